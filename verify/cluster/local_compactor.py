"""``compactor run`` folding in its own process instead of on Spark (the cluster's light engine).

``python -m verify.cluster.local_compactor run --hosts ... --store ... [every compactor flag]``

It is the real ``compactor`` command (``compactor_client.cli.main``: the same flags, variables,
membership, scheduler, pipeline, signals and exit codes) with one difference: no SparkSession is
built, so the pipeline runs the job's two stages in this process (``CompactionPipeline`` with
``spark=None``, the product's ``run_locally``).  A JVM per compactor does not fit a one-minute test
on two cores; the cluster command still runs the Spark engine (``--engine spark``).  The
compactor's CLI has no flag for this yet, hence this launcher.
"""

from __future__ import annotations

import sys
from typing import Any


def _no_session(*_args: Any, **_kwargs: Any) -> None:
    return None  # CompactionPipeline(spark=None) folds in this process


def _nothing_to_ship(spark: Any) -> None:
    return None


def main(argv: list[str] | None = None) -> int:
    from compactor_client import cli, sparkutil

    # ``cli.run`` imports these two by name from the module when it starts: replace them there.
    sparkutil.build_session = _no_session  # type: ignore[assignment]
    sparkutil.ship_package = _nothing_to_ship
    return cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
