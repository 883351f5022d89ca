"""``LogWriter``: group commit, pipelined fragment uploads and in-order manifest writes.

The write path:

1. ``append_many`` queues the bodies and waits on a future of its own: a cancelled caller only
   stops waiting, the work that other appends depend on goes on.
2. The batcher cuts a batch when enough bytes are queued, when the pipeline is idle, or when the
   batch interval expires, and assigns it the next sequence number and offsets speculatively.
3. Each batch is encoded off the event loop and uploaded with ``If-None-Match: *`` concurrently with
   the fragment hook (the dirty log); several uploads may be in flight.
4. One committer links uploaded fragments strictly in sequence order, as many as are ready per
   manifest write, with ``If-Match`` on the manifest's etag.  Only then are the appends durable.

Fencing and recovery: a failed condition means someone else touched the log.  If nobody appended
(garbage collection, a snapshot, a seal by another process) the manifest write is rebased and
retried.  Otherwise the writer pauses, lets in-flight uploads settle, reloads the manifest, links
any orphan fragment that fits at the tail (read repair, so a crashed writer never wedges the log),
acknowledges its own fragments that turn out linked, and fails the rest with ``LogContention``.
Every fragment records the setsum of the fragment it must follow, so a stale speculative upload
can never be linked after someone else's fragment; such dead objects are overwritten in place.

Read leases (``read_lease_s`` > 0): when may a reader answer from this writer's in-memory
manifest instead of loading the stored one?  Another process may have written the log (a second
writer is fenced, not prevented: the leader hint is advisory and may be wrong in any way), and
an answer must never miss a record that was acknowledged before it was asked for.  The store's
conditional writes are the only fence, so the rule is built on them and on monotonic clocks:

* **Lease.**  ``current_manifest()`` is the manifest in memory only if this writer wrote it itself
  (its etag is one our own put returned) and a store interaction *issued* less than
  ``read_lease_s`` ago proved it was still the stored one: our write (issued at ``i``, so the
  manifest was ours at some moment after ``i``) or a HEAD that found its etag
  (``confirm_lease``).  A HEAD that finds another etag while one of our own manifest puts is
  in flight (or was issued during the HEAD) gives no lease but keeps authorship: the etag may be
  our own next manifest, its answer not back yet, and dropping authorship would make that write
  look like a take-over (the writer fencing itself).  If it is another writer's, our put's
  If-Match fails and recovery loads and fences it.  The manifest is read before the clock is, so
  a pause in between can only shorten the lease.  A manifest this writer merely loaded is never leased: its author may still
  write on top of it without fencing (its base is its own), and we would not know.  Etags are
  content hashes (S3, the local store), so "an etag our put returned" names our bytes only if no
  other writer can write byte-identical ones: every manifest names its writer, and writer names
  must be unique per process (the log host's are).
* **Fence.**  A writer whose manifest write lands on a base it did not write (a take-over: it
  loaded that base, so another writer may hold a lease on it) acknowledges nothing until
  ``1.25 x`` *the base's lease* after that write's answer arrived.  Likewise after every load
  that shows a manifest it did not write: what it then learns (idempotency keys of others'
  appends) is not answered before the fence either.
* **Whose lease.**  Every manifest this writer puts records its ``read_lease_s`` (the
  ``read_lease_ms`` field, which Rust ignores), a writer never leases a manifest for longer than
  it records (one without the field is not leased at all), and the fence is for the lease
  recorded in the base, never for the taker's own setting.  So writers configured differently
  (a rolling change of the setting, a host at 0) stay safe: the bound a holder's lease obeys is
  written next to the manifest it vouches for, by the holder.  (One fixed cluster-wide fence
  would also be safe, but would make every take-over pay the largest lease anyone may ever
  configure, and a host at 0 would still have to know it.)  A base without the field (Rust,
  a version of this writer before the field) is fenced for this writer's own setting, as
  before.  The fence a writer raised outlives it: ``open(authored=...)`` hands it to the next
  writer of the log in this process, whatever that one finds stored.

Why no stale read, case by case (H leases manifest M, another writer G acknowledges X):

1. G's write of X lands on M (a take-over).  H's last proof of M was issued before X landed
   (after it, the store held G's manifest and the proof would have failed), so H's lease ends
   before landing + ``read_lease_s``; G acknowledges X no sooner than landing +
   ``fence_s`` (G's clock, measured from when it learned of the landing, later still).  Any read
   asked after the acknowledgement finds H's lease over; H's HEAD then sees G's etag, and the
   read loads the stored manifest (X included).  The 25 % covers clock-rate differences.
2. G's write lands on a manifest G wrote itself.  Nobody else can lease it (only its author
   leases), so nobody answers from an older one: M was replaced by G's earlier take-over write,
   whose fence has passed as in 1.
3. H crashes, stalls, is suspended or is cut off from Redis: its lease only runs out; it never
   extends without a store round trip, so a stalled H that wakes up re-proves before it answers
   (``Clock.monotonic`` counts suspended time, so a suspend cannot stretch a lease).
4. X reached H through a load (H's recovery read it, or learned its key): H's answers based on
   that load wait for its own fence, which ends after G's (H loaded after X landed).
5. Redis restarts empty, stalls, fails over, or names two holders: nothing above reads it.

Costs: one HEAD per ``read_lease_s`` per log read from memory without being written (own writes
renew the lease for free), and a ``fence_s`` wait for acknowledgements after a take-over (a
fail-over, a restart, a split between hosts), never in the steady state.  With
``read_lease_s`` = 0 nothing is leased and nothing waits: every read loads the manifest.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from .errors import (
    Backpressure,
    CorruptFragment,
    LogContention,
    LogFull,
    LogSealed,
    ObjectNotFound,
    PreconditionFailed,
    ProcessDeath,
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from .fragment import (
    EncodedFragment,
    KeyEntry,
    decode_fragment,
    encode_fragment,
    key_digest,
    read_footer,
    request_digest,
)
from .layout import load_manifest
from .manifest import FragmentPointer, Manifest, Snapshot, ensure_room, plan_snapshot
from .options import (
    FENCE_FACTOR,
    BatchOptions,
    IdempotencyOptions,
    LeaseOptions,
    LogWriterOptions,
    RetryOptions,
    SnapshotOptions,
    default_writer_name,
)
from .paths import MANIFEST_PATH, fragment_path, join
from .reader import Limits, SnapshotCache, resolve_fragments, tail_fragments
from .setsum import Setsum
from .store import (
    ObjectStore,
    ResolvedPreconditionFailed,
    content_etag,
    ensure_object,
    etag_matches_content,
    put_resolving,
)

__all__ = [
    "FENCE_FACTOR",
    "AppendResult",
    "BatchOptions",
    "FragmentHook",
    "FragmentInfo",
    "IdempotencyOptions",
    "LeaseOptions",
    "LogPosition",
    "LogWriter",
    "LogWriterOptions",
    "ManifestEdit",
    "RetryOptions",
    "SnapshotOptions",
    "default_writer_name",
]

_log = logging.getLogger("wal3.writer")
_INLINE_ENCODE_BYTES = 256 << 10  # smaller batches encode faster than a thread hop


def _lease_ms(read_lease_s: float) -> int:
    return max(0, round(read_lease_s * 1000))


@dataclass(frozen=True, slots=True)
class LogPosition:
    """A record's offset and the timestamp it was written with."""

    offset: int
    timestamp_us: int


@dataclass(frozen=True, slots=True)
class AppendResult:
    """Where an ``append_many`` landed; ``deduplicated`` when an idempotency key matched."""

    first_offset: int
    count: int
    timestamp_us: int
    deduplicated: bool = False
    # ``fragment.request_digest`` of the bodies the idempotency key first appended; None without
    # a key, or for a key learned from a fragment written before keys carried it.
    digest: str | None = None

    def as_duplicate(self) -> AppendResult:
        """This result, answering a retry of its append."""
        return AppendResult(self.first_offset, self.count, self.timestamp_us, True, self.digest)

    @property
    def next_offset(self) -> int:
        """The offset after the last appended record."""
        return self.first_offset + self.count


@dataclass(frozen=True, slots=True)
class FragmentInfo:
    """What the fragment hook learns about each fragment written or repaired."""

    seq_no: int
    start: int
    count: int
    timestamp_us: int
    repaired: bool = False


FragmentHook = Callable[[FragmentInfo], Awaitable[None]]
ManifestEdit = Callable[[Manifest], Manifest]


def _bare(etag: str) -> str:
    """An etag without the quotes S3 puts around it (callers may see either form)."""
    return etag.strip('"')


@dataclass(frozen=True, slots=True)
class _Repaired:
    """What a read repair left: the stored manifest and its etag, whether another writer linked
    the fragment it was linking (a live writer), and whether it linked bytes this writer did not
    encode (others' orphans)."""

    manifest: Manifest
    etag: str
    met_writer: bool
    linked_others: bool


class _Append:
    __slots__ = (
        "attempts",
        "bodies",
        "digest",
        "future",
        "key",
        "met_writer",
        "nbytes",
        "others_rounds",
        "shared",
    )

    def __init__(self, bodies: list[bytes], key: str | None, loop: asyncio.AbstractEventLoop):
        self.bodies = bodies
        self.nbytes = sum(len(b) for b in bodies) + 32 * len(bodies)
        self.key = key
        # Kept with the key (memory and footer): a reused key is told apart from a retry even
        # once these records are collected.
        self.digest = request_digest(bodies) if key is not None else None
        # The caller's future may be cancelled with the caller; duplicates of a keyed append
        # wait on ``shared`` instead, which only the writer settles.
        self.future: asyncio.Future[AppendResult] = loop.create_future()
        self.shared: asyncio.Future[AppendResult] | None = (
            loop.create_future() if key is not None else None
        )
        self.attempts = 0
        # Recoveries that freed this append because others' orphans were linked, and whether
        # one met a writer linking what our repair was linking (see ``_recover``).
        self.others_rounds = 0
        self.met_writer = False

    def settle(self, result: AppendResult | None, err: BaseException | None) -> None:
        """Answer the caller (unless it gave up) and any duplicate waiting on the same key."""
        for f in (self.future, self.shared):
            if f is None or f.done():
                continue
            if err is None:
                f.set_result(result)  # type: ignore[arg-type]
            else:
                f.set_exception(err)
                f.exception()  # nobody may be left to retrieve it; do not warn


class _Batch:
    """One fragment's worth of appends.  Once encoded its bytes never change: while the fragment may
    still be linked, a retry re-sends the same bytes (and re-runs the hook), so a late or repeated
    upload can never put the same appends into the log twice."""

    __slots__ = (
        "appends",
        "attempts",
        "count",
        "done",
        "encoded",
        "error",
        "frag",
        "hooked",
        "hooked_at",
        "md5",
        "overwrite_etag",
        "prev",
        "prev_setsum",
        "seq_no",
        "start",
        "task",
        "timestamp_us",
        "upload",
    )

    def __init__(
        self,
        seq_no: int,
        start: int,
        timestamp_us: int,
        appends: list[_Append],
        prev: asyncio.Future[Setsum | None],
        loop: asyncio.AbstractEventLoop,
        overwrite_etag: str | None,
    ):
        self.seq_no = seq_no
        self.start = start
        self.count = sum(len(a.bodies) for a in appends)
        self.timestamp_us = timestamp_us
        self.appends = appends
        self.prev = prev
        self.encoded: asyncio.Future[Setsum | None] = loop.create_future()
        self.frag: EncodedFragment | None = None
        self.md5: str | None = None
        self.error: BaseException | None = None
        self.done = False
        self.task: asyncio.Task[None] | None = None
        self.overwrite_etag = overwrite_etag
        self.prev_setsum: Setsum | None = None  # the setsum this fragment follows, once known
        # "pending" (not tried), "ok" (our bytes are at the key), "absent" (they are not and cannot
        # land: the condition failed), "unknown" (the store did not say).
        self.upload = "pending"
        self.hooked = False
        self.hooked_at = 0.0  # monotonic time the last successful hook call was issued
        self.attempts = 0  # retries of this very fragment

    @property
    def settled(self) -> bool:
        """Uploaded and marked by the hook: ready to link."""
        return self.upload == "ok" and self.hooked

    @property
    def pointer(self) -> FragmentPointer:
        f = self.frag
        assert f is not None
        return FragmentPointer(f.path, f.seq_no, f.start, f.limit, f.num_bytes, f.setsum, self.md5)


class _Edit:
    __slots__ = ("fn", "future")

    def __init__(self, fn: ManifestEdit, loop: asyncio.AbstractEventLoop):
        self.fn = fn
        self.future: asyncio.Future[Manifest] = loop.create_future()


class LogWriter:
    """The single writer of a log (best effort: a second writer is fenced, never trusted)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions,
        manifest: Manifest,
        etag: str,
        hook: FragmentHook | None,
    ) -> None:
        self._store = store
        self._prefix = prefix.strip("/")
        self._opts = options
        self._hook = hook
        self._loop = asyncio.get_running_loop()
        self._manifest = manifest
        self._etag = etag
        # Read leases (module docstring): the etag of the newest manifest this writer put, when
        # the latest proof that the stored manifest was ours was issued, and the time before
        # which nothing is acknowledged.
        self._authored: str | None = None
        self._lease_from: float | None = None
        self._fence_until = float("-inf")
        self._confirming: asyncio.Task[bool] | None = None
        # Our manifest puts: in flight now, and issued ever.  A lease-renewing HEAD overlapping
        # one may see our own next manifest before its answer reaches us (confirm_lease).
        self._manifest_puts_in_flight = 0
        self._manifest_puts_issued = 0
        # Speculative allocation: where the next batch goes.
        self._next_seq = manifest.next_seq_no
        self._next_offset = manifest.next_offset
        self._last_ts = 0
        self._tail: asyncio.Future[Setsum | None] = self._resolved(manifest.tail_setsum)
        self._dead: dict[int, str] = {}  # seq -> etag of an unlinkable object to overwrite
        # seq -> setsum of every fragment this writer encoded lately: what is not in here and got
        # linked was appended by someone else (contention), not by our own earlier attempts.
        self._mine: collections.OrderedDict[int, tuple[str, Setsum]] = collections.OrderedDict()
        self._pending: collections.deque[_Append] = collections.deque()
        self._pending_bytes = 0
        self._inflight: dict[int, _Batch] = {}
        self._outstanding_bytes = 0
        self._edits: list[_Edit] = []
        self._snapshot: tuple[Snapshot, float] | None = None
        self._snapshot_task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_fired = False
        self._recovering = False
        self._stale = False  # the last recovery could not reload the manifest
        self._repair_blocked: Exception | None = None  # why read repair last stopped early
        # MD5 of every fragment this writer encoded lately, earlier attempts at a slot included
        # (``_mine`` keeps only the latest per slot): bytes repair links that are not in here
        # are someone else's, whatever name their footer carries.
        self._encoded: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._closing = False
        self._failure: BaseException | None = None
        self._wake = asyncio.Event()
        self._committed = asyncio.Event()
        self._keys: collections.OrderedDict[str, AppendResult] = collections.OrderedDict()
        self._key_seq: dict[str, int] = {}  # the fragment each key is in, to expire the window
        # hash(key) -> fragment, for keys past idempotency.window_keys still in the fragment window.
        self._spill: dict[int, int] = {}
        self._keys_loaded = False
        self._unlearned: set[int] = set()  # sequence numbers whose footers we still must read
        self._keys_lock = asyncio.Lock()
        self._snapshots = SnapshotCache(16)
        self._key_waiters: dict[str, asyncio.Future[AppendResult]] = {}
        self.stats: collections.Counter[str] = collections.Counter()
        self._committer = asyncio.create_task(self._commit_loop(), name=f"wal3-commit:{prefix}")

    # ------------------------------------------------------------------------------ opening

    @classmethod
    async def open(
        cls,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions | None = None,
        *,
        hook: FragmentHook | None = None,
        authored: tuple[str | None, float] | None = None,
    ) -> LogWriter:
        """Open the log at ``prefix``, creating it (If-None-Match) when it does not exist.

        ``authored``: the etag a writer of this process wrote last (closed since; None when it
        did not know it wrote the stored one) and its fence; if the stored manifest is still that
        one, it is this writer's own (leases, no take-over).  The fence is kept whatever is found:
        the previous writer may have taken the log over, and this one may answer from that.
        """
        opts = options or LogWriterOptions()
        created = False
        for _ in range(opts.retry.max_rebases):
            issued = opts.clock.monotonic()
            loaded = await load_manifest(store, prefix)
            if loaded is not None:
                break
            empty = replace(
                Manifest.empty(opts.writer_name), read_lease_ms=_lease_ms(opts.lease.read_lease_s)
            )
            try:
                etag = await put_resolving(
                    store, join(prefix, MANIFEST_PATH), empty.to_bytes(), if_none_match="*"
                )
                loaded, created = (empty, etag), True
                break
            except PreconditionFailed:
                continue  # someone created it first (or a 409 storm): load theirs
        else:
            raise LogContention(f"could not open {prefix}: the manifest kept changing")
        manifest, etag = loaded
        w = cls(store, prefix, opts, manifest, etag, hook)
        if created:
            w._landed(None, etag, issued, None)  # nobody could lease what did not exist
        elif authored is not None and authored[0] and _bare(authored[0]) == _bare(etag):
            w._authored, w._lease_from = etag, issued
        elif opts.lease.name_is_unique and manifest.writer == opts.writer_name:
            # Written by this process (e.g. created before this writer opened): ours.
            w._authored, w._lease_from = etag, issued
        else:
            w._note_load(manifest, etag)
        if authored is not None:
            # The fence the log's previous writer in this process raised (a take-over it made,
            # a manifest it loaded) is this writer's too, whatever it finds: it may be about to
            # answer from that take-over's manifest.
            w._fence_until = max(w._fence_until, authored[1])
        return w

    # ---------------------------------------------------------------------------- properties

    @property
    def prefix(self) -> str:
        """The log's prefix in the store."""
        return self._prefix

    @property
    def store(self) -> ObjectStore:
        """The store the log lives in."""
        return self._store

    @property
    def manifest(self) -> Manifest:
        """The newest manifest this writer knows to be installed."""
        return self._manifest

    @property
    def options(self) -> LogWriterOptions:
        """The options the writer was opened with."""
        return self._opts

    @property
    def outstanding_bytes(self) -> int:
        """Bytes accepted but not yet acknowledged."""
        return self._outstanding_bytes

    @property
    def authored(self) -> bool:
        """Whether the manifest in memory is one this writer wrote (a lease can vouch for it)."""
        return self._authored is not None and _bare(self._etag) == _bare(self._authored)

    @property
    def authored_etag(self) -> tuple[str, float] | None:
        """The manifest's etag and the fence, when this writer wrote the manifest it holds (for
        ``open(authored=...)`` of the next writer in this process)."""
        return (self._etag, self._fence_until) if self.authored else None

    @property
    def fence_until(self) -> float:
        """Monotonic time before which this writer acknowledges nothing (a take-over)."""
        return self._fence_until

    def current_manifest(self) -> Manifest | None:
        """The manifest in memory if a read lease vouches that it is the stored one, else None
        (load it from the store).  See the module docstring."""
        m = self._manifest  # read before the clock: a pause in between only shortens the lease
        if self.lease_remaining() <= 0:
            return None
        return m

    def lease_remaining(self) -> float:
        """Seconds the read lease has left (0 when there is none)."""
        lease = self._lease_s()
        if (
            lease <= 0
            or self._lease_from is None
            or not self.authored
            or self._failure is not None
            or self._recovering
            or self._stale
        ):
            return 0.0
        return max(0.0, self._lease_from + lease - self._opts.clock.monotonic())

    async def confirm_lease(self) -> bool:
        """Renew the read lease with a HEAD of the manifest: True if it is still the one this
        writer wrote.  False when the store moved on (another writer wrote it) or cannot tell;
        the writer then stops vouching until it writes again."""
        if self._opts.lease.read_lease_s <= 0 or not self.authored:
            return False
        task = self._confirming
        if task is None:
            task = self._confirming = asyncio.ensure_future(self._confirm())
            task.add_done_callback(lambda _t: setattr(self, "_confirming", None))
        return await asyncio.shield(task)

    async def _confirm(self) -> bool:
        etag = self._etag
        issued = self._opts.clock.monotonic()
        puts_before = self._manifest_puts_issued
        try:
            held = await self._store.head(join(self._prefix, MANIFEST_PATH))
        except (StoreUnavailable, ObjectNotFound, OSError):
            return False
        if self._etag != etag or not self.authored:
            return self.lease_remaining() > 0  # we wrote again meanwhile: that write proves it
        if _bare(held.etag) != _bare(etag):
            if self._manifest_puts_in_flight or self._manifest_puts_issued != puts_before:
                # Maybe our own next manifest, its answer not back yet: no lease now, but
                # authorship stays (dropping it would make that write look like a take-over
                # and fence us against ourselves).  If another writer's it is, our put's
                # If-Match fails and recovery loads (and fences) what it wrote.
                return False
            self._authored, self._lease_from = None, None  # someone else wrote the log
            return False
        self._lease_from = max(self._lease_from or issued, issued)
        return True

    async def _put_manifest(self, new: Manifest, base_etag: str) -> str:
        """Put ``new`` over ``base_etag``, counted in flight for ``_confirm``."""
        self._manifest_puts_in_flight += 1
        self._manifest_puts_issued += 1
        try:
            return await put_resolving(
                self._store, join(self._prefix, MANIFEST_PATH), new.to_bytes(), if_match=base_etag
            )
        finally:
            self._manifest_puts_in_flight -= 1

    def _landed(
        self, base: str | None, etag: str, issued: float, base_manifest: Manifest | None
    ) -> None:
        """Our manifest write, issued at ``issued`` on top of ``base`` (``base_manifest``),
        landed as ``etag``."""
        if base is not None and (self._authored is None or _bare(base) != _bare(self._authored)):
            # A take-over: whoever wrote ``base`` may hold a lease on it, as long as it says.
            self._raise_fence(base_manifest)
        self._authored, self._lease_from = etag, issued

    def _note_load(self, manifest: Manifest, etag: str) -> None:
        """We read a manifest from the store: what it shows of others waits for the fence."""
        if self._authored is None or _bare(etag) != _bare(self._authored):
            self._raise_fence(manifest)

    def _base_lease_s(self, manifest: Manifest | None) -> float:
        """How long the author of ``manifest`` may answer reads from it: the lease it recorded
        in it, whatever this host's own setting; a manifest without one (Rust, a version of this
        host before the field) is fenced for this host's own setting and a margin (``fence_s``:
        older versions fenced by their own settings, assumed equal)."""
        if manifest is None:
            return self._opts.lease.read_lease_s
        if manifest.read_lease_ms is None:
            return self._opts.lease.read_lease_s
        return manifest.read_lease_ms / 1000.0

    def _stamped(self, new: Manifest) -> Manifest:
        """``new`` as this writer puts it: recording the lease it may answer from it for."""
        ms = _lease_ms(self._opts.lease.read_lease_s)
        return new if new.read_lease_ms == ms else replace(new, read_lease_ms=ms)

    def _lease_s(self) -> float:
        """The lease on the manifest in memory: ours, never longer than it records (so a
        take-over, fencing for the recorded one, always outlasts it)."""
        recorded = self._manifest.read_lease_ms
        return min(self._opts.lease.read_lease_s, 0.0 if recorded is None else recorded / 1000.0)

    def _raise_fence(self, manifest: Manifest | None) -> None:
        lease = self._base_lease_s(manifest)
        if lease > 0:
            self._fence_until = max(
                self._fence_until, self._opts.clock.monotonic() + FENCE_FACTOR * lease
            )

    async def wait_fence(self) -> None:
        """Return once the fence (a take-over) has passed: an acknowledgement of anything this
        writer knows may be given then (see the module docstring)."""
        wait = self._fence_until - self._opts.clock.monotonic()
        if wait > 0:
            await self._opts.clock.sleep(wait)

    @property
    def failed(self) -> BaseException | None:
        """Why the writer stopped working (a crash, a bug), or None while it is healthy."""
        return self._failure

    @property
    def closed(self) -> bool:
        """Whether the writer stopped accepting appends."""
        return self._closing or self._failure is not None

    # ------------------------------------------------------------------------------ appending

    async def append(self, body: bytes) -> LogPosition:
        """Append one record; returns once it is durable."""
        r = await self.append_many([body])
        return LogPosition(r.first_offset, r.timestamp_us)

    async def append_many(
        self, bodies: list[bytes], *, idempotency_key: str | None = None, fence: bool = True
    ) -> AppendResult:
        """Append records contiguously; returns once durable.

        With an ``idempotency_key`` seen within the dedup window, returns the first append's
        result and appends nothing.  After a take-over the result waits for the fence (module
        docstring); ``fence=False`` returns at once, and the caller must ``await wait_fence()``
        before it tells anyone (so it can wait without holding resources).
        """
        r = await self._append_many(bodies, idempotency_key)
        if fence:
            await self.wait_fence()
        return r

    async def _append_many(self, bodies: list[bytes], idempotency_key: str | None) -> AppendResult:
        if not bodies:
            raise ValueError("append at least one record")
        self._check_open()
        if idempotency_key is not None:
            await self._ensure_keys_loaded()
            self._check_open()
            known = self._keys.get(idempotency_key)
            if known is None:
                known = await self._spilled_key(idempotency_key)
                self._check_open()
            if known is not None:
                return known.as_duplicate()
            waiter = self._key_waiters.get(idempotency_key)
            if waiter is not None:
                return (await asyncio.shield(waiter)).as_duplicate()
        item = _Append([bytes(b) for b in bodies], idempotency_key, self._loop)
        if self._outstanding_bytes + item.nbytes > self._opts.batch.max_outstanding_bytes:
            self.stats["backpressure"] += 1
            raise Backpressure(
                f"{self._outstanding_bytes} bytes outstanding on {self._prefix}", "batching"
            )
        self._outstanding_bytes += item.nbytes
        if item.shared is not None:
            self._key_waiters[idempotency_key] = item.shared  # type: ignore[index]
        self._pending.append(item)
        self._pending_bytes += item.nbytes
        self._kick()
        return await item.future

    async def edit_manifest(self, fn: ManifestEdit) -> Manifest:
        """Apply a pure manifest transform through the normal, fenced manifest write.

        ``fn`` may be re-applied to a newer manifest when the write has to be rebased; it raises
        to reject.  Used for sealing and for garbage collection, which a sealed log still takes.
        """
        if self._failure is not None:
            raise WriterClosed(f"writer for {self._prefix} failed: {self._failure!r}")
        if self._closing:
            raise WriterClosed(f"writer for {self._prefix} is closing")
        edit = _Edit(fn, self._loop)
        self._edits.append(edit)
        self._wake.set()
        return await asyncio.shield(edit.future)

    async def seal(self) -> Manifest:
        """Seal the log: after this every append fails with LogSealed."""
        return await self.edit_manifest(lambda m: m.with_sealed(self._opts.writer_name))

    async def compact_manifest(self) -> int:
        """Write and link every snapshot the thresholds call for now; returns how many.

        Normally snapshots trail the appends in the background; this settles them (before a
        fork, in tests, or for an operator).
        """
        written = 0
        while True:
            self._check_open()
            task = self._snapshot_task
            if task is not None:
                await asyncio.shield(task)
                continue
            if self._snapshot is not None:
                before = self._manifest
                await self.edit_manifest(lambda m: m)  # links the pending snapshot
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
            self._kick()
            self._wake.set()
        with contextlib.suppress(Exception):
            await asyncio.shield(self._committer)
        if self._snapshot_task is not None:
            with contextlib.suppress(BaseException):
                await self._snapshot_task
        if self._timer is not None:
            self._timer.cancel()

    # --------------------------------------------------------------------------- internals

    def _resolved(self, value: Setsum | None) -> asyncio.Future[Setsum | None]:
        f: asyncio.Future[Setsum | None] = self._loop.create_future()
        f.set_result(value)
        return f

    def _check_open(self) -> None:
        if self._failure is not None:
            raise WriterClosed(f"writer for {self._prefix} failed: {self._failure!r}")
        if self._manifest.sealed:
            raise LogSealed(f"log {self._prefix} is sealed")
        if self._closing:
            raise WriterClosed(f"writer for {self._prefix} is closing")

    def _now_us(self) -> int:
        # Strictly increasing per writer: a retried batch never re-creates an earlier fragment.
        self._last_ts = max(self._opts.clock.wall_us(), self._last_ts + 1)
        return self._last_ts

    def _kick(self) -> None:
        """Cut and start batches if the policy allows; synchronous so allocation never races."""
        if self._recovering or self._failure is not None:
            return
        if self._stale:
            self._wake.set()
            return
        opts = self._opts
        while self._pending and len(self._inflight) < opts.batch.max_inflight_fragments:
            idle = not self._inflight
            if not (
                idle
                or self._closing
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

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_fired = True
        self._kick()

    def _start_batch(self) -> None:
        opts = self._opts
        appends: list[_Append] = []
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
                self._reject(a, e)
            while self._pending:
                self._reject(self._pending.popleft(), e)
            self._pending_bytes = 0
            return
        batch = _Batch(
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

    async def _run_batch(self, b: _Batch) -> None:
        """Encode and upload one fragment, with the hook alongside."""
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
            self._mine[b.seq_no] = (b.md5, frag.setsum)
            self._mine.move_to_end(b.seq_no)
            while len(self._mine) > 4 * self._opts.idempotency.window_fragments:
                self._mine.popitem(last=False)
            self._encoded[b.md5] = None
            while len(self._encoded) > 4 * self._opts.idempotency.window_fragments:
                self._encoded.popitem(last=False)
            await self._settle(b)
        except BaseException as e:
            b.error = e
            if not b.encoded.done():
                b.encoded.set_exception(e)
                b.encoded.exception()  # mark retrieved: later batches see it via their prev
        finally:
            b.done = True
            self._wake.set()

    async def _retry_batch(self, b: _Batch, delay_s: float) -> None:
        """Finish what an encoded fragment still lacks (its upload, its hook), bytes unchanged."""
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
            self._wake.set()

    async def _settle(self, b: _Batch) -> None:
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

    async def _mark(self, b: _Batch, info: FragmentInfo) -> None:
        assert self._hook is not None
        issued = self._opts.clock.monotonic()  # a mark is as old as its request: judge by that
        await self._hook(info)
        b.hooked = True
        b.hooked_at = issued

    async def _upload(self, b: _Batch, frag: EncodedFragment) -> None:
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
        self.stats["fragments_written"] += 1

    # -------------------------------------------------------------------------- committing

    async def _commit_loop(self) -> None:
        try:
            while True:
                await self._wake.wait()
                self._wake.clear()
                try:
                    while await self._commit_step():
                        pass
                except (StoreUnavailable, OSError) as e:
                    self._go_stale(e)
                    continue
                if self._closing and not self._pending and not self._inflight and not self._edits:
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
        if self._manifest.sealed and self._inflight:
            self._fail_sealed()  # uploads that finish after the seal are answered as they land
        if self._stale:
            await self._recover()
            return not self._stale
        ready: list[_Batch] = []
        seq = self._manifest.next_seq_no
        failed = False
        while seq in self._inflight:
            b = self._inflight[seq]
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
            await self._recover()
            return True
        snapshot = self._take_snapshot()
        if not ready and not self._edits and snapshot is None:
            if self._closing and self._pending:
                self._kick()
            return False
        await self._write_manifest(ready, snapshot)
        return True

    def _take_snapshot(self) -> Snapshot | None:
        if self._snapshot is None:
            return None
        snap, written = self._snapshot
        if self._opts.clock.monotonic() - written > self._opts.snapshot.max_age_s:
            # Garbage collection may treat an old unlinked snapshot as an orphan: never link it.
            self._snapshot = None
            return None
        return snap

    async def _write_manifest(self, ready: list[_Batch], snapshot: Snapshot | None) -> None:
        edits = list(self._edits)
        rebases = 0
        while True:
            base = self._manifest
            if base.sealed and ready:
                # A sealed log still takes edits (GC), never fragments.
                self._fail_sealed()
                ready = []
            if not ready and not edits and snapshot is None:
                return
            new = base.with_fragments([b.pointer for b in ready], self._opts.writer_name)
            if snapshot is not None:
                snapped = new.with_snapshot(snapshot, self._opts.writer_name)
                if snapped is None:
                    self._snapshot = snapshot = None
                else:
                    new = snapped
            applied: list[_Edit] = []
            for e in edits:
                try:
                    new = e.fn(new)
                    applied.append(e)
                except Exception as err:
                    self._edits.remove(e)
                    if not e.future.done():
                        e.future.set_exception(err)
            edits = applied
            new = self._stamped(new)
            new.check()
            base_etag = self._etag
            issued = self._opts.clock.monotonic()
            try:
                etag = await self._put_manifest(new, base_etag)
            except PreconditionFailed:
                self.stats["manifest_conflicts"] += 1
                loaded = await self._load()
                if loaded is None:
                    raise WriterClosed(f"manifest of {self._prefix} vanished") from None
                current, cur_etag = loaded
                if current.same_tail(base) and rebases < self._opts.retry.max_rebases:
                    # Nobody appended (GC, a snapshot or a seal elsewhere): rebase and retry.
                    self._manifest, self._etag = current, cur_etag
                    rebases += 1
                    continue
                await self._recover(reloaded=loaded)
                return
            except (StoreUnavailable, OSError, CorruptFragment) as e:
                self.stats["manifest_errors"] += 1
                _log.warning("manifest write for %s failed: %r; recovering", self._prefix, e)
                await self._recover()
                return
            self._landed(base_etag, etag, issued, base)  # before _installed acknowledges
            self._installed(new, etag, ready)
            if snapshot is not None:
                self._snapshot = None
            for e in edits:
                self._edits.remove(e)
                if not e.future.done():
                    e.future.set_result(new)
            if new.sealed:
                self._fail_sealed()
            return

    def _installed(self, new: Manifest, etag: str, linked: list[_Batch]) -> None:
        """A manifest landed: acknowledge what it links and wake whoever waits."""
        self._manifest, self._etag = new, etag
        self.stats["manifest_writes"] += 1
        for b in linked:
            self._inflight.pop(b.seq_no, None)
            off = b.start
            for a in b.appends:
                r = AppendResult(off, len(a.bodies), b.timestamp_us, digest=a.digest)
                off += len(a.bodies)
                self._resolve(a, r, b.seq_no)
        self._expire_keys()
        event, self._committed = self._committed, asyncio.Event()
        event.set()
        self._maybe_snapshot()
        self._kick()

    def _resolve(self, a: _Append, r: AppendResult, seq_no: int | None) -> None:
        self._outstanding_bytes -= a.nbytes
        if a.key is not None:
            if seq_no is not None:
                self._remember_key(a.key, r, seq_no)
            self._key_waiters.pop(a.key, None)
        a.settle(r, None)

    def _reject(self, a: _Append, err: BaseException) -> None:
        self._outstanding_bytes -= a.nbytes
        if a.key is not None and self._key_waiters.get(a.key) is a.shared:
            del self._key_waiters[a.key]
        a.settle(None, err)

    def _fail_sealed(self) -> None:
        err = LogSealed(f"log {self._prefix} is sealed")
        self._fail_queued(err)

    def _fail_queued(self, err: BaseException) -> None:
        while self._pending:
            a = self._pending.popleft()
            self._reject(a, err)
        self._pending_bytes = 0
        for b in list(self._inflight.values()):
            if b.done:
                for a in b.appends:
                    self._reject(a, err)
                del self._inflight[b.seq_no]

    def _fail_everything(self, err: BaseException) -> None:
        self._failure = err
        wrapped = err if isinstance(err, Wal3Error) else WriterClosed(repr(err))
        self._fail_queued(wrapped)
        for b in list(self._inflight.values()):
            for a in b.appends:
                self._reject(a, wrapped)
            if b.task is not None:
                b.task.cancel()
        self._inflight.clear()
        for e in self._edits:
            if not e.future.done():
                e.future.set_exception(wrapped)
        self._edits.clear()
        for w in self._key_waiters.values():
            if not w.done():
                w.set_exception(wrapped)
                w.exception()
        self._key_waiters.clear()
        event, self._committed = self._committed, asyncio.Event()
        event.set()

    # ---------------------------------------------------------------------------- recovery

    async def _recover(self, reloaded: tuple[Manifest, str] | None = None) -> None:
        """Settle in-flight work, reload, read-repair, and decide every batch's fate.

        A batch that is not linked either still continues the log exactly (its sequence number,
        start and predecessor match the reloaded tail): it keeps its bytes and only its missing
        upload or hook is retried, since those bytes may be in the store already and get linked
        by anyone's read repair.  Or it can never be linked (its slot is taken, or what it
        follows was not linked): then, and only then, its appends are free to be written anew,
        and "not written" (``LogContention``) is a true answer.
        """
        self._recovering = True
        self.stats["recoveries"] += 1
        try:
            tasks = [b.task for b in self._inflight.values() if b.task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            base = self._manifest
            causes = [b.error for b in self._inflight.values() if b.error is not None]
            if any(isinstance(c, StoreUnavailable) for c in causes):
                await asyncio.sleep(0.05)  # let a struggling store breathe before re-reading
            try:
                if reloaded is None:
                    reloaded = await self._load()
                    if reloaded is None:
                        raise WriterClosed(f"manifest of {self._prefix} vanished")
                repaired = await self._repair(*reloaded)
                manifest, etag = repaired.manifest, repaired.etag
                linked: list[_Batch] = []
                unsure: list[_Batch] = []
                for b in self._inflight.values():
                    mine = await self._linked_as_ours(manifest, b)
                    if mine:
                        linked.append(b)
                    elif mine is None:
                        unsure.append(b)
                # Contention means another writer committed.  What we encoded ourselves, linked
                # by us or by anyone's read repair, is not contention.
                foreign = await self._foreign(reloaded[0], base)
                # Keys are learned from everything linked that this recovery does not acknowledge,
                # our own earlier attempts included (answered "maybe", then repaired), by path:
                # garbage collection may have unlinked them already.
                acked = {b.seq_no for b in linked}
                learned = [
                    s for s in range(base.next_seq_no, manifest.next_seq_no) if s not in acked
                ]
            except (StoreUnavailable, OSError) as e:
                self._go_stale(e)
                return
            self._stale = False
            self._installed(manifest, etag, linked)
            for b in unsure:
                # Linked once and collected since, but its object is gone: we cannot tell whose.
                del self._inflight[b.seq_no]
                for a in b.appends:
                    self._reject(
                        a,
                        StoreUnavailable(
                            f"fragment {b.seq_no} of {self._prefix} may have been written"
                        ),
                    )
            leftovers = sorted(self._inflight.values(), key=lambda b: b.seq_no)
            self._inflight.clear()
            # A recovery that moved the log on frees a retry, unless others moved it.  A writer
            # that linked what our repair was linking is alive: that costs an attempt.  Orphans
            # of others that our repair linked are free ``max_append_attempts`` times per
            # append: a dead writer's backlog is one pipeline deep (a few rounds when cut at
            # max_rebases), while a writer that keeps its fragments ahead of every retry would
            # be chased for as long as it writes; after that, each such round costs an attempt.
            moved = manifest.next_seq_no > base.next_seq_no
            met, linked_others = repaired.met_writer, repaired.linked_others
            for seq in [s for s in self._dead if s < manifest.next_seq_no]:
                del self._dead[seq]
            # Learn the keys of fragments others linked before deciding anything: a keyed append
            # whose key is in the log already is answered from there, never "not written".  Also
            # while the first load is still running (it started from an older manifest).
            self._unlearned.update(learned)
            keys_known = True
            if self._keys_loaded and learned:
                try:
                    await self._learn_keys()
                except (StoreUnavailable, OSError) as e:
                    keys_known = False
                    # Until these footers are read, a queued keyed append might duplicate one.
                    for a in [a for a in self._pending if a.key is not None]:
                        self._pending.remove(a)
                        self._pending_bytes -= a.nbytes
                        self._reject(a, StoreUnavailable(f"store unavailable: {e}"))
            keep, free = self._sort_leftovers(manifest, leftovers)
            retry: list[_Append] = []
            for b in free:
                for a in b.appends:
                    known = self._keys.get(a.key) if a.key is not None else None
                    if known is not None:
                        self._resolve(a, known.as_duplicate(), None)
                        continue
                    if met:
                        a.met_writer = True
                        a.attempts += 1
                    elif moved and linked_others:
                        a.others_rounds += 1
                        if a.others_rounds > self._opts.retry.max_append_attempts:
                            a.attempts += 1
                    elif not moved:
                        a.attempts += 1
                    if manifest.sealed:
                        self._reject(a, LogSealed(f"log {self._prefix} is sealed"))
                    elif a.key is not None and not keys_known:
                        self._reject(
                            a,
                            StoreUnavailable(
                                f"could not read what another writer appended to {self._prefix}"
                            ),
                        )
                    elif foreign:
                        self.stats["contention"] += 1
                        self._reject(
                            a,
                            LogContention(
                                f"another writer appended to {self._prefix}; not written"
                            ),
                        )
                    elif a.attempts >= self._opts.retry.max_append_attempts:
                        kept_ahead = a.others_rounds > self._opts.retry.max_append_attempts
                        self._reject(
                            a,
                            LogContention(
                                f"another writer kept appending to {self._prefix}; not written"
                            )
                            if a.met_writer or kept_ahead
                            else self._give_up_error(b),
                        )
                    else:
                        retry.append(a)
            keep = self._retry_kept(keep)
            # Retried appends go first so the log keeps their order.
            for a in reversed(retry):
                self._pending.appendleft(a)
                self._pending_bytes += a.nbytes
            if keep:
                last = keep[-1]
                assert last.frag is not None
                self._next_seq, self._next_offset = last.seq_no + 1, last.frag.limit
                self._tail = last.encoded
            else:
                self._next_seq = manifest.next_seq_no
                self._next_offset = manifest.next_offset
                self._tail = self._resolved(manifest.tail_setsum)
            if manifest.sealed:
                self._fail_sealed()
        finally:
            self._recovering = False
        self._kick()

    def _sort_leftovers(
        self, manifest: Manifest, leftovers: list[_Batch]
    ) -> tuple[list[_Batch], list[_Batch]]:
        """Split unlinked batches into those that still continue ``manifest`` exactly (kept, bytes
        unchanged) and those that can never be linked (free: their appends may go elsewhere)."""
        seq, off, prev = manifest.next_seq_no, manifest.next_offset, manifest.tail_setsum
        chain = not manifest.sealed
        keep: list[_Batch] = []
        free: list[_Batch] = []
        for b in leftovers:
            if (
                chain
                and b.frag is not None
                and b.seq_no == seq
                and b.start == off
                and b.prev_setsum == prev
            ):
                keep.append(b)
                seq, off, prev = seq + 1, b.frag.limit, b.frag.setsum
                continue
            chain = False
            free.append(b)
            if b.frag is not None and b.seq_no >= manifest.next_seq_no and b.upload != "absent":
                # Our own object there can never be linked (what it follows was not): overwrite
                # it in place.  If-Match on our bytes' etag: if someone replaced it, we lose.
                self._dead[b.seq_no] = content_etag(b.frag.data)
        return keep, free

    def _retry_kept(self, keep: list[_Batch]) -> list[_Batch]:
        """Put kept batches back in flight; those missing their upload or hook retry just that.

        A batch out of attempts gives up with an ambiguous error (its bytes may be in the store
        and a later read repair may still link them), and so do the kept batches after it."""
        head = True
        for i, b in enumerate(keep):
            if b.settled:
                b.error = None
                continue
            if not head:
                continue  # only the first unsettled batch is what stalls the log: charge it
            head = False
            b.attempts += 1
            if b.attempts >= self._opts.retry.max_append_attempts:
                cause = self._repair_blocked or b.error
                err = StoreUnavailable(
                    f"fragment {b.seq_no} of {self._prefix} could not be linked ({cause!r}); "
                    "it may still appear"
                )
                for gone in keep[i:]:
                    for a in gone.appends:
                        self._reject(a, err)
                keep = keep[:i]
                break
        for b in keep:
            self._inflight[b.seq_no] = b
            if not b.settled:
                b.done, b.error = False, None
                # Read repair may have found a dead object in this batch's slot: replace it.
                b.overwrite_etag = self._dead.pop(b.seq_no, b.overwrite_etag)
                delay = min(1.0, 0.02 * 2**b.attempts)
                b.task = asyncio.create_task(
                    self._retry_batch(b, delay), name=f"wal3-frag-retry:{b.seq_no}"
                )
        return keep

    async def _since(self, manifest: Manifest, base: Manifest) -> list[FragmentPointer]:
        """Fragments ``manifest`` links beyond ``base``'s tail."""
        n = manifest.next_seq_no - base.next_seq_no
        if n <= 0:
            return []
        return await tail_fragments(self._store, self._prefix, manifest.entries, n, self._snapshots)

    def _is_ours(self, p: FragmentPointer) -> bool:
        """Whether a linked pointer names the fragment this writer encoded for its slot."""
        mine = self._mine.get(p.seq_no)
        if mine is None:
            return False
        md5, setsum = mine
        return p.content_md5 == md5 if p.content_md5 is not None else p.setsum == setsum

    async def _linked_as_ours(self, manifest: Manifest, b: _Batch) -> bool | None:
        """Whether ``manifest`` linked this batch's very fragment (even folded into a snapshot, or
        collected since); None when that cannot be told any more."""
        frag = b.frag
        if frag is None or b.upload not in ("ok", "unknown") or b.seq_no >= manifest.next_seq_no:
            return False  # our bytes never reached the store, or the slot is not linked yet
        if frag.start >= manifest.oldest_offset:
            for p in reversed(manifest.fragments):
                if p.seq_no == b.seq_no:
                    return p.path == frag.path and self._is_ours(p)
            found = await resolve_fragments(
                self._store,
                self._prefix,
                manifest.snapshots,
                frag.start,
                Limits(max_files=1),
                self._snapshots,
            )
            return bool(found) and found[0].path == frag.path and self._is_ours(found[0])
        # Linked once and collected since (every slot below the tail was linked once, and its
        # object is never rewritten): the object tells whose it was, while GC keeps it.
        try:
            held = await self._store.head(join(self._prefix, frag.path))
        except ObjectNotFound:
            return None
        return etag_matches_content(held.etag, frag.data)

    async def _foreign(self, manifest: Manifest, base: Manifest) -> bool:
        """Whether someone else linked a fragment between ``base`` and ``manifest``."""
        first, end = base.next_seq_no, manifest.next_seq_no
        if end <= first:
            return False
        visible = {p.seq_no: p for p in await self._since(manifest, base)}
        for seq in range(first, end):
            p = visible.get(seq)
            if p is not None:
                if not self._is_ours(p):
                    return True
                continue
            mine = self._mine.get(seq)
            if mine is None:
                return True
            try:  # collected already: the object tells whose it was
                held = await self._store.head(join(self._prefix, fragment_path(seq)))
            except ObjectNotFound:
                return True
            if held.etag.strip('"') != mine[0]:
                return True
        return False

    def _give_up_error(self, b: _Batch) -> BaseException:
        """Why a batch that can never be linked ran out of attempts: not written, and not
        contention (that is said only when another writer appended)."""
        cause = self._repair_blocked if self._repair_blocked is not None else b.error
        return StoreUnavailable(
            f"{self._prefix}: not written after "
            f"{self._opts.retry.max_append_attempts} attempts ({cause!r})"
        )

    def _go_stale(self, err: BaseException) -> None:
        """The store failed mid-commit: we cannot tell what is linked, so nothing in flight may be
        acknowledged.  Fail it (a retry with an idempotency key is safe) and reload first next
        time."""
        _log.warning("writer for %s lost track of the manifest: %r", self._prefix, err)
        self.stats["stale"] += 1
        for b in list(self._inflight.values()):
            for a in b.appends:
                self._reject(a, StoreUnavailable(f"store unavailable: {err}"))
        self._inflight.clear()
        for e in list(self._edits):
            if not e.future.done():
                e.future.set_exception(StoreUnavailable(f"store unavailable: {err}"))
        self._edits.clear()
        self._stale = True
        self._recovering = False
        self._loop.call_later(0.1, self._wake.set)

    async def _repair(self, manifest: Manifest, etag: str) -> _Repaired:
        """Link the orphan fragments that follow the tail exactly (zero-action recovery).

        Orphans are what a writer left between its upload and its manifest write.  A live
        writer always has one there while it appends, so repair must not chase it: once another
        writer links the fragment being repaired, it is alive and links its own (stop), and no
        repair links more than ``max_rebases`` fragments (the next recovery goes on).  Either
        way the tail returned is a stored manifest, which is all recovery needs.
        """
        self._repair_blocked = None
        met_writer = linked_others = False
        for _ in range(self._opts.retry.max_rebases):
            if manifest.sealed:
                break
            seq = manifest.next_seq_no
            key = join(self._prefix, fragment_path(seq))
            try:
                got = await self._store.get(key)
            except ObjectNotFound:
                break
            try:
                decoded = await asyncio.to_thread(decode_fragment, got.data)
            except CorruptFragment:
                self._dead[seq] = got.etag
                break
            # It must follow the tail exactly.  A fragment without ``wal3.prev`` (another
            # implementation's) is placed by position alone; with one, an empty root (a new log)
            # is followed only by a fragment that follows nothing.
            fits = decoded.start == manifest.next_offset and (
                decoded.prev is None or decoded.prev == manifest.tail_setsum
            )
            if not fits:
                # It follows a fragment that was never linked: nobody can ever link it.
                self._dead[seq] = got.etag
                break
            try:
                ensure_room(seq, decoded.start, len(decoded.records))
            except LogFull:
                self._dead[seq] = got.etag  # past u64::MAX: it can never be linked either
                break
            ts = decoded.records[0].timestamp_us
            if self._hook is not None:
                try:
                    await self._hook(
                        FragmentInfo(seq, decoded.start, len(decoded.records), ts, True)
                    )
                except (ProcessDeath, asyncio.CancelledError):
                    raise
                except Exception as e:
                    _log.warning("hook failed repairing %s of %s: %r", seq, self._prefix, e)
                    self._repair_blocked = e
                    break
            pointer = FragmentPointer(
                fragment_path(seq),
                seq,
                decoded.start,
                decoded.limit,
                len(got.data),
                decoded.setsum,
                content_etag(got.data),
            )
            new = self._stamped(manifest.with_fragments([pointer], self._opts.writer_name))
            base_etag, issued = etag, self._opts.clock.monotonic()
            try:
                etag = await self._put_manifest(new, base_etag)
                self._landed(base_etag, etag, issued, manifest)
                manifest = new
                self.stats["repaired"] += 1
                linked_others = linked_others or pointer.content_md5 not in self._encoded
                _log.info("read-repaired fragment %s of %s", seq, self._prefix)
            except PreconditionFailed as e:
                loaded = await self._load()
                if loaded is None:
                    raise WriterClosed(f"manifest of {self._prefix} vanished") from None
                manifest, etag = loaded
                if manifest.next_seq_no > seq:
                    # Linked: by a live writer (its next fragments are its own to link), or by
                    # our own put whose answer was lost before someone else's edit (then we
                    # cannot say a writer was met: no contention is claimed on it).
                    met_writer = not isinstance(e, ResolvedPreconditionFailed)
                    break
        return _Repaired(manifest, etag, met_writer, linked_others)

    async def _load(self) -> tuple[Manifest, str] | None:
        """Load the stored manifest (what it shows of others waits for the fence)."""
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is not None:
            self._note_load(*loaded)
        return loaded

    # ------------------------------------------------------------------------- snapshots

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
            self.stats["snapshots_written"] += 1
            self._wake.set()
        except (StoreUnavailable, OSError) as e:
            _log.warning("snapshot upload for %s failed: %r", self._prefix, e)
        except ProcessDeath as e:
            self._fail_everything(e)
        finally:
            self._snapshot_task = None

    # ------------------------------------------------------------------------- idempotency

    def _remember_key(self, key: str, r: AppendResult, seq_no: int) -> None:
        self._keys[key] = r
        self._keys.move_to_end(key)
        self._key_seq[key] = seq_no
        while len(self._keys) > self._opts.idempotency.window_keys:
            old = self._keys.popitem(last=False)[0]
            seq = self._key_seq.pop(old, None)
            if seq is not None and self._opts.idempotency.spill_keys > 0:
                # Still within the fragment window: keep a pointer to its footer.
                self._spill[hash(old)] = seq
                while len(self._spill) > self._opts.idempotency.spill_keys:
                    del self._spill[next(iter(self._spill))]

    async def _spilled_key(self, key: str) -> AppendResult | None:
        """A key pushed out of memory but still within the fragment window: from its footer."""
        seq = self._spill.get(hash(key))
        if (
            seq is None
            or seq < self._manifest.next_seq_no - self._opts.idempotency.window_fragments
        ):
            return None
        try:
            got = await self._store.get(join(self._prefix, fragment_path(seq)))
            entry = (await asyncio.to_thread(read_footer, got.data))[1].get(key)
        except (ObjectNotFound, CorruptFragment):
            return None
        if entry is None:
            return None  # another key with the same hash
        self.stats["dedup_footer_hits"] += 1
        return AppendResult(entry[0], entry[1], 0, digest=key_digest(entry))

    def _expire_keys(self) -> None:
        """Forget keys whose fragment left the window: memory stays bounded by the window, which
        is also all a reopened writer would know (keys are kept in insertion order, ~seq order)."""
        horizon = self._manifest.next_seq_no - self._opts.idempotency.window_fragments
        while self._keys:
            key = next(iter(self._keys))
            if self._key_seq.get(key, horizon) >= horizon:
                break
            del self._keys[key]
            self._key_seq.pop(key, None)
        while self._spill:
            h = next(iter(self._spill))
            if self._spill[h] >= horizon:
                break
            del self._spill[h]

    def _drop_known_keys(self) -> None:
        """Resolve queued appends whose key turned out to be in the log already (read repair)."""
        keep: collections.deque[_Append] = collections.deque()
        for a in self._pending:
            known = self._keys.get(a.key) if a.key is not None else None
            if known is None:
                keep.append(a)
                continue
            self._pending_bytes -= a.nbytes
            self._outstanding_bytes -= a.nbytes
            self._key_waiters.pop(a.key, None)  # type: ignore[arg-type]
            a.settle(known.as_duplicate(), None)
        self._pending = keep

    async def _ensure_keys_loaded(self) -> None:
        if self._keys_loaded and not self._unlearned:
            return
        async with self._keys_lock:
            if not self._keys_loaded:
                # The window is the last ``idempotency.window_fragments`` sequence numbers, read by path:
                # wherever they sit (root or snapshots) and even when garbage collection already
                # unlinked them (it keeps their objects for the window).  Every sequence number
                # below the tail was linked once, so every such object is the log's own.
                nxt = self._manifest.next_seq_no
                self._unlearned.update(
                    range(max(1, nxt - self._opts.idempotency.window_fragments), nxt)
                )
            while self._unlearned:
                await self._learn_keys()
            self._keys_loaded = True

    async def _learn_keys(self) -> None:
        """Read the footers of ``_unlearned`` fragments into the idempotency window (the log is
        the source of truth), and settle queued appends whose key is already in the log."""
        seqs = sorted(self._unlearned)
        sem = asyncio.Semaphore(16)

        async def footer(seq: int) -> dict[str, KeyEntry]:
            async with sem:
                try:
                    got = await self._store.get(join(self._prefix, fragment_path(seq)))
                except ObjectNotFound:
                    return {}  # collected long ago: outside the window
            return read_footer(got.data)[1]

        found = await asyncio.gather(*(footer(seq) for seq in seqs))
        for seq, keys in zip(seqs, found, strict=True):
            for k, entry in keys.items():
                if k not in self._keys:
                    self._remember_key(
                        k, AppendResult(entry[0], entry[1], 0, digest=key_digest(entry)), seq
                    )
        self._unlearned.difference_update(seqs)
        self._drop_known_keys()
