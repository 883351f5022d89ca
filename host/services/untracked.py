"""The dirty set's invariant, checked after every roll-up: every open log with uncompacted
records written before the roll-up began is in the dirty set (``loghost_dirty_untracked_collections``
must stay 0).  Open logs are what this server can check cheaply."""

from __future__ import annotations

from uuid import UUID

from dirtylog import missing_from_dirty_set

from ..manager import LogManager
from ..metrics import Metrics
from .dirtyset import HostDirtyLog


class UntrackedCheck:
    """Samples open logs' tails before a roll-up and counts, after it, those it left out."""

    def __init__(self, manager: LogManager, dirty: HostDirtyLog, metrics: Metrics) -> None:
        self._manager = manager
        self._dirty = dirty
        self._metrics = metrics

    def tails(self) -> dict[UUID, int]:
        """Each open log's next offset: sampled before a roll-up begins."""
        return {h.collection_id: h.writer.manifest.next_offset for h in self._manager.handles()}

    def collections(self, known_before: dict[UUID, int]) -> set[UUID]:
        """Open logs written before a roll-up (``tails()`` then) whose uncompacted records the
        dirty set does not list; purged logs not written since are left out."""
        offsets = {h.collection_id: h.compaction_offset for h in self._manager.handles()}
        purged = self._dirty.purged
        known = {
            cid: (nxt, offsets.get(cid, 1))
            for cid, nxt in known_before.items()
            if cid not in purged
        }
        return missing_from_dirty_set(known, self._dirty.entries())

    def record(self, known_before: dict[UUID, int]) -> None:
        """Export the check's count after a roll-up."""
        self._metrics.untracked.set(len(self.collections(known_before)))
