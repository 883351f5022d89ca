"""HTTP load plumbing shared by ``bench.http``, ``bench.scale`` and ``bench.peers``.

* :class:`ServerProcess` -- a real ``python -m host.cli serve`` (LocalStore, or any ``--store``
  URL such as ``s3://bucket/prefix``), or the bench-only ceiling app of ``bench.http_ceiling``
  (pinned to uvicorn ``--loop asyncio --http h11``), in a child process on 127.0.0.1, stopped
  with SIGINT (graceful), with its CPU time and RSS read from ``/proc``.  Optionally run under
  pyinstrument.
* :func:`run_load` -- closed-loop load from a *separate* process: ``wrk`` (C, one thread, epoll;
  the leanest client available, so it steals the least CPU from the server on 2 cores) when it is
  installed, else a small asyncio raw-HTTP/1.1 keep-alive client in this module (``python -m
  bench.loadgen``).  Either way each connection sends its next request when the previous answer
  arrives, cycling round-robin over the given paths.
* :func:`open_logs` -- one POST per log, to open (create) many logs before a measurement, timed.

Everything sends traffic to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verify.testkit import free_port, wait_for_port

from . import common

API_KEY = "benchkey"
# The HTTP ceiling's fixed stack (bench.http_ceiling; issue 14): uvicorn --loop asyncio --http h11.
CEILING_LOOP = "asyncio"
CEILING_HTTP = "h11"
DOC_CHARS = 600
EMBEDDING_DIM = 16
# Percentiles written for latency-distribution plots.
PCTS = [1, 5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 95, 97.5, 99, 99.5, 99.9]


# ------------------------------------------------------------------------------- payloads


def record(i: int, rng: random.Random | None = None) -> dict[str, Any]:
    """One record of the shape every HTTP/Chroma comparison uses: id, 600-character document,
    16-dim embedding, two metadata fields.  About 1 KiB as compact JSON."""
    rng = rng or random.Random(i)
    doc = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz     ") for _ in range(DOC_CHARS))
    return {
        "id": f"rec-{i:08d}",
        "op": "add",
        "document": doc,
        "metadata": {"source": "bench", "n": i},
        "embedding": [round(rng.uniform(-1, 1), 6) for _ in range(EMBEDDING_DIM)],
    }


def append_body(n: int, seed: int = 0) -> bytes:
    """A ``POST .../records`` body with ``n`` records."""
    rng = random.Random(seed)
    return json.dumps(
        {"records": [record(i, rng) for i in range(n)]}, separators=(",", ":")
    ).encode()


def record_json_bytes() -> int:
    """Bytes of one record as the host stores it (compact JSON)."""
    return len(json.dumps(record(0), separators=(",", ":")).encode())


def log_paths(n: int, tenant: str, salt: int = 0) -> list[str]:
    """``n`` distinct record paths of ``tenant``."""
    return [
        f"/v1/tenants/{tenant}/logs/00000000-0000-4000-{salt:04x}-{k:012x}/records"
        for k in range(1, n + 1)
    ]


# ------------------------------------------------------------------------------- processes


def _proc_stat(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, RSS bytes) of a process, all threads."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        tick = os.sysconf("SC_CLK_TCK")
        cpu = (int(fields[11]) + int(fields[12])) / tick
        rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        return cpu, rss
    except (OSError, IndexError, ValueError):
        return float("nan"), 0


class ServerProcess:
    """``loghost serve`` (kind="host") or the ceiling app (kind="ceiling") in a child process."""

    def __init__(
        self,
        kind: str,
        workdir: Path,
        *,
        env: dict[str, str] | None = None,
        profile_to: Path | None = None,
        python: str | None = None,
        store: str | None = None,
    ) -> None:
        self.kind = kind
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.workdir = workdir
        self.store_dir = workdir / "store"
        # The host's --store: LocalStore in store_dir unless a URL (s3://bucket/prefix) is given.
        self.store = store
        self.log_path = workdir / f"{kind}-{self.port}.log"
        self.env = dict(env or {})
        self.profile_to = profile_to
        self.python = python or sys.executable
        self.proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        if self.kind == "host":
            target = [
                "-m",
                "host.cli",
                "serve",
                "--store",
                self.store or str(self.store_dir),
                "--listen",
                f"127.0.0.1:{self.port}",
                "--server-id",
                "bench",
            ]
        else:
            # The ceiling's stack is pinned, whatever uvicorn's "auto" would pick here.
            target = [
                "-m",
                "bench.http_ceiling",
                "--listen",
                f"127.0.0.1:{self.port}",
                "--loop",
                CEILING_LOOP,
                "--http",
                CEILING_HTTP,
            ]
        if self.profile_to is not None:
            return [
                self.python,
                "-m",
                "pyinstrument",
                "-r",
                "pyisession",
                "-o",
                str(self.profile_to),
                *target,
            ]
        return [self.python, *target]

    def __enter__(self) -> ServerProcess:
        env = dict(os.environ)
        env.update(
            {
                "LOGHOST_API_KEYS": f"{API_KEY}=*",
                "LOGHOST_MAX_OPEN_LOGS": "20000",
                "LOGHOST_IDLE_CLOSE_S": "86400",
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.update(self.env)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv(),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=common.ROOT,
        )
        try:
            wait_for_port(self.port, 60, self.proc)
            self.wait_ready(60)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        """Until the server has started: ``loghost serve`` binds its port first and answers 503
        (``/healthz``: ``"status": "starting"``) while it opens its store, which on S3 takes a
        while; a load window must not begin before."""
        import urllib.error
        import urllib.request

        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no proxy
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with opener.open(f"{self.base}/healthz", timeout=5) as r:  # 127.0.0.1
                    body = r.read()
                try:
                    starting = json.loads(body).get("status") == "starting"
                except (ValueError, AttributeError):
                    starting = False
                if not starting:
                    return
            except urllib.error.HTTPError:
                return  # no /healthz here: the port is all there is to wait for
            except OSError:
                pass
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.kind} exited with status {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.kind} on port {self.port} not ready in {timeout_s} s")
            time.sleep(0.05)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def cpu_rss(self) -> tuple[float, int]:
        """The server's CPU seconds so far and its RSS now."""
        return _proc_stat(self.pid)

    def thread_cpu(self) -> tuple[float, float]:
        """CPU seconds of the main (event-loop) thread and of all other threads together."""
        main = other = 0.0
        tick = os.sysconf("SC_CLK_TCK")
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{self.pid}/task"):
                try:
                    with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                        fields = f.read().rsplit(")", 1)[1].split()
                except OSError:
                    continue
                cpu = (int(fields[11]) + int(fields[12])) / tick
                if int(tid) == self.pid:
                    main += cpu
                else:
                    other += cpu
        return main, other

    def __exit__(self, *exc: object) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # graceful: uvicorn drains, the host flushes its logs
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()  # our own child, by its handle
                proc.wait()
        with contextlib.suppress(Exception):
            self._log.close()


# ------------------------------------------------------------------------------- clients

_WRK_LUA = r"""
local paths = {}
for p in io.lines(os.getenv("BENCH_PATHS_FILE")) do if #p > 0 then paths[#paths + 1] = p end end
local f = io.open(os.getenv("BENCH_BODY_FILE"), "rb")
local body = f:read("*all")
f:close()
local i = 0
local method = os.getenv("BENCH_METHOD") or "POST"
wrk.method = method
if method == "POST" then
  wrk.body = body
  wrk.headers["Content-Type"] = "application/json"
end
wrk.headers["Authorization"] = "Bearer " .. (os.getenv("BENCH_KEY") or "")
setup = function(thread)
  thread:set("offset", math.random(1, #paths))
end
request = function()
  i = i + 1
  return wrk.format(nil, paths[((i + (offset or 0)) % #paths) + 1])
end
done = function(summary, latency, requests)
  local pcts = {}
  for _, p in ipairs({%PCTS%}) do
    pcts[#pcts + 1] = string.format("\"%s\":%d", tostring(p), latency:percentile(p))
  end
  io.write(string.format(
    "BENCHJSON {\"requests\":%d,\"duration_us\":%d,\"status_errors\":%d,\"connect_errors\":%d," ..
    "\"read_errors\":%d,\"write_errors\":%d,\"timeouts\":%d,\"mean_us\":%f,\"max_us\":%d," ..
    "\"pct_us\":{%s}}\n",
    summary.requests, summary.duration, summary.errors.status, summary.errors.connect,
    summary.errors.read, summary.errors.write, summary.errors.timeout, latency.mean,
    latency.max, table.concat(pcts, ",")))
end
"""


def wrk_path() -> str | None:
    """The wrk binary, when installed (``apt-get install wrk``)."""
    return shutil.which("wrk")


def client_name() -> str:
    w = wrk_path()
    if w is None:
        return "python asyncio raw HTTP/1.1 client (bench.loadgen; wrk not installed)"
    ver = subprocess.run(
        [w, "--version"], capture_output=True, text=True, check=False
    ).stdout.split("\n")[0]
    return f"wrk -t1 ({ver.split(' Copyright')[0].strip()})"


def run_load(
    base: str,
    paths: Sequence[str],
    body: bytes,
    *,
    connections: int,
    duration_s: float,
    workdir: Path,
    method: str = "POST",
    timeout_s: float = 30.0,
) -> dict[str, Any]:
    """Closed-loop load for ``duration_s``: requests/s, latency percentiles, errors."""
    workdir.mkdir(parents=True, exist_ok=True)
    body_file = workdir / f"body-{len(body)}.bin"
    body_file.write_bytes(body)
    env = dict(os.environ)
    paths_file = workdir / "paths.txt"
    paths_file.write_text("\n".join(paths) + "\n")
    env.update(
        {
            "BENCH_PATHS_FILE": str(paths_file),
            "BENCH_BODY_FILE": str(body_file),
            "BENCH_METHOD": method,
            "BENCH_KEY": API_KEY,
        }
    )
    w = wrk_path()
    if w is not None:
        lua = workdir / "bench.lua"
        lua.write_text(_WRK_LUA.replace("%PCTS%", ",".join(str(p) for p in PCTS)))
        dur: float = max(1, round(duration_s))  # wrk takes whole seconds
        cmd = [
            w,
            "-t1",
            f"-c{connections}",
            f"-d{dur}s",
            f"--timeout={int(timeout_s)}s",
            "-s",
            str(lua),
            base,
        ]
    else:
        dur = duration_s
        cmd = [sys.executable, "-m", "bench.loadgen", base, str(connections), str(dur)]
    t0 = time.perf_counter()
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        cwd=common.ROOT,
        timeout=dur + timeout_s + 30,
        check=False,
    )
    wall = time.perf_counter() - t0
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    if line is None:
        raise RuntimeError(f"load generator failed: {out.stdout[-2000:]} {out.stderr[-2000:]}")
    res: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
    secs = res["duration_us"] / 1e6
    res["requests_per_s"] = res["requests"] / secs if secs else float("nan")
    res["p50_ms"] = res["pct_us"]["50"] / 1e3
    res["p99_ms"] = res["pct_us"]["99"] / 1e3
    res["errors"] = sum(
        res[k]
        for k in ("status_errors", "connect_errors", "read_errors", "write_errors", "timeouts")
    )
    res["client"] = "wrk" if w is not None else "python"
    res["client_wall_s"] = wall
    return res


# ------------------------------------------------------------------------------- python client


async def _request(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes, body: bytes
) -> int:
    writer.write(head + body)
    status_line = await reader.readline()
    if not status_line:
        raise ConnectionError("closed")
    status = int(status_line.split(b" ", 2)[1])
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b"\n", b""):
            break
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    if length:
        await reader.readexactly(length)
    return status


def _head(method: str, path: str, port: int, body: bytes) -> bytes:
    lines = [
        f"{method} {path} HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Authorization: Bearer {API_KEY}",
    ]
    if method == "POST":
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def _client_main(
    base: str, connections: int, duration_s: float, paths: list[str], body: bytes, method: str
) -> dict[str, Any]:
    port = int(base.rsplit(":", 1)[1])
    heads = [_head(method, p, port, body) for p in paths]
    payload = body if method == "POST" else b""
    lat: list[float] = []
    errors = {"status": 0, "connect": 0, "read": 0}
    counter = [random.randrange(len(paths))]
    t_end = time.perf_counter() + duration_s

    async def conn() -> None:
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            errors["connect"] += 1
            return
        try:
            while time.perf_counter() < t_end:
                counter[0] += 1
                head = heads[counter[0] % len(heads)]
                t0 = time.perf_counter()
                try:
                    status = await _request(reader, writer, head, payload)
                except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
                    errors["read"] += 1
                    return
                lat.append(time.perf_counter() - t0)
                if status >= 400:
                    errors["status"] += 1
        finally:
            writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(conn() for _ in range(connections)))
    el = time.perf_counter() - t0
    lat.sort()
    return {
        "requests": len(lat),
        "duration_us": int(el * 1e6),
        "status_errors": errors["status"],
        "connect_errors": errors["connect"],
        "read_errors": errors["read"],
        "write_errors": 0,
        "timeouts": 0,
        "mean_us": (sum(lat) / len(lat) * 1e6) if lat else 0.0,
        "max_us": int(lat[-1] * 1e6) if lat else 0,
        "pct_us": {str(p): int(common.percentile(lat, p) * 1e6) for p in PCTS},
    }


def open_logs(
    base: str, paths: Sequence[str], body: bytes, concurrency: int = 32
) -> dict[str, Any]:
    """POST once to every path (opening/creating each log), ``concurrency`` at a time; timed."""

    async def main() -> dict[str, Any]:
        port = int(base.rsplit(":", 1)[1])
        todo = list(paths)
        lat: list[float] = []
        bad = 0

        async def worker() -> None:
            nonlocal bad
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            try:
                while todo:
                    p = todo.pop()
                    t0 = time.perf_counter()
                    status = await _request(reader, writer, _head("POST", p, port, body), body)
                    lat.append(time.perf_counter() - t0)
                    bad += status >= 400
            finally:
                writer.close()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(paths)))))
        el = time.perf_counter() - t0
        lat.sort()
        return {
            "logs": len(paths),
            "seconds": el,
            "opens_per_s": len(paths) / el,
            "p50_ms": common.percentile(lat, 50) * 1e3,
            "p99_ms": common.percentile(lat, 99) * 1e3,
            "errors": bad,
        }

    return asyncio.run(main())


def main(argv: list[str]) -> int:
    """``python -m bench.loadgen BASE CONNECTIONS SECONDS`` (paths/body from BENCH_* env)."""
    base, connections, duration = argv[0], int(argv[1]), float(argv[2])
    paths = [p for p in Path(os.environ["BENCH_PATHS_FILE"]).read_text().split("\n") if p]
    body = Path(os.environ["BENCH_BODY_FILE"]).read_bytes()
    res = asyncio.run(
        _client_main(
            base, connections, duration, paths, body, os.environ.get("BENCH_METHOD", "POST")
        )
    )
    print("BENCHJSON " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
