"""Cursors, garbage collection, scrub, seal and fork."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wal3 import (
    BatchOptions,
    CursorConflict,
    CursorNotFound,
    FaultRule,
    FaultyStore,
    GarbageRejected,
    InvalidCursorName,
    LocalStore,
    LogExists,
    LogPurged,
    LogReader,
    LogWriter,
    LogWriterOptions,
    NoCursors,
    ObjectStore,
    SimulatedCrash,
    SnapshotOptions,
)
from wal3.cursors import CursorStore
from wal3.fork import fork_log
from wal3.fragment import fragment_path
from wal3.gc import EMPTY_GARBAGE, Garbage, GarbageCollector, GcOptions, plan_cut, verify_garbage
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import Snapshot
from wal3.reader import SnapshotCache
from wal3.scrub import find_logs, scrub_log

from .helpers import Clock, assert_dense, fill, read_all

SMALL = LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=3, snapshot_threshold=2))


async def _objects(store: ObjectStore, prefix: str) -> set[str]:
    return {m.key async for m in store.list(prefix + "/")}


# ------------------------------------------------------------------------------------- cursors


async def test_cursor_cas_list_delete(store: ObjectStore) -> None:
    cs = CursorStore(store, "logs/c", "tester")
    assert await cs.load("compaction") is None
    w1 = await cs.init("compaction", 5)
    with pytest.raises(CursorConflict):
        await cs.init("compaction", 6)
    w2 = await cs.save("compaction", 9, w1)
    with pytest.raises(CursorConflict):
        await cs.save("compaction", 10, w1)  # stale witness
    loaded = await cs.load("compaction")
    assert loaded is not None and loaded.cursor.offset == 9 and loaded.etag == w2.etag
    raw = json.loads((await store.get(join("logs/c", "cursor/compaction.json"))).data)
    assert raw["position"] == {"offset": 9} and raw["writer"] == "tester" and raw["epoch_us"] > 0
    await cs.init("emergency", 3)
    assert sorted(await cs.list()) == ["compaction", "emergency"]
    assert (await cs.advance("compaction", 4)).cursor.offset == 9  # never backwards
    assert (await cs.advance("compaction", 12)).cursor.offset == 12
    await cs.delete("emergency")
    with pytest.raises(CursorNotFound):
        await cs.delete("emergency")
    for bad in ("", "a-b", "a/b", "../x", "a b"):
        with pytest.raises(InvalidCursorName):
            await cs.load(bad)


# ------------------------------------------------------------------------------------------ gc


async def test_gc_three_phases_with_grace(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/g", SMALL)
    await fill(w, 20)
    await w.compact_manifest()
    gc = GarbageCollector(
        store,
        "logs/g",
        GcOptions(grace_s=60, delete_batch=4, retain_fragments=12, retain_s=600),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    with pytest.raises(NoCursors):
        await gc.run_once()
    await CursorStore(store, "logs/g", "t").init("compaction", 12)
    before = await _objects(store, "logs/g")
    r1 = await gc.run_once()
    assert r1.phase == "waiting" and r1.cutoff == 12
    m = w.manifest
    assert m.oldest_offset <= 12 and m.oldest_offset > 1
    assert m.setsum == (await load_manifest(store, "logs/g"))[0].setsum  # type: ignore[index]
    # Appends keep working while garbage waits; nothing has been deleted yet.
    await w.append(b"during-gc")
    assert before <= await _objects(store, "logs/g")
    with pytest.raises(LogPurged):
        await LogReader(store, "logs/g").read(1)
    clock.now += 61
    r2 = await gc.run_once()
    assert r2.phase == "done" and r2.fragments_deleted > 0
    # The newest unlinked fragments stay for the idempotency window, then the sweep takes them.
    retained = w.manifest.next_seq_no - 12
    assert w.manifest.snapshots[0].start > retained or w.manifest.oldest_offset > retained
    assert join("logs/g", fragment_path(retained)) in await _objects(store, "logs/g")
    assert join("logs/g", fragment_path(retained - 1)) not in await _objects(store, "logs/g")
    clock.now = 10**12  # objects' real modification times are now far past retain_s
    assert (await gc.run_once()).orphans_deleted >= 1
    assert join("logs/g", fragment_path(retained)) not in await _objects(store, "logs/g")
    garbage = (await store.get(join("logs/g", GARBAGE_PATH))).data
    assert garbage == EMPTY_GARBAGE and Garbage.from_bytes(garbage) is None
    manifest, records = await read_all(store, "logs/g")
    assert_dense(records, manifest.oldest_offset)
    assert records[-1].body == b"during-gc"
    assert manifest.oldest_offset <= 12 and records[0].offset == manifest.oldest_offset
    report = await scrub_log(store, "logs/g")
    assert report.ok, report.problems
    await w.close()


async def test_gc_splits_a_straddling_snapshot(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/s", SMALL)
    await fill(w, 30)
    await w.compact_manifest()
    assert w.manifest.snapshots[0].limit > 14 > w.manifest.snapshots[0].start
    await CursorStore(store, "logs/s", "t").init("compaction", 14)
    gc = GarbageCollector(
        store, "logs/s", GcOptions(grace_s=1), edit_manifest=w.edit_manifest, clock=clock
    )
    await gc.run_once()
    clock.now += 2
    r = await gc.run_once()
    assert r.phase == "done" and r.snapshots_deleted >= 1
    m = w.manifest
    assert m.oldest_offset == 14  # one fragment per record: the split is exact
    assert (await scrub_log(store, "logs/s")).ok
    _, records = await read_all(store, "logs/s")
    assert [r.body for r in records] == [f"r{i}".encode() for i in range(13, 30)]
    await w.close()


async def test_gc_without_a_writer_and_everything_compacted(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/all")
    await fill(w, 5)
    await w.close()
    await CursorStore(store, "logs/all", "t").init("compaction", 6)
    gc = GarbageCollector(store, "logs/all", GcOptions(grace_s=0), clock=clock)
    assert (await gc.run_once()).phase == "done"
    m, records = await read_all(store, "logs/all")
    # The root keeps its last fragment (it fences stale speculative fragments); the rest goes.
    assert [r.body for r in records] == [b"r4"]
    assert m.oldest_offset == 5 and m.next_offset == 6 and m.next_seq_no == 6
    assert m.fragments and m.fragments[-1].seq_no == 5
    w2 = await LogWriter.open(store, "logs/all")
    assert (await w2.append(b"next")).offset == 6
    await w2.close()
    assert (await scrub_log(store, "logs/all")).ok


async def test_gc_bounds_each_plan_and_the_verifier_refuses_more(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/v")
    await fill(w, 10)
    await CursorStore(store, "logs/v", "t").init("compaction", 10)
    opts = GcOptions(max_fraction=0.5, grace_s=0)
    gc = GarbageCollector(store, "logs/v", opts, edit_manifest=w.edit_manifest, clock=clock)
    live = w.manifest.live_bytes
    report = await gc.run_once()
    assert report.phase == "done"
    # One pass drops at most half of the live bytes, yet something: collection progresses.
    assert 1 < w.manifest.oldest_offset < 10
    assert live - w.manifest.live_bytes <= live // 2
    while (await gc.run_once()).phase == "done":
        pass
    assert w.manifest.oldest_offset == 10  # up to the cursor (which also keeps the last fragment)
    # A plan built past the bound (as a planning bug would) is refused by the verifier.
    m = w.manifest
    w3 = await LogWriter.open(store, "logs/v3")
    await fill(w3, 10)
    m = w3.manifest
    cache = SnapshotCache()

    async def put(_: Snapshot) -> None:
        return None

    g = await plan_cut(store, "logs/v3", m, 9, cache, "t", put, keep_tail=True)
    assert g is not None
    with pytest.raises(GarbageRejected, match="more than the allowed"):
        verify_garbage(g, m, opts)
    with pytest.raises(GarbageRejected, match="a cursor pins"):
        verify_garbage(g, m, GcOptions(), pinned_at=3)
    everything = await plan_cut(store, "logs/v3", m, 11, cache, "t", put)
    assert everything is not None
    with pytest.raises(GarbageRejected, match="last fragment"):
        verify_garbage(everything, m, GcOptions(max_fraction=1.0))
    await w3.close()
    await w.close()


@pytest.mark.parametrize(
    "point",
    [
        ("crash_before", r"gc/GARBAGE$", 0),  # before the plan is written
        ("crash_after", r"gc/GARBAGE$", 0),  # plan written, not applied
        ("crash_before", r"manifest/MANIFEST$", 0),  # applying it
        ("crash_after", r"manifest/MANIFEST$", 0),  # applied, not recorded as applied
        ("crash_after", r"gc/GARBAGE$", 1),  # recorded as applied
        ("crash_after", r"/log/Bucket=", 0),  # mid-delete
        ("crash_before", r"gc/GARBAGE$", 2),  # deleted, not reset
    ],
)
async def test_gc_crash_at_every_phase_boundary(
    store: ObjectStore, point: tuple[str, str, int]
) -> None:
    kind, key, after = point
    clock = Clock()
    w = await LogWriter.open(store, "logs/k", SMALL)
    await fill(w, 25)
    await w.compact_manifest()
    await w.close()
    await CursorStore(store, "logs/k", "t").init("compaction", 13)
    faulty = FaultyStore(store, seed=11)
    ops = {"delete"} if "Bucket" in key else {"put"}
    rule = faulty.add_rule(FaultRule(kind, ops=ops, key_regex=key, after=after, times=1))  # type: ignore[arg-type]
    gc = GarbageCollector(
        faulty, "logs/k", GcOptions(grace_s=0, writer_name="gc", retain_fragments=0), clock=clock
    )
    with pytest.raises(SimulatedCrash):
        for _ in range(4):
            await gc.run_once()
    assert rule.fired == 1
    # Whatever the crash left, the log is readable and intact from its oldest offset ...
    assert (await scrub_log(store, "logs/k")).ok
    # ... and a fresh collector finishes the job.
    faulty.disable()
    gc2 = GarbageCollector(faulty, "logs/k", GcOptions(grace_s=0, writer_name="gc2"), clock=clock)
    for _ in range(3):
        await gc2.run_once()
    manifest, records = await read_all(store, "logs/k")
    assert manifest.oldest_offset == 13
    assert [r.body for r in records] == [f"r{i}".encode() for i in range(12, 25)]
    assert (await scrub_log(store, "logs/k")).ok
    assert (await store.get(join("logs/k", GARBAGE_PATH))).data == EMPTY_GARBAGE


async def test_orphans_below_the_live_range_are_swept(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path / "s")
    clock = Clock()
    w = await LogWriter.open(store, "logs/o")
    await fill(w, 6)
    await w.close()
    await CursorStore(store, "logs/o", "t").init("compaction", 4)
    gc = GarbageCollector(store, "logs/o", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    await gc.run_once()
    # Resurrect an old fragment object (as a crashed delete would leave it) and add a live-range
    # orphan beyond the tail: only the first may go.
    old = (
        await store.get(
            join("logs/o", "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000004.parquet")
        )
    ).data
    await store.put(
        join("logs/o", "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet"), old
    )
    await store.put(
        join("logs/o", "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000009.parquet"), old
    )
    clock.now = 10**12  # everything is older than the grace interval now
    r = await gc.run_once()
    assert r.orphans_deleted == 1
    keys = await _objects(store, "logs/o")
    assert (
        join("logs/o", "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet")
        not in keys
    )
    assert (
        join("logs/o", "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000009.parquet") in keys
    )


# ------------------------------------------------------------------------------------- scrub


async def test_scrub_reports_corruption_precisely(tmp_path) -> None:  # type: ignore[no-untyped-def]
    store = LocalStore(tmp_path / "s")
    w = await LogWriter.open(store, "logs/z", SMALL)
    await fill(w, 12)
    await w.compact_manifest()
    await w.close()
    assert (await scrub_log(store, "logs/z")).ok
    m, _ = await read_all(store, "logs/z")
    victim = m.fragments[-1].path
    path = store.root / "logs/z" / victim
    raw = bytearray(path.read_bytes())

    # 1. Flip one byte inside the data.
    flipped = bytearray(raw)
    flipped[len(flipped) // 3] ^= 0x01
    path.write_bytes(bytes(flipped))
    report = await scrub_log(store, "logs/z")
    assert not report.ok and any(victim in p for p in report.problems), report.problems
    # 2. Delete it.
    path.unlink()
    report = await scrub_log(store, "logs/z")
    assert any(p.startswith(victim) and "missing" in p for p in report.problems)
    path.write_bytes(bytes(raw))
    assert (await scrub_log(store, "logs/z")).ok
    # 3. Edit the manifest: drop a fragment and re-balance nothing.
    mpath = store.root / "logs/z/manifest/MANIFEST"
    obj = json.loads(mpath.read_bytes())
    obj["fragments"][-1]["num_bytes"] += 1
    mpath.write_bytes(json.dumps(obj).encode())
    report = await scrub_log(store, "logs/z")
    assert any("bytes, manifest says" in p for p in report.problems)
    obj["fragments"].pop()
    mpath.write_bytes(json.dumps(obj).encode())
    report = await scrub_log(store, "logs/z")
    assert any("does not balance" in p for p in report.problems)
    # 4. A snapshot edited in place.
    snap_path = store.root / "logs/z" / m.snapshots[0].path_to_snapshot
    snap_path.write_bytes(snap_path.read_bytes().replace(b'"depth":', b'"depth": ', 1)[:-5] + b"}")
    mpath.write_bytes(m.to_bytes())
    report = await scrub_log(store, "logs/z")
    assert any(m.snapshots[0].path_to_snapshot in p for p in report.problems)
    assert [p async for p in find_logs(store, "logs")] == ["logs/z"]


# ---------------------------------------------------------------------------------- fork, seal


async def test_fork_from_offset_is_identical_and_independent(store: ObjectStore) -> None:
    clock = Clock()
    w = await LogWriter.open(store, "logs/src", SMALL)
    await fill(w, 20)
    await w.compact_manifest()
    await CursorStore(store, "logs/src", "t").init("compaction", 8)
    forked = await fork_log(store, "logs/src", "logs/dst")
    src_m, src_records = await read_all(store, "logs/src")
    dst_m, dst_records = await read_all(store, "logs/dst")
    assert dst_m.setsum == src_m.setsum
    assert dst_m.oldest_offset == 8 and forked.next_offset == src_m.next_offset
    assert [(r.offset, r.timestamp_us, r.body) for r in dst_records] == [
        (r.offset, r.timestamp_us, r.body) for r in src_records if r.offset >= 8
    ]
    assert (await scrub_log(store, "logs/dst")).ok
    if isinstance(store, LocalStore):
        # Fragment bodies are not rewritten: the fork's fragments are hard links.
        f = dst_m.fragments[-1].path
        assert (store.root / "logs/src" / f).stat().st_ino == (
            store.root / "logs/dst" / f
        ).stat().st_ino
    with pytest.raises(LogExists):
        await fork_log(store, "logs/src", "logs/dst")
    # Independent afterwards: GC the source to its tail, then append to both.
    await CursorStore(store, "logs/src", "t").advance("compaction", src_m.next_offset)
    gc = GarbageCollector(
        store, "logs/src", GcOptions(grace_s=0), edit_manifest=w.edit_manifest, clock=clock
    )
    for _ in range(2):
        await gc.run_once()
    await w.append(b"src-only")
    await w.close()
    w2 = await LogWriter.open(store, "logs/dst")
    await w2.append(b"dst-only")
    await w2.close()
    _, dst_records = await read_all(store, "logs/dst")
    assert dst_records[0].offset == 8 and dst_records[-1].body == b"dst-only"
    assert b"src-only" not in {r.body for r in dst_records}
    assert (await scrub_log(store, "logs/dst")).ok and (await scrub_log(store, "logs/src")).ok


# --------------------------------------------------------------------------- property / soak


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.sampled_from(["append", "cursor", "gc", "grace"]), st.integers(1, 6)),
        min_size=5,
        max_size=40,
    )
)
def test_random_interleavings_keep_the_books_balanced(tmp_path_factory, ops) -> None:  # type: ignore[no-untyped-def]
    root = tmp_path_factory.mktemp("prop")

    async def run() -> None:
        store = LocalStore(root)
        clock = Clock()
        w = await LogWriter.open(store, "p", SMALL)
        cursors = CursorStore(store, "p", "t")
        gc = GarbageCollector(
            store, "p", GcOptions(grace_s=10), edit_manifest=w.edit_manifest, clock=clock
        )
        written = 0
        cursor = 1
        for op, n in ops:
            if op == "append":
                for _ in range(n):
                    await w.append(f"x{written}".encode())
                    written += 1
            elif op == "cursor":
                cursor = min(written + 1, cursor + n)
                await cursors.advance("compaction", cursor)
            elif op == "gc" and written:
                with contextlib.suppress(NoCursors):
                    await gc.run_once()
            else:
                clock.now += 5 * n
            m = w.manifest
            total = sum((e.setsum for e in m.entries), m.collected)
            assert total == m.setsum
            assert m.oldest_offset <= cursor or not written
            report = await scrub_log(store, "p")
            assert report.ok, report.problems
            _, records = await read_all(store, "p")
            assert [r.body for r in records] == [
                f"x{i}".encode() for i in range(m.oldest_offset - 1, written)
            ]
        # Liveness, not only safety: once everything is compacted and the grace has passed, the
        # collector must actually collect - down to the newest fragment, which the log keeps.
        if written:
            await cursors.advance("compaction", written + 1)
            for _ in range(50):
                clock.now += 11
                if (await gc.run_once()).phase == "idle" and w.manifest.oldest_offset == written:
                    break
            m = w.manifest
            assert m.oldest_offset == written, (m.oldest_offset, written)  # one record a fragment
            assert len(m.entries) == 1 and m.entries[0].start == written, m.entries
            _, records = await read_all(store, "p")
            assert [r.body for r in records] == [f"x{written - 1}".encode()]
            assert (await scrub_log(store, "p")).ok
        await w.close()

    asyncio.run(run())


async def test_appenders_cursor_mover_and_gc_together(moto_endpoint: str, s3_bucket: str) -> None:
    """Appenders, a cursor mover and the collector at once; no sleeps: the mover and the collector
    take a round whenever the others made progress, and halfway the appenders wait (bounded) until
    the collector has really collected, so collection provably interleaves with appends."""
    from wal3 import S3Store

    store = S3Store(bucket=s3_bucket, prefix="soak", endpoint_url=moto_endpoint, region="us-east-1")
    clock = Clock()
    w = await LogWriter.open(
        store,
        "log",
        LogWriterOptions(
            batch=BatchOptions(interval_s=0.001),
            snapshot=SnapshotOptions(fragment_threshold=4, snapshot_threshold=2),
        ),
    )
    cursors = CursorStore(store, "log", "mover")
    await cursors.init("compaction", 1)
    gc = GarbageCollector(
        store,
        "log",
        GcOptions(grace_s=5, retain_fragments=8),
        edit_manifest=w.edit_manifest,
        clock=clock,
    )
    acked: dict[int, bytes] = {}
    done = asyncio.Event()
    collected = asyncio.Event()  # set once a pass has deleted fragment objects
    rng = random.Random(3)
    progress = asyncio.Condition()
    counts = {"acks": 0, "moves": 0, "passes": 0}
    reports = []
    MAX_PASSES = 200

    async def bump(key: str) -> None:
        async with progress:
            counts[key] += 1
            progress.notify_all()

    async def others_moved(since: dict[str, int], mine: str) -> None:
        """Wait until another party made progress since ``since`` (or the appenders are done).
        Each party snapshots before its round and bumps after it, so two of them can never wait
        on each other at once."""
        async with progress:
            await progress.wait_for(
                lambda: done.is_set() or any(counts[k] != v for k, v in since.items() if k != mine)
            )

    async def appender(a: int) -> None:
        for i in range(30):
            if i == 15:  # halfway: wait for a real collection, bounded by passes, not by time
                async with progress:
                    await progress.wait_for(
                        lambda: collected.is_set() or counts["passes"] >= MAX_PASSES
                    )
                if not collected.is_set():
                    pytest.fail(
                        f"{MAX_PASSES} collector passes, and nothing collected while appending"
                    )
            body = f"a{a}-{i}".encode()
            acked[(await w.append(body)).offset] = body
            await bump("acks")

    async def mover() -> None:
        while not done.is_set():
            since = dict(counts)
            target = max(1, w.manifest.next_offset - rng.randint(0, 20))
            await cursors.advance("compaction", target)
            await bump("moves")
            await others_moved(since, "moves")

    async def collector() -> None:
        while not done.is_set():
            since = dict(counts)
            clock.now += 3
            report = await gc.run_once()
            reports.append(report)
            if report.phase == "done" and report.fragments_deleted > 0:
                collected.set()
            await bump("passes")  # notifies, so the appenders re-check ``collected``
            await others_moved(since, "passes")

    bg = [asyncio.create_task(mover()), asyncio.create_task(collector())]
    try:
        await asyncio.gather(*(appender(a) for a in range(12)))
    finally:
        async with progress:
            done.set()
            progress.notify_all()
        await asyncio.gather(*bg)
    await w.close()
    cut = (await cursors.load("compaction")).cursor.offset  # type: ignore[union-attr]
    manifest, records = await read_all(store, "log")
    # Liveness: collection happened (while appends were in flight: the appenders waited for it):
    # it moved the log's start and deleted fragment objects.
    assert collected.is_set()
    assert 1 < manifest.oldest_offset <= cut
    assert sum(r.fragments_deleted for r in reports) > 0, reports
    print(
        f"{len(reports)} collector passes, first collection after pass "
        f"{next(i for i, r in enumerate(reports) if r.fragments_deleted)}"
    )
    # Safety: nothing at or past the cursor was lost, and the books balance.
    assert_dense(records, manifest.oldest_offset)
    by_offset = {r.offset: r.body for r in records}
    for off, body in acked.items():
        if off >= cut:
            assert by_offset[off] == body
    assert (await scrub_log(store, "log")).ok
    await store.close()
