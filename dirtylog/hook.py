"""The writer hook: one mark_dirty record per collection-log fragment."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from uuid import UUID

from .backend import DirtyLogBackend
from .record import DirtyRecord

Clock = Callable[[], int]


def epoch_us() -> int:
    """Wall-clock time in microseconds since the epoch."""
    return time.time_ns() // 1000


class DirtyLogHook:
    """Appends dirty-log records on behalf of collection-log writers.

    The server calls :meth:`mark_dirty` once per fragment, concurrently with the fragment upload,
    and fails the collection write if it raises.  Batching many concurrent marks into one dirty-log
    fragment is the backend's job (it is a wal3 log), so the hook just appends.
    """

    def __init__(self, backend: DirtyLogBackend, clock: Clock = epoch_us) -> None:
        """Wrap ``backend``; ``clock`` returns epoch microseconds."""
        self._backend = backend
        self._clock = clock

    async def mark_dirty(self, collection_id: UUID, first_offset: int, num_records: int) -> int:
        """Durably record that ``[first_offset, first_offset + num_records)`` was written.

        Returns the record's dirty-log offset.  Any error propagates: the caller must fail its
        collection write, or a fragment could exist that no compactor ever hears about.
        """
        body = DirtyRecord.mark(collection_id, first_offset, num_records, self._clock()).encode()
        return await self._backend.append_many([body])

    async def purge(self, collection_ids: Iterable[UUID]) -> int | None:
        """Append one purge record per distinct id; return the first offset (None if no ids).

        Prefer :meth:`RollUp.purge`, which also serialises with roll-ups and updates the in-memory
        set; this is the raw append.
        """
        now = self._clock()
        ids = list(dict.fromkeys(collection_ids))  # dedupe, keep order
        if not ids:
            return None
        return await self._backend.append_many([DirtyRecord.purge(c, now).encode() for c in ids])
