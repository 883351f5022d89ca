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
change, back to back: ``LOGHOST_LOG_LEVEL=WARNING`` (drops the per-request JSON log line), and
uvicorn with ``uvloop`` + ``httptools`` importable (what ``pip install "uvicorn[standard]"``
gives; installed with ``pip install --target bench/out/uvicorn-extras``, put on ``PYTHONPATH``
for that server only, so the project's virtualenv is untouched).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import common, loadgen

NAME = "http_profile"
EXTRAS = common.OUT_DIR / "uvicorn-extras"

FULL = {"scenarios": [(1, 1), (1, 100), (100, 1)], "duration_s": 5, "warmup_s": 1,
        "connections": 64, "variants": ["log_warning", "uvloop_httptools"],
        "variant_cases": [(1, 1), (1, 100)]}
QUICK = {"scenarios": [(1, 1)], "duration_s": 1, "warmup_s": 0, "connections": 64,
         "variants": ["log_warning"], "variant_cases": [(1, 1)]}

# (label, predicate on (function, class_name, file_path)); a frame counts once, under the first
# (outermost) matching ancestor, so nested matches are not double counted.
CATEGORIES: list[tuple[str, Any]] = [
    ("loop idle (epoll: waiting for sockets / store threads)",
     lambda f, c, p: f == "select" and "selectors" in p),
    ("h11 request parsing (H11Protocol.data_received)",
     lambda f, c, p: f == "data_received" and "h11_impl" in p),
    ("the ASGI app per request (RequestResponseCycle.run_asgi)",
     lambda f, c, p: f == "run_asgi" and "uvicorn" in p),
    ("  _RequestContext: request log line (logging + JsonFormatter)",
     lambda f, c, p: (f in ("info", "_log", "handle", "emit") and p.endswith("logging/__init__.py"))),
    ("  _RequestContext: prometheus counters",
     lambda f, c, p: "prometheus_client" in p),
    ("  FastAPI solve_dependencies (auth, tenant scope, path params)",
     lambda f, c, p: f == "solve_dependencies"),
    ("  append: read body (_read_body)", lambda f, c, p: f == "_read_body"),
    ("  append: pydantic parse (_parse)", lambda f, c, p: f == "_parse" and "host/api" in p),
    ("  append: re-encode records (model_dump_json per record)",
     lambda f, c, p: f == "<listcomp>" and "host/api" in p),
    ("  append: LogManager.use (bind, open)",
     lambda f, c, p: f == "use" and "host/manager" in p),
    ("  append: LogWriter.append_many (enqueue)",
     lambda f, c, p: f == "append_many" and "wal3/writer" in p),
    ("  response: serialize_response + JSON",
     lambda f, c, p: f in ("serialize_response", "_prepare_response_content")),
    ("wal3: _run_batch (encode fragment, start upload)",
     lambda f, c, p: f == "_run_batch"),
    ("wal3: committer (_commit_loop: manifest write, acks)",
     lambda f, c, p: f == "_commit_loop"),
    ("dirty log: mark (hook)", lambda f, c, p: f == "hook" and "host/manager" in p),
    ("store thread hand-off (run_in_executor)",
     lambda f, c, p: f == "run_in_executor"),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("http_profile")
    g.add_argument("--http-profile-duration", type=float, default=None,
                   help="profiled seconds per scenario (5; quick 1)")


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

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/__bench/profile/"):
            action = scope["path"].rsplit("/", 1)[1]
            if action == "start":
                prof = Profiler(interval=0.001, async_mode="disabled")
                state["cpu0"] = time.process_time()
                state["t0"] = time.perf_counter()
                prof.start()
                state["prof"] = prof
            elif action == "stop" and "prof" in state:
                prof = state.pop("prof")
                prof.stop()
                cpu = time.process_time() - state["cpu0"]
                wall = time.perf_counter() - state["t0"]
                name = dict(x.split("=", 1) for x in scope["query_string"].decode().split("&")
                            if "=" in x).get("name", "profile")
                prof.last_session.save(f"{args.out}/{name}.pyisession")
                Path(f"{args.out}/{name}.cpu").write_text(f"{cpu} {wall}\n")
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"ok"})
            return
        await app(scope, receive, send)

    host, port = settings.host_port
    config = uvicorn.Config(wrapped, host=host, port=port, log_config=None, access_log=False,
                            lifespan="on", server_header=False,
                            timeout_graceful_shutdown=int(settings.shutdown_grace_s))
    _GracefulServer(config).run()
    return 0


class _ProfiledHost(loadgen.ServerProcess):
    def argv(self) -> list[str]:
        return [self.python, "-m", "bench.http_profile", "serve", "--store", str(self.store_dir),
                "--listen", f"127.0.0.1:{self.port}", "--out", str(self.workdir)]


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

    def walk(frame: Any, claimed: set[str]) -> None:
        f, c, p = frame.function or "", frame.class_name or "", frame.file_path or ""
        mine = set(claimed)
        for label, pred in CATEGORIES:
            if label not in claimed and pred(f, c, p):
                cats[label] += frame.time
                mine.add(label)
        if not frame.children:
            selfs[f"{c + '.' if c else ''}{f} ({Path(p).name})"] += frame.time
        else:
            own = frame.time - sum(ch.time for ch in frame.children)
            if own > 0:
                selfs[f"{c + '.' if c else ''}{f} ({Path(p).name})"] += own
        for ch in frame.children:
            walk(ch, mine)

    if root is not None:
        walk(root, set())
    return {"total_s": total, "categories": {k: cats.get(k, 0.0) for k, _ in CATEGORIES},
            "top_self": selfs.most_common(15)}


def render_profile_files(session_path: Path, stem: Path) -> list[str]:
    from pyinstrument.renderers import ConsoleRenderer, HTMLRenderer
    from pyinstrument.session import Session

    session = Session.load(str(session_path))
    txt = stem.with_suffix(".txt")
    txt.write_text(ConsoleRenderer(unicode=False, color=False, show_all=False).render(session))
    html = stem.with_suffix(".html")
    html.write_text(HTMLRenderer().render(session))
    return [common.rel(html), common.rel(txt)]


# ------------------------------------------------------------------------------- running


def _extras_path() -> str | None:
    """A directory with uvloop + httptools for PYTHONPATH (pip --target; once)."""
    if not (EXTRAS / "uvloop").exists():
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--target", str(EXTRAS),
                        "uvloop", "httptools"], check=False, capture_output=True)
    return str(EXTRAS) if (EXTRAS / "uvloop").exists() and (EXTRAS / "httptools").exists() \
        else None


def _load_case(srv: loadgen.ServerProcess, logs: int, records: int, conns: int, warm: float,
               dur: float, work: Path, salt: int) -> dict[str, Any]:
    body = loadgen.append_body(records, seed=records)
    paths = loadgen.log_paths(logs, f"p{salt}", salt=salt)
    loadgen.open_logs(srv.base, paths, loadgen.append_body(1))
    if warm:
        loadgen.run_load(srv.base, paths, body, connections=conns, duration_s=warm, workdir=work)
    c0, _ = srv.cpu_rss()
    res = loadgen.run_load(srv.base, paths, body, connections=conns, duration_s=dur,
                           workdir=work)
    c1, _ = srv.cpu_rss()
    res["server_cpu_s"] = c1 - c0
    res["cpu_ms_per_request"] = (c1 - c0) / max(1, res["requests"]) * 1e3
    return res


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    dur = getattr(args, "http_profile_duration", None) or cfg["duration_s"]
    warm, conns = cfg["warmup_s"], cfg["connections"]
    data: dict[str, Any] = {"benchmark": NAME, "quick": quick, "command": common.command_line(),
                            "machine": common.machine_info(), "client": loadgen.client_name(),
                            "config": {**cfg, "duration_s": dur}, "profiles": [],
                            "variants": []}
    with common.scratch_dir("httpprof") as work:
        for i, (logs, records) in enumerate(cfg["scenarios"]):
            name = f"http-profile-{logs}logs-{records}rec{'.quick' if quick else ''}"
            with _ProfiledHost("host", work / f"p{i}") as srv:
                body = loadgen.append_body(records, seed=records)
                paths = loadgen.log_paths(logs, f"prof{i}", salt=0x200 + i)
                loadgen.open_logs(srv.base, paths, loadgen.append_body(1))
                if warm:
                    loadgen.run_load(srv.base, paths, body, connections=conns,
                                     duration_s=warm, workdir=work)
                _post(f"{srv.base}/__bench/profile/start")
                res = loadgen.run_load(srv.base, paths, body, connections=conns,
                                       duration_s=dur, workdir=work)
                _post(f"{srv.base}/__bench/profile/stop?name={name}")
                sess = srv.workdir / f"{name}.pyisession"
                cpu, wall = (float(x) for x in (srv.workdir / f"{name}.cpu").read_text().split())
            cat = categorise(sess)
            files = render_profile_files(sess, common.OUT_DIR / name)
            data["profiles"].append({"logs": logs, "records": records, "load": res,
                                     "process_cpu_s": cpu, "wall_s": wall, "files": files,
                                     **cat})
            print(f"  . profiled {logs} log(s) x {records} rec/req: "
                  f"{res['requests_per_s']:.0f} req/s under the profiler, "
                  f"{cpu / wall:.2f} cores busy; {', '.join(files)}", flush=True)

        extras = _extras_path() if "uvloop_httptools" in cfg["variants"] else None
        salt = 0x300
        for variant in cfg["variants"]:
            if variant == "log_warning":
                env, label = {"LOGHOST_LOG_LEVEL": "WARNING"}, "LOGHOST_LOG_LEVEL=WARNING"
            else:
                if extras is None:
                    data["variants"].append({"variant": variant, "skipped":
                                             "pip install --target uvloop httptools failed"})
                    continue
                pp = os.pathsep.join(x for x in (extras, os.environ.get("PYTHONPATH")) if x)
                env, label = {"PYTHONPATH": pp}, "uvloop + httptools importable"
            for logs, records in cfg["variant_cases"]:
                pair = {}
                for which, e in (("default", {}), ("variant", env)):
                    salt += 1
                    with loadgen.ServerProcess("host", work / f"v{salt}", env=e) as srv:
                        pair[which] = _load_case(srv, logs, records, conns, warm, dur, work,
                                                 salt)
                        if which == "variant" and variant == "uvloop_httptools":
                            pair["variant_log_tail"] = _loop_line(srv.log_path)
                r = pair["variant"]["requests_per_s"] / pair["default"]["requests_per_s"]
                data["variants"].append({"variant": variant, "label": label, "logs": logs,
                                         "records": records, **pair, "ratio": r})
                print(f"  . variant {label}, {logs} log x {records} rec: "
                      f"{pair['default']['requests_per_s']:.0f} -> "
                      f"{pair['variant']['requests_per_s']:.0f} req/s ({r:.2f}x)", flush=True)
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
        out.append(f"pyinstrument on the server's event-loop thread during the load window "
                   f"only ({data['config']['duration_s']} s, {data['config']['connections']} "
                   f"connections, {data['client']}).  Inclusive share of the profiled wall "
                   f"time; indented rows are inside the ASGI app:")
        out.append("")
        heads = ["category"] + [f"{p['logs']} log{'s' if p['logs'] > 1 else ''} x "
                                f"{p['records']} rec %" for p in profs]
        rows = []
        for label, _ in CATEGORIES:
            rows.append([label] + [100 * p["categories"].get(label, 0.0) / p["total_s"]
                                   if p["total_s"] else None for p in profs])
        rows.append(["req/s under the profiler"] + [p["load"]["requests_per_s"] for p in profs])
        rows.append(["server cores busy (process CPU / wall)"] +
                    [p["process_cpu_s"] / p["wall_s"] for p in profs])
        rows.append(["server CPU ms per request"] +
                    [p["process_cpu_s"] / max(1, p["load"]["requests"]) * 1e3 for p in profs])
        out.append(common.md_table(heads, rows))
        out.append("")
        out.append("Top self time (event-loop thread):")
        out.append("")
        for p in profs:
            top = "; ".join(f"{name} {100 * t / p['total_s']:.1f}%"
                            for name, t in p["top_self"][:8])
            out.append(f"- {p['logs']} log(s) x {p['records']} rec: {top}")
        out.append("")
        out.append("Full trees: " + ", ".join(f for p in profs for f in p["files"]) + ".")
        out.append("")
    vs = data.get("variants", [])
    if vs:
        out.append("Variants of the server setup (no profiler; a fresh default server and a "
                   "fresh variant server, back to back, same load):")
        out.append("")
        rows = []
        for v in vs:
            if "skipped" in v:
                rows.append([v["variant"], "-", "-", None, None, None, None, None,
                             f"skipped: {v['skipped']}"])
                continue
            d, w = v["default"], v["variant"]
            rows.append([v["label"], v["logs"], v["records"], d["requests_per_s"],
                         w["requests_per_s"], v["ratio"], d["cpu_ms_per_request"],
                         w["cpu_ms_per_request"], f"p50 {d['p50_ms']:.0f} -> {w['p50_ms']:.0f} ms"])
        out.append(common.md_table(
            ["variant", "logs", "records/request", "default req/s", "variant req/s",
             "variant / default", "default CPU ms/req", "variant CPU ms/req", "latency"], rows))
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv and argv[0] == "serve":
        return serve(argv[1:])
    print("usage: python -m bench.http_profile serve --store DIR --listen HOST:PORT --out DIR",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
