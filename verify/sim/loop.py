"""A virtual-time asyncio event loop: no thread, no real I/O, no wall clock.

Time only moves when every runnable callback has run and the loop would block: the selector then
jumps virtual time to the next timer instead of sleeping.  ``run_in_executor`` (and so
``asyncio.to_thread``) runs the function inline, so no thread ever races the loop.  A loop that
would block with no timer pending is deadlocked: nothing can ever wake it.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, TypeVar, TypeVarTuple

from wal3.clock import Clock

T = TypeVar("T")
Ts = TypeVarTuple("Ts")

# Virtual wall time starts at a fixed instant so timestamps are the same in every replay.
BASE_WALL_S = 1_700_000_000.0


class Deadlock(RuntimeError):
    """The loop would wait forever: no callback is ready and no timer is pending."""


class _VirtualSelector(selectors.BaseSelector):
    """Registers file objects (the loop's self-pipe) but never polls them; ``select`` moves time."""

    def __init__(self) -> None:
        self._map: dict[Any, selectors.SelectorKey] = {}
        self.now = 0.0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        key = selectors.SelectorKey(fileobj, fd, events, data)
        self._map[fd] = key
        return key

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        fd = fileobj if isinstance(fileobj, int) else fileobj.fileno()
        return self._map.pop(fd)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if timeout is None:
            raise Deadlock("every task waits and no timer is pending")
        if timeout > 0:
            self.now += timeout
        return []

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._map

    def close(self) -> None:
        self._map.clear()


class Livelock(RuntimeError):
    """The loop ran its whole budget of iterations: something spins without time passing."""


class SimLoop(asyncio.SelectorEventLoop):
    """An event loop on virtual time (seconds since the run started)."""

    def __init__(self, budget: int = 2_000_000) -> None:
        self._vsel = _VirtualSelector()
        super().__init__(self._vsel)
        self.set_exception_handler(lambda _loop, _ctx: None)  # abandoned tasks are expected
        self.iterations = 0
        self._budget = budget

    def _run_once(self) -> None:
        # Counted, not timed: the guard must fire at the same point in every replay.
        self.iterations += 1
        if self.iterations > self._budget:
            raise Livelock(f"{self._budget} loop iterations at virtual time {self.time():.3f}")
        super()._run_once()  # type: ignore[misc]  # private to BaseEventLoop: not in typeshed

    def time(self) -> float:
        return self._vsel.now

    def run_in_executor(
        self, executor: Executor | None, func: Callable[[*Ts], T], *args: *Ts
    ) -> asyncio.Future[T]:
        fut: asyncio.Future[T] = self.create_future()
        try:
            fut.set_result(func(*args))
        except BaseException as e:
            fut.set_exception(e)
        return fut


@dataclass(frozen=True, slots=True)
class VirtualClock(Clock):
    """The engine's clock seam, reading the simulation's virtual time."""

    loop: SimLoop

    def wall_us(self) -> int:
        return round((BASE_WALL_S + self.loop.time()) * 1_000_000)

    def monotonic(self) -> float:
        return self.loop.time()


def wall_s(loop: SimLoop) -> float:
    """Virtual seconds since the epoch (the GC's clock, objects' last-modified)."""
    return BASE_WALL_S + loop.time()


def run(
    main: Callable[[SimLoop], Coroutine[Any, Any, T]], on_stop: Callable[[], None] | None = None
) -> T:
    """Run ``main(loop)`` to completion on a fresh virtual loop; abandoned tasks are dropped.

    ``on_stop`` runs when the run is over, before the teardown cancels what was abandoned."""
    loop = SimLoop()
    try:
        return loop.run_until_complete(main(loop))
    finally:
        if on_stop is not None:
            on_stop()
        _teardown(loop)


def _teardown(loop: SimLoop) -> None:
    """Cancel what the run abandoned while the loop still runs, so no coroutine is finalised
    against a closed loop (that aborts the interpreter in native code's callbacks)."""
    loop._budget = loop.iterations + 200_000
    try:
        for _ in range(20):
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            if not pending:
                break
            for t in pending:
                t.cancel()
            loop.run_until_complete(asyncio.sleep(0.001))
    except (Livelock, Deadlock, RuntimeError):
        pass
    finally:
        loop.close()
