"""Compaction rounds on real Spark clusters (issue 15): a standalone master and worker started
from pyspark's own ``spark-class``, and a Spark Connect server, all on 127.0.0.1, against moto's
S3 server.

Neither the worker nor the Connect server has an AWS variable in its environment: the store's
endpoint, region and credentials reach the executors only inside the tasks' closures
(``S3Options``).  The compactor is the real command (``compactor run --once``) with
``--spark-master spark://...`` or ``--spark-remote sc://...``; its result is checked against the
fold oracle through the reader, and a canary secret is looked for in every log, the executors'
output, and the Spark event log (what the UI shows: its Environment tab and SQL plans).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactor_client.fold import fold
from compactor_client.reader import read_state
from verify.cluster.spark import Procs, SparkStandalone, clean_env, spark_home
from verify.testkit import free_port, wait_for_port
from wal3 import S3Store

from .kit import Log, Served, make_host_app, normalise, random_records, state_view

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
CANARY_KEY = "AKIACANARY" + uuid.uuid4().hex[:10].upper()
CANARY_SECRET = "canary-secret-" + uuid.uuid4().hex


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A master and one worker (2 cores) from pyspark's spark-class, on loopback."""
    tmp = tmp_path_factory.mktemp("standalone")
    with SparkStandalone(tmp) as cluster:
        yield cluster.url, tmp


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """pyspark's Spark Connect server (local[2] inside it), bound to 127.0.0.1."""
    tmp = tmp_path_factory.mktemp("connect")
    env = clean_env(tmp)
    port = free_port()
    procs = Procs()
    try:
        (tmp / "events").mkdir()
        server = procs.start(
            [
                str(spark_home() / "bin" / "spark-submit"),
                "--class",
                "org.apache.spark.sql.connect.service.SparkConnectServer",
                "--name",
                "Spark Connect server (tests)",
                "--master",
                "local[2]",
                "--conf",
                "spark.connect.grpc.binding.address=127.0.0.1",
                "--conf",
                f"spark.connect.grpc.binding.port={port}",
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.driver.bindAddress=127.0.0.1",
                "--conf",
                "spark.ui.enabled=false",
                "--conf",
                "spark.eventLog.enabled=true",
                "--conf",
                f"spark.eventLog.dir={(tmp / 'events').as_uri()}",
            ],
            env,
            tmp / "logs" / "connect.out",
        )
        wait_for_port(port, 240, server)
        yield f"sc://127.0.0.1:{port}", tmp
    finally:
        procs.stop()


async def compact_on(
    tmp_path: Path, moto_endpoint: str, bucket: str, spark_args: list[str]
) -> tuple[subprocess.CompletedProcess[bytes], dict[str, Log]]:
    """Write logs to S3, serve them from a stub host, run one compactor round; check the oracle."""
    store = S3Store(bucket=bucket, prefix="root", endpoint_url=moto_endpoint, region="us-east-1")
    rng = random.Random(21)
    cids = [f"cl-{i}" for i in range(3)]
    logs = {cid: Log(store, cid) for cid in cids}
    for log in logs.values():
        for _ in range(3):
            await log.append_fragment(random_records(rng, 25, ids=20))
    cursors: dict[str, int] = {}
    calls: list[tuple[str, int]] = []
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COMPACTOR_", "AWS_"))}
    env.update(
        COMPACTOR_API_KEY="k",
        PYTHONPATH=str(ROOT),
        PYSPARK_PYTHON=sys.executable,
        AWS_ENDPOINT_URL=moto_endpoint,
        AWS_REGION="us-east-1",
        AWS_ACCESS_KEY_ID=CANARY_KEY,
        AWS_SECRET_ACCESS_KEY=CANARY_SECRET,
    )
    with Served(make_host_app(logs, cids, cursors, calls)) as host:
        cmd = [
            sys.executable,
            "-m",
            "compactor_client",
            "run",
            "--hosts",
            host.url,
            "--store",
            f"s3://{bucket}/root",
            "--once",
            "--member-id",
            "c1",
            "--no-progress",
            "--log-level",
            "DEBUG",
            # The round is small: without this it would fold in the driver, and the executors'
            # reach to S3 (what these tests are about) would go untested.
            "--driver-fold-below",
            "0",
            *spark_args,
        ]
        done = await asyncio.to_thread(
            subprocess.run, cmd, env=env, cwd=ROOT, capture_output=True, timeout=600
        )
    (tmp_path / "compactor.out").write_bytes(done.stdout + done.stderr)  # kept for a failure
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:].decode(errors="replace")
    folds = [
        json.loads(line)["round"]["fold"]
        for line in (done.stdout + done.stderr).decode(errors="replace").splitlines()
        if line.startswith("{") and '"round"' in line
    ]
    assert folds and all(f in ("one-stage", "two-stage") for f in folds), folds
    for cid, log in logs.items():
        state = await read_state(store, cid)
        assert state.offset == log.end == cursors[cid]
        assert state_view(state.table) == normalise(fold({}, log.records))
    await store.close()
    return done, logs


def assert_no_canary(*places: Any) -> None:
    """The credentials appear in no file under the given directories, and no given bytes."""
    for place in places:
        if isinstance(place, bytes):
            for secret in (CANARY_SECRET.encode(), CANARY_KEY.encode()):
                at = place.find(secret)
                assert at < 0, place[max(0, at - 400) : at + 60].decode(errors="replace")
            continue
        files = [f for f in Path(place).rglob("*") if f.is_file()]
        assert files, place
        for f in files:
            data = f.read_bytes()
            assert CANARY_SECRET.encode() not in data, f
            assert CANARY_KEY.encode() not in data, f


async def test_a_round_on_a_standalone_cluster_whose_worker_has_no_aws_settings(
    standalone: tuple[str, Path], tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    master, cluster = standalone
    events = tmp_path / "events"
    events.mkdir()
    done, _ = await compact_on(
        tmp_path,
        moto_endpoint,
        s3_bucket,
        [
            "--spark-master",
            master,
            "--spark-conf",
            f"spark.pyspark.python={sys.executable}",
            "--spark-conf",
            "spark.driver.host=127.0.0.1",
            "--spark-conf",
            "spark.driver.bindAddress=127.0.0.1",
            "--spark-conf",
            "spark.eventLog.enabled=true",
            "--spark-conf",
            f"spark.eventLog.dir={events.as_uri()}",
            "--spark-conf",
            "spark.executor.memory=1g",
        ],
    )
    # The executors ran on the worker (their stderr is in its work directory) ...
    assert list((cluster / "work").rglob("stderr"))
    # ... and no log, executor output, or UI event (environment, SQL plans) holds the secret.
    assert_no_canary(done.stdout, done.stderr, cluster / "logs", cluster / "work", events)


async def test_a_round_on_spark_connect(
    connect_server: tuple[str, Path], tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    remote, server = connect_server
    done, _ = await compact_on(tmp_path, moto_endpoint, s3_bucket, ["--spark-remote", remote])
    assert_no_canary(done.stdout, done.stderr, server / "logs", server / "events")
