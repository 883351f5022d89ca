"""What the writer's parts hand each other: an append and its answer, a batch (one fragment) and
what the fragment hook learns.

No state lives here beyond each object's own: the batcher creates appends and batches, the
committer links them, recovery decides the fate of those that were not linked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from .fragment import EncodedFragment, request_digest
from .manifest import FragmentPointer, Manifest
from .setsum import Setsum


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


class Append:
    """One ``append_many`` call: its bodies, its key, and the futures that answer it."""

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
        # one met a writer linking what our repair was linking (see ``Recovery.recover``).
        self.others_rounds = 0
        self.met_writer = False

    def answer(self, result: AppendResult) -> None:
        """Answer the caller (unless it gave up) and any duplicate waiting on the same key."""
        for f in (self.future, self.shared):
            if f is not None and not f.done():
                f.set_result(result)

    def fail(self, err: BaseException) -> None:
        """Fail the caller (unless it gave up) and any duplicate waiting on the same key."""
        for f in (self.future, self.shared):
            if f is not None and not f.done():
                f.set_exception(err)
                f.exception()  # nobody may be left to retrieve it; do not warn


class Batch:
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
        appends: list[Append],
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
        """The manifest's pointer to this batch's fragment (once encoded)."""
        f = self.frag
        assert f is not None
        return FragmentPointer(f.path, f.seq_no, f.start, f.limit, f.num_bytes, f.setsum, self.md5)
