"""Adversarial review of 2346d84 (``VerifiedCut.edit`` undoes a writer's snapshot rolls of the
verified prefix, ``wal3.gc._unrolled``).

Passing tests pin behaviour checked to be safe: rolls of dropped snapshots together with the
straddler, rolls reaching into what the plan keeps, misordered or duplicated pointers, a forged
roll with another setsum, a cursor pinned between the plan and the cut, a crash-resumed plan over
a rolled root, and a whole collection (phase 3 and the orphan sweep) under a rolling writer,
after which every record from the pinned cursor still reads back and every object the manifest
reaches exists.  The one case the review found wrong (rolls of removed and kept fragments
together discarded the plan) is fixed: ``Garbage.apply`` takes the unrolled root as it stands.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import LocalStore, LogReader
from wal3.cursors import CursorStore
from wal3.errors import GarbageRejected
from wal3.gc import GarbageCollector, GcOptions, GcReport, live_snapshot_paths, verify_cut
from wal3.layout import load_manifest
from wal3.manifest import Manifest, Snapshot
from wal3.paths import MANIFEST_PATH, join
from wal3.reader import SnapshotCache
from wal3.setsum import Setsum
from wal3.store import ensure_object, put_resolving

from .test_gc_liveness import PREFIX, RollingWriter, _Clock, _log, _manifest

GRACE = 10.0


def _gc(store: LocalStore, editor, clock: _Clock) -> GarbageCollector:  # type: ignore[no-untyped-def]
    return GarbageCollector(
        store,
        PREFIX,
        GcOptions(grace_s=GRACE, retain_fragments=0, retain_s=0.0, max_fraction=1.0),
        edit_manifest=editor,
        clock=clock,
    )


async def _install_roll(store: LocalStore, kids: list) -> Snapshot:  # type: ignore[type-arg]
    """Roll ``kids`` (consecutive root pointers) into a snapshot in the stored manifest."""
    loaded = await load_manifest(store, PREFIX)
    assert loaded is not None
    m, etag = loaded
    snap = Snapshot.build(kids, "w")
    await ensure_object(store, join(PREFIX, snap.path), snap.to_bytes())
    rolled = m.with_snapshot(snap, "w")
    assert rolled is not None
    await put_resolving(store, join(PREFIX, MANIFEST_PATH), rolled.to_bytes(), if_match=etag)
    return snap


async def _snapshotted_log(root: Path, pin: int) -> LocalStore:
    """24 one-record fragments; the root is [S_a(f1-4), S_b(f5-8), S_c(f9-12), f13..f24];
    a reader cursor at ``pin`` (inside S_b for 5 < pin < 9: S_b straddles the cut)."""
    store = await _log(root, 24)
    m = await _manifest(store)
    for _ in range(3):
        m = await _manifest(store)
        await _install_roll(store, list(m.fragments[:4]))
    m = await _manifest(store)
    assert [s.depth for s in m.snapshots] == [1, 1, 1], m.snapshots
    await CursorStore(store, PREFIX, "t").init("reader", pin)
    return store


def _roll(m: Manifest, kids: tuple) -> Manifest:  # type: ignore[type-arg]
    rolled = m.with_snapshot(Snapshot.build(list(kids), "w"), "w")
    assert rolled is not None
    return rolled


async def _plan(store: LocalStore, clock: _Clock):  # type: ignore[no-untyped-def]
    gc = _gc(store, RollingWriter(store), clock)
    g, _ = await gc._phase1(GcReport(), None)
    assert g is not None
    m = await _manifest(store)
    return g, m, await verify_cut(store, PREFIX, g, m)


async def _reachable_objects_exist(store: LocalStore, m: Manifest) -> None:
    """Every snapshot and fragment the manifest reaches (transitively) is in the store."""
    paths = await live_snapshot_paths(store, PREFIX, m, SnapshotCache(64))
    for p in paths:
        await store.get(join(PREFIX, p))
    reader = await LogReader.open(store, PREFIX)
    await reader.read(m.oldest_offset)


async def _check_log(store: LocalStore, pin: int) -> Manifest:
    m = await _manifest(store)
    assert m.oldest_offset <= pin
    total = sum((e.setsum for e in m.entries), Setsum.zero()) + m.collected
    assert total == m.setsum
    await _reachable_objects_exist(store, m)
    reader = await LogReader.open(store, PREFIX)
    got = await reader.read(pin)
    assert [r.body for r in got] == [f"r{i}".encode() for i in range(pin, m.next_offset)]
    return m


# ------------------------------------------------------------------- the straddler and rolls


def test_a_roll_of_a_dropped_snapshot_with_the_straddler_cuts_as_verified(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        g, m, cut = await _plan(store, _Clock())
        assert g.snapshot_for_root is not None  # S_b straddles offset 7
        assert cut.removed == m.snapshots[:2]
        fn = cut.edit(g, "gc")
        expect = fn(m)
        # The writer rolls [S_a, S_b] (same depth): the straddler is inside the roll.
        rolled = _roll(m, m.snapshots[:2])
        got = fn(rolled)
        assert got.entries == expect.entries
        assert got.collected == expect.collected
        # A roll of the straddler with the kept S_c reaches past the plan: refused.
        with pytest.raises(GarbageRejected):
            fn(_roll(m, m.snapshots[1:3]))
        # A roll of all three: refused (it holds kept records the unrolled cut would lose).
        with pytest.raises(GarbageRejected):
            fn(_roll(m, m.snapshots[:3]))

    asyncio.run(go())


def test_a_forged_roll_with_equal_range_and_bytes_but_other_setsum_is_refused(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        g, m, cut = await _plan(store, _Clock())
        fn = cut.edit(g, "gc")
        rolled = _roll(m, m.snapshots[:2])
        ptr = rolled.snapshots[0]
        forged = replace(
            rolled,
            snapshots=(
                replace(ptr, setsum=ptr.setsum + m.fragments[0].setsum),
                *rolled.snapshots[1:],
            ),
        )
        with pytest.raises(GarbageRejected):
            fn(forged)

    asyncio.run(go())


def test_misordered_or_duplicated_pointers_are_refused(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        g, m, cut = await _plan(store, _Clock())
        fn = cut.edit(g, "gc")
        s_a, s_b, s_c = m.snapshots
        # swapped verified pointers
        with pytest.raises(GarbageRejected):
            fn(replace(m, snapshots=(s_b, s_a, s_c)))
        # a verified pointer twice, the roll of it in front
        roll = Snapshot.build([s_a, s_b], "w").to_pointer()
        with pytest.raises(GarbageRejected):
            fn(replace(m, snapshots=(roll, s_a, s_b, s_c)))
        # the roll in the kept part of the root, verified pointers in front
        with pytest.raises(GarbageRejected):
            fn(replace(m, snapshots=(s_a, roll, s_c)))
        # a verified pointer missing
        with pytest.raises(GarbageRejected):
            fn(replace(m, snapshots=(s_b, s_c)))

    asyncio.run(go())


def test_a_roll_pointer_equal_to_a_verified_one_elsewhere_is_refused(tmp_path: Path) -> None:
    """``e in removed``: a verified pointer out of place is never read as a roll."""

    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        g, m, cut = await _plan(store, _Clock())
        fn = cut.edit(g, "gc")
        _s_a, s_b, s_c = m.snapshots
        with pytest.raises(GarbageRejected):
            fn(replace(m, snapshots=(s_b, s_c)))

    asyncio.run(go())


# --------------------------------------------------------------- cursor between plan and cut


def test_a_cursor_pinned_between_plan_and_rolled_cut_stops_the_cut(tmp_path: Path) -> None:
    """The floor dance still holds with rolls: a pin below the plan's cut made after the floor
    (retracting it) or before it (seen by the re-read) means no cut, whatever the roll."""

    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        clock = _Clock()
        editor = RollingWriter(store, fragment_threshold=2, snapshot_threshold=2)
        gc = _gc(store, editor, clock)
        g, _ = await gc._phase1(GcReport(), None)
        assert g is not None
        before = await _manifest(store)
        # An emergency cursor at 2 written after the plan (pin_cursor itself answers 410 while
        # a plan is pending above it; a cursor written straight to the store is what the floor's
        # re-read of the cursors must still see, rolls or not).
        await CursorStore(store, PREFIX, "t").init("emergency", 2)
        report = await gc.run_once(sweep_orphans=False)
        assert report.phase in ("discarded", "busy"), (report.phase, report.notes)
        m = await _manifest(store)
        assert m.oldest_offset == before.oldest_offset
        await _check_log(store, 2)

    asyncio.run(go())


# ------------------------------------------------------------ whole passes, rolling writer


@pytest.mark.parametrize("pin", [3, 5, 6, 7, 9, 13, 20])
def test_whole_collection_under_a_rolling_writer_keeps_every_pinned_record(
    tmp_path: Path, pin: int
) -> None:
    """Phase 1-3 and the orphan sweep, many passes, the writer rolling on every collector edit
    (fragments and same-depth snapshots, so rolls of rolls and rolls with the straddler): after
    every pass the manifest balances, everything it reaches exists, and the records from the
    pinned cursor read back."""

    async def go() -> None:
        store = await _snapshotted_log(tmp_path, pin)
        clock = _Clock()
        editor = RollingWriter(store, fragment_threshold=2, snapshot_threshold=2)
        phases = []
        for _ in range(12):
            report = await _gc(store, editor, clock).run_once()
            phases.append(report.phase)
            await _check_log(store, pin)
            clock.now += GRACE + 1
        m = await _check_log(store, pin)
        assert m.oldest_offset <= pin
        assert editor.rolls > 0

    asyncio.run(go())


def test_crash_between_phases_then_a_roll_resumes_safely(tmp_path: Path) -> None:
    """A plan computed (phase 1), the process dies, the writer rolls the verified prefix, a new
    collector resumes: either it cuts as verified or discards; never loses a pinned record."""

    async def go() -> None:
        store = await _snapshotted_log(tmp_path, 7)
        clock = _Clock()
        gc = _gc(store, RollingWriter(store), clock)
        g, _ = await gc._phase1(GcReport(), None)
        assert g is not None
        m = await _manifest(store)
        await _install_roll(store, list(m.snapshots[:2]))
        for _ in range(4):
            report = await _gc(store, RollingWriter(store), clock).run_once()
            await _check_log(store, 7)
            clock.now += GRACE + 1
        assert report.phase in ("done", "waiting", "applied", "discarded", "computed"), report

    asyncio.run(go())


# ------------------------------------------------------------------------------ findings


def test_rolls_of_removed_and_kept_fragments_together_still_cut(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _log(tmp_path, 24)
        await CursorStore(store, PREFIX, "t").init("reader", 5)
        g, m, cut = await _plan(store, _Clock())
        assert cut.removed == m.fragments[:4]
        fn = cut.edit(g, "gc")
        expect = fn(m)
        r = m
        for _ in range(3):  # three writes of the writer, each rolling two fragments
            r = _roll(r, r.fragments[:2])
        assert len(r.snapshots) == 3
        got = fn(r)
        assert got.oldest_offset == expect.oldest_offset
        assert got.collected == expect.collected

    asyncio.run(go())


def test_apply_refuses_a_given_root_it_would_leave_out_of_order(tmp_path: Path) -> None:
    """``Garbage.apply`` over an unrolled root never re-sorts it: a kept fragment before a kept
    snapshot is refused, not silently moved behind it."""

    async def go() -> None:
        store = await _log(tmp_path, 24)
        await CursorStore(store, PREFIX, "t").init("reader", 3)
        g, m, _ = await _plan(store, _Clock())
        f = m.fragments
        assert g.first_to_keep == 3  # drops f1, f2; keeps f3 onwards
        kept_roll = _roll(m, f[3:5]).snapshots[0]  # a roll of f4, f5
        good = g.apply(m, "gc", entries=(*f[:3], *f[3:]))
        assert good.entries == m.entries[2:]
        with pytest.raises(GarbageRejected, match="out of order"):
            g.apply(m, "gc", entries=(*f[:3], kept_roll, *f[5:]))

    asyncio.run(go())
