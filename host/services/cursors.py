"""Cursors: reading, compare-and-swap (pinned against the collector), deleting, and the
compaction cursor's forward-only move (which schedules a GC visit and clips the dirty set)."""

from __future__ import annotations

from uuid import UUID

from wal3 import LogPurged, ObjectStore
from wal3.cursors import COMPACTION, Witness
from wal3.gc import pin_cursor

from ..errors import BadRequest, NotFound
from ..manager import LogHandle, LogManager
from ..models import CompactionResponse, CursorOut, CursorPut
from .dirtyset import HostDirtyLog
from .gc import GcScheduler


def _cursor_out(name: str, w: Witness) -> CursorOut:
    return CursorOut(
        name=name,
        offset=w.cursor.offset,
        epoch_us=w.cursor.epoch_us,
        writer=w.cursor.writer,
        witness=w.etag,
    )


class CursorService:
    """The cursors of collection logs, through the log manager."""

    def __init__(
        self, store: ObjectStore, manager: LogManager, dirty: HostDirtyLog, gc: GcScheduler
    ) -> None:
        self._store = store
        self._manager = manager
        self._dirty = dirty
        self._gc = gc

    async def get(self, tenant: str, cid: UUID, name: str) -> CursorOut:
        """A cursor and its witness; 404 when there is none."""
        async with self._manager.use(cid, tenant) as h:
            w = await h.cursors.load(name)
        if w is None:
            raise NotFound(f"no cursor {name}")
        return _cursor_out(name, w)

    async def put(self, tenant: str, cid: UUID, name: str, req: CursorPut) -> CursorOut:
        """Create (witness None) or compare-and-swap a cursor, within the log's live range."""
        async with self._manager.use(cid, tenant) as h:
            m = await self._manager.view(h)  # another host may have written the log
            if req.offset > m.next_offset:
                raise BadRequest(f"offset: {req.offset} is past the log's tail {m.next_offset}")
            if req.offset < m.oldest_offset:
                raise LogPurged(req.offset, m.oldest_offset)
            # Write, then confirm against gc/GARBAGE and the stored manifest that no collector
            # (here or in another process) has passed the offset; undone if one has.
            if name != COMPACTION:
                w = await pin_cursor(
                    self._store, h.prefix, h.cursors, name, req.offset, req.witness
                )
                return _cursor_out(name, w)
            async with h.compaction_order:
                previous = h.compaction_offset
                w = await pin_cursor(
                    self._store, h.prefix, h.cursors, name, req.offset, req.witness
                )
                await self._moved_back(h, previous, req.offset, m.next_offset)
        return _cursor_out(name, w)

    async def delete(self, tenant: str, cid: UUID, name: str) -> None:
        """Delete a cursor (the compaction cursor's absence means nothing compacted above the
        log's oldest offset)."""
        async with self._manager.use(cid, tenant) as h:
            if name != COMPACTION:
                await h.cursors.delete(name)
                return
            async with h.compaction_order:
                previous = h.compaction_offset
                await h.cursors.delete(name)
                m = await self._manager.view(h)
                await self._moved_back(h, previous, m.oldest_offset, m.next_offset)

    async def _moved_back(self, h: LogHandle, previous: int, offset: int, tail: int) -> None:
        """The compaction cursor is now ``offset``: lower the open log's memory of it (what
        fallbacks and clears use), and when it moved back, make ``[offset, tail)`` dirty again
        before answering (the dirty set's floor learnt from earlier compactions is higher)."""
        h.compaction_offset = offset
        if offset < previous:
            await self._dirty.uncompacted(h.collection_id, offset, tail)

    async def compacted(self, tenant: str, cid: UUID, offset: int) -> CompactionResponse:
        """Everything below ``offset`` is compacted: move the compaction cursor forward (never
        back), clip the dirty set and schedule a GC visit."""
        async with self._manager.use(cid, tenant) as h:
            tail = (await self._manager.view(h)).next_offset  # another host may have written
            if offset > tail:
                raise BadRequest(f"offset: {offset} is past the log's tail {tail}")
            async with h.compaction_order:
                w = await h.cursors.advance(COMPACTION, offset)
                h.note_compaction(w.cursor.offset)
                # The cursor is durable: GC may visit now, whatever the dirty log's store does.
                # The answer still waits for the clear record, as an append waits for its mark,
                # so a compactor that saw 200 knows the dirty log (not only this process) has it.
                self._gc.schedule(cid)
                await self._dirty.compacted(cid, h.compaction_offset)
                return CompactionResponse(compaction_offset=h.compaction_offset)
