"""The compactor's metrics (issue 22, item 7): the time of the last successful round, and no
``*_created`` twin series."""

from __future__ import annotations

import time
from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from compactor_client.metrics import CompactorMetrics
from compactor_client.pipeline import CollectionOutcome, CompactionPipeline, RoundResult

LAST = "compactor_last_successful_round_timestamp_seconds"


def value(m: CompactorMetrics, name: str, **labels: str) -> float | None:
    return m.registry.get_sample_value(name, labels)


def record(m: CompactorMetrics, result: RoundResult) -> None:
    """What a round's end does with the metrics (the pipeline's own bookkeeping)."""
    CompactionPipeline._record(SimpleNamespace(metrics=m), result)  # type: ignore[arg-type]


def test_last_successful_round_time_moves_only_on_success() -> None:
    m = CompactorMetrics(CollectorRegistry())
    assert value(m, LAST) == 0.0  # exported before the first round: 0, none yet
    failed = RoundResult(
        outcomes=[CollectionOutcome("alice", "c1", "failed", stage="spark", error="boom")],
        seconds=2.0,
    )
    record(m, failed)
    assert value(m, LAST) == 0.0
    assert value(m, "compactor_rounds_total", outcome="failed") == 1
    unreachable = RoundResult(outcomes=[], seconds=1.0, failed_hosts={"http://h1": "refused"})
    record(m, unreachable)
    assert value(m, LAST) == 0.0  # a host that did not answer: not a successful round
    before = time.time()
    ok = RoundResult(
        outcomes=[CollectionOutcome("alice", "c1", "compacted", records_in=3, rows_out=2)],
        seconds=1.5,
    )
    record(m, ok)
    after = time.time()
    last = value(m, LAST)
    assert last is not None and before <= last <= after
    assert value(m, "compactor_rounds_total", outcome="ok") == 1
    assert value(m, "compactor_round_seconds_count") == 3
    record(m, failed)
    assert value(m, LAST) == last  # a later failure does not move it


def test_no_created_series() -> None:
    m = CompactorMetrics(CollectorRegistry())
    m.round_done(True, 1.0)
    m.failures.labels(stage="spark").inc()
    text = generate_latest(m.registry).decode()
    assert "compactor_rounds_total" in text and LAST in text
    assert "_created" not in text
