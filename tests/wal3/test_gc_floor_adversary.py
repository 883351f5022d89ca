"""Adversarial review of the pending-floor GC fixes (dbe5393, ad84fa1, 4a6a486).

What held up is in the review report; what did not is reproduced here, xfail(strict).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from host.wal3.gc import GcOptions
from host.wal3.layout import join, load_manifest
from host.wal3.manifest import MANIFEST_PATH

from .test_gc_floor import _log, _stall_before_the_cut


@pytest.mark.xfail(strict=True, reason=(
    "liveness (c/e): a Rust writer that appends once between every announcement and cut drops "
    "gc_floor each time, so every pass ends FloorLost ('busy') and the log is never collected; "
    "before the floor the cut simply rebased over the append"))
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
        await store.put(join(p, MANIFEST_PATH), json.dumps(raw, separators=(",", ":")).encode(),
                        if_match=etag)
        gate.release.set()
        phases.append((await task).phase)
    loaded = await load_manifest(store, p)
    assert loaded is not None
    assert loaded[0].oldest_offset == 10, f"never cut after {len(phases)} passes: {phases}"
