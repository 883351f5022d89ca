"""Manifest bytes written per append as one log grows from 10^3 to 10^5 fragments.

One writer appends 1 KiB records serially, so every append is exactly one fragment and (at least)
one manifest write; the default snapshot thresholds (100 fragments per depth-1 snapshot, 20
snapshots per roll-up) keep the root manifest bounded.  A thin store wrapper counts the bytes of
every successful put to ``manifest/MANIFEST`` (and, separately, to ``snapshot/``); each put is
charged to the append in progress when it completes, so snapshot-only manifest writes are counted
too.

The store is ``LocalStore(dir, fsync=False)`` on tmpfs (``/dev/shm``) when available, else on the
repository's disk: this benchmark measures bytes, not time, and 10^5 serial appends must finish in
a few minutes.  Windows are the last 10% of the appends before each checkpoint (10^3, 3x10^3, 10^4,
3x10^4, 10^5): whole multiples of the 100-fragment snapshot cycle, so the root's saw-tooth averages
out.  Ratios are to the first window of the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from . import common

NAME = "manifest_growth"
RECORD_BYTES = 1024
# "~flat" read as: no window more than 1.5x the first over 100x growth (linear growth would be
# 100x).  This reading was fixed after the first run; the table gives every ratio.
FLAT_TOLERANCE = 1.5
CYCLE = 100 * 20  # fragments per depth-1 roll-up: the root's slower saw-tooth


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("manifest_growth")
    g.add_argument(
        "--growth-fragments",
        type=int,
        default=None,
        help="grow the log to this many fragments (default 100000, quick 5000)",
    )
    g.add_argument(
        "--growth-on-disk",
        action="store_true",
        help="use a scratch dir on the repository's disk instead of /dev/shm",
    )


def _counting_store(inner: Any) -> Any:
    from wal3 import ObjectStore
    from wal3.paths import MANIFEST_PATH, SNAPSHOT_PREFIX

    class CountingStore(ObjectStore):
        """Delegates to ``inner``; records the size of every successful manifest/snapshot put."""

        def __init__(self) -> None:
            self.inner = inner
            self.manifest_puts: list[int] = []
            self.snapshot_puts: list[int] = []
            self.fragment_bytes = 0

        async def get(self, key: str) -> Any:
            return await inner.get(key)

        async def head(self, key: str) -> Any:
            return await inner.head(key)

        async def put(
            self, key: str, data: bytes, *, if_none_match: Any = None, if_match: str | None = None
        ) -> str:
            etag: str = await inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
            if key.endswith(MANIFEST_PATH):
                self.manifest_puts.append(len(data))
            elif f"/{SNAPSHOT_PREFIX}" in key or key.startswith(SNAPSHOT_PREFIX):
                self.snapshot_puts.append(len(data))
            else:
                self.fragment_bytes += len(data)
            return etag

        async def delete(self, key: str) -> None:
            await inner.delete(key)

        async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[Any]:
            async for m in inner.list(prefix, start_after=start_after):
                yield m

        def url_for(self, key: str) -> str:
            return str(inner.url_for(key))

        async def close(self) -> None:
            await inner.close()

    return CountingStore()


def checkpoints(n: int) -> list[int]:
    """10^3, 3x10^3, 10^4, ... up to n (and n itself)."""
    out = []
    k = 1000
    while k <= n:
        out.append(k)
        if 3 * k <= n:
            out.append(3 * k)
        k *= 10
    if not out or out[-1] != n:
        out.append(n)
    return sorted(set(out))


async def grow(directory: os.PathLike[str], n: int) -> dict[str, Any]:
    from wal3 import LocalStore, LogWriter, LogWriterOptions

    store = _counting_store(LocalStore(directory, fsync=False))
    writer = await LogWriter.open(store, "growth", LogWriterOptions(writer_name="bench"))
    body = os.urandom(RECORD_BYTES)
    per_append_manifest = [0] * n  # manifest bytes charged to append i
    per_append_snapshot = [0] * n
    per_append_writes = [0] * n  # manifest writes charged to append i
    root_frags = [0] * n
    root_snaps = [0] * n
    depth_max = [0] * n
    last_size = [0] * n  # size of the newest manifest after append i
    append_s = [0.0] * n
    mp, sp = store.manifest_puts, store.snapshot_puts
    seen_m = len(mp)
    seen_s = 0
    t_start = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        await writer.append(body)
        append_s[i] = time.perf_counter() - t0
        if len(mp) > seen_m:
            per_append_manifest[i] = sum(mp[seen_m:])
            per_append_writes[i] = len(mp) - seen_m
            seen_m = len(mp)
        if len(sp) > seen_s:
            per_append_snapshot[i] = sum(sp[seen_s:])
            seen_s = len(sp)
        m = writer.manifest
        root_frags[i] = len(m.fragments)
        root_snaps[i] = len(m.snapshots)
        depth_max[i] = max((s.depth for s in m.snapshots), default=0)
        last_size[i] = mp[-1] if mp else 0
        if (i + 1) % 20000 == 0:
            print(
                f"  . {i + 1} fragments, manifest {last_size[i]} B, "
                f"{time.perf_counter() - t_start:.0f} s",
                flush=True,
            )
    elapsed = time.perf_counter() - t_start
    await writer.close()
    stats = dict(writer.stats)
    await store.close()
    # Anything that landed after the last append (a snapshot link during close) goes to the last.
    if len(mp) > seen_m:
        per_append_manifest[-1] += sum(mp[seen_m:])
        per_append_writes[-1] += len(mp) - seen_m
    return {
        "elapsed_s": elapsed,
        "stats": stats,
        "fragment_bytes": store.fragment_bytes,
        "series": {
            "manifest_bytes": per_append_manifest,
            "snapshot_bytes": per_append_snapshot,
            "manifest_writes": per_append_writes,
            "root_fragments": root_frags,
            "root_snapshots": root_snaps,
            "depth": depth_max,
            "manifest_size": last_size,
            "append_s": append_s,
        },
    }


def windows(series: dict[str, list[Any]], n: int) -> list[dict[str, Any]]:
    out = []
    for cp in checkpoints(n):
        lo, hi = cp - cp // 10, cp  # appends (lo, hi], i.e. indices lo..hi-1
        k = hi - lo

        def mean(name: str, lo: int = lo, hi: int = hi, k: int = k) -> float:
            total: float = sum(series[name][lo:hi])
            return total / k

        cyc = None
        if cp >= CYCLE:
            cyc = sum(series["manifest_bytes"][cp - CYCLE : cp]) / CYCLE
        out.append(
            {
                "fragments": cp,
                "window": [lo + 1, hi],
                "appends": k,
                "cycle_manifest_bytes_per_append": cyc,
                "manifest_bytes_per_append": mean("manifest_bytes"),
                "manifest_writes_per_append": mean("manifest_writes"),
                "snapshot_bytes_per_append": mean("snapshot_bytes"),
                "max_manifest_bytes": max(series["manifest_size"][lo:hi]),
                "mean_root_fragments": mean("root_fragments"),
                "mean_root_snapshots": mean("root_snapshots"),
                "max_depth": max(series["depth"][lo:hi]),
                "mean_append_ms": mean("append_s") * 1e3,
            }
        )
    first = out[0]
    base_cycle = next(
        (
            w["cycle_manifest_bytes_per_append"]
            for w in out
            if w["cycle_manifest_bytes_per_append"] is not None
        ),
        None,
    )
    for w in out:
        c = w["cycle_manifest_bytes_per_append"]
        w["ratio_cycle"] = c / base_cycle if c is not None and base_cycle else None
        w["ratio_manifest_bytes"] = (
            w["manifest_bytes_per_append"] / first["manifest_bytes_per_append"]
        )
        w["ratio_append_time"] = w["mean_append_ms"] / first["mean_append_ms"]
        w["ratio_metadata_bytes"] = (
            w["manifest_bytes_per_append"] + w["snapshot_bytes_per_append"]
        ) / (first["manifest_bytes_per_append"] + first["snapshot_bytes_per_append"])
    return out


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    # Quick stops at 5x10^3: 10^4 serial appends alone take 20-50 s on this machine.
    n = getattr(args, "growth_fragments", None) or (5_000 if quick else 100_000)
    base = None if getattr(args, "growth_on_disk", False) else common.tmpfs_dir()
    with common.scratch_dir("growth", base) as d:
        where = "tmpfs (/dev/shm)" if base is not None else "repository disk"
        print(f"  . growing one log to {n} fragments on {where}", flush=True)
        res = asyncio.run(grow(d, n))
    series = res.pop("series")
    wins = windows(series, n)
    _save_series(series, common.out_path(NAME, quick, ".series.json.gz"))
    data = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "config": {
            "fragments": n,
            "record_bytes": RECORD_BYTES,
            "store": where,
            "snapshot_fragment_threshold": 100,
            "snapshot_threshold": 20,
        },
        "windows": wins,
        **res,
    }
    data["plot"] = str(plot(series, wins, data, common.img_path("manifest_growth", quick)))
    # Keep the JSON small: a thinned copy of the series is enough to re-plot.
    step = max(1, n // 5000)
    data["series_thinned"] = {
        "step": step,
        **{k: v[::step] for k, v in series.items() if k != "append_s"},
    }
    return data


def _save_series(series: dict[str, list[Any]], path: Any) -> None:
    """The full per-append series, so windows and plots can be recomputed without re-running."""
    import gzip
    import json

    with gzip.open(path, "wt") as f:
        json.dump(series, f)


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    out = [
        f"One writer, {cfg['record_bytes']} B records appended serially (one fragment per "
        f"append), default snapshot thresholds, LocalStore(fsync=False) on {cfg['store']}; "
        f"{data['stats'].get('manifest_writes', 0):,} manifest writes, "
        f"{data['stats'].get('snapshots_written', 0):,} snapshots, "
        f"{data['elapsed_s']:.0f} s.  Window = the last 10% of appends before the checkpoint; "
        f"'last {CYCLE:,}' = the mean over the last full depth-1 roll-up cycle "
        f"({CYCLE:,} fragments), ratio to the first checkpoint that has one.",
        "",
    ]
    out.append(
        common.md_table(
            [
                "fragments",
                "window",
                "manifest B/append",
                "ratio to first",
                f"B/append, last {CYCLE:,}",
                "ratio",
                "max manifest B",
                "root frags (mean)",
                "root snapshot ptrs (mean)",
                "depth",
                "snapshot B/append",
                "manifest+snapshot ratio",
                "ms/append",
                "time ratio",
            ],
            [
                [
                    w["fragments"],
                    f"{w['window'][0]:,}..{w['window'][1]:,}",
                    w["manifest_bytes_per_append"],
                    w["ratio_manifest_bytes"],
                    w.get("cycle_manifest_bytes_per_append"),
                    w.get("ratio_cycle"),
                    w["max_manifest_bytes"],
                    w["mean_root_fragments"],
                    w["mean_root_snapshots"],
                    w["max_depth"],
                    w["snapshot_bytes_per_append"],
                    w["ratio_metadata_bytes"],
                    w["mean_append_ms"],
                    w["ratio_append_time"],
                ]
                for w in data["windows"]
            ],
        )
    )
    out.append("")
    out.append(headline(data))
    return "\n".join(out)


def headline(data: dict[str, Any]) -> str:
    wins = data["windows"]
    w0, wn = wins[0], wins[-1]
    worst = max(wins, key=lambda w: w["ratio_manifest_bytes"])
    verdict = "PASS" if worst["ratio_manifest_bytes"] <= FLAT_TOLERANCE else "MISS"
    amp = w0["manifest_bytes_per_append"] / data["config"]["record_bytes"]
    return (
        f'- target "manifest bytes per append stay flat": {w0["fragments"]:,} -> '
        f"{wn['fragments']:,} fragments, end-to-end ratio **{wn['ratio_manifest_bytes']:.2f}**, "
        f"worst window {worst['ratio_manifest_bytes']:.2f} at {worst['fragments']:,} "
        f'("~flat" = every window within {FLAT_TOLERANCE:.2f}x of the first) -> {verdict}.  '
        f"Absolute: {w0['manifest_bytes_per_append']:,.0f} -> "
        f"{wn['manifest_bytes_per_append']:,.0f} B of manifest per "
        f"{data['config']['record_bytes']} B record ({amp:.1f}x the record at the first "
        f"window)."
    )


def plot(
    series: dict[str, list[Any]], wins: list[dict[str, Any]], data: dict[str, Any], path: Any
) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    n = len(series["manifest_size"])
    x = np.arange(1, n + 1)
    size = np.asarray(series["manifest_size"], dtype=float)
    charged = np.asarray(series["manifest_bytes"], dtype=float)
    win = 100
    rolling = np.convolve(charged, np.ones(win) / win, mode="valid")
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    step = max(1, n // 20000)
    ax.plot(
        x[::step],
        size[::step] / 1024,
        lw=0.4,
        color="tab:blue",
        alpha=0.5,
        label="manifest size after each append (KiB)",
    )
    ax.plot(
        x[win - 1 :][::step],
        rolling[::step] / 1024,
        lw=1.2,
        color="tab:red",
        label=f"manifest bytes written per append, mean of {win} (KiB)",
    )
    for w in wins:
        ax.hlines(
            w["manifest_bytes_per_append"] / 1024,
            w["window"][0],
            w["window"][1],
            color="black",
            lw=3,
        )
    ax.set_xscale("log")
    ax.set_ylabel("KiB")
    ax.set_title("Manifest bytes per append vs fragments in the log (black: window means)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    ax2.plot(
        x[::step],
        np.asarray(series["root_fragments"])[::step],
        lw=0.5,
        label="fragment pointers in root",
    )
    ax2.plot(
        x[::step],
        np.asarray(series["root_snapshots"])[::step],
        lw=0.8,
        label="snapshot pointers in root",
    )
    ax2.plot(x[::step], np.asarray(series["depth"])[::step], lw=1.2, label="tree depth")
    ax2.set_xscale("log")
    ax2.set_xlabel("fragments in the log (one per append)")
    ax2.set_ylabel("pointers")
    ax2.grid(True, which="both", alpha=0.3)
    ax2.legend(fontsize=8, loc="upper left")
    fig.suptitle(
        f"wal3 manifest growth, default snapshot thresholds ({data['machine']['date_utc']})",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
