"""``/v1/tenants/{tenant}/logs/{uuid}/seal``, ``/fork``, ``/gc``, ``/scrub`` (service keys)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Request

from ..models import ForkRequest, LogState
from ..requests import body_schema, parse_uuid, read_model
from ..services.lifecycle import LifecycleService
from . import ERRORS, LOG_PATH
from .deps import Access, LogScope


def router(lifecycle: LifecycleService, access: Access) -> APIRouter:
    """The lifecycle routes."""
    r = APIRouter(prefix="/v1", responses=ERRORS)

    @r.post(LOG_PATH + "/seal", response_model=LogState, summary="Seal the log (appends then 409)")
    async def seal(scope: LogScope = Depends(access.service_scope)) -> LogState:
        return await lifecycle.seal(scope.tenant, scope.cid)

    @r.post(
        LOG_PATH + "/fork",
        response_model=LogState,
        openapi_extra=body_schema(ForkRequest),
        summary="Fork the log (default: from its compaction cursor) into a new collection",
    )
    async def fork(request: Request, scope: LogScope = Depends(access.service_scope)) -> LogState:
        req = await read_model(request, ForkRequest)
        target = parse_uuid(req.target_collection_id, "target_collection_id")
        return await lifecycle.fork(scope.tenant, scope.cid, target, req.offset)

    @r.post(LOG_PATH + "/gc", summary="Run one garbage-collection pass now")
    async def gc(scope: LogScope = Depends(access.service_scope)) -> dict[str, Any]:
        return await lifecycle.collect(scope.tenant, scope.cid)

    @r.get(LOG_PATH + "/scrub", summary="Verify the log end to end from the objects")
    async def scrub(scope: LogScope = Depends(access.service_scope)) -> dict[str, Any]:
        return await lifecycle.scrub(scope.tenant, scope.cid)

    return r
