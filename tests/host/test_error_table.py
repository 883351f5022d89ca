"""The one table from error kinds to HTTP answers (issue 18).

Every engine kind and every host kind has a row; each answer that existed before the table keeps
its status, its code and its headers exactly (clients are built against them); data loss answers
500 ``data_loss``.  Checked on the table, through the real app's handlers (httpx over ASGI, a
route that raises each error), and end to end on a corrupt manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from host.api import create_app
from host.config import Settings
from host.errors import (
    ANSWERS,
    ApiError,
    BackpressureError,
    BadRequest,
    Conflict,
    Forbidden,
    HostKind,
    NotFound,
    NotLeader,
    RecordTooLarge,
    TooLarge,
    Unauthorized,
    Unavailable,
    to_api_error,
)
from host.forks import CorruptCompactedPointer
from host.server import Server
from wal3 import LocalStore
from wal3 import errors as w
from wal3.claim import ClaimLost, CreationInProgress
from wal3.errors import ErrorKind
from wal3.gc import FloorLost
from wal3.store import ResolvedPreconditionFailed

from .live import CID, KEYS, assert_error, auth, live_server, record


def test_every_kind_has_a_row_and_nothing_else_does() -> None:
    assert set(ANSWERS) == set(ErrorKind) | set(HostKind)
    for kind, answer in ANSWERS.items():
        assert 300 <= answer.status < 600, (kind, answer)
        assert answer.code and answer.code.isidentifier(), (kind, answer)


# (engine error, status, code, Retry-After or None, extra body fields): the answers the isinstance
# chain gave before the table, exactly.
ENGINE: list[tuple[w.Wal3Error, int, str, str | None, dict[str, Any]]] = [
    (w.LogPurged(3, 10), 410, "purged", None, {"oldest_offset": 10}),
    (w.LogSealed("sealed"), 409, "sealed", None, {}),
    (w.LogFull("full"), 409, "sealed", None, {}),
    (w.PreconditionFailed("k"), 409, "contention", "1", {}),
    (w.LogContention("raced"), 409, "contention", "1", {}),
    (w.CursorConflict("stale"), 409, "cursor_conflict", None, {}),
    (w.LogExists("there"), 409, "exists", None, {}),
    (w.NoCursors("none"), 409, "no_cursors", None, {}),
    (w.GarbageRejected("no"), 409, "gc_rejected", None, {}),
    (w.Backpressure("slow", "batching", 0.1), 429, "backpressure", "1", {"reason": "batching"}),
    (w.Backpressure("slow", "compaction", 7.4), 429, "backpressure", "7", {"reason": "compaction"}),
    (w.CursorNotFound("no cursor"), 404, "not_found", None, {}),
    (w.LogNotFound("no log"), 404, "not_found", None, {}),
    (w.InvalidCursorName("bad"), 400, "invalid_request", None, {}),
    (w.StoreUnavailable("down"), 503, "unavailable", "1", {}),
    (w.WriterClosed("closed"), 503, "unavailable", "1", {}),
    (w.CorruptFragment("bad bytes"), 500, "corrupt_fragment", None, {}),
    # Unmapped before the table, and still the generic answer.
    (w.ObjectNotFound("k"), 500, "internal", None, {}),
    (w.StoreError("denied"), 500, "internal", None, {}),
    (w.SimulatedCrash("boom"), 500, "internal", None, {}),
    (w.Wal3Error("what"), 500, "internal", None, {}),
    # New: data loss has its own code instead of the generic one.
    (w.CorruptManifest("bad manifest"), 500, "data_loss", None, {}),
    (w.ScrubFailed(["a", "b"]), 500, "data_loss", None, {}),
    (CorruptCompactedPointer("bad CURRENT.json"), 500, "data_loss", None, {}),
]

# Subclasses answer as their parents (kinds are inherited).
SUBCLASSES: list[tuple[type[w.Wal3Error], int, str]] = [
    (ClaimLost, 409, "contention"),
    (CreationInProgress, 409, "contention"),
    (FloorLost, 409, "gc_rejected"),
    (ResolvedPreconditionFailed, 409, "contention"),
]

HOST: list[tuple[ApiError, int, str, dict[str, str]]] = [
    (ApiError("plain"), 400, "bad_request", {}),
    (BadRequest("x: bad"), 400, "invalid_request", {}),
    (RecordTooLarge("big"), 400, "record_too_large", {}),
    (Unauthorized("who"), 401, "unauthorized", {}),
    (Forbidden("no"), 403, "forbidden", {}),
    (NotFound("none"), 404, "not_found", {}),
    (TooLarge("huge"), 413, "too_large", {}),
    (NotLeader("http://h2:8080"), 307, "not_leader", {"Location": "http://h2:8080"}),
    (BackpressureError("busy", "memory", 2.6), 429, "backpressure", {"Retry-After": "3"}),
    (Conflict("dup", "idempotency_mismatch"), 409, "idempotency_mismatch", {}),
    (Conflict("raced", "contention", retry_after_s=1), 409, "contention", {"Retry-After": "1"}),
    (Conflict("s", "sealed"), 409, "sealed", {}),
    (Conflict("c", "cursor_conflict"), 409, "cursor_conflict", {}),
    (Unavailable("down"), 503, "unavailable", {"Retry-After": "1"}),
    (Unavailable("shutting down", 1), 503, "unavailable", {"Retry-After": "1"}),
]


@pytest.mark.parametrize(
    ("exc", "status", "code", "retry", "extra"),
    ENGINE,
    ids=[type(e[0]).__name__ + ":" + e[2] for e in ENGINE],
)
def test_engine_answers_on_the_table(
    exc: w.Wal3Error, status: int, code: str, retry: str | None, extra: dict[str, Any]
) -> None:
    api = to_api_error(exc)
    assert api is not None
    assert (api.status, api.code) == (status, code)
    assert api.headers.get("Retry-After") == retry
    assert api.extra == extra
    assert ANSWERS[exc.kind].status == status and ANSWERS[exc.kind].code == code


@pytest.mark.parametrize(
    ("cls", "status", "code"), SUBCLASSES, ids=lambda v: getattr(v, "__name__", str(v))
)
def test_subclasses_answer_as_their_parents(cls: type[w.Wal3Error], status: int, code: str) -> None:
    exc = cls.__new__(cls)
    Exception.__init__(exc, "x")
    api = to_api_error(exc)
    assert api is not None and (api.status, api.code) == (status, code)


@pytest.mark.parametrize(
    ("exc", "status", "code", "headers"), HOST, ids=[f"{type(h[0]).__name__}:{h[2]}" for h in HOST]
)
def test_host_answers_on_the_table(
    exc: ApiError, status: int, code: str, headers: dict[str, str]
) -> None:
    assert (exc.status, exc.code) == (status, code)
    assert exc.headers == headers
    assert (type(exc).status, type(exc).code) == (
        ANSWERS[type(exc).kind].status,
        ANSWERS[type(exc).kind].code,
    )


def test_a_conflict_code_outside_the_table_is_refused() -> None:
    with pytest.raises(ValueError, match="409"):
        Conflict("x", "not_a_code")
    with pytest.raises(ValueError):
        Conflict("x", "purged")  # a 410, not a 409


def test_non_errors_are_not_mapped() -> None:
    assert to_api_error(ValueError("bug")) is None


# --------------------------------------------------------------------------- through the real app


@pytest.fixture
async def client(tmp_path: Path) -> Any:
    """The real app (create_app) with one extra route that raises the error it is told to."""
    cfg = Settings(
        store=str(tmp_path / "store"),
        listen="127.0.0.1:1",
        api_keys=KEYS,
        server_id="test-table",
        rollup_interval_s=3600.0,
        idle_close_s=3600.0,
        gc_interval_s=3600.0,
    )
    store = LocalStore(tmp_path / "store")
    server = Server(cfg, store=store)
    app = create_app(server)
    errors: list[BaseException] = [e[0] for e in ENGINE] + [h[0] for h in HOST]

    async def _raise(i: int) -> None:
        raise errors[i]

    app.add_api_route("/_test/raise/{i}", _raise, methods=["GET"])
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1"
    ) as c:
        yield c
    await store.close()


async def test_every_answer_through_the_app(client: httpx.AsyncClient) -> None:
    for i, (exc, status, code, retry, extra) in enumerate(ENGINE):
        r = await client.get(f"/_test/raise/{i}")
        err = assert_error(r, status, code)
        assert r.headers.get("retry-after") == retry, (exc, r.headers)
        for k, v in extra.items():
            assert err[k] == v, (exc, err)
        if code == "internal":
            assert err["message"].startswith(type(exc).__name__ + ": "), err
        else:
            assert err["message"] == str(exc), err
    for j, (hexc, status, code, headers) in enumerate(HOST):
        r = await client.get(f"/_test/raise/{len(ENGINE) + j}")
        if status == 307:
            # The app's own NotLeader handler points the client at the same path on the leader.
            assert r.status_code == 307
            assert r.headers["location"] == "http://h2:8080/_test/raise/" + str(len(ENGINE) + j)
            assert r.json()["error"]["code"] == "not_leader"
            continue
        assert_error(r, status, code)
        for k, v in headers.items():
            assert r.headers.get(k) == v, (hexc, r.headers)


async def test_framework_errors_keep_their_codes(client: httpx.AsyncClient) -> None:
    assert_error(await client.get("/no/such/route"), 404, "not_found")
    assert_error(await client.delete("/healthz"), 405, "method_not_allowed")


async def test_a_corrupt_manifest_answers_data_loss_end_to_end(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    path = f"/v1/tenants/alice/logs/{CID}"
    async with live_server(str(store_dir)) as live, live.client() as c:
        r = await c.post(f"{path}/records", json={"records": [record("a", document="x")]})
        assert r.status_code == 200, r.text
    manifests = [p for p in store_dir.rglob("MANIFEST") if p.is_file()]
    assert manifests, list(store_dir.rglob("*"))
    for m in manifests:
        if CID in str(m):
            m.write_bytes(b"{not json")
    async with live_server(str(store_dir)) as live, live.client() as c:
        r = await c.get(path, headers=auth())
        err = assert_error(r, 500, "data_loss")
        assert err["message"]
