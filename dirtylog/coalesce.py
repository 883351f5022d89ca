"""Coalescing dirty-log records per collection: the pure fold and this process's sightings.

:func:`coalesce` and :class:`Coalescer` fold a *whole window* of the dirty log at once (the rules are
in :mod:`dirtylog.rollup`'s docstring); the hand-over of a departed server's log uses them.  The
incremental roll-up folds record by record into :class:`dirtylog.dirtyset.DirtySet` instead, with
the same per-mark rules.  :class:`Observations` is when this process first knew each record to be
durable, on its monotonic clock (what "settled" is judged by).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from uuid import UUID

from .record import DirtyRecord, RecordKind


@dataclass(frozen=True, slots=True)
class Coalesced:
    """A collection's coalesced span ``[start, limit)`` over a window of the dirty log."""

    start: int
    limit: int
    first_insertion_us: int
    reinsert_count: int

    @property
    def num_records(self) -> int:
        """Offsets are dense, so the span's length is its record count."""
        return self.limit - self.start


def widen(old: Coalesced | None, new: Coalesced, *, newest: bool = False) -> Coalesced:
    """``old`` widened by ``new``: start = min, limit = max, reinsert = max, first insertion =
    min (max with ``newest``)."""
    if old is None:
        return new
    pick = max if newest else min
    return Coalesced(
        min(old.start, new.start),
        max(old.limit, new.limit),
        pick(old.first_insertion_us, new.first_insertion_us),
        max(old.reinsert_count, new.reinsert_count),
    )


Monotonic = Callable[[], float]


class Observations:
    """When this process first knew each dirty-log record to be durable, on its monotonic clock.

    A roll-up that read the log's end ``end`` at time t (``saw``) knows that every record below
    ``end`` was durable by t — and so its mark's upload, sent alongside, issued by t.  A record's
    sighting is therefore the time of the first roll-up whose end lay past it; a record this
    process re-appended (a carried mark) is remembered with the sighting of the marks it carries
    on (``carried``), which is older.  Offsets never seen are seen "now": after a restart every
    mark waits the full settle time from its first sighting.  Bounded by the window: whatever lies
    below the cursor is forgotten (``forget_below``).
    """

    def __init__(self) -> None:
        self._ends: list[int] = []  # ascending
        self._times: list[float] = []
        self._carried: dict[int, float] = {}
        self._ordered = True

    def saw(self, end: int, now: float) -> None:
        """A roll-up read the log's end ``end`` at ``now``."""
        if not self._ends or end > self._ends[-1]:
            self._ends.append(end)
            self._times.append(now)

    def seen_at(self, offset: int, now: float) -> float:
        """When the record at ``offset`` (or the marks it carries on) was first seen durable."""
        carried = self._carried.get(offset)
        if carried is not None:
            return carried
        i = bisect.bisect_right(self._ends, offset)  # the first end past the offset
        return self._times[i] if i < len(self._ends) else now

    def carried(self, first_offset: int, seen: Sequence[float]) -> None:
        """Records re-appended at ``first_offset``, ... carry marks first seen at ``seen``."""
        if self._carried and first_offset <= next(reversed(self._carried)):
            self._ordered = False  # never with one process's relogs; trimming then scans all
        for i, t in enumerate(seen):
            self._carried[first_offset + i] = t

    def forget_below(self, cursor: int) -> None:
        """The window starts at ``cursor`` now: nothing below it is read again."""
        i = bisect.bisect_right(self._ends, cursor)
        del self._ends[:i], self._times[:i]
        # Relogs are appended at rising offsets, so the dict's order is the log's: stop at the
        # first one the cursor has not passed (O(forgotten), not O(remembered)).
        if self._ordered:
            gone = list(itertools.takewhile(lambda o: o < cursor, self._carried))
        else:
            gone = [o for o in self._carried if o < cursor]
        for offset in gone:
            del self._carried[offset]


class Coalescer:
    """Folds dirty-log records one at a time, so a paged read needs O(collections) memory."""

    def __init__(
        self,
        compacted: Mapping[UUID, int] | None = None,
        tails: Mapping[UUID, int | None] | None = None,
        settle_s: float | None = None,
        seen_at: Callable[[int], float] | None = None,
        now: float = 0.0,
    ) -> None:
        """Fold records; ``compacted`` (read at each ``add``) clips marks to compaction cursors,
        and ``tails`` clips marks first seen (``seen_at(offset)``, monotonic) at least
        ``settle_s`` before ``now`` to the log's tail (a None tail: a write may still land
        there, nothing is settled)."""
        self._compacted = compacted
        self._tails = tails
        self._settle_s = settle_s
        self._seen_at = seen_at
        self._now = now
        self._spans: dict[UUID, Coalesced] = {}
        self._fresh: dict[UUID, Coalesced] = {}  # unsettled marks, stamped with the newest time
        self._spans_seen: dict[UUID, float] = {}  # the oldest sighting among settled marks
        self._fresh_seen: dict[UUID, float] = {}  # the newest sighting among unsettled marks
        self.marks = 0
        self.purges = 0
        self.clears = 0
        self.marks_fully_compacted = 0
        self.marks_beyond_tail = 0

    def _seen(self, offset: int | None) -> float:
        if offset is None or self._seen_at is None:
            return self._now
        return self._seen_at(offset)

    def aged(self, record: DirtyRecord, offset: int | None = None) -> bool:
        """Whether the mark at dirty-log ``offset`` is old enough for its upload to have ended
        (only with tails to clip against): first seen by this process at least ``settle_s``
        ago.  It is settled if its log's tail also shows no write that may still land."""
        return (
            self._tails is not None
            and self._settle_s is not None
            and record.kind == RecordKind.MARK_DIRTY
            and self._now - self._seen(offset) >= self._settle_s
        )

    def add(self, record: DirtyRecord, offset: int | None = None) -> None:
        """Fold one record, read at dirty-log ``offset`` (see the module docstring)."""
        cid = record.collection_id
        if record.kind == RecordKind.CLEAR:
            self.clears += 1
            return
        if record.kind == RecordKind.PURGE:
            self.purges += 1
            self._spans.pop(cid, None)
            self._fresh.pop(cid, None)
            self._spans_seen.pop(cid, None)
            self._fresh_seen.pop(cid, None)
            return
        self.marks += 1
        start, end, reinserts = record.log_position, record.end, record.reinsert_count
        if self._compacted is not None:
            cursor = self._compacted.get(cid, 1)
            if end <= cursor:
                self.marks_fully_compacted += 1
                return
            if cursor > start:
                start, reinserts = cursor, 0
        if start >= end:  # an empty mark covers nothing
            return
        span = Coalesced(start, end, record.initial_insertion_epoch_us, reinserts)
        seen = self._seen(offset)
        tail = None if self._tails is None else self._tails.get(cid, 1)
        if self._tails is None or self._settle_s is None:
            self._spans[cid] = widen(self._spans.get(cid), span)
            self._spans_seen[cid] = min(self._spans_seen.get(cid, seen), seen)
        elif self.aged(record, offset) and tail is not None:  # settled
            if tail <= start:  # the write never landed: nothing of it is in the log
                self.marks_beyond_tail += 1
                return
            self._spans[cid] = widen(
                self._spans.get(cid),
                Coalesced(start, min(end, tail), span.first_insertion_us, reinserts),
            )
            self._spans_seen[cid] = min(self._spans_seen.get(cid, seen), seen)
        else:
            self._fresh[cid] = widen(self._fresh.get(cid), span, newest=True)
            self._fresh_seen[cid] = max(self._fresh_seen.get(cid, seen), seen)

    @property
    def saw_changes(self) -> bool:
        """Whether any mark or purge was folded (a window of only clears changes nothing)."""
        return self.marks > 0 or self.purges > 0

    def result(self) -> dict[UUID, Coalesced]:
        """The spans folded so far, one per collection (settled and unsettled marks merged)."""
        out = dict(self._spans)
        for cid, fresh in self._fresh.items():
            old = out.get(cid)
            out[cid] = widen(old, fresh) if old is not None else fresh
        return out

    def carried(self) -> list[tuple[UUID, Coalesced]]:
        """The marks a roll-up re-appends: per collection, its settled span and its unsettled one."""
        return [(cid, span) for cid, span, _ in self.carried_seen()]

    def carried_seen(self) -> list[tuple[UUID, Coalesced, float]]:
        """``carried()``, each with the sighting it carries on: the oldest of its marks' for a
        settled span (all of them have ended), the newest for an unsettled one."""
        out = [
            (cid, span, self._spans_seen.get(cid, self._now)) for cid, span in self._spans.items()
        ]
        out += [
            (cid, span, self._fresh_seen.get(cid, self._now)) for cid, span in self._fresh.items()
        ]
        return sorted(out, key=lambda x: (x[1].first_insertion_us, x[0].bytes, x[1].start))


def coalesce(
    records: Iterable[DirtyRecord], compacted: Mapping[UUID, int] | None = None
) -> dict[UUID, Coalesced]:
    """Coalesce records (in dirty-log order) per collection, optionally clipped to compaction cursors."""
    folder = Coalescer(compacted)
    for record in records:
        folder.add(record)
    return folder.result()
