"""Second adversarial review of the hold after a quota refusal (4d6a06d, issue 19): the hold
defers uvicorn's completion of the refused request (keep-alive, flow control, the start of a
pipelined request) until it ends, and one refusal is exempt after a request authorized for
another tenant (``ConnectionTicket.note_tenant``).  Each test below named "failed" failed on
4d6a06d and passes since the fix:

* ``test_a_shutdown_closes_a_held_connection_and_starts_nothing_queued`` (failed, httptools): a
  graceful shutdown that began during a hold served the refused requests queued behind it one
  hold apart (k queued refusals added k-1 s to the drain, up to ``shutdown_grace_s``), and once
  the drain gave up, the hold's timer still started the next one against a closing host.
* ``test_an_authorized_request_that_does_no_work_grants_no_exemption`` (failed): a request
  authorized for another tenant and then refused 400 (a malformed collection id) exempted the
  next refusal, as a real request would.
* ``test_a_refusal_whose_hold_a_shutdown_cuts_is_counted`` (failed, both parsers): uvicorn counts
  a request in the completion the hold defers, so a connection closed during the hold never
  counted the refused request (``server_state.total_requests``).
* ``test_a_deep_pipeline_closes_the_connection`` (failed, httptools; not new: plain uvicorn
  resumes reading whenever a queued request starts, so the parsed queue grew with what the
  client wrote, about 25,000 requests and 58 MB in 4 s): past ``MAX_PIPELINED`` queued requests
  the connection closes.

Passing then too (what else was tried): the order and count of a mix pipelined behind a hold,
a client hanging up during a hold, the deadlines after a hold with a half-received request
(both parsers), refused-only pipelined floods.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path
from typing import Any

import pytest

from host.httpserver import MAX_PIPELINED

from .live import KEYS, log_path, wait_until
from .test_hold_adversary import _burn_burst, _held, _raw_get
from .test_tenant_flood import _answer, _raw_append, count_throttles, flood_host

EXTRA_KEYS = KEYS + ",alice-ro=alice:read,bob-ro=bob:read"


def _port(lv: Any) -> int:
    return int(lv.url.rsplit(":", 1)[1])


def _conn(table: Any) -> Any:
    (conn,) = table.connections
    return conn


# --------------------------------------------------------------------- 2. a client that keeps sending


async def test_a_deep_pipeline_closes_the_connection(
    tmp_path: Path, recorded_apps: list[Any]
) -> None:
    """A refused append, then more requests pipelined in the same write than a client that
    pipelines keeps in flight: the server closes the connection instead of parsing them all
    into its queue (uvicorn resumes reading whenever a queued request starts, so the queue
    would grow with whatever the client keeps writing)."""
    async with flood_host(tmp_path, http_parser="httptools") as (lv, _clock):
        port = _port(lv)
        path = log_path("alice", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, path)
            n = MAX_PIPELINED + 20
            writer.write(
                _raw_append(port, "alice-key", path, "refused")
                + b"".join(_raw_get(port, "/healthz", None) for _ in range(n))
            )
            answered = 0
            with contextlib.suppress(asyncio.IncompleteReadError, ValueError, IndexError):
                while True:
                    await _answer(reader)
                    answered += 1
            assert reader.at_eof()
            assert answered <= MAX_PIPELINED + 1 < n + 1
        finally:
            writer.transport.abort()


# ------------------------------------------------------------------------- 1. shutdown during a hold


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_shutdown_closes_a_held_connection_and_starts_nothing_queued(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """k refused appends pipelined in one write; a graceful shutdown begins while the first
    refusal's hold is on.  The connection closes then, and none of the queued requests starts
    (each would have waited a hold, or started after the drain gave up)."""
    k = 5
    stack = contextlib.AsyncExitStack()
    lv, _clock = await stack.enter_async_context(flood_host(tmp_path, http_parser=parser))
    table = recorded_apps[-1].state.connections
    port = _port(lv)
    path = log_path("alice", uuid.uuid4()) + "/records"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await _burn_burst(writer, reader, port, path)
        conn = _conn(table)
        throttles = count_throttles(lv.server.quotas)
        writer.write(b"".join(_raw_append(port, "alice-key", path, f"p{i}") for i in range(k)))
        assert (await _answer(reader))[0] == 429
        assert _held(table)
        await asyncio.wait_for(stack.aclose(), 60)
        assert await reader.read() == b""  # closed, nothing more answered
        assert throttles == {"alice": ["appends_per_s"]}  # no queued request started
        assert not conn.server_state.tasks
    finally:
        writer.transport.abort()
        await stack.aclose()


# --------------------------------------------------------------------------- 4. the exemption


async def test_an_authorized_request_that_does_no_work_grants_no_exemption(
    tmp_path: Path, recorded_apps: list[Any]
) -> None:
    """bob's read-only key on a malformed collection id of bob: authorized, then 400 before any
    work (nothing read, nothing charged).  Alternated with alice's refusals, none is held."""
    async with flood_host(tmp_path, api_keys=EXTRA_KEYS) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = _port(lv)
        a_log = log_path("alice", uuid.uuid4())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, a_log + "/records")
            throttles = count_throttles(lv.server.quotas)
            unheld = 0
            for i in range(3):
                writer.write(
                    _raw_get(
                        port, "/v1/tenants/bob/logs/not-a-uuid", "Authorization: Bearer bob-ro\r\n"
                    )
                )
                assert (await _answer(reader))[0] == 400
                writer.write(_raw_append(port, "alice-key", a_log + "/records", f"r{i}"))
                assert (await _answer(reader))[0] == 429
                if not _held(table):
                    unheld += 1
                else:
                    await wait_until(lambda: not _held(table), "the hold over")
            assert "bob" not in throttles
            assert unheld == 0, f"{unheld} of 3 refusals unheld, each bought by a 400 of bob's"
        finally:
            writer.close()


# ------------------------------------------------------------------- 3. deadlines after the hold


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_deadlines_after_a_hold_with_a_half_received_request(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    async with flood_host(tmp_path, http_parser=parser) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = _port(lv)
        path = log_path("alice", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, path)
            conn = _conn(table)
            nxt = _raw_get(port, "/healthz", None)
            writer.write(_raw_append(port, "alice-key", path, "refused") + nxt[:10])
            assert (await _answer(reader))[0] == 429
            assert _held(table)
            await wait_until(lambda: not _held(table), "the hold over")
            await wait_until(lambda: conn._guard_kind == "header", "the header deadline armed")
            writer.write(nxt[10:])
            assert (await _answer(reader))[0] == 200
            await wait_until(
                lambda: conn._guard_kind == "" and conn.timeout_keep_alive_task is not None,
                "idle: no deadline but keep-alive's",
            )
        finally:
            writer.close()


# ------------------------------------------------------------------- 1. lifecycle, order, counts


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_pipelined_requests_behind_a_hold_answer_in_order(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """Passes: a mix pipelined behind a held refusal is answered once each, in order, and
    nothing behind the hold starts before it ends."""
    async with flood_host(tmp_path, http_parser=parser) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = _port(lv)
        a_path = log_path("alice", uuid.uuid4()) + "/records"
        b_path = log_path("bob", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, a_path)
            throttles = count_throttles(lv.server.quotas)
            writer.write(
                _raw_append(port, "alice-key", a_path, "r1")
                + _raw_get(port, "/healthz", None)
                + _raw_append(port, "bob-key", b_path, "b1")
                + _raw_append(port, "alice-key", a_path, "r2")  # after bob's: exempt
                + _raw_get(port, "/healthz", None)
            )
            got = [(await _answer(reader))[0]]
            assert _held(table)  # the rest wait for the hold
            assert throttles == {"alice": ["appends_per_s"]}
            got += [(await _answer(reader))[0] for _ in range(4)]
            assert got == [429, 200, 200, 429, 200]
            assert not _held(table)
            assert throttles == {"alice": ["appends_per_s", "appends_per_s"]}
            async with lv.client("bob-key") as bob:
                r = await bob.get(log_path("bob", b_path.split("/")[-2]) + "/records")
                assert [x["record"]["id"] for x in r.json()["records"]] == ["b1-0"]
        finally:
            writer.close()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_client_closing_during_a_hold_leaves_nothing_behind(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """Passes: the client hangs up during the hold with refused retries queued; the server
    notices when the hold ends (it does not read while held), the connection goes, no task is
    left, and at most one queued request runs after the client left (httptools)."""
    async with flood_host(tmp_path, http_parser=parser) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = _port(lv)
        path = log_path("alice", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        await _burn_burst(writer, reader, port, path)
        conn = _conn(table)
        throttles = count_throttles(lv.server.quotas)
        writer.write(b"".join(_raw_append(port, "alice-key", path, f"p{i}") for i in range(4)))
        assert (await _answer(reader))[0] == 429
        assert _held(table)
        writer.close()
        await wait_until(lambda: not table.connections, "the connection gone")
        await wait_until(lambda: not conn.server_state.tasks, "no task left")
        assert len(throttles["alice"]) <= 2, throttles
        assert conn._hold is None and conn._guard is None and conn._send_guard is None


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_a_refusal_whose_hold_a_shutdown_cuts_is_counted(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """uvicorn counts a request (``server_state.total_requests``, what ``limit_max_requests``
    reads) in the completion the hold defers; a connection closed during the hold (here by a
    graceful shutdown) cancels it, so the refused request, answered, is never counted."""
    stack = contextlib.AsyncExitStack()
    lv, _clock = await stack.enter_async_context(flood_host(tmp_path, http_parser=parser))
    table = recorded_apps[-1].state.connections
    port = _port(lv)
    path = log_path("alice", uuid.uuid4()) + "/records"
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await _burn_burst(writer, reader, port, path)
        conn = _conn(table)
        before = conn.server_state.total_requests
        writer.write(_raw_append(port, "alice-key", path, "refused"))
        assert (await _answer(reader))[0] == 429
        assert _held(table)
        await asyncio.wait_for(stack.aclose(), 30)
        assert conn.server_state.total_requests == before + 1
    finally:
        writer.transport.abort()
        await stack.aclose()
