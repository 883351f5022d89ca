"""GC scheduling: the always-on collector's queue of logs to visit, and one pass over a log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from uuid import UUID

from wal3 import ObjectStore
from wal3.gc import GarbageCollector, GcOptions, GcReport

from ..config import Settings
from ..manager import LogHandle, LogManager
from ..metrics import Metrics, gc_failure_reason

_log = logging.getLogger("loghost.server")


def gc_options(settings: Settings) -> GcOptions:
    """Options of every collector a server with ``settings`` runs."""
    return GcOptions(
        grace_s=settings.gc_grace_s,
        deletes_per_second=settings.gc_deletes_per_second,
        max_fraction=settings.gc_max_fraction,
        writer_name=f"loghost-gc:{settings.server_id}",
    )


class GcScheduler:
    """Visits logs whose compaction moved, one at a time (deletes are rate limited), and again
    when a pass says when (the grace of a plan, a wait, a busy log); runs a pass on request."""

    def __init__(
        self, store: ObjectStore, manager: LogManager, metrics: Metrics, settings: Settings
    ) -> None:
        self._store = store
        self._manager = manager
        self._metrics = metrics
        self._settings = settings
        self.options = gc_options(settings)
        self._due: dict[UUID, float] = {}  # log -> when to visit it (monotonic)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the always-on collector."""
        self._task = asyncio.create_task(self._loop(), name="gc-loop")

    async def close(self) -> None:
        """Stop it (a pass under way is cancelled; the next start resumes from the store)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def schedule(self, cid: UUID, delay_s: float = 0.0) -> None:
        """Ask the always-on collector to visit a log."""
        due = time.monotonic() + delay_s
        self._due[cid] = min(self._due.get(cid, due), due)
        self._wake.set()

    async def collect(self, h: LogHandle) -> GcReport:
        """One garbage-collection pass over an open log, through its writer."""
        gc = GarbageCollector(
            self._store, h.prefix, self.options, edit_manifest=h.writer.edit_manifest
        )
        try:
            async with h.lock:  # one collector per log in this process (manual and always-on)
                report = await gc.run_once()
        except Exception as e:
            self._metrics.gc_failures.labels(gc_failure_reason(e)).inc()
            raise
        self._metrics.gc_runs.labels(report.phase).inc()
        if report.fragments_deleted:
            self._metrics.gc_deleted.labels("fragment").inc(report.fragments_deleted)
        if report.snapshots_deleted:
            self._metrics.gc_deleted.labels("snapshot").inc(report.snapshots_deleted)
        if report.orphans_deleted:
            self._metrics.gc_deleted.labels("orphan").inc(report.orphans_deleted)
        if report.phase in ("computed", "applied"):
            self.schedule(h.collection_id, self._settings.gc_grace_s)
        elif report.phase == "waiting":
            self.schedule(h.collection_id, report.waiting_s)
        elif report.phase == "busy":
            self.schedule(h.collection_id, self._settings.gc_interval_s)
        return report

    async def _loop(self) -> None:
        while True:
            now = time.monotonic()
            due = [cid for cid, t in self._due.items() if t <= now]
            for cid in due:
                self._due.pop(cid, None)
                try:
                    tenant = await self._manager.binding(cid)
                    if tenant is None:
                        continue
                    async with self._manager.use(cid, tenant) as h:
                        await self.collect(h)
                except Exception as e:
                    _log.warning("gc of %s failed: %r", cid, e)
                    self.schedule(cid, self._settings.gc_interval_s)
            nxt = min(self._due.values(), default=None)
            timeout = self._settings.gc_interval_s if nxt is None else max(0.0, nxt - now)
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)
