"""Typed errors of the wal3 engine.

Every failure a caller can act on has its own class; the server maps them to HTTP codes in one
place (``host/errors.py``).  Nothing here depends on the server.
"""

from __future__ import annotations


class Wal3Error(Exception):
    """Base class of every error raised by the wal3 engine."""


# ----------------------------------------------------------------------------------- object store


class StoreError(Wal3Error):
    """An object-store operation failed."""


class PreconditionFailed(StoreError):
    """A conditional put's condition did not hold (412, 409 ConditionalRequestConflict, or 404 on
    If-Match of a missing key)."""

    def __init__(self, key: str, detail: str = "") -> None:
        super().__init__(f"precondition failed for {key}" + (f": {detail}" if detail else ""))
        self.key = key


class ObjectNotFound(StoreError):
    """The key does not exist."""

    def __init__(self, key: str) -> None:
        super().__init__(f"no such object: {key}")
        self.key = key


class StoreUnavailable(StoreError):
    """A transient failure (5xx, throttling, timeout, connection) that outlived the retries.

    For a put this is ambiguous: the object may or may not have been written.
    """


class SimulatedCrash(Wal3Error):
    """Raised by ``FaultyStore`` to model the process dying at this point.

    A component that sees it must stop using its in-memory state; tests then reopen the log.
    """


# ------------------------------------------------------------------------------------------- log


class CorruptManifest(Wal3Error):
    """A manifest or snapshot violates an invariant or cannot be decoded."""


class CorruptFragment(Wal3Error):
    """A fragment cannot be decoded or does not match the setsum its manifest records."""


class LogNotFound(Wal3Error):
    """The log has no manifest."""


class LogExists(Wal3Error):
    """A log already exists where a new one was to be created (e.g. a fork target)."""


class LogContention(Wal3Error):
    """Another writer appended to the log; the batch was not written and may be retried."""


class Backpressure(Wal3Error):
    """The writer is holding as much unacknowledged data as it is allowed to; retry later."""

    def __init__(self, message: str, reason: str = "batching", retry_after_s: float = 0.1) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


class LogSealed(Wal3Error):
    """The log is sealed and refuses appends."""


class LogFull(LogSealed):
    """The log has used up its offsets or fragment sequence numbers (u64, as in Rust's wal3):
    like a sealed log it takes no more appends.  Raised before a manifest holding a value no
    reader can decode would be written."""


class LogPurged(Wal3Error):
    """The requested offset has been garbage collected."""

    def __init__(self, offset: int, oldest_offset: int) -> None:
        super().__init__(f"offset {offset} is below the oldest retained offset {oldest_offset}")
        self.offset = offset
        self.oldest_offset = oldest_offset


class WriterClosed(Wal3Error):
    """The writer was closed (or crashed) and accepts no more work."""


# ---------------------------------------------------------------------------------------- cursors


class InvalidCursorName(Wal3Error):
    """A cursor name does not match ``[A-Za-z0-9_]+``."""


class CursorNotFound(Wal3Error):
    """The cursor does not exist."""


class CursorConflict(Wal3Error):
    """A cursor compare-and-swap lost: the witness is stale."""


# --------------------------------------------------------------------------------------------- gc


class NoCursors(Wal3Error):
    """Garbage collection needs at least one cursor to compute a cutoff."""


class GarbageRejected(Wal3Error):
    """The garbage verifier refused a garbage file."""


class ScrubFailed(Wal3Error):
    """Scrub found problems; ``problems`` lists each precisely."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
