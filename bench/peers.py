"""Peers on the same machine, each beside wal3 / loghost measured in the same run.

* SlateDB (``slatedb`` on PyPI): ``await db.put(k, v)`` then ``await handle.await_durable()``,
  ``flush_interval`` set to our ``batch_interval_s`` (2 ms), 1 KiB values, N concurrent writers,
  on a local directory (``ObjectStore.resolve("file:///")``, a directory next to ours on the same
  disk) and on the same moto S3 server.  Beside it: ``LogWriter`` with N appenders of 1 KiB on
  ``LocalStore`` (fsync) / ``S3Store`` on that moto, durable appends/s (``bench.engine``).
* Chroma (``chromadb.PersistentClient``, single node, embedded): ``collection.add`` of 1 and 100
  records per call (id, 600-char document, 16-dim embedding, 2 metadata fields; no embedding
  function), one caller.  Beside it: ``loghost serve`` over HTTP with 1 and 100 records of the
  same shape per request (64 connections, one log).
* Redis ``XADD`` of 1 KiB, ``redis-server --appendonly yes --appendfsync always``, 1/16/64
  concurrent clients (redis-py asyncio).
* The disk's floor: a plain write(1 KiB)+fsync loop in the same directory.

The peers run in their own virtualenv (``bench/out/peers-venv``, created on first use with
``pip install slatedb chromadb redis``): chromadb pulls in uvloop and httptools, which uvicorn
would silently pick up for ``loghost serve`` if they were installed into the project's venv.
Where ``strace`` is installed, a short extra run of SlateDB and Chroma counts their fsync-family
system calls, so the durability each one buys is measured, not assumed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from verify.testkit import RedisServer, redis_executable

from . import common, loadgen

NAME = "peers"
PEERS_VENV = common.OUT_DIR / "peers-venv"
PEER_PACKAGES = ["slatedb", "chromadb", "redis"]
FLUSH_MS = 2.0  # LogWriterOptions.batch_interval_s default, 2 ms
HEADLINE_N = 64

FULL: dict[str, Any] = {
    "slatedb_local": [1, 16, 64, 256],
    "slatedb_s3": [1, 16, 64, 256],
    "redis": [1, 16, 64],
    "chroma": [1, 100],
    "host_records": [1, 100],
    "warmup_s": 0.5,
    "duration_s": 3.0,
    "strace": True,
    "headline_repeats": 2,
}
QUICK: dict[str, Any] = {
    "slatedb_local": [64],
    "slatedb_s3": [],
    "redis": [16],
    "chroma": [100],
    "host_records": [100],
    "warmup_s": 0.2,
    "duration_s": 0.75,
    "strace": False,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("peers")
    g.add_argument(
        "--peers",
        default=None,
        help="comma-separated subset of slatedb,chroma,redis (default: all)",
    )
    g.add_argument(
        "--peers-duration", type=float, default=None, help="measured seconds per case (3; quick 1)"
    )
    g.add_argument(
        "--peers-no-install",
        action="store_true",
        help="do not create bench/out/peers-venv; skip the peers it lacks",
    )


# ------------------------------------------------------------------------------- venv


def peers_python(install: bool) -> tuple[str | None, dict[str, str]]:
    """The peers' interpreter and package versions (installing them on first use)."""
    py = PEERS_VENV / "bin" / "python"
    if not py.exists() and install:
        base = getattr(sys, "_base_executable", None) or sys.executable
        print(
            f"  . creating {common.rel(PEERS_VENV)} and installing "
            f"{' '.join(PEER_PACKAGES)} (once)",
            flush=True,
        )
        subprocess.run([base, "-m", "venv", str(PEERS_VENV)], check=False)
        subprocess.run([str(py), "-m", "pip", "install", "-q", *PEER_PACKAGES], check=False)
    if not py.exists():
        return None, {}
    out = subprocess.run(
        [
            str(py),
            "-c",
            (
                "import importlib.metadata as m, json\n"
                "v = {}\n"
                "for p in ['slatedb', 'chromadb', 'redis']:\n"
                "    try: v[p] = m.version(p)\n"
                "    except Exception: pass\n"
                "print(json.dumps(v))"
            ),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        return str(py), json.loads(out.stdout)
    except ValueError:
        return str(py), {}


def child(
    py: str, args: list[str], timeout_s: float = 300, strace_to: Path | None = None
) -> dict[str, Any]:
    cmd = [py, "-m", "bench.peers_child", *args]
    if strace_to is not None:
        cmd = [
            "strace",
            "-f",
            "-c",
            "-e",
            "trace=fsync,fdatasync,sync_file_range,syncfs",
            "-o",
            str(strace_to),
            *cmd,
        ]
    env = dict(os.environ)
    env["ANONYMIZED_TELEMETRY"] = "False"
    out = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=common.ROOT,
        env=env,
        check=False,
    )
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("BENCHJSON ")), None)
    if line is None:
        raise RuntimeError(f"peer failed ({' '.join(args[:1])}): {out.stderr[-1500:]}")
    result: dict[str, Any] = json.loads(line[len("BENCHJSON ") :])
    return result


def strace_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1] in ("fsync", "fdatasync", "sync_file_range", "syncfs"):
                counts[parts[-1]] = int(parts[3])
    return counts


# ------------------------------------------------------------------------------- running


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    from . import engine

    cfg = dict(QUICK if quick else FULL)
    if getattr(args, "peers_duration", None):
        cfg["duration_s"] = args.peers_duration
    which = (getattr(args, "peers", None) or "slatedb,chroma,redis").split(",")
    py, versions = peers_python(not getattr(args, "peers_no_install", False))
    data: dict[str, Any] = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "config": cfg,
        "versions": versions,
        "skipped": {},
    }
    warm, dur = cfg["warmup_s"], cfg["duration_s"]
    sargs = ["--warmup", str(warm), "--duration", str(dur)]

    with contextlib.ExitStack() as stack:
        work = stack.enter_context(common.scratch_dir("peers"))
        data["fsync_floor"] = engine.fsync_floor(work, 1024, 0.5 if quick else 1.0)

        def engine_case(kind: str, n: int, make: Any) -> dict[str, Any]:
            return asyncio.run(engine.run_case(kind, make, 1024, n, warm, dur, 0.05))

        from wal3 import LocalStore, S3Store

        # ---------------------------------------------------------------- SlateDB vs engine
        slate: list[dict[str, Any]] = []
        if "slatedb" in which and (py is None or "slatedb" not in versions):
            data["skipped"]["slatedb"] = "slatedb is not installed in bench/out/peers-venv"
        elif "slatedb" in which and py is not None:  # (None: skipped above)
            moto = None
            if cfg["slatedb_s3"]:
                moto = stack.enter_context(common.MotoServer())
                bucket = moto.create_bucket(f"peers-{uuid.uuid4().hex[:8]}")
            for store in ("local", "s3"):
                for n in cfg[f"slatedb_{store}"]:
                    tag = uuid.uuid4().hex[:8]
                    if store == "local":
                        sargs_store = ["--path", str(work / f"slatedb-{tag}")]
                        make: Any = functools.partial(LocalStore, work / f"wal3-{tag}")
                    else:
                        assert moto is not None
                        sargs_store = [
                            "--endpoint",
                            moto.endpoint,
                            "--bucket",
                            bucket,
                            "--path",
                            f"slatedb-{tag}",
                        ]
                        make = functools.partial(
                            S3Store,
                            bucket=bucket,
                            prefix=f"wal3-{tag}",
                            endpoint_url=moto.endpoint,
                            region="us-east-1",
                        )
                    s = child(
                        py,
                        [
                            "slatedb",
                            "--writers",
                            str(n),
                            "--flush-ms",
                            str(FLUSH_MS),
                            *sargs_store,
                            *sargs,
                        ],
                    )
                    e = engine_case("local" if store == "local" else "s3", n, make)
                    row = {
                        "store": store,
                        "writers": n,
                        "slatedb": s,
                        "engine": {
                            k: e[k]
                            for k in (
                                "appends_per_s",
                                "p50_ms",
                                "p99_ms",
                                "records_per_manifest_write",
                                "cpu_s_per_append",
                            )
                        },
                        "ratio": e["appends_per_s"] / s["ops_per_s"],
                    }
                    slate.append(row)
                    print(
                        f"  . {store:5} x{n:<3}: slatedb {s['ops_per_s']:7.0f} durable puts/s "
                        f"(p50 {s['p50_ms']:.1f} ms) | wal3 {e['appends_per_s']:7.0f} "
                        f"appends/s (p50 {e['p50_ms']:.1f} ms) -> {row['ratio']:.2f}",
                        flush=True,
                    )
            # The headline pair again, twice, alternating, so its spread within the run is known.
            if HEADLINE_N in cfg["slatedb_local"]:
                reps = [
                    r["ratio"]
                    for r in slate
                    if r["store"] == "local" and r["writers"] == HEADLINE_N
                ]
                for _ in range(cfg.get("headline_repeats", 0)):
                    tag = uuid.uuid4().hex[:8]
                    s = child(
                        py,
                        [
                            "slatedb",
                            "--writers",
                            str(HEADLINE_N),
                            "--flush-ms",
                            str(FLUSH_MS),
                            "--path",
                            str(work / f"slatedb-{tag}"),
                            *sargs,
                        ],
                    )
                    e = engine_case(
                        "local", HEADLINE_N, lambda t=tag: LocalStore(work / f"wal3-{t}")
                    )
                    reps.append(e["appends_per_s"] / s["ops_per_s"])
                    print(
                        f"  . repeat local x{HEADLINE_N}: slatedb {s['ops_per_s']:.0f} | wal3 "
                        f"{e['appends_per_s']:.0f} -> {reps[-1]:.2f}",
                        flush=True,
                    )
                data["headline_repeats"] = reps
            if cfg["strace"] and shutil.which("strace"):
                f = work / "slatedb.strace"
                s = child(
                    py,
                    [
                        "slatedb",
                        "--writers",
                        "64",
                        "--flush-ms",
                        str(FLUSH_MS),
                        "--path",
                        str(work / "slatedb-strace"),
                        "--warmup",
                        "0",
                        "--duration",
                        "1",
                    ],
                    strace_to=f,
                )
                data["slatedb_strace"] = {"puts": s["ops"], "syscalls": strace_counts(f)}
        data["slatedb"] = slate

        # ---------------------------------------------------------------- Chroma vs host
        chroma: list[dict[str, Any]] = []
        host_rows: list[dict[str, Any]] = []
        if "chroma" in which and (py is None or "chromadb" not in versions):
            data["skipped"]["chroma"] = "chromadb is not installed in bench/out/peers-venv"
        elif "chroma" in which and py is not None:  # (None: skipped above)
            rec_file = work / "records.json"
            rec_file.write_text(json.dumps([loadgen.record(i) for i in range(200)]))
            for per in cfg["chroma"]:
                c = child(
                    py,
                    [
                        "chroma",
                        "--path",
                        str(work / f"chroma-{per}"),
                        "--per-call",
                        str(per),
                        "--records-file",
                        str(rec_file),
                        *sargs,
                    ],
                )
                chroma.append(c)
                print(
                    f"  . chroma add x{per}: {c['records_per_s']:.0f} records/s "
                    f"(p50 {c['p50_ms']:.1f} ms per call)",
                    flush=True,
                )
            if cfg["strace"] and shutil.which("strace"):
                f = work / "chroma.strace"
                c = child(
                    py,
                    [
                        "chroma",
                        "--path",
                        str(work / "chroma-strace"),
                        "--per-call",
                        "100",
                        "--records-file",
                        str(rec_file),
                        "--warmup",
                        "0",
                        "--duration",
                        "1",
                    ],
                    strace_to=f,
                )
                data["chroma_strace"] = {
                    "calls": c["ops"],
                    "records": c["ops"] * 100,
                    "syscalls": strace_counts(f),
                }
            from . import http as http_bench

            with loadgen.ServerProcess("host", work / "host") as host:
                for i, per in enumerate(cfg["host_records"]):
                    r = http_bench.measure_case(
                        host,
                        None,
                        1,
                        per,
                        64,
                        warm,
                        dur,
                        f"peers{i}",
                        work / "load",
                        salt=0x100 + i,
                    )
                    host_rows.append(r)
                    print(
                        f"  . host over HTTP x{per}/request: {r['records_per_s']:.0f} "
                        f"records/s (p50 {r['host']['p50_ms']:.1f} ms)",
                        flush=True,
                    )
        data["chroma"] = chroma
        data["host"] = host_rows

        # ---------------------------------------------------------------- Redis
        redis_rows: list[dict[str, Any]] = []
        server = redis_executable()
        if "redis" in which and server is None:
            data["skipped"]["redis"] = (
                "redis-server is not installed (apt-get install redis-server)"
            )
        elif "redis" in which and (py is None or "redis" not in versions):
            data["skipped"]["redis"] = "redis-py is not installed in bench/out/peers-venv"
        elif "redis" in which and py is not None and server is not None:  # (else skipped above)
            redis = RedisServer(work / "redis", executable=server, durable=True)
            port = redis.port
            try:
                redis.start(15)
                ver = subprocess.run(
                    [server, "--version"], capture_output=True, text=True, check=False
                ).stdout.strip()
                data["versions"]["redis-server"] = ver.split(" sha=")[0]
                for n in cfg["redis"]:
                    r = child(py, ["redis", "--port", str(port), "--writers", str(n), *sargs])
                    ours: dict[str, Any] | None = next(
                        (x["engine"] for x in slate if x["store"] == "local" and x["writers"] == n),
                        None,
                    )
                    if ours is None:
                        ee = engine_case(
                            "local", n, lambda: LocalStore(work / f"wal3-r-{uuid.uuid4().hex[:8]}")
                        )
                        ours = {k: ee[k] for k in ("appends_per_s", "p50_ms", "p99_ms")}
                    redis_rows.append(
                        {
                            "clients": n,
                            "redis": r,
                            "engine": ours,
                            "ratio": ours["appends_per_s"] / r["ops_per_s"],
                        }
                    )
                    print(
                        f"  . redis XADD x{n}: {r['ops_per_s']:.0f}/s (p50 "
                        f"{r['p50_ms']:.2f} ms) | wal3 {ours['appends_per_s']:.0f}/s",
                        flush=True,
                    )
            finally:
                redis.stop()  # our own child, by its handle
        data["redis"] = redis_rows

    data["client"] = loadgen.client_name()
    data["plot"] = str(plot(data, common.img_path("peers_throughput", quick)))
    return data


# ------------------------------------------------------------------------------- rendering


def render(data: dict[str, Any]) -> str:
    out: list[str] = []
    v = data.get("versions", {})
    out.append(
        "Versions: " + ", ".join(f"{k} {x}" for k, x in v.items()) + ".  "
        f"Disk floor (write 1 KiB + fsync loop, same directory): "
        f"{data['fsync_floor']['writes_per_s']:,.0f} fsyncs/s "
        f"(p50 {data['fsync_floor']['p50_ms']:.2f} ms)."
    )
    for k, why in data.get("skipped", {}).items():
        out.append(f"\n**{k} skipped**: {why}.")
    out.append("")
    if data.get("slatedb"):
        out.append(
            f"SlateDB `put` + `await_durable()` (flush_interval {FLUSH_MS:g} ms) vs "
            "wal3 `LogWriter.append` (batch_interval 2 ms), 1 KiB values, closed loop; "
            "local = a directory on the repository's disk (wal3: LocalStore with fsync), "
            "s3 = the same moto server over HTTP:"
        )
        out.append("")
        out.append(
            common.md_table(
                [
                    "store",
                    "writers",
                    "SlateDB durable puts/s",
                    "SlateDB p50 ms",
                    "SlateDB p99 ms",
                    "wal3 durable appends/s",
                    "wal3 p50 ms",
                    "wal3 p99 ms",
                    "wal3 / SlateDB",
                ],
                [
                    [
                        r["store"],
                        r["writers"],
                        r["slatedb"]["ops_per_s"],
                        r["slatedb"]["p50_ms"],
                        r["slatedb"]["p99_ms"],
                        r["engine"]["appends_per_s"],
                        r["engine"]["p50_ms"],
                        r["engine"]["p99_ms"],
                        r["ratio"],
                    ]
                    for r in data["slatedb"]
                ],
            )
        )
        out.append("")
        st = data.get("slatedb_strace")
        if st:
            n = sum(st["syscalls"].values())
            out.append(
                f"strace of SlateDB on the local directory, 64 writers for 1 s: "
                f"{st['puts']:,} durable puts, {n} fsync-family calls "
                f"({st['syscalls'] or 'none'}).  wal3's LocalStore fsyncs the file and "
                f"its directory on every put (two puts per durable append batch)."
            )
            out.append("")
        for r in data["slatedb"]:
            if r["store"] == "local" and r["writers"] == HEADLINE_N:
                reps = sorted(data.get("headline_repeats") or [r["ratio"]])
                med = reps[len(reps) // 2]
                verdict = "PASS" if med >= 1.0 else "MISS"
                spread = (
                    f" (median of {len(reps)} alternating pairs, range "
                    f"{reps[0]:.2f}..{reps[-1]:.2f})"
                    if len(reps) > 1
                    else ""
                )
                out.append(
                    f"- target: with {HEADLINE_N} appenders of 1 KiB on the same local "
                    f"directory, wal3 durable appends/s >= SlateDB-py durable puts/s: "
                    f"**{med:.2f}x**{spread}; the matrix row: "
                    f"{r['engine']['appends_per_s']:,.0f} vs "
                    f"{r['slatedb']['ops_per_s']:,.0f} -> {verdict}.  Not like for like "
                    f"in SlateDB's favour: its local store does not fsync."
                )
        out.append("")
    if data.get("chroma"):
        out.append(
            "Chroma `collection.add` (PersistentClient, one caller, embeddings given) vs "
            "`loghost serve` over HTTP (64 connections, one log, LocalStore with fsync), "
            "same record shape:"
        )
        out.append("")
        rows = [
            [
                f"Chroma add, {c['per_call']} per call",
                c["records_per_s"],
                c["ops_per_s"],
                c["p50_ms"],
                c["p99_ms"],
            ]
            for c in data["chroma"]
        ]
        rows.extend(
            [
                f"loghost HTTP, {h['records_per_request']} per request",
                h["records_per_s"],
                h["host"]["requests_per_s"],
                h["host"]["p50_ms"],
                h["host"]["p99_ms"],
            ]
            for h in data.get("host", [])
        )
        out.append(
            common.md_table(
                ["system", "records/s", "calls/s", "p50 ms per call", "p99 ms per call"], rows
            )
        )
        out.append("")
        st = data.get("chroma_strace")
        if st:
            n = sum(st["syscalls"].values())
            out.append(
                f"strace of Chroma, 100 records per call for 1 s: {st['calls']} calls, "
                f"{n} fsync-family calls ({st['syscalls'] or 'none'})."
            )
            out.append("")
        c100 = next((c for c in data["chroma"] if c["per_call"] == 100), None)
        h100 = next((h for h in data.get("host", []) if h["records_per_request"] == 100), None)
        if c100 and h100:
            ratio = h100["records_per_s"] / c100["records_per_s"]
            out.append(
                f"- target: the host over HTTP with 100 records per request beats "
                f"Chroma's add of 100 records per call: **{ratio:.2f}x** "
                f"({h100['records_per_s']:,.0f} vs {c100['records_per_s']:,.0f} "
                f"records/s) -> {'PASS' if ratio > 1 else 'MISS'}.  Not like for like: "
                f"Chroma is called by one thread in-process and also indexes "
                f"(SQLite + its HNSW/metadata segments); the host is called by 64 HTTP "
                f"connections and only logs."
            )
        out.append("")
    if data.get("redis"):
        out.append(
            "Redis `XADD` of 1 KiB (`appendonly yes`, `appendfsync always`; redis-py "
            "asyncio clients sharing a pool) vs wal3 on LocalStore at the same "
            "concurrency (from the SlateDB rows):"
        )
        out.append("")
        out.append(
            common.md_table(
                [
                    "clients",
                    "Redis XADD/s",
                    "Redis p50 ms",
                    "Redis p99 ms",
                    "wal3 appends/s",
                    "wal3 / Redis",
                ],
                [
                    [
                        r["clients"],
                        r["redis"]["ops_per_s"],
                        r["redis"]["p50_ms"],
                        r["redis"]["p99_ms"],
                        r["engine"]["appends_per_s"],
                        r["ratio"],
                    ]
                    for r in data["redis"]
                ],
            )
        )
    return "\n".join(out)


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    ax = axes[0]
    for store, color in (("local", "tab:blue"), ("s3", "tab:green")):
        rs = [r for r in data.get("slatedb", []) if r["store"] == store]
        if not rs:
            continue
        xs = [r["writers"] for r in rs]
        ax.plot(
            xs,
            [r["engine"]["appends_per_s"] for r in rs],
            "o-",
            color=color,
            label=f"wal3 ({'LocalStore, fsync' if store == 'local' else 'moto S3'})",
        )
        ax.plot(
            xs,
            [r["slatedb"]["ops_per_s"] for r in rs],
            "s--",
            color=color,
            label=f"SlateDB ({'local dir, no fsync' if store == 'local' else 'moto S3'})",
        )
    rr = data.get("redis", [])
    if rr:
        ax.plot(
            [r["clients"] for r in rr],
            [r["redis"]["ops_per_s"] for r in rr],
            "^-",
            color="tab:red",
            label="Redis XADD (appendfsync always)",
        )
    ax.axhline(
        data["fsync_floor"]["writes_per_s"],
        color="gray",
        ls="-.",
        lw=1,
        label="write+fsync loop (1 writer)",
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent writers")
    ax.set_ylabel("durable writes/s (1 KiB)")
    ax.set_title("throughput vs concurrency")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    ax = axes[1]
    labels, vals, colors = [], [], []
    for c in data.get("chroma", []):
        labels.append(f"Chroma add\n{c['per_call']}/call")
        vals.append(c["records_per_s"])
        colors.append("tab:purple")
    for h in data.get("host", []):
        labels.append(f"loghost HTTP\n{h['records_per_request']}/request")
        vals.append(h["records_per_s"])
        colors.append("tab:blue")
    if vals:
        ax.bar(range(len(vals)), vals, color=colors)
        ax.set_xticks(range(len(vals)))
        ax.set_xticklabels(labels, fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("records/s")
        ax.set_title("Chroma add vs loghost over HTTP (same records)")
        ax.grid(True, axis="y", which="both", alpha=0.3)
    fig.suptitle(
        f"peers on the same machine ({data['machine']['nproc']} cores, "
        f"{data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
