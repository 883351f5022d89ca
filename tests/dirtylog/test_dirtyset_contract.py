"""The in-memory dirty set's contract, rule by rule (issue 23: mutation testing of
dirtylog/dirtyset.py).

Each test folds hand-made records into a :class:`DirtySet` and checks one promise of its
docstrings: how marks widen a collection's parts, how floors clip them in either order, when a
part is aged and how parts are judged against a tail, what a relog restates, where homes are, and
which floors are kept.  Sightings and "now" are plain numbers; nothing sleeps.
"""

from __future__ import annotations

import uuid

import pytest

from dirtylog import DirtyEntry, DirtyRecord, RecordKind, score
from dirtylog.coalesce import Coalesced
from dirtylog.dirtyset import DirtySet, FoldStats, Part

from .helpers import T0_US, FakeClock, cid

A, B, C = cid(1), cid(2), cid(3)
U32_MAX = (1 << 32) - 1


def mark(c: uuid.UUID, start: int, n: int, t_us: int = T0_US, reinserts: int = 0) -> DirtyRecord:
    return DirtyRecord(c, start, n, t_us, reinserts, RecordKind.MARK_DIRTY)


def parts(d: DirtySet, c: uuid.UUID) -> list[Part]:
    item = d.item(c)
    assert item is not None
    return item.parts()


def test_marks_widen_one_settled_part_without_a_settle_time() -> None:
    clock = FakeClock(T0_US + 60_000_000)
    d = DirtySet(None, clock)
    d.fold(5, mark(A, 10, 5, T0_US + 2, 1), 3.0, 9.0)
    d.fold(6, mark(A, 12, 10, T0_US + 1, 3), 2.0, 9.0)
    d.fold(7, mark(A, 8, 2, T0_US + 5, 0), 4.0, 9.0)
    item = d.item(A)
    assert item is not None
    # start min, limit max, first insertion min, reinserts max; the oldest sighting.
    assert item.settled == Part(Coalesced(8, 22, T0_US + 1, 3), 2.0)
    assert item.fresh == [] and item.home == 5 and item.records == 3 and item.floor == 1
    assert d.entries[A] == DirtyEntry(A, 8, 22, 14, T0_US + 1, 3, score(14, T0_US + 1, 3, clock()))
    assert d.stats == FoldStats(records=3, marks=3)
    assert d.last_meaningful == 7
    assert len(d) == 1 and A in d and B not in d and d.item(B) is None
    assert d.homes_in(1, 100) == [A] and d.homes_in(5, 6) == [A]
    assert d.homes_in(1, 5) == [] and d.homes_in(6, 100) == []
    assert d.lowest_home() == 5
    d.check()


def test_an_empty_set_has_no_home() -> None:
    d = DirtySet(None)
    assert d.lowest_home() is None and len(d) == 0 and d.floor(A) == 1 and d.floors_kept == 0
    d.check()


def test_an_empty_mark_covers_nothing() -> None:
    d = DirtySet(None)
    d.fold(1, mark(A, 5, 0), 0.0, 0.0)
    assert A not in d and d.homes_in(1, 2) == [] and d.stats == FoldStats(records=1, marks=1)
    d.check()


def test_homes_are_listed_in_home_order() -> None:
    d = DirtySet(None)
    d.fold(3, mark(B, 1, 1), 0.0, 0.0)
    d.fold(2, mark(A, 1, 1), 0.0, 0.0)
    d.fold(9, mark(C, 1, 1), 0.0, 0.0)
    assert d.homes_in(1, 10) == [A, B, C] and d.homes_in(3, 9) == [B]
    assert d.lowest_home() == 2


def test_a_mark_below_a_collections_home_lowers_it() -> None:
    d = DirtySet(None)
    d.fold(10, mark(A, 5, 1), 0.0, 0.0)
    d.fold(4, mark(A, 1, 1), 0.0, 0.0)  # a relog of A landed after this mark
    assert d.homes_in(4, 5) == [A] and d.homes_in(5, 11) == []
    item = d.item(A)
    assert item is not None and item.home == 4
    d.fold(12, mark(A, 9, 1), 0.0, 0.0)  # a later mark leaves the home alone
    assert item.home == 4
    d.check()


def test_clears_raise_the_floor_and_clip_in_either_order() -> None:
    d = DirtySet(None)
    d.fold(1, mark(A, 1, 10, reinserts=5), 0.0, 0.0)
    d.fold(2, DirtyRecord.clear(T0_US), 0.0, 0.0)  # a checkpoint changes nothing
    assert d.last_meaningful == 1 and d.stats.clears == 1 and d.floor(A) == 1
    d.fold(3, DirtyRecord.compacted(A, 4, T0_US), 0.0, 0.0)
    assert d.floor(A) == 4 and d.last_meaningful == 3
    # Cut into: starts at the floor, its reinsert count restarts.
    assert parts(d, A) == [Part(Coalesced(4, 11, T0_US, 0), 0.0)]
    assert (d.entries[A].start, d.entries[A].limit) == (4, 11)
    d.fold(4, DirtyRecord.compacted(A, 3, T0_US), 0.0, 0.0)  # a lower floor changes nothing
    assert d.floor(A) == 4
    d.fold(5, DirtyRecord.compacted(A, 11, T0_US), 0.0, 0.0)  # wholly compacted: it leaves
    assert A not in d and A not in d.entries and d.floor(A) == 11 and d.floors_kept == 1
    assert d.stats.marks_fully_compacted == 1
    # A late mark of compacted records is clipped by the floor kept for the clean collection.
    d.fold(6, mark(A, 3, 8), 0.0, 0.0)
    assert A not in d and d.stats.marks_fully_compacted == 2
    d.fold(7, mark(A, 9, 4, reinserts=7), 0.0, 0.0)
    assert parts(d, A) == [Part(Coalesced(11, 13, T0_US, 0), 0.0)]
    assert d.floor(A) == 11 and d.floors_kept == 0
    d.fold(8, mark(A, 11, 3, reinserts=7), 0.0, 0.0)  # at the floor: not cut, count kept
    assert parts(d, A) == [Part(Coalesced(11, 14, T0_US, 7), 0.0)]
    assert d.stats == FoldStats(records=8, marks=4, clears=4, marks_fully_compacted=2)
    d.check()


def test_a_compaction_that_empties_some_parts_keeps_the_rest() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 4), 0.0, 40.0)  # aged
    d.fold(2, mark(A, 10, 4), 35.0, 40.0)  # young
    assert d.note_compacted(A, 5, 3) is False
    assert parts(d, A) == [Part(Coalesced(10, 14, T0_US, 0), 35.0)]
    assert d.note_compacted(A, 5, 4) is False  # not above the floor: nothing to do
    assert d.note_compacted(A, 14, 4) is True
    assert A not in d and d.floor(A) == 14


def test_a_settled_part_is_clipped_by_a_later_compaction() -> None:
    d = DirtySet(None)
    d.fold(1, mark(A, 1, 10), 2.0, 2.0)
    assert d.note_compacted(A, 6, 2) is False
    assert parts(d, A) == [Part(Coalesced(6, 11, T0_US, 0), 2.0)]
    assert d.entries[A].start == 6


def test_floors_of_clean_collections_only_rise_and_are_forgotten_in_order() -> None:
    d = DirtySet(None)
    assert d.note_compacted(B, 5, 10) is False
    assert d.note_compacted(C, 8, 20) is False
    assert d.note_compacted(B, 3, 12) is False  # lower: neither the floor nor its place moves
    assert d.floor(B) == 5 and d.floors_kept == 2
    d.forget_floors_below(11)
    assert d.floor(B) == 1 and d.floor(C) == 8
    assert d.note_compacted(A, 4, 21) is False
    assert d.note_compacted(C, 9, 30) is False  # re-learnt later: its place moves to the end
    d.forget_floors_below(25)  # A (learnt at 21) goes, C (now learnt at 30) stays
    assert d.floor(A) == 1 and d.floor(C) == 9
    d.forget_floors_below(30)
    assert d.floor(C) == 9
    d.forget_floors_below(31)
    assert d.floors_kept == 0


def test_a_floor_learnt_again_keeps_its_first_place() -> None:
    """The same floor learnt again later changes nothing: it is forgotten as first learnt."""
    d = DirtySet(None)
    d.note_compacted(B, 5, 10)
    d.note_compacted(B, 5, 30)
    d.forget_floors_below(20)
    assert d.floor(B) == 1


def test_a_compaction_at_the_floor_leaves_the_entry_alone() -> None:
    clock = FakeClock()
    d = DirtySet(None, clock)
    d.fold(1, mark(A, 1, 10), 0.0, 0.0)
    d.note_compacted(A, 4, 2)
    before = d.entries[A]
    clock.advance_s(3600.0)
    assert d.note_compacted(A, 4, 3) is False
    assert d.entries[A] is before  # not even rescored
    assert d.note_compacted(A, 5, 3) is False
    assert d.entries[A].score != before.score


def test_compacted_marks_are_counted_across_collections() -> None:
    d = DirtySet(None)
    d.fold(1, mark(A, 1, 2), 0.0, 0.0)
    d.fold(2, mark(A, 3, 2), 0.0, 0.0)
    d.fold(3, mark(B, 1, 2), 0.0, 0.0)
    assert d.note_compacted(A, 10, 4) and d.note_compacted(B, 10, 5)
    assert d.stats.marks_fully_compacted == 3


def test_a_purge_forgets_marks_and_floor() -> None:
    d = DirtySet(None)
    d.fold(1, mark(A, 1, 10), 0.0, 0.0)
    d.note_compacted(B, 9, 1)
    d.fold(2, DirtyRecord.purge(A, T0_US), 0.0, 0.0)
    d.fold(3, DirtyRecord.purge(B, T0_US), 0.0, 0.0)
    assert A not in d and A not in d.entries and d.floor(B) == 1 and d.floors_kept == 0
    assert d.homes_in(1, 10) == [] and d.last_meaningful == 3
    assert d.stats == FoldStats(records=3, marks=1, purges=2)
    d.fold(4, mark(A, 1, 2), 0.0, 0.0)  # a mark after the purge survives it
    assert parts(d, A) == [Part(Coalesced(1, 3, T0_US, 0), 0.0)]
    d.check()


def test_aged_and_young_marks_are_kept_apart_and_merged_when_both_aged() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 5), 0.0, 40.0)  # seen 40 s ago: aged
    d.fold(2, mark(A, 6, 5), 20.0, 40.0)  # 20 s ago: young
    d.fold(3, mark(A, 11, 1), 10.0, 40.0)  # exactly 30 s ago: aged, merged with the first
    d.fold(4, mark(A, 20, 1), 25.0, 40.0)  # young, merged with the second
    item = d.item(A)
    assert item is not None and item.settled is None
    # An unsettled part carries its newest sighting.
    assert item.fresh == [
        Part(Coalesced(1, 12, T0_US, 0), 10.0),
        Part(Coalesced(6, 21, T0_US, 0), 25.0),
    ]
    assert d.needs_judging(A, 40.0) and not d.needs_judging(B, 40.0)
    assert not d.needs_judging(A, 39.0)  # at 39 the first part is 29 s old
    # At 55 both have aged; a young mark then merges the two aged parts into one.
    d.fold(5, mark(A, 30, 2), 55.0, 55.0)
    assert item.fresh == [
        Part(Coalesced(1, 21, T0_US, 0), 25.0),
        Part(Coalesced(30, 32, T0_US, 0), 55.0),
    ]
    d.check()


def test_two_aged_parts_merge_even_without_a_young_one() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 5), 0.0, 40.0)
    d.fold(2, mark(A, 6, 5), 20.0, 40.0)
    d.fold(3, mark(A, 11, 5), 60.0, 60.0)  # young; the other two are both aged at 60
    d.fold(4, mark(A, 16, 1), 0.0, 100.0)  # aged: joins an aged part, the young one has aged too
    item = d.item(A)
    assert item is not None and len(item.fresh) <= 2
    assert [p.span.start for p in item.fresh] == [1, 11]
    d.check()


def test_judging_clips_aged_marks_to_the_tail_and_keeps_young_ones() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 20), 0.0, 40.0)  # aged
    d.fold(2, mark(A, 30, 5), 35.0, 40.0)  # young
    assert d.judge(A, None, 40.0) is False  # a write may still land: judged later
    assert d.judge(B, 5, 40.0) is False  # not dirty
    assert len(parts(d, A)) == 2
    assert d.judge(A, 15, 40.0) is False
    item = d.item(A)
    assert item is not None
    assert item.settled == Part(Coalesced(1, 15, T0_US, 0), 0.0)
    assert item.fresh == [Part(Coalesced(30, 35, T0_US, 0), 35.0)]
    assert d.judge(A, 15, 40.0) is False  # nothing aged left to judge
    assert (d.entries[A].start, d.entries[A].limit) == (1, 35)
    # A settled mark ending below the tail keeps its own limit.
    d.fold(3, mark(B, 3, 2), 0.0, 40.0)
    assert d.judge(B, 100, 40.0) is False
    assert parts(d, B) == [Part(Coalesced(3, 5, T0_US, 0), 0.0)]
    assert d.stats.marks_beyond_tail == 0
    d.check()


def test_a_mark_past_its_logs_tail_is_dropped_once_judged() -> None:
    d = DirtySet(30.0)
    d.fold(5, mark(A, 10, 5), 0.0, 40.0)
    d.fold(6, DirtyRecord.compacted(A, 7, T0_US), 0.0, 40.0)
    assert d.judge(A, 10, 40.0) is True  # the tail is at the mark's start: it never landed
    assert A not in d and d.stats.marks_beyond_tail == 1
    assert d.floor(A) == 7  # its floor is kept, learnt at its home
    d.forget_floors_below(5)
    assert d.floor(A) == 7
    d.forget_floors_below(6)
    assert d.floor(A) == 1


def test_a_settled_part_widens_with_later_judged_ones() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 5), 0.0, 40.0)
    d.judge(A, 100, 40.0)
    d.fold(2, mark(A, 10, 5), 5.0, 40.0)
    d.judge(A, 100, 40.0)
    assert parts(d, A) == [Part(Coalesced(1, 15, T0_US, 0), 0.0)]  # the oldest sighting


def test_a_relog_restates_every_part_once_more_and_moves_the_home() -> None:
    d = DirtySet(30.0)
    d.fold(1, mark(A, 1, 5, T0_US + 7, U32_MAX), 0.0, 40.0)
    d.fold(2, mark(A, 6, 5, T0_US + 3, 2), 35.0, 40.0)
    d.fold(3, mark(A, 8, 1, T0_US + 9, 1), 36.0, 40.0)
    d.judge(A, 100, 40.0)
    assert d.relog(A) == [
        (DirtyRecord(A, 1, 5, T0_US + 7, U32_MAX, RecordKind.MARK_DIRTY), 0.0),
        (DirtyRecord(A, 6, 5, T0_US + 3, 3, RecordKind.MARK_DIRTY), 36.0),
    ]
    d.relogged(A, 50)
    item = d.item(A)
    assert item is not None and item.home == 50 and item.records == 1
    assert d.homes_in(1, 50) == [] and d.homes_in(50, 51) == [A]
    assert item.settled is not None and item.settled.span.reinsert_count == U32_MAX
    assert [p.span.reinsert_count for p in item.fresh] == [3]
    assert d.entries[A].reinsert_count == U32_MAX
    d.relogged(B, 60)  # compacted while its relog was in flight: nothing to do
    assert B not in d
    d.check()


def test_a_relog_of_a_settled_collection_counts_as_one_record() -> None:
    d = DirtySet(None)
    for offset in (1, 2, 3):
        d.fold(offset, mark(A, offset, 1), 0.0, 0.0)
    d.relogged(A, 4)
    assert d.entries[A].reinsert_count == 1
    d.note_compacted(A, 100, 5)
    assert d.stats.marks_fully_compacted == 1  # the relog, not the three marks


def test_check_names_each_inconsistency() -> None:
    def dirty() -> DirtySet:
        d = DirtySet(30.0)
        d.fold(1, mark(A, 1, 5), 0.0, 0.0)
        d.check()
        return d

    d = dirty()
    d._entries.pop(A)
    with pytest.raises(AssertionError, match=r"^entries and items differ$"):
        d.check()
    d = dirty()
    d._homes.clear()
    with pytest.raises(AssertionError, match=r"^a home is missing or stale$"):
        d.check()
    d = dirty()
    item = d.item(A)
    assert item is not None
    item.home = 2
    with pytest.raises(AssertionError, match=f"{A}: home 1 is stale"):
        d.check()
    d = dirty()
    item = d.item(A)
    assert item is not None
    item.fresh = []
    with pytest.raises(AssertionError, match=f"{A} has no parts"):
        d.check()
    d = dirty()
    item = d.item(A)
    assert item is not None
    item.fresh = item.fresh * 3
    with pytest.raises(AssertionError, match=f"{A} has 3 unsettled parts"):
        d.check()
    d = dirty()
    item = d.item(A)
    assert item is not None
    item.floor = 2
    with pytest.raises(AssertionError, match="under floor"):
        d.check()
    d = dirty()
    item = d.item(A)
    assert item is not None
    item.fresh[0].span = Coalesced(3, 3, T0_US, 0)  # an empty part
    with pytest.raises(AssertionError, match="under floor"):
        d.check()
    d = dirty()
    d._floors[A] = (1, 1)
    with pytest.raises(AssertionError, match="is dirty and has a clean floor"):
        d.check()
