"""Authorization: every route of the running app × every kind of caller, with the exact status.

The routes come from the route table of the app the live server runs (``app.routes``); a route
without a row in ``MATRIX`` (or a row without a route) fails ``test_the_matrix_covers_every_route``.

Callers (columns):

* ``none``    – no Authorization header
* ``wrong``   – an unknown key
* ``other``   – bob's tenant key on alice's paths (for a per-log route: alice's existing log and
  a never-written id of alice's, both refused alike, so existence is not leaked)
* ``tenant``  – alice's tenant key (``key=alice``)
* ``reader``  – alice's read-only key (``key=alice:read``)
* ``service`` – the service key (``key=*``)

Every refused cell also checks that the store is byte-for-byte unchanged and that the error
names the role needed.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import pytest_asyncio
from fastapi import FastAPI
from starlette.routing import Mount

from wal3 import LocalStore

from .live import KEYS, Live, assert_error, live_server, log_path, record

pytestmark = pytest.mark.asyncio(loop_scope="module")

READER_KEY = "alice-read-key"
API_KEYS = f"{KEYS},{READER_KEY}=alice:read"
CALLERS: dict[str, str | None] = {
    "none": None,
    "wrong": "Bearer not-a-key",
    "other": "Bearer bob-key",
    "tenant": "Bearer alice-key",
    "reader": f"Bearer {READER_KEY}",
    "service": "Bearer svc-key",
}
COLUMNS = tuple(CALLERS)
BASE = "/v1/tenants/{tenant}/logs/{collection_id}"
NEW_CURSOR = "fresh_pos"  # a cursor the PUT cell creates


@dataclass(frozen=True)
class Row:
    """The exact status per caller, in ``COLUMNS`` order, and the role a refusal names."""

    statuses: tuple[int, int, int, int, int, int]
    needs: str = ""  # words the 403 message of a tenant-scoped refusal must contain

    def status(self, caller: str) -> int:
        return self.statuses[COLUMNS.index(caller)]


SERVICE_ONLY = Row((401, 401, 403, 403, 403, 200), "service key (key=*)")
TENANT_WRITE = Row((401, 401, 403, 200, 403, 200), "tenant key (key=tenant)")
TENANT_READ = Row((401, 401, 403, 200, 200, 200))
PUBLIC = Row((200, 200, 200, 200, 200, 200))

# (METHOD, path template) -> exact status per caller:  none wrong other tenant reader service
MATRIX: dict[tuple[str, str], Row] = {
    ("POST", BASE + "/records"): TENANT_WRITE,
    ("GET", BASE + "/records"): TENANT_READ,  # long-poll included (wait_ms)
    ("GET", BASE): TENANT_READ,
    # fragment URLs name the store's objects (file:// paths of the server's disk): service only
    ("GET", BASE + "/fragments"): SERVICE_ONLY,
    ("GET", BASE + "/cursors/{name}"): TENANT_READ,
    ("PUT", BASE + "/cursors/{name}"): TENANT_WRITE,
    ("DELETE", BASE + "/cursors/{name}"): TENANT_WRITE,
    ("POST", BASE + "/compaction"): SERVICE_ONLY,
    ("POST", BASE + "/seal"): SERVICE_ONLY,
    ("POST", BASE + "/fork"): SERVICE_ONLY,
    ("POST", BASE + "/gc"): SERVICE_ONLY,
    ("GET", BASE + "/scrub"): SERVICE_ONLY,
    ("GET", "/v1/dirty"): SERVICE_ONLY,
    ("POST", "/v1/dirty/rollup"): SERVICE_ONLY,
    ("POST", "/v1/dirty/purge"): SERVICE_ONLY,
    # 404 for the service: authorized, but no departed host of that name left a dirty log
    ("POST", "/v1/dirty/adopt"): Row((401, 401, 403, 403, 403, 404), "service key (key=*)"),
    ("GET", "/v1/dirty/inspect"): SERVICE_ONLY,
    ("GET", "/healthz"): PUBLIC,
    ("GET", "/readyz"): PUBLIC,
    ("GET", "/metrics"): PUBLIC,
    ("GET", "/metrics/tenants"): SERVICE_ONLY,
    ("GET", "/openapi.json"): PUBLIC,
    ("GET", "/docs"): PUBLIC,
    ("GET", "/docs/oauth2-redirect"): PUBLIC,
    ("GET", "/redoc"): PUBLIC,
    ("GET", "/docs/assets/{path}"): PUBLIC,  # a Mount: the page's own scripts and styles
}
CELLS = [(m, p, c) for (m, p) in MATRIX for c in COLUMNS]


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    """(METHOD, path template) of every route and mount of an app, routers flattened."""
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # an older FastAPI: app.routes is flat
        routes: list[Any] = list(app.routes)
    else:
        routes = [
            *iter_route_contexts(app.routes),
            *(r for r in app.routes if isinstance(r, Mount)),
        ]
    out: set[tuple[str, str]] = set()
    for r in routes:
        if isinstance(r, Mount):
            out.add(("GET", r.path + "/{path}"))
        elif getattr(r, "path", None) is not None:
            out.update((m, r.path) for m in (getattr(r, "methods", None) or ()) if m != "HEAD")
    return out


@dataclass
class Env:
    live: Live
    app: FastAPI
    root: Path
    svc: httpx.AsyncClient
    anon: httpx.AsyncClient


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(
    tmp_path_factory: pytest.TempPathFactory, recorded_apps: list[FastAPI]
) -> AsyncIterator[Env]:
    root = tmp_path_factory.mktemp("authz") / "store"
    async with live_server(
        store=LocalStore(root, fsync=False), api_keys=API_KEYS, gc_grace_s=0.0
    ) as lv:
        app = recorded_apps[-1]
        async with (
            lv.client() as svc,
            httpx.AsyncClient(base_url=lv.url, timeout=30, trust_env=False) as anon,
        ):
            yield Env(lv, app, root, svc, anon)


def store_files(root: Path) -> dict[str, bytes]:
    """Every object of the store, by path."""
    return (
        {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
        if root.exists()
        else {}
    )


async def fresh_log(env: Env) -> tuple[str, str]:
    """A new log of alice's (2 records, cursor ``pos`` at 1): its id and the cursor's witness."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid)
    r = await env.svc.post(
        path + "/records",
        json={
            "records": [
                record("s1", document="alice secret 1"),
                record("s2", document="alice secret 2"),
            ]
        },
    )
    assert r.status_code == 200, r.text
    r = await env.svc.put(path + "/cursors/pos", json={"offset": 1, "witness": None})
    assert r.status_code == 200, r.text
    return cid, r.json()["witness"]


def request_for(method: str, template: str, cid: str, witness: str) -> tuple[str, Any]:
    """A request the route would carry out, so a refusal is about the key only."""
    url = template.replace("{tenant}", "alice").replace("{collection_id}", cid)
    body: Any = None
    if template == BASE + "/records" and method == "POST":
        body = {"records": [record("new", document="appended")]}
    elif template == BASE + "/records":
        url += "?from=1&wait_ms=1"
    elif template.endswith("/cursors/{name}"):
        url = url.replace("{name}", NEW_CURSOR if method == "PUT" else "pos")
        if method == "PUT":
            body = {"offset": 2, "witness": None}
    elif template.endswith("/compaction"):
        body = {"offset": 2}
    elif template.endswith("/fork"):
        body = {"target_collection_id": str(uuid.uuid4())}
    elif template == "/v1/dirty/purge":
        body = {"collection_ids": [cid]}
    elif template == "/v1/dirty/adopt":
        body = {"server_id": "departed-host"}
    elif template == "/v1/dirty":
        url += "?min_records=0"
    elif template.endswith("/{path}"):
        url = url.replace("{path}", "swagger-ui.css")
    return url, body


async def send(env: Env, method: str, url: str, caller: str, body: Any) -> httpx.Response:
    auth = CALLERS[caller]
    headers = {} if auth is None else {"Authorization": auth}
    return await env.anon.request(method, url, headers=headers, json=body)


# ---------------------------------------------------------------------------------- the matrix


async def test_the_matrix_covers_every_route(env: Env) -> None:
    routes = app_routes(env.app)
    assert routes - set(MATRIX) == set(), "routes without a row in MATRIX"
    assert set(MATRIX) - routes == set(), "rows of MATRIX for routes the app does not have"


@pytest.mark.parametrize(
    ("method", "template", "caller"), CELLS, ids=[f"{m} {p} {c}" for m, p, c in CELLS]
)
async def test_every_route_for_every_caller(
    env: Env, method: str, template: str, caller: str
) -> None:
    row = MATRIX[(method, template)]
    expected = row.status(caller)
    per_log = template.startswith(BASE)
    cid, witness = await fresh_log(env) if per_log else (str(uuid.uuid4()), "")
    url, body = request_for(method, template, cid, witness)
    before = store_files(env.root)
    r = await send(env, method, url, caller, body)
    assert r.status_code == expected, (caller, method, url, r.status_code, r.text)
    if expected in (401, 403):
        err = assert_error(r, expected, {401: "unauthorized", 403: "forbidden"}[expected])
        assert "alice secret" not in r.text
        if expected == 403 and caller == "other" and per_log:
            assert "tenant 'alice'" in err["message"], err
        elif expected == 403:
            assert row.needs and row.needs in err["message"], err
        assert store_files(env.root) == before, "a refused request changed the store"
    if caller == "other" and per_log:  # a never-written id of alice's: the same answer
        never = url.replace(cid, str(uuid.uuid4()))
        r2 = await send(env, method, never, caller, body)
        assert r2.status_code == expected and r2.json() == r.json(), r2.text


# -------------------------------------------------------------------- the compaction cursor


RESERVED_SPELLINGS = [
    ("compaction", 403),
    ("Compaction", 403),
    ("COMPACTION", 403),
    ("%63ompaction", 403),
    ("stable_prefix", 403),
    ("_system", 403),
    ("loghost_gc", 403),
    ("Loghost_x", 403),
    ("compaction%0A", 400),
    ("compaction%0D%0A", 400),
    ("compaction%00", 400),
    ("compaction%20", 400),
    ("%20compaction", 400),
    ("compaction.json", 400),
    ("compaction%2Ejson", 400),
    ("..%2Fcursor%2Fcompaction", 404),
    ("compaction%2F", 307),  # the slash redirect, to a path that then answers 403
]


async def compaction_view(env: Env, cid: str) -> dict[str, Any]:
    path = log_path("alice", cid)
    cursor = await env.svc.get(path + "/cursors/compaction")
    assert cursor.status_code == 200, cursor.text
    state = await env.svc.get(path)
    return {
        "cursor": cursor.json(),
        "state": state.json(),
        "cursors": sorted(p.name for p in (env.root / "logs" / cid / "cursor").iterdir()),
    }


@pytest.mark.parametrize("caller", ["tenant", "reader"])
async def test_a_tenant_cannot_move_reset_or_delete_the_compaction_cursor(
    env: Env, caller: str
) -> None:
    cid, _ = await fresh_log(env)
    path = log_path("alice", cid)
    r = await env.svc.post(path + "/compaction", json={"offset": 2})
    assert r.status_code == 200, r.text
    before = await compaction_view(env, cid)
    witness = before["cursor"]["witness"]
    attempts: list[tuple[str, str, Any, int]] = []
    for name, status in RESERVED_SPELLINGS:  # the same for a reader (which writes no cursor)
        for offset in (1, 2, 3):  # back (reset), stay, ahead of every compacted version
            attempts.append(
                ("PUT", f"/cursors/{name}", {"offset": offset, "witness": witness}, status)
            )
            attempts.append(
                ("PUT", f"/cursors/{name}", {"offset": offset, "witness": None}, status)
            )
        attempts.append(("DELETE", f"/cursors/{name}", None, status))
    attempts += [
        ("POST", "/compaction", {"offset": 3}, 403),
        ("POST", "/compaction", {"offset": 1}, 403),
    ]
    for method, suffix, body, status in attempts:
        r = await send(env, method, path + suffix, caller, body)
        assert r.status_code == status, (method, suffix, body, r.text)
        if status == 403:
            assert "key=*" in r.json()["error"]["message"], r.text
    # method overrides are not honoured: a GET or POST stays what it is
    for override in ("DELETE", "PUT"):
        for method in ("GET", "POST"):
            r = await env.anon.request(
                method,
                path + "/cursors/compaction",
                headers={
                    "Authorization": CALLERS[caller] or "",
                    "X-HTTP-Method-Override": override,
                    "X-Method-Override": override,
                },
                json={"offset": 3, "witness": None},
            )
            assert r.status_code in (200, 405), r.text
    assert await compaction_view(env, cid) == before


async def test_the_service_may_move_and_delete_the_compaction_cursor(env: Env) -> None:
    """The other side of the same rule: the service key keeps the power tenants lost."""
    cid, _ = await fresh_log(env)
    path = log_path("alice", cid)
    r = await env.svc.put(path + "/cursors/compaction", json={"offset": 2, "witness": None})
    assert r.status_code == 200, r.text
    r = await env.svc.delete(path + "/cursors/compaction")
    assert r.status_code == 200 and r.json()["deleted"] is True, r.text


# ------------------------------------------------------------------- data a tenant appended


async def test_a_tenant_key_cannot_lose_data_it_appended(env: Env) -> None:
    """Everything the tenant key may do (and tries to do) on its log, then the service's
    collector: every record the tenant appended is still there, byte for byte."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid)
    tenant = {"Authorization": CALLERS["tenant"] or ""}
    records = [record(f"d{i}", document=f"alice data {i}") for i in range(5)]
    for rec in records:  # one fragment each, so a collector could drop some of them
        r = await env.anon.post(path + "/records", headers=tenant, json={"records": [rec]})
        assert r.status_code == 200, r.text
    original = (await env.anon.get(path + "/records", headers=tenant)).json()["records"]
    assert len(original) == 5
    # every request the tenant may try, allowed or not (the allowed ones must not lose data)
    tries: list[tuple[str, str, Any]] = [
        ("PUT", "/cursors/old", {"offset": 1, "witness": None}),
        ("DELETE", "/cursors/old", None),
        ("PUT", "/cursors/mine", {"offset": 6, "witness": None}),  # at the tail, and kept
        ("POST", "/compaction", {"offset": 6}),
        ("PUT", "/cursors/compaction", {"offset": 6, "witness": None}),
        ("DELETE", "/cursors/compaction", None),
        ("POST", "/gc", None),
        ("POST", "/seal", None),
        ("POST", "/fork", {"target_collection_id": str(uuid.uuid4()), "offset": 6}),
    ]
    for method, suffix, body in tries:
        await env.anon.request(method, path + suffix, headers=tenant, json=body)
    # the service's collector runs on the log (as it does after a compaction)
    for _ in range(3):  # compute, apply, delete (the grace is 0 here)
        r = await env.svc.post(path + "/gc")
        assert r.status_code in (200, 409), r.text
    after = (await env.anon.get(path + "/records", headers=tenant)).json()["records"]
    assert after == original
    state = (await env.svc.get(path)).json()
    assert state["oldest_offset"] == 1 and state["compaction_offset"] <= 1, state
    assert state["sealed"] is False


# ---------------------------------------------------------------------------- hostile shapes


@pytest.mark.parametrize(
    ("template", "caller"),
    [(p, c) for (m, p) in MATRIX if m == "GET" for c in COLUMNS],
    ids=[f"HEAD {p} {c}" for (m, p) in MATRIX if m == "GET" for c in COLUMNS],
)
async def test_head_gets_no_further_than_get(env: Env, template: str, caller: str) -> None:
    """HEAD is a method override of sorts: the API routes do not serve it (405), the rest
    answer it as GET; where GET is refused, HEAD is never a success."""
    expected = MATRIX[("GET", template)].status(caller)
    cid, witness = await fresh_log(env) if template.startswith(BASE) else (str(uuid.uuid4()), "")
    url, _ = request_for("GET", template, cid, witness)
    auth_header = CALLERS[caller]
    r = await env.anon.head(
        url, headers={} if auth_header is None else {"Authorization": auth_header}
    )
    assert r.status_code in (expected, 405), (caller, url, r.status_code)
    if expected >= 400:
        assert r.status_code >= 400, (caller, url, r.status_code)


async def test_unnormalized_paths_reach_no_route_unchecked(env: Env) -> None:
    """Dot segments, doubled slashes and encoded slashes, sent as raw bytes (no client-side
    normalization): a tenant key never reaches a service route or a reserved cursor."""
    cid, _ = await fresh_log(env)
    r = await env.svc.post(log_path("alice", cid) + "/compaction", json={"offset": 2})
    assert r.status_code == 200, r.text
    before = await compaction_view(env, cid)
    base = log_path("alice", cid)
    raw_paths = [
        f"{base}/cursors/../compaction",
        f"{base}/cursors/..%2Fcompaction",
        f"{base}/./compaction",
        f"{base}//compaction",
        f"/v1/tenants/alice//logs/{cid}/compaction",
        f"{base}/cursors/compaction/.",
        f"{base}/cursors/./compaction",
        f"{base}/cursors/%2e%2e/compaction",
        f"/v1/tenants/bob/../alice/logs/{cid}/compaction",
    ]
    host, port = env.live.url.removeprefix("http://").split(":")
    import asyncio

    for method in ("POST", "PUT", "DELETE"):
        for path in raw_paths:
            body = b'{"offset": 3, "witness": null}'
            reader, writer = await asyncio.open_connection(host, int(port))
            writer.write(
                f"{method} {path} HTTP/1.1\r\nHost: x\r\n"
                f"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            status_line = await reader.readline()
            writer.close()
            status = int(status_line.split()[1])
            assert status in (307, 400, 403, 404, 405), (method, path, status_line)
    assert await compaction_view(env, cid) == before


async def test_the_api_description_states_the_key_each_route_needs(env: Env) -> None:
    """/docs shows users which key a route needs; it says what the matrix tests."""
    spec = (await env.anon.get("/openapi.json")).json()
    for (method, template), row in MATRIX.items():
        op = spec["paths"].get(template, {}).get(method.lower())
        if not template.startswith("/v1/"):
            continue
        assert op is not None, (method, template)
        need = op["x-required-key"]
        assert need in op["description"]
        if row.status("tenant") != 200:
            assert need == "a service key", (method, template, need)
        elif row.status("reader") != 200:
            assert "(not read-only)" in need, (method, template, need)
        else:
            assert "(read-only or not)" in need, (method, template, need)
