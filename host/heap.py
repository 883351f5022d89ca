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

import bisect
import gc
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = 3


def freeze_start_up_objects() -> int:
    """Collect once, then freeze what survived (everything the start-up made); how many."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def space_full_collections(middle_collections: int) -> tuple[int, int, int]:
    """Run a full collection only every ``middle_collections`` collections of the middle
    generation (``gc.set_threshold``'s third value); the thresholds now.

    Frozen start-up objects aside, a full collection still walks everything the host holds:
    open logs' manifests, buffers, requests in flight.  Under a flood that took 50-100 ms,
    three times in 45 s, each a stall of whatever request was in flight (issue 19).  Python
    still waits for a quarter of the long-lived objects to be new since the last one; what
    this costs is cyclic garbage that reached the oldest generation living longer."""
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, middle_collections)
    return gc.get_threshold()


class GcPauses(Collector):
    """Every collection's duration by generation while installed, as a Prometheus histogram.

    The hook runs inside the collector, at any allocation of any thread, which may hold any
    lock at that moment, a metric's lock during a scrape included: so it takes none.  It adds
    to plain counters (collections never nest, and the GIL is held throughout), and a scrape
    reads them; a scrape racing a hook may see one pause half counted, never a wrong total
    for long.  ``gc.callbacks`` is the process's: one host per process installs it."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._started: float | None = None
        self._counts = [[0] * (len(BUCKETS) + 1) for _ in range(GENERATIONS)]
        self._sums = [0.0] * GENERATIONS

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        started, self._started = self._started, None
        gen = info.get("generation")
        if started is None or not isinstance(gen, int) or not 0 <= gen < GENERATIONS:
            return  # a stop whose start this hook did not see (installed meanwhile)
        pause = self._clock() - started
        self._counts[gen][bisect.bisect_left(BUCKETS, pause)] += 1
        self._sums[gen] += pause

    def install(self) -> None:
        if self._callback not in gc.callbacks:
            self._started = None
            gc.callbacks.append(self._callback)

    def remove(self) -> None:
        if self._callback in gc.callbacks:
            gc.callbacks.remove(self._callback)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(
            "loghost_python_gc_pause_seconds",
            "Pauses of the interpreter's garbage collector (loghost serve), by generation",
            labels=["generation"],
        )
        for gen in range(GENERATIONS):
            counts, running = list(self._counts[gen]), 0
            buckets = []
            for bound, n in zip((*map(str, BUCKETS), "+Inf"), counts, strict=True):
                running += n
                buckets.append((bound, float(running)))
            family.add_metric([str(gen)], buckets, self._sums[gen])
        yield family
