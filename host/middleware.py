"""The request context: request id, the JSON request log line, request metrics, and the last
resort for an exception nothing else answered."""

from __future__ import annotations

import logging
import random
import time

from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from . import jsonlog
from .errors import internal_error_response
from .metrics import Metrics

_log = logging.getLogger("loghost.api")


class RequestContext:
    """Pure ASGI middleware: request id, the JSON request log line, request metrics.

    Pure ASGI (not ``BaseHTTPMiddleware``) so the handler runs in this task: context variables
    it sets (tenant, collection id) are still there when the request line is logged.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self._app = app
        self._metrics = metrics
        # Request ids need to be unique, not secret: uuid4's os.urandom is a system call per
        # request (5 % of a flooded event loop on a small VM); this generator is seeded by it once.
        self._ids = random.Random()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        rid = ""
        for k, v in scope.get("headers", ()):
            if k == b"x-request-id":
                rid = v.decode("latin-1")[:64]
                break
        rid = rid or f"{self._ids.getrandbits(64):016x}"
        jsonlog.request_id.set(rid)
        jsonlog.tenant.set(None)
        jsonlog.collection_id.set(None)
        started = time.monotonic()
        status = 500
        sent_start = False

        async def send_wrapper(message: Message) -> None:
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
                await internal_error_response()(scope, receive, send_wrapper)
        finally:
            route = route_label(scope)
            self._metrics.request_done(scope.get("method", ""), route, status)
            _log.info(
                "request",
                extra={
                    "method": scope.get("method"),
                    "route": route,
                    "status": status,
                    "ms": round((time.monotonic() - started) * 1000, 3),
                },
            )


def route_label(scope: Scope) -> str:
    """The ``route`` label of a request: the path template of the route that took it.

    FastAPI's routes (and the append's) name themselves in ``scope["route"]``.  Plain Starlette
    routes and mounts (``/openapi.json``, the docs assets under ``/docs/assets``) only leave
    their endpoint in ``scope["endpoint"]``: it is looked up among the app's routes.  A request
    no route took is ``unmatched``.
    """
    route = scope.get("route")
    if route is not None:
        return str(getattr(route, "path", "unmatched"))
    endpoint = scope.get("endpoint")
    app = scope.get("app")
    if endpoint is None or app is None:
        return "unmatched"
    for r in getattr(getattr(app, "router", None), "routes", ()):
        if isinstance(r, Route) and r.endpoint is endpoint:
            return r.path
        if isinstance(r, Mount) and r.app is endpoint:
            return r.path
    return "unmatched"
