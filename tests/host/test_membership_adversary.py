"""Adversarial tests of host membership (``host.membership``), routing without Redis
(``RendezvousLeaderHint``) and automatic adoption (``AutoAdoption``): store faults (lost answers,
transient errors), interleavings of beats, forgets and drains, skewed clocks, odd server ids and
foreign records under ``hosts/live/``.  A test marked xfail pins a known bug by its mechanism."""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from host.config import Settings
from host.errors import BadRequest, NotFound
from host.leader import RendezvousLeaderHint
from host.membership import DuplicateServerId, HostRecord, Membership, rendezvous_owner
from host.metrics import Metrics
from host.server import Server
from host.services.adoption import Adoption, AutoAdoption
from wal3 import LocalStore, ObjectStore
from wal3.errors import ObjectNotFound, StoreUnavailable
from wal3.faulty import FaultRule, FaultyStore
from wal3.paths import host_live_key, parse_host_live_key

from .live import live_server, record

BOUND_S = 30.0  # bound of every wait for a condition (never a synchronisation sleep)


def _member(store: ObjectStore, sid: str, **kw: Any) -> Membership:
    opts: dict[str, Any] = {"interval_s": 1.0, "ttl_s": 5.0, **kw}
    return Membership(store, sid, f"http://{sid}.test", **opts)


def _age_record(root: Path, server_id: str, seconds: float) -> None:
    """Make a host's record look ``seconds`` old in the store's clock (its mtime)."""
    path = root / host_live_key(server_id)
    st = path.stat()
    os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


async def _stored(store: ObjectStore, sid: str) -> HostRecord:
    if isinstance(store, FaultyStore):
        store = store.inner  # what is stored, whatever the faults
    got = HostRecord.from_bytes((await store.get(host_live_key(sid))).data, 0.0)
    assert got is not None
    return got


class _StubAdoption(Adoption):
    """An Adoption that only records whom it was asked to adopt (as the real one, it refuses to
    adopt its own server)."""

    def __init__(self, server_id: str) -> None:
        self._server_id = server_id
        self.asked: list[str] = []

    async def adopt(self, server_id: str) -> Any:
        if server_id == self._server_id:
            raise BadRequest("own dirty log")
        self.asked.append(server_id)
        raise NotFound("no dirty log")  # only its record is left


def _auto(m: Membership, after_s: float = 300.0) -> tuple[AutoAdoption, _StubAdoption]:
    stub = _StubAdoption(m.server_id)
    auto = AutoAdoption(stub, m, Metrics(), after_s=after_s)
    m.on_refresh(auto)
    return auto, stub


def _adopter_first(departed: str, candidates: list[str]) -> list[str]:
    """``candidates`` reordered so the first is the rendezvous owner of ``departed``'s adoption
    among all of them."""
    recs = [HostRecord(c, "", "", "serving", 0.0) for c in candidates]
    owner = rendezvous_owner(f"adopt\n{departed}", recs)
    assert owner is not None
    return [owner.server_id, *(c for c in candidates if c != owner.server_id)]


# ---------------------------------------------------------------------------- store faults


async def test_a_beat_whose_answer_is_lost_is_recovered_without_crying_twin(
    tmp_path: Path,
) -> None:
    store = FaultyStore(LocalStore(tmp_path))
    m = _member(store, "h")
    await m.join()
    rule = store.add_rule(
        FaultRule("lost_response", ops={"put"}, key_regex=r"^hosts/live/h\.json$", times=1)
    )
    with pytest.raises(StoreUnavailable):
        await m.beat()  # it landed; we never learnt its etag
    assert rule.fired == 1
    await m.beat()  # the If-Match fails on our own write: rewritten, not a twin
    assert m.duplicates == 0
    got = await _stored(store, "h")
    assert got.incarnation == m.me.incarnation and got.beats == m.me.beats
    await m.beat()  # and the etag is ours again: a plain conditional put
    assert m.duplicates == 0


async def test_transient_store_errors_never_stop_the_beat_loop(tmp_path: Path) -> None:
    store = FaultyStore(LocalStore(tmp_path))
    sleeps = 0
    parked = asyncio.Event()
    gate = asyncio.Event()

    async def sleep(_s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        if sleeps > 6:
            parked.set()
            await gate.wait()

    m = _member(store, "h", sleep=sleep)
    await m.join()
    # A put, a list and a get each fail once, and a put's answer is lost once.
    for op, kind in (("put", "error"), ("list", "error"), ("get", "error")):
        store.add_rule(FaultRule(kind, ops={op}, times=1))  # type: ignore[arg-type]
    store.add_rule(FaultRule("lost_response", ops={"put"}, after=1, times=1))
    other = _member(LocalStore(tmp_path), "o")
    await other.join()  # a record the refresh has to read (a get)
    beats_before = (await _stored(store, "h")).beats
    m.start()
    await asyncio.wait_for(parked.wait(), BOUND_S)
    assert m.refresh_failures >= 3
    assert (await _stored(store, "h")).beats > beats_before  # it beat again after the faults
    assert m._task is not None and not m._task.done()
    gate.set()
    await m.close()
    assert (await _stored(store, "h")).state == "draining"


async def test_a_join_whose_answer_is_lost_can_be_retried_and_is_not_a_twin(
    tmp_path: Path,
) -> None:
    """The store briefly unavailable at start: join raises the store's error (the server's start
    fails and the process is restarted), never DuplicateServerId; the restart takes over the
    record its predecessor's lost put left, after one watch."""
    store = FaultyStore(LocalStore(tmp_path))
    store.add_rule(FaultRule("error", ops={"get"}, times=1))
    first = _member(store, "h")
    with pytest.raises(StoreUnavailable):
        await first.join()
    store.add_rule(FaultRule("lost_response", ops={"put"}, times=1))
    with pytest.raises(StoreUnavailable):
        await first.join()
    assert (await _stored(store, "h")).incarnation == first.me.incarnation  # it landed
    waits: list[float] = []

    async def nobody_beats(s: float) -> None:
        waits.append(s)

    restarted = _member(store, "h", sleep=nobody_beats)
    await restarted.join()
    assert waits == [1.5]
    assert (await _stored(store, "h")).incarnation == restarted.me.incarnation


async def test_the_server_does_not_start_while_the_store_is_unavailable(tmp_path: Path) -> None:
    """What a brief outage at start does to the server: its start fails (uvicorn exits, the
    orchestrator restarts it), as it did before membership when opening the dirty log failed;
    nothing is left half-started, and a start after the outage serves."""
    store = FaultyStore(LocalStore(tmp_path / "store"))
    rule = store.add_rule(FaultRule("error", ops={"get", "head"}, key_regex=r"^hosts/live/"))
    cfg = Settings(store="unused", server_id="h", api_keys="k=*")
    server = Server(cfg, store=store)
    with pytest.raises(StoreUnavailable):  # uvicorn's lifespan then exits with status 3
        await server.start()
    assert server.dirty is None  # nothing was started
    assert rule.fired >= 1
    store.remove_rule(rule)
    async with live_server(store=store, server_id="h") as h, h.client() as c:
        r = await c.post(
            f"/v1/tenants/alice/logs/{uuid.uuid4()}/records", json={"records": [record(1)]}
        )
        assert r.status_code == 200, r.text


# ------------------------------------------------------------------------------ draining


async def test_a_drain_whose_write_failed_is_written_at_close(tmp_path: Path) -> None:
    """SIGTERM: the draining write fails once (a transient error) and the host stops before its
    next beat.  close() must still leave the record draining, or the others route to a host that
    is gone until its record is ttl_s old."""
    store = FaultyStore(LocalStore(tmp_path))
    m, other = _member(store, "h"), _member(store, "o")
    await m.join()
    await other.join()
    rule = store.add_rule(FaultRule("error", ops={"put"}, key_regex=r"^hosts/live/h", times=1))
    await m.drain()
    assert rule.fired == 1
    await m.close()
    assert (await _stored(store, "h")).state == "draining"
    await other.beat()
    assert [r.server_id for r in other.live()] == ["o"]


async def test_with_converged_views_nobody_redirects_to_a_draining_host(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    ms = [_member(store, s) for s in ("a", "b", "c")]
    for m in ms:
        await m.join()
    await ms[2].drain()
    for m in ms:
        await m.refresh()
    hints = {m.server_id: RendezvousLeaderHint(m) for m in ms}
    urls = {m.me.url: m.server_id for m in ms}
    for i in range(200):
        k = str(uuid.UUID(int=i))
        for sid, hint in hints.items():
            target = await hint.claim(k)
            if target is None:
                assert sid != "c", "a draining host serves a log"
                continue
            assert urls[target] != "c"
            assert await hints[urls[target]].claim(k) is None  # one hop, then served


# ---------------------------------------------------------------------------- routing loops


def test_no_redirect_cycle_whatever_the_views(tmp_path: Path) -> None:
    """Serving hosts with arbitrarily different views (joins and departures half seen): a
    redirect chain always ends, because every host redirects only to a host that outscores it."""
    rng = random.Random(17)
    ids = [f"h{i}" for i in range(6)]
    store = LocalStore(tmp_path)
    for trial in range(200):
        ms = {s: _member(store, s) for s in ids}
        for s, m in ms.items():
            seen = [o for o in ids if o != s and rng.random() < 0.6]
            m._records = {o: HostRecord(o, f"http://{o}.test", "i", "serving", 0.0) for o in seen}
        by_url = {m.me.url: s for s, m in ms.items()}
        k = f"trial-{trial}"
        for start in ids:
            hops, at = 0, start
            while (owner := ms[at].owner(k)) is not None and owner.server_id != at:
                at = by_url[owner.url]
                hops += 1
                assert hops <= len(ids), "redirect loop"


# ------------------------------------------------------------------- records, odd and foreign


@pytest.mark.parametrize("sid", ["a b", "ü-host", "x%2Fy", "h.json", "50%", ".", "..", "-x"])
async def test_odd_server_ids_round_trip_through_the_records(tmp_path: Path, sid: str) -> None:
    # Settings refuse most of these (test_settings_accept_only_server_ids_adoption_accepts);
    # records written by anything else with such ids still round trip.
    assert parse_host_live_key(host_live_key(sid)) == sid
    store = LocalStore(tmp_path)
    odd, plain = _member(store, sid), _member(store, "plain")
    await odd.join()
    await plain.join()
    await odd.beat()
    await plain.refresh()
    assert sorted(r.server_id for r in plain.live()) == sorted([sid, "plain"])
    assert odd.duplicates == 0


async def test_junk_under_hosts_live_is_ignored_and_a_damaged_record_is_taken_over(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    for key, body in (
        ("hosts/live/damaged.json", b"{not json"),
        ("hosts/live/list.json", b"[1, 2]"),
        ("hosts/live/old.json", json.dumps({"server_id": "old", "url": "u"}).encode()),
        (
            "hosts/live/odd-state.json",
            HostRecord("odd-state", "u", "i", "serving", 0).to_bytes().replace(b"serving", b"gone"),
        ),
        ("hosts/live/README", b"not a record"),
        ("hosts/live/sub/x.json", HostRecord("x", "u", "i", "serving", 0).to_bytes()),
        ("hosts/live/h.json", b"\x00\xff damaged"),
    ):
        await store.put(key, body)
    h, a = _member(store, "h", sleep=_never), _member(store, "a")
    await h.join()  # over its own damaged record, without a watch
    await a.join()
    await a.refresh()
    assert [r.server_id for r in a.live()] == ["a", "h"]
    assert a.departed(0) == [r for r in a.records() if r.server_id == "h"]


async def _never(_s: float) -> None:
    raise AssertionError("join waited for a record that proves nothing")


async def test_a_foreign_record_naming_another_host_is_neither_routed_to_nor_adopted(
    tmp_path: Path,
) -> None:
    """A record whose body names another server id than its key (copied, restored, or written by
    something else): it must not stand for that host.  It used to: its URL was a redirect
    target for that host's logs, and since the record never beats, the host it names (alive)
    was adopted at every refresh, and forget() (of the named host's own key) never removed it."""
    store = LocalStore(tmp_path)
    a_id, b_id = _adopter_first("b", ["a", "b"])
    a, b = _member(store, a_id), _member(store, b_id)
    await a.join()
    await b.join()
    ghost = HostRecord("b", "http://evil.test", "x", "serving", 0.0)
    await store.put(host_live_key("ghost"), ghost.to_bytes())
    _, stub = _auto(a, after_s=30)
    await a.beat()
    assert all(r.url != "http://evil.test" for r in a.live())
    _age_record(tmp_path, "ghost", 600)
    await a.beat()
    await a.beat()
    assert "b" not in stub.asked


# --------------------------------------------------------------------------- twins and clocks


async def test_a_host_clock_ahead_of_the_stores_still_refuses_a_live_twin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalStore(tmp_path)
    first = _member(store, "h")
    await first.join()
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 60.0)

    async def first_beats_meanwhile(_s: float) -> None:
        await first.beat()

    twin = _member(store, "h", sleep=first_beats_meanwhile)
    with pytest.raises(DuplicateServerId):
        await twin.join()


async def test_a_live_twin_with_a_long_interval_is_refused(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    first = _member(store, "h", interval_s=40.0, ttl_s=100.0)
    await first.join()  # it just beat; its next beat is 40 s away

    async def the_first_beats_if_we_wait_a_beat(s: float) -> None:
        if s >= first.interval_s:
            await first.beat()

    twin = _member(
        store, "h", interval_s=40.0, ttl_s=100.0, sleep=the_first_beats_if_we_wait_a_beat
    )
    with pytest.raises(DuplicateServerId):
        await twin.join()


# ------------------------------------------------------------------------------- adoption


async def test_a_live_host_is_never_adopted_even_if_adopt_after_is_below_ttl(
    tmp_path: Path,
) -> None:
    """adopt_after_s shorter than ttl_s (nothing in the settings forbids it): a host that is
    live (routed to) must not be adopted and forgotten between two of its beats."""
    store = LocalStore(tmp_path)
    a_id, b_id = _adopter_first("b", ["a", "b"])
    a, b = _member(store, a_id), _member(store, b_id)
    await a.join()
    await b.join()
    auto, stub = _auto(a, after_s=2.0)
    _age_record(tmp_path, "b", 3.0)  # 3 s since its beat: live (ttl 5 s), "silent" for 2 s
    await a.beat()
    await a.settled()
    assert [r.server_id for r in a.live()] == ["a", "b"]
    assert stub.asked == [] and auto.adopted == []
    await store.head(host_live_key("b"))


async def test_converged_hosts_refreshing_concurrently_adopt_a_departed_host_once(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path)
    ms = [_member(store, s) for s in ("l1", "l2", "l3")]
    for m in ms:
        await m.join()
    for d in ("d1", "d2", "d3", "d4", "d5"):
        await _member(store, d).join()
        _age_record(tmp_path, d, 600)
    for m in ms:
        await m.refresh()  # converged views
        await m.settled()
    autos = [_auto(m) for m in ms]
    for _ in range(2):
        await asyncio.gather(*(m.beat() for m in ms))
        await asyncio.gather(*(m.settled() for m in ms))
    adopted = sorted(sid for auto, _ in autos for sid in auto.adopted)
    assert adopted == ["d1", "d2", "d3", "d4", "d5"]
    assert sorted(sid for _, stub in autos for sid in stub.asked) == adopted
    assert [r.server_id for r in ms[0].records()] == ["l1", "l2", "l3"]


async def test_a_departed_host_seen_by_two_diverging_views_is_counted_once(
    tmp_path: Path,
) -> None:
    """A host joins while another departs: the joiner's view has both live hosts, the older
    host's view (listed before the join) has only itself, so both are the adopter in their own
    view.  Both hand over (harmless: the second finds the cursor moved), but the adoption is
    counted (loghost_adopted_dirty_logs_total, ``adopted``) only by the host that removed the
    record, not also by the one that found it already removed."""
    store = LocalStore(tmp_path)
    joiner_id, old_id = _adopter_first("d", ["x", "y"])
    old = _member(store, old_id)
    await old.join()
    await _member(store, "d").join()
    _age_record(tmp_path, "d", 600)
    await old.refresh()  # its view: itself and d
    await old.settled()
    joiner = _member(store, joiner_id)
    await joiner.join()  # its view: both, and d
    auto_old, _ = _auto(old)
    auto_joiner, stub_joiner = _auto(joiner)
    await joiner.beat()  # adopts d, forgets its record
    await joiner.settled()
    # The old host's refresh listed before the joiner's record existed:
    await auto_old()
    assert stub_joiner.asked == ["d"]
    assert auto_joiner.adopted == ["d"]
    assert auto_old.adopted == []


async def test_a_forget_racing_the_departed_hosts_return_is_healed_by_its_next_beat(
    tmp_path: Path,
) -> None:
    """forget() heads then deletes: a host that beats in between loses its fresh record; its
    next beat writes it again (no twin counted) and it is live again for the others."""
    inner = LocalStore(tmp_path)
    b = _member(inner, "b")

    class BeatBeforeDelete(FaultyStore):
        async def delete(self, key: str) -> None:
            if key == host_live_key("b"):
                await b.beat()
            await super().delete(key)

    store = BeatBeforeDelete(inner)
    a = _member(store, "a")
    await a.join()
    await b.join()
    await a.refresh()
    seen = next(r for r in a.records() if r.server_id == "b")
    assert await a.forget("b", seen)  # the race: removed although it had just beaten
    with pytest.raises(ObjectNotFound):
        await inner.head(host_live_key("b"))
    await b.beat()
    assert b.duplicates == 0
    await a.refresh()
    assert [r.server_id for r in a.live()] == ["a", "b"]


async def test_a_host_back_after_its_adoption_is_not_adopted_again(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    a_id, _ = _adopter_first("b", ["a", "b"])
    a, b = _member(store, a_id), _member(store, "b")
    await a.join()
    await b.join()
    auto, stub = _auto(a)
    _age_record(tmp_path, "b", 600)
    await a.beat()
    await a.settled()
    assert auto.adopted == ["b"]
    await b.beat()  # back: its record is written again
    await b.settled()
    for _ in range(3):
        await b.beat()
        await b.settled()
        await a.beat()
        await a.settled()
    assert auto.adopted == ["b"] and stub.asked == ["b"]


async def test_a_slow_adoption_does_not_stop_the_beat(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    sleeps = 0
    third_sleep = asyncio.Event()

    async def sleep(_s: float) -> None:
        nonlocal sleeps
        sleeps += 1
        if sleeps >= 3:
            third_sleep.set()
        await asyncio.sleep(0)  # the interval elapses at once (not a synchronisation)

    m = _member(store, "h", sleep=sleep)
    await m.join()
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow_adoption() -> None:
        if not entered.is_set():
            entered.set()
            await release.wait()  # a hand-over on a slow store

    m.on_refresh(slow_adoption)
    m.start()
    try:
        await asyncio.wait_for(entered.wait(), BOUND_S)
        await asyncio.wait_for(third_sleep.wait(), 3.0)  # bound, not a synchronisation
    finally:
        release.set()
        await m.close()


async def test_an_alive_host_adopted_by_mistake_loses_no_dirty_mark(tmp_path: Path) -> None:
    """x is alive but its record looks long silent (a paused process, a partition): y adopts it.
    x goes on marking; every collection written through x stays dirty in one of the two logs,
    and x is not adopted again once it beats."""
    store_url = str(tmp_path / "store")
    quiet: dict[str, Any] = {
        "membership_interval_s": 50.0,
        "membership_ttl_s": 100.0,
        "adopt_after_s": 300.0,
    }
    async with (
        live_server(store_url, server_id="x", **quiet) as x,
        live_server(store_url, server_id="y", **quiet) as y,
        x.client() as cx,
    ):
        await x.server.membership.refresh()  # y joined after x's last refresh
        await x.server.membership.settled()
        mine = [
            str(uuid.UUID(int=i))
            for i in range(1, 200)
            if (o := x.server.membership.owner(str(uuid.UUID(int=i)))) and o.server_id == "x"
        ]
        before, after = mine[0], mine[1]
        r = await cx.post(f"/v1/tenants/alice/logs/{before}/records", json={"records": [record(1)]})
        assert r.status_code == 200, r.text
        root = tmp_path / "store"
        _age_record(root, "x", 100_000)
        await y.server.membership.beat()
        await y.server.membership.settled()
        assert y.server.auto_adoption.adopted == ["x"]
        for cid in (after, before):
            r = await cx.post(
                f"/v1/tenants/alice/logs/{cid}/records",
                json={"records": [record(2)]},
                follow_redirects=True,
            )
            assert r.status_code == 200, r.text
        await x.server.membership.beat()  # back
        await x.server.membership.settled()
        await y.server.membership.beat()
        await y.server.membership.settled()
        assert y.server.auto_adoption.adopted == ["x"]
        async with y.client() as cy:
            for c in (cx, cy):
                await c.post("/v1/dirty/rollup")
            dirty = set()
            for c in (cx, cy):
                dirty |= {e["collection_id"] for e in (await c.get("/v1/dirty")).json()["logs"]}
        assert {before, after} <= dirty


def test_settings_accept_only_server_ids_adoption_accepts() -> None:
    """One rule for server ids (host.config.SERVER_ID): an id a host may start with is one its
    dirty log can be adopted by (an id like 'pod a' used to start, then never be adopted)."""
    for odd in ("pod a", "ü-host", ".x", "-x", "a/b", ""):
        with pytest.raises(ValueError, match="server_id must be letters"):
            Settings(server_id=odd)
    assert Settings(server_id="loghost-0.pod_1").server_id == "loghost-0.pod_1"
