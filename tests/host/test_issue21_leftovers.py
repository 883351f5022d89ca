"""Issue 21, the findings that stayed open after the first round: real uvicorn log hosts.

Each test names its finding (V2 … V8 of ``verify/repro/``, where each was a script first) and
failed on the code before its fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from verify.testkit import free_port
from wal3 import Limits, LogReader

from .live import Live, assert_error, live_server, log_path, record, wait_until


@pytest.fixture(autouse=True)
def _every_host_serves_every_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts here write one log on purpose (the store's fencing and the read lease, with no
    hint), so membership routing, which would redirect one to the other, is off."""
    monkeypatch.setenv("LOGHOST_ROUTING", "none")


BOUND_S = 20.0  # generous: how long a test waits for the server to act, never a latency assert
KEYS = "svc=*,ak=alice,ar=alice:read,bk=bob"


def _port(lv: Live) -> int:
    return int(lv.url.rsplit(":", 1)[1])


def _waiting(lv: Live) -> int:
    return sum(h.waiters for h in lv.server.manager.handles())


# ------------------------------------------------------------ V8: long-poll share of read keys


async def test_read_only_key_cannot_take_its_tenants_whole_long_poll_cap(tmp_path: Path) -> None:
    """V8: a read-only key (``key=alice:read``) holding every long-poll it may must not starve
    the tenant's own key: that key's long-poll waits (and is answered), it is not a 429."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid) + "/records"
    async with live_server(
        str(tmp_path / "store"), api_keys=KEYS, max_long_polls_per_tenant=2
    ) as lv:
        async with lv.client("ak") as ak, lv.client("ar") as ar:
            assert (await ak.post(path, json={"records": [record("1")]})).status_code == 200
            params = {"from": 2, "wait_ms": 15_000}
            readers = [asyncio.create_task(ar.get(path, params=params)) for _ in range(2)]
            await wait_until(lambda: _waiting(lv) >= 2, "the reader's long-polls parked", BOUND_S)
            # the read-only key is at its own cap ...
            err = assert_error(await ar.get(path, params=params), 429, "backpressure")
            assert err["reason"] == "long_poll"
            # ... and the tenant key still long-polls
            mine = asyncio.create_task(ak.get(path, params=params))
            await wait_until(
                lambda: _waiting(lv) >= 3 or mine.done(),
                "the tenant key's long-poll parked",
                BOUND_S,
            )
            r = await ak.post(path, json={"records": [record("2")]})
            assert r.status_code == 200, r.text
            for t in (mine, *readers):
                got = await t
                assert got.status_code == 200, got.text
                assert [x["record"]["id"] for x in got.json()["records"]] == ["2"]


# ------------------------------------------------- V5: the connection cap and authentication


async def _request(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    method: str,
    path: str,
    key: str | None = None,
    body: bytes = b"",
) -> int:
    """One HTTP/1.1 request on a kept-alive connection; the status (the body is read and
    dropped).  Raises ConnectionError / IncompleteReadError when the server closed it."""
    head = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
    if key is not None:
        head += f"Authorization: Bearer {key}\r\n"
    writer.write(head.encode() + b"\r\n" + body)
    await writer.drain()
    async with asyncio.timeout(BOUND_S):
        status_line = await reader.readuntil(b"\r\n")
        headers = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
    length = 0
    for line in headers.split("\r\n"):
        if line.startswith("content-length:"):
            length = int(line.split(":", 1)[1])
    async with asyncio.timeout(BOUND_S):
        await reader.readexactly(length)
    return int(status_line.split()[1])


@pytest.mark.parametrize("parser", ["httptools", "h11"])  # LOGHOST_HTTP_PARSER
async def test_unauthenticated_connections_cannot_shut_tenants_out(
    tmp_path: Path, parser: str
) -> None:
    """V5: the connection cap was taken before authentication: connections that never showed a
    key (here: one public /healthz each, then idle keep-alive) filled it, and every tenant's new
    connection was closed.  Unauthenticated connections now give way; authenticated ones stay."""
    cid = str(uuid.uuid4())
    append = log_path("alice", cid) + "/records"
    body = b'{"records":[{"id":"1","op":"add"}]}'
    async with live_server(
        str(tmp_path / "store"),
        api_keys=KEYS,
        max_connections=4,
        max_unauthenticated_connections=2,
        header_timeout_s=60.0,
        http_parser=parser,
    ) as lv:
        port = _port(lv)
        # The application's connection, authenticated by its first request.
        app = await asyncio.open_connection("127.0.0.1", port)
        assert await _request(*app, "POST", append, "ak", body) == 200
        hogs = []
        try:
            for _ in range(8):  # more than either cap, none with a key
                conn = await asyncio.open_connection("127.0.0.1", port)
                hogs.append(conn)
                # Refused or closed: the cap at work.
                with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                    await _request(*conn, "GET", "/healthz")
            # A new tenant connection is served although the cap was full ...
            fresh = await asyncio.open_connection("127.0.0.1", port)
            try:
                assert await _request(*fresh, "POST", append, "ak", body) == 200
            finally:
                fresh[1].close()
            # ... and the application's kept-alive connection was never closed for them.
            assert await _request(*app, "POST", append, "ak", body) == 200
        finally:
            app[1].close()
            for _, w in hogs:
                w.close()


# -------------------------------------------------------- V3: a reader that never reads


@pytest.mark.parametrize("parser", ["httptools", "h11"])  # LOGHOST_HTTP_PARSER
async def test_reader_that_never_reads_is_cut_off_and_pins_one_fragment_at_most(
    tmp_path: Path, recorded_apps: list[Any], parser: str
) -> None:
    """V3: an answer of up to 8 MiB was built whole and handed to a socket nobody reads, with no
    time limit: N such connections pinned N x 8 MiB for ever.  Large answers are now streamed a
    fragment at a time (the next is read only once the socket took the last), and an answer the
    client does not take within ``send_timeout_s`` closes the connection."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid) + "/records"
    fragment_bytes = 1 << 20
    async with live_server(
        str(tmp_path / "store"), api_keys=KEYS, send_timeout_s=2.0, http_parser=parser
    ) as lv:
        table = recorded_apps[-1].state.connections
        async with lv.client("ak") as ak:
            for i in range(7):  # seven appends, one fragment of ~1 MiB each
                docs = [os.urandom(2000).hex() for _ in range(fragment_bytes // 4000)]
                r = await ak.post(
                    path,
                    json={"records": [record(f"{i}-{j}", document=d) for j, d in enumerate(docs)]},
                )
                assert r.status_code == 200, r.text
        await wait_until(lambda: not table.connections, "the appending client gone", BOUND_S)
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", _port(lv)))
        try:
            await asyncio.get_running_loop().sock_sendall(
                sock,
                (
                    f"GET {path}?from=1&limit=10000 HTTP/1.1\r\nHost: x\r\n"
                    f"Authorization: Bearer ar\r\n\r\n"
                ).encode(),
            )
            # ... and never read.  The server stalls on the full socket holding at most about
            # one fragment's share of the answer, not the whole of it (7 MiB) ...
            conn = await _only_connection(table)
            await wait_until(
                lambda: conn.flow.write_paused or conn.transport.is_closing(),
                "the answer to fill the socket",
                BOUND_S,
            )
            assert conn.transport.get_write_buffer_size() < 3 * fragment_bytes
            # ... and closes the connection once the client failed to take it in time.
            await wait_until(
                lambda: not table.connections, "the server to cut the reader off", BOUND_S
            )
        finally:
            sock.close()
        async with lv.client("ak") as ak:  # and serves everyone else as before
            got = await ak.get(path, params={"from": 1, "limit": 10_000})
            assert got.status_code == 200
            assert len(got.json()["records"]) == 7 * (fragment_bytes // 4000)


async def _only_connection(table: Any) -> Any:
    await wait_until(lambda: len(table.connections) == 1, "one connection", BOUND_S)
    return next(iter(table.connections))


async def test_streamed_answers_hold_what_a_whole_answer_holds(tmp_path: Path) -> None:
    """V3, the other side: a streamed answer has exactly the records, order and next_offset of
    the engine's own read (``LogReader.read``) for every limit, across group boundaries."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid) + "/records"
    async with live_server(str(tmp_path / "store"), api_keys=KEYS) as lv:
        async with lv.client("ak") as ak:
            for i in range(4):  # four fragments of ~600 KB: answers span several groups
                docs = [os.urandom(1500).hex() for _ in range(200)]
                r = await ak.post(
                    path,
                    json={"records": [record(f"{i}-{j}", document=d) for j, d in enumerate(docs)]},
                )
                assert r.status_code == 200, r.text
            reader = LogReader(lv.server.store, f"logs/{cid}")
            for start, limit in ((1, 10_000), (1, 350), (150, 500), (799, 10_000)):
                got = await ak.get(path, params={"from": start, "limit": limit})
                assert got.status_code == 200, got.text
                if (start, limit) == (1, 10_000):
                    assert got.headers.get("transfer-encoding") == "chunked"  # it streamed
                want = await reader.read(
                    start, Limits(max_records=limit, max_bytes=lv.settings.max_request_bytes)
                )
                body = got.json()
                assert [(x["offset"], x["timestamp_us"], x["record"]) for x in body["records"]] == [
                    (w.offset, w.timestamp_us, json.loads(w.body)) for w in want
                ]
                assert body["next_offset"] == want[-1].offset + 1


# ------------------------------------------- V7: a reused idempotency key after collection


async def test_reused_key_with_other_records_is_refused_after_its_records_are_collected(
    tmp_path: Path,
) -> None:
    """V7: once the first append's records were compacted and collected, a retry could no
    longer be compared with them, and a reused key with other records answered 200
    ``deduplicated`` (the new records silently dropped).  The key now carries a hash of its
    request, in the writer's window and in the fragment footer, so the answer is 409
    ``idempotency_mismatch`` while the key is known, also after a restart; the same request still
    answers its first offsets."""
    store = str(tmp_path / "store")
    path = log_path("alice", uuid.uuid4())
    first = {"records": [record("x")], "idempotency_key": "K"}
    other = {"records": [record("y", "upsert", document="other")], "idempotency_key": "K"}
    async with live_server(store, api_keys=KEYS, gc_grace_s=0) as lv:
        async with lv.client("ak") as ak, lv.client("svc") as svc:
            r = await ak.post(path + "/records", json=first)
            assert r.status_code == 200, r.text
            acked = r.json()
            for i in range(5):
                assert (
                    await ak.post(path + "/records", json={"records": [record(f"f{i}")]})
                ).status_code == 200
            r = await svc.post(path + "/compaction", json={"offset": 4})
            assert r.status_code == 200, r.text

            async def collected() -> bool:
                assert (await svc.post(path + "/gc")).status_code == 200
                return bool((await ak.get(path)).json()["oldest_offset"] > 1)

            await wait_until(collected, "the first append's records to be collected", BOUND_S)
            assert_error(await ak.post(path + "/records", json=other), 409, "idempotency_mismatch")
            same = await ak.post(path + "/records", json=first)
            assert same.status_code == 200, same.text
            assert same.json() == {**acked, "deduplicated": True}
    async with live_server(store, api_keys=KEYS, gc_grace_s=0) as lv:  # a restart
        async with lv.client("ak") as ak:
            assert_error(await ak.post(path + "/records", json=other), 409, "idempotency_mismatch")
            same = await ak.post(path + "/records", json=first)
            assert same.json() == {**acked, "deduplicated": True}
            assert (await ak.get(path)).json()["next_offset"] == 7  # nothing appended twice


# ------------------------------------------- V2: stale reads after a sub-second Redis stall


async def _ids(c: httpx.AsyncClient, path: str) -> list[str]:
    r = await c.get(path + "/records", params={"from": 1, "limit": 100})
    assert r.status_code == 200, r.text
    return [x["record"]["id"] for x in r.json()["records"]]


async def test_no_stale_read_after_another_host_wrote_through_a_redis_stall(
    tmp_path: Path, redis_server: Any
) -> None:
    """V2: Redis stalled for under a second (SIGSTOP); host B, asked to append meanwhile, could
    not reach it, failed open and wrote the log.  Host A, the holder, never saw Redis fail, so
    its tenure held and it kept answering reads, state and long-polls from its in-memory
    manifest without B's acknowledged record, for as long as it did not write.  Memory is now
    trusted only under a read lease that the store fences (see ``LogWriter``), whatever Redis
    does: every read after B's acknowledgement sees B's record."""
    store = str(tmp_path / "store")
    cid = str(uuid.uuid4())
    path = log_path("alice", cid)
    pa, pb = free_port(), free_port()
    # A long TTL: A's next renewal (and so any Redis failure A could see) is far away.
    common = {"redis_url": redis_server.url, "leader_ttl_ms": 120_000, "api_keys": KEYS}
    async with (
        live_server(
            store, port=pa, server_id="a", advertise_url=f"http://127.0.0.1:{pa}", **common
        ) as a,
        live_server(
            store, port=pb, server_id="b", advertise_url=f"http://127.0.0.1:{pb}", **common
        ) as b,
    ):
        async with a.client("ak") as ca, b.client("ak") as cb:
            r = await ca.post(path + "/records", json={"records": [record("r1")]})
            assert r.status_code == 200, r.text
            assert await _ids(ca, path) == ["r1"]
            poll = asyncio.create_task(
                ca.get(path + "/records", params={"from": 2, "wait_ms": 20_000})
            )
            await wait_until(lambda: _waiting(a) >= 1, "A's long-poll parked", BOUND_S)
            redis_server.pause()
            try:
                r = await cb.post(
                    path + "/records", json={"records": [record("r2")]}, follow_redirects=False
                )
            finally:
                redis_server.resume()
            assert r.status_code == 200, r.text  # B failed open and wrote: acknowledged
            assert b.server.leader.failures >= 1 and a.server.leader.failures == 0
            # Everything A answers from now on knows r2.
            assert await _ids(ca, path) == ["r1", "r2"]
            assert (await ca.get(path)).json()["next_offset"] == 3
            got = await poll
            assert got.status_code == 200, got.text
            assert [x["record"]["id"] for x in got.json()["records"]] == ["r2"]


async def test_no_stale_read_after_redis_restarts_empty_and_another_host_takes_over(
    tmp_path: Path, redis_server: Any
) -> None:
    """V2, the other way Redis can mislead: it restarts empty, host B claims the log with a
    *confirmed* hold and writes it, while host A (whose next renewal is far away) still believes
    its own tenure.  A's reads must see B's acknowledged record all the same."""
    store = str(tmp_path / "store")
    path = log_path("alice", uuid.uuid4())
    pa, pb = free_port(), free_port()
    common = {"redis_url": redis_server.url, "leader_ttl_ms": 120_000, "api_keys": KEYS}
    async with (
        live_server(
            store, port=pa, server_id="a", advertise_url=f"http://127.0.0.1:{pa}", **common
        ) as a,
        live_server(
            store, port=pb, server_id="b", advertise_url=f"http://127.0.0.1:{pb}", **common
        ) as b,
    ):
        async with a.client("ak") as ca, b.client("ak") as cb:
            assert (
                await ca.post(path + "/records", json={"records": [record("r1")]})
            ).status_code == 200
            assert await _ids(ca, path) == ["r1"]
            redis_server.stop()
            redis_server.start()  # empty: nobody holds the log now
            r = await cb.post(
                path + "/records", json={"records": [record("r2")]}, follow_redirects=False
            )
            assert r.status_code == 200, r.text
            assert b.server.leader.failures == 0  # B's claim was confirmed, not failed open
            assert await _ids(ca, path) == ["r1", "r2"]
            assert (await ca.get(path)).json()["next_offset"] == 3


async def test_a_take_over_waits_out_its_fence_without_pinning_an_open_log_slot(
    tmp_path: Path,
) -> None:
    """V2's fence must not become a way to pin open-log slots: the append that took the log
    over (claimed it: a write that links nothing) waits for its fence after leaving the log (its
    handle has no user meanwhile), and only then links its record."""
    store = str(tmp_path / "store")
    cid = str(uuid.uuid4())
    path = log_path("alice", cid)
    # A long lease: the fence (1.25 x) outlasts the checks below by far; the test never waits it.
    async with (
        live_server(store, api_keys=KEYS, read_lease_ms=20_000, read_lease_max_ms=20_000) as a,
        live_server(
            store, api_keys=KEYS, read_lease_ms=20_000, read_lease_max_ms=20_000, shutdown_grace_s=0
        ) as b,
    ):
        async with a.client("ak") as ca:
            assert (
                await ca.post(path + "/records", json={"records": [record("r1")]})
            ).status_code == 200
        async with b.client("ak") as cb:
            append = asyncio.create_task(
                cb.post(path + "/records", json={"records": [record("r2")]})
            )

            def fenced_and_free() -> bool:
                hs = [h for h in b.server.manager.handles() if str(h.collection_id) == cid]
                return (
                    bool(hs)
                    and hs[0].writer.authored  # its claim landed ...
                    and hs[0].writer.manifest.next_offset == 2  # ... linking nothing yet
                    and hs[0].users == 0
                    and not append.done()
                )

            await wait_until(fenced_and_free, "B's claim written, append held, log free", BOUND_S)
            append.cancel()
