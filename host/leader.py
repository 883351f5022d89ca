"""Advisory leader hints: which server should write a given log, kept in Redis.

Correctness never depends on this module.  wal3 logs fence their writers with conditional writes
on the manifest, so two servers writing the same log is safe, merely wasteful (they contend and
one loses).  The hint only makes the normal case cheap: before opening a writer a server claims
``{key_prefix}{collection_id}``; if another live server holds it, the caller redirects the client
there instead of opening a second writer.

Key value: compact JSON ``{"server_id": ..., "url": ..., "incarnation": ...}``.  ``url`` is the
holder's advertise URL (the redirect target, read from the key itself: no second lookup);
``incarnation`` is random per process, so two processes that share a server id (a restart racing
its predecessor) can still tell their claims apart.

Failure semantics: the hint fails OPEN.  If Redis is unset, down, slow or answers garbage,
:meth:`LeaderHint.claim` returns None ("serve it yourself") within about ``timeout_s``, the failure
is counted, and the log is still tracked so its claim is (re-)established once Redis answers again.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .membership import Membership

log = logging.getLogger(__name__)

OnFailure = Callable[[BaseException], object]
OnLost = Callable[[str], Awaitable[None] | None]

# Claim one key.  SET NX PX first (the common case: a free log); otherwise the key is ours if it
# holds exactly our value (refresh the TTL) or another incarnation of our server id (a restart
# before the old key expired: take it over with our current value and URL).  Anything else is a
# live foreign holder, whose value is returned so the caller can redirect without a second lookup.
# ARGV: our value, our server id, ttl ms.  Returns nil when we hold the key, else the holder's value.
_CLAIM_LUA = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[3]) then
  return false
end
local cur = redis.call('GET', KEYS[1])
if cur == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
  return false
end
local ok, holder = pcall(cjson.decode, cur)
if ok and type(holder) == 'table' and holder['server_id'] == ARGV[2] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  return false
end
return cur
"""

# Renew a batch of keys in one round trip.  Only an exact value match is ours: a newer incarnation
# of our server id that took a key over has won it.  A missing key (expired, or Redis restarted
# empty) is re-established with SET NX, because we still hold the log open.
# ARGV: our value, ttl ms.  Returns one status per key: 1 renewed, 2 re-established, or the
# holder's value when another server holds it (lost; the value is the redirect target).
_RENEW_LUA = """
local out = {}
for i, key in ipairs(KEYS) do
  local cur = redis.call('GET', key)
  if cur == ARGV[1] then
    redis.call('PEXPIRE', key, ARGV[2])
    out[i] = 1
  elseif not cur then
    redis.call('SET', key, ARGV[1], 'NX', 'PX', ARGV[2])
    out[i] = 2
  else
    out[i] = cur
  end
end
return out
"""

# Compare-and-delete a batch of keys: delete only those still holding exactly our value.
# ARGV: our value.  Returns how many keys were deleted.
_RELEASE_LUA = """
local n = 0
for _, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[1] then
    n = n + redis.call('DEL', key)
  end
end
return n
"""

_RENEWED, _REESTABLISHED = 1, 2


def encode_holder(server_id: str, url: str, incarnation: str) -> str:
    """The value stored under a leader key."""
    return json.dumps(
        {"server_id": server_id, "url": url, "incarnation": incarnation}, separators=(",", ":")
    )


def decode_holder(value: str) -> dict[str, str] | None:
    """Parse a leader key's value; None if it is not one of ours."""
    try:
        obj = json.loads(value)
    except ValueError:
        return None
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("server_id"), str)
        or not isinstance(obj.get("url"), str)
    ):
        return None
    return {k: str(v) for k, v in obj.items()}


class LeaderHint(ABC):
    """Advisory per-log leadership used by the log manager; never required for correctness."""

    failures: int

    @abstractmethod
    async def start(self) -> None:
        """Start background renewal."""

    @abstractmethod
    async def close(self) -> None:
        """Stop renewal and release every held key (best effort)."""

    @abstractmethod
    async def claim(self, collection_id: str) -> str | None:
        """None if this server may serve the log, else the advertise URL of the live holder."""

    @abstractmethod
    async def release(self, collection_id: str) -> None:
        """Give up the hint for a log this server closed (best effort)."""

    def holds(self, collection_id: str) -> bool:
        """Whether this server tracks a claim on the log (also one made while Redis was down)."""
        return True

    async def release_many(self, collection_ids: Sequence[str]) -> None:
        """Release several hints (best effort); the default releases them one by one."""
        for c in collection_ids:
            await self.release(c)

    def tenure(self, collection_id: str) -> int | None:
        """An id of this server's current, continuous, confirmed hold on a log, or None.

        None means the hint cannot vouch that no other server wrote the log (Redis unreachable,
        not renewed for a TTL, or lost).  The id changes whenever continuity broke (an outage, a
        re-established key): a writer opened under another id may hold a stale manifest.

        Without a hint (no Redis) nothing vouches that another host did not write the log, so no
        in-memory manifest is trusted: reads and state come from the store.
        """
        return None

    def lost_to(self, collection_id: str) -> str | None:
        """The advertise URL of the server that took a log over from us, if known."""
        return None

    async def recheck(self, collection_id: str) -> bool | None:
        """Another writer just appended to a log this server writes (a ``LogContention``):
        whether this server should still write it (True: retry here), another one should now
        (False: ``lost_to`` names it), or the hint cannot tell (None: answer the contention)."""
        return None


class NullLeaderHint(LeaderHint):
    """No Redis configured: every server may serve every log."""

    def __init__(self) -> None:
        self.failures = 0

    async def start(self) -> None:
        """Nothing to start."""

    async def close(self) -> None:
        """Nothing to release."""

    async def claim(self, collection_id: str) -> str | None:
        """Always serve locally."""
        return None

    async def release(self, collection_id: str) -> None:
        """Nothing to release."""


class RendezvousLeaderHint(LeaderHint):
    """No Redis: a log's writer is its rendezvous owner among the live hosts (``host.membership``).

    Every host derives the same owner from the same liveness records, so through any host a
    client gets served or redirected to the owner; while the views differ (a host joining or
    leaving, for at most one refresh) two hosts may both write, which the manifest's conditional
    writes keep safe.  Nothing vouches that no other host wrote a log, so no tenure: memory is
    trusted only under the writer's read lease, as without any hint.
    """

    def __init__(self, membership: Membership) -> None:
        self.failures = 0
        self._m = membership

    async def start(self) -> None:
        """Nothing to start: the server runs the membership."""

    async def close(self) -> None:
        """Nothing to release: a departing host marks its record draining."""

    def _other(self, collection_id: str) -> str | None:
        owner = self._m.owner(collection_id)
        if owner is None or owner.server_id == self._m.server_id:
            return None
        return owner.url

    async def claim(self, collection_id: str) -> str | None:
        """None when we own the log (or no host is live), else the owner's advertise URL."""
        return self._other(collection_id)

    async def release(self, collection_id: str) -> None:
        """Nothing to release."""

    def holds(self, collection_id: str) -> bool:
        """Whether we still own the log in the current view (an open log moves on a change)."""
        return self._other(collection_id) is None

    def lost_to(self, collection_id: str) -> str | None:
        """The owner's advertise URL when it is another host."""
        return self._other(collection_id)

    async def recheck(self, collection_id: str) -> bool | None:
        """A contention means two hosts' views differed (one joined or left within a refresh):
        refresh ours now; the owner in it writes the log (the other host redirects to it by its
        own next refresh, or when its next append meets this contention too)."""
        await self._m.refresh_now()
        return self._other(collection_id) is None


class RedisLeaderHint(LeaderHint):
    """Leader hints in Redis: SET NX PX claims, batched Lua renewals, compare-and-delete releases.

    Counters (plain ints, for metrics and tests): ``failures`` (Redis calls that errored or timed
    out), ``skipped`` (claims/releases that did not try Redis because it failed moments ago),
    ``renewed``, ``reestablished`` and ``lost`` (per key, from renewals).
    """

    def __init__(
        self,
        url: str,
        server_id: str,
        advertise_url: str,
        *,
        ttl_ms: int = 10_000,
        renew_every_ms: int | None = None,
        timeout_s: float = 0.5,
        connect_timeout_s: float | None = None,
        retry_after_ms: int = 1_000,
        renew_batch: int = 500,
        key_prefix: str = "loghost:leader:",
        on_failure: OnFailure | None = None,
        on_lost: OnLost | None = None,
        membership: Membership | None = None,
    ) -> None:
        """Build the client now (a malformed URL fails at startup); connect lazily.

        ``membership``: while Redis does not answer, a log is served by its rendezvous owner
        among the live hosts (as without Redis) instead of by every host asked (fail open)."""
        from redis.asyncio import Redis
        from redis.asyncio.retry import Retry
        from redis.backoff import NoBackoff

        if ttl_ms <= 0:
            raise ValueError("ttl_ms must be positive")
        if renew_batch <= 0:
            raise ValueError("renew_batch must be positive")
        self.server_id = server_id
        self.advertise_url = advertise_url
        self.ttl_ms = int(ttl_ms)
        # ttl/3: two renewal attempts before a key could expire, so one lost round is harmless.
        self.renew_every_s = (
            renew_every_ms if renew_every_ms is not None else max(1, ttl_ms // 3)
        ) / 1000.0
        self.timeout_s = timeout_s
        self.retry_after_s = retry_after_ms / 1000.0
        self.renew_batch = renew_batch
        self.key_prefix = key_prefix
        self.on_failure = on_failure
        self.on_lost = on_lost
        self._membership = membership
        self.incarnation = secrets.token_hex(8)
        self.value = encode_holder(server_id, advertise_url, self.incarnation)

        self.failures = 0
        self.skipped = 0
        self.renewed = 0
        self.reestablished = 0
        self.lost = 0

        # Short timeouts and no client-side retries: a dead or wedged Redis must cost a claim at
        # most ~timeout_s, never stall the append path (redis-py's default retries multiply it).
        self._redis: Any = Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=connect_timeout_s
            if connect_timeout_s is not None
            else timeout_s,
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._claim_script = self._redis.register_script(_CLAIM_LUA)
        self._renew_script = self._redis.register_script(_RENEW_LUA)
        self._release_script = self._redis.register_script(_RELEASE_LUA)

        # collection_id -> generation of its latest claim.  A renewal result only applies to the
        # generation it saw, so a release or re-claim racing an in-flight renewal is not undone.
        self._held: dict[str, int] = {}
        self._generation = 0
        # Continuous confirmed holds (see tenure()): collection_id -> (tenure id, confirmed at).
        # Any Redis failure ends every tenure: another server may have failed open meanwhile.
        self._tenures: dict[str, tuple[int, float]] = {}
        self._tenure_seq = 0
        self._lost_to: dict[str, str] = {}  # bounded by the logs we held
        # collection_id -> when Redis last confirmed our key (the time we asked): until a TTL
        # after it the key may still be there, so hosts that reach Redis send the log here.
        # Unlike tenures, a Redis failure does not clear it.
        self._confirmed_at: dict[str, float] = {}
        self._down_until = 0.0  # monotonic; claims skip Redis until then (circuit breaker)
        self._renew_task: asyncio.Task[None] | None = None
        self._lost_tasks: set[asyncio.Task[Any]] = set()
        self._closed = False
        self._healthy = (
            True  # log outages once on the way down and once on the way up, not per call
        )

    # -- public API ---------------------------------------------------------------------------

    def key(self, collection_id: str) -> str:
        """The Redis key for a log."""
        return self.key_prefix + collection_id

    def tenure(self, collection_id: str) -> int | None:
        """See :meth:`LeaderHint.tenure`."""
        got = self._tenures.get(collection_id)
        if got is None or not self._healthy or collection_id not in self._held:
            return None
        tenure, confirmed_at = got
        # Not confirmed for a whole TTL: the key may have expired and been taken meanwhile.
        if time.monotonic() - confirmed_at > self.ttl_ms / 1000.0:
            return None
        return tenure

    def holds(self, collection_id: str) -> bool:
        """See :meth:`LeaderHint.holds` (while Redis is down, only the logs we own by membership,
        when routing by membership)."""
        if collection_id not in self._held:
            return False
        return (
            self._healthy
            or self._key_may_live(collection_id)
            or self._fallback_owner(collection_id) is None
        )

    def lost_to(self, collection_id: str) -> str | None:
        """See :meth:`LeaderHint.lost_to`."""
        got = self._lost_to.get(collection_id)
        if got is None and not self._healthy and not self._key_may_live(collection_id):
            return self._fallback_owner(collection_id)
        return got

    def _key_may_live(self, collection_id: str) -> bool:
        """We hold the log and Redis confirmed our key less than a TTL ago: the key may still be
        there, and every host that reaches Redis sends the log here, so we keep serving it.
        Handing it to the membership owner now would bounce it back (a 307 loop) until the key
        expires; after that the owner can claim it in Redis."""
        at = self._confirmed_at.get(collection_id)
        return (
            at is not None
            and collection_id in self._held
            and time.monotonic() - at < self.ttl_ms / 1000.0
        )

    def _fallback_owner(self, collection_id: str) -> str | None:
        """Without an answer from Redis: the URL of the log's rendezvous owner among the live
        hosts when that is another host; None when it is us (or no membership routing)."""
        if self._membership is None:
            return None
        owner = self._membership.owner(collection_id)
        if owner is None or owner.server_id == self._membership.server_id:
            return None
        return owner.url

    def _unanswered(self, collection_id: str, generation: int) -> str | None:
        """A claim Redis did not answer: fail open, unless membership names another owner and
        our own key cannot still be in Redis."""
        if self._key_may_live(collection_id):
            return None
        other = self._fallback_owner(collection_id)
        if other is not None and self._held.get(collection_id) == generation:
            del self._held[collection_id]
            self._confirmed_at.pop(collection_id, None)
        return other

    async def recheck(self, collection_id: str) -> bool | None:
        """See :meth:`LeaderHint.recheck`: claim the log again (Redis, or membership while
        Redis does not answer); a holder elsewhere is where it goes now."""
        holder = await self.claim(collection_id)
        if holder is not None:
            self._lost_to[collection_id] = holder
            return False
        if not self._healthy and self._membership is None:
            return None  # failed open: nothing tells who should write it
        return True

    def _confirm(self, collection_id: str, *, fresh: bool, at: float) -> None:
        """Redis just said we hold the key; ``fresh`` when continuity is not established."""
        self._lost_to.pop(collection_id, None)
        self._confirmed_at[collection_id] = at
        cur = self._tenures.get(collection_id)
        if cur is None or fresh:
            self._tenure_seq += 1
            self._tenures[collection_id] = (self._tenure_seq, at)
        else:
            self._tenures[collection_id] = (cur[0], at)

    @property
    def held(self) -> frozenset[str]:
        """The logs this server currently claims (including ones claimed while Redis was down)."""
        return frozenset(self._held)

    async def start(self) -> None:
        """Start the background renewal task (idempotent)."""
        if self._renew_task is None and not self._closed:
            self._renew_task = asyncio.create_task(
                self._renew_loop(), name=f"leader-hint-renew-{self.server_id}"
            )

    async def close(self) -> None:
        """Stop renewing, let pending on_lost handlers finish, release every held key, disconnect."""
        if self._closed:
            return
        self._closed = True
        if self._renew_task is not None:
            self._renew_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._renew_task
            self._renew_task = None
        if self._lost_tasks:
            # They typically close the lost log, which calls release(): let them use the client.
            await asyncio.gather(*self._lost_tasks, return_exceptions=True)
        held, self._held = list(self._held), {}
        self._confirmed_at.clear()
        try:
            for batch in _batches([self.key(c) for c in held], self.renew_batch):
                # One bounded attempt per batch; whatever is not released simply expires.
                if not await self._call(self._release_script(keys=batch, args=[self.value])):
                    break
        finally:
            try:
                await self._redis.aclose()
            except Exception:  # best effort: the process is shutting down
                log.debug("closing the leader-hint Redis client failed", exc_info=True)

    async def claim(self, collection_id: str) -> str | None:
        """None if this server may serve the log (it holds the key, or Redis is unavailable), else the holder's URL."""
        if self._closed:
            return None
        # Track the log before asking Redis: if Redis is down we serve it anyway (fail open), and
        # renewal must establish the claim once Redis is back.
        self._generation += 1
        self._held[collection_id] = generation = self._generation
        if self._breaker_open():
            self.skipped += 1
            return self._unanswered(collection_id, generation)
        asked = time.monotonic()
        ok, holder = await self._call(
            self._claim_script(
                keys=[self.key(collection_id)], args=[self.value, self.server_id, self.ttl_ms]
            ),
            with_result=True,
        )
        if not ok:
            return self._unanswered(collection_id, generation)
        if holder is None:
            if self._held.get(collection_id) == generation:
                # A claim continues a tenure only if one is running (we never let go).
                self._confirm(collection_id, fresh=False, at=asked)
            return None
        # Someone else holds it: the caller redirects rather than serve, so we do not hold it
        # (unless a newer claim raced this one: that one decides).
        if self._held.get(collection_id) == generation:
            del self._held[collection_id]
            self._confirmed_at.pop(collection_id, None)
        decoded = decode_holder(holder)
        if decoded is None:
            # Not a value we wrote (a foreign or corrupt key): no redirect target.  Serve anyway
            # (fail open) but leave the key alone and do not track it, so renewal never fights
            # over it.  Redis itself is fine, so the circuit breaker stays closed.
            self._failed(
                ValueError(f"unparseable leader hint at {self.key(collection_id)!r}: {holder!r}"),
                trip=False,
            )
            return None
        return decoded["url"]

    async def release(self, collection_id: str) -> None:
        """Compare-and-delete the log's key if it is still ours (best effort)."""
        # Works while close() is running too (on_lost handlers release their logs).
        self._tenures.pop(collection_id, None)
        self._confirmed_at.pop(collection_id, None)
        self._lost_to.pop(collection_id, None)
        if self._held.pop(collection_id, None) is None:
            return
        if self._breaker_open():
            self.skipped += (
                1  # it expires after ttl_ms; until then others redirect to us, harmlessly
            )
            return
        await self._call(self._release_script(keys=[self.key(collection_id)], args=[self.value]))

    async def release_many(self, collection_ids: Sequence[str]) -> None:
        """Compare-and-delete many keys, one EVAL per batch (shutdown lets every log go)."""
        mine = [c for c in collection_ids if self._held.pop(c, None) is not None]
        for c in collection_ids:
            self._tenures.pop(c, None)
            self._confirmed_at.pop(c, None)
            self._lost_to.pop(c, None)
        if not mine:
            return
        for batch in _batches([self.key(c) for c in mine], self.renew_batch):
            if self._breaker_open():
                self.skipped += len(batch)  # they expire after ttl_ms
                continue
            await self._call(self._release_script(keys=batch, args=[self.value]))

    async def renew(self) -> None:
        """Renew every held key now, one EVAL per batch; the background task calls this periodically."""
        if self._closed:
            return
        snapshot = list(self._held.items())
        for batch in _batches(snapshot, self.renew_batch):
            asked = time.monotonic()
            # Renewal ignores the circuit breaker: it is the periodic probe that closes it.
            ok, statuses = await self._call(
                self._renew_script(
                    keys=[self.key(c) for c, _ in batch], args=[self.value, self.ttl_ms]
                ),
                with_result=True,
            )
            if not ok:
                return  # Redis is failing: one failure per round is enough, retry next period
            orphans: list[str] = []
            for (collection_id, generation), status in zip(batch, statuses, strict=True):
                current = self._held.get(collection_id)
                if status == _RENEWED:
                    self.renewed += 1
                    if current is not None:
                        self._confirm(collection_id, fresh=False, at=asked)
                elif status == _REESTABLISHED:
                    self.reestablished += 1
                    if current is None:
                        # Released while this renewal was in flight: undo the re-SET we just did.
                        orphans.append(self.key(collection_id))
                    else:
                        # The key was gone (expired, or Redis restarted empty): anyone may have
                        # written the log meanwhile, so this is a new tenure.
                        self._confirm(collection_id, fresh=True, at=asked)
                elif current == generation:
                    self.lost += 1
                    del self._held[collection_id]
                    self._tenures.pop(collection_id, None)
                    self._confirmed_at.pop(collection_id, None)
                    decoded = decode_holder(status) if isinstance(status, str) else None
                    if decoded is not None:
                        self._lost_to[collection_id] = decoded["url"]
                    self._notify_lost(collection_id)
            if orphans:
                await self._call(self._release_script(keys=orphans, args=[self.value]))

    # -- internals ----------------------------------------------------------------------------

    async def _renew_loop(self) -> None:
        next_at = time.monotonic()
        while True:
            # Fixed cadence (not sleep-after-work), so slow rounds do not push renewals past the
            # TTL; after a very slow round renew at once rather than in a catch-up burst.
            next_at += self.renew_every_s
            now = time.monotonic()
            next_at = max(next_at, now)
            await asyncio.sleep(next_at - now)
            try:
                await self.renew()
            except asyncio.CancelledError:
                raise
            except Exception:  # never let a bug kill renewal for every log
                log.exception("leader-hint renewal round failed")

    async def _call(self, awaitable: Awaitable[Any], *, with_result: bool = False) -> Any:
        """Await one Redis call under the timeout; (ok, result) if with_result, else ok. Never raises."""
        try:
            async with asyncio.timeout(
                self.timeout_s * 2
            ):  # connect + reply, as a hard upper bound
                result = await awaitable
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # RedisError, OSError, TimeoutError...: the hint is advisory
            self._failed(exc)
            return (False, None) if with_result else False
        self._down_until = 0.0
        if not self._healthy:
            self._healthy = True
            log.info("leader hint: Redis answers again")
        return (True, result) if with_result else True

    def _breaker_open(self) -> bool:
        return time.monotonic() < self._down_until

    def _failed(self, exc: BaseException, *, trip: bool = True) -> None:
        self.failures += 1
        if trip:
            self._down_until = time.monotonic() + self.retry_after_s
            # Other servers may fail open now: no hold is continuous across this.
            self._tenures.clear()
        if not trip:
            log.warning("leader hint ignored, serving anyway: %s", exc)
        elif self._healthy:
            self._healthy = False
            log.warning("leader hint: Redis unavailable, serving without it: %r", exc)
        else:
            log.debug("leader hint: Redis still unavailable: %r", exc)
        if self.on_failure is not None:
            try:
                self.on_failure(exc)
            except Exception:
                log.exception("leader-hint on_failure callback raised")

    def _notify_lost(self, collection_id: str) -> None:
        log.info("leader hint for %s taken over by another server", collection_id)
        if self.on_lost is None:
            return
        try:
            result = self.on_lost(collection_id)
        except Exception:
            log.exception("leader-hint on_lost callback raised")
            return
        if inspect.isawaitable(result):
            # Run it beside renewal (closing a log may take a while) and keep a reference so it is
            # neither garbage-collected nor forgotten by close().
            task = asyncio.ensure_future(result)
            self._lost_tasks.add(task)
            task.add_done_callback(self._lost_done)

    def _lost_done(self, task: asyncio.Future[Any]) -> None:
        self._lost_tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("leader-hint on_lost handler failed", exc_info=task.exception())


def _batches(items: Sequence[Any], size: int) -> list[Sequence[Any]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def leader_hint_from_url(
    url: str | None, server_id: str, advertise_url: str, **kw: Any
) -> LeaderHint:
    """A RedisLeaderHint for a Redis URL, or a NullLeaderHint when the URL is unset or empty."""
    if not url or not url.strip():
        return NullLeaderHint()
    return RedisLeaderHint(url.strip(), server_id, advertise_url, **kw)
