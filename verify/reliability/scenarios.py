"""The seeded fault scenarios of the reliability verifier.

Every scenario is ``async def scenario(seed, quick, workdir, opts) -> Result``.  All random choices
(the fault schedule, the crash points, the writers' plans, collection ids) come from
``random.Random`` seeded with the scenario's seed, so a failing seed is rerun with
``python -m verify.reliability --scenario NAME --seed S``.  Timing (which request a fault lands on
among concurrent ones) is not reproducible bit for bit; the schedule is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import httpx

from dirtylog import CURSOR_NAME as ROLLUP_CURSOR
from verify import keys
from verify.testkit import RedisServer, wait_until
from wal3 import FaultRule, FaultyStore, LocalStore, paths
from wal3.errors import GarbageRejected
from wal3.faulty import FaultKind
from wal3.gc import Garbage

from .core import (
    Collection,
    Load,
    Result,
    Run,
    Workload,
    append,
    audit,
    dirty_coverage,
    drain_readers,
    finish,
    log_states,
    make_collections,
    read_log,
    run_with,
    service_call,
)
from .infra import (
    ROOT,
    SERVICE_KEY,
    InProcessHost,
    ProcHost,
    compacted_objects,
)


@dataclass
class Options:
    """Knobs of the long form that are not per seed."""

    soak_seconds: float = 600.0
    soak_logs: int = 1000


def workload(quick: bool, **over: Any) -> Workload:
    if quick:
        wl = Workload(
            collections=6,
            writers=6,
            appends_per_writer=30,
            max_batch=4,
            mean_interval_s=0.01,
            wait_ms=300,
            gc_interval_s=0.15,
            rollup_interval_s=0.4,
        )
    else:
        wl = Workload(
            collections=16,
            writers=10,
            appends_per_writer=80,
            max_batch=6,
            mean_interval_s=0.01,
            wait_ms=500,
            gc_interval_s=0.15,
            rollup_interval_s=0.5,
        )
    for k, v in over.items():
        setattr(wl, k, v)
    return wl


# --------------------------------------------------------------------------- gated rules


@dataclass(eq=False)
class GatedRule(FaultRule):
    """A FaultRule that only matches while ``gate(op, key)`` holds (a phase of GC or roll-up)."""

    gate: Callable[[str, str], bool] | None = None

    def matches(self, op: str, key: str, *, conditional: bool) -> bool:
        return super().matches(op, key, conditional=conditional) and (
            self.gate is None or self.gate(op, key)
        )


_GARBAGE = keys.server_log(keys.GARBAGE)
_CURSOR = keys.server_log(keys.cursor(ROLLUP_CURSOR), dirty_only=True)


class PhaseTracker:
    """Follows GC and roll-up phases per log from the requests that succeed (a latch observer).

    GC: ``gc/GARBAGE`` holds a plan (phase 1 done), an applied plan (phase 2 done) or ``{}``
    (reset, phase 3 done).  Roll-up: the ``stable_prefix`` cursor was loaded (a window is open)
    or moved (the window is consumed).
    """

    def __init__(self) -> None:
        self.gc: dict[str, str] = {}
        self.rollup: dict[str, str] = {}
        self.run: Run | None = None

    @property
    def rollups_in_flight(self) -> int:
        """Roll-up requests of the harness now in flight (the gate of the roll-up crashes)."""
        return self.run.rollups_in_flight if self.run is not None else 0

    def observe(self, op: str, key: str, data: bytes | None) -> None:
        m = _GARBAGE.match(key)
        if m is not None and data is not None and op in ("get", "put"):
            try:
                g = Garbage.from_bytes(data)  # idle is Rust's Garbage::empty() (or our old {})
            except GarbageRejected:
                g = None
            self.gc[m.group(1)] = (
                "reset" if g is None else "applied" if g.applied_us is not None else "plan"
            )
            return
        m = _CURSOR.match(key)
        if m is not None:
            if op == "get":
                self.rollup[m.group(1)] = "loaded"
            elif op == "put":
                self.rollup[m.group(1)] = "moved"

    def gc_state(self, key: str) -> str | None:
        return self.gc.get(keys.log_of(key))


# -------------------------------------------------------------------- in-process scenarios


class StoreRates(TypedDict, total=False):
    """FaultyStore's background faults (its keyword arguments)."""

    latency_s: float
    jitter_s: float
    error_rate: float
    lost_response_rate: float
    precondition_storm_rate: float


@dataclass
class StorePlan:
    """The fault schedule of one in-process scenario."""

    faulty: StoreRates = field(default_factory=lambda: StoreRates())  # background rates
    rules: list[FaultRule] = field(default_factory=list)  # armed from the start
    crash: Callable[[random.Random, PhaseTracker, int], FaultRule] | None = None
    crashes: int = 0  # crash rules armed one after another (after each restart)
    settings: dict[str, Any] = field(default_factory=dict)
    workload: dict[str, Any] = field(default_factory=dict)


BASE_SETTINGS: dict[str, Any] = {
    "gc_grace_s": 0.0,
    "snapshot_fragment_threshold": 4,
    "snapshot_threshold": 2,
    "batch_interval_ms": 2.0,
    # A host crashed mid-creation blocks that log until its claim expires (2 minutes by the
    # default with no grace): every store operation here takes effect within a second or two.
    "claim_ttl_s": 10.0,
}


async def run_store_scenario(
    name: str, seed: int, quick: bool, workdir: Path, plan: StorePlan
) -> Result:
    """Writers and readers against one in-process host over a seeded FaultyStore."""
    started = time.monotonic()
    rng = random.Random(f"{name}:crash:{seed}")
    store_root = workdir / "store"
    # No fsync: the crashes emulated here are process deaths, which the page cache survives.
    faulty = FaultyStore(LocalStore(store_root, fsync=False), seed=seed, **plan.faulty)
    for rule in plan.rules:
        faulty.add_rule(rule)
    tracker = PhaseTracker()
    settings = dict(BASE_SETTINGS)
    settings.update(plan.settings)
    host = InProcessHost(faulty, settings, observers=[tracker.observe])
    await host.start()
    wl = workload(quick, **plan.workload)
    run = Run(name, seed, make_collections(seed, wl.collections), lambda: [host.url], wl)
    tracker.run = run
    result = Result(name, seed)
    crash_rules: list[FaultRule] = []

    async def supervise(load: Load) -> None:
        """Arm the crash points one by one; restart the host each time one fires."""
        armed = 0
        if plan.crash is not None and plan.crashes > 0:
            crash_rules.append(faulty.add_rule(plan.crash(rng, tracker, armed)))
            armed += 1
        stop = asyncio.create_task(run.stop.wait())
        try:
            while not run.stop.is_set():
                latch = host.latch
                assert latch is not None
                dead = asyncio.create_task(latch.crashed.wait())
                await asyncio.wait({dead, stop}, return_when=asyncio.FIRST_COMPLETED)
                dead.cancel()
                if not host.crashed:
                    break
                run.events["crash_restart"] += 1
                await host.restart()
                if plan.crash is not None and armed < plan.crashes:
                    crash_rules.append(faulty.add_rule(plan.crash(rng, tracker, armed)))
                    armed += 1
        finally:
            stop.cancel()

    phases: dict[str, float] = {}
    result.notes["phase_seconds"] = phases
    try:
        t = time.monotonic()
        load = await run_with(run, supervise, 600 if quick else 1800)
        phases["load"] = round(time.monotonic() - t, 2)
        faulty.disable()
        if host.crashed:  # a crash in the last moments: restart before the audit
            run.events["crash_restart"] += 1
            await host.restart()
        t = time.monotonic()
        await drain_readers(load)
        phases["drain"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        await audit(run, result, store_root)
        phases["audit"] = round(time.monotonic() - t, 2)
    except Exception as e:
        result.error = repr(e)
    finally:
        with contextlib.suppress(Exception):
            await host.stop()
        await run.close()
    stats = faulty.stats()
    result.faults = faulty.faults_injected
    result.fault_kinds = dict(stats["faults"])
    result.notes["store_requests"] = stats["requests_total"]
    result.notes["restarts"] = host.restarts
    result.notes["crash_points"] = [
        f"{r.kind} {r.ops} {r.key_regex} after={r.after} fired={r.fired}" for r in crash_rules
    ]
    if plan.crashes and not any(r.fired for r in crash_rules):
        result.notes["warning"] = "no crash point was reached"
    return finish(run, result, started)


# ---- the schedules


def plan_latency(seed: int, quick: bool) -> StorePlan:
    rng = random.Random(f"latency:{seed}")
    spike = FaultRule(
        "latency", probability=rng.uniform(0.01, 0.04), latency_s=rng.uniform(0.3, 1.5)
    )
    long_spike = FaultRule(
        "latency",
        ops={"put"},
        key_regex=keys.in_any_log(keys.MANIFEST),
        probability=rng.uniform(0.002, 0.01),
        latency_s=rng.uniform(2.5, 4.0),
    )
    return StorePlan(
        faulty={"latency_s": rng.uniform(0.0, 0.003), "jitter_s": rng.uniform(0.002, 0.02)},
        rules=[spike, long_spike],
        # Client timeouts shorter than the longest spikes: retries race the original
        # request; a small per-log buffer turns slow commits into 429s.
        settings={"max_log_outstanding_bytes": rng.choice((4096, 16384, 1 << 20))},
        workload={"request_timeout_s": 2.0},
    )


def plan_errors(seed: int, quick: bool) -> StorePlan:
    rng = random.Random(f"errors:{seed}")
    burst = FaultRule("error", after=rng.randint(20, 200), times=rng.randint(10, 60))
    return StorePlan(faulty={"error_rate": rng.uniform(0.01, 0.06)}, rules=[burst])


def plan_storms(seed: int, quick: bool) -> StorePlan:
    rng = random.Random(f"storms:{seed}")
    rules = [
        FaultRule(
            "precondition",
            ops={"put"},
            key_regex=keys.in_any_log(keys.MANIFEST),
            after=rng.randint(5, 80),
            times=rng.randint(5, 40),
        ),
        FaultRule("precondition", ops={"put", "copy"}, probability=rng.uniform(0.02, 0.1)),
    ]
    return StorePlan(faulty={"precondition_storm_rate": rng.uniform(0.02, 0.1)}, rules=rules)


def plan_lost(seed: int, quick: bool) -> StorePlan:
    rng = random.Random(f"lost:{seed}")
    rules = [
        FaultRule(
            "lost_response",
            ops={"put"},
            key_regex=keys.in_any_log(keys.MANIFEST),
            probability=rng.uniform(0.02, 0.1),
        ),
        FaultRule(
            "lost_response",
            ops={"put"},
            key_regex=keys.in_any_log(keys.FRAGMENT),
            probability=rng.uniform(0.02, 0.1),
        ),
        FaultRule(
            "lost_response",
            ops={"put", "delete"},
            key_regex=r"/(gc|cursor)/",
            probability=rng.uniform(0.02, 0.2),
        ),
    ]
    return StorePlan(faulty={"lost_response_rate": rng.uniform(0.005, 0.03)}, rules=rules)


def plan_hook_failures(seed: int, quick: bool) -> StorePlan:
    """The fragment hook (this host's dirty-log append) fails: sometimes, and in bursts long
    enough to outlast the writer's retries, while GC, pins and a seal run alongside."""
    rng = random.Random(f"hook:{seed}")
    dirty_puts = keys.in_dirty_log(keys.either(keys.FRAGMENT, keys.MANIFEST))
    rules = [
        FaultRule("error", ops={"put"}, key_regex=dirty_puts, probability=rng.uniform(0.05, 0.2)),
        FaultRule(
            "error",
            ops={"put"},
            key_regex=dirty_puts,
            after=rng.randint(10, 60),
            times=rng.randint(8, 30),
        ),
        FaultRule(
            "lost_response", ops={"put"}, key_regex=dirty_puts, probability=rng.uniform(0.02, 0.1)
        ),
    ]
    return StorePlan(rules=rules, workload={"pin_interval_s": 0.2, "seal": 1})


def plan_pins_and_seal(seed: int, quick: bool) -> StorePlan:
    """Readers pin, move back and drop cursors while compaction and GC run hard, a collection is
    sealed mid-run, and 1-3% of requests fail."""
    rng = random.Random(f"pins:{seed}")
    return StorePlan(
        faulty={"error_rate": rng.uniform(0.01, 0.03)},
        workload={"pin_interval_s": 0.05, "seal": 2, "gc_interval_s": 0.05},
    )


_CRASHES: tuple[FaultKind, ...] = ("crash_before", "crash_after")


def _crash_frag_manifest(rng: random.Random, _t: PhaseTracker, i: int) -> FaultRule:
    points: list[tuple[FaultKind, str]] = [
        # A fragment landed, its manifest was never written.
        ("crash_after", keys.in_collection_log(keys.FRAGMENT)),
        ("crash_after", keys.in_any_log(keys.FRAGMENT)),  # ... any log, the dirty log included
        # Fragment(s) up, the manifest not.
        ("crash_before", keys.in_collection_log(keys.MANIFEST)),
        # The manifest landed, its answer was never seen.
        ("crash_after", keys.in_collection_log(keys.MANIFEST)),
    ]
    kind, regex = rng.choice(points)
    return FaultRule(kind, ops={"put"}, key_regex=regex, after=rng.randint(3, 40), times=1)


def plan_crash_fragment_manifest(seed: int, quick: bool) -> StorePlan:
    return StorePlan(crash=_crash_frag_manifest, crashes=2 if quick else 4)


def _crash_snapshot(rng: random.Random, _t: PhaseTracker, i: int) -> FaultRule:
    return FaultRule(
        rng.choice(_CRASHES),
        ops={"put"},
        key_regex=keys.in_any_log(keys.SNAPSHOT),
        after=rng.randint(0, 4),
        times=1,
    )


def plan_crash_snapshot(seed: int, quick: bool) -> StorePlan:
    rng = random.Random(f"snapshot:{seed}")
    return StorePlan(
        crash=_crash_snapshot,
        crashes=2 if quick else 4,
        settings={
            "snapshot_fragment_threshold": rng.randint(2, 5),
            "snapshot_threshold": rng.randint(2, 3),
        },
    )


def _gc_crash(phase: str) -> Callable[[random.Random, PhaseTracker, int], FaultRule]:
    logs_garbage = keys.in_collection_log(keys.GARBAGE)

    def make(rng: random.Random, t: PhaseTracker, i: int) -> FaultRule:
        kind = rng.choice(_CRASHES)
        after = rng.randint(0, 2)
        if phase == "plan":  # phase 1: writing the plan to gc/GARBAGE
            return GatedRule(
                kind,
                ops={"put"},
                key_regex=logs_garbage,
                after=after,
                times=1,
                gate=lambda op, key: t.gc_state(key) in (None, "reset"),
            )
        if phase == "apply":  # phase 2: the manifest write that applies it, or its marker
            if rng.random() < 0.6:
                return GatedRule(
                    kind,
                    ops={"put"},
                    key_regex=keys.in_collection_log(keys.MANIFEST),
                    after=0,
                    times=1,
                    gate=lambda op, key: t.gc_state(key) == "plan",
                )
            return GatedRule(
                kind,
                ops={"put"},
                key_regex=logs_garbage,
                after=after,
                times=1,
                gate=lambda op, key: t.gc_state(key) == "plan",
            )
        if phase == "delete":  # phase 3: deleting fragments and snapshots
            return GatedRule(
                kind,
                ops={"delete"},
                key_regex=keys.in_collection_log(keys.either(keys.FRAGMENT, keys.SNAPSHOT)),
                after=after,
                times=1,
                gate=lambda op, key: t.gc_state(key) == "applied",
            )
        assert phase == "reset"  # phase 3 done: resetting gc/GARBAGE
        return GatedRule(
            kind,
            ops={"put"},
            key_regex=logs_garbage,
            after=after,
            times=1,
            gate=lambda op, key: t.gc_state(key) == "applied",
        )

    return make


def plan_crash_gc(phase: str) -> Callable[[int, bool], StorePlan]:
    def plan(seed: int, quick: bool) -> StorePlan:
        rng = random.Random(f"gc-{phase}:{seed}")
        return StorePlan(
            crash=_gc_crash(phase),
            crashes=2 if quick else 4,
            settings={"snapshot_fragment_threshold": rng.randint(2, 6), "snapshot_threshold": 2},
            workload={"gc_interval_s": 0.05},
        )

    return plan


def _rollup_crash(step: str) -> Callable[[random.Random, PhaseTracker, int], FaultRule]:
    def make(rng: random.Random, t: PhaseTracker, i: int) -> FaultRule:
        kind = rng.choice(_CRASHES)

        def rolling(op: str, key: str) -> bool:
            return t.rollups_in_flight > 0

        if step == "read":  # reading the window [cursor, end)
            return GatedRule(
                "crash_before",
                ops={"get"},
                key_regex=keys.in_dirty_log(keys.FRAGMENT),
                after=rng.randint(0, 2),
                times=1,
                gate=rolling,
            )
        if step == "append":  # re-appending the still-dirty collections
            return GatedRule(
                kind,
                ops={"put"},
                key_regex=keys.in_dirty_log(keys.either(keys.FRAGMENT, keys.MANIFEST)),
                after=rng.randint(0, 1),
                times=1,
                gate=lambda op, key: (
                    rolling(op, key) and t.rollup.get(keys.log_of(key)) == "loaded"
                ),
            )
        if step == "cursor":  # moving the stable_prefix cursor past the window
            return GatedRule(
                kind,
                ops={"put"},
                key_regex=keys.cursor(ROLLUP_CURSOR),
                after=rng.randint(0, 2),
                times=1,
            )
        assert step == "gc"  # the dirty log's own garbage collection
        return GatedRule(
            kind,
            ops={"put", "delete"},
            key_regex=keys.in_dirty_log(keys.either(keys.GARBAGE, keys.FRAGMENT, keys.SNAPSHOT)),
            after=rng.randint(0, 3),
            times=1,
            gate=lambda op, key: op == "put" or t.gc_state(key) == "applied",
        )

    return make


def plan_crash_rollup(step: str) -> Callable[[int, bool], StorePlan]:
    def plan(seed: int, quick: bool) -> StorePlan:
        return StorePlan(
            crash=_rollup_crash(step),
            crashes=2 if quick else 4,
            settings={"snapshot_fragment_threshold": 3},
            workload={"rollup_interval_s": 0.1},
        )

    return plan


# ---------------------------------------------------------------------- process scenarios


PROC_ENV = {
    "LOGHOST_GC_GRACE_S": "0",
    "LOGHOST_SNAPSHOT_FRAGMENT_THRESHOLD": "4",
    "LOGHOST_SNAPSHOT_THRESHOLD": "2",
    "LOGHOST_CLAIM_TTL_S": "10",
}


async def _ack_fraction(run: Run, fraction: float, timeout_s: float) -> bool:
    """Wait (polling) until ``fraction`` of the planned appends are acknowledged."""
    wl = run.workload
    total = wl.writers * (wl.appends_per_writer or 0)
    with contextlib.suppress(TimeoutError):
        await wait_until(
            lambda: run.stop.is_set() or run.acked_appends >= fraction * total,
            f"{fraction:.0%} of the appends acknowledged",
            timeout_s,
            0.01,
        )
    return not run.stop.is_set()


async def scenario_kill9(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
    """kill -9 a real log host process under load and restart it, several times."""
    started = time.monotonic()
    rng = random.Random(f"kill9:{seed}")
    store = workdir / "store"
    host = ProcHost(store, workdir / "logs", "p0", env=dict(PROC_ENV))
    await asyncio.to_thread(host.start)
    wl = workload(quick, appends_per_writer=60 if quick else 200)
    run = Run("kill9", seed, make_collections(seed, wl.collections), lambda: [host.url], wl)
    result = Result("kill9", seed)
    kills = sorted(rng.uniform(0.1, 0.9) for _ in range(2 if quick else 4))
    result.notes["kill_at_fraction_acked"] = [round(k, 3) for k in kills]

    async def chaos(load: Load) -> None:
        for frac in kills:
            if not await _ack_fraction(run, frac, 300):
                return
            await asyncio.to_thread(host.kill9)
            run.events["kill9"] += 1
            await asyncio.to_thread(host.start)

    try:
        load = await run_with(run, chaos, 600 if quick else 1800)
        stuck = await host.responsive()
        if stuck is not None:
            raise RuntimeError(stuck)
        await drain_readers(load)
        await audit(run, result, store)
    except Exception as e:
        result.error = repr(e)
    finally:
        await asyncio.to_thread(host.terminate)
        await run.close()
    result.faults = run.events["kill9"]
    result.fault_kinds = {"kill9": run.events["kill9"]}
    return finish(run, result, started)


async def _two_hosts(
    name: str, seed: int, quick: bool, workdir: Path, redis: RedisServer | None
) -> Result:
    started = time.monotonic()
    rng = random.Random(f"{name}:{seed}")
    store = workdir / "store"
    env = dict(PROC_ENV)
    if redis is not None:
        env.update({"LOGHOST_REDIS_URL": redis.url, "LOGHOST_LEADER_TTL_MS": "1000"})
    else:
        # Two writers racing on one log is what this scenario verifies (the manifest's fencing);
        # membership routing would send every log to one host and leave nothing to race.
        env["LOGHOST_ROUTING"] = "none"
    hosts = [ProcHost(store, workdir / "logs", f"p{i}", env=env) for i in range(2)]
    for h in hosts:
        await asyncio.to_thread(h.start)
    # Few collections, so both hosts write the same logs all the time.
    wl = workload(
        quick,
        collections=3 if quick else 6,
        appends_per_writer=50 if quick else 200,
        mean_interval_s=0.005,
    )
    urls = [h.url for h in hosts]
    current = {"hosts": urls}
    run = Run(name, seed, make_collections(seed, wl.collections), lambda: current["hosts"], wl)
    result = Result(name, seed)

    async def chaos(load: Load) -> None:
        if redis is None:
            return
        cycles = 1 if quick else 2
        points = sorted(rng.uniform(0.1, 0.9) for _ in range(2 * cycles))
        for i in range(cycles):
            if not await _ack_fraction(run, points[2 * i], 300):
                return
            await asyncio.to_thread(redis.stop)
            run.events["redis_stop"] += 1
            if not await _ack_fraction(run, points[2 * i + 1], 300):
                await asyncio.to_thread(redis.start)
                return
            await asyncio.to_thread(redis.start)
            run.events["redis_start"] += 1

    try:
        load = await run_with(run, chaos, 600 if quick else 1800)
        for h in hosts:
            stuck = await h.responsive()
            if stuck is not None:
                raise RuntimeError(stuck)
        if redis is not None:
            # After the restarts, through every host (not a fresh one): none may answer from a
            # stale manifest of a log another host wrote (issue 21).
            await _acked_visible_everywhere(run, urls, within_s=1.0 / 3)
        metrics = [await _metrics(run, u) for u in urls]
        result.notes["contention_409"] = sum(m.get("loghost_contention_total", 0) for m in metrics)
        result.notes["redirects_307"] = sum(
            m.get("loghost_not_leader_redirects_total", 0) for m in metrics
        )
        result.notes["leader_hint_failures"] = sum(
            m.get("loghost_leader_hint_failures_total", 0) for m in metrics
        )
        # Audit through one freshly started host (a second host's in-memory view of a log it
        # no longer writes is legitimately behind); both dirty logs are checked.
        for h in hosts:
            await asyncio.to_thread(h.terminate)
            await asyncio.to_thread(h.start)
        current["hosts"] = [urls[0]]
        await drain_readers(load)
        await audit(run, result, store, read_hosts=[urls[0]], check_dirty=False)
        await dirty_coverage(run, urls, await log_states(run))
    except Exception as e:
        result.error = repr(e)
    finally:
        for h in hosts:
            await asyncio.to_thread(h.terminate)
        await run.close()
    contention = int(result.notes.get("contention_409", 0))
    result.fault_kinds = {"concurrent_writer_409": contention}
    if redis is not None:
        result.fault_kinds.update({"redis_stop": run.events["redis_stop"]})
    result.faults = sum(result.fault_kinds.values())
    return finish(run, result, started)


async def _acked_visible_everywhere(run: Run, urls: list[str], within_s: float) -> None:
    """Every acknowledged record is readable through every host within ``within_s`` (one
    leader-hint renewal interval) of looking; a violation names the host and what is missing."""
    states = await log_states(run)
    want: dict[str, dict[int, str]] = {}
    for tag, (cid, off) in run.acked.items():
        st = states.get(cid)
        if st is not None and off >= int(st["oldest_offset"]):
            want.setdefault(cid, {})[off] = tag
    for url in urls:
        for cid, offs in want.items():
            deadline = time.monotonic() + within_s
            while True:
                # Compaction and GC still run: what they collected meanwhile is no longer
                # readable anywhere (the audit checks tailers saw it); the rest must be.
                purged: list[int] = []
                got = await read_log(
                    run, run.by_cid[cid], url, min(offs), max(offs) + 1, purged_to=purged
                )
                seen = dict(got or [])
                floor = max(purged, default=0)
                missing = [o for o, t in offs.items() if o >= floor and seen.get(o) != t]
                if got is not None and not missing:
                    break
                if time.monotonic() > deadline:
                    run.violation(
                        f"via {url}: {len(missing)} acknowledged records of {cid} not "
                        f"visible within {within_s:.2f} s, e.g. offsets {missing[:5]}"
                    )
                    break
                await asyncio.sleep(0.05)  # retry pacing within the bound


async def _metrics(run: Run, url: str) -> dict[str, float]:
    out: dict[str, float] = {}
    with contextlib.suppress(httpx.HTTPError):
        r = await run.client.get(url + "/metrics")
        for line in r.text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, _, value = line.rpartition(" ")
            base = name.split("{", 1)[0]
            with contextlib.suppress(ValueError):
                out[base] = out.get(base, 0.0) + float(value)
    return out


async def scenario_two_hosts(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
    """Two real host processes write the same logs with no leader hint; clients retry."""
    return await _two_hosts("two_hosts", seed, quick, workdir, None)


async def scenario_redis_restart(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
    """Two hosts with a Redis leader hint; Redis is killed and restarted empty mid-run."""
    redis = RedisServer(workdir / "redis")
    await asyncio.to_thread(redis.start)
    try:
        return await _two_hosts("redis_restart", seed, quick, workdir, redis)
    finally:
        await asyncio.to_thread(redis.stop)


# --------------------------------------------------------------------- compactor scenario


def compactor_records(rng: random.Random, tags: list[str]) -> list[dict[str, Any]]:
    """Operations on a small id space (so the fold has work to do), each uniquely tagged."""
    out = []
    for t in tags:
        rid = f"doc-{rng.randrange(12)}"
        op = rng.choice(["add", "add", "upsert", "upsert", "update", "delete"])
        rec: dict[str, Any] = {"id": rid, "op": op, "metadata": {"tag": t}}
        if op != "delete":
            if rng.random() < 0.7:
                rec["document"] = f"text {rng.randrange(1000)}"
            if rng.random() < 0.6:
                rec["metadata"][f"k{rng.randrange(4)}"] = rng.choice(
                    [None, rng.randrange(100), f"v{rng.randrange(9)}", True]
                )
            if rng.random() < 0.5:
                rec["embedding"] = [round(rng.uniform(-1, 1), 3) for _ in range(4)]
        out.append(rec)
    return out


def _compactor_cmd(host_url: str, store: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "compactor_client",
        "run",
        "--hosts",
        host_url,
        "--store",
        str(store),
        "--spark-master",
        "local[2]",
        "--once",
        "--member-id",
        "c1",
        "--no-progress",
    ]


def _compactor_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update({"COMPACTOR_API_KEY": SERVICE_KEY, "PYTHONPATH": str(ROOT)})
    return env


def _start_logged(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start a compactor in a session of its own (so its Spark JVM dies with a killpg), its
    output in ``log``, ``env`` added to its environment."""
    with open(log, "wb") as out:  # the child has its own copy of the descriptor
        return subprocess.Popen(
            cmd,
            env={**_compactor_env(), **(env or {})},
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _run_logged(cmd: list[str], log: Path) -> int:
    """Run a compactor to completion, its output in ``log``; its exit status."""
    with open(log, "wb") as out:
        return subprocess.run(
            cmd, env=_compactor_env(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, timeout=900
        ).returncode


async def _state(run: Run, coll: Collection) -> dict[str, Any]:
    """A collection's log state (from a random host, with the service key)."""
    r = await service_call(run, "GET", coll.path)
    assert r is not None and r.status_code == 200, r and r.text
    return dict(r.json())


async def _states(run: Run, colls: list[Collection]) -> dict[str, dict[str, Any]]:
    """Every collection's log state, by collection id."""
    return {c.cid: await _state(run, c) for c in colls}


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


async def _read_full(run: Run, coll: Collection, host: str, start: int = 1) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    pos = start
    while True:
        r = await run.client.get(
            host + coll.path + "/records",
            params={"from": pos, "limit": 1000},
            headers={"Authorization": f"Bearer {SERVICE_KEY}"},
        )
        r.raise_for_status()
        body = r.json()
        if not body["records"]:
            return out
        out.extend(body["records"])
        pos = body["next_offset"]


async def _read_collected(
    run: Run, coll: Collection, host: str
) -> tuple[list[dict[str, Any]], int]:
    """A log's records from its oldest offset, and that offset, while a collector may be
    purging its head: a read that finds its start purged (410) starts again from the new one."""
    for _attempt in range(5):
        oldest = int((await _state(run, coll))["oldest_offset"])
        try:
            return await _read_full(run, coll, host, oldest), oldest
        except httpx.HTTPStatusError as e:
            if e.response.status_code != 410:
                raise
    raise AssertionError(f"{coll.cid}: its oldest offset kept moving under five reads")


def _check_compacted(
    run: Run,
    store: Path,
    coll: Collection,
    state: dict[str, Any],
    records: list[dict[str, Any]],
    *,
    complete: bool,
) -> int | None:
    """CURRENT.json consistent, cursor never ahead of it, its state == reference fold."""
    from verify.oracle import reference_fold

    cur_path = store / paths.current_key(coll.cid)  # LocalStore: a key is a path
    cursor = int(state["compaction_offset"])
    if not cur_path.exists():
        if cursor > 1:
            run.violation(f"{coll.cid}: compaction cursor {cursor} but no {paths.CURRENT_NAME}")
        if complete:
            run.violation(f"{coll.cid}: never compacted")
        return None
    try:
        from compactor_client.reader import read_collection

        current = json.loads(cur_path.read_text())
        offset = int(current["offset"])
        # The compactor's documented reader: every run of the leveled layout (or the one file of
        # the single-version layout), merged.  Nothing installs while the checks run.
        compacted = read_collection(str(store), coll.cid)
        if (compacted.version, compacted.offset) != (int(current["version"]), offset):
            raise ValueError(
                f"read version {compacted.version}, {paths.CURRENT_NAME} names another"
            )
        table = compacted.table
    except Exception as e:
        run.violation(f"{coll.cid}: {paths.CURRENT_NAME} unusable: {e!r}")
        return None
    if cursor > offset:
        run.violation(
            f"{coll.cid}: cursor {cursor} is ahead of {paths.CURRENT_NAME} offset {offset}"
        )
    if complete and not (cursor == offset == int(state["next_offset"])):
        run.violation(
            f"{coll.cid}: after the final round cursor={cursor} CURRENT={offset} "
            f"next={state['next_offset']}"
        )
    folded = [r["record"] for r in records if int(r["offset"]) < offset]
    want = reference_fold(folded)
    got = {}
    for row in table.to_pylist():
        emb = row["embedding"]
        got[row["id"]] = {
            "document": row["document"],
            "metadata": json.loads(row["metadata"]),
            "embedding": None if emb is None else [round(x, 3) for x in emb],
        }
    # "rows" counts the runs' entries: exact with one run, an upper bound with several.
    if got != want or int(current["rows"]) < len(want):
        diff = sorted(set(got) ^ set(want)) or [k for k in want if got.get(k) != want[k]][:3]
        run.violation(
            f"{coll.cid}: compacted version at offset {offset} differs from the "
            f"reference fold of the log (ids {diff[:5]})"
        )
    return int(current["version"])


async def scenario_compactor_kill(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
    """SIGKILL ``compactor run --once`` mid-round (in the Spark fold or while installing), then
    rerun it: versions stay consistent, cursors never run ahead, nothing acknowledged is lost."""
    started = time.monotonic()
    store = workdir / "store"
    host = ProcHost(store, workdir / "logs", "p0", env=dict(PROC_ENV))
    await asyncio.to_thread(host.start)
    wl = workload(
        quick,
        collections=8 if quick else 24,
        writers=4 if quick else 8,
        appends_per_writer=None,
        gc_interval_s=None,
        rollup_interval_s=None,
        records=compactor_records,
        keyless_fraction=0.0,
        mean_interval_s=0.02,
    )
    colls = make_collections(seed, wl.collections)
    run = Run("compactor_kill", seed, colls, lambda: [host.url], wl)
    result = Result("compactor_kill", seed)
    # fold: once a run is written; install: once a CURRENT.json is; merge: the compactor kills
    # itself (COMPACTOR_CRASH_AT) right after writing a merge's output, in a second round.
    kill_at = "merge" if seed % 4 == 3 else "fold" if seed % 2 == 1 else "install"
    result.notes["kill_at"] = kill_at
    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    try:
        # Every log gets a first record and a reader cursor at 1, so garbage collection never
        # purges what the audit still has to read back (the compactor's own cursor moves).
        prng = random.Random(f"prime:{seed}")
        for i, c in enumerate(colls):
            tag = f"s{seed}prime.{i}"
            assert await append(run, prng, c, [tag], compactor_records(prng, [tag]), f"prime-{i}")
            r = await service_call(
                run, "PUT", c.path + "/cursors/verifier", json={"offset": 1, "witness": None}
            )
            assert r is not None and r.status_code == 200, r and r.text
        phases: dict[str, float] = {}
        result.notes["phase_seconds"] = phases
        t = time.monotonic()
        load_task = asyncio.create_task(run_with(run, None, 900))
        # Let some load build up, roll the dirty log up, then start the compactor under load.
        await wait_until(lambda: run.acked_records >= (150 if quick else 1500), "initial load", 300)
        phases["initial_load"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        await service_call(run, "POST", "/v1/dirty/rollup")
        crash: dict[str, str] = {}
        if kill_at == "merge":
            # A whole round first, so that the killed one has levels to merge.
            code = await asyncio.to_thread(
                _run_logged, _compactor_cmd(host.url, store), logdir / "compactor-0.log"
            )
            if code != 0:
                run.violation(f"the first compactor round exited {code}")
            more = run.acked_records + (100 if quick else 1000)
            await wait_until(lambda: run.acked_records >= more, "more load", 300)
            await service_call(run, "POST", "/v1/dirty/rollup")
            crash = {"COMPACTOR_CRASH_AT": "fold:merged"}
        proc = await asyncio.to_thread(
            _start_logged, _compactor_cmd(host.url, store), logdir / "compactor-1.log", crash
        )
        killed = False
        try:

            def at_kill_point() -> bool:
                if kill_at == "merge":
                    return proc.poll() is not None  # it kills itself, or ends without a merge
                parts, currents = compacted_objects(store)
                return proc.poll() is not None or (parts > 0 if kill_at == "fold" else currents > 0)

            await wait_until(at_kill_point, f"the compactor to reach {kill_at}", 300, 0.005)
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)  # the compactor and its Spark JVM
                killed = True
                run.events["compactor_kill9"] += 1
            await asyncio.to_thread(proc.wait, 60)
            if kill_at == "merge" and proc.returncode == -signal.SIGKILL:
                killed = True  # by its own crash point, right after a merge's output
                run.events["compactor_kill9"] += 1
            await wait_until(
                lambda: not _group_alive(proc.pid), "the compactor's group to exit", 60
            )
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)
        phases["first_compactor_until_kill"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        parts, currents = compacted_objects(store)
        result.notes["after_kill"] = {
            "killed": killed,
            "exit": proc.returncode,
            "parquet_parts": parts,
            "current_json": currents,
        }
        # The state the kill left behind is consistent already.
        states = await _states(run, colls)
        for c in colls:
            recs = await _read_full(run, c, host.url)
            _check_compacted(run, store, c, states[c.cid], recs, complete=False)
        run.stop.set()
        load = await load_task
        # Rerun to completion on a quiet log host.
        await service_call(run, "POST", "/v1/dirty/rollup")
        for attempt in range(3):
            code = await asyncio.to_thread(
                _run_logged,
                _compactor_cmd(host.url, store),
                logdir / f"compactor-{attempt + 2}.log",
            )
            if code != 0:
                run.violation(f"compactor rerun {attempt + 1} exited {code}")
            states = await _states(run, colls)
            if all(s["compaction_offset"] == s["next_offset"] for s in states.values()):
                break
            await service_call(run, "POST", "/v1/dirty/rollup")
        phases["reruns"] = round(time.monotonic() - t, 1)
        t = time.monotonic()
        versions = {}
        for c in colls:
            recs = await _read_full(run, c, host.url)
            versions[c.cid] = _check_compacted(run, store, c, states[c.cid], recs, complete=True)
        result.notes["versions"] = sorted(v or 0 for v in versions.values())
        await drain_readers(load)
        await audit(run, result, store)
        phases["checks_and_audit"] = round(time.monotonic() - t, 1)
    except Exception as e:
        result.error = repr(e)
    finally:
        await asyncio.to_thread(host.terminate)
        await run.close()
    result.faults = run.events["compactor_kill9"]
    result.fault_kinds = {"compactor_kill9": result.faults}
    return finish(run, result, started)


# ------------------------------------------------------------- compaction invariants (issue 20)


def _compactor_cmd_members(host_url: str, store: Path, members: str) -> list[str]:
    return [*_compactor_cmd(host_url, store), "--members", members]


def _tamper_fragment(path: Path) -> None:
    """Rewrite every body of a fragment in place: still valid Parquet, same offsets and footer."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    bodies = [b.replace(b"original", b"TAMPERED") for b in table.column("body").to_pylist()]
    new = table.set_column(
        table.schema.get_field_index("body"), "body", pa.array(bodies, pa.binary())
    )
    pq.write_table(new.replace_schema_metadata(table.schema.metadata), path)


async def scenario_compaction_invariants(
    seed: int, quick: bool, workdir: Path, opts: Options
) -> Result:
    """Forks at arbitrary offsets under write load, a tampered fragment, and a compactor member
    that is dead for good: every fork is tracked and compacts to the reference fold, nothing
    tampered is installed, and the dead member's share is compacted by the live one."""
    started = time.monotonic()
    store = workdir / "store"
    host = ProcHost(store, workdir / "logs", "p0", env=dict(PROC_ENV))
    await asyncio.to_thread(host.start)
    wl = workload(
        quick,
        collections=6 if quick else 16,
        writers=3 if quick else 6,
        appends_per_writer=None,
        gc_interval_s=None,
        rollup_interval_s=None,
        records=compactor_records,
        keyless_fraction=0.0,
        mean_interval_s=0.02,
    )
    colls = make_collections(seed, wl.collections)
    run = Run("compaction_invariants", seed, colls, lambda: [host.url], wl)
    result = Result("compaction_invariants", seed)
    rng = random.Random(f"invariants:{seed}")
    logdir = workdir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    # c2 ran once long ago and is gone for good: only its stale liveness record is left.
    await LocalStore(store).put(
        paths.live_key("c2"), json.dumps({"member_id": "c2", "at": 0.0}).encode()
    )
    rounds = 0

    async def compactor_round() -> int:
        nonlocal rounds
        rounds += 1
        await service_call(run, "POST", "/v1/dirty/rollup")
        return await asyncio.to_thread(
            _run_logged,
            _compactor_cmd_members(host.url, store, "c1,c2"),
            logdir / f"compactor-{rounds}.log",
        )

    forks: list[tuple[Collection, Collection]] = []
    tampered = Collection("alice", str(uuid.UUID(int=rng.getrandbits(128), version=4)))
    try:
        prng = random.Random(f"prime:{seed}")
        for i, c in enumerate(colls):
            tag = f"s{seed}prime.{i}"
            assert await append(run, prng, c, [tag], compactor_records(prng, [tag]), f"prime-{i}")
            r = await service_call(
                run, "PUT", c.path + "/cursors/verifier", json={"offset": 1, "witness": None}
            )
            assert r is not None and r.status_code == 200, r and r.text
        load_task = asyncio.create_task(run_with(run, None, 900))
        await wait_until(lambda: run.acked_records >= (100 if quick else 1000), "initial load", 300)
        await compactor_round()  # sources get CURRENT.json at some offset V
        await wait_until(lambda: run.acked_records >= (200 if quick else 2000), "more load", 300)
        # Forks at arbitrary offsets in [oldest, tail] while writers keep appending.
        for c in rng.sample(colls, k=max(2, len(colls) // 2)):
            r = await service_call(run, "GET", c.path)
            assert r is not None and r.status_code == 200, r and r.text
            st = r.json()
            at = rng.randint(int(st["oldest_offset"]), int(st["next_offset"]))
            target = Collection(c.tenant, str(uuid.UUID(int=rng.getrandbits(128), version=4)))
            r = await service_call(
                run,
                "POST",
                c.path + "/fork",
                json={"target_collection_id": target.cid, "offset": at},
            )
            if r is None or r.status_code != 200:
                run.violation(f"fork of {c.cid} at {at}: {None if r is None else r.text[:300]}")
                continue
            got = r.json()
            if int(got["oldest_offset"]) > int(got["compaction_offset"]):
                run.violation(
                    f"fork {target.cid}: oldest {got['oldest_offset']} above its "
                    f"compaction cursor {got['compaction_offset']}"
                )
            forks.append((c, target))
            run.events["fork"] += 1
        # Every fork with a backlog is in the dirty set at once (no write to it needed).
        r = await service_call(run, "POST", "/v1/dirty/rollup")
        dirty = {e["collection_id"] for e in (r.json()["logs"] if r is not None else [])}
        for _src, tgt in forks:
            st = await _state(run, tgt)
            if int(st["next_offset"]) > int(st["compaction_offset"]) and tgt.cid not in dirty:
                run.violation(f"fork {tgt.cid} has uncompacted records but is in no dirty set")
        # A collection whose only fragment is rewritten after it was written.
        r = await service_call(
            run,
            "POST",
            tampered.path + "/records",
            json={"records": [{"id": "doc", "op": "upsert", "document": "original"}]},
        )
        assert r is not None and r.status_code == 200, r and r.text
        # Its first and only fragment (LocalStore: a key is a path).
        frag = store / paths.join(paths.log_prefix(tampered.cid), paths.fragment_path(1))
        _tamper_fragment(frag)
        run.events["tampered_fragment"] += 1
        run.stop.set()
        load = await load_task
        # Compact to completion with c1 alone alive (c2 is listed but dead).
        everyone = list(colls) + [t for _s, t in forks]
        for _attempt in range(4):
            await compactor_round()  # exits 1: the tampered collection fails, by design
            states = await _states(run, everyone)
            if all(s["compaction_offset"] == s["next_offset"] for s in states.values()):
                break
        result.notes["compactor_rounds"] = rounds
        for c in colls:
            _check_compacted(
                run, store, c, states[c.cid], await _read_full(run, c, host.url), complete=True
            )
        # A fork carries no verifier cursor: once compacted, its head is garbage.  Collect it
        # now, so the reads below always follow a collection; one the last compaction scheduled
        # may still be moving the oldest offset, so they read from wherever it starts then.
        for _src, tgt in forks:
            r = await service_call(run, "POST", tgt.path + "/gc")
            if r is None or r.status_code != 200:
                run.violation(f"fork {tgt.cid}: gc {None if r is None else r.text[:300]}")
        for src, tgt in forks:
            own, oldest = await _read_collected(run, tgt, host.url)
            below = [r for r in await _read_full(run, src, host.url) if int(r["offset"]) < oldest]
            _check_compacted(run, store, tgt, states[tgt.cid], below + own, complete=True)
        if (store / paths.current_key(tampered.cid)).exists():
            run.violation(f"{tampered.cid}: a tampered fragment was compacted")
        r = await service_call(run, "GET", tampered.path + "/records", params={"from": 1})
        if r is None or r.status_code != 500 or r.json()["error"]["code"] != "corrupt_fragment":
            run.violation(
                f"{tampered.cid}: reading a tampered fragment answered "
                f"{None if r is None else r.text[:300]}"
            )
        await drain_readers(load)
        await audit(run, result, store)
        # The store-wide scrub must flag the tampered log, and only it.
        expected = [v for v in run.violations if v.startswith("scrub:") and tampered.cid in v]
        if not expected:
            run.violation(f"scrub did not report the tampered log {tampered.cid}")
        run.violations[:] = [v for v in run.violations if v not in expected]
        result.scrub_ok = not any(v.startswith("scrub:") for v in run.violations)
    except Exception as e:
        result.error = repr(e)
    finally:
        await asyncio.to_thread(host.terminate)
        await run.close()
    result.faults = sum(run.events.values())
    result.fault_kinds = dict(run.events)
    return finish(run, result, started)


# ---------------------------------------------------------------------------------- soak


async def scenario_soak(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
    """Many logs for a long time on a real host process over a mildly faulty store."""
    started = time.monotonic()
    seconds = 10.0 if quick else opts.soak_seconds
    nlogs = 100 if quick else opts.soak_logs
    store = workdir / "store"
    env = dict(PROC_ENV)
    env.update(
        {
            "LOGHOST_ROLLUP_INTERVAL_S": "5" if quick else "10",
            "LOGHOST_IDLE_CLOSE_S": "5" if quick else "30",
            # Quick: 40 of 100 logs open, so LRU eviction runs all the time.  Long: the
            # default (1024), so the soak measures memory at the default configuration.
            "LOGHOST_MAX_OPEN_LOGS": str(max(16, nlogs * 2 // 5)) if quick else "1024",
            "LOGHOST_GC_INTERVAL_S": "30",
        }
    )
    faults = [
        "--seed",
        str(seed),
        "--latency-s",
        "0.001",
        "--jitter-s",
        "0.004",
        "--error-rate",
        "0.002",
        "--lost-response-rate",
        "0.001",
        "--precondition-storm-rate",
        "0.002",
    ]
    host = ProcHost(store, workdir / "logs", "soak", env=env, faulty_args=faults)
    await asyncio.to_thread(host.start)
    mem: dict[str, Any] = {"start_kib": host.rss_kib(), "samples": []}
    wl = workload(
        quick,
        collections=nlogs,
        writers=8 if quick else 16,
        appends_per_writer=None,
        mean_interval_s=0.02 if quick else 0.04,
        tailed=16 if quick else 32,
        gc_interval_s=0.1,
        rollup_interval_s=None,
        wait_ms=1000,
        request_timeout_s=15.0,
    )
    run = Run("soak", seed, make_collections(seed, nlogs), lambda: [host.url], wl)
    result = Result("soak", seed)

    async def clock(load: Load) -> None:
        t0 = time.monotonic()
        warm_at = t0 + min(60.0, seconds / 10)
        while True:
            now = time.monotonic()
            if now - t0 >= seconds:
                break
            kib = host.rss_kib()
            mem["samples"].append((round(now - t0, 1), kib))
            if "warm_kib" not in mem and now >= warm_at:
                mem["warm_kib"] = kib
            await asyncio.sleep(min(5.0, max(0.0, seconds - (now - t0))))  # the soak's clock
        mem["end_kib"] = host.rss_kib()
        run.stop.set()

    try:
        load = await run_with(run, clock, seconds + 600)
        stuck = await host.responsive()
        if stuck is not None:
            raise RuntimeError(stuck)
        r = await run.client.post(host.url + "/_verify/faults/disable")
        stats = r.json()
        result.faults = int(stats["faults_injected"])
        result.fault_kinds = dict(stats["faults"])
        result.notes["store_requests"] = stats["requests_total"]
        await drain_readers(load, 300)
        await audit(run, result, store, api_scrub=False)  # the objects are scrubbed
        mem["after_audit_kib"] = host.rss_kib()
    except Exception as e:
        result.error = repr(e)
    finally:
        await asyncio.to_thread(host.terminate)
        await run.close()
    samples = [k for _, k in mem["samples"] if k]
    mem["peak_kib"] = max(samples, default=None)
    mem["samples"] = mem["samples"][:: max(1, len(mem["samples"]) // 40)]
    result.notes["memory"] = mem
    result.notes["seconds_of_load"] = seconds
    result.notes["appends_acknowledged"] = run.acked_appends
    return finish(run, result, started)


# ------------------------------------------------------------------------------ registry


Scenario = Callable[[int, bool, Path, Options], Awaitable[Result]]


def _store(name: str, plan: Callable[[int, bool], StorePlan]) -> Scenario:
    async def scenario(seed: int, quick: bool, workdir: Path, opts: Options) -> Result:
        return await run_store_scenario(name, seed, quick, workdir, plan(seed, quick))

    return scenario


SCENARIOS: dict[str, tuple[Scenario, str]] = {
    "latency": (
        _store("latency", plan_latency),
        "latency with jitter, random spikes up to 1.5 s and rare manifest stalls of "
        "2.5-4 s (longer than the 2 s client timeout); a small per-log buffer (429s)",
    ),
    "errors": (
        _store("errors", plan_errors),
        "5xx / throttling: StoreUnavailable on 1-6% of all requests plus a burst of "
        "10-60 consecutive failures",
    ),
    "storms": (
        _store("storms", plan_storms),
        "409/412 storms: failed conditions on 2-10% of conditional writes plus a burst of "
        "5-40 on the manifest",
    ),
    "lost_responses": (
        _store("lost_responses", plan_lost),
        "lost responses after a successful put (manifest, fragments, GC state, "
        "cursors) and on 0.5-3% of all requests",
    ),
    "hook_failures": (
        _store("hook_failures", plan_hook_failures),
        "the fragment hook (dirty-log append) fails at 5-20% plus a burst of 8-30, "
        "with reader pins and a seal alongside",
    ),
    "pins_and_seal": (
        _store("pins_and_seal", plan_pins_and_seal),
        "reader cursors pinned, moved back and dropped under hard GC; two "
        "collections sealed mid-run; 1-3% errors",
    ),
    "crash_fragment_manifest": (
        _store("crash_fragment_manifest", plan_crash_fragment_manifest),
        "process crash between fragment and manifest writes (after a fragment put, before or "
        "after a manifest put), then restart",
    ),
    "crash_snapshot": (
        _store("crash_snapshot", plan_crash_snapshot),
        "process crash before/after a snapshot write, then restart",
    ),
    "crash_gc_plan": (
        _store("crash_gc_plan", plan_crash_gc("plan")),
        "crash while GC writes its plan (gc/GARBAGE, phase 1)",
    ),
    "crash_gc_apply": (
        _store("crash_gc_apply", plan_crash_gc("apply")),
        "crash in the manifest write that applies the plan, or its applied marker (phase 2)",
    ),
    "crash_gc_delete": (
        _store("crash_gc_delete", plan_crash_gc("delete")),
        "crash while GC deletes fragments/snapshots (phase 3)",
    ),
    "crash_gc_reset": (
        _store("crash_gc_reset", plan_crash_gc("reset")),
        "crash while GC resets gc/GARBAGE after deleting",
    ),
    "crash_rollup_read": (
        _store("crash_rollup_read", plan_crash_rollup("read")),
        "crash while the roll-up reads its dirty-log window",
    ),
    "crash_rollup_append": (
        _store("crash_rollup_append", plan_crash_rollup("append")),
        "crash while the roll-up re-appends the dirty collections",
    ),
    "crash_rollup_cursor": (
        _store("crash_rollup_cursor", plan_crash_rollup("cursor")),
        "crash before/after moving the stable_prefix cursor",
    ),
    "crash_rollup_gc": (
        _store("crash_rollup_gc", plan_crash_rollup("gc")),
        "crash in the dirty log's own GC after a roll-up",
    ),
    "kill9": (
        scenario_kill9,
        "kill -9 of a real host process under load, restarted on the same "
        "store and port (2 kills quick, 4 long)",
    ),
    "two_hosts": (
        scenario_two_hosts,
        "two real host processes writing the same logs with no "
        "leader hint; clients retry on 409/503 with their keys",
    ),
    "redis_restart": (
        scenario_redis_restart,
        "two hosts with the Redis leader hint; redis-server killed and restarted "
        "empty mid-run; clients follow 307s",
    ),
    "compactor_kill": (
        scenario_compactor_kill,
        "`compactor run --once` SIGKILLed (with its Spark JVM) in the fold or "
        "while installing, under write load; then rerun to completion",
    ),
    "compaction_invariants": (
        scenario_compaction_invariants,
        "forks at arbitrary offsets under write load, a tampered fragment, and a compactor "
        "member listed but dead for good; then compaction to completion",
    ),
    "soak": (
        scenario_soak,
        "1,000 logs on one host process for 10 minutes over a mildly faulty "
        "store with continuous compaction, GC and roll-ups",
    ),
}

PROCESS_SCENARIOS = ("kill9", "two_hosts", "redis_restart")
STORE_SCENARIOS = [
    n
    for n in SCENARIOS
    if n not in (*PROCESS_SCENARIOS, "compactor_kill", "compaction_invariants", "soak")
]


def seeds_for(name: str, n: int) -> int:
    """How many seeds a scenario gets when every store scenario gets ``n`` (heavier scenarios
    get fewer): 6 gives 14*6 + 3*4 + 3 + 1 = 100 schedules."""
    if name == "soak":
        return 1
    if name in ("compactor_kill", "compaction_invariants"):
        return max(1, -(-n // 2))
    if name in PROCESS_SCENARIOS:
        return max(1, -(-2 * n // 3))
    return n
