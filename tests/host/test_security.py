"""Authentication, tenant isolation and key hygiene, checked on every route of the running app.

The routes are enumerated from the app the live server actually runs (``live_server`` is given a
``create_app`` that records the app it builds), so a route added later is covered without editing
this file, and one added without authentication fails here.

Public by decision (operational endpoints that carry no tenant data): ``/healthz`` and ``/readyz``
(probes of load balancers and orchestrators, which hold no keys), ``/metrics`` (scraped by
Prometheus; its labels are route templates and status codes, never tenants, ids or keys, which
``test_public_endpoints_need_no_key_and_reveal_no_tenant_data`` checks) and the API's own
description ``/openapi.json``, ``/docs``, ``/docs/oauth2-redirect`` and ``/redoc``.  Every other
route answers 401 without a valid key.
"""

from __future__ import annotations

import io
import json
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from starlette.routing import Route

from host import jsonlog
from wal3 import LocalStore

from .live import CID, KEYS, Live, assert_error, live_server, log_path, record

pytestmark = pytest.mark.asyncio(loop_scope="module")

PUBLIC = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
}
BOB_CID = "3f0c2d8e-9a41-4d7b-8e25-5c6b7a8d9e10"
VALID_KEYS = [k.split("=")[0] for k in KEYS.split(",")]  # svc-key, alice-key, bob-key
WRONG = [
    "Bearer not-a-key",
    "Bearer alice-key-",
    "Bearer ALICE-KEY",
    "alice-key",
    "Basic alice-key",
    "Bearer svc-key svc-key",
]
BASE = "/v1/tenants/{tenant}/logs/{collection_id}"
# per-log routes only a service key may use (see the role table in README.md)
SERVICE_ONLY = ("/fragments", "/compaction", "/seal", "/fork", "/gc", "/scrub")


def app_routes(app: FastAPI) -> list[tuple[str, str]]:
    """(METHOD, path template) of every route of an app, included routers flattened.

    FastAPI >= 0.16x keeps an included router as one node of ``app.routes``; its routes are
    reached through ``iter_route_contexts``.  Older versions copy them into ``app.routes``.
    """
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # an older FastAPI: app.routes is flat
        routes: list[Any] = [r for r in app.routes if isinstance(r, Route)]
    else:
        routes = list(iter_route_contexts(app.routes))
    out = {
        (m, r.path) for r in routes if r.path is not None for m in (r.methods or ()) if m != "HEAD"
    }
    return sorted(out)


def _valid_body(method: str, template: str, target: str | None = None) -> dict[str, Any] | None:
    """A body the route would accept, so a refusal is about the key, never about the body."""
    if method == "POST" and template.endswith("/records"):
        return {"records": [record("intruder", document="from the wrong key")]}
    if method == "PUT" and "/cursors/" in template:
        return {"offset": 1, "witness": None}
    if template.endswith("/compaction"):
        return {"offset": 2}
    if template.endswith("/fork"):
        return {"target_collection_id": target or str(uuid.uuid4())}
    if template.endswith("/dirty/purge"):
        return {"collection_ids": [CID]}
    if template.endswith("/dirty/adopt"):
        return {"server_id": "some-departed-host"}
    return None


def concrete(template: str, tenant: str = "alice", cid: str = CID, name: str = "reader") -> str:
    return (
        template.replace("{tenant}", tenant).replace("{collection_id}", cid).replace("{name}", name)
    )


@dataclass
class Env:
    live: Live
    app: FastAPI
    root: Path
    svc: httpx.AsyncClient
    anon: httpx.AsyncClient

    def routes(self) -> list[tuple[str, str]]:
        """(METHOD, path template) of every route the running app serves."""
        return app_routes(self.app)

    def protected(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.routes() if p not in PUBLIC]

    def per_log(self) -> list[tuple[str, str]]:
        return [(m, p) for m, p in self.routes() if p.startswith(BASE)]


def store_snapshot(root: Path, under: str = "") -> dict[str, bytes]:
    base = root / under
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}
        if base.exists()
        else {}
    )


async def alice_view(env: Env) -> dict[str, Any]:
    """Everything observable about alice's log, read with the service key, plus its objects."""
    path = log_path("alice", CID)
    state = await env.svc.get(path)
    assert state.status_code == 200, state.text
    recs = await env.svc.get(path + "/records", params={"from": state.json()["oldest_offset"]})
    cursor = await env.svc.get(path + "/cursors/reader")
    return {
        "state": state.json(),
        "records": recs.json(),
        "cursor": cursor.json(),
        "objects": store_snapshot(env.root, f"logs/{CID}"),
    }


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory, recorded_apps: list[FastAPI]
) -> AsyncIterator[Env]:
    root = tmp_path_factory.mktemp("security") / "store"
    built = len(recorded_apps)
    # fsync off: isolation is about what is stored, not durability (a real LocalStore all the same)
    async with live_server(store=LocalStore(root, fsync=False), gc_grace_s=3600) as lv:
        assert len(recorded_apps) == built + 1, "live_server did not build its app as expected"
        app = recorded_apps[-1]
        for key, tenant, cid in (("alice-key", "alice", CID), ("bob-key", "bob", BOB_CID)):
            async with lv.client(key) as c:
                path = log_path(tenant, cid)
                r = await c.post(
                    path + "/records",
                    json={
                        "records": [
                            record(f"{tenant}-{i}", document=f"{tenant} secret {i}")
                            for i in range(4)
                        ]
                    },
                )
                assert r.status_code == 200, r.text
                r = await c.put(path + "/cursors/reader", json={"offset": 2, "witness": None})
                assert r.status_code == 200, r.text
        async with (
            lv.client() as svc,
            httpx.AsyncClient(base_url=lv.url, timeout=30, trust_env=False) as anon,
        ):
            yield Env(lv, app, root, svc, anon)


async def send(
    env: Env, method: str, url: str, authorization: str | None, body: dict[str, Any] | None
) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    return await env.anon.request(method, url, headers=headers, json=body)


# ----------------------------------------------------------------------------- the routes


async def test_the_app_has_the_routes_this_file_expects(env: Env) -> None:
    routes = env.routes()
    paths = {p for _, p in routes}
    assert paths >= PUBLIC, PUBLIC - paths
    assert {
        "/v1/dirty",
        "/v1/dirty/rollup",
        "/v1/dirty/purge",
        "/v1/dirty/inspect",
        "/v1/dirty/adopt",
    } <= paths
    assert len(env.per_log()) >= 12, env.per_log()
    # every protected route is either per log, a service route under /v1/dirty, or the
    # per-tenant metrics (service key: they name tenants)
    for _, p in env.protected():
        assert p.startswith((BASE, "/v1/dirty")) or p == "/metrics/tenants", p


async def test_every_route_refuses_a_missing_or_wrong_key(env: Env) -> None:
    before = await alice_view(env)
    checked = 0
    for method, template in env.protected():
        url = concrete(template)
        for authorization in [None, *WRONG]:
            r = await send(env, method, url, authorization, _valid_body(method, template))
            err = assert_error(r, 401, "unauthorized")
            for secret in [*VALID_KEYS, "not-a-key"]:
                assert secret not in r.text, (method, url, r.text)
            assert err["message"], err
            checked += 1
    assert checked == len(env.protected()) * (1 + len(WRONG))
    assert await alice_view(env) == before


async def test_public_endpoints_need_no_key_and_reveal_no_tenant_data(env: Env) -> None:
    for method, path in env.routes():
        if path not in PUBLIC:
            continue
        r = await env.anon.request(method, path)
        assert r.status_code == 200, (path, r.status_code, r.text)
        if path == "/metrics":
            for secret in [CID, BOB_CID, "alice", "bob", *VALID_KEYS]:
                assert secret not in r.text, f"/metrics reveals {secret!r}"


# --------------------------------------------------------------------------- cross-tenant
# A tenant key on another tenant's path (403), and tenant keys on service routes (403), are cells
# of the matrix in test_authz.py; here: a tenant naming another tenant's log under its own path.


async def test_alices_id_on_bobs_path_is_404_like_a_never_written_id(env: Env) -> None:
    """Bob names alice's collection under his own tenant: 404, the same answer (but for the id)
    as for an id nobody ever wrote, so bob learns nothing about alice's log.  Service-only routes
    are called with the service key on bob's path: it may not reach alice's log that way either."""
    before = await alice_view(env)
    async with env.live.client("bob-key") as bob_key:
        for method, template in env.per_log():
            # bob's own key where it may act, the service key (acting for bob) elsewhere
            bob = env.svc if template.endswith(SERVICE_ONLY) else bob_key
            never_written = str(uuid.uuid4())
            target = str(uuid.uuid4())
            r = await bob.request(
                method,
                concrete(template, tenant="bob", cid=CID),
                json=_valid_body(method, template, target),
            )
            err = assert_error(r, 404, "not_found")
            assert "alice" not in r.text, r.text
            if method == "POST" and template.endswith("/records"):
                continue  # an append to a never-written id creates it: nothing to compare
            other = await bob.request(
                method,
                concrete(template, tenant="bob", cid=never_written),
                json=_valid_body(method, template, target),
            )
            assert other.status_code == 404, (method, template, other.text)
            assert r.json() == json.loads(other.text.replace(never_written, CID)), (
                method,
                template,
                err,
                other.json(),
            )
            assert_error(await env.svc.get(log_path("bob", target)), 404)
    assert await alice_view(env) == before


async def test_fork_into_another_tenants_log_is_refused_and_touches_nothing(env: Env) -> None:
    """Forking is the service's (bob's own key gets 403, a matrix cell); the service key acting
    on bob's path cannot fork into, or out of, alice's log."""
    before = await alice_view(env)
    bob_before = store_snapshot(env.root, f"logs/{BOB_CID}")
    svc = env.svc
    # from bob's log into alice's existing collection id
    r = await svc.post(log_path("bob", BOB_CID) + "/fork", json={"target_collection_id": CID})
    assert r.status_code in (404, 409), r.text
    assert_error(r, r.status_code)
    assert "alice" not in r.text
    # the same at an explicit offset
    r = await svc.post(
        log_path("bob", BOB_CID) + "/fork", json={"target_collection_id": CID, "offset": 1}
    )
    assert r.status_code in (404, 409), r.text
    # from alice's log (named under bob's tenant) into a fresh id of bob's
    fresh = str(uuid.uuid4())
    r = await svc.post(log_path("bob", CID) + "/fork", json={"target_collection_id": fresh})
    assert_error(r, 404, "not_found")
    assert_error(await svc.get(log_path("bob", fresh)), 404)
    assert not (env.root / "logs" / fresh).exists(), "a refused fork left objects behind"
    assert await alice_view(env) == before
    assert store_snapshot(env.root, f"logs/{BOB_CID}") == bob_before
    assert (await env.svc.get(log_path("alice", CID))).json()["tenant"] == "alice"


async def test_fragment_urls_stay_within_the_tenant(env: Env) -> None:
    """Fragment URLs are for service keys (tenant keys get 403, a matrix cell); those of bob's
    log name bob's objects only, and alice's log cannot be reached through bob's path."""
    r = await env.svc.get(log_path("bob", BOB_CID) + "/fragments")
    assert r.status_code == 200, r.text
    urls = [f["url"] for f in r.json()["fragments"]]
    assert urls and all(BOB_CID in u and CID not in u for u in urls), urls
    assert_error(await env.svc.get(log_path("bob", CID) + "/fragments"), 404)
    async with env.live.client("bob-key") as bob:
        r = await bob.get(log_path("bob", BOB_CID) + "/fragments")
        err = assert_error(r, 403, "forbidden")
        assert "file://" not in r.text and str(env.root) not in r.text, err


# ------------------------------------------------------------------------------ the logs


class _Capture(logging.Handler):
    """Every log record of the server, formatted as the server's JSON lines."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.stream = io.StringIO()
        self.setFormatter(jsonlog.JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] in ("httpx", "httpcore"):  # the test's own client
            return
        self.stream.write(self.format(record) + "\n")


INVALID_KEYS = ["sneaky-invalid-key-7f3a", "x" * 600 + "-long-invalid-key", "alice-key-plus"]
LOGGED_NEVER_WRITTEN = "5b4a3928-1706-4f5e-8d7c-6b5a49382716"


@dataclass
class LoggedRun:
    """What the server logged while serving every key, valid and not."""

    text: str
    by_rid: dict[str, list[dict[str, Any]]]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def logged_run(tmp_path_factory: pytest.TempPathFactory) -> LoggedRun:
    handler = _Capture()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        store = tmp_path_factory.mktemp("logged") / "store"
        async with live_server(store=LocalStore(store, fsync=False)) as lv:
            async with httpx.AsyncClient(base_url=lv.url, timeout=30, trust_env=False) as c:
                await _use_every_key(c)
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
    text = handler.stream.getvalue()
    by_rid: dict[str, list[dict[str, Any]]] = {}
    for line in text.splitlines():
        if line.strip():
            doc = json.loads(line)
            if doc.get("request_id"):
                by_rid.setdefault(doc["request_id"], []).append(doc)
    return LoggedRun(text, by_rid)


async def _use_every_key(c: httpx.AsyncClient) -> None:
    def h(key: str, rid: str, scheme: str = "Bearer") -> dict[str, str]:
        return {"Authorization": f"{scheme} {key}", "X-Request-Id": rid}

    alice = log_path("alice", CID)
    r = await c.post(
        alice + "/records",
        json={"records": [record("a")]},
        headers=h("alice-key", "rid-alice-append"),
    )
    assert r.status_code == 200, r.text
    r = await c.get(alice + "/records", headers=h("alice-key", "rid-alice-read"))
    assert r.status_code == 200
    r = await c.get(log_path("alice", LOGGED_NEVER_WRITTEN), headers=h("alice-key", "rid-404"))
    assert r.status_code == 404
    r = await c.get(alice, headers=h("bob-key", "rid-bob-403"))
    assert r.status_code == 403
    r = await c.post(
        log_path("bob", BOB_CID) + "/records",
        json={"records": [record("b")]},
        headers=h("bob-key", "rid-bob-append"),
    )
    assert r.status_code == 200
    r = await c.get("/v1/dirty", headers=h("svc-key", "rid-svc-dirty"))
    assert r.status_code == 200
    r = await c.get(alice, headers=h("svc-key", "rid-svc-state"))
    assert r.status_code == 200
    r = await c.post(alice + "/records", content=b"{not json", headers=h("alice-key", "rid-400"))
    assert r.status_code == 400
    for i, key in enumerate(INVALID_KEYS):
        for scheme in ("Bearer", "Basic", "Token"):
            r = await c.get(alice, headers=h(key, f"rid-invalid-{i}-{scheme}", scheme))
            assert r.status_code == 401
            assert key not in r.text
    r = await c.get(alice, headers={"Authorization": INVALID_KEYS[0], "X-Request-Id": "rid-bare"})
    assert r.status_code == 401


async def test_keys_never_appear_in_the_server_log(logged_run: LoggedRun) -> None:
    assert logged_run.text, "the server logged nothing"
    for secret in VALID_KEYS + INVALID_KEYS:
        assert secret not in logged_run.text, f"key {secret[:24]!r} appears in the server log"
    # the requests were logged (so the absence of keys means something)
    for rid in (
        "rid-alice-append",
        "rid-bob-403",
        "rid-svc-dirty",
        "rid-invalid-0-Bearer",
        "rid-invalid-1-Basic",
        "rid-bare",
    ):
        assert logged_run.by_rid.get(rid), f"no log line carries request_id {rid}"
    statuses = {x.get("status") for lines in logged_run.by_rid.values() for x in lines}
    assert {200, 401, 403, 404, 400} <= statuses, statuses


async def test_request_log_lines_carry_tenant_and_collection_id(logged_run: LoggedRun) -> None:
    """The log line of a per-log request says whose log it was (request_id, tenant,
    collection_id), whoever's key it was."""
    for rid, tenant, cid in (
        ("rid-alice-append", "alice", CID),
        ("rid-alice-read", "alice", CID),
        ("rid-bob-append", "bob", BOB_CID),
        ("rid-404", "alice", LOGGED_NEVER_WRITTEN),
        ("rid-svc-state", "alice", CID),
    ):
        lines = [x for x in logged_run.by_rid.get(rid, []) if x.get("msg") == "request"]
        assert lines, f"no request line for {rid}"
        assert any(x.get("tenant") == tenant and x.get("collection_id") == cid for x in lines), (
            f"{rid}: the request line lacks tenant={tenant} collection_id={cid}: {lines}"
        )
