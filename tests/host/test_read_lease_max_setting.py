"""LOGHOST_READ_LEASE_MAX_MS: the lease a take-over assumes for a manifest that records none.

A Rust writer's manifest write drops ``read_lease_ms``, possibly over a manifest whose lease
still answers reads (tests/wal3/test_lease_adversary3.py), so a host taking such a manifest over
fences for the longest lease any host holds, not for its own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from host.config import Settings
from tests.host.live import live_server


def test_by_default_it_is_the_default_lease() -> None:
    assert Settings().unrecorded_lease_s == 1.0
    assert Settings(read_lease_ms=0).unrecorded_lease_s == 1.0  # a host at 0 fences for peers
    assert Settings(read_lease_ms=0, read_lease_max_ms=4000).unrecorded_lease_s == 4.0


def test_a_lease_over_the_maximum_is_refused() -> None:
    """The one host that can tell the maximum was not raised first (fourth adversarial round,
    8fa4a95: a host at 2 s beside peers assuming 1 s read stale) refuses to start."""
    with pytest.raises(ValidationError, match="read_lease_max_ms"):
        Settings(read_lease_ms=2000)
    with pytest.raises(ValidationError, match="read_lease_max_ms"):
        Settings(read_lease_ms=2000, read_lease_max_ms=1500)
    assert Settings(read_lease_ms=1500, read_lease_max_ms=1500).unrecorded_lease_s == 1.5


@pytest.mark.parametrize(
    ("lease_ms", "max_ms", "grace_s"), [(0, 1000, 2.5), (1000, 300_000, 300.0), (0, 1000, 1.0)]
)
def test_a_gc_grace_within_a_take_overs_yield_and_fence_is_refused(
    lease_ms: int, max_ms: int, grace_s: float
) -> None:
    """A recovery may yield and then fence, 1.25 x the longest lease each, on the manifest it
    loaded: the collector's grace must outlast both (8fa4a95)."""
    with pytest.raises(ValidationError, match="gc_grace_s"):
        Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms, gc_grace_s=grace_s)
    Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms, gc_grace_s=grace_s + 750.1)
    Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms, gc_grace_s=0)  # tests: at once


async def test_a_host_hands_it_to_its_writers(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "s"), read_lease_ms=0, read_lease_max_ms=3000) as live:
        lease = live.server.manager._writer_options.lease
        assert (lease.read_lease_s, lease.unrecorded_lease_s) == (0.0, 3.0)
