"""Hand-written bad requests against a real uvicorn: each is a 4xx with the error shape, never a
5xx, never a hang, and stores nothing.

One server serves the whole module (a rejected request must leave no trace, so the cases cannot
disturb each other; each one checks exactly that).  ``max_request_bytes`` is set to 1 MiB so
oversized bodies are cheap to send, ``max_records_per_request`` to 100.

After every case: the answer is the expected 4xx with ``{"error": {"code", "message"}}`` (a code
word, a message); the store directory is byte-for-byte what it was before (no fragment, no
manifest, no cursor, no tenant binding, no dirty-log entry); the never-written target log still
answers 404 and alice's log still has the same state.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import pytest_asyncio

from wal3 import LocalStore

from .live import CID, Live, assert_error, live_server, log_path, record

pytestmark = pytest.mark.asyncio(loop_scope="module")

LIMIT = 1 << 20  # max_request_bytes of the server under test
MAX_RECORDS = 100  # max_records_per_request
ALICE = log_path("alice", CID)  # an existing log with 3 records
# A never-written log: appends aim here.  Each case gets its own id (``{fresh}`` in its path and
# body is replaced), so a case that wrongly creates it cannot mask or break the others.
FRESH_ID = "{fresh}"
FRESH = log_path("alice", FRESH_ID)
CODE_WORD = re.compile(r"^[a-z][a-z_]*$")
REQUEST_TIMEOUT_S = 10.0  # a hang check, not a timing assertion
GOOD = json.dumps({"records": [record("ok", document="fine")]}).encode()


# ------------------------------------------------------------------------------------ helpers


def store_snapshot(root: Path) -> dict[str, str]:
    """Every object under the store directory, with a digest of its content."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def diff(before: dict[str, str], after: dict[str, str]) -> dict[str, list[str]]:
    return {
        "added": sorted(set(after) - set(before)),
        "removed": sorted(set(before) - set(after)),
        "changed": sorted(k for k in set(before) & set(after) if before[k] != after[k]),
    }


@dataclass
class RawResponse:
    """What came back over a raw socket."""

    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


async def raw_request(base_url: str, head: bytes, body: bytes = b"") -> RawResponse:
    """Send exactly these bytes (request line and headers, CRLF-separated, without the blank line)
    to the server and read the answer until the server closes (``Connection: close`` is added).

    For what httpx will not send: dot segments it would normalise, raw non-ASCII bytes, duplicate
    framing headers.
    """
    parts = urlsplit(base_url)
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(parts.hostname, parts.port), REQUEST_TIMEOUT_S
    )
    try:
        writer.write(head + b"\r\nConnection: close\r\n\r\n" + body)
        await writer.drain()
        data = await asyncio.wait_for(reader.read(), REQUEST_TIMEOUT_S)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
    head_bytes, _, rest = data.partition(b"\r\n\r\n")
    lines = head_bytes.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        out, buf = b"", rest
        while buf:
            size_line, _, buf = buf.partition(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                break
            out, buf = out + buf[:size], buf[size + 2 :]
        rest = out
    elif "content-length" in headers:
        rest = rest[: int(headers["content-length"])]
    return RawResponse(status, headers, rest)


def check_error_shape(
    status: int, body: bytes, expected: set[int], codes: set[str] | None
) -> dict[str, Any]:
    """The 4xx status is one of ``expected`` and the body is the error shape."""
    assert status < 500, f"server error {status}: {body[:500]!r}"
    assert status in expected, f"expected {sorted(expected)}, got {status}: {body[:500]!r}"
    try:
        doc = json.loads(body)
    except ValueError:
        pytest.fail(f"error body is not JSON: {body[:300]!r}")
    assert isinstance(doc, dict) and set(doc) == {"error"}, doc
    err = doc["error"]
    assert isinstance(err, dict), doc
    assert isinstance(err.get("code"), str) and CODE_WORD.match(err["code"]), doc
    assert isinstance(err.get("message"), str) and err["message"].strip(), doc
    if codes is not None:
        assert err["code"] in codes, doc
    return err


@dataclass
class Env:
    live: Live
    root: Path
    svc: httpx.AsyncClient  # service key: for looking, never for the bad requests
    anon: httpx.AsyncClient  # no Authorization: each bad request brings its own headers


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Env]:
    root = tmp_path_factory.mktemp("bad-input") / "store"
    # fsync off: these tests are about what is stored, not about durability (and shared CI disks
    # make fsync slow); the store is a real LocalStore directory all the same.
    async with live_server(
        store=LocalStore(root, fsync=False),
        max_request_bytes=LIMIT,
        max_records_per_request=MAX_RECORDS,
        max_wait_ms=1000,
    ) as lv:
        async with lv.client("alice-key") as c:
            r = await c.post(
                ALICE + "/records",
                json={"records": [record(i, document=f"d{i}") for i in range(3)]},
            )
            assert r.status_code == 200, r.text
            r = await c.put(ALICE + "/cursors/reader", json={"offset": 2, "witness": None})
            assert r.status_code == 200, r.text
            assert (await c.get(ALICE)).json()["next_offset"] == 4
        async with (
            lv.client() as svc,
            httpx.AsyncClient(base_url=lv.url, timeout=REQUEST_TIMEOUT_S, trust_env=False) as anon,
        ):
            yield Env(lv, root, svc, anon)


def fresh_id(name: str) -> str:
    """The never-written collection id of one case (stable across runs)."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "loghost-bad-input/" + name))


async def alice_now(env: Env) -> tuple[dict[str, Any], list[str]]:
    """Alice's log state and record ids, read with the service key."""
    r = await env.svc.get(ALICE)
    assert r.status_code == 200, r.text
    recs = await env.svc.get(ALICE + "/records", params={"from": r.json()["oldest_offset"]})
    assert recs.status_code == 200, recs.text
    return r.json(), [x["record"]["id"] for x in recs.json()["records"]]


async def assert_nothing_stored(
    env: Env, before: dict[str, str], fresh: str, alice_before: tuple[dict[str, Any], list[str]]
) -> None:
    after = store_snapshot(env.root)
    assert after == before, f"a rejected request changed the store: {diff(before, after)}"
    assert_error(await env.svc.get(log_path("alice", fresh)), 404)
    assert_error(await env.svc.get(log_path("alice", fresh) + "/records"), 404)
    assert await alice_now(env) == alice_before, "a rejected request changed alice's log"


# ------------------------------------------------------------------------------- the table


# per-log routes only a service key may use
SERVICE_ROUTES = ("/compaction", "/seal", "/fork", "/gc", "/scrub", "/fragments")


@dataclass
class Bad:
    """One bad request and what it must get."""

    name: str
    method: str
    path: str
    body: bytes | None = None
    status: int | set[int] = 400
    code: str | set[str] | None = "invalid_request"
    key: str | None = "alice-key"
    headers: list[tuple[str, str | bytes]] = field(default_factory=list)

    @property
    def caller_key(self) -> str | None:
        """The key sent: bad input to the service's routes goes with the service key, since a
        tenant key gets 403 there before the input is looked at (the matrix in test_authz.py)."""
        if self.key == "alice-key" and self.path.split("?")[0].endswith(SERVICE_ROUTES):
            return "svc-key"
        return self.key

    @property
    def statuses(self) -> set[int]:
        return self.status if isinstance(self.status, set) else {self.status}

    @property
    def codes(self) -> set[str] | None:
        if self.code is None:
            return None
        return self.code if isinstance(self.code, set) else {self.code}


def rec(**kw: Any) -> bytes:
    """An append body of one record with these fields (id and op default to valid ones)."""
    r: dict[str, Any] = {"id": "a", "op": "add"}
    r.update(kw)
    return json.dumps({"records": [{k: v for k, v in r.items() if v is not ...}]}).encode()


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


APPENDS = FRESH + "/records"
UNAUTHORIZED = {"unauthorized"}

CASES: list[Bad] = [
    # --- bodies of an append (to a never-written log: it must stay never-written)
    Bad("empty body", "POST", APPENDS, b""),
    Bad("whitespace body", "POST", APPENDS, b"   \n"),
    Bad("not JSON", "POST", APPENDS, b"records=a"),
    Bad("truncated JSON", "POST", APPENDS, GOOD[:-3]),
    Bad("trailing garbage", "POST", APPENDS, GOOD + b"]"),
    Bad("JSON null", "POST", APPENDS, b"null"),
    Bad("JSON array", "POST", APPENDS, json.dumps([record("a")]).encode()),
    Bad("JSON string", "POST", APPENDS, b'"records"'),
    Bad("records missing", "POST", APPENDS, b"{}"),
    Bad("records an object", "POST", APPENDS, json.dumps({"records": record("a")}).encode()),
    Bad("records a string", "POST", APPENDS, b'{"records": "a"}'),
    Bad("records null", "POST", APPENDS, b'{"records": null}'),
    Bad("records empty", "POST", APPENDS, b'{"records": []}'),
    Bad("record null", "POST", APPENDS, b'{"records": [null]}'),
    Bad("record a number", "POST", APPENDS, b'{"records": [7]}'),
    Bad(
        "too many records",
        "POST",
        APPENDS,
        json.dumps({"records": [record(i) for i in range(MAX_RECORDS + 1)]}).encode(),
    ),
    Bad(
        "one good one bad record",
        "POST",
        APPENDS,
        json.dumps({"records": [record("good"), {"id": "bad", "op": "nope"}]}).encode(),
    ),
    Bad("record missing id", "POST", APPENDS, rec(id=...)),
    Bad("record missing op", "POST", APPENDS, rec(op=...)),
    Bad("id empty", "POST", APPENDS, rec(id="")),
    Bad("id 257 chars", "POST", APPENDS, rec(id="x" * 257)),
    Bad("id a number", "POST", APPENDS, rec(id=5)),
    Bad("id null", "POST", APPENDS, rec(id=None)),
    Bad("unknown op", "POST", APPENDS, rec(op="insert")),
    Bad("op in capitals", "POST", APPENDS, rec(op="ADD")),
    Bad("op a number", "POST", APPENDS, rec(op=1)),
    Bad("document a number", "POST", APPENDS, rec(document=12)),
    Bad("document an object", "POST", APPENDS, rec(document={"a": "b"})),
    Bad("metadata a list", "POST", APPENDS, rec(metadata=["a"])),
    Bad("metadata nested object", "POST", APPENDS, rec(metadata={"a": {"b": 1}})),
    Bad("metadata list value", "POST", APPENDS, rec(metadata={"a": [1, 2]})),
    Bad(
        "metadata NaN",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "metadata": {"x": NaN}}]}',
    ),
    Bad(
        "metadata float overflow",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "metadata": {"x": 1e999}}]}',
    ),
    Bad("embedding a string", "POST", APPENDS, rec(embedding="0.1,0.2")),
    Bad("embedding of strings", "POST", APPENDS, rec(embedding=["0.1", "0.2"])),
    Bad("embedding of booleans", "POST", APPENDS, rec(embedding=[True, False])),
    Bad("embedding of nulls", "POST", APPENDS, rec(embedding=[None])),
    Bad("embedding nested", "POST", APPENDS, rec(embedding=[[0.1]])),
    Bad(
        "embedding NaN",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "embedding": [0.5, NaN]}]}',
    ),
    Bad(
        "embedding Infinity",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "embedding": [Infinity]}]}',
    ),
    Bad(
        "embedding -Infinity",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "embedding": [-Infinity]}]}',
    ),
    Bad(
        "embedding float overflow",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "embedding": [1e400]}]}',
    ),
    # An integer no float can hold: the contract says [float], and a compactor's float(x) raises
    # OverflowError on it (a poison record that would stall the log's compaction for good).
    Bad(
        "embedding integer too large for a float",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "embedding": [1' + b"0" * 400 + b"]}]}",
    ),
    # One record's size is bounded (LOGHOST_MAX_METADATA_KEYS / _EMBEDDING_DIMS, 1024 / 65536).
    Bad(
        "metadata over 1024 keys",
        "POST",
        APPENDS,
        rec(metadata={str(i): 0 for i in range(1025)}),
        code="record_too_large",
    ),
    Bad(
        "embedding over 65536 elements",
        "POST",
        APPENDS,
        rec(embedding=[0] * 65537),
        code="record_too_large",
    ),
    Bad(
        "a later record's metadata over 1024 keys",
        "POST",
        APPENDS,
        json.dumps(
            {
                "records": [
                    record("a"),
                    {"id": "b", "op": "add", "metadata": {str(i): i for i in range(5000)}},
                ]
            }
        ).encode(),
        code="record_too_large",
    ),
    Bad(
        "unknown top-level field",
        "POST",
        APPENDS,
        json.dumps({"records": [record("a")], "force": True}).encode(),
    ),
    Bad("unknown record field", "POST", APPENDS, rec(vector=[1.0])),
    Bad(
        "idempotency key empty",
        "POST",
        APPENDS,
        json.dumps({"records": [record("a")], "idempotency_key": ""}).encode(),
    ),
    Bad(
        "idempotency key 257 chars",
        "POST",
        APPENDS,
        json.dumps({"records": [record("a")], "idempotency_key": "k" * 257}).encode(),
    ),
    Bad(
        "idempotency key a number",
        "POST",
        APPENDS,
        json.dumps({"records": [record("a")], "idempotency_key": 7}).encode(),
    ),
    Bad("100k-deep nested JSON", "POST", APPENDS, nested(100_000)),
    Bad(
        "100k-deep nested metadata",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "metadata": {"k": ' + nested(100_000) + b"}}]}",
    ),
    Bad("deep objects", "POST", APPENDS, b'{"a":' * 50_000 + b"1" + b"}" * 50_000),
    Bad(
        "invalid UTF-8 in a string",
        "POST",
        APPENDS,
        b'{"records": [{"id": "\xff\xfe", "op": "add"}]}',
    ),
    Bad(
        "overlong UTF-8 encoding",
        "POST",
        APPENDS,
        b'{"records": [{"id": "\xc0\xaf", "op": "add"}]}',
    ),
    Bad("invalid UTF-8 outside strings", "POST", APPENDS, b"\xff" + GOOD),
    Bad("UTF-16 body", "POST", APPENDS, GOOD.decode().encode("utf-16")),
    Bad(
        "lone surrogate escape in id",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a\\ud800b", "op": "add"}]}',
    ),
    Bad(
        "lone surrogate escape in document",
        "POST",
        APPENDS,
        b'{"records": [{"id": "a", "op": "add", "document": "\\udfff"}]}',
    ),
    # --- paths and query parameters
    Bad("invalid UUID in path (read)", "GET", log_path("alice", "not-a-uuid") + "/records"),
    Bad(
        "invalid UUID in path (append)", "POST", log_path("alice", "not-a-uuid") + "/records", GOOD
    ),
    Bad("UUID with a suffix", "POST", log_path("alice", FRESH_ID + "0") + "/records", GOOD),
    Bad("UUID too short", "GET", log_path("alice", FRESH_ID[:-1])),
    Bad("non-UTF-8 percent escape in UUID", "GET", log_path("alice", "%FF%FE")),
    Bad(
        "tenant with a space",
        "POST",
        log_path("al%20ice", FRESH_ID) + "/records",
        GOOD,
        key="svc-key",
    ),
    Bad(
        "tenant 129 chars", "POST", log_path("t" * 129, FRESH_ID) + "/records", GOOD, key="svc-key"
    ),
    Bad("tenant '*'", "POST", log_path("*", FRESH_ID) + "/records", GOOD, key="svc-key"),
    Bad("from=-1", "GET", ALICE + "/records?from=-1"),
    Bad("from=0", "GET", ALICE + "/records?from=0"),
    Bad("from=2**64", "GET", ALICE + f"/records?from={2**64}"),
    Bad("from=2**63", "GET", ALICE + f"/records?from={2**63}"),
    Bad("from not a number", "GET", ALICE + "/records?from=one"),
    Bad("from a float", "GET", ALICE + "/records?from=1.5"),
    Bad("from empty", "GET", ALICE + "/records?from="),
    Bad("limit=0", "GET", ALICE + "/records?limit=0"),
    Bad("limit=-1", "GET", ALICE + "/records?limit=-1"),
    Bad("limit huge", "GET", ALICE + "/records?limit=" + "9" * 40),
    Bad("wait_ms negative", "GET", ALICE + "/records?from=4&wait_ms=-1"),
    Bad("wait_ms huge", "GET", ALICE + "/records?from=4&wait_ms=" + str(2**63)),
    Bad("fragments from=0", "GET", ALICE + "/fragments?from=0"),
    Bad("fragments limit=0", "GET", ALICE + "/fragments?limit=0"),
    Bad("dirty limit=0", "GET", "/v1/dirty?limit=0", key="svc-key"),
    Bad("dirty min_records=-1", "GET", "/v1/dirty?min_records=-1", key="svc-key"),
    Bad("inspect from=0", "GET", "/v1/dirty/inspect?from=0", key="svc-key"),
    # --- cursors
    Bad(
        "cursor name with a space",
        "PUT",
        ALICE + "/cursors/a%20b",
        b'{"offset": 1, "witness": null}',
    ),
    Bad(
        "cursor name with an encoded slash",
        "PUT",
        ALICE + "/cursors/a%2Fb",
        b'{"offset": 1, "witness": null}',
        status={400, 404},
        code={"invalid_request", "not_found"},
    ),
    Bad(
        "cursor name with a slash",
        "PUT",
        ALICE + "/cursors/a/b",
        b'{"offset": 1, "witness": null}',
        status={400, 404},
        code={"invalid_request", "not_found"},
    ),
    Bad(
        "cursor name 129 chars",
        "PUT",
        ALICE + "/cursors/" + "c" * 129,
        b'{"offset": 1, "witness": null}',
    ),
    Bad(
        "cursor name non-ASCII", "PUT", ALICE + "/cursors/%C3%A9", b'{"offset": 1, "witness": null}'
    ),
    Bad("cursor read with a bad name", "GET", ALICE + "/cursors/a%20b"),
    Bad("cursor delete with a bad name", "DELETE", ALICE + "/cursors/a%20b"),
    Bad(
        "cursor offset past the tail",
        "PUT",
        ALICE + "/cursors/c2",
        b'{"offset": 5, "witness": null}',
    ),
    Bad(
        "cursor offset 2**64",
        "PUT",
        ALICE + "/cursors/c2",
        json.dumps({"offset": 2**64, "witness": None}).encode(),
    ),
    Bad(
        "cursor moved past the tail",
        "PUT",
        ALICE + "/cursors/reader",
        b'{"offset": 99, "witness": "whatever"}',
    ),
    Bad("cursor offset 0", "PUT", ALICE + "/cursors/c2", b'{"offset": 0, "witness": null}'),
    Bad(
        "cursor offset a string", "PUT", ALICE + "/cursors/c2", b'{"offset": "2", "witness": null}'
    ),
    Bad("cursor offset a float", "PUT", ALICE + "/cursors/c2", b'{"offset": 2.0, "witness": null}'),
    Bad(
        "cursor offset a boolean",
        "PUT",
        ALICE + "/cursors/c2",
        b'{"offset": true, "witness": null}',
    ),
    Bad("cursor offset missing", "PUT", ALICE + "/cursors/c2", b'{"witness": null}'),
    Bad("cursor body empty", "PUT", ALICE + "/cursors/c2", b""),
    Bad(
        "cursor unknown field",
        "PUT",
        ALICE + "/cursors/c2",
        b'{"offset": 1, "witness": null, "force": true}',
    ),
    Bad(
        "cursor body over 64 KiB",
        "PUT",
        ALICE + "/cursors/c2",
        json.dumps({"offset": 1, "witness": "w" * (70 << 10)}).encode(),
        status=413,
        code="too_large",
    ),
    # --- compaction
    Bad("compaction offset 0", "POST", ALICE + "/compaction", b'{"offset": 0}'),
    Bad("compaction offset -1", "POST", ALICE + "/compaction", b'{"offset": -1}'),
    Bad("compaction past the tail", "POST", ALICE + "/compaction", b'{"offset": 5}'),
    Bad(
        "compaction offset 2**64",
        "POST",
        ALICE + "/compaction",
        json.dumps({"offset": 2**64}).encode(),
    ),
    Bad("compaction offset a string", "POST", ALICE + "/compaction", b'{"offset": "2"}'),
    Bad("compaction offset NaN", "POST", ALICE + "/compaction", b'{"offset": NaN}'),
    Bad("compaction body a list", "POST", ALICE + "/compaction", b"[2]"),
    # --- fork
    Bad("fork to an invalid UUID", "POST", ALICE + "/fork", b'{"target_collection_id": "nope"}'),
    Bad("fork to an empty id", "POST", ALICE + "/fork", b'{"target_collection_id": ""}'),
    Bad("fork target a number", "POST", ALICE + "/fork", b'{"target_collection_id": 5}'),
    Bad(
        "fork to itself",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": CID}).encode(),
    ),
    Bad(
        "fork to itself in capitals",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": CID.upper()}).encode(),
    ),
    Bad(
        "fork to itself without dashes",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": uuid.UUID(CID).hex}).encode(),
    ),
    Bad(
        "fork to itself as a URN",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": uuid.UUID(CID).urn}).encode(),
    ),
    Bad(
        "fork offset 0",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": FRESH_ID, "offset": 0}).encode(),
    ),
    Bad(
        "fork offset past the tail",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": FRESH_ID, "offset": 1000}).encode(),
    ),
    Bad(
        "fork offset 2**64",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": FRESH_ID, "offset": 2**64}).encode(),
    ),
    Bad(
        "fork unknown field",
        "POST",
        ALICE + "/fork",
        json.dumps({"target_collection_id": FRESH_ID, "tenant": "bob"}).encode(),
    ),
    # --- purge (service key)
    Bad(
        "purge an invalid UUID",
        "POST",
        "/v1/dirty/purge",
        b'{"collection_ids": ["nope"]}',
        key="svc-key",
    ),
    Bad(
        "purge a valid and an invalid UUID",
        "POST",
        "/v1/dirty/purge",
        json.dumps({"collection_ids": [CID, "nope"]}).encode(),
        key="svc-key",
    ),
    Bad(
        "purge ids not strings",
        "POST",
        "/v1/dirty/purge",
        b'{"collection_ids": [1, 2]}',
        key="svc-key",
    ),
    Bad("purge no ids", "POST", "/v1/dirty/purge", b'{"collection_ids": []}', key="svc-key"),
    Bad(
        "purge 10001 ids",
        "POST",
        "/v1/dirty/purge",
        json.dumps({"collection_ids": [str(uuid.UUID(int=i)) for i in range(10_001)]}).encode(),
        key="svc-key",
    ),
    Bad("purge body not JSON", "POST", "/v1/dirty/purge", b"nope", key="svc-key"),
    # --- authentication (a valid append: only the key is wrong, and nothing may be stored)
    Bad("no Authorization", "POST", APPENDS, GOOD, 401, UNAUTHORIZED, key=None),
    Bad(
        "Bearer with no key",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer")],
    ),
    Bad(
        "Basic xyz",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Basic xyz")],
    ),
    Bad(
        "Basic with a real key",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Basic alice-key")],
    ),
    Bad(
        "key without a scheme",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "alice-key")],
    ),
    Bad(
        "unknown key",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer carol-key")],
    ),
    Bad(
        "a real key with a suffix",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer alice-key2")],
    ),
    Bad(
        "a 10 KB key",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer " + "k" * 10_000)],
    ),
    Bad(
        "unicode in the header",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer alice-key-ключ-🔑".encode())],
    ),
    Bad(
        "latin-1 in the header",
        "POST",
        APPENDS,
        GOOD,
        401,
        UNAUTHORIZED,
        key=None,
        headers=[("Authorization", "Bearer alice-k\xe9y".encode("latin-1"))],
    ),
    Bad(
        "duplicated Authorization, two keys",
        "POST",
        APPENDS,
        GOOD,
        {400, 401},
        {"unauthorized", "invalid_request"},
        key=None,
        headers=[("Authorization", "Bearer alice-key"), ("Authorization", "Bearer bob-key")],
    ),
    Bad(
        "duplicated Authorization, bad then good",
        "POST",
        APPENDS,
        GOOD,
        {400, 401},
        {"unauthorized", "invalid_request"},
        key=None,
        headers=[("Authorization", "Bearer nope"), ("Authorization", "Bearer alice-key")],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_bad_request_is_refused_and_stores_nothing(env: Env, case: Bad) -> None:
    fresh = fresh_id(case.name)
    alice_before = await alice_now(env)
    before = store_snapshot(env.root)
    headers: list[tuple[str, str | bytes]] = []
    if case.caller_key is not None:
        headers.append(("Authorization", f"Bearer {case.caller_key}"))
    headers.extend(case.headers)
    if case.body is not None:
        headers.append(("Content-Type", "application/json"))
    r = await env.anon.request(
        case.method,
        case.path.replace("{fresh}", fresh),
        content=None if case.body is None else case.body.replace(b"{fresh}", fresh.encode()),
        headers=httpx.Headers(headers),
    )
    check_error_shape(r.status_code, r.content, case.statuses, case.codes)
    await assert_nothing_stored(env, before, fresh, alice_before)


# ---------------------------------------------------------------------- oversized bodies


async def test_5mb_body_with_content_length_is_413(env: Env) -> None:
    fresh = fresh_id("5mb")
    alice_before = await alice_now(env)
    before = store_snapshot(env.root)
    body = json.dumps({"records": [record("big", document="x" * (5 << 20))]}).encode()
    try:
        r = await env.anon.post(
            log_path("alice", fresh) + "/records",
            content=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer alice-key"},
        )
    except httpx.TransportError as e:  # answering 413 early is fine; cutting the line is not
        pytest.fail(f"the server cut the connection without an answer: {e!r}")
    check_error_shape(r.status_code, r.content, {413}, {"too_large"})
    await assert_nothing_stored(env, before, fresh, alice_before)


async def test_chunked_body_over_the_limit_is_413(env: Env) -> None:
    fresh = fresh_id("chunked")
    alice_before = await alice_now(env)
    before = store_snapshot(env.root)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: Transfer-Encoding: chunked
        yield b'{"records": [{"id": "big", "op": "add", "document": "'
        for _ in range(40):  # 2.5 MiB in all, over the 1 MiB limit
            yield b"y" * (64 << 10)
        yield b'"}]}'

    r = await env.anon.post(
        log_path("alice", fresh) + "/records",
        content=chunks(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer alice-key"},
    )
    assert "content-length" not in r.request.headers
    assert r.request.headers.get("transfer-encoding") == "chunked"
    check_error_shape(r.status_code, r.content, {413}, {"too_large"})
    await assert_nothing_stored(env, before, fresh, alice_before)


async def test_body_exactly_at_the_limit_is_accepted(tmp_path: Path) -> None:
    """The limit is a limit, not an off-by-one: a body of exactly max_request_bytes is served."""
    path = log_path("alice", CID) + "/records"
    async with live_server(
        store=LocalStore(tmp_path / "store", fsync=False), max_request_bytes=4096
    ) as lv:
        async with lv.client("alice-key") as c:
            skeleton = json.dumps({"records": [record("x", document="")]}).encode()
            doc = "d" * (4096 - len(skeleton))
            body = json.dumps({"records": [record("x", document=doc)]}).encode()
            assert len(body) == 4096
            r = await c.post(path, content=body)
            assert r.status_code == 200, r.text
            r = await c.post(path, content=body + b" ")  # one byte over (still valid JSON)
            check_error_shape(r.status_code, r.content, {413}, {"too_large"})


# ------------------------------------------------------------------ what httpx will not send


RAW_CASES: list[tuple[str, bytes, bytes, set[int], set[str] | None]] = [
    (
        "cursor name '..'",
        b"PUT " + ALICE.encode() + b"/cursors/.. HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\nContent-Length: 30",
        b'{"offset": 1, "witness": null}',
        {400, 404},
        {"invalid_request", "not_found"},
    ),
    (
        "cursor name '.'",
        b"PUT " + ALICE.encode() + b"/cursors/. HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer alice-key\r\nContent-Type: application/json\r\nContent-Length: 30",
        b'{"offset": 1, "witness": null}',
        {400, 404},
        {"invalid_request", "not_found"},
    ),
    (
        "dot segments in the path",
        b"GET "
        + ALICE.encode()
        + b"/../../logs/"
        + FRESH_ID.encode()
        + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-key",
        b"",
        {400, 404},
        {"invalid_request", "not_found"},
    ),
    (
        "percent-encoded dot segments",
        b"GET " + ALICE.encode() + b"/cursors/%2e%2e HTTP/1.1\r\n"
        b"Host: x\r\nAuthorization: Bearer alice-key",
        b"",
        {400, 404},
        {"invalid_request", "not_found"},
    ),
    (
        "duplicated Authorization (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer alice-key\r\nAuthorization: Bearer svc-key\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(GOOD)).encode(),
        GOOD,
        {400, 401},
        {"unauthorized", "invalid_request"},
    ),
    (
        "Authorization with UTF-8 bytes (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/1.1\r\n"
        b"Host: x\r\nAuthorization: Bearer \xd0\xba\xd0\xbb\xd1\x8e\xd1\x87\r\n"
        b"Content-Type: application/json\r\nContent-Length: " + str(len(GOOD)).encode(),
        GOOD,
        {401},
        UNAUTHORIZED,
    ),
    (
        "Bearer and spaces (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer    \r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(GOOD)).encode(),
        GOOD,
        {401},
        UNAUTHORIZED,
    ),
    (
        "Bearer, a tab, a key (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/1.1\r\nHost: x\r\n"
        b"Authorization: Bearer\tnope\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(GOOD)).encode(),
        GOOD,
        {401},
        UNAUTHORIZED,
    ),
    (
        "content-length over the limit, body not sent",
        b"POST " + APPENDS.encode() + b" HTTP/1.1"
        b"\r\nHost: x\r\nAuthorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(LIMIT + 1).encode(),
        b"",
        {413},
        {"too_large"},
    ),
    (
        "content-length 2**64",
        b"POST " + APPENDS.encode() + b" HTTP/1.1"
        b"\r\nHost: x\r\nAuthorization: Bearer alice-key\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(2**64).encode(),
        b"",
        # httptools (the default parser) refuses a length past 64 bits itself: 400 from the
        # protocol, in the API's error shape; h11 passes it on and the app answers 413.
        {400, 413},
        {"invalid_request", "too_large"},
    ),
    (
        "a malformed request line (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/9.Z\r\nHost: x",
        b"",
        {400},
        {"invalid_request"},
    ),
    (
        "a space before a header's colon (raw)",
        b"POST " + APPENDS.encode() + b" HTTP/1.1\r\nHost : x\r\nContent-Length: 2",
        b"{}",
        {400},
        {"invalid_request"},
    ),
]


@pytest.mark.parametrize(
    ("head", "body", "statuses", "codes"), [c[1:] for c in RAW_CASES], ids=[c[0] for c in RAW_CASES]
)
async def test_raw_bad_request_is_refused_and_stores_nothing(
    request: pytest.FixtureRequest,
    env: Env,
    head: bytes,
    body: bytes,
    statuses: set[int],
    codes: set[str] | None,
) -> None:
    fresh = fresh_id(request.node.name)
    alice_before = await alice_now(env)
    before = store_snapshot(env.root)
    r = await raw_request(env.live.url, head.replace(b"{fresh}", fresh.encode()), body)
    check_error_shape(r.status, r.body, statuses, codes)
    await assert_nothing_stored(env, before, fresh, alice_before)


async def test_bad_requests_left_the_server_healthy(env: Env) -> None:
    """After the whole table (this runs last in the module): the server still serves, and it
    never answered a 5xx."""
    r = await env.svc.get(ALICE + "/records")
    assert r.status_code == 200
    assert [x["record"]["id"] for x in r.json()["records"]][:3] == ["0", "1", "2"]
    text = (await env.svc.get("/metrics")).text
    bad = [
        line
        for line in text.splitlines()
        if line.startswith("loghost_requests_total") and 'status="5' in line
    ]
    assert not bad, bad
