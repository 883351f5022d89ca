"""Engine throughput and latency: one log, N concurrent appenders, three stores, two bounds.

For every (store, record size, appender count) the benchmark opens a fresh log, lets ``N`` tasks
call ``await w.append(body)`` in a closed loop, discards a warm-up, and then measures for a fixed
wall-clock window: durable appends/s (appends *completed* inside the window), p50/p99 append
latency, and from ``w.stats`` the records per fragment and per manifest write.

Stores:

* ``local``  -- ``LocalStore`` (fsync on) in a scratch directory on the repository's disk;
* ``faulty`` -- ``FaultyStore(LocalStore(...), latency_s=0.02)``: every request takes >= 20 ms;
* ``s3``     -- ``S3Store`` on moto's S3 server over HTTP on 127.0.0.1 (moto runs in a child
  process, on the same 2 cores);
* ``memory`` -- a bench-only in-memory store (``bench.common.memory_store``): no disk, no threads,
  no latency, so the row shows what the engine's own CPU allows (full runs only).

Bounds printed beside each row (the headline numbers are these ratios, measured in the same run):

* I/O bound (latency store only): manifest writes are serial, so at most ``1 / latency`` of them
  land per second; each carries ``records / manifest writes`` records (observed), so
  ``bound = (1 / 0.020) x (records per manifest write)`` and ``measured / bound`` equals the
  fraction of the time a manifest write is in flight.
* CPU bound: the appends/s that encoding alone allows -- ``encode_fragment`` (Parquet + per-record
  SHA3 setsum) plus the content MD5 the writer takes, on batches of the observed records per
  fragment, no I/O at all -- measured right after the row.
* Disk floor (reference rows): a plain ``write(record) + fsync`` loop on a file in the same
  directory.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import os
import time
import uuid
from typing import Any

from . import common

NAME = "engine"
LATENCY_S = 0.020
TARGET_RATIO = 0.80  # "at least 80% of its bound at 256 appenders"
HEADLINE_REPEATS = 2  # extra runs of the headline case (full mode), for its spread

FULL: dict[str, Any] = {
    "sizes": [1024, 4096],
    "appenders": [1, 16, 64, 256],
    "warmup_s": 0.75,
    "duration_s": 3.0,
    "stores": ["local", "faulty", "s3", "memory"],
}
QUICK: dict[str, Any] = {
    "sizes": [1024],
    "appenders": [1, 256],
    "warmup_s": 0.15,
    "duration_s": 0.4,
    "stores": ["local", "faulty", "s3"],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument(
        "--engine-stores",
        default=None,
        help="comma-separated subset of local,faulty,s3,memory (default: all; quick: no memory)",
    )
    g.add_argument(
        "--engine-duration",
        type=float,
        default=None,
        help="measured seconds per case (default 3, quick 0.4)",
    )
    g.add_argument(
        "--engine-appenders",
        default=None,
        help="comma-separated appender counts (default 1,16,64,256)",
    )
    g.add_argument(
        "--engine-sizes",
        default=None,
        help="comma-separated record sizes in bytes (default 1024,4096)",
    )


# ------------------------------------------------------------------------------- measuring


async def drive(
    writer: Any, size: int, appenders: int, warmup_s: float, duration_s: float, think_s: float = 0.0
) -> dict[str, Any]:
    """Closed-loop appenders on an open writer; measure the window after the warm-up.

    With ``think_s`` each appender sleeps uniform(0, think_s) between appends (spread arrivals).
    """
    import random

    from wal3 import Wal3Error

    bodies = [os.urandom(size) for _ in range(appenders)]  # incompressible, one per appender
    latencies: list[float] = []
    errors: collections.Counter[str] = collections.Counter()
    t_open = time.perf_counter()
    win = [t_open + warmup_s, t_open + warmup_s + duration_s]
    stop = False

    async def appender(i: int) -> None:
        body = bodies[i]
        rng = random.Random(i)
        while not stop:
            if think_s:
                await asyncio.sleep(rng.uniform(0.0, think_s))
            t0 = time.perf_counter()
            try:
                await writer.append(body)
            except Wal3Error as e:
                errors[type(e).__name__] += 1
                await asyncio.sleep(0.01)
                continue
            t1 = time.perf_counter()
            if win[0] <= t1 <= win[1]:
                latencies.append(t1 - t0)

    tasks = [asyncio.create_task(appender(i)) for i in range(appenders)]
    await asyncio.sleep(max(0.0, win[0] - time.perf_counter()))
    s0, c0, w0 = collections.Counter(writer.stats), time.process_time(), time.perf_counter()
    win[0] = w0
    await asyncio.sleep(max(0.0, win[1] - time.perf_counter()))
    s1, c1, w1 = collections.Counter(writer.stats), time.process_time(), time.perf_counter()
    win[1] = w1
    stop = True
    await asyncio.gather(*tasks)
    window = w1 - w0
    d = {k: s1[k] - s0[k] for k in set(s0) | set(s1)}
    n = len(latencies)
    latencies.sort()
    mw = d.get("manifest_writes", 0)
    frags = d.get("fragments_written", 0)
    return {
        "window_s": window,
        "appends": n,
        "appends_per_s": n / window,
        "p50_ms": common.percentile(latencies, 50) * 1e3,
        "p99_ms": common.percentile(latencies, 99) * 1e3,
        "max_ms": (latencies[-1] * 1e3) if latencies else float("nan"),
        "manifest_writes": mw,
        "manifest_writes_per_s": mw / window,
        "fragments": frags,
        "records_per_fragment": n / frags if frags else float("nan"),
        "records_per_manifest_write": n / mw if mw else float("nan"),
        "cpu_s_per_append": (c1 - c0) / n if n else float("nan"),
        "process_cpu_util": (c1 - c0) / window,
        "stats_delta": d,
        "errors": dict(errors),
    }


def encode_only_rate(
    size: int, batch: float, min_time_s: float = 0.25, blocks: int = 3
) -> dict[str, float]:
    """Appends/s allowed by encoding + hashing alone, on batches of ``batch`` records (the median
    of ``blocks`` timed blocks, so one noisy moment does not set the reference)."""
    from wal3.fragment import encode_fragment

    batch = max(1, round(batch))
    bodies = [os.urandom(size) for _ in range(batch)]
    _ = encode_fragment(1, 1, 1, bodies).content_md5  # warm up pyarrow
    per: list[float] = []
    n = 0
    for _ in range(blocks):
        k = 0
        t0 = time.perf_counter()
        while True:
            frag = encode_fragment(n + 1, 1 + n * batch, 1_700_000_000_000_000 + n, bodies)
            _ = frag.content_md5  # the writer computes it for every fragment
            n += 1
            k += 1
            el = time.perf_counter() - t0
            if el >= min_time_s / blocks and k >= 2:
                break
        per.append(el / k)
    per.sort()
    s = per[len(per) // 2]
    return {"batch": batch, "s_per_fragment": s, "appends_per_s": batch / s}


def fsync_floor(directory: os.PathLike[str], size: int, duration_s: float) -> dict[str, Any]:
    """The disk's floor: append ``size`` bytes to one file and fsync, again and again."""
    path = os.path.join(directory, f"fsync-floor-{size}")
    body = os.urandom(size)
    lat: list[float] = []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        end = time.perf_counter() + duration_s
        while True:
            t0 = time.perf_counter()
            os.write(fd, body)
            os.fsync(fd)
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            if t1 >= end:
                break
    finally:
        os.close(fd)
        os.unlink(path)
    el = sum(lat)
    lat.sort()
    return {
        "size": size,
        "writes": len(lat),
        "writes_per_s": len(lat) / el,
        "p50_ms": common.percentile(lat, 50) * 1e3,
        "p99_ms": common.percentile(lat, 99) * 1e3,
    }


async def run_case(
    store_kind: str,
    make_store: Any,
    size: int,
    appenders: int,
    warmup_s: float,
    duration_s: float,
    encode_s: float = 0.25,
) -> dict[str, Any]:
    from wal3 import LogWriter, LogWriterOptions

    store = make_store()
    try:
        writer = await LogWriter.open(
            store, f"bench-{uuid.uuid4().hex[:8]}", LogWriterOptions(writer_name="bench")
        )
        try:
            res = await drive(writer, size, appenders, warmup_s, duration_s)
        finally:
            await writer.close()
    finally:
        await store.close()
    res.update(store=store_kind, size=size, appenders=appenders)
    rpf = res["records_per_fragment"]
    enc = encode_only_rate(size, rpf if rpf == rpf else 1.0, encode_s)
    res["encode_only"] = enc
    res["cpu_ratio"] = res["appends_per_s"] / enc["appends_per_s"]
    if store_kind == "faulty":
        bound = (1.0 / LATENCY_S) * res["records_per_manifest_write"]
        res["io_bound_appends_per_s"] = bound
        res["io_ratio"] = res["appends_per_s"] / bound
    return res


# ------------------------------------------------------------------------------- running


def _csv(value: str | None, cast: Any, default: list[Any]) -> list[Any]:
    return [cast(v) for v in value.split(",") if v] if value else list(default)


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Run the matrix and return the results (also plotted)."""
    cfg = dict(QUICK if quick else FULL)
    stores = _csv(getattr(args, "engine_stores", None), str, cfg["stores"])
    sizes = _csv(getattr(args, "engine_sizes", None), int, cfg["sizes"])
    appenders = _csv(getattr(args, "engine_appenders", None), int, cfg["appenders"])
    duration = getattr(args, "engine_duration", None) or cfg["duration_s"]
    warmup = cfg["warmup_s"]
    return asyncio.run(_run(stores, sizes, appenders, warmup, duration, quick))


async def _run(
    stores: list[str],
    sizes: list[int],
    appenders: list[int],
    warmup: float,
    duration: float,
    quick: bool,
) -> dict[str, Any]:
    from wal3 import FaultyStore, LocalStore, S3Store

    rows: list[dict[str, Any]] = []
    floors: list[dict[str, Any]] = []
    with contextlib.ExitStack() as stack:
        scratch = stack.enter_context(common.scratch_dir("engine"))
        moto = None
        if "s3" in stores:
            moto = stack.enter_context(common.MotoServer())
            bucket = moto.create_bucket(f"bench-{uuid.uuid4().hex[:8]}")
        floor_s = 0.15 if quick else 0.5

        def local() -> Any:
            return LocalStore(scratch / uuid.uuid4().hex[:8])

        def faulty() -> Any:
            return FaultyStore(local(), seed=0, latency_s=LATENCY_S)

        def s3() -> Any:
            assert moto is not None
            return S3Store(
                bucket=bucket,
                prefix=uuid.uuid4().hex[:8],
                endpoint_url=moto.endpoint,
                region="us-east-1",
            )

        makers = {"local": local, "faulty": faulty, "s3": s3, "memory": common.memory_store}
        for kind in stores:
            for size in sizes:
                for n in appenders:
                    floor = None
                    if kind == "local":
                        # The disk's floor right before the row: the disk's speed drifts with the
                        # machine's other tenants, so the reference is taken next to each row.
                        floor = fsync_floor(scratch, size, floor_s)
                        floors.append(floor)
                    r = await run_case(
                        kind, makers[kind], size, n, warmup, duration, 0.1 if quick else 0.25
                    )
                    if floor is not None:
                        r["fsync_floor"] = floor
                    rows.append(r)
                    extra = f", {r['io_ratio']:.2f} of I/O bound" if "io_ratio" in r else ""
                    _progress(
                        f"{kind:6} {size:5} B x{n:<4} {r['appends_per_s']:9.0f} appends/s "
                        f"p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms{extra}"
                    )
        # The headline case again (interleaved across sizes), so its run-to-run spread is known.
        repeats: dict[str, list[float]] = {}
        if "faulty" in stores:
            top = max(appenders)
            for r in rows:
                if r["store"] == "faulty" and r["appenders"] == top:
                    repeats[str(r["size"])] = [r["io_ratio"]]
            for _ in range(0 if quick else HEADLINE_REPEATS):
                for size in sizes:
                    r = await run_case(
                        "faulty", faulty, size, top, warmup, duration, 0.1 if quick else 0.25
                    )
                    repeats[str(size)].append(r["io_ratio"])
                    _progress(f"repeat faulty {size} B x{top}: {r['io_ratio']:.2f} of I/O bound")
    data = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "config": {
            "stores": stores,
            "sizes": sizes,
            "appenders": appenders,
            "warmup_s": warmup,
            "duration_s": duration,
            "latency_s": LATENCY_S,
        },
        "fsync_floor": floors,
        "rows": rows,
        "headline_repeats": repeats,
    }
    data["plot"] = str(plot(data, common.img_path("engine_throughput", quick)))
    return data


def _progress(msg: str) -> None:
    print(f"  . {msg}", flush=True)


# ------------------------------------------------------------------------------- rendering


def _label(store: str) -> str:
    return {
        "local": "LocalStore (fsync)",
        "faulty": "FaultyStore(20 ms)",
        "s3": "S3Store on moto/HTTP",
        "memory": "MemoryStore (bench-only)",
    }.get(store, store)


def render(data: dict[str, Any]) -> str:
    rows = data["rows"]
    out = []
    out.append(
        "Throughput and latency (durable appends; window "
        f"{data['config']['duration_s']} s after {data['config']['warmup_s']} s warm-up):"
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "store",
                "record",
                "appenders",
                "appends/s",
                "p50 ms",
                "p99 ms",
                "rec/fragment",
                "rec/manifest write",
                "manifest writes/s",
                "CPU s/append (µs)",
            ],
            [
                [
                    _label(r["store"]),
                    r["size"],
                    r["appenders"],
                    r["appends_per_s"],
                    r["p50_ms"],
                    r["p99_ms"],
                    r["records_per_fragment"],
                    r["records_per_manifest_write"],
                    r["manifest_writes_per_s"],
                    r["cpu_s_per_append"] * 1e6,
                ]
                for r in rows
            ],
        )
    )
    out.append("")
    out.append(
        "Bounds (same run).  I/O bound = (1 / 20 ms) x records per manifest write; "
        "encode-only = encode_fragment + MD5 on batches of the observed size, no I/O:"
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "store",
                "record",
                "appenders",
                "appends/s",
                "I/O bound",
                "measured/I/O bound",
                "encode-only appends/s",
                "measured/encode-only",
            ],
            [
                [
                    _label(r["store"]),
                    r["size"],
                    r["appenders"],
                    r["appends_per_s"],
                    r.get("io_bound_appends_per_s"),
                    r.get("io_ratio"),
                    r["encode_only"]["appends_per_s"],
                    r["cpu_ratio"],
                ]
                for r in rows
            ],
        )
    )
    out.append("")
    out.append(
        "Disk floor (plain write + fsync loop on the same directory, measured for "
        "0.5 s right before each LocalStore row) and LocalStore against it:"
    )
    out.append("")
    frows = []
    for r in rows:
        f = r.get("fsync_floor")
        if r["store"] == "local" and f:
            frows.append(
                [
                    f"{r['size']} B",
                    r["appenders"],
                    f["writes_per_s"],
                    f["p50_ms"],
                    r["appends_per_s"],
                    r["appends_per_s"] / f["writes_per_s"],
                ]
            )
    out.append(
        common.md_table(
            [
                "record",
                "appenders",
                "fsync writes/s",
                "fsync p50 ms",
                "LocalStore appends/s",
                "appends / fsyncs",
            ],
            frows,
        )
    )
    out.append("")
    out.append(headline(data))
    return "\n".join(out)


def headline(data: dict[str, Any]) -> str:
    """The issue target, stated as PASS/MISS with the ratio (median of the repeats)."""
    lines = []
    reps = data.get("headline_repeats", {})
    for r in data["rows"]:
        if r["store"] == "faulty" and r["appenders"] == max(data["config"]["appenders"]):
            samples = sorted(reps.get(str(r["size"])) or [r["io_ratio"]])
            med = samples[len(samples) // 2]
            verdict = "PASS" if med >= TARGET_RATIO else "MISS"
            spread = (
                f" (median of {len(samples)} runs, range {samples[0]:.2f}..{samples[-1]:.2f})"
                if len(samples) > 1
                else ""
            )
            floor_ms = 2 * LATENCY_S * 1e3
            lines.append(
                f"- target `FaultyStore(20 ms)` at {r['appenders']} appenders, "
                f"{r['size']} B records: measured/bound = **{med:.2f}**{spread} "
                f"(target >= {TARGET_RATIO:.2f}) -> {verdict}.  Closed-loop view of "
                f"the same row: two injected round trips = {floor_ms:.0f} ms, p50 append "
                f"latency = {r['p50_ms']:.1f} ms ({floor_ms / r['p50_ms']:.2f})."
            )
    return "\n".join(lines)


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = data["config"]["sizes"]
    fig, axes = plt.subplots(2, len(sizes), figsize=(6 * len(sizes), 8), squeeze=False)
    colors = {"local": "tab:blue", "faulty": "tab:red", "s3": "tab:green", "memory": "tab:gray"}
    for j, size in enumerate(sizes):
        ax, axl = axes[0][j], axes[1][j]
        for kind in data["config"]["stores"]:
            rs = [r for r in data["rows"] if r["store"] == kind and r["size"] == size]
            if not rs:
                continue
            xs = [r["appenders"] for r in rs]
            ax.plot(
                xs,
                [r["appends_per_s"] for r in rs],
                "o-",
                color=colors.get(kind),
                label=_label(kind),
            )
            ax.plot(
                xs,
                [r["encode_only"]["appends_per_s"] for r in rs],
                ":",
                color=colors.get(kind),
                alpha=0.6,
                label=f"encode-only bound ({kind})",
            )
            if kind == "faulty":
                ax.plot(
                    xs,
                    [r["io_bound_appends_per_s"] for r in rs],
                    "--",
                    color="tab:red",
                    alpha=0.6,
                    label="I/O bound (1/20 ms x rec/manifest write)",
                )
            axl.plot(
                xs,
                [r["p50_ms"] for r in rs],
                "o-",
                color=colors.get(kind),
                label=f"{_label(kind)} p50",
            )
            axl.plot(
                xs,
                [r["p99_ms"] for r in rs],
                "s--",
                color=colors.get(kind),
                alpha=0.6,
                label=f"{_label(kind)} p99",
            )
        fl = sorted(f["writes_per_s"] for f in data["fsync_floor"] if f["size"] == size)
        if fl:
            ax.axhline(
                fl[len(fl) // 2], color="gray", lw=1, ls="-.", label="write+fsync floor (median)"
            )
        for a in (ax, axl):
            a.set_xscale("log", base=2)
            a.set_yscale("log")
            a.set_xlabel("concurrent appenders")
            a.grid(True, which="both", alpha=0.3)
        ax.set_title(f"{size} B records: durable appends/s")
        axl.set_title(f"{size} B records: append latency (ms)")
        ax.legend(fontsize=7)
        axl.legend(fontsize=7)
    fig.suptitle(
        f"wal3 engine, one log ({data['machine']['nproc']} cores, {data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
