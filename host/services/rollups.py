"""Roll-up scheduling: the dirty log rolled up every ``rollup_interval_s`` or on request, with its
metrics and the untracked check after each run."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from dirtylog import RollUpResult

from ..config import Settings
from ..metrics import Metrics
from .dirtyset import HostDirtyLog
from .untracked import UntrackedCheck

_log = logging.getLogger("loghost.server")


class RollupScheduler:
    """Runs roll-ups of the server's dirty log, periodically and on demand."""

    def __init__(
        self, dirty: HostDirtyLog, untracked: UntrackedCheck, metrics: Metrics, settings: Settings
    ) -> None:
        self._dirty = dirty
        self._untracked = untracked
        self._metrics = metrics
        self._interval_s = settings.rollup_interval_s
        self._task: asyncio.Task[None] | None = None
        self._after: list[Callable[[RollUpResult], Awaitable[None]]] = []

    def after_each_pass(self, fn: Callable[[RollUpResult], Awaitable[None]]) -> None:
        """Call ``fn`` with each successful pass's result, before ``run_now`` returns (it must
        not raise: the pass itself succeeded)."""
        self._after.append(fn)

    def start(self) -> None:
        """Start rolling up every interval."""
        self._task = asyncio.create_task(self._loop(), name="rollup-loop")

    async def close(self) -> None:
        """Stop the periodic roll-ups (one under way is cancelled; the next converges)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def run_now(self) -> RollUpResult:
        """Roll the dirty log up immediately (``POST /v1/dirty/rollup``)."""
        log = self._dirty.opened()
        known = self._untracked.tails()
        started = time.monotonic()
        try:
            result = await log.run_now()
        except Exception:
            self._metrics.rollup_failures.inc()
            raise
        self._metrics.rollup_duration.observe(time.monotonic() - started)
        self._record(result)
        self._untracked.record(known)
        for fn in self._after:
            await fn(result)
        return result

    def _record(self, result: RollUpResult) -> None:
        self._metrics.reinsertions.inc(result.reinserted)
        self._metrics.dirty_fallback_lookups.labels("compaction").inc(result.compaction_lookups)
        self._metrics.dirty_fallback_lookups.labels("tail").inc(result.tail_lookups)
        self._metrics.dirty_log_records.set(result.retained)
        entries = result.entries
        self._metrics.dirty_collections.set(len(entries))
        now_us = time.time_ns() // 1000
        oldest = min((e.first_insertion_us for e in entries.values()), default=now_us)
        self._metrics.dirty_oldest_age.set(max(0.0, (now_us - oldest) / 1e6))

    async def _loop(self) -> None:
        """A failed run is counted and retried next time."""
        while True:
            try:
                await self.run_now()
            except Exception:
                _log.exception("dirty-log roll-up failed")
            await asyncio.sleep(self._interval_s)  # the period, not a sync
