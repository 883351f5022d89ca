"""Compactor client: a REST client for log hosts, a scheduler, and the PySpark compaction pipeline.

Names are imported lazily so that Spark executors, which import only ``compactor_client.executor``
(and through it ``fold`` and ``parquet_io``), need neither httpx nor the host package.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "LogHostClient": "client",
    "CompactorError": "errors",
    "LogHostError": "errors",
    "Record": "models",
    "Row": "fold",
    "fold": "fold",
    "CompactionPipeline": "pipeline",
    "Scheduler": "scheduler",
    "CompactedState": "reader",
    "read_collection": "reader",
    "read_collections": "reader",
    "read_state": "reader",
}

__all__ = [
    "CompactedState",
    "CompactionPipeline",
    "CompactorError",
    "LogHostClient",
    "LogHostError",
    "Record",
    "Row",
    "Scheduler",
    "fold",
    "read_collection",
    "read_collections",
    "read_state",
]


def __getattr__(name: str) -> Any:
    """Import an exported name on first use."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'compactor_client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
