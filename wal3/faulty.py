"""``FaultyStore``: wraps any object store and injects latency, failures and crashes.

Two ways to inject faults, usable together:

* background rates given to the constructor (``error_rate``, ``lost_response_rate``,
  ``precondition_storm_rate``, ``latency_s`` + ``jitter_s``), for soak tests and benchmarks;
* :class:`FaultRule` objects for deterministic injection at exact points, e.g. "the third put of the
  manifest lands but the process dies before it sees the answer"::

      store.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"manifest/MANIFEST$",
                               after=2, times=1))

Every random choice comes from one ``random.Random(seed)``, so the same seed and the same sequence
of requests give the same faults.  ``disable()`` turns everything off (a test can then recover and
check the state the faults left behind) and ``stats()`` tells what happened.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import random
import re
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, get_args

from .errors import PreconditionFailed, SimulatedCrash, StoreError, StoreUnavailable
from .store import GetResult, ObjectMeta, ObjectStore

T = TypeVar("T")

FaultKind = Literal[
    "latency", "error", "lost_response", "crash_before", "crash_after", "precondition"
]
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
OPS: frozenset[str] = frozenset({"get", "head", "put", "delete", "list", "copy"})
# Only a conditional write can fail its condition.
_CONDITIONAL_OPS = frozenset({"put", "copy"})


@dataclass(eq=False)
class FaultRule:
    """One injection point: which requests it matches, and what it does to them.

    A request matches when its op is in ``ops`` (None: any op) and ``key_regex`` is found in its key
    (the destination for copy, the prefix for list); "precondition" rules match only conditional
    writes.  The first ``after`` matching requests pass untouched; after that the rule fires with
    ``probability`` until it has fired ``times`` times (None: no limit).  ``seen`` and ``fired``
    count matches and firings, so a test can check that its fault really happened.
    """

    kind: FaultKind
    ops: Collection[str] | None = None
    key_regex: str | None = None
    after: int = 0
    times: int | None = None
    probability: float = 1.0
    latency_s: float = 0.0  # the delay a "latency" rule adds
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)
    _pattern: re.Pattern[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {FAULT_KINDS}")
        if self.ops is not None:
            self.ops = frozenset(self.ops)
            if unknown := self.ops - OPS:
                raise ValueError(
                    f"unknown ops {sorted(unknown)}; expected a subset of {sorted(OPS)}"
                )
            if self.kind == "precondition" and not self.ops & _CONDITIONAL_OPS:
                raise ValueError("a precondition rule needs 'put' or 'copy' among its ops")
        if self.after < 0:
            raise ValueError("after must be >= 0")
        if self.times is not None and self.times < 0:
            raise ValueError("times must be >= 0 or None")
        if not 0.0 <= self.probability <= 1.0:
            raise ValueError("probability must be within [0, 1]")
        if self.kind == "latency" and self.latency_s <= 0:
            raise ValueError("a latency rule needs latency_s > 0")
        if self.latency_s < 0:
            raise ValueError("latency_s must be >= 0")
        self._pattern = re.compile(self.key_regex) if self.key_regex is not None else None

    @property
    def exhausted(self) -> bool:
        """Whether the rule has fired as many times as it may."""
        return self.times is not None and self.fired >= self.times

    def matches(self, op: str, key: str, *, conditional: bool) -> bool:
        """Whether a request is one this rule is about (ignoring after/times/probability)."""
        if self.ops is not None and op not in self.ops:
            return False
        if self.kind == "precondition" and not conditional:
            return False
        return self._pattern is None or self._pattern.search(key) is not None


@dataclass(frozen=True, slots=True)
class InjectedFault:
    """A record of one fault: the request's sequence number, op and key, and the fault's kind."""

    seq: int
    op: str
    key: str
    kind: str


@dataclass(slots=True)
class _Plan:
    delay_s: float = 0.0
    action: str | None = None


class FaultyStore(ObjectStore):
    """An object store wrapper that injects faults, reproducibly from a seed."""

    def __init__(
        self,
        inner: ObjectStore,
        *,
        seed: int = 0,
        latency_s: float = 0.0,
        jitter_s: float = 0.0,
        error_rate: float = 0.0,
        lost_response_rate: float = 0.0,
        precondition_storm_rate: float = 0.0,
        history_size: int = 10_000,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
    ) -> None:
        for name, rate in (
            ("error_rate", error_rate),
            ("lost_response_rate", lost_response_rate),
            ("precondition_storm_rate", precondition_storm_rate),
        ):
            if not 0.0 <= rate <= 1.0:
                raise ValueError(f"{name} must be within [0, 1]")
        if latency_s < 0 or jitter_s < 0:
            raise ValueError("latency_s and jitter_s must be >= 0")
        self.inner = inner
        self.seed = seed
        self.latency_s = latency_s
        self.jitter_s = jitter_s
        self.error_rate = error_rate
        self.lost_response_rate = lost_response_rate
        self.precondition_storm_rate = precondition_storm_rate
        self.rng = random.Random(seed)
        # Injectable so a benchmark can run on a virtual clock and a test can see the delays.
        self.sleep = sleep
        self.rules: builtins.list[FaultRule] = []
        # The most recent faults, oldest first: what a failing test wants to print.
        self.history: deque[InjectedFault] = deque(maxlen=history_size)
        self._enabled = True
        self._seq = 0
        self._requests: Counter[str] = Counter()
        self._faults: Counter[str] = Counter()

    def __repr__(self) -> str:
        return (
            f"FaultyStore({self.inner!r}, seed={self.seed}, faults_injected={self.faults_injected})"
        )

    # ------------------------------------------------------------------------------ control

    def add_rule(self, rule: FaultRule) -> FaultRule:
        """Add a rule (checked after the ones already added) and return it."""
        self.rules.append(rule)
        return rule

    def remove_rule(self, rule: FaultRule) -> None:
        """Remove a rule added earlier."""
        self.rules.remove(rule)

    def clear_rules(self) -> None:
        """Remove every rule."""
        self.rules.clear()

    def disable(self) -> None:
        """Turn every fault off, latency included; requests go straight to the inner store."""
        self._enabled = False

    def enable(self) -> None:
        """Turn faults back on."""
        self._enabled = True

    @property
    def enabled(self) -> bool:
        """Whether faults are being injected."""
        return self._enabled

    @contextlib.contextmanager
    def faults_disabled(self) -> Iterator[None]:
        """Disable faults inside a ``with`` block, restoring the previous state after it."""
        was = self._enabled
        self._enabled = False
        try:
            yield
        finally:
            self._enabled = was

    @property
    def faults_injected(self) -> int:
        """How many faults were injected in total."""
        return sum(self._faults.values())

    def stats(self) -> dict[str, Any]:
        """Requests per op, faults per kind, and totals."""
        return {
            "requests": dict(self._requests),
            "requests_total": sum(self._requests.values()),
            "faults": dict(self._faults),
            "faults_injected": self.faults_injected,
            "enabled": self._enabled,
        }

    def reset_stats(self) -> None:
        """Zero the counters and forget the history (rules keep their own counts)."""
        self._requests.clear()
        self._faults.clear()
        self.history.clear()

    # ----------------------------------------------------------------------------- planning

    def _plan(self, op: str, key: str, *, conditional: bool = False) -> _Plan:
        """Decide, before the request runs, what happens to it."""
        self._requests[op] += 1
        seq = self._seq
        self._seq += 1
        plan = _Plan()
        if not self._enabled:
            return plan
        if self.latency_s or self.jitter_s:
            plan.delay_s = self.latency_s + (
                self.rng.uniform(0.0, self.jitter_s) if self.jitter_s else 0.0
            )
        for rule in self.rules:
            if not rule.matches(op, key, conditional=conditional):
                continue
            rule.seen += 1
            if rule.seen <= rule.after or rule.exhausted:
                continue
            if rule.kind != "latency" and plan.action is not None:
                continue  # one failure per request; a later rule keeps its chance for later
            if rule.probability < 1.0 and self.rng.random() >= rule.probability:
                continue
            rule.fired += 1
            self._record(seq, op, key, rule.kind)
            if rule.kind == "latency":
                plan.delay_s += rule.latency_s
            else:
                plan.action = rule.kind
        if plan.action is None:
            plan.action = self._background(op, conditional)
            if plan.action is not None:
                self._record(seq, op, key, plan.action)
        return plan

    def _background(self, op: str, conditional: bool) -> str | None:
        # Draw only for the rates in use, so adding a rate does not reshuffle the others' schedule
        # more than necessary.
        if self.error_rate and self.rng.random() < self.error_rate:
            return "error"
        if self.lost_response_rate and self.rng.random() < self.lost_response_rate:
            return "lost_response"
        if (
            conditional
            and self.precondition_storm_rate
            and self.rng.random() < self.precondition_storm_rate
        ):
            return "precondition"
        return None

    def _record(self, seq: int, op: str, key: str, kind: str) -> None:
        self._faults[kind] += 1
        self.history.append(InjectedFault(seq=seq, op=op, key=key, kind=kind))

    async def _before(self, plan: _Plan, op: str, key: str) -> None:
        """Sleep and raise the faults that stop a request before it reaches the inner store."""
        if plan.delay_s > 0:
            await self.sleep(plan.delay_s)
        if plan.action == "error":
            raise StoreUnavailable(f"injected fault: {op} {key} failed before reaching the store")
        if plan.action == "crash_before":
            raise SimulatedCrash(f"injected crash before {op} {key}")
        if plan.action == "precondition":
            raise PreconditionFailed(key, "injected ConditionalRequestConflict")

    @staticmethod
    def _hidden_answer(plan: _Plan, op: str, key: str) -> Exception:
        """The error that replaces the answer of a request that did reach the inner store."""
        if plan.action == "crash_after":
            return SimulatedCrash(f"injected crash after {op} {key} reached the store")
        return StoreUnavailable(
            f"injected fault: the response to {op} {key} was lost (it may have been applied)"
        )

    async def _run(
        self, op: str, key: str, call: Callable[[], Awaitable[T]], *, conditional: bool = False
    ) -> T:
        plan = self._plan(op, key, conditional=conditional)
        await self._before(plan, op, key)
        if plan.action in ("lost_response", "crash_after"):
            # The op happens; whatever it answered, the caller never learns it.
            with contextlib.suppress(StoreError):
                await call()
            raise self._hidden_answer(plan, op, key)
        return await call()

    # ------------------------------------------------------------------------------ the API

    async def get(self, key: str) -> GetResult:
        """Read through, with faults."""
        return await self._run("get", key, lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectMeta:
        """Head through, with faults."""
        return await self._run("head", key, lambda: self.inner.head(key))

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        """Write through, with faults ("precondition" ones only for conditional puts)."""
        return await self._run(
            "put",
            key,
            lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match),
            conditional=if_none_match is not None or if_match is not None,
        )

    async def delete(self, key: str) -> None:
        """Delete through, with faults."""
        await self._run("delete", key, lambda: self.inner.delete(key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        """List through, with faults decided when iteration starts (keyed by the prefix)."""
        plan = self._plan("list", prefix)
        await self._before(plan, "list", prefix)
        if plan.action in ("lost_response", "crash_after"):
            with contextlib.suppress(StoreError):
                async for _ in self.inner.list(prefix, start_after=start_after):
                    pass
            raise self._hidden_answer(plan, "list", prefix)
        async for meta in self.inner.list(prefix, start_after=start_after):
            yield meta

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        """Copy through the inner store (server-side where it can), with faults keyed by ``dst``."""
        return await self._run(
            "copy",
            dst,
            lambda: self.inner.copy(src, dst, if_none_match=if_none_match),
            conditional=if_none_match is not None,
        )

    def url_for(self, key: str) -> str:
        """The inner store's URL (no faults: it makes no request)."""
        return self.inner.url_for(key)

    async def close(self) -> None:
        """Close the inner store."""
        await self.inner.close()
