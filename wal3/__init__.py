"""wal3: a linearizable log built only on object storage and conditional writes.

Public surface: stores (``LocalStore``, ``S3Store``, ``FaultyStore``, ``open_store``), the
``Setsum`` checksum, ``LogWriter``/``LogReader`` and the typed errors.  S3 support is imported
lazily so that using the local store does not pay for loading the AWS SDK.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import (
    Backpressure,
    CorruptFragment,
    CorruptManifest,
    CursorConflict,
    CursorNotFound,
    GarbageRejected,
    InvalidCursorName,
    LogContention,
    LogExists,
    LogNotFound,
    LogPurged,
    LogSealed,
    NoCursors,
    ObjectNotFound,
    PreconditionFailed,
    ScrubFailed,
    SimulatedCrash,
    StoreError,
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from .fragment import LogRecord
from .localstore import LocalStore
from .manifest import FragmentPointer, Manifest, Snapshot, SnapshotPointer
from .options import (
    BatchOptions,
    IdempotencyOptions,
    LeaseOptions,
    LogWriterOptions,
    RetryOptions,
    SnapshotOptions,
)
from .reader import Limits, LogReader
from .setsum import Setsum
from .store import GetResult, ObjectMeta, ObjectStore
from .writer import AppendResult, FragmentInfo, LogPosition, LogWriter

if TYPE_CHECKING:
    from .faulty import FaultRule, FaultyStore
    from .s3store import S3Store
    from .storeurl import open_store

_LAZY = {
    "S3Store": ("s3store", "S3Store"),
    "FaultyStore": ("faulty", "FaultyStore"),
    "FaultRule": ("faulty", "FaultRule"),
    "open_store": ("storeurl", "open_store"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "AppendResult",
    "Backpressure",
    "BatchOptions",
    "CorruptFragment",
    "CorruptManifest",
    "CursorConflict",
    "CursorNotFound",
    "FaultRule",
    "FaultyStore",
    "FragmentInfo",
    "FragmentPointer",
    "GarbageRejected",
    "GetResult",
    "IdempotencyOptions",
    "InvalidCursorName",
    "LeaseOptions",
    "Limits",
    "LocalStore",
    "LogContention",
    "LogExists",
    "LogNotFound",
    "LogPosition",
    "LogPurged",
    "LogReader",
    "LogRecord",
    "LogSealed",
    "LogWriter",
    "LogWriterOptions",
    "Manifest",
    "NoCursors",
    "ObjectMeta",
    "ObjectNotFound",
    "ObjectStore",
    "PreconditionFailed",
    "RetryOptions",
    "S3Store",
    "ScrubFailed",
    "Setsum",
    "SimulatedCrash",
    "Snapshot",
    "SnapshotOptions",
    "SnapshotPointer",
    "StoreError",
    "StoreUnavailable",
    "Wal3Error",
    "WriterClosed",
    "open_store",
]
