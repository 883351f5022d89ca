"""The roll-up's contract, pinned rule by rule (issue 23: mutation testing of dirtylog/rollup.py).

Each test checks one promise of ``dirtylog/rollup.py``'s docstrings: what a roll-up re-appends and
reports, what it drops once settled or compacted, how sightings carry over crashes and races, how
conflicts are retried, and the texts operators see.  Time is a fake clock that the tests move by
hand (wall and monotonic alike); nothing sleeps.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence

import pytest

from dirtylog import (
    DirtyEntry,
    DirtyLogHook,
    DirtyRecord,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    MemoryLogTails,
    RecordKind,
    RollUp,
    hand_over,
    inspect_records,
    score,
)
from dirtylog.rollup import Coalescer, Observations, RollUpError
from wal3.errors import CursorConflict, LogPurged

from .helpers import T0_US, FakeClock, cid, decoded_from, spans


class World:
    """A dirty log, compaction cursors, log tails, a hook and a roll-up on one fake clock."""

    def __init__(
        self,
        settle_s: float = 30.0,
        compaction: MemoryCompactionOffsets | None = None,
        backend: MemoryLogBackend | None = None,
        **kw: object,
    ) -> None:
        self.clock = FakeClock()
        self.backend = backend if backend is not None else MemoryLogBackend()
        self.compaction = compaction if compaction is not None else MemoryCompactionOffsets()
        self.tails = MemoryLogTails(settle_s)
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = RollUp(
            self.backend,
            self.compaction,
            clock=self.clock,
            tails=self.tails,
            monotonic=self.mono,
            **kw,
        )  # type: ignore[arg-type]

    def mono(self) -> float:
        return self.clock.now_us / 1e6

    async def committed(self, c: uuid.UUID, first: int, n: int) -> None:
        await self.hook.mark_dirty(c, first, n)
        self.tails.set(c, max(self.tails.tails.get(c, 1), first + n))

    async def lost(self, c: uuid.UUID, first: int, n: int) -> None:
        await self.hook.mark_dirty(c, first, n)


def mark(c: uuid.UUID, start: int, n: int, t_us: int = T0_US, reinserts: int = 0) -> DirtyRecord:
    return DirtyRecord(c, start, n, t_us, reinserts, RecordKind.MARK_DIRTY)


# ------------------------------------------------------------------------------- Observations


def test_an_offset_no_roll_up_has_read_past_is_seen_now() -> None:
    obs = Observations()
    assert obs.seen_at(5, 7.0) == 7.0
    obs.saw(10, 1.0)
    assert obs.seen_at(9, 7.0) == 1.0
    assert obs.seen_at(10, 7.0) == 7.0  # the end itself was not yet durable


def test_forgetting_below_the_cursor_keeps_the_sightings_above_it() -> None:
    obs = Observations()
    obs.saw(10, 1.0)
    obs.saw(20, 2.0)
    obs.carried(10, [0.5, 0.25])
    obs.forget_below(10)
    assert obs.seen_at(15, 9.0) == 2.0
    assert obs.seen_at(10, 9.0) == 0.5 and obs.seen_at(11, 9.0) == 0.25


# -------------------------------------------------------------------------------- Coalescer


def test_the_coalescer_counts_each_clear_purge_and_mark() -> None:
    folder = Coalescer()
    assert (folder.clears, folder.purges, folder.marks) == (0, 0, 0)
    folder.add(DirtyRecord.clear(T0_US))
    folder.add(DirtyRecord.clear(T0_US))
    folder.add(mark(cid(1), 1, 3))
    assert (folder.clears, folder.marks) == (2, 1)


def test_without_tails_settle_time_changes_nothing() -> None:
    folder = Coalescer(settle_s=5.0)
    folder.add(mark(cid(1), 1, 3, T0_US + 10))
    folder.add(mark(cid(1), 4, 3, T0_US))
    assert folder.result()[cid(1)].first_insertion_us == T0_US  # min, as for any settled fold
    sighted = Coalescer(seen_at={1: 3.0, 2: 1.0, 3: 2.0}.__getitem__, now=9.0)
    for offset in (1, 2, 3):
        sighted.add(mark(cid(1), offset, 1), offset)
    assert [t for _, _, t in sighted.carried_seen()] == [1.0]  # all settled: the oldest sighting
    folder = Coalescer(tails={cid(1): 2}, settle_s=None)
    folder.add(mark(cid(1), 1, 3), 7)
    assert folder.result()[cid(1)].limit == 4  # no settle time: never clipped


def test_a_coalescer_without_a_clock_sees_every_mark_now() -> None:
    folder = Coalescer(tails={cid(1): 3}, settle_s=0.0, now=4.0)
    folder.add(mark(cid(1), 1, 5), 12)  # an offset, but no seen_at: seen "now", so aged
    assert folder.carried_seen() == [(cid(1), folder.result()[cid(1)], 4.0)]
    assert folder.result()[cid(1)].limit == 3
    seen = Coalescer(tails={cid(2): 9}, settle_s=0.0, seen_at=lambda o: 1.0, now=4.0)
    seen.add(mark(cid(2), 1, 5))  # no offset: seen now
    assert seen.carried_seen()[0][2] == 4.0


def test_a_collection_missing_from_the_tails_has_an_empty_log() -> None:
    folder = Coalescer(tails={}, settle_s=0.0, seen_at=lambda o: 0.0, now=1.0)
    folder.add(mark(cid(1), 1, 5), 1)
    assert folder.result() == {} and folder.marks_beyond_tail == 1


def test_carried_sightings_are_the_oldest_settled_and_the_newest_unsettled() -> None:
    a, b = cid(1), cid(2)
    sightings = {1: 10.0, 2: 20.0, 3: 90.0, 4: 95.0, 5: 5.0, 6: 91.0, 7: 92.0}
    folder = Coalescer(
        tails={a: 100, b: 100}, settle_s=30.0, seen_at=sightings.__getitem__, now=100.0
    )
    folder.add(mark(a, 1, 5, T0_US + 1), 1)  # settled, seen at 10
    folder.add(mark(a, 6, 5, T0_US + 2), 2)  # settled, seen at 20
    folder.add(mark(a, 11, 5, T0_US + 3), 3)  # unsettled, 90
    folder.add(mark(a, 16, 5, T0_US + 4), 4)  # unsettled, 95
    folder.add(mark(a, 21, 5, T0_US + 5), 6)  # unsettled, 91: older than the newest
    by_kind = {(c, s.start): t for c, s, t in folder.carried_seen()}
    assert by_kind == {(a, 1): 10.0, (a, 11): 95.0}
    spans_ = {(c, s.start): s for c, s, _ in folder.carried_seen()}
    assert spans_[(a, 1)].limit == 11  # both settled marks widened, not the last alone
    assert spans_[(a, 11)].first_insertion_us == T0_US + 5  # unsettled: the newest time
    assert spans_[(a, 11)].limit == 26
    # A purge forgets the sightings of what precedes it, settled and unsettled.
    folder.add(mark(b, 1, 5), 5)  # settled, seen at 5
    folder.add(mark(b, 6, 5), 4)  # unsettled, seen at 95
    folder.add(DirtyRecord.purge(b, T0_US), None)
    folder.add(mark(b, 11, 5), 2)  # settled, seen at 20
    folder.add(mark(b, 16, 5), 6)  # unsettled, seen at 91
    assert {(c, s.start): t for c, s, t in folder.carried_seen() if c == b} == {
        (b, 11): 20.0,
        (b, 16): 91.0,
    }
    # A collection's settled and unsettled spans are one entry, widened.
    assert folder.result()[a].start == 1 and folder.result()[a].limit == 26


# ---------------------------------------------------------------------------- settling in runs


async def test_a_mark_seen_exactly_settle_s_ago_has_settled() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)
    await w.lost(a, 6, 4)
    await w.rollup.run()
    w.clock.advance_s(30)  # exactly the settle time
    second = await w.rollup.run()
    assert spans(second.entries) == {a: (1, 6)}


async def test_lost_marks_are_counted_and_each_carried_mark_keeps_its_sighting() -> None:
    w = World()
    a, b = cid(1), cid(2)
    await w.lost(a, 1, 4)
    await w.lost(b, 1, 4)
    first = await w.rollup.run()
    assert first.reinserted == 2 and first.marks_beyond_tail == 0
    w.clock.advance_s(31)
    second = await w.rollup.run()  # both carried marks were first seen 31 s ago
    assert second.entries == {} and second.marks_beyond_tail == 2
    assert second.wrote_clear


async def test_a_crashed_roll_up_leaves_its_window_seen_when_it_was_read() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)
    await w.lost(a, 6, 4)
    w.backend.inject_fault("cas_cursor")  # re-appended, then dies before the cursor move
    with pytest.raises(Exception):
        await w.rollup.run()
    w.clock.advance_s(31)
    second = await w.rollup.run()  # re-reads the window first seen 31 s ago: settled
    assert spans(second.entries) == {a: (1, 6)}


class OnFirstLookup(MemoryCompactionOffsets):
    """Compaction cursors that run ``action`` inside the roll-up, once its window is fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.action = None

    async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        action, self.action = self.action, None
        if action is not None:
            await action()
        return await super().compaction_offsets(ids)


async def test_a_carried_mark_stands_for_its_newest_unsettled_write() -> None:
    comp = OnFirstLookup()
    w = World(compaction=comp)
    a = cid(1)
    await w.lost(a, 1, 5)  # a write in flight, seen at 0
    comp.action = lambda: w.lost(a, 6, 4)  # another, marked during roll-up 1 (before its carry)
    await w.rollup.run()
    w.clock.advance_s(20)
    await w.rollup.run()  # carries both: the newer was first seen at 20
    w.clock.advance_s(15)  # 35 s after the first sighting, 15 after the newest
    third = await w.rollup.run()
    assert spans(third.entries) == {a: (1, 10)}  # not settled: nothing dropped


async def test_two_settled_marks_of_one_collection_are_widened() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)
    await w.rollup.run()
    await w.committed(a, 6, 4)
    w.clock.advance_s(31)
    await w.rollup.run()
    w.clock.advance_s(31)
    third = await w.rollup.run()  # both marks settled in one window
    assert spans(third.entries) == {a: (1, 10)}


async def test_a_purge_forgets_unsettled_marks_before_it() -> None:
    w = World()
    a = cid(1)
    await w.lost(a, 1, 5)
    await w.hook.purge([a])
    result = await w.rollup.run()
    assert result.entries == {} and result.purges_read == 1


async def test_tails_are_read_only_for_aged_marks() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)
    await w.rollup.run()
    assert w.tails.calls == 0
    w.clock.advance_s(31)
    await w.rollup.run()
    assert w.tails.calls == 1


async def test_a_collection_log_that_does_not_exist_drops_its_settled_marks() -> None:
    w = World()
    a = cid(1)
    await w.lost(a, 1, 5)  # the log was never created: log_tails leaves it out
    await w.rollup.run()
    w.clock.advance_s(31)
    second = await w.rollup.run()
    assert second.entries == {} and second.marks_beyond_tail == 1


async def test_compaction_cursors_are_asked_for_marked_collections_only() -> None:
    asked: list[uuid.UUID] = []

    class Recording(MemoryCompactionOffsets):
        async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
            asked.extend(ids)
            return await super().compaction_offsets(ids)

    w = World(compaction=Recording())
    a, b = cid(1), cid(2)
    await w.hook.purge([b])
    await w.committed(a, 1, 5)
    await w.backend.append_many([DirtyRecord.clear(T0_US).encode()])
    await w.rollup.run()
    assert asked == [a]


async def test_fully_compacted_marks_are_counted() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)
    await w.committed(a, 6, 5)
    w.compaction.set(a, 20)
    result = await w.rollup.run()
    assert result.marks_fully_compacted == 2 and result.entries == {} and result.wrote_clear


class LogTailsBackend(MemoryLogBackend):
    """A dirty log that also answers log tails (as the host's does)."""

    def __init__(self, settle_s: float, tails: dict[uuid.UUID, int]) -> None:
        super().__init__()
        self.settle_s = settle_s
        self.tails = tails

    async def log_tails(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        return {c: self.tails[c] for c in ids if c in self.tails}


async def test_a_backend_that_knows_tails_clips_by_default() -> None:
    a = cid(1)
    backend = LogTailsBackend(0.0, {a: 6})
    rollup = RollUp(backend, MemoryCompactionOffsets(), clock=FakeClock())
    await DirtyLogHook(backend, FakeClock()).mark_dirty(a, 1, 9)
    result = await rollup.run()
    assert spans(result.entries) == {a: (1, 6)}


# ---------------------------------------------------------------------------------- hand-over


async def test_hand_over_reports_and_appends_each_collection_once() -> None:
    source, target = MemoryLogBackend(), MemoryLogBackend()
    a, b = cid(1), cid(2)
    hook = DirtyLogHook(source, FakeClock())
    await hook.mark_dirty(a, 1, 5)
    await hook.mark_dirty(b, 1, 5)
    await hook.mark_dirty(a, 6, 5)
    first = await hand_over(source, target, MemoryCompactionOffsets())
    assert (first.collections, first.records_read, first.cursor_from, first.cursor_to) == (
        2,
        3,
        1,
        4,
    )
    moved = await decoded_from(target, 1)
    assert sorted((r.collection_id, r.log_position, r.end) for _, r in moved) == [
        (a, 1, 11),
        (b, 1, 6),
    ]
    await source.append_many([DirtyRecord.clear(T0_US).encode()] * 2)
    idle = await hand_over(source, target, MemoryCompactionOffsets())
    assert (idle.collections, idle.records_read, idle.cursor_from, idle.cursor_to) == (0, 2, 4, 4)


async def test_hand_over_clips_with_the_tails_it_is_given_or_the_targets() -> None:
    a = cid(1)
    for given in (True, False):
        source = MemoryLogBackend()
        await DirtyLogHook(source, FakeClock()).mark_dirty(a, 1, 9)
        target = LogTailsBackend(0.0, {a: 3})
        tails = MemoryLogTails(0.0)
        tails.set(a, 6)
        await hand_over(source, target, MemoryCompactionOffsets(), tails=tails if given else None)
        ((_, moved),) = await decoded_from(target, 1)
        assert moved.end == (6 if given else 3)


# ----------------------------------------------------------------------------------- RollUp API


@pytest.mark.parametrize(
    "kw", [{"max_records_per_read": 0}, {"max_records_per_append": 0}, {"max_attempts": 0}]
)
def test_page_sizes_and_attempts_below_one_are_refused(kw: dict[str, int]) -> None:
    with pytest.raises(ValueError) as e:
        RollUp(MemoryLogBackend(), MemoryCompactionOffsets(), **kw)
    assert str(e.value) == (
        "max_records_per_read, max_records_per_append, max_attempts must be >= 1"
    )


async def test_one_record_per_append_and_a_single_attempt_are_allowed() -> None:
    w = World(max_records_per_append=1, max_attempts=1)
    assert w.rollup.last_result is None
    await w.committed(cid(1), 1, 5)
    await w.committed(cid(2), 1, 5)
    result = await w.rollup.run()
    assert result.reinserted == 2


async def test_a_purge_is_stamped_by_the_roll_ups_clock() -> None:
    w = World()
    first = await w.rollup.purge([cid(1)])
    ((_, record),) = await decoded_from(w.backend, first)
    assert record.kind == RecordKind.PURGE and record.initial_insertion_epoch_us == T0_US


async def test_an_idle_run_reports_nothing_moved() -> None:
    w = World()
    await w.backend.append_many([DirtyRecord.clear(T0_US).encode()] * 3)
    result = await w.rollup.run()
    assert result.idle is True and result.wrote_clear is False and result.reinserted == 0
    assert (result.cursor_from, result.cursor_to, result.records_read) == (1, 1, 3)


async def test_entries_are_scored_and_rescored_when_noted_compacted() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 10)
    w.clock.advance_s(120)
    result = await w.rollup.run()
    entry = result.entries[a]
    assert entry.score == score(10, T0_US, 1, w.clock())
    w.clock.advance_s(60)
    w.rollup.note_compacted(a, 4)
    noted = w.rollup.entries()[a]
    assert (noted.start, noted.num_records, noted.reinsert_count) == (4, 7, 0)
    assert noted.score == score(7, T0_US, 0, w.clock())


async def test_the_highest_compaction_noted_during_a_run_wins() -> None:
    comp = OnFirstLookup()
    w = World(compaction=comp)
    a = cid(1)
    await w.committed(a, 1, 10)

    async def notes() -> None:
        w.rollup.note_compacted(a, 8)
        w.rollup.note_compacted(a, 5)

    comp.action = notes
    result = await w.rollup.run()
    assert spans(result.entries) == {a: (8, 11)}


async def test_select_honours_max_age_and_the_given_now() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 2)
    await w.rollup.run()
    assert w.rollup.select(min_records=100, limit=5, max_age_s=60) == []
    assert [
        e.collection_id
        for e in w.rollup.select(min_records=100, limit=5, max_age_s=60, now_us=T0_US + 61_000_000)
    ] == [a]


class ConflictingCas(MemoryLogBackend):
    def __init__(self, conflicts: int) -> None:
        super().__init__()
        self.conflicts = conflicts
        self.cas_calls = 0

    async def cas_cursor(self, name: str, offset: int, witness: str) -> str:
        self.cas_calls += 1
        if self.conflicts > 0:
            self.conflicts -= 1
            raise CursorConflict(f"cursor {name} moved (test)")
        return await super().cas_cursor(name, offset, witness)


async def test_conflicts_are_counted_and_retried_up_to_max_attempts(caplog) -> None:
    backend = ConflictingCas(2)
    w = World(backend=backend, max_attempts=3)
    await w.committed(cid(1), 1, 5)
    with caplog.at_level(logging.WARNING, logger="dirtylog.rollup"):
        result = await w.rollup.run()
    assert result.conflicts == 2 and backend.cas_calls == 3
    messages = [r.getMessage() for r in caplog.records]
    assert (
        messages.count(
            "dirty-log roll-up lost a cursor race (cursor stable_prefix moved (test)); retrying"
        )
        == 2
    )

    backend = ConflictingCas(5)
    w = World(backend=backend, max_attempts=2)
    await w.committed(cid(1), 1, 5)
    with pytest.raises(CursorConflict):
        await w.rollup.run()
    assert backend.cas_calls == 2


async def test_a_gc_failure_is_reported_in_the_result_and_the_log(caplog) -> None:
    w = World()
    await w.committed(cid(1), 1, 5)
    error = RuntimeError("store down")
    w.backend.inject_fault("gc", exc=error)
    before = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="dirtylog.rollup"):
        result = await w.rollup.run()
    after = time.monotonic()
    assert result.gc_error == repr(error)
    assert w.rollup.last_result == result
    assert 0 <= result.duration_s <= after - before
    assert f"dirty-log GC failed after roll-up: {error!r}" in [
        r.getMessage() for r in caplog.records
    ]


# ------------------------------------------------------------------------- reads and inspection


async def test_inspected_records_name_their_fields() -> None:
    backend = MemoryLogBackend()
    await backend.append_many([mark(cid(1), 1, 3).encode(), b"\x00" * 5])
    good, bad = await inspect_records(backend, 1, 10)
    assert good.as_dict()["offset"] == 1 and good.as_dict()["collection_id"] == str(cid(1))
    view = bad.as_dict()
    assert set(view) == {"offset", "error", "raw_hex"}
    assert view["offset"] == 2 and view["raw_hex"] == "00" * 5 and view["error"]


async def test_inspecting_needs_a_positive_limit() -> None:
    with pytest.raises(ValueError, match=r"^limit must be >= 1, got 0$"):
        await inspect_records(MemoryLogBackend(), 1, 0)


class BrokenRead(MemoryLogBackend):
    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        page = await super().read(from_offset, max_records)
        if self.mode == "empty":
            return []
        if self.mode == "shifted":
            return [(o + 1, b) for o, b in page]
        # "more": a page running past what was asked (the roll-up must stop at its end)
        return page + await super().read(from_offset + len(page), 10)


async def test_a_short_or_gapped_read_fails_the_roll_up_with_its_offsets() -> None:
    for mode, text in (
        ("empty", "dirty log returned nothing at 1, before its end 3"),
        ("shifted", "dirty log read expected offset 1, got 2"),
    ):
        backend = BrokenRead(mode)
        await DirtyLogHook(backend, FakeClock()).mark_dirty(cid(1), 1, 3)
        await DirtyLogHook(backend, FakeClock()).mark_dirty(cid(2), 1, 3)
        with pytest.raises(RollUpError) as e:
            await RollUp(backend, MemoryCompactionOffsets(), clock=FakeClock()).run()
        assert str(e.value) == text


async def test_records_read_past_the_windows_end_wait_for_the_next_run() -> None:
    backend = BrokenRead("more")
    hook = DirtyLogHook(backend, FakeClock())
    await hook.mark_dirty(cid(1), 1, 3)
    rollup = RollUp(backend, MemoryCompactionOffsets(), clock=FakeClock(), max_records_per_read=1)
    original_next = backend.next_offset

    async def next_offset() -> int:  # a mark lands just after the end is read
        end = await original_next()
        await hook.mark_dirty(cid(2), 1, 3)
        return end

    backend.next_offset = next_offset  # type: ignore[method-assign]
    result = await rollup.run()
    assert result.marks_read == 1 and set(result.entries) == {cid(1)}
    assert result.cursor_to == 2


# --------------------------------------------- issue 24's pass: prior sets, cursors moved back


def second_rollup(w: World, **kw: object) -> RollUp:
    """Another roll-up of the same log (a reopened dirty log's), on the same clocks."""
    return RollUp(w.backend, w.compaction, clock=w.clock, tails=w.tails, monotonic=w.mono, **kw)  # type: ignore[arg-type]


def entry(
    c: uuid.UUID, start: int, limit: int, first_us: int, reinserts: int, now_us: int
) -> DirtyEntry:
    n = limit - start
    return DirtyEntry(
        c, start, limit, n, first_us, reinserts, score(n, first_us, reinserts, now_us)
    )


async def test_a_cursor_moved_back_on_a_fresh_roll_up_appends_a_purge_and_a_mark() -> None:
    w = World()
    a = cid(1)
    w.clock.advance_s(5)
    now_us = w.clock()
    assert await w.rollup.uncompacted(a, 3, 7) == 1
    assert await decoded_from(w.backend, 1) == [
        (1, DirtyRecord.purge(a, now_us)),
        (2, DirtyRecord(a, 3, 4, now_us, 0, RecordKind.MARK_DIRTY)),
    ]
    assert w.rollup.entries() == {a: entry(a, 3, 7, now_us, 0, now_us)}
    item = w.rollup.dirty_set.item(a)
    assert item is not None and item.home == 2


async def test_a_cursor_moved_back_to_its_tail_or_past_it_appends_only_a_purge() -> None:
    w = World()
    a = cid(1)
    assert await w.rollup.uncompacted(a, 7, 7) == 1
    assert await w.rollup.uncompacted(a, 9, 7) == 2
    assert [r.kind for _, r in await decoded_from(w.backend, 1)] == [RecordKind.PURGE] * 2
    assert w.rollup.entries() == {}


async def test_a_cursor_moved_back_restates_known_and_unread_marks() -> None:
    """The mark reaches the highest end known (memory, then marks appended before the purge and
    not folded yet, restated past it), with the oldest first insertion; a restart agrees."""
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 11)  # [1, 12) at T0, offset 1
    await w.rollup.run()  # relogged at 2
    w.clock.advance_s(10)
    await w.hook.mark_dirty(a, 15, 10)  # [15, 25), offset 3: not folded yet
    now_us = w.clock()
    assert await w.rollup.uncompacted(a, 3, 7) == 4
    assert await decoded_from(w.backend, 4) == [
        (4, DirtyRecord.purge(a, now_us)),
        (5, DirtyRecord(a, 3, 9, T0_US, 0, RecordKind.MARK_DIRTY)),
        (6, DirtyRecord(a, 3, 22, T0_US, 0, RecordKind.MARK_DIRTY)),
    ]
    assert w.rollup.entries() == {a: entry(a, 3, 25, T0_US, 0, now_us)}
    item = w.rollup.dirty_set.item(a)
    assert item is not None and item.home == 5
    assert spans((await second_rollup(w).run()).entries) == {a: (3, 25)}


async def test_a_cursor_moved_back_with_unreadable_marks_logs_and_restates_what_it_knows(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 11)
    await w.rollup.run()
    await w.hook.mark_dirty(a, 15, 10)
    w.backend.inject_fault("read", exc=RuntimeError("read failed"))
    with caplog.at_level(logging.WARNING, logger="dirtylog.rollup"):
        assert await w.rollup.uncompacted(a, 3, 7) == 4
    assert [r.getMessage() for r in caplog.records] == [
        f"dirty log: marks before the purge of {a} unread: RuntimeError('read failed')"
    ]
    assert await w.backend.next_offset() == 6  # the purge and one mark, none restated
    assert spans(w.rollup.entries()) == {a: (3, 12)}


async def test_a_cursor_moved_back_refuses_the_nil_uuid() -> None:
    w = World()
    with pytest.raises(ValueError, match=r"^the nil UUID names no collection$"):
        await w.rollup.uncompacted(uuid.UUID(int=0), 1, 5)
    assert await w.backend.next_offset() == 1


async def test_a_cursor_moved_back_replaces_the_prior_sets_entry() -> None:
    """Before its first pass a reopened roll-up serves the previous set: the collection moved
    back is restated there too (from the highest end known), other entries are kept."""
    w = World()
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 11)
    await w.hook.mark_dirty(b, 1, 2)
    await w.rollup.run()
    r2 = second_rollup(w)
    r2.carry_over(w.rollup)
    w.clock.advance_s(10)
    now_us = w.clock()
    await r2.uncompacted(a, 5, 7)
    assert r2.entries() == {
        a: entry(a, 5, 12, T0_US, 0, now_us),
        b: entry(b, 1, 3, T0_US, 1, T0_US),  # as carried: scored when the set was
    }
    assert [(e.collection_id, e.start, e.limit) for e in r2.select(0, 10)] == [
        (a, 5, 12),
        (b, 1, 3),
    ]


async def test_a_reopened_roll_up_serves_the_previous_set_until_its_rebuild_completes() -> None:
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 4)
    await w.rollup.run()
    other = World()  # a roll-up of an empty log
    r2 = RollUp(other.backend, other.compaction, clock=w.clock, tails=other.tails)
    r2.carry_over(w.rollup)
    assert r2.entries() == w.rollup.entries()
    assert [e.collection_id for e in r2.select(0, 10)] == [a]
    await r2.run()
    assert r2.entries() == {}
    r2.carry_over(w.rollup)  # complete now: nothing to carry
    assert r2.entries() == {}


async def test_carried_sets_are_united() -> None:
    """Two carried sets (and the roll-up's own partial fold) unite entry by entry: start min,
    limit max, first insertion min, reinserts max, scored now."""
    w1, w2 = World(), World()
    a, b = cid(1), cid(2)
    await w1.hook.mark_dirty(a, 1, 4)  # [1, 5) at T0
    await w1.hook.mark_dirty(cid(3), 1, 1)  # only in the first set
    await w1.rollup.run()  # reinserted once
    w2.clock.advance_s(60)
    await w2.hook.mark_dirty(a, 3, 6)  # [3, 9) at T0 + 60 s
    await w2.hook.mark_dirty(b, 1, 1)
    r = RollUp(MemoryLogBackend(), MemoryCompactionOffsets(), clock=w2.clock)
    r.carry_over(w1.rollup)
    await w2.rollup.run()
    r.carry_over(w2.rollup)
    now_us = w2.clock()
    assert r.entries() == {
        a: entry(a, 1, 9, T0_US, 1, now_us),
        b: entry(b, 1, 2, T0_US + 60_000_000, 1, now_us),
        cid(3): entry(cid(3), 1, 2, T0_US, 1, T0_US),
    }


async def test_the_prior_set_is_united_with_the_rebuilds_fold() -> None:
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 4)
    await w.rollup.run()
    r2 = second_rollup(w)
    r2.carry_over(w.rollup)
    # Memory of the new roll-up learns [3, 9) before its first pass.
    await r2.uncompacted(a, 3, 9)
    r3 = second_rollup(w)
    r3.carry_over(w.rollup)
    r3.carry_over(r2)
    assert spans(r3.entries()) == {a: (1, 9)}


async def test_compactions_and_purges_clip_the_prior_set() -> None:
    w = World()
    a, b, c = cid(1), cid(2), cid(3)
    await w.hook.mark_dirty(a, 1, 8)  # [1, 9)
    await w.hook.mark_dirty(b, 1, 2)
    await w.hook.mark_dirty(c, 1, 2)
    await w.rollup.run()
    r2 = second_rollup(w)
    r2.carry_over(w.rollup)
    before = r2.entries()
    r2.note_compacted(a, 1)  # not above its start: unchanged
    assert r2.entries()[a] == before[a]
    w.clock.advance_s(10)
    r2.note_compacted(a, 4)  # cut into: starts at 4, its reinsert count restarted
    assert r2.entries()[a] == entry(a, 4, 9, T0_US, 0, w.clock())
    r2.note_compacted(a, 9)  # wholly compacted: gone
    r2.note_compacted(cid(9), 5)  # a collection the prior set never had
    assert set(r2.entries()) == {b, c}
    await r2.purge([b])
    assert set(r2.entries()) == {c}
    await r2.purge([cid(9)])  # not in the prior set: nothing to do
    assert set(r2.entries()) == {c}


class FailingTails(MemoryLogTails):
    def __init__(self, settle_s: float) -> None:
        super().__init__(settle_s)
        self.fail = False

    async def log_tails(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int | None]:
        if self.fail:
            raise RuntimeError("tails down")
        return await super().log_tails(ids)


async def test_failed_lookups_are_counted_logged_and_change_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    w = World()
    w.tails = FailingTails(30.0)
    w.rollup = second_rollup(w)
    a, b = cid(1), cid(2)
    await w.lost(a, 1, 5)
    await w.lost(b, 1, 5)
    first = await w.rollup.run()
    assert w.rollup.last_result is first
    assert (first.compaction_lookups, first.tail_lookups, first.lookup_errors) == (2, 0, 0)
    w.clock.advance_s(31)
    w.compaction.fail_next = RuntimeError("cursors down")
    w.tails.fail = True
    with caplog.at_level(logging.WARNING, logger="dirtylog.rollup"):
        result = await w.rollup.run()
    assert (result.compaction_lookups, result.tail_lookups, result.lookup_errors) == (2, 2, 2)
    assert [r.getMessage() for r in caplog.records] == [
        "dirty-log roll-up: compaction cursors unreadable (RuntimeError('cursors down')); "
        "relogging",
        "dirty-log roll-up: log tails unreadable (RuntimeError('tails down')); relogging",
    ]
    assert set(result.entries) == {a, b}
    w.tails.fail = False
    result = await w.rollup.run()  # judged now: neither write landed
    assert result.entries == {} and result.marks_beyond_tail == 2 and result.tail_lookups == 2
    assert w.rollup.last_result is result


async def test_compaction_cursors_are_read_for_the_most_reinserted_first() -> None:
    w = World(max_compaction_lookups=1)
    a, b = cid(1), cid(2)  # a's id sorts first
    await w.backend.append_many([mark(a, 1, 2, reinserts=5).encode(), mark(b, 1, 2).encode()])
    w.compaction.set(a, 3)
    w.compaction.set(b, 3)
    result = await w.rollup.run()
    assert result.compaction_lookups == 1 and set(result.entries) == {b}


async def test_a_pass_reports_clears_read_and_what_is_retained() -> None:
    w = World(max_records_per_append=1)
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 2)
    await w.hook.mark_dirty(b, 1, 2)
    await w.rollup.compacted(cid(3), 4)
    await w.backend.append_many([DirtyRecord.clear(T0_US).encode()])
    result = await w.rollup.run()
    assert result.clears_read == 2 and result.reinserted == 2
    # Two relogs, one per append, past the end (5): the cursor moved to 5, 2 records retained.
    assert (result.cursor_to, result.retained) == (5, 2)


async def test_three_lost_races_in_a_row_fail_a_pass_by_default() -> None:
    backend = ConflictingCas(3)
    w = World(backend=backend)
    await w.committed(cid(1), 1, 5)
    with pytest.raises(CursorConflict):
        await w.rollup.run()
    assert backend.cas_calls == 3


@pytest.mark.parametrize(
    ("kw", "text"),
    [
        ({"window_records": 0}, "window_records must be >= 1, got 0"),
        (
            {"max_compaction_lookups": -1},
            "max_compaction_lookups and max_tail_lookups must be >= 0",
        ),
        ({"max_tail_lookups": -1}, "max_compaction_lookups and max_tail_lookups must be >= 0"),
    ],
)
def test_rollup_refuses_bad_bounds(kw: dict[str, int], text: str) -> None:
    with pytest.raises(ValueError) as e:
        World(**kw)  # type: ignore[arg-type]
    assert str(e.value) == text


async def test_no_lookups_at_all_is_allowed() -> None:
    w = World(max_compaction_lookups=0, max_tail_lookups=0)
    await w.lost(cid(1), 1, 5)
    await w.rollup.run()
    w.clock.advance_s(31)
    result = await w.rollup.run()
    assert (result.compaction_lookups, result.tail_lookups) == (0, 0)
    assert set(result.entries) == {cid(1)}  # never judged: kept


async def test_tail_lookups_are_bounded_per_pass() -> None:
    w = World(max_tail_lookups=1)
    a, b = cid(1), cid(2)
    await w.lost(a, 1, 5)
    await w.lost(b, 1, 5)
    await w.rollup.run()
    w.clock.advance_s(31)
    result = await w.rollup.run()
    assert result.tail_lookups == 1 and len(result.entries) == 1
    result = await w.rollup.run()
    assert result.tail_lookups == 1 and result.entries == {}


class EarlyPageBackend(MemoryLogBackend):
    """Answers a read from offset 1 with a page that starts at the end it reported."""

    async def next_offset(self) -> int:
        return min(await super().next_offset(), 3)

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        page = await super().read(from_offset, max_records + 5)
        return page[2:] if from_offset == 1 else page


async def test_a_page_that_starts_past_the_window_is_named() -> None:
    backend = EarlyPageBackend()
    await backend.append_many([mark(cid(i), 1, 1).encode() for i in range(3)])
    w = World(backend=backend)
    with pytest.raises(RollUpError, match=r"^dirty log read expected offset 1, got 3$"):
        await w.rollup.run()


async def test_the_window_grows_by_every_record_appended_since_the_last_pass() -> None:
    w = World(window_records=1, max_records_per_read=1)
    assert (await w.rollup.run()).idle  # an empty log
    for i in range(3):
        await w.hook.mark_dirty(cid(i), 1, 1)
    result = await w.rollup.run()  # three pages of one record: the window is 1 + 3
    assert (result.cursor_from, result.cursor_to, result.window) == (1, 4, 3)
    assert result.relogged == 3


async def test_a_pass_after_its_relogs_is_not_taken_for_idle() -> None:
    """The highest offset of a meaningful record counts every relog of a pass: once the cursor
    passed the first relog (its collection compacted meanwhile), the second still needs a pass."""
    w = World(window_records=1)
    a, b = cid(1), cid(2)
    assert (await w.rollup.run()).idle
    await w.hook.mark_dirty(a, 1, 2)
    await w.hook.mark_dirty(b, 1, 2)
    result = await w.rollup.run()  # relogs a at 3, b at 4
    assert (result.cursor_to, result.relogged) == (3, 2)
    w.rollup.note_compacted(a, 100)
    result = await w.rollup.run()  # [3, 4): a is gone, nothing to relog
    assert (result.cursor_to, result.relogged, result.idle) == (4, 0, False)
    result = await w.rollup.run()  # [4, 5): b's relog
    assert (result.cursor_to, result.relogged, result.idle) == (5, 1, False)
    assert set(result.entries) == {b}


async def test_a_cursor_moved_back_with_nothing_unread_appends_one_mark() -> None:
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 11)
    await w.rollup.run()  # relogged at 2
    assert await w.rollup.uncompacted(a, 3, 7) == 3
    assert await w.backend.next_offset() == 5  # the purge and [3, 12): nothing higher unread


async def test_a_failed_rebuild_serves_the_prior_set_united_with_what_it_folded() -> None:
    """A reopened roll-up of another log fails after folding its first page: it serves the
    previous set united, entry by entry, with what it folded."""
    w = World()
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 4)  # [1, 5)
    await w.rollup.run()
    other = World()
    await other.hook.mark_dirty(a, 10, 10)  # [10, 20)
    await other.hook.mark_dirty(b, 1, 1)
    r2 = RollUp(
        other.backend, other.compaction, clock=w.clock, tails=other.tails, max_records_per_read=1
    )
    r2.carry_over(w.rollup)
    other.backend.inject_fault("read", skip=1, exc=RuntimeError("flaky"))
    with pytest.raises(RuntimeError):
        await r2.run()
    assert spans(r2.entries()) == {a: (1, 20)}  # b's mark is not folded yet
    assert r2.entries()[a].reinsert_count == 1 and r2.entries()[a].first_insertion_us == T0_US


async def test_a_cursor_moved_back_before_a_failed_rebuild_is_served_from_the_prior_set() -> None:
    """Restated in the prior set too: a rebuild that then fails (its own memory thrown away)
    still serves the collection from ``offset``; a collection the prior set lacks is added."""
    w = World()
    a, b, c = cid(1), cid(2), cid(3)
    await w.hook.mark_dirty(a, 1, 11)
    await w.hook.mark_dirty(b, 1, 2)
    await w.rollup.run()
    r2 = second_rollup(w)
    r2.carry_over(w.rollup)
    w.clock.advance_s(10)
    now_us = w.clock()
    await r2.uncompacted(a, 3, 7)
    await r2.uncompacted(c, 1, 4)
    w.backend.inject_fault("read", exc=RuntimeError("flaky"))
    with pytest.raises(RuntimeError):
        await r2.run()
    assert r2.entries()[a] == entry(a, 3, 12, T0_US, 0, now_us)
    assert r2.entries()[c] == entry(c, 1, 4, now_us, 0, now_us)
    assert set(r2.entries()) == {a, b, c}


async def test_a_cursor_moved_back_mid_rebuild_unites_its_marks_in_the_prior_set() -> None:
    """Loaded but not yet complete (a rebuild failed midway), with a prior set: the unread marks
    are folded, a higher one restated, and the prior set holds both marks' union."""
    w = World()
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 11)  # 1
    await w.hook.mark_dirty(b, 1, 2)  # 2
    await w.rollup.run()  # relogs at 3, 4; cursor 3
    r2 = second_rollup(w, max_records_per_read=1)
    r2.carry_over(w.rollup)
    await w.hook.mark_dirty(a, 15, 10)  # 5: [15, 25)
    w.backend.inject_fault("read", skip=1, exc=RuntimeError("flaky"))
    with pytest.raises(RuntimeError):
        await r2.run()  # folded 3, failed at 4
    w.clock.advance_s(10)
    now_us = w.clock()
    assert await r2.uncompacted(a, 3, 7) == 6
    assert await w.backend.next_offset() == 9  # purge, [3, 12), and [3, 25) restated
    assert r2.entries()[a] == entry(a, 3, 25, T0_US, 0, now_us)


async def test_a_lost_race_mid_rebuild_keeps_what_the_rebuild_folded() -> None:
    """A rebuild that loses a race midway serves the prior set united with its partial fold."""
    w = World()
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 4)
    await w.rollup.run()  # a relogged at 2, cursor 2
    other = World()
    c = cid(3)
    await other.hook.mark_dirty(c, 1, 1)
    await other.rollup.run()
    r2 = second_rollup(w, max_records_per_read=1, max_attempts=1)
    r2.carry_over(other.rollup)  # a prior set with c alone
    await w.hook.mark_dirty(cid(2), 1, 1)  # 3
    w.backend.inject_fault("read", skip=1, exc=LogPurged(3, 4))
    with pytest.raises(LogPurged):
        await r2.run()  # folded a's relog at 2, then lost the race
    assert set(r2.entries()) == {a, c}
