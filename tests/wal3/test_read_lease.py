"""Read leases and take-over fences (issue 21, V2): no read from a writer's memory is ever stale.

A writer's in-memory manifest answers reads only while a store interaction issued less than
``read_lease_s`` ago proved that the stored manifest is the one this writer wrote; a writer that
takes the log over (writes on a manifest it did not write) holds its acknowledgements for
``fence_s``.  So whatever the leader hint does, a read asked after an acknowledgement never
misses it.  Time here is a manual clock: leases run out and fences pass only when the test says.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from verify.testkit.polling import wait_until
from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions, ObjectStore
from wal3.clock import Clock
from wal3.fragment import encode_fragment
from wal3.layout import load_manifest
from wal3.localstore import LocalStore
from wal3.paths import MANIFEST_PATH, join

from .helpers import read_all


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


async def _claimed(w: LogWriter, store: ObjectStore, prefix: str, name: str, nxt: int) -> None:
    """Wait until ``w``'s take-over claim landed and its answer came back (the writer holds it,
    or its read repair does, which installs it later): the stored manifest is then its own,
    under ``name``, and links nothing new (its next offset is still ``nxt``).

    The answer, not only the landing: the fence runs from when the writer learns its claim
    landed, and a test that moves the clock before that (a put's answer is a thread hop behind
    the file) would start the fence later than it thinks, and wait forever for it to pass."""
    opened = w.manifest

    async def landed() -> bool:
        if w.authored:
            return True
        stored = await load_manifest(store, prefix)
        # The lease's own record of what it wrote: landed() sets it as the answer arrives.
        return stored is not None and stored[0] != opened and w._lease.authored(stored[1])

    await wait_until(landed, "the take-over's claim landed")
    stored = await load_manifest(store, prefix)
    assert stored is not None
    assert (stored[0].writer, stored[0].next_offset) == (name, nxt), stored[0]


async def test_a_take_over_acknowledges_only_after_every_old_lease_ran_out(
    store: ObjectStore,
) -> None:
    """B's take-over claims the log with a write that links nothing, and links r2 only after its
    fence: while A's lease may answer without r2, no load of the store shows it either (reads are
    monotonic across hosts, not merely never missing an acknowledged record)."""
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/t", _opts(clock, "A"))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/t", _opts(clock, "B"))
    tb = asyncio.create_task(b.append(b"r2"))
    await _claimed(b, store, "logs/t", "B", 2)

    async def monotonic() -> None:
        m = a.current_manifest()
        stored = await load_manifest(store, "logs/t")
        assert stored is not None
        assert m is None or m.next_offset == stored[0].next_offset, "A misses a visible record"
        assert not tb.done() or m is None, "A serves a stale manifest"

    for step in (0.0, 0.5, 0.5, 0.2):  # up to 1.2 s: A's lease (1 s) ran out, B's fence not
        clock.advance(step)
        await _settle()
        await monotonic()
        assert not tb.done()
        assert b.manifest.next_offset == 2  # nothing linked during the fence
    assert a.current_manifest() is None
    assert not await a.confirm_lease() and not a.authored  # the store moved on: A says so
    clock.advance(0.05)  # B's fence (1.25 s) passes: r2 is linked, then answered
    assert (await tb).offset == 2
    await monotonic()
    stored = await load_manifest(store, "logs/t")
    assert stored is not None and stored[0].next_offset == 3
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
    await _claimed(other, store, "logs/r", "A", 3)
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


async def test_an_unfenced_answer_returns_at_once_and_wait_fence_holds(store: ObjectStore) -> None:
    """``fence=False`` lets a caller release what it holds before waiting (the log host leaves
    its open-log slot first); ``wait_fence`` is then what holds the acknowledgement.  Here the
    answer comes from a key B learned by loading A's manifest (linking waits for no one)."""
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/f", _opts(clock, "A"))
    first = await a.append_many([b"r1"], idempotency_key="K")
    b = await LogWriter.open(store, "logs/f", _opts(clock, "B"))
    r = await b.append_many([b"r1"], idempotency_key="K", fence=False)  # no clock advance
    assert r.deduplicated and r.first_offset == first.first_offset
    waiting = asyncio.create_task(b.wait_fence())
    await _settle()
    assert not waiting.done()
    clock.advance(1.25)
    await waiting
    await a.close()
    await b.close()


async def test_a_claim_starts_the_fence_before_anything_is_appended(store: ObjectStore) -> None:
    """``claim()`` takes the log over with a write that links nothing, so a caller can wait the
    fence out before it appends (the log host does, outside its open-log slot); the append
    after it is not fenced again.  A writer that wrote the stored manifest claims nothing."""
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/c", _opts(clock, "A"))
    await a.append(b"r1")
    writes = a.stats["manifest_writes"]
    await a.claim()
    assert a.stats["manifest_writes"] == writes  # ours already: no write
    b = await LogWriter.open(store, "logs/c", _opts(clock, "B"))
    assert not b.authored
    await b.claim()
    assert b.authored and b.fence_until > clock.monotonic()
    stored = await load_manifest(store, "logs/c")
    assert stored is not None and (stored[0].writer, stored[0].next_offset) == ("B", 2)
    assert a.current_manifest() is not None  # A's lease still answers: the same records
    waiting = asyncio.create_task(b.wait_fence())
    await _settle()
    assert not waiting.done()
    clock.advance(1.25)
    await waiting
    assert (await b.append(b"r2")).offset == 2  # answered with no clock advance
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
    await _claimed(shared, store, "logs/u", "host:abcd", 3)
    await _settle()
    assert not t.done()
    clock.advance(1.25)
    await t
    await shared.close()


async def test_read_repair_after_a_take_over_links_an_orphan_only_once_fenced(
    store: ObjectStore,
) -> None:
    """An orphan (a fragment uploaded, never linked: its writer died or is about to link it) is
    records too.  B's recovery finds it in the slot its own append wanted; it claims the log and
    links the orphan only after the fence, so no load of the store shows r2 while A's lease may
    still answer without it.  Kills read repair linking on the base it loaded."""
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/o", _opts(clock, "A"))
    await a.append(b"r1")
    orphan = encode_fragment(2, 2, 1, [b"r2"], prev=a.manifest.tail_setsum, writer="A")
    await store.put(join("logs/o", orphan.path), orphan.data)
    b = await LogWriter.open(store, "logs/o", _opts(clock, "B"))
    tb = asyncio.create_task(b.append(b"r3"))
    await _claimed(b, store, "logs/o", "B", 2)
    for step in (0.0, 0.6, 0.6):  # 1.2 s: A's lease ran out, B's fence (1.25 s) not
        clock.advance(step)
        await _settle()
        stored = await load_manifest(store, "logs/o")
        assert stored is not None and stored[0].next_offset == 2, "linked during the fence"
        assert not tb.done()
    clock.advance(0.05)
    assert (await tb).offset == 3  # the orphan went first, as read repair links it
    _, records = await read_all(store, "logs/o")
    assert [r.body for r in records] == [b"r1", b"r2", b"r3"]
    await a.close()
    await b.close()


class _HeldAnswers(LocalStore):
    """A local store whose manifest puts, once ``hold`` is set, land and then keep their answer
    until ``release`` is set (a slow response on the way back)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold = False
        self.release = asyncio.Event()

    async def put(self, key: str, data: bytes, **kw: Any) -> str:
        etag = await super().put(key, data, **kw)
        if self.hold and key.endswith(MANIFEST_PATH):
            await self.release.wait()
        return etag


async def test_a_read_waits_for_the_manifest_put_in_flight(tmp_path: Path) -> None:
    """A manifest put that landed but whose answer is not back shows its records to readers of
    the store already; the writer's memory must not answer without them.  ``current_manifest``
    vouches for nothing meanwhile, and ``leased_manifest`` waits for the answer.  The
    simulator's ``monotonic`` check found this (seeds 138 and 141 at the claim fix)."""
    store = _HeldAnswers(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/p", _opts(clock, "A"))
    await a.append(b"r1")
    assert a.current_manifest() is not None
    store.hold = True
    t = asyncio.create_task(a.append(b"r2"))

    async def landed() -> bool:
        stored = await load_manifest(store, "logs/p")
        return stored is not None and stored[0].next_offset == 3

    await wait_until(landed, "r2's manifest put landed")  # a reader of the store sees r2 ...
    assert a.current_manifest() is None  # ... so the memory (without it) vouches for nothing
    leased = asyncio.create_task(a.leased_manifest())
    await _settle()
    assert not leased.done()
    store.release.set()
    m = await leased
    assert m is not None and m.next_offset == 3
    assert (await t).offset == 2
    await a.close()
