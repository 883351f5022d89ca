"""Whole-window reads' contract, rule by rule (issue 23: mutation testing of dirtylog/window.py).

``read_window`` dates each record by the sightings it is given and clips aged marks to tails read
only for them; ``hand_over`` re-appends each collection once more; a backend that misbehaves is
named in the error.  Time is passed in by hand; nothing sleeps.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

import pytest

from dirtylog import (
    DirtyRecord,
    DirtyRecordError,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    MemoryLogTails,
    RecordKind,
    hand_over,
)
from dirtylog.coalesce import Coalesced, Observations
from dirtylog.errors import RollUpError
from dirtylog.window import CURSOR_NAME, read_window

from .helpers import T0_US, cid, decoded_from

A, B, C = cid(1), cid(2), cid(3)
U32_MAX = (1 << 32) - 1


def mark(c: uuid.UUID, start: int, n: int, reinserts: int = 0) -> DirtyRecord:
    return DirtyRecord(c, start, n, T0_US, reinserts, RecordKind.MARK_DIRTY)


async def log_of(*records: DirtyRecord) -> MemoryLogBackend:
    backend = MemoryLogBackend()
    await backend.append_many([r.encode() for r in records])
    return backend


class RecordingOffsets(MemoryCompactionOffsets):
    def __init__(self) -> None:
        super().__init__()
        self.asked: list[list[uuid.UUID]] = []

    async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        self.asked.append(list(ids))
        return await super().compaction_offsets(ids)


class RecordingTails(MemoryLogTails):
    def __init__(self, settle_s: float) -> None:
        super().__init__(settle_s)
        self.asked: list[list[uuid.UUID]] = []

    async def log_tails(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        self.asked.append(list(ids))
        return await super().log_tails(ids)


async def test_a_window_is_dated_by_the_sightings_it_is_given() -> None:
    """Marks this process saw durable 100 s ago are aged: each is clipped to its log's tail,
    read for them alone; an absent tail is an empty log (1), where nothing of a mark landed."""
    backend = await log_of(mark(A, 1, 10), mark(B, 1, 4), mark(C, 5, 2))
    obs = Observations()
    obs.saw(await backend.next_offset(), 0.0)
    tails = RecordingTails(30.0)
    tails.set(A, 6)
    window = await read_window(
        backend, MemoryCompactionOffsets(), CURSOR_NAME, 100, tails, obs, lambda: 100.0
    )
    assert window.folder.result() == {A: Coalesced(1, 6, T0_US, 0)}  # B and C never landed
    assert window.folder.marks_beyond_tail == 2
    assert tails.asked == [[A, B, C]]
    assert (window.cursor, window.end) == (1, 4)


async def test_marks_seen_too_recently_are_neither_judged_nor_clipped() -> None:
    backend = await log_of(mark(A, 1, 10))
    obs = Observations()
    obs.saw(await backend.next_offset(), 90.0)
    tails = RecordingTails(30.0)
    tails.set(A, 6)
    window = await read_window(
        backend, MemoryCompactionOffsets(), CURSOR_NAME, 100, tails, obs, lambda: 100.0
    )
    assert window.folder.result() == {A: Coalesced(1, 11, T0_US, 0)}
    assert tails.asked == []


async def test_a_hand_over_looks_up_each_marked_collection_once_and_no_tail() -> None:
    """Compaction cursors: once per marked collection, whatever the pages; never for a collection
    only purged.  Tails: none, since nothing of a departed host's log is aged here."""
    backend = await log_of(
        mark(A, 1, 2), mark(A, 3, 2), DirtyRecord.purge(B, T0_US), mark(C, 1, 1), mark(A, 5, 1)
    )
    offsets, tails, target = RecordingOffsets(), RecordingTails(30.0), MemoryLogBackend()
    result = await hand_over(
        backend, target, offsets, max_records_per_read=2, max_records_per_append=1, tails=tails
    )
    assert offsets.asked == [[A], [C]]
    assert tails.asked == []
    assert result.collections == 2 and result.cursor_to == 6


async def test_a_hand_over_reinserts_each_collection_once_more() -> None:
    backend = await log_of(mark(A, 1, 2, reinserts=3), mark(B, 4, 1, reinserts=U32_MAX))
    target = MemoryLogBackend()
    await hand_over(backend, target, MemoryCompactionOffsets())
    carried = {r.collection_id: r.reinsert_count for _, r in await decoded_from(target, 1)}
    assert carried == {A: 4, B: U32_MAX}


class OverReadingBackend(MemoryLogBackend):
    """Returns more than it was asked for, and a writer appends right after the end is read."""

    def __init__(self) -> None:
        super().__init__()
        self.late: bytes | None = None

    async def next_offset(self) -> int:
        end = await super().next_offset()
        if self.late is not None:
            late, self.late = self.late, None
            await self.append_many([late])
        return end

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        return await super().read(from_offset, max_records + 10)


async def test_records_at_or_past_the_windows_end_are_left_for_the_next_run() -> None:
    source = OverReadingBackend()
    await source.append_many([mark(A, 1, 2).encode()])
    source.late = mark(B, 1, 2).encode()  # lands at the window's end, 2
    target = MemoryLogBackend()
    result = await hand_over(source, target, MemoryCompactionOffsets())
    assert (result.cursor_from, result.cursor_to, result.records_read) == (1, 2, 1)
    assert [r.collection_id for _, r in await decoded_from(target, 1)] == [A]


class EmptyPageBackend(MemoryLogBackend):
    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        return []


class SkippingBackend(MemoryLogBackend):
    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        page = await super().read(from_offset, max_records)
        return page[1:] if from_offset == 1 else page


async def test_a_misbehaving_backend_is_named_in_the_error() -> None:
    target = MemoryLogBackend()
    for backend_type, error, text in (
        (EmptyPageBackend, RollUpError, "dirty log returned nothing at 1, before its end 3"),
        (SkippingBackend, RollUpError, "dirty log read expected offset 1, got 2"),
    ):
        backend = backend_type()
        await backend.append_many([mark(A, 1, 1).encode(), mark(B, 1, 1).encode()])
        with pytest.raises(error, match=f"^{text}$"):
            await hand_over(backend, target, MemoryCompactionOffsets())
    backend = MemoryLogBackend()
    await backend.append_many([mark(A, 1, 1).encode(), b"\x00" * 48])
    with pytest.raises(DirtyRecordError, match=r"^dirty log offset 2: "):
        await hand_over(backend, target, MemoryCompactionOffsets())
    assert await target.next_offset() == 1  # nothing was handed over
