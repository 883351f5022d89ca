"""Handing a departed server's dirty set over to a live server's dirty log, crash-safely."""

from __future__ import annotations

import contextlib

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyLogHook,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RollUp,
    hand_over,
)
from wal3.errors import SimulatedCrash

from .helpers import FakeClock, cid, spans


class Pair:
    """A departed server's dirty log (``gone``) and a live one (``live``) sharing one store."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.gone = MemoryLogBackend()
        self.live = MemoryLogBackend()
        self.compaction = MemoryCompactionOffsets()

    async def build(self) -> None:
        gone_hook = DirtyLogHook(self.gone, self.clock)
        for i in range(5):
            await gone_hook.mark_dirty(cid(i), 1, 4)
            self.clock.advance_s(1)
        await RollUp(self.gone, self.compaction, clock=self.clock).run()  # it rolled up once
        await gone_hook.mark_dirty(cid(0), 5, 3)
        await gone_hook.purge([cid(4)])
        self.compaction.set(cid(1), 5)  # fully compacted since: not handed over
        self.compaction.set(cid(2), 3)  # partly
        # The live server has dirty collections of its own, one shared with the departed one.
        live_hook = DirtyLogHook(self.live, self.clock)
        await live_hook.mark_dirty(cid(3), 5, 2)
        await live_hook.mark_dirty(cid(9), 1, 1)

    async def hand_over(self) -> None:
        await hand_over(
            self.gone, self.live, self.compaction, max_records_per_read=2, max_records_per_append=1
        )

    async def live_set(self) -> dict:
        return spans((await RollUp(self.live, self.compaction, clock=self.clock).run()).entries)


EXPECTED = {cid(0): (1, 8), cid(2): (3, 5), cid(3): (1, 7), cid(9): (1, 2)}


async def test_hand_over_moves_what_is_still_dirty_and_only_that() -> None:
    p = Pair()
    await p.build()
    gone_next = await p.gone.next_offset()
    result = await hand_over(p.gone, p.live, p.compaction)
    assert result.collections == 3 and result.cursor_to == gone_next
    assert await p.live_set() == EXPECTED
    # The departed log's cursor moved past everything: its own roll-up (should the server come
    # back) starts from there and finds nothing, and a second hand-over moves nothing.
    assert (await p.gone.load_cursor(CURSOR_NAME))[0] == gone_next  # type: ignore[index]
    assert spans((await RollUp(p.gone, p.compaction, clock=p.clock).run()).entries) == {}
    again = await hand_over(p.gone, p.live, p.compaction)
    assert again.collections == 0
    assert await p.live_set() == EXPECTED


async def test_marks_written_during_a_hand_over_stay_with_the_departed_log() -> None:
    # The window is fixed up front: a late mark (the server was not gone after all) stays above
    # the moved cursor, where its own roll-up or the next hand-over finds it.
    p = Pair()
    await p.build()
    late = DirtyLogHook(p.gone, p.clock)
    result = await hand_over(p.gone, p.live, p.compaction)
    await late.mark_dirty(cid(7), 1, 2)
    assert cid(7) not in await p.live_set()
    assert spans((await RollUp(p.gone, p.compaction, clock=p.clock).run()).entries) == {
        cid(7): (1, 3)
    }
    assert result.collections == 3


@pytest.mark.parametrize("after_effect", [False, True])
async def test_a_crash_at_any_step_loses_nothing(after_effect: bool) -> None:
    ref = Pair()
    await ref.build()
    mark_gone, mark_live = len(ref.gone.trace), len(ref.live.trace)
    await ref.hand_over()
    steps = len(ref.gone.trace) - mark_gone + len(ref.live.trace) - mark_live
    assert steps >= 6  # several reads, appends, the cursor move
    for n in range(steps):
        for where in ("gone", "live"):
            p = Pair()
            await p.build()
            backend = getattr(p, where)
            backend.inject_fault(None, skip=n, after=after_effect)
            with contextlib.suppress(SimulatedCrash):
                await p.hand_over()
            backend.clear_faults()
            # Whatever the crash left (nothing moved, or duplicates in the live log), a retry
            # converges and no still-dirty collection is missing.
            await p.hand_over()
            assert await p.live_set() == EXPECTED, (where, n, after_effect)
