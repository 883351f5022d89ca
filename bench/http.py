"""The log host over HTTP: appends/s and latency through uvicorn, beside the stack's own ceiling.

A real ``python -m host.cli serve`` (LocalStore with fsync, the server's default log level and
batch interval, ``LOGHOST_MAX_OPEN_LOGS=20000``, idle close disabled) and the bench-only ceiling
app (``bench.http_ceiling``: a trivial FastAPI POST on the same route, same uvicorn settings) run
side by side in child processes.  Load comes from a separate process (``wrk -t1`` when
installed, else ``bench.loadgen``'s asyncio client): ``connections`` keep-alive HTTP/1.1
connections in a closed loop, each request to the next log round-robin.

Cases: 1, 100 and 1,000 logs x 1 and 100 records per request (records of ~1 KiB: id, 600-char
document, 16-dim embedding, 2 metadata fields).  Each case first opens (creates) all its logs
with one POST each (timed: the open cost over HTTP), then warms up, then measures.  Right before
each host window the ceiling is measured with the same body and connections, so every row
carries ``host / ceiling`` from the same minute.
"""

from __future__ import annotations

import argparse
import contextlib
from typing import Any

from . import common, loadgen

NAME = "http"
FULL: dict[str, Any] = {
    "logs": [1, 100, 1000],
    "records": [1, 100],
    "connections": 64,
    "warmup_s": 1,
    "duration_s": 5,
}
QUICK: dict[str, Any] = {
    "logs": [1, 100],
    "records": [1, 100],
    "connections": 64,
    "warmup_s": 0,
    "duration_s": 1,
    "cases": [(1, 100), (100, 1)],
    "healthz": False,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("http")
    g.add_argument("--http-logs", default=None, help="comma-separated log counts (1,100,1000)")
    g.add_argument(
        "--http-records", default=None, help="comma-separated records per request (1,100)"
    )
    g.add_argument("--http-connections", type=int, default=None, help="connections (64)")
    g.add_argument(
        "--http-duration", type=float, default=None, help="measured seconds per case (5; quick 1)"
    )


def _csv(value: str | None, default: list[int]) -> list[int]:
    return [int(v) for v in value.split(",") if v] if value else list(default)


def measure_case(
    host: loadgen.ServerProcess,
    ceiling: loadgen.ServerProcess | None,
    logs: int,
    records: int,
    connections: int,
    warmup_s: float,
    duration_s: float,
    tenant: str,
    workdir: Any,
    salt: int = 0,
) -> dict[str, Any]:
    """One (logs, records/request) case: open the logs, warm up, ceiling window, host window."""
    body = loadgen.append_body(records, seed=records)
    paths = loadgen.log_paths(logs, tenant, salt=salt)
    opened = loadgen.open_logs(host.base, paths, loadgen.append_body(1), concurrency=32)
    if warmup_s:
        loadgen.run_load(
            host.base, paths, body, connections=connections, duration_s=warmup_s, workdir=workdir
        )
    ceil = None
    if ceiling is not None:
        c0, _ = ceiling.cpu_rss()
        ceil = loadgen.run_load(
            ceiling.base,
            paths,
            body,
            connections=connections,
            duration_s=duration_s,
            workdir=workdir,
        )
        c1, _ = ceiling.cpu_rss()
        ceil["server_cpu_s"] = c1 - c0
    c0, _ = host.cpu_rss()
    res = loadgen.run_load(
        host.base, paths, body, connections=connections, duration_s=duration_s, workdir=workdir
    )
    c1, rss = host.cpu_rss()
    res["server_cpu_s"] = c1 - c0
    res["server_rss"] = rss
    out = {
        "logs": logs,
        "records_per_request": records,
        "connections": connections,
        "body_bytes": len(body),
        "open": opened,
        "host": res,
        "ceiling": ceil,
        "records_per_s": res["requests_per_s"] * records,
    }
    if ceil:
        out["ratio"] = res["requests_per_s"] / ceil["requests_per_s"]
    return out


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    logs = _csv(getattr(args, "http_logs", None), cfg["logs"])
    records = _csv(getattr(args, "http_records", None), cfg["records"])
    conns = getattr(args, "http_connections", None) or cfg["connections"]
    duration = getattr(args, "http_duration", None) or cfg["duration_s"]
    warmup = cfg["warmup_s"]
    rows: list[dict[str, Any]] = []
    refs: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(common.scratch_dir("http"))
        host = stack.enter_context(loadgen.ServerProcess("host", work / "host"))
        ceiling = stack.enter_context(loadgen.ServerProcess("ceiling", work / "ceiling"))
        _, rss0 = host.cpu_rss()
        refs["host_rss_idle"] = rss0
        if cfg.get("healthz", True):
            # GET /healthz: a real endpoint of the server (auth-free, no body), for scale.
            refs["host_healthz"] = loadgen.run_load(
                host.base,
                ["/healthz"],
                b"",
                method="GET",
                connections=conns,
                duration_s=duration,
                workdir=work,
            )
            refs["ceiling_healthz"] = loadgen.run_load(
                ceiling.base,
                ["/healthz"],
                b"",
                method="GET",
                connections=conns,
                duration_s=duration,
                workdir=work,
            )
        cases = (
            cfg.get("cases")
            if not (getattr(args, "http_logs", None) or getattr(args, "http_records", None))
            else None
        )
        cases = cases or [(n_logs, n_rec) for n_logs in logs for n_rec in records]
        for case, (n_logs, n_rec) in enumerate(cases, 1):
            if True:
                r = measure_case(
                    host,
                    ceiling,
                    n_logs,
                    n_rec,
                    conns,
                    warmup,
                    duration,
                    f"http{case}",
                    work,
                    salt=case,
                )
                rows.append(r)
                h, c = r["host"], r["ceiling"]
                print(
                    f"  . {n_logs:5} logs x {n_rec:3} rec/req: host {h['requests_per_s']:7.0f} "
                    f"req/s ({r['records_per_s']:7.0f} rec/s) p50 {h['p50_ms']:.1f} ms "
                    f"p99 {h['p99_ms']:.1f} ms | ceiling {c['requests_per_s']:7.0f} req/s "
                    f"-> {r['ratio']:.3f}  (opened {n_logs} logs at "
                    f"{r['open']['opens_per_s']:.0f}/s, errors {h['errors']})",
                    flush=True,
                )
    data = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "client": loadgen.client_name(),
        "config": {
            "logs": sorted({r["logs"] for r in rows}),
            "records": sorted({r["records_per_request"] for r in rows}),
            "connections": conns,
            "warmup_s": warmup,
            "duration_s": duration,
            "record_json_bytes": loadgen.record_json_bytes(),
        },
        "rows": rows,
        "refs": refs,
    }
    data["plot"] = str(plot(data, common.img_path("http_latency", quick)))
    return data


# ------------------------------------------------------------------------------- rendering


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    out = [
        f"Load: {data['client']}, {cfg['connections']} keep-alive connections, closed loop, "
        f"requests round-robin over the logs; {cfg['duration_s']} s per window.  Records are "
        f"{cfg['record_json_bytes']} B of JSON each.  Server: `python -m host.cli serve` "
        f"(LocalStore with fsync, INFO logging, uvicorn asyncio + h11).  Ceiling: "
        f"`bench/http_ceiling.py`, a trivial FastAPI POST on the same route and uvicorn "
        f"settings, measured with the same body right before each host window.",
        "",
    ]
    rows = []
    for r in data["rows"]:
        h, c = r["host"], r["ceiling"] or {}
        cpu_ms = (h["server_cpu_s"] / h["requests"] * 1e3) if h["requests"] else float("nan")
        c_cpu_ms = (c["server_cpu_s"] / c["requests"] * 1e3) if c.get("requests") else None
        rows.append(
            [
                f"{r['logs']:,} log{'s' if r['logs'] > 1 else ''}",
                r["records_per_request"],
                h["requests_per_s"],
                r["records_per_s"],
                h["p50_ms"],
                h["p99_ms"],
                h["errors"],
                c.get("requests_per_s"),
                c.get("p50_ms"),
                r.get("ratio"),
                cpu_ms,
                c_cpu_ms,
                h["server_cpu_s"] / (h["duration_us"] / 1e6),
            ]
        )
    out.append(
        common.md_table(
            [
                "logs",
                "records/request",
                "host req/s",
                "host records/s",
                "p50 ms",
                "p99 ms",
                "errors",
                "ceiling req/s",
                "ceiling p50 ms",
                "host / ceiling",
                "server CPU ms/req",
                "ceiling CPU ms/req",
                "server cores busy",
            ],
            rows,
        )
    )
    out.append("")
    out.append(
        "Opening the logs (one POST of 1 record per new log, 32 at a time, before each "
        "case; each open creates TENANT, the manifest, and the first fragment):"
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "logs",
                "records/request (case)",
                "seconds",
                "new logs/s",
                "p50 ms",
                "p99 ms",
                "errors",
            ],
            [
                [
                    r["logs"],
                    r["records_per_request"],
                    r["open"]["seconds"],
                    r["open"]["opens_per_s"],
                    r["open"]["p50_ms"],
                    r["open"]["p99_ms"],
                    r["open"]["errors"],
                ]
                for r in data["rows"]
            ],
        )
    )
    refs = data.get("refs", {})
    if refs.get("host_healthz"):
        hh, ch = refs["host_healthz"], refs["ceiling_healthz"]
        out.append("")
        out.append(
            f"GET /healthz (no auth, no body): host {hh['requests_per_s']:,.0f} req/s "
            f"(p50 {hh['p50_ms']:.1f} ms), ceiling app {ch['requests_per_s']:,.0f} req/s "
            f"(p50 {ch['p50_ms']:.1f} ms) -> "
            f"{hh['requests_per_s'] / ch['requests_per_s']:.2f}.  Host RSS idle "
            f"{refs['host_rss_idle'] / 2**20:.0f} MiB."
        )
    return "\n".join(out)


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = data["config"]["records"]
    fig, axes = plt.subplots(1, len(recs) + 1, figsize=(5.5 * (len(recs) + 1), 4.5), squeeze=False)
    colors = {1: "tab:blue", 100: "tab:orange", 1000: "tab:red"}
    for j, n_rec in enumerate(recs):
        ax = axes[0][j]
        first = True
        for r in data["rows"]:
            if r["records_per_request"] != n_rec:
                continue
            pcts = sorted((float(k), v / 1e3) for k, v in r["host"]["pct_us"].items())
            ax.plot(
                [v for _, v in pcts],
                [k for k, _ in pcts],
                "o-",
                ms=3,
                color=colors.get(r["logs"]),
                label=f"host, {r['logs']:,} logs",
            )
            if r["ceiling"] and first:
                cp = sorted((float(k), v / 1e3) for k, v in r["ceiling"]["pct_us"].items())
                ax.plot(
                    [v for _, v in cp],
                    [k for k, _ in cp],
                    "s--",
                    ms=3,
                    color="gray",
                    label="ceiling (trivial FastAPI POST)",
                )
                first = False
        ax.set_xscale("log")
        ax.set_xlabel("request latency (ms)")
        ax.set_ylabel("percentile")
        ax.set_title(f"{n_rec} record{'s' if n_rec > 1 else ''} per request: latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    labels = [f"{r['logs']}L x{r['records_per_request']}" for r in data["rows"]]
    xs = range(len(labels))
    ax.bar(
        [x - 0.2 for x in xs],
        [r["host"]["requests_per_s"] for r in data["rows"]],
        0.4,
        label="host req/s",
    )
    ax.bar(
        [x + 0.2 for x in xs],
        [(r["ceiling"] or {}).get("requests_per_s", 0) for r in data["rows"]],
        0.4,
        color="gray",
        label="ceiling req/s",
    )
    ax.set_xticks(list(xs))
    ax.set_xticklabels(labels, fontsize=7)
    ax.set_yscale("log")
    ax.set_title("requests/s (logs x records/request)")
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(
        f"loghost over HTTP, {data['config']['connections']} connections "
        f"({data['machine']['nproc']} cores, {data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
