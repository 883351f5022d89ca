"""A Spark standalone cluster on this machine: a master and one worker started from pyspark's
own ``bin/spark-class``, bound to 127.0.0.1, for the cluster in a box and the compactor's tests.

The worker's environment has no ``AWS_*`` and no ``COMPACTOR_*`` variable: executors reach the
store only through what the compactor ships them (``compactor_client.parquet_io.S3Options``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path
from types import TracebackType

from verify.testkit import free_port, wait_for_port, wait_until_sync

ROOT = Path(__file__).resolve().parents[2]


def spark_home() -> Path:
    """pyspark's own Spark distribution (its ``bin/`` and ``sbin/`` scripts)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def clean_env(tmp: Path) -> dict[str, str]:
    """An environment for Spark's own processes: no AWS variable, no COMPACTOR_ one."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "COMPACTOR_", "PYSPARK_GATEWAY", "SPARK_"))
    }
    env.update(
        SPARK_HOME=str(spark_home()),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOG_DIR=str(tmp / "logs"),
        SPARK_PID_DIR=str(tmp / "pids"),
        SPARK_NO_DAEMONIZE="1",
        PYSPARK_PYTHON=sys.executable,
        PYTHONPATH=str(ROOT),
    )
    return env


class Procs:
    """Processes started for a cluster: stopped (and reaped) in reverse order."""

    def __init__(self) -> None:
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as out:
            p = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in reversed(self.procs):
            if p.poll() is None:
                os.killpg(p.pid, 15)
        for p in reversed(self.procs):
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, 9)
                p.wait(30)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


class SparkStandalone:
    """A master and one worker (``cores`` cores) from ``spark-class``; ``url`` is the master's
    ``spark://`` address once :meth:`start` returns (the worker registered)."""

    def __init__(self, workdir: Path, *, cores: int = 2, memory: str = "2g") -> None:
        self.workdir = workdir
        self.cores = cores
        self.memory = memory
        self.port = free_port()
        self.ui_port = free_port()
        self.worker_ui_port = free_port()
        self.procs = Procs()

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://127.0.0.1:{self.ui_port}"

    def _alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"{self.ui_url}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except OSError:
            return 0

    def start(self, timeout_s: float = 180.0) -> SparkStandalone:
        env = clean_env(self.workdir)
        spark_class = str(spark_home() / "bin" / "spark-class")
        logs = self.workdir / "logs"
        try:
            master = self.procs.start(
                [
                    spark_class,
                    "org.apache.spark.deploy.master.Master",
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--webui-port",
                    str(self.ui_port),
                ],
                env,
                logs / "master.out",
            )
            wait_for_port(self.port, timeout_s, master)
            self.procs.start(
                [
                    spark_class,
                    "org.apache.spark.deploy.worker.Worker",
                    self.url,
                    "--host",
                    "127.0.0.1",
                    "--webui-port",
                    str(self.worker_ui_port),
                    "--cores",
                    str(self.cores),
                    "--memory",
                    self.memory,
                    "--work-dir",
                    str(self.workdir / "work"),
                ],
                env,
                logs / "worker.out",
            )
            wait_until_sync(
                lambda: self._alive_workers() >= 1,
                "a worker registered with the master",
                timeout_s,
                0.2,
            )
        except BaseException:
            self.procs.stop()
            raise
        return self

    def stop(self) -> None:
        self.procs.stop()

    def __enter__(self) -> SparkStandalone:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
