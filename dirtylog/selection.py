"""The rolled-up dirty set's entries, their priority, selection for compactors, and the invariant.

Score (higher is compacted first)::

    score = num_records * (1 + age_s / AGE_SCALE_S) + reinsert_count

``num_records * age`` is the "record-seconds of debt" a collection carries: compacting it repays
the most read amplification per compaction, and the ``1 +`` keeps fresh collections ordered by size
instead of all scoring zero.  With ``AGE_SCALE_S = 60`` a minute of waiting doubles a collection's
weight.  ``reinsert_count`` adds one point per roll-up a collection was carried over without
compaction progress: negligible for big collections, but it lifts small, long-ignored ones above
fresh small ones and breaks ties between equal sizes and ages.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

AGE_SCALE_S = 60.0


def score(num_records: int, first_insertion_us: int, reinsert_count: int, now_us: int) -> float:
    """Priority of a dirty collection: more records and older first (see the module docstring)."""
    age_s = max(0, now_us - first_insertion_us) / 1e6
    return num_records * (1.0 + age_s / AGE_SCALE_S) + reinsert_count


@dataclass(frozen=True, slots=True)
class DirtyEntry:
    """One collection of the rolled-up dirty set: offsets ``[start, limit)`` are not compacted."""

    collection_id: UUID
    start: int
    limit: int
    num_records: int
    first_insertion_us: int
    reinsert_count: int
    score: float

    def rescored(self, now_us: int) -> DirtyEntry:
        """The same entry with its score computed at ``now_us``."""
        return dataclasses.replace(
            self,
            score=score(self.num_records, self.first_insertion_us, self.reinsert_count, now_us),
        )

    def as_dict(self) -> dict[str, Any]:
        """The pull API's JSON object, without ``tenant`` (the server adds it)."""
        return {
            "collection_id": str(self.collection_id),
            "start": self.start,
            "limit": self.limit,
            "num_records": self.num_records,
            "first_insertion_us": self.first_insertion_us,
            "reinsert_count": self.reinsert_count,
            "score": self.score,
        }


def select_entries(
    entries: Iterable[DirtyEntry],
    *,
    min_records: int,
    limit: int,
    now_us: int,
    max_age_s: float | None = None,
    max_reinserts: int | None = None,
) -> list[DirtyEntry]:
    """Up to ``limit`` qualifying entries, highest score (computed at ``now_us``) first.

    An entry qualifies when ``num_records >= min_records``, or it waited more than ``max_age_s``
    since its first insertion, or it was re-inserted more than ``max_reinserts`` times.  Only the
    chosen entries are rescored as objects: O(entries × log limit), no sort of the whole set.
    """
    if limit < 0:
        raise ValueError(f"limit must be >= 0, got {limit}")
    if limit == 0:
        return []

    def keyed() -> Iterator[tuple[float, int, int, DirtyEntry]]:
        for entry in entries:
            n, first, r = entry.num_records, entry.first_insertion_us, entry.reinsert_count
            age_us = now_us - first
            if (
                n >= min_records
                or (max_age_s is not None and age_us / 1e6 > max_age_s)
                or (max_reinserts is not None and r > max_reinserts)
            ):
                # score(), inlined (the same operations, so the same float); then older, then
                # id, so equal scores do not flap between pulls.
                s = n * (1.0 + (age_us if age_us > 0 else 0) / 1e6 / AGE_SCALE_S) + r
                yield (-s, first, entry.collection_id.int, entry)

    return [entry.rescored(now_us) for *_, entry in heapq.nsmallest(limit, keyed())]


def missing_from_dirty_set(
    known: Mapping[UUID, tuple[int, int]],
    entries: Mapping[UUID, DirtyEntry] | Iterable[DirtyEntry],
) -> set[UUID]:
    """Collections with uncompacted records (``next_offset > compaction_offset``) not in ``entries``.

    ``known`` maps a collection to ``(next_offset, compaction_offset)``.  Sample ``next_offset``
    before the roll-up starts and ``compaction_offset`` after it ends: writes acknowledged later are
    legitimately not rolled up yet, and compactions during the run may legitimately drop entries.
    Its size is the metric ``loghost_dirty_untracked_collections``; anything but 0 is a bug.
    """
    present: Mapping[UUID, object] | set[UUID] = (
        entries if isinstance(entries, Mapping) else {e.collection_id for e in entries}
    )
    return {
        cid
        for cid, (next_off, compacted) in known.items()
        if next_off > compacted and cid not in present
    }
