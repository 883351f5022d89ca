"""The log host's composition root: one ``Settings`` in, every component and service wired, and
their lifecycle (``start``, ``begin_drain``, ``close``).

Requests never come through here: the routes (``host.routers``) call the services this builds,
and the services call the log manager and one another directly.

* the object store, the membership (``host.membership``: this host's liveness record and every
  host's), the leader hint (``host.leader``: Redis when configured, else rendezvous hashing over
  the membership) and the log manager (``host.manager``);
* ``dirty_set`` (``host.services.dirtyset``): the server's dirty log, marked by every fragment;
* ``rollups``, ``untracked``, ``adoption``, ``auto_adoption``: roll-up scheduling, the dirty
  set's invariant check after each roll-up, taking over a departed host's dirty set (on request,
  and by itself once the host has been silent for ``adopt_after_s``);
* ``gc``: the always-on collector's schedule;
* ``records``, ``cursors``, ``lifecycle``, ``dirty_service``: what the routes call.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from uuid import UUID

from dirtylog import DirtyLogHook, RollUp, RollUpResult
from wal3 import (
    BatchOptions,
    LogWriter,
    LogWriterOptions,
    ObjectStore,
    SnapshotOptions,
    open_store,
)
from wal3.paths import dirty_prefix

from .auth import Authenticator
from .config import Settings
from .dirty import DirtyLog, KnownCompactionOffsets, WalDirtyBackend
from .leader import LeaderHint, NullLeaderHint, RendezvousLeaderHint, leader_hint_from_url
from .manager import LogManager
from .membership import Membership
from .metrics import Metrics
from .quotas import TenantQuotas
from .services.adoption import Adoption, AutoAdoption
from .services.cursors import CursorService
from .services.dirty import DirtyService
from .services.dirtyset import HostDirtyLog
from .services.gc import GcScheduler
from .services.lifecycle import LifecycleService
from .services.records import RecordService
from .services.rollups import RollupScheduler
from .services.untracked import UntrackedCheck
from .storemetrics import InstrumentedStore

_log = logging.getLogger("loghost.server")


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
        # Tenant quotas: an invalid configuration is a startup error (ValueError).
        self.metrics.tenants.top_n = settings.tenant_metrics_top_n
        self.quotas = TenantQuotas.from_settings(settings, self.metrics.tenants)
        self.metrics.set_build_info(settings.http_parser)
        # Every component below talks to the store through its metrics (host.storemetrics).
        self.store: ObjectStore = InstrumentedStore(
            store if store is not None else open_store(settings.store), self.metrics
        )
        self.membership = Membership(
            self.store,
            settings.server_id,
            settings.public_url,
            interval_s=settings.membership_interval_s,
            ttl_s=settings.membership_ttl_s,
            on_failure=lambda _e: self.metrics.membership_failures.inc(),
        )
        self.leader: LeaderHint
        if leader is not None:
            self.leader = leader
        elif settings.redis_url and settings.redis_url.strip():
            self.leader = leader_hint_from_url(
                settings.redis_url,
                settings.server_id,
                settings.public_url,
                ttl_ms=settings.leader_ttl_ms,
                on_failure=self._hint_failed,
                on_lost=self._hint_lost,
                membership=self.membership if settings.routing == "membership" else None,
            )
        elif settings.routing == "membership":
            self.leader = RendezvousLeaderHint(self.membership)
        else:
            self.leader = NullLeaderHint()
        # Background work and the dirty set.
        self.dirty_set = HostDirtyLog(self._open_dirty)
        self.manager = LogManager(
            self.store, settings, self.metrics, self.leader, self.dirty_set.mark, self.quotas
        )
        self.compaction_offsets = KnownCompactionOffsets(self.store, self._open_logs_compaction)
        self.untracked = UntrackedCheck(self.manager, self.dirty_set, self.metrics)
        self.rollups = RollupScheduler(self.dirty_set, self.untracked, self.metrics, settings)
        self.adoption = Adoption(
            self.store, settings.server_id, self.dirty_set, self.rollups, self.compaction_offsets
        )
        self.auto_adoption = AutoAdoption(
            self.adoption, self.membership, self.metrics, after_s=settings.adopt_after_s
        )
        self.gc = GcScheduler(self.store, self.manager, self.metrics, settings)
        # What the routes call.
        self.records = RecordService(self.store, self.manager, self.metrics, settings)
        self.cursors = CursorService(self.store, self.manager, self.dirty_set, self.gc)
        self.lifecycle = LifecycleService(
            self.store, self.manager, self.dirty_set, self.gc, self.metrics, settings.server_id
        )
        self.dirty_service = DirtyService(
            self.dirty_set, self.rollups, self.adoption, self.manager, settings
        )

    @property
    def dirty(self) -> DirtyLog | None:
        """The server's open dirty log (None before ``start``)."""
        return self.dirty_set.log

    # ----------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        """Join the membership (refusing a server id in use), open the dirty log, start the
        leader hint, the idle closer, roll-ups, GC and the membership's beat."""
        await self.membership.join()
        await self.leader.start()
        await self.dirty_set.open()
        self.manager.start()
        self.rollups.start()
        self.gc.start()
        self.membership.on_refresh(self._membership_changed)
        self.membership.on_refresh(self.auto_adoption)
        self.membership.start()
        _log.info("log host %s started on store %s", self.settings.server_id, self.store)

    async def begin_drain(self) -> None:
        """Shutdown began (before the HTTP drain): say so in our liveness record (the others
        stop routing here at their next refresh), release idle logs' hints, wake long-polls."""
        await self.membership.drain()
        await self.manager.begin_drain()

    async def close(self) -> None:
        """Graceful shutdown: stop background work, flush every open log, release everything."""
        await self.membership.close()
        await self.gc.close()
        await self.rollups.close()
        await self.manager.close()
        await self.dirty_set.close()
        self.records.close()
        await self.leader.close()
        await self.store.close()
        _log.info("log host %s stopped", self.settings.server_id)

    # ------------------------------------------------------------------- tests' and tools' view

    async def rollup_now(self) -> RollUpResult:
        """Roll the dirty log up now (``rollups.run_now``)."""
        return await self.rollups.run_now()

    def untracked_collections(self, known_before: dict[UUID, int]) -> set[UUID]:
        """Open logs written before a roll-up whose uncompacted records it does not list
        (``untracked.collections``)."""
        return self.untracked.collections(known_before)

    # ------------------------------------------------------------------------------- wiring

    async def _open_dirty(self) -> DirtyLog:
        prefix = dirty_prefix(self.settings.server_id)
        writer = await LogWriter.open(
            self.store,
            prefix,
            LogWriterOptions(
                writer_name=f"loghost:{self.settings.server_id}",
                batch=BatchOptions(interval_s=self.settings.batch_interval_ms / 1000.0),
                snapshot=SnapshotOptions(
                    max_age_s=max(0.001, min(60.0, self.settings.gc_grace_s / 2))
                ),
            ),
        )
        # The dirty log is read by roll-ups, not compactors: no intrinsic compaction cursor.
        backend = WalDirtyBackend(
            self.store, prefix, writer, self.gc.options, self.settings.claim_ttl_s
        )
        rollup = RollUp(backend, self.compaction_offsets)
        return DirtyLog(backend, rollup, DirtyLogHook(backend))

    def _open_logs_compaction(self) -> dict[UUID, int]:
        """The compaction cursors the open logs remember (each only ever moves forward)."""
        return {h.collection_id: h.compaction_offset for h in self.manager.handles()}

    async def _membership_changed(self) -> None:
        """After a refresh: open logs another host now owns stop being served here (long-polls
        are woken and redirected), as a lost Redis claim does."""
        if isinstance(self.leader, RendezvousLeaderHint):
            for h in self.manager.handles():
                cid = str(h.collection_id)
                if not self.leader.holds(cid):
                    await self.manager.lost_leadership(cid)

    def _hint_failed(self, _exc: BaseException) -> None:
        self.metrics.leader_hint_failures.inc()

    def _hint_lost(self, collection_id: str) -> Awaitable[None]:
        # Returned, not spawned: the hint tracks the task and waits for it on close.
        return self.manager.lost_leadership(collection_id)
