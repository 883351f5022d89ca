"""Issue 19 over HTTP: one tenant floods a live host past every quota it has, another keeps
working beside it.

Alice (A) sends many concurrent requests over many connections: appends past her appends/s
bucket, appends to new logs past her open-log quota (her open logs busy), oversized appends,
long-polls past the per-tenant cap.  Bob (B) meanwhile appends, creates a log and long-polls, a
bounded number of times and within his quota.  Bob must get no 429 and every request of his
must succeed; Alice gets 429 ``quota_exceeded`` naming each quota, with Retry-After where
waiting helps.  The quotas' clock is frozen (no bucket refills while the test runs), so every
count below is exact; nothing waits on time but bounded polls.

Then the connection hold (``host.httpserver.ConnectionTicket.hold``): after a quota refusal
with Retry-After, the refused connection is not read until then, so a client that retries at
once cannot keep the server busy refusing it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from host.httpserver import MAX_HOLD_S
from host.quotas import TenantQuotas
from wal3 import LocalStore

from .live import Live, assert_error, live_server, log_path, record, wait_until

BOUND_S = 30.0  # how long a bounded poll waits for the server to act; never a latency assert
BURST = 8  # every tenant's appends_per_s burst; the frozen clock never refills it
OPEN_LOGS = 3
LONG_POLLS = 2
MAX_RECORDS = 50
QUOTAS = json.dumps(
    {
        "default": {
            "appends_per_s": 1,
            "appends_burst": BURST,
            "open_logs": OPEN_LOGS,
            "records_per_request": MAX_RECORDS,
        }
    }
)


class FrozenClock:
    """The quotas' clock, moved only by the test."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def flood_host(tmp_path: Path, **settings: Any) -> AsyncIterator[tuple[Live, FrozenClock]]:
    clock = FrozenClock()
    async with live_server(
        store=LocalStore(tmp_path / "store"),
        tenant_quotas=QUOTAS,
        max_long_polls_per_tenant=LONG_POLLS,
        max_wait_ms=600_000,
        **settings,
    ) as lv:
        lv.server.quotas.clock = clock
        yield lv, clock


def count_throttles(quotas: TenantQuotas) -> dict[str, list[str]]:
    """Every quota refusal from now on, by tenant (the quotas named), counted as it is made."""
    seen: dict[str, list[str]] = {}
    real = quotas.throttle

    def counting(tenant: str, quota: str, limit: str, *args: Any, **kw: Any) -> Any:
        seen.setdefault(tenant, []).append(quota)
        return real(tenant, quota, limit, *args, **kw)

    quotas.throttle = counting  # type: ignore[method-assign]
    return seen


def body(n: int, tag: str) -> dict[str, Any]:
    return {"records": [record(f"{tag}-{i}") for i in range(n)]}


async def test_a_flood_past_every_quota_throttles_the_flooder_alone(tmp_path: Path) -> None:
    async with flood_host(tmp_path) as (lv, clock):
        mgr = lv.server.manager
        limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
        a_logs = [uuid.uuid4() for _ in range(OPEN_LOGS)]
        b_log, b_new = uuid.uuid4(), uuid.uuid4()
        async with (
            lv.client("alice-key", limits=limits) as alice,
            lv.client("bob-key") as bob,
            contextlib.AsyncExitStack() as busy,
        ):
            # Setup: each tenant's logs exist (alice: her whole open-log quota).
            for cid in a_logs:
                r = await alice.post(log_path("alice", cid) + "/records", json=body(1, "a"))
                assert r.status_code == 200, r.text
            r = await bob.post(log_path("bob", b_log) + "/records", json=body(1, "b"))
            assert r.status_code == 200, r.text
            alice_tokens = BURST - OPEN_LOGS
            throttles = count_throttles(lv.server.quotas)
            # Alice's open logs are all busy: a new log of hers has no room of her own.
            for cid in a_logs:
                await busy.enter_async_context(mgr.use(cid, "alice"))
            # Alice holds every long-poll she may, on a log the flood leaves alone.
            poll = {"from": 2, "wait_ms": 300_000}  # far beyond the test
            a_polls = [
                asyncio.create_task(
                    alice.get(log_path("alice", a_logs[0]) + "/records", params=poll)
                )
                for _ in range(LONG_POLLS)
            ]
            await wait_until(
                lambda: mgr.long_polls("alice", "tenant") == LONG_POLLS, "alice's polls", BOUND_S
            )

            # The flood: many requests at once, each past one of alice's quotas (or taking her
            # last few tokens), over many connections.
            async def a_append(path: str, n: int, tag: str) -> httpx.Response:
                return await alice.post(path + "/records", json=body(n, tag))

            flood = (
                [a_append(log_path("alice", a_logs[1 + i % 2]), 10, f"x{i}") for i in range(24)]
                + [a_append(log_path("alice", uuid.uuid4()), 10, f"n{i}") for i in range(24)]
                + [a_append(log_path("alice", a_logs[0]), MAX_RECORDS + 1, f"o{i}") for i in range(8)]
                + [
                    alice.get(log_path("alice", a_logs[0]) + "/records", params=poll)
                    for _ in range(8)
                ]
            )  # fmt: skip
            flood_tasks = [asyncio.ensure_future(f) for f in flood]

            # Bob, beside the flood: appends, a new log, long-polls; all within his quota.
            b_polls = [
                asyncio.create_task(bob.get(log_path("bob", b_log) + "/records", params=poll))
                for _ in range(LONG_POLLS)
            ]
            await wait_until(
                lambda: mgr.long_polls("bob", "tenant") == LONG_POLLS, "bob's polls", BOUND_S
            )
            b_answers = [
                await bob.post(log_path("bob", b_log) + "/records", json=body(1, f"b{i}"))
                for i in range(4)
            ]
            b_answers.append(
                await bob.post(log_path("bob", b_new) + "/records", json=body(1, "new"))
            )
            await wait_until(
                lambda: mgr.long_polls("bob", "tenant") == 0, "bob's polls answered", BOUND_S
            )
            b_polled = [await t for t in b_polls]
            a_answers = await asyncio.gather(*flood_tasks)
            await busy.aclose()

            # Bob: every request answered 200, nothing refused.
            for r in [*b_answers, *b_polled]:
                assert r.status_code == 200, r.text
            for r in b_polled:
                assert r.json()["records"][0]["record"]["id"] == "b0-0", r.text
            assert "bob" not in throttles

            # Alice: 200 only with her last tokens; every other append a 429 naming its quota.
            appends, polls = a_answers[:56], a_answers[56:]
            ok = [r for r in appends if r.status_code == 200]
            assert 1 <= len(ok) <= alice_tokens
            refused: dict[str, int] = {}
            for r in appends:
                if r.status_code == 200:
                    continue
                err = assert_error(r, 429, "quota_exceeded")
                refused[err["quota"]] = refused.get(err["quota"], 0) + 1
                if err["quota"] == "records_per_request":
                    assert "Retry-After" not in r.headers  # waiting does not help
                else:
                    assert int(r.headers["Retry-After"]) >= 1, r.headers
            assert refused["open_logs"] == 24  # her new logs: no room of her own
            assert refused["records_per_request"] == 8
            assert refused["appends_per_s"] == 24 - len(ok)
            for r in polls:
                err = assert_error(r, 429, "backpressure")
                assert err["reason"] == "long_poll" and "Retry-After" in r.headers
            assert sorted(throttles["alice"]) == sorted(
                ["appends_per_s"] * refused["appends_per_s"]
                + ["open_logs"] * 24
                + ["records_per_request"] * 8
            )

            # Alice's own waiting polls end with her next append (once her bucket refills).
            clock.now += 60
            r = await alice.post(log_path("alice", a_logs[0]) + "/records", json=body(1, "late"))
            assert r.status_code == 200, r.text
            for t in a_polls:
                got = await t
                assert got.status_code == 200 and got.json()["records"], got.text
        text = await _tenant_metrics(lv)
        assert 'loghost_tenant_throttled_total{quota="open_logs",tenant="alice"} 24.0' in text
        assert 'loghost_tenant_throttled_total{quota="long_polls",tenant="alice"} 8.0' in text
        assert not [ln for ln in text.splitlines() if "throttled" in ln and 'tenant="bob"' in ln]


async def _tenant_metrics(lv: Live) -> str:
    async with lv.client() as svc:
        r = await svc.get("/metrics/tenants")
        assert r.status_code == 200
        return r.text


# ------------------------------------------------------------------------ the connection hold


def _raw_append(port: int, key: str, path: str, tag: str) -> bytes:
    payload = json.dumps(body(1, tag)).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    )
    return head.encode() + payload


async def _answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    async with asyncio.timeout(BOUND_S):
        status = int((await reader.readline()).split(b" ", 2)[1])
        headers: dict[str, str] = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            k, _, v = line.decode().partition(":")
            headers[k.strip().lower()] = v.strip()
        await reader.readexactly(int(headers["content-length"]))
    return status, headers


@pytest.mark.parametrize("parser", ["httptools", "h11"])  # LOGHOST_HTTP_PARSER
async def test_a_refused_connection_is_not_read_until_its_retry_after(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """Before the hold, a client retrying at once had each retry parsed, decoded and refused
    (bench/noisy_neighbour.py: B's appends took seconds behind 64 such connections)."""
    async with flood_host(tmp_path, http_parser=parser) as (lv, clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        path = log_path("alice", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            for i in range(BURST):  # alice's whole burst
                writer.write(_raw_append(port, "alice-key", path, f"ok{i}"))
                assert (await _answer(reader))[0] == 200
            throttles = count_throttles(lv.server.quotas)
            writer.write(_raw_append(port, "alice-key", path, "refused"))
            status, headers = await _answer(reader)
            assert status == 429 and headers["retry-after"] == "1"
            # Retried at once, ignoring Retry-After: the connection is held, the retry unread.
            writer.write(_raw_append(port, "alice-key", path, "retry"))
            held: Callable[[], bool] = lambda: any(c.held for c in table.connections)  # noqa: E731
            await wait_until(held, "the refused connection held", BOUND_S)
            assert throttles == {"alice": ["appends_per_s"]}  # the retry was not parsed
            # Other tenants are served meanwhile.
            async with lv.client("bob-key") as bob:
                r = await bob.post(log_path("bob", uuid.uuid4()) + "/records", json=body(1, "b"))
                assert r.status_code == 200, r.text
            # The hold ends by itself (at most MAX_HOLD_S): the retry is answered then.
            status, headers = await _answer(reader)
            assert status == 429 and headers["retry-after"] == "1"
            assert held()  # refused again: held again
            assert throttles == {"alice": ["appends_per_s", "appends_per_s"]}
            # A client that waits gets through on the same connection.
            clock.now += MAX_HOLD_S * 10
            await wait_until(lambda: not held(), "the hold over", BOUND_S)
            writer.write(_raw_append(port, "alice-key", path, "later"))
            assert (await _answer(reader))[0] == 200
        finally:
            writer.close()


async def test_a_connection_shared_by_two_tenants_is_never_held(
    tmp_path: Path, recorded_apps: list[Any]
) -> None:
    """A proxy pools one connection for many tenants: a hold for alice's refusal would stall
    bob's requests queued behind it on that connection, so such a connection is never held.
    Before, the hold applied whatever the connection had carried (the note of issue 19)."""
    async with flood_host(tmp_path) as (lv, _clock):
        table = recorded_apps[-1].state.connections
        port = int(lv.url.rsplit(":", 1)[1])
        a_path = log_path("alice", uuid.uuid4()) + "/records"
        b_path = log_path("bob", uuid.uuid4()) + "/records"
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_raw_append(port, "bob-key", b_path, "b0"))
            assert (await _answer(reader))[0] == 200
            for i in range(BURST):  # alice's whole burst, on the same connection
                writer.write(_raw_append(port, "alice-key", a_path, f"ok{i}"))
                assert (await _answer(reader))[0] == 200
            throttles = count_throttles(lv.server.quotas)
            # Alice refused, then bob's next request sent at once on the same connection.
            writer.write(_raw_append(port, "alice-key", a_path, "refused"))
            writer.write(_raw_append(port, "bob-key", b_path, "b1"))
            status, headers = await _answer(reader)
            assert status == 429 and headers["retry-after"] == "1"
            # The answer is complete, so the hold (if any) is set by now: there is none.
            assert not any(c.held for c in table.connections)
            assert (await _answer(reader))[0] == 200  # bob's, not held back
            assert throttles == {"alice": ["appends_per_s"]}
        finally:
            writer.close()
        # A connection of one tenant is still held (the test above, in short).
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_raw_append(port, "alice-key", a_path, "alone"))
            assert (await _answer(reader))[0] == 429
            assert any(c.held for c in table.connections)
        finally:
            writer.close()
