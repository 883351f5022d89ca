"""``Batcher``: group commit and pipelined fragment uploads.

1. ``submit`` queues an append's bodies (or refuses it at once with ``Backpressure`` when the
   bytes accepted but not yet acknowledged would pass ``batch.max_outstanding_bytes``); the caller
   waits on a future of its own: a cancelled caller only stops waiting, the work that other
   appends depend on goes on.
2. ``kick`` cuts a batch when enough bytes are queued, when the pipeline is idle, or when the
   batch interval expires, and assigns it the next sequence number and offsets speculatively.
3. Each batch is encoded (off the event loop when large) and uploaded with ``If-None-Match: *``
   concurrently with the fragment hook (the dirty log); up to ``batch.max_inflight_fragments``
   may be in flight.  Every fragment records the setsum of the fragment it must follow, so a
   stale speculative upload can never be linked after someone else's fragment.

The committer links what is uploaded and tells the batcher to answer it (``acknowledge``);
recovery decides the fate of what was not linked and hands the batcher back where the next batch
goes (``continue_after``, ``restart_at``), what to retry (``retry``, ``requeue``) and which dead
objects the next batch at a slot must overwrite (``mark_dead``).
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING

from .appends import Append, AppendResult, Batch, FragmentHook, FragmentInfo
from .errors import (
    Backpressure,
    LogFull,
    LogSealed,
    ObjectNotFound,
    PreconditionFailed,
    StoreUnavailable,
)
from .fragment import EncodedFragment, KeyEntry, encode_fragment
from .idempotency import KeyWindow
from .manifest import Manifest, ensure_room
from .options import LogWriterOptions
from .paths import join
from .setsum import Setsum
from .store import ObjectStore, etag_matches_content, put_resolving

if TYPE_CHECKING:
    from .committer import Committer
    from .recovery import Recovery

_INLINE_ENCODE_BYTES = 256 << 10  # smaller batches encode faster than a thread hop


class Batcher:
    """The appends queued, the batches in flight, and where the next batch goes."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions,
        hook: FragmentHook | None,
        stats: collections.Counter[str],
        keys: KeyWindow,
        manifest: Manifest,
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._opts = options
        self._hook = hook
        self._stats = stats
        self._keys = keys
        self._loop = asyncio.get_running_loop()
        self._committer: Committer | None = None
        self._recovery: Recovery | None = None
        # Speculative allocation: where the next batch goes.
        self._next_seq = manifest.next_seq_no
        self._next_offset = manifest.next_offset
        self._last_ts = 0
        self._tail: asyncio.Future[Setsum | None] = self._resolved(manifest.tail_setsum)
        self._dead: dict[int, str] = {}  # seq -> etag of an unlinkable object to overwrite
        self._pending: collections.deque[Append] = collections.deque()
        self._pending_bytes = 0
        self._inflight: dict[int, Batch] = {}
        self._outstanding_bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_fired = False

    def attach(self, committer: Committer, recovery: Recovery) -> None:
        """The committer to wake when a batch is done, and the two whose state may hold back
        cutting (a recovery, a failed or closing writer)."""
        self._committer, self._recovery = committer, recovery

    @property
    def _parts(self) -> tuple[Committer, Recovery]:
        assert self._committer is not None and self._recovery is not None, "not attached"
        return self._committer, self._recovery

    # -------------------------------------------------------------------------- the queue

    @property
    def outstanding_bytes(self) -> int:
        """Bytes accepted but not yet acknowledged."""
        return self._outstanding_bytes

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing in flight."""
        return not self._pending and not self._inflight

    @property
    def has_queued(self) -> bool:
        """Appends are queued that no batch holds yet."""
        return bool(self._pending)

    def submit(self, bodies: list[bytes], key: str | None) -> Append:
        """Queue an append (its answer is its ``future``), or refuse it with ``Backpressure``."""
        item = Append(bodies, key, self._loop)
        if self._outstanding_bytes + item.nbytes > self._opts.batch.max_outstanding_bytes:
            self._stats["backpressure"] += 1
            raise Backpressure(
                f"{self._outstanding_bytes} bytes outstanding on {self._prefix}", "batching"
            )
        self._outstanding_bytes += item.nbytes
        if key is not None and item.shared is not None:
            self._keys.wait_on(key, item.shared)
        self._pending.append(item)
        self._pending_bytes += item.nbytes
        self.kick()
        return item

    def requeue(self, appends: list[Append]) -> None:
        """Put freed appends back at the head of the queue, in order (the log keeps their order
        ahead of what was queued since)."""
        for a in reversed(appends):
            self._pending.appendleft(a)
            self._pending_bytes += a.nbytes

    def drop_known_keys(self) -> None:
        """Resolve queued appends whose key turned out to be in the log already (read repair)."""
        keep: collections.deque[Append] = collections.deque()
        for a in self._pending:
            known = self._keys.known(a.key) if a.key is not None else None
            if a.key is None or known is None:
                keep.append(a)
                continue
            self._pending_bytes -= a.nbytes
            self._outstanding_bytes -= a.nbytes
            self._keys.resolved(a.key, known, None)
            a.answer(known.as_duplicate())
        self._pending = keep

    def reject_queued_keyed(self, error: Callable[[], BaseException]) -> None:
        """Fail every queued keyed append with an ``error()``: until the keys others linked are
        read, such an append might duplicate one."""
        for a in [a for a in self._pending if a.key is not None]:
            self._pending.remove(a)
            self._pending_bytes -= a.nbytes
            self.reject(a, error())

    # ------------------------------------------------------------------------- answering

    def resolve(self, a: Append, r: AppendResult, seq_no: int | None) -> None:
        """Answer ``a`` with ``r`` (linked in fragment ``seq_no``; None: already in the log)."""
        self._outstanding_bytes -= a.nbytes
        if a.key is not None:
            self._keys.resolved(a.key, r, seq_no)
        a.answer(r)

    def reject(self, a: Append, err: BaseException) -> None:
        """Fail ``a`` with ``err``."""
        self._outstanding_bytes -= a.nbytes
        if a.key is not None:
            self._keys.rejected(a.key, a.shared)
        a.fail(err)

    def acknowledge(self, linked: list[Batch]) -> None:
        """A manifest landed that links these batches: answer their appends."""
        for b in linked:
            self._inflight.pop(b.seq_no, None)
            off = b.start
            for a in b.appends:
                r = AppendResult(off, len(a.bodies), b.timestamp_us, digest=a.digest)
                off += len(a.bodies)
                self.resolve(a, r, b.seq_no)

    def fail_sealed(self) -> None:
        """The log is sealed: fail what is queued, and what is in flight as it lands."""
        err = LogSealed(f"log {self._prefix} is sealed")
        self.fail_queued(err)

    def fail_queued(self, err: BaseException) -> None:
        """Fail every queued append, and every batch in flight that is done."""
        while self._pending:
            a = self._pending.popleft()
            self.reject(a, err)
        self._pending_bytes = 0
        for b in list(self._inflight.values()):
            if b.done:
                for a in b.appends:
                    self.reject(a, err)
                del self._inflight[b.seq_no]

    def fail_all(self, err: BaseException) -> None:
        """The writer stopped: fail everything queued and in flight, and stop the uploads."""
        self.fail_queued(err)
        for b in list(self._inflight.values()):
            for a in b.appends:
                self.reject(a, err)
            if b.task is not None:
                b.task.cancel()
        self._inflight.clear()

    def reject_in_flight(self, error: Callable[[], BaseException]) -> None:
        """Fail every append in flight with an ``error()``, and forget their batches."""
        for b in list(self._inflight.values()):
            for a in b.appends:
                self.reject(a, error())
        self._inflight.clear()

    # ----------------------------------------------------------------------- in flight

    @property
    def in_flight(self) -> Mapping[int, Batch]:
        """The batches cut and not yet answered, by sequence number."""
        return self._inflight

    def take_in_flight(self) -> list[Batch]:
        """Every batch in flight, in sequence order, no longer in flight."""
        batches = sorted(self._inflight.values(), key=lambda b: b.seq_no)
        self._inflight.clear()
        return batches

    def drop(self, seq_no: int) -> None:
        """Forget the batch in flight at ``seq_no`` (its appends are answered elsewhere)."""
        del self._inflight[seq_no]

    def put_back(self, b: Batch) -> None:
        """``b`` is in flight again (kept by recovery)."""
        self._inflight[b.seq_no] = b

    def retry(self, b: Batch, delay_s: float) -> None:
        """Finish what ``b`` still lacks (its upload, its hook) after ``delay_s``."""
        b.task = asyncio.create_task(
            self._retry_batch(b, delay_s), name=f"wal3-frag-retry:{b.seq_no}"
        )

    # ------------------------------------------------------------------------- allocation

    def continue_after(self, last: Batch) -> None:
        """The next batch follows ``last`` (kept in flight)."""
        assert last.frag is not None
        self._next_seq, self._next_offset = last.seq_no + 1, last.frag.limit
        self._tail = last.encoded

    def restart_at(self, manifest: Manifest) -> None:
        """The next batch follows ``manifest``'s tail."""
        self._next_seq = manifest.next_seq_no
        self._next_offset = manifest.next_offset
        self._tail = self._resolved(manifest.tail_setsum)

    def mark_dead(self, seq_no: int, etag: str) -> None:
        """The object at ``seq_no`` (etag ``etag``) can never be linked: overwrite it there."""
        self._dead[seq_no] = etag

    def take_dead(self, seq_no: int, default: str | None) -> str | None:
        """The etag of a dead object at ``seq_no`` to overwrite, forgotten here."""
        return self._dead.pop(seq_no, default)

    def forget_dead_below(self, seq_no: int) -> None:
        """Slots below ``seq_no`` are linked: nothing there is to be overwritten."""
        for seq in [s for s in self._dead if s < seq_no]:
            del self._dead[seq]

    def _resolved(self, value: Setsum | None) -> asyncio.Future[Setsum | None]:
        f: asyncio.Future[Setsum | None] = self._loop.create_future()
        f.set_result(value)
        return f

    def _now_us(self) -> int:
        # Strictly increasing per writer: a retried batch never re-creates an earlier fragment.
        self._last_ts = max(self._opts.clock.wall_us(), self._last_ts + 1)
        return self._last_ts

    # ---------------------------------------------------------------------------- cutting

    def kick(self) -> None:
        """Cut and start batches if the policy allows; synchronous so allocation never races."""
        committer, recovery = self._parts
        if recovery.recovering or committer.failure is not None:
            return
        if recovery.stale:
            committer.wake()
            return
        opts = self._opts
        while self._pending and len(self._inflight) < opts.batch.max_inflight_fragments:
            idle = not self._inflight
            if not (
                idle
                or committer.closing
                or self._timer_fired
                or self._pending_bytes >= opts.batch.size_bytes
            ):
                if self._timer is None:
                    self._timer = self._loop.call_later(opts.batch.interval_s, self._on_timer)
                return
            self._start_batch()
        self._timer_fired = False
        if not self._pending and self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def cancel_timer(self) -> None:
        """The writer closed: no batch interval runs out any more."""
        if self._timer is not None:
            self._timer.cancel()

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_fired = True
        self.kick()

    def _start_batch(self) -> None:
        opts = self._opts
        appends: list[Append] = []
        nbytes = nrec = 0
        while self._pending:
            a = self._pending[0]
            if appends and (
                nbytes + a.nbytes > opts.batch.size_bytes
                or nrec + len(a.bodies) > opts.batch.max_records
            ):
                break
            self._pending.popleft()
            self._pending_bytes -= a.nbytes
            appends.append(a)
            nbytes += a.nbytes
            nrec += len(a.bodies)
        seq = self._next_seq
        try:
            ensure_room(seq, self._next_offset, nrec)
        except LogFull as e:
            # Never upload what can never be linked (read repair would meet it at every open);
            # the appends queued behind fail too.
            for a in appends:
                self.reject(a, e)
            while self._pending:
                self.reject(self._pending.popleft(), e)
            self._pending_bytes = 0
            return
        batch = Batch(
            seq,
            self._next_offset,
            self._now_us(),
            appends,
            self._tail,
            self._loop,
            self._dead.pop(seq, None),
        )
        self._next_seq += 1
        self._next_offset += batch.count
        self._tail = batch.encoded
        self._inflight[seq] = batch
        batch.task = asyncio.create_task(self._run_batch(batch), name=f"wal3-frag:{seq}")

    # -------------------------------------------------------------------------- uploading

    async def _run_batch(self, b: Batch) -> None:
        """Encode and upload one fragment, with the hook alongside."""
        committer, recovery = self._parts
        try:
            prev = await b.prev
            b.prev_setsum = prev
            keys: dict[str, KeyEntry] = {}
            off = b.start
            for a in b.appends:
                if a.key is not None and a.digest is not None:
                    keys[a.key] = (off, len(a.bodies), a.digest)
                off += len(a.bodies)
            bodies = [body for a in b.appends for body in a.bodies]
            writer = self._opts.writer_name
            if sum(a.nbytes for a in b.appends) < _INLINE_ENCODE_BYTES:
                frag = encode_fragment(
                    b.seq_no, b.start, b.timestamp_us, bodies, prev=prev, keys=keys, writer=writer
                )
            else:
                frag = await asyncio.to_thread(
                    encode_fragment,
                    b.seq_no,
                    b.start,
                    b.timestamp_us,
                    bodies,
                    prev=prev,
                    keys=keys,
                    writer=writer,
                )
            b.frag = frag
            b.md5 = frag.content_md5
            b.encoded.set_result(frag.setsum)
            recovery.note_encoded(b.seq_no, b.md5, frag.setsum)
            await self._settle(b)
        except BaseException as e:
            b.error = e
            if not b.encoded.done():
                b.encoded.set_exception(e)
                b.encoded.exception()  # mark retrieved: later batches see it via their prev
        finally:
            b.done = True
            committer.wake()

    async def _retry_batch(self, b: Batch, delay_s: float) -> None:
        """Finish what an encoded fragment still lacks (its upload, its hook), bytes unchanged."""
        committer, _ = self._parts
        try:
            await asyncio.sleep(delay_s)  # back off from a struggling store or dirty log
            if (
                b.hooked
                and b.upload != "ok"
                and self._opts.clock.monotonic() - b.hooked_at >= self._opts.retry.remark_after_s
            ):
                b.hooked = False  # an old mark may be gone by now: mark again, then re-send
            await self._settle(b)
        except BaseException as e:
            b.error = e
        finally:
            b.done = True
            committer.wake()

    async def _settle(self, b: Batch) -> None:
        """Upload the fragment and run the hook, concurrently, each unless already done."""
        frag = b.frag
        assert frag is not None
        jobs: list[Awaitable[None]] = []
        if b.upload != "ok":
            jobs.append(self._upload(b, frag))
        if self._hook is None:
            b.hooked = True
        elif not b.hooked:
            jobs.append(
                self._mark(
                    b, FragmentInfo(b.seq_no, frag.start, frag.limit - frag.start, b.timestamp_us)
                )
            )
        results = await asyncio.gather(*jobs, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r

    async def _mark(self, b: Batch, info: FragmentInfo) -> None:
        assert self._hook is not None
        issued = self._opts.clock.monotonic()  # a mark is as old as its request: judge by that
        await self._hook(info)
        b.hooked = True
        b.hooked_at = issued

    async def _upload(self, b: Batch, frag: EncodedFragment) -> None:
        key = join(self._prefix, frag.path)
        try:
            if b.overwrite_etag is not None:
                try:
                    await put_resolving(self._store, key, frag.data, if_match=b.overwrite_etag)
                except PreconditionFailed:
                    # The dead object was replaced (then the key is taken) or is gone (then it is
                    # free again).
                    try:
                        await self._store.head(key)
                    except ObjectNotFound:
                        await put_resolving(self._store, key, frag.data, if_none_match="*")
                    else:
                        raise
            else:
                await put_resolving(self._store, key, frag.data, if_none_match="*")
        except PreconditionFailed:
            # An earlier attempt of ours may be what holds the key (its answer was lost).  Only
            # other bytes there prove ours absent; a HEAD that fails, or finds the key gone
            # (collected since?), tells nothing, and "absent" would let linked bytes of ours be
            # answered "not written" or written again.
            try:
                held = (await self._store.head(key)).etag
            except (ObjectNotFound, StoreUnavailable, OSError):
                b.upload = "unknown"
                raise
            if not etag_matches_content(held, frag.data):
                b.upload = "absent"
                raise
        except BaseException:
            b.upload = "unknown"
            raise
        b.upload = "ok"
        self._stats["fragments_written"] += 1
