"""An adversary's cases for the incremental roll-up (issue 24), beyond test_rollup_incremental.

Passing tests pin behaviour checked sound; ``xfail(strict=True)`` tests reproduce a real defect
(see each reason).  The invariant under attack: a collection with landed records above its
compaction cursor stays in the dirty set, in memory (what ``GET /v1/dirty`` answers from) and in
the retained log (what a restart folds), until a compaction covering them is known.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from dirtylog import (
    CURSOR_NAME,
    DirtyLogHook,
    DirtyRecord,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    MemoryLogTails,
    RollUp,
    hand_over,
)
from dirtylog.dirtyset import DirtySet
from wal3.errors import CursorConflict, StoreUnavailable

from .helpers import FakeClock, cid, decoded_from, spans


class World:
    def __init__(self, backend: MemoryLogBackend | None = None, **kw: object) -> None:
        self.clock = FakeClock()
        self.backend = backend if backend is not None else MemoryLogBackend()
        self.compaction = MemoryCompactionOffsets()
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.kw = kw
        self.rollup = self.new_rollup()

    def new_rollup(self) -> RollUp:
        return RollUp(
            self.backend,
            self.compaction,
            clock=self.clock,
            monotonic=lambda: self.clock.now_us / 1e6,
            **self.kw,  # type: ignore[arg-type]
        )

    async def durable(self) -> dict[uuid.UUID, tuple[int, int]]:
        """The fold of the retained log from the cursor (what a restart rebuilds)."""
        cursor = await self.backend.load_cursor(CURSOR_NAME)
        start = cursor[0] if cursor is not None else await self.backend.oldest_offset()
        scratch = DirtySet(None)
        for offset, record in await decoded_from(self.backend, start):
            scratch.fold(offset, record, 0.0, 0.0)
        return spans(dict(scratch.entries))


def _unavailable() -> StoreUnavailable:
    return StoreUnavailable("injected: 503, the outcome unknown")


# ------------------------------------------------------------ ambiguous, non-fatal failures


@pytest.mark.parametrize("op", ["append", "cas_cursor", "read"])
@pytest.mark.parametrize("after", [False, True])
async def test_a_transient_failure_without_a_restart_loses_nothing(op: str, after: bool) -> None:
    """The model test injects only process deaths (a restart follows).  Here a 503 (landed or
    not) at a relog append, the cursor CAS or a page read, and the same process goes on."""
    w = World(window_records=2, max_records_per_read=2, max_records_per_append=1)
    want = {cid(i): (1, 4 + i) for i in range(6)}
    for i in range(6):
        await w.hook.mark_dirty(cid(i), 1, 3 + i)
    await w.rollup.run()
    await w.hook.mark_dirty(cid(0), 4, 2)
    want[cid(0)] = (1, 6)
    w.backend.inject_fault(op, after=after, exc=_unavailable())
    with pytest.raises(StoreUnavailable):
        await w.rollup.run()
    assert (await w.durable()).items() >= want.items()
    for _ in range(8):
        result = await w.rollup.run()
        assert spans(result.entries) == want
        assert (await w.durable()).items() >= want.items()
    assert await w.durable() == want
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == want


# ------------------------------------------------------------------- clears, marks, floors


@pytest.mark.parametrize("order", ["clear_first", "mark_first"])
async def test_a_clear_at_n_and_a_mark_at_n_plus_one_across_a_restart(order: str) -> None:
    w = World(window_records=1, max_compaction_lookups=0)
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 5)  # [1, 6)
    await w.hook.mark_dirty(b, 1, 1)
    await w.rollup.run()
    if order == "clear_first":
        await w.rollup.compacted(a, 6)
        await w.hook.mark_dirty(a, 6, 1)  # [6, 7): above the compaction
    else:
        await w.hook.mark_dirty(a, 6, 1)
        await w.rollup.compacted(a, 6)
    for _ in range(6):
        assert spans((await w.rollup.run()).entries) == {a: (6, 7), b: (1, 2)}
        assert await w.durable() == {a: (6, 7), b: (1, 2)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (6, 7), b: (1, 2)}


async def test_a_lower_compaction_after_a_higher_one_never_widens_or_narrows_wrongly() -> None:
    """A compactor's retry posts an older cursor: the floor stays where it was (cursors only move
    forward), and a mark of a new write above it is kept."""
    w = World(window_records=1, max_compaction_lookups=0)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 10)
    await w.rollup.compacted(a, 8)
    await w.rollup.compacted(a, 3)  # the retry, late
    await w.hook.mark_dirty(a, 11, 2)
    for _ in range(4):
        assert spans((await w.rollup.run()).entries) == {a: (8, 13)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (8, 13)}


async def test_the_checkpoint_clear_changes_nothing() -> None:
    w = World(window_records=1)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 3)
    await w.backend.append_many([DirtyRecord.clear(w.clock()).encode()])
    await w.hook.mark_dirty(a, 4, 1)
    for _ in range(4):
        assert spans((await w.rollup.run()).entries) == {a: (1, 5)}
    assert await w.durable() == {a: (1, 5)}
    with pytest.raises(ValueError):
        await w.rollup.compacted(uuid.UUID(int=0), 5)


async def test_a_purge_then_a_re_mark_survives_passes_and_restarts() -> None:
    w = World(window_records=1, max_compaction_lookups=0)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 5)
    await w.rollup.run()
    await w.rollup.compacted(a, 3)
    await w.rollup.purge([a])
    await w.hook.mark_dirty(a, 1, 2)  # below the forgotten floor: kept
    for _ in range(4):
        assert spans((await w.rollup.run()).entries) == {a: (1, 3)}
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == {a: (1, 3)}


# ------------------------------------------------------------------ marks that never commit


async def test_a_mark_whose_write_never_landed_stays_until_settled_then_leaves() -> None:
    tails = MemoryLogTails(30.0)
    w = World(window_records=1, tails=tails, max_compaction_lookups=0)
    a, b = cid(1), cid(2)
    await w.hook.mark_dirty(a, 1, 3)  # the write failed: the tail stays at 1
    await w.hook.mark_dirty(b, 1, 3)
    tails.set(b, 4)
    for _ in range(3):
        assert set((await w.rollup.run()).entries) == {a, b}  # not settled yet
    tails.pending.add(a)  # a commit may still be in flight: never judged
    w.clock.advance_s(31)
    for _ in range(3):
        assert set((await w.rollup.run()).entries) == {a, b}
    tails.pending.clear()
    for _ in range(3):
        result = await w.rollup.run()
    assert spans(result.entries) == {b: (1, 4)}
    w.rollup = w.new_rollup()  # a restart sees it afresh: it waits the settle time again
    assert set((await w.rollup.run()).entries) <= {a, b}


# ------------------------------------------------------------------- adoption racing a pass


@pytest.mark.parametrize("first", ["pass", "hand_over", "together"])
async def test_an_adoption_racing_the_live_owner_pass_loses_nothing(first: str) -> None:
    owner = World(window_records=2, max_compaction_lookups=0)
    adopter = World(max_compaction_lookups=0)
    want = {cid(i): (1, 2 + i) for i in range(5)}
    for i in range(5):
        await owner.hook.mark_dirty(cid(i), 1, 1 + i)
    await owner.rollup.run()
    await owner.hook.mark_dirty(cid(0), 2, 3)
    want[cid(0)] = (1, 5)

    async def do_hand_over() -> None:
        with contextlib.suppress(CursorConflict):
            await hand_over(owner.backend, adopter.backend, owner.compaction)

    async def do_pass() -> None:
        with contextlib.suppress(CursorConflict):
            await owner.rollup.run()

    if first == "together":  # interleaved at every store call
        await asyncio.gather(do_pass(), do_hand_over())
    elif first == "pass":
        await do_pass()
        await do_hand_over()
    else:
        await do_hand_over()
        await do_pass()
    both = {**await adopter.durable()}
    for c, span in (await owner.durable()).items():
        lo, hi = both.get(c, span)
        both[c] = (min(lo, span[0]), max(hi, span[1]))
    assert both.items() >= want.items()


# ---------------------------------------------- GET /v1/dirty after a rebuild that failed


async def _known_set_then_conflict(w: World) -> dict[uuid.UUID, tuple[int, int]]:
    for i in range(4):
        await w.hook.mark_dirty(cid(i), 1, 2)
    await w.rollup.run()
    want = spans(w.rollup.entries())
    assert len(want) == 4
    other = w.new_rollup()  # a second process on the log (adoption of a live host, split brain)
    await w.hook.mark_dirty(cid(9), 1, 1)
    await other.run()  # moves the cursor: our witness is stale
    want[cid(9)] = (1, 2)
    return want


async def test_a_failed_rebuild_after_a_lost_race_empties_get_dirty() -> None:
    w = World(window_records=2)
    want = await _known_set_then_conflict(w)
    # Our next pass loses the CAS, resets memory, and its reload of the cursor fails (503).
    w.backend.inject_fault("load_cursor", exc=_unavailable())
    with pytest.raises(StoreUnavailable):
        await w.rollup.run()
    assert await w.durable() == want  # nothing durable lost ...
    listed = {e.collection_id for e in w.rollup.select(min_records=0, limit=100)}
    assert listed >= set(want) - {cid(9)}  # ... and the pull API lists them all still


async def test_a_half_folded_rebuild_is_served_as_the_dirty_set() -> None:
    w = World(window_records=2, max_records_per_read=2)
    want = await _known_set_then_conflict(w)
    # The lost race rebuilds; the rebuild's second page read fails (the fourth read of the run).
    w.backend.inject_fault("read", skip=3, exc=_unavailable())
    with pytest.raises(StoreUnavailable):
        await w.rollup.run()
    assert await w.durable() == want
    listed = {e.collection_id for e in w.rollup.select(min_records=0, limit=100)}
    # The half the rebuild folded, united with the last complete set (not served as the whole).
    assert listed >= {cid(0), cid(1)}
    assert listed >= set(want) - {cid(9)}


class _Writer:
    failed: BaseException | None = None


class _WalLike(MemoryLogBackend):
    def __init__(self) -> None:
        super().__init__()
        self.writer = _Writer()


async def test_reopening_the_dirty_log_after_a_writer_failure_empties_get_dirty() -> None:
    from host.dirty import DirtyLog
    from host.services.dirtyset import HostDirtyLog as HostDirtySet

    backend = _WalLike()
    compaction = MemoryCompactionOffsets()

    async def open_log() -> DirtyLog:
        hook = DirtyLogHook(backend)
        return DirtyLog(backend, RollUp(backend, compaction), hook)  # type: ignore[arg-type]

    service = HostDirtySet(open_log)
    await service.open()
    await service.mark(cid(1), 1, 5)
    await service.opened().run_now()
    assert set(service.entries()) == {cid(1)}
    backend.writer.failed = StoreUnavailable("the dirty log's writer died")
    await service.mark(cid(2), 1, 1)  # reopens the dirty log first
    backend.writer.failed = None
    assert set(service.entries()) >= {cid(1)}


# ---------------------------------------------- a compaction cursor moved back (host level)


async def test_a_compaction_cursor_moved_back_leaves_records_untracked(tmp_path: Path) -> None:
    from tests.host.live import live_server, record

    async with live_server(str(tmp_path / "store")) as live:
        cid_s = str(uuid.UUID(int=0xADD0001, version=4))
        base = f"/v1/tenants/alice/logs/{cid_s}"
        async with live.client() as c:
            for i in range(3):
                r = await c.post(base + "/records", json={"records": [record(f"r{i}")]})
                assert r.status_code == 200, r.text
            r = await c.post(base + "/compaction", json={"offset": 4})
            assert r.status_code == 200, r.text
            # Back to 3 (the last fragment, which GC always keeps): [3, 4) is uncompacted again.
            cur = (await c.get(base + "/cursors/compaction")).json()
            r = await c.put(
                base + "/cursors/compaction", json={"offset": 3, "witness": cur["witness"]}
            )
            assert r.status_code == 200, r.text
            assert (await c.get(base + "/cursors/compaction")).json()["offset"] == 3
            r = await c.post("/v1/dirty/rollup")
            listed = {e["collection_id"]: e for e in r.json()["logs"]}
            assert cid_s in listed and listed[cid_s]["start"] <= 3, listed


# ------------------------------------------------- a clear racing a purge of the same collection


async def test_a_clear_racing_a_purge_lands_in_the_order_memory_saw() -> None:
    """compacted() and purge() are ordered: memory applied the clear then the purge (no floor)
    but the log had the purge then the clear, so a restart restored the floor the purge forgot
    and clipped away what memory kept (a log re-created under the id restarts at 1)."""
    w = World(window_records=1, max_compaction_lookups=0)
    a = cid(1)
    await w.hook.mark_dirty(a, 1, 5)
    await w.rollup.run()
    await asyncio.gather(w.rollup.purge([a]), w.rollup.compacted(a, 6))
    await w.hook.mark_dirty(a, 1, 2)
    in_memory = spans((await w.rollup.run()).entries)
    assert await w.durable() == in_memory
    w.rollup = w.new_rollup()
    assert spans((await w.rollup.run()).entries) == in_memory
