"""Typed errors of the wal3 engine.

Every failure a caller can act on has its own class, and every class declares its ``kind``: one
member of the closed set :class:`ErrorKind`, which says what a caller can do about it (retry,
give up, escalate).  The server maps kinds, not classes, to HTTP answers in one table
(``host/errors.py``).  Nothing here depends on the server.

A class defined anywhere that derives from :class:`Wal3Error` must set ``kind`` to an
:class:`ErrorKind` member or inherit one; anything else is refused when the class is created, so
the set stays closed.
"""

from __future__ import annotations

import enum
from typing import ClassVar


# Not StrEnum (UP042): that would change what str() and f-strings of a kind give (ErrorKind.NAME).
class ErrorKind(str, enum.Enum):  # noqa: UP042
    """What an engine error means to its caller: the closed set every error class picks from.

    Kinds are as fine as the answers callers tell apart, so each one has exactly one HTTP answer
    in the server's table; two kinds may share an answer (``full`` is answered like ``sealed``).
    """

    CONTENTION = "contention"  # another writer or process changed the log first; retry
    SEALED = "sealed"  # the log is sealed and takes no more appends
    FULL = "full"  # the log has used up its offsets or sequence numbers (like sealed)
    EXISTS = "exists"  # the log to create is already there
    NOT_FOUND = "not_found"  # the log or cursor does not exist
    PURGED = "purged"  # the offset was garbage collected
    CURSOR_CONFLICT = "cursor_conflict"  # a cursor compare-and-swap presented a stale witness
    NO_CURSORS = "no_cursors"  # garbage collection has no cursor to compute a cutoff from
    GC_REJECTED = "gc_rejected"  # the garbage verifier refused a plan
    BACKPRESSURE = "backpressure"  # too much unacknowledged data; retry later
    INVALID = "invalid"  # the caller's input is not valid (e.g. a cursor name)
    UNAVAILABLE = "unavailable"  # the store failed transiently past the retries; retry later
    CLOSED = "closed"  # the writer was closed and takes no more work; reopen
    DATA_LOSS = "data_loss"  # data at rest is corrupt or missing; no retry helps: escalate
    CORRUPT_FRAGMENT = "corrupt_fragment"  # data loss in one fragment (its checksum failed)
    OBJECT_NOT_FOUND = (
        "object_not_found"  # a store key does not exist (callers expecting it handle it)
    )
    PROCESS_DEATH = "process_death"  # the process is to be taken as dead here (fault injection)
    INTERNAL = (
        "internal"  # a bug or a failure no caller action fixes (e.g. a store refusing access)
    )

    @property
    def is_data_loss(self) -> bool:
        """Whether the error means data at rest is corrupt or gone (an escalation, not a retry)."""
        return self in (ErrorKind.DATA_LOSS, ErrorKind.CORRUPT_FRAGMENT)


class Wal3Error(Exception):
    """Base class of every error raised by the wal3 engine; ``kind`` says what it means."""

    kind: ClassVar[ErrorKind] = ErrorKind.INTERNAL

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(cls.__dict__.get("kind", ErrorKind.INTERNAL), ErrorKind):
            raise TypeError(
                f"{cls.__qualname__}.kind must be an ErrorKind member, not {cls.__dict__['kind']!r}"
            )


class ProcessDeath(Wal3Error):
    """The process is to be taken as dead at this point: a fault device raises a subclass.

    The engine never retries or swallows one: a component that sees it stops using its in-memory
    state and lets it propagate (tests then reopen the log).  It names no device, so production
    code handles the marker without knowing who raises it.
    """

    kind = ErrorKind.PROCESS_DEATH


# ----------------------------------------------------------------------------------- object store


class StoreError(Wal3Error):
    """An object-store operation failed (not transiently: e.g. access denied)."""

    kind = ErrorKind.INTERNAL


class PreconditionFailed(StoreError):
    """A conditional put's condition did not hold (412, 409 ConditionalRequestConflict, or 404 on
    If-Match of a missing key)."""

    kind = ErrorKind.CONTENTION

    def __init__(self, key: str, detail: str = "") -> None:
        super().__init__(f"precondition failed for {key}" + (f": {detail}" if detail else ""))
        self.key = key


class ObjectNotFound(StoreError):
    """The key does not exist."""

    kind = ErrorKind.OBJECT_NOT_FOUND

    def __init__(self, key: str) -> None:
        super().__init__(f"no such object: {key}")
        self.key = key


class StoreUnavailable(StoreError):
    """A transient failure (5xx, throttling, timeout, connection) that outlived the retries.

    For a put this is ambiguous: the object may or may not have been written.
    """

    kind = ErrorKind.UNAVAILABLE


class SimulatedCrash(ProcessDeath):
    """Raised by ``FaultyStore`` (and other test devices) to model the process dying here.

    A component that sees it must stop using its in-memory state; tests then reopen the log.
    The engine knows it only as a :class:`ProcessDeath`.
    """

    kind = ErrorKind.PROCESS_DEATH


# ------------------------------------------------------------------------------------------- log


class CorruptManifest(Wal3Error):
    """A manifest or snapshot violates an invariant or cannot be decoded."""

    kind = ErrorKind.DATA_LOSS


class CorruptFragment(Wal3Error):
    """A fragment cannot be decoded or does not match the setsum its manifest records."""

    kind = ErrorKind.CORRUPT_FRAGMENT


class LogNotFound(Wal3Error):
    """The log has no manifest."""

    kind = ErrorKind.NOT_FOUND


class LogExists(Wal3Error):
    """A log already exists where a new one was to be created (e.g. a fork target)."""

    kind = ErrorKind.EXISTS


class LogContention(Wal3Error):
    """Another writer appended to the log; the batch was not written and may be retried."""

    kind = ErrorKind.CONTENTION


class Backpressure(Wal3Error):
    """The writer is holding as much unacknowledged data as it is allowed to; retry later."""

    kind = ErrorKind.BACKPRESSURE

    def __init__(self, message: str, reason: str = "batching", retry_after_s: float = 0.1) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class LogSealed(Wal3Error):
    """The log is sealed and refuses appends."""

    kind = ErrorKind.SEALED


class LogFull(LogSealed):
    """The log has used up its offsets or fragment sequence numbers (u64, as in Rust's wal3):
    like a sealed log it takes no more appends.  Raised before a manifest holding a value no
    reader can decode would be written."""

    kind = ErrorKind.FULL


class LogPurged(Wal3Error):
    """The requested offset has been garbage collected."""

    kind = ErrorKind.PURGED

    def __init__(self, offset: int, oldest_offset: int) -> None:
        super().__init__(f"offset {offset} is below the oldest retained offset {oldest_offset}")
        self.offset = offset
        self.oldest_offset = oldest_offset


class WriterClosed(Wal3Error):
    """The writer was closed (or crashed) and accepts no more work."""

    kind = ErrorKind.CLOSED


# ---------------------------------------------------------------------------------------- cursors


class InvalidCursorName(Wal3Error):
    """A cursor name does not match ``[A-Za-z0-9_]+``."""

    kind = ErrorKind.INVALID


class CursorNotFound(Wal3Error):
    """The cursor does not exist."""

    kind = ErrorKind.NOT_FOUND


class CursorConflict(Wal3Error):
    """A cursor compare-and-swap lost: the witness is stale."""

    kind = ErrorKind.CURSOR_CONFLICT


# --------------------------------------------------------------------------------------------- gc


class NoCursors(Wal3Error):
    """Garbage collection needs at least one cursor to compute a cutoff."""

    kind = ErrorKind.NO_CURSORS


class GarbageRejected(Wal3Error):
    """The garbage verifier refused a garbage file."""

    kind = ErrorKind.GC_REJECTED


class ScrubFailed(Wal3Error):
    """Scrub found problems; ``problems`` lists each precisely."""

    kind = ErrorKind.DATA_LOSS

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
