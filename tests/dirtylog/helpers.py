"""Small shared helpers for the dirty-log tests."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from dirtylog import DirtyEntry, DirtyLogBackend, DirtyRecord

T0_US = 1_700_000_000_000_000


@dataclass
class FakeClock:
    """A clock tests move by hand (epoch microseconds)."""

    now_us: int = T0_US

    def __call__(self) -> int:
        return self.now_us

    def advance_s(self, seconds: float) -> None:
        self.now_us += int(seconds * 1_000_000)


def cid(n: int) -> uuid.UUID:
    """A readable, deterministic collection id."""
    return uuid.UUID(int=n + 1)


def spans(entries: dict[uuid.UUID, DirtyEntry]) -> dict[uuid.UUID, tuple[int, int]]:
    """Entries reduced to their ranges."""
    return {k: (e.start, e.limit) for k, e in entries.items()}


async def decoded_from(backend: DirtyLogBackend, offset: int) -> list[tuple[int, DirtyRecord]]:
    """Every record of ``backend`` from ``offset`` to the end, decoded."""
    out: list[tuple[int, DirtyRecord]] = []
    end = await backend.next_offset()
    while offset < end:
        page = await backend.read(offset, 100)
        out.extend((o, DirtyRecord.decode(b)) for o, b in page)
        offset += len(page)
    return out
