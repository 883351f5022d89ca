"""A creation-claim watch on a clock the test moves (claims expire without waiting)."""

from __future__ import annotations

from dataclasses import dataclass, field

from wal3.claim import ClaimWatch
from wal3.clock import Clock

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
