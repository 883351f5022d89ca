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


@pytest.mark.parametrize(
    ("lease_ms", "max_ms", "expected_s"),
    [(0, None, 1.0), (500, None, 1.0), (1000, None, 1.0), (2500, None, 2.5), (0, 4000, 4.0)],
)
def test_unset_it_is_the_larger_of_the_hosts_lease_and_the_default(
    lease_ms: int, max_ms: int | None, expected_s: float
) -> None:
    s = Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms)
    assert s.unrecorded_lease_s == expected_s


def test_a_lease_over_the_maximum_is_refused() -> None:
    with pytest.raises(ValidationError, match="read_lease_max_ms"):
        Settings(read_lease_ms=2000, read_lease_max_ms=1500)
    Settings(read_lease_ms=1500, read_lease_max_ms=1500)


async def test_a_host_hands_it_to_its_writers(tmp_path: Path) -> None:
    async with live_server(str(tmp_path / "s"), read_lease_ms=0, read_lease_max_ms=3000) as live:
        lease = live.server.manager._writer_options.lease
        assert (lease.read_lease_s, lease.unrecorded_lease_s) == (0.0, 3.0)
