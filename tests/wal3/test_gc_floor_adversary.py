"""Adversarial review of the pending-floor GC fixes (dbe5393, ad84fa1, 4a6a486).

What held up is in the review report; what did not is reproduced here, xfail(strict).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest

from wal3 import LogWriter, LogWriterOptions
from wal3.cursors import CursorStore
from wal3.errors import ObjectNotFound
from wal3.fragment import fragment_path
from wal3.gc import GarbageCollector, GcOptions
from wal3.layout import join, load_manifest
from wal3.manifest import MANIFEST_PATH

from .helpers import Clock
from .test_gc_floor import _age, _log, _stall_before_the_cut


@pytest.mark.xfail(
    strict=True,
    reason=(
        "liveness (c/e): a Rust writer that appends once between every announcement and cut drops "
        "gc_floor each time, so every pass ends FloorLost ('busy') and the log is never collected; "
        "before the floor the cut simply rebased over the append"
    ),
)
async def test_a_steady_rust_writer_starves_the_collector(tmp_path: Path) -> None:
    root = tmp_path / "store"
    p = "logs/rust-steady"
    store = await _log(root, p, cursor=10)
    opts = GcOptions(grace_s=60, retain_fragments=0)
    phases = []
    for _ in range(6):
        gate, task = await _stall_before_the_cut(store, p, opts)
        loaded = await load_manifest(store, p)
        assert loaded is not None
        m, etag = loaded
        raw = json.loads(m.to_bytes())
        del raw["gc_floor"]  # a Rust writer's manifest write (its append) drops the extension
        raw["writer"] = "rust"
        await store.put(
            join(p, MANIFEST_PATH), json.dumps(raw, separators=(",", ":")).encode(), if_match=etag
        )
        gate.release.set()
        phases.append((await task).phase)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset == 10, f"never cut after {len(phases)} passes: {phases}"


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
