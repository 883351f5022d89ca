"""``/v1/dirty``: the dirty set, its roll-up, purges, adoption and raw records (service keys)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request

from ..auth import Principal
from ..models import AdoptRequest, AdoptResponse, DirtyResponse, ErrorResponse, PurgeRequest
from ..requests import MAX_OFFSET, body_schema, parse_uuid, read_model
from ..services.dirty import DirtyService
from . import ERRORS
from .deps import Access


def router(dirty_set: DirtyService, access: Access) -> APIRouter:
    """The dirty-set routes."""
    r = APIRouter(prefix="/v1", responses=ERRORS)

    @r.get("/dirty", response_model=DirtyResponse, summary="Dirty collections, best first")
    async def dirty(
        _: Principal = Depends(access.service),
        min_records: int = Query(1, ge=0),
        limit: int = Query(1000, ge=1, le=100_000),
    ) -> DirtyResponse:
        return await dirty_set.listing(min_records, limit)

    @r.post("/dirty/rollup", response_model=DirtyResponse, summary="Roll up the dirty log now")
    async def rollup(_: Principal = Depends(access.service)) -> DirtyResponse:
        return await dirty_set.rollup()

    @r.post(
        "/dirty/purge",
        openapi_extra=body_schema(PurgeRequest),
        summary="Drop collections from the dirty set",
    )
    async def purge(request: Request, _: Principal = Depends(access.service)) -> dict[str, Any]:
        req = await read_model(request, PurgeRequest, 1 << 20)
        return await dirty_set.purge([parse_uuid(c, "collection_ids") for c in req.collection_ids])

    @r.post(
        "/dirty/adopt",
        openapi_extra=body_schema(AdoptRequest),
        response_model=AdoptResponse,
        summary="Take over the dirty set of a server that is gone",
        responses={404: {"model": ErrorResponse}},
    )
    async def adopt(request: Request, _: Principal = Depends(access.service)) -> AdoptResponse:
        req = await read_model(request, AdoptRequest, 1 << 16)
        return await dirty_set.adopt(req.server_id)

    @r.get("/dirty/inspect", summary="Decode raw dirty-log records (operators)")
    async def inspect(
        _: Principal = Depends(access.service),
        from_: int | None = Query(None, alias="from", ge=1, le=MAX_OFFSET),
        limit: int = Query(100, ge=1, le=10_000),
    ) -> dict[str, Any]:
        return await dirty_set.inspect(from_, limit)

    return r
