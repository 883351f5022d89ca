"""``Committer``: in-order manifest writes, rebases, manifest edits and snapshots.

One committer links uploaded fragments strictly in sequence order, as many as are ready per
manifest write, with ``If-Match`` on the manifest's etag.  Only then are the appends durable,
and only then are they answered.

A failed condition means someone else touched the log.  If nobody appended (garbage collection,
a snapshot, a seal by another process) the manifest write is rebased and retried, up to
``retry.max_rebases`` times.  Otherwise recovery takes over (``recovery.py``).

Snapshots (manifest compaction): after a manifest write, when the root holds more than
``snapshot.fragment_threshold`` fragments the oldest are written as an immutable snapshot in the
background and linked by the next manifest write the committer makes anyway.  A snapshot older
than ``snapshot.max_age_s`` is never linked (garbage collection may consider an unlinked
snapshot an orphan).

The committer's loop is the writer's life: it ends when the writer closes with nothing left to
write, and when it dies everything queued, in flight or waiting fails with it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from .appends import Batch, ManifestEdit
from .batcher import Batcher
from .errors import (
    CorruptFragment,
    LogSealed,
    PreconditionFailed,
    ProcessDeath,
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from .idempotency import KeyWindow
from .lease import Lease
from .manifest import Manifest, Snapshot, plan_snapshot
from .options import LogWriterOptions
from .paths import join
from .store import ObjectStore, ensure_object

if TYPE_CHECKING:
    from .recovery import Recovery

_log = logging.getLogger("wal3.writer")  # one logger for every part of the writer


def _unchanged(m: Manifest) -> Manifest:
    return m


class _Edit:
    __slots__ = ("claim", "fn", "future")

    def __init__(self, fn: ManifestEdit, loop: asyncio.AbstractEventLoop, claim: bool = False):
        self.fn = fn
        self.claim = claim  # take the log over if this write would (``Committer.claim``)
        self.future: asyncio.Future[Manifest] = loop.create_future()


class Committer:
    """The manifest this writer holds, the edits and the snapshot waiting to be written with it,
    and the writer's life (closing, failed)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions,
        stats: collections.Counter[str],
        manifest: Manifest,
        etag: str,
        lease: Lease,
        batcher: Batcher,
        keys: KeyWindow,
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._opts = options
        self._stats = stats
        self._lease = lease
        self._batcher = batcher
        self._keys = keys
        self._loop = asyncio.get_running_loop()
        self._recovery: Recovery | None = None
        self._manifest = manifest
        self._etag = etag
        self._edits: list[_Edit] = []
        self._snapshot: tuple[Snapshot, float] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._closing = False
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self, recovery: Recovery, name: str) -> None:
        """Run the commit loop (as task ``name``), handing failed writes to ``recovery``."""
        self._recovery = recovery
        self._task = asyncio.create_task(self._commit_loop(), name=name)

    @property
    def _rec(self) -> Recovery:
        """Recovery, which takes over when a manifest write fails (set by ``start``)."""
        assert self._recovery is not None, "not started"
        return self._recovery

    # ------------------------------------------------------------------------ what it holds

    @property
    def manifest(self) -> Manifest:
        """The newest manifest this writer knows to be installed."""
        return self._manifest

    @property
    def etag(self) -> str:
        """The etag of ``manifest``."""
        return self._etag

    @property
    def failure(self) -> BaseException | None:
        """Why the writer stopped working (a crash, a bug), or None while it is healthy."""
        return self._failure

    @property
    def closing(self) -> bool:
        """Whether ``close`` was called."""
        return self._closing

    @property
    def closed(self) -> bool:
        """Whether the writer stopped accepting appends."""
        return self._closing or self._failure is not None

    def wake(self) -> None:
        """There may be committing work: a batch is done, an edit or a snapshot is waiting."""
        self._wake.set()

    def check_open(self) -> None:
        """Raise unless appends are taken: not failed, not sealed, not closing."""
        if self._failure is not None:
            raise WriterClosed(f"writer for {self._prefix} failed: {self._failure!r}")
        if self._manifest.sealed:
            raise LogSealed(f"log {self._prefix} is sealed")
        if self._closing:
            raise WriterClosed(f"writer for {self._prefix} is closing")

    # ---------------------------------------------------------------------- edits and life

    async def edit(self, fn: ManifestEdit) -> Manifest:
        """Apply a pure manifest transform through the normal, fenced manifest write (see
        ``LogWriter.edit_manifest``).  On a manifest another writer holds, the edit is written
        as a collector's: that writer's holder and lease carried over, nothing leased by us."""
        return await self._edit(fn, claim=False)

    async def claim(self) -> Manifest:
        """A fenced write that links nothing: the log's claim (the lease's "Claim") when the
        write takes it over, else the stored manifest written back as it is (it lands, or fails
        its If-Match and recovery reloads)."""
        return await self._edit(_unchanged, claim=True)

    async def _edit(self, fn: ManifestEdit, *, claim: bool) -> Manifest:
        if self._failure is not None:
            raise WriterClosed(f"writer for {self._prefix} failed: {self._failure!r}")
        if self._closing:
            raise WriterClosed(f"writer for {self._prefix} is closing")
        edit = _Edit(fn, self._loop, claim)
        self._edits.append(edit)
        self._wake.set()
        return await asyncio.shield(edit.future)

    def fail_edits(self, error: Callable[[], BaseException]) -> None:
        """Fail every waiting edit with an ``error()``."""
        for e in list(self._edits):
            if not e.future.done():
                e.future.set_exception(error())
        self._edits.clear()

    async def compact(self) -> int:
        """Write and link every snapshot the thresholds call for now; returns how many.

        Normally snapshots trail the appends in the background; this settles them (before a
        fork, in tests, or for an operator).
        """
        written = 0
        while True:
            self.check_open()
            task = self._snapshot_task
            if task is not None:
                await asyncio.shield(task)
                continue
            if self._snapshot is not None:
                before = self._manifest
                await self.edit(lambda m: m)  # links the pending snapshot
                if self._manifest is before:
                    return written
                written += 1
                continue
            self._maybe_snapshot()
            if self._snapshot_task is None:
                return written

    async def wait_for_commit(self, after_offset: int, timeout_s: float) -> bool:
        """Wait until the record at ``after_offset`` exists, i.e. the next offset passes it (long
        polls); False on timeout or close."""
        deadline = self._loop.time() + timeout_s
        while self._manifest.next_offset <= after_offset:
            remaining = deadline - self._loop.time()
            if remaining <= 0 or self.closed:
                return False
            event = self._committed
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
        return True

    async def close(self) -> None:
        """Flush everything accepted, then stop.  Idempotent."""
        if not self._closing:
            self._closing = True
            self._batcher.kick()
            self._wake.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._task)
        if self._snapshot_task is not None:
            with contextlib.suppress(BaseException):
                await self._snapshot_task

    # ---------------------------------------------------------------------------- committing

    async def _commit_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                try:
                    while await self._commit_step():
                        pass
                except (StoreUnavailable, OSError) as e:
                    self._rec.go_stale(e)
                    continue
                if self._closing and self._batcher.idle and not self._edits:
                    return
        except ProcessDeath as e:
            self._fail_everything(e)
        except asyncio.CancelledError:
            self._fail_everything(WriterClosed(f"writer for {self._prefix} was cancelled"))
            raise
        except BaseException as e:
            _log.exception("wal3 committer for %s died", self._prefix)
            self._fail_everything(e)
            if isinstance(e, (KeyboardInterrupt, SystemExit)):
                raise

    async def _commit_step(self) -> bool:
        """Do one unit of committing work; False when there is nothing to do now."""
        batcher, recovery = self._batcher, self._rec
        if self._manifest.sealed and batcher.in_flight:
            batcher.fail_sealed()  # uploads that finish after the seal are answered as they land
        if recovery.stale:
            await recovery.recover(link_others=not self._idle())
            return not recovery.stale
        ready: list[Batch] = []
        seq = self._manifest.next_seq_no
        failed = False
        inflight = batcher.in_flight
        while seq in inflight:
            b = inflight[seq]
            if not b.done:
                break
            if isinstance(b.error, ProcessDeath):
                raise b.error
            if b.error is not None:
                failed = True
                break
            ready.append(b)
            seq += 1
        if not ready and failed:
            await recovery.recover()
            return True
        snapshot = self._take_snapshot()
        if not ready and not self._edits and snapshot is None:
            if self._closing and batcher.has_queued:
                batcher.kick()
            return False
        await self._write_manifest(ready, snapshot)
        return True

    def _idle(self, ready: Sequence[Batch] = ()) -> bool:
        """Nothing of ours to link (an edit, a snapshot): a recovery then takes no other writer's
        log over to link its orphans (``Recovery.recover``'s ``link_others``), whether the edit
        lost a race or met a store error (helper-7's review of 3225561: an idle editor's error
        recovery claimed the holder's log and fenced it after the faults had stopped)."""
        return not ready and not self._batcher.in_flight and not self._batcher.has_queued

    async def _write_manifest(self, ready: list[Batch], snapshot: Snapshot | None) -> None:
        edits = list(self._edits)
        rebases = 0
        while True:
            base = self._manifest
            if base.sealed and ready:
                # A sealed log still takes edits (GC), never fragments.
                self._batcher.fail_sealed()
                ready = []
            if not ready and not edits and snapshot is None:
                return
            # Records are linked only on a manifest this writer wrote and once its fence has
            # passed: a take-over first claims the log with a write that links nothing (the
            # lease's "Claim"), so nobody sees them while an old holder's lease may still answer.
            # A write on another writer's manifest with nothing to link and no claim asked for
            # is written as a collector's edit: the holder's name and lease stay, and this
            # writer gains no authorship.  Written under our name it would look to the holder
            # like a rival's claim, and the holder would yield its log for a fence that protects
            # nothing (a GC through edit_manifest on the host that does not hold the log, during
            # a leader split: the adversarial review of b755610).  Also on a base that records
            # no lease: ours recorded, the holder's next write would be a take-over to fence for.
            asked = any(e.claim for e in edits)
            claiming = self._lease.takes_over(base, self._etag) and (bool(ready) or asked)
            collecting = not ready and not asked and self._lease.others(base, self._etag)
            if claiming:
                await self._lease.yielded()
                new = base  # stamped below: under our name, so its etag is not the base's
            else:
                if ready:
                    await self._lease.wait_fence()
                new = base.with_fragments([b.pointer for b in ready], self._opts.writer_name)
                if snapshot is not None:
                    snapped = new.with_snapshot(snapshot, self._opts.writer_name)
                    if snapped is None:
                        self._snapshot = snapshot = None
                    else:
                        new = snapped
                applied: list[_Edit] = []
                for edit in edits:
                    try:
                        new = edit.fn(new)
                        applied.append(edit)
                    except Exception as err:
                        self._edits.remove(edit)
                        if not edit.future.done():
                            edit.future.set_exception(err)
                edits = applied
            if collecting:
                new = self._lease.as_collector(new, base)
            else:
                new = self._lease.stamped(new, base, self._etag)
            new.check()
            base_etag = self._etag
            issued = self._opts.clock.monotonic()
            try:
                etag = await self._lease.put(new, base_etag, base)
            except PreconditionFailed:
                self._stats["manifest_conflicts"] += 1
                loaded = await self._lease.load()
                if loaded is None:
                    raise WriterClosed(f"manifest of {self._prefix} vanished") from None
                current, cur_etag = loaded
                self._lease.lost_to(current, cur_etag, base)
                if current.same_tail(base) and rebases < self._opts.retry.max_rebases:
                    # Nobody appended (GC, a snapshot or a seal elsewhere): rebase and retry.
                    self._manifest, self._etag = current, cur_etag
                    rebases += 1
                    continue
                await self._rec.recover(reloaded=loaded, link_others=not self._idle(ready))
                return
            except (StoreUnavailable, OSError, CorruptFragment) as e:
                self._stats["manifest_errors"] += 1
                _log.warning("manifest write for %s failed: %r; recovering", self._prefix, e)
                await self._rec.recover(link_others=not self._idle(ready))
                return
            if not collecting:
                self._lease.landed(base_etag, etag, issued, base)  # before installed acknowledges
            if claiming:
                self.installed(new, etag, [])  # ours now; the records follow once fenced
                for edit in [e for e in edits if e.claim]:
                    # A claim asked for is done once it lands (its edit is the identity).
                    edits.remove(edit)
                    self._edits.remove(edit)
                    if not edit.future.done():
                        edit.future.set_result(new)
                continue
            self.installed(new, etag, ready)
            if ready:
                self._rec.progressed()
            if snapshot is not None:
                self._snapshot = None
            for edit in edits:
                self._edits.remove(edit)
                if not edit.future.done():
                    edit.future.set_result(new)
            if new.sealed:
                self._batcher.fail_sealed()
            return

    def installed(self, new: Manifest, etag: str, linked: list[Batch]) -> None:
        """A manifest landed: acknowledge what it links and wake whoever waits."""
        self._manifest, self._etag = new, etag
        self._stats["manifest_writes"] += 1
        self._batcher.acknowledge(linked)
        self._keys.expire()
        event, self._committed = self._committed, asyncio.Event()
        event.set()
        self._maybe_snapshot()
        self._batcher.kick()

    def _fail_everything(self, err: BaseException) -> None:
        self._failure = err
        wrapped = err if isinstance(err, Wal3Error) else WriterClosed(repr(err))
        self._batcher.fail_all(wrapped)
        self.fail_edits(lambda: wrapped)
        self._keys.fail_waiters(wrapped)
        event, self._committed = self._committed, asyncio.Event()
        event.set()

    # ---------------------------------------------------------------------------- snapshots

    def _take_snapshot(self) -> Snapshot | None:
        if self._snapshot is None:
            return None
        snap, written = self._snapshot
        if self._opts.clock.monotonic() - written > self._opts.snapshot.max_age_s:
            # Garbage collection may treat an old unlinked snapshot as an orphan: never link it.
            self._snapshot = None
            return None
        return snap

    def _maybe_snapshot(self) -> None:
        if self._snapshot is not None or self._snapshot_task is not None or self._closing:
            return
        snap = plan_snapshot(
            self._manifest,
            fragment_threshold=self._opts.snapshot.fragment_threshold,
            snapshot_threshold=self._opts.snapshot.snapshot_threshold,
            writer=self._opts.writer_name,
        )
        if snap is not None:
            self._snapshot_task = asyncio.create_task(self._write_snapshot(snap))

    async def _write_snapshot(self, snap: Snapshot) -> None:
        """Upload a snapshot off the append path; the next manifest write links it."""
        try:
            await ensure_object(self._store, join(self._prefix, snap.path), snap.to_bytes())
            self._snapshot = (snap, self._opts.clock.monotonic())
            self._stats["snapshots_written"] += 1
            self._wake.set()
        except (StoreUnavailable, OSError) as e:
            _log.warning("snapshot upload for %s failed: %r", self._prefix, e)
        except ProcessDeath as e:
            self._fail_everything(e)
        finally:
            self._snapshot_task = None
