"""The host's /metrics (issue 22, item 7): append requests apart from records, a ``method``
label and a route label for every route (the docs pages and the OpenAPI document too), no
``*_created`` twins, ``loghost_build_info``, and the object store's requests, errors and latency
per operation (``host.storemetrics``, which the engine does not import)."""

from __future__ import annotations

import platform
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from host.metrics import APPEND_ROUTE, Metrics, package_version
from host.routers import LOG_PATH
from host.storemetrics import InstrumentedStore, error_kind
from wal3 import LocalStore
from wal3.errors import ObjectNotFound, PreconditionFailed, StoreError, StoreUnavailable

from .live import CID, Live, live_server, log_path, metric, metric_sum, record

BASE = log_path("alice", CID)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    async with live_server(str(tmp_path / "store")) as lv:
        yield lv


async def scrape(lv: Live) -> str:
    async with lv.client() as c:
        r = await c.get("/metrics")
    assert r.status_code == 200
    return r.text


# --- requests and records ---------------------------------------------------------------------


async def test_append_requests_and_records_are_counted_apart(live: Live) -> None:
    async with live.client("alice-key") as c:
        body = {"records": [record(i) for i in range(5)], "idempotency_key": "k1"}
        assert (await c.post(BASE + "/records", json=body)).status_code == 200
        # a replay of the same key: a request answered 200, no new record
        assert (await c.post(BASE + "/records", json=body)).status_code == 200
        assert (await c.post(BASE + "/records", content=b"{not json")).status_code == 400
        async with live.client("nobody") as stranger:
            assert (await stranger.post(BASE + "/records", json=body)).status_code == 401
        # a read of the same path is not an append request
        assert (await c.get(BASE + "/records", params={"from": 1})).status_code == 200
    text = await scrape(live)
    assert metric(text, "loghost_append_records_total") == 5
    assert metric(text, "loghost_append_requests_total", status="200") == 2
    assert metric(text, "loghost_append_requests_total", status="400") == 1
    assert metric(text, "loghost_append_requests_total", status="401") == 1
    assert metric_sum(text, "loghost_append_requests_total") == 4
    assert metric(text, "loghost_idempotent_replays_total") == 1
    assert "loghost_appends_total" not in text


def test_the_append_route_constant_is_the_routers_path() -> None:
    assert APPEND_ROUTE == "/v1" + LOG_PATH + "/records"


async def test_429_append_requests_are_counted_as_requests(tmp_path: Path) -> None:
    """What LoghostBackpressure divides: 429 append requests by append requests."""
    async with (
        live_server(
            str(tmp_path / "s"), tenant_quotas='{"default": {"records_per_request": 2}}'
        ) as lv,
        lv.client("alice-key") as c,
    ):
        ok = {"records": [record(1), record(2)]}
        assert (await c.post(BASE + "/records", json=ok)).status_code == 200
        over = {"records": [record(i) for i in range(3, 6)]}
        assert (await c.post(BASE + "/records", json=over)).status_code == 429
        text = await scrape(lv)
    assert metric(text, "loghost_append_requests_total", status="429") == 1
    assert metric(text, "loghost_append_requests_total", status="200") == 1
    assert metric(text, "loghost_append_records_total") == 2


# --- method and route labels ------------------------------------------------------------------


async def test_requests_carry_method_and_route_including_the_docs(live: Live) -> None:
    async with live.client("alice-key") as c:
        assert (await c.post(BASE + "/records", json={"records": [record(1)]})).status_code == 200
        for path in ("/docs", "/openapi.json", "/redoc", "/docs/assets/swagger-ui.css"):
            assert (await c.get(path)).status_code == 200, path
        assert (await c.head("/healthz")).status_code in (200, 405)
        assert (await c.delete("/healthz")).status_code == 405
        assert (await c.get("/no/such/route")).status_code == 404
    got = samples(await scrape(live))
    requests = {
        (dict(labels)["method"], dict(labels)["route"], dict(labels)["status"]): v
        for (name, labels), v in got.items()
        if name == "loghost_requests_total"
    }
    assert requests[("POST", APPEND_ROUTE, "200")] == 1
    assert requests[("GET", "/docs", "200")] == 1
    assert requests[("GET", "/openapi.json", "200")] == 1
    assert requests[("GET", "/redoc", "200")] == 1
    assert requests[("GET", "/docs/assets", "200")] == 1
    assert requests[("DELETE", "/healthz", "405")] == 1
    # Only a request no route took is unmatched.
    assert {k for k in requests if k[1] == "unmatched"} == {("GET", "unmatched", "404")}


def test_an_unknown_method_is_other() -> None:
    m = Metrics()
    m.request_done("BREW", "unmatched", 400)
    m.request_done("post", APPEND_ROUTE, 200)  # methods are case-sensitive tokens
    got = samples(generate_latest(m.registry).decode())
    assert (
        got[
            (
                "loghost_requests_total",
                (("method", "other"), ("route", "unmatched"), ("status", "400")),
            )
        ]
        == 1
    )
    assert (
        got[
            (
                "loghost_requests_total",
                (("method", "other"), ("route", APPEND_ROUTE), ("status", "200")),
            )
        ]
        == 1
    )
    assert ("loghost_append_requests_total", (("status", "200"),)) not in got


# --- no _created twins, build info ------------------------------------------------------------


async def test_no_created_series(live: Live) -> None:
    async with live.client("alice-key") as c:
        assert (await c.post(BASE + "/records", json={"records": [record(1)]})).status_code == 200
    text = await scrape(live)
    assert "loghost_requests_total" in text
    assert "_created" not in text


async def test_build_info(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "s"), http_parser="h11") as lv:
        got = samples(await scrape(lv))
    info = [dict(labels) for (name, labels), v in got.items() if name == "loghost_build_info"]
    assert info == [
        {"version": package_version(), "python": platform.python_version(), "http_parser": "h11"}
    ]
    assert got[("loghost_build_info", tuple(sorted(info[0].items())))] == 1


# --- the object store ---------------------------------------------------------------------------


async def test_store_operations_of_a_live_host(live: Live) -> None:
    async with live.client("alice-key") as c:
        assert (await c.post(BASE + "/records", json={"records": [record(1)]})).status_code == 200
        assert (await c.get(BASE + "/records", params={"from": 1})).status_code == 200
    text = await scrape(live)
    for op in ("get", "put", "list"):
        assert (metric(text, "loghost_store_requests_total", operation=op) or 0) > 0, op
        assert metric(text, "loghost_store_request_duration_seconds_count", operation=op) == metric(
            text, "loghost_store_requests_total", operation=op
        ), op
    # Every operation is exported from the start (a rate over a missing series is no rate).
    for op in ("get", "head", "put", "delete", "list", "copy"):
        assert metric(text, "loghost_store_requests_total", operation=op) is not None, op
    assert isinstance(live.server.store, InstrumentedStore)


async def test_instrumented_store_counts_requests_errors_and_latency(tmp_path: Path) -> None:
    m = Metrics()
    store = InstrumentedStore(LocalStore(tmp_path / "s"), m)
    etag = await store.put("a/1", b"one", if_none_match="*")
    await store.put("a/2", b"two")
    with pytest.raises(PreconditionFailed):
        await store.put("a/1", b"again", if_none_match="*")
    assert (await store.get("a/1")).data == b"one"
    with pytest.raises(ObjectNotFound):
        await store.get("a/missing")
    assert (await store.head("a/1")).etag == etag
    await store.copy("a/1", "b/1")
    assert [meta.key async for meta in store.list("a/")] == ["a/1", "a/2"]
    # A list abandoned after its first entry is still one request.
    entries = store.list("a/")
    assert (await entries.__anext__()).key == "a/1"
    await entries.aclose()  # type: ignore[attr-defined]
    await store.delete("b/1")
    assert store.url_for("a/1") == store.inner.url_for("a/1")
    assert repr(store) == repr(store.inner)
    await store.close()
    got = samples(generate_latest(m.registry).decode())

    def count(name: str, **labels: str) -> float:
        return got.get((name, tuple(sorted(labels.items()))), 0.0)

    assert {
        op: count("loghost_store_requests_total", operation=op)
        for op in ("get", "head", "put", "delete", "list", "copy")
    } == {"get": 2, "head": 1, "put": 3, "delete": 1, "list": 2, "copy": 1}
    assert count("loghost_store_errors_total", operation="put", kind="precondition_failed") == 1
    assert count("loghost_store_errors_total", operation="get", kind="not_found") == 1
    assert sum(v for (name, _), v in got.items() if name == "loghost_store_errors_total") == 2
    for op, n in (("put", 3), ("list", 2), ("copy", 1)):
        assert count("loghost_store_request_duration_seconds_count", operation=op) == n
        assert count("loghost_store_request_duration_seconds_bucket", operation=op, le="+Inf") == n


def test_store_error_kinds() -> None:
    assert error_kind(ObjectNotFound("k")) == "not_found"
    assert error_kind(PreconditionFailed("k")) == "precondition_failed"
    assert error_kind(StoreUnavailable("k")) == "unavailable"
    assert error_kind(StoreError("denied")) == "store_error"
    assert error_kind(RuntimeError("bug")) == "error"


async def test_a_failing_list_counts_an_error(tmp_path: Path) -> None:
    class Broken(LocalStore):
        async def list(self, prefix: str, *, start_after: str | None = None):  # type: ignore[override]
            yield await self.head("x")
            raise StoreUnavailable("gone")

    inner = Broken(tmp_path / "s")
    await inner.put("x", b"1")
    m = Metrics()
    store = InstrumentedStore(inner, m)
    with pytest.raises(StoreUnavailable):
        _ = [meta async for meta in store.list("")]
    got = samples(generate_latest(m.registry).decode())
    assert (
        got[("loghost_store_errors_total", (("kind", "unavailable"), ("operation", "list")))] == 1
    )
    assert got[("loghost_store_requests_total", (("operation", "list"),))] == 1


def test_the_engine_imports_neither_the_host_nor_prometheus() -> None:
    code = (
        "import sys, pkgutil, importlib, wal3\n"
        "for m in pkgutil.walk_packages(wal3.__path__, 'wal3.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = sorted(n for n in sys.modules if n == 'host' or n.startswith(('host.', 'prometheus_client')))\n"
        "print(bad)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
