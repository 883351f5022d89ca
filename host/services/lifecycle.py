"""A log's lifecycle and verification: seal, fork, a GC pass on request, scrub."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from wal3 import LogPurged, ObjectStore
from wal3.paths import log_prefix
from wal3.scrub import scrub_log

from ..errors import BadRequest, NotFound
from ..forks import fork_collection
from ..manager import LogManager
from ..metrics import Metrics
from ..models import LogState
from .dirtyset import HostDirtyLog
from .gc import GcScheduler
from .logview import log_state, stored_compaction_offset


class LifecycleService:
    """Seals, forks, collects and scrubs collection logs, through the log manager."""

    def __init__(
        self,
        store: ObjectStore,
        manager: LogManager,
        dirty: HostDirtyLog,
        gc: GcScheduler,
        metrics: Metrics,
        server_id: str,
    ) -> None:
        self._store = store
        self._manager = manager
        self._dirty = dirty
        self._gc = gc
        self._metrics = metrics
        self._writer_name = f"loghost:{server_id}"

    async def seal(self, tenant: str, cid: UUID) -> LogState:
        """Seal the log (appends then answer 409); its state after."""
        async with self._manager.use(cid, tenant) as h:
            writer = h.writer
            await writer.seal()
            state = await log_state(self._manager, h)
        # Like an append: no read anywhere may miss what this answer acknowledges (a take-over's
        # fence), waited for outside use() so it pins no open-log slot.
        await writer.wait_fence()
        return state

    async def fork(self, tenant: str, cid: UUID, target: UUID, offset: int | None) -> LogState:
        """Fork the log into ``target`` from ``offset`` (default: its compaction cursor); the
        target's state."""
        if target == cid:
            raise BadRequest("target_collection_id: must differ from the source")
        async with self._manager.use(cid, tenant) as h:
            if offset is None:
                offset = await stored_compaction_offset(h)
            m = await self._manager.view(h)  # another host may have written the log
            if offset > m.next_offset:
                raise BadRequest(f"offset: {offset} is past the log's tail {m.next_offset}")
            if offset < m.oldest_offset:
                raise LogPurged(offset, m.oldest_offset)
            owner = await self._manager.bind(target, tenant)
            if owner != tenant:
                raise NotFound(f"no log {target} for tenant {tenant}")
            # The target's cursor, compacted base and dirty mark are all in place before its
            # manifest makes it visible (host/forks.py); the mark goes through our dirty set.
            forked = await fork_collection(
                self._store,
                source=cid,
                target=target,
                source_prefix=h.prefix,
                target_prefix=log_prefix(target),
                source_manifest=m,
                offset=offset,
                writer_name=self._writer_name,
                mark_dirty=self._dirty.mark,
                claims=self._manager.claims,
            )
        async with self._manager.use(target, tenant) as t:
            t.note_compaction(forked.compaction_offset)
            return await log_state(self._manager, t)

    async def collect(self, tenant: str, cid: UUID) -> dict[str, Any]:
        """One garbage-collection pass over the log now; its report."""
        async with self._manager.use(cid, tenant) as h:
            writer = h.writer
            report = await self._gc.collect(h)
        await writer.wait_fence()  # its manifest edit is acknowledged: as for an append
        return {
            "phase": report.phase,
            "cutoff": report.cutoff,
            "fragments_deleted": report.fragments_deleted,
            "snapshots_deleted": report.snapshots_deleted,
            "orphans_deleted": report.orphans_deleted,
            "waiting_s": report.waiting_s,
            "notes": report.notes,
        }

    async def scrub(self, tenant: str, cid: UUID) -> dict[str, Any]:
        """Verify the log end to end from its objects; the report."""
        async with self._manager.use(cid, tenant) as h:
            report = await scrub_log(self._store, h.prefix)
        if not report.ok:
            self._metrics.scrub_failures.inc()
        return {
            "ok": report.ok,
            "problems": report.problems,
            "fragments": report.fragments,
            "snapshots": report.snapshots,
            "records": report.records,
            "bytes": report.bytes,
            "setsum": report.setsum,
        }
