"""The roll-up: coalesce the dirty log into the set of dirty collections, crash-safely.

Durable truth.  The dirty set is a function of the dirty-log records at offsets ``>=`` the
``stable_prefix`` cursor (plus the collections' compaction cursors).  A roll-up reads the window
``[cursor, end)`` (``end`` = the log's next offset when it starts), re-appends every collection still
dirty *above* ``end``, and only then moves the cursor to ``end``.  So at every instant each dirty
collection has a record at or above the cursor: a crash before the cursor move leaves the window in
place (the re-appends are duplicates the next run coalesces away), a crash after it leaves only
garbage for GC.  Nothing is ever dropped by a step that is not already reflected durably.

Coalescing rules (:func:`coalesce`), in dirty-log order:

* ``mark_dirty`` widens the collection's span: start = min, limit = max end, reinsert_count = max,
  first insertion = min.  Given compaction cursors, each mark is first clipped to its collection's
  cursor (start = max(start, cursor)); a mark wholly below the cursor contributes nothing, and a mark
  the cursor has moved into restarts its reinsert count at 0 (the compactor made progress on it).
  Clipping per mark (not per span) keeps first insertion and reinsert count about the records that
  are actually still uncompacted, so the age and re-insertion criteria do not stay tripped forever
  for a collection that is written and compacted continuously.
* Given log tails (:class:`~dirtylog.backend.LogTails`), a *settled* mark is also clipped to its
  log's tail (limit = min(limit, tail)).  A mark of a batch that lost (409, a seal, a caller that
  gave up) covers offsets the log never got; without this it would be carried for ever, its
  reinsert count and score rising, and nothing would ever compact it away.  A mark is settled when
  (a) its fragment's upload has landed or failed (uploads go out with their mark): **this
  roll-up saw the mark, or the mark it carries on, durable at least ``settle_s`` ago on its own
  monotonic clock** (:class:`Observations`), and (b) the tail read *after* (a) shows no write
  that may still land: no uploaded fragment continuing the log (a commit in flight, for however
  long, or an orphan the next writer's read repair will link), no creation in progress.  A
  manifest links only fragments already in the store, so after (a) and (b) nothing can land at or
  past the tail that was read: clipping there drops no record.  (a) never reads a mark's
  ``initial_insertion_epoch_us``: that is the marking host's wall clock, and a clock stepped
  forward (NTP, a VM's clock corrected), or a host adopted with a skewed clock, would make the
  mark of a write still in flight look old.  It is judged the way GC's grace is: a roll-up that
  read the log's end at monotonic time t knows every record below that end was durable, its
  mark's upload issued, by t; a record carried by a roll-up of this process is remembered with
  the time its marks were first seen.  A process that did not see it (a restart, an adoption)
  starts the wait at its first sight: it can only wait longer.  Marks not yet settled are never
  clipped and are kept apart: they are carried as their own mark, remembered with the *newest*
  sighting among them (and stamped with the newest insertion time, informational), so that once
  that mark is judged settled, every write it stands for has ended.
* ``purge`` forgets the collection's marks that PRECEDE it in the log.  Marks after a purge (new
  writes) always survive it, so a purge can never hide data written after it.
* ``clear`` is a no-op.  A roll-up writes one when nothing is left, as a checkpoint operators can see
  and so that the retained log is never empty; it must not reset anything, because marks appended
  concurrently with that roll-up sit between the window and the clear, and a crashed roll-up's
  window is re-read in full, clear included.

Each still-dirty collection is re-appended as one mark ``[start, limit)`` with ``reinsert_count + 1``
and its first insertion time, so the dirty log holds O(dirty collections) records after a roll-up.
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from wal3.errors import CursorConflict, LogPurged

from .backend import CompactionOffsets, DirtyLogBackend, LogTails
from .errors import DirtyLogError
from .hook import Clock, DirtyLogHook, epoch_us
from .record import DirtyRecord, DirtyRecordError, RecordKind
from .selection import DirtyEntry, score, select_entries

log = logging.getLogger(__name__)

CURSOR_NAME = "stable_prefix"
DEFAULT_ROLLUP_INTERVAL_S = 10.0
_U32_MAX = (1 << 32) - 1


class RollUpError(DirtyLogError):
    """The dirty log violated its contract (gap or short read before the end)."""


# ------------------------------------------------------------------------------------ coalescing


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


def _widen(old: Coalesced | None, new: Coalesced, *, newest: bool = False) -> Coalesced:
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
        for i, t in enumerate(seen):
            self._carried[first_offset + i] = t

    def forget_below(self, cursor: int) -> None:
        """The window starts at ``cursor`` now: nothing below it is read again."""
        i = bisect.bisect_right(self._ends, cursor)
        del self._ends[:i], self._times[:i]
        for offset in [o for o in self._carried if o < cursor]:
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
            self._spans[cid] = _widen(self._spans.get(cid), span)
            self._spans_seen[cid] = min(self._spans_seen.get(cid, seen), seen)
        elif self.aged(record, offset) and tail is not None:  # settled
            if tail <= start:  # the write never landed: nothing of it is in the log
                self.marks_beyond_tail += 1
                return
            self._spans[cid] = _widen(
                self._spans.get(cid),
                Coalesced(start, min(end, tail), span.first_insertion_us, reinserts),
            )
            self._spans_seen[cid] = min(self._spans_seen.get(cid, seen), seen)
        else:
            self._fresh[cid] = _widen(self._fresh.get(cid), span, newest=True)
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
            out[cid] = _widen(old, fresh) if old is not None else fresh
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


# -------------------------------------------------------------------------------------- roll-up


@dataclass(frozen=True, slots=True)
class RollUpResult:
    """What one roll-up did."""

    entries: Mapping[UUID, DirtyEntry]
    cursor_from: int
    cursor_to: int
    records_read: int
    marks_read: int
    purges_read: int
    marks_fully_compacted: int
    reinserted: int
    wrote_clear: bool
    idle: bool  # the window held no mark or purge: nothing was written, the cursor did not move
    conflicts: int  # lost cursor races that were retried
    gc_error: str | None
    duration_s: float
    marks_beyond_tail: int = 0  # settled marks of writes that never landed, dropped


@dataclass(frozen=True, slots=True)
class InspectedRecord:
    """One raw dirty-log record, decoded for operators (``error`` set if it does not decode)."""

    offset: int
    record: DirtyRecord | None
    error: str | None = None
    raw_hex: str | None = None

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view."""
        if self.record is None:
            return {"offset": self.offset, "error": self.error, "raw_hex": self.raw_hex}
        return {"offset": self.offset, **self.record.as_dict()}


async def inspect_records(
    backend: DirtyLogBackend, from_offset: int, limit: int
) -> list[InspectedRecord]:
    """Decode up to ``limit`` raw records from ``from_offset``; ``LogPurged`` below the oldest."""
    if limit < 1:
        raise ValueError(f"limit must be >= 1, got {limit}")
    out: list[InspectedRecord] = []
    for offset, body in await backend.read(from_offset, limit):
        try:
            out.append(InspectedRecord(offset, DirtyRecord.decode(body)))
        except DirtyRecordError as e:
            # Operators inspect precisely when something is wrong: show it, do not fail the page.
            out.append(InspectedRecord(offset, None, str(e), bytes(body).hex()))
    return out


@dataclass(slots=True)
class _Window:
    cursor: int
    witness: str
    end: int
    folder: Coalescer


async def _read_window(
    backend: DirtyLogBackend,
    compaction: CompactionOffsets,
    cursor_name: str,
    max_read: int,
    tails: LogTails | None = None,
    observations: Observations | None = None,
    monotonic: Monotonic = time.monotonic,
) -> _Window:
    """Fold ``[cursor, end)`` of a dirty log, ``end`` being its next offset when we start."""
    # 1. Where the window starts.
    loaded = await backend.load_cursor(cursor_name)
    if loaded is None:
        cursor = await backend.oldest_offset()
        # A CursorConflict here means another roll-up created it first: retried by the caller.
        witness = await backend.create_cursor(cursor_name, cursor)
    else:
        cursor, witness = loaded
    # 2. Where it ends: fixed up front so concurrent writers and our own re-appends (all at or
    # above ``end``) are left for the next run, and a busy log cannot keep us reading forever.
    end = await backend.next_offset()
    # Everything below ``end`` was durable by now (this process's own, monotonic, observation).
    now = monotonic()
    seen = observations if observations is not None else Observations()
    seen.saw(end, now)

    # 3. Read the window page by page, folding as we go.
    compacted: dict[UUID, int] = {}
    known_tails: dict[UUID, int | None] = {}
    folder = Coalescer(
        compacted,
        known_tails if tails is not None else None,
        None if tails is None else tails.settle_s,
        lambda offset: seen.seen_at(offset, now),
        now,
    )
    pos = cursor
    while pos < end:
        page = await backend.read(pos, min(max_read, end - pos))
        if not page:
            raise RollUpError(f"dirty log returned nothing at {pos}, before its end {end}")
        records: list[tuple[int, DirtyRecord]] = []
        for offset, body in page:
            if offset >= end:
                break
            if offset != pos:
                raise RollUpError(f"dirty log read expected offset {pos}, got {offset}")
            try:
                records.append((offset, DirtyRecord.decode(body)))
            except DirtyRecordError as e:
                # Fail loudly: skipping could drop a dirty collection.  Nothing is lost while
                # we are stuck (the window stays), and the roll-up failure is visible.
                raise DirtyRecordError(f"dirty log offset {offset}: {e}") from e
            pos += 1
        # 4. Enrich with compaction cursors, once per collection per run.
        new_ids = list(
            dict.fromkeys(
                r.collection_id
                for _, r in records
                if r.kind == RecordKind.MARK_DIRTY and r.collection_id not in compacted
            )
        )
        if new_ids:
            found = await compaction.compaction_offsets(new_ids)
            for cid in new_ids:
                compacted[cid] = found.get(cid, 1)
        # 4b. Tails of logs with aged marks: read after those uploads ended, so they tell
        # (None: a write may still land there, whatever the marks' age).
        if tails is not None:
            tail_ids = list(
                dict.fromkeys(
                    r.collection_id
                    for o, r in records
                    if r.collection_id not in known_tails and folder.aged(r, o)
                )
            )
            if tail_ids:
                found_tails = await tails.log_tails(tail_ids)
                for cid in tail_ids:
                    known_tails[cid] = found_tails.get(cid, 1)
        for offset, record in records:
            folder.add(record, offset)
    return _Window(cursor, witness, end, folder)


def _carry(folder: Coalescer) -> list[tuple[DirtyRecord, float]]:
    """A mark per still-dirty collection (two when some of its marks are unsettled), re-inserted
    once more, oldest first; each with the sighting it carries on (``Observations``)."""
    return [
        (
            DirtyRecord(
                cid,
                span.start,
                span.num_records,
                span.first_insertion_us,
                min(span.reinsert_count + 1, _U32_MAX),
                RecordKind.MARK_DIRTY,
            ),
            seen,
        )
        for cid, span, seen in folder.carried_seen()
    ]


@dataclass(frozen=True, slots=True)
class HandOverResult:
    """What :func:`hand_over` moved from one dirty log to another."""

    collections: int
    records_read: int
    cursor_from: int
    cursor_to: int


async def hand_over(
    source: DirtyLogBackend,
    target: DirtyLogBackend,
    compaction: CompactionOffsets,
    *,
    cursor_name: str = CURSOR_NAME,
    max_records_per_read: int = 1024,
    max_records_per_append: int = 1024,
    tails: LogTails | None = None,
) -> HandOverResult:
    """Move another server's dirty set into ``target`` (a server that is gone for good).

    It is a roll-up of ``source`` whose re-appends go to ``target``: the still-dirty collections
    are appended to ``target`` first, and only then does ``source``'s cursor move past the window,
    so at every instant each dirty collection has a mark in one of the two logs.  A crash repeats
    the hand-over (duplicates, which roll-ups coalesce), never loses a collection.  If the source's
    own server is alive after all, this is as safe as two racing roll-ups: one cursor move wins
    and the loser starts over from the new cursor.  ``source`` is only read and its cursor moved.

    Nothing of ``source`` was observed by this process, so every mark is first seen now and none
    is settled (unless ``settle_s`` is 0): the departed host's insertion times, from its own wall
    clock, are never trusted.  They settle in ``target``'s roll-ups, which see them afresh.
    """
    if tails is None and isinstance(target, LogTails):
        tails = target
    window = await _read_window(source, compaction, cursor_name, max_records_per_read, tails)
    if not window.folder.saw_changes:
        return HandOverResult(0, window.end - window.cursor, window.cursor, window.cursor)
    carried = [r for r, _ in _carry(window.folder)]
    bodies = [r.encode() for r in carried]
    for i in range(0, len(bodies), max_records_per_append):
        await target.append_many(bodies[i : i + max_records_per_append])
    await source.cas_cursor(cursor_name, window.end, window.witness)
    return HandOverResult(len(carried), window.end - window.cursor, window.cursor, window.end)


@dataclass(slots=True)
class _Attempt:
    conflicts: int = 0
    started: float = field(default_factory=time.monotonic)


class RollUp:
    """Periodically coalesces one server's dirty log and keeps the dirty set in memory."""

    def __init__(
        self,
        backend: DirtyLogBackend,
        compaction_offsets: CompactionOffsets,
        *,
        max_records_per_read: int = 1024,
        max_records_per_append: int = 1024,
        clock: Clock = epoch_us,
        cursor_name: str = CURSOR_NAME,
        max_attempts: int = 3,
        tails: LogTails | None = None,
        monotonic: Monotonic = time.monotonic,
    ) -> None:
        """A roll-up over ``backend``; reads and appends are paged by the given maxima.

        ``tails`` (default: the backend, when it provides them) clips settled marks to their
        log's tail; without it marks are clipped to compaction cursors only.  ``clock`` (wall,
        epoch microseconds) stamps records and scores; whether a mark has settled is judged on
        ``monotonic`` alone, by this roll-up's own sightings (``Observations``).
        """
        if max_records_per_read < 1 or max_records_per_append < 1 or max_attempts < 1:
            raise ValueError(
                "max_records_per_read, max_records_per_append, max_attempts must be >= 1"
            )
        self._backend = backend
        self._compaction = compaction_offsets
        self._max_read = max_records_per_read
        self._max_append = max_records_per_append
        self._clock = clock
        self._cursor_name = cursor_name
        self._max_attempts = max_attempts
        self._tails = (
            tails if tails is not None else (backend if isinstance(backend, LogTails) else None)
        )
        self._monotonic = monotonic
        self._observations = Observations()
        self._hook = DirtyLogHook(backend, clock)
        self._entries: dict[UUID, DirtyEntry] = {}
        self._last: RollUpResult | None = None
        # One roll-up or purge at a time in this process: racing roll-ups would only burn CAS
        # retries, and a purge landing mid-roll-up could be overtaken by that roll-up's re-appends.
        self._lock = asyncio.Lock()
        # Compactions noted while a run is in flight, replayed onto its result when it swaps in.
        self._notes: dict[UUID, int] | None = None

    # ------------------------------------------------------------------------------ in-memory

    def entries(self) -> dict[UUID, DirtyEntry]:
        """The dirty set as of the last successful roll-up (plus compactions noted since)."""
        return dict(self._entries)

    @property
    def last_result(self) -> RollUpResult | None:
        """The last successful roll-up's result."""
        return self._last

    def note_compacted(self, collection_id: UUID, offset: int) -> None:
        """Record that ``collection_id`` is compacted below ``offset``: clip it, reset its reinserts.

        An entry whose span is now fully compacted leaves the in-memory set at once (handing it to a
        compactor again would be wasted work); the durable log still has it until the next roll-up,
        which drops it through the compaction cursor, or keeps it if new marks arrived.
        """
        if self._notes is not None:
            self._notes[collection_id] = max(self._notes.get(collection_id, 0), offset)
        self._apply_note(self._entries, collection_id, offset)

    def _apply_note(self, entries: dict[UUID, DirtyEntry], cid: UUID, offset: int) -> None:
        entry = entries.get(cid)
        if entry is None:
            return
        start = max(entry.start, offset)
        if start >= entry.limit:
            del entries[cid]
            return
        entries[cid] = dataclasses.replace(
            entry,
            start=start,
            num_records=entry.limit - start,
            reinsert_count=0,
            score=score(entry.limit - start, entry.first_insertion_us, 0, self._clock()),
        )

    def select(
        self,
        min_records: int,
        limit: int,
        max_age_s: float | None = None,
        max_reinserts: int | None = None,
        now_us: int | None = None,
    ) -> list[DirtyEntry]:
        """The pull API's answer: qualifying entries, highest score first (see ``select_entries``)."""
        return select_entries(
            self._entries.values(),
            min_records=min_records,
            limit=limit,
            now_us=self._clock() if now_us is None else now_us,
            max_age_s=max_age_s,
            max_reinserts=max_reinserts,
        )

    async def purge(self, collection_ids: Iterable[UUID]) -> int | None:
        """Append purge records (serialised with roll-ups) and drop the ids from the in-memory set."""
        ids = list(dict.fromkeys(collection_ids))
        async with self._lock:
            first = await self._hook.purge(ids)
            for cid in ids:
                self._entries.pop(cid, None)
            return first

    # -------------------------------------------------------------------------------- the run

    async def run(self) -> RollUpResult:
        """Roll up the dirty log once; on success the in-memory dirty set is replaced atomically."""
        async with self._lock:
            self._notes = {}
            attempt = _Attempt()
            try:
                while True:
                    try:
                        result = await self._run_once(attempt)
                        break
                    except (CursorConflict, LogPurged) as e:
                        # Another roll-up moved the cursor (and maybe GC'd our window) under us.
                        # Whatever we appended is a duplicate; start over from the new cursor.
                        attempt.conflicts += 1
                        log.warning("dirty-log roll-up lost a cursor race (%s); retrying", e)
                        if attempt.conflicts >= self._max_attempts:
                            raise
                return result
            finally:
                self._notes = None

    async def _run_once(self, attempt: _Attempt) -> RollUpResult:
        backend = self._backend
        window = await _read_window(
            backend,
            self._compaction,
            self._cursor_name,
            self._max_read,
            self._tails,
            self._observations,
            self._monotonic,
        )
        cursor, witness, end, folder = window.cursor, window.witness, window.end, window.folder
        if not folder.saw_changes:
            # Nothing but clears (or nothing at all) since the cursor: the set is empty and writing
            # yet another clear every interval would be pure churn on an idle server.
            return self._finish(
                attempt, {}, cursor, cursor, end - cursor, folder, 0, False, idle=True
            )

        # 5. Re-append every collection still dirty, or a clear record when none is; remember
        # what each carried mark was first seen as (its settle time goes on from there).
        carried = _carry(folder)
        now = self._clock()
        bodies = [r.encode() for r, _ in carried] if carried else [DirtyRecord.clear(now).encode()]
        for i in range(0, len(bodies), self._max_append):
            first = await backend.append_many(bodies[i : i + self._max_append])
            self._observations.carried(first, [t for _, t in carried[i : i + self._max_append]])

        # 6. Only now move the cursor past the window: everything in it is re-stated above ``end``.
        await backend.cas_cursor(self._cursor_name, end, witness)
        self._observations.forget_below(end)

        new_entries = {}
        for cid, span in folder.result().items():  # one entry per collection, both marks merged
            reinserts = min(span.reinsert_count + 1, _U32_MAX)
            new_entries[cid] = DirtyEntry(
                cid,
                span.start,
                span.limit,
                span.num_records,
                span.first_insertion_us,
                reinserts,
                score(span.num_records, span.first_insertion_us, reinserts, now),
            )
        result = self._finish(
            attempt, new_entries, cursor, end, end - cursor, folder, len(carried), not carried
        )

        # 7. Reclaim the consumed prefix.  Best effort: the roll-up is already durable, and garbage
        # left by a failure here is reclaimed by the next run's GC.
        try:
            await backend.collect_garbage()
        except Exception as e:
            log.warning("dirty-log GC failed after roll-up: %r", e)
            result = dataclasses.replace(result, gc_error=repr(e))
            self._last = result
        return result

    def _finish(
        self,
        attempt: _Attempt,
        entries: dict[UUID, DirtyEntry],
        cursor_from: int,
        cursor_to: int,
        records_read: int,
        folder: Coalescer,
        reinserted: int,
        wrote_clear: bool,
        idle: bool = False,
    ) -> RollUpResult:
        # Replay compactions noted during the run: our compaction cursors may predate them.
        for cid, offset in (self._notes or {}).items():
            self._apply_note(entries, cid, offset)
        self._entries = entries
        result = RollUpResult(
            entries=dict(entries),
            cursor_from=cursor_from,
            cursor_to=cursor_to,
            records_read=records_read,
            marks_read=folder.marks,
            purges_read=folder.purges,
            marks_fully_compacted=folder.marks_fully_compacted,
            reinserted=reinserted,
            wrote_clear=wrote_clear,
            idle=idle,
            conflicts=attempt.conflicts,
            gc_error=None,
            duration_s=time.monotonic() - attempt.started,
            marks_beyond_tail=folder.marks_beyond_tail,
        )
        self._last = result
        return result

    async def run_periodically(
        self,
        interval_s: float,
        stop: asyncio.Event,
        on_result: Callable[[RollUpResult], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        """Run every ``interval_s`` seconds until ``stop`` is set; a failed run is reported, not fatal."""
        while not stop.is_set():
            try:
                result = await self.run()
            except Exception as e:
                log.exception("dirty-log roll-up failed")
                if on_error is not None:
                    on_error(e)
            else:
                if on_result is not None:
                    on_result(result)
            try:
                await asyncio.wait_for(stop.wait(), timeout=interval_s)
            except TimeoutError:
                pass
