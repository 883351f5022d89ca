"""A standalone collector's manifest edits are no take-over of the writer whose manifest they
edit (``lease_holder``, wal3/lease.py): the writer rebases onto them with no claim and no fence,
while a writer that did not write the edited manifest still claims and fences.  The adversarial
review of 741b3dd found every such rebase a claim and a whole fence: a collector editing a busy
log every second held its first append for 1,083 virtual seconds (``verify/liveness_probe.py``),
and every cut of ``loghost gc`` or another host cost the writer a fence."""

from __future__ import annotations

from dataclasses import dataclass, replace

from wal3 import LeaseOptions, LogWriter, LogWriterOptions, ObjectStore
from wal3.clock import Clock as SystemClock
from wal3.cursors import CursorStore
from wal3.gc import GarbageCollector, GcOptions
from wal3.layout import load_manifest
from wal3.manifest import MANIFEST_PATH
from wal3.paths import join

from .helpers import Clock, read_all

PREFIX = "logs/edited"


class Fenced(AssertionError):
    """The writer was about to wait out a take-over's fence."""


@dataclass(frozen=True, slots=True)
class NoFenceClock(SystemClock):
    """The system's clock, except that a wait as long as a fence fails the writer at once (a
    test that waited it out would take 37.5 s per fence)."""

    async def sleep(self, seconds: float) -> None:
        if seconds > 5.0:
            raise Fenced(f"asked to wait {seconds:.1f} s")
        await super().sleep(seconds)


def leased(name: str, clock: SystemClock | None = None) -> LogWriterOptions:
    return LogWriterOptions(
        writer_name=name,
        lease=LeaseOptions(read_lease_s=30.0),
        clock=clock if clock is not None else SystemClock(),
    )


async def test_a_standalone_collectors_cuts_never_fence_the_writer(store: ObjectStore) -> None:
    """Appends and whole GC passes of a standalone collector (its own compare-and-swap edits:
    announce, cut, clear) take turns.  Every append lands without a fence (with a 30 s lease a
    fence would be 37.5 s), the writer lost races to the collector (so it rebased onto its
    edits), and the collector did cut."""
    clock = Clock()
    w = await LogWriter.open(store, PREFIX, leased("w", NoFenceClock()))
    cursors = CursorStore(store, PREFIX, "compactor")
    gc = GarbageCollector(store, PREFIX, GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    await w.append(b"r0")
    await cursors.init("compaction", w.manifest.next_offset)
    for i in range(1, 9):
        await w.append(f"r{i}".encode())
        witness = await cursors.load("compaction")
        assert witness is not None
        await cursors.save("compaction", w.manifest.next_offset, witness)
        await gc.run_once()
        stored = await load_manifest(store, PREFIX)
        assert stored is not None
        assert stored[0].lease_holder == w._lease.holder  # carried over by every edit
    await w.append(b"last")
    assert w._lease.fence_until == float("-inf")
    assert w.stats["manifest_conflicts"] >= 1
    await w.close()
    loaded = await load_manifest(store, PREFIX)
    assert loaded is not None and loaded[0].oldest_offset > 1  # collected
    _, records = await read_all(store, PREFIX)
    assert [r.body for r in records][-2:] == [b"r8", b"last"]


async def test_a_collectors_edit_of_another_writers_manifest_still_fences(
    store: ObjectStore,
) -> None:
    """The edited manifest stood under another writer's lease: opening on it, and rebasing on a
    further edit of it, is a take-over (the fence is raised for the recorded lease)."""
    first = await LogWriter.open(store, PREFIX, leased("first"))
    await first.append(b"theirs")
    await first.close()
    loaded = await load_manifest(store, PREFIX)
    assert loaded is not None
    m, etag = loaded
    await store.put(
        join(PREFIX, MANIFEST_PATH),
        replace(m, writer="gc", acc_bytes=m.acc_bytes + 1).to_bytes(),
        if_match=etag,
    )
    second = await LogWriter.open(store, PREFIX, leased("second"))
    assert second._lease.fence_until > float("-inf")
    assert second._lease.takes_over(second.manifest, second._committer.etag)
    await second.close()
