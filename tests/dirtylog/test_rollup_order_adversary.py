"""An adversary's cases for the roll-up's order lock (7669203: clears shared, purges alone).

The invariants under attack: a collection with uncompacted records is never missing from the
dirty set (in memory, or in the fold of the retained log); clears and purges reach the log in the
order memory applied them; no deadlock, no lost wake-up; a cancelled or failed holder or waiter
leaves the lock usable.  Task order is driven by events and ``asyncio.sleep(0)`` (to let ready
tasks run; no time passes), never by timing.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Callable

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyLogHook,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RecordKind,
    RollUp,
)
from dirtylog.dirtyset import DirtySet
from dirtylog.rollup import _SharedExclusive
from wal3.errors import StoreUnavailable

from .helpers import FakeClock, cid, decoded_from, spans

SPIN = 50  # rounds of sleep(0): enough for every ready task here to run (no time passes)


class _Gated(MemoryLogBackend):
    """Appends (and, when ``hold_reads``, reads) can be held at a gate; ``land_first`` makes a
    held append durable before it waits (its caller then resumes without another yield)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()
        self.land_first = False
        self.held = 0
        self.hold_reads = False
        self.read_gate = asyncio.Event()
        self.reads_held = 0

    async def append_many(self, bodies: list[bytes]) -> int:
        if self.gate.is_set():
            return await super().append_many(bodies)
        self.held += 1
        try:
            if self.land_first:
                first = await super().append_many(bodies)
                await self.gate.wait()
                return first
            await self.gate.wait()
            return await super().append_many(bodies)
        finally:
            self.held -= 1

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        if self.hold_reads:
            self.reads_held += 1
            try:
                await self.read_gate.wait()
            finally:
                self.reads_held -= 1
        return await super().read(from_offset, max_records)


class World:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.backend = _Gated()
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = RollUp(
            self.backend,
            MemoryCompactionOffsets(),
            clock=self.clock,
            monotonic=lambda: self.clock.now_us / 1e6,
        )

    @property
    def order(self) -> _SharedExclusive:
        return self.rollup._order

    def idle(self) -> bool:
        o = self.order
        return o._shared == 0 and not o._exclusive and o._waiting == 0

    async def durable(self) -> dict[uuid.UUID, tuple[int, int]]:
        """The fold of the retained log from the cursor (what a restart rebuilds)."""
        cursor = await self.backend.load_cursor(CURSOR_NAME)
        start = cursor[0] if cursor is not None else await self.backend.oldest_offset()
        scratch = DirtySet(None)
        for offset, record in await decoded_from(self.backend, start):
            scratch.fold(offset, record, 0.0, 0.0)
        return spans(dict(scratch.entries))

    async def kinds(self) -> list[tuple[int, RecordKind, uuid.UUID]]:
        return [(o, r.kind, r.collection_id) for o, r in await decoded_from(self.backend, 1)]


async def spin() -> None:
    for _ in range(SPIN):
        await asyncio.sleep(0)


async def until(predicate: Callable[[], bool]) -> None:
    for _ in range(SPIN):
        if predicate():
            return
        await asyncio.sleep(0)
    raise AssertionError("the interleaving this test drives was not reached")


# ------------------------------------------------------------------- cancellation / wake-ups


async def test_a_purge_cancelled_after_the_last_clear_left_wakes_the_clears_queued_behind_it() -> (
    None
):
    """Lost wake-up.  A purge waits for an in-flight clear; the clear finishes and notifies; a new
    clear arrives before the purge has run again and queues behind it (``_waiting``); the purge is
    then cancelled (its client went away).  Its exit decremented ``_waiting`` without notifying,
    and nothing else held the lock to notify later: the queued clear (a compaction POST) hung
    until some other clear or purge happened to come by."""
    w = World()
    a, b, x = cid(1), cid(2), cid(3)
    w.backend.land_first = True
    w.backend.gate.clear()
    early = asyncio.create_task(w.rollup.compacted(a, 5))
    await until(lambda: w.backend.held == 1)  # durable, still holding the lock shared
    purge = asyncio.create_task(w.rollup.purge([x]))
    await until(lambda: w.order._waiting == 1)
    w.backend.gate.set()  # ready: the early clear's release (it notifies the purge)
    late = asyncio.create_task(w.rollup.compacted(b, 7))  # ready after it
    await asyncio.sleep(0)  # the early clear leaves, the late clear queues behind the purge
    assert early.done() and not purge.done() and not late.done()
    assert w.order._waiting == 1 and w.order._shared == 0
    purge.cancel()  # before the purge, notified, has run again
    await spin()
    assert purge.cancelled()
    assert late.done(), "the clear queued behind a cancelled purge was never woken"
    assert late.result() == 2 and w.idle()


async def test_a_purge_cancelled_while_clears_hold_the_lock_leaves_it_usable() -> None:
    w = World()
    w.backend.gate.clear()
    holders = [asyncio.create_task(w.rollup.compacted(cid(i), 5)) for i in range(3)]
    await until(lambda: w.backend.held == 3)
    purge = asyncio.create_task(w.rollup.purge([cid(9)]))
    await until(lambda: w.order._waiting == 1)
    queued = asyncio.create_task(w.rollup.compacted(cid(4), 5))
    await spin()
    assert not queued.done()  # behind the waiting purge
    purge.cancel()
    await spin()
    assert purge.cancelled() and w.order._waiting == 0
    w.backend.gate.set()
    await asyncio.gather(*holders, queued)
    assert w.idle()
    assert await w.rollup.purge([cid(9)]) == 5  # the pass/purge lock was released too


async def test_holders_cancelled_mid_append_leave_the_lock_usable() -> None:
    w = World()
    w.backend.gate.clear()
    clear = asyncio.create_task(w.rollup.compacted(cid(1), 5))
    await until(lambda: w.backend.held == 1)
    clear.cancel()
    await spin()
    assert clear.cancelled() and w.idle()
    purge = asyncio.create_task(w.rollup.purge([cid(1)]))
    await until(lambda: w.backend.held == 1)
    assert w.order._exclusive
    queued = asyncio.create_task(w.rollup.compacted(cid(2), 5))
    await spin()
    assert not queued.done()
    purge.cancel()
    await spin()
    assert purge.cancelled() and not w.order._exclusive
    w.backend.gate.set()
    assert await queued == 1 and w.idle()  # nothing of the cancelled ones landed
    moved = asyncio.create_task(w.rollup.uncompacted(cid(3), 2, 6))
    assert await moved == 2 and w.idle()


async def test_an_append_that_raises_releases_the_lock_either_way() -> None:
    w = World()
    for op_after in (False, True):
        w.backend.inject_fault("append", after=op_after, exc=StoreUnavailable("injected"))
        with contextlib.suppress(StoreUnavailable):
            await w.rollup.compacted(cid(1), 5)
        assert w.idle()
        w.backend.inject_fault("append", after=op_after, exc=StoreUnavailable("injected"))
        with contextlib.suppress(StoreUnavailable):
            await w.rollup.purge([cid(1)])
        assert w.idle() and not w.rollup._lock.locked()
        w.backend.inject_fault("append", after=op_after, exc=StoreUnavailable("injected"))
        with contextlib.suppress(StoreUnavailable):
            await w.rollup.uncompacted(cid(1), 1, 4)
        assert w.idle() and not w.rollup._lock.locked()
    first = await w.rollup.compacted(cid(2), 3)
    assert await w.rollup.purge([cid(2)]) == first + 1


# ------------------------------------------------------------------------- order in the log


async def test_a_purge_racing_many_clears_of_the_same_collection_keeps_log_order() -> None:
    """Clears in flight land before the purge, clears arriving while it waits land after it;
    memory and the retained log's fold agree, and the marks after the purge stay dirty."""
    w = World()
    c = cid(1)
    await w.hook.mark_dirty(c, 1, 29)  # [1, 30)
    await w.rollup.run()
    w.backend.gate.clear()
    early = [asyncio.create_task(w.rollup.compacted(c, o)) for o in (5, 10, 20)]
    await until(lambda: w.backend.held == 3)
    purge = asyncio.create_task(w.rollup.purge([c]))
    await until(lambda: w.order._waiting == 1)
    late = [asyncio.create_task(w.rollup.compacted(c, o)) for o in (31, 32)]
    await spin()
    assert w.backend.held == 3  # the late clears queue behind the purge
    w.backend.gate.set()
    firsts_early = await asyncio.gather(*early)
    first_purge = await purge
    assert first_purge is not None
    firsts_late = await asyncio.gather(*late)
    assert max(firsts_early) < first_purge < min(firsts_late)
    await w.hook.mark_dirty(c, 30, 10)  # new writes after the purge: [30, 40)
    await w.rollup.run()
    assert spans(w.rollup.entries()) == await w.durable() == {c: (32, 40)}


@pytest.mark.parametrize("clear_first", [True, False])
async def test_a_clear_racing_a_cursor_moved_back_for_the_same_collection(
    clear_first: bool,
) -> None:
    w = World()
    c = cid(1)
    await w.hook.mark_dirty(c, 1, 19)  # [1, 20)
    await w.rollup.run()
    w.backend.gate.clear()
    if clear_first:
        first = asyncio.create_task(w.rollup.compacted(c, 15))
        await until(lambda: w.backend.held == 1)
        second = asyncio.create_task(w.rollup.uncompacted(c, 5, 20))
        await until(lambda: w.order._waiting == 1)
    else:
        first = asyncio.create_task(w.rollup.uncompacted(c, 5, 20))
        await until(lambda: w.backend.held == 1)
        second = asyncio.create_task(w.rollup.compacted(c, 12))
    await spin()
    assert w.backend.held == 1
    w.backend.gate.set()
    a, b = await first, await second
    assert a < b
    want = {c: (5, 20)} if clear_first else {c: (12, 20)}
    assert spans(w.rollup.entries()) == want
    await w.rollup.run()
    assert spans(w.rollup.entries()) == await w.durable() == want


# --------------------------------------------------------------------------- starvation, pass


async def test_a_stream_of_purges_does_not_starve_a_clear() -> None:
    w = World()
    w.backend.gate.clear()
    p1 = asyncio.create_task(w.rollup.purge([cid(1)]))
    await until(lambda: w.backend.held == 1)
    clear = asyncio.create_task(w.rollup.compacted(cid(2), 5))
    p2 = asyncio.create_task(w.rollup.purge([cid(3)]))
    p3 = asyncio.create_task(w.rollup.purge([cid(4)]))
    await spin()
    w.backend.gate.set()
    f1, fc, f2, f3 = await asyncio.gather(p1, clear, p2, p3)
    assert f1 is not None and f2 is not None and f3 is not None
    assert f1 < fc < f2 < f3 and w.idle()


async def test_clears_do_not_wait_for_a_pass_and_a_purge_does() -> None:
    w = World()
    await w.hook.mark_dirty(cid(1), 1, 9)
    w.backend.hold_reads = True
    run = asyncio.create_task(w.rollup.run())
    await until(lambda: w.backend.reads_held == 1)  # the pass holds ``_lock``, mid-fold
    assert await w.rollup.compacted(cid(2), 5) == 2  # not behind the pass
    purge = asyncio.create_task(w.rollup.purge([cid(1)]))
    after = asyncio.create_task(w.rollup.compacted(cid(3), 5))
    await spin()
    assert not purge.done() and after.done()  # the purge waits for ``_lock`` alone
    w.backend.hold_reads = False
    w.backend.read_gate.set()
    await run
    await purge
    assert w.idle()
    await w.rollup.run()
    assert spans(w.rollup.entries()) == await w.durable() == {}
