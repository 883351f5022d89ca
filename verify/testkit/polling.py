"""Bounded waits: poll a condition until it holds, and fail (never hang) at a deadline.

A poll is how a test waits for another process or task to reach a state it cannot be told about
(a socket that starts answering, a background round that finishes).  The interval paces the poll;
nothing is synchronised by it, and no assertion depends on how long the wait took.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool],
    what: str,
    timeout_s: float = 20.0,
    interval_s: float = 0.02,
) -> None:
    """Poll ``predicate`` (sync or async) until true; TimeoutError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for: {what}")
        await asyncio.sleep(interval_s)


def wait_until_sync(
    predicate: Callable[[], bool], what: str, timeout_s: float = 20.0, interval_s: float = 0.02
) -> None:
    """:func:`wait_until` for code without an event loop (subprocess supervisors, fixtures)."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:g}s waiting for: {what}")
        time.sleep(interval_s)
