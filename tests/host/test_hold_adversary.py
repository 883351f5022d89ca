"""Adversarial review of 3ddeb07 (a connection that carried keys of more than one tenant was
never held after a quota refusal) and of the hold itself (issue 19); each test failed on 3ddeb07
and passes since the fix.

The hold's promise (``ConnectionTicket.hold``): a client that retries a 429 at once "cannot make
the server parse (and refuse) request after request on this connection meanwhile".

* ``test_one_foreign_key_request_unholds_the_flooders_connection``: at 3ddeb07 one request with
  a valid key of another tenant (any role, a read-only key included) or a service key, even one
  refused 403 and doing no work, made the connection ``shared`` for good: the tenant's retries
  were then never held again.  Now only a request *authorized* for another tenant counts, and
  it exempts one refusal, not all later ones
  (``test_an_exemption_is_used_up_by_one_refusal``).
* ``test_what_does_not_make_a_connection_shared`` (passed then too): the tenant's own read-only
  key, an unknown key, a malformed or doubled Authorization header, no key (``/healthz``) leave
  it held.
* ``test_requests_pipelined_behind_a_refusal_are_not_held`` (failed before 3ddeb07 as well):
  requests already read when the hold started were parsed and refused during the hold, so a
  flooder that pipelined its retries was never slowed by it.  Now they start when it ends.
* ``test_a_service_key_acting_for_two_tenants_is_held_for_one``: 3ddeb07 looked at the key's
  tenant, the quota at the path's: one service-key connection acting for alice and bob was held
  for alice's refusal, which stalls bob's requests behind it.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from .live import KEYS, log_path
from .test_tenant_flood import BURST, _answer, _raw_append, count_throttles, flood_host

# Read-only keys of both tenants besides the usual ones.
EXTRA_KEYS = KEYS + ",alice-ro=alice:read,bob-ro=bob:read"


def _raw_get(port: int, path: str, auth: str | None) -> bytes:
    head = f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
    if auth is not None:
        head += auth
    return (head + "\r\n").encode()


def _held(table: Any) -> bool:
    return any(c.held for c in table.connections)


async def _burn_burst(
    writer: asyncio.StreamWriter, reader: asyncio.StreamReader, port: int, path: str
) -> None:
    for i in range(BURST):  # alice's whole burst (the quotas' clock is frozen)
        writer.write(_raw_append(port, "alice-key", path, f"ok{i}"))
        assert (await _answer(reader))[0] == 200


@pytest.mark.parametrize(
    "foreign_key",
    [
        "bob-key",  # a tenant key of another tenant
        "bob-ro",  # a read-only key of another tenant (the weakest key there is)
        "svc-key",  # a service key
    ],
)
async def test_one_foreign_key_request_unholds_the_flooders_connection(
    tmp_path: Path, recorded_apps: list[Any], foreign_key: str
) -> None:
    async with flood_host(tmp_path, api_keys=EXTRA_KEYS) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        a_log = log_path("alice", uuid.uuid4())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, a_log + "/records")
            # One request with the other key, on *alice's* log: refused 403 for bob's keys (no
            # work, nothing of bob's quota), 200 for the service key (an empty log).  Enough.
            writer.write(_raw_get(port, a_log, f"Authorization: Bearer {foreign_key}\r\n"))
            assert (await _answer(reader))[0] in (200, 403, 404)
            throttles = count_throttles(lv.server.quotas)
            for i in range(3):  # alice retries at once, Retry-After ignored
                writer.write(_raw_append(port, "alice-key", a_log + "/records", f"r{i}"))
                status, headers = await _answer(reader)
                assert status == 429 and headers["retry-after"] == "1"
                # As for a connection of alice alone: held once refused, the retry unread.
                assert _held(table), f"refusal {i + 1} of alice's flood: the connection not held"
            assert len(throttles["alice"]) == 3
        finally:
            writer.close()


@pytest.mark.parametrize(
    "auth",
    [
        "Authorization: Bearer alice-ro\r\n",  # alice's own read-only key: still alice
        "Authorization: Bearer not-a-key\r\n",  # 401 unknown key
        "Authorization: Basic Ym9iOmJvYg==\r\n",  # 401 malformed
        "Authorization: Bearer bob-key\r\nAuthorization: Bearer bob-key\r\n",  # 401 doubled
        None,  # no key at all (on /healthz)
    ],
)
async def test_what_does_not_make_a_connection_shared(
    tmp_path: Path, recorded_apps: list[Any], auth: str | None
) -> None:
    async with flood_host(tmp_path, api_keys=EXTRA_KEYS) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        a_log = log_path("alice", uuid.uuid4())
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, a_log + "/records")
            writer.write(_raw_get(port, "/healthz" if auth is None else a_log, auth))
            assert (await _answer(reader))[0] in (200, 401, 404)
            writer.write(_raw_append(port, "alice-key", a_log + "/records", "refused"))
            status, _headers = await _answer(reader)
            assert status == 429
            assert _held(table)
            ticket = next(iter(table.connections))._ticket
            assert ticket.tenant == "alice" and not ticket.interleaved
        finally:
            writer.close()


@pytest.mark.parametrize("parser", ["httptools", "h11"])
async def test_requests_pipelined_behind_a_refusal_are_not_held(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """Alice's retries sent in one write: before the fix all were parsed and refused while the
    connection was 'held', one refusal per request sent, not one per connection and hold.  Each
    now starts only when the hold before it ends (a second of real time each: few of them)."""
    async with flood_host(tmp_path, http_parser=parser) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        path = log_path("alice", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, path)
            refused_while_held: list[bool] = []
            real = lv.server.quotas.throttle

            def noting(*args: Any, **kw: Any) -> Any:
                refused_while_held.append(_held(table))
                return real(*args, **kw)

            lv.server.quotas.throttle = noting  # type: ignore[method-assign]
            n = 3
            writer.write(b"".join(_raw_append(port, "alice-key", path, f"p{i}") for i in range(n)))
            for _ in range(n):
                assert (await _answer(reader))[0] == 429
            # The first refusal starts the hold; none of the others may be made during one.
            assert refused_while_held[0] is False
            assert refused_while_held.count(True) == 0, (
                f"{refused_while_held.count(True)} of {n} refusals made while held"
            )
        finally:
            writer.close()


async def test_a_service_key_acting_for_two_tenants_is_held_for_one(
    tmp_path: Path, recorded_apps: list[Any]
) -> None:
    """The commit's own case (one connection, requests of alice and bob; alice refused), with
    the requests sent by one service key (a gateway acting for its tenants) instead of each
    tenant's key: the connection counts as one tenant's ("*") and is held."""
    async with flood_host(tmp_path) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        a_path = log_path("alice", uuid.uuid4()) + "/records"
        b_path = log_path("bob", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_raw_append(port, "svc-key", b_path, "b0"))
            assert (await _answer(reader))[0] == 200
            for i in range(BURST):
                writer.write(_raw_append(port, "svc-key", a_path, f"ok{i}"))
                assert (await _answer(reader))[0] == 200
            writer.write(_raw_append(port, "svc-key", a_path, "refused"))
            status, headers = await _answer(reader)
            assert status == 429 and headers["retry-after"] == "1"
            # bob's next request on this connection would wait out alice's hold
            assert not _held(table)
        finally:
            writer.close()


async def test_an_exemption_is_used_up_by_one_refusal(
    tmp_path: Path, recorded_apps: list[Any]
) -> None:
    """A proxy's connection: bob's request, then alice refused (not held: bob's next request
    must not wait behind it), then alice refused again at once, with no other tenant's request
    in between: held, so sharing a connection cannot make a flood's refusals free."""
    async with flood_host(tmp_path) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        a_path = log_path("alice", uuid.uuid4()) + "/records"
        b_path = log_path("bob", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await _burn_burst(writer, reader, port, a_path)
            writer.write(_raw_append(port, "bob-key", b_path, "b0"))
            assert (await _answer(reader))[0] == 200
            writer.write(_raw_append(port, "alice-key", a_path, "refused-1"))
            assert (await _answer(reader))[0] == 429
            assert not _held(table)  # bob's request came since: exempt
            writer.write(_raw_append(port, "alice-key", a_path, "refused-2"))
            assert (await _answer(reader))[0] == 429
            assert _held(table)  # the exemption was used up
        finally:
            writer.close()
