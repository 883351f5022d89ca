"""Real uvicorn log hosts on free loopback ports, in-process (or as subprocesses), for tests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from host.api import create_app, uvicorn_config
from host.config import Settings
from host.server import Server
from verify.testkit import QuietUvicorn, free_port
from verify.testkit import wait_until as wait_until  # re-exported for the API tests
from wal3 import ObjectStore

SERVICE_KEY = "svc-key"
KEYS = f"{SERVICE_KEY}=*,alice-key=alice,bob-key=bob"
CID = "6d1f7a52-3c3e-4a5c-9d1e-0f2b7c9a1e01"


def auth(key: str = SERVICE_KEY) -> dict[str, str]:
    """The Authorization header for a key."""
    return {"Authorization": f"Bearer {key}"}


def record(i: int | str, op: str = "add", **kw: Any) -> dict[str, Any]:
    """A Record body."""
    return {"id": str(i), "op": op, **kw}


@dataclass
class Live:
    """A running log host."""

    url: str
    server: Server
    settings: Settings

    def client(self, key: str = SERVICE_KEY, **kw: Any) -> httpx.AsyncClient:
        """An HTTP client for this host."""
        return httpx.AsyncClient(base_url=self.url, headers=auth(key), timeout=30.0, **kw)


@contextlib.asynccontextmanager
async def live_server(
    store_url: str | None = None,
    *,
    store: ObjectStore | None = None,
    port: int | None = None,
    **settings: Any,
) -> AsyncIterator[Live]:
    """Run a log host on a free 127.0.0.1 port (or ``port``) until the block ends."""
    if store_url is None and store is None:
        # A default URL would be a directory under the working directory, shared between runs.
        raise ValueError("live_server needs a store: a URL or an ObjectStore")
    port = port or free_port()
    base: dict[str, Any] = {
        "store": store_url or "unused",  # not opened: ``store`` is used
        "listen": f"127.0.0.1:{port}",
        "api_keys": KEYS,
        "server_id": f"test-{port}",
        "rollup_interval_s": 3600.0,
        "idle_close_s": 3600.0,
        "gc_interval_s": 3600.0,
        # The liveness record is written at start and on stop; beats only when a test asks.
        "membership_interval_s": 3600.0,
        "membership_ttl_s": 7200.0,
        "adopt_after_s": 14400.0,
        # Two in-process hosts on one store would route each log by rendezvous over their random
        # ports, so a test of a second host's own behaviour would see a 307 for about half of
        # its log ids (issue20_adversary, CI at 3304bc9).  Tests of routing ask for it.
        "routing": "none",
    }
    base.update(settings)
    cfg = Settings(**base)
    server = Server(cfg, store=store)
    userver = QuietUvicorn(uvicorn_config(create_app(server), cfg))
    task = asyncio.create_task(userver.serve())
    for _ in range(2000):  # wait for the socket, bounded
        if userver.started or task.done():
            break
        await asyncio.sleep(0.005)  # polling interval of a bounded wait for the socket
    if task.done():
        await task
        raise RuntimeError("server did not start")
    try:
        yield Live(f"http://127.0.0.1:{port}", server, cfg)
    finally:
        userver.should_exit = True
        await task


@dataclass
class Proc:
    """A log host in its own process (for kill -9 and restarts)."""

    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log: Path

    def kill9(self) -> None:
        """SIGKILL: no flush, no goodbye."""
        self.proc.kill()
        self.proc.wait(timeout=30)

    def terminate(self) -> int:
        """SIGTERM and wait for a graceful exit."""
        self.proc.terminate()
        return self.proc.wait(timeout=60)


def spawn_server(
    store: str,
    log_dir: Path,
    *,
    port: int | None = None,
    server_id: str = "p0",
    extra_env: dict[str, str] | None = None,
    api_keys: str | None = KEYS,
    extra_args: list[str] | None = None,
) -> Proc:
    """Start ``loghost serve`` as a subprocess and wait until it is ready (/readyz).

    ``api_keys=None`` starts it with no LOGHOST_API_KEYS at all; ``extra_args`` are appended to
    the command line (e.g. ``["--dev"]``).
    """
    port = port or free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHOST_")}
    env.update(
        {
            "LOGHOST_ROLLUP_INTERVAL_S": "3600",
            "LOGHOST_LOG_LEVEL": "WARNING",
            # A restart after kill -9 watches the dead incarnation's record for 1.5 beats.
            "LOGHOST_MEMBERSHIP_INTERVAL_S": "0.2",
            "LOGHOST_MEMBERSHIP_TTL_S": "2",
        }
    )
    if api_keys is not None:
        env["LOGHOST_API_KEYS"] = api_keys
    env.update(extra_env or {})
    log = log_dir / f"server-{server_id}-{port}.log"
    out = open(log, "ab")  # noqa: SIM115 - owned by the process
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "host.cli",
            "serve",
            "--store",
            store,
            "--listen",
            f"127.0.0.1:{port}",
            "--server-id",
            server_id,
            *(extra_args or []),
        ],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {log.read_text()[-2000:]}")
        try:
            # /readyz: /healthz answers 200 while the host is still starting (cli_serve).
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return Proc(url, port, proc, log)
        except httpx.HTTPError:
            pass
        time.sleep(0.05)  # polling for readiness, bounded by the deadline
    proc.kill()
    raise RuntimeError("server did not become healthy")


# ------------------------------------------------------------------------------------------------
# Shared helpers of the API tests.

PROMETHEUS_SAMPLE = re.compile(
    r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?\s+(\S+)'
)


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in Prometheus text (labels must all match); None if absent."""
    for line in text.splitlines():
        m = PROMETHEUS_SAMPLE.match(line)
        if m is None or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(3))
    return None


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of ``name`` (all label sets); 0 when absent."""
    total = 0.0
    for line in text.splitlines():
        m = PROMETHEUS_SAMPLE.match(line)
        if m is not None and m.group(1) == name:
            total += float(m.group(3))
    return total


async def metrics_text(client: httpx.AsyncClient) -> str:
    """GET /metrics."""
    r = await client.get("/metrics")
    assert r.status_code == 200, r.text
    return r.text


def log_path(tenant: str, collection_id: Any) -> str:
    """The API path of one log."""
    return f"/v1/tenants/{tenant}/logs/{collection_id}"


async def read_all(
    client: httpx.AsyncClient, path: str, start: int = 1, limit: int = 1000
) -> list[dict[str, Any]]:
    """Every record of a log from ``start`` to its tail, following next_offset."""
    out: list[dict[str, Any]] = []
    nxt = start
    while True:
        r = await client.get(path + "/records", params={"from": nxt, "limit": limit})
        assert r.status_code == 200, r.text
        body = r.json()
        out.extend(body["records"])
        if not body["records"]:
            return out
        nxt = body["next_offset"]


def assert_error(r: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    """Assert the status and the error shape ``{"error": {"code", "message"}}``; the error."""
    assert r.status_code == status, f"expected {status}, got {r.status_code}: {r.text}"
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert isinstance(err.get("code"), str) and err["code"], body
    assert isinstance(err.get("message"), str) and err["message"], body
    if code is not None:
        assert err["code"] == code, body
    return err
