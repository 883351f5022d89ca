"""bench/http.py (issue 14): the ceiling's fixed stack, alternating windows, and verdicts computed
from the data, per store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import common, http, http_ceiling, loadgen


def test_the_ceiling_is_pinned_to_asyncio_and_h11(tmp_path: Path) -> None:
    argv = loadgen.ServerProcess("ceiling", tmp_path).argv()
    assert argv[argv.index("--loop") + 1] == "asyncio"
    assert argv[argv.index("--http") + 1] == "h11"
    assert (http_ceiling.LOOP, http_ceiling.HTTP) == ("asyncio", "h11")


def test_the_host_takes_a_store_url(tmp_path: Path) -> None:
    local = loadgen.ServerProcess("host", tmp_path).argv()
    assert local[local.index("--store") + 1] == str(tmp_path / "store")
    s3 = loadgen.ServerProcess("host", tmp_path, store="s3://b/p").argv()
    assert s3[s3.index("--store") + 1] == "s3://b/p"


def _row(store: str, logs: int, recs: int, ratios: list[float], cpu: list[float]) -> dict[str, Any]:
    pct = {str(p): 1000 * (i + 1) for i, p in enumerate(loadgen.PCTS)}
    side = {"requests_per_s": 100.0, "p50_ms": 1.0, "p99_ms": 2.0, "pct_us": pct}
    return {
        "store": store,
        "logs": logs,
        "records_per_request": recs,
        "ratios": ratios,
        "ratio": sorted(ratios)[len(ratios) // 2],
        "cpu_ratios": cpu,
        "cpu_ratio": sorted(cpu)[len(cpu) // 2],
        "host_rps": 100.0,
        "records_per_s": 100.0 * recs,
        "ceiling_rps": 300.0,
        "host_cpu_ms": 2.0,
        "ceiling_cpu_ms": 0.5,
        "host_cores_busy": 0.9,
        "p50_ms": 1.0,
        "p99_ms": 2.0,
        "errors": 0,
        "moto_cpu_ms": 1.0,
        "host": side,
        "ceiling": side,
        "open": {"seconds": 1.0, "opens_per_s": 1.0, "p50_ms": 1.0, "p99_ms": 1.0, "errors": 0},
    }


def _data(rows: list[dict[str, Any]], windows: int = 3) -> dict[str, Any]:
    return {
        "client": "wrk",
        "machine": {"nproc": 2, "date_utc": "now"},
        "config": {
            "stores": ["local", "s3"],
            "records": [1, 100],
            "connections": 64,
            "duration_s": 5,
            "windows": windows,
            "record_json_bytes": 847,
            "ceiling_stack": "uvicorn --loop asyncio --http h11",
        },
        "rows": rows,
        "refs": {},
    }


def test_targets_are_judged_from_the_medians_per_store() -> None:
    data = _data(
        [
            _row("local", 1000, 1, [0.5, 0.3, 0.45], [2.0, 3.0, 2.4]),  # 0.45 and 2.4: pass
            _row("local", 1, 1, [0.7, 0.5, 0.55], [1.0, 1.0, 1.0]),  # 0.55 < 0.60: miss
            _row("s3", 1000, 1, [0.5, 0.5, 0.5], [3.0, 2.6, 2.7]),  # CPU 2.7 > 2.5: miss
            _row("s3", 1, 100, [0.3, 0.2, 0.26], [1.0, 1.0, 1.0]),  # 0.26: pass
        ]
    )
    got = {(t["store"], tuple(t["case"])): t["verdict"] for t in http.targets(data)}
    assert got[("local", (1000, 1))] == "PASS"
    assert got[("local", (1, 1))] == "MISS"
    assert got[("s3", (1000, 1))] == "MISS"
    assert got[("s3", (1, 100))] == "PASS"
    assert got[("local", (1000, 100))] == "not measured"
    few = http.targets(_data([_row("local", 1, 1, [0.9, 0.9], [1.0, 1.0])], windows=2))
    assert few[1]["verdict"].startswith("PASS (2 windows")


def test_render_has_one_table_per_store_with_the_windows(tmp_path: Path) -> None:
    data = _data(
        [
            _row("local", 1, 1, [0.61, 0.62, 0.63], [1.0, 1.1, 1.2]),
            _row("s3", 1, 1, [0.2, 0.3, 0.25], [4.0, 4.0, 4.0]),
        ]
    )
    text = http.render(data)
    assert http.STORE_TITLES["local"] in text and http.STORE_TITLES["s3"] in text
    assert "0.610, 0.620, 0.630" in text and "moto CPU ms/req" in text
    assert "**PASS**" in text and "**MISS**" in text
    assert http.plot(data, tmp_path / "p.png").exists()


def test_median_index_picks_the_median_pair() -> None:
    assert http._median_index([0.3, 0.1, 0.2]) == 2
    assert http._median_index([0.4, 0.1, 0.3, 0.2]) == 3  # the lower middle


@pytest.mark.slow
def test_the_quick_run_measures_both_stores() -> None:
    """``python -m bench --quick --only http`` end to end, one short window pair per case."""
    out = subprocess.run(
        [sys.executable, "-m", "bench", "--quick", "--only", "http", "--http-windows", "1"],
        cwd=common.ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    data = json.loads(common.out_path("http", True).read_text())
    assert {r["store"] for r in data["rows"]} == {"local", "s3"}
    for r in data["rows"]:
        assert r["errors"] == 0 and r["host_rps"] > 0 and r["ceiling_rps"] > 0, r["ratios"]
        assert len(r["windows"]) == 1
