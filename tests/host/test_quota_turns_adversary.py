"""Adversarial tests of the turns of refused requests (host/quotas.py ``TenantQuotas._turn``,
commit 59fa5f4): a fake clock, no sleeps, no server.

A request refused by a rate bucket is held until its turn; turns are ``n / rate`` apart per
(bucket, tenant), handed out up to ``PACE_HORIZON_S`` ahead.  What is pinned here: the hold of
any refusal is a finite number in [0, PACE_HORIZON_S], never longer than the Retry-After sent,
and one tenant's refusals never change another's holds, whatever the clock, the request sizes
and quota changes (retunes, a rate lifted to null and set again) do.  What fails: a turn handed
out at the old rate survives a quota change.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from host.errors import QuotaExceeded
from host.quotas import PACE_HORIZON_S, Quota, TenantQuotas, parse_quotas


class FakeClock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, default: dict[str, Any]) -> None:
    path.write_text(json.dumps({"default": default}), encoding="utf-8")


def _refusal(q: TenantQuotas, tenant: str) -> QuotaExceeded:
    with pytest.raises(QuotaExceeded) as e:
        q.charge(tenant, q.quota(tenant), appends=1, records=0)
    return e.value


# Was xfail(strict) in 92577f7: the turns kept the old rate's spacing for up to 100 s.
def test_turns_after_a_quota_raise_are_spread_at_the_new_rate(tmp_path: Path) -> None:
    """An operator throttles a tenant hard (appends_per_s 0.01: one append per 100 s, e.g. to
    suspend it) and then gives it its normal quota back by rewriting the quotas file.  Under
    the new quota, refused requests should get turns 1/rate apart, as
    tests/host/test_quotas.py::test_refused_requests_get_turns_spread_at_the_rate has it."""
    clock = FakeClock()
    path = tmp_path / "quotas.json"
    _write(path, {"appends_per_s": 0.01, "appends_burst": 1})
    q = TenantQuotas(path=str(path), clock=clock)
    q.charge("a", q.quota("a"), appends=1, records=0)  # the burst
    clock.now += 99.5
    first = _refusal(q, "a")  # its token is 0.5 s away: a turn, the next one 100 s later
    assert first.hold_s == pytest.approx(0.5)

    _write(path, {"appends_per_s": 10, "appends_burst": 1})
    clock.now += 0.5
    q.charge("a", q.quota("a"), appends=1, records=0)  # the new quota is in use
    holds = [_refusal(q, "a").hold_s for _ in range(5)]  # 5 connections refused at once
    assert holds == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5])


def test_a_stale_turn_far_in_the_past_does_not_hold_a_refusal_longer_than_its_wait() -> None:
    """A tenant refused long ago (its turn long past) and refused again now is held until its
    tokens are back, not by the old turn."""
    clock = FakeClock()
    q = TenantQuotas(
        parse_quotas(json.dumps({"default": {"appends_per_s": 10, "appends_burst": 1}})),
        clock=clock,
    )
    quota = q.quota("a")
    q.charge("a", quota, appends=1, records=0)
    _refusal(q, "a")
    clock.now += 3600.0
    q.charge("a", quota, appends=1, records=0)
    clock.now += 0.04
    assert _refusal(q, "a").hold_s == pytest.approx(0.06)


def _run(seed: int, *, noise: bool) -> list[float]:
    """A random life of tenant "a" (and, with ``noise``, of tenant "b" on the same quotas):
    appends of random sizes (beyond the burst too), clock steps (zero too), retunes (a rate
    lifted to null and set again).  Checks every refusal's hold; returns a's holds."""
    rng = random.Random(seed)
    clock = FakeClock()
    q = TenantQuotas(parse_quotas(""), clock=clock)
    quota = Quota(appends_per_s=5.0, records_per_s=100.0, records_burst=50.0)
    holds: list[float] = []
    for _ in range(3000):
        step = rng.random()
        if step < 0.05:
            quota = Quota(
                appends_per_s=rng.choice([None, 0.5, 5.0, 200.0]),
                appends_burst=rng.choice([None, 1.0, 3.0]),
                records_per_s=rng.choice([None, 10.0, 100.0, 1e4]),
                records_burst=rng.choice([None, 1.0, 50.0]),
            )
            continue
        if step < 0.3:
            clock.now += rng.choice([0.0, 1e-9, 0.003, 0.05, 0.4, 2.0])
        pick = rng.random()  # drawn in both runs: the same sequence for a
        tenants = ["a", "b"] if noise and pick < 0.5 else ["a"]
        records = rng.choice([1, 10, 60, 500])
        for tenant in tenants:
            try:
                q.charge(tenant, quota, appends=1, records=records)
            except QuotaExceeded as e:
                hold = e.hold_s
                assert hold is not None and math.isfinite(hold), hold
                assert 0.0 <= hold <= PACE_HORIZON_S, hold
                assert e.retry_after_s is not None and hold <= e.retry_after_s
                if tenant == "a":
                    holds.append(hold)
    return holds


@pytest.mark.parametrize("seed", range(4))
def test_holds_are_bounded_and_one_tenants_turns_are_its_own(seed: int) -> None:
    """Whatever the sequence, a hold is finite, within the horizon and the Retry-After; and
    tenant b flooding on the same quotas changes none of a's holds."""
    alone = _run(seed, noise=False)
    assert alone  # the sequence does refuse a
    assert _run(seed, noise=True) == alone
