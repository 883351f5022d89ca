"""The dirty set as the API serves it: listings with each collection's tenant, roll-ups and
adoptions on request, purges, raw records for operators.

A listing reads no store.  The tenant of each dirty collection is kept here, for the dirty set
only (not the manager's bounded cache of bindings, which a large dirty set would churn): learnt
after each roll-up pass for the entries it does not know yet, in one bulk lookup off the request
path.  A collection written by this process resolves from the manager's memory (the write bound
it); only collections dirty from before a restart (or adopted) cost one ``TENANT`` read, once per
process, at the first pass that lists them.  A listing resolves what no pass has yet (marks since
the last pass: the manager's memory again).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from dirtylog import DirtyEntry, RollUpResult
from wal3.errors import ProcessDeath

from ..config import Settings
from ..manager import LogManager
from ..models import AdoptResponse, DirtyLogOut, DirtyResponse
from .adoption import Adoption
from .dirtyset import HostDirtyLog
from .rollups import RollupScheduler

_log = logging.getLogger("loghost.dirty")
# Bindings read at once when tenants are learnt in bulk.
TENANT_LOOKUP_CONCURRENCY = 32


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
        # The tenant of each dirty collection this process has resolved (bindings never change).
        self._tenants: dict[UUID, str] = {}
        rollups.after_each_pass(self._learn_tenants)

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
        await self._resolve(e.collection_id for e in entries)
        tenants = self._tenants
        logs = [
            DirtyLogOut(tenant=tenants.get(e.collection_id, ""), **e.as_dict()) for e in entries
        ]
        return DirtyResponse(server_id=self._server_id, logs=logs)

    async def _learn_tenants(self, result: RollUpResult) -> None:
        """After a pass: forget the tenants of collections no longer dirty (when they are many)
        and resolve those of the set that no pass has resolved yet."""
        entries = result.entries
        if len(self._tenants) > 2 * len(entries) + 1024:
            self._tenants = {c: t for c, t in self._tenants.items() if c in entries}
        try:
            await self._resolve(entries)
        except ProcessDeath:
            raise
        except Exception as e:  # the pass succeeded; a listing (or the next pass) retries
            _log.warning("dirty set: tenants not resolved after the roll-up: %r", e)

    async def _resolve(self, ids: Iterable[UUID]) -> None:
        """Learn the tenants of ``ids`` not known yet, a few bindings at a time (the manager
        answers from memory for logs this process bound; else one ``TENANT`` read)."""
        known = self._tenants
        missing = [c for c in ids if c not in known]
        todo = iter(missing)

        async def worker() -> None:
            for cid in todo:
                tenant = await self._manager.binding(cid)
                if tenant is not None:  # unbound (a fork being created): asked again later
                    known[cid] = tenant

        n = min(TENANT_LOOKUP_CONCURRENCY, len(missing))
        if n:
            await asyncio.gather(*(worker() for _ in range(n)))
