"""Structured logs: one JSON object per line, with an RFC 3339 time and no terminal escapes.

The compactor logs through :func:`configure`; the log host's formatter (``host.jsonlog``) is this
one plus its request context.  A line is ``{"ts", "level", "logger", "msg", ...}``: every
``extra=`` of the call is a key of its own (``uvicorn``'s ``color_message``, a copy of ``msg``
with ANSI colours, is dropped), and an exception adds ``exc``.

httpx logs each request it sends at INFO; the compactor sends hundreds per round, so they are
logged at DEBUG here (shown with ``--log-level debug``).  Each round is one line,
:func:`log_round`.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

# CSI sequences (colours, cursor moves) and the two-byte escapes; what a terminal would act on.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")
_RESERVED = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# Extras that only repeat another key for terminals.
_DROPPED = frozenset({"color_message"})


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (and without a stray ESC)."""
    return _ANSI.sub("", text).replace("\x1b", "")


def rfc3339(created: float) -> str:
    """A log record's time as RFC 3339 in UTC with milliseconds: ``2025-01-31T12:00:00.123Z``."""
    t = dt.datetime.fromtimestamp(created, tz=dt.UTC)
    return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _clean(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with escapes removed from every string in it."""
    if isinstance(value, str):
        return strip_ansi(value)
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return strip_ansi(str(value))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ``ts`` (RFC 3339), ``level``, ``logger``, ``msg``, the extras."""

    def context(self) -> dict[str, Any]:
        """Keys every line carries besides the record's own (none here; the host adds some)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": rfc3339(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        out.update(self.context())
        out.update(
            {
                k: v
                for k, v in vars(record).items()
                if k not in _RESERVED and k not in _DROPPED and not k.startswith("_")
            }
        )
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            out["exc"] = record.exc_text
        if record.stack_info:
            out["stack"] = self.formatStack(record.stack_info)
        return json.dumps(_clean(out), default=str)


class DemoteToDebug(logging.Filter):
    """Logs a logger's INFO records at DEBUG (httpx's one line per request)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.INFO:
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


# Loggers whose INFO lines are per request: DEBUG in the compactor's logs.
REQUEST_LOGGERS = ("httpx",)
# Libraries that are noisy even at INFO.
QUIET_LOGGERS = ("botocore", "aiobotocore", "urllib3", "py4j")


def configure(
    level: str = "INFO",
    filters: Sequence[logging.Filter] = (),
    stream: TextIO | None = None,
) -> logging.Handler:
    """Route every logger of the compactor through one JSON handler on ``stream`` (stderr).

    ``filters`` go on the handler (the compactor's ``RedactSecrets``).  Records are kept at
    ``level`` and above, after the request loggers' INFO lines became DEBUG.  Returns the handler.
    """
    handler = logging.StreamHandler(stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter())
    threshold = logging.getLevelName(level.upper())
    if not isinstance(threshold, int):
        raise ValueError(f"unknown log level {level!r}")
    handler.setLevel(threshold)
    for f in filters:
        handler.addFilter(f)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(threshold)
    for name in REQUEST_LOGGERS:
        logger = logging.getLogger(name)
        # Above DEBUG their INFO lines are never even made; at DEBUG they are made and demoted.
        logger.setLevel(logging.DEBUG if threshold <= logging.DEBUG else logging.WARNING)
        if not any(isinstance(f, DemoteToDebug) for f in logger.filters):
            logger.addFilter(DemoteToDebug())
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(threshold, logging.WARNING))
    return handler


def log_round(logger: logging.Logger, summary: Mapping[str, Any]) -> None:
    """The one line of a compaction round: ``msg`` "round", its summary under ``round``.

    INFO, or WARNING when a collection or a host failed (the failures are in the summary).
    """
    failed = bool(summary.get("failed")) or bool(summary.get("failed_hosts"))
    logger.log(
        logging.WARNING if failed else logging.INFO,
        "round: %s compacted, %s failed in %ss",
        summary.get("compacted", 0),
        summary.get("failed", 0),
        summary.get("seconds", 0),
        extra={"round": dict(summary)},
    )
