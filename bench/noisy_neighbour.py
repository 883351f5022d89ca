"""Noisy neighbour (issue 19): one tenant floods, another keeps a light steady load.

A real ``python -m host.cli serve`` (``bench.loadgen.ServerProcess``: LocalStore with fsync, the
server's defaults otherwise) with one API key per tenant and the same default quota for every
tenant (``QUOTAS``).  Two tenants:

* **A** (``tenant-a``) floods: ``wrk -t1`` from a separate process (else ``bench.loadgen``'s
  asyncio client, which cannot count statuses: then A's 429s are reported as errors only),
  64 keep-alive connections in a closed loop, appends of 100 records round-robin over 100 of its
  logs.  It retries at once: it ignores ``Retry-After``, the worst case for its neighbours.  A Lua
  ``response`` hook counts its answers by status and its 429s that carry ``Retry-After``.
* **B** (``tenant-b``) appends 1 record to its own log 5 times a second, open loop (each append
  at its scheduled time, on an idle keep-alive connection or a new one), from this process, and
  records each latency.  Beside it, a probe ``GET /healthz`` 5 times a second (no auth, no store
  I/O) measures what the event loop alone adds: B's append latency minus that is the append path.

The run alternates windows "A idle" and "A flooding" (``pairs`` of each, idle first), all in one
run of one server, so the ratio p99(flood) / p99(idle) compares neighbouring minutes of the same
noisy machine.  B's requests are assigned to a window by when they were sent; the first
``trim_s`` of each window (A's connections starting or draining) is left out.  Targets (issue
19): the ratio <= 2, B gets 0 429s, A's 429s carry Retry-After.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from . import common, loadgen

NAME = "noisy_neighbour"
TENANT_A, KEY_A = "tenant-a", "tenant-a-key"
TENANT_B, KEY_B = "tenant-b", "tenant-b-key"
# Every tenant gets the same default quota; A's flood is far over its rates, B's 5/s far under.
# Each case of the run sets ``records_per_s`` (the quota A's 100-record appends meet first).
QUOTAS: dict[str, Any] = {
    "default": {
        "appends_per_s": 100,
        "records_per_s": 2000,
        "open_logs": 200,
        "created_logs": 1000,
        "pending_bytes": 32 << 20,
        "records_per_request": 1000,
    },
    "tenants": {},
}
FULL: dict[str, Any] = {
    "records_per_s": [2000, 5000],
    "pairs": 3,
    "window_s": 20,
    "trim_s": 1.0,
    "a_connections": 64,
    "a_logs": 100,
    "a_records": 100,
    "b_rate": 5.0,
    "warmup_s": 3,
    # The fairness cost (issue 19's third measure): the same flood with the fair share on and
    # off, alternating, a server each; a byte budget small enough that A contends for it.
    "cost_pairs": 2,
    "cost_window_s": 15,
    "cost_budget_bytes": 4 << 20,
}
QUICK: dict[str, Any] = {
    "records_per_s": [2000],
    "pairs": 2,
    "window_s": 3,
    "trim_s": 0.5,
    "a_connections": 64,
    "a_logs": 20,
    "a_records": 100,
    "b_rate": 5.0,
    "warmup_s": 1,
    "cost_pairs": 1,
    "cost_window_s": 3,
    "cost_budget_bytes": 4 << 20,
}
TARGET_COST = 0.9  # A's throughput with the fair share on, at least this share of it off
# The quotas of the cost runs: no rate quota (else it, not the fair share, bounds A).
COST_QUOTAS: dict[str, Any] = {
    "default": {"open_logs": 200, "created_logs": 1000, "records_per_request": 1000},
    "tenants": {},
}
TARGET_RATIO = 2.0

_WRK_LUA = r"""
local paths = {}
for p in io.lines(os.getenv("BENCH_PATHS_FILE")) do if #p > 0 then paths[#paths + 1] = p end end
local f = io.open(os.getenv("BENCH_BODY_FILE"), "rb")
local body = f:read("*all")
f:close()
wrk.method = "POST"
wrk.body = body
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer " .. os.getenv("BENCH_KEY")
local threads = {}
local i = 0
ok, throttled, throttled_ra, other = 0, 0, 0, 0
setup = function(thread)
  thread:set("offset", math.random(1, #paths))
  table.insert(threads, thread)
end
request = function()
  i = i + 1
  return wrk.format(nil, paths[((i + (offset or 0)) % #paths) + 1])
end
response = function(status, headers, body)
  if status == 200 then
    ok = ok + 1
  elseif status == 429 then
    throttled = throttled + 1
    for k, _ in pairs(headers) do
      if string.lower(k) == "retry-after" then throttled_ra = throttled_ra + 1 break end
    end
  else
    other = other + 1
  end
end
done = function(summary, latency, requests)
  local c = {ok = 0, throttled = 0, throttled_ra = 0, other = 0}
  for _, t in ipairs(threads) do
    for k, _ in pairs(c) do c[k] = c[k] + (t:get(k) or 0) end
  end
  io.write(string.format(
    "BENCHJSON {\"requests\":%d,\"duration_us\":%d,\"status_errors\":%d,\"connect_errors\":%d," ..
    "\"read_errors\":%d,\"write_errors\":%d,\"timeouts\":%d,\"p50_us\":%d,\"p99_us\":%d," ..
    "\"ok\":%d,\"throttled\":%d,\"throttled_retry_after\":%d,\"other\":%d}\n",
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout,
    latency:percentile(50), latency:percentile(99),
    c.ok, c.throttled, c.throttled_ra, c.other))
end
"""


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("noisy_neighbour")
    g.add_argument(
        "--nn-pairs", type=int, default=None, help="idle/flood window pairs (3; quick 2)"
    )
    g.add_argument("--nn-window", type=float, default=None, help="seconds per window (20; quick 3)")
    g.add_argument(
        "--nn-records-per-s",
        default=None,
        help="comma-separated records_per_s quotas, one case each (2000,5000; quick 2000)",
    )


# ------------------------------------------------------------------------------- clients


def _head(method: str, path: str, port: int, key: str | None, body: bytes) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}"]
    if key is not None:
        lines.append(f"Authorization: Bearer {key}")
    if method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _exchange(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> tuple[int, dict[str, str]]:
    """One request on a keep-alive connection: (status, headers in lower case)."""
    writer.write(data)
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split(b" ", 2)[1])
    headers: dict[str, str] = {}
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.decode("latin-1").partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0"))
    if length:
        await reader.readexactly(length)
    return status, headers


class _Pool:
    """Keep-alive connections to the server, one request at a time each; opens another when
    all are busy (an open-loop sender never waits for a connection)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self.opened = 0

    async def send(self, data: bytes) -> tuple[int, dict[str, str]]:
        conn = self.idle.pop() if self.idle else None
        if conn is None:
            conn = await asyncio.open_connection("127.0.0.1", self.port)
            self.opened += 1
        try:
            out = await _exchange(conn[0], conn[1], data)
        except BaseException:
            conn[1].close()
            raise
        self.idle.append(conn)
        return out

    def close(self) -> None:
        for _, w in self.idle:
            w.close()
        self.idle.clear()


async def _steady(
    port: int,
    rate: float,
    make: Any,
    samples: list[dict[str, Any]],
    stop: asyncio.Event,
) -> None:
    """Open loop: one request every 1/rate s at its scheduled time, each sample recorded as
    (sent, latency, status, retry_after) on the system-wide monotonic clock."""
    pool = _Pool(port)
    tasks: set[asyncio.Task[None]] = set()

    async def one(n: int) -> None:
        data = make(n)
        t0 = time.monotonic()
        try:
            status, headers = await pool.send(data)
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError) as e:
            samples.append({"t": t0, "lat": time.monotonic() - t0, "status": 0, "err": str(e)})
            return
        samples.append(
            {
                "t": t0,
                "lat": time.monotonic() - t0,
                "status": status,
                "retry_after": headers.get("retry-after"),
            }
        )

    start = time.monotonic()
    n = 0
    try:
        while not stop.is_set():
            due = start + n / rate
            delay = due - time.monotonic()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            task = asyncio.create_task(one(n))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            n += 1
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        pool.close()


def _b_body(n: int) -> bytes:
    rec = loadgen.record(n)
    rec["id"] = f"b-{n:08d}"
    return json.dumps({"records": [rec]}, separators=(",", ":")).encode()


async def _open_logs(port: int, paths: list[str], key: str, body: bytes) -> dict[str, Any]:
    """One append per log with the tenant's own key (creating it), 16 at a time; a 429 waits
    its Retry-After and tries again."""
    todo = list(paths)
    throttled = 0
    t0 = time.monotonic()

    async def worker() -> None:
        nonlocal throttled
        pool = _Pool(port)
        try:
            while todo:
                p = todo.pop()
                while True:
                    status, headers = await pool.send(_head("POST", p, port, key, body) + body)
                    if status == 429:
                        throttled += 1
                        await asyncio.sleep(float(headers.get("retry-after", "1")))
                        continue
                    if status != 200:
                        raise RuntimeError(f"opening {p}: HTTP {status}")
                    break
        finally:
            pool.close()

    await asyncio.gather(*(worker() for _ in range(min(16, len(paths)))))
    return {"logs": len(paths), "seconds": time.monotonic() - t0, "throttled": throttled}


def _flood_command(
    base: str, paths: list[str], body: bytes, connections: int, duration_s: float, work: Path
) -> tuple[list[str], dict[str, str], bool]:
    """The load generator's command line and environment (its inputs written to ``work``),
    and whether it is wrk."""
    work.mkdir(parents=True, exist_ok=True)
    body_file = work / "a-body.bin"
    body_file.write_bytes(body)
    paths_file = work / "a-paths.txt"
    paths_file.write_text("\n".join(paths) + "\n")
    env = dict(os.environ)
    env.update(
        {
            "BENCH_PATHS_FILE": str(paths_file),
            "BENCH_BODY_FILE": str(body_file),
            "BENCH_METHOD": "POST",
            "BENCH_KEY": KEY_A,
        }
    )
    w = loadgen.wrk_path()
    if w is not None:
        lua = work / "noisy.lua"
        lua.write_text(_WRK_LUA)
        dur = max(1, round(duration_s))
        cmd = [w, "-t1", f"-c{connections}", f"-d{dur}s", "--timeout=30s", "-s", str(lua), base]
        return cmd, env, True
    # bench.loadgen's client counts every status >= 400 as an error, 429s included.
    cmd = [sys.executable, "-m", "bench.loadgen", base, str(connections), str(duration_s)]
    return cmd, env, False


async def _flood(
    base: str, paths: list[str], body: bytes, connections: int, duration_s: float, work: Path
) -> dict[str, Any]:
    """Tenant A's flood for ``duration_s`` from a separate process (wrk, else bench.loadgen)."""
    cmd, env, wrk = _flood_command(base, paths, body, connections, duration_s, work)
    proc = await asyncio.create_subprocess_exec(
        *cmd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=env,
        cwd=common.ROOT,
    )
    out, err = await proc.communicate()
    text = out.decode(errors="replace")
    line = next((ln for ln in text.splitlines() if ln.startswith("BENCHJSON ")), None)
    if line is None:
        raise RuntimeError(f"load generator failed: {text[-2000:]} {err.decode()[-2000:]}")
    res: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
    if not wrk:
        res["throttled"] = res["status_errors"]  # unknown statuses: all counted as 429s
        res["throttled_retry_after"] = None
        res["ok"] = res["requests"] - res["status_errors"]
        res["other"] = 0
    res["client"] = "wrk" if wrk else "python"
    return res


# ------------------------------------------------------------------------------- the run


def _a_paths(n: int) -> list[str]:
    """Tenant A's logs, new ones each run."""
    salt = random.randrange(1 << 16)
    return [
        f"/v1/tenants/{TENANT_A}/logs/00000000-0000-4000-{salt:04x}-{k:012x}/records"
        for k in range(1, n + 1)
    ]


def _host_env(quotas_file: Path) -> dict[str, str]:
    """The host's keys (the service's, A's, B's) and quotas file."""
    return {
        "LOGHOST_API_KEYS": f"{loadgen.API_KEY}=*,{KEY_A}={TENANT_A},{KEY_B}={TENANT_B}",
        "LOGHOST_TENANT_QUOTAS_FILE": str(quotas_file),
    }


async def _fairness_cost(cfg: dict[str, Any], work: Path) -> list[dict[str, Any]]:
    """Issue 19's third measure: A's throughput with the fair share of the server-wide byte
    budget on (``weighted``, the default) and off (``fifo``), the same flood with B beside it.
    The budget is small enough (``cost_budget_bytes``) that A's 64 connections contend for it,
    or the fair share would never engage; A has no rate quota, or that would bound it.  One
    server per run, runs alternating."""
    a_paths = _a_paths(cfg["a_logs"])
    a_body = loadgen.append_body(cfg["a_records"], seed=19)
    runs = []
    for pair in range(cfg["cost_pairs"]):
        for mode in ("weighted", "fifo"):
            d = work / f"cost-{pair}-{mode}"
            d.mkdir(parents=True, exist_ok=True)
            quotas_file = d / "quotas.json"
            _write_quotas(quotas_file, COST_QUOTAS)
            env = {
                **_host_env(quotas_file),
                "LOGHOST_FAIR_SHARE": mode,
                "LOGHOST_MAX_BUFFERED_BYTES": str(cfg["cost_budget_bytes"]),
            }
            with loadgen.ServerProcess("host", d / "host", env=env) as host:
                b_path = f"/v1/tenants/{TENANT_B}/logs/{uuid.uuid4()}/records"
                await _open_logs(host.port, a_paths, KEY_A, loadgen.append_body(1))
                await _open_logs(host.port, [b_path], KEY_B, loadgen.append_body(1))
                b: list[dict[str, Any]] = []
                stop = asyncio.Event()
                port = host.port
                sender = asyncio.create_task(
                    _steady(
                        port,
                        cfg["b_rate"],
                        lambda n, p=b_path, port=port: (
                            _head("POST", p, port, KEY_B, _b_body(n)) + _b_body(n)
                        ),
                        b,
                        stop,
                    )
                )
                t0 = time.monotonic()
                flood = await _flood(
                    host.base, a_paths, a_body, cfg["a_connections"], cfg["cost_window_s"], d
                )
                t1 = time.monotonic()
                stop.set()
                await sender
            secs = flood["duration_us"] / 1e6
            b_ok = sorted(
                x["lat"] for x in b if x["status"] == 200 and t0 + cfg["trim_s"] <= x["t"] < t1
            )
            run = {
                "pair": pair,
                "fair_share": mode,
                "a_requests_per_s": flood["requests"] / secs,
                "a_ok_per_s": flood["ok"] / secs,
                "a_429": flood["throttled"],
                "b_n": len(b_ok),
                "b_429": sum(1 for x in b if x["status"] == 429),
                "b_p50_ms": common.percentile(b_ok, 50) * 1e3,
                "b_p99_ms": common.percentile(b_ok, 99) * 1e3,
            }
            runs.append(run)
            print(
                f"  . fairness cost {pair + 1} {mode}: A {run['a_ok_per_s']:.1f} ok/s, "
                f"{run['a_429']} 429; B p99 {run['b_p99_ms']:.1f} ms, {run['b_429']} 429",
                flush=True,
            )
    return runs


def _cost_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    by = {m: [r for r in runs if r["fair_share"] == m] for m in ("weighted", "fifo")}
    ok = {m: sum(r["a_ok_per_s"] for r in rs) / len(rs) for m, rs in by.items() if rs}
    return {"a_ok_per_s": ok, "ratio": ok["weighted"] / ok["fifo"] if ok.get("fifo") else None}


def case_quotas(records_per_s: float) -> dict[str, Any]:
    """The quotas of one case: ``QUOTAS`` with this ``records_per_s``."""
    return {**QUOTAS, "default": {**QUOTAS["default"], "records_per_s": records_per_s}}


def _write_quotas(path: Path, quotas: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(quotas))
    os.replace(tmp, path)  # a new inode: the host re-reads it on its next request


async def _windows(
    host: loadgen.ServerProcess, cfg: dict[str, Any], work: Path, quotas_file: Path
) -> dict[str, Any]:
    port = host.port
    a_paths = _a_paths(cfg["a_logs"])
    b_path = f"/v1/tenants/{TENANT_B}/logs/{uuid.uuid4()}/records"
    a_body = loadgen.append_body(cfg["a_records"], seed=19)
    opened = await _open_logs(port, a_paths, KEY_A, loadgen.append_body(1))
    await _open_logs(port, [b_path], KEY_B, loadgen.append_body(1))

    b_samples: list[dict[str, Any]] = []
    probe_samples: list[dict[str, Any]] = []
    stop = asyncio.Event()
    healthz = _head("GET", "/healthz", port, None, b"")
    senders = [
        asyncio.create_task(
            _steady(
                port,
                cfg["b_rate"],
                lambda n: _head("POST", b_path, port, KEY_B, _b_body(n)) + _b_body(n),
                b_samples,
                stop,
            )
        ),
        asyncio.create_task(_steady(port, cfg["b_rate"], lambda n: healthz, probe_samples, stop)),
    ]
    windows: list[dict[str, Any]] = []
    # This process measures B's latency: its own garbage collector must not pause it (a full
    # collection over the bench's imports took hundreds of ms on a loaded machine, charged to
    # whatever B request was in flight).  Collected at each window's start, inside the trim.
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        # Warm-up (not measured): B alone, then a short flood.
        await asyncio.sleep(cfg["warmup_s"])
        await _flood(host.base, a_paths, a_body, cfg["a_connections"], cfg["warmup_s"], work)
        for case, rate in enumerate(cfg["records_per_s"]):
            _write_quotas(quotas_file, case_quotas(rate))
            await _case(host, cfg, work, case, a_paths, a_body, windows)
    finally:
        stop.set()
        await asyncio.gather(*senders, return_exceptions=True)
        gc.enable()
        gc.unfreeze()
    return {
        "opened": opened,
        "windows": windows,
        "b": b_samples,
        "probe": probe_samples,
    }


async def _case(
    host: loadgen.ServerProcess,
    cfg: dict[str, Any],
    work: Path,
    case: int,
    a_paths: list[str],
    a_body: bytes,
    windows: list[dict[str, Any]],
) -> None:
    """One quota case: ``pairs`` of (A idle, A flooding) windows, appended to ``windows``."""
    for pair in range(cfg["pairs"]):
        for state in ("idle", "flood"):
            gc.collect()
            c0, _ = host.cpu_rss()
            m0, o0 = host.thread_cpu()
            t0 = time.monotonic()
            flood = None
            if state == "idle":
                await asyncio.sleep(cfg["window_s"])
            else:
                flood = await _flood(
                    host.base,
                    a_paths,
                    a_body,
                    cfg["a_connections"],
                    cfg["window_s"],
                    work,
                )
            t1 = time.monotonic()
            c1, rss = host.cpu_rss()
            m1, o1 = host.thread_cpu()
            windows.append(
                {
                    "case": case,
                    "pair": pair,
                    "state": state,
                    "t0": t0,
                    "t1": t1,
                    "server_cpu_s": c1 - c0,
                    "loop_cpu_s": m1 - m0,
                    "other_threads_cpu_s": o1 - o0,
                    "server_rss": rss,
                    "a": flood,
                }
            )
            print(f"  . case {case + 1} window {pair + 1} {state}: {t1 - t0:.1f} s", flush=True)


def _summarise(
    windows: list[dict[str, Any]],
    b_samples: list[dict[str, Any]],
    probe_samples: list[dict[str, Any]],
    trim_s: float,
) -> dict[str, Any]:
    """Per window and per state of one case: B's latencies (trimmed), its statuses, the
    probe's, A's answers."""
    out_windows = []
    pooled: dict[str, dict[str, list[float]]] = {
        s: {"b": [], "probe": []} for s in ("idle", "flood")
    }
    for w in windows:
        lo, hi = w["t0"] + trim_s, w["t1"]
        b = [s for s in b_samples if lo <= s["t"] < hi]
        probe = [s for s in probe_samples if lo <= s["t"] < hi]
        b_ok = sorted(s["lat"] for s in b if s["status"] == 200)
        p_ok = sorted(s["lat"] for s in probe if s["status"] == 200)
        pooled[w["state"]]["b"] += b_ok
        pooled[w["state"]]["probe"] += p_ok
        secs = w["t1"] - w["t0"]
        out_windows.append(
            {
                "pair": w["pair"],
                "state": w["state"],
                "seconds": secs,
                "b_n": len(b),
                "b_ok": len(b_ok),
                "b_429": sum(1 for s in b if s["status"] == 429),
                "b_errors": sum(1 for s in b if s["status"] not in (200, 429)),
                "b_p50_ms": common.percentile(b_ok, 50) * 1e3,
                "b_p99_ms": common.percentile(b_ok, 99) * 1e3,
                "b_max_ms": (b_ok[-1] * 1e3) if b_ok else float("nan"),
                "probe_p50_ms": common.percentile(p_ok, 50) * 1e3,
                "probe_p99_ms": common.percentile(p_ok, 99) * 1e3,
                "server_cores": w["server_cpu_s"] / secs,
                "loop_cores": w["loop_cpu_s"] / secs,
                "a": w["a"],
            }
        )
    states = {}
    for state, d in pooled.items():
        b_lat, p_lat = sorted(d["b"]), sorted(d["probe"])
        ws = [w for w in out_windows if w["state"] == state]
        a_runs = [w["a"] for w in ws if w["a"]]
        secs = sum(w["seconds"] for w in ws)
        st: dict[str, Any] = {
            "windows": len(ws),
            "b_n": sum(w["b_n"] for w in ws),
            "b_429": sum(w["b_429"] for w in ws),
            "b_errors": sum(w["b_errors"] for w in ws),
            "b_p50_ms": common.percentile(b_lat, 50) * 1e3,
            "b_p99_ms": common.percentile(b_lat, 99) * 1e3,
            "b_max_ms": (b_lat[-1] * 1e3) if b_lat else float("nan"),
            "probe_p50_ms": common.percentile(p_lat, 50) * 1e3,
            "probe_p99_ms": common.percentile(p_lat, 99) * 1e3,
            "server_cores": sum(w["server_cores"] * w["seconds"] for w in ws) / secs,
            "loop_cores": sum(w["loop_cores"] * w["seconds"] for w in ws) / secs,
        }
        if a_runs:
            a_secs = sum(a["duration_us"] for a in a_runs) / 1e6
            st["a_requests_per_s"] = sum(a["requests"] for a in a_runs) / a_secs
            st["a_ok_per_s"] = sum(a["ok"] for a in a_runs) / a_secs
            st["a_429"] = sum(a["throttled"] for a in a_runs)
            ra = [a["throttled_retry_after"] for a in a_runs]
            st["a_429_retry_after"] = None if None in ra else sum(ra)
            st["a_other"] = sum(a["other"] for a in a_runs)
            st["a_errors"] = sum(
                a[k] for a in a_runs for k in ("connect_errors", "read_errors", "timeouts")
            )
        states[state] = st
    idle, flood = states["idle"], states["flood"]
    ratios = []
    for pair in sorted({w["pair"] for w in out_windows}):
        i = next(w for w in out_windows if w["pair"] == pair and w["state"] == "idle")
        f = next(w for w in out_windows if w["pair"] == pair and w["state"] == "flood")
        ratios.append(f["b_p99_ms"] / i["b_p99_ms"])
    return {
        "windows": out_windows,
        "states": states,
        "ratio_p99": flood["b_p99_ms"] / idle["b_p99_ms"],
        "ratio_p50": flood["b_p50_ms"] / idle["b_p50_ms"],
        "pair_ratios_p99": ratios,
    }


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    if getattr(args, "nn_pairs", None):
        cfg["pairs"] = args.nn_pairs
    if getattr(args, "nn_window", None):
        cfg["window_s"] = args.nn_window
    if getattr(args, "nn_records_per_s", None):
        cfg["records_per_s"] = [float(v) for v in args.nn_records_per_s.split(",") if v]
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(common.scratch_dir("noisy"))
        quotas_file = work / "quotas.json"
        _write_quotas(quotas_file, case_quotas(cfg["records_per_s"][0]))
        with loadgen.ServerProcess("host", work / "host", env=_host_env(quotas_file)) as host:
            raw = asyncio.run(_windows(host, cfg, work, quotas_file))
        cost_runs = asyncio.run(_fairness_cost(cfg, work)) if cfg.get("cost_pairs") else []
    cases = []
    for case, rate in enumerate(cfg["records_per_s"]):
        ws = [w for w in raw["windows"] if w["case"] == case]
        summary = _summarise(ws, raw["b"], raw["probe"], cfg["trim_s"])
        cases.append({"records_per_s": rate, "quotas": case_quotas(rate), **summary})
    t_first = raw["windows"][0]["t0"]

    def rows(samples: list[dict[str, Any]]) -> list[list[Any]]:
        return [
            [round(x["t"] - t_first, 3), round(x["lat"] * 1e3, 3), x["status"]] for x in samples
        ]

    data = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "client": loadgen.client_name(),
        "config": {**cfg, "quotas": QUOTAS, "record_json_bytes": loadgen.record_json_bytes()},
        "opened": raw["opened"],
        "cases": cases,
        "cost": {"runs": cost_runs, **_cost_summary(cost_runs)} if cost_runs else None,
        # The series for the plot: seconds since the first window, latency in ms, status.
        "series": {
            "windows": [
                [w["t0"] - t_first, w["t1"] - t_first, w["state"], w["case"]]
                for w in raw["windows"]
            ],
            "b": rows(raw["b"]),
            "probe": rows(raw["probe"]),
        },
    }
    for c in cases:
        for state in ("idle", "flood"):
            st = c["states"][state]
            print(
                f"  . {c['records_per_s']:g} rec/s quota, {state}: B p50 {st['b_p50_ms']:.1f} ms "
                f"p99 {st['b_p99_ms']:.1f} ms (n {st['b_n']}, 429 {st['b_429']}); probe p99 "
                f"{st['probe_p99_ms']:.1f} ms"
                + (
                    f"; A {st['a_requests_per_s']:.0f} req/s, {st['a_ok_per_s']:.0f} ok/s, "
                    f"429 {st['a_429']} (Retry-After {st['a_429_retry_after']})"
                    if "a_429" in st
                    else ""
                ),
                flush=True,
            )
        print(f"  . p99 flood / idle = {c['ratio_p99']:.2f}", flush=True)
    data["plot"] = str(plot(data, common.img_path(NAME, quick)))
    return data


# ------------------------------------------------------------------------------- rendering


def _verdicts(c: dict[str, Any]) -> list[tuple[str, str, bool]]:
    st = c["states"]
    a = st["flood"]
    ra = a.get("a_429_retry_after")
    b_429 = st["idle"]["b_429"] + st["flood"]["b_429"]
    return [
        (
            f"B's p99 with A flooding <= {TARGET_RATIO:g}x B's p99 with A idle",
            f"{c['ratio_p99']:.2f}x ({st['flood']['b_p99_ms']:.1f} / "
            f"{st['idle']['b_p99_ms']:.1f} ms)",
            c["ratio_p99"] <= TARGET_RATIO,
        ),
        (
            "B gets 0 429s",
            f"{b_429} of {st['idle']['b_n'] + st['flood']['b_n']}",
            b_429 == 0,
        ),
        (
            "A is throttled by its own quota, with Retry-After",
            f"{a.get('a_429', 0):,} 429s, {ra if ra is not None else '?'} with Retry-After",
            bool(a.get("a_429")) and ra == a.get("a_429"),
        ),
    ]


def _case_tables(c: dict[str, Any]) -> list[str]:
    rows = []
    for w in c["windows"]:
        a = w["a"] or {}
        secs = (a.get("duration_us") or 0) / 1e6
        rows.append(
            [
                f"{w['pair'] + 1} {'A flooding' if w['state'] == 'flood' else 'A idle'}",
                w["b_n"],
                w["b_p50_ms"],
                w["b_p99_ms"],
                w["b_max_ms"],
                w["b_429"],
                w["probe_p50_ms"],
                w["probe_p99_ms"],
                (a["requests"] / secs) if a else None,
                (a["ok"] / secs) if a else None,
                a.get("throttled") if a else None,
                w["server_cores"],
                w["loop_cores"],
            ]
        )
    out = [
        common.md_table(
            [
                "window",
                "B appends",
                "B p50 ms",
                "B p99 ms",
                "B max ms",
                "B 429",
                "probe p50 ms",
                "probe p99 ms",
                "A req/s",
                "A 200/s",
                "A 429",
                "server cores busy",
                "event-loop thread cores",
            ],
            rows,
        ),
        "",
        "All windows of each state together:",
        "",
    ]
    srows = []
    for state in ("idle", "flood"):
        st = c["states"][state]
        srows.append(
            [
                "A flooding" if state == "flood" else "A idle",
                st["b_n"],
                st["b_p50_ms"],
                st["b_p99_ms"],
                st["b_max_ms"],
                st["b_429"],
                st["b_errors"],
                st["probe_p50_ms"],
                st["probe_p99_ms"],
                st.get("a_ok_per_s"),
                st.get("a_429"),
                st.get("a_429_retry_after"),
            ]
        )
    out += [
        common.md_table(
            [
                "state",
                "B appends",
                "B p50 ms",
                "B p99 ms",
                "B max ms",
                "B 429",
                "B other errors",
                "probe p50 ms",
                "probe p99 ms",
                "A 200/s",
                "A 429",
                "A 429 with Retry-After",
            ],
            srows,
        ),
        "",
        f"B's p99 flood / idle: **{c['ratio_p99']:.2f}** over all windows (per pair: "
        + ", ".join(f"{r:.2f}" for r in c["pair_ratios_p99"])
        + f"); p50 {c['ratio_p50']:.2f}.",
        "",
        common.md_table(
            ["target (issue 19)", "measured", "verdict"],
            [[t, m, "met" if ok else "**missed**"] for t, m, ok in _verdicts(c)],
        ),
    ]
    return out


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    q = {k: v for k, v in cfg["quotas"]["default"].items() if k != "records_per_s"}
    out = [
        f"Tenant A: {data['client']}, {cfg['a_connections']} keep-alive connections, closed "
        f"loop (a 429 is retried at once, Retry-After ignored), appends of {cfg['a_records']} "
        f"records round-robin over {cfg['a_logs']} logs.  Tenant B: {cfg['b_rate']:g} appends/s "
        f"of 1 record to its own log, open loop, plus a probe `GET /healthz` at the same rate.  "
        f"Records are {cfg['record_json_bytes']} B of JSON.  Windows of {cfg['window_s']:g} s, "
        f"{cfg['pairs']} of each state alternating (idle first); the first {cfg['trim_s']:g} s "
        f"of each window is left out.  Quota of every tenant: "
        + ", ".join(f"`{k}` {v:,}" for k, v in q.items())
        + ", and `records_per_s` as each case says (one server; the quotas file is rewritten "
        "between cases).",
    ]
    for c in data["cases"]:
        out += [
            "",
            f"**`records_per_s` {c['records_per_s']:,.0f}** (A's appends of "
            f"{cfg['a_records']} records: {c['records_per_s'] / cfg['a_records']:g} a second "
            "pass):",
            "",
            *_case_tables(c),
        ]
    cost = data.get("cost")
    if cost:
        out += ["", *_cost_tables(cfg, cost)]
    out += ["", f"![B's append latency, A idle and flooding](img/{Path(data['plot']).name})"]
    return "\n".join(out)


def _cost_tables(cfg: dict[str, Any], cost: dict[str, Any]) -> list[str]:
    ratio = cost["ratio"]
    return [
        f"**The fairness cost** (the issue's third measure): the same flood with the fair share "
        f"of the server-wide byte budget on (`LOGHOST_FAIR_SHARE=weighted`, the default) and "
        f"off (`fifo`), one server per run, runs alternating, {cfg['cost_window_s']:g} s each; "
        f"`LOGHOST_MAX_BUFFERED_BYTES` {cfg['cost_budget_bytes']:,} so that A's flood contends "
        "for it (else the fair share never engages), and no rate quota for A (else it, not the "
        "fair share, bounds A); B as above.",
        "",
        common.md_table(
            [
                "run",
                "fair share",
                "A req/s",
                "A 200/s",
                "A 429",
                "B appends",
                "B p50 ms",
                "B p99 ms",
                "B 429",
            ],
            [
                [
                    r["pair"] + 1,
                    r["fair_share"],
                    r["a_requests_per_s"],
                    r["a_ok_per_s"],
                    r["a_429"],
                    r["b_n"],
                    r["b_p50_ms"],
                    r["b_p99_ms"],
                    r["b_429"],
                ]
                for r in cost["runs"]
            ],
        ),
        "",
        common.md_table(
            ["target (issue 19)", "measured", "verdict"],
            [
                [
                    f"A's throughput with fairness on >= {TARGET_COST:g}x with it off",
                    f"{ratio:.2f}x ({cost['a_ok_per_s']['weighted']:.1f} / "
                    f"{cost['a_ok_per_s']['fifo']:.1f} appends/s)",
                    "met" if ratio >= TARGET_COST else "**missed**",
                ]
            ],
        ),
    ]


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, cdf) = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [2, 1]})
    series = data["series"]
    cases = data["cases"]
    for t0, t1, state, case in series["windows"]:
        if state == "flood":
            ax.axvspan(t0, t1, color="tab:red", alpha=0.08 + 0.1 * case, lw=0)
    for case, c in enumerate(cases):
        first = min(t0 for t0, _, _, k in series["windows"] if k == case)
        ax.axvline(first, color="black", lw=0.6)
        ax.annotate(
            f"records_per_s {c['records_per_s']:,.0f}",
            (first, 1),
            xycoords=("data", "axes fraction"),
            xytext=(3, -10),
            textcoords="offset points",
            fontsize=7,
        )
    b = [x for x in series["b"] if x[2] == 200]
    p = [x for x in series["probe"] if x[2] == 200]
    ax.plot(
        [x[0] for x in p], [x[1] for x in p], ".", ms=2, color="gray", label="probe GET /healthz"
    )
    ax.plot([x[0] for x in b], [x[1] for x in b], ".", ms=3, color="tab:blue", label="B append")
    bad = [x for x in series["b"] if x[2] != 200]
    if bad:
        ax.plot([x[0] for x in bad], [x[1] for x in bad], "x", color="tab:red", label="B not 200")
    ax.set_yscale("log")
    ax.set_xlabel("seconds (shaded: A flooding)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"tenant B, one request every {1000 / data['config']['b_rate']:.0f} ms")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")

    trim = data["config"]["trim_s"]

    def lat(case: int, state: str, samples: list[list[Any]]) -> list[float]:
        spans = [(t0 + trim, t1) for t0, t1, s, k in series["windows"] if s == state and k == case]
        return sorted(x[1] for x in samples if any(lo <= x[0] < hi for lo, hi in spans))

    styles = ["-", "--", "-.", ":"]
    for case, c in enumerate(cases):
        for state, color in (("idle", "tab:green"), ("flood", "tab:red")):
            xs = lat(case, state, b)
            if xs:
                cdf.plot(
                    xs,
                    [100 * (i + 1) / len(xs) for i in range(len(xs))],
                    styles[case % len(styles)],
                    color=color,
                    label=f"B, A {'flooding' if state == 'flood' else 'idle'}, quota "
                    f"{c['records_per_s']:,.0f} rec/s",
                )
    cdf.set_xscale("log")
    cdf.set_xlabel("B's append latency (ms)")
    cdf.set_ylabel("percentile")
    cdf.set_title("CDF by window state")
    cdf.grid(True, which="both", alpha=0.3)
    cdf.legend(fontsize=7)
    ratios = ", ".join(f"{c['ratio_p99']:.2f}" for c in cases)
    fig.suptitle(
        f"noisy neighbour: B's p99 flood / idle = {ratios} "
        f"({data['machine']['nproc']} cores, {data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
