"""Issue 21, leadership moving under open logs: real log hosts, one store, a real redis-server.

A Redis outage or restart must not leave a log split across two hosts serving stale data, a
refused open must not keep its claim, and a host shutting down must let its logs go at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from wal3 import LocalStore, StoreUnavailable
from wal3.store import GetResult

from ..conftest import free_port
from .live import (
    Live,
    assert_error,
    auth,
    live_server,
    log_path,
    metric,
    record,
    spawn_server,
    wait_until,
)
from .test_leader_server import holder

BOUND_S = 30.0  # generous bounds on the server acting; never a latency assert
TTL_MS = 1000


@contextlib.asynccontextmanager
async def host(
    store_url: str | None, name: str, redis_url: str, **settings: Any
) -> AsyncIterator[Live]:
    port = free_port()
    async with live_server(
        store_url,
        port=port,
        server_id=name,
        redis_url=redis_url,
        advertise_url=f"http://127.0.0.1:{port}",
        leader_ttl_ms=TTL_MS,
        **settings,
    ) as lv:
        yield lv


async def append(
    c: httpx.AsyncClient, cid: str, rid: str, *, follow: bool = True
) -> dict[str, Any]:
    """Append one record, retrying contention and following redirects, until acknowledged."""
    url = log_path("alice", cid) + "/records"
    body = {"records": [record(rid)], "idempotency_key": rid}
    for _ in range(400):
        r = await c.post(url, json=body)
        if r.status_code == 200:
            return dict(r.json())
        if r.status_code == 307 and follow:
            url = r.headers["location"]
            continue
        assert r.status_code in (409, 429, 503), r.text
        await asyncio.sleep(0.02)  # client back-off before a retry
    raise AssertionError("append never acknowledged")


async def read_ids(c: httpx.AsyncClient, cid: str) -> list[str] | None:
    """Every record id through one host (following a redirect); None if unreachable now."""
    url = log_path("alice", cid) + "/records"
    ids: list[str] = []
    nxt = 1
    for _ in range(100):
        r = await c.get(url, params={"from": nxt, "limit": 1000})
        if r.status_code == 307:
            url = r.headers["location"].split("?", 1)[0]
            continue
        if r.status_code != 200:
            return None
        body = r.json()
        if not body["records"]:
            return ids
        ids.extend(x["record"]["id"] for x in body["records"])
        nxt = body["next_offset"]
    return None


async def test_redis_outage_and_restart_never_serve_stale_logs(
    tmp_path: Path, redis_server: Any
) -> None:
    store = str(tmp_path / "store")
    cid = str(uuid.uuid4())
    acked: list[str] = []
    async with (
        host(store, "srv-a", redis_server.url) as a,
        host(store, "srv-b", redis_server.url) as b,
    ):
        async with a.client("alice-key") as ca, b.client("alice-key") as cb:
            await append(ca, cid, "r1")
            acked.append("r1")
            assert_error(await cb.get(log_path("alice", cid)), 307, "not_leader")

            # Redis goes away: both fail open.  B opens the log and writes; then A writes more.
            redis_server.stop()
            await append(cb, cid, "r2", follow=False)
            acked.append("r2")
            for rid in ("r3", "r4", "r5"):
                await append(ca, cid, rid, follow=False)
                acked.append(rid)
            # B must not answer from its writer's memory (next_offset 3): it reads the store.
            state = (await cb.get(log_path("alice", cid))).json()
            assert state["next_offset"] == 6, state
            assert await read_ids(cb, cid) == acked
            # A long-poll on B sees what A appends.
            poll = asyncio.create_task(
                cb.get(log_path("alice", cid) + "/records", params={"from": 6, "wait_ms": 15_000})
            )
            await wait_until(
                lambda: (
                    sum(h.users + getattr(h, "waiters", 0) for h in b.server.manager.handles()) >= 1
                    or poll.done()
                ),
                "B's long-poll parked",
                BOUND_S,
            )
            await append(ca, cid, "r6", follow=False)
            acked.append("r6")
            got = await poll
            assert got.status_code == 200, got.text
            assert [x["record"]["id"] for x in got.json()["records"]] == ["r6"]

            redis_server.start()
            # Every acknowledged record is visible through every host after Redis returns.
            for c in (ca, cb):

                async def complete(c: httpx.AsyncClient = c) -> bool:
                    ids = await read_ids(c, cid)
                    return ids is not None and set(acked) <= set(ids)

                await wait_until(complete, "every acknowledged record through each host", BOUND_S)


async def test_busy_log_split_by_a_redis_restart_ends_up_on_one_host(
    tmp_path: Path, redis_server: Any
) -> None:
    store = str(tmp_path / "store")
    cid = str(uuid.uuid4())
    acked: list[str] = []
    async with (
        host(store, "srv-a", redis_server.url) as a,
        host(store, "srv-b", redis_server.url) as b,
    ):
        async with a.client("alice-key") as ca, b.client("alice-key") as cb:
            await append(ca, cid, "r1")
            acked.append("r1")
            redis_server.stop()
            await append(cb, cid, "r2", follow=False)  # both hosts have the log open now
            acked.append("r2")
            await append(ca, cid, "r3", follow=False)
            acked.append("r3")

            # Redis comes back empty while both hosts are kept busy on the log (clients that
            # do not follow redirects): the host that lost the hint must start redirecting.
            redis_server.start()
            stop = asyncio.Event()
            statuses: dict[str, dict[int, int]] = {"a": {}, "b": {}}

            async def hammer(name: str, c: httpx.AsyncClient, lane: int) -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    rid = f"{name}{lane}-{n}"
                    r = await c.post(
                        log_path("alice", cid) + "/records",
                        json={"records": [record(rid)], "idempotency_key": rid},
                    )
                    counts = statuses[name]
                    counts[r.status_code] = counts.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        acked.append(rid)

            workers = [
                asyncio.create_task(hammer(n, c, lane))
                for n, c in (("a", ca), ("b", cb))
                for lane in range(6)
            ]
            try:
                await wait_until(
                    lambda: (
                        any(s.get(307) for s in statuses.values()) or any(t.done() for t in workers)
                    ),
                    "one host to redirect the busy log",
                    BOUND_S,
                )
            finally:
                stop.set()
                results = await asyncio.gather(*workers, return_exceptions=True)
            assert not [r for r in results if isinstance(r, BaseException)], results
            print(f"\nstatuses {statuses}")
            held = await holder(redis_server.url, cid)
            assert held is not None, "nobody holds the log after the restart"
            follower = b if held["server_id"] == "srv-a" else a
            async with follower.client("alice-key") as cf:
                r = await cf.post(
                    log_path("alice", cid) + "/records",
                    json={"records": [record("probe")], "idempotency_key": "p"},
                )
                assert_error(r, 307, "not_leader")

            # Every acknowledged record is visible through every host.
            for c in (ca, cb):

                async def complete(c: httpx.AsyncClient = c) -> bool:
                    ids = await read_ids(c, cid)
                    return ids is not None and set(acked) <= set(ids)

                await wait_until(complete, "every acknowledged record through each host", BOUND_S)


class _CursorLoadFails(LocalStore):
    """Fails reads of compaction cursors while ``broken`` (after the writer opened)."""

    broken = False

    async def get(self, key: str) -> GetResult:
        if self.broken and key.endswith("cursor/compaction.json"):
            raise StoreUnavailable("cursor store down")
        return await super().get(key)


async def test_refused_opens_release_their_claim(tmp_path: Path, redis_server: Any) -> None:
    store_dir = tmp_path / "store"
    busy, refused, failing = (str(uuid.uuid4()) for _ in range(3))
    faulty = _CursorLoadFails(store_dir)
    async with (
        host(None, "full", redis_server.url, store=faulty, max_open_logs=1) as full,
        host(str(store_dir), "roomy", redis_server.url) as roomy,
    ):
        async with full.client("alice-key") as cf, roomy.client("alice-key") as cr:
            # the only slot is busy with a request in flight
            r = await cf.post(log_path("alice", busy) + "/records", json={"records": [record("x")]})
            assert r.status_code == 200
            async with full.server.manager.use(uuid.UUID(busy), "alice"):
                r = await cf.post(
                    log_path("alice", refused) + "/records", json={"records": [record("y")]}
                )
                assert_error(r, 429, "backpressure")
                assert await holder(redis_server.url, refused) is None
                # the host with room serves it instead of redirecting to the full one
                r = await cr.post(
                    log_path("alice", refused) + "/records", json={"records": [record("y")]}
                )
                assert r.status_code == 200, r.text
        async with full.client("alice-key") as cf:
            # loading cursors fails after the writer opened: no claim, no writer left behind
            faulty.broken = True
            r = await cf.post(
                log_path("alice", failing) + "/records", json={"records": [record("z")]}
            )
            assert_error(r, 503)
            assert await holder(redis_server.url, failing) is None
            assert failing not in {str(h.collection_id) for h in full.server.manager.handles()}
            faulty.broken = False
            r = await cf.post(
                log_path("alice", failing) + "/records", json={"records": [record("z")]}
            )
            assert r.status_code == 200, r.text


def test_sigterm_lets_logs_go_at_once_and_answers_long_polls(
    tmp_path: Path, redis_server: Any
) -> None:
    store = str(tmp_path / "store")
    idle_log, polled_log = str(uuid.uuid4()), str(uuid.uuid4())
    env = {"LOGHOST_REDIS_URL": redis_server.url, "LOGHOST_SHUTDOWN_GRACE_S": "25"}
    pa, pb = free_port(), free_port()
    a = spawn_server(
        store,
        tmp_path,
        port=pa,
        server_id="a",
        extra_env={**env, "LOGHOST_ADVERTISE_URL": f"http://127.0.0.1:{pa}"},
    )
    b = spawn_server(
        store,
        tmp_path,
        port=pb,
        server_id="b",
        extra_env={**env, "LOGHOST_ADVERTISE_URL": f"http://127.0.0.1:{pb}"},
    )
    try:
        asyncio.run(_sigterm_scenario(a, b, idle_log, polled_log, redis_server.url))
    finally:
        for p in (a, b):
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait(timeout=30)


async def _sigterm_scenario(a: Any, b: Any, idle_log: str, polled_log: str, redis_url: str) -> None:
    async with httpx.AsyncClient(headers=auth("alice-key"), timeout=60) as c:
        for cid in (idle_log, polled_log):
            r = await c.post(
                a.url + log_path("alice", cid) + "/records", json={"records": [record("first")]}
            )
            assert r.status_code == 200, r.text
        assert (await holder(redis_url, idle_log) or {}).get("server_id") == "a"
        poll = asyncio.create_task(
            c.get(
                a.url + log_path("alice", polled_log) + "/records",
                params={"from": 2, "wait_ms": 30_000},
            )
        )
        # An upload that is still arriving keeps A draining (it is not the client's fault).
        _reader, writer = await asyncio.open_connection("127.0.0.1", a.port)
        writer.write(
            (
                f"POST {log_path('alice', str(uuid.uuid4()))}/records HTTP/1.1\r\n"
                f"Host: x\r\nAuthorization: Bearer alice-key\r\n"
                f"Content-Length: 100000\r\n\r\n"
            ).encode()
            + b'{"records": ['
        )
        await writer.drain()
        try:

            async def parked() -> bool:
                text = (await c.get(a.url + "/metrics")).text
                value = metric(text, "loghost_long_polls")
                return value is None or value == 1.0  # None: a server without the gauge

            await wait_until(parked, "the long-poll to park on A", BOUND_S)
            a.proc.send_signal(signal.SIGTERM)
            got = await poll
            assert got.status_code == 200, got.text
            assert got.json() == {"records": [], "next_offset": 2}

            # Through B, the idle log is served while A is still draining.
            async def served_by_b() -> bool:
                r = await c.post(
                    b.url + log_path("alice", idle_log) + "/records",
                    json={"records": [record("via-b")]},
                )
                return r.status_code == 200

            await wait_until(served_by_b, "B to serve A's idle log", BOUND_S)
            assert a.proc.poll() is None, "A already exited: this proves nothing"
        finally:
            writer.close()
        assert await asyncio.to_thread(a.proc.wait, 60) == 0
