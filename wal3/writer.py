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

``LogWriter`` is the facade; each job is a module that owns its own state:

* ``batcher``: the queue of appends, back-pressure, cutting batches, where the next batch goes,
  encoding and uploading fragments with the hook (steps 1-3);
* ``committer``: manifest writes in order, rebases, edits, snapshots, the writer's life (step 4);
* ``recovery``: fencing and recovery after a failed manifest write, read repair (its docstring);
* ``idempotency``: the dedup window of idempotency keys;
* ``lease``: the writer's loads and puts of its manifest, read leases and the take-over fence;
* ``appends``: what they hand each other (appends, batches, results); ``options``: the tuning.

Read leases (``lease.read_lease_s`` > 0) decide when a reader may answer from this writer's
in-memory manifest instead of loading the stored one; the rule and the reasoning, case by case,
are ``lease.py``'s module docstring.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import replace

from .appends import AppendResult, FragmentHook, FragmentInfo, LogPosition, ManifestEdit
from .batcher import Batcher
from .committer import Committer
from .errors import LogContention, PreconditionFailed
from .idempotency import KeyWindow
from .layout import load_manifest
from .lease import Lease, bare_etag, lease_ms, new_holder
from .manifest import Manifest
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
from .paths import MANIFEST_PATH, join
from .recovery import Recovery
from .store import ObjectStore, put_resolving

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


def _as_body(b: bytes) -> bytes:
    """A record body as bytes the caller can no longer change.  Anything that is not bytes-like
    is refused: ``bytes(b)`` would turn ``5`` into five zero bytes and ``[104, 105]`` into
    ``b"hi"``, a caller's wrong type written as a record."""
    if type(b) is bytes:
        return b
    return memoryview(b).tobytes()  # TypeError unless ``b`` is a buffer (bytearray, memoryview)


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
        holder: str | None = None,
    ) -> None:
        self._store = store
        self._prefix = prefix.strip("/")
        self._opts = options
        self.stats: collections.Counter[str] = collections.Counter()
        # The parts, each owning the state of its job; they reach each other only through
        # their methods.
        self._lease = Lease(
            store,
            self._prefix,
            options,
            held=lambda: (self._committer.manifest, self._committer.etag),
            healthy=self._healthy,
            holder=holder,
        )
        self._keys = KeyWindow(
            store,
            self._prefix,
            options.idempotency,
            self.stats,
            next_seq_no=lambda: self._committer.manifest.next_seq_no,
            on_learned=lambda: self._batcher.drop_known_keys(),
        )
        self._batcher = Batcher(
            store, self._prefix, options, hook, self.stats, self._keys, manifest
        )
        self._committer = Committer(
            store,
            self._prefix,
            options,
            self.stats,
            manifest,
            etag,
            self._lease,
            self._batcher,
            self._keys,
        )
        self._recovery = Recovery(
            store,
            self._prefix,
            options,
            hook,
            self.stats,
            self._lease,
            self._batcher,
            self._keys,
            self._committer,
        )
        self._batcher.attach(self._committer, self._recovery)
        self._committer.start(self._recovery, name=f"wal3-commit:{prefix}")

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
        # The create records this writer's holder token too, like every put of a writer: two
        # writers of one name (the default host:pid of two containers) would otherwise build
        # byte-identical manifests, and a create answered with an error, read back by
        # put_resolving, would take the other's for its own: both leasing it, neither fencing
        # (the adversarial review of a8ff7b1).
        holder = new_holder()
        for _ in range(opts.retry.max_rebases):
            issued = opts.clock.monotonic()
            loaded = await load_manifest(store, prefix)
            if loaded is not None:
                break
            empty = replace(
                Manifest.empty(opts.writer_name),
                read_lease_ms=lease_ms(opts.lease.read_lease_s),
                lease_holder=holder,
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
        w = cls(store, prefix, opts, manifest, etag, hook, holder)
        if created:
            w._lease.landed(None, etag, issued, None)  # nobody could lease what did not exist
        elif authored is not None and authored[0] and bare_etag(authored[0]) == bare_etag(etag):
            w._lease.adopt(etag, issued)
        elif opts.lease.name_is_unique and manifest.writer == opts.writer_name:
            # Written by this process (e.g. created before this writer opened): ours.
            w._lease.adopt(etag, issued)
        else:
            w._lease.note_load(manifest, etag)
        if authored is not None:
            # The fence the log's previous writer in this process raised (a take-over it made,
            # a manifest it loaded) is this writer's too, whatever it finds: it may be about to
            # answer from that take-over's manifest.
            w._lease.inherit_fence(authored[1])
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
        return self._committer.manifest

    @property
    def options(self) -> LogWriterOptions:
        """The options the writer was opened with."""
        return self._opts

    @property
    def outstanding_bytes(self) -> int:
        """Bytes accepted but not yet acknowledged."""
        return self._batcher.outstanding_bytes

    @property
    def authored(self) -> bool:
        """Whether the manifest in memory is one this writer wrote (a lease can vouch for it)."""
        return self._lease.authored(self._committer.etag)

    @property
    def authored_etag(self) -> tuple[str, float] | None:
        """The manifest's etag and the fence, when this writer wrote the manifest it holds (for
        ``open(authored=...)`` of the next writer in this process)."""
        return (self._committer.etag, self._lease.fence_until) if self.authored else None

    @property
    def fence_until(self) -> float:
        """Monotonic time before which this writer acknowledges nothing (a take-over)."""
        return self._lease.fence_until

    def current_manifest(self) -> Manifest | None:
        """The manifest in memory if a read lease vouches that it is the stored one, else None
        (load it from the store).  See ``lease.py``'s module docstring."""
        m = (
            self._committer.manifest
        )  # read before the clock: a pause in between only shortens the lease
        if self.lease_remaining() <= 0:
            return None
        return m

    async def leased_manifest(self) -> Manifest | None:
        """``current_manifest()`` once the manifest put in flight when called (if any) has been
        answered: what a reader asks for.  While one is in flight the memory may be older than
        the store, which a reader of the store may already have seen; its answer is one round
        trip away, cheaper than loading the manifest."""
        await self._lease.settled()
        return self.current_manifest()

    def lease_remaining(self) -> float:
        """Seconds the read lease has left (0 when there is none)."""
        return self._lease.remaining()

    async def confirm_lease(self) -> bool:
        """Renew the read lease with a HEAD of the manifest: True if it is still the one this
        writer wrote.  False when the store moved on (another writer wrote it) or cannot tell;
        the writer then stops vouching until it writes again."""
        return await self._lease.confirm()

    @property
    def fencing(self) -> bool:
        """Whether a take-over fence is still running (``wait_fence`` would wait)."""
        return self._lease.fence_until > self._opts.clock.monotonic()

    async def wait_fence(self) -> None:
        """Return once the fence (a take-over) has passed: an acknowledgement of anything this
        writer knows may be given then (see ``lease.py``'s module docstring)."""
        await self._lease.wait_fence()

    def _healthy(self) -> bool:
        """Whether the writer may vouch for its manifest: not failed, not recovering, not lost
        track of the store."""
        return (
            self._committer.failure is None
            and not self._recovery.recovering
            and not self._recovery.stale
        )

    @property
    def failed(self) -> BaseException | None:
        """Why the writer stopped working (a crash, a bug), or None while it is healthy."""
        return self._committer.failure

    @property
    def closed(self) -> bool:
        """Whether the writer stopped accepting appends."""
        return self._committer.closed

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
        copied = [_as_body(b) for b in bodies]  # before any wait: a refused call queues nothing
        committer, keys = self._committer, self._keys
        committer.check_open()
        if idempotency_key is not None:
            await keys.ensure_loaded()
            committer.check_open()
            known = keys.known(idempotency_key)
            if known is None:
                known = await keys.spilled(idempotency_key)
                committer.check_open()
            if known is not None:
                return known.as_duplicate()
            waiter = keys.waiter(idempotency_key)
            if waiter is not None:
                return (await asyncio.shield(waiter)).as_duplicate()
        item = self._batcher.submit(copied, idempotency_key)
        return await item.future

    async def claim(self, *, confirm: bool = False) -> None:
        """Take the log over now if the next write would: a write that links nothing, so the
        take-over fence starts (``lease.py``, "Claim").  A caller may then wait the fence out
        (``wait_fence``) before it appends, holding nothing meanwhile; the append that follows
        links at once.  Nothing is written when the stored manifest is this writer's own, when
        no lease may vouch for it, or when the log is sealed (nothing will be linked).

        With ``confirm`` a write is made in those cases too: the stored manifest written back,
        which lands or fails its If-Match and makes the writer reload, so that the writer's
        memory is the stored manifest and its own (a host that becomes a log's leader does so)."""
        m = self._committer.manifest
        if confirm or (not m.sealed and self._lease.takes_over(m, self._committer.etag)):
            await self._committer.claim()

    async def edit_manifest(self, fn: ManifestEdit) -> Manifest:
        """Apply a pure manifest transform through the normal, fenced manifest write.

        ``fn`` may be re-applied to a newer manifest when the write has to be rebased; it raises
        to reject.  Used for sealing and for garbage collection, which a sealed log still takes.
        An edit of a manifest another writer holds is written as a collector's (its holder and
        lease stay, this writer gains no lease): it is no take-over, so the holder goes on
        without a fence, and appends of this writer still claim the log first.
        """
        return await self._committer.edit(fn)

    async def seal(self) -> Manifest:
        """Seal the log: after this every append fails with LogSealed."""
        return await self.edit_manifest(lambda m: m.with_sealed(self._opts.writer_name))

    async def compact_manifest(self) -> int:
        """Write and link every snapshot the thresholds call for now; returns how many.

        Normally snapshots trail the appends in the background; this settles them (before a
        fork, in tests, or for an operator).
        """
        return await self._committer.compact()

    async def wait_for_commit(self, after_offset: int, timeout_s: float) -> bool:
        """Wait until the record at ``after_offset`` exists, i.e. the next offset passes it (long
        polls); False on timeout or close."""
        return await self._committer.wait_for_commit(after_offset, timeout_s)

    async def close(self) -> None:
        """Flush everything accepted, then stop.  Idempotent."""
        await self._committer.close()
        self._batcher.cancel_timer()
