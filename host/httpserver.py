"""HTTP-level defences and shutdown for uvicorn: timeouts, a connection cap, the drain hook.

uvicorn has a keep-alive timeout but nothing for a connection that never finishes its headers
or its body: a slowloris client holds a socket (and, mid-body, a request task) forever.  Nor for
one that never reads its answer: the answer waits in memory for as long as the connection lives.
``guarded_protocol`` closes such connections (``send_timeout_s`` counts from the moment the socket
stops taking the answer until all of it is taken), and connections beyond ``max_connections``.
It guards uvicorn's httptools protocol (the default: parsing a request costs a fraction of h11's,
docs/PERFORMANCE.md §7) or its h11 protocol (``LOGHOST_HTTP_PARSER=h11``), with the same rules.

The cap must not let strangers shut tenants out.  A connection is *unauthenticated* until one of
its requests carries a valid key (the app says so through the ``loghost.connection`` entry of
the ASGI scope's extensions).  Unauthenticated connections have their own cap
(``max_unauthenticated``), and whenever either cap is exceeded the oldest unauthenticated
connection is closed to make room (idle ones first), never an authenticated one: a newcomer is
refused only when every other connection is authenticated.  So connections that never show a
key cannot keep a tenant's new connection out, nor close its kept-alive ones.

``DrainingServer`` tells the log host that shutdown began *before* uvicorn's drain (which waits
up to ``timeout_graceful_shutdown`` for requests), so leader hints of idle logs are released and
long-polls answer at once instead of at the end of the drain.
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import h11
import uvicorn
from starlette.types import Scope
from uvicorn.protocols.http.h11_impl import H11Protocol

from .errors import BadRequest

HttpParser = Literal["httptools", "h11"]

_log = logging.getLogger("loghost.http")


SCOPE_EXTENSION = "loghost.connection"


# The longest a connection is not read after its tenant was told to retry later (below every
# keep-alive timeout, so a client's next request waiting in the socket is never dropped).
MAX_HOLD_S = 1.0

# Requests parsed and queued behind the one being answered (HTTP/1.1 pipelining, httptools):
# uvicorn resumes reading whenever a queued request starts, so a client that keeps writing could
# queue a socket read of requests per answer, without bound.  Past this the connection closes;
# clients that pipeline at all keep a few requests in flight.
MAX_PIPELINED = 16


class ConnectionTicket:
    """What the app knows of its request's connection: it marks it authenticated, notes the
    tenant each request acts for, and it may ask that the connection's next request not be
    read for a while (``hold``)."""

    __slots__ = ("_conn", "_table", "authenticated", "hold_s", "interleaved", "tenant")

    def __init__(self, table: ConnectionTable, conn: _Guard) -> None:
        self._table = table
        self._conn = conn
        self.authenticated = False
        self.hold_s = 0.0
        self.tenant: str | None = None  # the tenant the last authorized request acted for
        # A request acting for another tenant came since the last refusal (a proxy's pooled
        # connection): the next refusal is not held, so it cannot stall that tenant's requests.
        self.interleaved = False

    def hold(self, seconds: float) -> None:
        """This request's tenant was refused by its own quota and told to retry in
        ``seconds``: once the answer is sent, the connection is not read for that long (at
        most ``MAX_HOLD_S``), and no request already read behind it (pipelined) starts.  A
        client that honours Retry-After never notices; one that retries at once cannot make the
        server parse (and refuse) request after request on this connection meanwhile: a flood
        over a quota costs the event loop one refusal per connection and hold, not one per
        request the flooder can send (issue 19).

        On a connection shared by tenants, a refusal that follows a request of another tenant
        is not held, and that exemption is used up by it: each unheld refusal costs a
        well-formed request authorized for some other tenant (a key of that tenant, or a
        service key), so sharing cannot make refusals free.  A request of a second tenant
        queued behind a held refusal still waits that hold out: which tenant it is for is known
        only once it is read."""
        if self.interleaved:
            self.interleaved = False
            return
        self.hold_s = max(self.hold_s, min(seconds, MAX_HOLD_S))

    def mark_authenticated(self) -> None:
        """A request on this connection carried a valid key: it no longer gives way to others."""
        if not self.authenticated:
            self.authenticated = True
            self._table.unauthenticated.pop(self._conn, None)

    def note_tenant(self, tenant: str) -> None:
        """The request was authorized to act for ``tenant`` (the tenant its quotas are charged
        to, whatever key it carried: a service key acts for the tenant of its path)."""
        if self.tenant is not None and tenant != self.tenant:
            self.interleaved = True
        self.tenant = tenant


def connection_ticket(scope: Scope) -> ConnectionTicket | None:
    """The ticket of a request's connection (None when not served by ``guarded_protocol``)."""
    ticket = scope.get("extensions", {}).get(SCOPE_EXTENSION)
    return ticket if isinstance(ticket, ConnectionTicket) else None


class ConnectionTable:
    """One server's connections that have not authenticated yet, oldest first."""

    def __init__(self, max_connections: int, max_unauthenticated: int) -> None:
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.unauthenticated: collections.OrderedDict[_Guard, None] = collections.OrderedDict()
        # Aborted by the cap but not yet gone (connection_lost runs on a later loop turn): not
        # counted, or one burst of newcomers would evict more than it needs to.
        self.closing: set[_Guard] = set()
        self.evicted = 0  # connections closed to make room (for tests and logs)
        self.connections: set[_Guard] = set()  # every open one

    def victim(self, newcomer: _Guard) -> _Guard | None:
        """The connection to close for room: the oldest idle unauthenticated one, else the
        oldest unauthenticated one; never ``newcomer`` (refused only if nothing else gives)."""
        busy: _Guard | None = None
        for conn in self.unauthenticated:
            if conn is newcomer:
                continue
            if conn.idle:
                return conn
            if busy is None:
                busy = conn
        return busy


def _parser_refusal() -> bytes:
    err = BadRequest("not a valid HTTP/1.1 request")
    body = json.dumps(
        {"error": {"code": err.code, "message": err.message}}, separators=(",", ":")
    ).encode()
    head = (
        f"HTTP/1.1 {err.status} Bad Request\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode() + body


_PARSER_REFUSAL = _parser_refusal()


class _Guard:
    """Header, body and send deadlines and a connection cap, over one of uvicorn's HTTP/1.1
    protocols (mixed in before it: ``super()`` is the protocol).  The protocol subclasses below
    say when a request's headers begin, when its body is due and when it has all arrived."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0
    send_timeout_s: float = 60.0
    table: ConnectionTable

    # What uvicorn's protocols provide.  mypy cannot see that ``super()`` of a mixin is the
    # protocol, so each ``super().x()`` below carries ``type: ignore[misc]``.
    transport: asyncio.Transport
    server_state: Any
    loop: asyncio.AbstractEventLoop
    app: Any
    cycle: Any
    flow: Any
    connections: set[Any]
    timeout_keep_alive_task: asyncio.TimerHandle | None

    _guard: asyncio.TimerHandle | None = None
    _guard_kind: str = ""
    # While set, reading is paused after a quota refusal (ConnectionTicket.hold).
    _hold: asyncio.TimerHandle | None = None
    _ticket: ConnectionTicket | None = None
    # Armed when the socket first stops taking an answer (the transport's buffer is full), until
    # the answer is complete and taken: a client that does not read cannot hold it for ever.
    _send_guard: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        table = self.table
        self._ticket = ConnectionTicket(table, self)
        inner = self.app

        async def app(scope: Any, receive: Any, send: Any) -> None:
            scope.setdefault("extensions", {})[SCOPE_EXTENSION] = self._ticket
            await inner(scope, receive, send)

        self.app = app
        table.connections.add(self)
        table.unauthenticated[self] = None
        while (
            len(self.connections) - len(table.closing) > table.max_connections
            or len(table.unauthenticated) > table.max_unauthenticated
        ):
            victim = table.victim(self)
            if victim is None:
                _log.warning(
                    "refusing a connection: %d open, all authenticated (limit %d)",
                    len(self.connections),
                    table.max_connections,
                )
                self._evict(self)
                return
            self._evict(victim)
        # A connection that sends nothing is a connection whose headers never arrive.
        self._arm("header", self.header_timeout_s)

    def _evict(self, conn: _Guard) -> None:
        table = self.table
        table.unauthenticated.pop(conn, None)
        if conn is not self:
            table.evicted += 1
            _log.info("closing an unauthenticated connection to make room")
        table.closing.add(conn)
        conn._disarm()
        conn.transport.abort()

    @property
    def idle(self) -> bool:
        """Not in the middle of answering a request (waiting for one, or between them)."""
        return self.cycle is None or self.cycle.response_complete

    def pause_writing(self) -> None:
        super().pause_writing()  # type: ignore[misc]
        if self._send_guard is None:
            self._send_guard = self.loop.call_later(self.send_timeout_s, self._send_expired)

    def resume_writing(self) -> None:
        super().resume_writing()  # type: ignore[misc]
        if self.idle:
            self._disarm_send()  # the whole answer was written and the client took it

    def _disarm_send(self) -> None:
        if self._send_guard is not None:
            self._send_guard.cancel()
            self._send_guard = None

    def _send_expired(self) -> None:
        self._send_guard = None
        if self.transport.is_closing():
            return
        _log.info(
            "closing a connection that did not take its answer within %.0f s", self.send_timeout_s
        )
        # abort, not close: close would keep the unsent answer until it drains, i.e. for ever.
        # The request task sees http.disconnect (a streamed answer stops).
        self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_send()
        self._cancel_hold()
        self.table.unauthenticated.pop(self, None)
        self.table.closing.discard(self)
        self.table.connections.discard(self)
        super().connection_lost(exc)  # type: ignore[misc]

    def on_response_complete(self) -> None:
        if not self.flow.write_paused:
            self._disarm_send()
        ticket = self._ticket
        seconds = 0.0
        if ticket is not None:
            seconds, ticket.hold_s = ticket.hold_s, 0.0
        if seconds > 0 and not self.transport.is_closing() and self._hold is None:
            # uvicorn's own completion (keep-alive, flow control, and the start of a request
            # pipelined behind this one, already read into its buffer) waits for the hold's
            # end: pausing the transport alone would leave those requests to run.
            self.transport.pause_reading()
            self._hold = self.loop.call_later(seconds, self._end_hold)
            return
        self._response_done()

    def _response_done(self) -> None:
        """uvicorn's completion of an answered request."""
        super().on_response_complete()  # type: ignore[misc]

    def _cancel_hold(self) -> None:
        """The connection ends during a hold: the queued requests behind it never start, and the
        refused request, answered, is counted as uvicorn counts it on completion."""
        if self._hold is not None:
            self._hold.cancel()
            self._hold = None
            self.server_state.total_requests += 1

    def shutdown(self) -> None:
        """A graceful shutdown closes a held connection at once, as uvicorn closes an idle one:
        its answer was sent, and the requests queued behind the hold would otherwise run one
        hold apart, each delaying the drain, or start after it gave up (against a closing
        host)."""
        if self._hold is not None:
            self._cancel_hold()
            self.transport.close()
            return
        super().shutdown()  # type: ignore[misc]

    @property
    def held(self) -> bool:
        """Not read now because of a quota refusal (``ConnectionTicket.hold``)."""
        return self._hold is not None

    def _end_hold(self) -> None:
        self._hold = None
        if self.transport.is_closing():
            return
        self._response_done()  # may start a pipelined request
        # uvicorn pauses reading only while it holds an unread body, never while held: so
        # nothing else wants the transport paused now.
        if not self.transport.is_closing() and not self.flow.read_paused:
            self.transport.resume_reading()

    def send_400_response(self, msg: str) -> None:
        """A request the parser refused (a malformed request line, header or length): the
        API's JSON error body instead of uvicorn's plain text, then the connection closes."""
        self.transport.write(_PARSER_REFUSAL)
        self.transport.close()

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


class _GuardedH11(_Guard, H11Protocol):  # type: ignore[misc]  # uvicorn narrows Transport
    """The guard over h11: the phase is read off h11's connection state after every event."""

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._update()

    def _response_done(self) -> None:
        super()._response_done()
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


def _httptools_protocol() -> type[_Guard]:
    """The guard over httptools: the parser's callbacks mark the phases (imported on use: the
    h11 variant needs no httptools)."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class _GuardedHttpTools(_Guard, HttpToolsProtocol):  # type: ignore[misc]  # as above
        def on_message_begin(self) -> None:
            super().on_message_begin()
            # The first byte of a request line: its headers must all arrive in time (a request
            # pipelined behind an answer included), however slowly they trickle.
            if self._guard_kind != "header":
                self._arm("header", self.header_timeout_s)

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._arm("body", self.body_timeout_s)  # disarmed when the message completes
            if len(self.pipeline) > MAX_PIPELINED and not self.transport.is_closing():
                _log.warning("closing a connection with over %d requests pipelined", MAX_PIPELINED)
                self._disarm()
                self.transport.close()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._disarm()  # the app is answering; uvicorn's keep-alive timer follows

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            if self.transport.is_closing():
                self._disarm()

    return _GuardedHttpTools


def guarded_protocol(
    header_timeout_s: float,
    body_timeout_s: float,
    max_connections: int,
    max_unauthenticated: int | None = None,
    send_timeout_s: float = 60.0,
    parser: HttpParser = "httptools",
) -> type[_Guard]:
    """An HTTP/1.1 protocol class with these limits (uvicorn's ``http=`` option); each call makes
    a class with its own connection table (one per server)."""
    table = ConnectionTable(
        max_connections,
        min(max_connections, max_unauthenticated)
        if max_unauthenticated is not None
        else max_connections,
    )
    base = _httptools_protocol() if parser == "httptools" else _GuardedH11
    return type(
        f"Guarded{base.__name__.removeprefix('_Guarded')}Protocol",
        (base,),
        {
            "header_timeout_s": header_timeout_s,
            "body_timeout_s": body_timeout_s,
            "send_timeout_s": send_timeout_s,
            "table": table,
        },
    )


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
        except Exception:
            _log.exception("draining failed")
