"""Where the engine reads time: one injectable object, so a simulation can run on virtual time.

Wall time stamps records, cursors and garbage plans; monotonic time ages in-memory state.  Both
come from a ``Clock``; ``SYSTEM_CLOCK`` reads the machine's clocks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

_BOOTTIME: int | None = getattr(time, "CLOCK_BOOTTIME", None)


@dataclass(frozen=True, slots=True)
class Clock:
    """Reads of wall and monotonic time (override both to virtualise time)."""

    def wall_us(self) -> int:
        """Microseconds since the UNIX epoch."""
        return time.time_ns() // 1000

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back, counting time the machine was suspended
        (``CLOCK_BOOTTIME`` where there is one): a lease or a TTL measured on it never outlives
        a suspend or a frozen VM, as one measured on ``CLOCK_MONOTONIC`` would."""
        return time.clock_gettime(_BOOTTIME) if _BOOTTIME is not None else time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of ``monotonic`` time (the event loop's sleep; a virtual loop's time
        is virtual already)."""
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = Clock()
