"""Adversarial review of the issue-20 fixes on the compactor side (39f81b7, 4339322): two ways
they still broke, each reproduced here and now fixed (the tests pass).

1. **Prune ignored the store's one-second resolution.**  ``prune_versions`` compares two S3
   Last-Modified values (``stored_at`` of the install that superseded a version, and the newest
   Last-Modified under the collection), each truncated to a whole second, so their difference may
   be short of the real time by up to a second: a version was deleted up to 1 s inside the grace
   while a reader could still hold it.  Garbage collection allows for exactly this
   (``gc._LAST_MODIFIED_SLACK_S``); the pruner now does too (``LAST_MODIFIED_SLACK_S``: a file goes
   once the two differ by at least the grace plus a second).
2. **A take-over clock stamped while the member's wall clock ran ahead was believed.**  The
   scheduler keeps "stalled since" in the store (``compactors/progress/{member}.json``) on the
   member's wall clock, and a later round took the stored stamp as it was.  A member whose clock
   was ahead by D when it first saw a stalled collection (a pod rescheduled onto a node whose
   clock is off, a clock fixed by NTP) waited D more before it took that collection over, however
   long the owner had been stuck.  Now a stamp later than the member's present is clamped to it
   when loaded (and the clamped one saved) and whenever the clock is kept, as ``Liveness`` does
   with its ``since``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path

from compactor_client.fold import Row
from compactor_client.models import DirtyLog, DirtyResult
from compactor_client.scheduler import ProgressLedger, Scheduler, rank_of
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
from wal3.store import ObjectMeta

CID = "00000000-0000-4000-8000-0000000000b1"
ROWS = [Row(id="a", document="x", metadata={}, embedding=None)]


class S3SecondsStore(LocalStore):
    """The local store with S3's Last-Modified: whole seconds (the HTTP header's resolution)."""

    async def head(self, key: str) -> ObjectMeta:
        m = await super().head(key)
        return ObjectMeta(m.key, m.etag, m.size, float(math.floor(m.last_modified)))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        async for m in super().list(prefix, start_after=start_after):
            yield ObjectMeta(m.key, m.etag, m.size, float(math.floor(m.last_modified)))


async def _install(store: LocalStore, offset: int) -> CurrentVersion:
    base = await read_current(store, CID)
    pending = allocate_version(CID, base, token=f"t{offset}")
    await write_rows(store, pending, ROWS)
    out = await install_version(store, pending, offset=offset, rows=1)
    assert out.installed and out.current is not None
    return out.current


def _stored_at(store: LocalStore, key: str, when: float) -> None:
    """The store's (real, sub-second) time of an object's write."""
    os.utime(store.root / key, (when, when))  # type: ignore[attr-defined]


async def test_prune_allows_for_the_stores_one_second_resolution(tmp_path: Path) -> None:
    store = S3SecondsStore(tmp_path / "s")
    t = math.floor(time.time()) - 1000.0
    v1 = await _install(store, 10)
    reader = await read_current(store, CID)  # a reader holds v1's path ...
    assert reader is not None and reader.version == 1
    await _install(store, 20)
    _stored_at(store, current_key(CID), t + 0.9)  # ... until v2's install at t + 0.9 (store time)
    for key in [m.key async for m in store.list(f"compacted/{CID}/")]:
        if key != current_key(CID):
            _stored_at(store, key, t)  # the data files were written before
    cur = await _install(store, 30)  # v3, installed at t + 300.0 (the store's present)
    _stored_at(store, current_key(CID), t + 300.0)
    _stored_at(store, cur.path, t + 300.0)
    # Only 299.1 s have passed since v1 stopped being current.
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert v1.path not in report.deleted, report


# ------------------------------------------------------------------------------------- scheduler


class _Host:
    base_url = "http://h"

    def __init__(self, logs: list[DirtyLog]) -> None:
        self.logs = logs

    async def dirty(
        self, *, min_records: int | None = None, limit: int | None = None, retry: bool = True
    ) -> DirtyResult:
        return DirtyResult(server_id="h", logs=list(self.logs))


def _dirty(cid: str, start: int = 1) -> DirtyLog:
    return DirtyLog(
        tenant="t",
        collection_id=cid,
        start=start,
        limit=start + 100,
        num_records=100,
        first_insertion_us=0,
        reinsert_count=0,
        score=100.0,
    )


async def test_a_stall_stamp_from_a_fast_clock_does_not_delay_the_take_over(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    members = ["a", "b"]
    # A collection owned by b (alive, but stuck on it), for which a is next in line.
    cid = next(
        f"00000000-0000-4000-8000-{n:012x}"
        for n in range(1, 1000)
        if rank_of("a", f"00000000-0000-4000-8000-{n:012x}", members) == 1
    )
    host = _Host([_dirty(cid)])
    real = [1_800_000_000.0]
    skew = [86_400.0]  # a's node runs a day fast when a first sees the collection

    def clock() -> float:
        return real[0] + skew[0]

    def member() -> Scheduler:  # a --once round: a new process each time
        return Scheduler(
            [host],
            member_id="a",
            members=members,
            takeover_s=600.0,
            clock=clock,
            ledger=ProgressLedger(store, "a"),
        )

    assert (await member().select_round()).selected == []  # owned by b; the clock starts
    skew[0] = 0.0  # a is rescheduled onto a node with a correct clock (or NTP steps it back)
    for _ in range(10):
        real[0] += 600.0
        sel = await member().select_round()
    assert [c.log.collection_id for c in sel.selected] == [cid], (
        "b has been stuck on it for 100 minutes (10 x takeover_s); a still waits for a day"
    )
