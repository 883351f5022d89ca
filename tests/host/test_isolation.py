"""Tenant isolation on every per-log endpoint, service-only endpoints, and keys kept out of the logs."""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio

from host.jsonlog import JsonFormatter
from wal3 import LocalStore

from .live import CID, KEYS, Live, assert_error, live_server, log_path, read_all, record

ALICE_LOG = CID
BOB_LOG = "0b0b0b0b-1111-4222-8333-444455556666"


def endpoints() -> list[tuple[str, str, dict[str, Any] | None]]:
    """Every per-log endpoint with a plausible request (method, suffix, JSON body)."""
    return [
        ("GET", "", None),
        ("GET", "/records?from=1", None),
        ("GET", "/records?from=1&wait_ms=50", None),
        ("POST", "/records", {"records": [record("intruder")]}),
        ("POST", "/records", {"records": [record("intruder")], "idempotency_key": "alice-k1"}),
        ("GET", "/fragments", None),
        ("GET", "/fragments?from=1", None),
        ("GET", "/cursors/mine", None),
        ("PUT", "/cursors/mine", {"offset": 1, "witness": None}),
        ("PUT", "/cursors/evil", {"offset": 1, "witness": None}),
        ("DELETE", "/cursors/mine", None),
        ("POST", "/compaction", {"offset": 3}),
        ("POST", "/seal", None),
        ("POST", "/fork", {"target_collection_id": str(uuid.uuid4())}),
        ("POST", "/gc", None),
        ("GET", "/scrub", None),
    ]


ENDPOINT_IDS = [f"{m} {s or '/'}" for m, s, _ in endpoints()]
# per-log endpoints only a service key may use (see the role table in README.md)
SERVICE_ONLY = ("/fragments", "/compaction", "/seal", "/fork", "/gc", "/scrub")


def service_only(suffix: str) -> bool:
    return suffix.split("?")[0] in SERVICE_ONLY


async def _populated(root: Path) -> AsyncIterator[Live]:
    async with live_server(store=LocalStore(root, fsync=False)) as lv:
        async with lv.client("alice-key") as alice:
            a = alice.post(
                log_path("alice", ALICE_LOG) + "/records",
                json={
                    "records": [record("sx1"), record("sx2"), record("sx3")],
                    "idempotency_key": "alice-k1",
                },
            )
            assert (await a).status_code == 200
            r = await alice.put(
                log_path("alice", ALICE_LOG) + "/cursors/mine", json={"offset": 2, "witness": None}
            )
            assert r.status_code == 200, r.text
        async with lv.client() as svc:  # compaction is the service's
            r = await svc.post(log_path("alice", ALICE_LOG) + "/compaction", json={"offset": 2})
            assert r.status_code == 200, r.text
        async with lv.client("bob-key") as bob:
            r = await bob.post(
                log_path("bob", BOB_LOG) + "/records", json={"records": [record("b1")]}
            )
            assert r.status_code == 200, r.text
        yield lv


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    """alice's log (3 records, cursor "mine" at 2, compaction at 2) and bob's log (1 record)."""
    async for lv in _populated(tmp_path / "store"):
        yield lv


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    """The same, shared by the per-endpoint cases (each checks alice's log is unchanged)."""
    async for lv in _populated(tmp_path_factory.mktemp("iso") / "store"):
        yield lv


async def snapshot(lv: Live, tenant: str, cid: str) -> dict[str, Any]:
    """Everything the owner can see of a log."""
    key = f"{tenant}-key"
    async with lv.client(key) as c:
        path = log_path(tenant, cid)
        state = (await c.get(path)).json()
        records = await read_all(c, path)
        cursors = {}
        for name in ("mine", "evil", "compaction"):
            r = await c.get(path + f"/cursors/{name}")
            cursors[name] = r.json() if r.status_code == 200 else r.status_code
    return {"state": state, "records": records, "cursors": cursors}


async def call(
    c: httpx.AsyncClient, method: str, url: str, body: dict[str, Any] | None
) -> httpx.Response:
    return (
        await c.request(method, url, json=body)
        if body is not None
        else await c.request(method, url)
    )


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(("method", "suffix", "body"), endpoints(), ids=ENDPOINT_IDS)
async def test_bob_can_neither_act_on_nor_learn_of_alices_log(
    shared: Live, method: str, suffix: str, body: dict[str, Any] | None
) -> None:
    """Alice's collection named through bob's own path.  (Bob's key on alice's path is 403: a
    cell of the matrix in test_authz.py.)"""
    before = await snapshot(shared, "alice", ALICE_LOG)
    if not service_only(suffix):
        async with shared.client("bob-key") as bob:
            # 404, nothing of alice's in the answer
            r = await call(bob, method, log_path("bob", ALICE_LOG) + suffix, body)
            assert_error(r, 404)
            assert "alice" not in r.text and "sx1" not in r.text
    async with shared.client() as svc:  # the service key on the wrong tenant's path: 404 as well
        r = await call(svc, method, log_path("bob", ALICE_LOG) + suffix, body)
        assert_error(r, 404)
        assert "alice" not in r.text
    assert await snapshot(shared, "alice", ALICE_LOG) == before
    if suffix == "/fork":  # the refused forks created nothing, bound nothing
        assert body is not None
        target = body["target_collection_id"]
        async with shared.client("alice-key") as alice:
            assert_error(await alice.get(log_path("alice", target)), 404)
            r = await alice.post(
                log_path("alice", target) + "/records", json={"records": [record("mine")]}
            )
            assert r.status_code == 200, r.text


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "suffix", ["", "/records", "/fragments", "/cursors/mine", "/cursors/compaction", "/scrub"]
)
async def test_404_for_foreign_log_is_indistinguishable_from_no_log(
    shared: Live, suffix: str
) -> None:
    never = str(uuid.uuid4())
    async with shared.client("bob-key" if not service_only(suffix) else "svc-key") as bob:
        foreign = await bob.get(log_path("bob", ALICE_LOG) + suffix)
        missing = await bob.get(log_path("bob", never) + suffix)
    assert foreign.status_code == missing.status_code == 404
    fe, me = foreign.json()["error"], missing.json()["error"]
    assert fe["code"] == me["code"]
    assert fe["message"].replace(ALICE_LOG, "X") == me["message"].replace(never, "X")


async def test_cannot_fork_into_or_out_of_another_tenants_log(live: Live) -> None:
    alice_before = await snapshot(live, "alice", ALICE_LOG)
    bob_before = await snapshot(live, "bob", BOB_LOG)
    # forking is the service's (tenant keys get 403: the matrix in test_authz.py); acting for
    # one tenant it cannot fork into another tenant's collection
    async with live.client() as svc:
        r = await svc.post(
            log_path("bob", BOB_LOG) + "/fork", json={"target_collection_id": ALICE_LOG}
        )
        assert_error(r, 404)
        assert "alice" not in r.text
        r = await svc.post(
            log_path("alice", ALICE_LOG) + "/fork", json={"target_collection_id": BOB_LOG}
        )
        assert_error(r, 404)
    assert await snapshot(live, "alice", ALICE_LOG) == alice_before
    assert await snapshot(live, "bob", BOB_LOG) == bob_before
    # a fork into a fresh collection belongs to the forking tenant only
    fresh = str(uuid.uuid4())
    async with live.client() as svc:
        r = await svc.post(
            log_path("bob", BOB_LOG) + "/fork", json={"target_collection_id": fresh, "offset": 1}
        )
        assert r.status_code == 200, r.text
        assert r.json()["tenant"] == "bob"
    async with live.client("bob-key") as bob:
        assert [x["record"]["id"] for x in await read_all(bob, log_path("bob", fresh))] == ["b1"]
    async with live.client("alice-key") as alice:
        assert_error(await alice.get(log_path("alice", fresh)), 404)
        assert_error(await alice.get(log_path("alice", fresh) + "/records"), 404)


async def test_idempotency_keys_do_not_cross_tenants(live: Live) -> None:
    """bob reusing alice's idempotency key on his own log gets his own append, not alice's answer."""
    async with live.client("bob-key") as bob:
        r = await bob.post(
            log_path("bob", BOB_LOG) + "/records",
            json={"records": [record("b2")], "idempotency_key": "alice-k1"},
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"first_offset": 2, "count": 1, "next_offset": 3}


# Tenant keys on the /v1/dirty routes (403) are cells of the matrix in test_authz.py.


async def test_service_key_acts_on_every_tenant(live: Live) -> None:
    async with live.client() as svc:
        for tenant, cid in (("alice", ALICE_LOG), ("bob", BOB_LOG)):
            r = await svc.get(log_path(tenant, cid))
            assert r.status_code == 200 and r.json()["tenant"] == tenant
            r = await svc.post(
                log_path(tenant, cid) + "/records", json={"records": [record("svc")]}
            )
            assert r.status_code == 200, r.text
        r = await svc.post("/v1/dirty/rollup")
        listed = {e["collection_id"]: e["tenant"] for e in r.json()["logs"]}
        assert listed.get(ALICE_LOG) == "alice" and listed.get(BOB_LOG) == "bob"


# ------------------------------------------------------------------------ keys and the logs


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """Every log record of the process as JSON lines (the server's formatter), INFO and up."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield buf
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def test_logs_carry_request_context_and_never_keys(
    tmp_path: Path, json_log: io.StringIO
) -> None:
    secrets = [k.split("=")[0] for k in KEYS.split(",")] + ["unknown-sekrit-key-42"]
    async with live_server(str(tmp_path / "store")) as lv:
        async with lv.client("alice-key") as alice:
            r = await alice.post(
                log_path("alice", ALICE_LOG) + "/records",
                json={"records": [record("a")]},
                headers={"X-Request-Id": "rid-append-1"},
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "rid-append-1"
            r = await alice.get(
                log_path("alice", ALICE_LOG) + "/records", headers={"X-Request-Id": "rid-read-1"}
            )
            assert r.status_code == 200
            r = await alice.get(
                log_path("alice", uuid.uuid4()), headers={"X-Request-Id": "rid-404"}
            )
            assert r.status_code == 404
        async with lv.client("bob-key") as bob:
            assert (await bob.get(log_path("alice", ALICE_LOG))).status_code == 403
        async with lv.client() as svc:
            assert (await svc.get("/v1/dirty")).status_code == 200
            assert (await svc.get(log_path("alice", ALICE_LOG))).status_code == 200
        async with httpx.AsyncClient(base_url=lv.url) as anon:
            for header in (
                "Bearer unknown-sekrit-key-42",
                "Basic unknown-sekrit-key-42",
                "unknown-sekrit-key-42",
            ):
                r = await anon.get(log_path("alice", ALICE_LOG), headers={"Authorization": header})
                assert r.status_code == 401
                assert "unknown-sekrit-key-42" not in r.text
    text = json_log.getvalue()
    assert text, "the server logged nothing"
    for secret in secrets:
        assert secret not in text, f"API key {secret!r} appears in the server's logs"
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    requests = [x for x in lines if x.get("msg") == "request"]
    assert requests, "no request log lines"
    assert all(x.get("request_id") for x in requests), requests
    by_id = {x["request_id"]: x for x in requests}
    for rid, method in (("rid-append-1", "POST"), ("rid-read-1", "GET")):
        line = by_id.get(rid)
        assert line is not None, f"no request line for {rid}"
        assert line.get("method") == method and line.get("status") == 200, line
        assert line.get("tenant") == "alice", line
        assert line.get("collection_id") == ALICE_LOG, line
    assert by_id["rid-404"].get("tenant") == "alice", by_id["rid-404"]
