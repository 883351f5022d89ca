"""Property-based fuzzing of every operation of the live server's own OpenAPI schema (schemathesis).

The server is a real uvicorn on 127.0.0.1 (``live_server`` over a LocalStore in a temp dir), run in
a background thread with its own event loop, because schemathesis and hypothesis drive requests
synchronously.  The schema is fetched from the running server's ``/openapi.json``.

For every operation, derandomized (a fixed seed, so the quick form is repeatable) and bounded in
examples, positive and negative cases are sent:

* with the service key: never a 5xx; every non-2xx answer has the error shape
  ``{"error": {"code": "<word>", "message": "..."}}``; status codes, content types and bodies
  conform to the schema; data that violates the schema is refused with a 4xx;
* with no key, a wrong key or a malformed ``Authorization``: 401 with the error shape (or the
  router's 404 when the generated path matches no route), for every operation but the public
  probes ``/healthz`` and ``/readyz``.

Every request has a 10 s client timeout: a timeout is reported as a hang (not a timing assertion).

The schema types ``collection_id`` as a plain string, so the fuzzer mostly sends invalid ids (those
must be 400); to exercise the real paths too, most cases use a known tenant and a valid collection
id (alice's and bob's existing logs, also spelt in capitals or without dashes, a never-written id,
another tenant's log), some with bodies the server accepts (records, UUIDs to fork into or purge,
small offsets), and each operation first gets explicit valid and boundary requests on alice's log
(offsets at and just past its tail).  Beyond the schema, every log state answered must be coherent:
``oldest_offset <= compaction_offset <= next_offset``.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from starlette.routing import compile_path

from host.api import create_app
from host.config import Settings
from host.server import Server
from wal3 import LocalStore

from .live import CID, KEYS, SERVICE_KEY, Live, live_server, log_path, record

MAX_EXAMPLES = 40  # per operation, with the service key
MAX_EXAMPLES_UNAUTHENTICATED = 15  # per operation, without a valid key
REQUEST_TIMEOUT_S = 10.0  # a hang check, not a timing assertion
PUBLIC = {"/healthz", "/readyz"}  # operational probes in the schema that need no key
CODE_WORD = re.compile(r"^[a-z][a-z_]*$")

BOB_CID = "3f0c2d8e-9a41-4d7b-8e25-5c6b7a8d9e10"  # an existing log of bob's
NEVER_WRITTEN = "9e8d7c6b-5a49-4382-a716-151413121110"
CURSOR_NAMES = ["compaction", "reader", "fresh_cursor"]
BAD_AUTHORIZATION = [
    None,
    "",
    "Bearer",
    "Bearer ",
    "Bearer wrong-key",
    "Basic c3ZjLWtleTo=",
    SERVICE_KEY,
    "Token svc-key",
    "Bearer svc-key-x",
    "bearer " + "k" * 600,
    "Bearer alice-key bob-key",
]

_CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
_SETTINGS = {
    "derandomize": True,
    "database": None,
    "deadline": None,
    "phases": [Phase.explicit, Phase.generate],  # no shrinking: bounded time
    "suppress_health_check": list(HealthCheck),
    "print_blob": False,
}


def _operations_of_the_app() -> list[tuple[str, str]]:
    """(METHOD, path) of every operation in the app's schema, for parametrizing at collection.

    The app is built (never started) over a throw-away directory; the tests themselves fuzz the
    schema the running server serves, and check it lists the same operations.
    """
    with tempfile.TemporaryDirectory() as d:
        app = create_app(
            Server(Settings(store=str(Path(d) / "s"), api_keys=KEYS, server_id="schema-probe"))
        )
        paths = app.openapi()["paths"]
    return sorted((m.upper(), p) for p, ops in paths.items() for m in ops)


def _routes_of_the_app() -> list[tuple[str, str]]:
    """(METHOD, path) of every route of the app, included routers flattened (FastAPI >= 0.16x
    keeps an included router as one node of ``app.routes``)."""
    with tempfile.TemporaryDirectory() as d:
        app = create_app(
            Server(Settings(store=str(Path(d) / "s"), api_keys=KEYS, server_id="routes-probe"))
        )
    try:
        from fastapi.routing import iter_route_contexts
    except ImportError:  # an older FastAPI: app.routes is flat
        routes: list[Any] = list(app.routes)
    else:
        routes = list(iter_route_contexts(app.routes))
    return sorted(
        {
            (m, r.path)
            for r in routes
            if getattr(r, "path", None)
            for m in (getattr(r, "methods", None) or ())
            if m != "HEAD"
        }
    )


OPERATIONS = _operations_of_the_app()
# Routes deliberately outside the schema (the schema itself, its viewers, Prometheus metrics).
NOT_IN_SCHEMA = {
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/redoc",
    "/metrics",
    "/metrics/tenants",
}
OPERATION_IDS = [f"{m} {p}" for m, p in OPERATIONS]


# ------------------------------------------------------------------------------- the server


class ThreadedServer:
    """``live_server`` (a real uvicorn) on its own event loop in a background thread."""

    def __init__(self, store_dir: Path, **settings: Any) -> None:
        self._store_dir = store_dir
        self._settings = settings
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.live: Live | None = None
        self._thread = threading.Thread(target=self._run, name="fuzz-server", daemon=True)

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as e:
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        # fsync off: fuzzing is about answers, not durability (a real LocalStore all the same)
        store = LocalStore(self._store_dir, fsync=False)
        async with live_server(store=store, **self._settings) as lv:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            self.live = lv
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Live:
        self._thread.start()
        if not self._ready.wait(60) or self.live is None:
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self.live

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(60)
        assert not self._thread.is_alive(), "the server did not stop"


def _ensure_logs(live: Live) -> None:
    """alice's and bob's logs exist, with records and a "reader" cursor (the fuzzing of one
    operation may have deleted the cursor the next one reads)."""
    with httpx.Client(base_url=live.url, timeout=30, trust_env=False) as c:
        for key, tenant, cid in (("alice-key", "alice", CID), ("bob-key", "bob", BOB_CID)):
            h = {"Authorization": f"Bearer {key}"}
            path = log_path(tenant, cid)
            if c.get(path, headers=h).status_code == 404:
                r = c.post(
                    path + "/records",
                    headers=h,
                    json={
                        "records": [
                            record(i, document=f"doc {i}", metadata={"i": i}, embedding=[i, 0.5])
                            for i in range(5)
                        ]
                    },
                )
                assert r.status_code == 200, r.text
            r = c.put(path + "/cursors/reader", headers=h, json={"offset": 2, "witness": None})
            assert r.status_code in (200, 409), r.text  # created, or already there


DEPARTED = "departed-host"  # a server whose dirty log is in the store, for /v1/dirty/adopt


async def _departed_dirty_log(root: Path) -> None:
    """A dirty log left by another server: one mark for alice's log."""
    from dirtylog import DirtyRecord, RecordKind
    from host.dirty import dirty_prefix
    from wal3 import LogWriter

    store = LocalStore(root)
    w = await LogWriter.open(store, dirty_prefix(DEPARTED))
    await w.append(DirtyRecord(uuid.UUID(CID), 1, 2, 1, 0, RecordKind.MARK_DIRTY).encode())
    await w.close()
    await store.close()


@pytest.fixture(scope="module")
def fuzz_live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    store = tmp_path_factory.mktemp("fuzz") / "store"
    asyncio.run(_departed_dirty_log(store))
    # A short long-poll bound: a generated wait_ms is at most this (the schema says so).
    with ThreadedServer(store, max_wait_ms=200) as live:
        yield live


@pytest.fixture(scope="module")
def schema(fuzz_live: Live) -> Any:
    # Authorization is sent by each test itself (the service key, or a bad one), not generated
    # from the security scheme.  Unknown query parameters are ignored by design (as HTTP servers
    # do), so they are not "negative data"; unknown body fields are (and are fuzzed).
    config = schemathesis.Config.from_dict(
        {"generation": {"allow-extra-parameters": False, "with-security-parameters": False}}
    )
    return schemathesis.openapi.from_url(
        fuzz_live.url + "/openapi.json",
        config=config,
        timeout=30,
        proxies={"http": "", "https": ""},
    )


# ----------------------------------------------------------------------------- strategies


def _param_names(op: Any) -> set[str]:
    return {p.name for p in op.path_parameters}


# (tenant, collection id) pairs: mostly the owner on its own log (also spelt in capitals and
# without dashes), then a never-written id and other tenants' logs (404 either way).
PATHS = [
    ("alice", CID),
    ("alice", CID),
    ("alice", CID.upper()),
    ("alice", uuid.UUID(CID).hex),
    ("bob", BOB_CID),
    ("alice", NEVER_WRITTEN),
    ("bob", CID),
    ("carol", BOB_CID),
]


def _path_parameters(names: set[str]) -> st.SearchStrategy[dict[str, str]]:
    pairs = st.sampled_from(PATHS)
    if "name" in names:
        return st.tuples(pairs, st.sampled_from(CURSOR_NAMES)).map(
            lambda t: {"tenant": t[0][0], "collection_id": t[0][1], "name": t[1]}
        )
    return pairs.map(lambda t: {"tenant": t[0], "collection_id": t[1]})


def _with_path(
    op: Any, mode: GenerationMode, names: set[str], body: st.SearchStrategy[Any] | None = None
) -> st.SearchStrategy[Any]:
    """Cases on a known tenant and a valid collection id (and a valid cursor name)."""
    if body is None:
        return _path_parameters(names).flatmap(lambda pp: op.as_strategy(mode, path_parameters=pp))
    return st.tuples(_path_parameters(names), body).flatmap(
        lambda t: op.as_strategy(mode, path_parameters=t[0], body=t[1])
    )


_IDS = st.sampled_from([CID, BOB_CID, NEVER_WRITTEN]) | st.uuids().map(str)
_FLOATS = st.floats(allow_nan=False, allow_infinity=False, width=32)
_RECORD = st.fixed_dictionaries(
    {
        "id": st.text(min_size=1, max_size=8),
        "op": st.sampled_from(["add", "update", "upsert", "delete"]),
    },
    optional={
        "document": st.none() | st.text(max_size=20),
        "metadata": st.none()
        | st.dictionaries(
            st.text(max_size=5),
            st.none() | st.booleans() | st.integers() | _FLOATS | st.text(max_size=5),
            max_size=3,
        ),
        "embedding": st.none() | st.lists(_FLOATS | st.integers(-9, 9), max_size=4),
    },
)


def _valid_bodies(method: str, path: str) -> st.SearchStrategy[Any] | None:
    """Bodies valid for the server, which random strings and integers would rarely be."""
    if path.endswith("/fork"):
        return st.fixed_dictionaries(
            {"target_collection_id": _IDS}, optional={"offset": st.integers(1, 12)}
        )
    if path == "/v1/dirty/purge":
        return st.fixed_dictionaries({"collection_ids": st.lists(_IDS, min_size=1, max_size=4)})
    if path == "/v1/dirty/adopt":
        return st.fixed_dictionaries(
            {
                "server_id": st.sampled_from([DEPARTED, "never-was"])
                | st.from_regex(r"[a-z0-9][a-z0-9.-]{0,12}", fullmatch=True)
            }
        )
    if path.endswith("/records") and method == "POST":
        return st.fixed_dictionaries(
            {"records": st.lists(_RECORD, min_size=1, max_size=3)},
            optional={"idempotency_key": st.text(min_size=1, max_size=8)},
        )
    if path.endswith("/compaction"):
        return st.fixed_dictionaries({"offset": st.integers(1, 12)})
    if "/cursors/" in path and method == "PUT":
        return st.fixed_dictionaries({"offset": st.integers(1, 12), "witness": st.none()})
    return None


def case_strategy(op: Any, method: str, path: str) -> st.SearchStrategy[Any]:
    """Positive and negative cases of the schema, with known paths and valid bodies mixed in."""
    names = _param_names(op)
    pos, neg = GenerationMode.POSITIVE, GenerationMode.NEGATIVE
    parts = [op.as_strategy(pos), op.as_strategy(neg)]
    bodies = _valid_bodies(method, path)
    if "collection_id" in names:
        parts += [
            _with_path(op, pos, names),
            _with_path(op, pos, names),
            _with_path(op, neg, names),
        ]
        if bodies is not None:
            parts += [_with_path(op, pos, names, bodies)] * 2
    elif bodies is not None:
        parts += [bodies.flatmap(lambda b: op.as_strategy(pos, body=b))] * 2
    return st.one_of(parts)


def explicit_cases(op: Any, method: str, path: str, tail: int) -> list[Any]:
    """Valid and boundary requests on alice's log (whose next offset is ``tail``), tried first."""
    alice = {"tenant": "alice", "collection_id": CID}
    target = str(uuid.uuid5(uuid.NAMESPACE_URL, f"fuzz-fork-{tail}"))
    other = str(uuid.uuid5(uuid.NAMESPACE_URL, f"fuzz-fork-past-{tail}"))
    table: dict[tuple[str, str], list[dict[str, Any]]] = {
        ("POST", "/records"): [
            {
                "body": {
                    "records": [
                        record("explicit", document="d", metadata={"k": 1.5}, embedding=[0.25, 1])
                    ]
                }
            }
        ],
        ("GET", "/records"): [
            {"query": {"from": 1, "limit": 2}},
            {"query": {"from": tail, "wait_ms": 50}},
            {"query": {"from": tail + 1000}},
        ],
        ("GET", ""): [{}],
        ("GET", "/fragments"): [{}, {"query": {"from": 1, "limit": 1}}],
        ("GET", "/cursors/{name}"): [{"name": "reader"}],
        ("DELETE", "/cursors/{name}"): [{"name": "reader"}],
        ("PUT", "/cursors/{name}"): [
            {"name": "explicit_at_tail", "body": {"offset": tail, "witness": None}},
            {"name": "explicit_past_tail", "body": {"offset": tail + 1, "witness": None}},
        ],
        ("POST", "/compaction"): [{"body": {"offset": 1}}, {"body": {"offset": tail + 1}}],
        ("POST", "/fork"): [
            {"body": {"target_collection_id": target}},
            {"body": {"target_collection_id": other, "offset": tail + 1}},
        ],
        ("POST", "/seal"): [{}],
        ("POST", "/gc"): [{}],
        ("GET", "/scrub"): [{}],
    }
    base = "/v1/tenants/{tenant}/logs/{collection_id}"
    out = []
    if path.startswith(base):
        for spec in table.get((method, path[len(base) :]), []):
            pp = dict(alice, **({"name": spec["name"]} if "name" in spec else {}))
            kw: dict[str, Any] = {"path_parameters": pp, "query": spec.get("query")}
            if "body" in spec:
                kw.update(body=spec["body"], media_type="application/json")
            out.append(op.Case(**kw))
    elif path == "/v1/dirty/purge":
        out.append(op.Case(body={"collection_ids": [NEVER_WRITTEN]}, media_type="application/json"))
    elif path == "/v1/dirty/adopt":
        out.append(op.Case(body={"server_id": DEPARTED}, media_type="application/json"))
    elif path == "/v1/dirty/inspect":
        out.append(op.Case(query={"from": 1, "limit": 5}))
    else:
        out.append(op.Case())
    return out


def _alice_tail(live: Live) -> int:
    r = httpx.get(
        live.url + log_path("alice", CID),
        timeout=30,
        trust_env=False,
        headers={"Authorization": "Bearer alice-key"},
    )
    assert r.status_code == 200, r.text
    return int(r.json()["next_offset"])


# --------------------------------------------------------------------------------- checks


def _header(response: Any, name: str) -> str:
    values = response.headers.get(name) or response.headers.get(name.title()) or [""]
    return values[0] if isinstance(values, list) else values


def assert_error_shape(case: Any, response: Any) -> None:
    """Every non-2xx answer is ``{"error": {"code": "<word>", "message": "..."}}``."""
    if response.status_code < 400:
        return
    where = f"{case.method} {response.request.url} -> {response.status_code}: {response.text[:300]}"
    try:
        body = response.json()
    except ValueError:
        pytest.fail(f"error answer is not JSON: {where}")
    assert isinstance(body, dict) and set(body) == {"error"}, where
    err = body["error"]
    assert isinstance(err, dict), where
    assert isinstance(err.get("code"), str) and CODE_WORD.match(err["code"]), where
    assert isinstance(err.get("message"), str) and err["message"].strip(), where
    assert _header(response, "content-type").startswith("application/json"), where


def assert_state_invariants(case: Any, response: Any) -> None:
    """A log state the server answers with is coherent: oldest <= compaction <= next offset."""
    if not 200 <= response.status_code < 300:
        return
    try:
        body = response.json()
    except ValueError:
        return
    offsets = {"oldest_offset", "compaction_offset", "next_offset"}
    if isinstance(body, dict) and offsets <= set(body):
        assert 1 <= body["oldest_offset"] <= body["next_offset"], body
        assert body["compaction_offset"] <= body["next_offset"], (
            f"compaction cursor past the tail after {case.method} {response.request.url} "
            f"{response.request.body!r}: {body}"
        )


_SESSION = requests.Session()
_SESSION.trust_env = False  # loopback only: no proxy from the environment, ever


def call(case: Any, base_url: str, headers: dict[str, str] | None) -> Any:
    """Send one case; a schemathesis Response (``.request`` is what went on the wire)."""
    assert base_url.startswith("http://127.0.0.1:"), base_url
    try:
        return case.call(
            base_url=base_url, headers=headers, timeout=REQUEST_TIMEOUT_S, session=_SESSION
        )
    except requests.Timeout:
        pytest.fail(
            f"no answer within {REQUEST_TIMEOUT_S}s (a hang):\n"
            f"{case.as_curl_command(headers=headers, base_url=base_url)}"
        )


class Failures:
    """Failures found while fuzzing one operation, reported together at the end.

    The server keeps state (a fork succeeds once, then 409s), so a failure is not re-raised to
    hypothesis, which would replay it and call the result flaky: it is recorded with the request
    that produced it, the run goes on, and the test fails after it with every distinct failure.
    """

    def __init__(self) -> None:
        self.found: dict[str, str] = {}

    def record(
        self, exc: BaseException, case: Any, headers: dict[str, str] | None, base_url: str
    ) -> None:
        text = str(exc)
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        if first not in self.found:
            curl = case.as_curl_command(headers=headers, base_url=base_url)
            self.found[first] = f"{type(exc).__name__}: {text}\nReproduce: {curl}"

    def check(self) -> None:
        if self.found:
            pytest.fail(
                f"{len(self.found)} distinct failure(s):\n\n"
                + "\n\n".join(list(self.found.values())[:10]),
                pytrace=False,
            )


def _route_matches(templates: list[str], url: str) -> bool:
    """Whether the path of ``url`` (decoded, as the router sees it) matches a route template."""
    path = requests.utils.unquote(requests.utils.urlparse(url).path)
    return any(compile_path(t)[0].match(path) for t in templates)


# ---------------------------------------------------------------------------------- tests


def test_the_served_schema_lists_every_operation(schema: Any, fuzz_live: Live) -> None:
    served = sorted((m.upper(), p) for p, ops in schema.raw_schema["paths"].items() for m in ops)
    assert served == OPERATIONS
    assert len(OPERATIONS) >= 17
    # the schema describes every route but the deliberate exceptions: nothing goes unfuzzed
    routes = [(m, p) for m, p in _routes_of_the_app() if p not in NOT_IN_SCHEMA]
    assert routes == OPERATIONS
    r = httpx.get(fuzz_live.url + "/openapi.json", timeout=30, trust_env=False)
    assert r.status_code == 200 and r.json()["paths"].keys() == schema.raw_schema["paths"].keys()


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=OPERATION_IDS)
def test_fuzz_with_the_service_key(schema: Any, fuzz_live: Live, method: str, path: str) -> None:
    op = schema[path][method]
    _ensure_logs(fuzz_live)
    headers = {"Authorization": f"Bearer {SERVICE_KEY}"}
    seen: dict[int, int] = {}
    failures = Failures()

    def run(case: Any) -> None:
        try:
            response = call(case, fuzz_live.url, headers)
            seen[response.status_code] = seen.get(response.status_code, 0) + 1
            # schemathesis' checks: not_a_server_error, conformance, negative data rejected
            case.validate_response(
                response, checks=_CHECKS, transport_kwargs={"base_url": fuzz_live.url}
            )
            assert_error_shape(case, response)
            assert_state_invariants(case, response)
        except (Exception, pytest.fail.Exception) as e:
            failures.record(e, case, headers, fuzz_live.url)

    test = run
    for c in explicit_cases(op, method, path, _alice_tail(fuzz_live)):
        test = example(case=c)(test)
    settings(max_examples=MAX_EXAMPLES, **_SETTINGS)(
        given(case=case_strategy(op, method, path))(test)
    )()
    failures.check()
    # the fuzzer reached the operation itself, not only the 400s of invalid ids
    if path not in PUBLIC:
        assert any(200 <= s < 300 for s in seen), f"never a 2xx answer: {seen}"


@pytest.mark.parametrize(("method", "path"), OPERATIONS, ids=OPERATION_IDS)
def test_fuzz_without_a_valid_key(schema: Any, fuzz_live: Live, method: str, path: str) -> None:
    op = schema[path][method]
    _ensure_logs(fuzz_live)
    names = _param_names(op)
    cases = op.as_strategy(GenerationMode.POSITIVE)
    if "collection_id" in names:
        cases = cases | _with_path(op, GenerationMode.POSITIVE, names)
    authorization = st.sampled_from(BAD_AUTHORIZATION) | st.text(
        st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40
    ).map(lambda k: f"Bearer {k}")
    valid = {f"Bearer {k.split('=')[0]}" for k in KEYS.split(",")}
    templates = [p for _, p in OPERATIONS]
    failures = Failures()
    statuses: dict[int, int] = {}

    @settings(max_examples=MAX_EXAMPLES_UNAUTHENTICATED, **_SETTINGS)
    @given(case=cases, header=authorization)
    def run(case: Any, header: str | None) -> None:
        if header in valid:
            return
        if case.headers:
            case.headers.pop("Authorization", None)
        headers = None if header is None else {"Authorization": header}
        try:
            check_refused(case, headers)
        except (Exception, pytest.fail.Exception) as e:
            failures.record(e, case, headers, fuzz_live.url)

    def check_refused(case: Any, headers: dict[str, str] | None) -> None:
        response = call(case, fuzz_live.url, headers)
        statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
        sent = response.request.headers.get("Authorization")
        assert sent is None or sent.strip() not in valid, sent
        assert response.status_code < 500, (response.status_code, response.text)
        assert_error_shape(case, response)
        if path in PUBLIC:
            assert response.status_code == 200, (response.status_code, response.text)
            return
        if response.status_code == 404 and not _route_matches(templates, response.request.url):
            return  # the generated path matches no route at all: the router's 404
        assert response.status_code == 401, (
            f"{response.status_code} without a valid key: {response.text[:300]}\n"
            f"{case.as_curl_command(headers=headers, base_url=fuzz_live.url)}"
        )
        assert response.json()["error"]["code"] == "unauthorized"

    run()
    failures.check()
    if path not in PUBLIC:  # the run reached the authentication check, not only the router
        assert statuses.get(401, 0) > 0, statuses
