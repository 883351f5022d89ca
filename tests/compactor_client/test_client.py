"""LogHostClient against a small real FastAPI app served by uvicorn on 127.0.0.1.

The stub speaks the host's contract for the few behaviours under test (429 + Retry-After,
307 not_leader, error codes); the real server comes later.
"""

from __future__ import annotations

import socket
import threading
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from compactor_client.client import LogHostClient, parse_retry_after
from compactor_client.errors import (
    Backpressure,
    CursorConflict,
    InvalidRequest,
    LogHostUnavailable,
    NotFound,
    NotLeader,
    Purged,
    Sealed,
    ServerError,
    Unauthorized,
)
from compactor_client.models import Record

KEY = "secret"


def err(
    status: int, code: str, message: str = "", headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(
        {"error": {"code": code, "message": message or code}}, status_code=status, headers=headers
    )


@dataclass
class StubState:
    logs: dict[str, list[dict[str, Any]]] = field(default_factory=lambda: defaultdict(list))
    attempts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    seen_keys: dict[str, dict[str, Any]] = field(default_factory=dict)
    cursors: dict[str, dict[str, Any]] = field(default_factory=dict)
    compaction: dict[str, int] = field(default_factory=dict)
    leader_url: str = ""


def make_app(state: StubState, *, follower: bool = False) -> FastAPI:
    app = FastAPI()

    @app.middleware("http")
    async def auth_and_leadership(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.headers.get("authorization") != f"Bearer {KEY}":
            return err(401, "unauthorized")
        if follower:
            target = state.leader_url + request.url.path
            if request.url.query:
                target += "?" + request.url.query
            return err(307, "not_leader", headers={"Location": target})
        return await call_next(request)

    @app.post("/v1/tenants/{tenant}/logs/{cid}/records")
    async def append(tenant: str, cid: str, request: Request) -> Any:
        body = await request.json()
        state.attempts[cid] += 1
        n = state.attempts[cid]
        if cid == "busy" and n <= 2:
            return err(429, "backpressure", headers={"Retry-After": "2"})
        if cid == "very-busy":
            return err(429, "backpressure", headers={"Retry-After": "3600"})
        if cid == "flaky" and n == 1:
            # Applied, then the answer is lost behind a 503: the ambiguous case.
            key = body.get("idempotency_key")
            first = len(state.logs[cid]) + 1
            state.logs[cid].extend(body["records"])
            if key:
                state.seen_keys[key] = {
                    "first_offset": first,
                    "count": len(body["records"]),
                    "next_offset": first + len(body["records"]),
                }
            return err(503, "unavailable", headers={"Retry-After": "1"})
        if cid == "sealed":
            return err(409, "sealed")
        if not body["records"]:
            return err(400, "invalid", "no records")
        key = body.get("idempotency_key")
        if key and key in state.seen_keys:
            return state.seen_keys[key]
        first = len(state.logs[cid]) + 1
        state.logs[cid].extend(body["records"])
        answer = {
            "first_offset": first,
            "count": len(body["records"]),
            "next_offset": first + len(body["records"]),
        }
        if key:
            state.seen_keys[key] = answer
        return answer

    @app.get("/v1/tenants/{tenant}/logs/{cid}/records")
    async def read(tenant: str, cid: str, request: Request) -> Any:
        start = int(request.query_params["from"])
        limit = int(request.query_params.get("limit", 100))
        if cid == "gc" and start < 5:
            return err(410, "purged", "below oldest")
        recs = state.logs[cid][start - 1 : start - 1 + limit]
        return {
            "records": [
                {"offset": start + i, "timestamp_us": 1000 + i, "record": r}
                for i, r in enumerate(recs)
            ],
            "next_offset": start + len(recs),
        }

    @app.get("/v1/tenants/{tenant}/logs/{cid}")
    async def log_state(tenant: str, cid: str) -> Any:
        if cid not in state.logs:
            return err(404, "not_found", "never written")
        n = len(state.logs[cid])
        return {
            "collection_id": cid,
            "tenant": tenant,
            "oldest_offset": 1,
            "next_offset": n + 1,
            "compaction_offset": state.compaction.get(cid, 1),
            "setsum": "00",
            "sealed": False,
            "fragments": 1,
            "bytes": 10 * n,
            "future_field": "ignored",
        }

    @app.get("/v1/tenants/{tenant}/logs/{cid}/fragments")
    async def fragments(tenant: str, cid: str, request: Request) -> Any:
        return {
            "fragments": [
                {
                    "url": "file:///x/2.parquet",
                    "start": 11,
                    "limit": 21,
                    "num_bytes": 5,
                    "setsum": "b",
                },
                {
                    "url": "file:///x/1.parquet",
                    "start": 1,
                    "limit": 11,
                    "num_bytes": 5,
                    "setsum": "a",
                },
            ],
            "from": request.query_params.get("from"),
        }

    @app.put("/v1/tenants/{tenant}/logs/{cid}/cursors/{name}")
    async def put_cursor(tenant: str, cid: str, name: str, request: Request) -> Any:
        body = await request.json()
        cur = state.cursors.get(name)
        if (cur["witness"] if cur else None) != body["witness"]:
            return err(409, "cursor_conflict")
        witness = f"w{int(cur['witness'][1:]) + 1 if cur else 1}"
        state.cursors[name] = {
            "name": name,
            "offset": body["offset"],
            "epoch_us": 1,
            "writer": "stub",
            "witness": witness,
        }
        return state.cursors[name]

    @app.get("/v1/tenants/{tenant}/logs/{cid}/cursors/{name}")
    async def get_cursor(tenant: str, cid: str, name: str) -> Any:
        if name not in state.cursors:
            return err(404, "not_found")
        return state.cursors[name]

    @app.delete("/v1/tenants/{tenant}/logs/{cid}/cursors/{name}")
    async def delete_cursor(tenant: str, cid: str, name: str) -> Any:
        state.cursors.pop(name, None)
        return {}

    @app.post("/v1/tenants/{tenant}/logs/{cid}/compaction")
    async def compaction(tenant: str, cid: str, request: Request) -> Any:
        offset = (await request.json())["offset"]
        state.compaction[cid] = max(state.compaction.get(cid, 1), offset)
        return {"compaction_offset": state.compaction[cid]}

    @app.get("/v1/dirty")
    async def dirty(request: Request) -> Any:
        min_records = int(request.query_params.get("min_records", 0))
        logs = [
            {
                "tenant": "t",
                "collection_id": c,
                "start": 1,
                "limit": len(r) + 1,
                "num_records": len(r),
                "first_insertion_us": 5,
                "reinsert_count": 0,
                "score": float(len(r)),
            }
            for c, r in state.logs.items()
            if len(r) >= min_records
        ]
        return {"server_id": "stub", "logs": sorted(logs, key=lambda x: -x["score"])}

    @app.post("/v1/tenants/{tenant}/logs/{cid}/{action}")
    async def action(tenant: str, cid: str, action: str) -> Any:
        if cid == "explode":
            return JSONResponse("boom", status_code=500)
        return {"action": action, "collection_id": cid}

    return app


class ServerThread:
    """uvicorn on a socket bound before start, so clients can connect at once (no waiting)."""

    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        config = uvicorn.Config(app, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def hosts() -> Iterator[tuple[StubState, str, str]]:
    """(state, leader URL, follower URL): the follower redirects everything to the leader."""
    state = StubState()
    with (
        ServerThread(make_app(state)) as leader,
        ServerThread(make_app(state, follower=True)) as follower,
    ):
        state.leader_url = leader.url
        yield state, leader.url, follower.url


class Sleeps:
    """Records requested waits instead of waiting: tests observe the policy, not the clock."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waits.append(seconds)


def client(url: str, sleeps: Sleeps, **kw: Any) -> LogHostClient:
    return LogHostClient(url, KEY, sleep=sleeps, timeout=10, **kw)


RECS = [
    Record(id="a", op="add", document="x", metadata={"k": 1}),
    {"id": "b", "op": "upsert", "embedding": [0.5, 1.0]},
]


async def test_append_read_state_roundtrip(hosts: tuple[StubState, str, str]) -> None:
    state, leader, _ = hosts
    sleeps = Sleeps()
    async with client(leader, sleeps) as c:
        res = await c.append("t", "c1", RECS)
        assert (res.first_offset, res.count, res.next_offset) == (1, 2, 3)
        page = await c.read("t", "c1", from_offset=1, limit=10, wait_ms=0)
        assert [r.offset for r in page.records] == [1, 2] and page.next_offset == 3
        assert page.records[0].record == RECS[0]
        assert page.records[1].record.embedding == [0.5, 1.0]
        st = await c.state("t", "c1")
        assert st.next_offset == 3 and st.compaction_offset == 1
        frags = await c.fragments("t", "c1", from_offset=1)
        assert [f.start for f in frags] == [1, 11]
        assert await c.compact("t", "c1", 3) == 3
        assert await c.compact("t", "c1", 2) == 3  # forward only, the host decides
    assert sleeps.waits == []
    assert state.logs["c1"][0]["metadata"] == {"k": 1}


async def test_429_honours_retry_after_then_succeeds(hosts: tuple[StubState, str, str]) -> None:
    state, leader, _ = hosts
    sleeps = Sleeps()
    async with client(leader, sleeps) as c:
        res = await c.append("t", "busy", RECS)  # no idempotency key: 429 is a definite "no"
    assert res.first_offset == 1
    assert state.attempts["busy"] == 3
    assert sleeps.waits == [2.0, 2.0]
    assert len(state.logs["busy"]) == 2  # written exactly once


async def test_429_retries_are_bounded(hosts: tuple[StubState, str, str]) -> None:
    state, leader, _ = hosts
    sleeps = Sleeps()
    async with client(leader, sleeps, max_retries=1) as c:
        with pytest.raises(Backpressure) as info:
            await c.append("t", "busy", RECS)
    assert info.value.retry_after_s == 2.0 and info.value.status == 429
    assert state.attempts["busy"] == 2 and sleeps.waits == [2.0]


async def test_retry_after_beyond_the_cap_is_raised_not_waited(
    hosts: tuple[StubState, str, str],
) -> None:
    _, leader, _ = hosts
    sleeps = Sleeps()
    async with client(leader, sleeps, max_retry_after_s=60) as c:
        with pytest.raises(Backpressure) as info:
            await c.append("t", "very-busy", RECS)
    assert info.value.retry_after_s == 3600 and sleeps.waits == []


async def test_ambiguous_503_append_without_key_is_not_retried(
    hosts: tuple[StubState, str, str],
) -> None:
    state, leader, _ = hosts
    async with client(leader, Sleeps()) as c:
        with pytest.raises(ServerError) as info:
            await c.append("t", "flaky", RECS)
    assert info.value.status == 503
    assert state.attempts["flaky"] == 1 and len(state.logs["flaky"]) == 2  # no duplicate


async def test_ambiguous_503_append_with_key_is_retried_once_applied(
    hosts: tuple[StubState, str, str],
) -> None:
    state, leader, _ = hosts
    sleeps = Sleeps()
    async with client(leader, sleeps) as c:
        res = await c.append("t", "flaky", RECS, idempotency_key="k-1")
    assert state.attempts["flaky"] == 2 and sleeps.waits == [1.0]
    assert res.first_offset == 1 and len(state.logs["flaky"]) == 2


async def test_not_leader_redirect_is_followed(hosts: tuple[StubState, str, str]) -> None:
    state, _, follower = hosts
    async with client(follower, Sleeps()) as c:
        res = await c.append("t", "c2", RECS)
        page = await c.read("t", "c2", from_offset=2, limit=1)
    assert res.count == 2 and state.attempts["c2"] == 1
    assert [r.offset for r in page.records] == [2]  # the query string survived the hop


async def test_redirect_hops_are_bounded() -> None:
    state = StubState()
    with ServerThread(make_app(state, follower=True)) as loop_host:
        state.leader_url = loop_host.url  # redirects to itself forever
        async with client(loop_host.url, Sleeps(), max_redirects=2) as c:
            with pytest.raises(NotLeader) as info:
                await c.state("t", "c")
    assert info.value.location is not None and info.value.location.startswith(loop_host.url)


async def test_a_retry_starts_again_at_the_callers_address() -> None:
    """The follower names a leader that is dead (killed, its hint not yet expired): the retry
    asks the caller's address again, which by then names the new leader.  Before the fix every
    retry went to the dead leader's URL and the call failed (the cluster test of issue 17 lost
    8 of 600 batches that way)."""
    with socket.socket() as s:  # a port with nothing listening: the dead leader
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    state = StubState()
    with (
        ServerThread(make_app(state)) as leader,
        ServerThread(make_app(state, follower=True)) as follower,
    ):
        state.leader_url = dead
        waits: list[float] = []

        async def sleep(seconds: float) -> None:  # the hint expires while the client waits
            waits.append(seconds)
            state.leader_url = leader.url

        async with LogHostClient(follower.url, KEY, sleep=sleep, max_retries=2) as c:
            res = await c.append("t", "moved", RECS)
            page = await c.read("t", "moved", from_offset=2, limit=1)
    assert res.count == 2 and len(waits) == 1 and state.attempts["moved"] == 1
    assert [r.offset for r in page.records] == [2]


async def test_error_codes_map_to_exceptions(hosts: tuple[StubState, str, str]) -> None:
    _, leader, _ = hosts
    async with client(leader, Sleeps()) as c:
        with pytest.raises(NotFound):
            await c.state("t", "never")
        with pytest.raises(Sealed) as sealed:
            await c.append("t", "sealed", RECS)
        assert sealed.value.code == "sealed" and sealed.value.status == 409
        with pytest.raises(Purged):
            await c.read("t", "gc", from_offset=1)
        with pytest.raises(InvalidRequest):
            await c.append("t", "c3", [])
        with pytest.raises(ServerError) as boom:
            await c.gc("t", "explode")
        assert boom.value.status == 500
    async with LogHostClient(leader, "wrong", sleep=Sleeps()) as bad:
        with pytest.raises(Unauthorized):
            await bad.state("t", "c1")


async def test_cursor_compare_and_swap(hosts: tuple[StubState, str, str]) -> None:
    _, leader, _ = hosts
    async with client(leader, Sleeps()) as c:
        made = await c.put_cursor("t", "c", "reader", 5, witness=None)
        assert made.offset == 5 and made.witness == "w1"
        got = await c.get_cursor("t", "c", "reader")
        assert got == made
        moved = await c.put_cursor("t", "c", "reader", 9, witness=got.witness)
        assert moved.offset == 9
        with pytest.raises(CursorConflict):
            await c.put_cursor("t", "c", "reader", 12, witness=got.witness)  # stale
        await c.delete_cursor("t", "c", "reader")
        with pytest.raises(NotFound):
            await c.get_cursor("t", "c", "reader")


async def test_dirty_and_lifecycle_calls(hosts: tuple[StubState, str, str]) -> None:
    state, leader, _ = hosts
    state.logs["big"] = [{}] * 5
    state.logs["small"] = [{}]
    async with client(leader, Sleeps()) as c:
        d = await c.dirty(min_records=2, limit=10)
        assert d.server_id == "stub" and [x.collection_id for x in d.logs] == ["big"]
        assert d.logs[0].num_records == 5
        assert (await c.seal("t", "big"))["action"] == "seal"
        assert (await c.fork("t", "big", "copy"))["action"] == "fork"


async def test_unreachable_host_retries_then_raises() -> None:
    with socket.socket() as s:  # a port with nothing listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps = Sleeps()
    async with LogHostClient(f"http://127.0.0.1:{port}", KEY, sleep=sleeps, max_retries=2) as c:
        with pytest.raises(LogHostUnavailable):
            await c.append("t", "c", RECS)  # never sent, so even a key-less append is retried
    assert len(sleeps.waits) == 2


async def test_ambiguous_transport_failure_is_not_retried_for_appends() -> None:
    calls: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request.method)
        raise httpx.ReadTimeout("lost the answer", request=request)

    transport = httpx.MockTransport(handler)
    async with LogHostClient("http://127.0.0.1:9", KEY, sleep=Sleeps(), transport=transport) as c:
        with pytest.raises(LogHostUnavailable) as info:
            await c.append("t", "c", RECS)
        assert "may or may not" in str(info.value) and calls == ["POST"]
        with pytest.raises(LogHostUnavailable):
            await c.state("t", "c")
    assert calls.count("GET") == 1 + c.max_retries


def test_parse_retry_after() -> None:
    assert parse_retry_after("3") == 3.0
    assert parse_retry_after("0.25") == 0.25
    assert parse_retry_after(None) is None
    assert parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT", now=1445412470.0) == 10.0
