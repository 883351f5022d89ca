"""The log host's components and their lifecycle: store, leader hint, log manager, dirty log, GC."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import replace
from uuid import UUID

from dirtylog import (
    DirtyLogHook,
    HandOverResult,
    RollUp,
    RollUpResult,
    hand_over,
    missing_from_dirty_set,
)
from wal3 import LogWriter, LogWriterOptions, ObjectStore, open_store
from wal3.gc import GarbageCollector, GcOptions, GcReport

from .auth import Authenticator
from .config import Settings
from .dirty import (
    DirtyLog,
    StoredDirtyLog,
    WalDirtyBackend,
    compaction_offsets_from_store,
    dirty_prefix,
)
from .errors import BadRequest, NotFound
from .leader import LeaderHint, leader_hint_from_url
from .manager import LogHandle, LogManager, log_prefix
from .metrics import Metrics, gc_failure_reason

_log = logging.getLogger("loghost.server")
# Server ids a dirty log may be adopted from: pod names and the like, never a path.
_SERVER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")


class _CompactionOffsets:
    """``dirtylog.CompactionOffsets`` backed by the manager's memory and the store."""

    def __init__(self, server: Server) -> None:
        self._server = server

    async def compaction_offsets(self, ids: Sequence[UUID]) -> dict[UUID, int]:
        known = {h.collection_id: h.compaction_offset for h in self._server.manager.handles()}
        return await compaction_offsets_from_store(self._server.store, ids, log_prefix, known)


class Server:
    """Everything one log host runs; ``start``/``close`` bracket its life."""

    def __init__(
        self,
        settings: Settings,
        *,
        store: ObjectStore | None = None,
        leader: LeaderHint | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = Metrics()
        self.metrics.buffered_bytes_limit.set(settings.max_buffered_bytes)
        self.auth = Authenticator.from_settings(settings)
        self.store: ObjectStore = store if store is not None else open_store(settings.store)
        self.leader: LeaderHint = (
            leader
            if leader is not None
            else leader_hint_from_url(
                settings.redis_url,
                settings.server_id,
                settings.public_url,
                ttl_ms=settings.leader_ttl_ms,
                on_failure=self._hint_failed,
                on_lost=self._hint_lost,
            )
        )
        self.manager = LogManager(self.store, settings, self.metrics, self.leader, self._mark_dirty)
        self.dirty: DirtyLog | None = None
        self._gc_due: dict[UUID, float] = {}
        self._purged: set[UUID] = set()
        self._dirty_lock = asyncio.Lock()
        self._gc_wake = asyncio.Event()
        self._gc_task: asyncio.Task[None] | None = None
        self._rollup_task: asyncio.Task[None] | None = None
        self._started = False

    @property
    def gc_options(self) -> GcOptions:
        """Options of every collector this server runs."""
        return GcOptions(
            grace_s=self.settings.gc_grace_s,
            deletes_per_second=self.settings.gc_deletes_per_second,
            max_fraction=self.settings.gc_max_fraction,
            writer_name=f"loghost-gc:{self.settings.server_id}",
        )

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Open the dirty log, start the leader hint, the idle closer, roll-ups and GC."""
        await self.leader.start()
        self.dirty = await self._open_dirty()
        self.manager.start()
        self._rollup_task = asyncio.create_task(self._rollup_loop(), name="rollup-loop")
        self._gc_task = asyncio.create_task(self._gc_loop(), name="gc-loop")
        self._started = True
        _log.info("log host %s started on store %s", self.settings.server_id, self.store)

    async def begin_drain(self) -> None:
        """Shutdown began (before the HTTP drain): release idle logs' hints, wake long-polls."""
        await self.manager.begin_drain()

    async def close(self) -> None:
        """Graceful shutdown: stop background work, flush every open log, release everything."""
        for task in (self._gc_task, self._rollup_task):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        await self.manager.close()
        if self.dirty is not None:
            await self.dirty.close()
        await self.leader.close()
        await self.store.close()
        _log.info("log host %s stopped", self.settings.server_id)

    # -------------------------------------------------------------------------- dirty log

    async def _open_dirty(self) -> DirtyLog:
        prefix = dirty_prefix(self.settings.server_id)
        writer = await LogWriter.open(
            self.store,
            prefix,
            LogWriterOptions(
                writer_name=f"loghost:{self.settings.server_id}",
                batch_interval_s=self.settings.batch_interval_ms / 1000.0,
                snapshot_max_age_s=max(0.001, min(60.0, self.settings.gc_grace_s / 2)),
            ),
        )
        # The dirty log is read by roll-ups, not compactors: no intrinsic compaction cursor.
        backend = WalDirtyBackend(
            self.store, prefix, writer, replace(self.gc_options, intrinsic_cursor=None)
        )
        return DirtyLog(backend, RollUp(backend, _CompactionOffsets(self)), DirtyLogHook(backend))

    async def _mark_dirty(self, cid: UUID, first_offset: int, count: int) -> None:
        assert self.dirty is not None, "server not started"
        if self.dirty.backend.writer.failed is not None:
            async with self._dirty_lock:
                if self.dirty.backend.writer.failed is not None:
                    # The dirty log's writer died under a store crash: reopen it (read repair
                    # links what it left); the roll-up set is rebuilt by the next roll-up.
                    _log.warning("reopening the dirty log after writer failure")
                    self.dirty = await self._open_dirty()
        await self.dirty.mark(cid, first_offset, count)
        self._purged.discard(cid)  # a write after a purge makes it dirty again

    async def purge(self, ids: list[UUID]) -> int | None:
        """Drop collections from the dirty set (e.g. deleted ones)."""
        assert self.dirty is not None
        first = await self.dirty.rollup.purge(ids)
        self._purged.update(ids)
        return first

    async def adopt_dirty(self, server_id: str) -> HandOverResult:
        """Take over the dirty set of a server that is gone (``POST /v1/dirty/adopt``).

        Its still-dirty collections are appended to our dirty log, then its cursor moves past
        them (see ``dirtylog.hand_over``); our roll-up then serves them to compactors.
        """
        assert self.dirty is not None
        if server_id == self.settings.server_id:
            raise BadRequest("server_id: this server's own dirty log cannot be adopted")
        if not _SERVER_ID.fullmatch(server_id):
            raise BadRequest(
                "server_id: letters, digits, '.', '_' and '-', starting with a "
                "letter or digit, at most 253"
            )
        source = await StoredDirtyLog.load(
            self.store, dirty_prefix(server_id), f"loghost:{self.settings.server_id}:adopt"
        )
        if source is None:
            raise NotFound(f"no dirty log for server {server_id!r}")
        result = await hand_over(source, self.dirty.backend, _CompactionOffsets(self))
        _log.info(
            "adopted the dirty log of %s: %d collection(s), %d record(s) read",
            server_id,
            result.collections,
            result.records_read,
        )
        await self.rollup_now()
        return result

    async def rollup_now(self) -> RollUpResult:
        """Roll the dirty log up immediately (``POST /v1/dirty/rollup``)."""
        assert self.dirty is not None
        known = self._known_offsets()
        started = time.monotonic()
        try:
            result = await self.dirty.run_now()
        except Exception:
            self.metrics.rollup_failures.inc()
            raise
        self.metrics.rollup_duration.observe(time.monotonic() - started)
        self._record_rollup(result, known)
        return result

    def _known_offsets(self) -> dict[UUID, int]:
        return {h.collection_id: h.writer.manifest.next_offset for h in self.manager.handles()}

    async def _rollup_loop(self) -> None:
        """Roll up every ``rollup_interval_s``; a failed run is counted and retried next time."""
        while True:
            try:
                await self.rollup_now()
            except Exception:
                _log.exception("dirty-log roll-up failed")
            await asyncio.sleep(self.settings.rollup_interval_s)  # the period, not a sync

    def _record_rollup(self, result: RollUpResult, known_before: dict[UUID, int]) -> None:
        self.metrics.reinsertions.inc(result.reinserted)
        entries = result.entries
        self.metrics.dirty_collections.set(len(entries))
        now_us = time.time_ns() // 1000
        oldest = min((e.first_insertion_us for e in entries.values()), default=now_us)
        self.metrics.dirty_oldest_age.set(max(0.0, (now_us - oldest) / 1e6))
        # The invariant: every open log with uncompacted records that were written before the
        # roll-up began is in the dirty set.  Open logs are what this server can check cheaply.
        if known_before is not None:
            self.metrics.untracked.set(len(self.untracked_collections(known_before)))

    def untracked_collections(self, known_before: dict[UUID, int]) -> set[UUID]:
        """Open logs written before a roll-up whose uncompacted records it does not list."""
        assert self.dirty is not None
        offsets = {h.collection_id: h.compaction_offset for h in self.manager.handles()}
        known = {
            cid: (nxt, offsets.get(cid, 1))
            for cid, nxt in known_before.items()
            if cid not in self._purged
        }
        return missing_from_dirty_set(known, self.dirty.rollup.entries())

    # --------------------------------------------------------------------------- leader hint

    def _hint_failed(self, _exc: BaseException) -> None:
        self.metrics.leader_hint_failures.inc()

    def _hint_lost(self, collection_id: str):  # type: ignore[no-untyped-def]
        # Returned, not spawned: the hint tracks the task and waits for it on close.
        return self.manager.lost_leadership(collection_id)

    # ------------------------------------------------------------------------------------ gc

    def schedule_gc(self, cid: UUID, delay_s: float = 0.0) -> None:
        """Ask the always-on collector to visit a log."""
        due = time.monotonic() + delay_s
        self._gc_due[cid] = min(self._gc_due.get(cid, due), due)
        self._gc_wake.set()

    async def collect(self, h: LogHandle) -> GcReport:
        """One garbage-collection pass over an open log, through its writer."""
        gc = GarbageCollector(
            self.store, h.prefix, self.gc_options, edit_manifest=h.writer.edit_manifest
        )
        try:
            async with h.lock:  # one collector per log in this process (manual and always-on)
                report = await gc.run_once()
        except Exception as e:
            self.metrics.gc_failures.labels(gc_failure_reason(e)).inc()
            raise
        self.metrics.gc_runs.labels(report.phase).inc()
        if report.fragments_deleted:
            self.metrics.gc_deleted.labels("fragment").inc(report.fragments_deleted)
        if report.snapshots_deleted:
            self.metrics.gc_deleted.labels("snapshot").inc(report.snapshots_deleted)
        if report.orphans_deleted:
            self.metrics.gc_deleted.labels("orphan").inc(report.orphans_deleted)
        if report.phase in ("computed", "applied"):
            self.schedule_gc(h.collection_id, self.settings.gc_grace_s)
        elif report.phase == "waiting":
            self.schedule_gc(h.collection_id, report.waiting_s)
        elif report.phase == "busy":
            self.schedule_gc(h.collection_id, self.settings.gc_interval_s)
        return report

    async def _gc_loop(self) -> None:
        """Always on: visit logs whose compaction moved, one at a time (deletes are rate limited)."""
        while True:
            now = time.monotonic()
            due = [cid for cid, t in self._gc_due.items() if t <= now]
            for cid in due:
                self._gc_due.pop(cid, None)
                try:
                    tenant = await self.manager.binding(cid)
                    if tenant is None:
                        continue
                    async with self.manager.use(cid, tenant) as h:
                        await self.collect(h)
                except Exception as e:
                    _log.warning("gc of %s failed: %r", cid, e)
                    self.schedule_gc(cid, self.settings.gc_interval_s)
            nxt = min(self._gc_due.values(), default=None)
            timeout = self.settings.gc_interval_s if nxt is None else max(0.0, nxt - now)
            self._gc_wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._gc_wake.wait(), timeout)
