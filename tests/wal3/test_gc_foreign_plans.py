"""Garbage plans and markers written by someone else, and logs at the top of u64 (issue 16).

``gc/GARBAGE`` is shared with Rust wal3 and with older versions of ours, so phase 2 and phase 3
take nothing in it on trust: a plan's tree is read and compared leaf by leaf before it is
applied, and the grace interval runs from this process's own observation, never from a time
stamped in the file.  Each test names the finding of the 2026-11-23 adversarial review it pins
(they were reproductions under verify/repro/ and printed VIOLATION before the fix).
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import (
    CorruptFragment,
    LocalStore,
    LogReader,
    LogWriter,
    LogWriterOptions,
)
from wal3.errors import CorruptManifest, LogFull, ObjectNotFound
from wal3.fragment import fragment_path
from wal3.gc import EMPTY_GARBAGE, GarbageCollector, GcOptions, plan_cut
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import (
    MANIFEST_PATH,
    U64_MAX,
    FragmentPointer,
    Manifest,
    Snapshot,
    SnapshotPointer,
)
from wal3.reader import SnapshotCache
from wal3.scrub import scrub_log
from wal3.setsum import Setsum

from .helpers import assert_dense, read_all, twelve_record_log


class Clock:
    """A settable clock (seconds), used as the collector's wall and monotonic time."""

    def __init__(self, now: float = 2_000_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def _log(tmp_path: Path, prefix: str, cursor: int) -> tuple[LocalStore, Manifest]:
    """:func:`twelve_record_log` in ``tmp_path / "store"``."""
    return await twelve_record_log(tmp_path / "store", prefix, cursor)


def _rust_plan(
    drop: list[SnapshotPointer],
    make: list[Snapshot],
    root: SnapshotPointer | None,
    start: int,
    limit: int,
    discard: Setsum,
    first_to_keep: int,
) -> bytes:
    """A plan as Rust's serde writes it: no created_us, no applied_us."""
    return (
        b'{"snapshots_to_drop":['
        + b",".join(p.json_bytes() for p in drop)
        + b'],"snapshots_to_make":['
        + b",".join(s.to_bytes() for s in make)
        + b'],"snapshot_for_root":'
        + (b"null" if root is None else root.json_bytes())
        + b',"fragments_to_drop_start":%d,"fragments_to_drop_limit":%d,' % (start, limit)
        + b'"fragments_are_uuids":false,"setsum_to_discard":"%s",' % (discard.hexdigest().encode())
        + b'"first_to_keep":{"offset":%d}}' % first_to_keep
    )


async def _bodies_from(store: LocalStore, prefix: str, offset: int) -> list[bytes]:
    return [r.body for r in await LogReader(store, prefix).read(offset)]


async def _fragments_present(store: LocalStore, prefix: str, seqs: range) -> list[int]:
    present = []
    for s in seqs:
        try:
            await store.head(join(prefix, fragment_path(s)))
            present.append(s)
        except ObjectNotFound:
            pass
    return present


# Finding b2: a Rust-shaped plan with a lying root snapshot ---------------------------------


@pytest.mark.parametrize("where", ["in_plan", "in_store", "ours_shaped"])
async def test_a_foreign_plan_whose_new_root_lies_about_its_leaves_is_rejected(
    tmp_path: Path, where: str
) -> None:
    """Finding b2 (verify/repro/b2_rust_shaped_forged_root.py): a Rust-shaped plan (no
    created_us) whose ``snapshot_for_root`` is a snapshot holding fragment 4's pointer relabelled
    as [2, 5).  It is internally consistent, matches its pointer, balances, and its first_to_keep
    (2) is below the compaction cursor (3); phase 2 used to apply it and phase 3 then deleted
    fragments 1-3, offset 3 (at the cursor) included.  Phase 2 must compare the new root's leaves
    with the log's and reject the plan, whether the lying snapshot comes in the plan or already
    sits in the store (where a create-only install would keep it).  A plan shaped like ours
    (``created_us`` set, as an older version of ours writes it) is no more trusted."""
    p = "logs/b2"
    store, m = await _log(tmp_path, p, cursor=3)
    s1 = m.snapshots[0]
    f4 = (await SnapshotCache().get(store, p, s1)).fragments[3]
    liar = FragmentPointer(f4.path, f4.seq_no, 2, 5, f4.num_bytes, f4.setsum)
    t = Snapshot.build([liar], "garbage collection")
    t.check()  # consistent on its own: only the leaves give it away
    if where != "in_plan":
        await store.put(join(p, t.path), t.to_bytes())
    plan = _rust_plan([s1], [t], t.to_pointer(), 1, 4, s1.setsum - t.setsum, 2)
    if where == "ours_shaped":
        plan = plan[:-1] + b',"created_us":1}'
    await store.put(join(p, GARBAGE_PATH), plan)
    clock = Clock()
    gc = GarbageCollector(store, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    report = await gc.run_once()
    assert report.phase == "discarded", report.notes
    assert any("leaf" in n or "leaves" in n for n in report.notes), report.notes
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].to_bytes() == m.to_bytes()  # nothing applied
    assert (await store.get(join(p, GARBAGE_PATH))).data == EMPTY_GARBAGE
    if where == "in_plan":  # a rejected plan installs nothing
        with pytest.raises(ObjectNotFound):
            await store.head(join(p, t.path))
    # Collection goes on with our own plan, which never passes the cursor.
    for _ in range(4):
        clock.now += 61
        await gc.run_once()
    assert await _fragments_present(store, p, range(3, 13)) == list(range(3, 13))
    assert await _bodies_from(store, p, 3) == [f"r{i}".encode() for i in range(3, 13)]
    assert (await scrub_log(store, p)).ok


async def test_a_foreign_plan_listing_a_snapshot_it_does_not_unlink_deletes_nothing_live(
    tmp_path: Path,
) -> None:
    """Finding b2, phase 3's half: a plan is data, and its ``snapshots_to_drop`` may name any
    snapshot with any claimed range.  Phase 3 deletes a listed snapshot only when the stored
    object itself starts below the cut and nothing references it, so a writer's snapshot that
    is about to be linked (or any object above the cut) survives a lying pointer."""
    p = "logs/b2c"
    store, m = await _log(tmp_path, p, cursor=6)
    pending = Snapshot.build(list(m.fragments[:3]), "w")  # a writer's upload, not yet linked
    await store.put(join(p, pending.path), pending.to_bytes())
    clock = Clock()
    gc = GarbageCollector(store, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    obj = json.loads((await store.get(join(p, GARBAGE_PATH))).data)
    lie = replace(pending.to_pointer(), start=1)
    obj["snapshots_to_drop"].append(json.loads(lie.json_bytes()))
    await store.put(join(p, GARBAGE_PATH), json.dumps(obj).encode())
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    await store.head(join(p, pending.path))


# Finding e: a foreign applied_us ----------------------------------------------------------


async def _applied_elsewhere(
    tmp_path: Path, p: str, applied_us: int | None
) -> tuple[LocalStore, Manifest]:
    """Another implementation plans and applies a cut at 10 and leaves the file marked
    ``applied_us``; returns the manifest from before (what a reader may still hold)."""
    store, _ = await _log(tmp_path, p, cursor=10)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    m0, etag = loaded

    async def put(s: Snapshot) -> None:
        await store.put(join(p, s.path), s.to_bytes())

    g = await plan_cut(store, p, m0, 10, SnapshotCache(), "rust", put, keep_tail=True)
    assert g is not None
    await store.put(join(p, MANIFEST_PATH), g.apply(m0, "rust").to_bytes(), if_match=etag)
    marked = replace(g, created_us=None, applied_us=applied_us)
    await store.put(join(p, GARBAGE_PATH), marked.to_bytes())
    return store, m0


async def test_a_foreign_applied_us_does_not_shorten_the_grace(tmp_path: Path) -> None:
    """Finding e (verify/repro/e_forged_applied_us.py): the plan file said ``applied_us`` = 1
    (1970), so phase 3 deleted at once, under a reader holding the manifest from before the
    cut.  The grace interval must run from when this process first saw the plan applied."""
    p = "logs/e"
    store, m0 = await _applied_elsewhere(tmp_path, p, applied_us=1)
    reader = LogReader(store, p)
    clock = Clock()
    gc = GarbageCollector(store, p, GcOptions(grace_s=300, retain_fragments=0), clock=clock)
    r = await gc.run_once()
    assert r.phase == "waiting" and (r.fragments_deleted, r.snapshots_deleted) == (0, 0)
    assert [x.body for x in await reader.read(1, manifest=m0)] == [
        f"r{i}".encode() for i in range(1, 13)
    ]
    clock.now += 299
    assert (await gc.run_once()).phase == "waiting"
    clock.now += 2
    r = await gc.run_once()
    assert r.phase == "done" and r.fragments_deleted > 0
    with pytest.raises(CorruptFragment):
        await reader.read(1, manifest=m0)  # now it may go: the grace has passed
    assert await _bodies_from(store, p, 10) == [f"r{i}".encode() for i in range(10, 13)]


async def test_a_far_future_applied_us_does_not_wedge_phase_three(tmp_path: Path) -> None:
    """Finding e, the other direction: a time stamp from the future in the file must not hold
    phase 3 back either; the value is not read at all."""
    p = "logs/e2"
    store, _ = await _applied_elsewhere(tmp_path, p, applied_us=U64_MAX)
    clock = Clock()
    gc = GarbageCollector(store, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    clock.now += 61
    assert (await gc.run_once()).phase == "done"


async def test_the_grace_runs_on_monotonic_time_not_the_wall_clock(tmp_path: Path) -> None:
    """Finding e, clock jumps: a wall clock stepped forward by a day does not end the grace
    early; only monotonic time (here injected) counts within a process."""
    p = "logs/e3"
    store, _ = await _log(tmp_path, p, cursor=10)
    wall, mono = Clock(), Clock(now=500.0)
    gc = GarbageCollector(
        store, p, GcOptions(grace_s=60, retain_fragments=0), clock=wall, monotonic=mono
    )
    assert (await gc.run_once()).phase == "waiting"
    wall.now += 86_400
    assert (await gc.run_once()).phase == "waiting"
    mono.now += 61
    assert (await gc.run_once()).phase == "done"


async def test_a_marker_on_a_plan_the_manifest_does_not_hold_is_not_trusted(tmp_path: Path) -> None:
    """Finding e, the marker itself: a file marked applied whose plan is not in the manifest
    (marked before applying, or never applied) is resumed as pending: phase 2 verifies and
    applies it, and the grace runs from then, whatever the marker says (here: 1970).  Before,
    phase 3 raised GarbageRejected on it for ever."""
    p = "logs/e4"
    store, _ = await _log(tmp_path, p, cursor=10)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    m0 = loaded[0]

    async def put(s: Snapshot) -> None:
        await store.put(join(p, s.path), s.to_bytes())

    g = await plan_cut(store, p, m0, 10, SnapshotCache(), "rust", put, keep_tail=True)
    assert g is not None
    await store.put(join(p, GARBAGE_PATH), replace(g, created_us=None, applied_us=1).to_bytes())
    clock = Clock()
    gc = GarbageCollector(store, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    r = await gc.run_once()
    assert r.phase == "applied" and r.fragments_deleted == 0, r.notes
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == g.first_to_keep  # we applied it
    assert (await gc.run_once()).phase == "waiting"
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    assert await _bodies_from(store, p, g.first_to_keep) == [
        f"r{i}".encode() for i in range(g.first_to_keep, 13)
    ]


async def test_a_new_process_waits_unless_the_store_clock_shows_the_grace_passed(
    tmp_path: Path,
) -> None:
    """Finding e, across restarts: a collector that did not see the plan applied measures the
    grace by the store's own clock (the manifest's Last-Modified minus the applied file's), or
    else from its own first sight; never by the file's time stamp."""
    p = "logs/e5"
    await _applied_elsewhere(tmp_path, p, applied_us=1)
    clock = Clock()
    # A fresh process (a fresh store object: nothing observed) with the manifest untouched since.
    fresh = LocalStore(tmp_path / "store")
    gc = GarbageCollector(fresh, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    # The log moves on: its manifest is written (per the store's clock) 61 s after the marker.
    gpath = tmp_path / "store" / p / GARBAGE_PATH
    st = os.stat(gpath)
    os.utime(gpath, (st.st_atime - 63, st.st_mtime - 63))
    other = LocalStore(tmp_path / "store")
    gc2 = GarbageCollector(other, p, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc2.run_once()).phase == "done"


# Finding k: u64 overflow ------------------------------------------------------------------


U = U64_MAX


async def test_appends_past_u64_are_refused_and_the_manifest_stays_readable(tmp_path: Path) -> None:
    """Finding k (verify/repro/k_u64_overflow.py): a (Rust-readable) manifest near the top of
    u64 took appends until a fragment's ``seq_no`` was 2^64, and the manifest written then could
    be read by nobody (Rust's serde, our parser): the log was bricked by an ordinary append.
    The last sequence number (u64::MAX) is still usable; the append after it fails with the
    typed LogFull, and the stored manifest keeps parsing."""
    p = "logs/k"
    store = LocalStore(tmp_path / "store")
    m = Manifest(writer="rust", initial_offset=U - 2, initial_seq_no=U - 1)
    await store.put(join(p, MANIFEST_PATH), m.to_bytes(), if_none_match="*")
    w = await LogWriter.open(store, p, LogWriterOptions(writer_name="w"))
    assert (await w.append(b"a")).offset == U - 2
    assert (await w.append(b"b")).offset == U - 1  # seq_no u64::MAX, limit u64::MAX
    with pytest.raises(LogFull):
        await w.append(b"c")
    await w.close()
    raw = (await store.get(join(p, MANIFEST_PATH))).data
    stored = Manifest.from_bytes(raw)
    assert stored.next_offset == U and stored.fragments[-1].seq_no == U
    assert all(0 <= n <= U for n in _ints(json.loads(raw)))
    _, records = await read_all(store, p)
    assert_dense(records, U - 2)
    assert [r.body for r in records] == [b"a", b"b"]


def _ints(obj: object) -> list[int]:
    if isinstance(obj, bool):
        return []
    if isinstance(obj, int):
        return [obj]
    if isinstance(obj, dict):
        return [n for v in obj.values() for n in _ints(v)]
    if isinstance(obj, list):
        return [n for v in obj for n in _ints(v)]
    return []


def test_a_manifest_refuses_fragments_past_u64_before_anything_is_written() -> None:
    """Finding k, at the manifest: adding a fragment whose limit or sequence number does not
    fit u64 raises LogFull (a LogSealed: the log takes no more appends), and ``check`` refuses
    any in-memory manifest holding such a value, so none is ever encoded."""
    m = Manifest(writer="x", initial_offset=U - 1, initial_seq_no=U)
    ok = FragmentPointer(fragment_path(U), U, U - 1, U, 10, Setsum.of(b"a"))
    full = m.with_fragments([ok], "x")
    full.check()
    with pytest.raises(LogFull):
        full.with_fragments([FragmentPointer("log/x", U + 1, U, U + 1, 10, Setsum.of(b"b"))], "x")
    m2 = Manifest(writer="x", initial_offset=U - 1, initial_seq_no=5)
    with pytest.raises(LogFull):
        m2.with_fragments(
            [FragmentPointer(fragment_path(5), 5, U - 1, U + 1, 10, Setsum.of(b"c"))], "x"
        )
    bad = replace(full, acc_bytes=U + 1)
    with pytest.raises(CorruptManifest):
        bad.check()
