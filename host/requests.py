"""Reading a request: its body with a size bound, pydantic validation from the raw bytes, ids.

Bodies are validated by pydantic straight from the bytes, so a deeply nested or non-UTF-8 body is
a 400 naming the field, never a 500.  (Append bodies have their own decoder, ``host.appendbody``.)
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, TypeVar
from uuid import UUID

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.types import Receive

from .errors import BadRequest, TooLarge

_log = logging.getLogger("loghost.api")
M = TypeVar("M", bound=BaseModel)

MAX_OFFSET = (1 << 63) - 1
"""The largest offset a query may name."""

SMALL_BODY_BYTES = 64 << 10
"""The bound on a cursor, compaction or fork body."""


def parse_uuid(value: str, field: str = "collection_id") -> UUID:
    """``value`` as a UUID, or a 400 naming ``field``."""
    try:
        parsed = UUID(value)
    except (ValueError, AttributeError):
        raise BadRequest(f"{field}: not a UUID: {value[:64]!r}") from None
    return parsed


async def read_body(request: Request, limit: int) -> bytes:
    """The request's body; 413 past ``limit`` bytes (declared or streamed)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            if int(declared) > limit:
                raise TooLarge(f"request body over {limit} bytes")
        except ValueError:
            raise BadRequest("content-length: not a number") from None
    chunks: list[bytes] = []
    total = 0
    async for chunk in request.stream():
        total += len(chunk)
        if total > limit:
            raise TooLarge(f"request body over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse(model: type[M], raw: bytes) -> M:
    """``raw`` validated as ``model``; a 400 naming the first field in error."""
    if not raw:
        raise BadRequest("body: a JSON object is required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        raise BadRequest(f"{where}: {err.get('msg', 'invalid')}") from None


async def read_model(request: Request, model: type[M], limit: int = SMALL_BODY_BYTES) -> M:
    """The request's body, at most ``limit`` bytes, validated as ``model``."""
    return parse(model, await read_body(request, limit))


async def disconnected(receive: Receive) -> None:
    """Return when the client hangs up (the request body, if any, is already consumed)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        _log.debug("disconnect watch failed", exc_info=True)
        await asyncio.Event().wait()


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body we parse ourselves (``openapi_extra``; the schema itself is added to
    the document's components by ``host.routers.ops``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }
