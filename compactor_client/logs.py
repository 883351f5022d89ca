"""Structured logs: one JSON object per line, with an RFC 3339 time and no terminal escapes.

The compactor logs through :func:`configure`.  The formatter is python-json-logger's
(``pythonjsonlogger``), configured to the line ``{"ts", "level", "logger", "msg", ...}``: every
``extra=`` of the call is a key of its own (``uvicorn``'s ``color_message``, a copy of ``msg``
with ANSI colours, is dropped), and an exception adds ``exc``.  The log host's formatter
(``host.jsonlog``) is the same library's, configured alike, plus its request context.

httpx logs each request it sends at INFO; the compactor sends hundreds per round, so they are
logged at DEBUG here (shown with ``--log-level debug``).  Each round is one line,
:func:`log_round`.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _LibraryFormatter

# CSI sequences (colours, cursor moves) and the two-byte escapes; what a terminal would act on.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


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
        return {strip_ansi(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return strip_ansi(str(value))


class JsonFormatter(_LibraryFormatter):
    """One JSON object per line: ``ts`` (RFC 3339), ``level``, ``logger``, ``msg``, the extras.

    The library picks the fields, merges the extras and formats the exception; the hooks below
    are what it has no setting for: the time's format, a lower-case level, the record's
    ``exc_text`` (which a filter may have redacted), ``msg`` as text even for a dict, and no
    escape in any value.
    """

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s %(levelname)s %(name)s %(message)s",
            rename_fields={
                "asctime": "ts",
                "levelname": "level",
                "name": "logger",
                "message": "msg",
                "exc_info": "exc",
                "stack_info": "stack",
            },
            # Extras that only repeat another key for terminals.
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        )

    def context(self) -> dict[str, Any]:
        """Keys every line carries besides the record's own (none here; the host adds some)."""
        return {}

    def format(self, record: logging.LogRecord) -> str:
        if isinstance(record.msg, dict):
            # The library would take a dict's keys for fields and log an empty msg; msg is the
            # message's text, as for any other object (a copy: other handlers see the record).
            record = logging.makeLogRecord(
                {**vars(record), "msg": record.getMessage(), "args": None}
            )
        return super().format(record)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        # record.msecs is not used: a record made with makeLogRecord keeps the msecs of its making.
        return rfc3339(record.created)

    def add_fields(
        self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        if record.exc_text:
            # What logging.Formatter prints: a filter may have rewritten it (RedactSecrets), and
            # the library would format record.exc_info anew.
            message_dict["exc_info"] = record.exc_text
        super().add_fields(log_record, record, message_dict)
        if "level" not in vars(record):  # an extra named level is logged as given, like any other
            log_record["level"] = record.levelname.lower()
        for key, value in self.context().items():
            log_record.setdefault(key, value)  # an extra of the same name wins

    def process_log_record(self, log_record: dict[str, Any]) -> dict[str, Any]:
        return _clean(log_record)


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
