"""The engine's actors as the seed drives them: writer processes, the collector, readers, forks.

Each actor is a process with its own store view; a crash (chosen by the store at any operation, or
by the driver) abandons everything it was doing.  Every outcome an actor sees is reported to the
model; an outcome no correct engine may give is a violation.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import random
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any

from verify.testkit import wait_until
from wal3.cursors import COMPACTION, CursorStore
from wal3.errors import (
    Backpressure,
    CorruptFragment,
    CursorConflict,
    CursorNotFound,
    LogContention,
    LogExists,
    LogNotFound,
    LogPurged,
    LogSealed,
    NoCursors,
    ObjectNotFound,
    PreconditionFailed,
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from wal3.fork import fork_log
from wal3.gc import Garbage, GarbageCollector, GcOptions, pin_cursor
from wal3.layout import load_manifest
from wal3.manifest import GcFloor, Manifest
from wal3.paths import CURSOR_PREFIX, GARBAGE_PATH, MANIFEST_PATH, join
from wal3.reader import Limits, LogReader
from wal3.writer import (
    BatchOptions,
    FragmentInfo,
    IdempotencyOptions,
    LeaseOptions,
    LogWriter,
    LogWriterOptions,
    SnapshotOptions,
)

from .config import RunConfig
from .loop import SimLoop, VirtualClock, wall_s
from .model import Attempt, Model, encode_body
from .store import Actor, Latency, Obj, SimStore

PREFIX = "log0"
# Readers are exempt from store faults and slow tails: the design requires a reader to finish
# writing a cursor well within the grace interval, and a fault storm could stretch that.
READER_LATENCY = Latency(p_tail=0.0)
# A pin is a server request: it may pause between its cursor write and its re-check, but (the
# spec's timing assumption) finishes well within the grace interval (at most 2 s here).
PIN_LATENCY = Latency(
    p_tail=0.0,
    stall=(0.05, 0.3),
    p_stall=0.05,
    pause=(0.2, 1.0),
    p_pause=0.3,
    pause_after=("/" + CURSOR_PREFIX,),
    pause_before=("get",),
)
EMERGENCY = ("emergency0", "emergency1", "emergency2")
PINS = ("pin0", "pin1")  # cursors pinned with pin_cursor
# A compactor's progress cursor: moved only with CursorStore.advance, often by two advancers at
# once, so it must never move back (the model's ``cursor-back`` check).
PROGRESS = "progress"
ADVANCE_P = 0.15  # of cursor steps
# Once the faults stop, an append is answered within this many (virtual) seconds: a take-over's
# fence (1.25 x a lease of at most 2 s) and a few rounds of recovery, with room to spare.  A
# writer that fences again and again under a busy collector misses it by far.
QUIET_APPEND_S = 10.0


def _holder(manifest: bytes) -> str | None:
    """The ``lease_holder`` a stored manifest records (None: none, or not a manifest)."""
    try:
        m = Manifest.from_bytes(manifest)
    except Wal3Error:
        return None
    holder: str | None = getattr(m, "lease_holder", None)  # (an engine before the field: none)
    return holder


class HookFailed(Exception):
    """The fragment hook (the dirty log, in the server) failed."""


class WriterSlot:
    """One writer process position: opened, crashed, closed and reopened over a run."""

    def __init__(self, world: World, idx: int) -> None:
        self.world = world
        self.idx = idx
        self.instance = 0
        self.actor: Actor | None = None
        self.writer: LogWriter | None = None
        self.opening = False
        self.hook_streak = 0

    @property
    def live(self) -> LogWriter | None:
        """The writer, if its process is alive and it accepts work."""
        w = self.writer
        if w is None or self.actor is None or not self.actor.alive or w.closed:
            return None
        return w

    async def open(self) -> LogWriter | None:
        world = self.world
        quiet = world.quiet  # an open that began amid faults may still fail after they stop
        self.instance += 1
        actor = world.sim.actor(
            f"w{self.idx}.{self.instance}", 0.0 if world.quiet else world.cfg.writer_crash_p
        )
        self.actor, self.writer, self.opening = actor, None, True
        cfg = world.cfg
        lease_s = cfg.lease_s
        if cfg.lease_mix and lease_s > 0:
            # Its own generator: the world's draws stay what they were without the mix.
            draw = random.Random(f"wal3-sim-lease:{cfg.seed}:{self.idx}:{self.instance}")
            lease_s = draw.choice((0.0, cfg.lease_s / 4, cfg.lease_s))
        opts = LogWriterOptions(
            writer_name=actor.name,
            clock=world.clock,
            batch=BatchOptions(size_bytes=cfg.batch_bytes, max_inflight_fragments=cfg.pipeline),
            snapshot=SnapshotOptions(
                fragment_threshold=cfg.snapshot_fragment_threshold,
                snapshot_threshold=cfg.snapshot_threshold,
            ),
            idempotency=IdempotencyOptions(window_fragments=cfg.window),
            lease=LeaseOptions(
                read_lease_s=lease_s, unrecorded_lease_s=cfg.lease_s if cfg.lease_s else None
            ),
        )
        world.trace(f"{actor.name} opening (lease {lease_s} s)")
        try:
            w = await LogWriter.open(world.sim.view(actor), PREFIX, opts, hook=self.hook)
        except (StoreUnavailable, LogContention) as e:
            world.trace(f"{actor.name} open failed: {e!r}")
            if quiet:
                world.model.violate("liveness", f"{actor.name} could not open: {e!r}")
            self.opening = False
            return None
        self.opening = False
        world.opened.append((actor, w))
        if self.actor is actor:
            self.writer = w
            world.trace(
                f"{actor.name} open at [{w.manifest.oldest_offset},"
                f"{w.manifest.next_offset}) seq {w.manifest.next_seq_no}"
            )
        return w

    async def hook(self, info: FragmentInfo) -> None:
        world = self.world
        name = self.actor.name if self.actor is not None else "?"
        if world.quiet or not world.cfg.hook:
            return
        if self.hook_streak > 0:
            self.hook_streak -= 1
            world.trace(f"{name} hook fails seq {info.seq_no} repaired={info.repaired} (streak)")
            raise HookFailed(f"dirty log unavailable (seq {info.seq_no})")
        r = world.rng.random()
        if r < world.cfg.hook_fail_p:
            self.hook_streak = world.rng.choice((0, 1, 1, 2, 4))
            world.trace(f"{name} hook fails seq {info.seq_no} repaired={info.repaired}")
            raise HookFailed(f"dirty log unavailable (seq {info.seq_no})")
        delay = world.rng.choice((0.0, 0.0, 0.001, 0.01))
        if delay:
            await asyncio.sleep(delay)


class CollectorSlot:
    """One collector position: a process running passes, crashed and restarted over a run.

    ``fresh``: every pass is a new process (``loghost gc``): nothing it saw survives the pass,
    so it can only go by what the store says.  ``via_writer``: manifest edits go through the
    open writer, as the server's do; else they are standalone compare-and-swaps."""

    def __init__(self, world: World, name: str, *, via_writer: bool, fresh: bool) -> None:
        self.world = world
        self.name = name
        self.via_writer = via_writer
        self.fresh = fresh
        self.instances = 0
        self.actor: Actor | None = None
        self.gc: GarbageCollector | None = None
        self.task: asyncio.Task[str] | None = None
        self.running: Actor | None = None  # the process of the pass in ``task``, once started
        self.last = ""

    def start(self) -> asyncio.Task[str]:
        """Start a pass (the caller checked that none is running)."""
        world = self.world
        self.running = None
        self.task = world.loop.create_task(world.gc_once(self))
        world.tasks.append((self.task, world.quiet))
        return self.task

    @property
    def busy(self) -> bool:
        """A pass is running in a live process."""
        # (A pass not started yet has no process yet: it is busy all the same.)
        return (
            self.task is not None
            and not self.task.done()
            and (self.running is None or self.running.alive)
        )

    def collector(self) -> GarbageCollector:
        """The collector for the next pass (a new process when the last died, or always when
        ``fresh``)."""
        world = self.world
        if self.fresh or self.gc is None or self.actor is None or not self.actor.alive:
            self.instances += 1
            cfg = world.cfg
            self.actor = world.sim.actor(
                f"{self.name}.{self.instances}",
                0.0 if world.quiet else cfg.gc_crash_p,
                latency=Latency(
                    p_stall=0.0 if world.quiet else cfg.gc_stall_p / 8,
                    p_pause=0.0 if world.finishing else cfg.gc_stall_p,
                ),
            )
            opts = GcOptions(
                grace_s=cfg.grace_s,
                delete_batch=cfg.delete_batch,
                deletes_per_second=float("inf"),
                writer_name=self.actor.name,
                retain_fragments=cfg.window,
                retain_s=600.0,
            )
            edit: Callable[[Callable[[Manifest], Manifest]], Awaitable[Manifest]] | None = (
                functools.partial(world._edit_via_writer, self) if self.via_writer else None
            )
            self.gc = GarbageCollector(
                world.sim.view(self.actor),
                PREFIX,
                opts,
                edit_manifest=edit,
                clock=lambda: wall_s(world.loop),
            )
        return self.gc


class World:
    """Everything one run drives: the store, the model, the actors, the tasks in flight."""

    def __init__(
        self,
        loop: SimLoop,
        cfg: RunConfig,
        sim: SimStore,
        model: Model,
        rng: random.Random,
        trace: Callable[[str], None],
    ) -> None:
        self.loop = loop
        self.cfg = cfg
        self.sim = sim
        self.model = model
        self.rng = rng
        self.trace = trace
        self.clock = VirtualClock(loop)
        self.quiet = False
        self.quiet_append_max = 0.0  # the longest answer to an append begun in the quiet phase
        self.busy_instances = 0
        # The busy collector's floor while it may be in the manifest (an announce issued, its
        # retraction not yet known to have landed).
        self.busy_floor: GcFloor | None = None
        self.finishing = False  # the liveness check has begun: no more pauses, no more loops
        # The quiet phase's edit-only writer (``edit_only``), and each writer's fence when its
        # first append after the faults stopped was linked (``append``).
        self.editor: WriterSlot | None = None
        self.held_fence: dict[int, float] = {}
        self.writers = [WriterSlot(self, i) for i in range(cfg.writers)]
        # The collectors: the first as the server runs it (through the writer when the seed says
        # so), a second racing it when the seed says so.
        self.collectors = [CollectorSlot(self, "gc", via_writer=cfg.gc_via_writer, fresh=False)]
        if cfg.gc2:
            self.collectors.append(
                CollectorSlot(self, "gcb", via_writer=False, fresh=cfg.gc2_fresh)
            )
        self.reader = sim.actor("reader", faulty=False, latency=READER_LATENCY)
        self.reader_view = sim.view(self.reader)
        self.cursors = CursorStore(self.reader_view, PREFIX, "reader", clock=self.clock)
        self.pinner = sim.actor("pinner", faulty=False, latency=PIN_LATENCY)
        self.pinner_view = sim.view(self.pinner)
        self.pin_cursors = CursorStore(self.pinner_view, PREFIX, "pinner", clock=self.clock)
        self.forks = 0
        self.opened: list[tuple[Actor, LogWriter]] = []  # every writer process ever opened
        self.tasks: list[tuple[asyncio.Task[Any], bool]] = []  # (task, must finish)
        self.cursor_tasks: list[asyncio.Task[Any]] = []
        self.stats: dict[str, int] = {
            "appends": 0,
            "gc_runs": 0,
            "forks": 0,
            "reads": 0,
            "cursor_ops": 0,
            "reopens": 0,
            "seals": 0,
            "pins": 0,
        }

    def spawn(self, coro: Coroutine[Any, Any, Any], must_finish: bool = False) -> None:
        self.tasks.append((self.loop.create_task(coro), must_finish))

    def spawn_cursor(self, coro: Coroutine[Any, Any, Any]) -> None:
        """A reader's cursor operation: the liveness check waits for all of them before it
        lets the pins go (a pin landing after that would hold the collector back for ever)."""
        t = self.loop.create_task(coro)
        self.tasks.append((t, self.quiet))
        self.cursor_tasks.append(t)

    # ---------------------------------------------------------------------------- appends

    def append_batch(self, slot: WriterSlot) -> None:
        """Several appends at once on one writer (they pipeline), some with keys."""
        w = slot.live
        if w is None or slot.actor is None:
            return
        n = self.rng.randint(1, self.cfg.appends_per_step)
        for _ in range(n):
            count = self.rng.choice((1, 1, 1, 2, 5))
            keyed = self.rng.random() < self.cfg.keyed_p
            a = self.model.new_attempt(None, None, count, slot.actor.name, slot.actor.started_at)
            if keyed:
                a.key = f"k{a.id}"
            self.spawn(self.append(w, a), must_finish=self.quiet)

    def retry_keyed(self) -> None:
        """Retry a keyed append that failed ambiguously, on whichever writer is live."""
        failed = [
            a
            for a in self.model.attempts.values()
            if a.key is not None
            and a.outcome in ("failed", "lost", "pending")
            and a.id == max(self.model.logicals[a.logical])
        ]
        slots = [s for s in self.writers if s.live is not None]
        if not failed or not slots:
            return
        orig = self.rng.choice(failed[-8:])
        slot = self.rng.choice(slots)
        assert slot.writer is not None and slot.actor is not None
        a = self.model.new_attempt(
            orig.logical, orig.key, orig.count, slot.actor.name, slot.actor.started_at
        )
        self.trace(f"retry of a{orig.id} as a{a.id} key={a.key} on {slot.actor.name}")
        self.spawn(self.append(slot.writer, a), must_finish=self.quiet)

    async def append(self, w: LogWriter, a: Attempt) -> None:
        self.stats["appends"] += 1
        quiet = self.quiet
        bodies = [encode_body(a.id, i, self.rng.randint(0, self.cfg.pad)) for i in range(a.count)]
        self.trace(f"append a{a.id} x{a.count} key={a.key} on {a.writer}")
        started = self.loop.time()
        try:
            r = await w.append_many(bodies, idempotency_key=a.key)
        except LogContention as e:
            self.model.settle(a, "contention", error=e)
        except (StoreUnavailable, LogSealed, WriterClosed, Backpressure, HookFailed) as e:
            self.model.settle(a, "failed", error=e)
            if quiet and not isinstance(e, LogSealed):
                self.model.violate("liveness", f"a{a.id} failed after the faults stopped: {e!r}")
            return
        except Exception as e:
            self.model.settle(a, "failed", error=e)
            self.model.violate("error", f"a{a.id}: unexpected {e!r}")
            return
        else:
            self.model.settle(a, "dedup" if r.deduplicated else "acked", r)
            took = self.loop.time() - started
            self.quiet_append_max = max(self.quiet_append_max, took if quiet else 0.0)
            if quiet and not r.deduplicated:
                # Linked by this writer after the faults stopped: it holds the log, and nobody
                # else appends, so nothing may fence it again (a yield to an edit that links
                # nothing and a claim back, an editor's repair of its orphan: the adversarial
                # review of b755610).  Each costs 1.25 x a lease or more, in every append.
                held = self.held_fence.setdefault(id(w), w.fence_until)
                if w.fence_until > held:
                    self.model.violate(
                        "liveness",
                        f"{a.writer} fenced again on a log it held after the faults stopped "
                        f"(a{a.id}, until {w.fence_until - self.clock.monotonic():.2f} s on)",
                    )
                    self.held_fence[id(w)] = w.fence_until
            if quiet and took > QUIET_APPEND_S:
                self.model.violate(
                    "liveness", f"a{a.id} took {took:.1f} s after the faults stopped"
                )
            return
        if quiet:
            self.model.violate(
                "liveness", f"a{a.id} answered LogContention after the faults stopped"
            )

    # ------------------------------------------------------------------------ lifecycle

    def open_some(self) -> None:
        idle = [
            s
            for s in self.writers
            if s.live is None
            and not s.opening
            and (s.actor is None or not s.actor.alive or s.writer is None or s.writer.closed)
        ]
        if idle:
            slot = self.rng.choice(idle)
            self.stats["reopens"] += 1
            self.spawn(slot.open())

    def close_some(self) -> None:
        live = [s for s in self.writers if s.live is not None]
        if live:
            slot = self.rng.choice(live)
            self.spawn(self.close(slot))

    async def close(self, slot: WriterSlot) -> None:
        w, actor = slot.writer, slot.actor
        if w is None or actor is None:
            return
        self.trace(f"{actor.name} closing")
        await w.close()
        self.trace(f"{actor.name} closed")

    def crash_some(self) -> None:
        victims = [s.actor for s in self.writers if s.actor is not None and s.actor.alive]
        victims += [c.actor for c in self.collectors if c.actor is not None and c.actor.alive]
        if victims:
            self.sim.crash(self.rng.choice(victims), "killed by the driver")

    def seal(self) -> None:
        live = [s for s in self.writers if s.live is not None]
        if live:
            slot = self.rng.choice(live)
            self.stats["seals"] += 1
            self.spawn(self._seal(slot))

    async def _seal(self, slot: WriterSlot) -> None:
        w = slot.writer
        assert w is not None
        try:
            await w.seal()
            self.trace(f"{w.options.writer_name} sealed the log")
        except Wal3Error as e:
            self.trace(f"seal failed: {e!r}")

    # ----------------------------------------------------------------------------- GC

    async def _edit_via_writer(
        self, slot: CollectorSlot, fn: Callable[[Manifest], Manifest]
    ) -> Manifest:
        """The server's way: the collector edits the manifest through the log's writer (in the
        quiet phase with ``edit_only``, through the writer of the host that does not hold it)."""
        slots = self.writers if self.editor is None else [self.editor]
        for s in slots:
            w, actor, gc = s.writer, s.actor, slot.actor
            if w is not None and actor is not None and actor.alive and not w.closed:
                # The server runs both in one process: if the writer dies, so does the pass.
                if gc is not None:
                    actor.linked.append(gc)
                try:
                    return await w.edit_manifest(fn)
                finally:
                    if gc is not None and gc in actor.linked:
                        actor.linked.remove(gc)
        raise WriterClosed("no writer is open for the collector")

    def gc_step(self) -> None:
        if not self.cfg.gc:
            return
        slot = self.rng.choice(self.collectors)
        if not slot.busy:
            slot.start()

    async def gc_loop(self, slot: CollectorSlot) -> None:
        """A collector that is always on (the server's): a pass, a short rest, another pass,
        until the end of the run (the liveness check drives every collector itself)."""
        while not self.finishing:
            if not slot.busy:
                slot.start()
            # A pass of a process that died is abandoned, never awaited: poll (virtual time).
            await wait_until(lambda: not slot.busy, "the collector's pass", math.inf, 0.1)
            await asyncio.sleep(self.rng.uniform(0.05, 0.6))

    async def busy_collector(self, stop: Callable[[], bool], faulty: bool) -> None:
        """A collector that edits the manifest more often than a take-over's fence lasts, each
        edit linking nothing: a pending floor of its own announced at the oldest offset (a cut
        of nothing), then retracted, the shape of gc.py's announce and clear (``busy_gc_s``).
        It never replaces or clears another collector's floor, so the real collectors' cuts go
        on.  It runs until ``stop()``, then retracts its floor (if it can) and ends: from the
        first step until the quiet phase (its store view ``faulty``: its own edits' answers are
        lost too, and claims whose answers were lost get edited before their read-back), and
        again from the quiet phase until the liveness check begins.  The writer must go on
        acknowledging appends: every edit of its own manifest is to be rebased onto, not taken
        over (a claim and a fence each time: the adversary of 741b3dd saw a first append
        answered after 1,083 virtual seconds), and a take-over it edits must still be fenced
        (the adversary of 53ad3c8: a claim whose answer was lost, then edited)."""
        mean = self.cfg.busy_gc_s
        if mean is None:
            return
        self.busy_instances += 1
        name = f"busy.{self.busy_instances}"
        rng = random.Random(f"wal3-sim-busy:{self.cfg.seed}:{self.busy_instances}")
        view = self.sim.view(self.sim.actor(name, faulty=faulty))
        key = join(PREFIX, MANIFEST_PATH)
        poke = asyncio.Event()
        seen: list[Obj] = []  # the manifest a poke is about: edited without reading it again

        def watch(actor: Actor, k: str, old: Obj | None, new: Obj) -> None:
            # A writer's put that changed whose lease the log stands under (a take-over's claim,
            # or its first write): edit it at once, half the time, so the edit may land before
            # the taker hears back (or reads back a put whose answer was lost).
            if k != key or old is None or not actor.name.startswith("w") or stop():
                return
            if _holder(old.data) != _holder(new.data) and rng.random() < 0.5:
                seen[:] = [new]
                poke.set()

        self.sim.watchers.append(watch)
        edits = tries = 0
        while True:
            stopping = stop()
            if stopping and (self.busy_floor is None or tries >= 20):
                self.sim.watchers.remove(watch)
                self.trace(f"{name}: {edits} edits, stops")
                return
            if not stopping:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(poke.wait(), rng.expovariate(1 / mean))
                poke.clear()
            else:
                tries += 1
            try:
                if seen and not stopping:
                    obj = seen.pop()
                    m, etag = Manifest.from_bytes(obj.data), obj.etag
                else:
                    seen.clear()
                    loaded = await load_manifest(view, PREFIX)
                    if loaded is None:
                        continue
                    m, etag = loaded
                if self.busy_floor is not None and m.gc_floor != self.busy_floor:
                    self.busy_floor = None  # replaced by another collector's, or dropped
                if m.gc_floor is None and not stopping:
                    floor = GcFloor(m.oldest_offset, f"{rng.getrandbits(128):032x}")
                    new = replace(m, gc_floor=floor, writer=name)
                elif self.busy_floor is not None:
                    floor, new = None, replace(m, gc_floor=None, writer=name)
                else:
                    continue
                self.busy_floor = floor if floor is not None else self.busy_floor
                await view.put(key, new.to_bytes(), if_match=etag)
                edits += 1
                self.busy_floor = floor
            except (PreconditionFailed, StoreUnavailable, ObjectNotFound):
                pass

    async def open_editor(self) -> None:
        """The quiet phase's edit-only writer (``edit_only``): another host's writer of the log,
        open but never appending.  Its collector edits through it, and so does a loop that
        announces and retracts a floor of its own (the shape of gc.py's announce and clear),
        until the liveness check begins."""
        slot = WriterSlot(self, 9)
        if await slot.open() is None:
            return
        self.editor = slot
        self.spawn(self._edit_only_loop(slot), must_finish=True)

    async def _edit_only_loop(self, slot: WriterSlot) -> None:
        rng = random.Random(f"wal3-sim-editor:{self.cfg.seed}")
        mine: GcFloor | None = None
        edits = 0
        while True:
            w = slot.live
            if w is None:
                return
            stopping = self.finishing
            if stopping and mine is None:
                self.trace(f"editor: {edits} edits, stops")
                return
            if not stopping:
                await asyncio.sleep(rng.expovariate(1 / 0.3))
            nonce = f"{rng.getrandbits(128):032x}"

            def fn(m: Manifest, nonce: str = nonce, mine: GcFloor | None = mine) -> Manifest:
                if mine is not None and m.gc_floor == mine:
                    return replace(m, gc_floor=None)
                if m.gc_floor is None and not self.finishing:
                    return replace(m, gc_floor=GcFloor(m.oldest_offset, nonce))
                return m  # another collector's floor: never replaced

            try:
                new = await w.edit_manifest(fn)
                edits += 1
                floor = new.gc_floor
                mine = floor if floor is not None and floor.nonce == nonce else None
            except Wal3Error as e:
                self.trace(f"editor edit failed: {e!r}")
                if self.finishing:
                    return

    def gc_all(self) -> None:
        """Every idle collector starts a pass at once (the server and ``loghost gc`` together)."""
        if not self.cfg.gc:
            return
        for slot in self.collectors:
            if not slot.busy:
                slot.start()

    @property
    def gc_actor(self) -> Actor | None:
        """The first collector's current process (the one liveness is checked with)."""
        return self.collectors[0].actor

    @property
    def gc_last(self) -> str:
        return self.collectors[0].last

    async def gc_once(self, slot: CollectorSlot | None = None) -> str:
        slot = slot if slot is not None else self.collectors[0]
        gc = slot.collector()
        assert slot.actor is not None
        slot.running = slot.actor
        # (A log whose first writer has not created it yet is no failure of the collector.)
        exists = self.sim.objects.get(join(PREFIX, MANIFEST_PATH)) is not None
        name = slot.actor.name
        quiet = self.quiet  # a pass that began amid faults may still end in one
        self.model.gc_started[name] = self.loop.time()
        self.stats["gc_runs"] += 1
        self.trace(f"{name} run_once")
        try:
            report = await gc.run_once()
        except (NoCursors, StoreUnavailable, CursorConflict) as e:
            self.trace(f"{name} failed: {e!r}")
            if quiet and not isinstance(e, NoCursors):
                self.model.violate("liveness", f"{name} failed after the faults stopped: {e!r}")
            slot.last = "error"
            return "error"
        except PreconditionFailed as e:
            # Lost a compare-and-swap to the other collector: the pass ends, the next resumes.
            self.trace(f"{name} failed: {e!r}")
            if quiet and len(self.collectors) == 1:
                self.model.violate("liveness", f"{name} failed after the faults stopped: {e!r}")
            slot.last = "error"
            return "error"
        except Wal3Error as e:
            self.trace(f"{name} failed: {e!r}")
            if quiet and exists:
                self.model.violate("liveness", f"{name} failed after the faults stopped: {e!r}")
            slot.last = "error"
            return "error"
        except Exception as e:
            self.model.violate("error", f"{name}: unexpected {e!r}")
            return "error"
        self.trace(
            f"{name} -> {report.phase} cutoff={report.cutoff} "
            f"frags={report.fragments_deleted} snaps={report.snapshots_deleted} "
            f"orphans={report.orphans_deleted} {'; '.join(report.notes)}"
        )
        slot.last = report.phase
        return report.phase

    # -------------------------------------------------------------------------- cursors

    def cursor_step(self) -> None:
        r = self.rng.random()
        if r < self.cfg.emergency_p:
            name = self.rng.choice(EMERGENCY)
            if self.rng.random() < 0.4:
                self.spawn_cursor(self.delete_cursor(name))
            else:
                self.spawn_cursor(self.set_cursor(name, tail=False))
        elif r < self.cfg.emergency_p + ADVANCE_P:
            for _ in range(self.rng.choice((1, 2, 2))):
                self.spawn_cursor(self.advance_cursor())
        else:
            self.spawn_cursor(self.set_cursor(COMPACTION, tail=self.rng.random() < self.cfg.tail_p))

    async def set_cursor(self, name: str, *, tail: bool, at: int | None = None) -> None:
        """Pin an offset the way the design asks a reader to: read the manifest, write the cursor
        at or above its oldest offset, then re-read the manifest and any pending plan."""
        self.stats["cursor_ops"] += 1
        loaded = await load_manifest(self.reader_view, PREFIX)
        if loaded is None:
            return
        m0 = loaded[0]
        if at is not None:
            c = max(at, m0.oldest_offset)
        elif tail:
            c = m0.next_offset
        else:
            c = self.rng.randint(m0.oldest_offset, m0.next_offset)
        self.model.established.pop(name, None)
        try:
            cur = await self.cursors.load(name)
            w = (
                await self.cursors.init(name, c)
                if cur is None
                else await self.cursors.save(name, c, cur)
            )
        except CursorConflict as e:
            self.trace(f"cursor {name} -> {c} failed: {e!r}")
            return
        self.trace(f"cursor {name} -> {c} (oldest was {m0.oldest_offset})")
        await self.recheck(name, w.etag, c)

    async def recheck(self, name: str, etag: str, c: int) -> None:
        # The plan first, then the manifest: a plan written after this read re-reads the cursors
        # before applying (so it sees ours); one applied before it shows in the manifest read.
        pending: Garbage | None = None
        try:
            got = await self.reader_view.get(join(PREFIX, GARBAGE_PATH))
            pending = Garbage.from_bytes(got.data)
        except Wal3Error:
            pending = None
        loaded = await load_manifest(self.reader_view, PREFIX)
        if loaded is None:
            return
        m1 = loaded[0]
        cut = pending is not None and pending.first_to_keep > c
        # A collector between its pending floor and its cut (the manifest names the floor): this
        # reader does not retract it (pin_cursor does), so it does not count on its pin.
        floor = getattr(m1, "gc_floor", None)
        if floor is not None and floor.offset > c:
            cut = True
        if m1.oldest_offset <= c and not cut:
            self.model.established[name] = (etag, c)
            self.trace(f"cursor {name} @{c} established")
        else:
            self.trace(
                f"cursor {name} @{c} not established (oldest {m1.oldest_offset}, "
                f"pending cut {pending.first_to_keep if pending else None})"
            )

    def pin_step(self) -> None:
        """A reader pins a position with ``pin_cursor`` (the server's PUT of a cursor), or lets a
        pin go, racing the collectors.  The adversary knows when a plan is in flight (it reads
        the store's truth) and then likes to pin below it: a cursor that stays (an emergency
        one, which makes a collector drop the plan), then a pin a moment later."""
        name = self.rng.choice(PINS)
        floor = self._pending_cut()
        if floor is not None and self.rng.random() < 0.6:
            self.spawn_cursor(self.pin_race(name, floor))
        elif self.rng.random() < 0.3:
            self.spawn_cursor(self.delete_cursor(name))
        else:
            self.spawn_cursor(self.pin(name))

    def _pending_cut(self) -> int | None:
        """The first kept offset of a plan pending in gc/GARBAGE right now (the truth)."""
        obj = self.sim.objects.get(join(PREFIX, GARBAGE_PATH))
        if obj is None:
            return None
        try:
            g = Garbage.from_bytes(obj.data)
        except Wal3Error:
            return None
        return g.first_to_keep if g is not None and g.applied_us is None else None

    async def adversary(self) -> None:
        """Watches gc/GARBAGE (the truth) and, when a new plan is pending, races it now and
        then: a cursor below its cut a moment later, then a pin below it (``pin_race``)."""
        seen: str | None = None
        pending: int | None = None
        chance = min(1.0, self.cfg.pin_w / 3)
        while not self.finishing:
            await asyncio.sleep(self.rng.uniform(0.01, 0.05))
            if self.finishing:
                return
            obj = self.sim.objects.get(join(PREFIX, GARBAGE_PATH))
            if obj is None or obj.etag == seen:
                continue
            seen = obj.etag
            floor = self._pending_cut()
            mobj = self.sim.objects.get(join(PREFIX, MANIFEST_PATH))
            m = Manifest.from_bytes(mobj.data) if mobj is not None else None
            if (
                floor is None
                and pending is not None
                and m is not None
                and m.oldest_offset < pending
                and self.rng.random() < chance
            ):
                # A plan was dropped (a cursor pins below it) and the log is not cut: a pin
                # below it now is accepted, and must hold against whoever still has the plan.
                self.trace(f"adversary: pins below the dropped cut at {pending}")
                self.spawn_cursor(
                    self.pin(self.rng.choice(PINS), self.rng.randint(m.oldest_offset, pending - 1))
                )
            pending = floor
            if floor is not None and self.rng.random() < chance:
                await asyncio.sleep(self.rng.uniform(0.0, 1.0))
                if self.finishing:
                    return
                self.spawn_cursor(self.pin_race(self.rng.choice(PINS), floor))

    async def pin_race(self, name: str, floor: int) -> None:
        loaded = await load_manifest(self.pinner_view, PREFIX)
        if loaded is None or loaded[0].oldest_offset >= floor:
            return
        oldest = loaded[0].oldest_offset
        self.trace(f"adversary: pins below the pending cut at {floor}")
        await self.set_cursor(
            self.rng.choice(EMERGENCY), tail=False, at=self.rng.randint(oldest, floor - 1)
        )
        await asyncio.sleep(self.rng.uniform(0.05, 1.0))
        await self.pin(name, self.rng.randint(oldest, floor - 1))

    async def pin(self, name: str, at: int | None = None) -> None:
        """``pin_cursor`` at an offset inside the log as this reader last saw it: a pin it
        accepts must stay readable while it stands (``cursor-reach``) and nothing at or above it
        may be deleted (``grace``)."""
        self.stats["pins"] += 1
        loaded = await load_manifest(self.pinner_view, PREFIX)
        if loaded is None:
            return
        m0 = loaded[0]
        # Never below what this reader sees (a cursor below the log pins nothing).
        c = (
            max(at, m0.oldest_offset)
            if at is not None
            else self.rng.randint(m0.oldest_offset, m0.next_offset)
        )
        self.model.established.pop(name, None)
        try:
            cur = await self.pin_cursors.load(name)
            w = await pin_cursor(
                self.pinner_view,
                PREFIX,
                self.pin_cursors,
                name,
                c,
                cur.etag if cur is not None else None,
            )
        except LogPurged as e:
            self.trace(f"pin {name} @{c} refused: {e!r}")
            return
        except (CursorConflict, CursorNotFound) as e:
            self.trace(f"pin {name} @{c} failed: {e!r}")
            return
        self.model.established[name] = (w.etag, c)
        self.trace(f"pin {name} @{c} accepted (oldest was {m0.oldest_offset})")

    async def advance_cursor(self) -> None:
        """Move the progress cursor forward to an offset inside the log as this reader sees it,
        the way a compactor records what it has consumed; it never moves back."""
        self.stats["cursor_ops"] += 1
        loaded = await load_manifest(self.reader_view, PREFIX)
        if loaded is None:
            return
        m0 = loaded[0]
        c = self.rng.randint(m0.oldest_offset, m0.next_offset)
        try:
            w = await self.cursors.advance(PROGRESS, c)
        except CursorConflict as e:
            self.trace(f"advance {PROGRESS} -> {c} failed: {e!r}")
            return
        if w.cursor.offset < c:
            self.model.violate(
                "cursor-back", f"advance {PROGRESS} to {c} answered {w.cursor.offset}"
            )
        self.trace(f"advance {PROGRESS} -> {c}: at {w.cursor.offset}")

    async def delete_cursor(self, name: str) -> None:
        self.stats["cursor_ops"] += 1
        self.model.established.pop(name, None)
        try:
            await self.cursors.delete(name)
            self.trace(f"cursor {name} deleted")
        except CursorNotFound:
            pass

    # --------------------------------------------------------------------- reads, forks

    def read_step(self) -> None:
        self.spawn(self.read())

    async def read(self) -> None:
        """A reader on a faulty view: whatever it returns must be what the log holds.  With read
        leases, half the reads go through a live writer as the log host's do (its manifest in
        memory while its lease vouches for it, else the stored one)."""
        if self.cfg.lease_s > 0 and self.rng.random() < 0.5:
            await self.lease_read()
            return
        actor = self.sim.actor(f"rd{self.stats['reads']}")
        self.stats["reads"] += 1
        view = self.sim.view(actor)
        seen = self.model.observed[PREFIX]
        floor, acked = self.model.visible_next, self.model.acked_next
        try:
            reader = LogReader(view, PREFIX)
            m = await reader.manifest()
            self.model.saw_read(actor.name, m.next_offset, floor, acked)
            start = self.rng.randint(m.oldest_offset, max(m.oldest_offset, m.next_offset - 1))
            records = await reader.read(
                start, Limits(max_records=self.rng.randint(1, 40)), manifest=m
            )
        except (LogPurged, CorruptFragment, StoreUnavailable, LogNotFound) as e:
            self.trace(f"{actor.name} read failed: {e!r}")
            return
        for i, rec in enumerate(records):
            if rec.offset != start + i:
                self.model.violate(
                    "read", f"{actor.name} read @{rec.offset} at position {i} from {start}"
                )
                return
            had = seen.get(rec.offset)
            if had is not None and had[:2] != (rec.timestamp_us, rec.body):
                self.model.violate(
                    "read",
                    f"{actor.name} read @{rec.offset} {rec.body[:16]!r}"
                    f", the log holds {had[1][:16]!r}",
                )

    async def lease_read(self) -> None:
        """A read through a live writer: its manifest in memory when its lease vouches for it
        (renewed by a HEAD first, at times), else the stored one; monotonic, and missing no
        acknowledged record, whatever the other writers do."""
        slots = [s for s in self.writers if s.live is not None]
        if not slots:
            return
        slot = self.rng.choice(slots)
        w = slot.live
        assert w is not None and slot.actor is not None
        who = f"{slot.actor.name} (lease)"
        self.stats["reads"] += 1
        floor, acked = self.model.visible_next, self.model.acked_next
        m = await w.leased_manifest()
        if m is None and self.rng.random() < 0.5:
            try:
                if await w.confirm_lease():
                    # A HEAD that began before now: what it vouches for is judged from its start.
                    m = w.current_manifest()
            except Wal3Error as e:
                self.trace(f"{who} confirm failed: {e!r}")
        if m is None:
            try:
                m = await LogReader(self.sim.view(slot.actor), PREFIX).manifest()
            except (StoreUnavailable, CorruptFragment, LogNotFound) as e:
                self.trace(f"{who} read failed: {e!r}")
                return
        self.trace(f"{who} read up to {m.next_offset}")
        self.model.saw_read(who, m.next_offset, floor, acked)

    def fork_step(self) -> None:
        self.forks += 1
        target = f"fork{self.forks}"
        self.model.add_log(target)
        self.spawn(self.fork(target))

    async def fork(self, target: str) -> None:
        self.stats["forks"] += 1
        actor = self.sim.actor(f"fork.{target}", self.cfg.writer_crash_p)
        view = self.sim.view(actor)
        offset: int | None = None
        if self.rng.random() < 0.5:
            loaded = await load_manifest(self.reader_view, PREFIX)
            if loaded is not None:
                m = loaded[0]
                offset = self.rng.randint(m.oldest_offset, m.next_offset)
        try:
            m = await fork_log(view, PREFIX, target, from_offset=offset, writer_name=actor.name)
            self.trace(f"forked {target} at [{m.oldest_offset},{m.next_offset})")
        except (LogPurged, LogExists, LogNotFound, StoreUnavailable, CorruptFragment) as e:
            self.trace(f"fork {target} failed: {e!r}")
