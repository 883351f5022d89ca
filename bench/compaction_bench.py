"""Compaction: one Spark job vs the single-process fold, incremental cost, levels, and scale.

All in one run, on one machine (the compactor's real code: ``run_compaction_job`` on the
DataFrame API for Spark, ``run_locally`` — the same executor functions in one process, one
collection after another — for the single-process pyarrow fold):

* **throughput**: k collections of ``records`` records (adds, upserts, updates and deletes over
  1,000 ids, 16-dimension embeddings) in 1,000-record fragments, compacted from scratch by one
  Spark job over all k, and by the single-process fold; records/s of each.
* **incremental**: one collection of ``big`` records (distinct ids) compacted from scratch, then
  ``small`` new records compacted onto it, several rounds; the time of a round against the time
  from scratch, with the levels (runs) and merges of each round.
* **levels**: read amplification after the incremental rounds: runs per level (one, always) and
  how many levels a reader merges.
* **scale**: ``wide`` collections × ``narrow`` records in one round, in a child process that
  does nothing else (the data is written by the parent), so that its peak RSS (Python, and its
  JVM from ``/proc``) is the driver's own: time and peak memory, and the same with a fifth of the
  records per collection, to show what driver memory follows.

    .venv/bin/python -m bench --only compaction            # the suite; --report --write-docs
    .venv/bin/python bench/compaction_bench.py --quick     # standalone
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

# Run as a file, this directory would come first on sys.path and its http.py would shadow the
# standard library's: the repository root replaces it.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]
sys.path.insert(0, str(_HERE.parent))

from compactor_client.cli import DRIVER_FOLD_BELOW  # noqa: E402
from compactor_client.executor import CollectionStats, FoldTask, FragmentTask, RunRef  # noqa: E402
from compactor_client.pipeline import (  # noqa: E402
    Plan,
    choose_plan,
    run_compaction_job,
    run_locally,
)
from compactor_client.sparkutil import (  # noqa: E402
    build_session,
    default_parallelism,
    ship_package,
)

SPARK_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


def make_records(rng: random.Random, n: int, ids: int, dim: int, first_id: int = 0) -> list[bytes]:
    """Compact JSON record bodies over ``ids`` document ids (from ``first_id``)."""
    ops = ["add", "upsert", "upsert", "update", "delete"]
    out = []
    for _ in range(n):
        rec = {
            "id": f"doc-{first_id + rng.randrange(ids)}",
            "op": rng.choice(ops),
            "document": f"text {rng.randrange(10**6)}",
            "metadata": {"k": rng.randrange(100), "tag": rng.choice(["a", "b", None])},
            "embedding": [round(rng.random(), 6) for _ in range(dim)],
        }
        out.append(json.dumps(rec, separators=(",", ":")).encode())
    return out


def unique_records(n: int, dim: int, start_id: int = 0) -> list[bytes]:
    """``n`` upserts of distinct ids (a collection of ``n`` documents)."""
    rng = random.Random(start_id)
    return [
        json.dumps(
            {
                "id": f"doc-{start_id + i:09d}",
                "op": "upsert",
                "document": f"text {i}",
                "metadata": {"k": i % 100},
                "embedding": [round(rng.random(), 6) for _ in range(dim)],
            },
            separators=(",", ":"),
        ).encode()
        for i in range(n)
    ]


def write_fragments(
    root: Path, cid: str, bodies: list[bytes], per_fragment: int, first: int = 1
) -> list[tuple[str, int, int]]:
    """Write a collection's fragments from offset ``first``; (url, start, limit) of each."""
    frags = []
    for i in range(0, len(bodies), per_fragment):
        chunk = bodies[i : i + per_fragment]
        start = first + i
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
    root: Path,
    cids: list[str],
    frags: dict[str, list[tuple[str, int, int]]],
    run: str,
    base: dict[str, tuple[RunRef, ...]] | None = None,
) -> tuple[list[FoldTask], list[FragmentTask]]:
    """Fold tasks (outputs under ``compacted/{run}/``) and fragment tasks for ``cids``."""
    fold_tasks, frag_tasks = [], []
    for cidx, cid in enumerate(cids):
        start, end = frags[cid][0][1], frags[cid][-1][2]
        below = (base or {}).get(cid, ())
        outs = tuple(
            ((root / "compacted" / run / cid / f"run-{n}.parquet").as_uri(), f"{run}/{cid}/{n}")
            for n in range(len(below) + 1)
        )
        fold_tasks.append(FoldTask(cidx, cid, start, end, base=below, outputs=outs))
        frag_tasks += [FragmentTask(cidx, u, s, lim, start, end) for u, s, lim in frags[cid]]
    return fold_tasks, frag_tasks


def stack_of(stats: CollectionStats, root: Path, prev: tuple[RunRef, ...]) -> tuple[RunRef, ...]:
    """The stack a fold produced, as the next round's base."""
    urls = {r.key: r.url for r in prev}
    out = []
    for r in stats.runs:
        if r.written:  # keys are "{run}/{cid}/{n}" here (tasks_for)
            run, cid, n = r.key.split("/")
            url = (root / "compacted" / run / cid / f"run-{n}.parquet").as_uri()
        else:
            url = urls[r.key]
        out.append(RunRef(r.key, url, r.rows, r.bytes, r.tombstones, r.sketch))
    return tuple(out)


def check(stats: list[CollectionStats]) -> None:
    errors = [s.error for s in stats if s.error]
    if errors:
        raise RuntimeError(errors[0])


# ---------------------------------------------------------------------------- measurements


REPEATS = 3  # alternating repetitions per k; each figure is the median


def throughput(
    spark: Any, root: Path, ks: list[int], records: int, dim: int
) -> list[dict[str, Any]]:
    rng = random.Random(42)
    cids = [f"c{i:04d}" for i in range(max(ks))]
    frags = {
        cid: write_fragments(root, cid, make_records(rng, records, 1000, dim), 1000) for cid in cids
    }
    parallelism = default_parallelism(spark)
    below = DRIVER_FOLD_BELOW  # the compactor's default
    # Warm-ups, so no side is charged for first-time costs (JVM and workers; imports).
    for plan in ("one-stage", "two-stage"):
        check(run_compaction_job(spark, *tasks_for(root, cids[:1], frags, f"w-{plan}"), plan=plan))
    check(run_locally(*tasks_for(root, cids[:1], frags, "warmup-local")))
    out = []
    for k in ks:
        n = k * records
        plan = choose_plan(k, sum(len(frags[c]) for c in cids[:k]), parallelism)
        sides: dict[Plan | Literal["local"], list[float]] = {
            "auto": [],
            "two-stage": [],
            "local": [],
        }
        for rep in range(REPEATS):  # alternating, so the machine's drift hits every side alike
            for side in sides:
                tasks = tasks_for(root, cids[:k], frags, f"{side}-{k}-{rep}")
                t0 = time.perf_counter()
                if side == "local":
                    check(run_locally(*tasks))
                else:
                    check(
                        run_compaction_job(spark, *tasks, plan="auto" if side == "auto" else side)
                    )
                sides[side].append(time.perf_counter() - t0)
        spark_s, two_s, local_s = (statistics.median(v) for v in sides.values())
        # What a compactor round of these records runs: the driver fold below the threshold.
        round_s = local_s if n < below else spark_s
        out.append(
            {
                "collections": k,
                "records": n,
                "plan": plan,
                "spark_seconds": round(spark_s, 3),
                "spark_records_per_s": round(n / spark_s),
                "two_stage_seconds": round(two_s, 3),
                "two_stage_over_pyarrow": round(local_s / two_s, 3),
                "pyarrow_seconds": round(local_s, 3),
                "pyarrow_records_per_s": round(n / local_s),
                "spark_over_pyarrow": round(local_s / spark_s, 3),
                "round_folds_in": "driver" if n < below else f"Spark ({plan})",
                "round_over_pyarrow": round(local_s / round_s, 3),
                "repeats": REPEATS,
            }
        )
    return out


def incremental(
    spark: Any, root: Path, big: int, small: int, rounds: int, dim: int
) -> dict[str, Any]:
    cid = "big"
    bodies = unique_records(big, dim)
    frags = {cid: write_fragments(root, cid, bodies, 10_000)}
    del bodies
    t0 = time.perf_counter()
    stats = run_compaction_job(spark, *tasks_for(root, [cid], frags, "full"))
    full_s = time.perf_counter() - t0
    check(stats)
    stack = stack_of(stats[0], root, ())
    rng = random.Random(7)
    steps: list[dict[str, Any]] = []
    end = big + 1
    for i in range(rounds):
        # New documents and updates of existing ones, half and half.
        new = [
            json.dumps(
                {
                    "id": f"doc-{rng.randrange(big * 2):09d}",
                    "op": "upsert",
                    "document": f"round {i}",
                    "metadata": {"round": i},
                    "embedding": [round(rng.random(), 6) for _ in range(dim)],
                },
                separators=(",", ":"),
            ).encode()
            for _ in range(small)
        ]
        frags = {cid: write_fragments(root, f"{cid}-{i}", new, small, first=end)}
        end += small
        t0 = time.perf_counter()
        stats = run_compaction_job(spark, *tasks_for(root, [cid], frags, f"inc{i}", {cid: stack}))
        took = time.perf_counter() - t0
        check(stats)
        stack = stack_of(stats[0], root, stack)
        steps.append(
            {
                "round": i + 1,
                "seconds": round(took, 3),
                "of_full": round(took / full_s, 4),
                "levels": len(stack),
                "merges": stats[0].merges,
                "runs_rows": [r.rows for r in stack],
                "bytes_written": stats[0].bytes_out,
            }
        )
    first = steps[0]
    return {
        "records": big,
        "new_records": small,
        "full_seconds": round(full_s, 3),
        "full_rows": stats[0].rows_out,
        "first_round_seconds": first["seconds"],
        "first_round_of_full": first["of_full"],
        "mean_round_of_full": round(sum(s["of_full"] for s in steps) / len(steps), 4),
        "max_levels": max(s["levels"] for s in steps),
        "rounds": steps,
    }


def _hwm_kib(pid: int | str = "self") -> int:
    """A process's peak RSS (VmHWM; reset by exec, unlike getrusage's ru_maxrss), in KiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _jvm_hwm_kib() -> int:
    """Peak RSS (VmHWM) of this process's JVM children, in KiB."""
    me = os.getpid()
    total = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(fields.get("PPid", "0").strip()) == me and "java" in fields.get("Name", ""):
            total += int(fields.get("VmHWM", "0 kB").split()[0])
    return total


def write_many(root: Path, wide: int, narrow: int, dim: int) -> list[str]:
    """``wide`` collections of ``narrow`` records under ``root``; their ids."""
    rng = random.Random(11)
    cids = [f"s{i:05d}" for i in range(wide)]
    for cid in cids:
        write_fragments(root, cid, make_records(rng, narrow, narrow, dim), 1000)
    return cids


def fragments_in(root: Path, cid: str) -> list[tuple[str, int, int]]:
    """(url, start, limit) of a collection's fragments written by ``write_fragments``."""
    out = []
    for path in sorted((root / "logs" / cid).glob("*.parquet")):
        start = int(path.stem)
        out.append((path.as_uri(), start, start + pq.ParquetFile(path).metadata.num_rows))
    return out


def scale_child(root: str, cids: list[str], master: str) -> dict[str, Any]:
    """In a child process (the data written by the parent, so that this process's peak RSS is
    the compactor's driver alone): all ``cids`` in one round; time and the driver's peak RSS."""
    spark = build_session(master, app_name="compaction-scale", ui=False, conf=SPARK_CONF)
    ship_package(spark)
    try:
        base = Path(root)
        frags = {cid: fragments_in(base, cid) for cid in cids}
        check(run_compaction_job(spark, *tasks_for(base, cids[:2], frags, "warmup")))
        before = _hwm_kib()
        t0 = time.perf_counter()
        stats = run_compaction_job(spark, *tasks_for(base, cids, frags, "all"))
        took = time.perf_counter() - t0
        check(stats)
        n = sum(frags[c][-1][2] - frags[c][0][1] for c in cids)
        return {
            "collections": len(cids),
            "records_per_collection": n // len(cids),
            "records": n,
            "seconds": round(took, 2),
            "records_per_s": round(n / took),
            "driver_python_peak_rss_mib": round(_hwm_kib() / 1024, 1),
            "driver_python_rss_before_mib": round(before / 1024, 1),
            "driver_jvm_peak_rss_mib": round(_jvm_hwm_kib() / 1024, 1),
        }
    finally:
        spark.stop()


def scale(wide: int, narrow: int, dim: int, master: str) -> list[dict[str, Any]]:
    out = []
    for n in (max(1, narrow // 5), narrow):
        with tempfile.TemporaryDirectory(prefix="compaction-scale-") as tmp:
            cids = write_many(Path(tmp), wide, n, dim)
            done = subprocess.run(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--scale-child",
                    json.dumps([tmp, cids, master]),
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=3600,
            )
        out.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return out


# ---------------------------------------------------------------------------- the suite

QUICK: dict[str, Any] = {
    "collections": [1, 4],
    "records": 1000,
    "big": 50_000,
    "small": 1000,
    "rounds": 3,
    "wide": 50,
    "narrow": 200,
}
FULL: dict[str, Any] = {
    "collections": [1, 4, 16],
    "records": 5000,
    "big": 1_000_000,
    "small": 1000,
    "rounds": 5,
    "wide": 1000,
    "narrow": 1000,
}


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
    g.add_argument("--compaction-master", default="local[2]")


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of the module docstring, in one run."""
    cfg = dict(QUICK if quick else FULL)
    if getattr(args, "compaction_collections", None):
        cfg["collections"] = [int(k) for k in args.compaction_collections.split(",")]
    if getattr(args, "compaction_records", None):
        cfg["records"] = args.compaction_records
    master = getattr(args, "compaction_master", None) or "local[2]"
    dim = 16
    from bench import common

    spark = build_session(master, app_name="compaction-bench", ui=False, conf=SPARK_CONF)
    ship_package(spark)
    try:
        with tempfile.TemporaryDirectory(prefix="compaction-bench-") as tmp:
            root = Path(tmp)
            results = throughput(spark, root / "t", cfg["collections"], cfg["records"], dim)
            inc = incremental(spark, root / "i", cfg["big"], cfg["small"], cfg["rounds"], dim)
    finally:
        spark.stop()
    return {
        "benchmark": "compaction",
        "quick": quick,
        "command": common.command_line(),
        "master": master,
        "records_per_collection": cfg["records"],
        "results": results,
        "incremental": inc,
        "scale": scale(cfg["wide"], cfg["narrow"], dim, master),
    }


def render(data: dict[str, Any]) -> str:
    """The results as Markdown tables."""
    lines = [
        f"Spark master `{data['master']}`; throughput: {data['records_per_collection']:,} "
        "records per collection, from scratch, one job per k (after warm-up jobs); each figure "
        f"the median of {data['results'][0].get('repeats', 1)} alternating repetitions.  Spark: "
        "the job's `auto` plan; two-stage: the shuffle plan, for comparison; a compactor round: "
        "what `compactor run` does with these records (below `--driver-fold-below`, 10,000 by "
        "default, it folds in the driver):",
        "",
        "| collections per job | records | Spark plan | Spark rec/s | pyarrow fold rec/s | "
        "Spark / pyarrow | two-stage / pyarrow | a compactor round folds in | round / pyarrow |",
        "| ------------------: | ------: | :--------- | ----------: | -----------------: | "
        "--------------: | ------------------: | :------------------------- | --------------: |",
    ]
    lines.extend(
        f"| {r['collections']} | {r['records']:,} | {r.get('plan', 'two-stage')} | "
        f"{r['spark_records_per_s']:,} | {r['pyarrow_records_per_s']:,} | "
        f"{r['spark_over_pyarrow']:.2f} | "
        f"{r.get('two_stage_over_pyarrow', '-')} | "
        f"{r.get('round_folds_in', 'Spark')} | "
        f"{r.get('round_over_pyarrow', r['spark_over_pyarrow']):.2f} |"
        for r in data["results"]
    )
    inc = data.get("incremental")
    if inc:
        lines += [
            "",
            f"Incremental: {inc['records']:,} documents compacted from scratch in "
            f"{inc['full_seconds']:.2f} s (Spark); then rounds of {inc['new_records']:,} new "
            "records (half new ids, half updates):",
            "",
            "| round | seconds | of from-scratch | levels (runs) after | merges | rows per run, top first |",
            "| ----: | ------: | --------------: | ------------------: | -----: | :---------------------- |",
        ]
        lines.extend(
            f"| {s['round']} | {s['seconds']:.3f} | {100 * s['of_full']:.1f} % | {s['levels']} | "
            f"{s['merges']} | {', '.join(f'{n:,}' for n in s['runs_rows'])} |"
            for s in inc["rounds"]
        )
        lines += [
            "",
            f"First round: {100 * inc['first_round_of_full']:.1f} % of from scratch; mean "
            f"{100 * inc['mean_round_of_full']:.1f} %.  Read amplification: one run per level, "
            f"at most {inc['max_levels']} levels.",
        ]
    sc = data.get("scale")
    if sc:
        lines += [
            "",
            "Scale: one round over many collections, in a child process (driver peak RSS: the "
            "Python driver, and its JVM):",
            "",
            "| collections | records each | records | seconds | rec/s | Python peak MiB | JVM peak MiB |",
            "| ----------: | -----------: | ------: | ------: | ----: | --------------: | -----------: |",
        ]
        lines.extend(
            f"| {s['collections']:,} | {s['records_per_collection']:,} | {s['records']:,} | "
            f"{s['seconds']:.1f} | {s['records_per_s']:,} | {s['driver_python_peak_rss_mib']:.0f} | "
            f"{s['driver_jvm_peak_rss_mib']:.0f} |"
            for s in sc
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run standalone (``--quick`` for the small sizes) and print the tables."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scale-child", help=argparse.SUPPRESS)
    add_arguments(ap)
    args = ap.parse_args(argv)
    if args.scale_child:
        root, cids, master = json.loads(args.scale_child)
        print(json.dumps(scale_child(root, cids, master)))
        return 0
    print(render(run(args.quick, args)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
