"""The interpreter's own garbage collector in a serving host: start-up objects frozen, pauses
measured.

A full (generation 2) collection walks every object the collector tracks.  By the time a host
serves, it has imported FastAPI, pydantic, pyarrow and the rest and built its app: some 100,000
objects that live as long as the process.  ``gc.freeze()`` moves them out of the collector's
sight, so a full collection walks only what the process made since.  On the noisy-neighbour
benchmark (issue 19) that halved a light tenant's p99 while another flooded (234 → 121 ms, the
same run).  The pauses themselves are a metric, ``loghost_python_gc_pause_seconds``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import Histogram


def freeze_start_up_objects() -> int:
    """Collect once, then freeze what survived (everything the start-up made); how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """Observes every collection's duration by generation while installed (``gc.callbacks`` is
    the process's: one host per process installs it)."""

    def __init__(self, histogram: Histogram) -> None:
        self._histogram = histogram
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = time.perf_counter() - self._started
            self._histogram.labels(str(info["generation"])).observe(pause)

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)
