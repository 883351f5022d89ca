"""Regression tests for six engine bugs found by review at commit 3c61663.

Each test drives the exact interleaving that broke an invariant, and each failed on 3c61663
(docs/RELIABILITY.md lists how; the deterministic simulator finds the same bugs by seed).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from host.wal3 import (
    FaultRule,
    FaultyStore,
    LogContention,
    LogPurged,
    LogWriter,
    LogWriterOptions,
    ObjectNotFound,
    ObjectStore,
    Setsum,
    StoreUnavailable,
)
from host.wal3.cursors import CursorStore
from host.wal3.errors import SimulatedCrash
from host.wal3.fragment import encode_fragment, fragment_path
from host.wal3.gc import EMPTY_GARBAGE, GarbageCollector, GcOptions, pin_cursor
from host.wal3.layout import GARBAGE_PATH, join, load_manifest
from host.wal3.scrub import scrub_log

from .helpers import read_all


class Clock:
    """Virtual seconds for the collector's grace interval."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _fill(w: LogWriter, n: int, tag: str = "r") -> None:
    for i in range(n):
        await w.append(f"{tag}{i}".encode())


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
        store: ObjectStore) -> None:
    """With the compaction cursor at the tail, GC used to empty the root; then read repair took
    any orphan at the tail for a good one and linked a fragment whose append was 'not written'."""
    clock = Clock()
    w = await LogWriter.open(store, "logs/fence")
    await _fill(w, 3)
    await CursorStore(store, "logs/fence", "t").init("compaction", w.manifest.next_offset)
    gc = GarbageCollector(store, "logs/fence", GcOptions(grace_s=0, retain_fragments=0),
                          edit_manifest=w.edit_manifest, clock=clock)
    while (await gc.run_once()).phase == "done":
        pass
    # Another writer's speculative fragment at the tail: right slot and start, but it follows a
    # fragment of that writer's that was never linked (its append was answered "not written").
    stale = encode_fragment(w.manifest.next_seq_no, w.manifest.next_offset, 1, [b"not-written"],
                            prev=Setsum.of(b"a fragment that was never linked"))
    await store.put(join("logs/fence", stale.path), stale.data, if_none_match="*")
    await w.append(b"next")
    await w.close()
    _, records = await read_all(store, "logs/fence")
    assert b"not-written" not in [r.body for r in records]
    assert records[-1].body == b"next"
    assert w.manifest.fragments, "the root keeps its last fragment"


# 3 ------------------------------------------------------------------------------------------


async def test_gc_does_not_wedge_when_the_cutoff_falls_inside_a_snapshots_first_fragment(
        store: ObjectStore) -> None:
    """Splitting a straddling snapshot that loses nothing rebuilt it at the same content address,
    both live and listed for deletion: phase 3 refused on every run, for ever."""
    clock = Clock()
    opts = LogWriterOptions(snapshot_fragment_threshold=3, snapshot_threshold=100)
    w = await LogWriter.open(store, "logs/split", opts)
    for i in range(8):
        await w.append_many([f"a{i}".encode(), f"b{i}".encode()])  # fragments of two records
    await w.compact_manifest()
    assert w.manifest.snapshots and w.manifest.snapshots[0].start == 1
    cursors = CursorStore(store, "logs/split", "t")
    await cursors.init("compaction", 2)  # strictly inside the first fragment [1, 3)
    gc = GarbageCollector(store, "logs/split", GcOptions(grace_s=0, retain_fragments=0),
                          edit_manifest=w.edit_manifest, clock=clock)
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
    await _fill(w, 10)
    await CursorStore(store, "logs/pin", "t").init("compaction", 10)
    # The collector dies right after writing its plan (phase 1).
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"gc/GARBAGE$", times=1))
    gc = GarbageCollector(faulty, "logs/pin", GcOptions(grace_s=0, retain_fragments=0),
                          clock=clock)
    with pytest.raises(SimulatedCrash):
        await gc.run_once()
    # A reader pins offset 2 with a new cursor while the plan is pending ("emergency" cursor).
    await CursorStore(store, "logs/pin", "reader").init("emergency", 2)
    gc2 = GarbageCollector(store, "logs/pin", GcOptions(grace_s=0, retain_fragments=0),
                           clock=clock)
    await gc2.run_once()
    await gc2.run_once()
    for seq in range(2, 11):
        await store.head(join("logs/pin", fragment_path(seq)))  # nothing pinned was deleted
    manifest, _ = await load_manifest(store, "logs/pin") or (None, None)
    assert manifest is not None and manifest.oldest_offset <= 2
    await w.close()


async def test_pinning_below_an_applied_plan_fails_and_undoes_the_cursor(
        store: ObjectStore) -> None:
    """The reader's half of the dance: a plan applied by another process (not through the
    server's writer) is seen, the pin is refused and the cursor does not stay behind."""
    clock = Clock()
    faulty = FaultyStore(store, seed=1)
    w = await LogWriter.open(store, "logs/pin2")
    await _fill(w, 10)
    await CursorStore(store, "logs/pin2", "t").init("compaction", 10)
    # A collector in another process applies its plan and stops before deleting.
    faulty.add_rule(FaultRule("crash_before", ops={"delete"}, times=1))
    gc = GarbageCollector(faulty, "logs/pin2", GcOptions(grace_s=0, retain_fragments=0),
                          clock=clock)
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
    await _fill(w, 6)
    await CursorStore(store, "logs/sealed", "t").init("compaction", 7)
    await w.seal()
    gc = GarbageCollector(store, "logs/sealed", GcOptions(grace_s=0, retain_fragments=0),
                          edit_manifest=w.edit_manifest, clock=clock)
    while (await gc.run_once()).phase == "done":
        pass
    assert w.manifest.sealed and w.manifest.oldest_offset == 6
    with pytest.raises(ObjectNotFound):
        await store.head(join("logs/sealed", fragment_path(1)))
    await w.close()


# 6 ------------------------------------------------------------------------------------------


async def test_one_transient_upload_failure_is_retried_not_reported_as_contention(
        store: ObjectStore) -> None:
    """A single writer; one fragment's upload answers 503 four times and never lands; 8 appends in
    flight.  Most of them used to fail with LogContention, which claims another writer."""
    faulty = FaultyStore(store, seed=2)
    rule = faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=r"FragmentSeqNo=0+3\.parquet$",
                                     times=4))
    opts = LogWriterOptions(batch_size_bytes=1, max_inflight_fragments=8)  # one append a batch
    w = await LogWriter.open(faulty, "logs/transient", opts)
    results = await asyncio.gather(*(w.append(f"t{i}".encode()) for i in range(8)),
                                   return_exceptions=True)
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
    from host.wal3.cursors import check_cursor_name
    from host.wal3.errors import InvalidCursorName

    with pytest.raises(InvalidCursorName):
        check_cursor_name(name)


# a keyed retry on a stale writer --------------------------------------------------------------


async def test_a_keyed_retry_on_a_stale_writer_is_deduplicated_not_refused(
        store: ObjectStore) -> None:
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
        store: ObjectStore) -> None:
    """GC cut at the lowest of *all* cursors: a reader cursor on a never-compacted log made it
    delete records no compaction had folded."""
    clock = Clock()
    w = await LogWriter.open(store, "logs/intrinsic")
    await _fill(w, 10)
    cursors = CursorStore(store, "logs/intrinsic", "reader")
    await cursors.init("reader", 5)
    gc = GarbageCollector(store, "logs/intrinsic", GcOptions(grace_s=0, retain_fragments=0),
                          edit_manifest=w.edit_manifest, clock=clock)
    await gc.run_once()
    assert w.manifest.oldest_offset == 1  # no compaction cursor: nothing is collected
    await cursors.init("compaction", 3)
    while (await gc.run_once()).phase == "done":
        pass
    assert w.manifest.oldest_offset == 3  # the reader is at 5, compaction at 3
    _, records = await read_all(store, "logs/intrinsic")
    assert records[0].offset == 3
    await w.close()
