"""Which log hosts are alive, and which of them should write a given log.

Every host keeps a liveness record in the object store, ``hosts/live/{server_id}.json`` (never in
Redis, which is only a hint), and rewrites it every ``interval_s``.  From the records every host
derives the same answer to "who writes collection C?" without Redis: rendezvous hashing of C over
the hosts that are live and serving.  Redis, when present, is still consulted first (cheaper, more
current); this is what routing falls back on.  Conditional writes on each log's manifest keep two
writers safe whenever the views disagree (a host joining or leaving): routing is never correctness.

Time is the store's, not ours: a record's age is the ``last_modified`` of our own record, written a
moment before the listing, minus the record's own.  Host clocks may be skewed; one store's clock
is one clock.

The record's body names the server id, advertise URL, incarnation and state, and counts beats (so
every beat changes its etag: file systems stamp times coarsely, and equal bytes have equal
etags).  A beat is a conditional put (``If-Match`` our last etag).  It fails only when another
process wrote our key since: a second live process with the same server id (refused at
:meth:`Membership.join`, reported at every beat after), or a host that adopted us and then forgot
our record (we write it again).  A draining host rewrites its record as ``draining``: the others stop routing to it at
their next refresh, while its age still counts from its last beat for adoption.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import secrets
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace
from typing import Literal

from wal3 import ObjectStore
from wal3.errors import ObjectNotFound, PreconditionFailed
from wal3.paths import HOSTS_LIVE_PREFIX, host_live_key, parse_host_live_key

_log = logging.getLogger("loghost.membership")

State = Literal["serving", "draining"]


class DuplicateServerId(RuntimeError):
    """Another live process beats under this server id: two hosts with one id would share (and
    fight over) one dirty log.  ``loghost serve`` exits 8 with this line."""


@dataclass(frozen=True)
class HostRecord:
    """One host's liveness record, as last listed."""

    server_id: str
    url: str  # its advertise URL: the redirect target
    incarnation: str  # random per process
    state: State
    last_beat: float  # the record's last_modified, in the store's clock (0 until listed)
    beats: int = 0  # beats of this incarnation
    hostname: str = ""  # the machine and process that write it (operators' view)
    pid: int = 0
    interval_s: float = 0.0  # how often its writer beats (0: not recorded)
    etag: str = ""  # the etag it was read at (never in the body)

    def to_bytes(self) -> bytes:
        """The record's body (``last_beat`` is the object's own time, not in the body)."""
        return json.dumps(
            {
                "server_id": self.server_id,
                "url": self.url,
                "incarnation": self.incarnation,
                "state": self.state,
                "beats": self.beats,
                "hostname": self.hostname,
                "pid": self.pid,
                "interval_s": self.interval_s,
            },
            separators=(",", ":"),
            sort_keys=True,
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes, last_beat: float, etag: str = "") -> HostRecord | None:
        """Parse a record; None when it is not one (damaged, or written by something else)."""
        try:
            doc = json.loads(data)
        except ValueError:
            return None
        if not isinstance(doc, dict):
            return None
        server_id, url, inc, state = (
            doc.get(k) for k in ("server_id", "url", "incarnation", "state")
        )
        if not all(isinstance(v, str) for v in (server_id, url, inc)) or state not in (
            "serving",
            "draining",
        ):
            return None
        beats, hostname, pid = doc.get("beats", 0), doc.get("hostname", ""), doc.get("pid", 0)
        interval = doc.get("interval_s", 0.0)
        if (
            not isinstance(beats, int)
            or not isinstance(hostname, str)
            or not isinstance(pid, int)
            or not isinstance(interval, int | float)
            or not 0 <= interval < 1e6
        ):
            return None
        return cls(
            str(server_id),
            str(url),
            str(inc),
            state,
            last_beat,
            beats,
            hostname,
            pid,
            float(interval),
            etag,
        )

    def describe(self) -> str:
        """Who writes the record, for the refusal line."""
        who = f"{self.hostname} pid {self.pid}" if self.hostname else self.incarnation
        return f"a live host {who} listening on {self.url}"


def rendezvous_score(key: str, server_id: str) -> int:
    """The weight of ``server_id`` for ``key``: the highest weight owns the key.  A host's arrival
    or departure moves only the keys it wins or held (about 1/N of them)."""
    digest = hashlib.blake2b(f"{key}\n{server_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous_owner(key: str, hosts: Iterable[HostRecord]) -> HostRecord | None:
    """The host that owns ``key`` among ``hosts`` (ties, impossible in practice, by id)."""
    return max(hosts, key=lambda h: (rendezvous_score(key, h.server_id), h.server_id), default=None)


_OWNERS_CACHED = 1 << 16  # owners remembered per view (a bound: then they are computed anew)


class Membership:
    """This host's liveness record and the view of every host's, refreshed every ``interval_s``.

    ``ttl_s``: a serving host whose record is younger is live (routed to).  ``on_refresh`` runs
    after each refresh (the automatic adoption hangs off it).
    """

    def __init__(
        self,
        store: ObjectStore,
        server_id: str,
        url: str,
        *,
        interval_s: float = 3.0,
        ttl_s: float = 10.0,
        sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
        on_failure: Callable[[BaseException], object] | None = None,
    ) -> None:
        if interval_s <= 0 or ttl_s <= interval_s:
            raise ValueError("membership: need 0 < interval_s < ttl_s")
        self._store = store
        self._key = host_live_key(server_id)
        self.interval_s = interval_s
        self.ttl_s = ttl_s
        self._sleep = sleep
        self._on_failure = on_failure
        self.me = HostRecord(
            server_id,
            url.rstrip("/"),
            secrets.token_hex(8),
            "serving",
            0.0,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            interval_s=interval_s,
        )
        self._etag: str | None = None
        self._records: dict[str, HostRecord] = {}
        self._store_now = 0.0
        self._owners: dict[str, HostRecord | None] = {}
        self._owners_view: tuple[int, str] | None = None
        self._refreshes = 0  # views taken (the owners' cache is of one view)
        self._task: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Future[None] | None = None  # see refresh_now()
        self._on_refresh: list[Callable[[], Awaitable[None]]] = []
        self._after: asyncio.Task[None] | None = None
        self.steady = False  # see refresh()
        self._closing = False
        self.duplicates = 0  # beats that found another process's record under our id
        self.refresh_failures = 0
        self._drain_written = False  # a draining record was written (close() retries it if not)

    @property
    def server_id(self) -> str:
        return self.me.server_id

    # ------------------------------------------------------------------------------ joining

    async def join(self) -> None:
        """Write our record, refusing a server id another live process beats under.

        A record of another incarnation may be our own predecessor's (a restart, after a crash,
        within ``ttl_s``) or a live twin's.  Only watching tells them apart: if the record is
        rewritten within 1.5 of the intervals it records, a twin is alive
        (:class:`DuplicateServerId`); else we take the record over with a conditional put, which
        a twin's beat racing us would fail.  A draining record (a clean stop) is taken over at
        once.
        """
        try:
            got = await self._store.get(self._key)
            meta = await self._store.head(self._key)
        except ObjectNotFound:
            got = None
        if got is None:
            try:
                self._etag = await self._store.put(self._key, self._next(), if_none_match="*")
            except PreconditionFailed:
                raise DuplicateServerId(
                    self._twin_message("another process (its record appeared as this host started)")
                ) from None
        else:
            prior = HostRecord.from_bytes(got.data, meta.last_modified, got.etag)
            if (
                prior is not None
                and prior.state == "serving"
                and await self._beats_elsewhere(prior)
            ):
                raise DuplicateServerId(self._twin_message(prior.describe()))
            try:
                self._etag = await self._store.put(self._key, self._next(), if_match=got.etag)
            except PreconditionFailed:
                raise DuplicateServerId(
                    self._twin_message(
                        "another process (its record was rewritten as this host started)"
                    )
                ) from None
        await self.refresh()

    async def _beats_elsewhere(self, prior: HostRecord) -> bool:
        """Whether ``prior``, our key's serving record, is still being beaten by its process:
        watched for 1.5 of the intervals it says its writer beats at (ours when it says none).

        Its age is not consulted: before our first write we know no time of the store's, and a
        host clock ahead of the store's would take a live twin's record for a stale one.  So a
        restart after a crash always watches once, however long ago the crash was."""
        await self._sleep(1.5 * (prior.interval_s or self.interval_s))
        try:
            return (await self._store.head(self._key)).etag != prior.etag
        except ObjectNotFound:
            return False

    def _next(self) -> bytes:
        """Our record's body for the next write (one more beat)."""
        self.me = replace(self.me, beats=self.me.beats + 1)
        return self.me.to_bytes()

    def _twin_message(self, who: str) -> str:
        return (
            f"server id {self.server_id!r} is in use by {who}; "
            "give each host its own --server-id (LOGHOST_SERVER_ID)"
        )

    # ------------------------------------------------------------------------------- beating

    async def beat(self) -> None:
        """Rewrite our record (conditionally), then refresh the view."""
        try:
            self._etag = await self._store.put(self._key, self._next(), if_match=self._etag)
        except PreconditionFailed:
            await self._rewrite_after_conflict()
        await self.refresh()

    async def _rewrite_after_conflict(self) -> None:
        try:
            got = await self._store.get(self._key)
        except ObjectNotFound:
            # Forgotten by a host that adopted our dirty log while we were away: we are back.
            _log.warning(
                "liveness record %s was removed by an adopter; writing it again", self._key
            )
            self._etag = await self._store.put(self._key, self._next(), if_none_match="*")
            return
        other = HostRecord.from_bytes(got.data, 0.0)
        if other is not None and other.incarnation != self.me.incarnation:
            self.duplicates += 1
            _log.error("%s", self._twin_message(other.describe()))
        self._etag = await self._store.put(self._key, self._next(), if_match=got.etag)

    async def drain(self) -> None:
        """Say we are leaving: the others stop routing to us at their next refresh."""
        self.me = replace(self.me, state="draining")
        with contextlib.suppress(Exception):
            await self.beat()
            self._drain_written = True

    async def forget(self, server_id: str, seen: HostRecord) -> bool:
        """Remove a departed host's record (after adopting its dirty log) unless it beat since
        ``seen``; True when removed by us (False when another adopter removed it first, so one
        adoption is counted once).  A host coming back meanwhile writes its record again."""
        key = host_live_key(server_id)
        try:
            meta = await self._store.head(key)
        except ObjectNotFound:
            return False
        if meta.etag != seen.etag:
            return False
        await self._store.delete(key)
        self._records.pop(server_id, None)
        return True

    # ------------------------------------------------------------------------------ the view

    async def refresh(self) -> None:
        """List every record and read the ones that are new or changed."""
        metas = [m async for m in self._store.list(HOSTS_LIVE_PREFIX)]
        records: dict[str, HostRecord] = {}
        for meta in metas:
            sid = parse_host_live_key(meta.key)
            if sid is None:
                continue
            known = self._records.get(sid)
            if known is not None and meta.etag and meta.etag == known.etag:
                records[sid] = replace(known, last_beat=meta.last_modified)  # S3 lists etags
                continue
            try:
                got = await self._store.get(meta.key)
            except ObjectNotFound:
                continue
            rec = HostRecord.from_bytes(got.data, meta.last_modified, got.etag)
            # A body naming another server than its key (copied, restored, foreign) stands for
            # nobody: else its URL would be that host's and, never beating, it would have that
            # (live) host adopted at every refresh.
            if rec is not None and rec.server_id == sid:
                records[sid] = rec
        previous = self._store_now
        mine = records.get(self.server_id)
        if mine is not None and mine.incarnation == self.me.incarnation:
            self._store_now = mine.last_beat
        else:
            self._store_now = max((r.last_beat for r in records.values()), default=0.0)
        # Steady: our previous refresh is less than a TTL of store time ago.  After a gap (a
        # store outage, a paused process) every other record looks old too, so nothing is
        # judged departed until a second refresh.
        self.steady = previous > 0 and self._store_now - previous < self.ttl_s
        self._records = records
        self._refreshes += 1
        if self._on_refresh and not self._closing and (self._after is None or self._after.done()):
            # In a task of its own: an adoption may be slow, and the beat must go on meanwhile
            # (one at a time; a refresh while one runs is caught up by the next).
            self._after = asyncio.create_task(self._run_after(), name="membership:after")

    async def refresh_now(self) -> None:
        """Refresh the view at once, out of the beat's turn (a request found a log written by
        another host: our view may be a refresh old).  Callers at the same moment share one."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.ensure_future(self.refresh())
        await asyncio.shield(self._refreshing)

    async def _run_after(self) -> None:
        for fn in list(self._on_refresh):
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception:
                _log.exception("after a membership refresh")

    async def settled(self) -> None:
        """Wait for the callbacks of the last refresh to finish (tests, and close)."""
        if self._after is not None:
            await asyncio.shield(self._after)

    def age(self, record: HostRecord) -> float:
        """Seconds since ``record``'s last beat, in the store's clock."""
        return max(0.0, self._store_now - record.last_beat)

    def live(self) -> list[HostRecord]:
        """The hosts to route to: serving, and beaten within ``ttl_s``; ourselves while serving."""
        out = {
            sid: r
            for sid, r in self._records.items()
            if r.state == "serving" and self.age(r) < self.ttl_s and sid != self.server_id
        }
        if self.me.state == "serving":
            out[self.server_id] = self.me
        return sorted(out.values(), key=lambda r: r.server_id)

    def owner(self, key: str) -> HostRecord | None:
        """The live host that should serve ``key`` (None when we are draining and alone).

        Every request asks (routing), so answers are kept until the view changes: a refresh, or
        our own state.  (Our own record in an answer may be some beats old: callers read only
        its server id and URL.)"""
        view = (self._refreshes, self.me.state)
        if view != self._owners_view or len(self._owners) >= _OWNERS_CACHED:
            self._owners_view, self._owners = view, {}
        try:
            return self._owners[key]
        except KeyError:
            found = self._owners[key] = rendezvous_owner(key, self.live())
            return found

    def departed(self, older_than_s: float) -> list[HostRecord]:
        """Other hosts whose last beat is at least ``older_than_s`` old."""
        return sorted(
            (
                r
                for sid, r in self._records.items()
                if sid != self.server_id and self.age(r) >= older_than_s
            ),
            key=lambda r: r.server_id,
        )

    def records(self) -> list[HostRecord]:
        """Every record of the last refresh."""
        return sorted(self._records.values(), key=lambda r: r.server_id)

    # ----------------------------------------------------------------------------- the loop

    def on_refresh(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``fn`` after every refresh (failures are logged, never stop the beat)."""
        self._on_refresh.append(fn)

    def start(self) -> None:
        """Beat every ``interval_s`` in the background (after :meth:`join`)."""
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"membership:{self.server_id}")

    async def _run(self) -> None:
        while True:
            await self._sleep(self.interval_s)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a store outage: keep the last view, beat again later
                self.refresh_failures += 1
                _log.warning("membership beat failed: %s", e)
                if self._on_failure is not None:
                    self._on_failure(e)

    async def close(self) -> None:
        """Stop beating; the record stays, marked draining (a restart with the same id takes it
        over at once, and the others stop routing here)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._closing = True  # the drain's refresh runs no callbacks: the server is stopping
        if self._after is not None:
            self._after.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._after
        if self._etag is not None and not self._drain_written:
            await self.drain()  # also when the drain's own write failed
