"""What the creation-claim tests share: a claim watch on a clock the test moves (claims expire
without waiting), and a fork source with a compacted version."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field

import httpx

from wal3 import ObjectStore
from wal3.claim import ClaimWatch
from wal3.clock import Clock
from wal3.paths import current_key, version_prefix

from .live import log_path, record

TTL_S = 120.0


@dataclass(frozen=True, slots=True)
class StepClock(Clock):
    """Monotonic time that moves only when the test says so (wall time stays real)."""

    t: list[float] = field(default_factory=lambda: [1000.0])

    def monotonic(self) -> float:
        return self.t[0]

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        self.t[0] += seconds


def stepped_watch(ttl_s: float = TTL_S) -> tuple[ClaimWatch, StepClock]:
    """A watch whose claims expire once the test advances its clock by ``ttl_s``."""
    clock = StepClock()
    return ClaimWatch(ttl_s, clock=clock), clock


async def source_with_version(
    base: ObjectStore, alice: httpx.AsyncClient, svc: httpx.AsyncClient, src: str, per_fragment: int
) -> None:
    """``src`` holds three fragments of ``per_fragment`` records, [1, 1 + 3n); a compacted
    version of its first two at 1 + 2n, and its compaction cursor there."""
    for n in range(3):
        r = await alice.post(
            log_path("alice", src) + "/records",
            json={"records": [record(f"s{n}-{i}") for i in range(per_fragment)]},
        )
        assert r.status_code == 200, r.text
    offset = 1 + 2 * per_fragment
    path = version_prefix(uuid.UUID(src), 1) + "part-x.parquet"
    await base.put(path, f"parquet bytes of the source's [1, {offset})".encode())
    await base.put(
        current_key(uuid.UUID(src)),
        json.dumps({"version": 1, "offset": offset, "rows": offset - 1, "path": path}).encode(),
    )
    r = await svc.post(log_path("alice", src) + "/compaction", json={"offset": offset})
    assert r.status_code == 200, r.text
