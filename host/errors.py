"""API errors and the one place every failure is mapped to an HTTP answer.

Every error body is ``{"error": {"code": "<word>", "message": "..."}}``.

Every error has a *kind*: an engine error's :class:`wal3.errors.ErrorKind`, or one of the host's
own :class:`HostKind`.  :data:`ANSWERS` maps each kind to its HTTP status and error code (the codes
are a contract clients are built against; README.md lists them), and nothing else here decides
a status or a code.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import math
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeAlias
from uuid import UUID

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from wal3 import errors as w
from wal3.errors import ErrorKind

_log = logging.getLogger("loghost.errors")


class HostKind(enum.StrEnum):
    """The kinds of the host's own errors (what the engine never raises)."""

    BAD_REQUEST = "bad_request"  # an ApiError that names no more precise kind
    RECORD_TOO_LARGE = "record_too_large"
    UNAUTHORIZED = "unauthorized"
    FORBIDDEN = "forbidden"
    TOO_LARGE = "too_large"
    NOT_LEADER = "not_leader"
    IDEMPOTENCY_MISMATCH = "idempotency_mismatch"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    QUOTA_EXCEEDED = "quota_exceeded"  # a tenant's own quota (host.quotas), not the server's


Kind: TypeAlias = ErrorKind | HostKind


@dataclass(frozen=True)
class Answer:
    """The HTTP answer of one kind of error."""

    status: int
    code: str
    retry_after_s: float | None = None  # a Retry-After the answer carries unless the error sets one
    fields: tuple[str, ...] = ()  # attributes of an engine error copied into the error body


# The one table.  Every ErrorKind and HostKind has a row (tests/host/test_error_table.py).
ANSWERS: Mapping[Kind, Answer] = MappingProxyType(
    {
        # engine kinds
        ErrorKind.CONTENTION: Answer(409, "contention", retry_after_s=1),
        ErrorKind.SEALED: Answer(409, "sealed"),
        ErrorKind.FULL: Answer(409, "sealed"),  # a full log takes no appends, as a sealed one
        ErrorKind.EXISTS: Answer(409, "exists"),
        ErrorKind.CURSOR_CONFLICT: Answer(409, "cursor_conflict"),
        ErrorKind.NO_CURSORS: Answer(409, "no_cursors"),
        ErrorKind.GC_REJECTED: Answer(409, "gc_rejected"),
        ErrorKind.NOT_FOUND: Answer(404, "not_found"),
        ErrorKind.PURGED: Answer(410, "purged", fields=("oldest_offset",)),
        ErrorKind.INVALID: Answer(400, "invalid_request"),
        ErrorKind.BACKPRESSURE: Answer(429, "backpressure", retry_after_s=1, fields=("reason",)),
        ErrorKind.UNAVAILABLE: Answer(503, "unavailable", retry_after_s=1),
        ErrorKind.CLOSED: Answer(503, "unavailable", retry_after_s=1),
        ErrorKind.DATA_LOSS: Answer(500, "data_loss"),
        ErrorKind.CORRUPT_FRAGMENT: Answer(500, "corrupt_fragment"),
        # An object the engine did not expect to be missing, a process death, a bug: nothing the
        # client can act on.
        ErrorKind.OBJECT_NOT_FOUND: Answer(500, "internal"),
        ErrorKind.PROCESS_DEATH: Answer(500, "internal"),
        ErrorKind.INTERNAL: Answer(500, "internal"),
        # the host's own kinds
        HostKind.BAD_REQUEST: Answer(400, "bad_request"),
        HostKind.RECORD_TOO_LARGE: Answer(400, "record_too_large"),
        HostKind.UNAUTHORIZED: Answer(401, "unauthorized"),
        HostKind.FORBIDDEN: Answer(403, "forbidden"),
        HostKind.TOO_LARGE: Answer(413, "too_large"),
        HostKind.NOT_LEADER: Answer(307, "not_leader"),
        HostKind.IDEMPOTENCY_MISMATCH: Answer(409, "idempotency_mismatch"),
        HostKind.METHOD_NOT_ALLOWED: Answer(405, "method_not_allowed"),
        HostKind.QUOTA_EXCEEDED: Answer(429, "quota_exceeded"),
    }
)

# A 409's code names its kind (``sealed`` is the sealed kind; ``full`` answers the same).
_CONFLICT_KINDS: Mapping[str, Kind] = MappingProxyType(
    {a.code: k for k, a in reversed(list(ANSWERS.items())) if a.status == 409}
)


def answer_for(kind: Kind) -> Answer:
    """The HTTP answer of a kind (a kind outside the table answers as internal)."""
    return ANSWERS.get(kind, ANSWERS[ErrorKind.INTERNAL])


def _retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, round(seconds)))}


class _FromTable:
    """``status`` and ``code`` of an ApiError (class or instance): its kind's row of ANSWERS."""

    def __init__(self, field: str) -> None:
        self._field = field

    def __get__(self, obj: ApiError | None, cls: type[ApiError]) -> Any:
        return getattr(answer_for((obj if obj is not None else cls).kind), self._field)


class ApiError(Exception):
    """An error with a kind (hence a status and a code word) and optional headers."""

    kind: Kind = HostKind.BAD_REQUEST
    status = _FromTable("status")
    code = _FromTable("code")

    def __init__(
        self,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
        kind: Kind | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}
        self.extra = extra or {}
        if kind is not None:
            self.kind = kind


class BadRequest(ApiError):
    """Malformed or invalid input (naming the field)."""

    kind = ErrorKind.INVALID


class RecordTooLarge(ApiError):
    """A record with more metadata keys or embedding dimensions than the host allows."""

    kind = HostKind.RECORD_TOO_LARGE


class Unauthorized(ApiError):
    """Missing or unknown API key."""

    kind = HostKind.UNAUTHORIZED


class Forbidden(ApiError):
    """A tenant key used on another tenant's path, or a tenant key on a service endpoint."""

    kind = HostKind.FORBIDDEN


class NotFound(ApiError):
    """No such log (or it belongs to another tenant: existence is not leaked)."""

    kind = ErrorKind.NOT_FOUND


class TooLarge(ApiError):
    """The request body is over the configured size."""

    kind = HostKind.TOO_LARGE


class NotLeader(ApiError):
    """Another live server holds this log; the client should go there."""

    kind = HostKind.NOT_LEADER

    def __init__(self, location: str) -> None:
        super().__init__(
            f"another server holds this log: {location}", headers={"Location": location}
        )


class BackpressureError(ApiError):
    """Too much outstanding work; retry after a while."""

    kind = ErrorKind.BACKPRESSURE

    def __init__(self, message: str, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, headers=_retry_after(retry_after_s), extra={"reason": reason})
        self.reason = reason


MAX_RETRY_AFTER_S = 86_400


class QuotaExceeded(ApiError):
    """A tenant went over one of its quotas (``host.quotas``): 429 naming the quota, with a
    Retry-After when waiting helps (``retry_after_s``: seconds until it would pass)."""

    kind = HostKind.QUOTA_EXCEEDED

    def __init__(
        self,
        tenant: str,
        quota: str,
        limit: str,
        retry_after_s: float | None = None,
        *,
        hold_s: float | None = None,
    ) -> None:
        headers = None
        if retry_after_s is not None:
            # Whole seconds, rounded up: a client that waits this long passes.  At most a day (a
            # rate of one append in years is configurable; its wait may not even be finite).
            wait = min(retry_after_s, MAX_RETRY_AFTER_S)
            headers = {"Retry-After": str(max(1, math.ceil(wait - 1e-9)))}
        super().__init__(
            f"tenant {tenant!r} quota {quota} ({limit}) exceeded",
            headers=headers,
            extra={"quota": quota},
        )
        self.tenant = tenant
        self.quota = quota
        # The Retry-After sent (whole seconds), or None.
        self.retry_after_s = float(headers["Retry-After"]) if headers else None
        # How long the server leaves the connection unread (its turn; host.quotas), or None: then
        # the Retry-After.
        self.hold_s = hold_s


class Conflict(ApiError):
    """A conflicting state (contention, sealed, cursor CAS lost, existing target...): ``code`` is
    one of the 409 codes of :data:`ANSWERS` and names the kind."""

    kind = ErrorKind.CONTENTION

    def __init__(self, message: str, code: str, retry_after_s: float | None = None) -> None:
        if code not in _CONFLICT_KINDS:
            raise ValueError(
                f"{code!r} is not a 409 code; expected one of {sorted(_CONFLICT_KINDS)}"
            )
        super().__init__(
            message,
            headers=_retry_after(retry_after_s) if retry_after_s else None,
            kind=_CONFLICT_KINDS[code],
        )


class Unavailable(ApiError):
    """The store (or this server) cannot serve right now."""

    kind = ErrorKind.UNAVAILABLE

    def __init__(self, message: str, retry_after_s: float = 1.0) -> None:
        super().__init__(message, headers=_retry_after(retry_after_s))


def to_api_error(exc: BaseException) -> ApiError | None:
    """The API error an engine error means (by its kind), or None if it is neither an engine
    error nor an API error."""
    if isinstance(exc, ApiError):
        return exc
    if not isinstance(exc, w.Wal3Error):
        return None
    kind = exc.kind
    answer = answer_for(kind)
    message = str(exc)
    if answer.code == "internal":
        # Not the client's doing, and nothing it can act on: a bug, or a failure to look into.
        _log.error("unexpected engine error: %r", exc)
        message = f"{type(exc).__name__}: {exc}"
    elif kind.is_data_loss:
        # Data at rest is corrupt or gone: not a bug here, and no retry will make it pass.
        _log.error("%s: %s", kind.value, exc)
    retry = getattr(exc, "retry_after_s", None)
    if retry is None:
        retry = answer.retry_after_s
    return ApiError(
        message,
        kind=kind,
        headers=_retry_after(retry) if retry is not None else None,
        extra={f: getattr(exc, f) for f in answer.fields if hasattr(exc, f)},
    )


def _body(code: str, message: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    err: dict[str, Any] = {"code": code, "message": message}
    if extra:
        err.update(extra)
    return {"error": err}


def error_response(exc: ApiError) -> JSONResponse:
    """The JSON response for an API error."""
    return JSONResponse(
        _body(exc.code, exc.message, exc.extra), status_code=exc.status, headers=exc.headers
    )


def internal_error_response() -> JSONResponse:
    """The answer to an exception nothing else answered: 500 ``internal``, and nothing about
    it (it is logged)."""
    return error_response(ApiError("internal error", kind=ErrorKind.INTERNAL))


def _canonical_path(request: Request) -> str:
    """The request's path with the collection id spelled canonically and every part quoted.

    Redirects name the log as ``UUID`` prints it: a spelling ``UUID()`` merely accepts (braces,
    ``urn:uuid:``, other digits) must not leak into ``Location`` (nor break its encoding).
    """
    path = request.url.path
    raw = request.path_params.get("collection_id")
    if isinstance(raw, str):
        with contextlib.suppress(ValueError, AttributeError):
            path = path.replace(f"/logs/{raw}", f"/logs/{UUID(raw)}", 1)
    return urllib.parse.quote(path, safe="/:@!$&'()*+,;=-._~")


def _field(loc: Sequence[Any]) -> str:
    parts = [str(p) for p in loc if p not in ("body", "query", "path")]
    return ".".join(parts) or "body"


# Framework errors (no route, wrong method) by status; others keep their status as ``http_error``.
_HTTP_KINDS: Mapping[int, Kind] = MappingProxyType(
    {404: ErrorKind.NOT_FOUND, 405: HostKind.METHOD_NOT_ALLOWED}
)


def install_handlers(app: FastAPI) -> None:
    """Register the exception handlers that produce the error shape."""

    @app.exception_handler(ApiError)
    async def _api(_: Request, exc: ApiError) -> Response:
        return error_response(exc)

    @app.exception_handler(QuotaExceeded)
    async def _quota(request: Request, exc: QuotaExceeded) -> Response:
        # The tenant's own quota said "retry later": its connection is not read until then
        # (capped), so a client that retries at once cannot keep the event loop busy
        # refusing it (host.httpserver.ConnectionTicket.hold; issue 19).
        from .httpserver import connection_ticket  # imports this module

        ticket = connection_ticket(request.scope)
        if ticket is not None and exc.retry_after_s is not None:
            ticket.hold(exc.hold_s if exc.hold_s is not None else exc.retry_after_s)
        return error_response(exc)

    @app.exception_handler(NotLeader)
    async def _not_leader(request: Request, exc: NotLeader) -> Response:
        # The holder's URL, then this request's path and query: the same request, there.
        base = exc.headers["Location"].rstrip("/")
        query = f"?{request.url.query}" if request.url.query else ""
        return error_response(NotLeader(base + _canonical_path(request) + query))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_: Request, __: ClientDisconnect) -> Response:
        # The client hung up (mid-body, or during a long-poll): nobody reads this answer; it
        # is logged and counted as 499, not as a server error.
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        errs = exc.errors()
        first = errs[0] if errs else {"loc": (), "msg": "invalid request"}
        msg = f"{_field(first.get('loc', ()))}: {first.get('msg', 'invalid')}"
        return error_response(BadRequest(msg))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        kind = _HTTP_KINDS.get(exc.status_code)
        code = answer_for(kind).code if kind is not None else "http_error"
        return JSONResponse(
            _body(code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(w.Wal3Error)
    async def _wal3(_: Request, exc: w.Wal3Error) -> Response:
        mapped = to_api_error(exc)
        assert mapped is not None  # every engine error has a kind, every kind an answer
        return error_response(mapped)
