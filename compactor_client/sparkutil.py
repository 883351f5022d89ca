"""Building the SparkSession and shipping this package to executors."""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

PACKAGE_DIR = Path(__file__).resolve().parent


def launched_by_spark_submit() -> bool:
    """Whether spark-submit started this driver (it then owns master and deploy settings)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def build_session(
    master: str | None,
    *,
    app_name: str = "compactor",
    conf: Mapping[str, str] | None = None,
    ui: bool = True,
    console_progress: bool = False,
) -> SparkSession:
    """A SparkSession on ``master``; None means spark-submit's master, else ``local[*]``."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is None and not launched_by_spark_submit():
        master = "local[*]"
    if master is not None:
        builder = builder.master(master)
    if master is not None and master.startswith("local"):
        # Local workers would otherwise run whatever "python3" is on PATH, which may lack pyarrow;
        # PySpark reads only this variable for the workers' interpreter (not spark.pyspark.python).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    builder = builder.config("spark.ui.enabled", "true" if ui else "false")
    # Our own progress display replaces Spark's console bar, which would garble it.
    builder = builder.config(
        "spark.ui.showConsoleProgress", "true" if console_progress else "false"
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


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


def ship_package(sc: SparkContext) -> None:
    """Make ``compactor_client`` importable on executors (no-op if already shipped)."""
    path = _package_zip()
    if any(f.endswith(path.name) for f in sc.listFiles):
        return
    sc.addPyFile(str(path))
