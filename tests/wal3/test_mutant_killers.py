"""Tests written to kill mutants that survived every test at 3c61663 (docs/RELIABILITY.md).

Each names the mutation it kills: the manifest write without If-Match, idempotency offsets of two
keyed appends in one fragment, GC's balance check, and phase 3's "still referenced" re-check.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from wal3 import (
    BatchOptions,
    LogSealed,
    LogWriter,
    LogWriterOptions,
    ObjectStore,
    Setsum,
    SnapshotOptions,
)
from wal3.cursors import CursorStore
from wal3.fragment import fragment_path
from wal3.gc import (
    Garbage,
    GarbageCollector,
    GarbageRejected,
    GcOptions,
    live_snapshot_paths,
    plan_cut,
    verify_garbage,
)
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import Snapshot
from wal3.reader import SnapshotCache
from wal3.scrub import scrub_log

from .helpers import Clock, GateStore, read_all

# the manifest write's If-Match (the fencing condition itself) ----------------------------------


async def test_a_stale_writer_cannot_overwrite_another_process_seal(store: ObjectStore) -> None:
    a = await LogWriter.open(store, "logs/fence-seal")
    await a.append(b"one")
    b = await LogWriter.open(store, "logs/fence-seal")  # another process
    await b.seal()
    with pytest.raises(LogSealed):
        await a.append(b"after the seal")  # a holds a stale etag
    loaded = await load_manifest(store, "logs/fence-seal")
    assert loaded is not None and loaded[0].sealed, "the seal was overwritten"
    _, records = await read_all(store, "logs/fence-seal")
    assert [r.body for r in records] == [b"one"]
    await a.close()
    await b.close()


async def test_a_stale_writer_cannot_undo_another_process_collection(store: ObjectStore) -> None:
    clock = Clock()
    a = await LogWriter.open(store, "logs/fence-gc")
    for i in range(6):
        await a.append(f"r{i}".encode())
    await CursorStore(store, "logs/fence-gc", "t").init("compaction", 5)
    gc = GarbageCollector(
        store, "logs/fence-gc", GcOptions(grace_s=0, retain_fragments=0), clock=clock
    )  # standalone: another process
    assert (await gc.run_once()).phase == "done"
    await a.append(b"after")  # a's etag is stale; it must rebase, not restore dropped pointers
    loaded = await load_manifest(store, "logs/fence-gc")
    assert loaded is not None and loaded[0].oldest_offset == 5
    assert (await scrub_log(store, "logs/fence-gc")).ok
    await a.close()


# idempotency offsets when two keyed appends share a fragment -----------------------------------


async def test_two_keyed_appends_in_one_fragment_keep_their_own_offsets(store: ObjectStore) -> None:
    gated = GateStore(store)
    w = await LogWriter.open(
        gated, "logs/keys", LogWriterOptions(batch=BatchOptions(max_inflight_fragments=1))
    )
    await w.append_many([b"warm"], idempotency_key="warm")  # loads the key window first
    held = gated.hold("put", r"/log/")
    first = asyncio.create_task(w.append(b"zero"))  # its fragment is held in the store
    await held.reached.wait()
    k1 = asyncio.create_task(w.append_many([b"a"], idempotency_key="k1"))
    k2 = asyncio.create_task(w.append_many([b"b", b"c"], idempotency_key="k2"))
    # Both queued behind the held fragment (bounded by the gate); nothing signals it: poll.
    while len(w._batcher._pending) < 2:  # noqa: ASYNC110
        await asyncio.sleep(0)
    held.release.set()
    _r0, r1, r2 = await asyncio.gather(first, k1, k2)
    assert (r1.first_offset, r1.count, r2.first_offset, r2.count) == (3, 1, 4, 2)
    loaded = await load_manifest(store, "logs/keys")
    assert loaded is not None and loaded[0].next_seq_no == 4  # warm, zero, then one for both
    await w.close()
    again = await LogWriter.open(store, "logs/keys")  # a restart: keys come from the footer
    d1 = await again.append_many([b"a"], idempotency_key="k1")
    d2 = await again.append_many([b"b", b"c"], idempotency_key="k2")
    assert d1.deduplicated and d2.deduplicated
    assert (d1.first_offset, d1.count, d2.first_offset, d2.count) == (3, 1, 4, 2)
    await again.close()


# GC's verifier: balance ---------------------------------------------------------------------


async def _plan(store: ObjectStore, prefix: str, cutoff: int) -> tuple[Garbage, object]:
    w = await LogWriter.open(store, prefix)
    for i in range(8):
        await w.append(f"r{i}".encode())
    m = w.manifest
    await w.close()

    async def put(_: Snapshot) -> None:
        return None

    g = await plan_cut(store, prefix, m, cutoff, SnapshotCache(), "t", put, keep_tail=True)
    assert g is not None
    return g, m


async def test_the_verifier_refuses_plans_whose_setsums_do_not_balance(store: ObjectStore) -> None:
    g, m = await _plan(store, "logs/balance", 5)
    verify_garbage(g, m, GcOptions(max_fraction=1.0))  # the true plan passes
    wrong = replace(g, setsum_to_discard=g.setsum_to_discard + Setsum.of(b"x"))
    with pytest.raises(GarbageRejected, match=r"balance|discarded"):
        verify_garbage(wrong, m, GcOptions(max_fraction=1.0))
    short = replace(g, setsum_to_discard=Setsum.zero())
    with pytest.raises(GarbageRejected, match=r"balance|discarded"):
        verify_garbage(short, m, GcOptions(max_fraction=1.0))


# GC's phase 3: only what is affirmatively unreferenced is deleted --------------------------------


async def test_phase_three_never_deletes_what_the_manifest_still_references(
    store: ObjectStore,
) -> None:
    """A hand-built applied plan that lists live objects (as a planning bug would)."""
    clock = Clock()
    w = await LogWriter.open(
        store,
        "logs/p3",
        LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=3, snapshot_threshold=100)),
    )
    for i in range(8):
        await w.append(f"r{i}".encode())
    await w.compact_manifest()
    m = w.manifest
    await w.close()
    await CursorStore(store, "logs/p3", "t").init("compaction", m.next_offset)
    live = await live_snapshot_paths(store, "logs/p3", m, SnapshotCache())
    assert live
    snaps = list(m.snapshots)
    bad = Garbage(
        snapshots_to_drop=tuple(snaps),
        snapshots_to_make=(),
        snapshot_for_root=None,
        fragments_to_drop_start=1,
        fragments_to_drop_limit=m.next_seq_no,
        setsum_to_discard=Setsum.zero(),
        first_to_keep=m.oldest_offset,
        created_us=0,
        applied_us=0,
    )
    await store.put(join("logs/p3", GARBAGE_PATH), bad.to_bytes())
    gc = GarbageCollector(store, "logs/p3", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    report = await gc.run_once()
    assert report.phase == "done" and any("still referenced" in n for n in report.notes)
    for path in live:
        await store.head(join("logs/p3", path))
    for seq in range(1, m.next_seq_no):
        await store.head(join("logs/p3", fragment_path(seq)))
    assert (await scrub_log(store, "logs/p3")).ok
