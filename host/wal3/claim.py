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
   (at worst it makes ours fail, and nothing is committed).
5. Write the manifest (If-None-Match), then delete the claim.  An attempt that fails before step 5
   was sent, or that is refused at it, releases its claim (If-Match to a released tombstone) at
   once; one whose manifest put may still land (an ambiguous error, a crash) keeps it until it
   expires, so nobody cleans up under a commit that may still happen.

**Expiry without a lock service.**  A claim is never judged by comparing clocks: an observer
takes it over only after it has seen the *same etag* for ``ttl_s`` on its own monotonic clock
(``ClaimWatch``, first sight).  A live claimant renews its claim (If-Match, a new etag) every
``ttl_s / 4`` (``Claim.kept_alive``, so a slow step or a manifest put in flight never lets it
expire) and before any write once ``ttl_s / 4`` has passed since its last renewal began, and stops
at the first failed renewal (``ClaimLost``).  So every write of a claimant is issued within ``ttl_s / 4`` of a renewal
that an observer must then watch for ``ttl_s`` more: under the timing assumption that an operation
takes effect within ``ttl_s / 2`` of being issued (the server uses twice the GC grace), the old
claimant's last write has landed or failed before a taker cleans up, and its next write needs a
renewal, which fails.  Two takers race on If-Match: one wins.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from typing import Any

from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    LogContention,
    ObjectNotFound,
    PreconditionFailed,
    SimulatedCrash,
    StoreUnavailable,
)
from .layout import CURSOR_PREFIX, LOG_PREFIX, join, load_manifest
from .manifest import MANIFEST_PATH, Manifest
from .store import ObjectStore, put_resolving

CLAIM_PATH = "CLAIM"
# What a dead attempt may have left of a log that does not exist (its manifest never landed).
_LEFTOVER_DIRS = (CURSOR_PREFIX, LOG_PREFIX, "snapshot/", "gc/")


class CreationInProgress(LogContention):
    """Another attempt holds the claim on creating this log (a fork, or a first write); retry
    later.  A crashed attempt's claim expires (``ClaimWatch``)."""


class ClaimLost(LogContention):
    """Our claim was taken over (we were slower than its expiry) or our objects were replaced:
    nothing more may be written, and nothing was committed."""


class ClaimWatch:
    """First sightings of claims by this process, on its monotonic clock; the claim TTL.

    One per process (the server keeps it on its log manager).  Bounded: the oldest sightings are
    forgotten first, which only restarts their wait.
    """

    def __init__(self, ttl_s: float, *, clock: Clock = SYSTEM_CLOCK, max_entries: int = 4096
                 ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.ttl_s = ttl_s
        self.clock = clock
        self._max = max_entries
        self._seen: OrderedDict[str, tuple[str, float]] = OrderedDict()

    def expired(self, key: str, etag: str) -> bool:
        """Whether the claim at ``key`` has shown ``etag`` for ``ttl_s`` as seen here (the first
        sighting starts the wait)."""
        now = self.clock.monotonic()
        seen = self._seen.get(key)
        if seen is None or seen[0] != etag.strip('"'):
            self._seen[key] = (etag.strip('"'), now)
            self._seen.move_to_end(key)
            while len(self._seen) > self._max:
                self._seen.popitem(last=False)
            return False
        return now - seen[1] >= self.ttl_s

    def remaining_s(self, key: str) -> float:
        """How long a claim seen at ``key`` still has before it expires here (ttl when unseen)."""
        seen = self._seen.get(key)
        if seen is None:
            return self.ttl_s
        return max(0.0, self.ttl_s - (self.clock.monotonic() - seen[1]))

    def forget(self, key: str) -> None:
        """Drop a sighting (the claim is ours now, or gone)."""
        self._seen.pop(key, None)


class Claim:
    """A claim this process holds (see the module docstring)."""

    def __init__(self, store: ObjectStore, key: str, etag: str, doc: dict[str, Any],
                 watch: ClaimWatch, renewed_at: float) -> None:
        self.store = store
        self.key = key
        self.etag = etag
        self._doc = doc
        self._watch = watch
        self._renewed_at = renewed_at
        self._lost = False
        self._lock = asyncio.Lock()
        self.commit_sent = False  # the manifest put went out: it may land, keep the claim

    @property
    def attempt(self) -> str:
        """This attempt's id (in the claim object)."""
        return str(self._doc["attempt"])

    async def guard(self) -> None:
        """Call before every write to the log: renews the claim once ``ttl_s / 4`` has passed
        since the last renewal began; raises ``ClaimLost`` when it was taken over."""
        async with self._lock:
            if self._lost:
                raise ClaimLost(f"{self.key}: the claim was taken over")
            now = self._watch.clock.monotonic()
            if now - self._renewed_at < self._watch.ttl_s / 4:
                return
            doc = {**self._doc, "renewal": int(self._doc.get("renewal", 0)) + 1}
            try:
                self.etag = await put_resolving(self.store, self.key, _encode(doc),
                                                if_match=self.etag)
            except PreconditionFailed:
                self._lost = True
                raise ClaimLost(f"{self.key}: the claim was taken over") from None
            self._doc, self._renewed_at = doc, now

    @contextlib.asynccontextmanager
    async def kept_alive(self) -> AsyncIterator[Claim]:
        """Renew the claim every ``ttl_s / 4`` while the block runs, so a live attempt keeps it
        however long it takes — reading a large source, a manifest put in flight — and only a
        dead one's claim expires.  Safety does not rest on this: every write still calls
        ``guard()``, which fails once the claim was taken over."""
        async def beat() -> None:
            while not self._lost:
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
        """Give the claim up before any commit was sent (best effort: else it expires)."""
        if self._lost or self.commit_sent:
            return
        doc = {**self._doc, "released": True}
        try:
            self.etag = await put_resolving(self.store, self.key, _encode(doc),
                                            if_match=self.etag)
        except (PreconditionFailed, StoreUnavailable, ObjectNotFound, OSError):
            pass  # taken over (nothing to give), or the store is down (it expires)

    async def abandon(self, error: BaseException) -> None:
        """The attempt failed with ``error``: release the claim unless its commit may still land
        (the manifest put was sent) or the process is to be taken as dead (a simulated crash)."""
        if not isinstance(error, SimulatedCrash):
            await self.release()

    async def finish(self) -> None:
        """The manifest exists: the claim means nothing any more (best effort)."""
        try:
            await self.store.delete(self.key)
        except (StoreUnavailable, OSError):
            pass  # a leftover claim of an existing log is harmless


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
    watch's TTL, in which case it is released here by If-Match, which fences its holder off
    should it be only slow: its next renewal fails)."""
    try:
        got = await store.get(key)
    except ObjectNotFound:
        return True
    if claim_released(got.data):
        return True
    if not watch.expired(key, got.etag):
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


async def claim_log(store: ObjectStore, prefix: str, *, purpose: str, holder: str,
                    watch: ClaimWatch, leftovers: Sequence[str] = (), attempts: int = 8
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
    doc = {"attempt": uuid.uuid4().hex, "purpose": purpose, "holder": holder, "renewal": 0,
           "claimed_us": watch.clock.wall_us()}  # informational: nobody compares clocks
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
            if not (claim_released(got.data) or watch.expired(key, got.etag)):
                if await load_manifest(store, prefix) is not None:
                    return None  # a finished creation's claim, left behind
                raise CreationInProgress(
                    f"the creation of {prefix!r} is claimed by another attempt; retry in "
                    f"{watch.remaining_s(key):.0f} s at most") from None
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
    except Exception as e:
        await claim.abandon(e)
        raise
    return claim


async def _delete_all(store: ObjectStore, prefix: str, claim: Claim, batch: int = 16) -> None:
    """Delete every object under ``prefix``, renewing the claim between batches."""
    keys = [m.key async for m in store.list(prefix)]
    for i in range(0, len(keys), batch):
        await claim.guard()
        await asyncio.gather(*(store.delete(k) for k in keys[i:i + batch]))


async def create_log(store: ObjectStore, prefix: str, manifest: Manifest, *, holder: str,
                     watch: ClaimWatch, leftovers: Sequence[str] = ()) -> bool:
    """Create the log at ``prefix`` with ``manifest`` under a claim, after cleaning up what dead
    attempts left there; False when it exists already.  ``CreationInProgress`` while a fork (or
    another creation) holds the claim."""
    prefix = prefix.strip("/")
    claim = await claim_log(store, prefix, purpose="create", holder=holder, watch=watch,
                            leftovers=leftovers)
    if claim is None:
        return False
    try:
        async with claim.kept_alive():
            await claim.guard()
            claim.commit_sent = True  # from here on it may land: an error keeps the claim
            await put_resolving(store, join(prefix, MANIFEST_PATH), manifest.to_bytes(),
                                if_none_match="*")
    except PreconditionFailed:
        await claim.finish()  # a manifest exists (ours is not it): the claim means nothing
        return False
    except Exception as e:
        await claim.abandon(e)
        raise
    await claim.finish()
    return True
