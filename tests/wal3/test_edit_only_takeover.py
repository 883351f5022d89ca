"""A writer's edit of a manifest another writer holds is written as a collector's, not as a take-
over (the adversarial review of b755610, docs/RELIABILITY.md).

Before, such an edit (a GC announce through ``edit_manifest`` on the host that does not hold the
log, during a leader split) was put under the editing writer's own holder token.  The holder then
took it for a rival's claim (``Lease.lost_to``'s third-holder rule) and left its own log alone for
1.25 x lease before claiming it back and fencing again: its next batch was acknowledged after
2.5 s of virtual time instead of at once, for a fence that protected nothing (the edit links no
record).  Now the edit keeps the holder's token and recorded lease, the holder rebases onto it
with no fence, and the editor gains no authorship: its own appends still claim the log and fence.

Manual clock, in-memory store, no threads (helper-4's virtual-time finding, 2026-12-07).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable
from dataclasses import replace

from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions
from wal3.errors import StoreUnavailable
from wal3.manifest import GcFloor

from .test_committer_contract import (
    MANIFEST_RX,
    PREFIX,
    FakeBatch,
    ManualClock,
    MemStore,
    Rig,
    done,
    more_bytes,
    settle,
)


async def _other_writer(rig: Rig) -> LogWriter:
    """B: another host's writer of the log (the one that does not hold it)."""
    return await LogWriter.open(
        rig.store,
        PREFIX,
        LogWriterOptions(
            writer_name="b",
            clock=rig.clock,
            batch=BatchOptions(interval_s=0),
            lease=LeaseOptions(read_lease_s=1.0),
        ),
    )


async def test_the_holder_goes_on_at_once_after_another_writers_edit() -> None:
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))  # a manifest of ours: this writer holds the log
    ours = rig.store.stored()
    assert ours.lease_holder == rig.lease.holder
    b = await _other_writer(rig)
    floor = GcFloor(ours.oldest_offset, secrets.token_hex(16))
    await done(b.edit_manifest(lambda m: replace(m, gc_floor=floor)))  # a collector's announce
    stored = rig.store.stored()
    assert stored.gc_floor == floor and stored.same_tail(ours)
    # Written as a collector's: our holder and our recorded lease, and B leases nothing.
    assert stored.lease_holder == ours.lease_holder
    assert stored.read_lease_ms == ours.read_lease_ms
    assert stored.writer == ours.writer
    assert not b.authored and b.current_manifest() is None

    rig.in_flight(FakeBatch(3))  # our next batch: its link fails on B's edit, then rebases
    await settle()
    waited = 0.0
    while rig.batcher.acked[-1:] != [[3]] and waited < 10:
        rig.clock.advance(0.25)
        waited += 0.25
        await settle()
    await done(b.close())
    await done(rig.close())
    # No yield and no fence: the edit is no take-over (before the fix: 2.5 s).
    assert rig.batcher.acked[-1] == [3]
    assert waited == 0.0, f"acknowledged after {waited} s"
    assert rig.store.stored().gc_floor == floor  # rebased onto the edit, not over it


async def test_the_editor_still_claims_before_it_appends() -> None:
    """The safety half: an editor that gained no authorship links records only on a claim of
    its own, once its fence (1.25 x the holder's recorded lease) has passed."""
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))
    holder = rig.lease.holder
    b = await _other_writer(rig)
    floor = GcFloor(rig.store.stored().oldest_offset, secrets.token_hex(16))
    await done(b.edit_manifest(lambda m: replace(m, gc_floor=floor)))
    edited = rig.store.stored()
    assert edited.lease_holder == holder and not b.authored

    appended = asyncio.ensure_future(b.append_many([b"x"]))
    await settle()
    claim = rig.store.stored()
    assert claim.lease_holder not in (None, holder) and claim.same_tail(edited)
    assert claim.gc_floor == floor  # the claim links nothing and changes nothing else
    assert not appended.done()  # fenced: the holder's lease may still vouch for its manifest
    rig.clock.advance(1.0)
    await settle()
    assert not appended.done()
    rig.clock.advance(0.5)
    await settle()
    assert appended.done()
    linked = rig.store.stored()
    assert appended.result().first_offset == edited.next_offset == linked.next_offset - 1
    assert linked.lease_holder == claim.lease_holder
    await done(b.close())
    await done(rig.close())


async def test_claim_writes_under_our_holder_and_confirm_writes_our_own_back() -> None:
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))
    b = await _other_writer(rig)
    holder = rig.lease.holder
    puts = len(rig.store.puts(MANIFEST_RX))
    await done(b.claim())  # a take-over: a claim under B's holder, fenced
    claimed = rig.store.stored()
    assert claimed.lease_holder not in (None, holder)
    assert b.authored and b.fencing
    assert len(rig.store.puts(MANIFEST_RX)) == puts + 1
    await done(b.claim())  # B's own manifest now: nothing written
    assert len(rig.store.puts(MANIFEST_RX)) == puts + 1
    await done(b.claim(confirm=True))  # written back all the same, still B's
    assert len(rig.store.puts(MANIFEST_RX)) == puts + 2 and b.authored
    assert rig.store.stored().lease_holder == claimed.lease_holder
    await done(b.close())
    await done(rig.close())


def _writer(store: MemStore, clock: ManualClock, name: str) -> Awaitable[LogWriter]:
    return LogWriter.open(
        store,
        PREFIX,
        LogWriterOptions(
            writer_name=name,
            clock=clock,
            batch=BatchOptions(interval_s=0),
            lease=LeaseOptions(read_lease_s=1.0),
        ),
    )


async def test_an_editor_that_lost_links_no_orphan_over_the_holders_lease() -> None:
    """An edit that lost to a moved tail recovers without taking the log over: the orphan after
    the tail is most likely the holder's next fragment, its manifest write on the way.  Linking
    it would mean a claim and a fence, and the holder claiming back (the simulator's edit-only
    phase, seed 135, on the first version of the fix: 5.3 s appends on a held log)."""
    clock, store = ManualClock(), MemStore()
    a = await done(_writer(store, clock, "a"))
    clock.advance(2.0)  # past the create's fence
    await done(a.append_many([b"x1"]))
    b = await done(_writer(store, clock, "b"))  # B's memory: the log with x1
    await done(a.append_many([b"x2"]))  # the tail moves on: B's memory is stale
    holder = store.stored().lease_holder
    gate = store.hold("put", MANIFEST_RX)  # A's next fragment lands, its manifest waits
    x3 = asyncio.ensure_future(a.append_many([b"x3"]))
    await done(gate.reached.wait())
    orphan_seq = store.stored().next_seq_no
    floor = GcFloor(store.stored().oldest_offset, secrets.token_hex(16))
    edited = await done(b.edit_manifest(lambda m: replace(m, gc_floor=floor)))
    stored = store.stored()
    assert stored.gc_floor == floor and edited.next_seq_no == orphan_seq  # x3 not linked by B
    assert stored.lease_holder == holder and not b.authored
    gate.release.set()
    await settle()
    assert x3.done() and x3.result().first_offset == 3  # no fence: A still holds its log
    assert store.stored().lease_holder == holder
    await done(b.close())
    await done(a.close())


async def test_a_collectors_write_keeps_the_holders_name() -> None:
    """A snapshot or seal an editor links names the editor (``with_snapshot``, ``with_sealed``);
    written as a collector's it must keep the holder's name, or a later writer of the editor's
    process would adopt the manifest by its unique name as its own and lease it while the
    holder, seeing its token, links on it unfenced (helper-5's review of ceff69c: a record
    acknowledged by the holder missing from the reopened editor's leased answer)."""
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))
    ours = rig.store.stored()
    b = await _other_writer(rig)
    named = replace(ours, writer="b", lease_holder="0123456789abcdef", read_lease_ms=5)
    kept = b._lease.as_collector(named, ours)
    assert (kept.writer, kept.lease_holder, kept.read_lease_ms) == (
        ours.writer,
        ours.lease_holder,
        ours.read_lease_ms,
    )
    await done(b.close())
    await done(rig.close())


async def test_an_idle_editors_error_recovery_links_no_orphan_over_the_holders_lease() -> None:
    """The same after a store error instead of a lost race (helper-7's review of 3225561): the
    editor's announce fails four times (the last fault), and while its recovery reads the log the
    holder links x2 and uploads x3.  The recovery linked x3 under a claim of its own, so the
    holder, which had appended after the faults stopped, was fenced again (x3 acknowledged after
    2.75 s of virtual time, x4 after 1.5 s more).  Now it links nothing of the holder's."""
    clock, store = ManualClock(), MemStore()
    a = await done(_writer(store, clock, "a"))
    clock.advance(2.0)  # past the create's fence
    await done(a.append_many([b"x1"]))
    b = await done(_writer(store, clock, "b"))
    holder = store.stored().lease_holder
    store.fail("put", MANIFEST_RX, lambda: StoreUnavailable("boom"), times=4)
    load = store.hold("get", MANIFEST_RX)  # B's recovery reads the log: held
    floor = GcFloor(1, secrets.token_hex(16))
    edit = asyncio.ensure_future(b.edit_manifest(lambda m: replace(m, gc_floor=floor)))
    await done(load.reached.wait())
    await done(a.append_many([b"x2"]))  # after the last fault
    fence = a.fence_until
    put = store.hold("put", MANIFEST_RX)  # x3's fragment lands, its manifest waits
    x3 = asyncio.ensure_future(a.append_many([b"x3"]))
    await done(put.reached.wait())
    load.release.set()
    await done(edit)  # B's announce lands on the log as it stands, x3 not linked
    assert store.stored().gc_floor == floor and store.stored().next_offset == 3
    assert store.stored().lease_holder == holder and not b.authored
    put.release.set()
    await settle()
    assert x3.done() and x3.result().first_offset == 3  # no clock moved: no fence
    x4 = await done(a.append_many([b"x4"]))
    assert x4.first_offset == 4 and a.fence_until == fence
    assert store.stored().lease_holder == holder
    await done(b.close())
    await done(a.close())
