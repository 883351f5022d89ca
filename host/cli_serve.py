"""How ``loghost serve`` starts: the port first, then the store, in the background.

1. The listen address is bound before anything touches the store: a port in use is one line and
   exit code 7, not a store opened, a dirty log fenced and then a bind error.
2. The HTTP server starts serving at once.  Until the host has started, ``/healthz`` answers 200
   (``"status": "starting"``) and everything else 503 ``unavailable`` (``/readyz`` included): an
   unreachable store leaves the pod up and unready, retried with backoff and logged as one line,
   instead of a traceback and a crash loop.
3. Once the store answers, the ``Server`` starts: it joins the membership first
   (``host.membership``: a live host with the same id on the same store makes this one stop with
   exit code 8), then opens its dirty log and starts the leader hint, roll-ups and GC; requests
   go to the app.

A failure that waiting cannot mend (the id in use, a bucket that does not exist, a bug) stops the
server: one ``loghost: error:`` line on stderr and the exit code of its kind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import sys
from collections.abc import Callable
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import Receive, Scope, Send

from wal3 import ObjectNotFound

from .cli_errors import CliError, ExitCode, classify
from .errors import Unavailable, error_response
from .heap import freeze_start_up_objects, space_full_collections
from .server import Server

_log = logging.getLogger("loghost.serve")

READINESS_KEY = "readyz-probe"  # what /readyz heads too (absent: a 404 proves the store answers)
MAX_BACKOFF_S = 5.0


def bind_listen(listen: str, host: str, port: int) -> socket.socket:
    """A socket bound to ``host:port`` for uvicorn; CliError(ADDRESS_IN_USE) when it cannot be."""
    try:
        infos = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )
    except socket.gaierror as e:
        raise CliError(
            ExitCode.ADDRESS_IN_USE, f"cannot listen on {listen}: {e.strerror}"
        ) from None
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        # As uvicorn does: a port left in TIME_WAIT by a previous run can be bound again (one
        # with a listener on it cannot).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as e:
        sock.close()
        why = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise CliError(ExitCode.ADDRESS_IN_USE, f"cannot listen on {listen}: {why}") from None
    sock.set_inheritable(True)
    return sock


class StartingApp:
    """The ASGI app ``serve`` runs: the host's app once started, a starting stub until then.

    It owns the lifespan (the wrapped app's is not run): startup returns at once and starts the
    host in a background task; shutdown stops that task or closes the started host.
    """

    def __init__(
        self,
        app: Any,
        server: Server,
        *,
        on_fatal: Callable[[CliError], None],
    ) -> None:
        self.app = app
        self.server = server
        self.on_fatal = on_fatal
        self.started = False
        self.reason = "starting"
        self._task: asyncio.Task[None] | None = None
        self._gc_pauses = server.metrics.python_gc_pause

    @property
    def state(self) -> Any:
        """The wrapped app's state (``uvicorn_config`` records the connection table there)."""
        return self.app.state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        elif self.started:
            await self.app(scope, receive, send)
        elif scope["type"] == "http":
            if scope["path"] == "/healthz":
                response: JSONResponse = JSONResponse(
                    {"status": "starting", "server_id": self.server.settings.server_id}
                )
            else:
                response = error_response(Unavailable(self.reason))
            await response(scope, receive, send)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._task = asyncio.create_task(self._run(), name="loghost-start")
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self._shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def begin_drain(self) -> None:
        """uvicorn's drain hook: only a started host has anything to drain."""
        if self.started:
            await self.server.begin_drain()

    async def _shutdown(self) -> None:
        self._gc_pauses.remove()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.started:
            await self.server.close()  # marks the liveness record draining; closes the store
        else:
            await self.server.store.close()

    async def _run(self) -> None:
        try:
            await self._wait_for_store()
            self.reason = "starting the host"
            await self.server.start()  # refuses a server id a live host beats under
            self._gc_pauses.install()
            frozen = freeze_start_up_objects()
            thresholds = space_full_collections(self.server.settings.python_gc_full_threshold)
            self.started = True
            _log.info("ready", extra={"gc_frozen_objects": frozen, "gc_thresholds": thresholds})
        except asyncio.CancelledError:
            raise
        except Exception as e:
            err = classify(e, self.server.settings.store)
            if err is None:
                _log.error("could not start: %r", e, exc_info=True)
                err = CliError(ExitCode.INTERNAL, f"could not start: {type(e).__name__}: {e}")
            self.on_fatal(err)

    async def _wait_for_store(self) -> None:
        delay = 0.5
        logged = False
        while True:
            try:
                await self.server.store.head(READINESS_KEY)
                break
            except ObjectNotFound:
                break
            except Exception as e:
                err = classify(e, self.server.settings.store)
                if err is None or err.code != ExitCode.STORE_UNAVAILABLE:
                    raise
                self.reason = "store unreachable"
                if not logged:
                    _log.warning(
                        "%s; not ready (/readyz answers 503) until it answers, retrying",
                        err.message,
                    )
                    logged = True
            await asyncio.sleep(delay)  # retry backoff
            delay = min(MAX_BACKOFF_S, delay * 2)
        if logged:
            _log.info("store %s reachable", self.server.settings.store)


def report(err: CliError) -> None:
    """The one line a failure is."""
    print(f"loghost: error: {err.message}", file=sys.stderr, flush=True)
