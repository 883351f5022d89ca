"""Building the SparkSession (a master, or a Spark Connect remote) and shipping this package.

The compactor's job uses the DataFrame API only, so the same code runs on a classic session
(``--spark-master local[*]``, ``spark://...``, ``k8s://...``, or spark-submit's) and on Spark
Connect (``--spark-remote sc://host:port``).  What differs is here: shipping the package
(``addPyFile`` or ``addArtifacts``), tagging jobs, and the parallelism to plan for.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

PACKAGE_DIR = Path(__file__).resolve().parent
CONNECT_PARALLELISM = 4  # tasks planned per stage on Spark Connect, which does not say its cores


def launched_by_spark_submit() -> bool:
    """Whether spark-submit started this driver (it then owns master and deploy settings)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None,
    *,
    remote: str | None = None,
    app_name: str = "compactor",
    conf: Mapping[str, str] | None = None,
    ui: bool = True,
    console_progress: bool = False,
) -> SparkSession:
    """A SparkSession on ``master`` (None: spark-submit's, else ``local[*]``), or on the Spark
    Connect server at ``remote`` (``sc://host:port``)."""
    from pyspark.sql import SparkSession

    if remote is not None:
        if master is not None:
            raise ValueError("a Spark master and a Spark Connect remote are exclusive")
        builder = SparkSession.builder.remote(remote)
        for key, value in (conf or {}).items():
            builder = builder.config(key, value)
        return builder.getOrCreate()
    builder = SparkSession.builder.appName(app_name)
    if master is None and not launched_by_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Local workers would otherwise run whatever "python3" is on PATH, which may lack pyarrow;
        # PySpark reads only this variable for the workers' interpreter (not spark.pyspark.python).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Everything is in this process: nothing needs to reach the driver from elsewhere, so
        # it binds loopback (Spark would pick the host's first external address).
        for key in ("spark.driver.host", "spark.driver.bindAddress"):
            if key not in (conf or {}):
                builder = builder.config(key, "127.0.0.1")
    builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    # Our own progress display replaces Spark's console bar, which would garble it.
    builder = builder.config(
        "spark.ui.showConsoleProgress", "true" if console_progress else "false"
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (no SparkContext on this side)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def default_parallelism(spark: SparkSession) -> int:
    """How many tasks a stage should have: the cluster's cores on a classic session;
    ``spark.default.parallelism`` (else ``CONNECT_PARALLELISM``) on Spark Connect."""
    if not is_connect(spark):
        return max(1, spark.sparkContext.defaultParallelism)
    try:
        value = spark.conf.get("spark.default.parallelism", None)
    except Exception:
        value = None
    return max(1, int(value)) if value else CONNECT_PARALLELISM


def tag_jobs(spark: SparkSession, group: str, description: str) -> None:
    """Name the jobs this thread submits next (job group on classic, tag on Connect)."""
    if is_connect(spark):
        spark.clearTags()
        spark.addTag(group)
    else:
        sc = spark.sparkContext
        sc.setJobGroup(group, description, interruptOnCancel=True)


def _package_zip() -> Path:
    """A zip of this package's sources, named by content hash so rebuilding is idempotent."""
    files = sorted(p for p in PACKAGE_DIR.glob("*.py"))
    digest = hashlib.sha256()
    for p in files:
        digest.update(p.name.encode())
        digest.update(p.read_bytes())
    out = Path(tempfile.gettempdir()) / f"compactor_client-{digest.hexdigest()[:16]}.zip"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
            for p in files:
                zf.write(p, f"compactor_client/{p.name}")
        os.replace(tmp, out)
    return out


_SHIPPED: set[tuple[int, str]] = set()


def ship_package(spark: Any) -> None:
    """Make ``compactor_client`` importable on executors (no-op if already shipped).

    ``spark`` is a SparkSession (classic or Connect) or, as before, a SparkContext.
    """
    path = _package_zip()
    if is_connect(spark):
        key = (id(spark), path.name)
        if key not in _SHIPPED:
            spark.addArtifacts(str(path), pyfile=True)
            _SHIPPED.add(key)
        return
    sc = spark if hasattr(spark, "addPyFile") else spark.sparkContext
    if any(f.endswith(path.name) for f in sc.listFiles):
        return
    sc.addPyFile(str(path))
