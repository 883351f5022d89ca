"""Encoding one fragment: wal3's direct Parquet writer against pyarrow's, side by side.

``python -m bench --only fragment_encode``.  wal3 writes a fragment of up to 256 records and
1 MiB of bodies with ``wal3.parquetwrite`` (issue 14) and larger ones with pyarrow's writer.  For
each size both write the same records (850-byte bodies, the HTTP benchmark's records), in
alternating rounds on one thread, and the table gives the median of each and of the rounds'
ratios; ``encode_fragment`` adds the fragment's setsum (SHA3 per record) to the file.  No I/O.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from wal3.fragment import _write_with_pyarrow, encode_fragment
from wal3.parquetwrite import write_fragment_parquet
from wal3.setsum import Setsum

from . import common

NAME = "fragment_encode"
BODY = b'{"id":"doc","document":"' + b"d" * 800 + b'","metadata":{"k":1}}'
SIZES = (1, 8, 64, 256)


def _per_call_us(fn: Callable[[], object], calls: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    rounds = 3 if quick else 7
    budget_s = 0.05 if quick else 0.4  # per writer per round
    meta = {b"wal3.prev": Setsum.zero().hexdigest().encode(), b"wal3.writer": b"bench-writer"}
    rows = []
    for n in SIZES:
        bodies = [BODY] * n

        def direct(bodies: list[bytes] = bodies) -> bytes:
            return write_fragment_parquet(1 << 20, 1_700_000_000_000_000, bodies, meta)

        def pyarrow(bodies: list[bytes] = bodies) -> bytes:
            return _write_with_pyarrow(1 << 20, 1_700_000_000_000_000, bodies, meta)

        def encode(bodies: list[bytes] = bodies) -> object:
            return encode_fragment(7, 1 << 20, 1, bodies, prev=Setsum.zero(), writer="w")

        calls = max(5, int(budget_s / (0.0002 + n * 0.000004)))
        d, p, e = [], [], []
        for _ in range(rounds):
            p.append(_per_call_us(pyarrow, calls))
            d.append(_per_call_us(direct, calls))
            e.append(_per_call_us(encode, calls))
        rows.append(
            {
                "records": n,
                "direct_us": statistics.median(d),
                "pyarrow_us": statistics.median(p),
                "ratio": statistics.median(pp / dd for pp, dd in zip(p, d, strict=True)),
                "ratios": [pp / dd for pp, dd in zip(p, d, strict=True)],
                "encode_fragment_us": statistics.median(e),
                "calls_per_round": calls,
            }
        )
        print(
            f"  . {n} records: direct {rows[-1]['direct_us']:.1f} µs, "
            f"pyarrow {rows[-1]['pyarrow_us']:.1f} µs",
            flush=True,
        )
    return {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "config": {"rounds": rounds, "body_bytes": len(BODY)},
        "rows": rows,
    }


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    table = common.md_table(
        [
            "records per fragment",
            "direct writer µs",
            "pyarrow's writer µs",
            "pyarrow / direct",
            "rounds' ratios",
            "encode_fragment µs (file + setsum)",
        ],
        [
            [
                r["records"],
                common.fmt(r["direct_us"]),
                common.fmt(r["pyarrow_us"]),
                common.fmt(r["ratio"]),
                ", ".join(common.fmt(x) for x in r["ratios"]),
                common.fmt(r["encode_fragment_us"]),
            ]
            for r in data["rows"]
        ],
    )
    return (
        f"One fragment's Parquet file, {cfg['body_bytes']}-byte bodies, {cfg['rounds']} "
        "alternating rounds on one thread (pyarrow's writer, then the direct one, then the "
        "whole `encode_fragment`); medians, and the median of the rounds' ratios.\n\n" + table
    )
