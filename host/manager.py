"""The log manager: opens collection logs on demand, keeps them while used, closes them when idle.

One open per log even when many requests race (single flight); a cap on open logs with LRU
eviction of idle ones; closing flushes.  Before opening a writer the server claims the advisory
leader hint; a log held by another live server is redirected there.  Each log is bound to the
tenant that first wrote it (``logs/{uuid}/TENANT``, created with If-None-Match).

Leadership can move under an open log (a Redis outage, stall or restart), and the hint may be
wrong in any way, so it never decides what a read answers.  Reads answer from the local writer's
manifest only under the writer's read lease, which the store fences (``LogWriter``, module
docstring: a manifest this writer wrote, proven current by a store interaction issued within
``read_lease_ms``, and take-overs hold their acknowledgements past any such lease); otherwise
they load the manifest from the store.  The hint only decides who should make its memory
current: a host that holds a tenure and whose writer did not write the stored manifest makes a
fenced identity write, after which its reads are served from memory again.  A log lost to
another server redirects new requests there and closes once idle.  Long-polls wait outside
``use()``: a waiting request never pins an open-log slot.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from wal3 import (
    BatchOptions,
    LeaseOptions,
    LogReader,
    LogSealed,
    LogWriter,
    LogWriterOptions,
    ObjectNotFound,
    ObjectStore,
    PreconditionFailed,
    SnapshotOptions,
)
from wal3.claim import ClaimWatch
from wal3.cursors import COMPACTION, CursorStore
from wal3.layout import load_manifest
from wal3.manifest import Manifest
from wal3.paths import (
    TENANT_PATH,
    join,
    log_prefix,  # also imported from here (tests, tools)
)
from wal3.writer import FragmentHook, FragmentInfo

from .config import Settings
from .errors import BackpressureError, NotFound, NotLeader, Unavailable
from .forks import MarkDirty, claim_ttl_s, create_collection_log
from .leader import LeaderHint
from .metrics import Metrics
from .quotas import Admission, Quota, TenantQuotas

_log = logging.getLogger("loghost.manager")

# The 429 backpressure reason when every open log (LOGHOST_MAX_OPEN_LOGS) is in use.
OPEN_LOG_CAP = "open_log_cap"


@dataclass(eq=False)
class LogHandle:
    """An open collection log."""

    collection_id: UUID
    tenant: str
    writer: LogWriter
    reader: LogReader
    cursors: CursorStore
    compaction_offset: int
    last_used: float
    users: int = 0
    waiters: int = 0  # long-polls waiting on it (not users: they do not keep it open)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    # Held across a compaction-cursor move and the dirty-log record that reports it, so those
    # records reach the dirty log in the order the cursor moved (a clear of a forward move
    # arriving after a move back would list [back, forward) clean while it is not compacted).
    compaction_order: asyncio.Lock = field(default_factory=asyncio.Lock)
    # The leader-hint tenure under which the writer's memory was last made current (None: not
    # yet); only decides when to do that, never what reads trust (the writer's lease does).
    tenure: int | None = None
    lost: bool = False  # another server took the log over: hand out no more, close when idle
    lost_to: str | None = None  # its advertise URL, when known
    # Set when the log is lost or leaves the open set: wakes long-polls waiting on it.
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # left the open set
    refreshing: asyncio.Task[None] | None = None

    @property
    def prefix(self) -> str:
        """The log's prefix in the store."""
        return log_prefix(self.collection_id)

    def note_compaction(self, offset: int) -> None:
        """Remember a compaction cursor position (only ever forward)."""
        self.compaction_offset = max(self.compaction_offset, offset)


def _refreshed(h: LogHandle, _task: asyncio.Task[None]) -> None:
    h.refreshing = None


def lease_options(settings: Settings) -> LeaseOptions:
    """The read lease of every writer this host opens: its own setting, and for a manifest that
    records none the longest any host holds (``LOGHOST_READ_LEASE_MAX_MS``)."""
    return LeaseOptions(
        read_lease_s=settings.read_lease_ms / 1000.0,
        unrecorded_lease_s=settings.unrecorded_lease_s,
        name_is_unique=True,
    )


class LogManager:
    """Multiplexes thousands of collection logs over one store with bounded memory."""

    def __init__(
        self,
        store: ObjectStore,
        settings: Settings,
        metrics: Metrics,
        leader: LeaderHint,
        mark_dirty: MarkDirty,
        quotas: TenantQuotas | None = None,
    ) -> None:
        self._store = store
        self._settings = settings
        self._metrics = metrics
        self._leader = leader
        self._mark_dirty = mark_dirty
        # Creation claims this process has seen (forks and first writes share them).
        self.claims = ClaimWatch(claim_ttl_s(settings.gc_grace_s, settings.claim_ttl_s))
        self._open: collections.OrderedDict[UUID, LogHandle] = collections.OrderedDict()
        self._opening: dict[UUID, asyncio.Future[LogHandle]] = {}
        self._closing: dict[UUID, asyncio.Task[None]] = {}
        self._bindings: collections.OrderedDict[UUID, str] = collections.OrderedDict()
        # The manifest (etag and fence) a closed writer of this process wrote last, per log: a
        # reopen that finds it still stored is no take-over (no fence, leases at once).
        # Kept for every close (failed writers too; the etag then None): the fence always carries.
        self._authored: collections.OrderedDict[UUID, tuple[str | None, float]] = (
            collections.OrderedDict()
        )
        self._buffered = 0
        self._closed = False
        self._draining = False
        self._drained = asyncio.Event()  # set at shutdown: long-polls answer at once
        self._background: set[asyncio.Task[None]] = set()
        # Long-polls waiting, per (tenant, role of the key): a tenant's read-only keys have their
        # own share, so they cannot starve its tenant key (nor a compactor's service key).
        self._waits: collections.Counter[tuple[str, str]] = collections.Counter()
        self._idle_task: asyncio.Task[None] | None = None
        # Tenant quotas (host.quotas): open logs per tenant, logs created per tenant, and the
        # open-log slots and creations admitted requests hold until they end.
        self.quotas = quotas if quotas is not None else TenantQuotas(metrics=metrics.tenants)
        self.quotas.on_release = self._admission_done
        self._tenant_open: collections.Counter[str] = collections.Counter()
        # Opens that _make_room let in and that are not open yet, per tenant: they hold a place
        # in the table already, so a tenant's share counts them (concurrent first appends must
        # not let it pass its share).
        self._tenant_admitted: collections.Counter[str] = collections.Counter()
        self._created: collections.Counter[str] = collections.Counter()
        self._open_held: dict[str, collections.Counter[UUID]] = {}
        self._create_held: dict[str, collections.Counter[UUID]] = {}
        gc_grace = settings.gc_grace_s
        self._writer_options = LogWriterOptions(
            # Unique per process: two processes (a restart racing its predecessor under one
            # server id) never write byte-identical manifests, so an etag names one writer,
            # which read leases rely on (an identity write would otherwise keep the etag).
            writer_name=f"loghost:{settings.server_id}:{secrets.token_hex(4)}",
            batch=BatchOptions(
                interval_s=settings.batch_interval_ms / 1000.0,
                max_outstanding_bytes=settings.max_log_outstanding_bytes,
            ),
            snapshot=SnapshotOptions(
                fragment_threshold=settings.snapshot_fragment_threshold,
                snapshot_threshold=settings.snapshot_threshold,
                # A pending snapshot older than half the GC grace is never linked (GC may sweep it).
                max_age_s=max(0.001, min(60.0, gc_grace / 2)),
            ),
            lease=lease_options(settings),
        )

    # ------------------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Start closing idle logs in the background."""
        self._idle_task = asyncio.create_task(self._idle_loop(), name="idle-closer")

    async def begin_drain(self) -> None:
        """Shutdown began (SIGTERM): wake long-polls, let idle logs go at once, open no more.

        Busy logs are closed (and their hints released) as their last request ends, so other
        servers can take every log over while this one drains instead of redirecting to it.
        """
        self._draining = True
        self._drained.set()
        idle = [h for h in self._open.values() if h.users == 0]
        # Hints first, in batches: the flush of idle logs has nothing to write anyway.
        await self._leader.release_many([str(h.collection_id) for h in idle])
        await asyncio.gather(*(self._close_if_idle(h) for h in idle), return_exceptions=True)

    @property
    def draining(self) -> bool:
        """Whether shutdown began."""
        return self._draining

    async def close(self) -> None:
        """Flush and close every open log (graceful shutdown); every hint goes first."""
        self._closed = True
        self._draining = True
        self._drained.set()
        if self._idle_task is not None:
            self._idle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._idle_task
        handles = list(self._open.values())
        # Release before the final flush: another server may take over while we flush (its
        # appends and ours are fenced by the manifest; a loser retries).
        with contextlib.suppress(Exception):
            await self._leader.release_many([str(h.collection_id) for h in handles])
        await asyncio.gather(*(self._close_handle(h) for h in handles), return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing.values(), return_exceptions=True)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)

    @property
    def open_count(self) -> int:
        """How many logs are open."""
        return len(self._open)

    def handles(self) -> list[LogHandle]:
        """The open logs."""
        return list(self._open.values())

    @property
    def buffered_bytes(self) -> int:
        """Bytes accepted by appends and not yet durable, server wide."""
        return self._buffered

    # -------------------------------------------------------------------------------- tenants

    async def binding(self, cid: UUID) -> str | None:
        """The tenant a log is bound to, or None if no one wrote it yet."""
        cached = self._bindings.get(cid)
        if cached is not None:
            self._bindings.move_to_end(cid)
            return cached
        try:
            got = await self._store.get(join(log_prefix(cid), TENANT_PATH))
        except ObjectNotFound:
            return None
        tenant = str(json.loads(got.data)["tenant"])
        self._remember_binding(cid, tenant)
        return tenant

    def _remember_binding(self, cid: UUID, tenant: str) -> None:
        self._bindings[cid] = tenant
        while len(self._bindings) > 100_000:
            self._bindings.popitem(last=False)

    async def bind(self, cid: UUID, tenant: str) -> str:
        """Bind a log to ``tenant`` unless someone bound it first; returns the owner."""
        owner = await self.binding(cid)
        if owner is not None:
            return owner
        body = json.dumps({"tenant": tenant}).encode()
        try:
            await self._store.put(join(log_prefix(cid), TENANT_PATH), body, if_none_match="*")
        except PreconditionFailed:
            self._bindings.pop(cid, None)
            owner = await self.binding(cid)
            if owner is None:
                raise
            return owner
        self._remember_binding(cid, tenant)
        self._created[tenant] += 1  # the created_logs quota counts it
        return tenant

    async def check_owner(self, cid: UUID, tenant: str, *, create: bool) -> None:
        """Raise NotFound unless ``tenant`` owns the log (binding it first when ``create``)."""
        owner = await (self.bind(cid, tenant) if create else self.binding(cid))
        if owner != tenant:
            raise NotFound(f"no log {cid} for tenant {tenant}")

    # ------------------------------------------------------------------------------ admission

    def precheck(self, tenant: str, cid: UUID, q: Quota, *, records: int) -> None:
        """Refuse an append of ``records`` records to ``cid`` that ``admit`` would refuse now
        by a quota it can judge without the body's bytes (``q``: the tenant's quota): in
        ``admit``'s order, ``records_per_request``, ``open_logs``, then the rate buckets
        (``TenantQuotas.precheck``).  Called before the body is decoded, so a flood its quota
        refuses costs no decoding.  (The byte quotas and ``created_logs`` are judged at
        admission only: a request over one of them and over a rate is named by the rate.)"""
        quotas = self.quotas
        quotas.check_records(tenant, q, records)
        if self._no_open_room(tenant, cid, q):
            raise quotas.throttle(tenant, "open_logs", str(q.open_logs), 1)
        quotas.precheck(tenant, q, records=records)

    def _no_open_room(self, tenant: str, cid: UUID, q: Quota) -> bool:
        """Whether opening ``cid`` would take ``tenant`` past ``open_logs``: only the tenant's
        own idle logs may make room, never another tenant's."""
        if q.open_logs is None or cid in self._open:
            return False
        held = {c for c in self._open_held.get(tenant, ()) if c not in self._open}
        held.add(cid)
        return self._tenant_open[tenant] + len(held) > q.open_logs and not any(
            h.tenant == tenant and h.users == 0 for h in self._open.values()
        )

    async def admit(
        self,
        tenant: str,
        cid: UUID,
        *,
        records: int,
        nbytes: int,
        create: bool,
        quota: Quota | None = None,
    ) -> Admission:
        """The one admission point of a write to ``cid`` (an append): every tenant quota is
        checked here, before any work, and the request's tokens are charged here; the returned
        admission holds its bytes (and the open-log slot or creation it may need) until its
        ``release``.  Raises QuotaExceeded (429 ``quota_exceeded``) and charges nothing then.
        A request admitted here is refused by no quota later.

        Then its bytes of the server-wide budget (``LOGHOST_MAX_BUFFERED_BYTES``): at once below
        the fair-share threshold, else shared across the active tenants by weight
        (``host.fairshare``), waiting at most ``fair_share_max_wait_s`` (then 429
        ``backpressure``, reason ``fair_share``); a request that passed holds them until its
        release, so the server-wide budget does not refuse it later either.

        ``quota``: the tenant's quota as the caller just read it (else read here)."""
        q = quota if quota is not None else self.quotas.quota(tenant)
        a = await self._admit_quotas(tenant, cid, q, records=records, nbytes=nbytes, create=create)
        fair = self.quotas.fair
        if fair is not None:
            try:
                a.fair = await fair.acquire(tenant, nbytes, q.weight or 1.0)
            except BaseException as e:
                a.release()  # nothing done: its quota reservations go back
                if isinstance(e, BackpressureError):
                    self._metrics.backpressure.labels(e.reason).inc()
                raise
        return a

    async def _admit_quotas(
        self, tenant: str, cid: UUID, q: Quota, *, records: int, nbytes: int, create: bool
    ) -> Admission:
        """The tenant quotas of ``admit`` (unchanged): checked and charged in one step."""
        quotas = self.quotas
        if not q.limited():
            return quotas.admitted(tenant, nbytes)
        new_log = False
        if create and q.created_logs is not None and cid not in self._open:
            new_log = await self.binding(cid) is None  # a store read at most (then cached)
            q = quotas.quota(tenant)
        # From here to the charge nothing awaits: the checks and the charge are one step.
        quotas.check_request(tenant, q, records=records, nbytes=nbytes)
        hold_open = q.open_logs is not None and cid not in self._open
        if hold_open and self._no_open_room(tenant, cid, q):
            raise quotas.throttle(tenant, "open_logs", str(q.open_logs), 1)
        if new_log and q.created_logs is not None:
            creating = set(self._create_held.get(tenant, ()))
            creating.add(cid)
            if self._created[tenant] + len(creating) > q.created_logs:
                raise quotas.throttle(tenant, "created_logs", str(q.created_logs))
        quotas.charge(tenant, q, appends=1, records=records)
        a = quotas.admitted(tenant, nbytes)
        if hold_open:
            a.opened = cid
            self._open_held.setdefault(tenant, collections.Counter())[cid] += 1
        if new_log:
            a.created = cid
            self._create_held.setdefault(tenant, collections.Counter())[cid] += 1
        return a

    def _admission_done(self, a: Admission) -> None:
        for held, cid in ((self._open_held, a.opened), (self._create_held, a.created)):
            if not isinstance(cid, UUID):
                continue
            counts = held.get(a.tenant)
            if counts is None:
                continue
            counts[cid] -= 1
            if counts[cid] <= 0:
                del counts[cid]
            if not counts:
                del held[a.tenant]

    def tenant_open_logs(self, tenant: str) -> int:
        """Logs of ``tenant`` open on this host."""
        return self._tenant_open.get(tenant, 0)

    async def _make_tenant_room(self, cid: UUID, tenant: str) -> None:
        """Under ``tenant``'s open-log quota, close its own least-recently-used idle logs to
        make room for ``cid`` (never another tenant's).  A request admitted for ``cid`` opens it
        whatever happens; any other open (a read) past the quota answers 429."""
        limit = self.quotas.quota(tenant).open_logs
        if limit is None:
            return
        while self._tenant_open[tenant] >= limit:
            victim = next(
                (h for h in self._open.values() if h.tenant == tenant and h.users == 0), None
            )
            if victim is None:
                break
            self._metrics.evictions.inc()
            await self._close_handle(victim)
        held = self._open_held.get(tenant)
        if self._tenant_open[tenant] >= limit and not (held and held[cid]):
            raise self.quotas.throttle(tenant, "open_logs", str(limit), 1)

    # -------------------------------------------------------------------------------- opening

    @contextlib.asynccontextmanager
    async def use(
        self, cid: UUID, tenant: str, *, create: bool = False
    ) -> AsyncIterator[LogHandle]:
        """Hold a log open for one request (opening it if needed)."""
        await self.check_owner(cid, tenant, create=create)
        handle = await self._get_or_open(cid, tenant, create=create)
        handle.users += 1
        handle.last_used = time.monotonic()
        try:
            await self._ensure_tenure(handle)
            yield handle
        finally:
            handle.users -= 1
            handle.last_used = time.monotonic()
            if handle.users == 0 and (handle.lost or self._draining):
                # A lost log stops writing here, and a draining server lets its logs go, as
                # soon as the last request is done (in the background: this answer is ready).
                self._spawn(self._close_if_idle(handle), f"close:{cid}")

    async def _close_if_idle(self, h: LogHandle) -> None:
        # Checked when the task runs: a request that took the log meanwhile closes it itself
        # when it is done (use()), instead of having the writer closed under it.
        if h.users == 0:
            await self._close_handle(h)

    def _spawn(self, coro: Any, name: str) -> None:
        task: asyncio.Task[None] = asyncio.create_task(coro, name=name)
        self._background.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._background.discard(t)
            if not t.cancelled() and t.exception() is not None:
                _log.warning("%s failed: %r", t.get_name(), t.exception())

        task.add_done_callback(done)

    # ---------------------------------------------------------------------------- leadership

    def trusted(self, h: LogHandle) -> bool:
        """Whether ``h.writer.manifest`` is the log's current manifest: the writer's read lease
        (fenced by the store, never by the hint) vouches for it now."""
        return h.writer.current_manifest() is not None

    async def _ensure_tenure(self, h: LogHandle) -> None:
        """Under a new tenure, make the writer's memory current (so reads can use it) unless it
        is already the writer's own.

        A fenced identity write of the manifest either lands (the writer was current) or fails
        its If-Match, and the writer reloads and read-repairs, then lands; either way the stored
        manifest is then the writer's own and its lease vouches for it.  One write per log per
        change of leadership or of authorship; nothing when the hint names no tenure (reads then
        go to the store unless this writer wrote the log last).  Only an optimisation: the lease
        alone decides what reads trust.
        """
        if self._writer_options.lease.read_lease_s <= 0:
            return  # no leases: reads always load the stored manifest, memory is never used
        while True:
            t = self._leader.tenure(str(h.collection_id))
            if t is None or t == h.tenure:
                return
            if h.writer.authored:
                h.tenure = t  # the writer wrote what is stored: its lease proves it, no write
                return
            task = h.refreshing
            if task is None:
                task = h.refreshing = asyncio.create_task(
                    self._refresh(h, t), name=f"refresh:{h.collection_id}"
                )
                task.add_done_callback(functools.partial(_refreshed, h))
            await asyncio.shield(task)

    async def _refresh(self, h: LogHandle, tenure: int) -> None:
        # A sealed log takes no edit, and needs none: nobody can append, its tail is final.
        with contextlib.suppress(LogSealed):
            await h.writer.claim(confirm=True)
        h.tenure = tenure

    async def view(self, h: LogHandle) -> Manifest:
        """The manifest to answer reads and state from: the writer's own while its read lease
        vouches for it (renewed by a HEAD when it ran out), else the store's.  A manifest put
        in flight is waited for first: it may have landed, and a read of the store (here or on
        another host) may have shown its records already (reads are monotonic)."""
        m = await h.writer.leased_manifest()
        if m is not None:
            return m
        if h.writer.authored:
            if await h.writer.confirm_lease():
                m = h.writer.current_manifest()
                if m is not None:
                    return m
            elif not h.writer.authored:
                h.tenure = None  # another writer wrote it: the next use() re-proves, if ours
        loaded = await load_manifest(self._store, h.prefix)
        if loaded is None:
            return h.writer.manifest
        return loaded[0]

    def _poll_s(self) -> float:
        # Untrusted long-polls look at the store this often: well within one renewal interval.
        return max(0.05, min(1.0, self._settings.leader_ttl_ms / 3000.0))

    def long_polls(self, tenant: str, role: str) -> int:
        """Long-polls waiting on ``tenant``'s logs for keys of ``role``."""
        return self._waits.get((tenant, role), 0)

    async def wait_for_records(
        self,
        h: LogHandle,
        tenant: str,
        role: str,
        from_offset: int,
        deadline: float,
        disconnected: asyncio.Future[None] | None,
    ) -> str:
        """Wait, without holding ``h``, until the log may have a record at ``from_offset``.

        At most ``max_long_polls_per_tenant`` wait at once per tenant and role (``reader``,
        ``tenant``, ``service``): more raise a 429.

        Returns why it stopped: "records" (look again), "timeout", "changed" (the log was lost
        or closed: look again through ``use()``), "drain" (shutdown) or "disconnected".  The
        waiting request is not a user of ``h``, so eviction may close the log meanwhile.
        """
        pool = (tenant, role)
        if self._waits[pool] >= self._settings.max_long_polls_per_tenant:
            self._metrics.backpressure.labels("long_poll").inc()
            self._metrics.tenants.throttled(tenant, "long_polls")
            raise BackpressureError(
                f"tenant {tenant} has {self._waits[pool]} long-polls waiting for {role} keys",
                "long_poll",
                1,
            )
        self._waits[pool] += 1
        h.waiters += 1
        self._metrics.long_polls.inc()
        stops: list[asyncio.Future[Any]] = [
            asyncio.ensure_future(h.changed.wait()),
            asyncio.ensure_future(self._drained.wait()),
        ]
        if disconnected is not None:
            stops.append(disconnected)
        try:
            while True:
                if disconnected is not None and disconnected.done():
                    return "disconnected"
                if self._drained.is_set():
                    return "drain"
                if h.changed.is_set() or h.writer.closed:
                    return "changed"
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                # Under a lease only this writer's commits can add records until it runs out;
                # without one, look at the store every poll interval.
                lease = h.writer.lease_remaining()
                step = min(remaining, lease if lease > 0 else self._poll_s())
                commit = asyncio.ensure_future(h.writer.wait_for_commit(from_offset, step))
                try:
                    await asyncio.wait([commit, *stops], return_when=asyncio.FIRST_COMPLETED)
                finally:
                    commit.cancel()
                if h.writer.manifest.next_offset > from_offset:
                    return "records"
                if h.changed.is_set() or self.trusted(h):
                    continue
                if h.writer.authored and await h.writer.confirm_lease():
                    continue  # still the stored manifest: nobody else wrote
                loaded = await load_manifest(self._store, h.prefix)
                if loaded is not None and loaded[0].next_offset > from_offset:
                    return "records"
        finally:
            for f in stops[:2]:
                f.cancel()
            self._waits[pool] -= 1
            h.waiters -= 1
            if self._waits[pool] <= 0:
                del self._waits[pool]
            self._metrics.long_polls.dec()

    async def _get_or_open(self, cid: UUID, tenant: str, *, create: bool) -> LogHandle:
        while True:
            if self._closed:
                raise BackpressureError("server is shutting down", "shutting_down", 1)
            h = self._open.get(cid)
            if h is not None and h.writer.failed is not None:
                # A writer that died (its store crashed under it) is replaced, not reused: the
                # new one reloads the manifest and read-repairs whatever the old one left.
                _log.warning("reopening %s after writer failure: %r", cid, h.writer.failed)
                await self._close_handle(h)
                continue
            if h is not None and h.lost:
                if h.lost_to:
                    self._metrics.redirects.inc()
                    raise NotLeader(h.lost_to)
                # Lost to a holder we cannot name: let it go, then claim afresh.
                if h.users == 0:
                    await self._close_handle(h)
                else:
                    await h.gone.wait()
                continue
            if h is not None and not self._draining and not self._leader.holds(str(cid)):
                # Open here but no longer claimed (lost while it was being opened, or dropped):
                # claim it again, or hand it over to the holder.
                holder = await self._leader.claim(str(cid))
                if self._open.get(cid) is not h:
                    continue
                if holder is None:
                    self._open.move_to_end(cid)
                    return h  # ours again (or the hint cannot tell: fail open)
                h.lost, h.lost_to = True, holder
                h.changed.set()
                if h.users == 0:
                    await self._close_handle(h)
                continue
            if h is not None:
                self._open.move_to_end(cid)
                return h
            if self._draining:
                # Hints of logs that are not open are released; do not claim new ones.
                raise Unavailable("server is shutting down", 1)
            closing = self._closing.get(cid)
            if closing is not None:
                if closing.done():
                    # Its done-callback may not have run yet; awaiting a finished task does not
                    # yield, so waiting for the callback here would spin the loop forever.
                    self._closing.pop(cid, None)
                    continue
                # Never two writers of one log in one process: wait for the old one to flush.
                await asyncio.shield(closing)
                continue
            fut = self._opening.get(cid)
            if fut is not None:
                try:
                    await asyncio.shield(fut)
                except NotFound:
                    if not create:
                        raise
                    continue  # a read found no log yet; this append creates it
                # Look again rather than take the opener's handle: eviction may have closed it,
                # or the hint lost it, before this waiter woke.
                continue

            fut = asyncio.get_running_loop().create_future()
            self._opening[cid] = fut
            try:
                h = await self._open_log(cid, tenant, create=create)
            except BaseException as e:
                fut.set_exception(e)
                fut.exception()  # retrieved: waiters re-raise it themselves
                raise
            finally:
                self._opening.pop(cid, None)
            fut.set_result(h)
            return h

    async def _open_log(self, cid: UUID, tenant: str, *, create: bool) -> LogHandle:
        prefix = log_prefix(cid)
        if not create and await load_manifest(self._store, prefix) is None:
            raise NotFound(f"log {cid} was never written")
        holder = await self._leader.claim(str(cid))
        if holder is not None:
            self._metrics.redirects.inc()
            raise NotLeader(holder)
        writer: LogWriter | None = None
        admitted = False
        try:
            # Inside the try: a refused open (429) must not keep the claim, or other servers
            # would redirect this log here for as long as we renew it.
            await self._make_tenant_room(cid, tenant)
            await self._make_room(tenant)
            admitted = True  # no await since _make_room judged the room: nothing came between
            self._tenant_admitted[tenant] += 1
            if create:  # under the creation claim: a fork may be creating it (host/forks.py)
                await create_collection_log(
                    self._store, cid, prefix, self._writer_options.writer_name, self.claims
                )
            writer = await LogWriter.open(
                self._store,
                prefix,
                self._writer_options,
                hook=self._hook_for(cid),
                authored=self._authored.get(cid),
            )
            cursors = CursorStore(self._store, prefix, self._writer_options.writer_name)
            witness = await cursors.load(COMPACTION)
        except BaseException:
            if admitted:
                self._unadmit(tenant)
            if writer is not None:
                with contextlib.suppress(Exception):
                    await writer.close()
            await self._leader.release(str(cid))
            raise
        compaction = witness.cursor.offset if witness is not None else writer.manifest.oldest_offset
        # No tenure yet: the first use() under one makes the writer's memory current unless
        # the writer wrote the stored manifest itself.
        h = LogHandle(
            cid,
            tenant,
            writer,
            LogReader(self._store, prefix),
            cursors,
            compaction,
            time.monotonic(),
        )
        self._unadmit(tenant)  # now counted as open, with no await in between
        self._open[cid] = h
        self._tenant_open[tenant] += 1
        self._metrics.opens.inc()
        self._metrics.open_logs.set(len(self._open))
        return h

    def _hook_for(self, cid: UUID) -> FragmentHook:
        mark = self._mark_dirty

        async def hook(info: FragmentInfo) -> None:
            await mark(cid, info.start, info.count)

        return hook

    def _unadmit(self, tenant: str) -> None:
        self._tenant_admitted[tenant] -= 1
        if self._tenant_admitted[tenant] <= 0:
            del self._tenant_admitted[tenant]

    def _holding(self, tenant: str) -> int:
        """The places ``tenant`` takes in the open-log table: its open logs and its admitted
        opens."""
        return self._tenant_open[tenant] + self._tenant_admitted[tenant]

    def _open_shares(self, tenant: str) -> dict[str, float]:
        """Each tenant's fair share of the open-log cap: by quota weight among the tenants that
        hold open logs now (or are opening some), and ``tenant`` (the one asking)."""
        tenants = (*self._tenant_open, *self._tenant_admitted, tenant)
        weights = {t: self.quotas.quota(t).weight or 1.0 for t in tenants}
        per_weight = self._settings.max_open_logs / sum(weights.values())
        return {t: w * per_weight for t, w in weights.items()}

    async def _make_room(self, tenant: str) -> None:
        """Close least-recently-used idle logs until there is room for one more (for
        ``tenant``).

        With ``fair_share=weighted`` a full table is shared like the byte budget: room is taken
        first from the idle logs of ``tenant`` itself and of tenants over their share of the cap
        (by weight among the tenants holding open logs); a tenant already at its own share takes
        it only from those, and when none is idle it is refused (429 ``fair_share``) rather than
        closing an idle log of a tenant within its share.  So a tenant opening log after log
        cannot push the others' logs out."""
        fair = self._settings.fair_share == "weighted"
        while len(self._open) + len(self._opening) > self._settings.max_open_logs:
            victim = None
            if fair:
                shares = self._open_shares(tenant)
                givers = {t for t, share in shares.items() if self._holding(t) > share}
                givers.add(tenant)
                # Least recently used first; stops at the first fit.
                victim = next(
                    (h for h in self._open.values() if h.users == 0 and h.tenant in givers), None
                )
                at_share = self._holding(tenant) >= shares[tenant]
                if (
                    victim is None and at_share and any(h.users == 0 for h in self._open.values())
                ):  # only others' idle logs (within their shares) could give way
                    self._metrics.backpressure.labels("fair_share").inc()
                    raise BackpressureError(
                        f"tenant {tenant} holds {self._holding(tenant)} of the "
                        f"{self._settings.max_open_logs} open logs, its fair share, and none "
                        "of those that could give way is idle",
                        "fair_share",
                        1,
                    )
            if victim is None:
                victim = next((h for h in self._open.values() if h.users == 0), None)
            if victim is None:
                # The open-log cap, not a store conflict (409 contention): its own reason.
                self._metrics.backpressure.labels(OPEN_LOG_CAP).inc()
                raise BackpressureError(
                    f"all {len(self._open)} open logs are busy (LOGHOST_MAX_OPEN_LOGS)",
                    OPEN_LOG_CAP,
                    1,
                )
            self._metrics.evictions.inc()
            await self._close_handle(victim)

    async def _close_handle(self, h: LogHandle) -> None:
        if self._open.get(h.collection_id) is not h:
            task = self._closing.get(h.collection_id)
            if task is not None:
                await asyncio.shield(task)
            return
        del self._open[h.collection_id]
        self._tenant_open[h.tenant] -= 1
        if self._tenant_open[h.tenant] <= 0:
            del self._tenant_open[h.tenant]
        self._metrics.open_logs.set(len(self._open))
        h.gone.set()
        h.changed.set()  # long-polls on it stop waiting

        async def finish() -> None:
            try:
                await h.writer.close()
            finally:
                # Every close leaves its fence for the log's next writer here (a failed writer
                # and one that learned its own manifest by a load included: either may have
                # taken the log over, and the next one, finding a manifest naming this process,
                # would otherwise answer at once).  The etag only when the writer knows it wrote
                # the stored manifest and did not fail.
                self._remember_fence(h.writer)
                await self._leader.release(str(h.collection_id))

        cid = h.collection_id
        task = asyncio.create_task(finish(), name=f"close:{cid}")
        self._closing[cid] = task

        def forget(t: asyncio.Task[None]) -> None:
            # On the task itself, not in an awaiter that may be cancelled: a finished close
            # left behind would make the next open of this log spin.
            if self._closing.get(cid) is t:
                del self._closing[cid]

        task.add_done_callback(forget)
        await asyncio.shield(task)

    def _remember_fence(self, writer: LogWriter) -> None:
        cid = UUID(writer.prefix.rsplit("/", 1)[-1])
        authored = writer.authored_etag if writer.failed is None else None
        etag = authored[0] if authored is not None else None
        fence = writer.fence_until
        old = self._authored.get(cid)
        if old is not None:
            fence = max(fence, old[1])
        if etag is None and fence <= writer.options.clock.monotonic():
            self._authored.pop(cid, None)  # nothing to hand on
            return
        self._authored[cid] = (etag, fence)
        self._authored.move_to_end(cid)
        while len(self._authored) > 100_000:
            # Drop the oldest entry whose fence has passed (an etag only saves a fence-free
            # reopen); a fence still running is never dropped.
            now = writer.options.clock.monotonic()
            victim = next((k for k, (_e, f) in self._authored.items() if f <= now), None)
            if victim is None:
                break
            del self._authored[victim]

    async def contended(self, h: LogHandle) -> bool:
        """Another writer appended to ``h``'s log under a request: True when the request should
        be retried here (this server still writes the log); NotLeader (307) when another server
        writes it now; False when the hint cannot tell (the 409 stands)."""
        cid = str(h.collection_id)
        verdict = await self._leader.recheck(cid)
        if verdict is None:
            return False
        if verdict:
            return True
        target = self._leader.lost_to(cid)
        await self.lost_leadership(cid)
        if target is None:
            return False
        self._metrics.redirects.inc()
        raise NotLeader(target)

    async def lost_leadership(self, collection_id: str) -> None:
        """The hint says another server took this log over: stop serving it here.

        New requests are redirected to the new holder at once; requests in flight finish, and
        the log closes when the last one ends (``use()``), idle or not at this moment.
        """
        try:
            cid = UUID(collection_id)
        except ValueError:
            return
        h = self._open.get(cid)
        if h is None or self._leader.holds(collection_id):
            return  # closed meanwhile, or claimed again since the renewal saw it lost
        h.lost = True
        h.lost_to = self._leader.lost_to(collection_id)
        h.changed.set()  # long-polls re-enter use() and are redirected
        if h.users == 0:
            await self._close_handle(h)

    async def _idle_loop(self) -> None:
        period = max(0.05, min(5.0, self._settings.idle_close_s / 4))
        while True:
            await asyncio.sleep(period)  # a periodic sweep, not synchronisation
            now = time.monotonic()
            idle = [
                h
                for h in self._open.values()
                if h.users == 0 and now - h.last_used >= self._settings.idle_close_s
            ]
            for h in idle:
                try:
                    await self._close_handle(h)
                    self._metrics.idle_closes.inc()
                except Exception:
                    _log.exception("closing idle log %s failed", h.collection_id)

    # ------------------------------------------------------------------------------ buffering

    def reserve(self, nbytes: int) -> None:
        """Account bytes an append is about to buffer; 429 when the server is full."""
        if self._buffered + nbytes > self._settings.max_buffered_bytes and self._buffered:
            self._metrics.backpressure.labels("batching").inc()
            raise BackpressureError(
                f"{self._buffered} bytes buffered on this server", "batching", 1
            )
        self._buffered += nbytes
        self._metrics.buffered_bytes.set(self._buffered)

    def release(self, nbytes: int) -> None:
        """Return bytes reserved by ``reserve``."""
        self._buffered -= nbytes
        self._metrics.buffered_bytes.set(self._buffered)

    # ------------------------------------------------------------------------------- cursors

    async def compaction_offset(self, cid: UUID) -> int | None:
        """The compaction cursor of a log: from memory when open, else from the store."""
        h = self._open.get(cid)
        if h is not None:
            return h.compaction_offset
        w = await CursorStore(self._store, log_prefix(cid), "loghost").load(COMPACTION)
        return None if w is None else w.cursor.offset
