"""Structured JSON logs carrying tenant, collection_id and request id (never API keys)."""

from __future__ import annotations

import contextvars
import json
import logging
import sys
from typing import Any

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
tenant: contextvars.ContextVar[str | None] = contextvars.ContextVar("tenant", default=None)
collection_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "collection_id", default=None
)

_RESERVED = frozenset(vars(logging.makeLogRecord({})))


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the request context attached."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for name, var in (
            ("request_id", request_id),
            ("tenant", tenant),
            ("collection_id", collection_id),
        ):
            value = var.get()
            if value is not None:
                out[name] = value
        out.update(
            {k: v for k, v in vars(record).items() if k not in _RESERVED and not k.startswith("_")}
        )
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure(level: str = "INFO", stream: Any = None) -> None:
    """Route every logger through the JSON formatter."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access", "botocore", "aiobotocore", "urllib3", "py4j"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
