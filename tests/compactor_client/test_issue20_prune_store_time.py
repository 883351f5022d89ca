"""Issue 20, finding r5 (was ``verify/repro/r5_prune_clock_skew.py``): the prune grace is dated by
the store's own clock (Last-Modified), never by an installing compactor's wall clock.

A compactor whose clock lags by 20 minutes installs v2; a correct one installs v3 a moment later
and prunes.  v1 stopped being current a moment ago, so a reader that read the old ``CURRENT.json``
must still find its file; before the fix v1 was deleted at once (its supersession was dated by
v2's skewed ``installed_at``).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from compactor_client.fold import Row
from compactor_client.versions import (
    CurrentVersion,
    allocate_version,
    current_key,
    install_version,
    prune_versions,
    read_current,
    write_rows,
)
from wal3.localstore import LocalStore

CID = "00000000-0000-4000-8000-0000000000aa"
ROWS = [Row(id="a", document="x", metadata={}, embedding=None)]


async def _install(store: LocalStore, installer_clock: float, offset: int) -> CurrentVersion:
    base = await read_current(store, CID)
    pending = allocate_version(CID, base, token=f"t{offset}")
    await write_rows(store, pending, ROWS)
    out = await install_version(store, pending, offset=offset, rows=1, now=installer_clock)
    assert out.installed and out.current is not None
    return out.current


def _age(store: LocalStore, key: str, seconds: float) -> None:
    """Make the store date an object ``seconds`` in the past (its Last-Modified)."""
    when = time.time() - seconds
    os.utime(store.root / key, (when, when))  # type: ignore[attr-defined]


async def test_a_slow_installer_clock_does_not_shorten_the_grace(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    real = time.time()
    await _install(store, real - 3600, 10)  # v1; its installer's clock says an hour ago
    reader = await read_current(store, CID)  # a reader holds v1's path
    assert reader is not None and reader.version == 1
    await _install(store, real - 1200, 20)  # v2, by a compactor whose clock is 20 min slow
    cur = await _install(store, real + 1, 30)  # v3, by a correct clock
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert reader.path not in report.deleted
    assert (await store.get(reader.path)).data  # the reader's read still works


async def test_the_grace_runs_on_the_stores_clock(tmp_path: Path) -> None:
    """Once the store dates v2's install (v1's supersession) past the grace, v1 goes, whatever
    the installers' clocks say (here they run an hour fast)."""
    store = LocalStore(tmp_path / "s")
    fast = time.time() + 3600
    v1 = await _install(store, fast, 10)
    await _install(store, fast + 1, 20)
    # The store wrote v2's CURRENT.json 400 s ago (as v3's installer reads it).
    _age(store, current_key(CID), 400.0)
    cur = await _install(store, fast + 2, 30)
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert report.deleted == [v1.path]
    # And with v2 installed only 200 s before v3 (by the store), v2 stays after v4.
    _age(store, current_key(CID), 200.0)
    cur = await _install(store, fast + 3, 40)
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert report.deleted == [] and report.deferred == 1
