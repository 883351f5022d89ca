"""Adversarial tests of the GC pause hook (host/heap.py ``GcPauses``, commit da36daf).

The hook runs inside the interpreter's collector: at any allocation of a GC-tracked object
(CPython 3.11 collects synchronously there), in whatever thread, while that thread may be in
the middle of anything, holding any lock.  It called ``Histogram.labels()``, which takes the
parent histogram's ``threading.Lock`` (not re-entrant), the lock a ``/metrics`` scrape holds
while it copies the histogram's children; and it measured from the last ``start`` it saw.  Both
findings are fixed (the hook now keeps plain counters that a collector reads, and ignores a
'stop' without its 'start'); their tests below were xfail(strict) in 92577f7.

What holds up, pinned here: the StartingApp's lifespan leaves no hook behind, after a start
that failed and across a restart in one process.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from types import SimpleNamespace
from typing import Any

from host.cli_serve import StartingApp
from host.heap import GcPauses
from host.metrics import Metrics


def _sample(pauses: GcPauses, suffix: str) -> float:
    return sum(s.value for m in pauses.collect() for s in m.samples if s.name.endswith(suffix))


def _locks(obj: object) -> list[str]:
    lock_types = (type(threading.Lock()), type(threading.RLock()))
    return [k for k, v in vars(obj).items() if isinstance(v, lock_types)]


def test_a_collection_during_a_scrape_of_the_pauses_does_not_deadlock() -> None:
    """Was xfail(strict) (92577f7): the hook called ``Histogram.labels()``, which takes the
    histogram's non-reentrant lock, the lock a scrape holds while it copies the children (an
    allocation, where a collection may start): the thread blocked for ever, with the event loop
    that serves every tenant.  Now the hook takes no lock (plain counters a scrape reads), and a
    scrape in which collections keep starting completes."""
    pauses = Metrics().python_gc_pause
    assert isinstance(pauses, GcPauses) and not _locks(pauses)
    seen_in_scrape = []

    def spy(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen_in_scrape.append(info["generation"])

    thresholds = gc.get_threshold()
    pauses.install()
    gc.callbacks.append(spy)
    try:
        gc.set_threshold(1)  # every GC-tracked allocation of the scrape starts a collection
        families = list(pauses.collect())
    finally:
        gc.set_threshold(*thresholds)
        gc.callbacks.remove(spy)
        pauses.remove()
    assert seen_in_scrape, "no collection started inside the scrape"
    assert families[0].name == "loghost_python_gc_pause_seconds"


class _InstallsWhenCollected:
    """Garbage in a cycle: freed by a collection, whose finalizers run between its ``start``
    and its ``stop`` (as another thread runs while a finalizer releases the GIL)."""

    def __init__(self, pauses: GcPauses) -> None:
        self.pauses = pauses
        self.me = self

    def __del__(self) -> None:
        self.pauses.install()


def test_a_collection_whose_start_the_hook_did_not_see_is_not_observed_as_a_pause() -> None:
    """Was xfail(strict) (92577f7): a 'stop' without its 'start' was measured from 0.0, the
    machine's uptime recorded as one pause for ever."""
    pauses = Metrics().python_gc_pause
    enabled = gc.isenabled()
    gc.disable()  # the explicit collection below is the one that frees the object
    try:
        _InstallsWhenCollected(pauses)
        before = time.perf_counter()
        gc.collect()
        elapsed = time.perf_counter() - before
    finally:
        pauses.remove()
        if enabled:
            gc.enable()
    assert pauses._callback not in gc.callbacks
    # Whatever it observed lies within the collection: never longer than it.
    assert _sample(pauses, "_sum") <= elapsed


# ------------------------------------------------------------------------------ what holds up


def _gc_pause_hooks() -> list[Any]:
    return [cb for cb in gc.callbacks if isinstance(getattr(cb, "__self__", None), GcPauses)]


class _FakeStore:
    def __init__(self) -> None:
        self.closed = 0

    async def head(self, key: str) -> None:
        return None

    async def close(self) -> None:
        self.closed += 1


class _FakeServer:
    """What StartingApp uses of a Server."""

    def __init__(self, fail: Exception | None = None) -> None:
        self.metrics = Metrics()
        self.store = _FakeStore()
        # The interpreter's own threshold: a started app sets it, in this test's process.
        self.settings = SimpleNamespace(
            store="file:///nowhere",
            server_id="adversary",
            python_gc_full_threshold=gc.get_threshold()[2],
        )
        self.fail = fail
        self.closed = 0

    async def start(self) -> None:
        if self.fail is not None:
            raise self.fail

    async def close(self) -> None:
        self.closed += 1

    async def begin_drain(self) -> None:
        return None


async def _lifespan(app: StartingApp) -> None:
    """Startup, the background start to its end, shutdown: uvicorn's lifespan messages."""
    messages: asyncio.Queue[dict[str, str]] = asyncio.Queue()
    sent: list[str] = []
    started = asyncio.Event()

    async def send(message: Any) -> None:
        sent.append(message["type"])
        started.set()

    messages.put_nowait({"type": "lifespan.startup"})
    runner = asyncio.create_task(app({"type": "lifespan"}, messages.get, send))
    await started.wait()  # the lifespan has created the host's start task
    assert app._task is not None
    await asyncio.wait([app._task])
    messages.put_nowait({"type": "lifespan.shutdown"})
    await runner
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


async def test_the_lifespan_leaves_no_gc_hook_after_a_failed_start_or_a_restart() -> None:
    before = _gc_pause_hooks()
    fatal: list[Any] = []
    failed = _FakeServer(fail=RuntimeError("boom"))
    app = StartingApp(object(), failed, on_fatal=fatal.append)  # type: ignore[arg-type]
    await _lifespan(app)
    assert fatal and not app.started and failed.store.closed == 1
    assert _gc_pause_hooks() == before

    try:
        for _ in range(2):  # one process, the host started and stopped twice
            server = _FakeServer()
            app = StartingApp(object(), server, on_fatal=fatal.append)  # type: ignore[arg-type]
            await _lifespan(app)
            assert app.started and server.closed == 1
            assert _gc_pause_hooks() == before
    finally:
        gc.unfreeze()  # the start froze this test process's heap
    assert len(fatal) == 1
