"""``/v1/tenants/{tenant}/logs/{uuid}/cursors/{name}`` and ``.../compaction``."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from ..models import CompactionRequest, CompactionResponse, CursorOut, CursorPut
from ..requests import body_schema, read_model
from ..services.cursors import CursorService
from . import ERRORS, LOG_PATH
from .deps import Access, LogScope


def router(cursors: CursorService, access: Access) -> APIRouter:
    """The cursor routes."""
    r = APIRouter(prefix="/v1", responses=ERRORS)

    @r.get(LOG_PATH + "/cursors/{name}", response_model=CursorOut, summary="Read a cursor")
    async def get_cursor(
        name: str, scope: LogScope = Depends(access.cursor_reader_scope)
    ) -> CursorOut:
        return await cursors.get(scope.tenant, scope.cid, name)

    @r.put(
        LOG_PATH + "/cursors/{name}",
        response_model=CursorOut,
        openapi_extra=body_schema(CursorPut),
        summary="Create (witness null) or compare-and-swap a cursor",
    )
    async def put_cursor(
        name: str, request: Request, scope: LogScope = Depends(access.cursor_writer_scope)
    ) -> CursorOut:
        req = await read_model(request, CursorPut)
        return await cursors.put(scope.tenant, scope.cid, name, req)

    @r.delete(LOG_PATH + "/cursors/{name}", summary="Delete a cursor")
    async def delete_cursor(
        name: str, scope: LogScope = Depends(access.cursor_writer_scope)
    ) -> dict[str, Any]:
        await cursors.delete(scope.tenant, scope.cid, name)
        return {"name": name, "deleted": True}

    @r.post(
        LOG_PATH + "/compaction",
        response_model=CompactionResponse,
        openapi_extra=body_schema(CompactionRequest),
        summary="Record that everything below offset is compacted (forward only)",
    )
    async def compaction(
        request: Request, scope: LogScope = Depends(access.service_scope)
    ) -> CompactionResponse:
        req = await read_model(request, CompactionRequest)
        return await cursors.compacted(scope.tenant, scope.cid, req.offset)

    return r
