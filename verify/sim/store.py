"""An in-memory object store with seed-chosen latency, failures and crashes.

``SimStore`` holds the truth (key -> bytes, etag, last-modified) and decides every operation's
fate with its own seeded RNG.  Each actor (a writer process, the collector, a reader) talks to it
through its own ``ActorView``, an ``ObjectStore``; crashing an actor makes its view stop answering
forever, like a process that died: the engine's tasks are abandoned mid-await, no special
exception is caught anywhere.  Requests it had in flight either still land or are lost.

An operation takes effect atomically at its landing time (request delay after it was issued) and
its answer arrives a response delay later, so concurrent operations complete out of order.
Faults: ``before`` (503, nothing landed), ``lost`` (landed, the caller sees 503: an ambiguous
write), ``sticky`` (the next few operations on one key all fail with 503), ``conflict`` (S3's 409
when two conditional writes to one key overlap) and crashes before or after an operation lands.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol, TypeVar

from wal3.errors import ObjectNotFound, PreconditionFailed, StoreUnavailable, Wal3Error
from wal3.paths import CURSOR_PREFIX, GARBAGE_PATH
from wal3.store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

from .loop import SimLoop, wall_s

T = TypeVar("T")

LIST_PAGE = 4  # small pages: listings interleave with writes, as S3's do


@dataclass(slots=True)
class Obj:
    """One stored object."""

    data: bytes
    etag: str
    mtime: float


@dataclass(frozen=True)
class FaultRates:
    """Per-operation probabilities of each fault (all zero: a healthy store)."""

    before: float = 0.0
    lost: float = 0.0
    sticky: float = 0.0
    conflict: float = 0.0


@dataclass(frozen=True)
class Latency:
    """Delays in virtual seconds: usually fast, sometimes slow, rarely very slow."""

    fast: tuple[float, float] = (0.0005, 0.004)
    slow: tuple[float, float] = (0.004, 0.04)
    tail: tuple[float, float] = (0.04, 0.25)
    p_slow: float = 0.15
    p_tail: float = 0.04
    # A stall: the process is paused (GC, a swapped-out host) between two store operations.
    stall: tuple[float, float] = (0.5, 4.0)
    p_stall: float = 0.0
    # The adversary's favourite pause: right after the process read (or wrote) control state,
    # keys holding one of ``pause_after``, when what it knows is about to be acted on: at the
    # first operation of a kind in ``pause_before`` on another key after control operations.
    p_pause: float = 0.0
    pause: tuple[float, float] = (0.3, 2.5)
    pause_after: tuple[str, ...] = ("/" + CURSOR_PREFIX, "/" + GARBAGE_PATH)
    pause_before: tuple[str, ...] = ("put", "delete")


class Observer(Protocol):
    """What the model learns from the store as operations land."""

    def on_put(self, actor: Actor, key: str, old: Obj | None, new: Obj) -> None: ...

    def on_delete(self, actor: Actor, key: str, old: Obj) -> None: ...


@dataclass(eq=False)
class Actor:
    """A process talking to the store; ``crash_p`` is its chance to die at each operation."""

    name: str
    crash_p: float = 0.0
    faulty: bool = True  # whether store faults reach it (readers are exempt: see actors)
    latency: Latency | None = None  # its own latency profile, else the store's
    alive: bool = True
    started_at: float = 0.0
    dead: asyncio.Future[None] | None = None
    inflight: dict[int, bool] = field(default_factory=dict)  # op id -> still lands if crashed
    read_control: bool = False  # its last operation was on control state (see Latency.p_pause)
    # Actors living in the same process (the collector using this writer): they die with it.
    linked: list[Actor] = field(default_factory=list)


class SimStore:
    """The simulated store's truth and its fault engine."""

    def __init__(
        self,
        loop: SimLoop,
        rng: random.Random,
        trace: Callable[[str], None],
        observer: Observer | None = None,
        *,
        rates: FaultRates = FaultRates(),
        latency: Latency = Latency(),
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.trace = trace
        self.observer = observer
        # Called after the observer with every put that lands: actors that react to the store's
        # truth the moment it changes (the busy collector racing a take-over's read-back).
        self.watchers: list[Callable[[Actor, str, Obj | None, Obj], None]] = []
        self.rates = rates
        self.latency = latency
        self.faults_on = True
        self.objects: dict[str, Obj] = {}
        self.faults: collections.Counter[str] = collections.Counter()
        self.ops = 0
        self._sticky: dict[str, int] = {}
        self._conditional_inflight: collections.Counter[str] = collections.Counter()
        self._next_op = 0

    # ------------------------------------------------------------------------------ actors

    def actor(
        self,
        name: str,
        crash_p: float = 0.0,
        *,
        faulty: bool = True,
        latency: Latency | None = None,
    ) -> Actor:
        """A new live actor (a new process: its crash chance given by the run's config)."""
        return Actor(
            name,
            crash_p,
            faulty,
            latency,
            started_at=self.loop.time(),
            dead=self.loop.create_future(),
        )

    def view(self, actor: Actor) -> ActorView:
        """The store as ``actor`` sees it."""
        return ActorView(self, actor)

    def crash(self, actor: Actor, why: str) -> None:
        """Kill ``actor``: it never gets another answer; each request in flight lands or not."""
        if not actor.alive:
            return
        actor.alive = False
        self.faults["crash"] += 1
        for op in actor.inflight:
            actor.inflight[op] = self.rng.random() < 0.5
        self.trace(
            f"{actor.name} CRASH ({why}); in flight: "
            f"{sorted(k for k, v in actor.inflight.items() if v)} still land"
        )
        for other in actor.linked:
            self.crash(other, f"its process {actor.name} died")

    async def _forever(self, actor: Actor) -> None:
        assert actor.dead is not None
        await asyncio.shield(actor.dead)  # never resolved: the process is gone

    # ----------------------------------------------------------------------------- delays

    def _delay(self, actor: Actor) -> float:
        lat = actor.latency or self.latency
        r = self.rng.random()
        if r < lat.p_stall:
            lo, hi = lat.stall
        else:
            r -= lat.p_stall
            lo, hi = (
                lat.tail
                if r < lat.p_tail
                else lat.slow
                if r < lat.p_tail + lat.p_slow
                else lat.fast
            )
        return round(self.rng.uniform(lo, hi), 6)

    def _fault(self, actor: Actor, kind: str, key: str) -> str | None:
        if not self.faults_on or not actor.faulty:
            return None
        left = self._sticky.get(key, 0)
        if left > 0:
            self._sticky[key] = left - 1
            return "sticky"
        if actor.crash_p and self.rng.random() < actor.crash_p:
            return self.rng.choice(("crash_before", "crash_after"))
        r = self.rng.random()
        rates = self.rates
        if r < rates.sticky and kind in ("put", "get", "head"):
            self._sticky[key] = self.rng.randint(2, 10)
            return "sticky"
        r -= rates.sticky
        if r < rates.before:
            return "before"
        r -= rates.before
        if r < rates.lost:
            return "lost"
        return None

    # ------------------------------------------------------------------------- operations

    async def op(
        self, actor: Actor, kind: str, key: str, apply: Callable[[], T], conditional: bool = False
    ) -> T:
        """Run one operation for ``actor``: delay, land atomically (or fail), delay, answer."""
        if not actor.alive:
            await self._forever(actor)
        self.ops += 1
        op_id = self._next_op
        self._next_op += 1
        fault = self._fault(actor, kind, key)
        if fault == "crash_before":
            self.crash(actor, f"before #{op_id} {kind} {key}")
            await self._forever(actor)
        if fault is not None and fault != "crash_after":
            self.faults[fault] += 1
        d_req, d_resp = self._delay(actor), self._delay(actor)
        lat = actor.latency
        if lat is not None and lat.p_pause:
            control = kind != "delete" and any(k in key for k in lat.pause_after)
            if (
                actor.read_control
                and not control
                and kind in lat.pause_before
                and self.rng.random() < lat.p_pause
            ):
                d_req += round(self.rng.uniform(*lat.pause), 6)
            actor.read_control = control or (actor.read_control and kind not in lat.pause_before)
        actor.inflight[op_id] = True
        if conditional:
            self._conditional_inflight[key] += 1
        try:
            await asyncio.sleep(d_req)
        finally:
            if conditional:
                self._conditional_inflight[key] -= 1
        lands = actor.inflight.pop(op_id)
        if not actor.alive and not lands:
            self.trace(f"#{op_id} {actor.name} {kind} {key}: lost with its process")
            await self._forever(actor)
        landed: list[T] = []  # what ``apply`` returned, once it ran
        error: Wal3Error | None = None
        if fault in ("before", "sticky"):
            error = StoreUnavailable(f"simulated 503 ({fault}) on {kind} {key}")
            outcome = f"503 {fault}"
        elif (
            conditional
            and self._conditional_inflight[key] > 0
            and self.rates.conflict
            and self.faults_on
            and actor.faulty
            and self.rng.random() < self.rates.conflict
        ):
            self.faults["conflict"] += 1
            error = PreconditionFailed(key, "simulated 409: concurrent conditional write")
            outcome = "409 concurrent"
        else:
            try:
                landed.append(apply())
                outcome = "ok"
            except (ObjectNotFound, PreconditionFailed) as e:
                error = e
                outcome = type(e).__name__
        self.trace(
            f"#{op_id} {actor.name} {kind} {key} -> {outcome}"
            + (" (answer lost)" if fault == "lost" else "")
        )
        if fault == "crash_after":
            self.crash(actor, f"after #{op_id} {kind} {key} landed")
        await asyncio.sleep(d_resp)
        if not actor.alive:
            await self._forever(actor)
        if fault == "lost" and outcome in ("ok", "PreconditionFailed", "ObjectNotFound"):
            raise StoreUnavailable(f"simulated lost answer to {kind} {key}")
        if error is not None:
            raise error
        return landed[0]

    # ------------------------------------------------------------------- the truth, applied

    def do_get(self, key: str) -> GetResult:
        o = self.objects.get(key)
        if o is None:
            raise ObjectNotFound(key)
        return GetResult(o.data, o.etag)

    def do_head(self, key: str) -> ObjectMeta:
        o = self.objects.get(key)
        if o is None:
            raise ObjectNotFound(key)
        return ObjectMeta(key, o.etag, len(o.data), o.mtime)

    def do_put(
        self, actor: Actor, key: str, data: bytes, if_none_match: str | None, if_match: str | None
    ) -> str:
        old = self.objects.get(key)
        if if_none_match is not None and old is not None:
            raise PreconditionFailed(key, "exists")
        if if_match is not None and (old is None or old.etag.strip('"') != if_match.strip('"')):
            raise PreconditionFailed(key, "etag mismatch")
        new = Obj(data, content_etag(data), wall_s(self.loop))
        self.objects[key] = new
        if self.observer is not None:
            self.observer.on_put(actor, key, old, new)
        for watch in self.watchers:
            watch(actor, key, old, new)
        return new.etag

    def do_delete(self, actor: Actor, key: str) -> None:
        old = self.objects.pop(key, None)
        if old is not None and self.observer is not None:
            self.observer.on_delete(actor, key, old)

    def do_list(self, prefix: str, start_after: str | None) -> list[ObjectMeta]:
        keys = sorted(
            k
            for k in self.objects
            if k.startswith(prefix) and (start_after is None or k > start_after)
        )
        out = []
        for k in keys[:LIST_PAGE]:
            o = self.objects[k]
            out.append(ObjectMeta(k, o.etag, len(o.data), o.mtime))
        return out


class ActorView(ObjectStore):
    """One actor's connection to the simulated store."""

    def __init__(self, sim: SimStore, actor: Actor) -> None:
        self.sim = sim
        self.actor = actor

    async def get(self, key: str) -> GetResult:
        return await self.sim.op(self.actor, "get", key, lambda: self.sim.do_get(key))

    async def head(self, key: str) -> ObjectMeta:
        return await self.sim.op(self.actor, "head", key, lambda: self.sim.do_head(key))

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        check_condition(if_none_match, if_match)
        data = bytes(data)
        return await self.sim.op(
            self.actor,
            "put",
            key,
            lambda: self.sim.do_put(self.actor, key, data, if_none_match, if_match),
            conditional=if_none_match is not None or if_match is not None,
        )

    async def delete(self, key: str) -> None:
        await self.sim.op(self.actor, "delete", key, lambda: self.sim.do_delete(self.actor, key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        after = start_after
        while True:
            page = await self.sim.op(
                self.actor, "list", prefix, functools.partial(self.sim.do_list, prefix, after)
            )
            for meta in page:
                yield meta
            if len(page) < LIST_PAGE:
                return
            after = page[-1].key

    def url_for(self, key: str) -> str:
        return f"sim://{key}"
