"""``python -m verify.cluster`` (``make cluster``): start a cluster in a box and keep it running.

It prints where everything is, then waits; Ctrl-C (SIGINT) or SIGTERM stops every process it
started, compactors first, then the front, the hosts (each draining) and Redis.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

from .core import TENANT, start
from .spark import SparkStandalone


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verify.cluster",
        description="N log hosts over one store behind HAProxy, optional Redis, M compactors; "
        "all on 127.0.0.1.  Ctrl-C stops everything.",
    )
    p.add_argument("--hosts", type=int, default=3, help="log hosts (default 3)")
    p.add_argument("--compactors", type=int, default=2, help="compactors (default 2)")
    p.add_argument("--redis", action="store_true", help="start redis-server for leader hints")
    p.add_argument(
        "--store",
        default=None,
        help="a directory or s3://bucket/prefix (AWS_* variables name the endpoint and "
        "credentials); default WORKDIR/store",
    )
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temporary directory")
    p.add_argument(
        "--engine",
        choices=("spark", "local"),
        default="spark",
        help="compactors on Spark (compactor run --spark-master; default) or folding in their "
        "own process (lighter)",
    )
    p.add_argument("--spark-master", default="local[1]", help="for --engine spark")
    p.add_argument(
        "--spark-standalone",
        action="store_true",
        help="also start a Spark standalone master and worker (pyspark's spark-class) and run "
        "the compactors on it (implies --engine spark; replaces --spark-master)",
    )
    p.add_argument(
        "--interval-s", type=float, default=5.0, help="compactors' round interval (default 5)"
    )
    p.add_argument(
        "--adopt-after-s",
        type=float,
        default=None,
        help="LOGHOST_ADOPT_AFTER_S for every host (default: the host's, 300)",
    )
    args = p.parse_args(argv)

    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    host_env = {}
    if args.adopt_after_s is not None:
        host_env["LOGHOST_ADOPT_AFTER_S"] = str(args.adopt_after_s)
    spark: SparkStandalone | None = None
    if args.spark_standalone:
        if args.engine != "spark":
            p.error("--spark-standalone needs --engine spark")
        base = args.workdir or Path(tempfile.mkdtemp(prefix="loghost-cluster-spark-"))
        (base / "spark").mkdir(parents=True, exist_ok=True)
        print("starting a Spark standalone master and worker ...", flush=True)
        spark = SparkStandalone(base / "spark").start()
        args.spark_master = spark.url
    print("starting the cluster ...", flush=True)
    try:
        cluster = start(
            args.hosts,
            args.compactors,
            redis=args.redis,
            store=args.store,
            workdir=args.workdir,
            engine=args.engine,
            spark_master=args.spark_master,
            host_env=host_env,
            compactor_args=["--interval-s", str(args.interval_s), "--min-records", "1"],
        )
    except BaseException:
        if spark is not None:
            spark.stop()
        raise
    try:
        print(cluster.describe(), flush=True)
        if spark is not None:
            print(f"spark: master {spark.url}, UI {spark.ui_url}", flush=True)
        print(
            "\ntry:\n"
            f"  curl -s --location-trusted -X POST -H 'Authorization: Bearer {cluster.tenant_key}' "
            "-H 'Content-Type: application/json' \\\n"
            f"    {cluster.front_url}/v1/tenants/{TENANT}/logs/"
            "0b7e4c1a-9f2d-4e8a-b5c6-3d1f2a7e9c42/records \\\n"
            '    -d \'{"records": [{"id": "doc-1", "op": "upsert", "document": "hi"}]}\''
            "\n\nCtrl-C stops everything.",
            flush=True,
        )
        while not stop.wait(1.0):
            for h in cluster.hosts:
                if not h.killed and not h.running():
                    print(f"host {h.server_id} exited (see {h.child.log_path})", flush=True)
                    h.killed = True
    finally:
        print("stopping ...", flush=True)
        cluster.close()
        if spark is not None:
            spark.stop()
        print("stopped.", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
