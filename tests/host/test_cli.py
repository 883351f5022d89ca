"""The operator commands: ``loghost scrub``, ``loghost inspect`` and ``loghost gc`` on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from .live import live_server, log_path, record

LOG1 = str(uuid.UUID(int=101, version=4))
LOG2 = str(uuid.UUID(int=202, version=4))


def loghost(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the installed ``loghost`` command (the console script next to this interpreter)."""
    script = Path(sys.executable).parent / "loghost"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "host.cli"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHOST_")}
    return subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=120, env=env)


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip().startswith("{")]


def json_stream(text: str) -> list[Any]:
    """Consecutive JSON values (pretty-printed or one per line)."""
    dec = json.JSONDecoder()
    out, i = [], 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return out
        value, i = dec.raw_decode(text, i)
        out.append(value)


@pytest.fixture
async def store(tmp_path: Path) -> Path:
    """A store with two alice logs written through a real server (5 fragments in LOG1)."""
    root = tmp_path / "store"
    async with live_server(str(root)) as lv, lv.client("alice-key") as c, lv.client() as svc:
        for i in range(5):
            r = await c.post(
                log_path("alice", LOG1) + "/records",
                json={"records": [record(f"one-{i}", document=f"d{i}")]},
            )
            assert r.status_code == 200, r.text
        r = await c.post(
            log_path("alice", LOG2) + "/records",
            json={"records": [record("two-0"), record("two-1", "delete")]},
        )
        assert r.status_code == 200, r.text
        # the cursor only (POST .../compaction would also start the server's own collector); it
        # is reserved for the service
        r = await svc.put(
            log_path("alice", LOG1) + "/cursors/compaction", json={"offset": 3, "witness": None}
        )
        assert r.status_code == 200, r.text
    return root


def test_scrub_healthy_store_exits_0(store: Path) -> None:
    out = loghost("scrub", str(store))
    assert out.returncode == 0, out.stdout + out.stderr
    lines = {x["log"]: x for x in json_lines(out.stdout)}
    assert lines[f"logs/{LOG1}"]["ok"] is True and lines[f"logs/{LOG1}"]["records"] == 5
    assert lines[f"logs/{LOG2}"]["ok"] is True and lines[f"logs/{LOG2}"]["records"] == 2
    assert all(x["ok"] for x in lines.values())
    # also with a file:// URL
    assert loghost("scrub", store.as_uri()).returncode == 0


def test_scrub_exits_1_after_corrupting_a_fragment(store: Path) -> None:
    frags = sorted((store / "logs" / LOG1 / "log").rglob("*.parquet"))
    assert len(frags) == 5
    victim = frags[2]
    data = bytearray(victim.read_bytes())
    mid = len(data) // 2
    data[mid : mid + 8] = bytes(b ^ 0xFF for b in data[mid : mid + 8])
    victim.write_bytes(bytes(data))

    out = loghost("scrub", str(store))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = {x["log"]: x for x in json_lines(out.stdout)}
    bad = lines[f"logs/{LOG1}"]
    assert bad["ok"] is False and bad["problems"], bad
    assert lines[f"logs/{LOG2}"]["ok"] is True
    # one healthy log alone still passes
    only = loghost("scrub", str(store), "--log", f"logs/{LOG2}")
    assert only.returncode == 0, only.stdout + only.stderr
    assert loghost("scrub", str(store), "--log", f"logs/{LOG1}").returncode == 1


def test_scrub_of_an_empty_store_is_not_ok(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    assert loghost("scrub", str(tmp_path / "empty")).returncode != 0


def test_inspect_prints_summary_and_records(store: Path) -> None:
    out = loghost("inspect", str(store), f"logs/{LOG2}", "--records")
    assert out.returncode == 0, out.stdout + out.stderr
    values = json_stream(out.stdout)
    summary, records = values[0], values[1:]
    assert summary["log"] == f"logs/{LOG2}"
    assert summary["oldest_offset"] == 1 and summary["next_offset"] == 3
    assert summary["sealed"] is False
    assert len(summary["setsum"]) == 64
    assert [r["offset"] for r in records] == [1, 2]
    assert [r["body"]["id"] for r in records] == ["two-0", "two-1"]
    assert [r["body"]["op"] for r in records] == ["add", "delete"]

    out = loghost("inspect", str(store), f"logs/{LOG1}", "--records", "--from", "4")
    assert out.returncode == 0, out.stdout + out.stderr
    values = json_stream(out.stdout)
    assert values[0]["cursors"]["compaction"]["offset"] == 3
    assert [(r["offset"], r["body"]["document"]) for r in values[1:]] == [(4, "d3"), (5, "d4")]

    missing = loghost("inspect", str(store), f"logs/{uuid.uuid4()}")
    assert missing.returncode != 0


def test_gc_runs_and_collects_below_the_compaction_cursor(store: Path) -> None:
    out = loghost("gc", str(store), f"logs/{LOG1}", "--grace-s", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    report = json_stream(out.stdout)[-1]
    assert isinstance(report, dict) and "phase" in report
    summary = json_stream(loghost("inspect", str(store), f"logs/{LOG1}").stdout)[0]
    if summary["oldest_offset"] != 3:  # one more pass finishes a plan the first one started
        assert loghost("gc", str(store), f"logs/{LOG1}", "--grace-s", "0").returncode == 0
        summary = json_stream(loghost("inspect", str(store), f"logs/{LOG1}").stdout)[0]
    assert summary["oldest_offset"] == 3 and summary["next_offset"] == 6
    # Unlinked, but the objects stay: they are the idempotency window a reopened writer reads.
    assert len(list((store / "logs" / LOG1 / "log").rglob("*.parquet"))) == 5
    # Without a window the next pass deletes them (the orphan sweep takes what phase 3 left).
    out = loghost("gc", str(store), f"logs/{LOG1}", "--grace-s", "0", "--retain-fragments", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    names = sorted(p.name for p in (store / "logs" / LOG1 / "log").rglob("*.parquet"))
    assert names == [f"FragmentSeqNo={s:016d}.parquet" for s in (3, 4, 5)], names
    # still healthy after collection, and the records above the cut read back
    scrub = loghost("scrub", str(store))
    assert scrub.returncode == 0, scrub.stdout + scrub.stderr
    out = loghost("inspect", str(store), f"logs/{LOG1}", "--records")
    assert [r["body"]["id"] for r in json_stream(out.stdout)[1:]] == ["one-2", "one-3", "one-4"]


def test_dirty_logs_lists_each_servers_dirty_log(store: Path) -> None:
    out = loghost("dirty-logs", str(store))
    assert out.returncode == 0, out.stdout + out.stderr
    logs = json_lines(out.stdout)
    assert len(logs) == 1  # the one server of the fixture
    (d,) = logs
    assert d["log"] == f"dirty/{d['server_id']}" and d["server_id"].startswith("test-")
    # 5 + 1 appends, one fragment each, never rolled up: every mark is above the cursor
    assert d["next_offset"] == 7 and d["records_above_cursor"] == 6
    assert loghost("dirty-logs", str(store / "nowhere")).stdout.strip() == ""
