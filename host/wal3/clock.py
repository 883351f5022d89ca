"""Where the engine reads time: one injectable object, so a simulation can run on virtual time.

Wall time stamps records, cursors and garbage plans; monotonic time ages in-memory state.  Both
come from a ``Clock``; ``SYSTEM_CLOCK`` reads the machine's clocks.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Clock:
    """Reads of wall and monotonic time (override both to virtualise time)."""

    def wall_us(self) -> int:
        """Microseconds since the UNIX epoch."""
        return time.time_ns() // 1000

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back."""
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of ``monotonic`` time (the event loop's sleep; a virtual loop's time
        is virtual already)."""
        await asyncio.sleep(seconds)


SYSTEM_CLOCK = Clock()
