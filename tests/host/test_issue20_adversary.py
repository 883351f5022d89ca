"""Adversarial review of the issue-20 fixes (creation claims d23391f/7b9f2c9, the roll-up's tail
settle 4b80d7d): reproductions that still break them.  Each is ``xfail(strict=True)`` until fixed.

1. **A released claim does not wait for the releaser's own writes.**  The claimant's writes to the
   target run in ``asyncio.gather`` (the clean-up's deletes in ``claim._delete_all``, a fork's
   copies in ``fork._fork_into``).  When one of them fails, ``gather`` raises at once while its
   siblings are still in flight, and the attempt then *releases* its claim (``Claim.abandon`` ->
   ``release``), which lets the next claimant in immediately, without the TTL wait that protects
   against a taken-over claimant.  A sibling landing after the next claimant's clean-up then
   (a) deletes a fragment the new log has linked and acknowledged, or (b) leaves a copy of the
   fork's source fragment that the new log's read repair links as its own first records.
2. **The claim TTL is each host's own** (``2 x max(60 s, its LOGHOST_GC_GRACE_S)``).  A host with a
   shorter grace (a rolling change of the setting) takes over a live fork of a host with a longer
   one, which renews only every quarter of *its* TTL; the fork's next writes (guarded, but with
   no renewal due) land in the log created by the taker: another log's ``CURRENT.json``.
3. **Settling a dirty mark compares wall clocks.**  ``initial_insertion_epoch_us`` (the host's
   wall clock when it marked) is judged against the roll-up's wall clock, so a forward step of the
   host's clock (NTP, a VM's clock corrected) by more than the settle time makes the mark of a
   write whose fragment upload is still in flight "aged"; the tail probe finds nothing at the
   next sequence number yet, and the mark is dropped.  The write then lands, and the collection
   is in no dirty set.  (Same for ``/v1/dirty/adopt`` of a live host whose clock lags.)
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import httpx
import pytest

import dirtylog.hook
from host.forks import claim_ttl_s, current_key
from host.wal3 import FaultRule, FaultyStore, LocalStore, ObjectStore
from host.wal3.claim import ClaimWatch
from host.wal3.errors import ObjectNotFound

from ..wal3.helpers import GateStore
from .claimkit import StepClock
from .live import live_server, log_path, read_all, record

SRC = "00000000-0000-4000-8000-0000000000a1"
DST = "00000000-0000-4000-8000-0000000000a2"
SEQ1 = r"FragmentSeqNo=0*1\.parquet$"
SEQ2 = r"FragmentSeqNo=0*2\.parquet$"


async def _two_fragment_source(alice: httpx.AsyncClient) -> None:
    """SRC holds [1, 5) in two fragments, never compacted (a fork copies both, cursor at 1)."""
    for n in range(2):
        r = await alice.post(log_path("alice", SRC) + "/records",
                             json={"records": [record(f"s{n}-{i}") for i in range(2)]})
        assert r.status_code == 200, r.text


async def _ids(client: httpx.AsyncClient, cid: str) -> list[str]:
    return [x["record"]["id"] for x in await read_all(client, log_path("alice", cid), 1)]


# ------------------------------------------------------------------------ 1. release vs stragglers


@pytest.mark.xfail(strict=True, reason=(
    "a first write whose clean-up fails releases its claim while a sibling delete is still in "
    "flight; the retry's log is created and acknowledged, then that delete removes its fragment"))
async def test_a_straggling_cleanup_delete_removes_an_acknowledged_fragment(
        tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "s")
    faulty = FaultyStore(base, seed=1)
    store = GateStore(faulty)
    async with live_server(store=store, gc_grace_s=0.0) as live, \
            live.client("alice-key") as alice, live.client() as svc:
        await _two_fragment_source(alice)
        # A fork fails after its copies (its cursor write meets an outage) and releases its
        # claim: the target keeps two copied fragments for the next claimant to clean up.
        outage = faulty.add_rule(FaultRule("error", ops={"put"},
                                           key_regex=rf"logs/{DST}/cursor/"))
        r = await svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        assert r.status_code == 503, r.text
        faulty.remove_rule(outage)
        left = sorted([m.key async for m in base.list(f"logs/{DST}/log/")])
        assert len(left) == 2, left

        # The tenant writes the target.  Its clean-up deletes both leftovers at once: the delete
        # of seq 1 is slow (held), the delete of seq 2 fails -> 503, and the claim is released.
        slow = store.hold("delete", rf"logs/{DST}/log/.*{SEQ1}")
        faulty.add_rule(FaultRule("error", ops={"delete"}, key_regex=rf"logs/{DST}/log/.*{SEQ2}",
                                  times=1))
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert r.status_code == 503, r.text
        assert slow.reached.is_set() and not slow.landed.is_set()

        # Its retry takes the released claim at once, cleans up, creates the log: acknowledged.
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert r.status_code == 200 and r.json()["first_offset"] == 1, r.text

        slow.release.set()  # the first attempt's delete, issued before the retry, lands now
        await slow.landed.wait()
        r = await alice.get(log_path("alice", DST) + "/records", params={"from": 1})
        try:
            await base.head(left[0])
            linked = True
        except ObjectNotFound:
            linked = False
        assert linked, ("the acknowledged record's fragment was deleted by the released attempt; "
                        f"reading it: {r.status_code} {r.text}")
        assert [x["record"]["id"] for x in r.json()["records"]] == ["t"]


@pytest.mark.xfail(strict=True, reason=(
    "a fork whose copy fails releases its claim while a sibling copy is in flight; the copy of "
    "the source's first fragment lands after the next claimant's clean-up and the target's "
    "first write read-repairs it: the target holds another log's records"))
async def test_a_straggling_fork_copy_becomes_the_first_written_logs_records(
        tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "s")
    faulty = FaultyStore(base, seed=1)
    store = GateStore(faulty)
    async with live_server(store=store, gc_grace_s=0.0) as live, \
            live.client("alice-key") as alice, live.client() as svc:
        await _two_fragment_source(alice)
        copy1 = store.hold("put", rf"logs/{DST}/log/.*{SEQ1}")  # a slow copy
        faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=rf"logs/{DST}/log/.*{SEQ2}"))
        r = await svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        assert r.status_code == 503, r.text  # the other copy failed: the claim is released
        assert copy1.reached.is_set() and not copy1.landed.is_set()
        faulty.clear_rules()

        # The tenant creates the target meanwhile (the released claim lets it in at once); its
        # first fragment's upload is about to go out when the fork's straggling copy lands.
        upload = store.hold("put", rf"logs/{DST}/log/.*{SEQ1}")
        first = asyncio.create_task(alice.post(log_path("alice", DST) + "/records",
                                               json={"records": [record("t")]}))
        try:
            await upload.reached.wait()
            copy1.release.set()
            await copy1.landed.wait()
        finally:
            copy1.release.set()
            upload.release.set()
        r = await first
        assert r.status_code == 200, r.text
        assert await _ids(alice, DST) == ["t"]  # before the fix: ["s0-0", "s0-1", "t"]


# ------------------------------------------------------------------ 2. the TTL is each host's own


async def _source_with_version(base: ObjectStore, alice: httpx.AsyncClient,
                               svc: httpx.AsyncClient) -> None:
    """SRC holds [1, 7) in three fragments; a compacted version of it at 5, its cursor there."""
    for n in range(3):
        r = await alice.post(log_path("alice", SRC) + "/records",
                             json={"records": [record(f"s{n}-{i}") for i in range(2)]})
        assert r.status_code == 200, r.text
    path = f"compacted/{SRC}/v{1:016d}/part-x.parquet"
    await base.put(path, b"parquet bytes of the source's [1, 5)")
    await base.put(current_key(uuid.UUID(SRC)), json.dumps(
        {"version": 1, "offset": 5, "rows": 4, "path": path}).encode())
    r = await svc.post(log_path("alice", SRC) + "/compaction", json={"offset": 5})
    assert r.status_code == 200, r.text


@pytest.mark.xfail(strict=True, reason=(
    "host B (GC grace 0: claim TTL 120 s) takes over a live fork of host A (grace 600: TTL "
    "1200 s, renewing every 300 s); A's next guarded write lands in B's new log: the first-"
    "written target gets the source's CURRENT.json"))
async def test_a_shorter_local_ttl_takes_over_a_live_fork(tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "s")
    store = GateStore(base)
    clock = StepClock()
    async with live_server(store=store, gc_grace_s=600.0) as a, \
            live_server(store=store, gc_grace_s=0.0) as b, \
            a.client("alice-key") as alice_a, a.client() as svc_a, \
            b.client("alice-key") as alice_b:
        a.server.manager.claims = ClaimWatch(claim_ttl_s(600.0), clock=clock)
        b.server.manager.claims = ClaimWatch(claim_ttl_s(0.0), clock=clock)
        await _source_with_version(base, alice_a, svc_a)

        # A forks SRC into DST; it is reading the source's compacted file (a large object).
        reading = store.hold("get", rf"compacted/{SRC}/v.*part-x\.parquet$")
        fork = asyncio.create_task(svc_a.post(log_path("alice", SRC) + "/fork",
                                              json={"target_collection_id": DST}))
        try:
            await reading.reached.wait()
            body = {"records": [record("t")]}
            r = await alice_b.post(log_path("alice", DST) + "/records", json=body)
            assert r.status_code == 409, r.text  # B sees A's claim for the first time
            clock.advance(claim_ttl_s(0.0))  # 120 s: well inside A's renewal period (300 s)
            r = await alice_b.post(log_path("alice", DST) + "/records", json=body)
            assert r.status_code == 200 and r.json()["first_offset"] == 1, r.text
        finally:
            reading.release.set()
        forked = await fork
        assert forked.status_code != 200, forked.text  # A lost the manifest ...
        # ... but DST, the tenant's own first-written log [1, 2), must have no compacted view.
        try:
            pointer = json.loads((await base.get(current_key(uuid.UUID(DST)))).data)
        except ObjectNotFound:
            pointer = None
        assert pointer is None, pointer  # before a fix: SRC's version at offset 5, past the tail


# --------------------------------------------------------------- 3. settle by comparing wall clocks


class _SteppedTime:
    """``time`` as the dirty-log code sees it, after the host's wall clock stepped forward."""

    def __init__(self, step_s: float) -> None:
        self.step_ns = int(step_s * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.step_ns

    def time(self) -> float:
        return self.time_ns() / 1e9


@pytest.mark.xfail(strict=True, reason=(
    "a forward wall-clock step makes an in-flight write's mark look settled; the tail probe "
    "finds no fragment yet and the mark is dropped, so the write lands in no dirty set"))
async def test_a_wall_clock_step_drops_the_mark_of_a_write_in_flight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = GateStore(LocalStore(tmp_path / "s"))
    cid = "00000000-0000-4000-8000-0000000000a3"
    # Settle time max(60 s, GC grace) = 60 s here (300 s with the default grace: a step of more
    # than five minutes then does the same).
    async with live_server(store=store, gc_grace_s=60.0) as live, \
            live.client("alice-key") as alice, live.client() as svc:
        assert live.server.dirty is not None
        assert live.server.dirty.backend.settle_s == 60.0
        dirty_writer = live.server.dirty.backend.writer
        before = dirty_writer.manifest.next_offset
        upload = store.hold("put", rf"logs/{cid}/log/")
        write = asyncio.create_task(alice.post(log_path("alice", cid) + "/records",
                                               json={"records": [record("x")]}))
        try:
            await upload.reached.wait()  # the fragment's upload is in flight ...
            assert await dirty_writer.wait_for_commit(before, 30.0)  # ... and its mark is durable
            # The host's wall clock is stepped forward by two minutes (the settle time is 60 s;
            # a second of real time has not passed).
            monkeypatch.setattr(dirtylog.hook, "time", _SteppedTime(120.0))
            r = await svc.post("/v1/dirty/rollup")
            assert r.status_code == 200, r.text
        finally:
            upload.release.set()
        r = await write
        assert r.status_code == 200 and r.json()["first_offset"] == 1, r.text
        r = await svc.post("/v1/dirty/rollup")
        assert r.status_code == 200, r.text
        spans = {e["collection_id"]: (e["start"], e["limit"]) for e in r.json()["logs"]}
        assert spans.get(cid) == (1, 2), spans  # acknowledged, never compacted, in no dirty set
