"""Adversarial review of wal3 GC after c67aa86 (verified phase 2, observed grace, Rust plans).

Each test reproduced one finding (marked ``xfail(strict=True)`` until it was fixed): it asserts
what the design promises, and failed on the reviewed code for the stated reason.  Interleavings are
forced with ``GateStore`` (events, never sleeps); grace intervals pass on injected clocks;
"a day ago" on the local store is an mtime moved back (what S3 reports as Last-Modified).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from pathlib import Path

import pytest

from wal3 import LocalStore, LogReader, LogWriter, LogWriterOptions
from wal3.cursors import CursorStore
from wal3.errors import LogPurged, SimulatedCrash
from wal3.faulty import FaultRule, FaultyStore
from wal3.gc import EMPTY_GARBAGE, GarbageCollector, GcOptions, pin_cursor
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import MANIFEST_PATH, Manifest

from .helpers import Clock, GateStore, age_objects, record_bodies, twelve_record_log

_log, _age, _bodies = twelve_record_log, age_objects, record_bodies


# Finding 1 ------------------------------------------------------------------------------------


async def test_cli_collector_finishes_an_idle_log_after_the_grace(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``loghost gc`` is a new process each run, so it has no in-process observation of the
    plan; phase 3 then measures the grace as Last-Modified(manifest) - Last-Modified(gc/GARBAGE)
    - 1 s.  On an idle log the manifest was last written by the cut itself, *before* the marker,
    so that difference is negative for ever: every run answers "waiting", the applied plan is
    never finished, and no further collection is ever planned for that log."""
    from host.cli import build_parser

    root = tmp_path / "store"
    p = "logs/idle"
    store, _ = await _log(root, p, cursor=10)
    argv = ["gc", str(root), p, "--grace-s", "60", "--retain-fragments", "0"]

    async def cli_gc() -> dict[str, object]:
        args = build_parser().parse_args(argv)
        assert await args.func(args) == 0
        return json.loads(capsys.readouterr().out.strip().splitlines()[-1])

    first = await cli_gc()
    assert first["phase"] == "waiting"  # planned, applied, marked; the grace begins
    _age(root, 86_400)  # a day passes; nobody writes to the log
    phases = [(await cli_gc())["phase"] for _ in range(3)]
    assert phases[0] == "done", phases  # the first run after the grace finishes the plan
    assert (await store.get(join(p, GARBAGE_PATH))).data == EMPTY_GARBAGE


# Finding 2 ------------------------------------------------------------------------------------


async def test_a_plan_discarded_for_a_pin_is_not_applied_by_a_stalled_collector(
    tmp_path: Path,
) -> None:
    """Two collectors (the server and ``loghost gc``, or two servers across a take-over):

    1. A plans P (cut at 10), phase 2 re-reads the cursors (only compaction at 10), verifies,
       and stalls right before its manifest compare-and-swap.
    2. A reader pins cursor ``reader`` at 3 (``pin_cursor`` writes it ...)
    3. B runs: phase 2 sees the cursor at 3 < 10 and discards P (gc/GARBAGE = empty).
    4. (... and then reads gc/GARBAGE: empty; the manifest: not cut) - the pin is accepted.
    5. A resumes: its edit only checks that the oldest pointers are unchanged (they are) and
       applies P.  The manifest now starts at 10 while ``reader`` stands at 3: the pinned
       records are unlinked (invariant 10), and the next sweep is free to delete them (without
       a grace: see finding 3) as soon as the cursor is moved or deleted.

    Since the fix A's first manifest write is the announcement of its floor, which B replaces
    and clears; ``test_gc_floor.py`` holds A at the cut itself.
    """
    root = tmp_path / "store"
    p = "logs/race"
    store, _ = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)

    gate_a = GateStore(store)
    held_edit = gate_a.hold("put", r"manifest/MANIFEST$")
    a = GarbageCollector(gate_a, p, opts, clock=Clock())
    task_a = asyncio.create_task(a.run_once())
    await held_edit.reached.wait()  # A: planned, cursors re-read, verified; edit in flight

    gate_r = GateStore(store)
    held_check = gate_r.hold("get", r"gc/GARBAGE$")
    task_r = asyncio.create_task(
        pin_cursor(gate_r, p, CursorStore(gate_r, p, "reader"), "reader", 3, None)
    )
    await held_check.reached.wait()  # the reader's cursor is written

    b = GarbageCollector(store, p, opts, clock=Clock())
    assert (await b.run_once()).phase == "discarded"  # B saw the pin and dropped P

    held_check.release.set()
    await task_r  # the pin is accepted: gc/GARBAGE is empty and the manifest starts at 1
    held_edit.release.set()
    await asyncio.gather(task_a, return_exceptions=True)  # A's marker write fails; too late

    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset <= 3, (
        f"the log was cut at {loaded[0].oldest_offset} under an accepted pin at 3"
    )
    assert [r.body for r in await LogReader(store, p).read(3)] == _bodies(3, 13)


# Finding 3 ------------------------------------------------------------------------------------


class _NthGet(GateStore):
    """Holds the ``n``-th get of a key matching ``regex`` (earlier ones pass)."""

    def __init__(self, inner: LocalStore, regex: str, n: int) -> None:
        super().__init__(inner)
        self._rx, self._left = re.compile(regex), n
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        if self._rx.search(key):
            self._left -= 1
            if self._left == 0:
                self.reached.set()
                await self.release.wait()
        return await self.inner.get(key)


@pytest.mark.parametrize(
    "trigger",
    ["concurrent_collector_sweeps", "rust_resets_applied_plan", "crash_then_transient_pin"],
)
async def test_the_sweep_never_deletes_within_the_grace_of_a_cut(
    tmp_path: Path, trigger: str
) -> None:
    """The log was written an hour ago (its objects' Last-Modified says so); a collector cuts
    it at 10 now, with a 300 s grace, and a reader holds the manifest from before the cut.

    * ``concurrent_collector_sweeps``: two collectors (server and ``loghost gc``).  B finds no
      plan and starts its orphan sweep: it reads gc/GARBAGE (empty) ... A plans, applies and
      marks its cut ... B reads the manifest (cut at 10) and sweeps everything below it.
    * ``rust_resets_applied_plan``: Rust's collector finds our applied plan, which "does not
      apply cleanly" for it, and resets gc/GARBAGE (DESIGN.md: "our orphan sweep reclaims what
      it dropped").  Our next pass has no plan in flight and sweeps.
    * ``crash_then_transient_pin``: the collector dies after the manifest edit lands and before
      the applied marker; on restart, phase 2 finds the plan in the manifest, but a cursor being
      pinned at 3 (``pin_cursor``, which will answer 410 and undo it) is in the listing, so the
      plan is *discarded* (reset) although the manifest already holds it.  The pin is undone;
      the next pass sweeps.

    Each time fragments 1-9 and snapshots S1, S2 are deleted zero seconds after the cut: the
    sweep compares each object's Last-Modified (its creation, an hour ago) with the grace,
    never the time the object stopped being referenced.
    """
    root = tmp_path / "store"
    p = "logs/sweep"
    store, _ = await _log(root, p, cursor=1 if trigger == "concurrent_collector_sweeps" else 10)
    _age(root, 3600)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    m0 = loaded[0]  # what a reader loaded before the cut
    opts = GcOptions(grace_s=300, retain_fragments=0)
    mono = Clock()  # no monotonic time passes in this test: the grace never ends

    if trigger == "concurrent_collector_sweeps":
        gate_b = _NthGet(store, r"manifest/MANIFEST$", 2)  # the sweep's read of the manifest
        b = GarbageCollector(gate_b, p, opts, clock=time.time, monotonic=mono)
        task_b = asyncio.create_task(b.run_once())
        await gate_b.reached.wait()  # B: nothing to plan (cursor at 1); sweep saw no plan
        cursors = CursorStore(store, p, "compactor")
        w = await cursors.load("compaction")
        assert w is not None
        await cursors.save("compaction", 10, w)  # compaction moves on
        a = GarbageCollector(store, p, opts, clock=time.time, monotonic=Clock())
        assert (await a.run_once()).phase == "waiting"  # cut at 10 now; the grace begins
        gate_b.release.set()
        report = await task_b
    elif trigger == "rust_resets_applied_plan":
        gc = GarbageCollector(store, p, opts, clock=time.time, monotonic=mono)
        assert (await gc.run_once()).phase == "waiting"  # cut at 10 and marked applied
        await store.put(join(p, GARBAGE_PATH), EMPTY_GARBAGE)  # Rust: reset, delete nothing
        report = await gc.run_once()
    else:
        faulty = FaultyStore(store)
        # The second manifest write of phase 2 is the cut (the first announces its floor).
        faulty.add_rule(
            FaultRule("crash_after", ops={"put"}, key_regex=r"manifest/MANIFEST$", after=1, times=1)
        )
        crashed = GarbageCollector(faulty, p, opts, clock=time.time, monotonic=mono)
        with pytest.raises(SimulatedCrash):
            await crashed.run_once()  # the cut landed; the marker was never written
        store = LocalStore(root)  # the collector's process restarts
        gate_r = GateStore(store)
        held_check = gate_r.hold("get", r"gc/GARBAGE$")
        task_r = asyncio.create_task(
            pin_cursor(gate_r, p, CursorStore(gate_r, p, "reader"), "reader", 3, None)
        )
        await held_check.reached.wait()
        gc = GarbageCollector(store, p, opts, clock=time.time, monotonic=mono)
        # The manifest holds the plan: it is marked applied (its grace starts), never discarded,
        # whatever cursor is being written meanwhile.
        assert (await gc.run_once()).phase == "waiting"
        held_check.release.set()
        with pytest.raises(LogPurged):
            await task_r  # the reader learns it lost, and removes its cursor
        report = await gc.run_once()

    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10  # the cut is in the manifest
    # Within the grace of that cut nothing it unlinked may go yet.
    assert report.orphans_deleted == 0, report
    assert [r.body for r in await LogReader(store, p).read(1, manifest=m0)] == _bodies(1, 13)


# Finding 4 ------------------------------------------------------------------------------------


async def test_an_append_past_u64_leaves_nothing_behind(tmp_path: Path) -> None:
    """A (Rust-readable) log whose next offset is u64::MAX - 1 has room for one record.  A batch
    of two is refused with LogFull, as it should be, but only after its fragment (sequence 5,
    offsets [u64::MAX - 1, u64::MAX + 1)) was uploaded: ``ensure_room`` runs in
    ``Manifest.with_fragments``, not before the upload as its docstring asks.  The orphan's
    ``prev`` is the tail, so every writer that opens the log repairs by linking it, gets LogFull
    in its committer and dies: the one record that fits is refused for ever (WriterClosed)."""
    from wal3.errors import LogFull, ObjectNotFound
    from wal3.fragment import fragment_path
    from wal3.manifest import U64_MAX

    store = LocalStore(tmp_path / "store")
    p = "logs/full"
    m = Manifest(writer="rust", initial_offset=U64_MAX - 1, initial_seq_no=5)
    await store.put(join(p, MANIFEST_PATH), m.to_bytes(), if_none_match="*")
    w = await LogWriter.open(store, p, LogWriterOptions(writer_name="w"))
    with pytest.raises(LogFull):
        await w.append_many([b"a", b"b"])
    with contextlib.suppress(Exception):
        await w.close()
    # Nothing is written for an append that can never be linked (ensure_room's docstring) ...
    try:
        await store.head(join(p, fragment_path(5)))
        orphan = True
    except ObjectNotFound:
        orphan = False
    # ... so the log still takes the record that fits.
    w2 = await LogWriter.open(store, p, LogWriterOptions(writer_name="w2"))
    try:
        assert (await w2.append(b"c")).offset == U64_MAX - 1, f"orphan left: {orphan}"
    finally:
        with contextlib.suppress(Exception):
            await w2.close()
    assert not orphan
