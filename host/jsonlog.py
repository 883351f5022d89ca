"""Structured JSON logs carrying tenant, collection_id and request id (never API keys).

One JSON object per line (``compactor_client.logs.JsonFormatter``): ``ts`` in RFC 3339 (UTC,
milliseconds), ``level``, ``logger``, ``msg``, the request context, every ``extra=`` of the call,
and ``exc`` for an exception.  No line carries an ANSI escape: uvicorn's ``color_message`` is
dropped and escapes in any value are removed.
"""

from __future__ import annotations

import contextvars
import logging
import sys
from typing import Any

from compactor_client.logs import JsonFormatter as _BaseFormatter

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
collection_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "collection_id", default=None
)


class JsonFormatter(_BaseFormatter):
    """One JSON object per line, with the request context attached."""

    def context(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, var in (
            ("request_id", request_id),
            ("tenant", tenant),
            ("collection_id", collection_id),
        ):
            value = var.get()
            if value is not None:
                out[name] = value
        return out


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
