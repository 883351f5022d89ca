"""The REST API: a FastAPI app over one ``Server``.

Request bodies are read with a size bound and validated by pydantic straight from the bytes (so a
deeply nested or non-UTF-8 body is a 400, never a 500), and the records answer is assembled from
the stored JSON bodies without re-encoding them.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.openapi.utils import get_openapi
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse, Response

from dirtylog import inspect_records
from wal3 import (
    Backpressure,
    Limits,
    LogContention,
    LogPurged,
    ObjectNotFound,
    StoreUnavailable,
)
from wal3.cursors import COMPACTION
from wal3.fragment import request_digest
from wal3.gc import pin_cursor
from wal3.paths import join, log_prefix
from wal3.scrub import scrub_log

from . import jsonlog
from .auth import Principal, Role, check_cursor_name
from .config import Settings
from .docs import install_docs
from .errors import (
    BackpressureError,
    BadRequest,
    Conflict,
    NotFound,
    NotLeader,
    RecordTooLarge,
    TooLarge,
    Unauthorized,
    Unavailable,
    error_response,
    install_handlers,
)
from .forks import fork_collection
from .httpserver import connection_ticket, guarded_h11
from .manager import LogHandle
from .models import (
    MAX_RECORDS_PER_REQUEST,
    AdoptRequest,
    AdoptResponse,
    AppendRequest,
    AppendResponse,
    CompactionRequest,
    CompactionResponse,
    CursorOut,
    CursorPut,
    DirtyResponse,
    ErrorResponse,
    ForkRequest,
    FragmentsResponse,
    LogState,
    PurgeRequest,
    Record,
)
from .pages import empty_answer, records_answer
from .server import Server

_log = logging.getLogger("loghost.api")
M = TypeVar("M", bound=BaseModel)
MAX_OFFSET = (1 << 63) - 1

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorResponse} for code in (307, 400, 401, 403, 404, 409, 410, 413, 429, 503)
}


def _body(model: type[BaseModel]) -> dict[str, Any]:
    """OpenAPI for a body we parse ourselves (the schema is added in ``_openapi``)."""
    return {
        "requestBody": {
            "required": True,
            "content": {
                "application/json": {"schema": {"$ref": f"#/components/schemas/{model.__name__}"}}
            },
        }
    }


def _parse_uuid(value: str, field: str = "collection_id") -> UUID:
    try:
        parsed = UUID(value)
    except (ValueError, AttributeError):
        raise BadRequest(f"{field}: not a UUID: {value[:64]!r}") from None
    return parsed


async def _read_body(request: Request, limit: int) -> bytes:
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


def _parse(model: type[M], raw: bytes) -> M:
    if not raw:
        raise BadRequest("body: a JSON object is required")
    try:
        return model.model_validate_json(raw)
    except ValidationError as e:
        err = e.errors(include_url=False)[0]
        where = ".".join(str(p) for p in err.get("loc", ())) or "body"
        raise BadRequest(f"{where}: {err.get('msg', 'invalid')}") from None


# The smallest record in JSON ({"id":"a","op":"add"} and a comma): a body shorter than this many
# bytes per allowed record cannot hold too many, and needs no count before validation.
_MIN_RECORD_BYTES = 20
_DECODE_OFF_LOOP_BYTES = 256 << 10
# Its own threads: large bodies must not queue the store's I/O (the default executor) behind them.
_DECODER = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="decode")


class _TooManyObjects(Exception):
    """Raised from inside the JSON decoder to stop it early."""


def _count_records(raw: bytes, limit: int) -> Any:
    """Refuse a body with more than ``limit`` records before anything is validated; the decoded
    document, or None when it is left to the validator (not UTF-8, not JSON).

    The decoder stops as soon as the body holds more JSON objects than ``limit`` valid records
    can (a record and its metadata: two each), so an oversized body costs a bounded amount of
    work, not a parse of every record.
    """
    try:
        text = raw.decode("utf-8")  # strictly: json.loads would also take UTF-16 and -32
    except UnicodeDecodeError:
        return None
    budget = 2 * limit + 1
    seen = 0

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if seen > budget:
            raise _TooManyObjects
        return obj

    try:
        doc = json.loads(text, object_hook=hook)
    except _TooManyObjects:
        raise BadRequest(f"records: at most {limit} per request") from None
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(doc, dict)
        and isinstance(doc.get("records"), list)
        and len(doc["records"]) > limit
    ):
        raise BadRequest(f"records: at most {limit} per request")
    return doc


_CHUNK_RECORDS = 256
# Metadata entries and embedding elements one validation call may take at most (a slice of
# records is cut short when its records carry more): pydantic holds the GIL for the whole call.
_CHUNK_VALUES = 65536
# The smallest embedding element or metadata entry in JSON ("0,"): a shorter body holds fewer
# than _CHUNK_VALUES values and is validated in one call.
_MIN_VALUE_BYTES = 2
_RECORDS: TypeAdapter[list[Record]] = TypeAdapter(list[Record])


@dataclass(frozen=True)
class RecordLimits:
    """What one append may carry: records, and per record metadata keys and embedding length."""

    records: int
    metadata_keys: int
    embedding_dims: int


def _record_values(records: list[Any], limits: RecordLimits) -> list[int]:
    """Each record's metadata entries plus embedding elements, read off the parsed JSON (one
    ``len`` each); a record over ``limits`` is refused here, before anything is validated."""
    sizes = []
    for i, rec in enumerate(records):
        n = 0
        if isinstance(rec, dict):
            meta, emb = rec.get("metadata"), rec.get("embedding")
            if isinstance(meta, dict):
                if len(meta) > limits.metadata_keys:
                    raise RecordTooLarge(
                        f"records.{i}.metadata: {len(meta)} keys, at most "
                        f"{limits.metadata_keys} (LOGHOST_MAX_METADATA_KEYS)"
                    )
                n += len(meta)
            if isinstance(emb, list):
                if len(emb) > limits.embedding_dims:
                    raise RecordTooLarge(
                        f"records.{i}.embedding: {len(emb)} elements, at most "
                        f"{limits.embedding_dims} (LOGHOST_MAX_EMBEDDING_DIMS)"
                    )
                n += len(emb)
        sizes.append(n)
    return sizes


def _check_record_sizes(records: list[Record], limits: RecordLimits) -> None:
    """The same limits on records validated already (small bodies, bounded by their size)."""
    for i, rec in enumerate(records):
        if rec.metadata is not None and len(rec.metadata) > limits.metadata_keys:
            raise RecordTooLarge(
                f"records.{i}.metadata: {len(rec.metadata)} keys, at most "
                f"{limits.metadata_keys} (LOGHOST_MAX_METADATA_KEYS)"
            )
        if rec.embedding is not None and len(rec.embedding) > limits.embedding_dims:
            raise RecordTooLarge(
                f"records.{i}.embedding: {len(rec.embedding)} elements, at most "
                f"{limits.embedding_dims} (LOGHOST_MAX_EMBEDDING_DIMS)"
            )


def _slices(sizes: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` slices of at most ``_CHUNK_RECORDS`` records and (unless one record is
    alone) ``_CHUNK_VALUES`` values."""
    out: list[tuple[int, int]] = []
    start, values = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= _CHUNK_RECORDS or values + n > _CHUNK_VALUES):
            out.append((start, i))
            start, values = i, 0
        values += n
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def _stored(records: list[Record]) -> list[bytes]:
    """The records as stored: compact JSON, metadata keys sorted (``Record`` sorts them: JSON
    objects are unordered, so the same request always stores, and hashes, the same bytes)."""
    return [r.model_dump_json().encode() for r in records]


def _decode_in_chunks(doc: dict[str, Any], sizes: list[int]) -> tuple[AppendRequest, list[bytes]]:
    """Validate a large append a slice of records at a time.

    Pydantic holds the GIL while it validates: in one call over thousands of records (or values)
    the decoding thread would stall the event loop as surely as decoding on it.  Between slices
    the loop gets its turn.  Each slice is validated from JSON again, so the rules are exactly
    the body's.
    """
    records = doc["records"]
    parsed: list[Record] = []
    for i, end in _slices(sizes):
        chunk = json.dumps(records[i:end])
        try:
            parsed.extend(_RECORDS.validate_json(chunk))
        except ValidationError as e:
            err = e.errors(include_url=False)[0]
            loc = list(err.get("loc", ()))
            if loc and isinstance(loc[0], int):
                loc[0] += i
            where = ".".join(["records", *(str(p) for p in loc)])
            raise BadRequest(f"{where}: {err.get('msg', 'invalid')}") from None
    # The rest of the body, with one stand-in record (the real ones are validated above).
    envelope = {k: v for k, v in doc.items() if k != "records"}
    envelope["records"] = [{"id": "-", "op": "add"}]
    req = _parse(AppendRequest, json.dumps(envelope).encode())
    req = req.model_copy(update={"records": parsed})
    return req, _stored(parsed)


def _decode_append(raw: bytes, limits: RecordLimits) -> tuple[AppendRequest, list[bytes]]:
    """Validate an append body; the records as stored (compact JSON)."""
    limit = limits.records
    if len(raw) > min(_MIN_RECORD_BYTES * limit, _MIN_VALUE_BYTES * _CHUNK_VALUES):
        # Large enough to hold too many records or values: counted on the parsed JSON before
        # any validation.
        doc = _count_records(raw, limit)
        if isinstance(doc, dict) and isinstance(doc.get("records"), list):
            sizes = _record_values(doc["records"], limits)
            if len(sizes) > _CHUNK_RECORDS or sum(sizes) > _CHUNK_VALUES:
                return _decode_in_chunks(doc, sizes)
    req = _parse(AppendRequest, raw)
    if len(req.records) > limit:
        raise BadRequest(f"records: at most {limit} per request")
    _check_record_sizes(req.records, limits)
    return req, _stored(req.records)


def _mismatch() -> Conflict:
    return Conflict("idempotency_key: already used for a different request", "idempotency_mismatch")


async def _disconnected(receive: Any) -> None:
    """Return when the client hangs up (the request body, if any, is already consumed)."""
    try:
        while (await receive())["type"] != "http.disconnect":
            pass
    except Exception:
        _log.debug("disconnect watch failed", exc_info=True)
        await asyncio.Event().wait()


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


class _RequestContext:
    """Pure ASGI middleware: request id, the JSON request log line, request metrics.

    Pure ASGI (not ``BaseHTTPMiddleware``) so the handler runs in this task: context variables
    it sets (tenant, collection id) are still there when the request line is logged.
    """

    def __init__(self, app: Any, server: Server) -> None:
        self._app = app
        self._server = server

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        rid = ""
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:64]
                break
        rid = rid or uuid.uuid4().hex[:16]
        jsonlog.request_id.set(rid)
        jsonlog.tenant.set(None)
        jsonlog.collection_id.set(None)
        started = time.monotonic()
        status = 500
        sent_start = False

        async def send_wrapper(message: dict[str, Any]) -> None:
            nonlocal status, sent_start
            if message["type"] == "http.response.start":
                status = message["status"]
                sent_start = True
                message["headers"] = [
                    *message.get("headers", []),
                    (b"x-request-id", rid.encode("latin-1")),
                ]
            await send(message)

        try:
            await self._app(scope, receive, send_wrapper)
        except Exception:
            _log.exception("unhandled error")
            if not sent_start:
                await JSONResponse(
                    {"error": {"code": "internal", "message": "internal error"}}, status_code=500
                )(scope, receive, send_wrapper)
        finally:
            route = getattr(scope.get("route"), "path", "unmatched")
            self._server.metrics.requests.labels(route, str(status)).inc()
            _log.info(
                "request",
                extra={
                    "method": scope.get("method"),
                    "route": route,
                    "status": status,
                    "ms": round((time.monotonic() - started) * 1000, 3),
                },
            )


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """How the log host runs under uvicorn: ``loghost serve``, the tests and the benchmarks."""
    host, port = settings.host_port
    http = guarded_h11(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        settings.max_unauthenticated_connections,
        settings.send_timeout_s,
    )
    state = getattr(app, "state", None)
    if state is not None:
        state.connections = http.table  # type: ignore[attr-defined]  # what the cap sees
    options: dict[str, Any] = {
        "host": host,
        "port": port,
        "log_config": None,
        "access_log": False,
        "lifespan": "on",
        "server_header": False,
        # Above clients' idle expiry, or a request may be sent on a connection being closed.
        "timeout_keep_alive": max(1, round(settings.keep_alive_s)),
        "timeout_graceful_shutdown": int(settings.shutdown_grace_s),
        # Slowloris: headers and bodies must arrive in time; connections are capped.
        "http": http,
    }
    options.update(overrides)
    return uvicorn.Config(app, **options)


def create_app(server: Server) -> FastAPI:
    """The FastAPI application serving ``server``."""
    settings = server.settings

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await server.start()
        try:
            yield
        finally:
            await server.close()

    # The docs pages are served from the package by ``install_docs`` (no CDN).
    app = FastAPI(
        title="loghost",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        description="A multi-tenant log host over wal3 logs on object storage.",
    )
    install_handlers(app)
    install_docs(app)
    app.state.server = server

    app.add_middleware(_RequestContext, server=server)

    @app.exception_handler(NotLeader)
    async def _not_leader(request: Request, exc: NotLeader) -> Response:
        base = exc.headers["Location"].rstrip("/")
        location = (
            base + _canonical_path(request) + (f"?{request.url.query}" if request.url.query else "")
        )
        return error_response(NotLeader(location))

    @app.exception_handler(ClientDisconnect)
    async def _client_gone(_: Request, __: ClientDisconnect) -> Response:
        # The client hung up (mid-body, or during a long-poll): nobody reads this answer; it
        # is logged and counted as 499, not as a server error.
        return Response(status_code=499)

    def principal(request: Request) -> Principal:
        values = request.headers.getlist("authorization")
        if len(values) > 1:
            raise Unauthorized("more than one Authorization header")
        who = server.auth.authenticate(values[0] if values else None)
        ticket = connection_ticket(request.scope)
        if ticket is not None:
            ticket.mark_authenticated()  # the connection cap no longer closes it for strangers
        return who

    # One flat dependency per route (a chain of them costs a fifth of a small request), named for
    # the role the route needs (the role table is in README.md); the bearer scheme is documented
    # in the OpenAPI document by ``_openapi`` instead.
    def _scope(request: Request, tenant: str, collection_id: str, needed: Role) -> tuple[str, UUID]:
        who = principal(request)
        server.auth.authorize(who, tenant, needed)
        request.state.principal = who  # long-polls are counted per role
        cid = _parse_uuid(collection_id)
        jsonlog.tenant.set(tenant)
        jsonlog.collection_id.set(str(cid))
        return tenant, cid

    async def reader_scope(request: Request, tenant: str, collection_id: str) -> tuple[str, UUID]:
        return _scope(request, tenant, collection_id, Role.READER)

    async def tenant_scope(request: Request, tenant: str, collection_id: str) -> tuple[str, UUID]:
        return _scope(request, tenant, collection_id, Role.TENANT)

    async def service_scope(request: Request, tenant: str, collection_id: str) -> tuple[str, UUID]:
        return _scope(request, tenant, collection_id, Role.SERVICE)

    async def cursor_reader_scope(
        request: Request, tenant: str, collection_id: str, name: str
    ) -> tuple[str, UUID]:
        scope = _scope(request, tenant, collection_id, Role.READER)  # 401 before any 400
        check_cursor_name(name)
        return scope

    async def cursor_writer_scope(
        request: Request, tenant: str, collection_id: str, name: str
    ) -> tuple[str, UUID]:
        """A tenant's own cursors; the reserved ones (``compaction``, ...) need a service key."""
        server.auth.authorize_cursor_write(principal(request), tenant, name)
        cid = _parse_uuid(collection_id)
        jsonlog.tenant.set(tenant)
        jsonlog.collection_id.set(str(cid))
        return tenant, cid

    async def service(request: Request) -> Principal:
        who = principal(request)
        server.auth.require_service(who)
        return who

    v1 = APIRouter(prefix="/v1", responses=_ERRORS)
    base = "/tenants/{tenant}/logs/{collection_id}"

    # ---------------------------------------------------------------------------- records

    @v1.post(
        base + "/records",
        response_model=AppendResponse,
        openapi_extra=_body(AppendRequest),
        response_model_exclude_none=True,
        summary="Append records; answers once they are durable",
    )
    async def append(
        request: Request, scope: tuple[str, UUID] = Depends(tenant_scope)
    ) -> AppendResponse:
        tenant, cid = scope
        started = time.monotonic()
        raw = await _read_body(request, settings.max_request_bytes)
        limits = RecordLimits(
            min(settings.max_records_per_request, MAX_RECORDS_PER_REQUEST),
            settings.max_metadata_keys,
            settings.max_embedding_dims,
        )
        if len(raw) > _DECODE_OFF_LOOP_BYTES:
            # Large bodies are decoded in a worker thread; the record count is checked before
            # any record is validated, so the work per request is bounded.
            req, bodies = await asyncio.get_running_loop().run_in_executor(
                _DECODER, _decode_append, raw, limits
            )
        else:
            req, bodies = _decode_append(raw, limits)
        nbytes = sum(len(b) for b in bodies)
        server.manager.reserve(nbytes)
        try:
            async with server.manager.use(cid, tenant, create=True) as h:
                await _check_compaction_backlog(h)
                writer = h.writer
                try:
                    # The take-over fence is waited for below, outside use(): a waiting answer
                    # must not pin an open-log slot.
                    result = await writer.append_many(
                        bodies, idempotency_key=req.idempotency_key, fence=False
                    )
                except Exception as e:
                    outcome = type(e).__name__
                    server.metrics.append_requests.labels(outcome).inc()
                    if isinstance(e, LogContention):
                        server.metrics.contention.inc()
                    elif isinstance(e, Backpressure):
                        server.metrics.backpressure.labels("batching").inc()
                    raise
                if result.deduplicated:
                    await _check_same_request(h, result, bodies)
        finally:
            server.manager.release(nbytes)
        await writer.wait_fence()  # no read anywhere may miss what this answer acknowledges
        if result.deduplicated:
            server.metrics.idempotent_hits.inc()
        else:
            server.metrics.appends.inc(result.count)
            server.metrics.append_bytes.inc(nbytes)
        server.metrics.append_requests.labels("ok").inc()
        server.metrics.append_latency.observe(time.monotonic() - started)
        return AppendResponse(
            first_offset=result.first_offset,
            count=result.count,
            next_offset=result.next_offset,
            deduplicated=True if result.deduplicated else None,
        )

    async def _check_same_request(h: LogHandle, result: Any, bodies: list[bytes]) -> None:
        """A reused idempotency key must carry the same records: 409 otherwise.

        The key keeps a hash of the records it first appended (in the writer's window and the
        fragment footer, so across restarts and fail-overs, and after those records are
        collected).  A key written before keys carried a hash is checked against the log's own
        records while they are there, and by count once they are collected.
        """
        if result.count != len(bodies):
            raise _mismatch()
        if result.digest is not None:
            # The key's own hash of its request: it holds after the records are collected.
            if result.digest != request_digest(bodies):
                raise _mismatch()
            return
        try:
            stored = await h.reader.read(
                result.first_offset,
                Limits(max_records=result.count, max_bytes=2 * settings.max_request_bytes),
                manifest=await server.manager.view(h),
            )
        except LogPurged:
            # A key from before keys carried a hash, collected since: only the count compares.
            return
        got = [r.body for r in stored if r.offset < result.first_offset + result.count]
        if got != bodies:
            raise _mismatch()

    async def _check_compaction_backlog(h: LogHandle) -> None:
        limit = settings.backpressure_uncompacted_records
        if h.writer.manifest.next_offset - h.compaction_offset <= limit:
            return
        # Maybe a compactor advanced the cursor through another path: look before refusing.
        w = await h.cursors.load(COMPACTION)
        if w is not None:
            h.note_compaction(w.cursor.offset)
        backlog = h.writer.manifest.next_offset - h.compaction_offset
        if backlog > limit:
            server.metrics.backpressure.labels("compaction").inc()
            raise BackpressureError(
                f"{backlog} uncompacted records (limit {limit})", "compaction", 5
            )

    @v1.get(
        base + "/records",
        summary="Read records from an offset (long-poll with wait_ms)",
        responses={200: {"content": {"application/json": {}}}},
    )
    async def read(
        request: Request,
        scope: tuple[str, UUID] = Depends(reader_scope),
        from_: int = Query(1, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(100, ge=1, le=settings.max_read_records),
        wait_ms: int = Query(0, ge=0, le=settings.max_wait_ms),
    ) -> Response:
        tenant, cid = scope
        started = time.monotonic()
        deadline = started + wait_ms / 1000.0
        gone: asyncio.Task[None] | None = None
        limits = Limits(max_records=limit, max_bytes=settings.max_request_bytes)
        pointers: list[Any] = []
        try:
            while True:
                async with server.manager.use(cid, tenant) as h:
                    m = await server.manager.view(h)
                    if from_ < m.oldest_offset:
                        raise LogPurged(from_, m.oldest_offset)
                    if from_ < m.next_offset:
                        pointers = await h.reader.scan(from_, limits, manifest=m)
                        break
                if time.monotonic() >= deadline or server.manager.draining:
                    break
                # Wait outside use(): a waiting request holds no open-log slot, and it stops
                # when its client hangs up, at shutdown, or when the log moves.
                if gone is None:
                    gone = asyncio.create_task(_disconnected(request.receive))
                role = request.state.principal.role.name.lower()
                why = await server.manager.wait_for_records(h, tenant, role, from_, deadline, gone)
                if why == "disconnected":
                    raise ClientDisconnect()
                if why in ("timeout", "drain"):
                    break
                if why == "changed" and not h.lost:
                    break  # evicted or closed meanwhile: answer empty; the client polls again
        finally:
            if gone is not None:
                gone.cancel()
        # Fragments are immutable: they are fetched (and a large answer streamed) outside use().
        answer = (
            await records_answer(h.reader, pointers, from_, limit, settings.max_request_bytes)
            if pointers
            else empty_answer(from_)
        )
        server.metrics.read_latency.observe(time.monotonic() - started)
        return answer

    # ------------------------------------------------------------------------ state & co

    async def _compaction_offset(h: LogHandle) -> int:
        """The compaction cursor as stored: another host (or the compactor through another
        path) may have advanced it, and no lease covers the handle's memory of it.  The cursor
        only moves forward, so the memory is a floor."""
        w = await h.cursors.load(COMPACTION)
        if w is not None:
            h.note_compaction(w.cursor.offset)
        return h.compaction_offset

    async def _state(h: LogHandle) -> LogState:
        m = await server.manager.view(h)
        compaction = await _compaction_offset(h)
        first_seq = m.initial_seq_no if m.initial_seq_no is not None else 1
        return LogState(
            collection_id=str(h.collection_id),
            tenant=h.tenant,
            oldest_offset=m.oldest_offset,
            next_offset=m.next_offset,
            compaction_offset=compaction,
            setsum=m.setsum.hexdigest(),
            sealed=m.sealed,
            fragments=max(0, m.next_seq_no - first_seq),
            bytes=m.live_bytes,
        )

    @v1.get(base, response_model=LogState, summary="A log's state")
    async def state(scope: tuple[str, UUID] = Depends(reader_scope)) -> LogState:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            return await _state(h)

    @v1.get(
        base + "/fragments",
        response_model=FragmentsResponse,
        summary="Fragment URLs a bulk reader can open directly",
    )
    async def fragments(
        scope: tuple[str, UUID] = Depends(service_scope),
        from_: int | None = Query(None, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(10_000, ge=1, le=100_000),
    ) -> FragmentsResponse:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            m = await server.manager.view(h)
            start = from_ if from_ is not None else await _compaction_offset(h)
            start = max(start, m.oldest_offset) if from_ is None else start
            ptrs = await h.reader.scan(start, Limits(max_files=limit), manifest=m)
        return FragmentsResponse(
            fragments=[
                {
                    "url": server.store.url_for(join(h.prefix, p.path)),
                    "start": p.start,
                    "limit": p.limit,
                    "num_bytes": p.num_bytes,
                    "setsum": p.setsum.hexdigest(),
                    "content_md5": p.content_md5,
                }
                for p in ptrs
            ]
        )  # type: ignore[misc]

    # ----------------------------------------------------------------------------- cursors

    @v1.get(base + "/cursors/{name}", response_model=CursorOut, summary="Read a cursor")
    async def get_cursor(
        name: str, scope: tuple[str, UUID] = Depends(cursor_reader_scope)
    ) -> CursorOut:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            w = await h.cursors.load(name)
        if w is None:
            raise NotFound(f"no cursor {name}")
        return CursorOut(
            name=name,
            offset=w.cursor.offset,
            epoch_us=w.cursor.epoch_us,
            writer=w.cursor.writer,
            witness=w.etag,
        )

    @v1.put(
        base + "/cursors/{name}",
        response_model=CursorOut,
        openapi_extra=_body(CursorPut),
        summary="Create (witness null) or compare-and-swap a cursor",
    )
    async def put_cursor(
        name: str, request: Request, scope: tuple[str, UUID] = Depends(cursor_writer_scope)
    ) -> CursorOut:
        tenant, cid = scope
        req = _parse(CursorPut, await _read_body(request, 64 << 10))
        async with server.manager.use(cid, tenant) as h:
            m = await server.manager.view(h)  # another host may have written the log
            if req.offset > m.next_offset:
                raise BadRequest(f"offset: {req.offset} is past the log's tail {m.next_offset}")
            if req.offset < m.oldest_offset:
                raise LogPurged(req.offset, m.oldest_offset)
            # Write, then confirm against gc/GARBAGE and the stored manifest that no collector
            # (here or in another process) has passed the offset; undone if one has.
            w = await pin_cursor(server.store, h.prefix, h.cursors, name, req.offset, req.witness)
            if name == COMPACTION:
                h.compaction_offset = req.offset
        return CursorOut(
            name=name,
            offset=w.cursor.offset,
            epoch_us=w.cursor.epoch_us,
            writer=w.cursor.writer,
            witness=w.etag,
        )

    @v1.delete(base + "/cursors/{name}", summary="Delete a cursor")
    async def delete_cursor(
        name: str, scope: tuple[str, UUID] = Depends(cursor_writer_scope)
    ) -> dict[str, Any]:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            await h.cursors.delete(name)
        return {"name": name, "deleted": True}

    @v1.post(
        base + "/compaction",
        response_model=CompactionResponse,
        openapi_extra=_body(CompactionRequest),
        summary="Record that everything below offset is compacted (forward only)",
    )
    async def compaction(
        request: Request, scope: tuple[str, UUID] = Depends(service_scope)
    ) -> CompactionResponse:
        tenant, cid = scope
        req = _parse(CompactionRequest, await _read_body(request, 64 << 10))
        async with server.manager.use(cid, tenant) as h:
            tail = (await server.manager.view(h)).next_offset  # another host may have written
            if req.offset > tail:
                raise BadRequest(f"offset: {req.offset} is past the log's tail {tail}")
            w = await h.cursors.advance(COMPACTION, req.offset)
            h.note_compaction(w.cursor.offset)
            server.dirty_set.note_compacted(cid, h.compaction_offset)
            server.gc.schedule(cid)
            return CompactionResponse(compaction_offset=h.compaction_offset)

    @v1.post(base + "/seal", response_model=LogState, summary="Seal the log (appends then 409)")
    async def seal(scope: tuple[str, UUID] = Depends(service_scope)) -> LogState:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            writer = h.writer
            await writer.seal()
            state = await _state(h)
        # Like an append: no read anywhere may miss what this answer acknowledges (a take-over's
        # fence), waited for outside use() so it pins no open-log slot.
        await writer.wait_fence()
        return state

    @v1.post(
        base + "/fork",
        response_model=LogState,
        openapi_extra=_body(ForkRequest),
        summary="Fork the log (default: from its compaction cursor) into a new collection",
    )
    async def fork(request: Request, scope: tuple[str, UUID] = Depends(service_scope)) -> LogState:
        tenant, cid = scope
        req = _parse(ForkRequest, await _read_body(request, 64 << 10))
        target = _parse_uuid(req.target_collection_id, "target_collection_id")
        if target == cid:
            raise BadRequest("target_collection_id: must differ from the source")
        async with server.manager.use(cid, tenant) as h:
            offset = req.offset if req.offset is not None else await _compaction_offset(h)
            m = await server.manager.view(h)  # another host may have written the log
            if offset > m.next_offset:
                raise BadRequest(f"offset: {offset} is past the log's tail {m.next_offset}")
            if offset < m.oldest_offset:
                raise LogPurged(offset, m.oldest_offset)
            owner = await server.manager.bind(target, tenant)
            if owner != tenant:
                raise NotFound(f"no log {target} for tenant {tenant}")
            # The target's cursor, compacted base and dirty mark are all in place before its
            # manifest makes it visible (host/forks.py); the mark goes through our dirty hook.
            forked = await fork_collection(
                server.store,
                source=cid,
                target=target,
                source_prefix=h.prefix,
                target_prefix=log_prefix(target),
                source_manifest=m,
                offset=offset,
                writer_name=f"loghost:{settings.server_id}",
                mark_dirty=server.dirty_set.mark,
                claims=server.manager.claims,
            )
        async with server.manager.use(target, tenant) as t:
            t.note_compaction(forked.compaction_offset)
            return await _state(t)

    @v1.post(base + "/gc", summary="Run one garbage-collection pass now")
    async def gc(scope: tuple[str, UUID] = Depends(service_scope)) -> dict[str, Any]:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            writer = h.writer
            report = await server.gc.collect(h)
        await writer.wait_fence()  # its manifest edit is acknowledged: as for an append
        return {
            "phase": report.phase,
            "cutoff": report.cutoff,
            "fragments_deleted": report.fragments_deleted,
            "snapshots_deleted": report.snapshots_deleted,
            "orphans_deleted": report.orphans_deleted,
            "waiting_s": report.waiting_s,
            "notes": report.notes,
        }

    @v1.get(base + "/scrub", summary="Verify the log end to end from the objects")
    async def scrub(scope: tuple[str, UUID] = Depends(service_scope)) -> dict[str, Any]:
        tenant, cid = scope
        async with server.manager.use(cid, tenant) as h:
            report = await scrub_log(server.store, h.prefix)
        if not report.ok:
            server.metrics.scrub_failures.inc()
        return {
            "ok": report.ok,
            "problems": report.problems,
            "fragments": report.fragments,
            "snapshots": report.snapshots,
            "records": report.records,
            "bytes": report.bytes,
            "setsum": report.setsum,
        }

    # ------------------------------------------------------------------------- dirty log

    async def _dirty_answer(entries: list[Any]) -> DirtyResponse:
        logs = []
        for e in entries:
            tenant = await server.manager.binding(e.collection_id)
            logs.append({"tenant": tenant or "", **e.as_dict()})
        return DirtyResponse(server_id=settings.server_id, logs=logs)  # type: ignore[arg-type]

    @v1.get("/dirty", response_model=DirtyResponse, summary="Dirty collections, best first")
    async def dirty(
        _: Principal = Depends(service),
        min_records: int = Query(1, ge=0),
        limit: int = Query(1000, ge=1, le=100_000),
    ) -> DirtyResponse:
        assert server.dirty is not None
        entries = server.dirty.rollup.select(
            min_records,
            limit,
            max_age_s=settings.dirty_max_age_s,
            max_reinserts=settings.dirty_max_reinserts,
        )
        return await _dirty_answer(entries)

    @v1.post("/dirty/rollup", response_model=DirtyResponse, summary="Roll up the dirty log now")
    async def rollup(_: Principal = Depends(service)) -> DirtyResponse:
        assert server.dirty is not None
        await server.rollups.run_now()
        return await _dirty_answer(server.dirty.rollup.select(0, 1 << 31))

    @v1.post(
        "/dirty/purge",
        openapi_extra=_body(PurgeRequest),
        summary="Drop collections from the dirty set",
    )
    async def purge(request: Request, _: Principal = Depends(service)) -> dict[str, Any]:
        assert server.dirty is not None
        req = _parse(PurgeRequest, await _read_body(request, 1 << 20))
        ids = [_parse_uuid(c, "collection_ids") for c in req.collection_ids]
        first = await server.dirty_set.purge(ids)
        return {"purged": len(ids), "first_offset": first}

    @v1.post(
        "/dirty/adopt",
        openapi_extra=_body(AdoptRequest),
        response_model=AdoptResponse,
        summary="Take over the dirty set of a server that is gone",
        responses={404: {"model": ErrorResponse}},
    )
    async def adopt(request: Request, _: Principal = Depends(service)) -> AdoptResponse:
        assert server.dirty is not None
        req = _parse(AdoptRequest, await _read_body(request, 1 << 16))
        r = await server.adoption.adopt(req.server_id)
        return AdoptResponse(
            adopted_server_id=req.server_id,
            collections=r.collections,
            records_read=r.records_read,
            cursor_from=r.cursor_from,
            cursor_to=r.cursor_to,
        )

    @v1.get("/dirty/inspect", summary="Decode raw dirty-log records (operators)")
    async def inspect(
        _: Principal = Depends(service),
        from_: int | None = Query(None, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        assert server.dirty is not None
        start = from_ if from_ is not None else await server.dirty.backend.oldest_offset()
        records = await inspect_records(server.dirty.backend, start, limit)
        return {"records": [r.as_dict() for r in records]}

    app.include_router(v1)

    # ---------------------------------------------------------------------- operations

    @app.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "server_id": settings.server_id}

    @app.get("/readyz", summary="The store is reachable", responses={503: {"model": ErrorResponse}})
    async def readyz() -> Response:
        try:
            await server.store.head("readyz-probe")
        except ObjectNotFound:
            pass
        except (StoreUnavailable, OSError) as e:
            # The details go to the log, not to unauthenticated callers.
            _log.warning("readiness probe: store unreachable: %r", e)
            return error_response(Unavailable("store unreachable"))
        return JSONResponse({"status": "ready", "server_id": settings.server_id})

    @app.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def metrics() -> Response:
        server.metrics.open_logs.set(server.manager.open_count)
        return Response(generate_latest(server.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    # The key each route needs, stated in the API description (the role table is in README.md).
    needs_of: dict[Any, str] = {
        reader_scope: "a key of this tenant (read-only or not) or a service key",
        cursor_reader_scope: "a key of this tenant (read-only or not) or a service key",
        tenant_scope: "a tenant key of this tenant (not read-only) or a service key",
        cursor_writer_scope: "a tenant key of this tenant (not read-only) or a service key; "
        "a service key for reserved names (compaction, stable_prefix, "
        "names starting with _ or loghost)",
        service_scope: "a service key",
        service: "a service key",
    }

    def _required_keys() -> dict[tuple[str, str], str]:
        out: dict[tuple[str, str], str] = {}
        for route in v1.routes:
            for dep in getattr(getattr(route, "dependant", None), "dependencies", ()):
                if dep.call in needs_of:
                    for method in getattr(route, "methods", ()):
                        out[(method, route.path)] = needs_of[dep.call]
        return out

    def _openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(
            title=app.title, version=app.version, routes=app.routes, description=app.description
        )
        components = schema.setdefault("components", {})
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "Authorization: Bearer <key>",
            }
        }
        needs = _required_keys()
        for path, ops in schema.get("paths", {}).items():
            if path.startswith("/v1/"):
                for method, op in ops.items():
                    op["security"] = [{"bearer": []}]
                    need = needs.get((method.upper(), path))
                    if need:
                        op["x-required-key"] = need
                        op["description"] = (
                            op.get("description", "") + f"\n\nNeeds {need}."
                        ).strip()
        comps = components.setdefault("schemas", {})
        for model in (
            AppendRequest,
            CursorPut,
            CompactionRequest,
            ForkRequest,
            PurgeRequest,
            AdoptRequest,
        ):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(js.pop("$defs", {}))
            comps[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = _openapi  # type: ignore[method-assign]
    return app
