"""Per-round compactor metrics, registered on a caller-owned ``CollectorRegistry``.

No metric lives in prometheus-client's global registry: tests and embedding applications create
as many compactors as they like, each with its own registry.  No ``*_created`` twin series either
(``disable_created_metrics``, process-wide, as the log host's metrics module does).
"""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

disable_created_metrics()

_ROUND_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, float("inf"))


class CompactorMetrics:
    """The compactor's counters and histograms."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.rounds = Counter(
            "compactor_rounds_total",
            "Compaction rounds run, by outcome (ok: no collection failed).",
            ["outcome"],
            registry=registry,
        )
        self.last_success = Gauge(
            "compactor_last_successful_round_timestamp_seconds",
            "Unix time at which the last round without a failed collection ended (0: none yet).",
            registry=registry,
        )
        self.round_seconds = Histogram(
            "compactor_round_seconds",
            "Wall-clock seconds of a compaction round.",
            buckets=_ROUND_BUCKETS,
            registry=registry,
        )
        self.collections = Counter(
            "compactor_collections_compacted_total",
            "Collections whose new version was installed and cursor advanced.",
            registry=registry,
        )
        self.records_in = Counter(
            "compactor_records_in_total",
            "Log records folded into installed versions.",
            registry=registry,
        )
        self.rows_out = Counter(
            "compactor_rows_out_total",
            "Rows written in installed versions.",
            registry=registry,
        )
        self.failures = Counter(
            "compactor_failures_total",
            "Collections that failed, by stage (poll, plan, spark, fold, install, cursor).",
            ["stage"],
            registry=registry,
        )
        self.races_lost = Counter(
            "compactor_races_lost_total",
            "Versions discarded because another compactor installed first.",
            registry=registry,
        )

    def round_done(self, ok: bool, seconds: float) -> None:
        """Count a finished round: its outcome, its duration, and when it succeeded."""
        self.rounds.labels(outcome="ok" if ok else "failed").inc()
        self.round_seconds.observe(seconds)
        if ok:
            self.last_success.set_to_current_time()
