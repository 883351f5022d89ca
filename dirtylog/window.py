"""Whole-window reads of a dirty log: the hand-over of a departed server's set, and inspection.

:func:`hand_over` is a roll-up of another server's log whose re-appends go to ours: it folds the
whole window ``[cursor, end)`` (with a compaction-cursor lookup per marked collection: an operator's
one-off action, not the periodic pass) and appends before it moves the source's cursor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from .backend import CompactionOffsets, DirtyLogBackend, LogTails
from .coalesce import Coalescer, Monotonic, Observations
from .errors import RollUpError
from .record import DirtyRecord, DirtyRecordError, RecordKind

CURSOR_NAME = "stable_prefix"
_U32_MAX = (1 << 32) - 1


@dataclass(frozen=True, slots=True)
class InspectedRecord:
    """One raw dirty-log record, decoded for operators (``error`` set if it does not decode)."""

    offset: int
    record: DirtyRecord | None
    error: str | None = None
    raw_hex: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        if self.record is None:
            return {"offset": self.offset, "error": self.error, "raw_hex": self.raw_hex}
        return {"offset": self.offset, **self.record.as_dict()}


async def inspect_records(
    backend: DirtyLogBackend, from_offset: int, limit: int
) -> list[InspectedRecord]:
    """Decode up to ``limit`` raw records from ``from_offset``; ``LogPurged`` below the oldest."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out: list[InspectedRecord] = []
    for offset, body in await backend.read(from_offset, limit):
        try:
            out.append(InspectedRecord(offset, DirtyRecord.decode(body)))
        except DirtyRecordError as e:
            # Operators inspect precisely when something is wrong: show it, do not fail the page.
            out.append(InspectedRecord(offset, None, str(e), bytes(body).hex()))
    return out


@dataclass(slots=True)
class _Window:
    cursor: int
    witness: str
    end: int
    folder: Coalescer


async def read_window(
    backend: DirtyLogBackend,
    compaction: CompactionOffsets,
    cursor_name: str,
    max_read: int,
    tails: LogTails | None = None,
    observations: Observations | None = None,
    monotonic: Monotonic = time.monotonic,
) -> _Window:
    """Fold ``[cursor, end)`` of a dirty log, ``end`` being its next offset when we start."""
    # 1. Where the window starts.
    loaded = await backend.load_cursor(cursor_name)
    if loaded is None:
        cursor = await backend.oldest_offset()
        # A CursorConflict here means another roll-up created it first: retried by the caller.
        witness = await backend.create_cursor(cursor_name, cursor)
    else:
        cursor, witness = loaded
    # 2. Where it ends: fixed up front so concurrent writers and our own re-appends (all at or
    # above ``end``) are left for the next run, and a busy log cannot keep us reading forever.
    end = await backend.next_offset()
    # Everything below ``end`` was durable by now (this process's own, monotonic, observation).
    now = monotonic()
    seen = observations if observations is not None else Observations()
    seen.saw(end, now)

    # 3. Read the window page by page, folding as we go.
    compacted: dict[UUID, int] = {}
    known_tails: dict[UUID, int | None] = {}
    folder = Coalescer(
        compacted,
        known_tails if tails is not None else None,
        None if tails is None else tails.settle_s,
        lambda offset: seen.seen_at(offset, now),
        now,
    )
    pos = cursor
    while pos < end:
        page = await backend.read(pos, min(max_read, end - pos))
        if not page:
            raise RollUpError(f"dirty log returned nothing at {pos}, before its end {end}")
        records: list[tuple[int, DirtyRecord]] = []
        for offset, body in page:
            if offset >= end:
                break
            if offset != pos:
                raise RollUpError(f"dirty log read expected offset {pos}, got {offset}")
            try:
                records.append((offset, DirtyRecord.decode(body)))
            except DirtyRecordError as e:
                # Fail loudly: skipping could drop a dirty collection.  Nothing is lost while
                # we are stuck (the window stays), and the roll-up failure is visible.
                raise DirtyRecordError(f"dirty log offset {offset}: {e}") from e
            pos += 1
        # 4. Enrich with compaction cursors, once per collection per run.
        new_ids = list(
            dict.fromkeys(
                r.collection_id
                for _, r in records
                if r.kind == RecordKind.MARK_DIRTY and r.collection_id not in compacted
            )
        )
        if new_ids:
            found = await compaction.compaction_offsets(new_ids)
            for cid in new_ids:
                compacted[cid] = found.get(cid, 1)
        # 4b. Tails of logs with aged marks: read after those uploads ended, so they tell
        # (None: a write may still land there, whatever the marks' age).
        if tails is not None:
            tail_ids = list(
                dict.fromkeys(
                    r.collection_id
                    for o, r in records
                    if r.collection_id not in known_tails and folder.aged(r, o)
                )
            )
            if tail_ids:
                found_tails = await tails.log_tails(tail_ids)
                for cid in tail_ids:
                    known_tails[cid] = found_tails.get(cid, 1)
        for offset, record in records:
            folder.add(record, offset)
    return _Window(cursor, witness, end, folder)


def carry(folder: Coalescer) -> list[tuple[DirtyRecord, float]]:
    """A mark per still-dirty collection (two when some of its marks are unsettled), re-inserted
    once more, oldest first; each with the sighting it carries on (``Observations``)."""
    return [
        (
            DirtyRecord(
                cid,
                span.start,
                span.num_records,
                span.first_insertion_us,
                min(span.reinsert_count + 1, _U32_MAX),
                RecordKind.MARK_DIRTY,
            ),
            seen,
        )
        for cid, span, seen in folder.carried_seen()
    ]


@dataclass(frozen=True, slots=True)
class HandOverResult:
    """What :func:`hand_over` moved from one dirty log to another."""

    collections: int
    records_read: int
    cursor_from: int
    cursor_to: int


async def hand_over(
    source: DirtyLogBackend,
    target: DirtyLogBackend,
    compaction: CompactionOffsets,
    *,
    cursor_name: str = CURSOR_NAME,
    max_records_per_read: int = 1024,
    max_records_per_append: int = 1024,
    tails: LogTails | None = None,
) -> HandOverResult:
    """Move another server's dirty set into ``target`` (a server that is gone for good).

    It is a roll-up of ``source`` whose re-appends go to ``target``: the still-dirty collections
    are appended to ``target`` first, and only then does ``source``'s cursor move past the window,
    so at every instant each dirty collection has a mark in one of the two logs.  A crash repeats
    the hand-over (duplicates, which roll-ups coalesce), never loses a collection.  If the source's
    own server is alive after all, this is as safe as two racing roll-ups: one cursor move wins
    and the loser starts over from the new cursor.  ``source`` is only read and its cursor moved.

    Nothing of ``source`` was observed by this process, so every mark is first seen now and none
    is settled (unless ``settle_s`` is 0): the departed host's insertion times, from its own wall
    clock, are never trusted.  They settle in ``target``'s roll-ups, which see them afresh.
    """
    if tails is None and isinstance(target, LogTails):
        tails = target
    window = await read_window(source, compaction, cursor_name, max_records_per_read, tails)
    if not window.folder.saw_changes:
        return HandOverResult(0, window.end - window.cursor, window.cursor, window.cursor)
    carried = [r for r, _ in carry(window.folder)]
    bodies = [r.encode() for r in carried]
    for i in range(0, len(bodies), max_records_per_append):
        await target.append_many(bodies[i : i + max_records_per_append])
    await source.cas_cursor(cursor_name, window.end, window.witness)
    return HandOverResult(len(carried), window.end - window.cursor, window.cursor, window.end)
