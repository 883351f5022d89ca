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
    assert bare_etag('"X1-2X"') == "X1-2X"  # nothing but the quotes


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


# ------------------------------------------------- pinned against the mutants of the module


class GatedStore(HookedStore):
    """A local store whose manifest puts land at once but answer only when ``answer`` is set
    (while ``gate`` is on): the writer's answer is not back while the store already shows it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.gate = False
        self.answer = asyncio.Event()
        self.landed = asyncio.Event()

    async def put(self, key: str, data: bytes, **kw: object) -> str:  # type: ignore[override]
        etag = await super().put(key, data, **kw)  # type: ignore[arg-type]
        if self.gate:
            self.landed.set()
            await self.answer.wait()
        return etag


async def _yields(n: int = 8) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_lease_ms_rounds_to_whole_milliseconds_never_below_zero() -> None:
    from wal3.lease import lease_ms

    assert lease_ms(0.0) == 0
    assert lease_ms(-1.0) == 0
    assert lease_ms(1.5) == 1500
    assert lease_ms(0.0006) == 1  # rounded, not truncated


def test_a_claim_is_the_base_under_another_writer_lease_and_holder() -> None:
    from wal3.lease import _claims

    base = replace(Manifest.empty("old"), read_lease_ms=1000, lease_holder="a" * 16)
    assert _claims(base, base)
    assert _claims(replace(base, writer="new"), base)
    assert _claims(replace(base, read_lease_ms=5000), base)
    assert _claims(replace(base, read_lease_ms=None), base)
    assert _claims(replace(base, lease_holder="b" * 16), base)
    assert _claims(replace(base, writer="new", read_lease_ms=0, lease_holder=None), base)
    assert not _claims(replace(base, acc_bytes=1), base)  # an edit, not a claim
    assert not _claims(replace(base, writer="new", acc_bytes=1), base)


def test_a_holder_token_is_16_fresh_hex_digits(tmp_path: Path) -> None:
    from wal3.lease import new_holder

    tokens = {new_holder() for _ in range(4)}
    assert len(tokens) == 4
    assert all(len(t) == 16 and int(t, 16) >= 0 for t in tokens)
    w = World(tmp_path)
    assert len(w.lease.holder) == 16 and w.lease.holder not in tokens
    given = Lease(w.store, PREFIX, LogWriterOptions(), lambda: w.held, lambda: True, holder="h1")
    assert given.holder == "h1"


async def test_a_fresh_lease_has_authored_nothing_not_even_an_empty_etag(
    tmp_path: Path,
) -> None:
    w = World(tmp_path)  # holds (empty manifest, "")
    assert not w.lease.authored("")
    assert await w.lease.confirm() is False
    assert w.store.heads == 0  # nothing of ours to renew: no HEAD
    assert w.lease.remaining() == 0.0


async def test_loading_a_log_without_a_manifest_fences_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    assert await w.lease.load() is None
    assert w.lease.fence_until == float("-inf")


async def test_a_failed_put_ends_the_lease_on_our_own_manifest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))
    assert w.lease.remaining() == 1.0

    async def silent(*args: object, **kw: object) -> str:
        raise StoreUnavailable("no answer")

    monkeypatch.setattr(w.store, "put", silent)
    monkeypatch.setattr(w.store, "head", silent)
    with pytest.raises(StoreUnavailable):
        await w.lease.put(replace(w.manifest(1000), acc_bytes=1), etag)
    assert w.lease.authored(etag)  # it may not have landed: authorship stays
    assert w.lease.remaining() == 0.0  # but nothing is vouched for until proven again
    assert w.lease.fence_until == float("-inf")  # our own base: no take-over


async def test_settled_waits_for_every_put_in_flight(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.store = GatedStore(tmp_path / "g")
    w.lease = Lease(w.store, PREFIX, w.lease._opts, lambda: w.held, lambda: True)
    etag = await w.write(w.manifest(1000))
    await w.lease.settled()  # nothing in flight: at once
    w.store.gate = True
    puts = [
        asyncio.ensure_future(w.lease.put(replace(w.manifest(1000), acc_bytes=n), etag))
        for n in (1, 2)
    ]
    await w.store.landed.wait()
    settled = asyncio.ensure_future(w.lease.settled())
    await _yields()
    assert not settled.done()
    assert w.lease.remaining() == 0.0  # a put in flight: no lease
    w.store.answer.set()
    await asyncio.gather(*puts, return_exceptions=True)
    await _yields()
    assert settled.done()
    await w.lease.settled()


async def test_a_renewal_seeing_our_put_in_flight_keeps_authorship(tmp_path: Path) -> None:
    """The HEAD finds another etag while a put of ours issued before it has landed but not
    answered: maybe ours, so no lease but authorship stays."""
    w = World(tmp_path)
    w.store = GatedStore(tmp_path / "g")
    w.lease = Lease(w.store, PREFIX, w.lease._opts, lambda: w.held, lambda: True)
    etag = await w.write(w.manifest(1000))
    w.store.gate = True
    put = asyncio.ensure_future(w.lease.put(replace(w.manifest(1000), acc_bytes=1), etag))
    await w.store.landed.wait()
    assert await w.lease.confirm() is False
    assert w.lease.authored(etag)
    w.store.answer.set()
    await put


@pytest.mark.parametrize("whose", ["ours", "held", "unleased", "short", "theirs"])
def test_takes_over_only_a_leased_base_of_someone_else(tmp_path: Path, whose: str) -> None:
    w = World(tmp_path)
    w.lease.adopt("mine", 0.0)
    base, etag = w.manifest(2000, writer="other"), '"theirs"'
    if whose == "ours":
        etag = '"mine"'
    elif whose == "held":
        base = replace(base, lease_holder=w.lease.holder)
    elif whose == "unleased":
        base = w.manifest(0, writer="other")
    elif whose == "short":
        base = w.manifest(500, writer="other")
    assert w.lease.takes_over(base, etag) is (whose in ("short", "theirs"))


async def test_a_claim_records_the_longer_base_lease_and_fences_for_it(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=1.0)
    base = w.manifest(3000, writer="other")
    base_etag = await w.foreign(base)
    now = w.clock.monotonic()
    new, etag = await w.lease.claim(base, base_etag)
    assert new.read_lease_ms == 3000 and new.writer == "w" and w.lease.holds(new)
    assert replace(new, writer="other", read_lease_ms=3000, lease_holder=None) == base
    assert w.lease.fence_until == now + 1.25 * 3.0
    assert w.lease.authored(etag)
    w.held = (new, etag)
    w.clock.advance(0.25)
    assert w.lease.remaining() == 0.75  # our own 1 s, from the claim's issue


def test_stamping_counts_the_base_lease_only_for_a_base_not_ours(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=1.0)
    w.lease.adopt("mine", 0.0)
    base = w.manifest(3000, writer="other")
    new = w.manifest(None)
    assert w.lease.stamped(new, base, '"theirs"').read_lease_ms == 3000
    assert w.lease.stamped(new, base, '"mine"').read_lease_ms == 1000  # ours: our lease
    assert w.lease.stamped(new, base).read_lease_ms == 1000  # no etag: not a take-over
    assert w.lease.stamped(new, None, '"theirs"').read_lease_ms == 1000
    assert w.lease.stamped(new, w.manifest(500, "x"), '"t"').read_lease_ms == 1000  # shorter


@pytest.mark.parametrize(("elapsed", "expected"), [(1.25, 2000), (3.7495, 1), (3.75, 0)])
def test_stamping_while_fencing_records_what_the_fence_has_left(
    tmp_path: Path, elapsed: float, expected: int
) -> None:
    """What is left of a fence, over FENCE_FACTOR, in whole milliseconds rounded up."""
    w = World(tmp_path, lease_s=0.0)
    w.lease.note_load(w.manifest(3000, writer="other"), '"theirs"')  # fences 3.75 s
    w.clock.advance(elapsed)
    assert w.lease.stamped(w.manifest(None)).read_lease_ms == expected


def test_landing_on_a_held_edit_or_an_unknown_base(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=2.0)
    now = w.clock.monotonic()
    held = replace(w.manifest(3000, writer="gc"), lease_holder=w.lease.holder)
    w.lease.landed('"a-collectors-edit"', "e1", now, held)  # our own edited: no take-over
    assert w.lease.fence_until == float("-inf")
    w.lease.landed('"unknown"', "e2", now, None)  # a base not known: fenced for our lease
    assert w.lease.fence_until == now + 1.25 * 2.0


def test_loading_an_edit_of_our_own_raises_no_fence(tmp_path: Path) -> None:
    w = World(tmp_path)
    held = replace(w.manifest(3000, writer="gc"), lease_holder=w.lease.holder)
    w.lease.note_load(held, '"a-collectors-edit"')
    assert w.lease.fence_until == float("-inf")
    w.lease.adopt("mine", w.clock.monotonic())
    w.lease.note_load(w.manifest(3000, writer="other"), '"not-mine"')
    assert w.lease.fence_until == w.clock.monotonic() + 1.25 * 3.0


async def test_an_adopted_manifest_is_leased_from_its_read(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.held = (w.manifest(1000), "e1")
    w.lease.adopt("e1", w.clock.monotonic() - 0.25)
    assert w.lease.authored('"e1"')
    assert w.lease.remaining() == 0.75
    w.clock.advance(5.0)
    assert w.lease.remaining() == 0.0  # ran out: none, never negative


def test_a_lease_of_half_a_second_is_a_lease(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=0.5)
    w.held = (w.manifest(500), "e1")
    w.lease.adopt("e1", w.clock.monotonic())
    assert w.lease.remaining() == 0.5
    now = w.clock.monotonic()
    w.lease.note_load(w.manifest(400, writer="other"), '"theirs"')
    assert w.lease.fence_until == now + 1.25 * 0.4


async def test_a_renewal_of_half_a_second_heads_the_store(tmp_path: Path) -> None:
    w = World(tmp_path, lease_s=0.5)
    await w.write(w.manifest(500))
    w.clock.advance(0.25)
    assert await w.lease.confirm() is True
    assert w.store.heads == 1 and w.lease.remaining() == 0.5


async def test_a_renewal_of_a_vanished_manifest_is_no_renewal(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.write(w.manifest(1000))
    await w.store.delete(KEY)
    assert await w.lease.confirm() is False


def test_an_unrecorded_lease_is_fenced_for_the_longest_configured(tmp_path: Path) -> None:
    clock = ManualClock()
    store = HookedStore(tmp_path)

    def lease(own: float, unrecorded: float | None) -> Lease:
        opts = LogWriterOptions(
            writer_name="w",
            clock=clock,
            lease=LeaseOptions(read_lease_s=own, unrecorded_lease_s=unrecorded),
        )
        return Lease(store, PREFIX, opts, lambda: (Manifest.empty("w"), ""), lambda: True)

    rust = Manifest.empty("rust")  # records no lease
    now = clock.monotonic()
    for own, unrecorded, fenced in ((1.0, 5.0, 5.0), (2.0, 0.5, 2.0), (1.0, None, 1.0)):
        one = lease(own, unrecorded)
        one.note_load(rust, '"rust"')
        assert one.fence_until == now + 1.25 * fenced


def _rival_claim(w: World, lease_ms_: int = 2000) -> tuple[Manifest, Manifest]:
    base = replace(w.manifest(1000), lease_holder=w.lease.holder)
    return replace(base, writer="rival", read_lease_ms=lease_ms_, lease_holder="r" * 16), base


async def test_losing_to_a_rivals_claim_yields_for_its_fence(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.lease.adopt("mine", w.clock.monotonic())  # this writer held the log
    current, base = _rival_claim(w)
    w.lease.lost_to(current, '"rivals"', base)
    w.lease.lost_to(*_rival_claim(w, 400)[:1], '"rivals"', base)  # shorter: never shortens it
    waiting = asyncio.ensure_future(w.lease.yielded())
    await _yields()
    w.clock.advance(2.4)
    await _yields()
    assert not waiting.done()
    w.clock.advance(0.1)  # 1.25 x the rival's 2 s
    await _yields()
    assert waiting.done()
    await asyncio.wait_for(w.lease.yielded(), 5)  # exactly at its end: no wait


@pytest.mark.parametrize("why", ["never-held", "our-etag", "held", "linked-more", "unleased"])
async def test_losing_to_what_is_no_rivals_claim_yields_nothing(tmp_path: Path, why: str) -> None:
    w = World(tmp_path)
    if why != "never-held":
        w.lease.adopt("mine", w.clock.monotonic())
    current, base = _rival_claim(w, 0 if why == "unleased" else 2000)
    etag = '"mine"' if why == "our-etag" else '"rivals"'
    if why == "held":
        current = replace(current, lease_holder=w.lease.holder)
    elif why == "linked-more":  # not the base claimed: its tail moved on
        current = replace(current, initial_offset=5, initial_seq_no=3)
    w.lease.lost_to(current, etag, base)
    assert w.lease._yield_until == float("-inf")
    await asyncio.wait_for(w.lease.yielded(), 5)


async def test_losing_a_write_on_a_base_held_before_yields_after_landing(tmp_path: Path) -> None:
    """``landed`` marks the log as held once (``lost_to`` yields only then)."""
    w = World(tmp_path)
    w.lease.landed(None, "e1", w.clock.monotonic(), None)
    current, base = _rival_claim(w)
    w.lease.lost_to(current, '"rivals"', base)
    assert w.lease._yield_until == w.clock.monotonic() + 1.25 * 2.0


def test_an_inherited_fence_only_ever_lengthens(tmp_path: Path) -> None:
    w = World(tmp_path)
    now = w.clock.monotonic()
    w.lease.inherit_fence(now + 3.0)
    assert w.lease.fence_until == now + 3.0
    w.lease.inherit_fence(now + 1.0)
    assert w.lease.fence_until == now + 3.0


async def test_a_fence_that_just_passed_waits_for_nothing(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.lease.note_load(w.manifest(2000, writer="other"), '"theirs"')
    w.clock.advance(2.5)
    await asyncio.wait_for(w.lease.wait_fence(), 5)


async def test_a_claim_is_conditional_on_its_base(tmp_path: Path) -> None:
    from wal3.errors import PreconditionFailed

    w = World(tmp_path)
    base = w.manifest(3000, writer="other")
    base_etag = await w.foreign(base)
    await w.foreign(replace(base, acc_bytes=1))  # someone wrote the log meanwhile
    with pytest.raises(PreconditionFailed):
        await w.lease.claim(base, base_etag)


async def test_a_claim_that_raises_fences_for_its_bases_lease(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = World(tmp_path, lease_s=1.0)
    base = w.manifest(3000, writer="other")
    base_etag = await w.foreign(base)

    async def silent(*args: object, **kw: object) -> str:
        raise StoreUnavailable("no answer")

    monkeypatch.setattr(w.store, "put", silent)
    monkeypatch.setattr(w.store, "head", silent)
    with pytest.raises(StoreUnavailable):
        await w.lease.claim(base, base_etag)
    assert w.lease.fence_until == w.clock.monotonic() + 1.25 * 3.0  # the base's, not our 1 s


async def test_a_renewal_overlapping_a_put_that_left_our_manifest_stored_keeps_the_lease(
    tmp_path: Path,
) -> None:
    """A put issued during the HEAD that stored the very same bytes (the same etag): the HEAD
    proves nothing newer, but the lease it had still stands."""
    w = World(tmp_path)
    m = w.manifest(1000)
    etag = await w.write(m)
    w.clock.advance(0.5)

    async def same_bytes_again() -> None:
        assert await w.lease.put(m, etag) == etag

    w.store.during_head = same_bytes_again
    assert await w.lease.confirm() is True
    assert w.lease.remaining() == 0.5  # not renewed by the HEAD


async def test_a_renewal_overlapping_a_failed_put_is_no_renewal(tmp_path: Path) -> None:
    from wal3.errors import PreconditionFailed

    w = World(tmp_path)
    etag = await w.write(w.manifest(1000))

    async def stale_put() -> None:
        with pytest.raises(PreconditionFailed):
            await w.lease.put(replace(w.manifest(1000), acc_bytes=1), '"stale"')

    w.store.during_head = stale_put
    assert await w.lease.confirm() is False
    assert w.lease.authored(etag) and w.lease.remaining() == 0.0


async def test_a_yield_shorter_than_a_second_is_waited_out(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.lease.adopt("mine", w.clock.monotonic())
    current, base = _rival_claim(w, 400)  # 1.25 x 0.4 s = 0.5 s
    w.lease.lost_to(current, '"rivals"', base)
    waiting = asyncio.ensure_future(w.lease.yielded())
    await _yields()
    assert not waiting.done()
    w.clock.advance(0.5)
    await _yields()
    assert waiting.done()


# -------------------------------------------------------------------------------------------
# Mutants not killed here, all equivalent (no input tells them apart):
#
# * ``Lease.__init__``'s ``_lease_from = ""``: read only once ``_authored`` is set (``remaining``
#   answers 0 for a manifest we did not write before looking at it), and every write that sets
#   ``_authored`` (``landed``, ``adopt``) sets ``_lease_from`` as well.
# * ``Lease.__init__``'s ``float("-INF")`` for ``_fence_until`` and ``_yield_until``: the same
#   value as ``float("-inf")``.
# * ``Lease.__init__``'s ``_held_once = None``: only ever tested for truth, and None is falsy.
# * ``Lease.__init__``'s ``_puts_issued = 1`` and ``put``'s ``_puts_issued -= 1`` / ``+= 2``: the
#   counter is only compared with an earlier reading of itself (``!=``), so its start and its
#   step do not matter as long as each put changes it.
# * ``stamped``'s ``left >= 0``: at ``left == 0`` the recorded lease is ``max(ms, ceil(0))``,
#   the same ``ms``.
# * ``remaining``'s ``lease < 0``: a lease of 0 then answers ``max(0, _lease_from - now)``, and
#   ``_lease_from`` is a monotonic reading taken before now, so 0 all the same.
