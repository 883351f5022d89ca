"""The deterministic simulator: its store's fault semantics, replay, and the short form."""

from __future__ import annotations

import asyncio
import gc
import random
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from verify.sim import loop as simloop
from verify.sim import report
from verify.sim.model import Model
from verify.sim.report import run_range
from verify.sim.run import run_seed
from verify.sim.store import Actor, FaultRates, SimStore
from wal3.cursors import CursorStore, Witness
from wal3.errors import CursorConflict, ObjectNotFound, PreconditionFailed, StoreUnavailable
from wal3.manifest import Manifest

SHORT_FORM = (0, 300)  # the seeds `make test` runs (all six known bugs of 3c61663 show in them)


def _run(
    main: Callable[[SimStore, Actor], Awaitable[Any]], rates: FaultRates | None = None
) -> tuple[Any, list[str]]:
    """Run ``main(store, actor)`` on a virtual loop with a fresh simulated store."""
    trace: list[str] = []

    async def go(loop: simloop.SimLoop) -> Any:
        sim = SimStore(
            loop, random.Random(1), trace.append, rates=FaultRates() if rates is None else rates
        )
        actor = sim.actor("t")
        return await main(sim, actor)

    return simloop.run(go), trace


# ------------------------------------------------------------------------------ the loop


def test_virtual_time_jumps_without_sleeping() -> None:
    async def main(loop: simloop.SimLoop) -> tuple[float, int]:
        await asyncio.sleep(3600.0)
        return loop.time(), loop.iterations

    # An hour passes in a handful of loop iterations: the selector jumps to the timer instead of
    # polling (counted, not timed, so the check is the same on any machine).
    now, iterations = simloop.run(main)
    assert now == 3600.0
    assert iterations < 10, iterations


def test_to_thread_runs_inline() -> None:
    import threading

    async def main(loop: simloop.SimLoop) -> bool:
        ident = await asyncio.to_thread(threading.get_ident)
        return ident == threading.get_ident()

    assert simloop.run(main)


def test_a_loop_waiting_on_nothing_is_a_deadlock() -> None:
    async def main(loop: simloop.SimLoop) -> None:
        await loop.create_future()

    with pytest.raises(simloop.Deadlock):
        simloop.run(main)


# ----------------------------------------------------------------------------- the store


def test_conditional_puts() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        v = sim.view(actor)
        etag = await v.put("k", b"1", if_none_match="*")
        with pytest.raises(PreconditionFailed):
            await v.put("k", b"2", if_none_match="*")
        with pytest.raises(PreconditionFailed):
            await v.put("k", b"2", if_match="nope")
        await v.put("k", b"3", if_match=etag)
        with pytest.raises(PreconditionFailed):
            await v.put("missing", b"x", if_match=etag)
        return (await v.get("k")).data

    assert _run(main)[0] == b"3"


def test_list_is_in_key_order_across_pages() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        v = sim.view(actor)
        keys = [f"p/{i:03d}" for i in range(11)]
        for k in reversed(keys):
            await v.put(k, b"x")
        await v.put("q/other", b"x")
        return [m.key async for m in v.list("p/")], keys

    got, keys = _run(main)[0]
    assert got == keys


def test_failure_before_landing_leaves_nothing() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        with pytest.raises(StoreUnavailable):
            await sim.view(actor).put("k", b"x")
        return "k" in sim.objects

    assert _run(main, FaultRates(before=1.0))[0] is False


def test_ambiguous_failure_lands_the_write() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        with pytest.raises(StoreUnavailable):
            await sim.view(actor).put("k", b"x", if_none_match="*")
        return sim.objects["k"].data

    assert _run(main, FaultRates(lost=1.0))[0] == b"x"


def test_sticky_failures_repeat_on_one_key() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        v = sim.view(actor)
        failures = 0
        for _ in range(3):
            with pytest.raises(StoreUnavailable):
                await v.put("k", b"x")
            failures += 1
            sim.rates = FaultRates()  # only the streak itself fails from now on
        left = sim._sticky["k"]
        return failures, left, "k" in sim.objects

    (failures, left, landed), _ = _run(main, FaultRates(sticky=1.0))
    assert failures == 3 and not landed and left >= 0


def test_a_crashed_actor_never_hears_back() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        v = sim.view(actor)
        task = asyncio.ensure_future(v.put("k", b"x"))
        await asyncio.sleep(0)
        sim.crash(actor, "test")
        await asyncio.sleep(10.0)
        pending = not task.done()
        later = asyncio.ensure_future(v.get("k"))
        await asyncio.sleep(10.0)
        return pending, not later.done()

    (pending, later_pending), trace = _run(main)
    assert pending and later_pending
    assert any("CRASH" in line for line in trace)


def test_crash_chance_kills_at_an_operation() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        doomed = sim.actor("doomed", crash_p=1.0)
        task = asyncio.ensure_future(sim.view(doomed).put("k", b"x"))
        await asyncio.sleep(10.0)
        return task.done(), doomed.alive

    (done, alive), _ = _run(main, FaultRates())
    assert not done and not alive


def test_get_of_a_missing_key() -> None:
    async def main(sim: SimStore, actor: Actor) -> Any:
        with pytest.raises(ObjectNotFound):
            await sim.view(actor).get("nothing")
        return True

    assert _run(main)[0]


# ------------------------------------------------------------------------------- replays


@pytest.mark.parametrize("seed", [3, 12])
def test_a_seed_replays_identically(seed: int) -> None:
    first, second = run_seed(seed), run_seed(seed)
    assert first.ops > 0 and first.trace_hash == second.trace_hash
    assert (first.steps, dict(first.faults)) == (second.steps, dict(second.faults))


def test_different_seeds_differ() -> None:
    assert run_seed(3).trace_hash != run_seed(4).trace_hash


def test_a_cursor_advanced_backwards_is_a_violation(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutation run's hole in wal3/cursors.py: ``advance`` that saves whatever it was given
    moves the progress cursor back, which only the ``cursor-back`` check sees (seed 0 shows it;
    an unconditional ``save`` shows at seed 6)."""

    async def advance_blindly(self: CursorStore, name: str, offset: int, **_: Any) -> Witness:
        for _attempt in range(16):
            current = await self.load(name)
            try:
                if current is None:
                    return await self.init(name, offset)
                return await self.save(name, offset, current)  # no "already past it" check
            except CursorConflict:
                continue
        raise CursorConflict(name)

    monkeypatch.setattr(CursorStore, "advance", advance_blindly)
    r = run_seed(0)
    assert "cursor-back" in {v.check for v in r.violations}, r.trace[-20:]


def test_a_key_answered_with_another_timestamp_is_a_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Keys learned from footers answered with timestamp 0: the records are right, so only the
    ``acked`` check's timestamp catches it (seed 2; 22 of seeds 0:300, where the simulator
    before the check passed all of 0:60; seed 4 since seeds draw read leases, which changed
    seed 2's run)."""
    from wal3 import fragment, idempotency

    def keys_without_their_time(data: bytes) -> tuple[dict[str, fragment.KeyEntry], int]:
        return fragment.read_keys(data)[0], 0

    monkeypatch.setattr(idempotency, "read_keys", keys_without_their_time)
    r = run_seed(4)
    assert any(v.check == "acked" and "timestamp" in v.detail for v in r.violations), r.trace[-20:]


def test_a_writer_vouching_while_its_put_is_in_flight_is_a_monotonic_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The read lease as it was before the ``monotonic`` check: the writer's memory answered
    while its own manifest put had landed, its answer not back (seeds 11, 127, 138 of 0:300;
    the seeds without read leases cannot show it; since writers may draw their own leases,
    ``lease_mix``, 138 alone; since the busy collector also edits through the faulty phase
    (``busy_gc_s``), 11 alone; since a rival's claim of a collector's edit is a claim too
    (5b4145b), 352, 367, 439 and 483 of 0:500; since the quiet phase's edit-only writer
    (``edit_only``), 127, 439, 705 and 882 of 0:1000)."""
    from wal3 import lease

    answered = lease.Lease.remaining

    def remaining_ignoring_puts(self: lease.Lease) -> float:
        held, self._puts_in_flight = self._puts_in_flight, 0
        try:
            return answered(self)
        finally:
            self._puts_in_flight = held

    async def settled_at_once(self: lease.Lease) -> None:
        return None

    monkeypatch.setattr(lease.Lease, "remaining", remaining_ignoring_puts)
    monkeypatch.setattr(lease.Lease, "settled", settled_at_once)
    r = run_seed(127)
    assert "monotonic" in {v.check for v in r.violations}, r.trace[-20:]


def test_writers_that_never_yield_to_a_rivals_claim_are_a_liveness_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Without ``Lease.lost_to`` two writers claim the log back from each other forever and link
    nothing (seeds 20 and 109 of the leased seeds with several writers in 0:200; 109 and 136
    of 0:300 since writers may draw their own leases; 109, 339 and 489 of 0:600 since a claim
    lost to an edit that links nothing, a rival's claim included, is a free round
    ``max_append_attempts`` times in a row)."""
    from wal3 import lease

    monkeypatch.setattr(lease.Lease, "lost_to", lambda self, current, etag, base: None)
    r = run_seed(109)
    assert "liveness" in {v.check for v in r.violations}, r.trace[-20:]


def test_a_take_over_fencing_for_its_own_lease_is_a_stale_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Writers configured differently (``lease_mix``: each draws 0, a quarter of the longest
    lease, or the longest when it opens).  A take-over that fences for its own setting instead
    of the lease its base records (issue 21's finding, fixed in d65e5e5) acknowledges a record
    while the longer lease still answers without it: seed 255 of 0:300 (its ``lease-read`` and
    ``monotonic`` checks); since a rival's claim of a collector's edit is a claim too (5b4145b),
    865, the first of 0:865.  With one lease for every writer the mutant is equivalent, so the
    simulator before ``lease_mix`` could not show it."""
    from wal3 import lease

    def own_setting(self: lease.Lease, manifest: object) -> float:
        return self._opts.lease.read_lease_s

    monkeypatch.setattr(lease.Lease, "_base_lease_s", own_setting)
    r = run_seed(865)
    assert {"lease-read", "monotonic"} <= {v.check for v in r.violations}, r.trace[-20:]


def test_edits_of_a_busy_collector_taken_for_take_overs_are_a_liveness_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine before ``lease_holder`` (741b3dd): every rebase onto a collector's edit of the
    writer's own manifest was a claim and a whole fence, so under a collector editing more often
    than the fence (``busy_gc_s``) an append begun after the faults stopped waited far past
    ``QUIET_APPEND_S``.  At 741b3dd's engine 10 of seeds 0:300 fail so (1, 6, 66, 101, 106,
    151, 205, 209, 267, 297), every one with a busy collector; the mutant here (``holds``
    always False, that engine's rule) fails 12 of them (6, 65, 84, 101, 106, 138, 141, 209,
    251, 260, 279, 297)."""
    from wal3 import lease

    monkeypatch.setattr(lease.Lease, "holds", lambda self, manifest: False)
    r = run_seed(6)
    assert any(
        v.check == "liveness" and "after the faults stopped" in v.detail for v in r.violations
    ), r.trace[-20:]


def test_an_edit_under_the_editors_own_holder_is_a_liveness_violation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The engine before the adversarial review of b755610 was fixed: a writer's edit of a
    manifest another writer holds went out under the editor's holder token, so the holder took
    it for a rival's claim, yielded, claimed back and fenced again.  The quiet phase's
    edit-only writer (``edit_only``) and its check (a writer that holds the log is never
    fenced again) catch it: b755610's engine fails 14 of the 20 seeds with an edit-only writer
    and a lease in 0:150, the first 2; the fix with the editor's read repair still linking the
    holder's orphan fails 37 of the 131 such seeds in 0:1000 (first 2), and without the rule
    on a base that records no lease 13 (first 47); the fix none.  The mutant here (the edit
    under our holder, authorship not taken) fails 47, 52, 109 and 127 first."""
    from wal3 import lease

    def under_our_holder(self: lease.Lease, new: Manifest, base: Manifest) -> Manifest:
        return self.stamped(new)

    monkeypatch.setattr(lease.Lease, "as_collector", under_our_holder)
    r = run_seed(47)
    assert any(v.check == "liveness" and "fenced again" in v.detail for v in r.violations), r.trace[
        -20:
    ]


def test_a_finished_seed_leaves_no_world_behind() -> None:
    """The collectors' per-store memory held the virtual clock, hence the whole world: a long
    run's workers grew by ~5,000 objects a seed and slowed about tenfold."""
    run_seed(3)
    gc.collect()
    assert not [o for o in gc.get_objects() if isinstance(o, Model)]


# 150 s on an idle 2-core CI machine; over the suite's 300 s default beside other load.
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_short_form_finds_no_violation() -> None:
    # Stops at the first failing chunk: a mutation run (verify/mutation.py) pays the whole range
    # only for the mutants that survive it.
    summary = run_range(*SHORT_FORM, jobs=2, progress=False, stop_on_failure=True)
    assert summary.ok, summary.markdown()
    assert summary.seeds == SHORT_FORM[1] - SHORT_FORM[0]


def test_a_seed_replays_identically_in_another_process() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    # Another interpreter with another string-hash seed: nothing may depend on set order.
    env = dict(os.environ, PYTHONHASHSEED="7")
    code = "from verify.sim.run import run_seed; print(run_seed(3).trace_hash)"
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=120,
    )
    assert out.stdout.strip() == run_seed(3).trace_hash


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 2 seeds (25 in a real run): the ledger's logic with a fraction of the seeds."""
    monkeypatch.setattr(report, "CHUNK", 2)


@pytest.mark.usefixtures("small_chunks")
def test_a_ledger_resumes_an_interrupted_range_with_the_same_totals(tmp_path: Any) -> None:
    import json

    whole = run_range(0, 4, jobs=1, progress=False)
    ledger = tmp_path / "ledger.jsonl"
    run_range(0, 4, jobs=1, progress=False, ledger=ledger)
    lines = ledger.read_text().splitlines()
    assert [json.loads(x)["chunk"] for x in lines[1:]] == [0, 2]
    ledger.write_text("\n".join(lines[:2]) + "\n")  # killed after its first chunk
    resumed = run_range(0, 4, jobs=1, progress=False, ledger=ledger)
    assert (resumed.seeds, resumed.steps, resumed.ops, resumed.faults, resumed.stats) == (
        whole.seeds,
        whole.steps,
        whole.ops,
        whole.faults,
        whole.stats,
    )
    assert resumed.sittings == 2
    chunks = [json.loads(x).get("chunk") for x in ledger.read_text().splitlines()[1:]]
    assert [c for c in chunks if c is not None] == [0, 2]  # chunk 0 was not run again


@pytest.mark.usefixtures("small_chunks")
def test_a_ledger_of_another_range_is_refused(tmp_path: Any) -> None:
    ledger = tmp_path / "ledger.jsonl"
    run_range(0, 2, jobs=1, progress=False, ledger=ledger)
    with pytest.raises(SystemExit, match="ledger of --seeds 0:2"):
        run_range(0, 4, jobs=1, progress=False, ledger=ledger)


@pytest.mark.usefixtures("small_chunks")
def test_a_ledger_resumes_at_another_commit_only_over_the_same_trees(tmp_path: Any) -> None:
    """A seed depends only on the engine's and the simulator's trees: a long run resumes at a
    later commit that left them alone (and is reported at the commit it began at), never over
    other trees."""
    import json

    ledger = tmp_path / "ledger.jsonl"
    run_range(0, 2, jobs=1, progress=False, ledger=ledger)
    lines = ledger.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["trees"] and "," in head["trees"]
    ledger.write_text("\n".join([json.dumps({**head, "commit": "0123456789ab"}), *lines[1:]]))
    resumed = run_range(0, 2, jobs=1, progress=False, ledger=ledger)
    assert resumed.commit == "0123456789ab" and resumed.seeds == 2
    ledger.write_text("\n".join([json.dumps({**head, "trees": "feedfacefeed,0"}), *lines[1:]]))
    with pytest.raises(SystemExit, match="over trees feedfacefeed,0"):
        run_range(0, 2, jobs=1, progress=False, ledger=ledger)


@pytest.mark.parametrize("seed", [27714, 40459, 44594])
def test_the_long_forms_contention_seeds_pass(seed: int) -> None:
    """Seeds the long form found failing at 7d06e69 (``contention``): a crashed writer's orphans,
    linked by the survivor's repair a few at a time under hook failures, ran the survivor's
    appends out of attempts, and they were answered ``LogContention`` ("another writer kept
    appending") though no other writer had linked anything since it opened.  Now such an append
    gives up with ``StoreUnavailable`` unless a writer was met."""
    r = run_seed(seed)
    assert not r.violations, [f"[{v.check}] {v.detail}" for v in r.violations[:5]]


@pytest.mark.parametrize("seed", [50465, 57203])
def test_the_long_forms_liveness_seeds_pass(seed: int) -> None:
    """Seeds the long form found failing at 7d06e69 (``liveness``): a crashed writer's orphan
    fitted the tail, so the survivor's repair had to claim the log and wait out its fence before
    linking it; a collector's edit landed during the wait three times, each lost claim cost the
    survivor's kept batch an attempt, and its appends failed ``StoreUnavailable`` after the
    faults had stopped.  Now a claim lost to an edit that linked nothing is a rebase (free,
    ``max_rebases`` times in a row)."""
    r = run_seed(seed)
    assert not r.violations, [f"[{v.check}] {v.detail}" for v in r.violations[:5]]
