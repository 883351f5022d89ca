"""Profile of the log host's append path over HTTP, and measured variants of the server setup.

Profile.  ``python -m bench.http_profile serve`` runs exactly what ``loghost serve`` runs
(``host.api.create_app(host.server.Server(settings))`` under ``uvicorn.Config`` with the same
arguments as ``host.cli._serve``) inside one extra pure-ASGI wrapper that answers
``POST /__bench/profile/start`` and ``/stop``: a pyinstrument ``Profiler`` (main thread, 1 ms
interval, ``async_mode="disabled"``) runs only while the load generator runs, so the profile holds
the load window and nothing else (no imports, no start-up, no idle tail).  The event-loop thread
is what pyinstrument samples; LocalStore's fsyncs run in worker threads and show up as the loop
waiting in ``epoll``.

Variants (no profiler).  The same load against a fresh default server and then a server with one
change, back to back: ``LOGHOST_LOG_LEVEL=WARNING`` (drops the per-request JSON log line),
``LOGHOST_HTTP_PARSER=h11`` (the parser the host used before httptools), and ``uvloop``
importable (uvicorn's ``loop="auto"`` then picks it; installed with ``pip install --target
bench/out/uvicorn-extras``, put on ``PYTHONPATH`` for that server only, so the project's
virtualenv is untouched).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import logging
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import common, loadgen

NAME = "http_profile"
EXTRAS = common.OUT_DIR / "uvicorn-extras"

FULL: dict[str, Any] = {
    "scenarios": [(1, 1), (1, 100), (1000, 1)],
    "duration_s": 5,
    "warmup_s": 1,
    "connections": 64,
    "variants": ["log_warning", "h11_parser", "uvloop"],
    "variant_cases": [(1, 1), (1, 100)],
}
QUICK: dict[str, Any] = {
    "scenarios": [(1, 1)],
    "duration_s": 1,
    "warmup_s": 0,
    "connections": 64,
    "variants": ["log_warning"],
    "variant_cases": [(1, 1)],
}

# (label, predicate on (function, class_name, file_path)); a frame counts once, under the first
# (outermost) matching ancestor, so nested matches are not double counted.
CATEGORIES: list[tuple[str, Any]] = [
    ("loop idle (epoll; ~0 on the CPU clock)", lambda f, c, p: f == "select" and "selectors" in p),
    (
        "HTTP request parsing (httptools or h11 Protocol.data_received)",
        lambda f, c, p: f == "data_received" and ("h11_impl" in p or "httptools_impl" in p),
    ),
    (
        "the ASGI app per request (RequestResponseCycle.run_asgi)",
        lambda f, c, p: f == "run_asgi" and "uvicorn" in p,
    ),
    (
        "  _RequestContext: request log line (logging + JsonFormatter)",
        lambda f, c, p: (
            f in ("info", "_log", "handle", "emit") and p.endswith("logging/__init__.py")
        ),
    ),
    ("  _RequestContext: prometheus counters", lambda f, c, p: "prometheus_client" in p),
    (
        "  FastAPI solve_dependencies (auth, tenant scope, path params)",
        lambda f, c, p: f == "solve_dependencies",
    ),
    ("  append: read body (_read_body)", lambda f, c, p: f == "_read_body"),
    (
        "  append: body decode, validate, re-encode (decode_append)",
        lambda f, c, p: f == "decode_append" and "host/appendbody" in p,
    ),
    ("  append: LogManager.use (bind, open)", lambda f, c, p: f == "use" and "host/manager" in p),
    (
        "  append: LogWriter.append_many (enqueue)",
        lambda f, c, p: f == "append_many" and "wal3/writer" in p,
    ),
    (
        "  response: serialize_response + JSON",
        lambda f, c, p: f in ("serialize_response", "_prepare_response_content"),
    ),
    ("wal3: _run_batch (encode fragment, start upload)", lambda f, c, p: f == "_run_batch"),
    ("wal3: committer (_commit_loop: manifest write, acks)", lambda f, c, p: f == "_commit_loop"),
    ("dirty log: mark (hook)", lambda f, c, p: f == "hook" and "host/manager" in p),
    ("store thread hand-off (run_in_executor)", lambda f, c, p: f == "run_in_executor"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("http_profile")
    g.add_argument(
        "--http-profile-duration",
        type=float,
        default=None,
        help="profiled seconds per scenario (5; quick 1)",
    )


# ------------------------------------------------------------------------------- the server


def serve(argv: list[str]) -> int:
    """Run the host like ``loghost serve`` does, with a profiler switch (bench only)."""
    import uvicorn
    from pyinstrument import Profiler

    from host import jsonlog
    from host.api import create_app
    from host.cli import _GracefulServer
    from host.config import Settings
    from host.server import Server

    p = argparse.ArgumentParser()
    p.add_argument("--store", required=True)
    p.add_argument("--listen", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    settings = Settings(store=args.store, listen=args.listen, server_id="bench")
    jsonlog.configure(settings.log_level)
    server = Server(settings)
    app = create_app(server)
    state: dict[str, Any] = {}
    timers = _install_timers()

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/__bench/profile/"):
            action = scope["path"].rsplit("/", 1)[1]
            if action == "start":
                from pyinstrument.stack_sampler import get_stack_sampler

                # Sample on the loop thread's CPU clock: time the thread is runnable but not
                # running (2 busy cores, other tenants) is not charged to whatever it was doing.
                get_stack_sampler().timer_func = time.thread_time
                prof = Profiler(interval=0.001, async_mode="disabled")
                state["cpu0"] = time.process_time()
                state["t0"] = time.perf_counter()
                prof.start()
                state["prof"] = prof
            elif action == "timers-start":
                for t in timers.values():
                    t[0] = t[1] = 0
                state["loop0"] = time.thread_time()
            elif action == "timers-stop":
                loop = time.thread_time() - state.pop("loop0", time.thread_time())
                await asyncio.to_thread(
                    Path(f"{args.out}/timers.json").write_text,
                    json.dumps(
                        {
                            "loop_thread_cpu_s": loop,
                            "timers": {
                                k: {"calls": v[0], "cpu_s": v[1]} for k, v in timers.items()
                            },
                        }
                    ),
                )
            elif action == "stop" and "prof" in state:
                prof = state.pop("prof")
                prof.stop()
                cpu = time.process_time() - state["cpu0"]
                wall = time.perf_counter() - state["t0"]
                name = dict(
                    x.split("=", 1) for x in scope["query_string"].decode().split("&") if "=" in x
                ).get("name", "profile")
                prof.last_session.save(f"{args.out}/{name}.pyisession")
                await asyncio.to_thread(
                    Path(f"{args.out}/{name}.cpu").write_text, f"{cpu} {wall}\n"
                )
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/plain")],
                }
            )
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await app(scope, receive, send)

    host, port = settings.host_port
    config = uvicorn.Config(
        wrapped,
        host=host,
        port=port,
        log_config=None,
        access_log=False,
        lifespan="on",
        server_header=False,
        timeout_graceful_shutdown=int(settings.shutdown_grace_s),
    )
    _GracefulServer(config).run()
    return 0


def _install_timers() -> dict[str, list[float]]:
    """Wrap a few functions of the request path with loop-thread CPU timers (``thread_time``
    around each outermost call; none of them suspends), to cross-check the profiler, whose hooks
    inflate call-heavy code.  Bench-only monkeypatching in this process; host/ is not edited."""
    import fastapi.routing
    from uvicorn.protocols.http import h11_impl, httptools_impl

    import host.appendbody
    import host.requests
    import wal3.batcher

    timers: dict[str, list[float]] = {}

    def timed_async(name: str, fn: Any) -> Any:
        acc = timers.setdefault(name, [0, 0.0])
        depth = [0]

        async def wrapper(*a: Any, **kw: Any) -> Any:
            if depth[0]:
                return await fn(*a, **kw)
            depth[0] += 1
            t0 = time.thread_time()
            try:
                return await fn(*a, **kw)
            finally:
                acc[1] += time.thread_time() - t0
                acc[0] += 1
                depth[0] -= 1

        return wrapper

    def timed(name: str, fn: Any) -> Any:
        acc = timers.setdefault(name, [0, 0.0])

        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                acc[1] += time.thread_time() - t0
                acc[0] += 1

        return wrapper

    def patch(owner: Any, attr: str, label: str, timer: Callable[[str, Any], Any] = timed) -> None:
        """Replace ``owner.attr`` (looked up there at call time) by its timed wrapper."""
        setattr(owner, attr, timer(label, getattr(owner, attr)))

    patch(
        fastapi.routing,
        "solve_dependencies",
        "FastAPI solve_dependencies (auth, tenant scope, path params)",
        timed_async,
    )
    patch(host.requests, "parse", "pydantic parse of other bodies (host.requests.parse)")
    patch(
        host.appendbody,
        "decode_append",
        "append body: msgspec decode + re-encode (host.appendbody.decode_append)",
    )
    # The request log line's logger (host.middleware's), by name: the same object wherever it is.
    request_log = logging.getLogger("loghost.api")
    patch(request_log, "info", "request log line (_log.info + JsonFormatter + write)")
    patch(h11_impl.H11Protocol, "data_received", "h11 parse + dispatch (H11Protocol.data_received)")
    patch(
        httptools_impl.HttpToolsProtocol,
        "data_received",
        "httptools parse + dispatch (HttpToolsProtocol.data_received)",
    )
    patch(wal3.batcher, "encode_fragment", "encode_fragment (on the loop thread)")
    return timers


class _ProfiledHost(loadgen.ServerProcess):
    def argv(self) -> list[str]:
        return [
            self.python,
            "-m",
            "bench.http_profile",
            "serve",
            "--store",
            str(self.store_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--out",
            str(self.workdir),
        ]


def _post(url: str) -> None:
    req = urllib.request.Request(url, data=b"", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:  # 127.0.0.1 only
        r.read()


# ------------------------------------------------------------------------------- analysis


def categorise(session_path: Path) -> dict[str, Any]:
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    root = session.root_frame(trim_stem=False)
    total = root.time if root is not None else 0.0
    cats = collections.Counter[str]()
    selfs = collections.Counter[str]()

    def walk(frame: Any, claimed: set[str], parent: str) -> None:
        f, c, p = frame.function or "", frame.class_name or "", frame.file_path or ""
        name = f"{c + '.' if c else ''}{f} ({Path(p).name})" if p else parent
        if f.startswith("[") or getattr(frame, "is_synthetic_leaf", False):
            name = parent  # pyinstrument's "[self]" leaf: the parent's own time
        mine = set(claimed)
        for label, pred in CATEGORIES:
            if label not in claimed and pred(f, c, p):
                cats[label] += frame.time
                mine.add(label)
        own = frame.time - sum(ch.time for ch in frame.children)
        if own > 0:
            selfs[name] += own
        for ch in frame.children:
            walk(ch, mine, name)

    if root is not None:
        walk(root, set(), "root")
    return {
        "total_s": total,
        "categories": {k: cats.get(k, 0.0) for k, _ in CATEGORIES},
        "top_self": selfs.most_common(15),
    }


def render_profile_files(session_path: Path, stem: Path) -> list[str]:
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    txt = stem.with_suffix(".txt")
    txt.write_text(ConsoleRenderer(unicode=False, color=False, show_all=True).render(session))
    html = stem.with_suffix(".html")
    html.write_text(HTMLRenderer().render(session))
    return [common.rel(html), common.rel(txt)]


# ------------------------------------------------------------------------------- running


def _extras_path() -> str | None:
    """A directory with uvloop for PYTHONPATH (pip --target; once)."""
    if not (EXTRAS / "uvloop").exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "-q",
                "--target",
                str(EXTRAS),
                "uvloop",
            ],
            check=False,
            capture_output=True,
        )
    return str(EXTRAS) if (EXTRAS / "uvloop").exists() else None


def _load_case(
    srv: loadgen.ServerProcess,
    logs: int,
    records: int,
    conns: int,
    warm: float,
    dur: float,
    work: Path,
    salt: int,
) -> dict[str, Any]:
    body = loadgen.append_body(records, seed=records)
    paths = loadgen.log_paths(logs, f"p{salt}", salt=salt)
    loadgen.open_logs(srv.base, paths, loadgen.append_body(1))
    if warm:
        loadgen.run_load(srv.base, paths, body, connections=conns, duration_s=warm, workdir=work)
    c0, _ = srv.cpu_rss()
    res = loadgen.run_load(srv.base, paths, body, connections=conns, duration_s=dur, workdir=work)
    c1, _ = srv.cpu_rss()
    res["server_cpu_s"] = c1 - c0
    res["cpu_ms_per_request"] = (c1 - c0) / max(1, res["requests"]) * 1e3
    return res


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    dur = getattr(args, "http_profile_duration", None) or cfg["duration_s"]
    warm, conns = cfg["warmup_s"], cfg["connections"]
    data: dict[str, Any] = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "client": loadgen.client_name(),
        "config": {**cfg, "duration_s": dur},
        "profiles": [],
        "variants": [],
    }
    data["prototypes"] = prototypes(quick)
    with common.scratch_dir("httpprof") as work:
        for i, (logs, records) in enumerate(cfg["scenarios"]):
            name = f"http-profile-{logs}logs-{records}rec{'-quick' if quick else ''}"
            with _ProfiledHost("host", work / f"p{i}") as srv:
                body = loadgen.append_body(records, seed=records)
                paths = loadgen.log_paths(logs, f"prof{i}", salt=0x200 + i)
                loadgen.open_logs(srv.base, paths, loadgen.append_body(1))
                if warm:
                    loadgen.run_load(
                        srv.base, paths, body, connections=conns, duration_s=warm, workdir=work
                    )
                _post(f"{srv.base}/__bench/profile/timers-start")
                tres = loadgen.run_load(
                    srv.base, paths, body, connections=conns, duration_s=dur, workdir=work
                )
                _post(f"{srv.base}/__bench/profile/timers-stop")
                timers = json.loads((srv.workdir / "timers.json").read_text())
                timers["requests"] = tres["requests"]
                timers["requests_per_s"] = tres["requests_per_s"]
                _post(f"{srv.base}/__bench/profile/start")
                m0, o0 = srv.thread_cpu()
                res = loadgen.run_load(
                    srv.base, paths, body, connections=conns, duration_s=dur, workdir=work
                )
                m1, o1 = srv.thread_cpu()
                _post(f"{srv.base}/__bench/profile/stop?name={name}")
                sess = srv.workdir / f"{name}.pyisession"
                cpu, wall = (float(x) for x in (srv.workdir / f"{name}.cpu").read_text().split())
            cat = categorise(sess)
            files = render_profile_files(sess, common.OUT_DIR / name)
            data["profiles"].append(
                {
                    "logs": logs,
                    "records": records,
                    "load": res,
                    "process_cpu_s": cpu,
                    "wall_s": wall,
                    "files": files,
                    "loop_thread_cpu_s": m1 - m0,
                    "other_threads_cpu_s": o1 - o0,
                    "timers": timers,
                    **cat,
                }
            )
            print(
                f"  . profiled {logs} log(s) x {records} rec/req: "
                f"{res['requests_per_s']:.0f} req/s under the profiler, "
                f"{cpu / wall:.2f} cores busy; {', '.join(files)}",
                flush=True,
            )

        extras = _extras_path() if "uvloop" in cfg["variants"] else None
        salt = 0x300
        for variant in cfg["variants"]:
            if variant == "log_warning":
                env, label = {"LOGHOST_LOG_LEVEL": "WARNING"}, "LOGHOST_LOG_LEVEL=WARNING"
            elif variant == "h11_parser":
                env, label = {"LOGHOST_HTTP_PARSER": "h11"}, "LOGHOST_HTTP_PARSER=h11"
            else:
                if extras is None:
                    data["variants"].append(
                        {"variant": variant, "skipped": "pip install --target uvloop failed"}
                    )
                    continue
                pp = os.pathsep.join(x for x in (extras, os.environ.get("PYTHONPATH")) if x)
                env, label = {"PYTHONPATH": pp}, "uvloop importable"
            for logs, records in cfg["variant_cases"]:
                pair: dict[str, Any] = {}
                for which, e in (("default", {}), ("variant", env)):
                    salt += 1
                    with loadgen.ServerProcess("host", work / f"v{salt}", env=e) as srv:
                        pair[which] = _load_case(srv, logs, records, conns, warm, dur, work, salt)
                        if which == "variant" and variant == "uvloop":
                            pair["variant_log_tail"] = _loop_line(srv.log_path)
                r = pair["variant"]["requests_per_s"] / pair["default"]["requests_per_s"]
                data["variants"].append(
                    {
                        "variant": variant,
                        "label": label,
                        "logs": logs,
                        "records": records,
                        **pair,
                        "ratio": r,
                    }
                )
                print(
                    f"  . variant {label}, {logs} log x {records} rec: "
                    f"{pair['default']['requests_per_s']:.0f} -> "
                    f"{pair['variant']['requests_per_s']:.0f} req/s ({r:.2f}x)",
                    flush=True,
                )
    return data


def _loop_line(path: Path) -> str:
    with contextlib.suppress(OSError):
        return path.read_text()[-400:]
    return ""


# ------------------------------------------------------------------------------- rendering


def render(data: dict[str, Any]) -> str:
    out: list[str] = []
    profs = data["profiles"]
    if profs:
        out.append(
            f"pyinstrument on the server's event-loop thread during the load window "
            f"only ({data['config']['duration_s']} s, {data['config']['connections']} "
            f"connections, {data['client']}), sampling on the thread's CPU clock "
            f"(`time.thread_time`).  Inclusive share of the loop thread's CPU time; "
            f"indented rows are inside the ASGI app:"
        )
        out.append("")
        heads = ["category"] + [
            f"{p['logs']} log{'s' if p['logs'] > 1 else ''} x {p['records']} rec %" for p in profs
        ]
        rows = []
        for label, _ in CATEGORIES:
            rows.append(
                [label]
                + [
                    100 * p["categories"].get(label, 0.0) / p["total_s"] if p["total_s"] else None
                    for p in profs
                ]
            )
        rows.append(["req/s under the profiler"] + [p["load"]["requests_per_s"] for p in profs])
        rows.append(
            ["server cores busy (process CPU / wall)"]
            + [p["process_cpu_s"] / p["wall_s"] for p in profs]
        )
        rows.append(
            ["loop thread busy (its CPU / wall)"]
            + [p.get("loop_thread_cpu_s", float("nan")) / p["wall_s"] for p in profs]
        )
        rows.append(
            ["server CPU ms per request"]
            + [p["process_cpu_s"] / max(1, p["load"]["requests"]) * 1e3 for p in profs]
        )
        rows.append(
            ["  of which loop thread (ms/request, /proc)"]
            + [
                p.get("loop_thread_cpu_s", float("nan")) / max(1, p["load"]["requests"]) * 1e3
                for p in profs
            ]
        )
        rows.append(
            ["  of which other threads: store I/O, big encodes (ms/request)"]
            + [
                p.get("other_threads_cpu_s", float("nan")) / max(1, p["load"]["requests"]) * 1e3
                for p in profs
            ]
        )
        out.append(common.md_table(heads, rows))
        out.append("")
        out.append(
            "Cross-check without the profiler (same server, the window before): loop-thread "
            "CPU inside a few wrapped functions (`time.thread_time` around each call), "
            "per request and as a share of the loop thread's CPU:"
        )
        out.append("")
        names = list(profs[0]["timers"]["timers"]) if profs and "timers" in profs[0] else []
        trows = []
        for nm in names:
            row = [nm]
            for p in profs:
                t = p["timers"]
                v = t["timers"][nm]
                row += [
                    v["cpu_s"] / max(1, t["requests"]) * 1e6,
                    100 * v["cpu_s"] / t["loop_thread_cpu_s"] if t["loop_thread_cpu_s"] else None,
                ]
            trows.append(row)
        if names:
            trows.append(
                ["loop thread CPU per request (all)"]
                + [
                    x
                    for p in profs
                    for x in (
                        p["timers"]["loop_thread_cpu_s"] / max(1, p["timers"]["requests"]) * 1e6,
                        100.0,
                    )
                ]
            )
            trows.append(
                ["req/s in this window (no profiler)"]
                + [x for p in profs for x in (p["timers"]["requests_per_s"], None)]
            )
            heads2 = ["function"] + [
                h
                for p in profs
                for h in (f"{p['logs']}L x{p['records']} µs/req", f"{p['logs']}L x{p['records']} %")
            ]
            out.append(common.md_table(heads2, trows))
            out.append("")
        out.append("Top self time (event-loop thread):")
        out.append("")
        for p in profs:
            top = "; ".join(
                f"{name} {100 * t / p['total_s']:.1f}%" for name, t in p["top_self"][:8]
            )
            out.append(f"- {p['logs']} log(s) x {p['records']} rec: {top}")
        out.append("")
        out.append("Full trees: " + ", ".join(f for p in profs for f in p["files"]) + ".")
        out.append("")
    if data.get("prototypes"):
        out.append(render_prototypes(data["prototypes"]))
        out.append("")
    vs = data.get("variants", [])
    if vs:
        out.append(
            "Variants of the server setup (no profiler; a fresh default server and a "
            "fresh variant server, back to back, same load):"
        )
        out.append("")
        rows = []
        for v in vs:
            if "skipped" in v:
                rows.append(
                    [
                        v["variant"],
                        "-",
                        "-",
                        None,
                        None,
                        None,
                        None,
                        None,
                        f"skipped: {v['skipped']}",
                    ]
                )
                continue
            d, w = v["default"], v["variant"]
            rows.append(
                [
                    v["label"],
                    v["logs"],
                    v["records"],
                    d["requests_per_s"],
                    w["requests_per_s"],
                    v["ratio"],
                    d["cpu_ms_per_request"],
                    w["cpu_ms_per_request"],
                    f"p50 {d['p50_ms']:.0f} -> {w['p50_ms']:.0f} ms",
                ]
            )
        out.append(
            common.md_table(
                [
                    "variant",
                    "logs",
                    "records/request",
                    "default req/s",
                    "variant req/s",
                    "variant / default",
                    "default CPU ms/req",
                    "variant CPU ms/req",
                    "latency",
                ],
                rows,
            )
        )
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        return serve(argv[1:])
    print(
        "usage: python -m bench.http_profile serve --store DIR --listen HOST:PORT --out DIR",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))


# ------------------------------------------------------------------------------- prototypes


def _median_us(fn: Any, min_time_s: float, blocks: int = 5) -> float:
    """Median over ``blocks`` timed blocks of the mean µs per call of ``fn()``."""
    fn()
    per = []
    for _ in range(blocks):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            el = time.perf_counter() - t0
            if el >= min_time_s / blocks and n >= 3:
                break
        per.append(el / n * 1e6)
    per.sort()
    return per[len(per) // 2]


def prototypes(quick: bool) -> dict[str, Any]:
    """Bench-only prototypes of the fixes suggested for host/, measured in-process against the
    current code (nothing in host/ is changed)."""
    from typing import Annotated

    from pydantic import (
        BaseModel,
        Field,
        StrictFloat,
        StrictInt,
        StrictStr,
        ValidationError,
    )

    from host.appendbody import RecordLimits, decode_append
    from host.models import (
        _FLOAT32_MAX,
        _STRICT,
        MAX_RECORDS_PER_REQUEST,
        AppendRequest,
        MetadataValue,
        Op,
    )
    from wal3.fragment import encode_fragment

    t = 0.3 if quick else 1.5
    out: dict[str, Any] = {}

    # (1) Embedding validation in pydantic-core instead of a Python AfterValidator per element.
    F32 = _FLOAT32_MAX
    Elem = (
        Annotated[StrictFloat, Field(ge=-F32, le=F32)]
        | Annotated[StrictInt, Field(ge=-int(F32), le=int(F32))]
    )

    class ProtoRecord(BaseModel):
        model_config = _STRICT
        id: StrictStr = Field(min_length=1, max_length=256)
        op: Op
        document: StrictStr | None = None
        metadata: dict[StrictStr, MetadataValue] | None = None
        embedding: list[Elem] | None = None

    class ProtoAppend(BaseModel):
        model_config = _STRICT
        records: list[ProtoRecord] = Field(min_length=1)
        idempotency_key: StrictStr | None = Field(default=None, min_length=1, max_length=256)

    def accepts(model: Any, raw: bytes) -> bool:
        try:
            model.model_validate_json(raw)
            return True
        except ValidationError:
            return False

    probes = {
        "valid, 100 records": loadgen.append_body(100),
        "embedding 1e39 (float, over float32)": b'{"records":[{"id":"a","op":"add","embedding":[1e39]}]}',
        "embedding 10**40 (int, over float32)": b'{"records":[{"id":"a","op":"add","embedding":['
        + str(10**40).encode()
        + b"]}]}",
        "embedding 10**400 (int, no float)": b'{"records":[{"id":"a","op":"add","embedding":['
        + str(10**400).encode()
        + b"]}]}",
        "embedding NaN": b'{"records":[{"id":"a","op":"add","embedding":[NaN]}]}',
        "embedding Infinity": b'{"records":[{"id":"a","op":"add","embedding":[Infinity]}]}',
        "embedding -3.4e38 (fits)": b'{"records":[{"id":"a","op":"add","embedding":[-3.4e38]}]}',
        'embedding "1" (string)': b'{"records":[{"id":"a","op":"add","embedding":["1"]}]}',
    }
    same = {k: (accepts(AppendRequest, v), accepts(ProtoAppend, v)) for k, v in probes.items()}
    rows = []
    for n in (1, 100):
        body = loadgen.append_body(n, seed=n)
        cur = _median_us(lambda b=body: AppendRequest.model_validate_json(b), t)
        proto = _median_us(lambda b=body: ProtoAppend.model_validate_json(b), t)
        req = AppendRequest.model_validate_json(body)
        dump = _median_us(lambda r=req: [x.model_dump_json().encode() for x in r.records], t)
        limits = RecordLimits(MAX_RECORDS_PER_REQUEST, 10_000, 100_000)
        now = _median_us(lambda b=body, lim=limits: decode_append(b, lim), t)
        rows.append(
            {
                "records": n,
                "current_us": cur,
                "prototype_us": proto,
                "speedup": cur / proto,
                "reencode_us": dump,
                "msgspec_us": now,
            }
        )
    out["validation"] = {
        "rows": rows,
        "same_verdicts": same,
        "all_same": all(len(set(v)) == 1 for v in same.values()),
    }

    # (2) The dependency chain of every tenant route: HTTPBearer -> principal -> tenant_scope, as
    # in host/api.py, against the same checks done by one plain call inside the handler.
    from .http_proto_app import bare, chained, flat

    real_path = loadgen.log_paths(1, "t")[0]
    headers = [
        (b"host", b"127.0.0.1"),
        (b"authorization", f"Bearer {loadgen.API_KEY}".encode()),
        (b"content-type", b"application/json"),
        (b"content-length", b"2"),
    ]

    async def call(app: Any) -> int:
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": "POST",
            "scheme": "http",
            "path": real_path,
            "raw_path": real_path.encode(),
            "query_string": b"",
            "headers": headers,
            "client": ("127.0.0.1", 1),
            "server": ("127.0.0.1", 80),
            "root_path": "",
        }
        msgs = [{"type": "http.request", "body": b"{}", "more_body": False}]
        status = [0]

        async def receive() -> dict[str, Any]:
            return msgs.pop(0) if msgs else {"type": "http.disconnect"}

        async def send(m: dict[str, Any]) -> None:
            if m["type"] == "http.response.start":
                status[0] = m["status"]

        await app(scope, receive, send)
        return status[0]

    async def per_call(app: Any) -> float:
        assert await call(app) == 200
        per = []
        for _ in range(5):
            n, t0 = 0, time.perf_counter()
            while time.perf_counter() - t0 < t / 5 or n < 3:
                await call(app)
                n += 1
            per.append((time.perf_counter() - t0) / n * 1e6)
        per.sort()
        return per[2]

    async def measure() -> dict[str, float]:
        return {
            "chained_us": await per_call(chained),
            "flat_us": await per_call(flat),
            "bare_us": await per_call(bare),
        }

    out["dependencies"] = asyncio.run(measure())

    # (3) encode_fragment: fixed cost per fragment against cost per record.
    body = json_record = loadgen.append_body(1)[len(b'{"records":[') : -2]
    enc = []
    for n in (1, 8, 64):
        bodies = [json_record] * n
        us = _median_us(lambda bs=bodies: encode_fragment(1, 1, 1_700_000_000_000_000, bs), t)
        enc.append(
            {
                "records": n,
                "us_per_fragment": us,
                "us_per_record": us / n,
                "record_bytes": len(body),
            }
        )
    out["encode"] = enc
    return out


def render_prototypes(p: dict[str, Any]) -> str:
    out = [
        "Prototypes of the suggested host/ changes, measured in-process against the current "
        "code in the same run (bench-only code in `bench/http_profile.py`):",
        "",
    ]
    v = p["validation"]
    out.append(
        common.md_table(
            [
                "records in the body",
                "pydantic AppendRequest.model_validate_json µs (before)",
                "A: bounds as Field(ge, le) in pydantic-core, µs",
                "A speedup",
                "re-encode: model_dump_json per record, µs (before)",
                "host.appendbody.decode_append (msgspec: validate + re-encode), µs",
                "decode_append / (pydantic parse + re-encode)",
            ],
            [
                [
                    r["records"],
                    r["current_us"],
                    r["prototype_us"],
                    r["speedup"],
                    r["reencode_us"],
                    r.get("msgspec_us", "-"),
                    (
                        r["msgspec_us"] / (r["current_us"] + r["reencode_us"])
                        if "msgspec_us" in r
                        else "-"
                    ),
                ]
                for r in v["rows"]
            ],
        )
    )
    out.append("")
    out.append(
        "Accept/reject verdicts, current / A: "
        + "; ".join(
            f"{k}: " + "/".join("accept" if x else "reject" for x in verdicts)
            for k, verdicts in v["same_verdicts"].items()
        )
        + f" -> {'identical' if v['all_same'] else 'DIFFERENT'} (A's error messages differ)."
    )
    out.append("")
    d = p["dependencies"]
    out.append(
        f"One POST through FastAPI in-process (no server, no body parsing, no storage): "
        f"with the host's dependency chain (HTTPBearer -> principal -> tenant_scope) "
        f"**{d['chained_us']:.0f} µs**; the same checks as one plain call in the handler "
        f"**{d['flat_us']:.0f} µs**; no checks at all {d['bare_us']:.0f} µs.  The chain "
        f"costs {d['chained_us'] - d['flat_us']:.0f} µs per request more than the plain "
        f"call."
    )
    out.append("")
    out.append(
        common.md_table(
            ["records per fragment", "encode_fragment µs", "µs per record"],
            [[e["records"], e["us_per_fragment"], e["us_per_record"]] for e in p["encode"]],
        )
    )
    return "\n".join(out)
