"""Host membership (``host.membership``): liveness records in the store, routing by rendezvous
hashing over them without Redis, duplicate server ids refused, departed hosts adopted by one live
host with no operator (issue 17, items 0 and 2)."""

from __future__ import annotations

import asyncio
import os
import uuid
from pathlib import Path
from typing import Any

import pytest

from compactor_client.client import LogHostClient
from host.membership import DuplicateServerId, HostRecord, Membership, rendezvous_owner
from verify.testkit import free_port
from wal3 import LocalStore
from wal3.errors import ObjectNotFound
from wal3.paths import host_live_key

from .live import live_server, record, wait_until

BOUND_S = 30.0  # bound of every wait for a condition (never a synchronisation sleep)


async def _never(_s: float) -> None:
    raise AssertionError("join waited for a record that proves nothing")


def _member(store: LocalStore, sid: str, **kw: Any) -> Membership:
    return Membership(store, sid, f"http://{sid}.test", interval_s=1.0, ttl_s=5.0, **kw)


def _age_record(root: Path, server_id: str, seconds: float) -> None:
    """Make a host's record look ``seconds`` old in the store's clock (its mtime)."""
    path = root / host_live_key(server_id)
    st = path.stat()
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


# ------------------------------------------------------------------------------- the records


async def test_every_host_derives_the_same_owner_and_a_join_moves_only_what_it_wins(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    a, b = _member(store, "a"), _member(store, "b")
    await a.join()
    await b.join()
    await a.refresh()
    assert [r.server_id for r in a.live()] == [r.server_id for r in b.live()] == ["a", "b"]
    keys = [str(uuid.UUID(int=i)) for i in range(400)]

    def owner(m: Membership, k: str) -> str:
        got = m.owner(k)
        assert got is not None
        return got.server_id

    before = {k: owner(a, k) for k in keys}
    assert all(before[k] == owner(b, k) for k in keys)
    assert set(before.values()) == {"a", "b"}  # both get a share
    c = _member(store, "c")
    await c.join()
    await a.refresh()
    moved = [k for k in keys if owner(a, k) != before[k]]
    assert moved and all(owner(a, k) == "c" for k in moved)
    assert len(moved) < len(keys) // 2
    assert all(owner(a, k) == owner(c, k) for k in keys)


async def test_a_draining_or_silent_host_is_not_routed_to(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, b, c = _member(store, "a"), _member(store, "b"), _member(store, "c")
    for m in (a, b, c):
        await m.join()
    await b.refresh()
    keys = [str(uuid.UUID(int=i)) for i in range(64)]
    assert "b" in {getattr(b.owner(k), "server_id", None) for k in keys}  # answers kept...
    await b.drain()
    assert "b" not in {getattr(b.owner(k), "server_id", None) for k in keys}  # ...until it drains
    _age_record(tmp_path, "c", 60)
    await a.beat()
    assert [r.server_id for r in a.live()] == ["a"]
    assert [r.server_id for r in a.departed(30)] == ["c"]
    assert a.age(next(r for r in a.records() if r.server_id == "c")) >= 59


async def test_a_second_live_process_with_the_same_server_id_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    first = _member(store, "h")
    await first.join()

    async def first_beats_meanwhile(_s: float) -> None:
        await first.beat()

    twin = _member(store, "h", sleep=first_beats_meanwhile)
    with pytest.raises(DuplicateServerId, match=r"server id 'h' is in use.*LOGHOST_SERVER_ID"):
        await twin.join()
    # The first keeps its record.
    got = HostRecord.from_bytes((await store.get(host_live_key("h"))).data, 0)
    assert got is not None and got.incarnation == first.me.incarnation


async def test_a_restart_takes_over_its_crashed_predecessors_record(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    crashed = _member(store, "h")
    await crashed.join()  # then never beats again (kill -9)
    waits: list[float] = []

    async def nobody_beats(s: float) -> None:
        waits.append(s)

    again = _member(store, "h", sleep=nobody_beats)
    await again.join()
    assert waits == [1.5]  # watched one and a half beats: nobody rewrote the record
    got = HostRecord.from_bytes((await store.get(host_live_key("h"))).data, 0)
    assert got is not None and got.incarnation == again.me.incarnation


async def test_a_restart_after_a_clean_stop_does_not_wait(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    stopped = _member(store, "h")
    await stopped.join()
    await stopped.drain()
    await _member(store, "h", sleep=_never).join()
    # A crash long ago is still watched once: the record's age is not trusted before the
    # store's clock is known (a host clock ahead would take a live twin for a dead one).
    silent = _member(store, "s")
    await silent.join()
    _age_record(tmp_path, "s", 3600)
    waits: list[float] = []

    async def watch(s: float) -> None:
        waits.append(s)

    await _member(store, "s", sleep=watch).join()
    assert waits == [1.5]


async def test_a_beat_after_an_adopter_forgot_the_record_writes_it_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, b = _member(store, "a"), _member(store, "b")
    await a.join()
    await b.join()
    await a.refresh()
    seen = next(r for r in a.records() if r.server_id == "b")
    assert await a.forget("b", seen)
    await b.beat()
    assert b.duplicates == 0
    await a.refresh()
    assert [r.server_id for r in a.live()] == ["a", "b"]


async def test_forget_keeps_a_record_that_beat_since_it_was_seen(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a, b = _member(store, "a"), _member(store, "b")
    await a.join()
    await b.join()
    await a.refresh()
    seen = next(r for r in a.records() if r.server_id == "b")
    await b.beat()  # it beat after the adopter's refresh: back, not departed
    assert not await a.forget("b", seen)
    await store.head(host_live_key("b"))


async def test_a_twin_overwriting_the_record_at_runtime_is_counted(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a = _member(store, "h")
    await a.join()
    twin = HostRecord("h", "http://twin.test", "other", "serving", 0)
    await store.put(host_live_key("h"), twin.to_bytes())
    await a.beat()
    assert a.duplicates == 1
    got = HostRecord.from_bytes((await store.get(host_live_key("h"))).data, 0)
    assert got is not None and got.incarnation == a.me.incarnation


def test_rendezvous_owner_of_nothing_is_none() -> None:
    assert rendezvous_owner("k", []) is None


# ----------------------------------------------------------------------- routing, end to end


async def test_two_hosts_without_redis_redirect_instead_of_contending(tmp_path: Path) -> None:
    """The issue's reproduction: two hosts on one store, no Redis, appends alternating between
    them.  With NullLeaderHint every other append answered 409 contention, and the client
    raised; now each host serves the logs it owns and redirects the rest to the owner."""
    store = str(tmp_path / "store")
    pa, pb = free_port(), free_port()
    common: dict[str, Any] = {
        "routing": "membership",
        "membership_interval_s": 0.2,
        "membership_ttl_s": 30.0,
    }
    async with (
        live_server(
            store, port=pa, server_id="a", advertise_url=f"http://127.0.0.1:{pa}", **common
        ) as a,
        live_server(
            store, port=pb, server_id="b", advertise_url=f"http://127.0.0.1:{pb}", **common
        ) as b,
    ):
        await a.server.membership.refresh()  # b joined after a's last refresh
        cids = [str(uuid.UUID(int=i + 1)) for i in range(12)]
        owners = {c: a.server.membership.owner(c) for c in cids}
        assert {o.server_id for o in owners.values() if o} == {"a", "b"}
        clients = [LogHostClient(h.url, "alice-key", max_retries=0) for h in (a, b)]
        try:
            for i in range(48):
                cid = cids[i % len(cids)]
                got = await clients[i % 2].append("alice", cid, [record(i)])
                assert got.first_offset == i // len(cids) + 1
            for h in (a, b):  # each host opened exactly the logs it owns
                opened = {str(x.collection_id) for x in h.server.manager.handles()}
                mine = {c for c, o in owners.items() if o and o.server_id == h.settings.server_id}
                assert opened == mine
            for cid in cids:  # every record once, in order, read through either host
                page = await clients[1].read("alice", cid, from_offset=1)
                assert [int(r.record.id) for r in page.records] == [
                    i for i in range(48) if cids[i % len(cids)] == cid
                ]
        finally:
            for c in clients:
                await c.aclose()
        # Without following: the non-owner answers 307 naming the owner.
        async with b.client() as raw:
            cid = next(c for c, o in owners.items() if o and o.server_id == "a")
            r = await raw.post(
                f"/v1/tenants/alice/logs/{cid}/records", json={"records": [record("x")]}
            )
            assert r.status_code == 307
            assert r.headers["location"].startswith(f"http://127.0.0.1:{pa}/")


async def test_a_draining_host_hands_its_logs_to_the_others(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    pa, pb = free_port(), free_port()
    common: dict[str, Any] = {
        "routing": "membership",
        "membership_interval_s": 0.2,
        "membership_ttl_s": 30.0,
    }
    async with live_server(
        store, port=pa, server_id="a", advertise_url=f"http://127.0.0.1:{pa}", **common
    ) as a:
        async with live_server(
            store, port=pb, server_id="b", advertise_url=f"http://127.0.0.1:{pb}", **common
        ):
            await a.server.membership.refresh()
            cid = next(
                str(uuid.UUID(int=i))
                for i in range(1, 100)
                if a.server.membership.owner(str(uuid.UUID(int=i))).server_id == "b"  # type: ignore[union-attr]
            )
            async with a.client() as ca:
                r = await ca.post(
                    f"/v1/tenants/alice/logs/{cid}/records", json={"records": [record(1)]}
                )
                assert r.status_code == 307
        # b stopped cleanly (its record says draining): a serves b's logs at its next refresh.
        await wait_until(
            lambda: [r.server_id for r in a.server.membership.live()] == ["a"],
            "a sees b draining",
            BOUND_S,
        )
        async with a.client() as ca:
            r = await ca.post(
                f"/v1/tenants/alice/logs/{cid}/records", json={"records": [record(2)]}
            )
            assert r.status_code == 200, r.text
            assert r.json()["first_offset"] == 1  # b never wrote it (a redirect, not a write)


# ------------------------------------------------------------------------ automatic adoption


async def test_a_silent_hosts_dirty_log_is_adopted_once_with_no_operator(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    ids = [str(uuid.uuid4()) for _ in range(3)]
    fast: dict[str, Any] = {
        "routing": "membership",
        "membership_interval_s": 0.1,
        "membership_ttl_s": 0.5,
    }
    async with live_server(store, server_id="gone", **fast) as gone, gone.client() as c:
        for cid in ids:
            r = await c.post(f"/v1/tenants/alice/logs/{cid}/records", json={"records": [record(1)]})
            assert r.status_code == 200, r.text
    # "gone" stopped; two hosts share the store and adopt after 1 s of silence.
    adopt: dict[str, Any] = {**fast, "adopt_after_s": 1.0}
    async with (
        live_server(store, server_id="x", **adopt) as x,
        live_server(store, server_id="y", **adopt) as y,
    ):
        adopters = (x.server.auto_adoption, y.server.auto_adoption)
        await wait_until(
            lambda: sum(len(a.adopted) for a in adopters) == 1, "gone adopted", BOUND_S
        )
        (winner,) = [h for h, a in zip((x, y), adopters, strict=True) if a.adopted]
        assert next(a for a in adopters if a.adopted).adopted == ["gone"]
        async with winner.client() as c:
            listed = {e["collection_id"] for e in (await c.get("/v1/dirty")).json()["logs"]}
            assert listed == set(ids)
            metrics = (await c.get("/metrics")).text
            assert "loghost_adopted_dirty_logs_total 1.0" in metrics
        # Its record is forgotten, so nobody adopts it again.
        with pytest.raises(ObjectNotFound):
            await x.server.store.head(host_live_key("gone"))
        await x.server.membership.beat()
        await y.server.membership.beat()
        assert sum(len(a.adopted) for a in adopters) == 1
    # It comes back: it goes on with its own dirty log.
    async with live_server(store, server_id="gone", **fast) as back, back.client() as c:
        r = await c.post(f"/v1/tenants/alice/logs/{ids[0]}/records", json={"records": [record(2)]})
        assert r.status_code == 200, r.text
        rolled = (await c.post("/v1/dirty/rollup")).json()["logs"]
        assert [e["collection_id"] for e in rolled] == [ids[0]]


async def test_unknown_hosts_are_adopted_by_exactly_one_of_many(tmp_path: Path) -> None:
    """Rendezvous picks one adopter per departed host; each departed host is adopted once."""
    store = LocalStore(tmp_path)
    live = [_member(store, s) for s in ("l1", "l2", "l3")]
    for m in live:
        await m.join()
    for dead in ("d1", "d2", "d3", "d4"):
        await _member(store, dead).join()
        _age_record(tmp_path, dead, 600)
    picks: dict[str, list[str]] = {}
    for m in live:
        await m.refresh()
        for rec in m.departed(300):
            owner = rendezvous_owner(f"adopt\n{rec.server_id}", m.live())
            assert owner is not None
            picks.setdefault(rec.server_id, []).append(owner.server_id)
    assert sorted(picks) == ["d1", "d2", "d3", "d4"]
    assert all(len(set(v)) == 1 for v in picks.values())  # every host names the same adopter


async def test_membership_settings_are_checked() -> None:
    from host.config import Settings

    with pytest.raises(ValueError, match="membership_ttl_s must be longer"):
        Settings(membership_interval_s=5, membership_ttl_s=5)


async def test_a_failing_beat_is_counted_and_the_loop_goes_on(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    seen: list[BaseException] = []
    gate = asyncio.Event()
    beats = 0

    async def sleep(_s: float) -> None:
        nonlocal beats
        beats += 1
        if beats > 2:
            await gate.wait()  # park the loop after two beats

    m = Membership(
        store, "h", "http://h.test", interval_s=1.0, ttl_s=5.0, sleep=sleep, on_failure=seen.append
    )
    await m.join()
    (tmp_path / host_live_key("h")).unlink()  # the next conditional beat fails...
    (tmp_path / "hosts" / "live").rmdir()
    (tmp_path / "hosts" / "live").write_text("not a directory")  # ...and so does the rewrite
    m.start()
    await wait_until(lambda: len(seen) == 2, "two failed beats", BOUND_S)
    assert m.refresh_failures == 2 and beats == 3
    await m.close()
