"""Second adversarial review of the take-over claim (d65e5e5, its fixes of c8f3366's findings).

Each finding was ``xfail(strict=True)`` (33faae0) until fixed in the commit after it: every
manifest a writer puts records the base's lease when it takes the log over and, while it
fences, the lease what is left of its fence stands for (``Lease.stamped``), so 1 and 2 hold;
and a HEAD during which a put of ours was issued renews nothing (3).
Time is a manual clock; interleavings are forced with one-shot store gates and bounded polls
(no sleeps).  A (lease 2 s, or 1 s) holds the log, B takes it over, C takes over from B.

1. **A take-over write records the lease it fences for only if a fence is already running
   when it is stamped.**  ``stamped`` adds ``_carried_ms`` only while ``now < _fence_until``,
   but a take-over write's own fence is raised by ``landed`` *after* the put: the claim is
   stamped before it.  The fence B raised when it loaded A's manifest (at open) has passed by
   the time B claims if B opened the log more than ``1.25 x`` A's lease earlier (the log host
   opens a writer for a read; an append, or a tenure ``_refresh`` identity edit, comes later).
   A renews its lease with a HEAD just before B's claim lands; B's claim records only B's own
   lease (0.5 s, or 0); C takes over B's claim, fences 0.625 s (or, for 0, makes no claim at
   all: ``takes_over`` is false), links r2 and acknowledges it while A's lease, proven before
   B's claim landed, still answers without r2.  c8f3366's finding 1 again, one clock step
   later (the fixed test claims right after opening, inside the load's fence).
2. **``open(authored=...)`` hands on the fence but not the lease it is for.**  B (0.5 s)
   claims over A (2 s): its claim records 2000 ms, right.  B is closed and reopened in the same
   process (the host evicts idle writers and reopens with ``authored``): B2 adopts the claim,
   ``inherit_fence`` gives it B's fence, but ``_carried_ms`` is 0.  While still fencing, B2
   writes a manifest that links nothing (an edit: GC, a seal, a tenure refresh, a snapshot;
   only writes that link records wait the fence out), recording 500 ms.  C takes over that,
   fences 0.625 s, acknowledges r2 while A's lease still answers without it.
3. **A HEAD issued before a put that then fails re-vouches for the old manifest.**  The fix of
   c8f3366's finding 2 ends the lease when a put raises (``_lease_from = None``), but
   ``_confirm`` sets ``_lease_from = issued`` whenever the HEAD found the held etag, and checks
   whether a put was issued during the HEAD only when it found *another* etag.  A's lease ran
   out; a read renews it: the HEAD reads A's etag (M1), its answer is slow.  A's put of M2 (r2)
   lands, its answer is lost; B claims over M2 (a read of the store returns r2); A's put
   resolves as failed (``_lease_from = None``), and while the committer reloads (A is healthy,
   not yet recovering) the old HEAD's answer arrives: the lease is renewed from a proof that
   predates M2, and ``leased_manifest()`` answers M1, without r2: reads are not monotonic.

Under a scratch patch (a take-over write stamps max(own, base's recorded lease); the fence
handed on carries its lease; ``_confirm`` renews only if no put was issued during the HEAD)
all four tests pass.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from verify.testkit.polling import wait_until
from wal3 import LocalStore, LogWriter
from wal3.layout import load_manifest
from wal3.paths import MANIFEST_PATH
from wal3.store import ObjectMeta

from .test_claim_adversary import _build_on_the_lost_put, _LostAnswer, _no_lease_without_r2
from .test_read_lease import ManualClock, _opts


async def _stored(store: LocalStore, prefix: str) -> tuple[str, int | None, int]:
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    m = loaded[0]
    return m.writer, m.read_lease_ms, m.next_offset


async def _a_never_misses(
    clock: ManualClock, a: LogWriter, c: LogWriter, acked: asyncio.Task, offset: int
) -> None:
    """Move the clock 0.1 s at a time until C acknowledged the record at ``offset``: once it
    did, A's lease must not answer without it.  Each step lets C run until it acknowledged or
    waits for its fence (the clock moves only here)."""
    await wait_until(lambda: c.authored or acked.done(), "C's take-over write landed")
    for _ in range(40):  # 4 s of the manual clock: past every fence here
        await wait_until(lambda: acked.done() or c.fencing, "C acknowledged or fences")
        if acked.done():
            break
        clock.advance(0.1)
    assert (await asyncio.wait_for(acked, 10)).offset == offset
    m = a.current_manifest()  # the clock has not moved since the acknowledgement
    assert m is None or m.next_offset > offset, (
        f"A's lease answers up to {m.next_offset} at +{clock.monotonic() - 1000.0:.2f} s, "
        f"but offset {offset} was acknowledged"
    )


@pytest.mark.parametrize("claimer_lease", [0.5, 0.0])
async def test_a_late_claim_records_the_lease_it_takes_over_from(
    tmp_path: Path, claimer_lease: float
) -> None:
    store = LocalStore(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/x", _opts(clock, "A", lease_s=2.0))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/x", _opts(clock, "B", lease_s=claimer_lease))
    clock.advance(3.0)  # B's fence from its load (2.5 s) passes; A renews its lease
    assert await a.confirm_lease()
    await b.claim()  # stamped after B's fence from its load passed: B's own lease only
    assert (await _stored(store, "logs/x"))[0] == "B"  # today it records claimer_lease only
    c = await LogWriter.open(store, "logs/x", _opts(clock, "C", lease_s=0.5))
    acked = asyncio.create_task(c.append(b"r2"))

    await _a_never_misses(clock, a, c, acked, 2)
    for w in (a, b, c):
        await w.close()


async def test_a_reopened_writer_records_the_lease_its_inherited_fence_is_for(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "store")
    clock = ManualClock()
    a = await LogWriter.open(store, "logs/y", _opts(clock, "A", lease_s=2.0))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/y", _opts(clock, "B", lease_s=0.5))
    await b.claim()
    writer, recorded, nxt = await _stored(store, "logs/y")
    assert (writer, nxt) == ("B", 2) and recorded is not None and recorded >= 2000  # fenced for
    await b.close()
    mine = b.authored_etag
    assert mine is not None
    b2 = await LogWriter.open(store, "logs/y", _opts(clock, "B", lease_s=0.5), authored=mine)
    assert b2.fencing
    await b2.edit_manifest(lambda m: m)  # links nothing: no wait for the fence
    assert (await _stored(store, "logs/y"))[0] == "B"  # today recording 500 ms, not 2000
    c = await LogWriter.open(store, "logs/y", _opts(clock, "C", lease_s=0.5))
    acked = asyncio.create_task(c.append(b"r2"))

    await _a_never_misses(clock, a, c, acked, 2)
    for w in (a, b2, c):
        await w.close()


class _Gated(_LostAnswer):
    """``_LostAnswer`` (a manifest put that lands and then loses its answer, a held manifest
    load) with one more one-shot gate: the next HEAD of the manifest reads its etag and then
    holds its answer (``head_read``, until ``head_release``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.hold_head = False
        self.head_read = asyncio.Event()
        self.head_release = asyncio.Event()

    async def head(self, key: str) -> ObjectMeta:
        meta = await super().head(key)
        if self.hold_head and key.endswith(MANIFEST_PATH):
            self.hold_head = False
            self.head_read.set()
            await self.head_release.wait()
        return meta


async def test_a_head_older_than_a_failed_put_does_not_renew_the_lease(tmp_path: Path) -> None:
    clock = ManualClock()
    store = _Gated(tmp_path / "store")
    raw = LocalStore(tmp_path / "store")
    a = await LogWriter.open(store, "logs/h", _opts(clock, "A"))
    await a.append(b"r1")
    clock.advance(1.0)  # A's lease ran out: a read renews it with a HEAD
    assert a.current_manifest() is None
    store.hold_head = True
    renewing = asyncio.create_task(a.confirm_lease())
    await store.head_read.wait()  # the HEAD saw A's manifest (r1); its answer is on the way
    store.lose = True
    t = asyncio.create_task(a.append(b"r2"))
    await store.landed.wait()  # r2's manifest landed; its answer is lost
    b = await _build_on_the_lost_put(store, raw, clock, "logs/h")
    # The put raised (``_lease_from = None``); the reload is held.
    store.head_release.set()  # the HEAD issued before the put answers: A's etag
    await renewing  # was True: renewed from a proof that predates M2
    await _no_lease_without_r2(store, clock, a, b, t)
