"""Roll-up behaviour on the in-memory backend: ranges, compaction, purges, clears, cursor, GC."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyEntry,
    DirtyLogHook,
    DirtyRecord,
    DirtyRecordError,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RecordKind,
    RollUp,
    inspect_records,
    missing_from_dirty_set,
    score,
    select_entries,
)
from wal3.errors import LogPurged

from .helpers import T0_US, FakeClock, cid, decoded_from, spans


class World:
    """A dirty log, compaction cursors, a hook, a roll-up and a clock, wired together."""

    def __init__(self, **rollup_kwargs: int) -> None:
        self.clock = FakeClock()
        self.backend = MemoryLogBackend()
        self.compaction = MemoryCompactionOffsets()
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = RollUp(self.backend, self.compaction, clock=self.clock, **rollup_kwargs)

    async def write(self, c: uuid.UUID, first: int, n: int) -> None:
        await self.hook.mark_dirty(c, first, n)

    def compact(self, c: uuid.UUID, offset: int) -> None:
        self.compaction.set(c, offset)
        self.rollup.note_compacted(c, offset)


async def test_marks_for_many_collections_coalesce_into_ranges() -> None:
    w = World(max_records_per_read=7)
    # 10 collections, 4 fragments each, interleaved: 40 records.
    for frag in range(4):
        for i in range(10):
            await w.write(cid(i), 1 + frag * (i + 1), i + 1)
            w.clock.advance_s(1)
    result = await w.rollup.run()
    assert result.records_read == 40 and result.marks_read == 40
    assert w.backend.calls["read"] == 6  # ceil(40 / 7): reads are paged
    assert spans(w.rollup.entries()) == {cid(i): (1, 1 + 4 * (i + 1)) for i in range(10)}
    for i in range(10):
        e = w.rollup.entries()[cid(i)]
        assert e.num_records == 4 * (i + 1)
        assert e.first_insertion_us == T0_US + i * 1_000_000  # its first mark's time
        assert e.reinsert_count == 1
    assert result.cursor_from == 1 and result.cursor_to == 41
    assert result.reinserted == 10 and not result.wrote_clear and not result.idle
    assert (await w.backend.load_cursor(CURSOR_NAME))[0] == 41  # type: ignore[index]


async def test_compaction_past_limit_drops_and_new_writes_bring_back() -> None:
    w = World()
    await w.write(cid(1), 1, 10)
    await w.write(cid(2), 1, 3)
    await w.rollup.run()
    w.compaction.set(cid(1), 11)  # compacted, but not noted in memory: the roll-up must drop it
    result = await w.rollup.run()
    assert spans(result.entries) == {cid(2): (1, 4)}
    assert result.marks_fully_compacted == 1
    await w.write(cid(1), 11, 2)
    await w.rollup.run()
    assert spans(w.rollup.entries()) == {cid(1): (11, 13), cid(2): (1, 4)}
    assert w.rollup.entries()[cid(1)].reinsert_count == 1


async def test_partial_compaction_clips_start() -> None:
    w = World()
    await w.write(cid(1), 1, 10)
    w.compaction.set(cid(1), 4)
    await w.rollup.run()
    e = w.rollup.entries()[cid(1)]
    assert (e.start, e.limit, e.num_records) == (4, 11, 7)


async def test_reappend_increments_reinsert_and_keeps_first_insertion() -> None:
    w = World()
    t_first = w.clock.now_us
    await w.write(cid(1), 1, 2)
    for expected in (1, 2, 3):
        w.clock.advance_s(10)
        await w.rollup.run()
        e = w.rollup.entries()[cid(1)]
        assert (e.reinsert_count, e.first_insertion_us) == (expected, t_first)
    # A newer mark does not make the entry look younger.
    await w.write(cid(1), 3, 1)
    await w.rollup.run()
    e = w.rollup.entries()[cid(1)]
    assert (e.start, e.limit, e.reinsert_count, e.first_insertion_us) == (1, 4, 4, t_first)
    # The dirty log holds one carried record per dirty collection after each roll-up.
    cursor = (await w.backend.load_cursor(CURSOR_NAME))[0]  # type: ignore[index]
    tail = await decoded_from(w.backend, cursor)
    assert [r for _, r in tail] == [DirtyRecord(cid(1), 1, 3, t_first, 4, RecordKind.MARK_DIRTY)]


async def test_compaction_progress_resets_reinsert_count_durably() -> None:
    w = World()
    await w.write(cid(1), 1, 10)
    await w.rollup.run()
    await w.rollup.run()
    assert w.rollup.entries()[cid(1)].reinsert_count == 2
    w.compact(cid(1), 5)
    assert w.rollup.entries()[cid(1)].reinsert_count == 0  # in memory at once
    await w.rollup.run()
    e = w.rollup.entries()[cid(1)]
    assert (e.start, e.reinsert_count) == (5, 1)  # and durably: counted again from 0
    await w.rollup.run()
    assert w.rollup.entries()[cid(1)].reinsert_count == 2  # no progress: keeps climbing


async def test_clear_record_cursor_advance_and_gc() -> None:
    w = World()
    await w.write(cid(1), 1, 1)
    await w.write(cid(2), 1, 1)
    await w.rollup.run()  # carries both: offsets 3, 4
    w.compaction.set(cid(1), 2)
    w.compaction.set(cid(2), 2)
    result = await w.rollup.run()
    assert result.entries == {} and result.wrote_clear and result.reinserted == 0
    assert (result.cursor_from, result.cursor_to) == (3, 5)
    tail = await decoded_from(w.backend, 5)
    assert [r.kind for _, r in tail] == [RecordKind.CLEAR]
    assert tail[0][1].collection_id.int == 0
    # GC reclaimed the consumed prefix.
    assert await w.backend.oldest_offset() == 5
    for offset in (1, 4):
        with pytest.raises(LogPurged):
            await w.backend.read(offset, 1)
    # An idle window (just the clear) writes nothing and keeps the cursor; the pass reads nothing
    # (the clear is its own, and it folds only what was appended since the last pass).
    appends = w.backend.calls["append"]
    idle = await w.rollup.run()
    assert idle.idle and idle.entries == {} and idle.records_read == 0
    assert w.backend.calls["append"] == appends
    assert (await w.backend.load_cursor(CURSOR_NAME))[0] == 5  # type: ignore[index]
    # ... and the next write is picked up from there.
    await w.write(cid(3), 1, 4)
    assert spans((await w.rollup.run()).entries) == {cid(3): (1, 5)}


async def test_empty_log_is_idle() -> None:
    w = World()
    result = await w.rollup.run()
    assert result.idle and result.entries == {}
    assert await w.backend.next_offset() == 1


async def test_purge_drops_earlier_marks_but_never_later_ones() -> None:
    w = World()
    await w.write(cid(1), 1, 5)
    await w.write(cid(2), 1, 5)
    await w.hook.purge([cid(1), cid(2)])
    await w.write(cid(2), 6, 2)  # written after the purge: must survive it
    result = await w.rollup.run()
    assert spans(result.entries) == {cid(2): (6, 8)}
    assert result.purges_read == 2
    # Purges are not carried: the next roll-up keeps the same set.
    assert spans((await w.rollup.run()).entries) == {cid(2): (6, 8)}
    # A purge also removes carried records of earlier roll-ups.
    await w.hook.purge([cid(2)])
    assert (await w.rollup.run()).entries == {}


class PurgesDuringLookup(MemoryCompactionOffsets):
    """Inside a run (after its window is fixed), an operator purges a collection."""

    def __init__(self) -> None:
        super().__init__()
        self.rollup: RollUp | None = None
        self.purge_task: asyncio.Task[int | None] | None = None

    async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        if self.purge_task is None and self.rollup is not None:
            self.purge_task = asyncio.create_task(self.rollup.purge([cid(2)]))
            # Hand the loop to the purge for a few turns (deterministic scheduling, not timing): an
            # unserialised purge would append now, before this run's re-appends.
            for _ in range(5):
                await asyncio.sleep(0)
        return await super().compaction_offsets(ids)


async def test_rollup_purge_updates_memory_and_is_serialised_with_rollups() -> None:
    w = World()
    await w.write(cid(1), 1, 5)
    await w.write(cid(2), 1, 5)
    await w.rollup.run()
    assert await w.rollup.purge([cid(1)]) is not None
    assert spans(w.rollup.entries()) == {cid(2): (1, 6)}
    assert spans((await w.rollup.run()).entries) == {cid(2): (1, 6)}
    # A purge issued while a roll-up is in flight must land after that roll-up's re-appends, or the
    # re-append would resurrect the purged collection.
    lookup = PurgesDuringLookup()
    w.rollup = RollUp(w.backend, lookup, clock=w.clock)
    lookup.rollup = w.rollup
    await w.rollup.run()
    assert lookup.purge_task is not None
    await lookup.purge_task
    assert spans((await w.rollup.run()).entries) == {}


async def test_purge_only_window_writes_a_clear() -> None:
    w = World()
    await w.hook.purge([cid(1)])
    result = await w.rollup.run()
    assert result.wrote_clear and not result.idle and result.cursor_to == 2
    assert [r.kind for _, r in await decoded_from(w.backend, 2)] == [RecordKind.CLEAR]


async def test_note_compacted_clips_resets_and_drops() -> None:
    w = World()
    await w.write(cid(1), 1, 10)
    await w.rollup.run()
    await w.rollup.run()
    w.rollup.note_compacted(cid(1), 4)
    e = w.rollup.entries()[cid(1)]
    assert (e.start, e.limit, e.num_records, e.reinsert_count) == (4, 11, 7, 0)
    w.rollup.note_compacted(cid(1), 11)
    assert w.rollup.entries() == {}
    w.rollup.note_compacted(cid(9), 3)  # unknown: no-op
    # The durable log still has it; the roll-up drops it through the compaction cursor.
    w.compaction.set(cid(1), 11)
    assert (await w.rollup.run()).entries == {}


class CompactsDuringLookup(MemoryCompactionOffsets):
    """Answers with the old cursors, then a compaction completes before the run swaps in."""

    def __init__(self) -> None:
        super().__init__()
        self.rollup: RollUp | None = None

    async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        answer = await super().compaction_offsets(ids)
        assert self.rollup is not None
        self.set(cid(1), 11)
        self.rollup.note_compacted(cid(1), 11)
        return answer


async def test_compaction_noted_during_a_run_survives_the_swap() -> None:
    w = World()
    w.compaction = CompactsDuringLookup()
    w.rollup = RollUp(w.backend, w.compaction, clock=w.clock)
    w.compaction.rollup = w.rollup
    await w.write(cid(1), 1, 10)
    await w.write(cid(2), 1, 10)
    result = await w.rollup.run()
    assert set(result.entries) == {cid(2)}
    assert set(w.rollup.entries()) == {cid(2)}


async def test_racing_rollups_are_safe() -> None:
    w = World(max_records_per_read=2)
    other = RollUp(w.backend, w.compaction, clock=w.clock, max_records_per_read=3)
    for i in range(6):
        await w.write(cid(i), 1, i + 1)
    a, b = await asyncio.gather(w.rollup.run(), other.run())
    assert a.conflicts + b.conflicts >= 1
    want = {cid(i): (1, i + 2) for i in range(6)}
    assert spans(a.entries) == spans(b.entries) == want
    # Duplicated carries converge on the next run.
    again = await w.rollup.run()
    assert spans(again.entries) == want and again.reinserted == 6


async def test_append_is_chunked() -> None:
    w = World(max_records_per_append=4)
    for i in range(10):
        await w.write(cid(i), 1, 1)
    appends = w.backend.calls["append"]
    await w.rollup.run()
    assert w.backend.calls["append"] - appends == 3


async def test_corrupt_record_fails_the_rollup_without_losing_anything() -> None:
    w = World()
    await w.write(cid(1), 1, 5)
    await w.rollup.run()
    await w.backend.append_many([b"\x00" * 47])
    before = w.rollup.entries()
    next_before = await w.backend.next_offset()
    with pytest.raises(DirtyRecordError, match="offset 3"):
        await w.rollup.run()
    assert w.rollup.entries() == before
    assert await w.backend.next_offset() == next_before  # nothing written
    assert (await w.backend.load_cursor(CURSOR_NAME))[0] == 2  # type: ignore[index]


async def test_inspect_records() -> None:
    w = World()
    await w.write(cid(1), 3, 4)
    await w.backend.append_many([b"junk"])
    await w.hook.purge([cid(1)])
    got = await inspect_records(w.backend, 1, 10)
    assert [g.offset for g in got] == [1, 2, 3]
    assert got[0].as_dict()["kind"] == "mark_dirty" and got[0].as_dict()["log_position"] == 3
    assert (
        got[1].record is None
        and "48 bytes" in (got[1].error or "")
        and got[1].raw_hex == b"junk".hex()
    )
    assert got[2].as_dict()["kind"] == "purge"
    assert [g.offset for g in await inspect_records(w.backend, 2, 1)] == [2]


def _entry(n: int, records: int, first_us: int, reinserts: int) -> DirtyEntry:
    return DirtyEntry(cid(n), 1, 1 + records, records, first_us, reinserts, 0.0)


def test_score_prefers_more_records_and_older() -> None:
    now = 1_000_000_000
    assert score(10, now, 0, now) > score(5, now, 0, now)
    assert score(5, now - 60_000_000, 0, now) > score(5, now, 0, now)
    assert score(5, now - 60_000_000, 0, now) == pytest.approx(10.0)
    assert score(5, now, 3, now) > score(5, now, 0, now)
    assert score(5, now + 10, 0, now) == score(5, now, 0, now)  # clock skew never goes negative


def test_select_qualifies_and_orders() -> None:
    now = 10_000_000_000
    entries = [
        _entry(1, 100, now, 0),  # big
        _entry(2, 2, now - 600_000_000, 0),  # small but old
        _entry(3, 2, now, 9),  # small, re-inserted a lot
        _entry(4, 2, now, 0),  # small and fresh: not yet
        _entry(5, 100, now - 60_000_000, 0),  # big and older than 1
    ]
    got = select_entries(
        entries, min_records=50, limit=10, now_us=now, max_age_s=300, max_reinserts=5
    )
    assert [e.collection_id for e in got] == [cid(5), cid(1), cid(2), cid(3)]
    assert got[0].score == pytest.approx(200.0)
    assert [
        e.collection_id for e in select_entries(entries, min_records=50, limit=1, now_us=now)
    ] == [cid(5)]
    assert select_entries(entries, min_records=1, limit=0, now_us=now) == []
    assert len(select_entries(entries, min_records=0, limit=10, now_us=now)) == 5
    d = got[0].as_dict()
    assert d["collection_id"] == str(cid(5)) and set(d) == {
        "collection_id",
        "start",
        "limit",
        "num_records",
        "first_insertion_us",
        "reinsert_count",
        "score",
    }


async def test_rollup_select_uses_the_rolled_up_set() -> None:
    w = World()
    await w.write(cid(1), 1, 100)
    await w.write(cid(2), 1, 1)
    await w.rollup.run()
    assert [e.collection_id for e in w.rollup.select(min_records=50, limit=10)] == [cid(1)]
    chosen = w.rollup.select(min_records=50, limit=10, max_reinserts=0)
    assert [e.collection_id for e in chosen] == [cid(1), cid(2)]


def test_missing_from_dirty_set() -> None:
    entries = {cid(1): _entry(1, 5, 0, 0)}
    known = {cid(1): (6, 1), cid(2): (6, 6), cid(3): (9, 2)}
    assert missing_from_dirty_set(known, entries) == {cid(3)}
    assert missing_from_dirty_set(known, list(entries.values())) == {cid(3)}


def test_rollup_rejects_bad_limits() -> None:
    with pytest.raises(ValueError):
        RollUp(MemoryLogBackend(), MemoryCompactionOffsets(), max_records_per_read=0)


async def test_a_late_compaction_note_below_an_entry_leaves_it_whole() -> None:
    """A note for an offset below the entry's start (a compactor answering late, or a second
    compactor behind the first) must not widen the entry: the clip is max(start, offset)."""
    w = World()
    await w.write(cid(1), 1, 10)
    await w.rollup.run()
    w.rollup.note_compacted(cid(1), 6)
    w.rollup.note_compacted(cid(1), 3)  # late and lower
    e = w.rollup.entries()[cid(1)]
    assert (e.start, e.limit, e.num_records) == (6, 11, 5)
