"""Adoption: taking over the dirty set of a server that is gone (``POST /v1/dirty/adopt``).

Its still-dirty collections are appended to our dirty log, then its cursor moves past them
(``dirtylog.hand_over``); our roll-up then serves them to compactors.  The departed log is only
read and its cursor moved (never its manifest written), so adopting a host that turns out to be
alive is two racing roll-ups, which the cursor CAS settles.

:class:`AutoAdoption` does it with no operator: after every membership refresh, each host whose
liveness record is older than ``adopt_after_s`` is adopted by exactly one live host, its
rendezvous owner among the live records, which then forgets the departed record (unless it beat
again meanwhile), so a host is adopted once per departure.  A host that comes back writes its
record again and goes on with its own dirty log: adoption only moved that log's cursor.
"""

from __future__ import annotations

import logging

from dirtylog import CompactionOffsets, HandOverResult, hand_over
from wal3 import ObjectStore
from wal3.paths import dirty_prefix

from ..config import SERVER_ID
from ..dirty import StoredDirtyLog
from ..errors import BadRequest, NotFound
from ..membership import Membership, rendezvous_owner
from ..metrics import Metrics
from .dirtyset import HostDirtyLog
from .rollups import RollupScheduler

_log = logging.getLogger("loghost.server")


class Adoption:
    """Hands other servers' dirty sets over to this server's dirty log."""

    def __init__(
        self,
        store: ObjectStore,
        server_id: str,
        dirty: HostDirtyLog,
        rollups: RollupScheduler,
        offsets: CompactionOffsets,
    ) -> None:
        self._store = store
        self._server_id = server_id
        self._dirty = dirty
        self._rollups = rollups
        self._offsets = offsets

    async def adopt(self, server_id: str) -> HandOverResult:
        """Take over the dirty set of ``server_id``, then roll ours up."""
        if server_id == self._server_id:
            raise BadRequest("server_id: this server's own dirty log cannot be adopted")
        if not SERVER_ID.fullmatch(server_id):
            raise BadRequest(
                "server_id: letters, digits, '.', '_' and '-', starting with a "
                "letter or digit, at most 253"
            )
        source = await StoredDirtyLog.load(
            self._store, dirty_prefix(server_id), f"loghost:{self._server_id}:adopt"
        )
        if source is None:
            raise NotFound(f"no dirty log for server {server_id!r}")
        result = await hand_over(source, self._dirty.opened().backend, self._offsets)
        _log.info(
            "adopted the dirty log of %s: %d collection(s), %d record(s) read",
            server_id,
            result.collections,
            result.records_read,
        )
        await self._rollups.run_now()
        return result


class AutoAdoption:
    """Adopts departed hosts' dirty logs after each membership refresh (see the module doc)."""

    def __init__(
        self, adoption: Adoption, membership: Membership, metrics: Metrics, *, after_s: float
    ) -> None:
        self._adoption = adoption
        self._m = membership
        self._metrics = metrics
        self.after_s = after_s
        self.adopted: list[str] = []  # server ids adopted by this host, in order

    async def __call__(self) -> None:
        live = self._m.live()
        self._metrics.live_hosts.set(len(live))
        live_ids = {r.server_id for r in live}
        silent = [r for r in self._m.records() if r.server_id not in live_ids]
        self._metrics.departed_oldest_age.set(max((self._m.age(r) for r in silent), default=0.0))
        if not self._m.steady:
            return  # our own beats had a gap: every record looks old; judge at the next refresh
        for rec in self._m.departed(self.after_s):
            if rec.server_id in live_ids:
                continue  # routed to (adopt_after_s below ttl_s): alive, never adopted
            owner = rendezvous_owner(f"adopt\n{rec.server_id}", live)
            if owner is None or owner.server_id != self._m.server_id:
                continue
            try:
                await self._adoption.adopt(rec.server_id)
            except NotFound:
                pass  # it never marked anything: only its record is left
            except BadRequest:
                _log.warning("liveness record of %r: not a server id; left alone", rec.server_id)
                continue
            if await self._m.forget(rec.server_id, rec):
                self.adopted.append(rec.server_id)
                self._metrics.adopted_dirty_logs.inc()
                _log.info(
                    "host %s last beat %.0f s ago: adopted its dirty log",
                    rec.server_id,
                    self._m.age(rec),
                )
