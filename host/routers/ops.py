"""Operations: ``/healthz``, ``/readyz``, ``/metrics`` (public), and the OpenAPI document the
app serves at ``/openapi.json`` (bearer auth and the key each ``/v1`` route needs stated)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.responses import JSONResponse, Response

from wal3 import ObjectNotFound, ObjectStore, StoreUnavailable

from ..auth import Principal
from ..errors import Unavailable, error_response
from ..manager import LogManager
from ..metrics import Metrics
from ..models import (
    AdoptRequest,
    AppendRequest,
    CompactionRequest,
    CursorPut,
    ErrorResponse,
    ForkRequest,
    PurgeRequest,
)
from .deps import Access

_log = logging.getLogger("loghost.api")

# The bodies routes parse themselves (``host.requests.body_schema`` refers to these schemas).
_BODIES = (AppendRequest, CursorPut, CompactionRequest, ForkRequest, PurgeRequest, AdoptRequest)


def router(
    store: ObjectStore, manager: LogManager, host_metrics: Metrics, server_id: str, access: Access
) -> APIRouter:
    """The operations routes."""
    r = APIRouter()
    # Per-tenant series name tenants: never on the public /metrics (tests/host/test_security.py),
    # only to the service key (Prometheus scrapes with it as a bearer token).
    tenant_registry = CollectorRegistry(auto_describe=False)
    tenant_registry.register(host_metrics.tenants)

    @r.get("/healthz", summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "server_id": server_id}

    @r.get("/readyz", summary="The store is reachable", responses={503: {"model": ErrorResponse}})
    async def readyz() -> Response:
        try:
            await store.head("readyz-probe")
        except ObjectNotFound:
            pass
        except (StoreUnavailable, OSError) as e:
            # The details go to the log, not to unauthenticated callers.
            _log.warning("readiness probe: store unreachable: %r", e)
            return error_response(Unavailable("store unreachable"))
        return JSONResponse({"status": "ready", "server_id": server_id})

    @r.get("/metrics", summary="Prometheus metrics", include_in_schema=False)
    async def metrics() -> Response:
        host_metrics.open_logs.set(manager.open_count)
        return Response(generate_latest(host_metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @r.get("/metrics/tenants", summary="Per-tenant metrics (service key)", include_in_schema=False)
    async def tenant_metrics(_: Principal = Depends(access.service)) -> Response:
        return Response(generate_latest(tenant_registry), media_type=CONTENT_TYPE_LATEST)

    return r


def _required_keys(
    routers: Sequence[APIRouter], needs: Mapping[Callable[..., Any], str]
) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for router in routers:
        for route in router.routes:
            if not isinstance(route, APIRoute):
                continue
            for dep in route.dependant.dependencies:
                need = needs.get(dep.call) if dep.call is not None else None
                if need is not None:
                    for method in route.methods or ():
                        out[(method, route.path)] = need
    return out


def install_openapi(
    app: FastAPI, routers: Sequence[APIRouter], needs: Mapping[Callable[..., Any], str]
) -> None:
    """Serve the OpenAPI document with the bearer scheme, the key each of ``routers``' routes
    needs (``needs``: the key each auth dependency asks for) and the schemas of parsed bodies."""

    def openapi() -> dict[str, Any]:
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
        required = _required_keys(routers, needs)
        for path, ops in schema.get("paths", {}).items():
            if path.startswith("/v1/"):
                for method, op in ops.items():
                    op["security"] = [{"bearer": []}]
                    need = required.get((method.upper(), path))
                    if need:
                        op["x-required-key"] = need
                        op["description"] = (
                            op.get("description", "") + f"\n\nNeeds {need}."
                        ).strip()
        comps = components.setdefault("schemas", {})
        for model in _BODIES:
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(js.pop("$defs", {}))
            comps[model.__name__] = js
        app.openapi_schema = schema
        return schema

    # FastAPI's documented way to customise the document: replace the method on the instance
    # (mypy refuses assigning to a method).
    app.openapi = openapi  # type: ignore[method-assign]
