"""Regression tests for bugs the reliability verifier (verify/reliability/) found.

Each is the smallest reproduction at the level where the bug lives; they fail until it is fixed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import pytest

from verify import keys
from verify.testkit import wait_until
from wal3 import (
    FaultRule,
    FaultyStore,
    GarbageRejected,
    Limits,
    LocalStore,
    LogReader,
    LogWriter,
    LogWriterOptions,
    SnapshotOptions,
    StoreUnavailable,
)
from wal3.cursors import CursorStore
from wal3.fork import fork_log
from wal3.gc import GarbageCollector, GcOptions
from wal3.layout import load_manifest
from wal3.paths import MANIFEST_PATH, fragment_path, join, log_prefix
from wal3.scrub import scrub_log
from wal3.store import GetResult

SNAPSHOT = keys.in_any_log(keys.SNAPSHOT)


async def _write(store: FaultyStore | LocalStore, prefix: str, n: int) -> LogWriter:
    w = await LogWriter.open(
        store,
        prefix,
        LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=2, snapshot_threshold=2)),
    )
    for i in range(n):
        await w.append(b"record-%d" % i)  # sequential: one fragment per record
    return w


async def _all_bodies(store: LocalStore, prefix: str) -> list[bytes]:
    reader = LogReader(store, prefix)
    m = await reader.manifest()
    return [
        r.body for r in await reader.read(m.oldest_offset, Limits(max_records=10_000), manifest=m)
    ]


async def test_regression_writer_links_snapshot_that_a_409_kept_out_of_the_store(
    tmp_path: Path,
) -> None:
    """Found by ``storms`` (seed 1): a snapshot put answered with a failed condition (S3's 409
    ConditionalRequestConflict: another request was writing the same key at the same moment) is
    taken as proof that the snapshot exists, and the next manifest links it.  It never existed:
    every read through that part of the log fails and scrub reports the snapshot missing."""
    base = LocalStore(tmp_path)
    faulty = FaultyStore(base, seed=1)
    rule = faulty.add_rule(FaultRule("precondition", ops={"put"}, key_regex=SNAPSHOT, times=1))
    w = await _write(faulty, log_prefix("a"), 12)
    await w.compact_manifest()
    await w.close()
    assert rule.fired == 1
    report = await scrub_log(base, log_prefix("a"))
    assert report.ok, report.problems
    assert await _all_bodies(base, log_prefix("a")) == [b"record-%d" % i for i in range(12)]


async def test_regression_gc_links_split_snapshot_that_a_409_kept_out_of_the_store(
    tmp_path: Path,
) -> None:
    """Same cause in garbage collection: the snapshot GC writes when it splits a snapshot that
    straddles the cutoff is assumed present after a failed condition, and phase 2 installs a root
    pointing at it."""
    base = LocalStore(tmp_path)
    w = await _write(base, log_prefix("g"), 16)
    await w.compact_manifest()
    m = w.manifest
    assert m.snapshots, "the log needs a snapshot to split"
    cut = m.snapshots[0].start + 1  # inside the first snapshot: GC must split it
    await w.close()
    await CursorStore(base, log_prefix("g"), "t").init("compaction", cut)
    faulty = FaultyStore(base, seed=2)
    rule = faulty.add_rule(FaultRule("precondition", ops={"put"}, key_regex=SNAPSHOT, times=1))
    gc = GarbageCollector(faulty, log_prefix("g"), GcOptions(grace_s=0))
    for _ in range(3):  # a pass may fail on the fault; the next one must finish cleanly
        try:
            await gc.run_once()
        except (StoreUnavailable, GarbageRejected):
            continue
    assert rule.fired == 1
    report = await scrub_log(base, log_prefix("g"))
    assert report.ok, report.problems
    loaded = await load_manifest(base, log_prefix("g"))
    assert loaded is not None
    oldest = loaded[0].oldest_offset
    assert await _all_bodies(base, log_prefix("g")) == [
        b"record-%d" % i for i in range(oldest - 1, 16)
    ]


async def test_regression_fork_links_fragment_copy_that_a_409_kept_out_of_the_store(
    tmp_path: Path,
) -> None:
    """Same cause in fork: a fragment copy that fails its condition is taken as "a retried fork
    copied it already", and the fork's manifest references a fragment the fork does not have."""
    base = LocalStore(tmp_path)
    w = await _write(base, log_prefix("src"), 16)
    await w.close()
    faulty = FaultyStore(base, seed=3)
    rule = faulty.add_rule(
        FaultRule("precondition", ops={"copy"}, key_regex=keys.in_any_log(keys.FRAGMENT), times=1)
    )
    await fork_log(faulty, log_prefix("src"), log_prefix("dst"), from_offset=5)
    assert rule.fired == 1
    report = await scrub_log(base, log_prefix("dst"))
    assert report.ok, report.problems
    assert await _all_bodies(base, log_prefix("dst")) == [b"record-%d" % i for i in range(4, 16)]


@pytest.mark.timeout(20)  # the bug livelocks the event loop: only the signal timeout ends it
async def test_regression_cancelled_close_livelocks_the_next_request_for_that_log(
    tmp_path: Path,
) -> None:
    """Found by ``crash_fragment_manifest`` (seed 13), where the whole in-process host hung.

    ``LogManager._close_handle`` removes its entry from ``_closing`` only if its own awaiter is
    still there when the close task finishes.  When that awaiter is cancelled (Starlette cancels a
    request whose client went away; here: a request evicting another log), a finished task stays
    in ``_closing`` for good, and the next request for that log loops in ``_get_or_open`` on
    ``await asyncio.shield(<done task>)``, which returns without yielding: the event loop spins
    and the host stops answering anything."""
    import asyncio
    import uuid

    from host.config import Settings
    from host.leader import NullLeaderHint
    from host.manager import LogManager
    from host.metrics import Metrics

    class GatedStore(LocalStore):
        """Holds the next manifest write until released: the close stays in flight, by design
        rather than by a delay, while the request that started it is cancelled."""

        armed = False
        entered = asyncio.Event()
        release = asyncio.Event()

        async def put(
            self,
            key: str,
            data: bytes,
            *,
            if_none_match: Literal["*"] | None = None,
            if_match: str | None = None,
        ) -> str:
            if self.armed and key.endswith(MANIFEST_PATH):
                type(self).armed = False
                self.entered.set()
                await self.release.wait()
            return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)

    store = GatedStore(tmp_path)
    settings = Settings(store="unused", api_keys="k=*", server_id="t", max_open_logs=1)

    async def mark(cid: uuid.UUID, first: int, count: int) -> None:
        return None

    mgr = LogManager(store, settings, Metrics(), NullLeaderHint(), mark)
    a, b = uuid.uuid4(), uuid.uuid4()
    async with mgr.use(a, "alice", create=True) as h:
        await h.writer.append_many([b"first"])
        # Leave something for the close to flush, behind a held manifest write.
        GatedStore.armed = True
        flushed = asyncio.ensure_future(h.writer.append_many([b"second"]))

    async def open_b() -> None:
        async with mgr.use(b, "alice", create=True):  # evicts a (max_open_logs=1)
            pass

    evicting = asyncio.create_task(open_b())
    await asyncio.wait_for(GatedStore.entered.wait(), 10)  # the flush reached the manifest write
    await wait_until(lambda: a in mgr._closing, "the eviction to start", 10, 0.005)
    assert not mgr._closing[a].done()  # held: the close is really in flight
    evicting.cancel()  # the request that evicts a goes away mid-close (the write is still held)
    with pytest.raises(asyncio.CancelledError):
        await evicting
    GatedStore.release.set()
    await flushed  # the close of a finishes in the background
    async with mgr.use(a, "alice") as again:  # livelocks before the fix
        assert again.writer.manifest.next_offset == 3
    await mgr.close()


async def test_regression_idempotency_keys_in_snapshotted_fragments_are_forgotten_on_reopen(
    tmp_path: Path,
) -> None:
    """Found by ``crash_snapshot`` (duplicates after a restart).  A reopened writer learns
    idempotency keys from ``manifest.fragments[-dedup_window_fragments:]``: the root's fragments
    only.  Keys in fragments already folded into a snapshot are forgotten, so a client retrying
    after a crash or failover appends its records a second time; with the default thresholds the
    window shrinks from 256 fragments to whatever the root still holds."""
    store = LocalStore(tmp_path)
    opts = LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=2, snapshot_threshold=2))
    w1 = await LogWriter.open(store, log_prefix("k"), opts)
    first = await w1.append_many([b"once"], idempotency_key="key-1")
    for i in range(8):
        await w1.append_many([b"later-%d" % i])
    await w1.compact_manifest()
    assert not any(f.start <= first.first_offset < f.limit for f in w1.manifest.fragments), (
        "the keyed fragment must be inside a snapshot for this test"
    )
    await w1.close()
    w2 = await LogWriter.open(store, log_prefix("k"), opts)  # a restart, or another host
    again = await w2.append_many([b"once"], idempotency_key="key-1")  # the client's retry
    await w2.close()
    assert again.deduplicated and again.first_offset == first.first_offset
    assert (await _all_bodies(store, log_prefix("k"))).count(b"once") == 1


class _GateStore(LocalStore):
    """Another view of the test's LocalStore directory, holding manifest puts until ``gate`` is
    set (``reached`` tells when the first one is waiting)."""

    def __init__(self, root: Path) -> None:
        import asyncio

        super().__init__(root)
        self.gate = asyncio.Event()
        self.reached = asyncio.Event()

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        if key.endswith(MANIFEST_PATH):
            self.reached.set()
            await self.gate.wait()
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


async def test_regression_writer_repeats_a_batch_another_writer_linked_into_a_snapshot(
    tmp_path: Path,
) -> None:
    """Found by ``redis_restart`` (seeds 2-5: one POST, its records twice in the log, the second
    copy acknowledged).  Writer A uploads a fragment; before A's manifest write lands, writer B
    (another host) read-repairs that fragment into the log and snapshots fold it away.  A's
    recovery checks ``manifest.contains_fragment``, which only looks at the root's fragments, so A
    does not see its batch linked and appends it again (or, if B's later fragments are still in
    the root, answers 409 "not written" for records that are in the log)."""
    import asyncio

    store = LocalStore(tmp_path)
    opts = LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=2, snapshot_threshold=2))
    base = await LogWriter.open(store, log_prefix("two"), opts)
    for i in range(3):
        await base.append_many([b"base-%d" % i])
    await base.close()
    gated = _GateStore(tmp_path)
    a = await LogWriter.open(gated, log_prefix("two"), opts)
    b = await LogWriter.open(store, log_prefix("two"), opts)
    pending = asyncio.ensure_future(a.append_many([b"from-a"], idempotency_key="a-1"))
    await gated.reached.wait()  # A's fragment is uploaded; its manifest write is held
    # B appends: its upload collides with A's fragment, B read-repairs A's fragment into the log.
    for i in range(6):
        await b.append_many([b"from-b-%d" % i])
    await b.compact_manifest()
    assert b"from-a" in await _all_bodies(store, log_prefix("two"))
    gated.gate.set()
    outcome: object
    try:
        outcome = await pending
    except Exception as e:
        outcome = e
    await a.close()
    await b.close()
    bodies = await _all_bodies(store, log_prefix("two"))
    assert bodies.count(b"from-a") == 1, (
        f"A's records are in the log {bodies.count(b'from-a')} times"
    )
    assert not isinstance(outcome, Exception), (
        f"A was told {outcome!r} for records that are in the log"
    )


async def test_regression_append_joining_a_reads_open_of_a_new_log_gets_404(tmp_path: Path) -> None:
    """Found by ``two_hosts`` (seed 4): an append answered ``404 log ... was never written``.

    ``LogManager._get_or_open`` shares one open per log (single flight) without looking at
    ``create``: an append (``create=True``) arriving while a read is opening the same log, bound
    to its tenant but with no manifest yet (its first append is still creating it, maybe on
    another host), awaits the read's ``create=False`` open and fails with the read's NotFound.
    Clients treat 404 as final, so a valid append is lost to a harmless read."""
    import asyncio
    import uuid

    from host.config import Settings
    from host.errors import NotFound
    from host.leader import NullLeaderHint
    from host.manager import LogManager
    from host.metrics import Metrics

    settings = Settings(store="unused", api_keys="k=*", server_id="t")

    async def mark(cid: uuid.UUID, first: int, count: int) -> None:
        return None

    mgr = LogManager(LocalStore(tmp_path), settings, Metrics(), NullLeaderHint(), mark)
    cid = uuid.uuid4()
    await mgr.bind(cid, "alice")  # the state while the log's first append is opening it

    async def read() -> None:
        async with mgr.use(cid, "alice"):
            pass

    async def append() -> int:
        async with mgr.use(cid, "alice", create=True) as h:
            return (await h.writer.append_many([b"x"])).first_offset

    got_read, got_append = await asyncio.gather(read(), append(), return_exceptions=True)
    await mgr.close()
    assert isinstance(got_read, NotFound | type(None))  # a read of an empty log: 404 is fine
    assert got_append == 1, f"the append failed: {got_append!r}"


class _ReadGate(LocalStore):
    """Another view of the test's LocalStore directory, holding gets of the given keys until
    ``gate`` is set."""

    def __init__(self, root: Path, held: set[str]) -> None:
        import asyncio

        super().__init__(root)
        self.held = held
        self.gate = asyncio.Event()
        self.reached = asyncio.Event()

    async def get(self, key: str) -> GetResult:
        if key in self.held:
            self.reached.set()
            await self.gate.wait()
        return await super().get(key)


async def test_regression_keys_of_fragments_repaired_while_keys_load_are_dropped(
    tmp_path: Path,
) -> None:
    """Found by ``crash_rollup_cursor`` (long form, seed 101: a keyed append retried across four
    restarts landed twice).  After a restart a writer learns idempotency keys lazily, at its first
    keyed append, from the manifest it has then.  If, while those footers are being read, another
    append collides with a crashed process's orphan fragment and read repair links it,
    ``_recover`` learns the orphan's keys only ``if self._keys_loaded`` - false until the first
    load finishes, and that load never saw the orphan.  The orphan's keys are lost, and the retry
    of the append that wrote the orphan is appended again."""
    import asyncio

    from wal3 import SimulatedCrash, WriterClosed

    base = LocalStore(tmp_path)
    w0 = await LogWriter.open(base, log_prefix("c"))
    for i in range(3):
        await w0.append_many([b"before-%d" % i])
    await w0.close()
    # A process dies between uploading a keyed fragment and writing the manifest.
    dying = FaultyStore(base, seed=5)
    dying.add_rule(FaultRule("crash_before", ops={"put"}, key_regex=keys.MANIFEST, times=1))
    w1 = await LogWriter.open(dying, log_prefix("c"))
    with pytest.raises((SimulatedCrash, WriterClosed)):
        await w1.append_many([b"retried"], idempotency_key="k")
    await w1.close()
    # The restarted process: its first key load is slow (held), a keyless append runs meanwhile.
    gated = _ReadGate(tmp_path, {join(log_prefix("c"), fragment_path(s)) for s in (1, 2, 3)})
    w2 = await LogWriter.open(gated, log_prefix("c"))
    loading = asyncio.ensure_future(w2.append_many([b"other"], idempotency_key="k2"))
    await gated.reached.wait()
    await w2.append_many([b"keyless"])  # collides with the orphan: read repair links it
    gated.gate.set()
    await loading
    again = await w2.append_many([b"retried"], idempotency_key="k")  # the client's retry
    await w2.close()
    bodies = await _all_bodies(base, log_prefix("c"))
    assert bodies.count(b"retried") == 1, bodies
    assert again.deduplicated


async def test_regression_idempotency_window_ends_at_the_gc_cutoff_after_reopen(
    tmp_path: Path,
) -> None:
    """Found by ``crash_fragment_manifest`` (seed 8) and ``crash_gc_reset`` (seeds 8, 16): an
    append died with its host after its fragment was written; the next host read-repaired it;
    compaction and GC then moved the log's oldest offset past it; the client's retry, a few
    seconds later, reached a host that had reopened the log and was appended a second time.

    A reopened writer learns idempotency keys only from fragments still live in the manifest.
    GC phase 2 moves ``oldest_offset`` at once, and phase 3 deletes the fragments (after the
    grace), so with a compactor keeping up the dedup window after a restart shrinks to nothing -
    far short of ``dedup_window_fragments`` - and how long a retry stays safe depends on how fast
    the compactor is.  The window must survive collection (e.g. GC keeps the objects of the newest
    ``dedup_window_fragments`` fragments and a reopened writer reads their footers, linked or not);
    at ``gc_grace_s=0`` (the verifier's setting) merely reading not-yet-deleted fragments is not
    enough."""
    store = LocalStore(tmp_path)
    w1 = await LogWriter.open(store, log_prefix("w"))
    first = await w1.append_many([b"once"], idempotency_key="k")
    for i in range(4):
        await w1.append_many([b"later-%d" % i])
    await w1.close()
    # A compactor consumed the whole log; GC collects it (grace 0: apply and delete in one pass).
    await CursorStore(store, log_prefix("w"), "t").init("compaction", 6)
    gc = GarbageCollector(store, log_prefix("w"), GcOptions(grace_s=0))
    report = await gc.run_once()
    assert report.phase == "done", report
    w2 = await LogWriter.open(store, log_prefix("w"))  # a restart, or another host
    again = await w2.append_many([b"once"], idempotency_key="k")  # the client's retry
    await w2.close()
    assert again.deduplicated and again.first_offset == first.first_offset, again
