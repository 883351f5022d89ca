"""Random interleavings of writes, compactions, purges, roll-ups, races and crashes.

After every successful roll-up: every collection with uncompacted records marked since its last
purge is in the rolled-up set, and its entry covers those records.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from dirtylog import (
    DirtyLogHook,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RollUp,
    RollUpResult,
    missing_from_dirty_set,
)
from wal3.errors import CursorConflict, SimulatedCrash

from .helpers import FakeClock, cid

IDS = [cid(i) for i in range(5)]
ids = st.sampled_from(IDS)


class HookedCompactionOffsets(MemoryCompactionOffsets):
    """Runs queued callbacks inside the next lookup, i.e. mid-roll-up, after its window is fixed."""

    def __init__(self) -> None:
        super().__init__()
        self.during_lookup: list[Callable[[], Awaitable[None]]] = []

    async def compaction_offsets(self, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
        while self.during_lookup:
            await self.during_lookup.pop(0)()
        return await super().compaction_offsets(ids)


class DirtyLogMachine(RuleBasedStateMachine):
    """The model: per collection, the next offset, the compaction cursor, and marks since the last purge."""

    @initialize()
    def setup(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.clock = FakeClock()
        self.backend = MemoryLogBackend()
        self.compaction = HookedCompactionOffsets()
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = self._new_rollup()
        self.next: dict[uuid.UUID, int] = dict.fromkeys(IDS, 1)
        self.marks: dict[uuid.UUID, list[tuple[int, int]]] = {c: [] for c in IDS}
        self.purged: set[uuid.UUID] = set()  # purged with no successful write since
        self.successes = 0

    def teardown(self) -> None:
        if hasattr(self, "loop"):
            self.loop.close()

    def _new_rollup(self, page: int = 3) -> RollUp:
        return RollUp(
            self.backend,
            self.compaction,
            clock=self.clock,
            max_records_per_read=page,
            max_records_per_append=2,
        )

    def run(self, coro):  # type: ignore[no-untyped-def]
        return self.loop.run_until_complete(coro)

    # ------------------------------------------------------------------------------- actions

    @rule(c=ids, n=st.integers(1, 4), fail=st.sampled_from([None, "before", "after"]))
    def write(self, c: uuid.UUID, n: int, fail: str | None) -> None:
        """A fragment write; a failed dirty-log append fails the write (offsets not consumed)."""
        if fail is not None:
            self.backend.inject_fault("append", after=fail == "after")
        try:
            self.run(self.hook.mark_dirty(c, self.next[c], n))
        except SimulatedCrash:
            assert fail is not None
            return
        assert fail is None
        self.marks[c].append((self.next[c], self.next[c] + n))
        self.next[c] += n
        self.purged.discard(c)
        self.clock.advance_s(1)

    @rule(c=ids, n=st.integers(1, 4))
    def roll_up_with_a_concurrent_write(self, c: uuid.UUID, n: int) -> None:
        """A fragment is marked while a roll-up is between its snapshot and its cursor move."""
        first = self.next[c]
        done: list[bool] = []

        async def write() -> None:
            await self.hook.mark_dirty(c, first, n)
            done.append(True)

        self.compaction.during_lookup.append(write)
        result = self.run(self.rollup.run())
        self.check(result)  # the concurrent mark is not part of this run's snapshot ...
        if not done:  # idle window: no lookup happened, so the write happens now
            self.compaction.during_lookup.clear()
            self.run(self.hook.mark_dirty(c, first, n))
        self.marks[c].append((first, first + n))  # ... but must be in every later one
        self.next[c] += n
        self.purged.discard(c)

    @rule(c=ids, data=st.data())
    def compact(self, c: uuid.UUID, data: st.DataObject) -> None:
        """A compactor moves the collection's cursor forward, up to its end."""
        current = self.compaction.get(c)
        target = data.draw(st.integers(current, self.next[c]))
        self.compaction.set(c, target)
        self.rollup.note_compacted(c, target)

    @rule(c=ids)
    def purge(self, c: uuid.UUID) -> None:
        self.run(self.rollup.purge([c]))
        self.marks[c] = []
        self.purged.add(c)
        assert c not in self.rollup.entries()

    @rule()
    def roll_up(self) -> None:
        self.check(self.run(self.rollup.run()))

    @rule(n=st.integers(0, 40), after=st.booleans())
    def crashing_roll_up(self, n: int, after: bool) -> None:
        """The process dies at the n-th backend call of a roll-up; a new process takes over."""
        self.backend.inject_fault(None, skip=n, after=after)
        try:
            result = self.run(self.rollup.run())
        except SimulatedCrash:
            self.rollup = self._new_rollup()
        else:
            # The crash point was past the run's calls (or hit GC, which is best effort).
            self.check(result)
        self.backend.clear_faults()

    @rule()
    def crashing_compaction_lookup(self) -> None:
        self.compaction.fail_next = SimulatedCrash("lookup")
        try:
            result = self.run(self.rollup.run())
        except SimulatedCrash:
            self.rollup = self._new_rollup()
        else:
            self.check(result)  # idle run: no lookup needed
        self.compaction.fail_next = None

    @rule(page=st.integers(1, 5))
    def racing_roll_ups(self, page: int) -> None:
        """Two processes roll up the same dirty log at once; CAS keeps it safe."""
        other = self._new_rollup(page)

        async def both() -> list[RollUpResult | BaseException]:
            return await asyncio.gather(self.rollup.run(), other.run(), return_exceptions=True)

        for result in self.run(both()):
            if isinstance(result, CursorConflict):
                continue  # out of retries: allowed, nothing written is lost
            assert isinstance(result, RollUpResult), result
            self.check(result)

    @rule(seconds=st.integers(1, 100))
    def tick(self, seconds: int) -> None:
        self.clock.advance_s(seconds)

    # ---------------------------------------------------------------------------- invariants

    def check(self, result: RollUpResult) -> None:
        """The dirty-set invariant, right after a successful roll-up."""
        self.successes += 1
        entries = result.entries
        for c in IDS:
            cursor = self.compaction.get(c)
            uncompacted = [(max(s, cursor), e) for s, e in self.marks[c] if e > cursor]
            if not uncompacted:
                continue
            assert c in entries, (
                f"{c} has uncompacted marks {uncompacted} but fell out of the dirty set"
            )
            entry = entries[c]
            assert entry.start <= min(s for s, _ in uncompacted)
            assert entry.limit >= max(e for _, e in uncompacted)
        for c, entry in entries.items():
            assert self.compaction.get(c) <= entry.start < entry.limit
            assert entry.num_records == entry.limit - entry.start
        # Never-purged collections: marks are dense from 1, so the entry covers [cursor, end).
        for c in IDS:
            if not self.marks[c] or self.marks[c][0][0] != 1:
                continue
            cursor = self.compaction.get(c)
            if cursor < self.next[c]:
                assert entries[c].start == cursor and entries[c].limit >= self.next[c]
        # The operator metric stays 0.
        known = {c: (self.next[c], self.compaction.get(c)) for c in IDS if c not in self.purged}
        assert missing_from_dirty_set(known, entries) == set()

    @invariant()
    def memory_set_never_claims_compacted_work(self) -> None:
        if not hasattr(self, "rollup"):
            return
        for entry in self.rollup.entries().values():
            assert entry.start < entry.limit

    @precondition(lambda self: hasattr(self, "rollup"))
    @rule()
    def select_is_sorted(self) -> None:
        chosen = self.rollup.select(min_records=0, limit=100)
        assert [e.score for e in chosen] == sorted((e.score for e in chosen), reverse=True)


DirtyLogMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=40, deadline=None
)
TestDirtyLogStateful = DirtyLogMachine.TestCase
