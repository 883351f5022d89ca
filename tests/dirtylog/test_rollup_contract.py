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
from wal3.errors import CursorConflict

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
