"""Adversarial review of the take-over claim (issue 21, read leases V2: ``wal3/lease.py``'s
"Claim", the committer's and read repair's claims, ``leased_manifest``, ``lost_to``).

Each finding was ``xfail(strict=True)`` (c8f3366) until fixed in the commit that follows it:
a write made while fencing records the lease it fences for (1), a manifest put that raised
vouches for nothing until a write or a HEAD proves again (2), and read repair makes one claim at
most, yielding only to a rival's pure claim (3).  Time is a manual clock, interleavings are
forced with events (no sleeps).

1. **A claim records the claimer's own lease, so the next take-over fences too short.**  The
   fence is "for the lease recorded in the base", and the base of a take-over may be a claim
   whose author records a *shorter* lease (or 0: "a host at 0") than the manifest it claimed
   over.  A (lease 2 s) holds the log; B (lease 0.5 s, or 0) claims it, and its own fence is
   right (2.5 s, for A's lease); but C (a third host, or B restarted: fences live in memory)
   takes over *B's claim* and fences for B's recorded 0.5 s (0.625 s; nothing at all for 0),
   links r2 and acknowledges it while A's lease, proven before B's claim, still vouches for a
   manifest without r2: a read through A misses an acknowledged record.  The docstring's
   "writers configured differently (a rolling change of the setting, a host at 0) stay safe"
   does not hold across two take-overs: a claim must record (or a taker must fence for) the
   longest lease that may still vouch for its records, not only its author's.
2. **A put that may have landed vouches for nothing while in flight, and for the old memory
   again once it failed ambiguously.**  ``remaining()`` is 0 only while the put is in flight.
   A manifest put whose answer is lost (``StoreUnavailable``) and whose manifest someone then
   builds on (B's claim over it) ends in ``ResolvedPreconditionFailed``: the put *did* land,
   readers of the store already see its record, yet the writer's memory is still the old
   manifest, authored, healthy (no recovery yet: the committer first awaits a load), and its
   lease proven earlier is still running.  A read in that window (``leased_manifest``)
   answers without the record another read already returned: reads are not monotonic.
3. **Read repair now waits (a yield, then a claim's fence) up to ``max_rebases`` times, while
   recovery holds the manifest it loaded first, and walks that one afterwards.**  Found by the
   simulator with every seed leased and 2-3 writers (the config is pinned below: the stock
   draw of seed 191 with ``lease_s`` 2.0 and three writers).  Writer w0.4's recovery loads the
   manifest (linking snapshot S), then ``_repair`` finds an orphan on a base it did not write:
   ``yielded()``, claim, which loses (another writer or the collector wrote the same tail
   meanwhile), ``lost_to`` yields 2.5 s again, and so on, six rounds: 15 virtual seconds in
   one recovery (also a liveness finding: a writer that yields to *every* same-tail manifest,
   a collector's floor edits included, loses every claim to whoever writes within its yield).
   Meanwhile a collector cut S away and deleted it after its grace (2 s).  Recovery then calls
   ``_foreign(reloaded[0], base)`` on the manifest it loaded 15 s earlier, whose walk reads S:
   ``CorruptFragment("snapshot ... is missing")``, which kills the committer: every append of
   the writer fails with a corruption error.  Before the change repair never waited, so the
   first load was seconds old at most; the collector's grace assumes no reader holds a
   manifest that long.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from verify.sim import run as sim_run
from verify.sim.config import RunConfig
from verify.sim.store import FaultRates
from verify.testkit.polling import wait_until
from wal3 import LocalStore, LogWriter
from wal3.errors import StoreUnavailable
from wal3.layout import load_manifest
from wal3.paths import MANIFEST_PATH
from wal3.store import GetResult

from .test_read_lease import ManualClock, _claimed, _opts, _settle


async def _stored_writer(store: LocalStore, prefix: str) -> str:
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    return loaded[0].writer


@pytest.mark.parametrize("claimer_lease", [0.5, 0.0])
async def test_a_take_over_of_a_short_lease_claim_still_outlasts_the_older_lease(
    tmp_path: Path, claimer_lease: float
) -> None:
    store = LocalStore(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/x", _opts(clock, "A", lease_s=2.0))
    await a.append(b"r1")  # A's lease on its manifest: 2 s from now
    b = await LogWriter.open(store, "logs/x", _opts(clock, "B", lease_s=claimer_lease))
    await b.claim()  # B's claim (fenced for A's 2 s itself), recording B's own lease
    assert await _stored_writer(store, "logs/x") == "B"
    c = await LogWriter.open(store, "logs/x", _opts(clock, "C", lease_s=0.5))
    acked = asyncio.create_task(c.append(b"r2"))

    # B's claim records the lease it fences for (A's), not only its own: C claims over it too.
    await _claimed(c, store, "logs/x", "C", 2)
    # Until r2 is acknowledged, and after: whenever it is, A's lease must not answer without it.
    for _ in range(40):  # 4 s of the manual clock, 0.1 s at a time: past every fence here
        clock.advance(0.1)
        await _settle()
        if acked.done():
            m = a.current_manifest()
            assert m is None or m.next_offset == 3, (
                f"A's lease answers up to {m.next_offset} at +{clock.monotonic() - 1000.0:.2f} "
                "s, but r2 (offset 2) was acknowledged"
            )
    r2 = await asyncio.wait_for(acked, 10)  # a bound on a hang, not a timing assert
    assert r2.offset == 2
    for w in (a, b, c):
        await w.close()


class _LostAnswer(LocalStore):
    """A local store whose next manifest put, once armed, lands and then loses its answer
    (``StoreUnavailable``) when ``answer`` is set; and whose next manifest load, once armed, is
    held until ``release`` is set."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.lose = False
        self.landed = asyncio.Event()
        self.answer = asyncio.Event()
        self.hold = False
        self.held = asyncio.Event()
        self.release = asyncio.Event()

    async def put(self, key: str, data: bytes, **kw: Any) -> str:
        etag = await super().put(key, data, **kw)
        if self.lose and key.endswith(MANIFEST_PATH):
            self.lose = False
            self.landed.set()
            await self.answer.wait()
            raise StoreUnavailable("the answer was lost on the way back")
        return etag

    async def get(self, key: str) -> GetResult:
        if self.hold and key.endswith(MANIFEST_PATH):
            self.hold = False
            self.held.set()
            await self.release.wait()
        return await super().get(key)


async def test_a_put_that_landed_and_was_built_on_is_not_unseen_by_the_lease(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    store = _LostAnswer(tmp_path / "store")
    raw = LocalStore(tmp_path / "store")
    a = await LogWriter.open(store, "logs/p", _opts(clock, "A"))
    await a.append(b"r1")
    assert a.current_manifest() is not None  # A's lease: 1 s from now
    store.lose = True
    t = asyncio.create_task(a.append(b"r2"))
    await store.landed.wait()  # r2's manifest is in the store; its answer is not back
    assert a.current_manifest() is None  # in flight: vouches for nothing (right)
    b = await _build_on_the_lost_put(store, raw, clock, "logs/p")
    await _no_lease_without_r2(store, clock, a, b, t)


async def _build_on_the_lost_put(
    store: _LostAnswer, raw: LocalStore, clock: ManualClock, prefix: str
) -> LogWriter:
    """A's manifest put of r2 landed, its answer held: B claims on top of it (a read of the
    store returns r2), then the answer is lost and A's reload after it is held.  B is returned."""
    b = await LogWriter.open(raw, prefix, _opts(clock, "B"))
    await b.claim()  # B builds on A's landed manifest (r2 included)
    seen = await load_manifest(raw, prefix)
    assert seen is not None and seen[0].next_offset == 3  # a read of the store returns r2
    store.hold = True  # the committer's reload after the failed put
    store.answer.set()  # the put's retry finds B's manifest: ResolvedPreconditionFailed
    await store.held.wait()
    return b


async def _no_lease_without_r2(
    store: _LostAnswer, clock: ManualClock, a: LogWriter, b: LogWriter, t: asyncio.Task[Any]
) -> None:
    """A read through A's lease now must not miss r2; then A recovers and r2 is answered."""
    m = await a.leased_manifest()
    try:
        assert m is None or m.next_offset == 3, (
            f"A's lease answers up to {m.next_offset} after a read of the store returned r2"
        )
    finally:
        store.release.set()

        async def recovered() -> bool:
            return a.manifest.next_offset == 3

        await wait_until(recovered, "A's recovery installed B's manifest")
        clock.advance(2.0)  # A's fence (it loaded B's manifest)
        await _settle()
        assert (await asyncio.wait_for(t, 10)).offset == 2  # linked: r2 is A's, acknowledged
        await a.close()
        await b.close()


# The stock draw of seed 191 (``verify/sim/config.py``), leased for 2 s with three writers.
_SEED_191_LEASED = RunConfig(
    seed=191,
    steps=102,
    quiet_from=68,
    writers=3,
    pipeline=1,
    batch_bytes=48,
    appends_per_step=8,
    keyed_p=0.3,
    pad=40,
    snapshot_fragment_threshold=3,
    snapshot_threshold=2,
    hook=True,
    hook_fail_p=0.2,
    gc=True,
    gc_via_writer=True,
    grace_s=2.0,
    window=16,
    delete_batch=64,
    rates=FaultRates(before=0.0, lost=0.0, sticky=0.0, conflict=0.0),
    writer_crash_p=0.0,
    gc_crash_p=0.1,
    seal_at=None,
    fork_p=0.0,
    tail_p=0.2,
    emergency_p=0.1,
    gc2=True,
    gc2_fresh=True,
    gc_stall_p=0.1,
    pin_w=0.0,
    lease_s=2.0,
    lease_mix=False,  # one lease for every writer, as when this was found
)


def test_a_long_read_repair_never_walks_a_manifest_older_than_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sim_run, "make_config", lambda seed: _SEED_191_LEASED)
    result = sim_run.run_seed(191)
    missing = [str(v) for v in result.violations if "is missing" in str(v)]
    assert not missing, missing[:2]
