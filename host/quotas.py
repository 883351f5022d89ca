"""Per-tenant quotas: what one tenant may use of a shared host, so a noisy neighbour slows down
itself and not everyone else.

Configuration (``LOGHOST_TENANT_QUOTAS``, inline JSON, and/or ``LOGHOST_TENANT_QUOTAS_FILE``, a
file in the same JSON re-read when it changes)::

    {"default": {"records_per_s": 5000, "pending_bytes": 67108864},
     "tenants": {"alice": {"records_per_s": 500}, "batch": {"records_per_s": null}}}

A tenant's quota is the default with its own entry over it, key by key (``null`` lifts a
default: unlimited).  Unset means unlimited.  The file's entries go over the inline ones.

=======================  ==========================================================
``open_logs``            logs of the tenant open on this host at once
``created_logs``         logs the tenant may create through this host (since it started)
``pending_bytes``        bytes of the tenant accepted but not yet durable
``appends_per_s``        append requests per second (token bucket; ``appends_burst``)
``records_per_s``        records appended per second (token bucket; ``records_burst``)
``records_per_request``  records in one append
``bytes_per_request``    record bytes in one append
``weight``               the tenant's relative share of the server-wide byte budget when
                         it is contended (``host.fairshare``; default 1); not a limit
=======================  ==========================================================

A bucket's burst defaults to one second of its rate.  Exceeding a quota answers 429
``quota_exceeded`` naming it, with a ``Retry-After`` computed from the bucket (the seconds until
enough tokens are back).  Admission happens once per request, before any work
(``LogManager.admit``): token charges are taken there, the byte budget is held until the bytes
are durable or the request fails, and nothing the request does later is refused by a quota.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import QuotaExceeded
from .fairshare import FairShare, Grant
from .metrics import TenantMetrics
from .watchedfile import Signature, file_signature

_log = logging.getLogger("loghost.quotas")

Clock = Callable[[], float]


@dataclass(frozen=True, slots=True)
class Quota:
    """One tenant's limits; None: unlimited."""

    open_logs: int | None = None
    created_logs: int | None = None
    pending_bytes: int | None = None
    appends_per_s: float | None = None
    appends_burst: float | None = None
    records_per_s: float | None = None
    records_burst: float | None = None
    records_per_request: int | None = None
    bytes_per_request: int | None = None
    weight: float | None = None  # fair share (host.fairshare), not a limit

    def limited(self) -> bool:
        """Whether any limit is set (``weight`` is none).  Every append asks: no per-call
        ``dataclasses.fields`` (it was 5 % of a small append's event-loop time)."""
        return any(getattr(self, name) is not None for name in _LIMIT_NAMES)


QUOTA_NAMES = tuple(f.name for f in fields(Quota))
_LIMIT_NAMES = tuple(name for name in QUOTA_NAMES if name != "weight")

# How far ahead refused requests are given turns (TenantQuotas._turn): the longest a refused
# connection is left unread (host.httpserver.MAX_HOLD_S).
PACE_HORIZON_S = 1.0
# A tenant's refusals by one quota are logged a line per this many seconds (with their count).
THROTTLE_LOG_EVERY_S = 10.0


class _QuotaModel(BaseModel):
    """A quota entry as configured: only the keys it names override."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    open_logs: Annotated[int, Field(ge=0)] | None = None
    created_logs: Annotated[int, Field(ge=0)] | None = None
    pending_bytes: Annotated[int, Field(ge=1)] | None = None
    appends_per_s: Annotated[float, Field(gt=0)] | None = None
    appends_burst: Annotated[float, Field(ge=1)] | None = None
    records_per_s: Annotated[float, Field(gt=0)] | None = None
    records_burst: Annotated[float, Field(ge=1)] | None = None
    records_per_request: Annotated[int, Field(ge=1)] | None = None
    bytes_per_request: Annotated[int, Field(ge=1)] | None = None
    weight: Annotated[float, Field(gt=0)] | None = None


class _ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    default: _QuotaModel = _QuotaModel()
    tenants: dict[Annotated[str, Field(min_length=1)], _QuotaModel] = {}


def _entry(m: _QuotaModel) -> dict[str, Any]:
    return {k: getattr(m, k) for k in m.model_fields_set}


@dataclass(frozen=True)
class QuotaConfig:
    """Defaults and per-tenant overrides (each only the keys it sets)."""

    default: Mapping[str, Any] = field(default_factory=dict)
    tenants: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def over(self, other: QuotaConfig) -> QuotaConfig:
        """``other``'s entries over this one's, key by key."""
        tenants = {t: dict(q) for t, q in self.tenants.items()}
        for t, q in other.tenants.items():
            tenants[t] = {**tenants.get(t, {}), **q}
        return QuotaConfig({**self.default, **other.default}, tenants)

    def quota(self, tenant: str) -> Quota:
        """A tenant's quota: the default with its own entry over it."""
        return Quota(**{**self.default, **self.tenants.get(tenant, {})})


def parse_quotas(text: str, where: str = "LOGHOST_TENANT_QUOTAS") -> QuotaConfig:
    """The quotas of a JSON text (empty: none).  Raises ValueError naming ``where`` and the
    offending key."""
    if not text.strip():
        return QuotaConfig()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not JSON: {e}") from None
    try:
        m = _ConfigModel.model_validate(raw)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'quotas'}: {err['msg']}"
            for err in e.errors()
        )
        raise ValueError(
            f'{where}: {problems} (expected {{"default": {{...}}, "tenants": '
            f'{{"<tenant>": {{...}}}}}} with keys {", ".join(QUOTA_NAMES)})'
        ) from None
    return QuotaConfig(_entry(m.default), {t: _entry(q) for t, q in m.tenants.items()})


def read_quotas_file(path: str | os.PathLike[str]) -> QuotaConfig:
    """The quotas of a file (OSError or ValueError on failure)."""
    return parse_quotas(Path(path).read_text(encoding="utf-8"), f"tenant quotas file {path}")


def load_quota_config(inline: str, path: str | None) -> QuotaConfig:
    """``LOGHOST_TENANT_QUOTAS`` with the file's entries over it.  Raises ValueError."""
    config = parse_quotas(inline)
    if path:
        try:
            config = config.over(read_quotas_file(path))
        except OSError as e:
            raise ValueError(f"LOGHOST_TENANT_QUOTAS_FILE: {e}") from None
    return config


# ------------------------------------------------------------------------------ token buckets


class TokenBucket:
    """``rate`` tokens a second up to ``burst``; the clock is the caller's (injectable)."""

    __slots__ = ("burst", "rate", "stamp", "tokens")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.stamp = now

    def _refill(self, now: float) -> None:
        if now > self.stamp:
            self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
            self.stamp = now

    def wait_s(self, n: float, now: float) -> float:
        """Seconds until ``n`` tokens are there (0: now).  More than the burst needs a full
        bucket (then the bucket goes into debt), so any request can pass eventually."""
        self._refill(now)
        need = min(n, self.burst)
        return 0.0 if self.tokens >= need else (need - self.tokens) / self.rate

    def take(self, n: float, now: float) -> None:
        """Charge ``n`` tokens (after ``wait_s`` said 0)."""
        self._refill(now)
        self.tokens -= n

    def retune(self, rate: float, burst: float, now: float) -> None:
        """New settings (a re-read file): the tokens there stay, up to the new burst."""
        self._refill(now)
        self.rate, self.burst = rate, burst
        self.tokens = min(self.tokens, burst)


def _rate(n: float) -> str:
    return f"{n:g}/s"


# -------------------------------------------------------------------------------- admission


class Admission:
    """What one admitted request holds (its bytes, a log it may open or create) until
    ``release`` (idempotent): when the bytes are durable, or the request failed."""

    __slots__ = ("_quotas", "created", "fair", "nbytes", "opened", "released", "tenant")

    def __init__(self, quotas: TenantQuotas, tenant: str, nbytes: int) -> None:
        self._quotas = quotas
        self.tenant = tenant
        self.nbytes = nbytes
        self.opened: object | None = None  # a log id whose open-log slot it reserved
        self.created: object | None = None  # a log id whose creation it reserved
        self.fair: Grant | None = None  # its part of the server-wide budget (host.fairshare)
        self.released = False

    def release(self) -> None:
        """Give back what the request held (its in-flight bytes, its reservations)."""
        if not self.released:
            self.released = True
            if self.fair is not None:
                self.fair.release()
            self._quotas._done(self)


class TenantQuotas:
    """Every tenant's quota, token buckets and in-flight accounting on this host."""

    def __init__(
        self,
        config: QuotaConfig | None = None,
        *,
        inline: str = "",
        path: str | None = None,
        metrics: TenantMetrics | None = None,
        clock: Clock = time.monotonic,
    ) -> None:
        self.clock = clock
        self.metrics = metrics if metrics is not None else TenantMetrics()
        self._inline = parse_quotas(inline) if config is None else config
        self._file = Path(path) if path else None
        self._file_sig: Signature | None = None
        self._config = self._inline
        self._cache: dict[str, Quota] = {}
        self._appends: dict[str, TokenBucket] = {}
        self._records: dict[str, TokenBucket] = {}
        # (bucket, tenant) -> when the next refused request of that tenant gets its turn.
        self._turns: dict[tuple[str, str], tuple[float, float]] = {}  # and the rate they were for
        self._pending: dict[str, int] = {}
        # (tenant, quota) -> when its refusal was last logged, and the refusals since then.
        self._throttle_logged: dict[tuple[str, str], tuple[float | None, int]] = {}
        if self._file is not None and not self.reload():
            raise ValueError(f"LOGHOST_TENANT_QUOTAS_FILE: cannot use {self._file}")

    @classmethod
    def from_settings(cls, settings: Any, metrics: TenantMetrics | None = None) -> TenantQuotas:
        """From ``Settings.tenant_quotas`` and ``tenant_quotas_file`` (and the fair share of
        the server-wide budget, ``fair_share*``).  Raises ValueError."""
        q = cls(inline=settings.tenant_quotas, path=settings.tenant_quotas_file, metrics=metrics)
        if settings.fair_share == "weighted":
            q.fair = FairShare.from_settings(settings, q.metrics)
        return q

    # ------------------------------------------------------------------------------ the file

    def _signature(self) -> Signature | None:
        assert self._file is not None
        return file_signature(self._file)

    def reload(self) -> bool:
        """Re-read the quotas file now.  On failure the quotas in use stay; False."""
        if self._file is None:
            return True
        self._file_sig = self._signature()
        try:
            config = self._inline.over(read_quotas_file(self._file))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            _log.error("tenant quotas file not loaded, the quotas in use stay: %s", e)
            return False
        self._config, self._cache = config, {}
        _log.info("tenant quotas loaded", extra={"tenants": len(config.tenants)})
        return True

    def quota(self, tenant: str) -> Quota:
        """``tenant``'s quota now (one stat of the file, if any: a change applies at once)."""
        if self._file is not None and self._signature() != self._file_sig:
            self.reload()
        q = self._cache.get(tenant)
        if q is None:
            q = self._config.quota(tenant)
            if len(self._cache) > 100_000:
                self._cache.clear()
            self._cache[tenant] = q
        return q

    # ---------------------------------------------------------------------------- accounting

    def pending_bytes(self, tenant: str) -> int:
        """Bytes of ``tenant`` admitted and not yet durable (nor failed)."""
        return self._pending.get(tenant, 0)

    def throttle(
        self,
        tenant: str,
        quota: str,
        limit: str,
        retry_after_s: float | None = None,
        *,
        hold_s: float | None = None,
    ) -> QuotaExceeded:
        """The 429 of ``quota`` (counted in the metrics), to raise.  Logged once per tenant and
        quota every ``THROTTLE_LOG_EVERY_S``, with the refusals since the last line: a flood's
        refusals would otherwise be a log line each (tens a second), and the metrics count
        every one."""
        self.metrics.throttled(tenant, quota)
        key = (tenant, quota)
        now = self.clock()
        last, since = self._throttle_logged.get(key, (None, 0))
        if last is None or now - last >= THROTTLE_LOG_EVERY_S:
            self._throttle_logged[key] = (now, 0)
            if len(self._throttle_logged) > 10_000:
                self._throttle_logged = {key: (now, 0)}
            _log.info(
                "tenant %s over quota %s (%s)%s",
                tenant,
                quota,
                limit,
                f"; {since} more refused since the last line" if since else "",
                extra={"quota": quota, "retry_after_s": retry_after_s, "refused_since": since},
            )
        else:
            self._throttle_logged[key] = (last, since + 1)
        return QuotaExceeded(tenant, quota, limit, retry_after_s, hold_s=hold_s)

    def _turn(
        self, name: str, tenant: str, wait: float, n: float, rate: float, now: float
    ) -> float:
        """How long to hold the connection of a request refused by a rate bucket: until its
        turn.  Refused requests of one tenant get turns ``n / rate`` apart, so that a tenant
        flooding from many connections comes back one request at a time, spread evenly, and
        not all at once when a common hold ends: a wave of admitted work stalls every other
        tenant's requests behind it (issue 19).  Turns are handed out up to ``PACE_HORIZON_S``
        ahead; a request beyond it is held that long and asks again."""
        key = (name, tenant)
        last, at_rate = self._turns.get(key, (now, rate))
        # Turns handed out at another rate (the quota changed since) are not this rate's.
        turn = max(now + wait, last if at_rate == rate else now)
        if turn - now <= PACE_HORIZON_S:
            self._turns[key] = (turn + n / rate, rate)
        return min(turn - now, PACE_HORIZON_S)

    def _bucket(
        self, buckets: dict[str, TokenBucket], tenant: str, rate: float | None, burst: float | None
    ) -> TokenBucket | None:
        if rate is None:
            buckets.pop(tenant, None)
            return None
        size = burst if burst is not None else max(1.0, rate)
        now = self.clock()
        b = buckets.get(tenant)
        if b is None:
            b = buckets[tenant] = TokenBucket(rate, size, now)
        elif (b.rate, b.burst) != (rate, size):
            b.retune(rate, size, now)
        return b

    def precheck(self, tenant: str, q: Quota, *, records: int) -> None:
        """Refuse (QuotaExceeded) an append of ``records`` records that ``tenant``'s rate
        buckets refuse now, exactly as ``charge`` would, with the same Retry-After and turn.
        Called before the body is decoded (its records counted, not validated): a flood its
        quota refuses is then refused before the decoding, which cost the event loop, and so
        every other tenant, as much as an admitted append's (issue 19).  Charges nothing:
        ``charge`` still decides at admission."""
        self._refuse_if_short(tenant, q, appends=1, records=records, now=self.clock())

    def check_records(self, tenant: str, q: Quota, records: int) -> None:
        """``records_per_request`` (nothing charged)."""
        if q.records_per_request is not None and records > q.records_per_request:
            raise self.throttle(tenant, "records_per_request", f"{q.records_per_request}")

    def check_request(self, tenant: str, q: Quota, *, records: int, nbytes: int) -> None:
        """The per-request limits and the byte budget (nothing charged)."""
        self.check_records(tenant, q, records)
        if q.bytes_per_request is not None and nbytes > q.bytes_per_request:
            raise self.throttle(tenant, "bytes_per_request", f"{q.bytes_per_request} bytes")
        pending = self._pending.get(tenant, 0)
        # As the server-wide budget: the first request always fits (else one larger than the
        # budget could never pass; bytes_per_request bounds that).
        if q.pending_bytes is not None and pending and pending + nbytes > q.pending_bytes:
            raise self.throttle(tenant, "pending_bytes", f"{q.pending_bytes} bytes", 1)

    def charge(self, tenant: str, q: Quota, *, appends: int, records: int) -> None:
        """Take the tokens of a request from its buckets, or raise (charging nothing)."""
        now = self.clock()
        for bucket, n in self._refuse_if_short(
            tenant, q, appends=appends, records=records, now=now
        ):
            bucket.take(n, now)

    def _refuse_if_short(
        self, tenant: str, q: Quota, *, appends: int, records: int, now: float
    ) -> list[tuple[TokenBucket, int]]:
        """The rate buckets a request of ``appends`` and ``records`` charges, with what; raises
        the 429 of the first one short of it (giving the refused request its turn)."""
        checks = (
            ("appends_per_s", q.appends_per_s, self._bucket(self._appends, tenant, q.appends_per_s, q.appends_burst), appends),
            ("records_per_s", q.records_per_s, self._bucket(self._records, tenant, q.records_per_s, q.records_burst), records),
        )  # fmt: skip
        for name, rate, bucket, n in checks:
            if bucket is not None and n:
                wait = bucket.wait_s(n, now)
                if wait > 0:
                    assert rate is not None
                    hold = self._turn(name, tenant, wait, min(n, bucket.burst), rate, now)
                    raise self.throttle(tenant, name, _rate(rate), max(wait, 1e-9), hold_s=hold)
        return [(bucket, n) for _name, _rate_, bucket, n in checks if bucket is not None and n]

    def admitted(self, tenant: str, nbytes: int) -> Admission:
        """Record an admitted request holding ``nbytes`` until its ``release``."""
        self._pending[tenant] = self._pending.get(tenant, 0) + nbytes
        self.metrics.admitted(tenant)
        self.metrics.in_flight(tenant, 1, nbytes)
        return Admission(self, tenant, nbytes)

    def _done(self, a: Admission) -> None:
        left = self._pending.get(a.tenant, 0) - a.nbytes
        if left > 0:
            self._pending[a.tenant] = left
        else:
            self._pending.pop(a.tenant, None)
        self.metrics.in_flight(a.tenant, -1, -a.nbytes)
        hook = self.on_release
        if hook is not None:
            hook(a)

    # Set by the log manager: gives back an admission's open-log and creation reservations.
    on_release: Callable[[Admission], None] | None = None
    # The fair share of the server-wide byte budget (LogManager.admit); None: first come, first
    # served (the budget's 429 alone).
    fair: FairShare | None = None


def unlimited() -> TenantQuotas:
    """Quotas that limit nothing (a manager built without any)."""
    return TenantQuotas(QuotaConfig())


def describe(q: Quota) -> dict[str, Any]:
    """The set limits of a quota (for logs and tests)."""
    return {k: v for k, v in ((f.name, getattr(q, f.name)) for f in fields(q)) if v is not None}


__all__ = [
    "QUOTA_NAMES",
    "Admission",
    "Quota",
    "QuotaConfig",
    "TenantQuotas",
    "TokenBucket",
    "load_quota_config",
    "parse_quotas",
    "read_quotas_file",
    "unlimited",
]
