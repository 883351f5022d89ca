"""A writer yields to another writer's edit that links nothing: a known liveness weakness of
``Lease.lost_to`` since 5b4145b (docs/RELIABILITY.md, the adversarial review of b755610).

``_claims`` takes a stored manifest under a third holder that ends at our base's tail for a
rival's claim, so that two writers stop claiming a log back from each other under a busy
collector.  But another writer's *edit-only* take-over (a GC announce through its
``edit_manifest``, as ``host/services/gc.py`` runs it on the host that does not hold the log
during a leader split) has the same shape, and the committer writes one only when it has nothing
ready to link (a take-over with batches ready writes a pure claim): the yield protects no fence,
and our next batch waits 1.25 x lease for nothing before its own claim fence.

The ``new`` case is a strict xfail until the rule can tell the two apart (a claim marker in the
manifest, or an edit-only take-over that keeps the base's holder); the ``old`` case runs the same
scenario under the exact-claim rule of c02f4a8, which acknowledges after its own fence alone, so
the test can pass.  Found by helper-4 (2026-12-07); manual clock, in-memory store, no threads.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

import pytest

import wal3.lease as lease_mod
from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions
from wal3.manifest import GcFloor, Manifest

from .test_committer_contract import PREFIX, FakeBatch, Rig, done, more_bytes, settle


def _exact_claims(current: Manifest, base: Manifest) -> bool:
    """c02f4a8's rule: a claim only of our exact base (same but for writer, lease and holder)."""
    same = replace(
        current,
        writer=base.writer,
        read_lease_ms=base.read_lease_ms,
        lease_holder=base.lease_holder,
    )
    return same == base


@pytest.mark.parametrize(
    "rule",
    [
        pytest.param(
            "new",
            marks=pytest.mark.xfail(
                strict=True, reason="lost_to yields to an edit-only take-over (RELIABILITY)"
            ),
        ),
        "old",
    ],
)
async def test_no_yield_to_another_writers_edit_that_links_nothing(
    rule: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if rule == "old":
        monkeypatch.setattr(lease_mod, "_claims", _exact_claims)
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))  # a manifest of ours: this writer held the log
    ours = rig.store.stored()
    assert ours.lease_holder == rig.lease.holder
    # B: another host's writer of the log, used only for GC through its edit_manifest.
    b = await LogWriter.open(
        rig.store,
        PREFIX,
        LogWriterOptions(
            writer_name="b",
            clock=rig.clock,
            batch=BatchOptions(interval_s=0),
            lease=LeaseOptions(read_lease_s=1.0),
        ),
    )
    floor = GcFloor(ours.oldest_offset, secrets.token_hex(16))
    await done(b.edit_manifest(lambda m: replace(m, gc_floor=floor)))  # a collector's announce
    stored = rig.store.stored()
    assert stored.lease_holder != ours.lease_holder and stored.same_tail(ours)
    assert b.outstanding_bytes == 0  # B has nothing it could ever link

    rig.in_flight(FakeBatch(3))  # our next batch is ready: its link fails, then we claim
    await settle()
    waited = 0.0
    while rig.batcher.acked[-1] != [3] and waited < 10:
        rig.clock.advance(0.25)
        waited += 0.25
        await settle()
    await done(b.close())
    await done(rig.close())
    # Our own claim's fence is 1.25 x 1 s; a yield to B would add as much again.
    assert rig.batcher.acked[-1] == [3]
    assert waited <= 1.25 + 0.25, f"acknowledged after {waited} s"
