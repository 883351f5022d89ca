"""The REST API: a FastAPI app over one ``Server``, and how it runs under uvicorn.

``create_app`` only assembles: the routers (``host.routers``, one module per resource, each
handler calling a service the server built), the request-context middleware, the exception
handlers (``host.errors``), the docs pages, the OpenAPI document and the lifespan.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI

from .config import Settings
from .docs import install_docs
from .errors import install_handlers
from .httpserver import guarded_protocol
from .middleware import RequestContext
from .routers import cursors, dirty, lifecycle, ops, records
from .routers.deps import Access
from .server import Server


def uvicorn_config(app: Any, settings: Settings, **overrides: Any) -> uvicorn.Config:
    """How the log host runs under uvicorn: ``loghost serve``, the tests and the benchmarks."""
    host, port = settings.host_port
    http = guarded_protocol(
        settings.header_timeout_s,
        settings.body_timeout_s,
        settings.max_connections,
        settings.max_unauthenticated_connections,
        settings.send_timeout_s,
        settings.http_parser,
    )
    state = getattr(app, "state", None)
    if state is not None:
        state.connections = http.table  # what the cap sees
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
    app.add_middleware(RequestContext, metrics=server.metrics)

    access = Access(server.auth)
    v1 = [
        records.router(server.records, access, server.settings),
        cursors.router(server.cursors, access),
        lifecycle.router(server.lifecycle, access),
        dirty.router(server.dirty_service, access),
    ]
    # Ahead of every other route: it takes each POST to its path (host.routers.records).
    app.router.routes.insert(0, records.append_route(server.records, access, server.settings))
    for router in v1:
        app.include_router(router)
    app.include_router(
        ops.router(server.store, server.manager, server.metrics, server.settings.server_id, access)
    )
    ops.install_openapi(app, v1, access.needs)
    return app
