"""The abstract slices of wal3 the dirty log needs.

The real adapters live with the server; ``dirtylog.memory`` has in-memory ones with the same
contract.  Keeping these as protocols is what lets ``dirtylog`` stay free of server imports.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable
from uuid import UUID


@runtime_checkable
class DirtyLogBackend(Protocol):
    """The part of one wal3 log (the server's ``dirty/{server_id}/`` log) the dirty log uses.

    Offsets start at 1 and are dense.  Errors are the typed ones of ``wal3.errors``.
    """

    async def append_many(self, bodies: list[bytes]) -> int:
        """Append ``bodies`` durably and contiguously; return the offset of the first one."""
        ...

    async def read(self, from_offset: int, max_records: int) -> list[tuple[int, bytes]]:
        """Up to ``max_records`` contiguous ``(offset, body)`` pairs from ``from_offset``.

        Returns ``[]`` at or past the end; raises ``LogPurged`` below the oldest retained offset.
        """
        ...

    async def next_offset(self) -> int:
        """The offset the next append will get (1 for an empty log)."""
        ...

    async def oldest_offset(self) -> int:
        """The oldest retained offset (equals ``next_offset()`` when nothing is retained)."""
        ...

    async def load_cursor(self, name: str) -> tuple[int, str] | None:
        """The cursor's ``(offset, witness)``, or ``None`` if it does not exist."""
        ...

    async def create_cursor(self, name: str, offset: int) -> str:
        """Create a cursor at ``offset``; return its witness; raise ``CursorConflict`` if it exists."""
        ...

    async def cas_cursor(self, name: str, offset: int, witness: str) -> str:
        """Move a cursor if ``witness`` is current; return the new witness, else ``CursorConflict``."""
        ...

    async def collect_garbage(self) -> None:
        """Reclaim every record below the minimum cursor."""
        ...


@runtime_checkable
class CompactionOffsets(Protocol):
    """Where each collection's compaction cursor stands."""

    async def compaction_offsets(self, ids: Sequence[UUID]) -> dict[UUID, int]:
        """The first offset NOT yet compacted, per collection; absent means nothing compacted (1)."""
        ...


@runtime_checkable
class LogTails(Protocol):
    """Where each collection log ends, for dropping marks of writes that never landed.

    A mark is appended concurrently with its fragment's upload, so a batch that then loses (a
    conflicting writer, a seal, a caller that gives up) leaves a mark past the log's tail.  Once
    ``settle_s`` has passed since the roll-up first saw a mark durable (its own monotonic clock,
    never the mark's insertion time, which is the marking host's wall clock) its fragment's upload
    has ended either way (the same timing assumption as garbage collection's grace); its *commit*
    may still be in flight for any time, so a log whose commit may still land is reported as
    ``None``: "not settled, whatever the marks' age".
    """

    settle_s: float

    async def log_tails(self, ids: Sequence[UUID]) -> dict[UUID, int | None]:
        """The next offset of each collection log, or None while a write may still land there
        (an uploaded fragment that continues it, a creation in progress); absent means the log
        does not exist and nothing can land (1)."""
        ...
