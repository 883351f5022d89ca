"""Clears are appended concurrently, purges alone (issue 24, the regression of 70348e4).

70348e4 ordered clears with purges by one lock held across each durable append, which also
serialised clears with one another: a compactor's round of N ``POST .../compaction`` became N
durable writes one after another, each its own fragment, and the roll-up then read N fragments
(bench rollup, 1,000 dirty: a pass went from 70 ms to 900 ms of CPU).  Clears now share the order
and purges (and cursors moved back) hold it alone, so a clear lands wholly before or wholly
after a purge, never across it.
"""

from __future__ import annotations

import asyncio
import uuid

from dirtylog import MemoryCompactionOffsets, MemoryLogBackend, RollUp

from .helpers import FakeClock

BOUND_S = 10.0


class _GatedBackend(MemoryLogBackend):
    """Holds every append until released, counting how many are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.in_flight = 0
        self.most = 0
        self.changed = asyncio.Condition()

    async def append_many(self, bodies: list[bytes]) -> int:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        async with self.changed:
            self.changed.notify_all()
        try:
            await self.gate.wait()
            return await super().append_many(bodies)
        finally:
            self.in_flight -= 1

    async def until_in_flight(self, n: int) -> None:
        async def wait() -> None:
            async with self.changed:
                await self.changed.wait_for(lambda: self.in_flight == n)

        await asyncio.wait_for(wait(), BOUND_S)  # a bound, not a synchronisation


async def test_clears_of_a_round_are_in_flight_together() -> None:
    backend = _GatedBackend()
    rollup = RollUp(backend, MemoryCompactionOffsets(), clock=FakeClock())
    ids = [uuid.uuid4() for _ in range(10)]
    tasks = [asyncio.create_task(rollup.compacted(c, 5)) for c in ids]
    await backend.until_in_flight(10)  # all ten appending at once
    backend.gate.set()
    firsts = await asyncio.gather(*tasks)
    assert sorted(firsts) == list(range(1, 11)) and backend.most == 10


async def test_a_purge_waits_for_clears_in_flight_and_clears_wait_for_a_waiting_purge() -> None:
    backend = _GatedBackend()
    rollup = RollUp(backend, MemoryCompactionOffsets(), clock=FakeClock())
    a, b = uuid.uuid4(), uuid.uuid4()
    early = asyncio.create_task(rollup.compacted(a, 5))
    await backend.until_in_flight(1)  # the first clear appending
    purge = asyncio.create_task(rollup.purge([a]))
    late = asyncio.create_task(rollup.compacted(b, 7))
    for _ in range(50):
        await asyncio.sleep(0)  # let everything that can run, run (no time passes)
    assert backend.in_flight == 1  # the purge waits for the clear; the late clear for the purge
    backend.gate.set()
    first_early, first_purge, first_late = await asyncio.gather(early, purge, late)
    assert first_early < first_purge < first_late  # log order is the order they were admitted
