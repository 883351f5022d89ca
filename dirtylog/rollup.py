"""The roll-up: keep the dirty set in memory and move the dirty log's tail, a bounded window a pass.

Durable truth.  The dirty set is a function of the dirty-log records at offsets ``>=`` the
``stable_prefix`` cursor: folded in log order (rules below) they name every collection with records
not yet compacted.  The roll-up keeps that fold in memory (:class:`~dirtylog.dirtyset.DirtySet`),
built once from the cursor after a start and then extended, a pass at a time, by what was appended
since.  Compactors are answered from memory (:meth:`RollUp.select`).

A pass (every ``LOGHOST_ROLLUP_INTERVAL_S``), with ``end`` the log's next offset when it starts:

1. **Fold what is new**: the records in ``[read, end)``, ``read`` being where the last pass stopped
   (the cursor after a start).  Its own relogs are skipped: they restate what memory holds.
2. **The head window** ``[cursor, stop)``, ``stop = min(end, cursor + window + new records)``: the
   collections whose *home* (the lowest offset of a record their state depends on) lies in it are
   the only ones the cursor cannot pass.  The window grows with what was appended, so the cursor
   keeps up with the log; a collection is relogged at most once per rotation, so the retained log
   stays under ``dirty × (1 + new per pass / window)`` records and a rotation of it takes at most
   ``dirty / window + 1`` passes.
3. **Fallbacks, bounded**: for those collections only, up to ``max_compaction_lookups`` compaction
   cursors (most re-inserted first: a compaction this host was never told of, e.g. posted to
   another host) and up to ``max_tail_lookups`` log tails (marks that have settled, see below).  A
   failed lookup changes nothing; the collection is relogged as it is.
4. **Relog** each still-dirty window collection whole (one mark per part, ``reinsert_count + 1``,
   first insertion kept), past ``end``; or a checkpoint clear when the window emptied the log.
5. **Move the cursor** to ``stop`` (compare-and-swap), after checking that no collection in memory
   still has its home below ``stop``, then let the dirty log's GC reclaim the prefix.

Why nothing can drop out.  Before the cursor passes a record, every collection that depends on it
has been restated, whole, above the log's end (steps 2, 4, 5); a collection depends on nothing
else.  A crash before the cursor move leaves the window in place (the relogs are duplicates, which
the fold coalesces); a crash after it leaves garbage.  A restart rebuilds memory from the cursor.
A lost compare-and-swap (another process moved the cursor) throws memory away and rebuilds from
the new cursor, whose log is, by the same argument, a complete statement.  Marks appended during a
pass land at or past ``end``: the cursor never passes them before a later pass has folded them.

Coalescing rules, per record, in dirty-log order:

* ``mark_dirty`` is clipped to the collection's **floor** (the highest compaction offset known;
  a mark wholly below it contributes nothing, one the floor cuts into restarts its reinsert count)
  and widens the collection's span: start = min, limit = max end, reinsert_count = max, first
  insertion = min.
* ``clear`` naming a collection (written when ``POST .../compaction`` arrives) raises its floor and
  clips its span; the floor also clips marks folded after it, so the order in which a clear and a
  racing mark reach the log does not matter.  A clear is true by construction: the compaction
  cursor moved before it was written, and cursors only move forward.  The nil-UUID clear is a
  checkpoint, a no-op.
* ``purge`` forgets the collection's marks that PRECEDE it, and its floor.  Marks after a purge
  (new writes) always survive it.

Marks are also clipped to their log's **tail** once *settled*: a mark is written alongside its
upload, so a batch that then loses leaves a mark past the tail.  A mark is settled when (a) this
process saw it durable at least ``settle_s`` ago on its own monotonic clock
(:class:`~dirtylog.coalesce.Observations`; never by the mark's insertion time, another host's wall
clock), so its upload has ended, and (b) the tail, read after (a), shows no write that may still
land.  Unsettled marks are never clipped to a tail; they are kept and relogged apart, with their
newest sighting, so the mark later judged stands only for writes that have ended.

Compaction reaches the set without reading collection logs: through the clear records and
:meth:`RollUp.compacted` / :meth:`RollUp.note_compacted` (the host calls them on each
``POST .../compaction``).  The bounded lookups of step 3 are the fallback, counted in the result.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from uuid import UUID

from wal3.errors import CursorConflict, LogPurged, ProcessDeath

from .backend import CompactionOffsets, DirtyLogBackend, LogTails
from .coalesce import Coalesced, Coalescer, Monotonic, Observations, coalesce, widen
from .dirtyset import DirtySet, FoldStats
from .errors import RollUpError
from .hook import Clock, DirtyLogHook, epoch_us
from .record import DirtyRecord, DirtyRecordError, RecordKind
from .selection import DirtyEntry, score, select_entries
from .window import (
    CURSOR_NAME,
    HandOverResult,
    InspectedRecord,
    hand_over,
    inspect_records,
)

__all__ = [
    "CURSOR_NAME",
    "DEFAULT_COMPACTION_LOOKUPS",
    "DEFAULT_ROLLUP_INTERVAL_S",
    "DEFAULT_TAIL_LOOKUPS",
    "DEFAULT_WINDOW_RECORDS",
    "Coalesced",
    "Coalescer",
    "HandOverResult",
    "InspectedRecord",
    "Observations",
    "RollUp",
    "RollUpError",
    "RollUpResult",
    "coalesce",
    "hand_over",
    "inspect_records",
    "widen",
]

log = logging.getLogger(__name__)

DEFAULT_ROLLUP_INTERVAL_S = 10.0
# Records of the head window a pass may relog past (plus what was appended since the last pass).
DEFAULT_WINDOW_RECORDS = 4096
# Fallback reads a pass may make of collection logs: compaction cursors, and tails (2 requests).
DEFAULT_COMPACTION_LOOKUPS = 16
DEFAULT_TAIL_LOOKUPS = 64


class _SharedExclusive:
    """A lock held shared by many or exclusively by one; exclusive holders go first once they
    wait (new shared holders queue behind them), so a stream of clears cannot starve a purge."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()
        self._shared = 0
        self._exclusive = False
        self._waiting = 0  # exclusive holders waiting

    @contextlib.asynccontextmanager
    async def shared(self) -> AsyncIterator[None]:
        async with self._cond:
            await self._cond.wait_for(lambda: not self._exclusive and not self._waiting)
            self._shared += 1
        try:
            yield
        finally:
            async with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[None]:
        async with self._cond:
            self._waiting += 1
            try:
                await self._cond.wait_for(lambda: not self._exclusive and not self._shared)
            except BaseException:
                # Cancelled while waiting (the condition's lock is held again here): shared
                # holders queued behind this waiter may have nobody left to wake them.
                self._waiting -= 1
                self._cond.notify_all()
                raise
            self._waiting -= 1
            self._exclusive = True
        try:
            yield
        finally:
            async with self._cond:
                self._exclusive = False
                self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class RollUpResult:
    """What one roll-up pass did."""

    entries: Mapping[UUID, DirtyEntry]  # the dirty set after the pass (a copy)
    cursor_from: int
    cursor_to: int
    records_read: int  # records folded by this pass (all of them after a start)
    marks_read: int
    purges_read: int
    marks_fully_compacted: int  # marks (and collections' marks) found wholly compacted
    reinserted: int  # marks relogged
    wrote_clear: bool  # a checkpoint clear: the window emptied the log
    idle: bool  # nothing but checkpoints retained: nothing written, the cursor did not move
    conflicts: int  # lost cursor races that were retried
    gc_error: str | None
    duration_s: float
    marks_beyond_tail: int = 0  # settled marks of writes that never landed, dropped
    window: int = 0  # records between the cursor and where it moved
    relogged: int = 0  # collections relogged
    compaction_lookups: int = 0  # collections whose compaction cursor was read (fallback)
    tail_lookups: int = 0  # collections whose log tail was read (settled marks)
    lookup_errors: int = 0  # fallback reads that failed (the collection was relogged as is)
    rebuilt: bool = False  # memory was (re)built from the cursor by this pass
    retained: int = 0  # records left between the cursor and the log's end
    clears_read: int = 0


@dataclass(slots=True)
class _Attempt:
    conflicts: int = 0
    started: float = field(default_factory=time.monotonic)


@dataclass(slots=True)
class _Pass:
    """What a pass did so far (for its result)."""

    cursor: int
    rebuilt: bool
    compaction_lookups: int = 0
    tail_lookups: int = 0
    lookup_errors: int = 0
    relogged: int = 0
    reinserted: int = 0
    wrote_clear: bool = False


class RollUp:
    """Keeps one server's dirty set in memory and its dirty log's tail moving (see the module)."""

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
        window_records: int = DEFAULT_WINDOW_RECORDS,
        max_compaction_lookups: int = DEFAULT_COMPACTION_LOOKUPS,
        max_tail_lookups: int = DEFAULT_TAIL_LOOKUPS,
    ) -> None:
        """A roll-up over ``backend``; reads and appends are paged by the given maxima.

        ``tails`` (default: the backend, when it provides them) clips settled marks to their
        log's tail; without it marks are clipped to compaction floors only.  ``clock`` (wall,
        epoch microseconds) stamps records and scores; whether a mark has settled is judged on
        ``monotonic`` alone, by this process's own sightings.  ``window_records`` bounds the head
        window; the two ``max_*_lookups`` bound the fallback reads of collection logs per pass.
        """
        if max_records_per_read < 1 or max_records_per_append < 1 or max_attempts < 1:
            raise ValueError(
                "max_records_per_read, max_records_per_append, max_attempts must be >= 1"
            )
        if window_records < 1:
            raise ValueError(f"window_records must be >= 1, got {window_records}")
        if max_compaction_lookups < 0 or max_tail_lookups < 0:
            raise ValueError("max_compaction_lookups and max_tail_lookups must be >= 0")
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
        self._window = window_records
        self._max_compaction_lookups = max_compaction_lookups
        self._max_tail_lookups = max_tail_lookups
        self._observations = Observations()
        self._hook = DirtyLogHook(backend, clock)
        self._last: RollUpResult | None = None
        # One pass or purge at a time in this process: racing passes would only burn CAS retries,
        # and a purge landing mid-pass could be overtaken by that pass's relogs.
        self._lock = asyncio.Lock()
        # Orders the records that change a floor in the log as in memory: clears share it (many
        # at once, so a compactor's round of clears is batched into a few fragments instead of
        # one durable write after another), purges and cursors moved back hold it alone.  Held
        # briefly, so a clear does not wait for a pass.
        self._order = _SharedExclusive()
        self._set = self._new_set()
        # The last complete set, served united with ``_set`` until a rebuild completes (a lost
        # race, a reopen): a superset is safe (a phantom costs a compactor a no-op), a missing
        # entry strands data.  None once ``_set`` is complete.
        self._prior: dict[UUID, DirtyEntry] | None = None
        self._loaded = False  # memory holds the fold of [cursor, read)
        self._rebuilding = False  # the fold since the last load is not complete yet
        self._cursor = 1
        self._witness = ""
        self._read = 1
        self._own: deque[tuple[int, int]] = deque()  # our relogs not yet read past: (first, n)

    def _new_set(self) -> DirtySet:
        settle = self._tails.settle_s if self._tails is not None else None
        return DirtySet(settle, self._clock)

    # ------------------------------------------------------------------------------ in-memory

    def entries(self) -> dict[UUID, DirtyEntry]:
        """The dirty set as this process knows it (a copy): while a rebuild is incomplete, the
        last complete set united with what the rebuild has folded so far."""
        current = self._set.entries
        if self._prior is None:
            return dict(current)
        out = dict(self._prior)
        for cid, entry in current.items():
            old = out.get(cid)
            out[cid] = entry if old is None else _united(old, entry, self._clock())
        return out

    def carry_over(self, previous: RollUp) -> None:
        """Serve ``previous``'s set (united with ours) until this roll-up has completed a
        rebuild: a reopened dirty log's new roll-up must not list everything clean meanwhile."""
        if self._loaded and not self._rebuilding:
            return  # complete already
        carried = previous.entries()
        if self._prior is not None:
            for cid, entry in self._prior.items():
                old = carried.get(cid)
                carried[cid] = entry if old is None else _united(old, entry, self._clock())
        self._prior = carried

    @property
    def dirty_set(self) -> DirtySet:
        """The in-memory set itself (read it, do not change it)."""
        return self._set

    @property
    def last_result(self) -> RollUpResult | None:
        """The last successful pass's result."""
        return self._last

    def note_compacted(self, collection_id: UUID, offset: int) -> None:
        """Record, in memory only, that ``collection_id`` is compacted below ``offset``: clip it
        (resetting its reinsert count), drop it when nothing is left.  Prefer :meth:`compacted`,
        which also makes it durable."""
        self._set.note_compacted(collection_id, offset, self._read)
        if self._prior is not None:
            entry = self._prior.get(collection_id)
            if entry is not None:
                clipped = _clipped_entry(entry, offset, self._clock())
                if clipped is None:
                    del self._prior[collection_id]
                else:
                    self._prior[collection_id] = clipped

    async def compacted(self, collection_id: UUID, offset: int) -> int:
        """A compaction cursor moved to ``offset`` (it already has, durably): note it in memory
        at once and append the clear record that tells every later fold.  Returns the clear's
        offset.  Its failure loses nothing: the collection is only kept dirty longer.

        Ordered with purges (and cursors moved back): a clear that reached the log after a purge
        of the collection would restore, at every later fold, the floor the purge forgot."""
        async with self._order.shared():
            self.note_compacted(collection_id, offset)
            body = DirtyRecord.compacted(collection_id, offset, self._clock()).encode()
            return await self._backend.append_many([body])

    async def uncompacted(self, collection_id: UUID, offset: int, tail: int) -> int:
        """The collection's compaction cursor moved BACK to ``offset`` (already durable; its log
        ends at ``tail``): make ``[offset, tail)`` dirty again, durably, before returning.

        Appends a purge (which forgets the floor learnt from earlier clears) and, in the same
        append, a mark from ``offset`` to the highest end known of the collection's marks and
        ``tail``.  Marks appended before the purge and not folded yet (writes that may still land
        past ``tail``) are then folded, and a mark past the purge restates any that ends higher.
        Returns the purge's offset."""
        if collection_id.int == 0:
            raise ValueError("the nil UUID names no collection")
        async with self._lock, self._order.exclusive():
            now_us = self._clock()
            limit, first_us = self._known_span(collection_id, max(tail, offset), now_us)
            marks: list[DirtyRecord] = []
            if limit > offset:
                marks.append(
                    DirtyRecord(
                        collection_id, offset, limit - offset, first_us, 0, RecordKind.MARK_DIRTY
                    )
                )
            bodies = [DirtyRecord.purge(collection_id, now_us).encode()]
            first = await self._backend.append_many(bodies + [m.encode() for m in marks])
            placed = [(first + 1 + i, m) for i, m in enumerate(marks)]
            if self._loaded:
                try:
                    await self._fold_new(first, self._monotonic())
                except ProcessDeath:
                    raise
                except Exception as e:
                    log.warning(
                        "dirty log: marks before the purge of %s unread: %r", collection_id, e
                    )
                else:
                    late, first_us = self._known_span(collection_id, limit, first_us)
                    if late > limit:
                        m = DirtyRecord(
                            collection_id, offset, late - offset, first_us, 0, RecordKind.MARK_DIRTY
                        )
                        placed.append((await self._backend.append_many([m.encode()]), m))
            # In memory as the fold of these records will have it (the next pass folds them again:
            # the purge then the marks, the same result).
            now = self._monotonic()
            self._set.purge(collection_id)
            for at, m in placed:
                self._set.fold(at, m, now, now)
            if self._prior is not None:
                self._prior.pop(collection_id, None)
                for _, m in placed:
                    entry = _entry_of(m, now_us)
                    old = self._prior.get(collection_id)
                    self._prior[collection_id] = (
                        entry if old is None else _united(old, entry, now_us)
                    )
            return first

    def _known_span(self, cid: UUID, limit: int, first_us: int) -> tuple[int, int]:
        """``limit`` and ``first_us`` widened by what memory holds of the collection."""
        for entry in (self._set.entries.get(cid), (self._prior or {}).get(cid)):
            if entry is not None:
                limit = max(limit, entry.limit)
                first_us = min(first_us, entry.first_insertion_us)
        return limit, first_us

    def select(
        self,
        min_records: int,
        limit: int,
        max_age_s: float | None = None,
        max_reinserts: int | None = None,
        now_us: int | None = None,
    ) -> list[DirtyEntry]:
        """The pull API's answer, from memory: qualifying entries, highest score first."""
        return select_entries(
            self._set.entries.values() if self._prior is None else self.entries().values(),
            min_records=min_records,
            limit=limit,
            now_us=self._clock() if now_us is None else now_us,
            max_age_s=max_age_s,
            max_reinserts=max_reinserts,
        )

    async def purge(self, collection_ids: Iterable[UUID]) -> int | None:
        """Append purge records (serialised with passes) and drop the ids from the set."""
        ids = list(dict.fromkeys(collection_ids))
        async with self._lock, self._order.exclusive():
            first = await self._hook.purge(ids)
            for cid in ids:
                self._set.purge(cid)
                if self._prior is not None:
                    self._prior.pop(cid, None)
            return first

    # -------------------------------------------------------------------------------- the pass

    async def run(self) -> RollUpResult:
        """One pass (see the module docstring); a lost cursor race rebuilds and retries."""
        async with self._lock:
            attempt = _Attempt()
            while True:
                try:
                    return await self._pass(attempt)
                except (CursorConflict, LogPurged) as e:
                    # Another process moved the cursor (and maybe collected below it): memory may
                    # be stale; whatever we appended is a duplicate.  Rebuild from its cursor.
                    attempt.conflicts += 1
                    self._reset()
                    log.warning("dirty-log roll-up lost a cursor race (%s); retrying", e)
                    if attempt.conflicts >= self._max_attempts:
                        raise
                except ProcessDeath:
                    self._reset()  # taken as dead here: memory is not to be trusted further
                    raise

    def _reset(self) -> None:
        if self._loaded and (not self._rebuilding or self._prior is not None):
            # Complete (or a rebuild's part, united with the last complete set): served until
            # a rebuild completes.
            self._prior = self.entries()
        self._loaded = False
        self._set = self._new_set()
        self._own.clear()

    async def _load(self) -> None:
        backend = self._backend
        loaded = await backend.load_cursor(self._cursor_name)
        if loaded is None:
            cursor = await backend.oldest_offset()
            # A CursorConflict here means another roll-up created it first: retried by run().
            witness = await backend.create_cursor(self._cursor_name, cursor)
        else:
            cursor, witness = loaded
        self._set = self._new_set()
        self._own.clear()
        self._cursor, self._witness, self._read = cursor, witness, cursor
        self._loaded = True
        self._rebuilding = True

    async def _pass(self, attempt: _Attempt) -> RollUpResult:
        backend = self._backend
        rebuilt = not self._loaded
        if rebuilt:
            await self._load()
        cursor = self._cursor
        state = _Pass(cursor, rebuilt)
        # Everything below ``end`` was durable by ``now`` (this process's own observation).
        end = await backend.next_offset()
        now = self._monotonic()
        self._observations.saw(end, now)

        # 1. Fold what was appended since the last pass.
        folded = await self._fold_new(end, now)
        grow = 0 if self._rebuilding else folded
        self._rebuilding = False
        self._prior = None  # the rebuild is complete: it alone is the set now
        dirty = self._set
        if dirty.last_meaningful < cursor:
            # Nothing but checkpoints since the cursor: writing yet another one every interval
            # would be pure churn on an idle server.
            return self._finish(attempt, state, cursor, end, idle=True)

        # 2. The head window: the collections that depend on a record below ``stop``.
        stop = min(end, cursor + self._window + grow)
        window = dirty.homes_in(cursor, stop)

        # 3. Bounded fallbacks for those collections only.
        await self._verify(window, state)
        await self._judge(window, now, state)

        # 4. Relog what is still dirty (or a checkpoint when the window emptied the log).
        carried: list[tuple[UUID | None, DirtyRecord, float]] = [
            (cid, r, seen) for cid in window if cid in dirty for r, seen in dirty.relog(cid)
        ]
        state.reinserted = len(carried)
        if not carried and stop == end and len(dirty) == 0:
            carried = [(None, DirtyRecord.clear(self._clock()), now)]
            state.wrote_clear = True
        firsts: dict[UUID, int] = {}
        appended = 0
        for i in range(0, len(carried), self._max_append):
            chunk = carried[i : i + self._max_append]
            first = await backend.append_many([r.encode() for _, r, _ in chunk])
            appended += len(chunk)
            self._own.append((first, len(chunk)))
            self._observations.carried(first, [seen for _, _, seen in chunk])
            for j, (cid, _, _) in enumerate(chunk):
                if cid is not None:
                    firsts.setdefault(cid, first + j)
                    dirty.last_meaningful = max(dirty.last_meaningful, first + j)
        # Homes move only once every chunk is durable: a collection split over two chunks must not
        # look relogged when only its first part is.
        for cid, first in firsts.items():
            dirty.relogged(cid, first)
        state.relogged = len(firsts)

        # 5. Move the cursor past the window, never past a record something still depends on.
        stuck = dirty.homes_in(cursor, stop)
        if stuck:
            raise RollUpError(
                f"{len(stuck)} dirty collection(s) still depend on records in [{cursor}, {stop}) "
                f"after the relog (first: {stuck[0]}); the cursor stays"
            )
        self._witness = await backend.cas_cursor(self._cursor_name, stop, self._witness)
        self._cursor = stop
        self._observations.forget_below(stop)
        dirty.forget_floors_below(stop)
        result = self._finish(attempt, state, stop, end + appended)

        # 6. Reclaim the consumed prefix.  Best effort: the pass is already durable, and garbage
        # left by a failure here is reclaimed by the next pass's GC.
        try:
            await backend.collect_garbage()
        except ProcessDeath:
            raise
        except Exception as e:
            log.warning("dirty-log GC failed after roll-up: %r", e)
            result = dataclasses.replace(result, gc_error=repr(e))
            self._last = result
        return result

    async def _fold_new(self, end: int, now: float) -> int:
        """Fold ``[read, end)`` page by page, skipping our own relogs; return how many records
        were folded.  A page is folded whole or not at all, so a failure resumes where it was."""
        backend = self._backend
        own = self._own
        seen_at = self._observations.seen_at
        pos = self._read
        folded = 0
        while pos < end:
            while own and own[0][0] + own[0][1] <= pos:
                own.popleft()
            if own and own[0][0] <= pos:
                pos = own[0][0] + own[0][1]
                self._read = pos
                continue
            limit = min(end, own[0][0]) if own else end
            page = await backend.read(pos, min(self._max_read, limit - pos))
            if not page:
                raise RollUpError(f"dirty log returned nothing at {pos}, before its end {end}")
            records: list[tuple[int, DirtyRecord]] = []
            for offset, body in page:
                if offset >= limit:
                    break
                expected = pos + len(records)
                if offset != expected:
                    raise RollUpError(f"dirty log read expected offset {expected}, got {offset}")
                try:
                    records.append((offset, DirtyRecord.decode(body)))
                except DirtyRecordError as e:
                    # Fail loudly: skipping could drop a dirty collection.  Nothing is lost while
                    # we are stuck (the cursor stays), and the roll-up failure is visible.
                    raise DirtyRecordError(f"dirty log offset {offset}: {e}") from e
            if not records:
                raise RollUpError(f"dirty log read expected offset {pos}, got {page[0][0]}")
            for offset, record in records:
                self._set.fold(offset, record, seen_at(offset, now), now)
            pos += len(records)
            folded += len(records)
            self._read = pos
        return folded

    async def _verify(self, window: list[UUID], state: _Pass) -> None:
        """The fallback for compactions this host was not told of: read the compaction cursors of
        at most ``max_compaction_lookups`` window collections, the most re-inserted first."""
        dirty = self._set
        entries = dirty.entries
        present = [cid for cid in window if cid in dirty]
        if not present or self._max_compaction_lookups == 0:
            return
        chosen = heapq.nlargest(
            self._max_compaction_lookups, present, key=lambda c: entries[c].reinsert_count
        )
        state.compaction_lookups += len(chosen)
        try:
            found = await self._compaction.compaction_offsets(chosen)
        except ProcessDeath:
            raise
        except Exception as e:
            state.lookup_errors += 1
            log.warning("dirty-log roll-up: compaction cursors unreadable (%r); relogging", e)
            return
        for cid in chosen:
            offset = found.get(cid)
            if offset is not None:
                self._set.note_compacted(cid, offset, self._read)

    async def _judge(self, window: list[UUID], now: float, state: _Pass) -> None:
        """Clip the settled marks of at most ``max_tail_lookups`` window collections to their
        logs' tails, read now (after the marks were seen ``settle_s`` ago)."""
        if self._tails is None or self._max_tail_lookups == 0:
            return
        dirty = self._set
        due = [cid for cid in window if dirty.needs_judging(cid, now)]
        due = due[: self._max_tail_lookups]
        if not due:
            return
        state.tail_lookups += len(due)
        try:
            tails = await self._tails.log_tails(due)
        except ProcessDeath:
            raise
        except Exception as e:
            state.lookup_errors += 1
            log.warning("dirty-log roll-up: log tails unreadable (%r); relogging", e)
            return
        for cid in due:
            dirty.judge(cid, tails.get(cid, 1), now)

    def _finish(
        self,
        attempt: _Attempt,
        state: _Pass,
        cursor_to: int,
        log_end: int,
        *,
        idle: bool = False,
    ) -> RollUpResult:
        stats = self._set.stats
        self._set.stats = FoldStats()
        result = RollUpResult(
            entries=dict(self._set.entries),
            cursor_from=state.cursor,
            cursor_to=cursor_to,
            records_read=stats.records,
            marks_read=stats.marks,
            purges_read=stats.purges,
            marks_fully_compacted=stats.marks_fully_compacted,
            reinserted=state.reinserted,
            wrote_clear=state.wrote_clear,
            idle=idle,
            conflicts=attempt.conflicts,
            gc_error=None,
            duration_s=time.monotonic() - attempt.started,
            marks_beyond_tail=stats.marks_beyond_tail,
            window=cursor_to - state.cursor,
            relogged=state.relogged,
            compaction_lookups=state.compaction_lookups,
            tail_lookups=state.tail_lookups,
            lookup_errors=state.lookup_errors,
            rebuilt=state.rebuilt,
            retained=log_end - cursor_to,
            clears_read=stats.clears,
        )
        self._last = result
        return result


def _entry(
    cid: UUID, start: int, limit: int, first_us: int, reinserts: int, now_us: int
) -> DirtyEntry:
    n = limit - start
    return DirtyEntry(
        cid, start, limit, n, first_us, reinserts, score(n, first_us, reinserts, now_us)
    )


def _united(a: DirtyEntry, b: DirtyEntry, now_us: int) -> DirtyEntry:
    """One entry covering both (the safe direction: a superset)."""
    return _entry(
        a.collection_id,
        min(a.start, b.start),
        max(a.limit, b.limit),
        min(a.first_insertion_us, b.first_insertion_us),
        max(a.reinsert_count, b.reinsert_count),
        now_us,
    )


def _clipped_entry(entry: DirtyEntry, floor: int, now_us: int) -> DirtyEntry | None:
    """The entry above ``floor`` (its reinsert count restarted when cut), None when empty."""
    if entry.limit <= floor:
        return None
    if entry.start >= floor:
        return entry
    return _entry(entry.collection_id, floor, entry.limit, entry.first_insertion_us, 0, now_us)


def _entry_of(mark: DirtyRecord, now_us: int) -> DirtyEntry:
    return _entry(
        mark.collection_id,
        mark.log_position,
        mark.end,
        mark.initial_insertion_epoch_us,
        mark.reinsert_count,
        now_us,
    )
