"""A crash at every backend call of a roll-up only ever duplicates; a fresh roll-up converges."""

from __future__ import annotations

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyLogHook,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RollUp,
    RollUpResult,
)
from wal3.errors import LogPurged, SimulatedCrash

from .helpers import FakeClock, cid, spans


class Scenario:
    """A deterministic dirty log: carried records, fresh marks, a purge, compaction progress."""

    def __init__(self) -> None:
        self.clock = FakeClock()
        self.backend = MemoryLogBackend()
        self.compaction = MemoryCompactionOffsets()
        self.hook = DirtyLogHook(self.backend, self.clock)

    def rollup(self) -> RollUp:
        # Small pages and batches so every run makes several reads and appends.
        return RollUp(
            self.backend,
            self.compaction,
            clock=self.clock,
            max_records_per_read=3,
            max_records_per_append=2,
        )

    async def build(self, *, with_prior_rollup: bool) -> None:
        for i in range(6):
            await self.hook.mark_dirty(cid(i), 1, 4)
            self.clock.advance_s(1)
        await self.hook.purge([cid(5)])
        if with_prior_rollup:
            await self.rollup().run()
        for i in (0, 1, 2):
            await self.hook.mark_dirty(cid(i), 5, 2)
            self.clock.advance_s(1)
        self.compaction.set(cid(1), 7)  # fully compacted: drops
        self.compaction.set(cid(2), 6)  # partially compacted: clipped
        self.compaction.set(cid(3), 2)


EXPECTED = {cid(0): (1, 7), cid(2): (6, 7), cid(3): (2, 5), cid(4): (1, 5)}


async def reference(with_prior_rollup: bool) -> tuple[RollUpResult, list[str]]:
    s = Scenario()
    await s.build(with_prior_rollup=with_prior_rollup)
    mark = len(s.backend.trace)
    result = await s.rollup().run()
    assert spans(result.entries) == EXPECTED
    return result, s.backend.trace[mark:]


async def assert_converged(s: Scenario, ref: RollUpResult) -> None:
    for k in range(2):
        result = await s.rollup().run()  # a fresh object: the crashed process's memory is gone
        assert result.gc_error is None
        assert spans(result.entries) == EXPECTED
        for c, e in result.entries.items():
            r = ref.entries[c]
            assert e.first_insertion_us == r.first_insertion_us
            # A crash can cost one extra carry, never lose one; each later run carries once more.
            assert r.reinsert_count + k <= e.reinsert_count <= r.reinsert_count + k + 1
        cursor = (await s.backend.load_cursor(CURSOR_NAME))[0]  # type: ignore[index]
        assert await s.backend.oldest_offset() == cursor  # GC caught up
        if cursor > 1:
            with pytest.raises(LogPurged):
                await s.backend.read(cursor - 1, 1)


@pytest.mark.parametrize("with_prior_rollup", [False, True])
@pytest.mark.parametrize("after_effect", [False, True])
async def test_crash_at_every_call_point_converges(
    with_prior_rollup: bool, after_effect: bool
) -> None:
    ref, ops = await reference(with_prior_rollup)
    # The enumeration really visits each step of the algorithm.
    expected_ops = {"load_cursor", "next_offset", "read", "append", "cas_cursor", "gc"}
    if not with_prior_rollup:
        expected_ops |= {"oldest_offset", "create_cursor"}
    assert set(ops) == expected_ops
    assert ops.count("read") >= 3 and ops.count("append") >= 2
    for n, op in enumerate(ops):
        s = Scenario()
        await s.build(with_prior_rollup=with_prior_rollup)
        s.backend.inject_fault(None, skip=n, after=after_effect)
        try:
            result = await s.rollup().run()
        except SimulatedCrash:
            pass
        else:
            assert op == "gc" and result.gc_error is not None, (n, op)  # GC is best effort
            assert spans(result.entries) == EXPECTED
        assert s.backend.pending_faults == 0, (n, op)
        await assert_converged(s, ref)


@pytest.mark.parametrize("with_prior_rollup", [False, True])
async def test_crash_at_compaction_lookup_converges(with_prior_rollup: bool) -> None:
    ref, _ = await reference(with_prior_rollup)
    s = Scenario()
    await s.build(with_prior_rollup=with_prior_rollup)
    s.compaction.fail_next = SimulatedCrash("compaction lookup")
    next_before = await s.backend.next_offset()
    with pytest.raises(SimulatedCrash):
        await s.rollup().run()
    assert await s.backend.next_offset() == next_before  # nothing was written
    await assert_converged(s, ref)


async def test_repeated_crashes_between_appends_and_cursor_never_lose() -> None:
    """Crash right before the cursor move many times in a row: duplicates pile up, then collapse."""
    s = Scenario()
    await s.build(with_prior_rollup=True)
    ref, _ = await reference(True)
    for _ in range(5):
        s.backend.inject_fault("cas_cursor")
        with pytest.raises(SimulatedCrash):
            await s.rollup().run()
    result = await s.rollup().run()
    assert spans(result.entries) == EXPECTED
    # Each crashed run's carries were re-read (reinsert grew), but first insertion never moved.
    for c, e in result.entries.items():
        assert e.first_insertion_us == ref.entries[c].first_insertion_us
        assert e.reinsert_count >= ref.entries[c].reinsert_count
    # One more run: the window is now only the last run's carries.
    again = await s.rollup().run()
    assert again.records_read == len(EXPECTED)
