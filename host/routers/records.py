"""``/v1/tenants/{tenant}/logs/{uuid}``: append, read, state, fragments."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Query, Request
from starlette.responses import Response

from ..config import Settings
from ..models import AppendRequest, AppendResponse, FragmentsResponse, LogState
from ..requests import MAX_OFFSET, body_schema, read_body
from ..services.records import ReadRequest, RecordService
from . import ERRORS, LOG_PATH
from .deps import Access, LogScope


def router(records: RecordService, access: Access, settings: Settings) -> APIRouter:
    """The records routes (the read's query bounds come from ``settings``)."""
    r = APIRouter(prefix="/v1", responses=ERRORS)

    @r.post(
        LOG_PATH + "/records",
        response_model=AppendResponse,
        openapi_extra=body_schema(AppendRequest),
        response_model_exclude_none=True,
        summary="Append records; answers once they are durable",
    )
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
