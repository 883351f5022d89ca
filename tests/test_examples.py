"""examples/log_app.py against a live log host, in this venv (issue 22, item 8): append, tail
with long polls, and the compacted state before and after a compactor installed one."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from compactor_client import LogHostClient
from compactor_client.fold import Row
from compactor_client.versions import allocate_version, install_version, write_rows
from tests.host.live import SERVICE_KEY, live_server
from wal3.storeurl import open_store

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "log_app.py"


async def run_example(python: str, *args: str, cwd: Path) -> dict[str, Any]:
    """Run the example with ``python``; its JSON summary (the last line of its output)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    proc = await asyncio.create_subprocess_exec(
        python,
        str(EXAMPLE),
        *args,
        "--json",
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    text = out.decode()
    assert proc.returncode == 0, text + err.decode()
    summary: dict[str, Any] = json.loads(text.strip().splitlines()[-1])
    summary["_text"] = text
    return summary


def check_round(summary: dict[str, Any], records: int) -> None:
    """One run of the example: both batches appended, and all of them tailed in order."""
    first = summary["first_offset"]
    assert summary["next_offset"] == first + 2 * records
    assert summary["tailed"] == list(range(first, first + 2 * records))
    # The late batch was appended while the reader waited in a long poll, and it woke at once
    # (far sooner than the poll's wait).
    assert 0 <= summary["woke_after_ms"] < 2500
    assert "appended 3 more records while the reader waits" in summary["_text"]


async def test_example_app_appends_tails_and_reads_the_compacted_state(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    key = ["--api-key", "alice-key", "--tenant", "alice", "--records", "3"]
    async with live_server(str(store_dir)) as live:
        # A new log, no store given: the compacted state is not looked for.
        one = await run_example(sys.executable, "--url", live.url, *key, cwd=tmp_path)
        check_round(one, 3)
        assert one["first_offset"] == 1
        assert one["compaction_offset"] == 1
        assert one["compacted"] == {"available": False, "why": "no --store given"}
        cid = one["collection_id"]

        # The same log with its store: not compacted yet.
        args = ["--url", live.url, *key, "--collection", cid, "--store", str(store_dir)]
        two = await run_example(sys.executable, *args, cwd=tmp_path)
        check_round(two, 3)
        assert two["first_offset"] == 7
        assert two["compacted"] == {"available": False, "why": "not compacted yet"}

        # A compactor installs a version of the first 6 records and advances the cursor.
        store = open_store(str(store_dir))
        try:
            pending = allocate_version(cid, None)
            rows = [
                Row(id=f"{b}-{i}", document=f"{b} document {i}")
                for b in ("early", "late")
                for i in range(3)
            ]
            await write_rows(store, pending, rows)
            assert (await install_version(store, pending, offset=7, rows=len(rows))).installed
        finally:
            await store.close()
        async with LogHostClient(live.url, SERVICE_KEY) as service:
            assert await service.compact("alice", cid, 7) == 7

        three = await run_example(sys.executable, *args, cwd=tmp_path)
        check_round(three, 3)
        assert three["first_offset"] == 13
        assert three["compaction_offset"] == 7
        assert three["compacted"] == {
            "available": True,
            "version": 1,
            "offset": 7,
            "rows": 6,
            "ids": sorted(r.id for r in rows),
        }
        assert "compacted state v1: 6 documents" in three["_text"]


async def test_example_app_reports_a_host_error_in_one_line(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "store")) as live:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(EXAMPLE),
            "--url",
            live.url,
            "--api-key",
            "wrong-key",
            cwd=tmp_path,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 1
    assert out == b""
    lines = err.decode().splitlines()
    assert len(lines) == 1 and lines[0].startswith("log_app: "), lines
