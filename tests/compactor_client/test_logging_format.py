"""The compactor's logs: JSON lines with an RFC 3339 ``ts`` and no escapes, one line per round,
and httpx's per-request lines only at DEBUG (issue 22, item 9)."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry

from compactor_client import cli, logs
from compactor_client.metrics import CompactorMetrics
from compactor_client.pipeline import CollectionOutcome, RoundResult

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


@pytest.fixture
def restore_logging() -> Iterator[None]:
    """``logs.configure`` changes process-wide loggers: put them back afterwards."""
    root = logging.getLogger()
    touched = [logging.getLogger(n) for n in (*logs.REQUEST_LOGGERS, *logs.QUIET_LOGGERS)]
    saved = (root.handlers[:], root.level, [(lg, lg.level, lg.filters[:]) for lg in touched])
    try:
        yield
    finally:
        root.handlers[:], root.level = saved[0], saved[1]
        for lg, level, filters in saved[2]:
            lg.setLevel(level)
            lg.filters[:] = filters


def parse(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as JSON, checked to be what a log pipeline can take as is."""
    out = []
    for line in text.splitlines():
        assert "\x1b" not in line, line
        obj = json.loads(line)
        assert isinstance(obj, dict), line
        assert RFC3339.match(obj["ts"]), obj["ts"]
        ts = dt.datetime.fromisoformat(obj["ts"].replace("Z", "+00:00"))
        assert ts.utcoffset() == dt.timedelta(0)
        assert {"level", "logger", "msg"} <= set(obj), obj
        out.append(obj)
    return out


def send_requests(n: int) -> None:
    """``n`` requests through httpx (a mock transport: the log lines are httpx's own)."""
    transport = httpx.MockTransport(lambda request: httpx.Response(200, json={"logs": []}))
    with httpx.Client(transport=transport, base_url="http://host-a:8080") as client:
        for i in range(n):
            assert client.get(f"/v1/dirty?page={i}").status_code == 200


@pytest.mark.usefixtures("restore_logging")
def test_request_lines_are_debug_and_hidden_at_info() -> None:
    out = io.StringIO()
    logs.configure("INFO", stream=out)
    send_requests(5)
    logging.getLogger("compactor").info("after the requests")
    lines = parse(out.getvalue())
    assert [line["msg"] for line in lines] == ["after the requests"]

    out = io.StringIO()
    logs.configure("DEBUG", stream=out)
    send_requests(3)
    requests = [line for line in parse(out.getvalue()) if line["logger"] == "httpx"]
    assert len(requests) == 3
    assert all(r["level"] == "debug" and r["msg"].startswith("HTTP Request: GET") for r in requests)


@pytest.mark.usefixtures("restore_logging")
def test_lines_are_json_without_escapes_and_keep_extras_and_tracebacks() -> None:
    out = io.StringIO()
    logs.configure("INFO", stream=out)
    log = logging.getLogger("compactor.test")
    log.warning(
        "colour \x1b[31mred\x1b[0m %s",
        "arg\x1b[1m",
        extra={"color_message": "\x1b[32m%s\x1b[0m", "host": "h\x1b[2Ja", "n": 3},
    )
    try:
        raise ValueError("boom \x1b[31m")
    except ValueError:
        log.exception("failed")
    warn, exc = parse(out.getvalue())
    assert warn["msg"] == "colour red arg" and warn["level"] == "warning"
    assert "color_message" not in warn
    assert warn["host"] == "ha" and warn["n"] == 3
    assert exc["level"] == "error" and "ValueError: boom" in exc["exc"]


@pytest.mark.usefixtures("restore_logging")
def test_secrets_are_still_redacted_in_json_lines() -> None:
    out = io.StringIO()
    logs.configure("DEBUG", [cli.RedactSecrets(["s3cr3t-value-1"])], stream=out)
    logging.getLogger("botocore.auth").warning("signing with s3cr3t-value-1")
    (line,) = parse(out.getvalue())
    assert "s3cr3t" not in out.getvalue() and line["msg"] == "signing with ***"


def test_ts_is_the_records_instant_in_utc() -> None:
    record = logging.makeLogRecord({"msg": "x", "created": 1_700_000_000.25})
    line = json.loads(logs.JsonFormatter().format(record))
    assert line["ts"] == "2023-11-14T22:13:20.250Z"


def test_an_unknown_level_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log level"):
        logs.configure("LOUD", stream=io.StringIO())


class _Scheduler:
    def __init__(self, failed_hosts: dict[str, str]) -> None:
        self.failed_hosts = failed_hosts

    async def select_round(self) -> Any:
        return SimpleNamespace(
            selected=[],
            merged=7,
            not_ours=2,
            over_budget=1,
            taken_over=0,
            members=("c1", "c2"),
            failed_hosts=self.failed_hosts,
        )


class _Pipeline:
    """A round whose outcomes are given (the pipeline itself has its own tests)."""

    def __init__(self, outcomes: list[CollectionOutcome], failed_hosts: dict[str, str]) -> None:
        self.outcomes = outcomes
        self.failed_hosts = failed_hosts

    async def run_round(self, selected: Any, failed_hosts: Any = None) -> RoundResult:
        logging.getLogger("httpx").info('HTTP Request: POST http://h/compact "HTTP/1.1 200 OK"')
        return RoundResult(
            outcomes=self.outcomes, seconds=1.25, spark_seconds=0.5, failed_hosts=failed_hosts
        )


def compacted(cid: str, records: int) -> CollectionOutcome:
    return CollectionOutcome("t", cid, "compacted", records_in=records, rows_out=records, levels=1)


async def one_round(outcomes: list[CollectionOutcome], failed_hosts: dict[str, str]) -> str:
    out = io.StringIO()
    logs.configure("INFO", stream=out)
    metrics = CompactorMetrics(CollectorRegistry())
    await cli._one_round(
        _Scheduler(failed_hosts),  # type: ignore[arg-type]
        _Pipeline(outcomes, failed_hosts),  # type: ignore[arg-type]
        metrics,
    )
    return out.getvalue()


@pytest.mark.usefixtures("restore_logging")
async def test_a_round_is_one_info_line_naming_what_was_compacted() -> None:
    text = await one_round([compacted("c-1", 10), compacted("c-2", 5)], {})
    (line,) = parse(text)
    assert line["level"] == "info" and line["logger"] == "compactor"
    r = line["round"]
    assert r["compacted"] == 2 and r["failed"] == 0 and r["records_in"] == 15
    assert r["compacted_collections"] == ["t/c-1", "t/c-2"] and r["failures"] == []
    assert r["seconds"] == 1.25 and r["spark_seconds"] == 0.5
    assert r["dirty"] == 7 and r["not_ours"] == 2 and r["members"] == ["c1", "c2"]


@pytest.mark.usefixtures("restore_logging")
async def test_a_round_with_failures_is_one_warning_line_listing_them() -> None:
    failed = CollectionOutcome(
        "t", "c-3", "failed", stage="fetch", error="gap at 12", error_kind="gap"
    )
    text = await one_round([compacted("c-1", 4), failed], {"http://h2": "ConnectError"})
    (line,) = parse(text)
    assert line["level"] == "warning"
    r = line["round"]
    assert r["failed"] == 1 and r["failed_hosts"] == {"http://h2": "ConnectError"}
    assert r["failures"] == [
        {"collection": "t/c-3", "stage": "fetch", "error": "gap at 12", "error_kind": "gap"}
    ]


@pytest.mark.usefixtures("restore_logging")
def test_the_pipeline_leaves_the_rounds_line_to_its_caller() -> None:
    """The pipeline's bookkeeping of a round, failures included, logs nothing itself: the
    round's one line is ``log_round``'s."""
    from compactor_client.pipeline import CompactionPipeline

    out = io.StringIO()
    logs.configure("DEBUG", stream=out)
    failed = CollectionOutcome("t", "c-3", "failed", stage="fetch", error="gap")
    result = RoundResult(outcomes=[compacted("c-1", 4), failed], seconds=1.0)
    CompactionPipeline._record(SimpleNamespace(metrics=None), result)  # type: ignore[arg-type]
    assert out.getvalue() == ""
