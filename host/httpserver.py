"""HTTP-level defences and shutdown for uvicorn: read timeouts, a connection cap, the drain hook.

uvicorn (h11) has a keep-alive timeout but nothing for a connection that never finishes its
headers or its body: a slowloris client holds a socket (and, mid-body, a request task) forever.
``guarded_h11`` closes such connections, and connections beyond ``max_connections``.

``DrainingServer`` tells the log host that shutdown began *before* uvicorn's drain (which waits
up to ``timeout_graceful_shutdown`` for requests), so leader hints of idle logs are released and
long-polls answer at once instead of at the end of the drain.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

_log = logging.getLogger("loghost.http")


class _GuardedH11(H11Protocol):
    """H11Protocol with a header deadline, a body deadline and a connection cap."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    max_connections: int = 4096

    _guard: asyncio.TimerHandle | None = None
    _guard_kind: str = ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.max_connections:
            _log.warning("closing a connection: %d open (limit %d)", len(self.connections),
                         self.max_connections)
            transport.abort()
            return
        # A connection that sends nothing is a connection whose headers never arrive.
        self._arm("header", self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._update()

    def _update(self) -> None:
        """Arm the deadline the request's phase calls for (never extended by trickling bytes)."""
        if self.transport.is_closing():
            self._disarm()
            return
        state = self.conn.their_state
        if state is h11.SEND_BODY:
            if self._guard_kind != "body":
                self._arm("body", self.body_timeout_s)
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            # Part of a request line or header block is buffered: it must complete in time.
            if self._guard_kind != "header":
                self._arm("header", self.header_timeout_s)
        elif state is h11.IDLE and self.cycle is not None and not self.cycle.response_complete:
            self._disarm()  # the app is answering; uvicorn's keep-alive timer follows
        elif state is h11.IDLE and self.timeout_keep_alive_task is not None:
            self._disarm()  # idle between requests: uvicorn's keep-alive timeout applies
        elif state is not h11.IDLE:
            self._disarm()  # request fully received (DONE) or closing

    def _arm(self, kind: str, seconds: float) -> None:
        self._disarm()
        self._guard_kind = kind
        self._guard = self.loop.call_later(seconds, self._expired, kind)

    def _disarm(self) -> None:
        if self._guard is not None:
            self._guard.cancel()
        self._guard, self._guard_kind = None, ""

    def _expired(self, kind: str) -> None:
        self._guard, self._guard_kind = None, ""
        if self.transport.is_closing():
            return
        _log.info("closing a connection whose request %s did not arrive in time", kind)
        # The request task, if any, sees http.disconnect (a 499 in the request log).
        self.transport.close()


def guarded_h11(header_timeout_s: float, body_timeout_s: float,
                max_connections: int) -> type[H11Protocol]:
    """An h11 protocol class with these limits (uvicorn's ``http=`` option)."""
    return type("GuardedH11Protocol", (_GuardedH11,), {
        "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s,
        "max_connections": max_connections})


DrainHook = Callable[[], Awaitable[None]]


class DrainingServer(uvicorn.Server):
    """uvicorn that runs ``on_drain`` as shutdown begins, beside uvicorn's own drain."""

    def __init__(self, config: uvicorn.Config, on_drain: DrainHook | None = None) -> None:
        super().__init__(config)
        self._on_drain = on_drain
        self._drain_task: asyncio.Task[None] | None = None

    async def shutdown(self, sockets: Any = None) -> None:
        if self._on_drain is not None and self._drain_task is None:
            self._drain_task = asyncio.create_task(self._run_drain(), name="drain")
        try:
            await super().shutdown(sockets)
        finally:
            if self._drain_task is not None:
                await self._drain_task

    async def _run_drain(self) -> None:
        assert self._on_drain is not None
        try:
            await self._on_drain()
        except Exception:  # noqa: BLE001 - the lifespan shutdown still flushes everything
            _log.exception("draining failed")
