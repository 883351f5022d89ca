"""``wal3.fork`` rule by rule: what a fork's manifest holds (the source from the fork point, split
as garbage collection would, unsealed, under the fork's writer), where it starts by default and
what it refuses, which objects it copies and writes into the target and how (create-only, at most
``concurrency`` copies at once, split snapshots read back from the target), the compaction cursor,
``before_commit``, the commit, and how a claimed fork (``acquire``) writes only through its claim
and keeps or loses it.  Written against the mutation run of the module (docs/RELIABILITY.md):
each test pins one rule (its name says which); the mutants it leaves, all equivalent, are
listed at the end of the file.

The source is a real log (``LogWriter``) on the in-memory store of tests/wal3/test_claim_contract
(every request recorded, hooks before chosen ones, failures on demand); claims run on a clock the
test moves.  The server-level fork cases are tests/host/test_fork_claims.py and its neighbours.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

from wal3 import LogReader, LogWriter, LogWriterOptions, ObjectStore, SnapshotOptions
from wal3.claim import Claim, ClaimLost, claim_log
from wal3.cursors import COMPACTION, Cursor, CursorStore
from wal3.errors import (
    CorruptFragment,
    CorruptManifest,
    CursorConflict,
    LogExists,
    LogNotFound,
    LogPurged,
    StoreUnavailable,
)
from wal3.fork import fork_log
from wal3.fragment import LogRecord
from wal3.gc import plan_cut
from wal3.layout import load_manifest
from wal3.manifest import FragmentPointer, Manifest, Pointer, Snapshot
from wal3.paths import CLAIM_PATH, MANIFEST_PATH, cursor_path, join
from wal3.reader import SnapshotCache

from .test_claim_contract import MemStore, StepClock, watch_and_clock

SRC, DST = "logs/src", "logs/dst"
DMAN = join(DST, MANIFEST_PATH)
DCURSOR = join(DST, cursor_path(COMPACTION))
OPTS = LogWriterOptions(
    writer_name="w", snapshot=SnapshotOptions(fragment_threshold=3, snapshot_threshold=2)
)


class Store(MemStore):
    """The test store, whose copies can be held at a gate (``hold``) while counting how many
    are in flight at once."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Event | None = None
        self.in_flight = 0
        self.most = 0

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            if self.gate is not None:
                await self.gate.wait()
            return await super().copy(src, dst, if_none_match=if_none_match)
        finally:
            self.in_flight -= 1


async def source(records: int = 20, *, sealed: bool = False) -> tuple[Store, Manifest]:
    """``records`` one-record fragments (offsets 1…), folded into snapshots: with 20, the root
    is a depth-3 snapshot over [1, 13), a depth-2 one over [13, 19), and fragments 19 and 20."""
    store = Store()
    w = await LogWriter.open(store, SRC, OPTS)
    for i in range(records):
        await w.append(f"r{i + 1}".encode())
    await w.compact_manifest()
    if sealed:
        await w.seal()
    m = w.manifest
    await w.close()
    store.ops.clear()
    return store, m


async def expected(store: Store, m: Manifest, at: int, writer: str = "wal3-fork") -> Manifest:
    """The fork's manifest as garbage collection would cut the source at ``at``."""

    async def keep(_: Snapshot) -> None:
        pass

    cut = await plan_cut(store, SRC, m, at, SnapshotCache(), writer, keep)
    cut_m = cut.apply(m, writer) if cut is not None else m
    return Manifest(
        setsum=cut_m.setsum,
        collected=cut_m.collected,
        acc_bytes=cut_m.acc_bytes,
        writer=writer,
        snapshots=cut_m.snapshots,
        fragments=cut_m.fragments,
        initial_offset=cut_m.initial_offset,
        initial_seq_no=cut_m.initial_seq_no,
    )


async def reached(store: Store, prefix: str, m: Manifest) -> set[str]:
    """Every object key the manifest's root reaches under ``prefix``."""
    keys: set[str] = set()
    stack: list[Pointer] = list(m.entries)
    cache = SnapshotCache()
    while stack:
        p = stack.pop()
        keys.add(join(prefix, p.path))
        if not isinstance(p, FragmentPointer):
            stack.extend((await cache.get(store, prefix, p)).children)
    return keys


async def read_all(store: ObjectStore, prefix: str) -> tuple[Manifest, list[LogRecord]]:
    """Every live record of a log (the reader verifies them against the manifest's setsums)."""
    reader = LogReader(store, prefix)
    manifest = await reader.manifest()
    return manifest, await reader.read(manifest.oldest_offset, manifest=manifest)


def target_keys(store: Store) -> set[str]:
    return {k for k in store.objects if k.startswith(DST + "/")}


def bodies(records: Any) -> list[tuple[int, bytes]]:
    return [(r.offset, r.body) for r in records]


async def split_keys(store: Store, at: int = 8) -> list[str]:
    """The keys in the target of the snapshots a fork from ``at`` splits (content-addressed:
    found by a fork into another log, which is then dropped)."""
    probe = "logs/probe"
    await fork_log(store, SRC, probe, from_offset=at)
    keys = [
        join(DST, k[len(probe) + 1 :])
        for k in store.objects
        if k.startswith(probe + "/snapshot/")
        and join(SRC, k[len(probe) + 1 :]) not in store.objects
    ]
    for k in [k for k in store.objects if k.startswith(probe + "/")]:
        del store.objects[k]
    store.ops.clear()
    assert keys
    return keys


async def acquire_for(store: Store, target: str = DST) -> tuple[list[Claim], Any, StepClock]:
    """An ``acquire`` claiming ``target`` (cleaning it up), and the claims it gave."""
    watch, clock = watch_and_clock()
    got: list[Claim] = []

    async def acquire() -> Claim | None:
        c = await claim_log(store, target, purpose="fork", holder="h", watch=watch)
        if c is not None:
            got.append(c)
        return c

    return got, acquire, clock


# ------------------------------------------------------------------ the fork's content


async def test_a_fork_holds_the_source_from_the_offset_and_nothing_else() -> None:
    """The manifest is the source cut at the offset as GC would cut it (same setsum, what lies
    before in ``collected``), under the fork's writer, unsealed, with no lease or GC floor of
    the source's; every object its root reaches is in the target (split snapshots written
    there, the rest copied), and nothing else but the cursor.  Returned as stored."""
    store, m = await source()
    called: list[tuple[Manifest, set[str]]] = []

    async def before_commit(forked: Manifest) -> None:
        called.append((forked, target_keys(store)))

    forked = await fork_log(
        store, SRC, DST, from_offset=8, compaction_offset=10, before_commit=before_commit
    )
    want = await expected(store, m, 8)
    assert forked == want
    assert forked.sealed is False and forked.writer == "wal3-fork"
    assert forked.oldest_offset == 8 and forked.next_offset == m.next_offset == 21
    assert forked.setsum == m.setsum and forked.collected != m.collected
    assert forked.initial_offset == 8 and forked.initial_seq_no == 8
    assert forked.acc_bytes == m.acc_bytes != 0
    loaded = await load_manifest(store, DST)
    assert loaded is not None and loaded[0] == forked
    assert store.objects[DMAN][0] == forked.to_bytes()
    _, src_records = await read_all(store, SRC)
    _, dst_records = await read_all(store, DST)
    assert bodies(dst_records) == [b for b in bodies(src_records) if b[0] >= 8]
    objects = await reached(store, DST, forked)
    assert target_keys(store) == objects | {DMAN, DCURSOR}
    # The split snapshots are new objects, written by the fork under its own name.
    split = {k for k in objects if "/snapshot/" in k} - {
        join(DST, k[len(SRC) + 1 :]) for k in store.objects if k.startswith(SRC + "/snapshot/")
    }
    assert split
    for k in split:
        assert Snapshot.from_bytes(store.objects[k][0]).writer == "wal3-fork"
        assert ("get", k) in store.ops  # walked from the target's own copy
    # before_commit: once, with the manifest to be, everything but the manifest in place.
    [(arg, then)] = called
    assert arg == forked and then == objects | {DCURSOR}
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None
    assert (cursor.cursor.offset, cursor.cursor.writer) == (10, "wal3-fork")


async def test_a_fork_of_the_whole_log_is_the_source_under_its_writer() -> None:
    store, m = await source(sealed=True)
    forked = await fork_log(store, SRC, DST, writer_name="forker")
    assert forked == await expected(store, m, 1, "forker")
    assert forked.entries == m.entries and forked.sealed is False and forked.writer == "forker"
    assert target_keys(store) == await reached(store, DST, forked) | {DMAN}
    assert all(op != "put" or "/snapshot/" not in k for op, k in store.ops)  # nothing split
    _, dst_records = await read_all(store, DST)
    assert [r.offset for r in dst_records] == list(range(1, 21))


async def test_the_forks_writer_signs_its_split_snapshots_and_cursor() -> None:
    store, _ = await source()
    forked = await fork_log(
        store, SRC, DST, from_offset=5, writer_name="forker", compaction_offset=7
    )
    assert forked.writer == "forker"
    fresh = {
        k
        for k in target_keys(store)
        if "/snapshot/" in k and join(SRC, k[len(DST) + 1 :]) not in store.objects
    }
    assert fresh and all(Snapshot.from_bytes(store.objects[k][0]).writer == "forker" for k in fresh)
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None and cursor.cursor.writer == "forker"


async def test_the_default_fork_point_is_the_sources_compaction_cursor() -> None:
    store, m = await source()
    await CursorStore(store, SRC, "t").init(COMPACTION, 8)
    forked = await fork_log(store, SRC, DST)
    assert forked.oldest_offset == 8 and forked == await expected(store, m, 8)


async def test_without_a_cursor_the_fork_starts_at_the_oldest_record() -> None:
    store, m = await source()
    older = await fork_log(store, SRC, "logs/mid", from_offset=6)
    forked = await fork_log(store, "logs/mid", DST)
    assert forked.oldest_offset == older.oldest_offset == 6
    _, dst_records = await read_all(store, DST)
    assert [r.offset for r in dst_records] == list(range(6, 21))
    assert m.oldest_offset == 1


async def test_a_fork_point_below_the_oldest_record_is_purged() -> None:
    store, _ = await source()
    await fork_log(store, SRC, "logs/mid", from_offset=6)
    with pytest.raises(LogPurged) as e:
        await fork_log(store, "logs/mid", DST, from_offset=5)
    assert (e.value.offset, e.value.oldest_offset) == (5, 6)
    assert target_keys(store) == set()
    forked = await fork_log(store, "logs/mid", DST, from_offset=6)
    assert forked.oldest_offset == 6


async def test_a_fork_point_past_the_tail_forks_an_empty_log_at_the_tail() -> None:
    store, m = await source(5)
    forked = await fork_log(store, SRC, DST, from_offset=1_000)
    assert forked.oldest_offset == forked.next_offset == m.next_offset == 6
    assert forked == await expected(store, m, 6)
    _, dst_records = await read_all(store, DST)
    assert dst_records == []


async def test_no_fork_of_a_missing_log() -> None:
    store, _ = await source(2)
    with pytest.raises(LogNotFound) as e:
        await fork_log(store, "/logs/none/", DST)
    assert str(e.value) == "no log at 'logs/none'"
    assert target_keys(store) == set()


async def test_no_fork_onto_an_existing_log() -> None:
    store, _ = await source(2)
    theirs = Manifest.empty("theirs").to_bytes()
    store.store(DMAN, theirs)
    with pytest.raises(LogExists) as e:
        await fork_log(store, SRC, "/logs/dst/")
    assert str(e.value) == "a log already exists at 'logs/dst'"
    assert target_keys(store) == {DMAN} and store.objects[DMAN][0] == theirs


async def test_only_the_slashes_around_the_names_are_dropped() -> None:
    store, _ = await source(3)
    with pytest.raises(LogNotFound):
        await fork_log(store, "logs/srcX", DST)
    forked = await fork_log(store, "/logs/src/", "/logs/dstX/")
    loaded = await load_manifest(store, "logs/dstX")
    assert loaded is not None and loaded[0] == forked
    assert await load_manifest(store, DST) is None


# ------------------------------------------------------------------ the compaction cursor


async def test_the_compaction_cursor_may_stand_anywhere_in_the_forks_records() -> None:
    for offset in (8, 21):
        store, _ = await source()
        await fork_log(store, SRC, DST, from_offset=8, compaction_offset=offset)
        cursor = await CursorStore(store, DST, "x").load(COMPACTION)
        assert cursor is not None and cursor.cursor.offset == offset


@pytest.mark.parametrize("offset", [7, 22])
async def test_a_compaction_cursor_outside_the_records_is_refused(offset: int) -> None:
    store, _ = await source()
    with pytest.raises(ValueError) as e:
        await fork_log(store, SRC, DST, from_offset=8, compaction_offset=offset)
    assert str(e.value) == f"compaction offset {offset} is outside the fork's records [8, 21]"
    assert DMAN not in store.objects and DCURSOR not in store.objects


async def test_an_unclaimed_retry_replaces_the_cursor_it_left() -> None:
    store, _ = await source()
    await CursorStore(store, DST, "crashed").init(COMPACTION, 9)
    await fork_log(store, SRC, DST, from_offset=8, compaction_offset=12)
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None
    assert (cursor.cursor.offset, cursor.cursor.writer) == (12, "wal3-fork")


async def test_the_left_cursor_is_replaced_by_compare_and_swap() -> None:
    """The replacement names the etag it read: a cursor changed since is never overwritten."""
    store, _ = await source()
    await CursorStore(store, DST, "crashed").init(COMPACTION, 9)

    async def moved(_: str) -> None:
        store.store(DCURSOR, Cursor(offset=11, epoch_us=1, writer="another").to_bytes())

    store.before("put", "logs/dst/cursor/", moved)
    with pytest.raises(CursorConflict):
        await fork_log(store, SRC, DST, from_offset=8, compaction_offset=12)
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None and cursor.cursor.writer == "another"
    assert DMAN not in store.objects


async def test_no_cursor_without_a_compaction_offset() -> None:
    store, _ = await source()
    await fork_log(store, SRC, DST, from_offset=8)
    assert DCURSOR not in store.objects


# ------------------------------------------------------------------ copies and the commit


async def test_at_most_concurrency_copies_run_at_once() -> None:
    for concurrency, want in ((None, 16), (3, 3)):
        store, _ = await source()
        store.gate = asyncio.Event()
        kw: dict[str, Any] = {} if concurrency is None else {"concurrency": concurrency}
        task = asyncio.ensure_future(fork_log(store, SRC, DST, **kw))
        for _ in range(200):
            await asyncio.sleep(0)
        assert store.in_flight == want
        store.gate.set()
        await task
        assert store.most == want


async def test_an_unclaimed_fork_takes_what_is_at_a_copys_key_as_the_copy() -> None:
    """Without a claim the target is the caller's: an object already at a fragment's key (a
    retried fork's) is never compared."""
    store, m = await source()
    f = join(DST, m.fragments[-1].path)
    store.store(f, b"left by an earlier attempt")
    await fork_log(store, SRC, DST, from_offset=8)
    assert store.objects[f][0] == b"left by an earlier attempt"


async def test_an_unclaimed_fork_reads_its_split_snapshots_back_from_the_target() -> None:
    """A split snapshot is content-addressed: whatever is at its key is trusted as written, and
    the walk reads it from the target, so a damaged leftover fails the fork before its commit."""
    store, _ = await source()
    split = await split_keys(store)
    for k in split:
        store.store(k, b"{damaged")
    with pytest.raises((CorruptManifest, CorruptFragment)):
        await fork_log(store, SRC, DST, from_offset=8)
    assert DMAN not in store.objects


async def test_a_log_appearing_during_the_fork_wins() -> None:
    store, _ = await source(3)
    theirs = Manifest.empty("theirs").to_bytes()

    async def appear(_: str) -> None:
        store.store(DMAN, theirs)

    store.before("put", "logs/dst/manifest/MANIFEST$", appear)
    with pytest.raises(LogExists) as e:
        await fork_log(store, SRC, DST)
    assert str(e.value) == "a log appeared at 'logs/dst' during the fork"
    assert store.objects[DMAN][0] == theirs


# ------------------------------------------------------------------ a claimed fork


async def test_a_claimed_fork_writes_through_its_claim_and_keeps_it() -> None:
    """The claim is taken once the source is read, kept alive and left to the caller (still
    stored); the manifest put was sent, so the claim may still land."""
    store, m = await source()
    claims, acquire, _ = await acquire_for(store)
    forked = await fork_log(store, SRC, DST, from_offset=8, compaction_offset=10, acquire=acquire)
    [c] = claims
    assert forked == await expected(store, m, 8)
    assert c.commit_sent is True and c.may_still_land is True
    assert join(DST, CLAIM_PATH) in store.objects
    assert target_keys(store) == await reached(store, DST, forked) | {
        DMAN,
        DCURSOR,
        join(DST, CLAIM_PATH),
    }
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None and cursor.cursor.offset == 10


async def test_a_claimed_fork_counts_its_copies_in_flight() -> None:
    store, _ = await source()
    claims, acquire, _ = await acquire_for(store)
    store.gate = asyncio.Event()
    task = asyncio.ensure_future(fork_log(store, SRC, DST, acquire=acquire))
    for _ in range(200):
        await asyncio.sleep(0)
    [c] = claims
    assert store.in_flight == 16 and c.may_still_land is True and c.commit_sent is False
    store.gate.set()
    await task


async def test_no_claimed_fork_where_a_log_exists() -> None:
    store, _ = await source(2)

    async def acquire() -> Claim | None:
        return None

    with pytest.raises(LogExists) as e:
        await fork_log(store, SRC, "/logs/dst/", acquire=acquire)
    assert str(e.value) == "a log already exists at 'logs/dst'"
    assert target_keys(store) == set()


async def test_a_claimed_fork_refuses_a_foreign_copy() -> None:
    """An object other than our copy at a fragment's key, after the clean-up: ClaimLost, no
    commit, and the claim takes no more writes (a refused write: nothing may land)."""
    store, m = await source()
    claims, acquire, _ = await acquire_for(store)
    f = join(DST, m.fragments[-1].path)

    async def foreign(_: str) -> None:
        store.store(f, b"another attempt's")

    store.before("copy", "logs/dst/log/", foreign)
    with pytest.raises(ClaimLost):
        await fork_log(store, SRC, DST, from_offset=8, acquire=acquire)
    [c] = claims
    assert DMAN not in store.objects and store.objects[f][0] == b"another attempt's"
    assert c.may_still_land is False
    with pytest.raises(ClaimLost, match="a write failed"):
        await c.guard()


async def test_a_claimed_fork_refuses_a_foreign_split_snapshot() -> None:
    store, _ = await source()
    split = await split_keys(store)
    claims, acquire, _ = await acquire_for(store)

    async def foreign(_: str) -> None:
        for k in split:
            store.store(k, b"another attempt's")

    store.before("put", "logs/dst/snapshot/", foreign)
    with pytest.raises(ClaimLost):
        await fork_log(store, SRC, DST, from_offset=8, acquire=acquire)
    assert DMAN not in store.objects
    with pytest.raises(ClaimLost, match="a write failed"):
        await claims[0].guard()


async def test_a_claimed_fork_refuses_a_cursor_that_appeared() -> None:
    store, _ = await source()
    claims, acquire, _ = await acquire_for(store)

    async def foreign(_: str) -> None:
        await CursorStore(store, DST, "other").init(COMPACTION, 9)

    store.before("copy", "logs/dst/log/", foreign)
    with pytest.raises(ClaimLost) as e:
        await fork_log(store, SRC, DST, from_offset=8, compaction_offset=10, acquire=acquire)
    assert str(e.value) == "logs/dst: a compaction cursor appeared under our claim"
    cursor = await CursorStore(store, DST, "x").load(COMPACTION)
    assert cursor is not None and cursor.cursor.writer == "other"
    assert DMAN not in store.objects and claims[0].may_still_land is False


async def test_an_ambiguous_copy_may_still_land() -> None:
    store, _ = await source()
    claims, acquire, _ = await acquire_for(store)
    store.refuse("copy", "logs/dst/log/", StoreUnavailable("timeout"))
    with pytest.raises(StoreUnavailable):
        await fork_log(store, SRC, DST, acquire=acquire)
    assert claims[0].may_still_land is True and DMAN not in store.objects


async def test_an_ambiguous_manifest_put_keeps_the_claim() -> None:
    store, _ = await source(3)
    claims, acquire, _ = await acquire_for(store)
    store.refuse("put", "logs/dst/manifest/MANIFEST$", StoreUnavailable("timeout"), times=4)
    with pytest.raises(StoreUnavailable):
        await fork_log(store, SRC, DST, acquire=acquire)
    assert claims[0].commit_sent is True and claims[0].may_still_land is True


async def test_a_claim_given_up_before_the_commit_stops_the_fork() -> None:
    store, _ = await source(3)
    claims, acquire, _ = await acquire_for(store)

    async def before_commit(_: Manifest) -> None:
        await claims[0].release()

    with pytest.raises(ClaimLost):
        await fork_log(store, SRC, DST, acquire=acquire, before_commit=before_commit)
    assert DMAN not in store.objects
    assert claims[0].commit_sent is False


async def test_a_claim_taken_over_before_before_commit_stops_the_fork() -> None:
    """The guard before ``before_commit`` renews (a quarter TTL has passed since the cursor's)
    and finds the taker's claim: ``before_commit`` never runs."""
    store, _ = await source(3)
    _, acquire, clock = await acquire_for(store)
    called: list[Manifest] = []

    async def before_commit(forked: Manifest) -> None:
        called.append(forked)

    async def taken(_: str) -> None:
        store.store(join(DST, CLAIM_PATH), b'{"attempt":"taker"}')
        clock.advance(30.0)

    store.before("put", "logs/dst/cursor/", taken)
    with pytest.raises(ClaimLost, match="taken over"):
        await fork_log(
            store, SRC, DST, compaction_offset=2, acquire=acquire, before_commit=before_commit
        )
    assert called == [] and DMAN not in store.objects


# -------------------------------------------------------------------------------------------
# Mutants not killed here, all equivalent (no input tells them apart):
#
# * ``fork_log``'s ``CursorStore(store, source, None)`` for the default fork point: a cursor
#   store's writer name is only stamped into cursors it writes; ``load`` never reads it.
# * ``_fork_into``'s ``SnapshotCache(257)``: the cache only saves reads of immutable snapshots
#   (split ones are read back from the target whatever it holds); a capacity of 256 or 257
#   differs only in how many gets a log of more than 256 snapshots costs.
# * ``garbage.apply(m, None)``: ``apply`` puts its writer only on the manifest it returns, and
#   the fork builds its own from that one's fields with ``writer=writer_name``.
# * ``Manifest(...)`` without ``sealed=False``: False is the field's default.
