"""``Lease`` (wal3/lease.py) rule by rule, driven directly on a manual clock: what a lease is
worth and when it is none, how a renewal is shared and answered, and how long a fence is.
Written against the mutation run of the module (docs/RELIABILITY.md); the writer-level cases are
tests/wal3/test_read_lease.py."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import pytest

from wal3 import LeaseOptions, LogWriterOptions
from wal3.errors import StoreUnavailable
from wal3.lease import Lease
from wal3.localstore import LocalStore
from wal3.manifest import Manifest
from wal3.paths import MANIFEST_PATH, join
from wal3.store import ObjectMeta

from .test_read_lease import ManualClock

PREFIX = "t/log"
KEY = join(PREFIX, MANIFEST_PATH)


class HookedStore(LocalStore):
    """A local store whose HEADs can be made to fail, or to run a step before they answer."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.heads = 0
        self.fail_heads = False
        self.during_head: Callable[[], Awaitable[None]] | None = None

    async def head(self, key: str) -> ObjectMeta:
        self.heads += 1
        if self.fail_heads:
            raise StoreUnavailable("head refused")
        if self.during_head is not None:
            step, self.during_head = self.during_head, None
            await step()
        return await super().head(key)


class World:
    def __init__(self, tmp: Path, lease_s: float = 1.0) -> None:
        self.clock = ManualClock()
        self.store = HookedStore(tmp)
        self.healthy = True
        self.held: tuple[Manifest, str] = (Manifest.empty("w"), "")
        opts = LogWriterOptions(
            writer_name="w", clock=self.clock, lease=LeaseOptions(read_lease_s=lease_s)
        )
        self.lease = Lease(
            self.store, PREFIX, opts, held=lambda: self.held, healthy=lambda: self.healthy
        )

    def manifest(self, recorded_ms: int | None, writer: str = "w") -> Manifest:
        return replace(Manifest.empty(writer), read_lease_ms=recorded_ms)

    async def write(self, m: Manifest, base: str | None = None) -> str:
        """Our put of ``m`` (created, or over ``base``), landed and held."""
        issued = self.clock.monotonic()
        if base is None:
            etag = await self.store.put(KEY, m.to_bytes(), if_none_match="*")
        else:
            etag = await self.lease.put(m, base)
        self.lease.landed(base, etag, issued, None)
        self.held = (m, etag)
        return etag

    async def foreign(self, m: Manifest) -> str:
        """Another writer replaces the stored manifest."""
        return await self.store.put(KEY, m.to_bytes())


async def test_a_lease_is_worth_what_the_manifest_records_at_most(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=5.0)
    await w.write(w.manifest(2000))
    assert w.lease.remaining() == 2.0  # recorded 2 s, own setting 5 s: the recorded one
    w.clock.advance(0.5)
    assert w.lease.remaining() == 1.5
    w.healthy = False
    assert w.lease.remaining() == 0.0  # a writer that cannot vouch has no lease
    w.healthy = True
    w.held = (w.held[0], '"someone-elses"')
    assert w.lease.remaining() == 0.0  # not the manifest we wrote


async def test_a_manifest_recording_no_lease_gives_none(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.write(w.manifest(None))
    assert w.lease.remaining() == 0.0


async def test_no_renewal_without_a_lease_setting(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=0.0)
    await w.write(w.manifest(0))
    assert w.lease.authored(w.held[1])
    assert await w.lease.confirm() is False
    assert w.store.heads == 0


async def test_concurrent_renewals_share_one_head_and_later_ones_ask_again(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    await w.write(w.manifest(1000))
    w.clock.advance(0.9)
    assert await asyncio.gather(w.lease.confirm(), w.lease.confirm()) == [True, True]
    assert w.store.heads == 1
    assert w.lease.remaining() == pytest.approx(1.0)
    await w.foreign(w.manifest(1000, writer="other"))
    assert await w.lease.confirm() is False  # a new HEAD, not the finished one's answer
    assert w.store.heads == 2
    assert w.lease.remaining() == 0.0 and not w.lease.authored(w.held[1])


async def test_a_renewal_the_store_does_not_answer_is_no_renewal(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.write(w.manifest(1000))
    w.store.fail_heads = True
    assert await w.lease.confirm() is False
    assert w.lease.authored(w.held[1])  # nothing learned: authorship stays


async def test_our_own_put_during_a_renewal_keeps_authorship_without_a_lease(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))
    etag = await w.write(replace(w.manifest(1000), acc_bytes=3), base=etag)  # not our first put
    w.clock.advance(2.0)

    async def our_put_lands() -> None:  # issued after the HEAD: the writer's answer not back
        await w.lease.put(replace(w.manifest(1000), acc_bytes=7), etag)

    w.store.during_head = our_put_lands
    assert await w.lease.confirm() is False
    assert w.lease.authored(etag)  # maybe our own next manifest: never fence ourselves


@pytest.mark.parametrize(("late", "expected"), [(0.0, True), (2.0, False)])
async def test_a_write_of_ours_during_a_renewal_answers_for_it(
    tmp_path: Path, late: float, expected: bool
) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))
    w.clock.advance(2.0)

    async def we_write_again() -> None:
        await w.write(replace(w.manifest(1000), acc_bytes=1), base=etag)
        w.clock.advance(late)

    w.store.during_head = we_write_again
    # Our write proves the lease (for 1 s from its issue), as long as it still runs.
    assert await w.lease.confirm() is expected
    assert w.lease.remaining() == (1.0 - late if expected else 0.0)


async def test_a_renewal_never_moves_the_lease_back(tmp_path: Path) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))

    async def proven_later_meanwhile() -> None:
        w.clock.advance(0.5)
        w.lease.adopt(etag, w.clock.monotonic())

    w.store.during_head = proven_later_meanwhile
    assert await w.lease.confirm() is True
    assert w.lease.remaining() == 1.0  # from the later proof, not from the HEAD's issue


async def test_a_fence_is_for_the_lease_the_base_records(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=1.0)
    now = w.clock.monotonic()
    w.lease.note_load(w.manifest(3000, writer="other"), '"theirs"')
    assert w.lease.fence_until == now + 1.25 * 3.0  # theirs, not our 1 s
    w.lease.note_load(w.manifest(None, writer="rust"), '"rust"')
    assert w.lease.fence_until == now + 1.25 * 3.0  # a shorter fence never shortens it


async def test_a_base_recording_no_lease_is_fenced_for_our_own(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=2.0)
    now = w.clock.monotonic()
    w.lease.note_load(w.manifest(None, writer="rust"), '"rust"')
    assert w.lease.fence_until == now + 1.25 * 2.0


async def test_a_base_leased_for_nothing_raises_no_fence(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=0.0)
    w.lease.note_load(w.manifest(0, writer="other"), '"theirs"')
    assert w.lease.fence_until == float("-inf")
    await w.lease.wait_fence()  # returns at once


async def test_a_load_fences_what_others_wrote_and_not_what_we_wrote(tmp_path: Path) -> None:
    w = World(tmp_path)
    now = w.clock.monotonic()
    await w.write(w.manifest(1000))
    loaded = await w.lease.load()
    assert loaded is not None and loaded[1] == w.held[1]
    assert w.lease.fence_until == float("-inf")  # our own manifest: no take-over
    await w.foreign(w.manifest(2000, writer="other"))
    loaded = await w.lease.load()
    assert loaded is not None and loaded[0].writer == "other"
    assert w.lease.fence_until == now + 1.25 * 2.0  # theirs: answers wait out their lease


async def test_note_load_of_our_own_etag_raises_no_fence(tmp_path: Path) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))
    w.lease.note_load(w.manifest(1000), f'"{etag.strip(chr(34))}"')  # quoted or not: ours
    assert w.lease.fence_until == float("-inf")


def test_bare_etag_strips_only_the_quotes_s3_adds() -> None:
    from wal3.lease import bare_etag

    assert bare_etag('"9e107d9d372bb6826bd81d3542a419d6"') == "9e107d9d372bb6826bd81d3542a419d6"
    assert bare_etag("9e107d9d372bb6826bd81d3542a419d6") == "9e107d9d372bb6826bd81d3542a419d6"
    assert bare_etag(' "x" ') == ' "x" '  # not whitespace: S3 never pads, so nothing to strip


async def test_concurrent_puts_are_each_counted_in_flight(tmp_path: Path) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))
    results = await asyncio.gather(
        w.lease.put(replace(w.manifest(1000), acc_bytes=1), etag),
        w.lease.put(replace(w.manifest(1000), acc_bytes=2), etag),
        return_exceptions=True,
    )
    assert sum(isinstance(r, str) for r in results) == 1  # one If-Match wins
    # Nothing in flight any more: a HEAD finding someone else's manifest drops authorship.
    await w.foreign(w.manifest(1000, writer="other"))
    assert await w.lease.confirm() is False
    assert not w.lease.authored(w.held[1])


@pytest.mark.parametrize(("lease_s", "recorded"), [(1.0, None), (1.0, 5000), (0.25, 0), (0.0, 7)])
async def test_every_manifest_we_put_records_our_lease(
    tmp_path: Path, lease_s: float, recorded: int | None
) -> None:
    # Whatever the manifest carried (Rust's none, another writer's), ours records our setting.
    w = World(tmp_path, lease_s=lease_s)
    m = w.lease.stamped(w.manifest(recorded, writer="other"))
    assert m.read_lease_ms == round(lease_s * 1000)
    assert m.lease_holder == w.lease.holder and w.lease.holds(m)
    same = replace(w.manifest(round(lease_s * 1000)), lease_holder=w.lease.holder)
    assert w.lease.stamped(same) is same
    # Another writer's holder (or none) is replaced by ours, whatever else matches.
    for other in (None, "0" * 16):
        theirs = replace(same, lease_holder=other)
        assert not w.lease.holds(theirs)
        assert w.lease.stamped(theirs) == same


async def test_landing_on_our_own_base_is_no_take_over(tmp_path: Path) -> None:
    w = World(tmp_path)
    now = w.clock.monotonic()
    w.lease.landed(None, "e1", now - 0.25, None)  # created: nobody could lease it before
    assert w.lease.fence_until == float("-inf") and w.lease.authored('"e1"')
    w.held = (w.manifest(1000), "e1")
    assert w.lease.remaining() == 0.75  # from the write's issue, not its answer
    w.lease.landed('"e1"', "e2", now, w.manifest(1000))  # on our own (quoted as S3 does)
    assert w.lease.fence_until == float("-inf")
    assert w.lease.authored("e2") and not w.lease.authored("e1")


async def test_landing_on_another_writers_base_waits_out_its_lease(tmp_path: Path) -> None:
    w = World(tmp_path)
    now = w.clock.monotonic()
    w.lease.landed("e1", "e2", now, w.manifest(2000, writer="other"))  # authored nothing yet
    assert w.lease.fence_until == now + 1.25 * 2.0
    w.lease.landed("e9", "e3", now, w.manifest(4000, writer="other"))  # not ours either
    assert w.lease.fence_until == now + 1.25 * 4.0
    w.clock.advance(4.5)  # half a second of the fence left: still waited out
    waiting = asyncio.ensure_future(w.lease.wait_fence())
    for _ in range(5):
        await asyncio.sleep(0)
    w.clock.advance(0.4)
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    w.clock.advance(0.1)
    await asyncio.wait_for(waiting, 5)


@pytest.mark.parametrize("whose", ["theirs", "ours", "held"])
async def test_a_take_over_put_that_raises_raises_the_fence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, whose: str
) -> None:
    """A put may land although it raised (its answer lost), recording our holder token: if it
    took the log over, the fence for its base's lease starts at once, as ``landed`` would have
    started it, or a later load of it (held: no fence) would link at once while the old holder's
    lease still answers (the adversarial review of 53ad3c8, finding 1;
    tests/wal3/test_holder_adversary.py).  On a base of our own, or one we hold, nothing is
    taken over: no fence.  Fails with the fence in ``put``'s failure path dropped (theirs), or
    raised always (ours, held)."""
    w = World(tmp_path)
    base_etag = await w.write(w.manifest(1000))  # ours
    base = w.manifest(3000, writer="other")
    if whose == "theirs":
        base_etag = '"someone-else"'
    elif whose == "held":
        base = replace(base, lease_holder=w.lease.holder)  # a collector edited ours
        base_etag = '"a-collectors-edit"'

    async def silent(*args: object, **kw: object) -> str:
        raise StoreUnavailable("no answer")

    monkeypatch.setattr(w.store, "put", silent)
    monkeypatch.setattr(w.store, "head", silent)
    with pytest.raises(StoreUnavailable):
        await w.lease.put(w.lease.stamped(base, base, base_etag), base_etag, base)
    expected = w.clock.monotonic() + 1.25 * 3.0 if whose == "theirs" else float("-inf")
    assert w.lease.fence_until == expected
