"""Per-round compactor metrics, registered on a caller-owned ``CollectorRegistry``.

No metric lives in prometheus-client's global registry: tests and embedding applications create
as many compactors as they like, each with its own registry.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

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
