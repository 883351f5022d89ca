"""Peer workloads, run by ``bench.peers`` in a child process with the peers' own virtualenv.

``python -m bench.peers_child slatedb|chroma|redis ...`` prints one ``BENCHJSON {...}`` line.
This module imports nothing from ``host`` (the peers' virtualenv does not have it) and only
talks to 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import time
from typing import Any


def _pct(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return sorted_values[k]


def _summary(lat: list[float], window: float, per_op: int = 1) -> dict[str, Any]:
    lat.sort()
    return {
        "ops": len(lat),
        "window_s": window,
        "ops_per_s": len(lat) / window,
        "records_per_s": len(lat) * per_op / window,
        "p50_ms": _pct(lat, 50) * 1e3,
        "p99_ms": _pct(lat, 99) * 1e3,
    }


async def _closed_loop(op: Any, writers: int, warmup_s: float, duration_s: float) -> dict[str, Any]:
    """``writers`` tasks calling ``await op(i, k)`` in a closed loop; measure one window."""
    lat: list[float] = []
    t_open = time.perf_counter()
    win = [t_open + warmup_s, t_open + warmup_s + duration_s]
    stop = False

    async def worker(i: int) -> None:
        k = 0
        while not stop:
            t0 = time.perf_counter()
            await op(i, k)
            t1 = time.perf_counter()
            k += 1
            if win[0] <= t1 <= win[1]:
                lat.append(t1 - t0)

    tasks = [asyncio.create_task(worker(i)) for i in range(writers)]
    await asyncio.sleep(max(0.0, win[0] - time.perf_counter()))
    w0 = time.perf_counter()
    win[0] = w0
    await asyncio.sleep(max(0.0, win[1] - time.perf_counter()))
    w1 = time.perf_counter()
    win[1] = w1
    stop = True
    await asyncio.gather(*tasks)
    return _summary(lat, w1 - w0)


# ------------------------------------------------------------------------------- SlateDB


async def slatedb(args: argparse.Namespace) -> dict[str, Any]:
    from slatedb.uniffi import DbBuilder, ObjectStore, ObjectStoreBuilder, Settings

    settings = Settings.default()
    settings.set("flush_interval", json.dumps(f"{args.flush_ms:g}ms"))
    if args.endpoint:
        b = ObjectStoreBuilder.from_url(f"s3://{args.bucket}")
        for k, v in {
            "endpoint": args.endpoint,
            "allow_http": "true",
            "access_key_id": "testing",
            "secret_access_key": "testing",
            "region": "us-east-1",
        }.items():
            b.with_config(k, v)
        store = b.build()
        path = args.path
    else:
        store = ObjectStore.resolve("file:///")
        path = args.path  # an absolute directory
    builder = DbBuilder(path, store)
    builder.with_settings(settings)
    db = await builder.build()
    value = os.urandom(args.size)

    async def op(i: int, k: int) -> None:
        h = await db.put(b"w%05d-%010d" % (i, k), value)
        await h.await_durable()

    try:
        res = await _closed_loop(op, args.writers, args.warmup, args.duration)
    finally:
        await db.shutdown()
    res["flush_interval"] = json.loads(settings.to_json_string())["flush_interval"]
    return res


# ------------------------------------------------------------------------------- Chroma


def chroma(args: argparse.Namespace) -> dict[str, Any]:
    os.environ["ANONYMIZED_TELEMETRY"] = "False"  # no telemetry traffic, ever
    import chromadb
    from chromadb.config import Settings

    client = chromadb.PersistentClient(
        path=args.path, settings=Settings(anonymized_telemetry=False)
    )
    col = client.get_or_create_collection("bench", embedding_function=None)
    with open(args.records_file) as f:
        recs = json.load(f)  # [{id, document, embedding, metadata}]
    per = args.per_call
    out: dict[str, Any] = {"chromadb": chromadb.__version__, "per_call": per}
    lat: list[float] = []
    n = 0
    t_open = time.perf_counter()
    w0 = t_open + args.warmup
    w1 = w0 + args.duration
    while True:
        batch = [recs[(n + j) % len(recs)] for j in range(per)]
        ids = [f"{r['id']}-{n + j}" for j, r in enumerate(batch)]
        t0 = time.perf_counter()
        col.add(
            ids=ids,
            documents=[r["document"] for r in batch],
            embeddings=[r["embedding"] for r in batch],
            metadatas=[r["metadata"] for r in batch],
        )
        t1 = time.perf_counter()
        n += per
        if t1 >= w0:
            if not lat:
                w0 = t0
            lat.append(t1 - t0)
        if t1 >= w1:
            break
    out.update(_summary(lat, time.perf_counter() - w0, per))
    out["count"] = col.count()
    return out


# ------------------------------------------------------------------------------- Redis


async def redis_xadd(args: argparse.Namespace) -> dict[str, Any]:
    import redis.asyncio as aioredis

    r = aioredis.Redis(host="127.0.0.1", port=args.port, max_connections=max(1, args.writers))
    value = os.urandom(args.size)

    async def op(i: int, k: int) -> None:
        await r.xadd("bench", {"v": value})

    try:
        res = await _closed_loop(op, args.writers, args.warmup, args.duration)
        info = await r.info("persistence")
        res["aof_enabled"] = info.get("aof_enabled")
        res["xlen"] = await r.xlen("bench")
    finally:
        await r.aclose()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.peers_child")
    p.add_argument("what", choices=["slatedb", "chroma", "redis"])
    p.add_argument("--path", default="")
    p.add_argument("--endpoint", default="")
    p.add_argument("--bucket", default="")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--writers", type=int, default=1)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--flush-ms", type=float, default=2.0)
    p.add_argument("--per-call", type=int, default=1)
    p.add_argument("--records-file", default="")
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--duration", type=float, default=3.0)
    args = p.parse_args(argv)
    random.seed(0)
    if args.what == "slatedb":
        res = asyncio.run(slatedb(args))
    elif args.what == "chroma":
        res = chroma(args)
    else:
        res = asyncio.run(redis_xadd(args))
    print("BENCHJSON " + json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
