"""Issue 20, item 6: a mark of a write that then failed must not live for ever.

The hook marks ``[s, s+n)`` concurrently with the upload; when the batch loses, the log never gets
those offsets.  Once such a mark has settled (seen by the roll-up at least ``settle_s`` before, on
its monotonic clock), roll-ups clip it to the log's tail; marks that may still belong to a write in
flight are never clipped.
"""

from __future__ import annotations

import uuid

from dirtylog import (
    DirtyLogHook,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    MemoryLogTails,
    RollUp,
    missing_from_dirty_set,
)

from .helpers import FakeClock, cid, spans


class World:
    """A dirty log, compaction cursors, log tails, a hook and a roll-up on one fake clock (its
    wall time, and the roll-up's monotonic time)."""

    def __init__(self, settle_s: float = 30.0) -> None:
        self.clock = FakeClock()
        self.backend = MemoryLogBackend()
        self.compaction = MemoryCompactionOffsets()
        self.tails = MemoryLogTails(settle_s)
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = RollUp(
            self.backend,
            self.compaction,
            clock=self.clock,
            tails=self.tails,
            monotonic=lambda: self.clock.now_us / 1e6,
        )

    async def committed(self, c: uuid.UUID, first: int, n: int) -> None:
        """A write that landed: marked, and the log's tail moved past it."""
        await self.hook.mark_dirty(c, first, n)
        self.tails.set(c, max(self.tails.tails.get(c, 1), first + n))

    async def lost(self, c: uuid.UUID, first: int, n: int) -> None:
        """A write whose batch lost after its mark was appended: the tail does not move."""
        await self.hook.mark_dirty(c, first, n)

    def compact(self, c: uuid.UUID, offset: int) -> None:
        self.compaction.set(c, offset)
        self.rollup.note_compacted(c, offset)


async def test_a_failed_writes_mark_is_dropped_once_settled() -> None:
    w = World()
    a = cid(1)
    await w.committed(a, 1, 5)  # [1, 6) is in the log
    await w.lost(a, 6, 4)  # [6, 10) never landed
    first = await w.rollup.run()
    assert spans(first.entries) == {a: (1, 10)}  # too young to judge: kept whole
    w.compact(a, 6)  # the compactor folds everything the log has
    w.clock.advance_s(31)
    dropped = 0
    for _ in range(3):  # and it stays gone: no reinsert growth, no rising score
        result = await w.rollup.run()
        assert a not in result.entries, result.entries
        dropped += result.marks_beyond_tail
    assert dropped == 1
    assert missing_from_dirty_set({a: (6, 6)}, w.rollup.entries()) == set()


async def test_a_settled_mark_partly_past_the_tail_keeps_the_landed_part() -> None:
    w = World()
    a = cid(2)
    await w.committed(a, 1, 3)  # the tail is 4
    await w.lost(a, 3, 5)  # speculative offsets [3, 8): offset 3 is another writer's record
    w.clock.advance_s(31)
    # First seen now: young, whatever its insertion time says (issue 20 adversary, 3).
    assert spans((await w.rollup.run()).entries) == {a: (1, 8)}
    w.clock.advance_s(31)
    result = await w.rollup.run()
    assert spans(result.entries) == {a: (1, 4)}


async def test_unsettled_marks_are_never_clipped_even_when_merged_with_old_ones() -> None:
    """A fresh mark of a write still in flight must survive although an old, settled mark of the
    same collection is clipped: the two are carried apart."""
    w = World(settle_s=30)
    a = cid(3)
    await w.committed(a, 1, 2)  # tail 3
    await w.lost(a, 3, 4)  # an old failure
    assert spans((await w.rollup.run()).entries) == {a: (1, 7)}  # first seen: young
    w.clock.advance_s(31)
    await w.lost(a, 3, 2)  # a new write in flight at the same offsets (the tail has not moved)
    first = await w.rollup.run()
    assert spans(first.entries) == {a: (1, 5)}  # old clipped to [1, 3), fresh [3, 5) kept
    # Still in flight at the next roll-up (inside settle_s): kept, although carried once.
    w.clock.advance_s(10)
    assert spans((await w.rollup.run()).entries) == {a: (1, 5)}
    # It lands; later everything is compacted and the collection leaves the set.
    w.tails.set(a, 5)
    w.compact(a, 5)
    w.clock.advance_s(60)
    assert (await w.rollup.run()).entries == {}


async def test_without_tails_the_rollup_clips_to_compaction_only() -> None:
    """Backends that cannot tell tails keep the previous behaviour (nothing is ever dropped)."""
    clock = FakeClock()
    backend = MemoryLogBackend()
    compaction = MemoryCompactionOffsets()
    hook = DirtyLogHook(backend, clock)
    rollup = RollUp(backend, compaction, clock=clock)
    await hook.mark_dirty(cid(4), 1, 9)
    clock.advance_s(3600)
    assert spans((await rollup.run()).entries) == {cid(4): (1, 10)}


async def test_an_old_mark_whose_commit_may_still_land_is_kept() -> None:
    """Issue 20, r6: however old a mark, while its log reports a write that may still land (an
    uploaded fragment continuing it, a commit in flight) it is not clipped to the tail."""
    w = World(settle_s=30)
    a = cid(5)
    await w.committed(a, 1, 2)  # tail 3
    w.compact(a, 3)
    await w.lost(a, 3, 4)  # marked and uploaded; its commit is slow
    w.tails.pending.add(a)
    w.clock.advance_s(3600)
    for _ in range(2):
        assert spans((await w.rollup.run()).entries) == {a: (3, 7)}
    # The commit lands an hour late: the tail tells, and the span is the log's.
    w.tails.pending.discard(a)
    w.tails.set(a, 7)
    w.clock.advance_s(31)
    assert spans((await w.rollup.run()).entries) == {a: (3, 7)}
    assert missing_from_dirty_set({a: (7, 3)}, w.rollup.entries()) == set()


async def test_a_mark_is_aged_by_the_rollups_sightings_not_its_insertion_time() -> None:
    """Issue 20 adversary, 3: a mark whose insertion time is far in the past (the marking host's
    wall clock stepped forward, or a skewed host adopted) is still young when the roll-up first
    sees it; it settles only ``settle_s`` of the roll-up's monotonic time later, and a restarted
    roll-up (no sightings) starts the wait afresh."""
    w = World(settle_s=30)
    a = cid(6)
    await w.committed(a, 1, 2)  # tail 3
    w.compact(a, 3)
    w.clock.advance_s(3600)
    await w.hook.mark_dirty(a, 3, 4)  # stamped "now" ...
    w.clock.now_us -= 3600 * 1_000_000  # ... by a clock an hour fast: the roll-up's is not
    assert spans((await w.rollup.run()).entries) == {a: (3, 7)}  # young: kept
    w.clock.advance_s(29)
    assert spans((await w.rollup.run()).entries) == {a: (3, 7)}  # still inside settle_s
    # A restart: a new roll-up has seen nothing, so the carried mark is young again.
    w.rollup = RollUp(
        w.backend,
        w.compaction,
        clock=w.clock,
        tails=w.tails,
        monotonic=lambda: w.clock.now_us / 1e6,
    )
    w.clock.advance_s(2)
    assert spans((await w.rollup.run()).entries) == {a: (3, 7)}
    w.clock.advance_s(29)
    assert spans((await w.rollup.run()).entries) == {a: (3, 7)}
    w.clock.advance_s(2)  # 31 s after this process first saw it: settled, past the tail (3)
    result = await w.rollup.run()
    assert a not in result.entries and result.marks_beyond_tail == 1, result
