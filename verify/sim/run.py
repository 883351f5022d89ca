"""Running seeds: one run (the driver), a range of them, and their summary."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from wal3 import gc as wal3_gc
from wal3.cursors import COMPACTION
from wal3.errors import GarbageRejected
from wal3.gc import Garbage
from wal3.paths import CURSOR_PREFIX, GARBAGE_PATH, MANIFEST_PATH, join
from wal3.scrub import scrub_log

from . import loop as simloop
from .actors import EMERGENCY, PINS, PREFIX, PROGRESS, World
from .config import RunConfig, make_config
from .model import Model, Violation
from .store import SimStore

TRACE_TAIL = 60
# A run goes on after its first violation (later ones may show other bugs) but not forever.
MAX_VIOLATIONS = 40
# Passes the collector gets to reach the cutoff once faults stop: a plan may drop at most a share
# of the log (GcOptions.max_fraction) and each takes two passes (plan+apply, then delete).
GC_PASSES = 24
QUIET_SETTLE_S = 3.0  # longer than any request's two delays plus a recovery: zombies have landed
STEP_GAPS = (0.0, 0.0005, 0.002, 0.005, 0.02, 0.05, 0.2, 0.6, 2.5)
STEP_GAP_WEIGHTS = (2, 3, 4, 4, 3, 2, 2, 1, 1)


@dataclass
class RunResult:
    """What one seed did and found."""

    seed: int
    steps: int
    violations: list[Violation]
    faults: collections.Counter[str]
    trace_hash: str
    trace: list[str]
    virtual_s: float
    wall_s: float
    ops: int
    stats: dict[str, int] = field(default_factory=dict)
    root_emptied: bool = False

    @property
    def ok(self) -> bool:
        return not self.violations


class _Trace:
    def __init__(self, loop: simloop.SimLoop) -> None:
        self.loop = loop
        self.lines: list[str] = []
        self.digest = hashlib.sha256()
        self.frozen = False  # set once the run is over: teardown is not part of the trace

    def __call__(self, msg: str) -> None:
        if self.frozen:
            return
        line = f"{self.loop.time():11.6f} {msg}"
        self.lines.append(line)
        self.digest.update(line.encode())
        self.digest.update(b"\n")


async def _with_timeout(
    world: World, what: str, aw: asyncio.Future[object] | asyncio.Task[object], limit_s: float
) -> bool:
    try:
        await asyncio.wait_for(asyncio.shield(aw), limit_s)
        return True
    except TimeoutError:
        world.model.violate(
            "liveness", f"{what} did not finish within {limit_s}s after the faults stopped"
        )
        return False
    except Exception:
        return True


def _choose(world: World, step: int) -> None:
    cfg, rng = world.cfg, world.rng
    if cfg.seal_at is not None and step == cfg.seal_at:
        world.seal()
        return
    actions: tuple[tuple[str, float], ...]
    # With read leases, reads race take-overs often: a stale or non-monotonic read needs a read
    # through the old holder's lease right after another read saw the taker's records.
    reads = 6 if cfg.lease_s > 0 else 1
    if world.quiet:
        actions = (("append", 6), ("cursor", 2), ("gc", 2), ("read", reads), ("pin", cfg.pin_w / 3))
    else:
        actions = (
            ("append", 8),
            ("append_all", 3 if cfg.writers > 1 else 0),
            ("retry", 1),
            ("cursor", 3),
            ("gc", 3),
            ("gc_all", 2 if len(world.collectors) > 1 else 0),
            ("read", reads),
            ("pin", cfg.pin_w),
            ("open", 2),
            ("close", 1 if cfg.writers > 1 else 0.3),
            ("crash", 0.4),
            ("fork", 10 * cfg.fork_p),
        )
    kind = rng.choices([a for a, _ in actions], [w for _, w in actions])[0]
    world.trace(f"step {step}: {kind}")
    if kind == "append":
        slots = [s for s in world.writers if s.live is not None]
        if slots:
            world.append_batch(rng.choice(slots))
        elif not world.quiet:
            world.open_some()
    elif kind == "append_all":  # every writer at once: contention on every sequence number
        for s in world.writers:
            if s.live is not None:
                world.append_batch(s)
    elif kind == "retry":
        world.retry_keyed()
    elif kind == "cursor":
        world.cursor_step()
    elif kind == "gc_all":
        world.gc_all()
    elif kind == "pin":
        world.pin_step()
    elif kind == "gc":
        world.gc_step()
    elif kind == "read":
        world.read_step()
    elif kind == "open":
        world.open_some()
    elif kind == "close":
        world.close_some()
    elif kind == "crash":
        world.crash_some()
    elif kind == "fork":
        world.fork_step()


async def _enter_quiet(world: World) -> None:
    """Stop every fault, let the dust settle, then one fresh writer (liveness is checked)."""
    world.trace("QUIET: faults stop")
    world.quiet = True
    world.sim.faults_on = False
    for s in world.writers:
        if s.actor is not None:
            s.actor.crash_p = 0.0
    for c in world.collectors:
        if c.actor is not None:
            c.actor.crash_p = 0.0
            if c.actor.latency is not None:  # a stall is a fault; a pause (latency) goes on
                c.actor.latency = dataclasses.replace(c.actor.latency, p_stall=0.0)
    await asyncio.sleep(QUIET_SETTLE_S)
    # Every surviving writer process, including ones a slot already replaced (still flushing).
    for actor, w in world.opened:
        if actor.alive:
            t = world.loop.create_task(w.close())
            await _with_timeout(world, f"closing {actor.name}", t, 60.0)
            world.trace(f"{actor.name} closed")
    for s in world.writers:
        s.writer = None
    if await world.writers[0].open() is None:
        world.model.violate("liveness", "no writer could open after the faults stopped")
    if await world.cursors.load(COMPACTION) is None:
        await world.set_cursor(COMPACTION, tail=False)
    if world.cfg.busy_gc_s is not None:
        world.spawn(world.busy_collector(lambda: world.finishing, faulty=False), must_finish=True)
    if world.cfg.edit_only:
        await world.open_editor()


def _gc_idle(world: World) -> bool:
    """Whether gc/GARBAGE holds no plan (its idle form differs between schemas)."""
    obj = world.sim.objects.get(join(PREFIX, GARBAGE_PATH))
    if obj is None:
        return True
    try:
        return Garbage.from_bytes(obj.data) is None
    except GarbageRejected:
        return False


async def _finish(world: World) -> None:
    """Liveness: settle everything, then GC must reach the cutoff and appends must succeed."""
    world.finishing = True
    for c in world.collectors:
        if c.actor is not None and c.actor.latency is not None:
            c.actor.latency = dataclasses.replace(c.actor.latency, p_pause=0.0)
    must = [t for t, m in world.tasks if m and not t.done()]
    for t in must:
        await _with_timeout(world, "a task started after the faults stopped", t, 60.0)
    for c in world.collectors:
        if c.busy and c.task is not None:  # a crashed collector's pass is abandoned, not awaited
            await _with_timeout(world, f"the collector's pass ({c.name})", c.task, 60.0)
    for t in [t for t in world.cursor_tasks if not t.done()]:
        await _with_timeout(world, "a reader's cursor operation", t, 60.0)
    for name in (*EMERGENCY, *PINS, PROGRESS):
        await world.delete_cursor(name)
    first = world.model.walk(PREFIX)
    if first is None:
        return
    loaded = first.manifest
    target = world.rng.choice(
        (loaded.next_offset, world.rng.randint(loaded.oldest_offset, loaded.next_offset))
    )
    if world.cfg.gc:
        await world.set_cursor(COMPACTION, tail=False, at=max(1, target))
        cursor = await world.cursors.load(COMPACTION)
        cut = cursor.cursor.offset if cursor is not None else 1
        done = False
        for i in range(GC_PASSES):
            # Every collector takes its turn (the server and loghost gc both visit the log).
            phase = await world.gc_once(world.collectors[i % len(world.collectors)])
            world.model.check()
            view = world.model.walk(PREFIX)
            if view is not None and _gc_idle(world):
                leaves = view.leaves
                frags = view.manifest.fragments
                # The root's last fragment may stay whatever the cutoff: it fences writers.
                if (
                    not leaves
                    or leaves[0].limit > min(cut, view.manifest.next_offset)
                    or (frags and leaves[0] == frags[-1])
                ):
                    done = True
                    break
            world.trace(f"GC not settled yet ({phase})")
            await asyncio.sleep(world.cfg.grace_s + 0.5)
        if not done:
            world.model.violate(
                "liveness",
                f"GC never reached the cutoff {cut} after the faults "
                f"stopped (last pass: {world.gc_last})",
            )
    slot = world.writers[0]
    if slot.live is not None and not slot.live.manifest.sealed:
        world.append_batch(slot)
        for t in [t for t, m in world.tasks if m and not t.done()]:
            await _with_timeout(world, "a final append", t, 60.0)
    world.model.check()
    for prefix in list(world.model.logs):
        if world.sim.objects.get(join(prefix, MANIFEST_PATH)) is None:
            continue
        report = await scrub_log(world.reader_view, prefix)
        if not report.ok:
            world.model.violate("scrub", f"{prefix}: {'; '.join(report.problems[:3])}")


async def _main(loop: simloop.SimLoop, cfg: RunConfig, trace: _Trace) -> World:
    rng = random.Random(f"wal3-sim-driver:{cfg.seed}")
    model: Model
    sim = SimStore(loop, random.Random(f"wal3-sim-store:{cfg.seed}"), trace, None, rates=cfg.rates)
    model = Model(PREFIX, loop.time, trace, sim.objects, cfg.window, cfg.grace_s)
    sim.observer = model
    model.progress_key = join(PREFIX, f"{CURSOR_PREFIX}{PROGRESS}.json")
    world = World(loop, cfg, sim, model, rng, trace)
    trace(f"seed {cfg.seed}: {cfg}")
    world.spawn(world.writers[0].open())  # not awaited: the process may die while opening
    if cfg.gc and len(world.collectors) > 1:
        world.spawn(world.gc_loop(world.collectors[1]))  # the second collector is always on
    if cfg.gc and cfg.pin_w:
        world.spawn(world.adversary())
    if cfg.busy_gc_s is not None:
        world.spawn(world.busy_collector(lambda: world.quiet, faulty=True))
    for step in range(cfg.steps):
        if step == cfg.quiet_from:
            await _enter_quiet(world)
        if not world.quiet:
            for s in world.writers:  # a dead process's slot is reopened by an "open" step
                if s.actor is not None and not s.actor.alive and s.writer is not None:
                    world.trace(f"{s.actor.name} is dead")
                    s.writer = None
        _choose(world, step)
        await asyncio.sleep(rng.choices(STEP_GAPS, STEP_GAP_WEIGHTS)[0])
        model.check()
        if len(model.violations) >= MAX_VIOLATIONS:
            return world
    if not world.quiet:
        await _enter_quiet(world)
    await _finish(world)
    return world


def _forget_the_worlds_stores() -> None:
    """Drop what the engine's collectors remember per store object.  Those maps are keyed
    weakly by the store, but their values hold the simulated monotonic clock, whose loop reaches
    the world and so its stores: each seed's whole world stayed alive (a worker grew by ~5,000
    objects a seed, and a long run slowed about tenfold).  Seeds run one after another in a
    process, so nothing of the next seed is in them."""
    wal3_gc._SEEN_APPLIED.clear()
    wal3_gc._OBSERVED.clear()


def run_seed(seed: int, *, keep_trace: bool = False) -> RunResult:
    """Run one seed to the end (or its first violation)."""
    logging.getLogger("wal3").setLevel(logging.CRITICAL)
    cfg = make_config(seed)
    started = time.perf_counter()
    holder: dict[str, object] = {}

    async def main(loop: simloop.SimLoop) -> World:
        trace = _Trace(loop)
        holder["trace"] = trace
        return await _main(loop, cfg, trace)

    def freeze() -> None:
        t = holder.get("trace")
        if isinstance(t, _Trace):
            t.frozen = True

    world: World | None = None
    error: Violation | None = None
    try:
        world = simloop.run(main, freeze)
    except simloop.Deadlock as e:
        error = Violation("deadlock", str(e))
    except simloop.Livelock as e:
        error = Violation("livelock", str(e))
    _forget_the_worlds_stores()
    trace = holder["trace"]
    assert isinstance(trace, _Trace)
    trace.frozen = False
    violations = list(world.model.violations) if world is not None else []
    if error is not None:
        trace(f"VIOLATION {error}")
        violations.append(error)
    faults: collections.Counter[str] = collections.Counter()
    ops = 0
    stats: dict[str, int] = {}
    if world is not None:
        faults = world.sim.faults
        ops = world.sim.ops
        stats = dict(world.stats)
    return RunResult(
        seed=seed,
        steps=cfg.steps,
        violations=violations,
        faults=faults,
        trace_hash=trace.digest.hexdigest(),
        trace=trace.lines if keep_trace or violations else trace.lines[-TRACE_TAIL:],
        virtual_s=trace.loop.time(),
        wall_s=time.perf_counter() - started,
        ops=ops,
        stats=stats,
        root_emptied=world is not None and world.model.root_emptied,
    )


def run_seeds(seeds: Iterable[int]) -> list[RunResult]:
    """Run seeds one after another (a worker's share of a range)."""
    out = []
    for s in seeds:
        r = run_seed(s)
        if r.ok:
            r.trace = []
        out.append(r)
    return out
