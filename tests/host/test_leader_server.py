"""The advisory leader hint end to end: two real log hosts, one store, a real redis-server."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from host.leader import decode_holder

from ..conftest import free_port
from .live import (
    Live,
    assert_error,
    live_server,
    log_path,
    metric,
    metrics_text,
    read_all,
    record,
    wait_until,
)

PREFIX = "loghost:leader:"


@contextlib.asynccontextmanager
async def leader_server(
    store: str, name: str, redis_url: str, **settings: Any
) -> AsyncIterator[Live]:
    port = free_port()
    async with live_server(
        store,
        port=port,
        server_id=name,
        redis_url=redis_url,
        advertise_url=f"http://127.0.0.1:{port}",
        **settings,
    ) as lv:
        assert lv.url == f"http://127.0.0.1:{port}"
        yield lv


async def holder(redis_url: str, cid: str) -> dict[str, str] | None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        value = await client.get(PREFIX + cid)
    finally:
        await client.aclose()
    return None if value is None else decode_holder(value)


async def test_second_server_redirects_to_the_first(tmp_path: Path, redis_server: Any) -> None:
    store = str(tmp_path / "store")
    log_a, log_b = str(uuid.uuid4()), str(uuid.uuid4())
    async with contextlib.AsyncExitStack() as outer:
        b = await outer.enter_async_context(
            leader_server(store, "srv-b", redis_server.url, leader_ttl_ms=500)
        )
        async with leader_server(store, "srv-a", redis_server.url, leader_ttl_ms=500) as a:
            async with a.client("alice-key") as ca, b.client("alice-key") as cb:
                r = await ca.post(
                    log_path("alice", log_a) + "/records", json={"records": [record("a1")]}
                )
                assert r.status_code == 200, r.text
                held = await holder(redis_server.url, log_a)
                assert held is not None and held["server_id"] == "srv-a" and held["url"] == a.url
                # renewed while open: watch the key's expiry being pushed back three times (no
                # wall-clock assertion; the deadline only bounds the wait for the renewals)
                rc = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
                try:
                    renewals, last_ttl = 0, None
                    deadline = time.monotonic() + 60
                    while renewals < 3:
                        assert time.monotonic() < deadline, f"only {renewals} renewals seen"
                        value, ttl = await rc.get(PREFIX + log_a), await rc.pttl(PREFIX + log_a)
                        if value is not None:
                            assert decode_holder(value)["server_id"] == "srv-a"
                        if last_ttl is not None and 0 <= last_ttl < ttl:  # PEXPIRE of a live key
                            renewals += 1
                        last_ttl = ttl
                        await asyncio.sleep(0.02)  # polling interval of a bounded wait
                finally:
                    await rc.aclose()

                path = log_path("alice", log_a) + "/records"
                r = await cb.post(path, json={"records": [record("via-b")]})
                assert_error(r, 307, "not_leader")
                assert r.headers["location"] == a.url + path
                r = await cb.get(path, params={"from": 1, "limit": 5})
                assert_error(r, 307, "not_leader")
                assert r.headers["location"] == a.url + path + "?from=1&limit=5"
                r = await cb.get(log_path("alice", log_a))
                assert_error(r, 307, "not_leader")
                assert r.headers["location"] == a.url + log_path("alice", log_a)

                # following the redirect (with the key) lands the append on the leader
                r = await cb.post(path, json={"records": [record("via-b")]})
                r = await cb.post(r.headers["location"], json={"records": [record("via-b")]})
                assert r.status_code == 200 and r.json()["first_offset"] == 2, r.text

                # the other way round for a log B opened first
                r = await cb.post(
                    log_path("alice", log_b) + "/records", json={"records": [record("b1")]}
                )
                assert r.status_code == 200, r.text
                r = await ca.get(log_path("alice", log_b) + "/records", params={"from": 1})
                assert_error(r, 307, "not_leader")
                assert r.headers["location"] == b.url + log_path("alice", log_b) + "/records?from=1"
                assert (
                    metric(await metrics_text(cb), "loghost_not_leader_redirects_total") or 0
                ) >= 3
        # srv-a shut down gracefully: its hint is released and srv-b serves the log now
        assert await holder(redis_server.url, log_a) is None
        async with b.client("alice-key") as cb:
            r = await cb.post(
                log_path("alice", log_a) + "/records", json={"records": [record("after")]}
            )
            assert r.status_code == 200, r.text
            assert r.json()["first_offset"] == 3
            ids = [x["record"]["id"] for x in await read_all(cb, log_path("alice", log_a))]
            assert ids == ["a1", "via-b", "after"]
            held = await holder(redis_server.url, log_a)
            assert held is not None and held["server_id"] == "srv-b"


@dataclass
class Acks:
    """Acknowledged appends: (collection id, first offset) -> record ids."""

    by_offset: dict[tuple[str, int], list[str]] = field(default_factory=dict)
    after_stop: dict[str, int] = field(default_factory=dict)  # server name -> acks after stop
    statuses: dict[int, int] = field(default_factory=dict)


async def writer(
    srv: Live,
    name: str,
    cids: list[str],
    acks: Acks,
    stop: asyncio.Event,
    redis_down: asyncio.Event,
) -> None:
    """Append through one server, following 307s and retrying 409/429/503 with the same key."""
    async with srv.client("alice-key") as c:
        n = 0
        while not stop.is_set():
            cid = cids[n % len(cids)]
            key = f"{name}-{n}"
            ids = [f"{key}-{j}" for j in range(1 + n % 2)]
            body = {"records": [record(i) for i in ids], "idempotency_key": key}
            n += 1
            url = log_path("alice", cid) + "/records"
            for _attempt in range(200):
                r = await c.post(url, json=body)
                acks.statuses[r.status_code] = acks.statuses.get(r.status_code, 0) + 1
                if r.status_code == 307:
                    url = r.headers["location"]
                    continue
                if r.status_code in (409, 429, 503):
                    if r.status_code == 409:
                        assert r.json()["error"]["code"] == "contention", r.text
                    await asyncio.sleep(0.01)  # client back-off before the retry
                    continue
                break
            assert r.status_code == 200, r.text
            ans = r.json()
            acks.by_offset[(cid, ans["first_offset"])] = ids
            if redis_down.is_set():
                acks.after_stop[name] = acks.after_stop.get(name, 0) + 1


async def test_redis_stopped_mid_test_both_keep_serving_and_nothing_is_lost(
    tmp_path: Path, redis_server: Any
) -> None:
    store = str(tmp_path / "store")
    shared, only_a, only_b = (str(uuid.uuid4()) for _ in range(3))
    acks = Acks()
    stop, redis_down = asyncio.Event(), asyncio.Event()
    async with (
        leader_server(store, "srv-a", redis_server.url, leader_ttl_ms=1000) as a,
        leader_server(store, "srv-b", redis_server.url, leader_ttl_ms=1000) as b,
    ):
        async with a.client("alice-key") as ca, b.client("alice-key") as cb:
            for c, cid in ((ca, shared), (ca, only_a), (cb, only_b)):
                r = await c.post(
                    log_path("alice", cid) + "/records", json={"records": [record(f"seed-{cid}")]}
                )
                assert r.status_code == 200, r.text
                acks.by_offset[(cid, 1)] = [f"seed-{cid}"]
            r = await cb.post(
                log_path("alice", shared) + "/records", json={"records": [record("x")]}
            )
            assert_error(r, 307, "not_leader")  # the hint works before the outage

            writers = [
                asyncio.create_task(writer(a, "wa1", [shared, only_a], acks, stop, redis_down)),
                asyncio.create_task(writer(a, "wa2", [shared, only_b], acks, stop, redis_down)),
                asyncio.create_task(writer(b, "wb1", [shared, only_b], acks, stop, redis_down)),
                asyncio.create_task(writer(b, "wb2", [shared, only_a], acks, stop, redis_down)),
            ]
            try:
                await wait_until(
                    lambda: len(acks.by_offset) >= 40 or any(t.done() for t in writers),
                    "acks before the outage",
                )
                redis_server.stop()
                redis_down.set()
                await wait_until(
                    lambda: (
                        all(acks.after_stop.get(w, 0) >= 15 for w in ("wa1", "wa2", "wb1", "wb2"))
                        or any(t.done() for t in writers)
                    ),
                    "acks on both servers during the outage",
                    60.0,
                )
            finally:
                stop.set()
                await asyncio.gather(*writers)
            print(f"\nstatuses {acks.statuses}; after the stop {acks.after_stop}")
            assert all(acks.after_stop.get(w, 0) >= 15 for w in ("wa1", "wa2", "wb1", "wb2"))

            # both keep serving: a brand-new log on each, directly
            for c in (ca, cb):
                fresh = str(uuid.uuid4())
                r = await c.post(
                    log_path("alice", fresh) + "/records", json={"records": [record("fresh")]}
                )
                assert r.status_code == 200, r.text

            assert (metric(await metrics_text(cb), "loghost_leader_hint_failures_total") or 0) > 0
            if acks.statuses.get(409):  # contention between the two writers is counted
                contention = [
                    metric(await metrics_text(c), "loghost_contention_total") or 0 for c in (ca, cb)
                ]
                assert sum(contention) > 0, contention

            async def a_failed() -> bool:
                return (
                    metric(await metrics_text(ca), "loghost_leader_hint_failures_total") or 0
                ) > 0

            await wait_until(a_failed, "srv-a to count a leader-hint failure", 30.0, 0.1)

    # Read everything back through a fresh server (no Redis): nothing acknowledged is lost.
    async with live_server(store) as c_srv, c_srv.client("alice-key") as c:
        logs = {cid: await read_all(c, log_path("alice", cid)) for cid in (shared, only_a, only_b)}
    for recs in logs.values():
        assert [r["offset"] for r in recs] == list(range(1, len(recs) + 1))
    lost = []
    for (cid, first), ids in acks.by_offset.items():
        got = [r["record"]["id"] for r in logs[cid][first - 1 : first - 1 + len(ids)]]
        if got != ids:
            lost.append((cid, first, ids, got))
    assert not lost, f"{len(lost)} acknowledged appends not found where acknowledged: {lost[:5]}"
    all_ids = [r["record"]["id"] for recs in logs.values() for r in recs]
    dupes = len(all_ids) - len(set(all_ids))
    print(f"{len(acks.by_offset)} acknowledged appends all present; {dupes} duplicated records")
