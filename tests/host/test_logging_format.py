"""The host's logs: JSON lines with an RFC 3339 ``ts``, no ANSI escapes (uvicorn's
``color_message`` dropped), and a warning naming a misspelled ``LOGHOST_*`` variable (issue 22,
items 5 and 9)."""

from __future__ import annotations

import datetime as dt
import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from host import jsonlog
from host.config import warn_unknown_env

from .live import spawn_server

RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")


def parse_line(line: str) -> dict[str, Any]:
    """One log line as JSON, checked: an object, an RFC 3339 UTC ``ts``, no escape."""
    assert "\x1b" not in line, line
    obj = json.loads(line)
    assert isinstance(obj, dict), line
    assert RFC3339.match(obj["ts"]), obj["ts"]
    ts = dt.datetime.fromisoformat(obj["ts"].replace("Z", "+00:00"))
    assert ts.utcoffset() == dt.timedelta(0)
    assert {"level", "logger", "msg"} <= set(obj), obj
    assert "color_message" not in obj, obj
    return obj


def test_a_line_has_rfc3339_time_context_and_no_escapes() -> None:
    record = logging.makeLogRecord(
        {
            "name": "uvicorn.error",
            "levelno": logging.INFO,
            "levelname": "INFO",
            "msg": "Uvicorn running on %s (Press CTRL+C to quit)",
            "args": ("http://127.0.0.1:8080",),
            "created": 1_700_000_000.5,
            # what uvicorn passes: the same message with colours, for terminals
            "color_message": "Uvicorn running on \x1b[1m%s\x1b[0m (Press CTRL+C to quit)",
            "peer": "\x1b[31mred\x1b[0m",
        }
    )
    tokens = (jsonlog.request_id.set("rid-1"), jsonlog.tenant.set("acme"))
    try:
        line = jsonlog.JsonFormatter().format(record)
    finally:
        jsonlog.tenant.reset(tokens[1])
        jsonlog.request_id.reset(tokens[0])
    obj = parse_line(line)
    assert obj["ts"] == "2023-11-14T22:13:20.500Z"
    assert obj["msg"] == "Uvicorn running on http://127.0.0.1:8080 (Press CTRL+C to quit)"
    assert obj["request_id"] == "rid-1" and obj["tenant"] == "acme"
    assert obj["peer"] == "red" and "collection_id" not in obj


@pytest.mark.parametrize(
    "fields",
    [
        {"msg": "request", "method": "POST", "route": "/v1/x", "status": 200, "ms": 1.5},
        {"msg": "%s and %d", "args": ("a", 3), "level": "custom", "tenant": "extra-wins"},
        {"msg": "k\x1b[31mred", "note": "x\x1b]0;title\x07y"},  # escapes: the library's path
        {"msg": "values", "b": b"raw", "s": {1}, "t": (1, "x"), "n": None, "f": True},
        {"msg": "plain", "color_message": "\x1b[32mplain\x1b[0m"},
    ],
)
def test_the_fast_path_writes_what_the_library_writes(fields: dict[str, Any]) -> None:
    """Plain records skip python-json-logger (``JsonFormatter._plain``): the same object."""
    fmt = jsonlog.JsonFormatter()
    record = logging.makeLogRecord({"name": "loghost.api", "levelname": "INFO", **fields})
    token, tenant = jsonlog.request_id.set("rid-1"), jsonlog.tenant.set("context-tenant")
    try:
        fast = fmt.format(record)
        slow = super(jsonlog.JsonFormatter, fmt).format(record)  # the library's path
    finally:
        jsonlog.request_id.reset(token)
        jsonlog.tenant.reset(tenant)
    assert parse_line(fast) == parse_line(slow)
    assert list(json.loads(fast)) == list(json.loads(slow))  # the same fields, in the same order


def test_unknown_loghost_variables_are_one_warning_each_naming_the_closest() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(jsonlog.JsonFormatter())
    log = logging.getLogger("loghost.config")
    log.addHandler(handler)
    try:
        found = warn_unknown_env(
            {
                "LOGHOST_MAX_OPEN_LOG": "5",
                "LOGHOST_SHUTDOWN_GRACE": "10",
                "LOGHOST_STORE": "./data",  # known
                "loghost_listen": "0.0.0.0:1",  # known: the names are not case-sensitive
                "LOGHOSTS": "x",  # not the prefix
                "LOGHOST_QQQQQQQQQQQQQQQQQQ": "1",
            }
        )
    finally:
        log.removeHandler(handler)
    assert found == ["LOGHOST_MAX_OPEN_LOG", "LOGHOST_QQQQQQQQQQQQQQQQQQ", "LOGHOST_SHUTDOWN_GRACE"]
    lines = [parse_line(line) for line in out.getvalue().splitlines()]
    assert [(x["level"], x["variable"], x["closest"]) for x in lines] == [
        ("warning", "LOGHOST_MAX_OPEN_LOG", "LOGHOST_MAX_OPEN_LOGS"),
        ("warning", "LOGHOST_QQQQQQQQQQQQQQQQQQ", None),
        ("warning", "LOGHOST_SHUTDOWN_GRACE", "LOGHOST_SHUTDOWN_GRACE_S"),
    ]
    assert lines[0]["msg"] == (
        "unknown setting LOGHOST_MAX_OPEN_LOG is ignored; did you mean LOGHOST_MAX_OPEN_LOGS?"
    )
    assert lines[1]["msg"] == "unknown setting LOGHOST_QQQQQQQQQQQQQQQQQQ is ignored"


def test_a_served_host_logs_only_json_lines(tmp_path: Path) -> None:
    """``loghost serve``: uvicorn's own lines (which carry ``color_message``) included."""
    proc = spawn_server(
        str(tmp_path / "store"),
        tmp_path,
        extra_env={
            "LOGHOST_LOG_LEVEL": "INFO",
            "LOGHOST_MAX_OPEN_LOG": "5",
            "LOGHOST_SHUTDOWN_GRACE_S": "0",
        },
    )
    try:
        assert httpx.get(proc.url + "/healthz", timeout=10).status_code == 200
    finally:
        assert proc.terminate() == 0
    text = proc.log.read_text()
    assert "\x1b" not in text
    lines = []
    for line in text.splitlines():
        if line.startswith("loghost ") and " serving " in line:
            continue  # the banner ``serve`` prints on stdout (captured together here)
        lines.append(parse_line(line))
    loggers = {x["logger"] for x in lines}
    assert any(name.startswith("uvicorn") for name in loggers), loggers
    assert any(x["msg"].startswith("Uvicorn running on") for x in lines)
    unknown = [x for x in lines if x.get("variable") == "LOGHOST_MAX_OPEN_LOG"]
    assert len(unknown) == 1 and unknown[0]["closest"] == "LOGHOST_MAX_OPEN_LOGS"
