"""Fourth adversarial review: the collector re-announcing a lost floor (00645e2) and the fence
for a manifest that records no lease (b12d007).

What held up is in the review report; what did not was reproduced here, ``xfail(strict=True)``
(8fa4a95), until fixed in the commit after it: ``Settings`` refuses both.  Time is a manual
clock; nothing sleeps.

1. **The GC grace assumption is not enforced, and b12d007 adds a lease nobody configured.**
   RELIABILITY.md: "the GC grace must exceed a recovery's yield and fence, 2.5 x the longest
   read lease".  Since b12d007 a take-over of a manifest without ``read_lease_ms`` (any manifest
   a Rust writer wrote) yields and fences for ``unrecorded_lease_s``, which is at least 1 s even
   on a host at ``LOGHOST_READ_LEASE_MS=0`` (whose operator was told "0: nothing waits"), and is
   unbounded when ``LOGHOST_READ_LEASE_MAX_MS`` is set.  ``Settings`` checks neither against
   ``LOGHOST_GC_GRACE_S``: a host at lease 0 with a 2 s grace (fine before b12d007: it never
   fenced), or one with ``read_lease_max_ms`` = 300000 and the default 300 s grace, is accepted,
   and its recoveries may hold their first load across a yield and a fence longer than the
   collector's grace (the failure c8f3366's third finding describes: the walk finds a deleted
   snapshot and the writer dies).
2. **A host lease above 1 s without ``LOGHOST_READ_LEASE_MAX_MS`` is accepted.**  The docs say
   "to give any host a lease above 1 s, first set LOGHOST_READ_LEASE_MAX_MS on every host", but
   a host at ``read_lease_ms=2000`` with the maximum unset validates (it assumes its own 2 s),
   while every peer left at the defaults assumes 1 s for a manifest that records no lease.  Two
   hosts whose settings both pass validation: A (2000) leases its manifest, a Rust-style write
   drops the field, C (defaults) takes over, fences 1.25 s, acknowledges r2 while A's lease
   still answers without it: the third round's stale read (42aa49e), under accepted settings.
   The one host that can tell the procedure was skipped (its own lease is above the default
   maximum and it names no maximum) is the one that does not refuse to start.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pydantic import ValidationError

from host.config import Settings
from host.manager import lease_options
from wal3 import LocalStore, LogWriter
from wal3.options import BatchOptions, LogWriterOptions

from .test_lease_adversary2 import _a_never_misses
from .test_lease_adversary3 import _rust_style_edit
from .test_read_lease import ManualClock


def _host_opts(clock: ManualClock, name: str, s: Settings) -> LogWriterOptions:
    """A writer's options with the lease the log host derives from its settings."""
    return LogWriterOptions(
        writer_name=name, clock=clock, batch=BatchOptions(interval_s=0), lease=lease_options(s)
    )


@pytest.mark.parametrize(
    ("lease_ms", "max_ms", "grace_s"),
    [(0, 1000, 2.0), (1000, 300_000, 300.0)],
    ids=["lease-0-grace-2s", "max-300s-grace-300s"],
)
def test_accepted_settings_keep_the_gc_grace_above_every_yield_and_fence(
    lease_ms: int, max_ms: int, grace_s: float
) -> None:
    """Finding 1: such settings were accepted; now they are refused, and what is accepted keeps
    the grace above a recovery's yield and fence on a manifest recording no lease."""
    with pytest.raises(ValidationError, match="gc_grace_s"):
        Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms, gc_grace_s=grace_s)
    s = Settings(read_lease_ms=lease_ms, read_lease_max_ms=max_ms, gc_grace_s=2.5 * max_ms)
    longest = max(s.read_lease_ms / 1000.0, s.unrecorded_lease_s)
    assert s.gc_grace_s > 2.5 * longest


async def test_validated_hosts_never_miss_an_acknowledged_record(tmp_path: Path) -> None:
    """Finding 2: a host at 2 s with the maximum unset validated beside peers at the defaults
    (assuming 1 s for a manifest that records none), and read stale.  It is refused now; with
    the maximum raised on both hosts, as the setting says, the peer fences for A's lease."""
    with pytest.raises(ValidationError, match="read_lease_max_ms"):
        Settings(read_lease_ms=2000)
    a_settings = Settings(read_lease_ms=2000, read_lease_max_ms=2000)
    c_settings = Settings(read_lease_max_ms=2000)  # a peer at the default lease
    assert c_settings.unrecorded_lease_s == 2.0
    store = LocalStore(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/v", _host_opts(clock, "A", a_settings))
    await a.append(b"r1")  # A's lease on its manifest: 2 s from now
    assert a.current_manifest() is not None
    await _rust_style_edit(store, "logs/v")
    c = await LogWriter.open(store, "logs/v", _host_opts(clock, "C", c_settings))
    acked = asyncio.create_task(c.append(b"r2"))

    await _a_never_misses(clock, a, c, acked, 2)
    for w in (a, c):
        await w.close()
