"""Regression tests for six engine bugs found by review at commit 3c61663.

Each test drives the exact interleaving that broke an invariant, and each failed on 3c61663
(docs/RELIABILITY.md lists how; the deterministic simulator finds the same bugs by seed).
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from dataclasses import replace

import pytest

from wal3 import (
    BatchOptions,
    CorruptFragment,
    CorruptManifest,
    FaultRule,
    FaultyStore,
    LogContention,
    LogPurged,
    LogSealed,
    LogWriter,
    LogWriterOptions,
    ObjectNotFound,
    ObjectStore,
    Setsum,
    SnapshotOptions,
    StoreUnavailable,
)
from wal3.clock import Clock as WallClock
from wal3.cursors import CursorStore
from wal3.errors import SimulatedCrash
from wal3.fragment import decode_fragment, encode_fragment, fragment_path
from wal3.gc import EMPTY_GARBAGE, Garbage, GarbageCollector, GcOptions, pin_cursor
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import MANIFEST_PATH, Manifest, Snapshot
from wal3.reader import SnapshotCache
from wal3.scrub import scrub_log

from .helpers import Clock, GateStore, fill, read_all

# 1 ------------------------------------------------------------------------------------------


async def test_a_failing_hook_never_duplicates_an_acknowledged_append(store: ObjectStore) -> None:
    """The fragment lands, the hook fails, and fails again in read repair: the batch used to be
    re-encoded with a new timestamp, collide with its own unlinked fragment, and land twice."""
    calls: list[bool] = []

    async def hook(info) -> None:  # type: ignore[no-untyped-def]
        calls.append(info.repaired)
        if len(calls) <= 2:  # the upload's mark, then the first repair's
            raise StoreUnavailable("dirty log down")

    w = await LogWriter.open(store, "logs/once", hook=hook)
    r = await w.append_many([b"only-once"])
    await w.close()
    assert r.first_offset == 1
    _, records = await read_all(store, "logs/once")
    assert [(x.offset, x.body) for x in records] == [(1, b"only-once")]
    assert len(calls) >= 3  # the hook really failed twice before it succeeded


# 2 ------------------------------------------------------------------------------------------


async def test_gc_keeps_the_tail_so_a_stale_speculative_fragment_stays_fenced(
    store: ObjectStore,
) -> None:
    """With the compaction cursor at the tail, GC used to empty the root; then read repair took
    any orphan at the tail for a good one and linked a fragment whose append was 'not written'."""
    clock = Clock()
    w = await LogWriter.open(store, "logs/fence")
    await fill(w, 3)
    await CursorStore(store, "logs/fence", "t").init("compaction", w.manifest.next_offset)
    gc = GarbageCollector(
        store,
        "logs/fence",
        GcOptions(grace_s=0, retain_fragments=0),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    while (await gc.run_once()).phase == "done":
        pass
    # Another writer's speculative fragment at the tail: right slot and start, but it follows a
    # fragment of that writer's that was never linked (its append was answered "not written").
    stale = encode_fragment(
        w.manifest.next_seq_no,
        w.manifest.next_offset,
        1,
        [b"not-written"],
        prev=Setsum.of(b"a fragment that was never linked"),
    )
    await store.put(join("logs/fence", stale.path), stale.data, if_none_match="*")
    await w.append(b"next")
    await w.close()
    _, records = await read_all(store, "logs/fence")
    assert b"not-written" not in [r.body for r in records]
    assert records[-1].body == b"next"
    assert w.manifest.fragments, "the root keeps its last fragment"


# 3 ------------------------------------------------------------------------------------------


async def test_gc_does_not_wedge_when_the_cutoff_falls_inside_a_snapshots_first_fragment(
    store: ObjectStore,
) -> None:
    """Splitting a straddling snapshot that loses nothing rebuilt it at the same content address,
    both live and listed for deletion: phase 3 refused on every run, for ever."""
    clock = Clock()
    opts = LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=3, snapshot_threshold=100))
    w = await LogWriter.open(store, "logs/split", opts)
    for i in range(8):
        await w.append_many([f"a{i}".encode(), f"b{i}".encode()])  # fragments of two records
    await w.compact_manifest()
    assert w.manifest.snapshots and w.manifest.snapshots[0].start == 1
    cursors = CursorStore(store, "logs/split", "t")
    await cursors.init("compaction", 2)  # strictly inside the first fragment [1, 3)
    gc = GarbageCollector(
        store,
        "logs/split",
        GcOptions(grace_s=0, retain_fragments=0),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    first = await gc.run_once()
    assert first.phase in ("idle", "done")
    # Once the cursor moves on, collection must go on too.
    witness = await cursors.load("compaction")
    assert witness is not None
    await cursors.save("compaction", 11, witness)
    for _ in range(4):
        await gc.run_once()
    assert w.manifest.oldest_offset == 11
    garbage = await store.get(join("logs/split", GARBAGE_PATH))
    assert garbage.data == EMPTY_GARBAGE  # idle: Rust's Garbage::empty()
    await w.close()
    assert (await scrub_log(store, "logs/split")).ok


# 4 ------------------------------------------------------------------------------------------


async def test_a_cursor_written_while_a_plan_is_pending_stops_the_plan(store: ObjectStore) -> None:
    """Phases 2 and 3 never re-read the cursors: a plan computed before a reader pinned offset 2
    was applied and its fragments deleted."""
    clock = Clock()
    faulty = FaultyStore(store, seed=1)
    w = await LogWriter.open(store, "logs/pin")
    await fill(w, 10)
    await CursorStore(store, "logs/pin", "t").init("compaction", 10)
    # The collector dies right after writing its plan (phase 1).
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"gc/GARBAGE$", times=1))
    gc = GarbageCollector(faulty, "logs/pin", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    with pytest.raises(SimulatedCrash):
        await gc.run_once()
    # A reader pins offset 2 with a new cursor while the plan is pending ("emergency" cursor).
    await CursorStore(store, "logs/pin", "reader").init("emergency", 2)
    gc2 = GarbageCollector(store, "logs/pin", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    await gc2.run_once()
    await gc2.run_once()
    for seq in range(2, 11):
        await store.head(join("logs/pin", fragment_path(seq)))  # nothing pinned was deleted
    manifest, _ = await load_manifest(store, "logs/pin") or (None, None)
    assert manifest is not None and manifest.oldest_offset <= 2
    await w.close()


async def test_pinning_below_an_applied_plan_fails_and_undoes_the_cursor(
    store: ObjectStore,
) -> None:
    """The reader's half of the dance: a plan applied by another process (not through the
    server's writer) is seen, the pin is refused and the cursor does not stay behind."""
    clock = Clock()
    faulty = FaultyStore(store, seed=1)
    w = await LogWriter.open(store, "logs/pin2")
    await fill(w, 10)
    await CursorStore(store, "logs/pin2", "t").init("compaction", 10)
    # A collector in another process applies its plan and stops before deleting.
    faulty.add_rule(FaultRule("crash_before", ops={"delete"}, times=1))
    gc = GarbageCollector(
        faulty, "logs/pin2", GcOptions(grace_s=0, retain_fragments=0), clock=clock
    )
    with pytest.raises(SimulatedCrash):
        await gc.run_once()
    cursors = CursorStore(store, "logs/pin2", "reader")
    with pytest.raises(LogPurged):
        await pin_cursor(store, "logs/pin2", cursors, "emergency", 2, None)
    assert await cursors.load("emergency") is None
    ok = await pin_cursor(store, "logs/pin2", cursors, "emergency", 10, None)
    assert ok.cursor.offset == 10
    await w.close()


# 5 ------------------------------------------------------------------------------------------


async def test_a_sealed_log_is_collected_through_its_writer(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/sealed")
    await fill(w, 6)
    await CursorStore(store, "logs/sealed", "t").init("compaction", 7)
    await w.seal()
    gc = GarbageCollector(
        store,
        "logs/sealed",
        GcOptions(grace_s=0, retain_fragments=0),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    while (await gc.run_once()).phase == "done":
        pass
    assert w.manifest.sealed and w.manifest.oldest_offset == 6
    with pytest.raises(ObjectNotFound):
        await store.head(join("logs/sealed", fragment_path(1)))
    await w.close()


# 6 ------------------------------------------------------------------------------------------


async def test_one_transient_upload_failure_is_retried_not_reported_as_contention(
    store: ObjectStore,
) -> None:
    """A single writer; one fragment's upload answers 503 four times and never lands; 8 appends in
    flight.  Most of them used to fail with LogContention, which claims another writer."""
    faulty = FaultyStore(store, seed=2)
    rule = faulty.add_rule(
        FaultRule("error", ops={"put"}, key_regex=r"FragmentSeqNo=0+3\.parquet$", times=4)
    )
    opts = LogWriterOptions(
        batch=BatchOptions(size_bytes=1, max_inflight_fragments=8)
    )  # one append a batch
    w = await LogWriter.open(faulty, "logs/transient", opts)
    results = await asyncio.gather(
        *(w.append(f"t{i}".encode()) for i in range(8)), return_exceptions=True
    )
    await w.close()
    assert rule.fired == 4
    failures = [r for r in results if isinstance(r, BaseException)]
    assert not [f for f in failures if isinstance(f, LogContention)], failures
    assert failures == []
    _, records = await read_all(store, "logs/transient")
    assert Counter(r.body for r in records) == Counter(f"t{i}".encode() for i in range(8))
    assert [r.offset for r in records] == list(range(1, 9))


# cursor names ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["compaction\n", "a\n", "\ncompaction", "a b", "", "é"])
def test_cursor_names_are_matched_whole(name: str) -> None:
    """``$`` matches before a trailing newline: ``compaction\\n`` used to be a second, valid name."""
    from wal3.cursors import check_cursor_name
    from wal3.errors import InvalidCursorName

    with pytest.raises(InvalidCursorName):
        check_cursor_name(name)


# a keyed retry on a stale writer --------------------------------------------------------------


async def test_a_keyed_retry_on_a_stale_writer_is_deduplicated_not_refused(
    store: ObjectStore,
) -> None:
    """Recovery used to reject in-flight batches as 'not written' before learning the keys that
    the other writer's fragments carry; a client believing it and retrying under a fresh key
    would store the record twice."""
    a = await LogWriter.open(store, "logs/stale")
    await a.append_many([b"warm"], idempotency_key="warm")  # a has loaded its key window
    b = await LogWriter.open(store, "logs/stale")
    first = await b.append_many([b"payload"], idempotency_key="k")
    retry = await a.append_many([b"payload"], idempotency_key="k")  # a has not seen b's append
    assert retry.deduplicated and retry.first_offset == first.first_offset
    await a.close()
    await b.close()
    _, records = await read_all(store, "logs/stale")
    assert [r.body for r in records] == [b"warm", b"payload"]


# GC never passes the compaction cursor (issue 20, item 1) ---------------------------------------


async def test_gc_never_passes_the_compaction_cursor_nor_collects_without_one(
    store: ObjectStore,
) -> None:
    """GC cut at the lowest of *all* cursors: a reader cursor on a never-compacted log made it
    delete records no compaction had folded."""
    clock = Clock()
    w = await LogWriter.open(store, "logs/intrinsic")
    await fill(w, 10)
    cursors = CursorStore(store, "logs/intrinsic", "reader")
    await cursors.init("reader", 5)
    gc = GarbageCollector(
        store,
        "logs/intrinsic",
        GcOptions(grace_s=0, retain_fragments=0),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    await gc.run_once()
    assert w.manifest.oldest_offset == 1  # no compaction cursor: nothing is collected
    await cursors.init("compaction", 3)
    while (await gc.run_once()).phase == "done":
        pass
    assert w.manifest.oldest_offset == 3  # the reader is at 5, compaction at 3
    _, records = await read_all(store, "logs/intrinsic")
    assert records[0].offset == 3
    await w.close()


# found by the adversarial review of the fixes above (each reproduced before it was fixed) ------


def _frag(seq: int) -> str:
    return re.escape(fragment_path(seq)) + "$"


async def _holders(store: ObjectStore, prefix: str, body: bytes) -> list[str]:
    out = []
    async for meta in store.list(join(prefix, "log/")):
        frag = decode_fragment((await store.get(meta.key)).data)
        if any(r.body == body for r in frag.records):
            out.append(meta.key)
    return out


async def test_a_fragment_repaired_then_collected_is_acknowledged_not_refused(
    store: ObjectStore,
) -> None:
    """A's fragment is linked by B's read repair and collected before A recovers: A used to
    answer LogContention ("not written") for a record that is in the log."""
    a_store = GateStore(store)
    a = await LogWriter.open(a_store, "logs/rc", LogWriterOptions(writer_name="A"))
    await a.append(b"w0")
    manifest_put = a_store.hold("put", r"manifest/MANIFEST$")
    tx = asyncio.create_task(a.append(b"X"))
    await manifest_put.reached.wait()  # X's fragment is up; A's manifest write is held
    b = await LogWriter.open(store, "logs/rc", LogWriterOptions(writer_name="B"))
    assert (await b.append(b"B")).offset == 3  # repaired A's fragment 2 first
    await CursorStore(store, "logs/rc", "compactor").init("compaction", 3)
    assert (await GarbageCollector(store, "logs/rc", GcOptions()).run_once()).phase == "waiting"
    manifest_put.release.set()
    assert (await tx).offset == 2
    await a.close()
    await b.close()
    assert len(await _holders(store, "logs/rc", b"X")) == 1


async def test_a_pipelined_batch_collected_before_recovery_is_not_appended_again(
    store: ObjectStore,
) -> None:
    """X and Y are linked by another writer's repair; the compactor passes X and GC unlinks it
    before A recovers: A used to re-append X after Y (twice in the log, out of order)."""
    a_store = GateStore(store)
    a = await LogWriter.open(
        a_store, "logs/rx", LogWriterOptions(writer_name="A", batch=BatchOptions(size_bytes=1))
    )
    await a.append(b"w0")
    manifest_put = a_store.hold("put", r"manifest/MANIFEST$")
    y_up = a_store.watch("put", _frag(3))
    tx = asyncio.create_task(a.append(b"X"))
    ty = asyncio.create_task(a.append(b"Y"))
    await manifest_put.reached.wait()
    await y_up.landed.wait()
    b_store = FaultyStore(store, seed=0)
    b_store.add_rule(FaultRule("crash_before", ops={"put"}, key_regex=_frag(4)))
    b = await LogWriter.open(b_store, "logs/rx", LogWriterOptions(writer_name="B"))
    with pytest.raises(Exception):
        await b.append(b"B")
    await CursorStore(store, "logs/rx", "compactor").init("compaction", 3)
    await GarbageCollector(store, "logs/rx", GcOptions()).run_once()
    manifest_put.release.set()
    rx, ry = await asyncio.gather(tx, ty)
    assert (rx.offset, ry.offset) == (2, 3)
    await a.close()
    assert len(await _holders(store, "logs/rx", b"X")) == 1


async def test_uploads_finishing_after_a_seal_are_answered_and_close_returns(
    store: ObjectStore,
) -> None:
    a_store = GateStore(store)
    a = await LogWriter.open(a_store, "logs/sc", LogWriterOptions(batch=BatchOptions(size_bytes=1)))
    await a.append(b"w0")
    g2, g3 = a_store.hold("put", _frag(2)), a_store.hold("put", _frag(3))
    ts = [asyncio.create_task(a.append(f"x{i}".encode())) for i in (2, 3)]
    await g2.reached.wait()
    await g3.reached.wait()
    assert (await a.seal()).sealed
    g2.release.set()
    await g2.landed.wait()
    g3.release.set()
    # Bounded only to turn a hang into a failure, not a timing assertion.
    results = await asyncio.wait_for(asyncio.gather(*ts, return_exceptions=True), 60)
    assert all(isinstance(r, LogSealed) for r in results), results
    await asyncio.wait_for(a.close(), 60)
    assert not a._batcher.in_flight


async def test_after_a_long_upload_outage_the_pipeline_recovers_fully(store: ObjectStore) -> None:
    """Dead speculative fragments: each recovery uncovers one; charging every waiting batch an
    attempt per recovery used to fail most of the next burst on a healthy store."""
    faulty = FaultyStore(store, seed=0)
    w = await LogWriter.open(
        faulty, "logs/outage", LogWriterOptions(batch=BatchOptions(size_bytes=1))
    )
    await w.append(b"w0")
    rule = faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=_frag(2), times=12))
    await asyncio.gather(*(w.append(f"a{i}".encode()) for i in range(8)), return_exceptions=True)
    assert rule.fired == 12
    faulty.clear_rules()
    after = await asyncio.gather(
        *(w.append(f"b{i}".encode()) for i in range(8)), return_exceptions=True
    )
    await w.close()
    assert not [r for r in after if isinstance(r, BaseException)], after
    assert (await scrub_log(store, "logs/outage")).ok


async def test_the_only_writer_never_answers_contention(store: ObjectStore) -> None:
    """Its own given-up fragments, linked one per recovery by read repair, used to exhaust the
    next batch's attempts and be reported as LogContention."""
    phase = {"down": True}
    repaired: Counter[int] = Counter()

    async def hook(info) -> None:  # type: ignore[no-untyped-def]
        if info.seq_no == 1:
            return
        if phase["down"]:
            raise RuntimeError("dirty log down")
        if info.repaired and info.seq_no in (3, 4):
            repaired[info.seq_no] += 1
            if repaired[info.seq_no] == 1:
                raise RuntimeError("dirty log hiccup")

    w = await LogWriter.open(
        store, "logs/only", LogWriterOptions(batch=BatchOptions(size_bytes=1)), hook=hook
    )
    await w.append(b"w0")
    await asyncio.gather(*(w.append(f"a{i}".encode()) for i in (2, 3, 4)), return_exceptions=True)
    phase["down"] = False
    r = await w.append(b"X")
    await w.close()
    _, records = await read_all(store, "logs/only")
    assert [x.body for x in records].count(b"X") == 1 and records[-1].offset == r.offset


async def test_two_writers_with_equal_records_and_timestamps_are_told_apart(
    store: ObjectStore,
) -> None:
    """Same body, same offset, same (frozen) timestamp: equal setsums made B's fragment look
    like A's, and both appends were acknowledged for one record."""

    class Frozen(WallClock):
        def wall_us(self) -> int:
            return 1_700_000_000_000_000

    w0 = await LogWriter.open(store, "logs/eq", LogWriterOptions(writer_name="W0"))
    await w0.append(b"w0")
    await w0.close()
    a_store = GateStore(store)
    a = await LogWriter.open(a_store, "logs/eq", LogWriterOptions(writer_name="A", clock=Frozen()))
    b = await LogWriter.open(store, "logs/eq", LogWriterOptions(writer_name="B", clock=Frozen()))
    manifest_put = a_store.hold("put", r"manifest/MANIFEST$")
    ta = asyncio.create_task(a.append_many([b"payload"]))
    await manifest_put.reached.wait()
    rb = await b.append_many([b"payload"])
    manifest_put.release.set()
    try:
        ra = await ta
    except LogContention:
        ra = None
    await a.close()
    await b.close()
    _, records = await read_all(store, "logs/eq")
    acked = 1 + (ra is not None)
    assert [x.body for x in records].count(b"payload") == acked
    assert ra is None or ra.first_offset != rb.first_offset


async def test_gc_trusts_no_cursor_past_the_tail(store: ObjectStore) -> None:
    """A compaction cursor a fork left before its manifest (the fork failed, and the collection
    was then created by plain appends) points past the new log's tail: collecting up to it
    purged records no compaction had folded."""
    clock = Clock()
    await CursorStore(store, "logs/ahead", "fork").init("compaction", 11)  # the leftover
    w = await LogWriter.open(store, "logs/ahead")
    await fill(w, 6)
    gc = GarbageCollector(
        store,
        "logs/ahead",
        GcOptions(grace_s=0, retain_fragments=0),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    await gc.run_once()
    assert w.manifest.oldest_offset == 1
    await w.close()


# hostile or foreign garbage plans and manifests (adversarial review of issue 16) ----------------


async def _snapshotted(store: ObjectStore, prefix: str) -> Manifest:
    w = await LogWriter.open(
        store,
        prefix,
        LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=4, snapshot_threshold=100)),
    )
    for i in range(12):
        await w.append(f"r{i + 1}".encode())
    await w.compact_manifest()
    m = w.manifest
    await w.close()
    return m


async def test_a_snapshot_pointer_whose_range_lies_is_refused(store: ObjectStore) -> None:
    """A balanced manifest whose root pointer claims [1, 5) over an object holding [3, 5): reads
    used to skip offsets 1 and 2 silently."""
    m = await _snapshotted(store, "logs/lie")
    s1 = m.snapshots[0]
    snap = await SnapshotCache().get(store, "logs/lie", s1)
    t = Snapshot.build(list(snap.fragments[2:]), "x")
    await store.put(join("logs/lie", t.path), t.to_bytes())
    lie = replace(t.to_pointer(), start=1)
    new = replace(
        m, snapshots=(lie, *m.snapshots[1:]), collected=m.collected + (s1.setsum - t.setsum)
    )
    loaded = await load_manifest(store, "logs/lie")
    assert loaded is not None
    await store.put(join("logs/lie", MANIFEST_PATH), new.to_bytes(), if_match=loaded[1])
    with pytest.raises(CorruptFragment):
        await read_all(store, "logs/lie")


async def test_the_sweep_leaves_a_nested_logs_snapshots_alone(store: ObjectStore) -> None:
    clock = Clock()
    outer = await LogWriter.open(store, "t")
    for i in range(12):
        await outer.append(f"o{i}".encode())
    await outer.close()
    await _snapshotted(store, "t/snapshot/x")
    await CursorStore(store, "t", "c").init("compaction", 10)
    gc = GarbageCollector(store, "t", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    for _ in range(3):
        await gc.run_once()
        clock.now += 61
    _, records = await read_all(store, "t/snapshot/x")
    assert len(records) == 12


async def test_a_plan_starting_at_sequence_zero_does_not_wedge_the_collector(
    store: ObjectStore,
) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/zero")
    await fill(w, 4)
    await w.close()
    await CursorStore(store, "logs/zero", "t").init("compaction", 1)
    plan = Garbage((), (), None, 0, 3, Setsum.zero(), 1)  # Rust's empty() start, "applied"
    await store.put(join("logs/zero", GARBAGE_PATH), plan.to_bytes())
    gc = GarbageCollector(store, "logs/zero", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase in ("done", "idle", "discarded")
    assert (await gc.run_once()).phase in ("done", "idle")


async def test_a_fragment_pointer_must_name_its_own_sequence_numbers_object(
    store: ObjectStore,
) -> None:
    """seq_no raised by 100 with paths unchanged parsed and read fine, and the sweep (which goes
    by seq_no) then deleted every live fragment."""
    w = await LogWriter.open(store, "logs/seqpath")
    await fill(w, 3)
    m = w.manifest
    await w.close()
    bad = replace(
        m, fragments=tuple(replace(f, seq_no=f.seq_no + 100, _json=None) for f in m.fragments)
    )
    with pytest.raises(CorruptManifest, match="is not the path of fragment"):
        Manifest.from_bytes(bad.to_bytes())
