"""In-memory implementations of the dirty-log protocols, with fault injection for tests."""

from __future__ import annotations

import asyncio
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from uuid import UUID

from wal3.errors import (
    CursorConflict,
    CursorNotFound,
    InvalidCursorName,
    LogPurged,
    NoCursors,
    SimulatedCrash,
)

_CURSOR_NAME = re.compile(r"[A-Za-z0-9_]+")

# Every call point a fault can be injected at; "gc" is collect_garbage.
OPS: tuple[str, ...] = (
    "append",
    "read",
    "next_offset",
    "oldest_offset",
    "load_cursor",
    "create_cursor",
    "cas_cursor",
    "gc",
)


@dataclass(slots=True)
class _Fault:
    op: str | None  # None matches any op
    skip: int  # matching calls to let through first
    after: bool  # apply the call's effect, then raise (an ambiguous, durable failure)
    exc: BaseException


class MemoryLogBackend:
    """A wal3-like log in memory, following :class:`~dirtylog.backend.DirtyLogBackend` exactly.

    ``inject_fault`` makes a later call raise (by default ``SimulatedCrash``), either before its
    effect or after it, which is how tests model a process dying at each step.
    """

    def __init__(self) -> None:
        """An empty log: oldest = next = 1, no cursors."""
        self._records: dict[int, bytes] = {}
        self._oldest = 1
        self._next = 1
        self._cursors: dict[str, tuple[int, str]] = {}
        self._witness_seq = 0
        self._faults: list[_Fault] = []
        self.calls: Counter[str] = Counter()
        self.trace: list[str] = []  # every call, in order, so tests can aim faults at each point

    # -------------------------------------------------------------------------- fault injection

    def inject_fault(
        self,
        op: str | None = None,
        *,
        skip: int = 0,
        after: bool = False,
        exc: BaseException | None = None,
    ) -> None:
        """Make the (skip+1)-th next call of ``op`` (any op if None) raise once."""
        if op is not None and op not in OPS:
            raise ValueError(f"unknown op {op!r}; expected one of {OPS}")
        error = exc if exc is not None else SimulatedCrash(f"injected crash at {op or 'any op'}")
        self._faults.append(_Fault(op, skip, after, error))

    def clear_faults(self) -> None:
        """Drop every pending injected fault."""
        self._faults.clear()

    @property
    def pending_faults(self) -> int:
        """How many injected faults have not fired yet."""
        return len(self._faults)

    async def _enter(self, op: str) -> _Fault | None:
        # Yield once so concurrent callers interleave at call boundaries, as with a real store.
        await asyncio.sleep(0)
        self.calls[op] += 1
        self.trace.append(op)
        for i, fault in enumerate(self._faults):
            if fault.op is None or fault.op == op:
                if fault.skip > 0:
                    fault.skip -= 1
                    continue
                del self._faults[i]
                if not fault.after:
                    raise fault.exc
                return fault
        return None

    @staticmethod
    def _leave(fault: _Fault | None) -> None:
        if fault is not None:
            raise fault.exc

    # ------------------------------------------------------------------------------------- log

    async def append_many(self, bodies: list[bytes]) -> int:
        """Append atomically; return the first offset."""
        if not bodies:
            raise ValueError("append_many needs at least one body")
        if not all(isinstance(b, (bytes, bytearray)) for b in bodies):
            raise TypeError("bodies must be bytes")
        fault = await self._enter("append")
        first = self._next
        for body in bodies:
            self._records[self._next] = bytes(body)
            self._next += 1
        self._leave(fault)
        return first

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        """Up to ``max_records`` records from ``from_offset``; ``LogPurged`` below the oldest."""
        if max_records < 1:
            raise ValueError(f"max_records must be >= 1, got {max_records}")
        fault = await self._enter("read")
        if from_offset < self._oldest:
            raise LogPurged(from_offset, self._oldest)
        stop = min(self._next, from_offset + max_records)
        out = [(o, self._records[o]) for o in range(from_offset, stop)]
        self._leave(fault)
        return out

    async def next_offset(self) -> int:
        """The offset the next append gets."""
        fault = await self._enter("next_offset")
        self._leave(fault)
        return self._next

    async def oldest_offset(self) -> int:
        """The oldest retained offset."""
        fault = await self._enter("oldest_offset")
        self._leave(fault)
        return self._oldest

    # --------------------------------------------------------------------------------- cursors

    def _new_witness(self) -> str:
        self._witness_seq += 1
        return f"w{self._witness_seq}"

    def _check_cursor(self, name: str, offset: int) -> None:
        if not _CURSOR_NAME.fullmatch(name):
            raise InvalidCursorName(name)
        if offset > self._next:
            raise ValueError(f"cursor offset {offset} is past the end {self._next}")
        if offset < self._oldest:
            raise LogPurged(offset, self._oldest)

    async def load_cursor(self, name: str) -> tuple[int, str] | None:
        """The cursor's (offset, witness), or None."""
        fault = await self._enter("load_cursor")
        if not _CURSOR_NAME.fullmatch(name):
            raise InvalidCursorName(name)
        value = self._cursors.get(name)
        self._leave(fault)
        return value

    async def create_cursor(self, name: str, offset: int) -> str:
        """Create a cursor; ``CursorConflict`` if it exists."""
        fault = await self._enter("create_cursor")
        self._check_cursor(name, offset)
        if name in self._cursors:
            raise CursorConflict(f"cursor {name} already exists")
        witness = self._new_witness()
        self._cursors[name] = (offset, witness)
        self._leave(fault)
        return witness

    async def cas_cursor(self, name: str, offset: int, witness: str) -> str:
        """Move a cursor if ``witness`` is current; ``CursorConflict`` otherwise."""
        fault = await self._enter("cas_cursor")
        self._check_cursor(name, offset)
        current = self._cursors.get(name)
        if current is None:
            raise CursorNotFound(name)
        if current[1] != witness:
            raise CursorConflict(f"cursor {name}: witness {witness} is stale")
        new_witness = self._new_witness()
        self._cursors[name] = (offset, new_witness)
        self._leave(fault)
        return new_witness

    # -------------------------------------------------------------------------------------- gc

    async def collect_garbage(self) -> None:
        """Drop every record below the minimum cursor."""
        fault = await self._enter("gc")
        if not self._cursors:
            raise NoCursors("the log has no cursors")
        cutoff = min(offset for offset, _ in self._cursors.values())
        for offset in range(self._oldest, cutoff):
            self._records.pop(offset, None)
        self._oldest = max(self._oldest, cutoff)
        self._leave(fault)


class MemoryCompactionOffsets:
    """Compaction cursors in a dict, following :class:`~dirtylog.backend.CompactionOffsets`."""

    def __init__(self) -> None:
        """No collection compacted yet."""
        self.offsets: dict[UUID, int] = {}
        self.fail_next: BaseException | None = None
        self.calls = 0

    def set(self, collection_id: UUID, offset: int) -> None:
        """Move a collection's compaction cursor (first offset not yet compacted)."""
        self.offsets[collection_id] = offset

    def get(self, collection_id: UUID) -> int:
        """The collection's compaction cursor (1 when it has none)."""
        return self.offsets.get(collection_id, 1)

    async def compaction_offsets(self, ids: Sequence[UUID]) -> dict[UUID, int]:
        """The cursors of those ``ids`` that have one."""
        await asyncio.sleep(0)
        self.calls += 1
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc
        return {cid: self.offsets[cid] for cid in ids if cid in self.offsets}


class MemoryLogTails:
    """Collection-log tails in a dict, following :class:`~dirtylog.backend.LogTails`."""

    def __init__(self, settle_s: float = 0.0) -> None:
        """Every log empty; marks older than ``settle_s`` are judged against these tails."""
        self.settle_s = settle_s
        self.tails: dict[UUID, int] = {}
        self.pending: set[UUID] = set()  # logs a write may still land in (a commit in flight)
        self.calls = 0

    def set(self, collection_id: UUID, next_offset: int) -> None:
        """A collection log's next offset."""
        self.tails[collection_id] = next_offset

    async def log_tails(self, ids: Sequence[UUID]) -> dict[UUID, int | None]:
        """The tails of those ``ids`` that have a log; None for those in ``pending``."""
        await asyncio.sleep(0)
        self.calls += 1
        out: dict[UUID, int | None] = {cid: self.tails[cid] for cid in ids if cid in self.tails}
        out.update({cid: None for cid in ids if cid in self.pending})
        return out
