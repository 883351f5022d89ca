"""GC makes progress while the log's writer keeps rolling snapshots (seed 8007 of the long
simulation run at 9f01525).

The server's collector edits the manifest through the log's writer, and the writer links its
pending snapshot in the very write that applies an edit (``LogWriter._write_manifest``: the
snapshot first, then the edits), planning the next one as each write lands.  So while the root
has a backlog of fragments (or runs of same-depth snapshots) to roll, every collector edit (the
pending floor, the cut, the clear of a discard) rolls some of the oldest root pointers, exactly
the ones the plan removes, and the cut found "the log's oldest pointers changed since the plan
was verified": each pass was discarded until the backlog ran out (in seed 8007, for the whole
liveness budget).  A roll changes no leaf: the cut now undoes it (the roll's pointer must have
the range, bytes and setsum of the run of verified pointers it stands for) and cuts as verified.
Anything else that changed the prefix is still refused.

The writer here is modelled by an editor that does what the writer's manifest write does
(deterministic: no background task to race), so the test does not depend on the writer's
options or timing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import LocalStore, LogReader, LogWriter
from wal3.cursors import CursorStore
from wal3.errors import GarbageRejected
from wal3.gc import GarbageCollector, GcOptions, GcReport, verify_cut
from wal3.layout import load_manifest
from wal3.manifest import Manifest, Snapshot, SnapshotPointer, plan_snapshot
from wal3.paths import MANIFEST_PATH, join
from wal3.store import ensure_object, put_resolving

PREFIX = "log"
GRACE = 10.0


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class RollingWriter:
    """A manifest editor that behaves like ``LogWriter._write_manifest`` with a snapshot always
    pending: each write first links a snapshot of the root's oldest pointers (``plan_snapshot``,
    uploaded before it is linked), then applies the edit, then compare-and-swaps.  An edit that
    raises is answered with its error, and the roll is written all the same (as the writer
    does)."""

    def __init__(
        self, store: LocalStore, *, fragment_threshold: int = 2, snapshot_threshold: int = 2
    ):
        self.store = store
        self.fragment_threshold = fragment_threshold
        self.snapshot_threshold = snapshot_threshold
        self.rolls = 0

    async def __call__(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        loaded = await load_manifest(self.store, PREFIX)
        assert loaded is not None
        m, etag = loaded
        base = m
        snap = plan_snapshot(
            m,
            fragment_threshold=self.fragment_threshold,
            snapshot_threshold=self.snapshot_threshold,
            writer="w",
        )
        if snap is not None:
            await ensure_object(self.store, join(PREFIX, snap.path), snap.to_bytes())
            rolled = m.with_snapshot(snap, "w")
            if rolled is not None:
                base = rolled
                self.rolls += 1
        err: BaseException | None = None
        try:
            new = fn(base)
        except Exception as e:  # the writer answers the edit and still writes the roll
            err, new = e, base
        if new is not m:
            await put_resolving(
                self.store, join(PREFIX, MANIFEST_PATH), new.to_bytes(), if_match=etag
            )
        if err is not None:
            raise err
        return new


async def _log(root: Path, records: int) -> LocalStore:
    """A log of ``records`` one-record fragments, all in the root (the writer's default
    thresholds roll nothing this small), and a compaction cursor at its tail."""
    store = LocalStore(root)
    w = await LogWriter.open(store, PREFIX)
    for i in range(records):
        await w.append(f"r{i + 1}".encode())
    tail = w.manifest.next_offset
    await w.close()
    await CursorStore(store, PREFIX, "t").init("compaction", tail)
    return store


def _collector(store: LocalStore, editor: RollingWriter, clock: _Clock) -> GarbageCollector:
    return GarbageCollector(
        store,
        PREFIX,
        GcOptions(grace_s=GRACE, retain_fragments=0, retain_s=0.0),
        edit_manifest=editor,
        clock=clock,
    )


async def _manifest(store: LocalStore) -> Manifest:
    loaded = await load_manifest(store, PREFIX)
    assert loaded is not None
    return loaded[0]


def test_a_pass_cuts_while_the_writer_rolls_the_pointers_it_removes(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _log(tmp_path, 24)
        editor, clock = RollingWriter(store), _Clock()
        gc = _collector(store, editor, clock)
        report = await gc.run_once()
        # Before the fix: "discarded" (the floor's write and the cut's each rolled two of the
        # fragments the plan removes).  Applied, the pass goes on to wait out the grace.
        assert report.phase == "waiting", (report.phase, report.notes)
        assert editor.rolls >= 2
        m = await _manifest(store)
        assert m.gc_floor is None
        assert m.oldest_offset > 1
        # Nothing at or above the cut was lost: every record from it on reads back.
        reader = await LogReader.open(store, PREFIX)
        got = await reader.read(m.oldest_offset)
        assert [r.body for r in got] == [
            f"r{i}".encode() for i in range(m.oldest_offset, m.next_offset)
        ]

    asyncio.run(go())


def test_gc_reaches_the_cutoff_while_the_writer_keeps_rolling(tmp_path: Path) -> None:
    """The liveness the simulator checks: with the cursor at the tail, a few passes take the
    log down to its last fragment (the one the collector always keeps), however busy the
    writer's snapshotting; before the fix the first passes were all discarded."""

    async def go() -> None:
        store = await _log(tmp_path, 24)
        editor, clock = RollingWriter(store), _Clock()
        phases = []
        for _ in range(6):
            report = await _collector(store, editor, clock).run_once()
            phases.append(report.phase)
            clock.now += GRACE + 1
            m = await _manifest(store)
            if m.oldest_offset >= m.fragments[-1].start:
                break
        assert "discarded" not in phases, phases
        m = await _manifest(store)
        assert m.oldest_offset == m.fragments[-1].start, phases
        reader = await LogReader.open(store, PREFIX)
        got = await reader.read(m.oldest_offset)
        assert [r.body for r in got] == [f"r{m.next_offset - 1}".encode()]

    asyncio.run(go())


# ------------------------------------------------------- what the cut still refuses


async def _verified(store: LocalStore, clock: _Clock):  # type: ignore[no-untyped-def]
    """A plan computed and stored by phase 1 (no edit yet), and its proof against the
    manifest as it stands."""
    gc = _collector(store, RollingWriter(store), clock)
    g, _ = await gc._phase1(GcReport(), None)
    assert g is not None
    m = await _manifest(store)
    return g, m, await verify_cut(store, PREFIX, g, m)


def _roll(m: Manifest, n: int, skip: int = 0) -> tuple[Manifest, Snapshot]:
    """``m`` with root pointers ``skip`` … ``skip + n - 1`` rolled into one snapshot."""
    kids = list(m.entries[skip : skip + n])
    snap = Snapshot.build(kids, "w")
    rolled = m.with_snapshot(snap, "w")
    assert rolled is not None
    return rolled, snap


def test_the_cut_undoes_rolls_of_the_verified_prefix_only(tmp_path: Path) -> None:
    async def go() -> None:
        store = await _log(tmp_path, 12)
        g, m, cut = await _verified(store, _Clock())
        fn = cut.edit(g, "gc")
        expect = fn(m)
        # A roll of verified pointers, and a roll of that roll with the next one: the same cut.
        once, _ = _roll(m, 2)
        assert fn(once).entries == expect.entries
        twice, _ = _roll(_roll(once, 2, skip=1)[0], 2)
        assert twice.snapshots[0].depth == 2
        assert fn(twice).entries == expect.entries
        assert fn(twice).collected == expect.collected
        # A roll reaching past what the plan removes (into what it keeps) is refused.
        n = len(cut.removed)
        with pytest.raises(GarbageRejected, match="oldest pointers changed"):
            fn(_roll(m, n + 1)[0])
        # A pointer standing for the run by range and bytes but with another setsum (another
        # content) is refused.
        rolled, _ = _roll(m, 2)
        ptr = rolled.snapshots[0]
        other = m.entries[2].setsum
        forged = replace(
            rolled,
            snapshots=(replace(ptr, setsum=ptr.setsum + other), *rolled.snapshots[1:]),
        )
        assert isinstance(forged.snapshots[0], SnapshotPointer)
        with pytest.raises(GarbageRejected):
            fn(forged)
        # A verified pointer gone (not rolled: replaced by something else) is refused.
        with pytest.raises(GarbageRejected):
            fn(replace(m, fragments=m.fragments[1:]))

    asyncio.run(go())
