"""Adversarial review of the issue-20 fixes (creation claims d23391f/7b9f2c9, the roll-up's tail
settle 4b80d7d): three ways they still broke, each reproduced here against a real host and now
fixed (the tests pass; each docstring tells the interleaving, before and after).

1. **A released claim did not wait for the releaser's own writes.**  The claimant's writes to the
   target ran in ``asyncio.gather`` (the clean-up's deletes in ``claim._delete_all``, a fork's
   copies in ``fork._fork_into``).  When one of them failed, ``gather`` raised at once while its
   siblings were still in flight, and the attempt then *released* its claim (``Claim.abandon`` ->
   ``release``), which let the next claimant in immediately, without the TTL wait that protects
   against a taken-over claimant.  A sibling landing after the next claimant's clean-up then
   (a) deleted a fragment the new log had linked and acknowledged, or (b) left a copy of the
   fork's source fragment that the new log's read repair linked as its own first records.
   Fixed: claimant writes run in a task group (``claim.run_all``: the first failure cancels the
   siblings and waits for every one to end), each is a claimed write (``Claim.write``), any
   failure closes the claim, and the claim is released only when no write of the attempt may
   still land — a write cancelled after it was issued, or ended by an ambiguous error, keeps it
   until it expires.
2. **The claim TTL was each host's own** (``2 x max(60 s, its LOGHOST_GC_GRACE_S)``).  A host with
   a shorter grace (a rolling change of the setting) took over a live fork of a host with a longer
   one, which renews only every quarter of *its* TTL; the fork's next writes (guarded, but with
   no renewal due) landed in the log created by the taker: another log's ``CURRENT.json``.
   Fixed: the holder records its TTL in the claim (``ttl_s``), and observers wait for the longer
   of theirs and the holder's.
3. **Settling a dirty mark compared wall clocks.**  ``initial_insertion_epoch_us`` (the host's
   wall clock when it marked) was judged against the roll-up's wall clock, so a forward step of
   the host's clock (NTP, a VM's clock corrected) by more than the settle time made the mark of a
   write whose fragment upload was still in flight "aged"; the tail probe found nothing at the
   next sequence number yet, and the mark was dropped.  The write then landed, and the collection
   was in no dirty set.  (Same for ``/v1/dirty/adopt`` of a live host whose clock lags.)  Fixed:
   a mark settles only once the roll-up has itself seen it for the settle time, on its monotonic
   clock (``dirtylog.rollup.Observations``); a mark first seen now is young.
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
from wal3 import FaultRule, FaultyStore, LocalStore, ObjectStore
from wal3.claim import (
    CLAIM_PATH,
    Claim,
    ClaimLost,
    ClaimWatch,
    CreationInProgress,
    claim_log,
    copy_claimed,
    put_claimed,
    release_if_dead,
    run_all,
)
from wal3.errors import ObjectNotFound, StoreUnavailable
from wal3.store import GetResult

from ..wal3.helpers import GateStore
from .claimkit import TTL_S, StepClock, source_with_version, stepped_watch
from .live import live_server, log_path, read_all, record

SRC = "00000000-0000-4000-8000-0000000000a1"
DST = "00000000-0000-4000-8000-0000000000a2"
SEQ1 = r"FragmentSeqNo=0*1\.parquet$"
SEQ2 = r"FragmentSeqNo=0*2\.parquet$"


async def _two_fragment_source(alice: httpx.AsyncClient) -> None:
    """SRC holds [1, 5) in two fragments, never compacted (a fork copies both, cursor at 1)."""
    for n in range(2):
        r = await alice.post(
            log_path("alice", SRC) + "/records",
            json={"records": [record(f"s{n}-{i}") for i in range(2)]},
        )
        assert r.status_code == 200, r.text


async def _ids(client: httpx.AsyncClient, cid: str) -> list[str]:
    return [x["record"]["id"] for x in await read_all(client, log_path("alice", cid), 1)]


# ------------------------------------------------------------------------ 1. release vs stragglers


async def _contention(r: httpx.Response) -> bool:
    return r.status_code == 409 and r.json()["error"]["code"] == "contention"


async def test_a_straggling_cleanup_delete_removes_an_acknowledged_fragment(tmp_path: Path) -> None:
    """Before the fix: the first write's failed clean-up released its claim while its other
    delete was in flight; the retry got in at once, created the log and was acknowledged, and
    then that delete removed its fragment.  Now the deletes run in a task group (the failure
    cancels the held delete and waits for it) and a write that may still land — the cancelled
    delete was issued — keeps the claim until it expires: the retry is refused meanwhile."""
    base = LocalStore(tmp_path / "s")
    faulty = FaultyStore(base, seed=1)
    store = GateStore(faulty)
    async with (
        live_server(store=store, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        watch, clock = stepped_watch()
        live.server.manager.claims = watch
        await _two_fragment_source(alice)
        # A fork fails after its copies (its cursor write meets an outage: it may still land, so
        # the fork keeps its claim): the target keeps two copied fragments for the next claimant.
        outage = faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=rf"logs/{DST}/cursor/"))
        r = await svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        assert r.status_code == 503, r.text
        faulty.remove_rule(outage)
        left = sorted([m.key async for m in base.list(f"logs/{DST}/log/")])
        assert len(left) == 2, left
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert await _contention(r), r.text  # the fork's claim stands until it expires
        clock.advance(TTL_S)

        # The tenant writes the target.  Its clean-up deletes both leftovers at once: the delete
        # of seq 1 is slow (held), the delete of seq 2 fails -> 503.
        slow = store.hold("delete", rf"logs/{DST}/log/.*{SEQ1}")
        faulty.add_rule(
            FaultRule("error", ops={"delete"}, key_regex=rf"logs/{DST}/log/.*{SEQ2}", times=1)
        )
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert r.status_code == 503, r.text
        assert slow.reached.is_set() and not slow.landed.is_set()

        # The fix: the failed attempt's delete was issued and may still land, so its claim is
        # kept, not released: the retry cannot get in and clean up under it.
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert await _contention(r), r.text

        assert slow.cancelled.is_set()  # the task group cancelled it: it never reaches the store
        assert not slow.landed.is_set()
        clock.advance(TTL_S)  # the claim expires: any straggler has landed or failed by now
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert r.status_code == 200 and r.json()["first_offset"] == 1, r.text
        r = await alice.get(log_path("alice", DST) + "/records", params={"from": 1})
        try:
            await base.head(left[0])
            linked = True
        except ObjectNotFound:
            linked = False
        assert linked, (
            "the acknowledged record's fragment was deleted by the released attempt; "
            f"reading it: {r.status_code} {r.text}"
        )
        assert [x["record"]["id"] for x in r.json()["records"]] == ["t"]


async def test_a_straggling_fork_copy_becomes_the_first_written_logs_records(
    tmp_path: Path,
) -> None:
    """Before the fix: a fork whose copy failed released its claim while its other copy was in
    flight; the tenant's first write got in at once, and the straggling copy of the source's
    first fragment landed at the target's seq 1 just before the tenant's own upload, which read
    repair then linked: the target began with another log's records.  Now the copies run in a
    task group and the fork, whose cancelled copy may still land, keeps its claim: the first
    write is refused until it expires."""
    base = LocalStore(tmp_path / "s")
    faulty = FaultyStore(base, seed=1)
    store = GateStore(faulty)
    async with (
        live_server(store=store, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        watch, clock = stepped_watch()
        live.server.manager.claims = watch
        await _two_fragment_source(alice)
        copy1 = store.hold("put", rf"logs/{DST}/log/.*{SEQ1}")  # a slow copy
        copy2 = store.hold("put", rf"logs/{DST}/log/.*{SEQ2}")  # fails once copy 1 is out
        faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=rf"logs/{DST}/log/.*{SEQ2}"))
        fork = asyncio.create_task(
            svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        )
        await copy1.reached.wait()
        await copy2.reached.wait()
        copy2.release.set()
        r = await fork
        assert r.status_code == 503, r.text  # the other copy failed
        assert copy1.reached.is_set() and not copy1.landed.is_set()
        faulty.clear_rules()

        # The fix: the claim is kept (the slow copy was issued and may still land), so the
        # tenant cannot create the target while it might.
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert await _contention(r), r.text
        assert copy1.cancelled.is_set()  # cancelled by the task group: it never reaches the store
        assert not copy1.landed.is_set()

        clock.advance(TTL_S)  # expired: the first write takes it over and cleans up
        upload = store.watch("put", rf"logs/{DST}/log/.*{SEQ1}")
        r = await alice.post(log_path("alice", DST) + "/records", json={"records": [record("t")]})
        assert r.status_code == 200 and r.json()["first_offset"] == 1, r.text
        assert upload.landed.is_set()
        assert await _ids(alice, DST) == ["t"]  # before the fix: ["s0-0", "s0-1", "t"]


# ------------------------------------------------------------------ 2. the TTL is each host's own


async def test_a_shorter_local_ttl_takes_over_a_live_fork(tmp_path: Path) -> None:
    """Before the fix: host B (GC grace 0: claim TTL 120 s) took over a live fork of host A
    (grace 600: TTL 1200 s, renewing every 300 s) after 120 s, and A's next guarded write (no
    renewal due) landed in B's new log: the first-written target got the source's
    ``CURRENT.json``.  Now A's claim records its TTL and B waits for the longer of the two."""
    base = LocalStore(tmp_path / "s")
    store = GateStore(base)
    clock = StepClock()
    async with (
        live_server(store=store, gc_grace_s=600.0) as a,
        live_server(store=store, gc_grace_s=0.0) as b,
        a.client("alice-key") as alice_a,
        a.client() as svc_a,
        b.client("alice-key") as alice_b,
    ):
        a.server.manager.claims = ClaimWatch(claim_ttl_s(600.0), clock=clock)
        b.server.manager.claims = ClaimWatch(claim_ttl_s(0.0), clock=clock)
        await source_with_version(base, alice_a, svc_a, SRC, 2)

        # A forks SRC into DST; it is reading the source's compacted file (a large object).
        reading = store.hold("get", rf"compacted/{SRC}/v.*part-x\.parquet$")
        fork = asyncio.create_task(
            svc_a.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        )
        try:
            await reading.reached.wait()
            body = {"records": [record("t")]}
            r = await alice_b.post(log_path("alice", DST) + "/records", json=body)
            assert r.status_code == 409, r.text  # B sees A's claim for the first time
            clock.advance(claim_ttl_s(0.0))  # 120 s: well inside A's renewal period (300 s)
            r = await alice_b.post(log_path("alice", DST) + "/records", json=body)
            # The fix: B's own TTL has passed, A's has not: A's live fork keeps the target.
            assert r.status_code == 409 and r.json()["error"]["code"] == "contention", r.text
            claim = json.loads((await base.get(f"logs/{DST}/CLAIM")).data)
            assert claim["ttl_s"] == claim_ttl_s(600.0), claim  # the holder's TTL, recorded
        finally:
            reading.release.set()
        forked = await fork
        assert forked.status_code == 200, forked.text  # A's fork created DST, whole
        assert forked.json()["compaction_offset"] == 5, forked.text
        r = await alice_b.post(log_path("alice", DST) + "/records", json=body)
        assert r.status_code == 200 and r.json()["first_offset"] == 7, r.text  # B appends to it
        # DST's compacted view is the fork's base (SRC's version at 5, where DST's log [5, 8)
        # starts), never another attempt's.
        pointer = json.loads((await base.get(current_key(uuid.UUID(DST)))).data)
        assert (pointer["offset"], pointer["path"].startswith(f"compacted/{DST}/")) == (5, True)
        assert [x["record"]["id"] for x in await read_all(alice_b, log_path("alice", DST), 5)] == [
            "s2-0",
            "s2-1",
            "t",
        ]


# --------------------------------------------------------------- 3. settle by comparing wall clocks


class _SteppedTime:
    """``time`` as the dirty-log code sees it, after the host's wall clock stepped forward."""

    def __init__(self, step_s: float) -> None:
        self.step_ns = int(step_s * 1e9)

    def time_ns(self) -> int:
        return time.time_ns() + self.step_ns

    def time(self) -> float:
        return self.time_ns() / 1e9


async def test_a_wall_clock_step_drops_the_mark_of_a_write_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before the fix: a forward step of the host's wall clock made an in-flight write's mark
    look settled (its insertion time was compared with the roll-up's wall clock); the tail probe
    found no fragment yet, the mark was dropped, and the write landed in no dirty set.  Now a mark
    settles only once the roll-up itself has seen it for the settle time on its monotonic clock:
    first seen at this roll-up, it is young."""
    store = GateStore(LocalStore(tmp_path / "s"))
    cid = "00000000-0000-4000-8000-0000000000a3"
    # Settle time max(60 s, GC grace) = 60 s here (300 s with the default grace: a step of more
    # than five minutes then does the same).
    async with (
        live_server(store=store, gc_grace_s=60.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        assert live.server.dirty is not None
        assert live.server.dirty.backend.settle_s == 60.0
        dirty_writer = live.server.dirty.backend.writer
        before = dirty_writer.manifest.next_offset
        upload = store.hold("put", rf"logs/{cid}/log/")
        write = asyncio.create_task(
            alice.post(log_path("alice", cid) + "/records", json={"records": [record("x")]})
        )
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


# ------------------------------------------------------------ 1 (engine). claimed writes, release


_T = uuid.UUID(int=0xA4, version=4)
_PREFIX = f"logs/{_T}"


async def _claim(store: ObjectStore, watch: ClaimWatch | None = None) -> Claim | None:
    return await claim_log(
        store, _PREFIX, purpose="create", holder="t", watch=watch or ClaimWatch(TTL_S)
    )


async def test_a_cancelled_claimant_with_a_delete_in_flight_keeps_its_claim(tmp_path: Path) -> None:
    """A first write cancelled (its client hung up) while a clean-up delete is out: that delete
    may still land, so the claim is kept until it expires; the cancelled attempt is closed."""
    base = LocalStore(tmp_path / "s")
    await base.put(f"{_PREFIX}/log/Bucket=0/FragmentSeqNo=1.parquet", b"left by a dead fork")
    store = GateStore(base)
    held = store.hold("delete", r"/log/")
    attempt = asyncio.create_task(_claim(store))
    await held.reached.wait()
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    with pytest.raises(CreationInProgress):
        await _claim(base)  # not released: the delete was issued


async def test_a_cancelled_claimant_with_nothing_in_flight_releases_its_claim(
    tmp_path: Path,
) -> None:
    """Cancelled while only reading (no write of it issued): nothing can land, so the claim is
    released at once (shielded from the cancellation) and the next attempt gets in without the
    TTL wait."""
    base = LocalStore(tmp_path / "s")
    store = GateStore(base)
    claimed = store.watch("put", rf"{CLAIM_PATH}$")
    reading = asyncio.Event()
    real_get = store.get

    async def get(key: str) -> GetResult:
        if claimed.landed.is_set() and key.endswith("manifest/MANIFEST"):
            reading.set()  # the re-read under the claim: hangs until cancelled
            await asyncio.Event().wait()
        return await real_get(key)

    store.get = get  # type: ignore[method-assign]  # a spy on this one store
    attempt = asyncio.create_task(_claim(store))
    await reading.wait()
    attempt.cancel()
    with pytest.raises(asyncio.CancelledError):
        await attempt
    stored = json.loads((await base.get(f"{_PREFIX}/{CLAIM_PATH}")).data)
    assert stored.get("released") is True, stored
    assert await _claim(base) is not None


async def test_a_released_or_failed_claim_takes_no_more_writes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    claim = await _claim(store)
    assert claim is not None
    await claim.release()
    with pytest.raises(ClaimLost):
        await claim.guard()
    with pytest.raises(ClaimLost):
        await claim.write(lambda: store.put(f"{_PREFIX}/cursor/x.json", b"x"))
    with pytest.raises(ObjectNotFound):
        await store.head(f"{_PREFIX}/cursor/x.json")

    # A write that fails ambiguously closes the claim and keeps it (it may still land).
    other = uuid.UUID(int=0xA5, version=4)
    faulty = FaultyStore(LocalStore(tmp_path / "t"), seed=1)
    claim = await claim_log(
        faulty, f"logs/{other}", purpose="create", holder="t", watch=ClaimWatch(TTL_S)
    )
    assert claim is not None
    faulty.add_rule(FaultRule("error", ops={"put"}, key_regex=r"/cursor/"))
    with pytest.raises(StoreUnavailable):
        await claim.write(lambda: faulty.put(f"logs/{other}/cursor/x.json", b"x"))
    assert claim.may_still_land
    await claim.abandon(StoreUnavailable("boom"))
    faulty.clear_rules()
    with pytest.raises(CreationInProgress):
        await claim_log(
            faulty, f"logs/{other}", purpose="create", holder="u", watch=ClaimWatch(TTL_S)
        )


async def test_run_all_waits_for_every_sibling_and_raises_the_failure_itself() -> None:
    ended: list[str] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append("slow")

    async def fail() -> None:
        await asyncio.sleep(0)
        raise StoreUnavailable("the first failure")

    with pytest.raises(StoreUnavailable, match="the first failure"):
        await run_all([slow(), fail()])
    assert ended == ["slow"]  # cancelled and awaited before run_all returned


async def test_claimed_copies_and_puts_accept_only_our_bytes(tmp_path: Path) -> None:
    """Under a claim an object already at the destination is ours only if it holds exactly
    the bytes we meant to write (a retried put, a copy that landed): anything else is another
    attempt's, and the claimant stops."""
    store = LocalStore(tmp_path / "s")
    await store.put("src/a", b"source bytes")
    await store.put("dst/a", b"source bytes")  # e.g. our own copy whose answer was lost
    await copy_claimed(store, "src/a", "dst/a")
    await store.put("dst/b", b"another log's fragment")
    with pytest.raises(ClaimLost):
        await copy_claimed(store, "src/a", "dst/b")
    await put_claimed(store, "dst/c", b"snapshot")
    await put_claimed(store, "dst/c", b"snapshot")  # identical: accepted
    with pytest.raises(ClaimLost):
        await put_claimed(store, "dst/c", b"another snapshot")


async def test_the_holders_ttl_binds_every_observer(tmp_path: Path) -> None:
    """Issue 20 adversary, 2, in the engine: a claim records its holder's TTL; an observer with
    a shorter one (the roll-up's ``release_if_dead`` too) waits for the holder's."""
    store = LocalStore(tmp_path / "s")
    holder = await _claim(store, ClaimWatch(10 * TTL_S))
    assert holder is not None
    key = f"{_PREFIX}/{CLAIM_PATH}"
    watch, clock = stepped_watch(TTL_S)
    assert not await release_if_dead(store, key, watch)
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)
    clock.advance(TTL_S)
    assert not await release_if_dead(store, key, watch)  # the observer's own TTL is not enough
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)
    clock.advance(9 * TTL_S)
    assert await release_if_dead(store, key, watch)  # the holder's TTL has passed
    assert await _claim(store, watch) is not None
