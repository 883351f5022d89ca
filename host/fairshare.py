"""Fair share of the server-wide byte budget under contention (issue 19, second bullet).

``LOGHOST_MAX_BUFFERED_BYTES`` bounds the bytes accepted and not yet durable on a host.  Below
``LOGHOST_FAIR_SHARE_THRESHOLD`` of it (and with nobody waiting) an append is admitted at once,
as before: no queue, no await.  Past it, admission is shared across the active tenants (those
with bytes in flight or requests waiting) instead of first come, first served:

* Waiting requests are granted in start-time fair queuing order: a request's tag is
  ``max(virtual time, its tenant's last finish tag)``, its finish tag that plus
  ``bytes / weight``.  A tenant's ``weight`` (a key of its quota entry, default 1) is its share
  relative to the others; a light tenant, its tag at the current virtual time, goes ahead of a
  flood's queued requests, whose tags lie further ahead.
* A tenant holding more than its share (``budget * weight / active weights``) may not take the
  contended part of the budget (past the threshold): it waits while the others are admitted.  A
  tenant alone is entitled to the whole budget.
* A grant holds its bytes until the request's admission is released, and is granted only when
  the bytes fit in the budget, so an admitted append never meets the server-wide ``batching``
  429 afterwards.
* A wait is bounded (``LOGHOST_FAIR_SHARE_MAX_WAIT_S``): then 429 ``backpressure``, reason
  ``fair_share``.  A waiting request that goes away (client disconnect: its task is cancelled)
  leaves the queue, and a grant that raced its cancellation is given back at once.

Everything here runs on the event loop: no locks, and the clock and the timer are injectable.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .errors import BackpressureError
from .metrics import TenantMetrics

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[Any]]

REASON = "fair_share"


class Grant:
    """The bytes one admitted request holds of the server-wide budget until ``release``
    (idempotent)."""

    __slots__ = ("_fair", "nbytes", "released", "tenant")

    def __init__(self, fair: FairShare, tenant: str, nbytes: int) -> None:
        self._fair = fair
        self.tenant = tenant
        self.nbytes = nbytes
        self.released = False

    def release(self) -> None:
        """Give the bytes back (and admit whoever waits for them)."""
        if not self.released:
            self.released = True
            self._fair._give_back(self)


class _Waiter:
    __slots__ = ("fut", "nbytes", "seq", "start", "tenant", "weight")

    def __init__(self, tenant: str, nbytes: int, weight: float, start: float, seq: int) -> None:
        self.tenant = tenant
        self.nbytes = nbytes
        self.weight = weight
        self.start = start
        self.seq = seq
        self.fut: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()


class FairShare:
    """The server-wide byte budget, shared across active tenants when near full."""

    def __init__(
        self,
        budget: int,
        *,
        threshold: float = 0.8,
        max_wait_s: float = 5.0,
        metrics: TenantMetrics | None = None,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.budget = budget
        self.threshold = threshold
        self.max_wait_s = max_wait_s
        self.metrics = metrics if metrics is not None else TenantMetrics()
        self.clock = clock
        self.sleep = sleep
        self.used = 0
        self._usage: collections.Counter[str] = collections.Counter()
        self._queues: dict[str, collections.deque[_Waiter]] = {}
        self._weights: dict[str, float] = {}  # of the active tenants
        self._finish: dict[str, float] = {}  # last finish tag of a tenant while active
        self._vtime = 0.0
        self._seq = itertools.count()

    @classmethod
    def from_settings(cls, settings: Any, metrics: TenantMetrics | None = None) -> FairShare:
        """From ``max_buffered_bytes``, ``fair_share_threshold`` and ``fair_share_max_wait_s``."""
        return cls(
            settings.max_buffered_bytes,
            threshold=settings.fair_share_threshold,
            max_wait_s=settings.fair_share_max_wait_s,
            metrics=metrics,
        )

    # ------------------------------------------------------------------------------ queries

    @property
    def limit(self) -> float:
        """Bytes in flight below which nothing is shared (the threshold of the budget)."""
        return self.budget * min(self.threshold, 1.0)

    def usage(self, tenant: str) -> int:
        """Bytes ``tenant`` holds now."""
        return self._usage.get(tenant, 0)

    def waiting(self, tenant: str | None = None) -> int:
        """Requests waiting (of ``tenant``, or all)."""
        if tenant is not None:
            return len(self._queues.get(tenant, ()))
        return sum(len(q) for q in self._queues.values())

    def share(self, tenant: str, weight: float = 1.0) -> float:
        """``tenant``'s share of the budget now: by weight among the active tenants."""
        weights = dict(self._weights)
        weights[tenant] = weights.get(tenant, weight)
        return self.budget * weights[tenant] / sum(weights.values())

    # ---------------------------------------------------------------------------- admission

    async def acquire(self, tenant: str, nbytes: int, weight: float = 1.0) -> Grant:
        """Hold ``nbytes`` of the budget for a request of ``tenant``: at once below the
        threshold, else when its fair turn comes.  Raises BackpressureError (``fair_share``)
        after ``max_wait_s``.  Cancelled while waiting: it leaves the queue."""
        if not self._queues and self.used + nbytes <= self.limit:
            return self._grant(tenant, nbytes, weight)  # uncontended: no await at all
        have = self._usage.get(tenant, 0)
        if not self._fits(nbytes) and have and have + nbytes > self.share(tenant, weight):
            # The budget is full and this tenant holds its share of it already (alone, all of
            # it): answer at once, as the server-wide budget always has (429 ``batching``),
            # instead of queueing behind its own bytes.  Tenants under their share wait.
            self.metrics.throttled(tenant, "batching")
            raise BackpressureError(
                f"{self.used} bytes buffered on this server, {have} of them tenant {tenant}'s",
                "batching",
                1,
            )
        w = self._enqueue(tenant, nbytes, weight)
        self._dispatch()
        if w.fut.done():
            return w.fut.result()
        began = self.clock()
        self.metrics.fair_waiting(tenant, 1)
        timer = asyncio.ensure_future(self.sleep(self.max_wait_s))
        try:
            await asyncio.wait((w.fut, timer), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            self._abandon(w)
            raise
        finally:
            timer.cancel()
            self.metrics.fair_waiting(tenant, -1)
            self.metrics.fair_waited(tenant, self.clock() - began)
        if w.fut.done():
            return w.fut.result()  # granted, even if the timer fired too: never failed later
        self._abandon(w)
        self.metrics.throttled(tenant, REASON)
        raise BackpressureError(
            f"tenant {tenant} waited {self.max_wait_s:g} s for its share of the server's "
            f"byte budget ({self.budget} bytes)",
            REASON,
            1,
        )

    def _enqueue(self, tenant: str, nbytes: int, weight: float) -> _Waiter:
        self._activate(tenant, weight)
        start = max(self._vtime, self._finish.get(tenant, 0.0))
        self._finish[tenant] = start + max(nbytes, 1) / weight
        w = _Waiter(tenant, nbytes, weight, start, next(self._seq))
        self._queues.setdefault(tenant, collections.deque()).append(w)
        return w

    def _activate(self, tenant: str, weight: float) -> None:
        self._weights[tenant] = weight

    def _abandon(self, w: _Waiter) -> None:
        """A waiter that stops waiting: out of the queue, or its grant given back."""
        if w.fut.done() and not w.fut.cancelled():
            w.fut.result().release()
            return
        w.fut.cancel()
        q = self._queues.get(w.tenant)
        if q is not None and w in q:
            q.remove(w)
            if not q:
                del self._queues[w.tenant]
            self._deactivate(w.tenant)
        self._dispatch()  # its place goes to the next one

    def _deactivate(self, tenant: str) -> None:
        if not self._usage.get(tenant) and tenant not in self._queues:
            self._weights.pop(tenant, None)
            self._finish.pop(tenant, None)

    def _grant(self, tenant: str, nbytes: int, weight: float) -> Grant:
        self._activate(tenant, weight)
        self.used += nbytes
        self._usage[tenant] += nbytes
        return Grant(self, tenant, nbytes)

    def _give_back(self, g: Grant) -> None:
        self.used -= g.nbytes
        left = self._usage[g.tenant] - g.nbytes
        if left > 0:
            self._usage[g.tenant] = left
        else:
            del self._usage[g.tenant]
            self._deactivate(g.tenant)
        if self._queues:
            self._dispatch()

    def _fits(self, nbytes: int) -> bool:
        # As the server-wide budget: the first request always fits.
        return self.used + nbytes <= self.budget or self.used == 0

    def _over_share(self, w: _Waiter) -> bool:
        have = self._usage.get(w.tenant, 0)
        return have > 0 and have + w.nbytes > self.share(w.tenant, w.weight)

    def _dispatch(self) -> None:
        """Grant waiting requests in tag order while they fit; a tenant over its share is
        passed over while the budget is past the threshold."""
        while self._queues:
            heads = sorted((q[0] for q in self._queues.values()), key=lambda w: (w.start, w.seq))
            chosen = None
            for w in heads:
                if self._over_share(w) and self.used + w.nbytes > self.limit:
                    continue  # over its share: waits while others may go
                if self._fits(w.nbytes):
                    chosen = w
                break  # the first eligible in tag order goes first, or nobody does
            if chosen is None:
                return
            q = self._queues[chosen.tenant]
            q.popleft()
            if not q:
                del self._queues[chosen.tenant]
            self._vtime = max(self._vtime, chosen.start)
            chosen.fut.set_result(self._grant(chosen.tenant, chosen.nbytes, chosen.weight))


__all__ = ["REASON", "FairShare", "Grant"]
