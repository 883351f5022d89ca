"""The serving host's interpreter GC: start-up objects frozen, pauses measured (host/heap.py)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import httpx

from host.heap import GcPauses, space_full_collections

from .live import auth, metric, spawn_server


def _sample(pauses: GcPauses, suffix: str, generation: str) -> float:
    for m in pauses.collect():
        for s in m.samples:
            ours = s.name.endswith(suffix) and s.labels.get("generation") == generation
            if ours and (suffix != "_bucket" or s.labels.get("le") == "+Inf"):
                return s.value
    return 0.0


def test_pauses_are_observed_by_generation_while_installed() -> None:
    pauses = GcPauses()
    pauses.install()
    pauses.install()  # once only
    try:
        gc.collect()
        assert _sample(pauses, "_count", "2") == 1
        assert _sample(pauses, "_bucket", "2") == 1  # +Inf holds every pause
        assert _sample(pauses, "_sum", "2") > 0
    finally:
        pauses.remove()
    gc.collect()
    assert _sample(pauses, "_count", "2") == 1  # removed: no longer observed


def test_the_buckets_are_cumulative_with_prometheus_bounds() -> None:
    now = [0.0]
    pauses = GcPauses(clock=lambda: now[0])
    for pause in (0.001, 0.003, 2.0):
        now[0] = 0.0
        pauses._callback("start", {"generation": 0})
        now[0] = pause
        pauses._callback("stop", {"generation": 0})
    buckets = {
        s.labels["le"]: s.value
        for m in pauses.collect()
        for s in m.samples
        if s.name.endswith("_bucket") and s.labels["generation"] == "0"
    }
    assert buckets["0.001"] == 1  # le: at most the bound
    assert buckets["0.0025"] == 1 and buckets["0.005"] == 2 and buckets["1.0"] == 2
    assert buckets["+Inf"] == 3


def test_serve_freezes_its_start_up_objects_and_exports_the_pauses(tmp_path: Path) -> None:
    env = {"LOGHOST_LOG_LEVEL": "INFO", "LOGHOST_PYTHON_GC_FULL_THRESHOLD": "37"}
    proc = spawn_server(str(tmp_path / "store"), tmp_path, server_id="heap", extra_env=env)
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
    young, middle, full = ready[0]["gc_thresholds"]
    assert full == 37 and (young, middle) == gc.get_threshold()[:2], ready  # only the third


def test_full_collections_are_spaced_and_the_other_thresholds_kept() -> None:
    before = gc.get_threshold()
    try:
        assert space_full_collections(250) == (*before[:2], 250) == gc.get_threshold()
    finally:
        gc.set_threshold(*before)
