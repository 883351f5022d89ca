"""``/v1/tenants/{tenant}/logs/{uuid}``: append, read, state, fragments.

The append is served by a plain Starlette route placed before FastAPI's: FastAPI's request
handling (resolving the auth dependency and the path parameters, then serialising the response
model) cost about 50 µs of the event loop per request, a tenth of a small append's CPU.  The
FastAPI route stays, with the same path, for the API description only; both make the same
checks (``Access.role_scope``) and call the same service.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import Scope

from ..auth import Role
from ..config import Settings
from ..models import AppendRequest, AppendResponse, FragmentsResponse, LogState
from ..requests import MAX_OFFSET, body_schema, read_body
from ..services.records import ReadRequest, RecordService
from . import ERRORS, LOG_PATH
from .deps import Access, LogScope


class _AppendRoute(Route):
    """The append's Starlette route; it names itself in the scope as FastAPI's routes do (the
    request metrics label requests by ``scope["route"].path``)."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child = super().matches(scope)
        if match is Match.FULL:
            child["route"] = self
        return match, child


def append_route(records: RecordService, access: Access, settings: Settings) -> Route:
    """The append's route, for the app's own routes ahead of the others (an included router
    would rebuild it as a plain Route)."""

    async def append_fast(request: Request) -> Response:
        started = time.monotonic()
        params: dict[str, Any] = request.path_params
        scope = access.role_scope(request, params["tenant"], params["collection_id"], Role.TENANT)
        raw = await read_body(request, settings.max_request_bytes)
        out = await records.append(scope.tenant, scope.cid, raw, started)
        return Response(out.model_dump_json(exclude_none=True), media_type="application/json")

    return _AppendRoute("/v1" + LOG_PATH + "/records", append_fast, methods=["POST"])


def router(records: RecordService, access: Access, settings: Settings) -> APIRouter:
    """The records routes (the read's query bounds come from ``settings``)."""
    r = APIRouter(prefix="/v1", responses=ERRORS)

    @r.post(
        LOG_PATH + "/records",
        response_model=AppendResponse,
        openapi_extra=body_schema(AppendRequest),
        response_model_exclude_none=True,
        summary="Append records; answers once they are durable",
    )  # served by ``append_fast`` (module docstring); this route describes it
    async def append(
        request: Request, scope: LogScope = Depends(access.tenant_scope)
    ) -> AppendResponse:
        started = time.monotonic()
        raw = await read_body(request, settings.max_request_bytes)
        return await records.append(scope.tenant, scope.cid, raw, started)

    @r.get(
        LOG_PATH + "/records",
        summary="Read records from an offset (long-poll with wait_ms)",
        responses={200: {"content": {"application/json": {}}}},
    )
    async def read(
        request: Request,
        scope: LogScope = Depends(access.reader_scope),
        from_: int = Query(1, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(100, ge=1, le=settings.max_read_records),
        wait_ms: int = Query(0, ge=0, le=settings.max_wait_ms),
    ) -> Response:
        return await records.read(
            scope.tenant,
            scope.cid,
            ReadRequest(from_, limit, wait_ms),
            role=scope.principal.role,
            receive=request.receive,
        )

    @r.get(LOG_PATH, response_model=LogState, summary="A log's state")
    async def state(scope: LogScope = Depends(access.reader_scope)) -> LogState:
        return await records.state(scope.tenant, scope.cid)

    @r.get(
        LOG_PATH + "/fragments",
        response_model=FragmentsResponse,
        summary="Fragment URLs a bulk reader can open directly",
    )
    async def fragments(
        scope: LogScope = Depends(access.service_scope),
        from_: int | None = Query(None, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(10_000, ge=1, le=100_000),
    ) -> FragmentsResponse:
        return await records.fragments(scope.tenant, scope.cid, from_, limit)

    return r
