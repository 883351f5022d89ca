"""wal3 adapters for the ``dirtylog`` package: the server's own dirty log (``WalDirtyBackend``,
which also reads the collection logs' tails), another server's (``StoredDirtyLog``), and the
collections' compaction cursors (``KnownCompactionOffsets``).  ``host.services.dirtyset`` owns the
open dirty log; ``host.services.rollups`` rolls it up."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from uuid import UUID

from dirtylog import DirtyLogHook, RollUp, RollUpResult
from wal3 import Limits, LogReader, LogWriter, ObjectStore
from wal3.claim import ClaimWatch, release_if_dead
from wal3.cursors import COMPACTION, CursorStore
from wal3.errors import ObjectNotFound, ProcessDeath
from wal3.gc import GarbageCollector, GcOptions
from wal3.layout import load_manifest, load_manifest_tail
from wal3.manifest import Manifest
from wal3.paths import (
    CLAIM_PATH,
    fragment_path,
    join,
    log_prefix,
)
from wal3.paths import dirty_prefix as dirty_prefix  # re-exported: tests and tools use it

from .forks import claim_ttl_s

_log = logging.getLogger("loghost.dirty")
# A mark this young may belong to a write still in flight, whatever the configured GC grace
# (tests and fault drills run with grace 0 and stall writes for seconds).
MIN_SETTLE_S = 60.0


class _Cursors:
    """The cursor part of ``dirtylog.DirtyLogBackend``, over a wal3 cursor store."""

    _cursors: CursorStore

    async def load_cursor(self, name: str) -> tuple[int, str] | None:
        """A cursor's offset and witness."""
        w = await self._cursors.load(name)
        return None if w is None else (w.cursor.offset, w.etag)

    async def create_cursor(self, name: str, offset: int) -> str:
        """Create a cursor."""
        return (await self._cursors.init(name, offset)).etag

    async def cas_cursor(self, name: str, offset: int, witness: str) -> str:
        """Compare-and-swap a cursor."""
        return (await self._cursors.save(name, offset, witness)).etag


class WalDirtyBackend(_Cursors):
    """``dirtylog.DirtyLogBackend`` over an open wal3 log, and ``dirtylog.LogTails`` over the
    collection logs of the same store (so roll-ups drop marks of writes that never landed)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        writer: LogWriter,
        gc: GcOptions,
        claim_ttl: float = 0.0,
    ) -> None:
        self._store = store
        # The spec's timing assumption: a writer finishes each operation within the GC grace.
        self.settle_s = max(MIN_SETTLE_S, gc.grace_s)
        self._writer = writer
        self._reader = LogReader(store, prefix)
        self._cursors = CursorStore(store, prefix, writer.options.writer_name)
        # Creation claims of forks in flight, as these roll-ups see them (see log_tails); one is
        # dead after the longer of this TTL and the one its holder recorded.
        self._claims = ClaimWatch(claim_ttl_s(gc.grace_s, claim_ttl))
        # No compactor reads a dirty log: its GC follows the stable_prefix cursor alone.
        gc = dataclasses.replace(gc, intrinsic_cursor=None)
        self._gc = GarbageCollector(store, prefix, gc, edit_manifest=writer.edit_manifest)

    @property
    def writer(self) -> LogWriter:
        """The dirty log's writer."""
        return self._writer

    async def append_many(self, bodies: list[bytes]) -> int:
        """Append durably; the first offset."""
        return (await self._writer.append_many(bodies)).first_offset

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        """Contiguous records from ``from_offset``."""
        recs = await self._reader.read(
            from_offset, Limits(max_records=max_records), manifest=self._writer.manifest
        )
        return [(r.offset, r.body) for r in recs]

    async def next_offset(self) -> int:
        """The next offset to be written."""
        return self._writer.manifest.next_offset

    async def oldest_offset(self) -> int:
        """The oldest retained offset."""
        return self._writer.manifest.oldest_offset

    async def collect_garbage(self) -> None:
        """Advance the dirty log's own garbage collection."""
        await self._gc.run_once()

    async def log_tails(self, ids: Sequence[UUID], concurrency: int = 32) -> dict[UUID, int | None]:
        """Each collection log's next offset, from its manifest in the store (the truth: a
        committed write is there whichever process wrote it); logs without one are left out.

        None when a write may still land: the roll-up calls this for marks whose uploads have
        ended (``settle_s`` of the roll-up's own sightings), but a commit may be in flight for
        any time.  A manifest links only fragments already in the store, so the manifest is read
        first and then the object at its next sequence number: absent, nothing can land at or past this tail (a commit sent later
        would need an upload sent later, which no settled mark has); present, its commit may
        still land, or the next writer's read repair links it.  A sealed log takes no fragment.
        A log without a manifest may be being created (a fork's mark precedes its manifest):
        a creation claim that stands means None; with none, the manifest is read once more, since
        a creation may have committed and dropped its claim between the two reads.
        """
        out: dict[UUID, int | None] = {}
        sem = asyncio.Semaphore(concurrency)

        async def one(cid: UUID) -> None:
            prefix = log_prefix(cid)
            async with sem:
                # The tail alone: decoding all of each root is most of a pass's event-loop time.
                tail = await load_manifest_tail(self._store, prefix)
                if tail is None:
                    if await self._creating(prefix):
                        out[cid] = None
                        return
                    tail = await load_manifest_tail(self._store, prefix)
                    if tail is None:
                        return
                if not tail.sealed and await self._exists(
                    join(prefix, fragment_path(tail.next_seq_no))
                ):
                    out[cid] = None
                    return
            out[cid] = tail.next_offset

        await asyncio.gather(*(one(c) for c in ids))
        return out

    async def _creating(self, prefix: str) -> bool:
        """Whether a creation claim stands on the log (wal3.claim): a fork in flight.  One
        seen unchanged for the claim TTL is dead (a live holder renews): it is released, which
        fences its holder off, so a crashed fork's mark does not stay for ever."""
        return not await release_if_dead(self._store, join(prefix, CLAIM_PATH), self._claims)

    async def _exists(self, key: str) -> bool:
        try:
            await self._store.head(key)
        except ObjectNotFound:
            return False
        return True


class StoredDirtyLog(_Cursors):
    """Another server's dirty log, as the store has it: read and cursor-moved, never written.

    The manifest is read once, so a hand-over's window ends where the log ended when it began.
    """

    def __init__(
        self, store: ObjectStore, prefix: str, manifest: Manifest, writer_name: str
    ) -> None:
        self._manifest = manifest
        self._reader = LogReader(store, prefix)
        self._cursors = CursorStore(store, prefix, writer_name)

    @classmethod
    async def load(cls, store: ObjectStore, prefix: str, writer_name: str) -> StoredDirtyLog | None:
        """The log at ``prefix``, or None when there is none."""
        loaded = await load_manifest(store, prefix)
        return None if loaded is None else cls(store, prefix, loaded[0], writer_name)

    async def append_many(self, bodies: list[bytes]) -> int:
        """Never: only its own server writes a dirty log."""
        raise NotImplementedError("another server's dirty log is read-only here")

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        """Contiguous records from ``from_offset``."""
        recs = await self._reader.read(
            from_offset, Limits(max_records=max_records), manifest=self._manifest
        )
        return [(r.offset, r.body) for r in recs]

    async def next_offset(self) -> int:
        """The log's end when it was loaded."""
        return self._manifest.next_offset

    async def oldest_offset(self) -> int:
        """The oldest retained offset when it was loaded."""
        return self._manifest.oldest_offset

    async def collect_garbage(self) -> None:
        """Left to the log's own server (collecting here would write its manifest)."""


class DirtyLog:
    """The per-server dirty log, its hook, and its roll-up."""

    def __init__(self, backend: WalDirtyBackend, rollup: RollUp, hook: DirtyLogHook) -> None:
        self.backend = backend
        self.rollup = rollup
        self.hook = hook

    async def mark(self, collection_id: UUID, first_offset: int, count: int) -> None:
        """Record that a fragment of a collection log was written (fails the write if it fails)."""
        await self.hook.mark_dirty(collection_id, first_offset, count)

    async def run_now(self) -> RollUpResult:
        """Roll up immediately."""
        return await self.rollup.run()

    async def compacted(self, collection_id: UUID, offset: int) -> None:
        """A compaction cursor moved (``POST .../compaction``, already durable): clip the
        collection in memory at once and append a clear record, so the roll-up learns it
        without reading the cursor.  A failed append only keeps the collection listed longer
        (a later roll-up's bounded fallback reads the cursor): the request still succeeds."""
        try:
            await self.rollup.compacted(collection_id, offset)
        except ProcessDeath:
            raise
        except Exception as e:
            _log.warning("dirty log: clear record for %s not written: %r", collection_id, e)

    async def close(self) -> None:
        """Flush the dirty log."""
        await self.backend.writer.close()


async def compaction_offsets_from_store(
    store: ObjectStore,
    ids: Sequence[UUID],
    prefix_of: Callable[[UUID], str],
    known: Mapping[UUID, int],
    concurrency: int = 32,
) -> dict[UUID, int]:
    """Each collection's compaction cursor: from memory when known, else from the store."""
    out: dict[UUID, int] = {}
    missing = [cid for cid in ids if cid not in known]
    for cid in ids:
        if cid in known:
            out[cid] = known[cid]
    sem = asyncio.Semaphore(concurrency)

    async def one(cid: UUID) -> None:
        async with sem:
            w = await CursorStore(store, prefix_of(cid), "rollup").load(COMPACTION)
        if w is not None:
            out[cid] = w.cursor.offset

    await asyncio.gather(*(one(c) for c in missing))
    return out


class KnownCompactionOffsets:
    """``dirtylog.CompactionOffsets`` over the store, preferring what ``known()`` remembers (the
    open logs' compaction cursors, which only move forward)."""

    def __init__(self, store: ObjectStore, known: Callable[[], Mapping[UUID, int]]) -> None:
        self._store = store
        self._known = known

    async def compaction_offsets(self, ids: Sequence[UUID]) -> dict[UUID, int]:
        """Each collection's compaction cursor (those without one are left out)."""
        return await compaction_offsets_from_store(self._store, ids, log_prefix, self._known())
