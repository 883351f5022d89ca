"""Structured JSON logs carrying tenant, collection_id and request id (never API keys).

One JSON object per line, by python-json-logger's formatter (``pythonjsonlogger``; a plain
record, such as every request's line, is written directly with the same fields): ``ts`` in
RFC 3339 (UTC, milliseconds), ``level``, ``logger``, ``msg``, the request context, every
``extra=`` of the call, and ``exc`` for an exception.  No line carries an ANSI escape: uvicorn's
``color_message`` is dropped and escapes in any value are removed.  The compactor's lines
(``compactor_client.logs``) are the same but for the request context; neither package imports
the other, so each configures the library itself.
"""

from __future__ import annotations

import contextvars
import datetime as dt
import logging
import re
import sys
from collections.abc import Mapping
from typing import Any

import msgspec
from pythonjsonlogger.core import RESERVED_ATTRS
from pythonjsonlogger.json import JsonFormatter as _LibraryFormatter

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
collection_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "collection_id", default=None
)

_CONTEXT = (("request_id", request_id), ("tenant", tenant), ("collection_id", collection_id))

# CSI sequences (colours, cursor moves) and the two-byte escapes; what a terminal would act on.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|[@-Z\\-_])")


def _strip_ansi(text: str) -> str:
    return _ANSI.sub("", text).replace("\x1b", "")


def _clean(value: Any) -> Any:
    """A JSON-ready copy of ``value`` with escapes removed from every string in it."""
    if isinstance(value, str):
        return _strip_ansi(value)
    if isinstance(value, Mapping):
        return {_strip_ansi(str(k)): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    if value is None or isinstance(value, bool | int | float):
        return value
    return _strip_ansi(str(value))


# What a record carries that is not an extra (uvicorn's ``color_message`` is dropped).
_NOT_EXTRA = frozenset(
    {*RESERVED_ATTRS, *vars(logging.makeLogRecord({})), "color_message", "taskName", "message"}
)
_ENCODER = msgspec.json.Encoder()
_PLAIN = frozenset({str, int, float, bool, type(None)})


class JsonFormatter(_LibraryFormatter):
    """One JSON object per line, with the request context attached.

    The library picks the fields, merges the extras and formats the exception; the hooks below
    are what it has no setting for: the time's format, a lower-case level, the record's
    ``exc_text`` (which a filter may have rewritten), ``msg`` as text even for a dict, the
    request context, and no escape in any value.
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
            # uvicorn's copy of msg with ANSI colours, for terminals.
            reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        )

    def format(self, record: logging.LogRecord) -> str:
        fast = self._plain(record)
        if fast is not None:
            return fast
        if isinstance(record.msg, dict):
            # The library would take a dict's keys for fields and log an empty msg; msg is the
            # message's text, as for any other object (a copy: other handlers see the record).
            record = logging.makeLogRecord(
                {**vars(record), "msg": record.getMessage(), "args": None}
            )
        return super().format(record)

    def _plain(self, record: logging.LogRecord) -> str | None:
        """The line of a plain record (a text message, no exception or stack, JSON-ready extras,
        no escape anywhere), built directly: the library's path cost about 15 µs of a request's
        event-loop time (docs/PERFORMANCE.md §7).  The same fields as the library's; None sends
        anything else down that path."""
        if (
            record.exc_info
            or record.exc_text
            or record.stack_info
            or not isinstance(record.msg, str)
        ):
            return None
        line: dict[str, Any] = {
            "ts": self.formatTime(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _NOT_EXTRA:
                if type(value) not in _PLAIN:  # the library turns anything else into text
                    return None
                line[key] = value  # an extra named level is logged as given
        for name, var in _CONTEXT:
            value = var.get()
            if value is not None:
                line.setdefault(name, value)  # an extra of the same name wins
        try:
            text = _ENCODER.encode(line).decode()
        except (TypeError, ValueError):  # a value JSON cannot hold as it is: the library's path
            return None
        if "\\u001b" in text or "\\u001B" in text:  # an escape to remove: the library's path
            return None
        return text

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        """RFC 3339 in UTC with milliseconds: ``2025-01-31T12:00:00.123Z`` (from ``created``: a
        record made with makeLogRecord keeps the ``msecs`` of its making)."""
        t = dt.datetime.fromtimestamp(record.created, tz=dt.UTC)
        return t.isoformat(timespec="milliseconds").replace("+00:00", "Z")

    def add_fields(
        self, log_record: dict[str, Any], record: logging.LogRecord, message_dict: dict[str, Any]
    ) -> None:
        if record.exc_text:
            # What logging.Formatter prints: a filter may have rewritten it, and the library
            # would format record.exc_info anew.
            message_dict["exc_info"] = record.exc_text
        super().add_fields(log_record, record, message_dict)
        if "level" not in vars(record):  # an extra named level is logged as given, like any other
            log_record["level"] = record.levelname.lower()
        for name, var in _CONTEXT:
            value = var.get()
            if value is not None:
                log_record.setdefault(name, value)  # an extra of the same name wins

    def process_log_record(self, log_record: dict[str, Any]) -> dict[str, Any]:
        return _clean(log_record)


def configure(level: str = "INFO", stream: Any = None) -> None:
    """Route every logger through the JSON formatter (uvicorn's included: the host runs it with
    ``log_config=None``, so its loggers propagate here)."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "botocore", "aiobotocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
