"""The log host over HTTP (issue 14): host / ceiling from alternating windows, LocalStore and S3.

A real ``python -m host.cli serve`` with its product defaults (httptools parser via
``LOGHOST_HTTP_PARSER``'s default, the server's default log level and batch interval;
``LOGHOST_MAX_OPEN_LOGS=20000``, idle close disabled) and the bench-only ceiling app
(``bench.http_ceiling``: a trivial FastAPI POST on the same route, uvicorn pinned to ``--loop
asyncio --http h11``, the fixed bar issue 14 sets) run in child processes.  Load comes from a
separate process (``wrk -t1`` when installed, else ``bench.loadgen``'s asyncio client):
``connections`` keep-alive HTTP/1.1 connections in a closed loop, each request to the next log
round-robin.

Two store variants, one host each (the first is stopped before the second starts):

* ``local``: LocalStore with fsync under bench/out/tmp (the repository's disk);
* ``s3``: S3Store (``--store s3://bucket/prefix``, ``AWS_ENDPOINT_URL``) over moto's
  ThreadedMotoServer on 127.0.0.1 in its own process (``bench.common.MotoServer``).

Each (logs, records/request) case first opens (creates) all its logs with one POST each (timed:
the open cost over HTTP), warms the host up, then runs ``windows`` alternating pairs: ceiling
window, host window, ceiling, host, ...  Each pair gives ``host req/s / ceiling req/s`` and the
ratio of the two servers' CPU per request (the server process's user+system CPU over the window,
from /proc, divided by the window's requests).  A case reports the median of the pairs and every
pair.  The issue-14 targets are judged from those medians (:data:`TARGETS`).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from . import common, loadgen

NAME = "http"
ALL_CASES = [(1, 1), (1, 100), (100, 1), (100, 100), (1000, 1), (1000, 100)]
FULL: dict[str, Any] = {
    "stores": ["local", "s3"],
    "cases": {"local": ALL_CASES, "s3": [(1, 1), (1, 100), (1000, 1), (1000, 100)]},
    "connections": 64,
    "warmup_s": 1,
    "duration_s": 5,
    "windows": 3,
    "healthz": True,
}
QUICK: dict[str, Any] = {
    "stores": ["local", "s3"],
    "cases": {"local": [(1, 100), (100, 1)], "s3": [(1, 1)]},
    "connections": 64,
    "warmup_s": 0,
    "duration_s": 1,
    "windows": 2,
    "healthz": False,
}
STORE_TITLES = {
    "local": "LocalStore (fsync, the repository's disk)",
    "s3": "S3Store over moto's threaded S3 server (127.0.0.1, its own process)",
}
BUCKET = "bench-http"
# Issue 14's targets: (label, (logs, records/request), minimum host / ceiling, maximum CPU ratio).
TARGETS: list[tuple[str, tuple[int, int], float, float | None]] = [
    (
        "1,000 logs × 1 record: host / ceiling ≥ 0.40, CPU/request ≤ 2.5× the ceiling's",
        (1000, 1),
        0.40,
        2.5,
    ),
    ("1 log × 1 record: host / ceiling ≥ 0.60", (1, 1), 0.60, None),
    ("1 log × 100 records: host / ceiling ≥ 0.25", (1, 100), 0.25, None),
    ("1,000 logs × 100 records: host / ceiling ≥ 0.25", (1000, 100), 0.25, None),
]
MIN_WINDOWS = 3  # the "median of at least 3 alternating windows"


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("http")
    g.add_argument(
        "--http-logs", default=None, help="comma-separated log counts (all cases: 1,100,1000)"
    )
    g.add_argument(
        "--http-records", default=None, help="comma-separated records per request (1,100)"
    )
    g.add_argument("--http-connections", type=int, default=None, help="connections (64)")
    g.add_argument(
        "--http-duration", type=float, default=None, help="seconds per window (5; quick 1)"
    )
    g.add_argument(
        "--http-windows",
        type=int,
        default=None,
        help="alternating ceiling/host window pairs per case (3; quick 2)",
    )
    g.add_argument("--http-stores", default=None, help="comma-separated stores (local,s3)")


def _csv(value: str | None, default: list[int]) -> list[int]:
    return [int(v) for v in value.split(",") if v] if value else list(default)


def _window(
    server: loadgen.ServerProcess,
    paths: list[str],
    body: bytes,
    connections: int,
    duration_s: float,
    workdir: Path,
    extra: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One closed-loop window against ``server``, with its CPU time (and ``extra`` pids')."""
    c0, _ = server.cpu_rss()
    x0 = {k: loadgen._proc_stat(pid)[0] for k, pid in (extra or {}).items()}
    res = loadgen.run_load(
        server.base, paths, body, connections=connections, duration_s=duration_s, workdir=workdir
    )
    c1, rss = server.cpu_rss()
    res["server_cpu_s"] = c1 - c0
    res["server_rss"] = rss
    n = res["requests"]
    res["cpu_ms_per_req"] = res["server_cpu_s"] / n * 1e3 if n else float("nan")
    res["cores_busy"] = res["server_cpu_s"] / (res["duration_us"] / 1e6)
    for k, pid in (extra or {}).items():
        cpu = loadgen._proc_stat(pid)[0] - x0[k]
        res[f"{k}_cpu_s"] = cpu
        res[f"{k}_cpu_ms_per_req"] = cpu / n * 1e3 if n else float("nan")
    return res


def _median_index(values: list[float]) -> int:
    """The index of the (lower) median of ``values``."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    return order[(len(order) - 1) // 2]


def measure_case(
    host: loadgen.ServerProcess,
    ceiling: loadgen.ServerProcess | None,
    logs: int,
    records: int,
    connections: int,
    warmup_s: float,
    duration_s: float,
    tenant: str,
    workdir: Path,
    salt: int = 0,
    *,
    windows: int = 1,
    extra: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One (logs, records/request) case: open the logs, warm up, then ``windows`` alternating
    ceiling/host window pairs (host windows only without a ceiling, as bench.peers runs it); the
    medians, and every pair."""
    body = loadgen.append_body(records, seed=records)
    paths = loadgen.log_paths(logs, tenant, salt=salt)
    opened = loadgen.open_logs(host.base, paths, loadgen.append_body(1), concurrency=32)
    if warmup_s:
        loadgen.run_load(
            host.base, paths, body, connections=connections, duration_s=warmup_s, workdir=workdir
        )
    pairs: list[dict[str, Any]] = []
    for _ in range(max(1, windows)):
        pair: dict[str, Any] = {}
        if ceiling is not None:
            pair["ceiling"] = _window(ceiling, paths, body, connections, duration_s, workdir)
        pair["host"] = _window(host, paths, body, connections, duration_s, workdir, extra)
        if ceiling is not None:
            h, c = pair["host"], pair["ceiling"]
            pair["ratio"] = h["requests_per_s"] / c["requests_per_s"]
            pair["cpu_ratio"] = h["cpu_ms_per_req"] / c["cpu_ms_per_req"]
        pairs.append(pair)

    def med(side: str, key: str) -> float:
        return statistics.median(p[side][key] for p in pairs)

    out: dict[str, Any] = {
        "logs": logs,
        "records_per_request": records,
        "connections": connections,
        "body_bytes": len(body),
        "open": opened,
        "windows": pairs,
        "host_rps": med("host", "requests_per_s"),
        "host_cpu_ms": med("host", "cpu_ms_per_req"),
        "host_cores_busy": med("host", "cores_busy"),
        "p50_ms": med("host", "p50_ms"),
        "p99_ms": med("host", "p99_ms"),
        "errors": sum(p["host"]["errors"] for p in pairs),
        "ceiling": None,
    }
    out["records_per_s"] = out["host_rps"] * records
    for k in extra or {}:
        out[f"{k}_cpu_ms"] = med("host", f"{k}_cpu_ms_per_req")
    if ceiling is None:
        out["host"] = pairs[_median_index([p["host"]["requests_per_s"] for p in pairs])]["host"]
        return out
    ratios = [p["ratio"] for p in pairs]
    # The pair whose ratio is the median: its latency percentiles go to the plot.
    mid = pairs[_median_index(ratios)]
    out.update(
        ratios=ratios,
        ratio=statistics.median(ratios),
        cpu_ratios=[p["cpu_ratio"] for p in pairs],
        cpu_ratio=statistics.median(p["cpu_ratio"] for p in pairs),
        host=mid["host"],
        ceiling=mid["ceiling"],
        ceiling_rps=med("ceiling", "requests_per_s"),
        ceiling_cpu_ms=med("ceiling", "cpu_ms_per_req"),
        ceiling_p50_ms=med("ceiling", "p50_ms"),
        ceiling_errors=sum(p["ceiling"]["errors"] for p in pairs),
    )
    return out


def _cases(cfg: dict[str, Any], store: str, args: argparse.Namespace) -> list[tuple[int, int]]:
    logs_arg = getattr(args, "http_logs", None)
    recs_arg = getattr(args, "http_records", None)
    if logs_arg or recs_arg:
        logs = _csv(logs_arg, sorted({n for n, _ in ALL_CASES}))
        recs = _csv(recs_arg, sorted({r for _, r in ALL_CASES}))
        return [(n, r) for n in logs for r in recs]
    return [(int(n), int(r)) for n, r in cfg["cases"][store]]


@contextlib.contextmanager
def _host(store: str, work: Path) -> Iterator[tuple[loadgen.ServerProcess, dict[str, int]]]:
    """The host on ``store``; yields (host, extra pids whose CPU each host window also reads)."""
    if store == "local":
        with loadgen.ServerProcess("host", work / "host-local") as host:
            yield host, {}
        return
    if store != "s3":
        raise ValueError(f"unknown store {store!r} (local, s3)")
    with common.MotoServer() as moto:
        moto.create_bucket(BUCKET)
        env = {"AWS_ENDPOINT_URL": moto.endpoint}
        with loadgen.ServerProcess(
            "host", work / "host-s3", env=env, store=f"s3://{BUCKET}/loghost"
        ) as host:
            proc = moto._proc
            yield host, ({"moto": proc.pid} if proc is not None else {})


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    stores_arg = getattr(args, "http_stores", None)
    stores = [s for s in stores_arg.split(",") if s] if stores_arg else list(cfg["stores"])
    conns = getattr(args, "http_connections", None) or cfg["connections"]
    duration = getattr(args, "http_duration", None) or cfg["duration_s"]
    windows = getattr(args, "http_windows", None) or cfg["windows"]
    warmup = cfg["warmup_s"]
    rows: list[dict[str, Any]] = []
    refs: dict[str, Any] = {}
    case = 0
    with contextlib.ExitStack() as stack:
        work = stack.enter_context(common.scratch_dir("http"))
        ceiling = stack.enter_context(loadgen.ServerProcess("ceiling", work / "ceiling"))
        for store in stores:
            with _host(store, work) as (host, extra):
                _, rss0 = host.cpu_rss()
                refs[f"{store}_host_rss_idle"] = rss0
                if cfg.get("healthz", True) and store == stores[0]:
                    # GET /healthz: a real endpoint of the server (auth-free, no body), for scale.
                    hz = {
                        k: loadgen.run_load(
                            srv.base,
                            ["/healthz"],
                            b"",
                            method="GET",
                            connections=conns,
                            duration_s=duration,
                            workdir=work,
                        )
                        for k, srv in (("ceiling_healthz", ceiling), ("host_healthz", host))
                    }
                    refs.update(hz)
                for n_logs, n_rec in _cases(cfg, store, args):
                    case += 1
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
                        windows=windows,
                        extra=extra,
                    )
                    r["store"] = store
                    rows.append(r)
                    print(
                        f"  . {store:5} {n_logs:5} logs x {n_rec:3} rec/req: host "
                        f"{r['host_rps']:7.0f} req/s p50 {r['p50_ms']:.1f} ms p99 "
                        f"{r['p99_ms']:.1f} ms | ceiling {r['ceiling_rps']:7.0f} req/s -> "
                        f"{r['ratio']:.3f} ({', '.join(f'{x:.3f}' for x in r['ratios'])}); "
                        f"CPU/req {r['host_cpu_ms']:.2f} vs {r['ceiling_cpu_ms']:.2f} ms -> "
                        f"{r['cpu_ratio']:.1f}x (opened {n_logs} logs at "
                        f"{r['open']['opens_per_s']:.0f}/s, errors {r['errors']})",
                        flush=True,
                    )
    data = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "client": loadgen.client_name(),
        "config": {
            "stores": stores,
            "logs": sorted({r["logs"] for r in rows}),
            "records": sorted({r["records_per_request"] for r in rows}),
            "connections": conns,
            "warmup_s": warmup,
            "duration_s": duration,
            "windows": windows,
            "record_json_bytes": loadgen.record_json_bytes(),
            "ceiling_stack": f"uvicorn --loop {loadgen.CEILING_LOOP} --http {loadgen.CEILING_HTTP}",
        },
        "rows": rows,
        "refs": refs,
    }
    data["targets"] = targets(data)
    data["plot"] = str(plot(data, common.img_path("http_latency", quick)))
    return data


# ------------------------------------------------------------------------------- targets


def targets(data: dict[str, Any]) -> list[dict[str, Any]]:
    """Each issue-14 target per store, judged from the run's medians: PASS, MISS, or not run."""
    out: list[dict[str, Any]] = []
    windows = data["config"].get("windows", 1)
    for store in data["config"].get("stores", ["local"]):
        by_case = {
            (r["logs"], r["records_per_request"]): r
            for r in data["rows"]
            if r.get("store", "local") == store
        }
        for label, key, min_ratio, max_cpu in TARGETS:
            r = by_case.get(key)
            t: dict[str, Any] = {"store": store, "target": label, "case": list(key)}
            if r is None:
                t.update(verdict="not measured", ratio=None, cpu_ratio=None)
                out.append(t)
                continue
            ok = r["ratio"] >= min_ratio and (max_cpu is None or r["cpu_ratio"] <= max_cpu)
            verdict = "PASS" if ok else "MISS"
            if r["errors"]:
                verdict = f"MISS ({r['errors']} errors)"
            elif windows < MIN_WINDOWS:
                verdict += f" ({windows} windows, the issue asks {MIN_WINDOWS})"
            t.update(
                verdict=verdict,
                ratio=r["ratio"],
                ratios=r["ratios"],
                cpu_ratio=r["cpu_ratio"] if max_cpu is not None else None,
            )
            out.append(t)
    return out


# ------------------------------------------------------------------------------- rendering


def _ratios(xs: list[float]) -> str:
    return ", ".join(common.fmt(x) for x in xs)


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    windows = cfg.get("windows", 1)
    out = [
        f"Load: {data['client']}, {cfg['connections']} keep-alive connections, closed loop, "
        f"requests round-robin over the logs.  Records are {cfg['record_json_bytes']} B of JSON "
        f"each.  Host: `python -m host.cli serve` with its defaults (httptools parser, INFO "
        f"logging, one JSON line per request).  Ceiling: `bench/http_ceiling.py`, a trivial "
        f"FastAPI POST on the same route, on "
        f"`{cfg.get('ceiling_stack', 'uvicorn (asyncio + h11)')}`.  Per case: {windows} "
        f"alternating window pairs (ceiling then host, {cfg['duration_s']} s each, same body "
        f"and connections); host / ceiling is the median of the pairs' ratios, the pairs listed "
        f"in order.  CPU/request is the server process's user+system CPU over a window divided "
        f"by its requests (median of the windows); the CPU ratio is the median of the pairs' "
        f"host/ceiling CPU ratios.  p50/p99 are the host's, the median over its windows.",
        "",
    ]
    for store in cfg.get("stores", ["local"]):
        rows = [r for r in data["rows"] if r.get("store", "local") == store]
        if not rows:
            continue
        moto = store == "s3"
        out.append(f"**{STORE_TITLES.get(store, store)}**")
        out.append("")
        headers = [
            "logs × records/request",
            "host req/s",
            "host records/s",
            "ceiling req/s",
            "host / ceiling",
            "windows",
            "host CPU ms/req",
            "ceiling CPU ms/req",
            "CPU ratio",
            "host cores busy",
            "p50 ms",
            "p99 ms",
            "errors",
        ]
        if moto:
            headers.insert(9, "moto CPU ms/req")
        table = []
        for r in rows:
            line: list[Any] = [
                f"{r['logs']:,} × {r['records_per_request']}",
                r["host_rps"],
                r["records_per_s"],
                r["ceiling_rps"],
                r["ratio"],
                _ratios(r["ratios"]),
                r["host_cpu_ms"],
                r["ceiling_cpu_ms"],
                r["cpu_ratio"],
                r["host_cores_busy"],
                r["p50_ms"],
                r["p99_ms"],
                r["errors"],
            ]
            if moto:
                line.insert(9, r.get("moto_cpu_ms"))
            table.append(line)
        out.append(common.md_table(headers, table))
        out.append("")
    tg = data.get("targets") or targets(data)
    out.append("Issue 14's targets, judged from the medians above:")
    out.append("")
    out.append(
        common.md_table(
            ["store", "target", "host / ceiling (windows)", "CPU ratio", "verdict"],
            [
                [
                    t["store"],
                    t["target"],
                    "-"
                    if t["ratio"] is None
                    else f"{common.fmt(t['ratio'])} ({_ratios(t.get('ratios', []))})",
                    t["cpu_ratio"],
                    f"**{t['verdict']}**",
                ]
                for t in tg
            ],
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
                "store",
                "logs × records/request (case)",
                "seconds",
                "new logs/s",
                "p50 ms",
                "p99 ms",
                "errors",
            ],
            [
                [
                    r.get("store", "local"),
                    f"{r['logs']:,} × {r['records_per_request']}",
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
        rss = refs.get("local_host_rss_idle") or refs.get("host_rss_idle") or 0
        out.append("")
        out.append(
            f"GET /healthz (no auth, no body; LocalStore host): host "
            f"{hh['requests_per_s']:,.0f} req/s (p50 {hh['p50_ms']:.1f} ms), ceiling app "
            f"{ch['requests_per_s']:,.0f} req/s (p50 {ch['p50_ms']:.1f} ms) -> "
            f"{hh['requests_per_s'] / ch['requests_per_s']:.2f}.  Host RSS idle "
            f"{rss / 2**20:.0f} MiB."
        )
    return "\n".join(out)


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    recs = data["config"]["records"]
    stores = data["config"].get("stores", ["local"])
    fig, axes = plt.subplots(1, len(recs) + 1, figsize=(5.5 * (len(recs) + 1), 4.5), squeeze=False)
    colors = {1: "tab:blue", 100: "tab:orange", 1000: "tab:red"}
    styles = {"local": "o-", "s3": "^:"}
    for j, n_rec in enumerate(recs):
        ax = axes[0][j]
        first = True
        for r in data["rows"]:
            if r["records_per_request"] != n_rec:
                continue
            store = r.get("store", "local")
            pcts = sorted((float(k), v / 1e3) for k, v in r["host"]["pct_us"].items())
            ax.plot(
                [v for _, v in pcts],
                [k for k, _ in pcts],
                styles.get(store, "o-"),
                ms=3,
                color=colors.get(r["logs"]),
                label=f"host ({store}), {r['logs']:,} logs",
            )
            if first:
                cp = sorted((float(k), v / 1e3) for k, v in r["ceiling"]["pct_us"].items())
                ax.plot(
                    [v for _, v in cp],
                    [k for k, _ in cp],
                    "s--",
                    ms=3,
                    color="gray",
                    label="ceiling (trivial FastAPI POST, asyncio + h11)",
                )
                first = False
        ax.set_xscale("log")
        ax.set_xlabel("request latency (ms)")
        ax.set_ylabel("percentile")
        ax.set_title(f"{n_rec} record{'s' if n_rec > 1 else ''} per request: latency CDF")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    ax = axes[0][-1]
    width = 0.8 / max(1, len(stores))
    cases = sorted({(r["logs"], r["records_per_request"]) for r in data["rows"]})
    xs = range(len(cases))
    for k, store in enumerate(stores):
        by_case = {
            (r["logs"], r["records_per_request"]): r
            for r in data["rows"]
            if r.get("store", "local") == store
        }
        off = (k - (len(stores) - 1) / 2) * width
        ax.bar(
            [x + off for x, c in zip(xs, cases, strict=True) if c in by_case],
            [by_case[c]["ratio"] for c in cases if c in by_case],
            width,
            label=f"{store}: median host / ceiling",
        )
        for x, c in zip(xs, cases, strict=True):
            if c in by_case:
                ys = by_case[c]["ratios"]
                ax.plot([x + off] * len(ys), ys, "k.", ms=4)
    for _, key, min_ratio, _cpu in TARGETS:
        if key in cases:
            x = cases.index(key)
            ax.hlines(min_ratio, x - 0.45, x + 0.45, colors="red", linestyles="--", lw=1)
    ax.set_xticks(list(xs))
    ax.set_xticklabels([f"{n}L x{r}" for n, r in cases], fontsize=7)
    ax.set_ylim(0, max([1.0, *(x * 1.05 for r in data["rows"] for x in r["ratios"])]))
    ax.set_title("host / ceiling (bars: median; dots: windows; red: issue-14 target)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(
        f"loghost over HTTP, {data['config']['connections']} connections "
        f"({data['machine']['nproc']} cores, {data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def summary_row(data: dict[str, Any]) -> str:
    """The HTTP row of docs/PERFORMANCE.md's summary table (issue 14's targets), from the same
    results as :func:`render` (``--report --write-docs`` puts it on the line marked
    ``<!-- bench-row:http -->``)."""
    m = data["machine"]
    judged = targets(data)
    parts = []
    for store in data["config"].get("stores", ["local"]):
        shown = [
            f"{t['case'][0]:,}×{t['case'][1]} {common.fmt(t['ratio'])}"
            + (f" (CPU {common.fmt(t['cpu_ratio'])}×)" if t.get("cpu_ratio") is not None else "")
            for t in judged
            if t["store"] == store and t["ratio"] is not None
        ]
        parts.append(f"{store}: " + ", ".join(shown))
    met = sum(1 for t in judged if t["verdict"] == "PASS")
    verdict = "**met**" if met == len(judged) else f"**{met} of {len(judged)} met**"
    return (
        "| Host over HTTP against the HTTP ceiling (issue 14: 1,000 logs × 1 ≥ 0.40 with CPU per "
        "request ≤ 2.5× the ceiling's; 1 × 1 ≥ 0.60; 100 records per request ≥ 0.25) | "
        f"host / ceiling, median of {data['config'].get('windows', 1)} alternating windows: "
        f"{'; '.join(parts)}. From `{data['command']}` ({m['date_utc']}, commit "
        f"{m['git_head']}, load average {m['loadavg_at_start'][0]:.1f} at the start). | "
        f"{verdict} (§4) "
        "<!-- bench-row:http --> |"
    )
