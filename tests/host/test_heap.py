"""The serving host's interpreter GC: start-up objects frozen, pauses measured (host/heap.py)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import httpx
from prometheus_client import CollectorRegistry, Histogram

from host.heap import GcPauses

from .live import auth, metric, spawn_server


def _count(h: Histogram, generation: str) -> float:
    for m in h.collect():
        for s in m.samples:
            if s.name.endswith("_count") and s.labels.get("generation") == generation:
                return s.value
    return 0.0


def test_pauses_are_observed_by_generation_while_installed() -> None:
    h = Histogram("p", "p", ["generation"], registry=CollectorRegistry())
    pauses = GcPauses(h)
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect()
        assert _count(h, "2") == 1
    finally:
        pauses.remove()
    gc.collect()
    assert _count(h, "2") == 1  # removed: no longer observed


def test_serve_freezes_its_start_up_objects_and_exports_the_pauses(tmp_path: Path) -> None:
    proc = spawn_server(
        str(tmp_path / "store"), tmp_path, server_id="heap", extra_env={"LOGHOST_LOG_LEVEL": "INFO"}
    )
    try:
        text = httpx.get(proc.url + "/metrics", headers=auth(), timeout=30).text
        for _ in range(20):  # requests allocate: young collections happen while serving
            httpx.get(proc.url + "/metrics", headers=auth(), timeout=30)
        text = httpx.get(proc.url + "/metrics", headers=auth(), timeout=30).text
        assert (metric(text, "loghost_python_gc_pause_seconds_count", generation="0") or 0) > 0
    finally:
        proc.terminate()
    ready = [
        json.loads(line)
        for line in proc.log.read_text().splitlines()
        if line.startswith("{") and '"ready"' in line
    ]
    assert ready and ready[0]["gc_frozen_objects"] > 10_000, ready
