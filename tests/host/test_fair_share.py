"""Fair share of the server-wide byte budget under contention (issue 19, second bullet).

Deterministic: no sleeps and no timing asserts.  Grants happen synchronously when bytes are given
back, so the order of admission is read from the scheduler's accounting at once; waiting tasks
are driven by yielding to the loop until a condition holds (a bounded number of turns, no time);
the bounded wait runs on an injected timer the test fires, and the wait metric on a fake clock.
"""

from __future__ import annotations

import asyncio
import collections
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from host.config import Settings
from host.errors import BackpressureError
from host.fairshare import FairShare, Grant
from host.metrics import TenantMetrics
from host.quotas import TenantQuotas, parse_quotas
from wal3 import LocalStore

from .live import live_server, log_path, record


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Timer:
    """An injected ``sleep``: each wait's timer is a future the test fires."""

    def __init__(self) -> None:
        self.pending: list[asyncio.Future[None]] = []

    def __call__(self, _seconds: float) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.pending.append(fut)
        return fut

    def fire(self) -> None:
        for f in self.pending:
            if not f.done():
                f.set_result(None)


async def until(cond: Callable[[], bool], turns: int = 200) -> None:
    """Yield to the loop until ``cond`` holds (a bounded number of turns; no time involved)."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never held")


def fair(budget: int, **kw: Any) -> tuple[FairShare, Timer, FakeClock, TenantMetrics]:
    timer, clock, metrics = Timer(), FakeClock(), TenantMetrics()
    for t in ("a", "b"):
        metrics.admitted(t)  # traffic: their own label (as the quotas count it before)
    kw.setdefault("threshold", 0.8)
    return FairShare(budget, clock=clock, sleep=timer, metrics=metrics, **kw), timer, clock, metrics


def now(coro: Any) -> Grant:
    """Run ``acquire`` and insist it did not suspend once (no await: no extra latency)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        grant: Grant = stop.value
        return grant
    coro.close()
    raise AssertionError("admission waited")


def samples(metrics: TenantMetrics, name: str) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(metrics)
    return {
        s.labels["tenant"]: s.value
        for fam in registry.collect()
        for s in fam.samples
        if s.name == name
    }


async def test_below_the_threshold_nothing_waits() -> None:
    fs, _timer, _clock, metrics = fair(1000)
    grants = [now(fs.acquire(t, 100)) for t in ("a", "b", "a", "c", "a", "a", "b", "a")]
    assert fs.used == 800 and fs.waiting() == 0
    for g in grants:
        g.release()
    assert fs.used == 0 and fs.usage("a") == 0
    assert samples(metrics, "loghost_tenant_fair_waits_total") == {}


async def test_a_flood_at_the_budget_does_not_starve_a_light_tenant() -> None:
    fs, _timer, _clock, metrics = fair(1000)
    held = collections.deque([now(fs.acquire("a", 100)) for _ in range(10)])  # alone: all of it
    assert fs.used == 1000
    # The budget is full of a's own bytes: a's next request is answered at once, 429 batching,
    # as the server-wide budget always answered (README), not queued behind a's own bytes.
    with pytest.raises(BackpressureError) as refused:
        await fs.acquire("a", 100)
    assert refused.value.reason == "batching"
    # A light tenant under its share waits for room instead, and gets the first that frees.
    light = asyncio.ensure_future(fs.acquire("b", 10))
    await until(lambda: fs.waiting("b") == 1)
    held.popleft().release()  # room: the light tenant goes first
    assert fs.usage("b") == 10 and fs.waiting("b") == 0
    (await light).release()
    while held:
        held.popleft().release()
    assert fs.used == 0
    assert samples(metrics, "loghost_tenant_fair_waits_total") == {"b": 1}


async def test_a_tenant_over_its_share_waits_while_another_under_it_goes() -> None:
    fs, _timer, _clock, _metrics = fair(1000)
    mine = [now(fs.acquire("a", 100)) for _ in range(8)]  # below the threshold: at once
    other = now(fs.acquire("b", 100))  # past it, under b's share (500): at once
    assert fs.used == 900
    # a holds 800 > its 500 and the budget is past the threshold: a waits, room or not.
    a_more = asyncio.ensure_future(fs.acquire("a", 50))
    await until(lambda: fs.waiting("a") == 1)
    b_more = now(fs.acquire("b", 50))  # b, under its share, is not held behind a
    assert fs.usage("b") == 150
    for g in (*mine[:4], other, b_more):
        g.release()  # a alone again, 400 in flight: its waiter goes
    assert fs.waiting("a") == 0 and fs.usage("a") == 450
    (await a_more).release()
    for g in mine[4:]:
        g.release()
    assert fs.used == 0


async def test_weights_are_respected_in_admission_order() -> None:
    fs, _timer, _clock, _metrics = fair(100)
    blocker = now(fs.acquire("z", 100))  # the whole budget: everyone else queues
    tasks: dict[str, collections.deque[asyncio.Future[Grant]]] = {
        "a": collections.deque(),
        "b": collections.deque(),
    }
    for _ in range(6):
        tasks["a"].append(asyncio.ensure_future(fs.acquire("a", 100, weight=3)))
        tasks["b"].append(asyncio.ensure_future(fs.acquire("b", 100, weight=1)))
    await until(lambda: fs.waiting() == 12)
    order = []
    blocker.release()
    while any(tasks.values()):
        # One request fits at a time: who holds the budget now was admitted next.
        (tenant,) = [t for t in ("a", "b") if fs.usage(t)]
        order.append(tenant)
        (await tasks[tenant].popleft()).release()
    # Start-time fair queuing by bytes / weight: a's tags 0, 1/3, 2/3, 1 ..., b's 0, 1, 2 ...
    # (ties to the earlier arrival): three of a's for one of b's while both wait.
    assert "".join(order[:8]) == "abaabaaa"
    assert order.count("a") == order.count("b") == 6


async def test_cancelling_a_waiting_request_frees_its_place() -> None:
    fs, _timer, _clock, metrics = fair(100)
    blocker = now(fs.acquire("z", 100))
    gone = asyncio.ensure_future(fs.acquire("a", 100))
    await until(lambda: fs.waiting("a") == 1)
    after = asyncio.ensure_future(fs.acquire("b", 100))
    await until(lambda: fs.waiting("b") == 1)
    gone.cancel()  # the client hung up
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert fs.waiting() == 1
    blocker.release()
    assert fs.usage("b") == 100 and fs.usage("a") == 0
    (await after).release()
    assert fs.used == 0
    assert samples(metrics, "loghost_tenant_fair_waiting") == {}


async def test_a_grant_that_races_cancellation_is_given_back_to_the_next() -> None:
    fs, _timer, _clock, _metrics = fair(100)
    blocker = now(fs.acquire("z", 100))
    first = asyncio.ensure_future(fs.acquire("a", 100))
    await until(lambda: fs.waiting("a") == 1)
    second = asyncio.ensure_future(fs.acquire("b", 100))
    await until(lambda: fs.waiting("b") == 1)
    blocker.release()  # granted to a, whose task has not resumed yet...
    assert fs.usage("a") == 100
    first.cancel()  # ...and hangs up before it does
    with pytest.raises(asyncio.CancelledError):
        await first
    assert fs.usage("a") == 0 and fs.usage("b") == 100
    (await second).release()
    assert fs.used == 0


async def test_the_wait_is_bounded_then_429_fair_share() -> None:
    fs, timer, clock, metrics = fair(100, max_wait_s=5)
    blocker = now(fs.acquire("z", 100))
    waiting = asyncio.ensure_future(fs.acquire("a", 100))
    await until(lambda: fs.waiting("a") == 1)
    clock.now += 5
    timer.fire()
    with pytest.raises(BackpressureError) as e:
        await waiting
    assert e.value.status == 429 and e.value.extra["reason"] == "fair_share"
    assert e.value.headers["Retry-After"] == "1"
    assert fs.waiting() == 0 and fs.usage("a") == 0
    assert samples(metrics, "loghost_tenant_fair_wait_seconds_total") == {"a": 5}
    assert samples(metrics, "loghost_tenant_throttled_total") == {"a": 1}
    blocker.release()
    assert fs.used == 0


async def test_a_request_that_passed_admission_is_never_failed_later() -> None:
    fs, timer, _clock, _metrics = fair(100)
    blocker = now(fs.acquire("z", 100))
    waiting = asyncio.ensure_future(fs.acquire("a", 100))
    await until(lambda: fs.waiting("a") == 1)
    blocker.release()  # granted...
    timer.fire()  # ...and its timer runs out in the same turn: the grant stands
    grant = await waiting
    assert not grant.released and fs.usage("a") == 100
    # Nothing is ever granted past the budget, so the server-wide 429 cannot refuse it later.
    grant.release()


def test_weight_is_a_quota_key_but_no_limit() -> None:
    config = parse_quotas('{"default": {"weight": 1}, "tenants": {"big": {"weight": 4}}}')
    assert config.quota("big").weight == 4 and not config.quota("big").limited()
    with pytest.raises(ValueError, match="weight"):
        parse_quotas('{"tenants": {"x": {"weight": 0}}}')


def test_settings_build_the_scheduler() -> None:
    on = TenantQuotas.from_settings(Settings(max_buffered_bytes=4096, fair_share_threshold=0.5))
    assert on.fair is not None and on.fair.budget == 4096 and on.fair.limit == 2048
    off = TenantQuotas.from_settings(Settings(fair_share="fifo"))
    assert off.fair is None


async def test_appends_pass_the_one_admission_point_and_give_the_budget_back(
    tmp_path: Path,
) -> None:
    async with live_server(store=LocalStore(tmp_path / "store"), max_buffered_bytes=4096) as lv:
        fs = lv.server.quotas.fair
        assert fs is not None
        cid = uuid.uuid4()
        async with lv.client() as c:
            r = await c.post(log_path("alice", cid) + "/records", json={"records": [record("r0")]})
        assert r.status_code == 200, r.text
        assert fs.used == 0 and lv.server.manager.buffered_bytes == 0
