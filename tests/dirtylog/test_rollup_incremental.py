"""The incremental roll-up (issue 24): bounded passes, clears instead of cursor reads, and the
adversary's cases (a crash between relog and cursor move, a clear racing a mark, a restart
mid-window, two processes on one log, a forked collection)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Awaitable, Callable

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyLogHook,
    DirtyRecord,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RecordKind,
    RollUp,
    RollUpResult,
)
from dirtylog.dirtyset import DirtySet
from wal3.errors import CursorConflict, SimulatedCrash

from .helpers import FakeClock, cid, decoded_from, spans


class ArmedBackend(MemoryLogBackend):
    """Runs queued callbacks right before the next append (a pass is about to relog)."""

    def __init__(self) -> None:
        super().__init__()
        self.before_append: list[Callable[[], Awaitable[object]]] = []

    async def append_many(self, bodies: list[bytes]) -> int:
        while self.before_append:
            await self.before_append.pop(0)()
        return await super().append_many(bodies)


class World:
    def __init__(self, **kw: int) -> None:
        self.clock = FakeClock()
        self.backend = ArmedBackend()
        self.compaction = MemoryCompactionOffsets()
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.kw = kw
        self.rollup = self.new_rollup()

    def new_rollup(self) -> RollUp:
        return RollUp(self.backend, self.compaction, clock=self.clock, **self.kw)  # type: ignore[arg-type]

    async def durable(self) -> dict[uuid.UUID, tuple[int, int]]:
        """What a restarted process would rebuild: the fold of the retained log."""
        cursor = await self.backend.load_cursor(CURSOR_NAME)
        start = cursor[0] if cursor is not None else await self.backend.oldest_offset()
        scratch = DirtySet(None)
        for offset, record in await decoded_from(self.backend, start):
            scratch.fold(offset, record, 0.0, 0.0)
        return spans(dict(scratch.entries))

    async def retained(self) -> int:
        cursor = await self.backend.load_cursor(CURSOR_NAME)
        return await self.backend.next_offset() - (cursor[0] if cursor else 1)


# ------------------------------------------------------------------------------- bounded work


async def test_a_pass_reads_only_what_is_new_and_relogs_a_bounded_window() -> None:
    w = World(window_records=64, max_records_per_read=100, max_compaction_lookups=4)
    for i in range(1000):
        await w.hook.mark_dirty(cid(i), 1, 5)
    first = await w.rollup.run()  # a start: the whole log is folded once
    assert first.rebuilt and first.records_read == 1000 and len(first.entries) == 1000
    assert first.window == 64 and first.relogged == 64 and first.compaction_lookups == 4
    for step in range(5):
        reads = w.backend.calls["read"]
        for i in range(10):
            await w.hook.mark_dirty(cid(2000 + 10 * step + i), 1, 1)
        result = await w.rollup.run()
        assert not result.rebuilt and result.records_read == 10  # only the new marks
        assert w.backend.calls["read"] - reads == 1
        assert result.window == 64 + 10 and result.relogged <= 64 + 10
        assert result.compaction_lookups <= 4
    # A full rotation of the dirty set takes ceil(retained / window) + 1 passes, after which the
    # log holds one relog per dirty collection and nothing else.
    end = await w.backend.next_offset()
    passes = math.ceil(await w.retained() / 64) + 1
    for _ in range(passes):
        result = await w.rollup.run()
    assert result.cursor_to >= end
    assert result.retained == len(result.entries) == 1050
    assert await w.durable() == spans(result.entries)


async def test_the_log_stays_bounded_while_marks_keep_coming() -> None:
    """Every pass brings m new marks (half to dirty collections, half to new ones): the retained
    log stays under dirty × (1 + m / window) + m + window records."""
    window, m = 32, 40
    w = World(window_records=window, max_compaction_lookups=0)
    n = 0
    for step in range(60):
        for i in range(m):
            c = cid(i % 20) if i % 2 else cid(1000 + n)
            n += i % 2 == 0
            await w.hook.mark_dirty(c, 1 + step, 1)
        result = await w.rollup.run()
        dirty = len(result.entries)
        assert result.retained <= dirty * (1 + m / window) + m + window, (step, result.retained)
        assert result.relogged <= window + m


async def test_select_and_entries_answer_from_memory() -> None:
    w = World()
    for i in range(5):
        await w.hook.mark_dirty(cid(i), 1, 10 * (i + 1))
    await w.rollup.run()
    before = sum(w.backend.calls.values()), w.compaction.calls
    chosen = w.rollup.select(min_records=0, limit=3)
    assert [e.collection_id for e in chosen] == [cid(4), cid(3), cid(2)]
    assert len(w.rollup.entries()) == 5
    assert (sum(w.backend.calls.values()), w.compaction.calls) == before


# ------------------------------------------------------------------------ clears, not lookups


async def test_compactions_reach_the_set_through_clears_without_any_cursor_read() -> None:
    w = World(window_records=3, max_compaction_lookups=0)
    for i in range(8):
        await w.hook.mark_dirty(cid(i), 1, 10)
    await w.rollup.run()
    for i in range(4):
        first = await w.rollup.compacted(cid(i), 11)  # everything
        (_, clear), *_ = await decoded_from(w.backend, first)
        assert (clear.kind, clear.collection_id, clear.log_position) == (
            RecordKind.CLEAR,
            cid(i),
            11,
        )
        assert len(clear.encode()) == 48
    await w.rollup.compacted(cid(4), 6)  # half
    assert set(w.rollup.entries()) == {cid(i) for i in range(4, 8)}  # at once, in memory
    for _ in range(6):
        await w.rollup.run()
    assert spans(w.rollup.entries()) == {cid(4): (6, 11), **{cid(i): (1, 11) for i in (5, 6, 7)}}
    # A restart rebuilds the same set from the log alone: the clears are in it.
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == spans(w.rollup.entries())
    assert spans(w.rollup.entries()) == {cid(4): (6, 11), **{cid(i): (1, 11) for i in (5, 6, 7)}}
    assert w.compaction.calls == 0


async def test_a_compaction_told_to_another_host_is_found_by_the_bounded_fallback() -> None:
    w = World(window_records=4, max_compaction_lookups=2)
    for i in range(10):
        await w.hook.mark_dirty(cid(i), 1, 10)
        w.compaction.set(cid(i), 11)  # compacted, but this host was never told
    lookups = 0
    for _ in range(12):
        result = await w.rollup.run()
        assert result.compaction_lookups <= 2
        lookups += result.compaction_lookups
        if not result.entries:
            break
    assert result.entries == {} and lookups == 10


@pytest.mark.parametrize("order", ["clear_first", "mark_first"])
async def test_a_clear_racing_a_mark_of_the_same_collection(order: str) -> None:
    """The compactor folded a write whose mark reaches the dirty log only after the clear (or
    just before it): either way the mark is clipped, in memory and after a restart."""
    w = World(window_records=2, max_compaction_lookups=0)
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 5)
    await w.hook.mark_dirty(b, 1, 5)
    await w.rollup.run()
    if order == "clear_first":
        await w.rollup.compacted(a, 9)
        await w.hook.mark_dirty(a, 6, 3)  # the late mark of [6, 9): compacted already
    else:
        await w.hook.mark_dirty(a, 6, 3)
        await w.rollup.compacted(a, 9)
    await w.hook.mark_dirty(a, 9, 2)  # a new write: must stay
    for _ in range(4):
        result = await w.rollup.run()
        assert spans(result.entries) == {a: (9, 11), b: (1, 6)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (9, 11), b: (1, 6)}


async def test_a_compaction_noted_while_its_relog_is_in_flight() -> None:
    """The note clips memory mid-pass; the relog already built states the older, wider span
    (a superset), and the next pass restates the clipped one."""
    w = World(max_compaction_lookups=0)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 10)

    async def note() -> None:
        await w.rollup.compacted(a, 4)

    w.backend.before_append.append(note)
    result = await w.rollup.run()
    assert spans(result.entries) == {a: (4, 11)}
    assert await w.durable() == {a: (4, 11)}  # the clear landed before the relog
    assert spans((await w.rollup.run()).entries) == {a: (4, 11)}


# ----------------------------------------------------------------------------------- crashes


async def _windowed_log(w: World) -> None:
    for i in range(7):
        await w.hook.mark_dirty(cid(i), 1, 4)
    await w.hook.purge([cid(6)])
    await w.rollup.run()
    await w.hook.mark_dirty(cid(0), 5, 2)
    await w.rollup.compacted(cid(1), 5)
    await w.hook.mark_dirty(cid(2), 5, 1)


EXPECTED = {cid(0): (1, 7), cid(2): (1, 6), **{cid(i): (1, 5) for i in (3, 4, 5)}}


@pytest.mark.parametrize("after_effect", [False, True])
async def test_a_crash_at_every_call_of_a_windowed_pass_loses_nothing(after_effect: bool) -> None:
    ref = World(window_records=2, max_records_per_read=2, max_records_per_append=1)
    await _windowed_log(ref)
    mark = len(ref.backend.trace)
    await ref.rollup.run()
    await ref.rollup.run()
    ops = ref.backend.trace[mark:]
    assert {"read", "append", "cas_cursor", "gc"} <= set(ops)
    for n in range(len(ops)):
        w = World(window_records=2, max_records_per_read=2, max_records_per_append=1)
        await _windowed_log(w)
        w.backend.inject_fault(None, skip=n, after=after_effect)
        for _ in range(2):
            try:
                result = await w.rollup.run()
            except SimulatedCrash:
                w.rollup = w.new_rollup()  # the process died: a new one starts
                break
            assert spans(result.entries) == EXPECTED, (n, ops[n])
        w.backend.clear_faults()
        assert (
            await w.durable() == {**EXPECTED, cid(1): (5, 5)}
            or (await w.durable()).items() >= EXPECTED.items()
        ), (n, ops[n])
        for _ in range(6):  # a few passes: a full rotation at window 2
            result = await w.rollup.run()
            assert spans(result.entries) == EXPECTED, (n, ops[n])
        assert await w.durable() == EXPECTED, (n, ops[n])


async def test_crashes_between_relog_and_cursor_move_only_duplicate() -> None:
    w = World(window_records=3)
    await _windowed_log(w)
    for _ in range(4):
        w.backend.inject_fault("cas_cursor", after=False)
        with pytest.raises(SimulatedCrash):
            await w.rollup.run()
        w.rollup = w.new_rollup()
        assert (await w.durable()).items() >= EXPECTED.items()
    for _ in range(8):
        result = await w.rollup.run()
    assert spans(result.entries) == EXPECTED and await w.durable() == EXPECTED
    assert result.retained == len(EXPECTED)  # the duplicates were rotated out


async def test_a_restart_mid_window_resumes_the_rotation() -> None:
    w = World(window_records=3, max_compaction_lookups=0)
    for i in range(20):
        await w.hook.mark_dirty(cid(i), 1, i + 1)
    want = {cid(i): (1, i + 2) for i in range(20)}
    for restart in range(4):
        for _ in range(2):
            assert spans((await w.rollup.run()).entries) == want
        w.rollup = w.new_rollup()  # mid-rotation: the cursor is somewhere inside the set
        assert await w.durable() == want, restart
    for i in range(20):
        await w.rollup.compacted(cid(i), i + 2)
    assert w.rollup.entries() == {}
    for _ in range(math.ceil(await w.retained() / 3) + 1):
        result = await w.rollup.run()
    assert result.entries == {} and result.retained == 1  # a checkpoint
    assert await w.durable() == {}


async def test_a_mark_that_lands_before_a_relog_holds_the_window_back() -> None:
    """A mark appended after a pass read the end but before its relog lies below the relog: the
    collection's home is the mark now, so the next window relogs it before passing the mark (a
    home left at the relog lost ``[6, 8)`` at the next restart: the model's mutant 2)."""
    w = World(window_records=1, max_compaction_lookups=0)
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 5)  # offset 1
    await w.hook.mark_dirty(b, 1, 5)  # offset 2
    w.backend.before_append.append(lambda: w.hook.mark_dirty(a, 6, 2))  # lands at 3
    first = await w.rollup.run()  # window [1, 2): relogs a at 4
    assert first.cursor_to == 2
    second = await w.rollup.run()  # folds 3; window [2, 4)
    assert second.cursor_to == 4
    assert await w.durable() == {a: (1, 8), b: (1, 6)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (1, 8), b: (1, 6)}


# ------------------------------------------------------------------------------------ forks


async def test_two_processes_rolling_up_one_log_lose_nothing() -> None:
    """A split brain (a host believed gone is adopted while alive, a forked process): passes of
    two processes interleave on one log with small windows."""
    w = World(window_records=2, max_records_per_read=2)
    other = w.new_rollup()
    want: dict[uuid.UUID, tuple[int, int]] = {}
    for step in range(12):
        c = cid(step % 5)
        start = want.get(c, (1, 1))
        await w.hook.mark_dirty(c, start[1], 2)
        want[c] = (start[0], start[1] + 2)
        for r in (w.rollup, other) if step % 2 else (other, w.rollup):
            try:
                result: RollUpResult = await r.run()
            except CursorConflict:
                continue
            assert spans(result.entries).items() >= want.items() or (
                set(result.entries) >= set(want)
            )
        assert (await w.durable()).items() >= want.items()
    final = await w.new_rollup().run()
    assert spans(final.entries) == want


async def test_a_forked_collection_is_dirty_from_its_copied_compaction_cursor() -> None:
    """A fork copies the source's compaction cursor to the target without a POST (no clear):
    the target's mark starts there, and clears of the source never touch it."""
    w = World(window_records=2, max_compaction_lookups=0)
    source, target = cid(1), cid(2)
    await w.hook.mark_dirty(source, 1, 10)
    await w.rollup.run()
    await w.rollup.compacted(source, 6)
    await w.hook.mark_dirty(target, 6, 5)  # the fork marks [cursor, tail) before it is visible
    await w.rollup.compacted(source, 11)
    for _ in range(3):
        result = await w.rollup.run()
    assert spans(result.entries) == {target: (6, 11)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {target: (6, 11)}


async def test_a_purge_forgets_the_floor_so_a_recreated_log_is_tracked() -> None:
    w = World(max_compaction_lookups=0)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 10)
    await w.rollup.compacted(a, 11)
    await w.rollup.purge([a])
    await w.hook.mark_dirty(a, 1, 3)  # the same id, a new log from offset 1
    assert spans((await w.rollup.run()).entries) == {a: (1, 4)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (1, 4)}


async def test_the_pass_refuses_to_move_past_a_record_still_needed() -> None:
    """The last guard: a window that failed to relog a collection (here: a set that hides one
    home from the relog scan) stops the cursor with an error instead of dropping it."""

    class HidesOne(DirtySet):
        calls = 0

        def homes_in(self, start: int, stop: int) -> list[uuid.UUID]:
            HidesOne.calls += 1
            homes = super().homes_in(start, stop)
            return homes[1:] if HidesOne.calls % 2 else homes  # the relog scan misses one

    class Broken(RollUp):
        def _new_set(self) -> DirtySet:
            return HidesOne(None, self._clock)

    w = World()
    w.rollup = Broken(w.backend, w.compaction, clock=w.clock)
    await w.hook.mark_dirty(cid(1), 1, 2)
    await w.hook.mark_dirty(cid(2), 1, 2)
    with pytest.raises(Exception, match="still depend on records"):
        await w.rollup.run()
    assert (await w.backend.load_cursor(CURSOR_NAME)) == (1, "w1")
    assert await w.durable() == {cid(1): (1, 3), cid(2): (1, 3)}


def test_a_compaction_clear_names_a_collection() -> None:
    with pytest.raises(ValueError):
        DirtyRecord.compacted(uuid.UUID(int=0), 5, 1)
    with pytest.raises(ValueError):
        DirtyRecord.compacted(cid(1), 0, 1)
    clear = DirtyRecord.compacted(cid(1), 7, 9)
    assert DirtyRecord.decode(clear.encode()) == clear and not clear.is_checkpoint
    assert DirtyRecord.clear(9).is_checkpoint
