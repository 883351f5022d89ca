"""The whole-window fold's contract, rule by rule (issue 23: mutation testing of
dirtylog/coalesce.py): the counters a :class:`Coalescer` reports, a mark ending exactly at its
compaction cursor, the default sighting of a hand-built fold, and what
:meth:`Observations.forget_below` forgets of re-appended records, in log order or not.
"""

from __future__ import annotations

import uuid

from dirtylog import DirtyRecord, RecordKind
from dirtylog.coalesce import Coalesced, Coalescer, Observations, coalesce

from .helpers import T0_US, cid

A, B = cid(1), cid(2)


def mark(c: uuid.UUID, start: int, n: int, reinserts: int = 0) -> DirtyRecord:
    return DirtyRecord(c, start, n, T0_US, reinserts, RecordKind.MARK_DIRTY)


def test_every_counter_counts_each_record() -> None:
    folder = Coalescer({A: 10, B: 1}, {A: None, B: 5}, 30.0, lambda offset: 0.0, 100.0)
    assert (folder.marks, folder.purges, folder.clears) == (0, 0, 0)
    assert (folder.marks_fully_compacted, folder.marks_beyond_tail) == (0, 0)
    folder.add(mark(A, 1, 9), 1)  # ends at A's cursor exactly: wholly compacted
    folder.add(mark(A, 2, 3), 2)
    folder.add(mark(B, 5, 2), 3)  # settled, at B's tail: its write never landed
    folder.add(mark(B, 7, 2), 4)
    folder.add(DirtyRecord.purge(B, T0_US), 5)
    folder.add(DirtyRecord.purge(B, T0_US), 6)
    folder.add(DirtyRecord.clear(T0_US), 7)
    folder.add(DirtyRecord.compacted(A, 3, T0_US), 8)
    assert (folder.marks, folder.purges, folder.clears) == (4, 2, 2)
    assert (folder.marks_fully_compacted, folder.marks_beyond_tail) == (2, 2)
    assert folder.result() == {} and folder.saw_changes


def test_a_mark_ending_at_its_compaction_cursor_is_counted_as_compacted() -> None:
    folder = Coalescer({A: 6})
    folder.add(mark(A, 2, 4))  # [2, 6): the cursor is at its end
    assert folder.marks_fully_compacted == 1 and folder.result() == {}
    folder.add(mark(A, 2, 5, reinserts=3))  # [2, 7): cut to [6, 7), its count restarted
    assert folder.marks_fully_compacted == 1
    assert folder.result() == {A: Coalesced(6, 7, T0_US, 0)}


def test_a_hand_built_fold_dates_sightings_at_zero() -> None:
    folder = Coalescer()
    folder.add(mark(A, 1, 2))
    assert folder.carried_seen() == [(A, Coalesced(1, 3, T0_US, 0), 0.0)]


def test_forget_below_forgets_relogs_the_cursor_passed_in_log_order() -> None:
    obs = Observations()
    obs.saw(10, 5.0)
    obs.carried(3, [1.0, 1.5])  # offsets 3 and 4
    obs.carried(8, [2.0])
    obs.forget_below(4)
    assert obs.seen_at(3, 9.0) == 5.0  # forgotten: the end read past it dates it now
    assert obs.seen_at(4, 9.0) == 1.5  # at the cursor: kept
    obs.forget_below(8)
    assert obs.seen_at(4, 9.0) == 5.0 and obs.seen_at(8, 9.0) == 2.0


def test_forget_below_forgets_relogs_out_of_log_order_too() -> None:
    """Relogs remembered out of offset order (two processes' relogs, never one's): every one the
    cursor passed is forgotten, wherever it sits, and one at the cursor is kept."""
    obs = Observations()
    obs.saw(20, 5.0)
    obs.carried(10, [1.0])
    obs.carried(4, [2.0])  # below the last one remembered
    obs.carried(6, [3.0])
    obs.forget_below(6)
    assert obs.seen_at(4, 9.0) == 5.0  # forgotten although it comes after 10 in memory
    assert obs.seen_at(6, 9.0) == 3.0 and obs.seen_at(10, 9.0) == 1.0
    obs.forget_below(11)
    assert obs.seen_at(6, 9.0) == 5.0 and obs.seen_at(10, 9.0) == 5.0


def test_a_collection_without_a_compaction_cursor_is_clipped_at_nothing() -> None:
    """A cursor absent from the mapping is 1 (nothing compacted): a mark from 1 keeps its start
    and its reinsert count."""
    assert coalesce([mark(A, 1, 2, reinserts=3)], {B: 5}) == {A: Coalesced(1, 3, T0_US, 3)}
