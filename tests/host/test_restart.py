"""``loghost serve`` as a real process: SIGTERM, kill -9 under load, restarts, idempotent retries,
and refusing to start without keys."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from ..conftest import free_port
from .live import Proc, assert_error, auth, log_path, read_all, record, spawn_server, wait_until

LOGS = [str(uuid.UUID(int=i + 1, version=4)) for i in range(3)]


@dataclass
class Ledger:
    """What appenders sent and what the server acknowledged."""

    sent: dict[str, list[str]] = field(default_factory=dict)  # idempotency key -> record ids
    log_of: dict[str, str] = field(default_factory=dict)  # idempotency key -> collection id
    acked: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> answer

    @property
    def unacked(self) -> list[str]:
        return [k for k in self.sent if k not in self.acked]


async def appender(
    url: str, name: str, ledger: Ledger, stop: asyncio.Event, per_request: int = 3
) -> None:
    """Append until stopped or the server goes away; every request has its own idempotency key."""
    async with httpx.AsyncClient(base_url=url, headers=auth("alice-key"), timeout=30.0) as c:
        n = 0
        while not stop.is_set():
            cid = LOGS[n % len(LOGS)]
            key = f"{name}-{n}"
            ids = [f"{key}-r{j}" for j in range(1 + n % per_request)]
            ledger.sent[key] = ids
            ledger.log_of[key] = cid
            n += 1
            try:
                r = await c.post(
                    log_path("alice", cid) + "/records",
                    json={"records": [record(i) for i in ids], "idempotency_key": key},
                )
            except httpx.HTTPError:
                return  # the server is gone: this append's outcome is unknown
            if r.status_code == 200:
                ledger.acked[key] = r.json()
            elif r.status_code in (429, 503):
                continue
            else:
                return  # shutting down (e.g. 503/409): outcome known to be "not acknowledged"


async def check_ledger(url: str, ledger: Ledger) -> None:
    """Every acknowledged append is readable, once, where it was acknowledged; retries of every
    key (acknowledged or not) then leave each record exactly once in its log."""
    async with httpx.AsyncClient(base_url=url, headers=auth("alice-key"), timeout=30.0) as c:
        logs = {cid: await _records_or_empty(c, cid) for cid in LOGS}
        for key, answer in ledger.acked.items():
            recs = logs[ledger.log_of[key]]
            ids = ledger.sent[key]
            assert answer["count"] == len(ids)
            got = [r for r in recs if answer["first_offset"] <= r["offset"] < answer["next_offset"]]
            assert [r["record"]["id"] for r in got] == ids, (key, answer, got)
        for cid, recs in logs.items():
            offsets = [r["offset"] for r in recs]
            assert offsets == list(range(1, len(recs) + 1)), cid  # contiguous from 1
            ids = [r["record"]["id"] for r in recs]
            assert len(ids) == len(set(ids)), f"duplicated records in {cid}"
        # retry everything with the same keys: acknowledged ones answer as before, append nothing
        before = {cid: len(recs) for cid, recs in logs.items()}
        for key, answer in ledger.acked.items():
            r = await c.post(
                log_path("alice", ledger.log_of[key]) + "/records",
                json={"records": [record(i) for i in ledger.sent[key]], "idempotency_key": key},
            )
            assert r.status_code == 200, r.text
            assert r.json() == {**answer, "deduplicated": True}, (key, r.json(), answer)
        after = {cid: len(await _records_or_empty(c, cid)) for cid in LOGS}
        assert after == before
        for key in ledger.unacked:  # outcome unknown: the retry lands it at most once
            r = await c.post(
                log_path("alice", ledger.log_of[key]) + "/records",
                json={"records": [record(i) for i in ledger.sent[key]], "idempotency_key": key},
            )
            assert r.status_code == 200, r.text
        for cid in LOGS:
            ids = [r["record"]["id"] for r in await _records_or_empty(c, cid)]
            expected = {i for k, v in ledger.sent.items() if ledger.log_of[k] == cid for i in v}
            assert sorted(ids) == sorted(expected), cid


async def _records_or_empty(c: httpx.AsyncClient, cid: str) -> list[dict[str, Any]]:
    r = await c.get(log_path("alice", cid))
    if r.status_code == 404:
        return []
    return await read_all(c, log_path("alice", cid))


async def run_load_until(
    proc: Proc, ledger: Ledger, acks: int, appenders: int = 6
) -> tuple[asyncio.Event, list[asyncio.Task[None]]]:
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(appender(proc.url, f"a{i}", ledger, stop)) for i in range(appenders)
    ]
    await wait_until(
        lambda: len(ledger.acked) >= acks or all(t.done() for t in tasks),
        f"{acks} acknowledged appends",
        60.0,
    )
    assert len(ledger.acked) >= acks
    return stop, tasks


def server_log(proc: Proc) -> str:
    return proc.log.read_text(errors="replace")


# ---------------------------------------------------------------------------------- SIGTERM


async def test_sigterm_exits_0_after_flushing(tmp_path: Path) -> None:
    proc = spawn_server(str(tmp_path / "store"), tmp_path, extra_env={"LOGHOST_LOG_LEVEL": "INFO"})
    try:
        async with httpx.AsyncClient(base_url=proc.url, headers=auth("alice-key")) as c:
            r = await c.post(
                log_path("alice", LOGS[0]) + "/records", json={"records": [record("a")]}
            )
            assert r.status_code == 200, r.text
        rc = await asyncio.to_thread(proc.terminate)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    # the lifespan shutdown (which flushes every open log) ran to its end
    assert "Application shutdown complete" in server_log(proc), server_log(proc)[-3000:]
    assert rc == 0, f"exit code {rc} after SIGTERM; log tail:\n{server_log(proc)[-2000:]}"


async def test_acknowledged_appends_survive_sigterm_and_retries_dedupe_after_restart(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    proc = spawn_server(store, tmp_path)
    ledger = Ledger()
    try:
        async with httpx.AsyncClient(base_url=proc.url, headers=auth("alice-key")) as c:
            first = await c.post(
                log_path("alice", LOGS[0]) + "/records",
                json={"records": [record("x1"), record("x2")], "idempotency_key": "restart-key"},
            )
            assert first.status_code == 200, first.text
        stop, tasks = await run_load_until(proc, ledger, 60)
        # SIGTERM while appends are in flight: in-flight requests finish, then every log flushes
        proc.proc.terminate()
        rc = await asyncio.to_thread(proc.proc.wait, 60)
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    assert rc is not None  # it exited by itself (exit code checked in the test above)

    again = spawn_server(store, tmp_path, server_id="p0")
    try:
        async with httpx.AsyncClient(base_url=again.url, headers=auth("alice-key")) as c:
            state = (await c.get(log_path("alice", LOGS[0]))).json()
            retry = await c.post(
                log_path("alice", LOGS[0]) + "/records",
                json={"records": [record("x1"), record("x2")], "idempotency_key": "restart-key"},
            )
            assert retry.status_code == 200, retry.text
            assert retry.json() == {**first.json(), "deduplicated": True}
            assert (await c.get(log_path("alice", LOGS[0]))).json()["next_offset"] == state[
                "next_offset"
            ]
            recs = await read_all(c, log_path("alice", LOGS[0]))
            assert [r["record"]["id"] for r in recs].count("x1") == 1
        ledger.sent["restart-key"] = ["x1", "x2"]
        ledger.log_of["restart-key"] = LOGS[0]
        ledger.acked["restart-key"] = first.json()
        await check_ledger(again.url, ledger)
    finally:
        again.kill9()


# ----------------------------------------------------------------------------------- kill -9


async def test_kill9_under_load_loses_no_acknowledged_append(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    proc = spawn_server(store, tmp_path)
    ledger = Ledger()
    try:
        stop, tasks = await run_load_until(proc, ledger, 150)
        proc.kill9()  # mid-flight: no flush, no goodbye
        stop.set()
        await asyncio.gather(*tasks)
    finally:
        if proc.proc.poll() is None:
            proc.kill9()
    acked_at_kill = dict(ledger.acked)
    assert len(acked_at_kill) >= 150

    again = spawn_server(store, tmp_path, server_id="p0")
    try:
        await check_ledger(again.url, ledger)
        async with httpx.AsyncClient(base_url=again.url, headers=auth()) as c:  # scrub: service
            for cid in LOGS:  # and the logs are healthy end to end
                r = await c.get(log_path("alice", cid) + "/scrub")
                assert r.status_code == 200 and r.json()["ok"] is True, r.text
    finally:
        again.kill9()


# -------------------------------------------------------------------------------- no keys, --dev


def _env_without_loghost() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("LOGHOST_")}


def test_serve_without_keys_refuses_to_start(tmp_path: Path) -> None:
    port = free_port()
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "host.cli",
            "serve",
            "--store",
            str(tmp_path / "store"),
            "--listen",
            f"127.0.0.1:{port}",
            "--server-id",
            "nokeys",
        ],
        env=_env_without_loghost(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0, out
    assert "key" in (out.stderr + out.stdout).lower()
    # it never served
    try:
        httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
        served = True
    except httpx.HTTPError:
        served = False
    assert not served


async def test_dev_flag_creates_and_prints_a_working_key(tmp_path: Path) -> None:
    proc = spawn_server(
        str(tmp_path / "store"), tmp_path, server_id="dev", api_keys=None, extra_args=["--dev"]
    )
    try:
        found = re.findall(r"Bearer (\S+)", server_log(proc))
        assert found, server_log(proc)
        key = found[0]
        cid = str(uuid.uuid4())
        async with httpx.AsyncClient(base_url=proc.url, headers=auth(key)) as c:
            r = await c.post(log_path("dev", cid) + "/records", json={"records": [record("a")]})
            assert r.status_code == 200, r.text
            assert [x["record"]["id"] for x in await read_all(c, log_path("dev", cid))] == ["a"]
        async with httpx.AsyncClient(base_url=proc.url, headers=auth("svc-key")) as c:
            assert_error(await c.get(log_path("dev", cid)), 401)  # only the printed key works
    finally:
        proc.kill9()
