"""LOGHOST_CLAIM_TTL_S: how long a dead host's creation claim blocks that log.

Unset (0) it is twice the bound on one store operation, 2 × max(60 s, GC grace) (host.forks);
set, it is what both the appends' creation claims and the roll-ups' view of fork claims use.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from host.forks import claim_ttl_s
from tests.host.live import live_server


def test_the_default_is_twice_the_operation_bound_or_the_grace() -> None:
    assert claim_ttl_s(0.0) == 120.0
    assert claim_ttl_s(300.0) == 600.0
    assert claim_ttl_s(300.0, 10.0) == 10.0


@pytest.mark.parametrize(("setting", "expected"), [({}, 120.0), ({"claim_ttl_s": 7.0}, 7.0)])
async def test_a_host_claims_and_judges_claims_with_the_setting(
    tmp_path: Path, setting: dict[str, float], expected: float
) -> None:
    async with live_server(str(tmp_path / "s"), gc_grace_s=0.0, **setting) as live:
        assert live.server.manager.claims.ttl_s == expected
        dirty = live.server.dirty_set.opened()
        assert dirty.backend._claims.ttl_s == expected  # the roll-ups' view of fork claims


@pytest.mark.parametrize("value", [0.001, 0.5, -1.0])
def test_a_claim_ttl_under_a_second_is_refused(value: float) -> None:
    """A claimant renews every quarter of its TTL: a tiny one would be a loop of store writes."""
    from pydantic import ValidationError

    from host.config import Settings

    with pytest.raises(ValidationError, match="claim_ttl"):
        Settings(claim_ttl_s=value)
    assert Settings(claim_ttl_s=1.0).claim_ttl_s == 1.0
