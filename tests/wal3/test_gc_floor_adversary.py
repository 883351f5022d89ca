"""Adversarial review of the pending-floor GC fixes (dbe5393, ad84fa1, 4a6a486).

What held up is in the review report; what did not is reproduced here (xfail(strict) until
fixed).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from wal3 import LogWriter, LogWriterOptions
from wal3.cursors import CursorStore
from wal3.errors import ObjectNotFound
from wal3.fragment import fragment_path
from wal3.gc import _FLOOR_ATTEMPTS, GarbageCollector, GcOptions
from wal3.layout import join, load_manifest
from wal3.manifest import MANIFEST_PATH
from wal3.store import ObjectStore

from .helpers import Clock, GateStore
from .test_gc_floor import _age, _log


class _RustBeforeTheCut(GateStore):
    """Before each of the collector's first ``n`` cuts (a manifest put without ``gc_floor`` onto
    a stored manifest holding one), a Rust writer's manifest write lands first and drops the
    floor, as its append would: the cut's If-Match fails and the collector finds its floor
    gone, replaced by nothing."""

    def __init__(self, inner: ObjectStore, p: str, n: int) -> None:
        super().__init__(inner)
        self._key, self.left = join(p, MANIFEST_PATH), n

    async def put(  # type: ignore[no-untyped-def]
        self, key: str, data: bytes, *, if_none_match=None, if_match=None
    ):
        if key == self._key and self.left > 0 and b'"gc_floor"' not in data:
            stored = await self.inner.get(key)
            raw = json.loads(stored.data)
            if "gc_floor" in raw:
                self.left -= 1
                del raw["gc_floor"]  # Rust's Manifest drops the extension on its next write
                raw["writer"] = "rust"
                body = json.dumps(raw, separators=(",", ":")).encode()
                await self.inner.put(key, body, if_match=stored.etag)
        return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)


async def test_a_rust_writer_inside_the_cut_window_does_not_end_the_pass(tmp_path: Path) -> None:
    """Was xfail(strict) (liveness): a Rust writer whose append landed between the collector's
    announcement and its cut dropped ``gc_floor``, so the pass ended 'busy'; one landing in
    every pass's window starved the collector for good.  A floor gone with none in its place is
    announced again, up to ``_FLOOR_ATTEMPTS`` times in one pass: two such appends in a row
    still let it cut."""
    root = tmp_path / "store"
    p = "logs/rust-steady"
    store = await _log(root, p, cursor=10)
    assert _FLOOR_ATTEMPTS == 3
    rust = _RustBeforeTheCut(store, p, _FLOOR_ATTEMPTS - 1)
    report = await GarbageCollector(rust, p, GcOptions(grace_s=60, retain_fragments=0)).run_once()
    assert rust.left == 0  # both windows were hit
    assert report.phase == "waiting", report  # cut; its grace runs
    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset == 10 and loaded[0].gc_floor is None


async def test_a_rust_writer_inside_every_window_postpones_the_cut_to_the_next_pass(
    tmp_path: Path,
) -> None:
    """The bound: a floor dropped in each of a pass's windows ends the pass 'busy', having cut
    nothing and left no floor; the next pass, with the windows clear, cuts."""
    root = tmp_path / "store"
    p = "logs/rust-every"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    rust = _RustBeforeTheCut(store, p, _FLOOR_ATTEMPTS)
    gc = GarbageCollector(rust, p, opts)
    assert (await gc.run_once()).phase == "busy"
    assert rust.left == 0
    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset == 1 and loaded[0].gc_floor is None
    assert (await gc.run_once()).phase == "waiting"  # cut
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 10


async def test_a_log_recreated_at_the_same_prefix_is_swept_by_the_old_logs_observation(
    tmp_path: Path,
) -> None:
    root = tmp_path / "store"
    p = "logs/again"
    store = await _log(root, p, cursor=10)
    clock = Clock()
    opts = GcOptions(grace_s=60, retain_fragments=0)
    gc = GarbageCollector(store, p, opts, clock=time.time, monotonic=clock)
    assert (await gc.run_once()).phase == "waiting"  # cut at 10: (10, 10) observed
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    # The log goes away (every object under its prefix) and a new one is created there.
    shutil.rmtree(root / p)
    w = await LogWriter.open(store, p, LogWriterOptions(writer_name="w2"))
    for i in range(12):
        await w.append(f"n{i + 1}".encode())
    await w.close()
    await CursorStore(store, p, "t").init("compaction", 1)
    _age(root, 120)  # the new log's objects are older than the grace (S3 Last-Modified)
    clock.now += 61
    await gc.run_once()
    loaded = await load_manifest(store, p)
    assert loaded is not None and loaded[0].oldest_offset == 1
    missing = []
    for seq in range(1, 13):
        try:
            await store.head(join(p, fragment_path(seq)))
        except ObjectNotFound:
            missing.append(seq)
    assert not missing, f"fragments the manifest references were deleted: {missing}"
