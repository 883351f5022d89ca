"""API errors and the one place every failure is mapped to an HTTP answer.

Every error body is ``{"error": {"code": "<word>", "message": "..."}}``.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import JSONResponse, Response

from wal3 import errors as w

_log = logging.getLogger("loghost.errors")


class ApiError(Exception):
    """An error with a status, a code word and optional headers."""

    status = 400
    code = "bad_request"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}


class BadRequest(ApiError):
    """Malformed or invalid input (naming the field)."""

    status, code = 400, "invalid_request"


class RecordTooLarge(ApiError):
    """A record with more metadata keys or embedding dimensions than the host allows."""

    status, code = 400, "record_too_large"


class Unauthorized(ApiError):
    """Missing or unknown API key."""

    status, code = 401, "unauthorized"


class Forbidden(ApiError):
    """A tenant key used on another tenant's path, or a tenant key on a service endpoint."""

    status, code = 403, "forbidden"


class NotFound(ApiError):
    """No such log (or it belongs to another tenant: existence is not leaked)."""

    status, code = 404, "not_found"


class TooLarge(ApiError):
    """The request body is over the configured size."""

    status, code = 413, "too_large"


class NotLeader(ApiError):
    """Another live server holds this log; the client should go there."""

    status, code = 307, "not_leader"

    def __init__(self, location: str) -> None:
        super().__init__(f"another server holds this log: {location}",
                         headers={"Location": location})


class BackpressureError(ApiError):
    """Too much outstanding work; retry after a while."""

    status, code = 429, "backpressure"

    def __init__(self, message: str, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after_s)))},
                         extra={"reason": reason})


class Conflict(ApiError):
    """A conflicting state (contention, sealed, cursor CAS lost, existing target)."""

    status, code = 409, "conflict"

    def __init__(self, message: str, code: str, retry_after_s: float | None = None) -> None:
        headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s else None
        super().__init__(message, headers=headers)
        self.code = code


class Unavailable(ApiError):
    """The store (or this server) cannot serve right now."""

    status, code = 503, "unavailable"

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, headers={"Retry-After": str(max(1, round(retry_after_s)))})


def to_api_error(exc: BaseException) -> ApiError | None:
    """The API error a wal3 error means, or None if it is a bug."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, w.LogPurged):
        e = ApiError(str(exc), extra={"oldest_offset": exc.oldest_offset})
        e.status, e.code = 410, "purged"
        return e
    if isinstance(exc, w.LogSealed):
        return Conflict(str(exc), "sealed")
    if isinstance(exc, w.PreconditionFailed):
        # Another process changed what we were about to replace (e.g. two collectors).
        return Conflict(str(exc), "contention", retry_after_s=1)
    if isinstance(exc, w.LogContention):
        return Conflict(str(exc), "contention", retry_after_s=1)
    if isinstance(exc, w.CursorConflict):
        return Conflict(str(exc), "cursor_conflict")
    if isinstance(exc, w.LogExists):
        return Conflict(str(exc), "exists")
    if isinstance(exc, w.NoCursors):
        return Conflict(str(exc), "no_cursors")
    if isinstance(exc, w.GarbageRejected):
        return Conflict(str(exc), "gc_rejected")
    if isinstance(exc, w.Backpressure):
        return BackpressureError(str(exc), exc.reason, exc.retry_after_s)
    if isinstance(exc, (w.CursorNotFound, w.LogNotFound)):
        return NotFound(str(exc))
    if isinstance(exc, w.InvalidCursorName):
        return BadRequest(str(exc))
    if isinstance(exc, (w.StoreUnavailable, w.WriterClosed)):
        return Unavailable(str(exc))
    if isinstance(exc, w.CorruptFragment):
        # Data at rest failed its checksum: not a bug here, and no retry will make it pass.
        _log.error("corrupt fragment: %s", exc)
        e = ApiError(str(exc))
        e.status, e.code = 500, "corrupt_fragment"
        return e
    return None


def _body(code: str, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if extra:
        err.update(extra)
    return {"error": err}


def error_response(exc: ApiError) -> JSONResponse:
    """The JSON response for an API error."""
    return JSONResponse(_body(exc.code, exc.message, exc.extra), status_code=exc.status,
                        headers=exc.headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


def install_handlers(app: FastAPI) -> None:
    """Register the exception handlers that produce the error shape."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        msg = f"{_field(first.get('loc', ()))}: {first.get('msg', 'invalid')}"
        return error_response(BadRequest(msg))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return JSONResponse(_body(code, str(exc.detail)), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    @app.exception_handler(w.Wal3Error)
    async def _wal3(_: Request, exc: w.Wal3Error) -> Response:
        mapped = to_api_error(exc)
        if mapped is not None:
            return error_response(mapped)
        _log.error("unexpected engine error: %r", exc)
        return JSONResponse(_body("internal", f"{type(exc).__name__}: {exc}"), status_code=500)
