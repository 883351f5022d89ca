"""The ``loghost`` command's exit codes, and how a failure becomes one line and one of them.

Every failure an operator can cause or meet (a typo in a store URL, a missing log, an
unreachable store, a busy port, a second host with the same server id) ends the command with one
line on stderr, ``loghost: error: ...``, and the exit code of its kind below; never a traceback.
An exception of no known kind is a bug: one line as well, exit code 70, and the traceback only
with ``--traceback``.  docs/OPERATIONS.md ("CLI exit codes") lists the codes; the compactor uses
the same numbers for the kinds it shares (``compactor_client.cli``).
"""

from __future__ import annotations

import enum
from pathlib import Path

from wal3 import LogNotFound, ObjectNotFound, StoreError, StoreUnavailable
from wal3.errors import NoCursors
from wal3.storeurl import StoreURL, store_url_parts

from .membership import DuplicateServerId

# What LocalStore creates in every directory it opens (wal3.localstore._HIDDEN).
_LOCAL_STORE_DIR = ".wal3-local"


class ExitCode(enum.IntEnum):
    """What a ``loghost`` (or ``compactor``) exit status means."""

    OK = 0
    PROBLEMS = 1  # the command ran and found problems (scrub: damage, or no log at all)
    USAGE = 2  # a bad flag, or an invalid configuration
    STORE_URL = 3  # the store URL is malformed or its scheme unsupported
    NOT_FOUND = 4  # no store at that path or bucket, or no log at that prefix
    NO_CURSORS = 5  # gc: the log has no cursor, so nothing can be collected
    STORE_UNAVAILABLE = 6  # the store is unreachable, or refuses the credentials
    ADDRESS_IN_USE = 7  # the listen address is taken (or cannot be bound)
    DUPLICATE_SERVER_ID = 8  # a live host already runs with this server id on this store
    KEY_REJECTED = 9  # compactor: a host refused the API key (401/403)
    INTERNAL = 70  # a bug: an exception of no known kind


class CliError(Exception):
    """A failure the command reports as one line and exits with ``code``."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def check_store_url(url: str) -> StoreURL:
    """The parsed store URL; CliError(STORE_URL) when it is malformed or unsupported."""
    try:
        return store_url_parts(url)
    except ValueError as e:
        raise CliError(ExitCode.STORE_URL, str(e)) from None


def check_existing_store(url: str) -> StoreURL:
    """Like ``check_store_url``, and for a directory store also that it exists and is a store.

    Opening a directory store creates the directory: a command that only reads (or that acts on
    what is there, like ``gc``) checks first, so a mistyped path is an error, not a new store.
    """
    parts = check_store_url(url)
    if parts.scheme == "file":
        root = Path(parts.location)
        if not root.is_dir():
            raise CliError(ExitCode.NOT_FOUND, f"no store at {url!r}: no such directory")
        if not (root / _LOCAL_STORE_DIR).is_dir():
            raise CliError(
                ExitCode.NOT_FOUND,
                f"no store at {url!r}: the directory was never opened as a store",
            )
    return parts


def classify(e: BaseException, store_url: str | None = None) -> CliError | None:
    """The exit code and line of a known failure; None for anything else (a bug)."""
    where = f" {store_url!r}" if store_url else ""
    if isinstance(e, CliError):
        return e
    if isinstance(e, DuplicateServerId):
        return CliError(ExitCode.DUPLICATE_SERVER_ID, str(e))
    if isinstance(e, NoCursors):
        return CliError(ExitCode.NO_CURSORS, f"{e} (set a cursor first, e.g. the compaction one)")
    if isinstance(e, LogNotFound | ObjectNotFound):
        return CliError(ExitCode.NOT_FOUND, str(e))
    if isinstance(e, StoreUnavailable):
        return CliError(ExitCode.STORE_UNAVAILABLE, f"store{where} unreachable: {_first_line(e)}")
    if isinstance(e, StoreError):
        text = str(e)
        if "NoSuchBucket" in text:
            return CliError(ExitCode.NOT_FOUND, f"no store at{where}: the bucket does not exist")
        return CliError(ExitCode.STORE_UNAVAILABLE, f"store{where} refused: {_first_line(e)}")
    try:
        from botocore.exceptions import BotoCoreError
    except ImportError:  # pragma: no cover - botocore comes with the S3 store
        return None
    if isinstance(e, BotoCoreError):
        return CliError(
            ExitCode.STORE_UNAVAILABLE, f"store{where} not accessible: {_first_line(e)}"
        )
    return None


def _first_line(e: BaseException) -> str:
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0]
