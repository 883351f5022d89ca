"""The server's dirty log as the rest of the host sees it: marks on the write path, purges, and
the rolled-up dirty set (``dirtylog``'s roll-up over ``host.dirty``'s wal3 adapters)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from uuid import UUID

from dirtylog import DirtyEntry, InspectedRecord, inspect_records

from ..dirty import DirtyLog

_log = logging.getLogger("loghost.server")

OpenDirtyLog = Callable[[], Awaitable[DirtyLog]]


class HostDirtyLog:
    """Owns the open dirty log: reopens it when its writer failed, marks fragments, purges.

    ``purged`` is the collections purged from the dirty set and not written since: the untracked
    check leaves them out (a purge is an operator's word that they need no compaction).
    """

    def __init__(self, open_log: OpenDirtyLog) -> None:
        self._open_log = open_log
        self._log: DirtyLog | None = None
        self._reopen = asyncio.Lock()
        self._purged: set[UUID] = set()

    @property
    def log(self) -> DirtyLog | None:
        """The open dirty log (None before ``open``)."""
        return self._log

    def opened(self) -> DirtyLog:
        """The open dirty log; only called once the server started."""
        assert self._log is not None, "server not started"
        return self._log

    async def open(self) -> None:
        """Open (or create) the dirty log."""
        self._log = await self._open_log()

    async def close(self) -> None:
        """Flush and close the dirty log."""
        if self._log is not None:
            await self._log.close()

    @property
    def purged(self) -> frozenset[UUID]:
        """Collections purged and not written since."""
        return frozenset(self._purged)

    async def mark(self, cid: UUID, first_offset: int, count: int) -> None:
        """The fragment hook of every collection log: mark ``[first_offset, +count)`` dirty
        (a failed mark fails the collection write)."""
        log = self.opened()
        if log.backend.writer.failed is not None:
            async with self._reopen:
                if self.opened().backend.writer.failed is not None:
                    # The dirty log's writer died under a store crash: reopen it (read repair
                    # links what it left).  The new roll-up rebuilds the set at its first pass;
                    # until then it serves the old one's (nothing listed clean while dirty).
                    _log.warning("reopening the dirty log after writer failure")
                    reopened = await self._open_log()
                    reopened.rollup.carry_over(self.opened().rollup)
                    self._log = reopened
            log = self.opened()
        await log.mark(cid, first_offset, count)
        self._purged.discard(cid)  # a write after a purge makes it dirty again

    async def purge(self, ids: list[UUID]) -> int | None:
        """Drop collections from the dirty set (e.g. deleted ones); the first purge record's
        offset."""
        first = await self.opened().rollup.purge(ids)
        self._purged.update(ids)
        return first

    async def compacted(self, cid: UUID, offset: int) -> None:
        """A compactor moved ``cid``'s compaction cursor to ``offset`` (a clear record: no
        cursor read by roll-ups)."""
        if self._log is not None:
            await self._log.compacted(cid, offset)

    async def uncompacted(self, cid: UUID, offset: int, tail: int) -> None:
        """``cid``'s compaction cursor moved BACK to ``offset`` (a PUT or DELETE of it): make
        ``[offset, tail)`` dirty again in the dirty log (a purge, then a mark) before answering.
        A failure fails the request: the cursor moved, and only this makes it known."""
        await self.opened().rollup.uncompacted(cid, offset, tail)
        self._purged.discard(cid)

    def entries(self) -> dict[UUID, DirtyEntry]:
        """The dirty set as of the last roll-up (plus compactions noted since)."""
        return self.opened().rollup.entries()

    def select(
        self,
        min_records: int,
        limit: int,
        max_age_s: float | None = None,
        max_reinserts: int | None = None,
    ) -> list[DirtyEntry]:
        """Qualifying entries, best first."""
        return self.opened().rollup.select(
            min_records, limit, max_age_s=max_age_s, max_reinserts=max_reinserts
        )

    async def inspect(self, from_offset: int | None, limit: int) -> list[InspectedRecord]:
        """Up to ``limit`` raw records decoded, from ``from_offset`` (default: the oldest)."""
        backend = self.opened().backend
        start = from_offset if from_offset is not None else await backend.oldest_offset()
        return await inspect_records(backend, start, limit)
