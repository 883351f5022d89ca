"""The fixes of the adversarial GC review (tests/wal3/test_gc_adversary.py), case by case.

* The pending floor: phase 2 announces its cut in the manifest (``gc_floor``), re-reads the
  cursors, and cuts only from a manifest still holding that floor; ``pin_cursor`` retracts a
  floor above its pin; a Rust writer dropping the field only retracts it.
* The store clock: ``gc/CLOCK``'s Last-Modified is the store's "now"; ``gc/OLDEST`` dates an
  oldest offset the sweep saw, so a fresh process sweeps only what has been unreachable for a
  grace.
* u64: nothing is uploaded for an append past u64::MAX, and read repair steps over such an orphan.

Interleavings are forced with gates (events, never sleeps); grace intervals pass on injected
clocks, or by moving every object's Last-Modified back (what S3 reports).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import time
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import LocalStore, LogReader, LogWriter, LogWriterOptions
from wal3.cursors import CursorStore
from wal3.errors import (
    CorruptManifest,
    LogFull,
    LogPurged,
    ObjectNotFound,
    SimulatedCrash,
)
from wal3.faulty import FaultRule, FaultyStore
from wal3.fragment import encode_fragment, fragment_path
from wal3.gc import EMPTY_GARBAGE, Garbage, GarbageCollector, GcOptions, pin_cursor
from wal3.layout import CLOCK_PATH, GARBAGE_PATH, OLDEST_PATH, join, load_manifest
from wal3.manifest import MANIFEST_PATH, U64_MAX, GcFloor, Manifest
from wal3.store import ObjectStore

from .helpers import Clock, GateStore, age_objects, record_bodies, twelve_record_log


async def _log(root: Path, prefix: str, cursor: int) -> LocalStore:
    """:func:`twelve_record_log`'s store (a cursor at 10 cuts at 10)."""
    return (await twelve_record_log(root, prefix, cursor))[0]


_age, _bodies = age_objects, record_bodies


class NthGate(GateStore):
    """Holds the ``n``-th request of ``op`` on a key matching ``regex`` (earlier ones pass)."""

    def __init__(self, inner: ObjectStore, op: str, regex: str, n: int) -> None:
        super().__init__(inner)
        self._op, self._rx, self._left = op, re.compile(regex), n
        self.reached, self.release = asyncio.Event(), asyncio.Event()

    async def _hold(self, op: str, key: str) -> None:
        if op == self._op and self._rx.search(key):
            self._left -= 1
            if self._left == 0:
                self.reached.set()
                await self.release.wait()

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        await self._hold("get", key)
        return await self.inner.get(key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match=None,  # type: ignore[no-untyped-def]
        if_match=None,
    ):
        await self._hold("put", key)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)


async def _stall_before_the_cut(
    store: LocalStore, p: str, opts: GcOptions
) -> tuple[NthGate, asyncio.Task]:  # type: ignore[type-arg]
    """Collector A plans, announces its floor, re-reads the cursors (nothing pins below 10),
    verifies, and stalls right before its cut (its second manifest write)."""
    gate = NthGate(store, "put", r"manifest/MANIFEST$", 2)
    a = GarbageCollector(gate, p, opts, clock=Clock())
    task = asyncio.create_task(a.run_once())
    await gate.reached.wait()
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].gc_floor is not None
    assert loaded[0].gc_floor.offset == 10 and loaded[0].oldest_offset == 1
    return gate, task


# ------------------------------------------------------------------------- the pending floor


async def test_a_collector_stalled_at_its_cut_cannot_cut_once_another_discarded_for_a_pin(
    tmp_path: Path,
) -> None:
    """Finding 2 with the stall where it hurts most: A has read the cursors and stalls before
    the cut itself.  A reader pins 3; B's phase 2 replaces A's floor with its own, sees the pin
    and discards (clearing its floor); the pin is accepted.  A's cut needs its own floor in the
    manifest: it is gone, so A cuts nothing and leaves the decision to a later pass."""
    root = tmp_path / "store"
    p = "logs/stall"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gate_a, task_a = await _stall_before_the_cut(store, p, opts)

    gate_r = NthGate(store, "get", r"gc/GARBAGE$", 1)
    task_r = asyncio.create_task(
        pin_cursor(gate_r, p, CursorStore(gate_r, p, "reader"), "reader", 3, None)
    )
    await gate_r.reached.wait()  # the reader's cursor is written
    b = GarbageCollector(store, p, opts, clock=Clock())
    assert (await b.run_once()).phase == "discarded"
    gate_r.release.set()
    await task_r  # accepted: no plan, no floor, not cut
    gate_a.release.set()
    report = await task_a
    assert report.phase == "busy", report
    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset == 1 and loaded[0].gc_floor is None
    assert [r.body for r in await LogReader(store, p).read(3)] == _bodies(3, 13)


async def test_pin_cursor_retracts_a_floor_above_it_and_the_cut_is_not_made(tmp_path: Path) -> None:
    """A floor with no plan pending above the pin (Rust reset gc/GARBAGE meanwhile, say):
    ``pin_cursor`` retracts the floor by compare-and-swap and accepts; the stalled cut then
    finds its floor gone.  With the cursor gone again, the next pass collects as usual."""
    root = tmp_path / "store"
    p = "logs/retract"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gate_a, task_a = await _stall_before_the_cut(store, p, opts)
    await store.put(join(p, GARBAGE_PATH), EMPTY_GARBAGE)  # Rust: reset, nothing applied

    cursors = CursorStore(store, p, "reader")
    await pin_cursor(store, p, cursors, "reader", 3, None)
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].gc_floor is None  # retracted
    gate_a.release.set()
    assert (await task_a).phase == "busy"
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 1

    await cursors.delete("reader")
    gc = GarbageCollector(store, p, opts, clock=Clock())
    assert (await gc.run_once()).phase == "waiting"  # planned, announced, cut, marked
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10
    assert loaded[0].gc_floor is None  # the cut takes its floor away


async def test_a_pin_below_a_pending_plan_is_still_refused(tmp_path: Path) -> None:
    """The plan in gc/GARBAGE still answers 410 for a pin below it (a collector of an older
    version applies it without any floor), and the pin's cursor is undone."""
    root = tmp_path / "store"
    p = "logs/pending"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gate_a, task_a = await _stall_before_the_cut(store, p, opts)
    cursors = CursorStore(store, p, "reader")
    with pytest.raises(LogPurged):
        await pin_cursor(store, p, cursors, "reader", 3, None)
    assert await cursors.load("reader") is None
    gate_a.release.set()
    assert (await task_a).phase == "waiting"  # no pin stands: the cut is made


async def test_a_rust_writer_dropping_the_floor_is_never_cut_without_one(tmp_path: Path) -> None:
    """Rust's serde ignores ``gc_floor`` and drops it on its next manifest write: to the
    collector that is a retraction, never a cut without its floor.  It announces a fresh floor,
    reads the cursors again, and cuts with that one (tests/wal3/test_gc_floor_adversary.py has
    the bound on how often one pass does so)."""
    root = tmp_path / "store"
    p = "logs/rust"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gate_a, task_a = await _stall_before_the_cut(store, p, opts)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    m, etag = loaded
    raw = json.loads(m.to_bytes())
    del raw["gc_floor"]  # what a Rust writer writes back (plus its own changes)
    raw["writer"] = "rust"
    await store.put(
        join(p, MANIFEST_PATH), json.dumps(raw, separators=(",", ":")).encode(), if_match=etag
    )
    gate_a.release.set()
    report = await task_a
    assert report.phase == "waiting", report  # cut, its grace running
    assert sum("announced again" in n for n in report.notes) == 1, report.notes
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10 and loaded[0].gc_floor is None
    garbage = Garbage.from_bytes((await store.get(join(p, GARBAGE_PATH))).data)
    assert garbage is not None and garbage.applied_us is not None
    gc = GarbageCollector(store, p, opts, clock=Clock())
    assert (await gc.run_once()).phase == "waiting"
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10


def test_the_floor_is_an_extension_field_and_strictly_parsed() -> None:
    """Written only when set (every manifest without one is byte for byte what it was), read
    back exactly, and anything malformed is CorruptManifest."""
    m = Manifest(writer="w")
    assert b"gc_floor" not in m.to_bytes()
    f = replace(m, gc_floor=GcFloor(7, "ab" * 16))
    assert Manifest.from_bytes(f.to_bytes()) == f
    assert f.to_bytes().endswith(b',"gc_floor":{"offset":7,"nonce":"' + b"ab" * 16 + b'"}}')
    for bad in (
        '{"offset":7}',
        '{"offset":-1,"nonce":"' + "ab" * 16 + '"}',
        '"x"',
        '{"offset":7,"nonce":"AB"}',
    ):
        data = m.to_bytes()[:-1] + b',"gc_floor":' + bad.encode() + b"}"
        with pytest.raises(CorruptManifest):
            Manifest.from_bytes(data)


async def test_a_crash_after_the_floor_leaves_nothing_that_can_cut(tmp_path: Path) -> None:
    """A collector dies right after announcing its floor: the floor stays, nobody can cut with
    it (its nonce died with the process), and the next pass announces its own and cuts."""
    root = tmp_path / "store"
    p = "logs/crash"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    faulty = FaultyStore(store)
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"manifest/MANIFEST$", times=1))
    with pytest.raises(SimulatedCrash):
        await GarbageCollector(faulty, p, opts, clock=Clock()).run_once()
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].gc_floor is not None
    stale = loaded[0].gc_floor
    report = await GarbageCollector(LocalStore(root), p, opts, clock=Clock()).run_once()
    assert report.phase == "waiting", report
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10 and loaded[0].gc_floor is None
    assert stale.offset == 10


# -------------------------------------------------------------------------- the store clock


async def test_a_fresh_process_sweeps_only_after_the_marker_aged(tmp_path: Path) -> None:
    """The sweep of a process that has seen nothing (``loghost gc``) writes ``gc/OLDEST`` and
    deletes nothing; once that marker is a grace old on the store's clock (``gc/CLOCK``), the
    objects below what it recorded go."""
    root = tmp_path / "store"
    p = "logs/marker"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gc = GarbageCollector(store, p, opts, clock=Clock())
    assert (await gc.run_once()).phase == "waiting"
    _age(root, 120)
    report = await GarbageCollector(LocalStore(root), p, opts).run_once()
    assert report.phase == "done" and report.fragments_deleted == 9
    assert report.orphans_deleted == 0  # its sweep has seen nothing for a grace: marker only
    marker = json.loads((await store.get(join(p, OLDEST_PATH))).data)
    assert marker == {"oldest_offset": 10, "first_live_seq_no": 10}
    assert (await store.head(join(p, CLOCK_PATH))).size > 0
    # An orphan below the live range, written long ago (a leftover of a crashed writer).
    orphan = encode_fragment(3, 3, 1, [b"r3"])
    await store.put(join(p, orphan.path), orphan.data)
    os.utime(root / p / orphan.path, (time.time() - 3600, time.time() - 3600))
    fresh = await GarbageCollector(LocalStore(root), p, opts).run_once()
    assert fresh.orphans_deleted == 0, fresh  # the marker is not a grace old yet
    _age(root, 120)
    later = await GarbageCollector(LocalStore(root), p, opts).run_once()
    assert later.orphans_deleted == 1, later
    with pytest.raises(ObjectNotFound):
        await store.head(join(p, orphan.path))


async def test_a_long_lived_collector_sweeps_after_its_own_observation_aged(tmp_path: Path) -> None:
    """In one process the observation is kept in memory on monotonic time: once a grace has
    passed since the collector saw the live range start where it does, no marker is needed
    (while a fresh process, which saw nothing, still waits for its marker to age)."""
    root = tmp_path / "store"
    p = "logs/inproc"
    store = await _log(root, p, cursor=10)
    clock = Clock()
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gc = GarbageCollector(store, p, opts, clock=time.time, monotonic=clock)
    assert (await gc.run_once()).phase == "waiting"  # cut at 10, seen at once
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    orphan = encode_fragment(2, 2, 1, [b"r2"])
    await store.put(join(p, orphan.path), orphan.data)
    os.utime(root / p / orphan.path, (time.time() - 3600, time.time() - 3600))
    fresh = await GarbageCollector(LocalStore(root), p, opts).run_once()
    assert fresh.orphans_deleted == 0
    swept = await gc.run_once()
    assert swept.orphans_deleted == 1, swept


# -------------------------------------------------------------------------------------- u64


async def test_read_repair_steps_over_an_orphan_past_u64(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An orphan an older version left past u64::MAX (it can never be linked) is dead to read
    repair, not the end of the writer: the record that fits is appended over it."""
    from wal3 import fragment as fragment_mod

    store = LocalStore(tmp_path / "store")
    p = "logs/full"
    m = Manifest(writer="rust", initial_offset=U64_MAX - 1, initial_seq_no=5)
    await store.put(join(p, MANIFEST_PATH), m.to_bytes(), if_none_match="*")
    monkeypatch.setattr(fragment_mod, "_U64_MAX", 1 << 70)  # what the older version wrote
    orphan = encode_fragment(5, U64_MAX - 1, 1, [b"a", b"b"])
    monkeypatch.undo()
    await store.put(join(p, fragment_path(5)), orphan.data)
    w = await LogWriter.open(store, p, LogWriterOptions(writer_name="w"))
    try:
        assert (await w.append(b"c")).offset == U64_MAX - 1
        with pytest.raises(LogFull):
            await w.append(b"d")  # and now it is full
    finally:
        await w.close()
    records = await LogReader(store, p).read(U64_MAX - 1)
    assert [r.body for r in records] == [b"c"]


def test_a_fragment_past_u64_is_never_encoded() -> None:
    with pytest.raises(LogFull):
        encode_fragment(5, U64_MAX - 1, 1, [b"a", b"b"])
    with pytest.raises(LogFull):
        encode_fragment(U64_MAX + 1, 1, 1, [b"a"])
    assert encode_fragment(U64_MAX, U64_MAX - 1, 1, [b"a"]).limit == U64_MAX
    with pytest.raises(ValueError):
        fragment_path(U64_MAX + 1)
