"""Third adversarial review of the read leases and take-over claims (d65e5e5, b94dfdf).

Each finding was ``xfail(strict=True)`` (42aa49e) until fixed in the commit after it: the
invariant's own assertion failed on b94dfdf's engine.  Time is a manual clock; interleavings are
forced with store gates (no sleeps).

1. **A manifest write by a Rust-style writer erases the lease a take-over must fence for.**
   The fence is "for the lease recorded in the base" (``read_lease_ms``), and a base without the
   field is fenced for the *taker's own* setting.  But the field is written by the author of a
   leased manifest and is dropped by any writer that does not know it: Rust's collector (the
   engine keeps its garbage file decodable by Rust precisely because that collector runs on these
   logs) decodes the manifest, cuts, and writes it back without the extension field.  A (lease
   2 s) leases its manifest M_A (recording 2000 ms); the Rust-style edit lands on M_A, dropping
   the field; C (0.5 s, or 0: "one host at 0") takes the edit over and fences for its own
   setting only (0.625 s, or nothing at all: ``takes_over`` is false, r2 is linked by the first
   write), links r2 and acknowledges it while A's lease, proven before the edit landed, still
   answers M_A without r2.  DESIGN.md promises "hosts configured differently (a rolling change,
   one host at 0) never read stale"; its caveat (upgrade with equal settings) covers manifests
   *authored* by older versions, not a loghost-authored lease whose record a third party erased.
   (With equal settings the taker's own fence covers A's lease, so only the mix breaks.)
   Fixed: a base recording no lease is fenced for ``LeaseOptions.unrecorded_lease_s``, the
   longest lease any writer of the log holds (the host's ``LOGHOST_READ_LEASE_MAX_MS``).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import LocalStore, LogWriter
from wal3.layout import load_manifest
from wal3.paths import MANIFEST_PATH, join

from .test_lease_adversary2 import _a_never_misses
from .test_read_lease import ManualClock, _opts


async def _rust_style_edit(store: LocalStore, prefix: str) -> None:
    """A manifest write by a writer that does not know ``read_lease_ms`` (Rust's collector, a
    loghost version before the field): the manifest decoded, written back under its own name
    without the extension field (a cut would change more; nothing else matters here)."""
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    m, etag = loaded
    assert m.read_lease_ms is not None and m.read_lease_ms > 1000  # A recorded its lease ...
    edited = replace(m, writer="rust-gc", read_lease_ms=None)  # ... which Rust drops
    await store.put(join(prefix, MANIFEST_PATH), edited.to_bytes(), if_match=etag)


@pytest.mark.parametrize("taker_lease", [0.5, 0.0])
async def test_a_rust_style_edit_does_not_shorten_the_fence_of_the_next_take_over(
    tmp_path: Path, taker_lease: float
) -> None:
    store = LocalStore(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/r", _opts(clock, "A", lease_s=2.0))
    await a.append(b"r1")  # A's lease on M_A: 2 s from now
    assert a.current_manifest() is not None
    await _rust_style_edit(store, "logs/r")
    # C is configured as a host is: the longest lease of any writer (A's) is known to it.
    opts = _opts(clock, "C", lease_s=taker_lease)
    opts = replace(opts, lease=replace(opts.lease, unrecorded_lease_s=2.0))
    c = await LogWriter.open(store, "logs/r", opts)
    acked = asyncio.create_task(c.append(b"r2"))

    await _a_never_misses(clock, a, c, acked, 2)
    for w in (a, c):
        await w.close()
