"""The engine's actors as the seed drives them: writer processes, the collector, readers, forks.

Each actor is a process with its own store view; a crash (chosen by the store at any operation, or
by the driver) abandons everything it was doing.  Every outcome an actor sees is reported to the
model; an outcome no correct engine may give is a violation.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from host.wal3.cursors import COMPACTION, CursorStore
from host.wal3.errors import (
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
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from host.wal3.fork import fork_log
from host.wal3.gc import Garbage, GarbageCollector, GcOptions
from host.wal3.layout import GARBAGE_PATH, join, load_manifest
from host.wal3.manifest import Manifest
from host.wal3.reader import Limits, LogReader
from host.wal3.writer import FragmentInfo, LogWriter, LogWriterOptions

from .config import RunConfig
from .loop import SimLoop, VirtualClock, wall_s
from .model import Attempt, Model, encode_body
from .store import Actor, ActorView, Latency, SimStore

PREFIX = "log0"
# Readers are exempt from store faults and slow tails: the design requires a reader to finish
# writing a cursor well within the grace interval, and a fault storm could stretch that.
READER_LATENCY = Latency(p_tail=0.0)
EMERGENCY = ("emergency0", "emergency1", "emergency2")


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
        actor = world.sim.actor(f"w{self.idx}.{self.instance}",
                                0.0 if world.quiet else world.cfg.writer_crash_p)
        self.actor, self.writer, self.opening = actor, None, True
        cfg = world.cfg
        opts = LogWriterOptions(
            writer_name=actor.name, batch_size_bytes=cfg.batch_bytes,
            max_inflight_fragments=cfg.pipeline,
            snapshot_fragment_threshold=cfg.snapshot_fragment_threshold,
            snapshot_threshold=cfg.snapshot_threshold, dedup_window_fragments=cfg.window,
            clock=world.clock)
        world.trace(f"{actor.name} opening")
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
            world.trace(f"{actor.name} open at [{w.manifest.oldest_offset},"
                        f"{w.manifest.next_offset}) seq {w.manifest.next_seq_no}")
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


class World:
    """Everything one run drives: the store, the model, the actors, the tasks in flight."""

    def __init__(self, loop: SimLoop, cfg: RunConfig, sim: SimStore, model: Model,
                 rng: random.Random, trace: Callable[[str], None]) -> None:
        self.loop = loop
        self.cfg = cfg
        self.sim = sim
        self.model = model
        self.rng = rng
        self.trace = trace
        self.clock = VirtualClock(loop)
        self.quiet = False
        self.writers = [WriterSlot(self, i) for i in range(cfg.writers)]
        self.gc_actor: Actor | None = None
        self.gc: GarbageCollector | None = None
        self.gc_task: asyncio.Task[None] | None = None
        self.gc_instances = 0
        self.gc_last: str = ""
        self.reader = sim.actor("reader", faulty=False, latency=READER_LATENCY)
        self.reader_view = sim.view(self.reader)
        self.cursors = CursorStore(self.reader_view, PREFIX, "reader", clock=self.clock)
        self.forks = 0
        self.opened: list[tuple[Actor, LogWriter]] = []  # every writer process ever opened
        self.tasks: list[tuple[asyncio.Task[Any], bool]] = []  # (task, must finish)
        self.stats: dict[str, int] = {"appends": 0, "gc_runs": 0, "forks": 0, "reads": 0,
                                      "cursor_ops": 0, "reopens": 0, "seals": 0}

    def spawn(self, coro: Coroutine[Any, Any, Any], must_finish: bool = False) -> None:
        self.tasks.append((self.loop.create_task(coro), must_finish))

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
        failed = [a for a in self.model.attempts.values()
                  if a.key is not None and a.outcome in ("failed", "lost", "pending")
                  and a.id == max(self.model.logicals[a.logical])]
        slots = [s for s in self.writers if s.live is not None]
        if not failed or not slots:
            return
        orig = self.rng.choice(failed[-8:])
        slot = self.rng.choice(slots)
        assert slot.writer is not None and slot.actor is not None
        a = self.model.new_attempt(orig.logical, orig.key, orig.count, slot.actor.name,
                                   slot.actor.started_at)
        self.trace(f"retry of a{orig.id} as a{a.id} key={a.key} on {slot.actor.name}")
        self.spawn(self.append(slot.writer, a), must_finish=self.quiet)

    async def append(self, w: LogWriter, a: Attempt) -> None:
        self.stats["appends"] += 1
        quiet = self.quiet
        bodies = [encode_body(a.id, i, self.rng.randint(0, self.cfg.pad)) for i in range(a.count)]
        self.trace(f"append a{a.id} x{a.count} key={a.key} on {a.writer}")
        try:
            r = await w.append_many(bodies, idempotency_key=a.key)
        except LogContention as e:
            self.model.settle(a, "contention", error=e)
        except (StoreUnavailable, LogSealed, WriterClosed, Backpressure, HookFailed) as e:
            self.model.settle(a, "failed", error=e)
            if quiet and not isinstance(e, LogSealed):
                self.model.violate("liveness", f"a{a.id} failed after the faults stopped: {e!r}")
            return
        except Exception as e:  # noqa: BLE001 - any other answer is a bug
            self.model.settle(a, "failed", error=e)
            self.model.violate("error", f"a{a.id}: unexpected {e!r}")
            return
        else:
            self.model.settle(a, "dedup" if r.deduplicated else "acked", r)
            return
        if quiet:
            self.model.violate("liveness", f"a{a.id} answered LogContention after the faults "
                               "stopped")

    # ------------------------------------------------------------------------ lifecycle

    def open_some(self) -> None:
        idle = [s for s in self.writers if s.live is None and not s.opening
                and (s.actor is None or not s.actor.alive or s.writer is None or s.writer.closed)]
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
        if self.gc_actor is not None and self.gc_actor.alive:
            victims.append(self.gc_actor)
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

    async def _edit_via_writer(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        """The server's way: the collector edits the manifest through the log's writer."""
        for s in self.writers:
            w, actor, gc = s.writer, s.actor, self.gc_actor
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
        if not self.cfg.gc or (self.gc_task is not None and not self.gc_task.done()
                               and self.gc_actor is not None and self.gc_actor.alive):
            return
        self.gc_task = self.loop.create_task(self.gc_once())
        self.tasks.append((self.gc_task, self.quiet))

    def _collector(self) -> GarbageCollector:
        if self.gc is None or self.gc_actor is None or not self.gc_actor.alive:
            self.gc_instances += 1
            self.gc_actor = self.sim.actor(f"gc.{self.gc_instances}",
                                           0.0 if self.quiet else self.cfg.gc_crash_p)
            opts = GcOptions(grace_s=self.cfg.grace_s, delete_batch=self.cfg.delete_batch,
                             deletes_per_second=float("inf"), writer_name=self.gc_actor.name,
                             retain_fragments=self.cfg.window, retain_s=600.0)
            edit: Callable[[Callable[[Manifest], Manifest]], Awaitable[Manifest]] | None = (
                self._edit_via_writer if self.cfg.gc_via_writer else None)
            self.gc = GarbageCollector(self.sim.view(self.gc_actor), PREFIX, opts,
                                       edit_manifest=edit, clock=lambda: wall_s(self.loop))
        return self.gc

    async def gc_once(self) -> str:
        gc = self._collector()
        assert self.gc_actor is not None
        name = self.gc_actor.name
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
            self.gc_last = "error"
            return "error"
        except Wal3Error as e:
            self.trace(f"{name} failed: {e!r}")
            if quiet:
                self.model.violate("liveness", f"{name} failed after the faults stopped: {e!r}")
            self.gc_last = "error"
            return "error"
        except Exception as e:  # noqa: BLE001 - any other failure is a bug
            self.model.violate("error", f"{name}: unexpected {e!r}")
            return "error"
        self.trace(f"{name} -> {report.phase} cutoff={report.cutoff} "
                   f"frags={report.fragments_deleted} snaps={report.snapshots_deleted} "
                   f"orphans={report.orphans_deleted} {'; '.join(report.notes)}")
        self.gc_last = report.phase
        return report.phase

    # -------------------------------------------------------------------------- cursors

    def cursor_step(self) -> None:
        r = self.rng.random()
        if r < self.cfg.emergency_p:
            name = self.rng.choice(EMERGENCY)
            if self.rng.random() < 0.4:
                self.spawn(self.delete_cursor(name), must_finish=self.quiet)
            else:
                self.spawn(self.set_cursor(name, tail=False), must_finish=self.quiet)
        else:
            self.spawn(self.set_cursor(COMPACTION, tail=self.rng.random() < self.cfg.tail_p),
                       must_finish=self.quiet)

    async def set_cursor(self, name: str, *, tail: bool, at: int | None = None) -> None:
        """Pin an offset the way the design asks a reader to: read the manifest, write the cursor
        at or above its oldest offset, then re-read the manifest and any pending plan."""
        self.stats["cursor_ops"] += 1
        loaded = await load_manifest(self.reader_view, PREFIX)
        if loaded is None:
            return
        m0 = loaded[0]
        if at is not None:
            c = at
        elif tail:
            c = m0.next_offset
        else:
            c = self.rng.randint(m0.oldest_offset, m0.next_offset)
        self.model.established.pop(name, None)
        try:
            cur = await self.cursors.load(name)
            w = (await self.cursors.init(name, c) if cur is None
                 else await self.cursors.save(name, c, cur))
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
        if m1.oldest_offset <= c and not cut:
            self.model.established[name] = (etag, c)
            self.trace(f"cursor {name} @{c} established")
        else:
            self.trace(f"cursor {name} @{c} not established (oldest {m1.oldest_offset}, "
                       f"pending cut {pending.first_to_keep if pending else None})")

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
        """A reader on a faulty view: whatever it returns must be what the log holds."""
        actor = self.sim.actor(f"rd{self.stats['reads']}")
        self.stats["reads"] += 1
        view = self.sim.view(actor)
        seen = self.model.observed[PREFIX]
        try:
            reader = LogReader(view, PREFIX)
            m = await reader.manifest()
            start = self.rng.randint(m.oldest_offset, max(m.oldest_offset, m.next_offset - 1))
            records = await reader.read(start, Limits(max_records=self.rng.randint(1, 40)),
                                        manifest=m)
        except (LogPurged, CorruptFragment, StoreUnavailable, LogNotFound) as e:
            self.trace(f"{actor.name} read failed: {e!r}")
            return
        for i, rec in enumerate(records):
            if rec.offset != start + i:
                self.model.violate("read", f"{actor.name} read @{rec.offset} at position {i} "
                                   f"from {start}")
                return
            had = seen.get(rec.offset)
            if had is not None and had[:2] != (rec.timestamp_us, rec.body):
                self.model.violate("read", f"{actor.name} read @{rec.offset} {rec.body[:16]!r}"
                                   f", the log holds {had[1][:16]!r}")

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
