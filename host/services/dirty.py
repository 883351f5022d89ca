"""The dirty set as the API serves it: listings with each collection's tenant, roll-ups and
adoptions on request, purges, raw records for operators."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from dirtylog import DirtyEntry

from ..config import Settings
from ..manager import LogManager
from ..models import AdoptResponse, DirtyLogOut, DirtyResponse
from .adoption import Adoption
from .dirtyset import HostDirtyLog
from .rollups import RollupScheduler


class DirtyService:
    """``/v1/dirty``: what compactors and operators ask of this server's dirty set."""

    def __init__(
        self,
        dirty: HostDirtyLog,
        rollups: RollupScheduler,
        adoption: Adoption,
        manager: LogManager,
        settings: Settings,
    ) -> None:
        self._dirty = dirty
        self._rollups = rollups
        self._adoption = adoption
        self._manager = manager
        self._server_id = settings.server_id
        self._max_age_s = settings.dirty_max_age_s
        self._max_reinserts = settings.dirty_max_reinserts

    async def listing(self, min_records: int, limit: int) -> DirtyResponse:
        """Dirty collections with at least ``min_records`` records, best first (entries aged or
        reinserted past the settings' bounds qualify whatever their size)."""
        entries = self._dirty.select(
            min_records, limit, max_age_s=self._max_age_s, max_reinserts=self._max_reinserts
        )
        return await self._answer(entries)

    async def rollup(self) -> DirtyResponse:
        """Roll up now; the whole dirty set after."""
        await self._rollups.run_now()
        return await self._answer(self._dirty.select(0, 1 << 31))

    async def purge(self, ids: list[UUID]) -> dict[str, Any]:
        """Drop collections from the dirty set."""
        first = await self._dirty.purge(ids)
        return {"purged": len(ids), "first_offset": first}

    async def adopt(self, server_id: str) -> AdoptResponse:
        """Take over the dirty set of a server that is gone."""
        r = await self._adoption.adopt(server_id)
        return AdoptResponse(
            adopted_server_id=server_id,
            collections=r.collections,
            records_read=r.records_read,
            cursor_from=r.cursor_from,
            cursor_to=r.cursor_to,
        )

    async def inspect(self, from_offset: int | None, limit: int) -> dict[str, Any]:
        """Raw dirty-log records, decoded."""
        records = await self._dirty.inspect(from_offset, limit)
        return {"records": [r.as_dict() for r in records]}

    async def _answer(self, entries: list[DirtyEntry]) -> DirtyResponse:
        logs = []
        for e in entries:
            tenant = await self._manager.binding(e.collection_id)
            logs.append(DirtyLogOut(tenant=tenant or "", **e.as_dict()))
        return DirtyResponse(server_id=self._server_id, logs=logs)
