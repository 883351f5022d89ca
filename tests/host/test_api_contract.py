"""The REST contract through a real uvicorn on a loopback port: every endpoint, shape and error code."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import pytest_asyncio

from wal3 import LocalStore

from .live import (
    CID,
    Live,
    assert_error,
    live_server,
    log_path,
    metric,
    metric_sum,
    metrics_text,
    read_all,
    record,
    wait_until,
)

BASE = log_path("alice", CID)
RECORD_KEYS = {"id", "op", "document", "metadata", "embedding"}
STATE_KEYS = {
    "collection_id",
    "tenant",
    "oldest_offset",
    "next_offset",
    "compaction_offset",
    "setsum",
    "sealed",
    "fragments",
    "bytes",
}
FRAGMENT_KEYS = {"url", "start", "limit", "num_bytes", "setsum", "content_md5"}
CURSOR_KEYS = {"name", "offset", "epoch_us", "writer", "witness"}
METRIC_NAMES = (
    "loghost_append_requests_total",
    "loghost_append_records_total",
    "loghost_append_bytes_total",
    "loghost_append_latency_seconds",
    "loghost_open_logs",
    "loghost_log_evictions_total",
    "loghost_backpressure_total",
    "loghost_contention_total",
    "loghost_leader_hint_failures_total",
)


@pytest.fixture
async def live(tmp_path: Path) -> AsyncIterator[Live]:
    async with live_server(str(tmp_path / "store"), gc_grace_s=0) as lv:
        yield lv


@pytest.fixture
async def client(live: Live) -> AsyncIterator[httpx.AsyncClient]:
    async with live.client("alice-key") as c:
        yield c


@pytest.fixture
async def service(live: Live) -> AsyncIterator[httpx.AsyncClient]:
    """The service key: compaction, seal, fork and fragment URLs are the service's."""
    async with live.client() as c:
        yield c


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Live]:
    """One server for the many parametrised bad-input cases (each starts from the same state:
    alice's log ``CID`` with two records; refused requests change nothing)."""
    async with live_server(str(tmp_path_factory.mktemp("shared") / "store")) as lv:
        async with lv.client("alice-key") as c:
            await append_singles(c, 2)
        yield lv


async def append(
    c: httpx.AsyncClient, *records: dict[str, Any], path: str = BASE, **extra: Any
) -> dict[str, Any]:
    r = await c.post(path + "/records", json={"records": list(records), **extra})
    assert r.status_code == 200, r.text
    return r.json()


async def append_singles(c: httpx.AsyncClient, n: int, path: str = BASE) -> None:
    """``n`` appends of one record each, one after the other (so one fragment each)."""
    for i in range(n):
        await append(c, record(f"r{i}", document=f"doc {i}"), path=path)


def full_record(rec: dict[str, Any]) -> dict[str, Any]:
    """A record as stored: every field, absent ones null."""
    return {k: rec.get(k) for k in RECORD_KEYS}


def is_compact_json(text: str) -> bool:
    """True if ``text`` has no insignificant whitespace (outside string literals)."""
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in " \t\r\n":
            return False
    return True


def url_to_path(url: str) -> Path:
    parts = urlsplit(url)
    assert parts.scheme == "file", url
    return Path(unquote(parts.path))


# ------------------------------------------------------------------------------ appends & reads


async def test_append_and_read_shapes(client: httpx.AsyncClient) -> None:
    recs = [
        record(
            "a",
            document="héllo wörld ✓",
            metadata={"s": "x", "i": 7, "f": 1.5, "b": True, "n": None},
            embedding=[0.5, -1.25, 3],
        ),
        record("b", "update", document=None),
        record("c", "upsert", metadata={}),
        record("d", "delete"),
    ]
    ans = await append(client, *recs)
    assert set(ans) == {"first_offset", "count", "next_offset"}
    assert ans == {"first_offset": 1, "count": 4, "next_offset": 5}
    again = await append(client, record("e"))
    assert again == {"first_offset": 5, "count": 1, "next_offset": 6}

    r = await client.get(BASE + "/records", params={"from": 1})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"records", "next_offset"}
    assert body["next_offset"] == 6
    assert [x["offset"] for x in body["records"]] == [1, 2, 3, 4, 5]
    for item, sent in zip(body["records"], [*recs, record("e")], strict=True):
        assert set(item) == {"offset", "timestamp_us", "record"}
        assert isinstance(item["timestamp_us"], int) and item["timestamp_us"] > 0
        got = item["record"]
        assert set(got) <= RECORD_KEYS
        assert full_record(got) == full_record(sent)
    # bool stays bool, int stays int in metadata
    meta = body["records"][0]["record"]["metadata"]
    assert meta["b"] is True and type(meta["i"]) is int and meta["n"] is None


async def test_records_are_contiguous_from_offset_with_limit(client: httpx.AsyncClient) -> None:
    await append(client, *[record(i) for i in range(3)])
    await append(client, *[record(i) for i in range(3, 7)])
    r = await client.get(BASE + "/records", params={"from": 3, "limit": 3})
    body = r.json()
    assert [x["offset"] for x in body["records"]] == [3, 4, 5]
    assert [x["record"]["id"] for x in body["records"]] == ["2", "3", "4"]
    assert body["next_offset"] == 6
    r = await client.get(BASE + "/records", params={"from": body["next_offset"]})
    assert [x["offset"] for x in r.json()["records"]] == [6, 7]
    # at the tail: nothing, next_offset stays put
    r = await client.get(BASE + "/records", params={"from": 8})
    assert r.status_code == 200 and r.json() == {"records": [], "next_offset": 8}


async def test_stored_body_is_compact_utf8_json_in_the_fragment(service: httpx.AsyncClient) -> None:
    client = service
    sent = record(
        "ü-1", document="naïve café ☕", metadata={"k": "välue", "n": 3}, embedding=[1.5, 2.0]
    )
    await append(client, sent)
    r = await client.get(BASE + "/fragments", params={"from": 1})
    frags = r.json()["fragments"]
    assert len(frags) == 1
    table = pq.read_table(url_to_path(frags[0]["url"]))
    bodies = table.column("body").to_pylist()
    assert table.column("offset").to_pylist() == [1]
    assert len(bodies) == 1
    raw: bytes = bodies[0]
    text = raw.decode("utf-8")  # UTF-8, not some other encoding
    assert "naïve café ☕".encode() in raw, raw  # raw UTF-8, not \\u escapes
    assert is_compact_json(text), text
    assert full_record(json.loads(text)) == full_record(sent)
    # /records embeds exactly the stored body
    r = await client.get(BASE + "/records")
    assert r.content.count(raw) == 1


async def test_idempotent_retry_returns_first_answer(client: httpx.AsyncClient) -> None:
    first = await append(client, record("x1"), record("x2"), idempotency_key="k-1")
    again = await append(client, record("x1"), record("x2"), idempotency_key="k-1")
    assert again == {**first, "deduplicated": True}
    # a different body under the same key is refused, never silently dropped (issue 21)
    r = await client.post(
        BASE + "/records", json={"records": [record("zzz")], "idempotency_key": "k-1"}
    )
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_mismatch", r.text
    state = (await client.get(BASE)).json()
    assert state["next_offset"] == first["next_offset"]
    records = await read_all(client, BASE)
    assert [x["record"]["id"] for x in records] == ["x1", "x2"]


async def test_concurrent_retries_with_one_key_append_once(client: httpx.AsyncClient) -> None:
    await append(client, record("seed"))
    answers = await asyncio.gather(
        *(
            client.post(
                BASE + "/records",
                json={"records": [record("once"), record("twice")], "idempotency_key": "same"},
            )
            for _ in range(12)
        )
    )
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers]
    # one appended, the others say they were deduplicated; all name the same offsets
    assert len({(a.json()["first_offset"], a.json()["count"]) for a in answers}) == 1
    assert sum(1 for a in answers if not a.json().get("deduplicated")) == 1
    ids = [x["record"]["id"] for x in await read_all(client, BASE)]
    assert ids == ["seed", "once", "twice"]


# --------------------------------------------------------------------------------- long poll


def _readers_inside(live: Live, cid: str) -> int:
    # Long-polls wait outside use() (they never pin a slot): count users and waiters.
    return sum(
        h.users + h.waiters for h in live.server.manager.handles() if str(h.collection_id) == cid
    )


async def test_long_poll_gets_records_appended_while_waiting(
    live: Live, client: httpx.AsyncClient
) -> None:
    await append(client, record("before"))
    read = asyncio.create_task(client.get(BASE + "/records", params={"from": 2, "wait_ms": 20_000}))
    # The read is parked inside the server before anything is appended.
    await wait_until(lambda: _readers_inside(live, CID) >= 1 or read.done(), "reader waiting")
    assert not read.done(), read.result().text
    async with live.client("alice-key") as writer:
        ans = await append(writer, record("during", document="hi"))
    r = await read
    assert r.status_code == 200, r.text
    body = r.json()
    assert [x["offset"] for x in body["records"]] == [ans["first_offset"]] == [2]
    assert body["records"][0]["record"]["id"] == "during"
    assert body["records"][0]["record"]["document"] == "hi"
    assert body["next_offset"] == 3


async def test_long_poll_with_nothing_arriving_returns_empty(client: httpx.AsyncClient) -> None:
    await append(client, record("only"))
    r = await client.get(BASE + "/records", params={"from": 2, "wait_ms": 300})
    assert r.status_code == 200
    assert r.json() == {"records": [], "next_offset": 2}


# ------------------------------------------------------------------------- state & fragments


async def test_state_shape(client: httpx.AsyncClient) -> None:
    await append_singles(client, 3)
    r = await client.get(BASE)
    assert r.status_code == 200
    st = r.json()
    assert set(st) == STATE_KEYS
    assert st["collection_id"] == CID and st["tenant"] == "alice"
    assert st["oldest_offset"] == 1 and st["next_offset"] == 4
    assert st["compaction_offset"] == 1
    assert st["sealed"] is False
    assert st["fragments"] == 3
    assert isinstance(st["setsum"], str) and len(st["setsum"]) == 64
    assert st["bytes"] > 0


async def test_fragments_are_directly_readable(service: httpx.AsyncClient) -> None:
    client = service
    await append_singles(client, 4)
    r = await client.get(BASE + "/fragments", params={"from": 1})
    assert r.status_code == 200
    body = r.json()
    assert set(body) == {"fragments"}
    frags = body["fragments"]
    assert [(f["start"], f["limit"]) for f in frags] == [(1, 2), (2, 3), (3, 4), (4, 5)]
    for f in frags:
        assert set(f) == FRAGMENT_KEYS
        assert f["url"].startswith("file://")
        path = url_to_path(f["url"])
        assert path.stat().st_size == f["num_bytes"]
        table = pq.read_table(path)
        assert table.column("offset").to_pylist() == list(range(f["start"], f["limit"]))
        assert len(f["setsum"]) == 64
    r = await client.get(BASE + "/fragments", params={"from": 3})
    assert [f["start"] for f in r.json()["fragments"]] == [3, 4]


# -------------------------------------------------------------------------------- cursors


async def test_cursor_compare_and_swap(client: httpx.AsyncClient) -> None:
    await append_singles(client, 5)
    path = BASE + "/cursors/reader_1"
    assert_error(await client.get(path), 404)
    r = await client.put(path, json={"offset": 2, "witness": None})
    assert r.status_code == 200, r.text
    created = r.json()
    assert set(created) == CURSOR_KEYS
    assert created["name"] == "reader_1" and created["offset"] == 2
    assert isinstance(created["witness"], str) and created["witness"]
    got = (await client.get(path)).json()
    assert set(got) == CURSOR_KEYS and got["offset"] == 2 and got["witness"] == created["witness"]

    # creating again (witness null) conflicts
    assert_error(
        await client.put(path, json={"offset": 3, "witness": None}), 409, "cursor_conflict"
    )
    r = await client.put(path, json={"offset": 4, "witness": got["witness"]})
    assert r.status_code == 200, r.text
    moved = r.json()
    assert moved["offset"] == 4 and moved["witness"] != got["witness"]
    # the stale witness loses and changes nothing
    assert_error(
        await client.put(path, json={"offset": 5, "witness": got["witness"]}),
        409,
        "cursor_conflict",
    )
    assert (await client.get(path)).json()["offset"] == 4
    # CAS may move a cursor back (it is not the compaction cursor)
    r = await client.put(path, json={"offset": 3, "witness": moved["witness"]})
    assert r.status_code == 200 and r.json()["offset"] == 3

    r = await client.delete(path)
    assert r.status_code == 200, r.text
    assert_error(await client.get(path), 404)


async def test_compaction_moves_forward_only(service: httpx.AsyncClient) -> None:
    client = service
    await append_singles(client, 6)
    r = await client.post(BASE + "/compaction", json={"offset": 4})
    assert r.status_code == 200 and r.json() == {"compaction_offset": 4}
    r = await client.post(BASE + "/compaction", json={"offset": 2})
    assert r.status_code == 200 and r.json() == {"compaction_offset": 4}
    assert (await client.get(BASE)).json()["compaction_offset"] == 4
    assert (await client.get(BASE + "/cursors/compaction")).json()["offset"] == 4
    r = await client.post(BASE + "/compaction", json={"offset": 7})  # == next_offset: allowed
    assert r.status_code == 200 and r.json() == {"compaction_offset": 7}
    assert_error(await client.post(BASE + "/compaction", json={"offset": 8}), 400)


# ------------------------------------------------------------------------ seal, fork, gc, scrub


async def test_seal_then_appends_conflict(service: httpx.AsyncClient) -> None:
    client = service
    await append(client, record("a"))
    r = await client.post(BASE + "/seal")
    assert r.status_code == 200, r.text
    assert (await client.get(BASE)).json()["sealed"] is True
    assert_error(
        await client.post(BASE + "/records", json={"records": [record("b")]}), 409, "sealed"
    )
    # still readable, nothing appended
    assert [x["record"]["id"] for x in await read_all(client, BASE)] == ["a"]


async def test_fork_equals_source_from_fork_point(service: httpx.AsyncClient) -> None:
    client = service
    await append_singles(client, 5)
    await append(client, record("multi-1"), record("multi-2"))
    # The cursor is moved by hand (PUT), as a tool would without compacting: no compacted version
    # exists, and no GC visit is scheduled (a compaction POST schedules one, which with grace 0
    # could collect [1, 3) before the fork reads it: what this test checks is the fork, not GC).
    cur = await client.get(BASE + "/cursors/compaction")
    witness = cur.json()["witness"] if cur.status_code == 200 else None
    put = await client.put(BASE + "/cursors/compaction", json={"offset": 3, "witness": witness})
    assert put.status_code == 200, put.text
    target = str(uuid.uuid4())
    r = await client.post(BASE + "/fork", json={"target_collection_id": target})
    assert r.status_code == 200, r.text
    tpath = log_path("alice", target)
    tstate = (await client.get(tpath)).json()
    sstate = (await client.get(BASE)).json()
    assert set(tstate) == STATE_KEYS
    assert tstate["collection_id"] == target and tstate["tenant"] == "alice"
    assert tstate["next_offset"] == sstate["next_offset"] == 8
    assert tstate["oldest_offset"] <= 3
    # No compacted version exists (the cursor was moved by hand): the fork's cursor may not
    # stand ahead of compacted data, so it is 1 and the fork holds the log from 1 (issue 20).
    assert tstate["compaction_offset"] == 1 and tstate["oldest_offset"] == 1
    src = await read_all(client, BASE, 3)
    dst = await read_all(client, tpath, 3)
    assert dst == src and len(src) == 5
    # independent afterwards
    t_ans = await append(client, record("t"), path=tpath)
    s_ans = await append(client, record("s"))
    assert t_ans["first_offset"] == s_ans["first_offset"] == 8
    assert (await read_all(client, tpath, 8))[0]["record"]["id"] == "t"
    assert (await read_all(client, BASE, 8))[0]["record"]["id"] == "s"
    # forking into an existing collection is refused
    r = await client.post(BASE + "/fork", json={"target_collection_id": target})
    assert_error(r, 409)


async def test_fork_past_the_tail_is_rejected(service: httpx.AsyncClient) -> None:
    client = service
    """``offset`` in the fork body (a server extension) beyond the tail is invalid input."""
    await append_singles(client, 3)
    target = str(uuid.uuid4())
    r = await client.post(BASE + "/fork", json={"target_collection_id": target, "offset": 1000})
    err = assert_error(r, 400)
    assert "offset" in err["message"]
    assert_error(await client.get(log_path("alice", target)), 404)


async def test_gc_then_read_below_oldest_is_purged(service: httpx.AsyncClient) -> None:
    client = service
    await append_singles(client, 6)
    assert (await client.post(BASE + "/compaction", json={"offset": 4})).status_code == 200

    async def collected() -> bool:
        # Moving the compaction cursor schedules the server's own collector (grace 0 here).
        return (await client.get(BASE)).json()["oldest_offset"] == 4

    await wait_until(collected, "GC to move oldest_offset to the compaction cursor", 30.0, 0.05)
    r = await client.post(BASE + "/gc")  # nothing left to do; still a well-formed answer
    assert r.status_code == 200, r.text
    err = assert_error(await client.get(BASE + "/records", params={"from": 1}), 410, "purged")
    assert "message" in err
    assert_error(await client.get(BASE + "/records", params={"from": 3}), 410, "purged")
    assert_error(await client.get(BASE + "/fragments", params={"from": 2}), 410, "purged")
    kept = await read_all(client, BASE, 4)
    assert [x["offset"] for x in kept] == [4, 5, 6]
    assert [x["record"]["id"] for x in kept] == ["r3", "r4", "r5"]
    # a cursor cannot be created below the oldest retained offset either
    assert_error(
        await client.put(BASE + "/cursors/late", json={"offset": 2, "witness": None}), 410, "purged"
    )


async def test_manual_gc_purges_and_never_500s(service: httpx.AsyncClient) -> None:
    client = service
    """POST .../gc (twice if needed) while the server's own collector runs: 200 or 409, never 500."""
    await append_singles(client, 6)
    assert (await client.post(BASE + "/compaction", json={"offset": 4})).status_code == 200
    for _ in range(3):
        answers = await asyncio.gather(*(client.post(BASE + "/gc") for _ in range(2)))
        for r in answers:
            assert r.status_code in (200, 409), r.text
            if r.status_code == 200:
                assert "phase" in r.json()
    await wait_until(lambda: _oldest_is(client, 4), "oldest_offset 4", 30.0, 0.05)
    assert_error(await client.get(BASE + "/records", params={"from": 1}), 410, "purged")


async def _oldest_is(client: httpx.AsyncClient, offset: int) -> bool:
    return (await client.get(BASE)).json()["oldest_offset"] == offset


async def test_scrub_ok(service: httpx.AsyncClient) -> None:
    client = service
    await append_singles(client, 3)
    r = await client.get(BASE + "/scrub")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["ok"] is True and body["problems"] == []
    assert body["records"] == 3


# ----------------------------------------------------------------------------- operations


async def test_health_ready_docs(live: Live) -> None:
    async with httpx.AsyncClient(base_url=live.url) as anon:
        r = await anon.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        r = await anon.get("/readyz")
        assert r.status_code == 200 and r.json()["status"] == "ready"
        r = await anon.get("/openapi.json")
        assert r.status_code == 200
        paths = r.json()["paths"]
        recs = "/v1/tenants/{tenant}/logs/{collection_id}/records"
        assert {"get", "post"} <= set(paths[recs])
        for suffix in (
            "",
            "/fragments",
            "/cursors/{name}",
            "/compaction",
            "/seal",
            "/fork",
            "/gc",
            "/scrub",
        ):
            assert "/v1/tenants/{tenant}/logs/{collection_id}" + suffix in paths, suffix
        r = await anon.get("/docs")
        assert r.status_code == 200 and "text/html" in r.headers["content-type"]


async def test_readyz_is_503_while_the_store_fails(s3_fault_proxy: Any, s3_bucket: str) -> None:
    from wal3 import S3Store

    store = S3Store(
        bucket=s3_bucket,
        prefix="ready",
        endpoint_url=s3_fault_proxy.endpoint,
        region="us-east-1",
        max_attempts=2,
        base_backoff_s=0.01,
        max_backoff_s=0.02,
    )
    async with live_server(store=store) as lv, httpx.AsyncClient(base_url=lv.url) as anon:
        assert (await anon.get("/readyz")).status_code == 200
        s3_fault_proxy.fail_next("internal_error", method="HEAD", count=20)
        s3_fault_proxy.fail_next("internal_error", method="GET", count=20)
        r = await anon.get("/readyz")
        assert_error(r, 503)
        assert (await anon.get("/healthz")).status_code == 200  # alive, just not ready
        s3_fault_proxy.script.clear()
        assert (await anon.get("/readyz")).status_code == 200


async def test_metrics_names_and_counts(live: Live, client: httpx.AsyncClient) -> None:
    await append(client, record("a", document="x" * 100), record("b"))
    text = await metrics_text(client)
    for name in METRIC_NAMES:
        assert f"# TYPE {name} " in text, name
    assert "# TYPE loghost_append_latency_seconds histogram" in text
    assert metric(text, "loghost_append_records_total") == 2
    assert metric(text, "loghost_append_requests_total", status="200") == 1
    assert (metric(text, "loghost_append_bytes_total") or 0) > 100
    assert metric(text, "loghost_append_latency_seconds_count") == 1
    assert metric(text, "loghost_open_logs") == 1


# ------------------------------------------------------------------------------ 400s


BAD_APPEND_BODIES: list[tuple[str, bytes, str]] = [
    ("empty records", b'{"records": []}', "records"),
    ("bad op", b'{"records": [{"id": "a", "op": "insert"}]}', "op"),
    ("id too long", b'{"records": [{"id": "' + b"a" * 257 + b'", "op": "add"}]}', "id"),
    ("empty id", b'{"records": [{"id": "", "op": "add"}]}', "id"),
    ("id not a string", b'{"records": [{"id": 1, "op": "add"}]}', "id"),
    ("missing op", b'{"records": [{"id": "a"}]}', "op"),
    (
        "document not a string",
        b'{"records": [{"id": "a", "op": "add", "document": 5}]}',
        "document",
    ),
    ("metadata a list", b'{"records": [{"id": "a", "op": "add", "metadata": [1]}]}', "metadata"),
    (
        "metadata value nested",
        b'{"records": [{"id": "a", "op": "add", "metadata": {"k": {}}}]}',
        "metadata",
    ),
    (
        "metadata value list",
        b'{"records": [{"id": "a", "op": "add", "metadata": {"k": [1]}}]}',
        "metadata",
    ),
    (
        "embedding a string",
        b'{"records": [{"id": "a", "op": "add", "embedding": "1,2"}]}',
        "embedding",
    ),
    (
        "embedding of strings",
        b'{"records": [{"id": "a", "op": "add", "embedding": ["1"]}]}',
        "embedding",
    ),
    ("embedding NaN", b'{"records": [{"id": "a", "op": "add", "embedding": [NaN]}]}', ""),
    ("unknown record field", b'{"records": [{"id": "a", "op": "add", "colour": "red"}]}', "colour"),
    ("unknown top-level field", b'{"records": [{"id": "a", "op": "add"}], "mode": 1}', "mode"),
    ("records not a list", b'{"records": {"id": "a", "op": "add"}}', "records"),
    ("records missing", b"{}", "records"),
    (
        "idempotency key not a string",
        b'{"records": [{"id": "a", "op": "add"}], "idempotency_key": 7}',
        "idempotency_key",
    ),
    ("body an array", b"[]", ""),
    ("body null", b"null", ""),
    ("empty body", b"", ""),
    ("invalid JSON", b'{"records": [', ""),
    ("trailing garbage", b'{"records": [{"id": "a", "op": "add"}]} x', ""),
    ("non-UTF-8 body", b"\xff\xfe\x00{", ""),
    ("non-UTF-8 inside a string", b'{"records": [{"id": "\xc3\x28", "op": "add"}]}', ""),
    (
        "deeply nested",
        b'{"records": [{"id": "a", "op": "add", "metadata": {"k": '
        + b"[" * 5000
        + b"]" * 5000
        + b"}}]}",
        "",
    ),
    ("deeply nested top level", b"[" * 100_000 + b"]" * 100_000, ""),
]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("body", "field"),
    [(b, f) for _, b, f in BAD_APPEND_BODIES],
    ids=[n for n, _, _ in BAD_APPEND_BODIES],
)
async def test_bad_append_is_400_naming_the_field(shared: Live, body: bytes, field: str) -> None:
    fresh = log_path("alice", uuid.uuid4())
    async with shared.client("alice-key") as c:
        for path in (fresh, BASE):  # a new log and an existing one
            r = await c.post(
                path + "/records", content=body, headers={"content-type": "application/json"}
            )
            err = assert_error(r, 400)
            if field:
                assert field in err["message"], err
        # nothing was created or appended by a refused append
        assert_error(await c.get(fresh), 404)
        assert (await c.get(BASE)).json()["next_offset"] == 3


BAD_REQUESTS: list[tuple[str, str, str, bytes | None, str]] = [
    ("bad uuid", "GET", "/v1/tenants/alice/logs/not-a-uuid", None, "collection_id"),
    (
        "bad uuid on append",
        "POST",
        "/v1/tenants/alice/logs/12345/records",
        b'{"records": [{"id": "a", "op": "add"}]}',
        "collection_id",
    ),
    ("bad tenant", "GET", f"/v1/tenants/al!ce/logs/{CID}", None, "tenant"),
    ("negative from", "GET", BASE + "/records?from=-1", None, "from"),
    ("zero from", "GET", BASE + "/records?from=0", None, "from"),
    ("huge from", "GET", BASE + "/records?from=" + "9" * 30, None, "from"),
    ("from 2^63", "GET", BASE + f"/records?from={1 << 63}", None, "from"),
    ("from not a number", "GET", BASE + "/records?from=abc", None, "from"),
    ("zero limit", "GET", BASE + "/records?limit=0", None, "limit"),
    ("huge limit", "GET", BASE + "/records?limit=" + "9" * 20, None, "limit"),
    ("negative wait", "GET", BASE + "/records?wait_ms=-5", None, "wait_ms"),
    ("huge wait", "GET", BASE + "/records?wait_ms=" + "9" * 20, None, "wait_ms"),
    ("fragments negative from", "GET", BASE + "/fragments?from=-3", None, "from"),
    ("compaction negative", "POST", BASE + "/compaction", b'{"offset": -1}', "offset"),
    ("compaction huge", "POST", BASE + "/compaction", b'{"offset": ' + b"9" * 40 + b"}", "offset"),
    ("compaction string", "POST", BASE + "/compaction", b'{"offset": "3"}', "offset"),
    ("compaction unknown field", "POST", BASE + "/compaction", b'{"offset": 1, "x": 1}', "x"),
    ("compaction invalid JSON", "POST", BASE + "/compaction", b"{", ""),
    ("cursor negative", "PUT", BASE + "/cursors/c1", b'{"offset": -1, "witness": null}', "offset"),
    (
        "cursor huge",
        "PUT",
        BASE + "/cursors/c1",
        b'{"offset": ' + b"9" * 40 + b', "witness": null}',
        "offset",
    ),
    ("cursor witness type", "PUT", BASE + "/cursors/c1", b'{"offset": 1, "witness": 5}', "witness"),
    (
        "cursor unknown field",
        "PUT",
        BASE + "/cursors/c1",
        b'{"offset": 1, "witness": null, "force": true}',
        "force",
    ),
    ("cursor bad name", "PUT", BASE + "/cursors/a%20b", b'{"offset": 1, "witness": null}', ""),
    ("cursor name too long", "GET", BASE + "/cursors/" + "a" * 300, None, ""),
    ("cursor non-UTF-8", "PUT", BASE + "/cursors/c1", b'{"offset": 1, "witness": "\xff"}', ""),
    (
        "fork bad uuid",
        "POST",
        BASE + "/fork",
        b'{"target_collection_id": "nope"}',
        "target_collection_id",
    ),
    ("fork missing target", "POST", BASE + "/fork", b"{}", "target_collection_id"),
    (
        "fork into itself",
        "POST",
        BASE + "/fork",
        b'{"target_collection_id": "' + CID.encode() + b'"}',
        "target_collection_id",
    ),
    ("fork deeply nested", "POST", BASE + "/fork", b"[" * 20_000 + b"]" * 20_000, ""),
]


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    ("method", "path", "body", "field"),
    [(m, p, b, f) for _, m, p, b, f in BAD_REQUESTS],
    ids=[n for n, *_ in BAD_REQUESTS],
)
async def test_bad_input_is_400(
    shared: Live, method: str, path: str, body: bytes | None, field: str
) -> None:
    # the service key: its routes (compaction, fork, fragments) are among the cases
    async with shared.client() as c:
        kw: dict[str, Any] = {}
        if body is not None:
            kw = {"content": body, "headers": {"content-type": "application/json"}}
        err = assert_error(await c.request(method, path, **kw), 400)
        if field:
            assert field in err["message"], err


async def test_dirty_purge_bad_input_is_400(live: Live) -> None:
    async with live.client() as svc:
        for body in (
            b'{"collection_ids": ["x"]}',
            b'{"collection_ids": []}',
            b"{",
            b'{"collection_ids": "abc"}',
        ):
            assert_error(await svc.post("/v1/dirty/purge", content=body), 400)


# ------------------------------------------------------------------------------ 401/403/404


@pytest.mark.asyncio(loop_scope="module")
@pytest.mark.parametrize(
    "header",
    [
        None,
        "Bearer nope",
        "Bearer",
        "Basic c3ZjLWtleTo=",
        "svc-key",
        "Bearersvc-key",
        "Token svc-key",
        "Bearer svc-key-but-longer",
        "Bearer " + "x" * 5000,
    ],
)
async def test_401_for_missing_unknown_or_malformed_authorization(
    shared: Live, header: str | None
) -> None:
    headers = {} if header is None else {"Authorization": header}
    fresh = log_path("alice", uuid.uuid4())
    async with httpx.AsyncClient(base_url=shared.url, headers=headers) as c:
        assert_error(await c.post(fresh + "/records", json={"records": [record("a")]}), 401)
        assert_error(await c.post(BASE + "/records", json={"records": [record("a")]}), 401)
        assert_error(await c.get(BASE + "/records"), 401)
        assert_error(await c.get(BASE), 401)
        assert_error(await c.get(BASE + "/cursors/compaction"), 401)
        assert_error(await c.get("/v1/dirty"), 401)
        # bad input does not get past authentication either
        assert_error(await c.post("/v1/tenants/alice/logs/not-a-uuid/records", content=b"{"), 401)
    async with shared.client() as svc:  # and nothing was created or appended
        assert_error(await svc.get(fresh), 404)
        assert (await svc.get(BASE)).json()["next_offset"] == 3


# A tenant key on another tenant's path (403) is a cell of the matrix in test_authz.py.


async def test_404_never_written_log(client: httpx.AsyncClient, service: httpx.AsyncClient) -> None:
    path = log_path("alice", uuid.uuid4())
    assert_error(await client.get(path), 404)
    assert_error(await client.get(path + "/records"), 404)
    assert_error(await service.get(path + "/fragments"), 404)
    assert_error(await client.get(path + "/cursors/compaction"), 404)
    assert_error(await service.post(path + "/seal"), 404)
    assert_error(await client.get(path), 404)  # and the probes created nothing


# ----------------------------------------------------------------------------------- 413


async def test_413_request_over_configured_size(tmp_path: Path) -> None:
    async with (
        live_server(str(tmp_path / "store"), max_request_bytes=2048) as lv,
        lv.client("alice-key") as c,
    ):
        big = {"records": [record("a", document="x" * 4000)]}
        assert_error(await c.post(BASE + "/records", json=big), 413)

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: streamed
            yield b'{"records": [{"id": "a", "op": "add", "document": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        assert_error(await c.post(BASE + "/records", content=chunks()), 413)
        small = await append(c, record("fits", document="x" * 100))
        assert small["first_offset"] == 1


# ----------------------------------------------------------------------------------- 429


async def test_429_compaction_backpressure(tmp_path: Path) -> None:
    async with (
        live_server(str(tmp_path / "store"), backpressure_uncompacted_records=3) as lv,
        lv.client() as c,
    ):
        await append(c, record(1), record(2), record(3))
        await append(c, record(4))  # backlog 3 <= 3 before it: accepted
        r = await c.post(BASE + "/records", json={"records": [record(5)]})
        err = assert_error(r, 429, "backpressure")
        assert int(r.headers["Retry-After"]) >= 1
        assert "compaction" in json.dumps(err)
        text = await metrics_text(c)
        assert metric(text, "loghost_backpressure_total", reason="compaction") == 1
        # nothing appended by the refused request
        assert (await c.get(BASE)).json()["next_offset"] == 5
        # compaction catches up: appends flow again
        assert (await c.post(BASE + "/compaction", json={"offset": 5})).status_code == 200
        assert (await append(c, record(5)))["first_offset"] == 5


class GatedStore(LocalStore):
    """A local store whose fragment uploads under one log wait for a gate (to hold work in flight)."""

    def __init__(self, root: Path, prefix: str) -> None:
        super().__init__(root)
        self.prefix = prefix
        self.gate = asyncio.Event()
        self.gate.set()
        self.waiting = 0

    async def put(self, key: str, data: bytes, **kw: Any) -> str:
        if key.startswith(self.prefix) and "/log/" in key:
            self.waiting += 1
            try:
                await self.gate.wait()
            finally:
                self.waiting -= 1
        return await super().put(key, data, **kw)


@pytest.mark.parametrize("setting", ["max_buffered_bytes", "max_log_outstanding_bytes"])
async def test_429_batching_backpressure(tmp_path: Path, setting: str) -> None:
    store = GatedStore(tmp_path / "store", f"logs/{CID}/")
    async with live_server(store=store, **{setting: 1024}) as lv, lv.client("alice-key") as c:
        await append(c, record("warm"))  # opened and bound
        store.gate.clear()
        doc = "x" * 700
        first = asyncio.create_task(
            c.post(BASE + "/records", json={"records": [record("held", document=doc)]})
        )
        await wait_until(lambda: store.waiting >= 1 or first.done(), "first append in flight")
        assert not first.done(), first.result().text
        r = await c.post(BASE + "/records", json={"records": [record("over", document=doc)]})
        err = assert_error(r, 429, "backpressure")
        assert int(r.headers["Retry-After"]) >= 1
        assert "batching" in json.dumps(err)
        store.gate.set()
        held = await first
        assert held.status_code == 200, held.text
        assert held.json()["first_offset"] == 2
        text = await metrics_text(c)
        assert metric(text, "loghost_backpressure_total", reason="batching") == 1
        ids = [x["record"]["id"] for x in await read_all(c, BASE)]
        assert ids == ["warm", "held"]
        # once drained, the same append is accepted
        assert (await append(c, record("over", document=doc)))["first_offset"] == 3


async def test_429_open_log_cap_when_every_open_log_is_busy(tmp_path: Path) -> None:
    store = GatedStore(tmp_path / "store", f"logs/{CID}/")
    other = log_path("alice", uuid.uuid4())
    async with live_server(store=store, max_open_logs=1) as lv, lv.client("alice-key") as c:
        await append(c, record("warm"))
        store.gate.clear()
        busy = asyncio.create_task(c.post(BASE + "/records", json={"records": [record("held")]}))
        await wait_until(lambda: store.waiting >= 1 or busy.done(), "the only open log busy")
        assert not busy.done(), busy.result().text
        r = await c.post(other + "/records", json={"records": [record("elsewhere")]})
        err = assert_error(r, 429, "backpressure")
        assert int(r.headers["Retry-After"]) >= 1
        # The open-log cap has its own reason: "contention" is a store write conflict (409).
        assert err.get("reason") == "open_log_cap", err
        store.gate.set()
        assert (await busy).status_code == 200
        text = await metrics_text(c)
        assert metric(text, "loghost_backpressure_total", reason="open_log_cap") == 1
        assert metric(text, "loghost_backpressure_total", reason="contention") is None
        assert metric(text, "loghost_contention_total") == 0
        # the busy log is idle now: it is evicted to make room
        assert (await append(c, record("elsewhere"), path=other))["first_offset"] == 1
        assert metric(await metrics_text(c), "loghost_log_evictions_total") == 1
        assert [x["record"]["id"] for x in await read_all(c, BASE)] == ["warm", "held"]


async def test_fragment_urls_on_s3_are_readable_by_a_bulk_reader(
    moto_endpoint: str, s3_bucket: str
) -> None:
    import boto3

    from wal3 import S3Store

    store = S3Store(bucket=s3_bucket, prefix="root", endpoint_url=moto_endpoint, region="us-east-1")
    async with live_server(store=store) as lv, lv.client() as c:
        await append(c, record("s3-a", document="über"))
        await append(c, record("s3-b"), record("s3-c"))
        r = await c.get(BASE + "/fragments", params={"from": 1})
        assert r.status_code == 200, r.text
        frags = r.json()["fragments"]
        assert [(f["start"], f["limit"]) for f in frags] == [(1, 2), (2, 4)]
        s3 = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
        bodies = []
        for f in frags:
            parts = urlsplit(f["url"])
            assert parts.scheme == "s3" and parts.netloc == s3_bucket, f["url"]
            obj = s3.get_object(Bucket=s3_bucket, Key=unquote(parts.path.lstrip("/")))
            data = obj["Body"].read()
            assert len(data) == f["num_bytes"]
            table = pq.read_table(pa.BufferReader(data))
            assert table.column("offset").to_pylist() == list(range(f["start"], f["limit"]))
            bodies += [json.loads(b) for b in table.column("body").to_pylist()]
        assert [b["id"] for b in bodies] == ["s3-a", "s3-b", "s3-c"]
        assert bodies[0]["document"] == "über"


async def test_bad_input_never_500_on_any_endpoint(live: Live) -> None:
    """A sweep of junk bodies over every body-taking endpoint: always a 4xx with the error shape."""
    junk = [
        b"",
        b"{",
        b"[]",
        b"null",
        b"1",
        b'"s"',
        b"\xff\xff",
        b'{"a": 1}',
        b"[" * 20_000 + b"]" * 20_000,
        b'{"offset": 1e400}',
        b'{"offset": 1.5}',
        b'{"offset": true}',
        b'{"records": [null]}',
        b'{"records": [1]}',
    ]
    async with live.client("alice-key") as c:
        await append_singles(c, 2)
        for path, method in (
            (BASE + "/records", "POST"),
            (BASE + "/compaction", "POST"),
            (BASE + "/cursors/c", "PUT"),
            (BASE + "/fork", "POST"),
        ):
            for body in junk:
                r = await c.request(method, path, content=body)
                assert 400 <= r.status_code < 500, (path, body[:40], r.status_code, r.text)
                assert_error(r, r.status_code)
    async with live.client() as svc:
        text = await metrics_text(svc)
        assert metric_sum(text, "loghost_requests_total") > 0
        assert 'status="500"' not in text
