"""The coalesced dirty set, kept in memory and folded one dirty-log record at a time.

This is the state of the incremental roll-up (:class:`~dirtylog.rollup.RollUp`): no I/O here, only
what each record does to the set and what the head window must relog.  Per collection it keeps

* its **parts**: a *settled* span (marks whose writes have ended, clipped to the log's tail when
  they were judged) and up to two *unsettled* ones (marks that may still belong to a write in
  flight: never clipped to a tail; one whose sighting is older than ``settle_s``, one younger), each
  a :class:`~dirtylog.rollup.Coalesced` span with the monotonic time its marks were first seen;
* its **floor**: the highest compaction offset this process has learnt of (a clear record, a
  compaction noted by the host, a fallback read of the cursor).  Every part is clipped to it, and
  a mark folded later is clipped too, in whichever order the two reach the log;
* its **home**: the lowest dirty-log offset of a record the collection's parts depend on.

The home is what makes a bounded window safe.  Moving the ``stable_prefix`` cursor to ``stop``
forgets every record below ``stop``; a collection whose home is below ``stop`` must first be
*relogged* (its parts re-appended whole, past the log's end), after which its home is the relog.
:meth:`DirtySet.homes_in` names those collections, and nothing else needs to be written: a
collection whose home is at or past ``stop`` depends on no record below it.  A mark folded for a
collection whose home is higher (a relog that landed after the mark) lowers the home to the mark.

Floors of collections that are not dirty are kept while the record that taught them is retained
(``forget_floors_below``), so a late mark of a write the compactor already folded is clipped.  A
purge forgets the collection, floor included (a log re-created under the same id restarts at 1).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from uuid import UUID

from .coalesce import Coalesced, widen
from .hook import Clock, epoch_us
from .record import DirtyRecord, RecordKind
from .selection import DirtyEntry, score

_U32_MAX = (1 << 32) - 1


@dataclass(slots=True)
class Part:
    """A span of one collection and the monotonic time its marks were seen durable: the oldest
    sighting for the settled part, the newest for an unsettled one (its writes have all ended
    ``settle_s`` after that)."""

    span: Coalesced
    seen: float


@dataclass(slots=True)
class Item:
    """One dirty collection in memory."""

    home: int
    floor: int = 1
    settled: Part | None = None
    fresh: list[Part] = field(default_factory=list)
    records: int = 0  # marks folded into it since its last relog (a relog counts as one)

    def parts(self) -> list[Part]:
        """Settled part first, then the unsettled ones."""
        return ([self.settled] if self.settled is not None else []) + self.fresh


@dataclass(slots=True)
class FoldStats:
    """What folding and judging did since the counters were last reset."""

    records: int = 0
    marks: int = 0
    purges: int = 0
    clears: int = 0
    marks_fully_compacted: int = 0
    marks_beyond_tail: int = 0


def _bumped(span: Coalesced) -> Coalesced:
    return Coalesced(
        span.start, span.limit, span.first_insertion_us, min(span.reinsert_count + 1, _U32_MAX)
    )


def _clipped(span: Coalesced, floor: int) -> Coalesced | None:
    """The span above ``floor``; a span the floor cut into restarts its reinsert count (the
    compactor made progress on it); None when nothing is left."""
    if span.limit <= floor:
        return None
    if span.start >= floor:
        return span
    return Coalesced(floor, span.limit, span.first_insertion_us, 0)


class DirtySet:
    """Collections with records not yet compacted, as this process knows them."""

    def __init__(self, settle_s: float | None, clock: Clock = epoch_us) -> None:
        """``settle_s`` None: every mark counts as settled at once (no tails to clip to)."""
        self.settle_s = settle_s
        self._clock = clock
        self._items: dict[UUID, Item] = {}
        self._entries: dict[UUID, DirtyEntry] = {}
        self._homes: dict[int, UUID] = {}
        # Floors of collections not in the set: cid -> (floor, dirty-log position it was learnt at)
        self._floors: OrderedDict[UUID, tuple[int, int]] = OrderedDict()
        self.last_meaningful = 0  # highest offset of a record other than a checkpoint clear
        self.stats = FoldStats()

    # ---------------------------------------------------------------------------------- views

    @property
    def entries(self) -> Mapping[UUID, DirtyEntry]:
        """The set as compactors see it (live: copy it to keep it)."""
        return self._entries

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, cid: object) -> bool:
        return cid in self._items

    def item(self, cid: UUID) -> Item | None:
        """The collection's parts, or None when it is not dirty."""
        return self._items.get(cid)

    def floor(self, cid: UUID) -> int:
        """The highest compaction offset known for the collection (1: none)."""
        item = self._items.get(cid)
        if item is not None:
            return item.floor
        known = self._floors.get(cid)
        return known[0] if known is not None else 1

    @property
    def floors_kept(self) -> int:
        """Floors remembered for collections that are not dirty."""
        return len(self._floors)

    # -------------------------------------------------------------------------------- folding

    def aged(self, part: Part, now: float) -> bool:
        """Whether ``settle_s`` has passed since the part's marks were seen (see LogTails)."""
        return self.settle_s is not None and now - part.seen >= self.settle_s

    def fold(self, offset: int, record: DirtyRecord, seen: float, now: float) -> None:
        """Fold the record read at dirty-log ``offset``, first seen durable at ``seen``."""
        self.stats.records += 1
        kind = record.kind
        cid = record.collection_id
        if kind == RecordKind.CLEAR:
            self.stats.clears += 1
            if not record.is_checkpoint:
                self.last_meaningful = max(self.last_meaningful, offset)
                self.note_compacted(cid, record.log_position, offset)
            return
        self.last_meaningful = max(self.last_meaningful, offset)
        if kind == RecordKind.PURGE:
            self.stats.purges += 1
            self.purge(cid)
            return
        self.stats.marks += 1
        item = self._items.get(cid)
        floor = item.floor if item is not None else self.floor(cid)
        span = _clipped(
            Coalesced(
                record.log_position,
                record.end,
                record.initial_insertion_epoch_us,
                record.reinsert_count,
            ),
            floor,
        )
        if span is None:
            self.stats.marks_fully_compacted += 1
            return
        if span.start >= span.limit:  # an empty mark covers nothing
            return
        if item is None:
            item = Item(home=offset, floor=floor)
            self._floors.pop(cid, None)
            self._items[cid] = item
            self._homes[offset] = cid
        elif offset < item.home:
            # A relog of this collection landed after this mark: the mark is needed too.
            self._move_home(cid, item, offset)
        self._add(item, Part(span, seen), now)
        item.records += 1
        self._refresh(cid, item)

    def _add(self, item: Item, part: Part, now: float) -> None:
        if self.settle_s is None:
            item.settled = _merge(item.settled, part, oldest=True)
            return
        aged = self.aged(part, now)
        # Never merge a young part into an aged one (that would restart its wait) nor the other
        # way (the aged part would stand for a write that may still be in flight).
        for existing in item.fresh:
            if self.aged(existing, now) == aged:
                merged = _merge(existing, part, oldest=False)
                existing.span, existing.seen = merged.span, merged.seen
                break
        else:
            item.fresh.append(part)
        if len(item.fresh) > 2:  # a young part aged meanwhile: merge the aged ones
            old = [p for p in item.fresh if self.aged(p, now)]
            young = [p for p in item.fresh if not self.aged(p, now)]
            item.fresh = [_merge_all(old)] + ([_merge_all(young)] if young else [])

    def note_compacted(self, cid: UUID, offset: int, position: int) -> bool:
        """The collection is compacted below ``offset`` (learnt at dirty-log ``position``): clip
        its parts, drop it when nothing is left.  True when the collection left the set."""
        item = self._items.get(cid)
        if item is None:
            known = self._floors.get(cid)
            if known is None or known[0] < offset:
                self._floors[cid] = (offset, position)
                self._floors.move_to_end(cid)
            return False
        if offset <= item.floor:
            return False
        item.floor = offset
        if item.settled is not None:
            span = _clipped(item.settled.span, offset)
            item.settled = None if span is None else Part(span, item.settled.seen)
        fresh = []
        for p in item.fresh:
            span = _clipped(p.span, offset)
            if span is not None:
                fresh.append(Part(span, p.seen))
        item.fresh = fresh
        if item.settled is None and not item.fresh:
            self.stats.marks_fully_compacted += item.records
            self._remove(cid)
            self._floors[cid] = (offset, position)
            self._floors.move_to_end(cid)
            return True
        self._refresh(cid, item)
        return False

    def purge(self, cid: UUID) -> None:
        """Forget the collection: its marks so far and its floor."""
        if cid in self._items:
            self._remove(cid)
        self._floors.pop(cid, None)

    # --------------------------------------------------------------------------------- window

    def homes_in(self, start: int, stop: int) -> list[UUID]:
        """Collections whose home lies in ``[start, stop)``, in home order: those the cursor
        cannot pass before they are relogged."""
        homes = self._homes
        return [homes[o] for o in range(start, stop) if o in homes]

    def lowest_home(self) -> int | None:
        """The lowest home of any collection (for checks; O(set))."""
        return min(self._homes, default=None)

    def needs_judging(self, cid: UUID, now: float) -> bool:
        """Whether the collection has unsettled marks old enough to be judged against a tail."""
        item = self._items.get(cid)
        return item is not None and any(self.aged(p, now) for p in item.fresh)

    def judge(self, cid: UUID, tail: int | None, now: float) -> bool:
        """Clip the collection's aged unsettled marks to its log's ``tail``, read after they aged
        (None: a write may still land there, judge later).  True when it left the set."""
        item = self._items.get(cid)
        if item is None or tail is None:
            return False
        aged = [p for p in item.fresh if self.aged(p, now)]
        if not aged:
            return False
        item.fresh = [p for p in item.fresh if not self.aged(p, now)]
        part = _merge_all(aged)
        if tail <= part.span.start:  # the writes never landed: nothing of them is in the log
            self.stats.marks_beyond_tail += 1
        else:
            span = part.span
            if span.limit > tail:
                span = Coalesced(span.start, tail, span.first_insertion_us, span.reinsert_count)
            item.settled = _merge(item.settled, Part(span, part.seen), oldest=True)
        if item.settled is None and not item.fresh:
            self._remove(cid)
            self._floors[cid] = (item.floor, item.home)
            self._floors.move_to_end(cid)
            return True
        self._refresh(cid, item)
        return False

    def relog(self, cid: UUID) -> list[tuple[DirtyRecord, float]]:
        """The marks that restate the collection whole, one per part, re-inserted once more,
        each with the sighting it carries on."""
        item = self._items[cid]
        return [
            (
                DirtyRecord(
                    cid,
                    p.span.start,
                    p.span.num_records,
                    p.span.first_insertion_us,
                    min(p.span.reinsert_count + 1, _U32_MAX),
                    RecordKind.MARK_DIRTY,
                ),
                p.seen,
            )
            for p in item.parts()
        ]

    def relogged(self, cid: UUID, first_offset: int) -> None:
        """The collection's relog is durable from ``first_offset``: that is its home now."""
        item = self._items.get(cid)
        if item is None:  # compacted while its relog was in flight: nothing depends on it
            return
        self._move_home(cid, item, first_offset)
        if item.settled is not None:
            item.settled.span = _bumped(item.settled.span)
        for p in item.fresh:
            p.span = _bumped(p.span)
        item.records = 1
        self._refresh(cid, item)

    def forget_floors_below(self, cursor: int) -> None:
        """Floors of clean collections learnt below the cursor: nothing retained needs them."""
        floors = self._floors
        while floors:
            cid, (_, position) = next(iter(floors.items()))
            if position >= cursor:
                break
            del floors[cid]

    # ---------------------------------------------------------------------------- internals

    def _move_home(self, cid: UUID, item: Item, offset: int) -> None:
        if self._homes.get(item.home) == cid:
            del self._homes[item.home]
        item.home = offset
        self._homes[offset] = cid

    def _remove(self, cid: UUID) -> None:
        item = self._items.pop(cid)
        if self._homes.get(item.home) == cid:
            del self._homes[item.home]
        self._entries.pop(cid, None)

    def _refresh(self, cid: UUID, item: Item) -> None:
        span = _merge_all(item.parts()).span
        self._entries[cid] = DirtyEntry(
            cid,
            span.start,
            span.limit,
            span.num_records,
            span.first_insertion_us,
            span.reinsert_count,
            score(span.num_records, span.first_insertion_us, span.reinsert_count, self._clock()),
        )

    def check(self) -> None:
        """Raise AssertionError unless the indexes agree (for tests)."""
        assert set(self._items) == set(self._entries), "entries and items differ"
        assert len(self._homes) == len(self._items), "a home is missing or stale"
        for offset, cid in self._homes.items():
            assert self._items[cid].home == offset, f"{cid}: home {offset} is stale"
        for cid, item in self._items.items():
            parts = item.parts()
            assert parts, f"{cid} has no parts"
            assert len(item.fresh) <= 2, f"{cid} has {len(item.fresh)} unsettled parts"
            for p in parts:
                assert item.floor <= p.span.start < p.span.limit, f"{cid}: {p.span} under floor"
            assert cid not in self._floors, f"{cid} is dirty and has a clean floor"


def _merge(old: Part | None, new: Part, *, oldest: bool) -> Part:
    if old is None:
        return Part(new.span, new.seen)
    seen = min(old.seen, new.seen) if oldest else max(old.seen, new.seen)
    return Part(widen(old.span, new.span), seen)


def _merge_all(parts: list[Part]) -> Part:
    out = Part(parts[0].span, parts[0].seen)
    for p in parts[1:]:
        out = Part(widen(out.span, p.span), max(out.seen, p.seen))
    return out
