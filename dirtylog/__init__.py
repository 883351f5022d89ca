"""The per-server dirty log: which collection logs have uncompacted records, in O(logs written).

Every fragment written to a collection log appends one 48-byte ``mark_dirty`` record
(:class:`DirtyLogHook`) to the server's own dirty log; :class:`RollUp` periodically coalesces that
log into an in-memory dirty set that compactors pull (:meth:`RollUp.select`).  Everything here is
written against the abstract :class:`DirtyLogBackend` / :class:`CompactionOffsets` protocols.
"""

from .backend import CompactionOffsets, DirtyLogBackend, LogTails
from .errors import DirtyLogError
from .hook import DirtyLogHook, epoch_us
from .memory import MemoryCompactionOffsets, MemoryLogBackend, MemoryLogTails
from .record import RECORD_SIZE, DirtyRecord, DirtyRecordError, RecordKind
from .rollup import (
    CURSOR_NAME,
    DEFAULT_ROLLUP_INTERVAL_S,
    Coalesced,
    HandOverResult,
    InspectedRecord,
    RollUp,
    RollUpError,
    RollUpResult,
    coalesce,
    hand_over,
    inspect_records,
)
from .selection import DirtyEntry, missing_from_dirty_set, score, select_entries

__all__ = [
    "CURSOR_NAME",
    "DEFAULT_ROLLUP_INTERVAL_S",
    "RECORD_SIZE",
    "Coalesced",
    "CompactionOffsets",
    "DirtyEntry",
    "DirtyLogBackend",
    "DirtyLogError",
    "DirtyLogHook",
    "DirtyRecord",
    "DirtyRecordError",
    "HandOverResult",
    "InspectedRecord",
    "LogTails",
    "MemoryCompactionOffsets",
    "MemoryLogBackend",
    "MemoryLogTails",
    "RecordKind",
    "RollUp",
    "RollUpError",
    "RollUpResult",
    "coalesce",
    "epoch_us",
    "hand_over",
    "inspect_records",
    "missing_from_dirty_set",
    "score",
    "select_entries",
]
