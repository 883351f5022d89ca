"""Compaction throughput: one Spark job over k collections vs a single-process pyarrow fold.

For each k in ``--collections``, k collections of ``--records`` records each (in fragments of
``--fragment-records``) are written as Parquet fragments to a temporary directory; then

* ``spark``: ``run_compaction_job`` folds all k in one job (the compactor's real code path);
* ``pyarrow``: one Python process reads the same fragments, folds and writes, one collection after
  another (the same ``fold``/``parquet_io`` code, no Spark).

Records/s in are printed as a table and written as JSON to ``--out`` (default bench/out/).
A warm-up job runs first so JVM and worker start-up are not charged to the first k.

    .venv/bin/python bench/compaction_bench.py --collections 1,4,16 --records 5000
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from compactor_client.executor import (
    FoldTask,
    FragmentTask,
    fold_collection,
    read_fragment_task,
)
from compactor_client.pipeline import run_compaction_job
from compactor_client.sparkutil import build_session, ship_package


def make_records(rng: random.Random, n: int, ids: int, dim: int) -> list[bytes]:
    """Compact JSON record bodies over a pool of ``ids`` document ids."""
    ops = ["add", "upsert", "upsert", "update", "delete"]
    out = []
    for _ in range(n):
        rec = {
            "id": f"doc-{rng.randrange(ids)}",
            "op": rng.choice(ops),
            "document": f"text {rng.randrange(10**6)}",
            "metadata": {"k": rng.randrange(100), "tag": rng.choice(["a", "b", None])},
            "embedding": [rng.random() for _ in range(dim)],
        }
        out.append(json.dumps(rec, separators=(",", ":")).encode())
    return out


def write_collection(
    root: Path, cid: str, bodies: list[bytes], per_fragment: int
) -> list[tuple[str, int, int]]:
    """Write one collection's fragments; returns (url, start, limit) per fragment."""
    frags = []
    for i in range(0, len(bodies), per_fragment):
        chunk = bodies[i : i + per_fragment]
        start = i + 1
        table = pa.table(
            {
                "offset": pa.array(range(start, start + len(chunk)), pa.uint64()),
                "timestamp_us": pa.array([0] * len(chunk), pa.uint64()),
                "body": pa.array(chunk, pa.binary()),
            }
        )
        path = root / "logs" / cid / f"{start:012d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="snappy")
        frags.append((path.as_uri(), start, start + len(chunk)))
    return frags


def tasks_for(
    root: Path, cids: list[str], frags: dict[str, list[tuple[str, int, int]]], run: str
) -> tuple[list[FoldTask], list[FragmentTask]]:
    fold_tasks, frag_tasks = [], []
    for cidx, cid in enumerate(cids):
        end = frags[cid][-1][2]
        out = (root / "compacted" / run / cid / "part.parquet").as_uri()
        fold_tasks.append(FoldTask(cidx, cid, 1, end, None, out))
        frag_tasks += [FragmentTask(cidx, u, s, lim, 1, end) for u, s, lim in frags[cid]]
    return fold_tasks, frag_tasks


def pyarrow_fold(fold_tasks: list[FoldTask], frag_tasks: list[FragmentTask]) -> None:
    """The single-process baseline: the same read/fold/write code, one collection at a time."""
    by_cidx: dict[int, list[FragmentTask]] = {}
    for t in frag_tasks:
        by_cidx.setdefault(t.cidx, []).append(t)
    for ft in fold_tasks:
        items = [
            kv
            for t in sorted(by_cidx[ft.cidx], key=lambda t: t.start)
            for kv in read_fragment_task(t)
        ]
        stats = fold_collection(ft, items)
        if stats.error:
            raise RuntimeError(stats.error)


QUICK: dict[str, Any] = {"collections": [1, 4], "records": 1000}
FULL: dict[str, Any] = {"collections": [1, 4, 16], "records": 5000}


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The benchmark's flags on the suite's parser."""
    g = p.add_argument_group("compaction")
    g.add_argument(
        "--compaction-collections",
        default=None,
        help="k values, comma-separated (default 1,4,16; quick 1,4)",
    )
    g.add_argument(
        "--compaction-records",
        type=int,
        default=None,
        help="records per collection (default 5000; quick 1000)",
    )
    g.add_argument("--compaction-master", default="local[*]")


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Spark job vs single-process pyarrow fold, same data, same run."""
    cfg = QUICK if quick else FULL
    ks = (
        [int(k) for k in args.compaction_collections.split(",")]
        if getattr(args, "compaction_collections", None)
        else cfg["collections"]
    )
    records = getattr(args, "compaction_records", None) or cfg["records"]
    master = getattr(args, "compaction_master", None) or "local[*]"
    from bench import common

    return {
        "benchmark": "compaction",
        "quick": quick,
        "command": common.command_line(),
        "master": master,
        "records_per_collection": records,
        "results": measure(ks, records, 1000, 1000, 16, master),
    }


def measure(
    ks: list[int], records: int, per_fragment: int, ids: int, dim: int, master: str
) -> list[dict[str, Any]]:
    """Records/s in for one Spark job over k collections and for the pyarrow baseline."""
    rng = random.Random(42)
    spark = build_session(master, app_name="compaction-bench", ui=False)
    ship_package(spark.sparkContext)
    results: list[dict[str, Any]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="compaction-bench-") as tmp:
            root = Path(tmp)
            cids = [f"c{i:04d}" for i in range(max(ks))]
            frags = {
                cid: write_collection(root, cid, make_records(rng, records, ids, dim), per_fragment)
                for cid in cids
            }
            # A warm-up job first, so JVM and worker start-up are not charged to the first k.
            run_compaction_job(spark.sparkContext, *tasks_for(root, cids[:1], frags, "warmup"))
            for k in ks:
                fold_tasks, frag_tasks = tasks_for(root, cids[:k], frags, f"spark-{k}")
                t0 = time.perf_counter()
                stats = run_compaction_job(spark.sparkContext, fold_tasks, frag_tasks)
                spark_s = time.perf_counter() - t0
                errors = [st.error for st in stats if st.error]
                if errors:
                    raise RuntimeError(errors[0])
                fold_tasks, frag_tasks = tasks_for(root, cids[:k], frags, f"pyarrow-{k}")
                t0 = time.perf_counter()
                pyarrow_fold(fold_tasks, frag_tasks)
                arrow_s = time.perf_counter() - t0
                n = k * records
                results.append(
                    {
                        "collections": k,
                        "records": n,
                        "spark_seconds": round(spark_s, 3),
                        "spark_records_per_s": round(n / spark_s),
                        "pyarrow_seconds": round(arrow_s, 3),
                        "pyarrow_records_per_s": round(n / arrow_s),
                        "spark_over_pyarrow": round(arrow_s / spark_s, 3),
                    }
                )
    finally:
        spark.stop()
    return results


def render(data: dict[str, Any]) -> str:
    """The results as a Markdown table."""
    lines = [
        f"Spark master `{data['master']}`, {data['records_per_collection']:,} records per "
        "collection, one job per k (after a warm-up job):",
        "",
        "| collections per job | records | Spark rec/s | pyarrow fold rec/s | Spark / pyarrow |",
        "| ------------------: | ------: | ----------: | -----------------: | --------------: |",
    ]
    lines.extend(
        f"| {r['collections']} | {r['records']:,} | {r['spark_records_per_s']:,} | "
        f"{r['pyarrow_records_per_s']:,} | {r['spark_over_pyarrow']:.2f} |"
        for r in data["results"]
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print/write its results."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--collections", default="1,4,16", help="k values, comma-separated")
    ap.add_argument("--records", type=int, default=5000, help="records per collection")
    ap.add_argument("--fragment-records", type=int, default=1000)
    ap.add_argument("--ids", type=int, default=1000, help="distinct document ids per collection")
    ap.add_argument("--dim", type=int, default=16, help="embedding dimension")
    ap.add_argument("--master", default="local[*]")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "compaction_bench.json"))
    args = ap.parse_args(argv)
    ks = [int(k) for k in args.collections.split(",")]
    console = Console()
    rng = random.Random(42)

    spark = build_session(args.master, app_name="compaction-bench", ui=False)
    ship_package(spark.sparkContext)
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="compaction-bench-") as tmp:
        root = Path(tmp)
        cids = [f"c{i:04d}" for i in range(max(ks))]
        frags = {}
        for cid in cids:
            bodies = make_records(rng, args.records, args.ids, args.dim)
            frags[cid] = write_collection(root, cid, bodies, args.fragment_records)
        warm = tasks_for(root, cids[:1], frags, "warmup")
        run_compaction_job(spark.sparkContext, *warm)
        for k in ks:
            fold_tasks, frag_tasks = tasks_for(root, cids[:k], frags, f"spark-{k}")
            t0 = time.perf_counter()
            stats = run_compaction_job(spark.sparkContext, fold_tasks, frag_tasks)
            spark_s = time.perf_counter() - t0
            errors = [s.error for s in stats if s.error]
            if errors:
                raise RuntimeError(errors[0])
            fold_tasks, frag_tasks = tasks_for(root, cids[:k], frags, f"pyarrow-{k}")
            t0 = time.perf_counter()
            pyarrow_fold(fold_tasks, frag_tasks)
            arrow_s = time.perf_counter() - t0
            n = k * args.records
            results.append(
                {
                    "collections": k,
                    "records": n,
                    "spark_seconds": round(spark_s, 3),
                    "spark_records_per_s": round(n / spark_s),
                    "pyarrow_seconds": round(arrow_s, 3),
                    "pyarrow_records_per_s": round(n / arrow_s),
                }
            )
    spark.stop()

    table = Table(title=f"compaction throughput ({args.master}, {args.records} records/collection)")
    for col in ("collections", "records", "spark rec/s", "pyarrow rec/s", "spark s", "pyarrow s"):
        table.add_column(col, justify="right")
    for r in results:
        table.add_row(
            str(r["collections"]),
            str(r["records"]),
            f"{r['spark_records_per_s']:,}",
            f"{r['pyarrow_records_per_s']:,}",
            f"{r['spark_seconds']:.2f}",
            f"{r['pyarrow_seconds']:.2f}",
        )
    console.print(table)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=2))
    console.print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
