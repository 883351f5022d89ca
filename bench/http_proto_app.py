"""Bench-only FastAPI apps for the dependency-chain prototype in ``bench.http_profile``.

No ``from __future__ import annotations`` here: FastAPI reads these annotations at runtime.
``chained`` mirrors host/api.py's tenant routes (HTTPBearer -> principal -> tenant_scope as
``Depends``); ``flat`` does the same checks in one plain call inside the handler; ``bare`` does
none.  All three answer ``{}`` without reading the body.
"""

import uuid

from fastapi import Depends, FastAPI, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.responses import Response

from host import jsonlog
from host.auth import Authenticator, Principal

API_KEY = "benchkey"
PATH = "/v1/tenants/{tenant}/logs/{collection_id}/records"
auth = Authenticator({API_KEY: "*"})
bearer = HTTPBearer(auto_error=False)


async def principal(
    request: Request, _: HTTPAuthorizationCredentials | None = Depends(bearer)
) -> Principal:
    values = request.headers.getlist("authorization")
    return auth.authenticate(values[0] if values else None)


async def tenant_scope(
    tenant: str, collection_id: str, who: Principal = Depends(principal)
) -> tuple[str, uuid.UUID]:
    auth.authorize_tenant(who, tenant)
    cid = uuid.UUID(collection_id)
    jsonlog.tenant.set(tenant)
    jsonlog.collection_id.set(str(cid))
    return tenant, cid


def flat_scope(request: Request, tenant: str, collection_id: str) -> tuple[str, uuid.UUID]:
    values = request.headers.getlist("authorization")
    who = auth.authenticate(values[0] if values else None)
    auth.authorize_tenant(who, tenant)
    cid = uuid.UUID(collection_id)
    jsonlog.tenant.set(tenant)
    jsonlog.collection_id.set(str(cid))
    return tenant, cid


chained = FastAPI()
flat = FastAPI()
bare = FastAPI()


@chained.post(PATH)
async def chained_append(
    request: Request, scope: tuple[str, uuid.UUID] = Depends(tenant_scope)
) -> Response:
    return Response(b"{}", media_type="application/json")


@flat.post(PATH)
async def flat_append(tenant: str, collection_id: str, request: Request) -> Response:
    flat_scope(request, tenant, collection_id)
    return Response(b"{}", media_type="application/json")


@bare.post(PATH)
async def bare_append(tenant: str, collection_id: str, request: Request) -> Response:
    return Response(b"{}", media_type="application/json")
