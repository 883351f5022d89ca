"""Adversarial checks of append routing after a contention (issue 17: 3b22e59, 4e7d0d1).

``RecordService._append_routed`` retries an append that lost the manifest's condition (at most
twice) when this host still writes the log, or redirects it (307) to the host that does:
``LeaderHint.recheck`` decides (membership: ``Membership.refresh_now``; Redis: a new claim,
falling back to the membership owner while Redis does not answer).

Views only change when a test refreshes them (beats are an hour apart in ``live_server``), and
interleavings are forced by events (store gates, a cut proxy), never by sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx

from host.leader import RedisLeaderHint
from host.membership import Membership, rendezvous_owner
from wal3 import LocalStore
from wal3.errors import StoreUnavailable
from wal3.faulty import FaultRule, FaultyStore

from ..conftest import free_port
from .live import Live, auth, live_server, record

ROUTING: dict[str, Any] = {"routing": "membership"}


def _owned_by(sid: str, among: list[Any]) -> str:
    """A log id whose rendezvous owner among ``among`` (host records) is ``sid``."""
    return next(
        c
        for c in (str(uuid.UUID(int=i)) for i in range(1, 1000))
        if (o := rendezvous_owner(c, among)) is not None and o.server_id == sid
    )


def _url(cid: str) -> str:
    return f"/v1/tenants/alice/logs/{cid}/records"


async def _read_ids(lv: Live, cid: str) -> list[str]:
    async with lv.client() as c:
        r = await c.get(_url(cid), params={"from": 1, "limit": 1000})
        assert r.status_code == 200, r.text
        return [x["record"]["id"] for x in r.json()["records"]]


# ------------------------------------------------------------------------------ idempotency


async def test_a_key_written_by_the_stale_host_is_not_written_again_by_the_owner(
    tmp_path: Path,
) -> None:
    """A client's keyed append reached the stale host a (which wrote it), and its retry of the
    same request reached the owner b, whose writer then loses the manifest's condition: the
    answer is a's record (deduplicated, at a's offset), never a second copy."""
    store = str(tmp_path / "store")
    async with (
        live_server(store, server_id="a", **ROUTING) as a,
        live_server(store, server_id="b", **ROUTING) as b,
    ):
        cid = _owned_by("b", b.server.membership.live())
        async with a.client() as ca, b.client() as cb:
            r = await cb.post(_url(cid), json={"records": [record(1)]})
            assert r.status_code == 200, r.text
            body = {"records": [record(2)], "idempotency_key": "k2"}
            r = await ca.post(_url(cid), json=body)  # a's stale view: a writes it
            assert r.status_code == 200 and r.json()["first_offset"] == 2, r.text
            r = await cb.post(_url(cid), json=body)  # the same request, at the owner
            assert r.status_code == 200, r.text
            assert r.json()["first_offset"] == 2 and r.json().get("deduplicated") is True
            r = await cb.post(_url(cid), json={"records": [record(3)]})
            assert r.status_code == 200 and r.json()["first_offset"] == 3, r.text
        assert await _read_ids(b, cid) == ["1", "2", "3"]


async def test_a_redirected_keyed_append_is_written_once(tmp_path: Path) -> None:
    """a (stale) meets b's append, refreshes and answers 307; the client sends the same keyed
    request to b: written once, at the next offset (the 307 wrote nothing), and a retry of it at
    either host is deduplicated."""
    store = str(tmp_path / "store")
    async with live_server(store, server_id="a", **ROUTING) as a:
        async with live_server(store, server_id="b", **ROUTING) as b:
            assert [r.server_id for r in a.server.membership.live()] == ["a"]
            cid = _owned_by("b", b.server.membership.live())
            async with a.client() as ca, b.client() as cb:
                assert (await ca.post(_url(cid), json={"records": [record(1)]})).status_code == 200
                assert (await cb.post(_url(cid), json={"records": [record(2)]})).status_code == 200
                body = {"records": [record(3)], "idempotency_key": "k3"}
                r = await ca.post(_url(cid), json=body)
                assert r.status_code == 307, r.text
                assert r.headers["location"].startswith(b.url + "/")
                r = await cb.post(_url(cid), json=body)
                assert r.status_code == 200 and r.json()["first_offset"] == 3, r.text
                r = await cb.post(_url(cid), json=body)
                assert r.status_code == 200 and r.json().get("deduplicated") is True
                # a refreshed: it redirects now, it does not answer from its own window
                r = await ca.post(_url(cid), json=body)
                assert r.status_code == 307, r.text
            assert await _read_ids(b, cid) == ["1", "2", "3"]


async def test_concurrent_keyed_appends_retried_after_contention_write_once(
    tmp_path: Path,
) -> None:
    """Two copies of one keyed request at the owner b (a client that re-sent on a timeout)
    while a stale host wrote the log: both lose the condition (one through the key's waiter),
    both are retried, and the key is written once."""
    store = str(tmp_path / "store")
    async with (
        live_server(store, server_id="a", **ROUTING) as a,
        live_server(store, server_id="b", **ROUTING) as b,
    ):
        cid = _owned_by("b", b.server.membership.live())
        async with a.client() as ca, b.client() as cb:
            assert (await cb.post(_url(cid), json={"records": [record(1)]})).status_code == 200
            assert (await ca.post(_url(cid), json={"records": [record(2)]})).status_code == 200
            body = {"records": [record(3)], "idempotency_key": "k3"}
            r1, r2 = await asyncio.gather(
                cb.post(_url(cid), json=body), cb.post(_url(cid), json=body)
            )
            assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
            assert r1.json()["first_offset"] == r2.json()["first_offset"] == 3
        assert await _read_ids(b, cid) == ["1", "2", "3"]


# --------------------------------------------------------------------------- refresh_now


async def test_a_failed_shared_refresh_fails_every_sharer_and_is_not_kept(
    tmp_path: Path,
) -> None:
    """``refresh_now`` shared by concurrent callers: a failing refresh fails each of them (none
    waits forever), and the next call refreshes anew instead of answering the old failure."""
    store = FaultyStore(LocalStore(tmp_path / "s"))
    m = Membership(store, "a", "http://a", interval_s=3600.0, ttl_s=7200.0)
    await m.join()
    rule = store.add_rule(FaultRule("error", ops={"list"}, times=1))
    got = await asyncio.gather(m.refresh_now(), m.refresh_now(), return_exceptions=True)
    assert rule.fired == 1  # one refresh for both
    assert all(isinstance(g, StoreUnavailable) for g in got), got
    await m.refresh_now()  # not the kept failure
    assert [r.server_id for r in m.live()] == ["a"]


# ------------------------------------------------------------------- Redis, partial outage


class _CutProxy:
    """A TCP proxy to Redis that the test can cut: its connections are closed and new ones
    refused, as when one host loses its route to Redis while the others keep theirs."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _pipe(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            while data := await r.read(65536):
                w.write(data)
                await w.drain()
        with contextlib.suppress(Exception):
            w.close()

    async def _serve(self, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        ur, uw = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        self._writers.update((w, uw))
        both = [asyncio.create_task(self._pipe(r, uw)), asyncio.create_task(self._pipe(ur, w))]
        self._tasks.update(both)
        await asyncio.gather(*both, return_exceptions=True)

    async def cut(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.close()

    async def stop(self) -> None:
        await self.cut()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def _cut_proxy(upstream_port: int) -> AsyncIterator[_CutProxy]:
    p = _CutProxy(upstream_port)
    await p.start()
    try:
        yield p
    finally:
        await p.stop()


async def _follow(base: str, path: str, body: dict[str, Any], hops: int) -> list[tuple[str, int]]:
    """POST, following 307s by hand (at most ``hops``); the (host, status) of each answer."""
    seen: list[tuple[str, int]] = []
    url = base + path
    async with httpx.AsyncClient(headers=auth(), timeout=30.0) as c:
        for _ in range(hops):
            r = await c.post(url, json=body)
            seen.append((url.split("/v1/")[0], r.status_code))
            if r.status_code != 307:
                break
            url = r.headers["location"]
    return seen


async def test_a_host_cut_from_redis_does_not_ping_pong_with_the_owner(
    tmp_path: Path, redis_server: Any
) -> None:
    store = str(tmp_path / "store")
    async with _cut_proxy(redis_server.port) as proxy:
        pa, pb = free_port(), free_port()
        common: dict[str, Any] = {**ROUTING, "leader_ttl_ms": 60_000}
        async with (
            live_server(
                store,
                port=pa,
                server_id="a",
                advertise_url=f"http://127.0.0.1:{pa}",
                redis_url=f"redis://127.0.0.1:{proxy.port}/0",
                **common,
            ) as a,
            live_server(
                store,
                port=pb,
                server_id="b",
                advertise_url=f"http://127.0.0.1:{pb}",
                redis_url=redis_server.url,
                **common,
            ) as b,
        ):
            await a.server.membership.refresh()  # both views: {a, b}
            cid = _owned_by("b", b.server.membership.live())
            assert _owned_by("b", a.server.membership.live()) == cid
            # Redis up for both: a claims the log first and writes it (Redis routing).
            seen = await _follow(a.url, _url(cid), {"records": [record(1)]}, hops=1)
            assert seen == [(a.url, 200)], seen
            # a loses Redis (b does not): a's next Redis call fails and opens its breaker.
            await proxy.cut()
            hint = a.server.leader
            assert isinstance(hint, RedisLeaderHint)
            await hint.renew()
            seen = await _follow(a.url, _url(cid), {"records": [record(2)]}, hops=6)
            assert seen[-1][1] == 200, seen  # fails: a -> b -> a -> b ... all 307
