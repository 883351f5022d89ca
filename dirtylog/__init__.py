"""The per-server dirty log: which collection logs have uncompacted records, in O(logs written).

Every fragment written to a collection log appends one 48-byte ``mark_dirty`` record
(:class:`DirtyLogHook`) to the server's own dirty log; :class:`RollUp` periodically coalesces that
log into an in-memory dirty set that compactors pull (:meth:`RollUp.select`): each pass folds what
was appended since the last one and relogs a bounded window at the log's head, so its cost follows
new marks, not the size of the set.  Everything here is
written against the abstract :class:`DirtyLogBackend` / :class:`CompactionOffsets` protocols.
"""

from .backend import CompactionOffsets, DirtyLogBackend, LogTails
from .dirtyset import DirtySet
from .errors import DirtyLogError, RollUpError
from .hook import DirtyLogHook, epoch_us
from .memory import MemoryCompactionOffsets, MemoryLogBackend, MemoryLogTails
from .record import RECORD_SIZE, DirtyRecord, DirtyRecordError, RecordKind
from .rollup import (
    CURSOR_NAME,
    DEFAULT_COMPACTION_LOOKUPS,
    DEFAULT_ROLLUP_INTERVAL_S,
    DEFAULT_TAIL_LOOKUPS,
    DEFAULT_WINDOW_RECORDS,
    Coalesced,
    HandOverResult,
    InspectedRecord,
    RollUp,
    RollUpResult,
    coalesce,
    hand_over,
    inspect_records,
)
from .selection import DirtyEntry, missing_from_dirty_set, score, select_entries

__all__ = [
    "CURSOR_NAME",
    "DEFAULT_COMPACTION_LOOKUPS",
    "DEFAULT_ROLLUP_INTERVAL_S",
    "DEFAULT_TAIL_LOOKUPS",
    "DEFAULT_WINDOW_RECORDS",
    "RECORD_SIZE",
    "Coalesced",
    "CompactionOffsets",
    "DirtyEntry",
    "DirtyLogBackend",
    "DirtyLogError",
    "DirtyLogHook",
    "DirtyRecord",
    "DirtyRecordError",
    "DirtySet",
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
