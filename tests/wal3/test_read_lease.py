"""Read leases and take-over fences (issue 21, V2): no read from a writer's memory is ever stale.

A writer's in-memory manifest answers reads only while a store interaction issued less than
``read_lease_s`` ago proved that the stored manifest is the one this writer wrote; a writer that
takes the log over (writes on a manifest it did not write) holds its acknowledgements for
``fence_s``.  So whatever the leader hint does, a read asked after an acknowledgement never
misses it.  Time here is a manual clock: leases run out and fences pass only when the test says.
"""

from __future__ import annotations

import asyncio
from typing import Any

from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions, ObjectStore
from wal3.clock import Clock
from wal3.layout import load_manifest


class ManualClock(Clock):
    """Monotonic time that moves only on ``advance``; sleepers wake as it passes them."""

    def __init__(self) -> None:
        object.__setattr__(self, "state", {"now": 1000.0, "sleepers": []})

    def monotonic(self) -> float:
        return float(self.state["now"])  # type: ignore[attr-defined]

    async def sleep(self, seconds: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.state["sleepers"].append((self.monotonic() + seconds, fut))  # type: ignore[attr-defined]
        await fut

    def advance(self, seconds: float) -> None:
        state: dict[str, Any] = self.state  # type: ignore[attr-defined]
        state["now"] += seconds
        due = [(t, f) for t, f in state["sleepers"] if t <= state["now"]]
        state["sleepers"] = [(t, f) for t, f in state["sleepers"] if t > state["now"]]
        for _, f in due:
            if not f.done():
                f.set_result(None)


def _opts(clock: ManualClock, name: str, lease_s: float = 1.0) -> LogWriterOptions:
    return LogWriterOptions(
        writer_name=name,
        clock=clock,
        batch=BatchOptions(interval_s=0),
        lease=LeaseOptions(read_lease_s=lease_s),
    )


async def _settle() -> None:
    """Let every ready task run (nothing here waits on real time)."""
    for _ in range(50):
        await asyncio.sleep(0)


async def test_a_lease_vouches_only_for_what_the_writer_wrote(store: ObjectStore) -> None:
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/l", _opts(clock, "A"))
    assert a.current_manifest() is not None  # it created the log
    await a.append(b"r1")
    m = a.current_manifest()
    assert m is not None and m.next_offset == 2
    clock.advance(1.0)
    assert a.current_manifest() is None  # the lease ran out ...
    assert await a.confirm_lease()  # ... and a HEAD that finds our etag renews it
    assert a.current_manifest() is not None
    b = await LogWriter.open(store, "logs/l", _opts(clock, "B"))
    assert not b.authored and b.current_manifest() is None  # loaded, never leased
    assert not await b.confirm_lease()
    await a.close()
    await b.close()


async def test_a_take_over_acknowledges_only_after_every_old_lease_ran_out(
    store: ObjectStore,
) -> None:
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/t", _opts(clock, "A"))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/t", _opts(clock, "B"))
    tb = asyncio.create_task(b.append(b"r2"))
    assert await b.wait_for_commit(2, 30.0)  # B's write landed (durable, not yet answered)
    stored = await load_manifest(store, "logs/t")
    assert stored is not None and stored[0].next_offset == 3

    def no_stale_read() -> None:
        m = a.current_manifest()
        assert not tb.done() or m is None or m.next_offset == 3, "A serves a stale manifest"

    for step in (0.0, 0.5, 0.5, 0.2):  # up to 1.2 s: A's lease (1 s) ran out, B's fence not
        clock.advance(step)
        await _settle()
        no_stale_read()
        assert not tb.done()
    assert a.current_manifest() is None
    assert not await a.confirm_lease() and not a.authored  # the store moved on: A says so
    clock.advance(0.05)  # B's fence (1.25 s) passes
    assert (await tb).offset == 2
    no_stale_read()
    await a.close()
    await b.close()


async def test_a_reopen_of_our_own_manifest_is_no_take_over(store: ObjectStore) -> None:
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/r", _opts(clock, "A"))
    await a.append(b"r1")
    await a.close()
    mine = a.authored_etag
    assert mine is not None
    again = await LogWriter.open(store, "logs/r", _opts(clock, "A"), authored=mine)
    assert again.current_manifest() is not None
    assert (await again.append(b"r2")).offset == 2  # answered with no clock advance: no fence
    await again.close()
    # Without knowing it wrote the manifest, a reopen is a take-over: the answer waits.
    other = await LogWriter.open(store, "logs/r", _opts(clock, "A"))
    t = asyncio.create_task(other.append(b"r3"))
    assert await other.wait_for_commit(3, 30.0)
    await _settle()
    assert not t.done()
    clock.advance(1.25)
    assert (await t).offset == 3
    await other.close()


async def test_a_key_learned_from_the_store_is_answered_after_the_fence(store: ObjectStore) -> None:
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/k", _opts(clock, "A"))
    first = await a.append_many([b"x"], idempotency_key="K")
    b = await LogWriter.open(store, "logs/k", _opts(clock, "B"))
    dup = asyncio.create_task(b.append_many([b"x"], idempotency_key="K"))
    await _settle()
    assert not dup.done()  # B knows K only from the store: A's acknowledgement may be pending
    clock.advance(1.25)
    got = await dup
    assert got.deduplicated and got.first_offset == first.first_offset
    await a.close()
    await b.close()


async def test_without_a_lease_nothing_is_vouched_for_and_nothing_waits(store: ObjectStore) -> None:
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/z", _opts(clock, "A", lease_s=0))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/z", _opts(clock, "B", lease_s=0))
    assert (await b.append(b"r2")).offset == 2  # no fence
    assert a.current_manifest() is None and not await a.confirm_lease()
    await a.close()
    await b.close()


async def test_an_unfenced_append_returns_at_once_and_wait_fence_holds(store: ObjectStore) -> None:
    """``fence=False`` lets a caller release what it holds before waiting (the log host leaves
    its open-log slot first); ``wait_fence`` is then what holds the acknowledgement."""
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/f", _opts(clock, "A"))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/f", _opts(clock, "B"))
    r = await b.append_many([b"r2"], fence=False)  # no clock advance needed
    assert r.first_offset == 2
    waiting = asyncio.create_task(b.wait_fence())
    await _settle()
    assert not waiting.done()
    clock.advance(1.25)
    await waiting
    await a.close()
    await b.close()


async def test_a_manifest_naming_our_unique_writer_is_ours(store: ObjectStore) -> None:
    """With ``name_is_unique`` a manifest that names this process's writer (say, created before
    the writer opened) is no take-over; without it the same open must fence."""
    clock = ManualClock()
    unique = LogWriterOptions(
        writer_name="host:abcd",
        clock=clock,
        batch=BatchOptions(interval_s=0),
        lease=LeaseOptions(read_lease_s=1.0, name_is_unique=True),
    )
    first = await LogWriter.open(store, "logs/u", unique)
    await first.append(b"r1")
    await first.close()
    again = await LogWriter.open(store, "logs/u", unique)
    assert again.authored and again.current_manifest() is not None
    assert (await again.append(b"r2")).offset == 2  # no clock advance: no fence
    await again.close()
    shared = await LogWriter.open(store, "logs/u", _opts(clock, "host:abcd"))  # not unique
    assert not shared.authored
    t = asyncio.create_task(shared.append(b"r3"))
    assert await shared.wait_for_commit(3, 30.0)
    await _settle()
    assert not t.done()
    clock.advance(1.25)
    await t
    await shared.close()
