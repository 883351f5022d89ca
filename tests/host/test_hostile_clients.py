"""Issue 21, hostile clients: real uvicorn log hosts (and real ``loghost serve`` processes).

Slowloris connections, long-polls pinning open-log slots, clients hanging up, oversized bodies,
reused idempotency keys, odd spellings in redirects, and what /readyz tells strangers.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactor_client import LogHostClient
from compactor_client.errors import NotLeader as ClientNotLeader
from wal3 import LocalStore, StoreUnavailable
from wal3.store import ObjectMeta

from ..conftest import free_port
from .live import (
    Live,
    assert_error,
    auth,
    live_server,
    log_path,
    metric,
    metrics_text,
    record,
    spawn_server,
    wait_until,
)

BOUND_S = 20.0  # generous: how long a test waits for the server to act, never a latency assert


def _port(lv: Live) -> int:
    return int(lv.url.rsplit(":", 1)[1])


async def _closed_by_server(reader: asyncio.StreamReader) -> bool:
    """True once the server closed the connection (EOF), False if it is still open at BOUND_S."""
    try:
        async with asyncio.timeout(BOUND_S):
            while await reader.read(65536):
                pass
    except TimeoutError:
        return False
    except ConnectionError:
        return True
    return True


def _waiting(lv: Live, cid: str | None = None) -> int:
    """Requests parked on logs: users (before the fix long-polls were users) and waiters."""
    return sum(
        h.users + getattr(h, "waiters", 0)
        for h in lv.server.manager.handles()
        if cid is None or str(h.collection_id) == cid
    )


# ------------------------------------------------------------------------------ 7. slowloris


PARSERS = pytest.mark.parametrize("parser", ["httptools", "h11"])  # LOGHOST_HTTP_PARSER


@PARSERS
async def test_slowloris_connections_are_closed_by_the_server(tmp_path: Path, parser: str) -> None:
    cid = str(uuid.uuid4())
    async with live_server(
        str(tmp_path / "store"), header_timeout_s=0.5, body_timeout_s=0.5, http_parser=parser
    ) as lv:
        head = (
            f"POST {log_path('alice', cid)}/records HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
            f"Content-Length: 100\r\n\r\n"
        ).encode()
        attacks = {
            "silent": b"",
            "partial request line": b"GET /heal",
            "partial headers": b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: 1",
            "partial body": head + b'{"records"',
            # Answered, then the next request on the connection trickles in: uvicorn's
            # keep-alive timer stops at its first byte, so only the header deadline closes it.
            "partial second request": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /heal",
            "partial second body": b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" + head + b"{",
        }
        conns = {}
        for name, payload in attacks.items():
            reader, writer = await asyncio.open_connection("127.0.0.1", _port(lv))
            writer.write(payload)
            await writer.drain()
            conns[name] = (reader, writer)
        try:
            closed = {name: await _closed_by_server(r) for name, (r, _) in conns.items()}
        finally:
            for _, w in conns.values():
                w.close()
        assert all(closed.values()), f"left open by the server: {closed}"
        # the server itself is fine, and the cut upload counts as the client's doing (499)
        async with lv.client("alice-key") as c:
            assert (await c.get("/healthz")).status_code == 200
            text = await metrics_text(c)
        assert metric(text, "loghost_requests_total", status="500") is None, text


@PARSERS
async def test_connections_beyond_the_limit_are_closed(tmp_path: Path, parser: str) -> None:
    async with live_server(
        str(tmp_path / "store"), max_connections=3, header_timeout_s=60.0, http_parser=parser
    ) as lv:
        held = [await asyncio.open_connection("127.0.0.1", _port(lv)) for _ in range(3)]
        try:
            _reader, writer = await asyncio.open_connection("127.0.0.1", _port(lv))
            try:
                # None of them showed a key: the oldest gives way to the newcomer (issue 21,
                # V5: strangers must not keep tenants out), so three stay open.
                assert await _closed_by_server(held[0][0]), "the oldest stayed open"
            finally:
                writer.close()
        finally:
            for _, w in held:
                w.close()
        async with lv.client() as c:  # room again once those are gone
            for _ in range(200):
                try:
                    if (await c.get("/healthz")).status_code == 200:
                        break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)  # polling interval of a bounded retry
            else:
                pytest.fail("the server did not accept connections again")


async def test_client_hanging_up_mid_body_is_not_a_server_error(tmp_path: Path) -> None:
    cid = str(uuid.uuid4())
    async with live_server(str(tmp_path / "store")) as lv:
        head = (
            f"POST {log_path('alice', cid)}/records HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer alice-key\r\nContent-Length: 1000\r\n\r\n"
        ).encode()
        _reader, writer = await asyncio.open_connection("127.0.0.1", _port(lv))
        writer.write(head + b'{"records": [')
        await writer.drain()
        writer.close()
        async with lv.client() as c:

            async def counted() -> bool:
                text = await metrics_text(c)
                return any(metric(text, "loghost_requests_total", status=s) for s in ("499", "500"))

            await wait_until(counted, "the cut request to be counted", BOUND_S)
            text = await metrics_text(c)
        assert metric(text, "loghost_requests_total", status="500") is None, text
        assert metric(text, "loghost_requests_total", status="499") == 1.0


# ------------------------------------------------------------------- 2. long-polls and slots


async def _long_poll_then_hang_up(lv: Live, tenant: str, key: str, cid: str) -> None:
    _reader, writer = await asyncio.open_connection("127.0.0.1", _port(lv))
    writer.write(
        (
            f"GET {log_path(tenant, cid)}/records?from=2&wait_ms=30000 HTTP/1.1\r\n"
            f"Host: x\r\nAuthorization: Bearer {key}\r\n\r\n"
        ).encode()
    )
    await writer.drain()
    await wait_until(lambda: _waiting(lv, cid) >= 1, "the long-poll to park", BOUND_S)
    writer.close()


async def test_hung_up_long_polls_neither_pin_slots_nor_keep_waiting(tmp_path: Path) -> None:
    bobs = [str(uuid.uuid4()) for _ in range(3)]
    async with live_server(str(tmp_path / "store"), max_open_logs=3) as lv:
        async with lv.client("bob-key") as bob:
            for cid in bobs:
                r = await bob.post(
                    log_path("bob", cid) + "/records", json={"records": [record("b")]}
                )
                assert r.status_code == 200, r.text
        for cid in bobs:
            await _long_poll_then_hang_up(lv, "bob", "bob-key", cid)
        # every slot is open and waited on; another tenant still gets new logs opened
        async with lv.client("alice-key") as alice:
            for _ in range(3):
                r = await alice.post(
                    log_path("alice", uuid.uuid4()) + "/records", json={"records": [record("a")]}
                )
                assert r.status_code == 200, r.text

            # and the server stopped waiting for the clients that hung up
            async def none_waiting() -> bool:
                return metric(await metrics_text(alice), "loghost_long_polls") == 0.0

            await wait_until(none_waiting, "hung-up long-polls to end", BOUND_S)


async def test_long_polls_are_limited_per_tenant(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "store"), max_long_polls_per_tenant=2) as lv:
        cids = {t: str(uuid.uuid4()) for t in ("alice", "bob")}
        async with lv.client("alice-key") as alice, lv.client("bob-key") as bob:
            for c, t in ((alice, "alice"), (bob, "bob")):
                r = await c.post(log_path(t, cids[t]) + "/records", json={"records": [record("x")]})
                assert r.status_code == 200, r.text
            params = {"from": 2, "wait_ms": 10_000}
            waits = [
                asyncio.create_task(
                    alice.get(log_path("alice", cids["alice"]) + "/records", params=params)
                )
                for _ in range(2)
            ]
            await wait_until(lambda: _waiting(lv) >= 2, "two long-polls parked", BOUND_S)
            r = await alice.get(log_path("alice", cids["alice"]) + "/records", params=params)
            err = assert_error(r, 429, "backpressure")
            assert err["reason"] == "long_poll"
            # another tenant is not affected
            other = asyncio.create_task(
                bob.get(log_path("bob", cids["bob"]) + "/records", params=params)
            )
            await wait_until(lambda: _waiting(lv) >= 3, "bob's long-poll parked", BOUND_S)
            r = await alice.post(
                log_path("alice", cids["alice"]) + "/records", json={"records": [record("wake")]}
            )
            assert r.status_code == 200
            for t in waits:
                got = await t
                assert got.status_code == 200 and got.json()["records"], got.text
            other.cancel()


# ----------------------------------------------------------------------- 5. oversized bodies


def _vm_hwm_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
def test_many_tiny_records_are_refused_without_parsing_them_all(tmp_path: Path) -> None:
    proc = spawn_server(str(tmp_path / "store"), tmp_path)
    try:
        cid = str(uuid.uuid4())
        path = proc.url + log_path("alice", cid) + "/records"
        with httpx.Client(headers=auth("alice-key"), timeout=120) as c:
            r = c.post(path, json={"records": [record("warm")]})
            assert r.status_code == 200, r.text
            before = _vm_hwm_kib(proc.proc.pid)
            one = b'{"id":"a","op":"add"}'
            n = ((8 << 20) - 64) // (len(one) + 1)  # as many as fit under the 8 MiB limit
            body = b'{"records":[' + b",".join([one] * n) + b"]}"
            assert n > 300_000 and len(body) < 8 << 20
            r = c.post(path, content=body, headers={"Content-Type": "application/json"})
            assert_error(r, 400, "invalid_request")
            assert "at most 10000" in r.json()["error"]["message"]
            grown_mib = (_vm_hwm_kib(proc.proc.pid) - before) / 1024
            print(f"peak memory grew by {grown_mib:.0f} MiB")
            # Parsing every record into objects costs hundreds of MiB; counting them does not.
            assert grown_mib < 120, f"peak memory grew by {grown_mib:.0f} MiB"
            assert c.get(proc.url + "/healthz").status_code == 200
    finally:
        proc.terminate()


async def test_large_bodies_decoded_in_slices_keep_the_rules(tmp_path: Path) -> None:
    """Bodies over the slicing threshold are validated as strictly, and stored identically."""
    cid = str(uuid.uuid4())
    recs = [
        record(
            i,
            document="d" * 100,
            metadata={"n": i, "f": 1.5, "b": True, "z": None},
            embedding=[i, 0.25],
        )
        for i in range(2000)
    ]
    async with live_server(str(tmp_path / "store")) as lv, lv.client("alice-key") as c:
        path = log_path("alice", cid) + "/records"
        bad = [*recs[:1500], record("x", op="nope"), *recs[1500:]]
        assert len(json.dumps({"records": bad})) > 256 << 10
        err = assert_error(await c.post(path, json={"records": bad}), 400, "invalid_request")
        assert err["message"].startswith("records.1500.op:"), err
        err = assert_error(await c.post(path, json={"records": recs, "extra": 1}), 400)
        assert err["message"].startswith("extra:"), err
        r = await c.post(path, json={"records": recs, "idempotency_key": "big"})
        assert r.status_code == 200 and r.json()["count"] == 2000, r.text
        got = (await c.get(path, params={"from": 1, "limit": 2000})).json()["records"]
        assert [x["record"] for x in got] == [
            {"document": None, "metadata": None, "embedding": None, **x} for x in recs
        ]


async def test_records_bound_is_in_the_schema(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "store")) as lv, lv.client() as c:
        schema = (await c.get("/openapi.json")).json()
        records = schema["components"]["schemas"]["AppendRequest"]["properties"]["records"]
        assert records.get("maxItems") == 10_000, records


# ------------------------------------------------------------------------ 6. idempotency


def test_reused_idempotency_key_with_another_body_is_refused_across_a_restart(
    tmp_path: Path,
) -> None:
    store = str(tmp_path / "store")
    cid = str(uuid.uuid4())
    first_body = {
        "records": [record("r1", document="one"), record("r2")],
        "idempotency_key": "batch-1",
    }
    other_body = {
        "records": [record("r1", document="two"), record("r2")],
        "idempotency_key": "batch-1",
    }
    proc = spawn_server(store, tmp_path, server_id="idem")
    try:
        with httpx.Client(base_url=proc.url, headers=auth("alice-key"), timeout=30) as c:
            path = log_path("alice", cid) + "/records"
            first = c.post(path, json=first_body)
            assert first.status_code == 200, first.text
            assert "deduplicated" not in first.json()
            same = c.post(path, json=first_body)
            assert same.status_code == 200, same.text
            assert same.json() == {**first.json(), "deduplicated": True}
            assert_error(c.post(path, json=other_body), 409, "idempotency_mismatch")
    finally:
        assert proc.terminate() == 0
    proc = spawn_server(store, tmp_path, server_id="idem")
    try:
        with httpx.Client(base_url=proc.url, headers=auth("alice-key"), timeout=30) as c:
            path = log_path("alice", cid) + "/records"
            assert_error(c.post(path, json=other_body), 409, "idempotency_mismatch")
            same = c.post(path, json=first_body)
            assert same.status_code == 200, same.text
            assert same.json() == {**first.json(), "deduplicated": True}
            state = c.get(log_path("alice", cid)).json()
            assert state["next_offset"] == 3  # nothing appended by the retries
            got = c.get(path, params={"from": 1}).json()["records"]
            assert [x["record"].get("document") for x in got] == ["one", None]
    finally:
        proc.terminate()


# --------------------------------------------------------------------------- 8. small ones


@pytest.mark.parametrize(
    "spelling",
    [
        "{%s}",
        "urn:uuid:%s",
        "%s-upper",
        "arabic-indic",
    ],
)
async def test_redirect_names_the_log_canonically(
    tmp_path: Path, redis_server: Any, spelling: str
) -> None:
    cid = uuid.uuid4()
    store = str(tmp_path / "store")
    pa, pb = free_port(), free_port()
    async with (
        live_server(
            store,
            port=pa,
            server_id="a",
            redis_url=redis_server.url,
            advertise_url=f"http://127.0.0.1:{pa}",
        ) as a,
        live_server(
            store,
            port=pb,
            server_id="b",
            redis_url=redis_server.url,
            advertise_url=f"http://127.0.0.1:{pb}",
        ) as b,
    ):
        async with a.client("alice-key") as ca, b.client("alice-key") as cb:
            r = await ca.post(log_path("alice", cid) + "/records", json={"records": [record("x")]})
            assert r.status_code == 200, r.text
            if spelling == "%s-upper":
                odd = str(cid).upper()
            elif spelling == "arabic-indic":
                odd = str(cid).translate({ord(d): 0x660 + int(d) for d in "0123456789"})
            else:
                odd = spelling % cid
            assert uuid.UUID(odd) == cid
            r = await cb.get(log_path("alice", odd) + "/records", params={"from": 1})
            assert_error(r, 307, "not_leader")
            assert r.headers["location"] == f"{a.url}{log_path('alice', cid)}/records?from=1"


class _BrokenProbeStore(LocalStore):
    """A local store whose readiness probe fails with a message naming its internals."""

    async def head(self, key: str) -> ObjectMeta:
        if key == "readyz-probe":
            raise StoreUnavailable("connect to s3.internal.example:9000 failed: secret-bucket")
        return await super().head(key)


async def test_readyz_does_not_echo_store_errors(tmp_path: Path) -> None:
    async with live_server(store=_BrokenProbeStore(tmp_path / "store")) as lv:
        async with httpx.AsyncClient(base_url=lv.url) as anonymous:
            r = await anonymous.get("/readyz")
        err = assert_error(r, 503, "unavailable")
        assert "internal.example" not in r.text and "secret" not in r.text, err


async def test_cursor_names_with_a_trailing_newline_are_refused(tmp_path: Path) -> None:
    cid = str(uuid.uuid4())
    async with live_server(str(tmp_path / "store")) as lv, lv.client() as c:
        r = await c.post(log_path("alice", cid) + "/records", json={"records": [record("x")]})
        assert r.status_code == 200
        r = await c.put(
            log_path("alice", cid) + "/cursors/mine%0A", json={"offset": 1, "witness": None}
        )
        assert_error(r, 400)
        assert not list((tmp_path / "store").rglob("mine*"))


async def test_tenant_names_with_a_trailing_newline_are_refused(tmp_path: Path) -> None:
    cid = str(uuid.uuid4())
    async with live_server(str(tmp_path / "store")) as lv, lv.client() as service:
        r = await service.post(
            log_path("alice%0A", cid) + "/records", json={"records": [record("x")]}
        )
        assert_error(r, 400)
        assert not list((tmp_path / "store").rglob("TENANT"))


async def test_compactor_client_follows_redirects_only_to_listed_hosts(
    tmp_path: Path, redis_server: Any
) -> None:
    """A Location from Redis pointing elsewhere never receives the service key."""
    cid = str(uuid.uuid4())
    seen: list[str] = []

    async def trap(scope: dict[str, Any], receive: Any, send: Any) -> None:
        # Stands in for whatever a hostile hint names: records the Authorization it gets.
        if scope["type"] != "http":
            return
        seen.append(dict(scope["headers"]).get(b"authorization", b"").decode())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    import uvicorn

    trap_port = free_port()
    trap_server = uvicorn.Server(
        uvicorn.Config(trap, host="127.0.0.1", port=trap_port, log_config=None, lifespan="off")
    )
    trap_task = asyncio.create_task(trap_server.serve())
    try:
        await wait_until(lambda: trap_server.started, "trap server up")
        async with live_server(str(tmp_path / "store")) as lv, lv.client() as c:
            r = await c.post(log_path("alice", cid) + "/records", json={"records": [record("x")]})
            assert r.status_code == 200
        # A hint naming the trap (a compromised or confused Redis).
        import redis.asyncio as aioredis

        rc = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
        try:
            await rc.set(
                "loghost:leader:" + cid,
                json.dumps(
                    {
                        "server_id": "evil",
                        "url": f"http://127.0.0.1:{trap_port}",
                        "incarnation": "x",
                    }
                ),
                px=60_000,
            )
        finally:
            await rc.aclose()
        async with live_server(
            str(tmp_path / "store"), redis_url=redis_server.url, server_id="other"
        ) as lv2:
            async with LogHostClient(lv2.url, "svc-key", redirect_hosts=[lv2.url]) as client:
                with pytest.raises(ClientNotLeader):
                    await client.state("alice", cid)
    finally:
        trap_server.should_exit = True
        await trap_task
    assert seen == [], f"the key was sent to the trap: {seen}"
