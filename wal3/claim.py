"""Claims on creating a log: who may write a log's objects before its manifest exists.

A log exists once its manifest does (created with If-None-Match, the commit point).  A fork writes
the target's objects *before* that — copies, the compaction cursor, the server's compacted base —
so that a visible target is complete.  Without coordination, a failed fork leaves those objects for
the log created there later to inherit, a plain first append can create the log between a fork's
cursor write and its manifest, and two forks into one target mix their cursors and bases.  So every
creation of a log that forks may target goes through a **claim**, ``{prefix}/CLAIM``: a JSON object
created with If-None-Match, replaced only with If-Match.

Protocol, in order (each step's crash is safe):

1. Claim: create ``CLAIM`` (If-None-Match), or replace a released or expired one (If-Match on the
   etag judged).  A crash after this leaves only a claim, which expires.
2. Read the manifest: present, the log exists and the claimant stops (deleting its claim is safe
   then: once a manifest exists every claimant finds it after claiming).
3. Clean leftovers: every object under the log's ``cursor/``, ``log/``, ``snapshot/``, ``gc/`` and
   the caller's own prefixes (the server's ``compacted/{uuid}/``).  Holding the claim with no
   manifest, everything there is a dead attempt's: nobody else may write there.  A crash leaves a
   partial clean-up, which the next claimant repeats.
4. Write what the log needs before it is visible (a fork's copies, cursor, base).  Writes that
   create objects use If-None-Match, so a write of a fenced-off old claimant can never replace ours
   (at worst it makes ours fail, and nothing is committed); an object found already there is
   accepted only if it holds exactly the bytes we meant to write (``copy_claimed``,
   ``put_claimed``: etags compared, else the bytes), anything else is ``ClaimLost``.
5. Write the manifest (If-None-Match), then delete the claim.

**Every write of a claimant goes through ``Claim.write``**, and concurrent ones run in
``run_all`` (an ``asyncio.TaskGroup``: the first failure cancels the siblings and waits until
every one has ended).  ``Claim.write`` counts a write from the moment it is issued; one that
ended in anything but success or a definite refusal by the store (412, 404) — an error that may
hide a request still queued somewhere, a timeout, a cancellation after it was issued — *may still
land*.  The first failure also closes the claim: every later ``guard()`` refuses.  So:

* An attempt that failed releases its claim at once (If-Match to a ``released`` tombstone) only
  when **no write of it may still land**: none in flight, none ended ambiguously, and its manifest
  put never sent.  Otherwise it keeps the claim until it expires, exactly as a crash does, so the
  next claimant's clean-up never runs while a straggler of ours may still land (a delete removing
  the next log's acknowledged fragment, a copy the next log's read repair would link).
* Release is the only way another attempt gets in without the TTL wait, and a released (or
  failed) claim takes no more writes: ``release()`` closes it first.
* A cancelled attempt (a client hanging up) is the same: released when nothing may still land
  (the release runs shielded), else kept until it expires.

**Expiry without a lock service.**  A claim is never judged by comparing clocks: an observer
takes it over only after it has seen the *same etag* for ``max(its own ttl_s, the holder's)`` on
its own monotonic clock (``ClaimWatch``, first sight).  The holder's TTL is recorded in the claim
(``ttl_s``), so a host configured with a shorter TTL (a rolling change of the GC grace) still waits
for the holder's renewal period to pass several times over; a claim without it (an older writer)
is judged by the observer's own TTL.  A live claimant renews its claim (If-Match, a new etag)
every ``ttl_s / 4`` (``Claim.kept_alive``, so a slow step or a manifest put in flight never lets
it expire) and before any write once ``ttl_s / 4`` has passed since its last renewal began, and
stops at the first failed renewal (``ClaimLost``).  So every write of a claimant is issued within
``ttl_s / 4`` of a renewal that an observer must then watch for at least ``ttl_s`` more: under the
timing assumption that an operation takes effect within ``ttl_s / 2`` of being issued (the server
uses twice the GC grace), the old claimant's last write has landed or failed before a taker
cleans up, and its next write needs a renewal, which fails.  Two takers race on If-Match: one
wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import uuid
from collections import OrderedDict
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Coroutine,
    Iterable,
    Sequence,
)
from typing import Any, TypeVar

from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    LogContention,
    ObjectNotFound,
    PreconditionFailed,
    ProcessDeath,
    StoreUnavailable,
)
from .layout import load_manifest
from .manifest import Manifest
from .paths import (
    CLAIM_PATH,  # re-exported: callers name the claim through this module
    CURSOR_PREFIX,
    GC_PREFIX,
    LOG_PREFIX,
    MANIFEST_PATH,
    SNAPSHOT_PREFIX,
    join,
)
from .store import ObjectStore, etag_matches_content, put_resolving

T = TypeVar("T")

# What a dead attempt may have left of a log that does not exist (its manifest never landed).
_LEFTOVER_DIRS = (CURSOR_PREFIX, LOG_PREFIX, SNAPSHOT_PREFIX, GC_PREFIX)
# Releases started by a cancelled attempt, kept referenced until they end.
_RELEASING: set[asyncio.Task[None]] = set()


class CreationInProgress(LogContention):
    """Another attempt holds the claim on creating this log (a fork, or a first write); retry
    later.  A crashed attempt's claim expires (``ClaimWatch``)."""


class ClaimLost(LogContention):
    """Our claim was taken over (we were slower than its expiry) or our objects were replaced,
    or this attempt already failed or gave its claim up: nothing more may be written, and nothing
    was committed."""


def holder_ttl_s(data: bytes) -> float | None:
    """The TTL a stored claim's holder renews by (``ttl_s``), if it says (and says it sanely)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    ttl = doc.get("ttl_s") if isinstance(doc, dict) else None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        return None
    return float(ttl) if math.isfinite(ttl) and ttl > 0 else None


class ClaimWatch:
    """First sightings of claims by this process, on its monotonic clock; the claim TTL.

    One per process (the server keeps it on its log manager).  Bounded: the oldest sightings are
    forgotten first, which only restarts their wait.  A claim is judged by the longer of this
    process's TTL and the one its holder recorded (``holder_ttl_s``).
    """

    def __init__(
        self, ttl_s: float, *, clock: Clock = SYSTEM_CLOCK, max_entries: int = 4096
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.ttl_s = ttl_s
        self.clock = clock
        self._max = max_entries
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def wait_s(self, holder_ttl: float | None = None) -> float:
        """How long a claim must show one etag here before it is dead: the longer TTL."""
        return self.ttl_s if holder_ttl is None else max(self.ttl_s, holder_ttl)

    def expired(self, key: str, etag: str, holder_ttl: float | None = None) -> bool:
        """Whether the claim at ``key`` has shown ``etag`` for ``wait_s(holder_ttl)`` as seen
        here (the first sighting starts the wait)."""
        now = self.clock.monotonic()
        seen = self._seen.get(key)
        if seen is None or seen[0] != etag.strip('"'):
            self._seen[key] = (etag.strip('"'), now)
            self._seen.move_to_end(key)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
            return False
        return now - seen[1] >= self.wait_s(holder_ttl)

    def remaining_s(self, key: str, holder_ttl: float | None = None) -> float:
        """How long a claim seen at ``key`` still has before it expires here (all of it when
        unseen)."""
        wait = self.wait_s(holder_ttl)
        seen = self._seen.get(key)
        if seen is None:
            return wait
        return max(0.0, wait - (self.clock.monotonic() - seen[1]))

    def forget(self, key: str) -> None:
        """Drop a sighting (the claim is ours now, or gone)."""
        self._seen.pop(key, None)


class Claim:
    """A claim this process holds (see the module docstring)."""

    def __init__(
        self,
        store: ObjectStore,
        key: str,
        etag: str,
        doc: dict[str, Any],
        watch: ClaimWatch,
        renewed_at: float,
    ) -> None:
        self.store = store
        self.key = key
        self.etag = etag
        self._doc = doc
        self._watch = watch
        self._renewed_at = renewed_at
        self._lost = False  # taken over: the stored claim is not ours
        self._closed: str | None = None  # why no more writes may go out (failed, released, ...)
        self._in_flight = 0  # writes issued and not ended
        self._unsettled = False  # some write ended without a definite answer: it may still land
        self._lock = asyncio.Lock()
        self.commit_sent = False  # the manifest put went out: it may land, keep the claim

    @property
    def attempt(self) -> str:
        """This attempt's id (in the claim object)."""
        return str(self._doc["attempt"])

    @property
    def may_still_land(self) -> bool:
        """Whether some write of this attempt may still take effect: one in flight, one that
        ended ambiguously (an error that may hide a queued request, a timeout, a cancellation
        after it was issued), or the manifest put sent."""
        return self._in_flight > 0 or self._unsettled or self.commit_sent

    def _close(self, why: str) -> None:
        if self._closed is None:
            self._closed = why

    async def guard(self) -> None:
        """Call before every write to the log: renews the claim once ``ttl_s / 4`` has passed
        since the last renewal began; raises ``ClaimLost`` when it was taken over, or when this
        attempt has failed or given the claim up."""
        async with self._lock:
            if self._lost:
                raise ClaimLost(f"{self.key}: the claim was taken over")
            if self._closed is not None:
                raise ClaimLost(f"{self.key}: no more writes under this claim ({self._closed})")
            now = self._watch.clock.monotonic()
            if now - self._renewed_at < self._watch.ttl_s / 4:
                return
            doc = {**self._doc, "renewal": int(self._doc.get("renewal", 0)) + 1}
            try:
                self.etag = await put_resolving(
                    self.store, self.key, _encode(doc), if_match=self.etag
                )
            except PreconditionFailed:
                self._lost = True
                raise ClaimLost(f"{self.key}: the claim was taken over") from None
            self._doc, self._renewed_at = doc, now

    async def write(self, op: Callable[[], Awaitable[T]]) -> T:
        """Run one write to the log's objects under the claim: ``guard()`` first, then ``op``,
        counted from the moment it is issued.  It is settled when it returns or the store
        refused it (``PreconditionFailed``, ``ObjectNotFound``, or ``ClaimLost`` raised on such
        an answer); any other end — an ambiguous error, a cancellation — leaves it possibly
        landing later, and the claim is then never released (it expires).  Any failure closes
        the claim: the attempt has failed, and later writes (siblings included) are refused."""
        await self.guard()
        self._in_flight += 1
        try:
            return await op()
        except (PreconditionFailed, ObjectNotFound, ClaimLost):
            self._close("a write failed")
            raise
        except BaseException:
            self._unsettled = True
            self._close("a write failed and may still land")
            raise
        finally:
            self._in_flight -= 1

    @contextlib.asynccontextmanager
    async def kept_alive(self) -> AsyncIterator[Claim]:
        """Renew the claim every ``ttl_s / 4`` while the block runs, so a live attempt keeps it
        however long it takes — reading a large source, a manifest put in flight — and only a
        dead one's claim expires.  Safety does not rest on this: every write still calls
        ``guard()``, which fails once the claim was taken over."""

        async def beat() -> None:
            while not self._lost and self._closed is None:
                await asyncio.sleep(self._watch.ttl_s / 4)  # the renewal period
                try:
                    await self.guard()
                except ClaimLost:
                    return
                except (StoreUnavailable, OSError):
                    continue  # the next beat (or the next guard) tries again

        task = asyncio.create_task(beat(), name=f"claim:{self.key}")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def release(self) -> None:
        """Give the claim up (best effort: else it expires).  Closes it first, so no later write
        of this attempt goes out; releases only when nothing of it may still land (see
        ``may_still_land``) and the claim is still ours."""
        self._close("released")
        async with self._lock:  # never alongside a renewal: the etag must be the last one
            if self._lost or self.may_still_land:
                return
            self._lost = True  # given away: nothing of ours may be done under it any more
            doc = {**self._doc, "released": True}
            # Taken over (nothing to give), or the store is down (it expires).
            with contextlib.suppress(PreconditionFailed, StoreUnavailable, ObjectNotFound, OSError):
                self.etag = await put_resolving(
                    self.store, self.key, _encode(doc), if_match=self.etag
                )

    async def abandon(self, error: BaseException) -> None:
        """The attempt failed with ``error``: close the claim, and release it only when no write
        of it may still land (none in flight or ended ambiguously, the manifest put not sent)
        and the process is not to be taken as dead (a simulated crash, an interpreter exit).  A
        cancelled attempt releases shielded from further cancellation."""
        self._close(f"the attempt failed: {type(error).__name__}")
        if isinstance(error, ProcessDeath) or self._lost or self.may_still_land:
            return
        if isinstance(error, asyncio.CancelledError):
            task = asyncio.get_running_loop().create_task(
                self.release(), name=f"release:{self.key}"
            )
            _RELEASING.add(task)
            task.add_done_callback(_RELEASING.discard)
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)
            return
        if isinstance(error, Exception):
            await self.release()

    async def finish(self) -> None:
        """The manifest exists: the claim means nothing any more (best effort)."""
        self._close("finished")
        # A leftover claim of an existing log is harmless.
        with contextlib.suppress(StoreUnavailable, OSError):
            await self.store.delete(self.key)


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def released_copy(data: bytes) -> bytes:
    """A stored claim's bytes, given up (a damaged one becomes a bare tombstone)."""
    try:
        doc = json.loads(data)
    except ValueError:
        doc = None
    return _encode({**(doc if isinstance(doc, dict) else {}), "released": True})


async def release_if_dead(store: ObjectStore, key: str, watch: ClaimWatch) -> bool:
    """Whether no creation claim stands at ``key`` (none, released, or dead: unchanged for the
    longer of the watch's and its holder's TTL, in which case it is released here by If-Match,
    which fences its holder off should it be only slow: its next renewal fails)."""
    try:
        got = await store.get(key)
    except ObjectNotFound:
        return True
    if claim_released(got.data):
        return True
    if not watch.expired(key, got.etag, holder_ttl_s(got.data)):
        return False
    try:
        await put_resolving(store, key, released_copy(got.data), if_match=got.etag)
    except PreconditionFailed:
        return False  # it changed: its holder is alive (or someone took it over)
    except ObjectNotFound:
        return True
    watch.forget(key)
    return True


def claim_released(data: bytes) -> bool:
    """Whether a stored claim was given up (anyone may take it)."""
    try:
        doc = json.loads(data)
    except ValueError:
        return False  # damaged: judged like a live claim (it expires)
    return isinstance(doc, dict) and doc.get("released") is True


async def claim_log(
    store: ObjectStore,
    prefix: str,
    *,
    purpose: str,
    holder: str,
    watch: ClaimWatch,
    leftovers: Sequence[str] = (),
    attempts: int = 8,
) -> Claim | None:
    """Claim the creation of the log at ``prefix`` and clean up leftovers (steps 1-3).

    Returns None when the log exists; raises ``CreationInProgress`` while another attempt holds a
    claim that has not expired as seen by ``watch``.  ``leftovers`` are further key prefixes
    (outside the log) that belong to the log and are cleaned up with it.
    """
    prefix = prefix.strip("/")
    key = join(prefix, CLAIM_PATH)
    if await load_manifest(store, prefix) is not None:
        return None
    # ttl_s: how long observers must see it unchanged, whatever their own TTL (the module
    # docstring); claimed_us is informational (nobody compares clocks).
    doc = {
        "attempt": uuid.uuid4().hex,
        "purpose": purpose,
        "holder": holder,
        "renewal": 0,
        "ttl_s": watch.ttl_s,
        "claimed_us": watch.clock.wall_us(),
    }
    body = _encode(doc)
    claim: Claim | None = None
    for _ in range(attempts):
        started = watch.clock.monotonic()
        try:
            etag = await put_resolving(store, key, body, if_none_match="*")
        except PreconditionFailed:
            try:
                got = await store.get(key)
            except ObjectNotFound:
                continue  # deleted meanwhile (its log was created): look again
            ttl = holder_ttl_s(got.data)
            if not (claim_released(got.data) or watch.expired(key, got.etag, ttl)):
                if await load_manifest(store, prefix) is not None:
                    return None  # a finished creation's claim, left behind
                raise CreationInProgress(
                    f"the creation of {prefix!r} is claimed by another attempt; retry in "
                    f"{watch.remaining_s(key, ttl):.0f} s at most"
                ) from None
            try:
                etag = await put_resolving(store, key, body, if_match=got.etag)
            except PreconditionFailed:
                continue  # someone else took or renewed it first
        claim = Claim(store, key, etag, doc, watch, started)
        watch.forget(key)
        break
    if claim is None:
        raise CreationInProgress(f"the claim on creating {prefix!r} kept changing")
    try:
        if await load_manifest(store, prefix) is not None:
            await claim.finish()
            return None
        for sub in (*(join(prefix, d) for d in _LEFTOVER_DIRS), *leftovers):
            await _delete_all(store, sub, claim)
    except BaseException as e:
        await claim.abandon(e)
        raise
    return claim


async def run_all(aws: Iterable[Coroutine[Any, Any, Any]]) -> None:
    """Run ``aws`` concurrently in an ``asyncio.TaskGroup``: the first failure cancels the rest,
    and this returns only once every one of them has ended; then that failure is raised as it is
    (not as a group), so callers see the store's own error."""
    try:
        async with asyncio.TaskGroup() as tg:
            for aw in aws:
                tg.create_task(aw)
    except BaseExceptionGroup as group:
        first: BaseException = group
        while isinstance(first, BaseExceptionGroup):
            first = first.exceptions[0]
        raise first from None


async def _delete_all(store: ObjectStore, prefix: str, claim: Claim, batch: int = 16) -> None:
    """Delete every object under ``prefix``, renewing the claim between batches; every delete
    is a claimed write (``Claim.write``) and a batch ends only when all of its deletes have."""

    def delete(key: str) -> Callable[[], Awaitable[None]]:
        return lambda: store.delete(key)

    keys = [m.key async for m in store.list(prefix)]
    for i in range(0, len(keys), batch):
        await run_all(claim.write(delete(k)) for k in keys[i : i + batch])


_PLAIN_MD5 = re.compile(r"[0-9a-f]{32}")


def _plain_md5(etag: str) -> bool:
    """Whether an etag is the content's MD5 (a single-part upload), not a multipart one."""
    return _PLAIN_MD5.fullmatch(etag.strip('"').lower()) is not None


async def copy_claimed(store: ObjectStore, src: str, dst: str, *, attempts: int = 8) -> None:
    """Copy an immutable object to ``dst`` (create-only) for a claimant.  An object found at
    ``dst`` is accepted only if it holds ``src``'s bytes (equal etags; when they differ and are
    not both plain MD5s, the bytes are compared): anything else was written there by someone
    else under our claim (``ClaimLost``)."""
    for _ in range(attempts):
        try:
            await store.copy(src, dst, if_none_match="*")
            return
        except PreconditionFailed:
            try:
                have = await store.head(dst)
            except ObjectNotFound:
                continue  # a conflicting write that did not land: try again
            want = await store.head(src)  # ObjectNotFound: the source is gone (collected)
            a, b = have.etag.strip('"'), want.etag.strip('"')
            if a and a == b:
                return
            if (
                not (a and b and _plain_md5(a) and _plain_md5(b))
                and (await store.get(dst)).data == (await store.get(src)).data
            ):
                return
            raise ClaimLost(
                f"{dst}: an object other than a copy of {src} appeared under our claim"
            ) from None
    raise StoreUnavailable(f"could not copy {src} to {dst}: the store kept refusing")


async def put_claimed(store: ObjectStore, key: str, data: bytes, *, attempts: int = 8) -> None:
    """Create ``key`` with ``data`` for a claimant.  An object found there is accepted only if
    it holds exactly ``data`` (its etag names them; a multipart etag: the bytes are compared):
    anything else was written by someone else under our claim (``ClaimLost``)."""
    for _ in range(attempts):
        try:
            await put_resolving(store, key, data, if_none_match="*")
            return
        except PreconditionFailed:
            try:
                have = await store.head(key)
            except ObjectNotFound:
                continue  # a conflicting write that did not land: try again
            if etag_matches_content(have.etag, data):
                return
            if not _plain_md5(have.etag):
                try:
                    if (await store.get(key)).data == data:
                        return
                except ObjectNotFound:
                    continue
            raise ClaimLost(f"{key}: an object other than ours appeared under our claim") from None
    raise StoreUnavailable(f"could not create {key}: the store kept refusing")


async def create_log(
    store: ObjectStore,
    prefix: str,
    manifest: Manifest,
    *,
    holder: str,
    watch: ClaimWatch,
    leftovers: Sequence[str] = (),
) -> bool:
    """Create the log at ``prefix`` with ``manifest`` under a claim, after cleaning up what dead
    attempts left there; False when it exists already.  ``CreationInProgress`` while a fork (or
    another creation) holds the claim."""
    prefix = prefix.strip("/")
    claim = await claim_log(
        store, prefix, purpose="create", holder=holder, watch=watch, leftovers=leftovers
    )
    if claim is None:
        return False
    try:
        async with claim.kept_alive():
            await claim.guard()
            claim.commit_sent = True  # from here on it may land: an error keeps the claim
            await put_resolving(
                store, join(prefix, MANIFEST_PATH), manifest.to_bytes(), if_none_match="*"
            )
    except PreconditionFailed:
        await claim.finish()  # a manifest exists (ours is not it): the claim means nothing
        return False
    except BaseException as e:
        await claim.abandon(e)
        raise
    await claim.finish()
    return True
