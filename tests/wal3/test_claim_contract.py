"""``wal3.claim`` rule by rule: how a claim is judged dead (``ClaimWatch``, ``holder_ttl_s``), what
a stored claim says (``claim_released``, ``released_copy``), how one is taken, renewed, written
under, released, abandoned and finished (``claim_log``, ``Claim``), how the leftovers of dead
attempts are cleaned up, how a claimant's creates accept only its own bytes (``put_claimed``,
``copy_claimed``), how ``run_all`` ends, and ``create_log``.  Written against the mutation run of
the module (docs/RELIABILITY.md): each test pins one rule (its name says which); the mutants it
leaves, all equivalent, are listed at the end of the file.

Everything runs on an in-memory store that records every request, can fail chosen ones or run a
step of "another attempt" right before them, and can give chosen keys multipart etags; time is a
clock the test moves (no sleeps).  The server-level claim cases are tests/host/test_fork_claims.py
and its neighbours.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

import wal3.claim as claim_module
from wal3.claim import (
    Claim,
    ClaimLost,
    ClaimWatch,
    CreationInProgress,
    claim_log,
    claim_released,
    copy_claimed,
    create_log,
    holder_ttl_s,
    put_claimed,
    release_if_dead,
    released_copy,
    run_all,
)
from wal3.clock import Clock
from wal3.errors import (
    ObjectNotFound,
    PreconditionFailed,
    SimulatedCrash,
    StoreUnavailable,
)
from wal3.manifest import Manifest
from wal3.paths import CLAIM_PATH, MANIFEST_PATH, join
from wal3.store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

P = "logs/x"
KEY = join(P, CLAIM_PATH)
MKEY = join(P, MANIFEST_PATH)
TTL = 120.0
WALL_US = 1_700_000_000_000_000

# ------------------------------------------------------------------------------ fixtures

Hook = Callable[[str], Awaitable[None]]


class MemStore(ObjectStore):
    """An in-memory store that records every request (``ops``), runs a hook right before the
    next request matching it (``before``), fails chosen requests (``refuse``), and gives the keys
    in ``multipart`` a multipart etag (not their content's MD5)."""

    def __init__(self) -> None:
        self.objects: dict[str, tuple[bytes, str]] = {}
        self.ops: list[tuple[str, str]] = []
        self.hooks: list[tuple[str, re.Pattern[str], Hook]] = []
        self.fails: list[list[Any]] = []  # [op, rx, exception, times left]
        self.multipart: set[str] = set()

    def before(self, op: str, regex: str, fn: Hook) -> None:
        self.hooks.append((op, re.compile(regex), fn))

    def refuse(self, op: str, regex: str, exc: BaseException, times: int = 1) -> None:
        self.fails.append([op, re.compile(regex), exc, times])

    async def _check(self, op: str, key: str) -> None:
        self.ops.append((op, key))
        for i, (o, rx, fn) in enumerate(self.hooks):
            if o == op and rx.search(key):
                del self.hooks[i]
                await fn(key)
                break
        for f in self.fails:
            if f[0] == op and f[1].search(key) and f[3] > 0:
                f[3] -= 1
                raise f[2]

    def _etag(self, key: str, data: bytes) -> str:
        md5 = content_etag(data)
        return f"{md5[:31]}0-2" if key in self.multipart else md5

    def store(self, key: str, data: bytes) -> str:
        """Write directly (another attempt, a dead one's leftover): no request recorded."""
        etag = self._etag(key, data)
        self.objects[key] = (data, etag)
        return etag

    async def get(self, key: str) -> GetResult:
        await self._check("get", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data, etag = self.objects[key]
        return GetResult(data, etag)

    async def head(self, key: str) -> ObjectMeta:
        await self._check("head", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data, etag = self.objects[key]
        return ObjectMeta(key, etag, len(data), 0.0)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        await self._check("put", key)
        check_condition(if_none_match, if_match)
        cur = self.objects.get(key)
        if if_none_match is not None and cur is not None:
            raise PreconditionFailed(key)
        if if_match is not None and (cur is None or cur[1] != if_match):
            raise PreconditionFailed(key)
        return self.store(key, data)

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        await self._check("copy", dst)
        check_condition(if_none_match, None)
        if src not in self.objects:
            raise ObjectNotFound(src)
        if if_none_match is not None and dst in self.objects:
            raise PreconditionFailed(dst)
        return self.store(dst, self.objects[src][0])

    async def delete(self, key: str) -> None:
        await self._check("delete", key)
        self.objects.pop(key, None)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        for key in sorted(self.objects):
            if key.startswith(prefix) and (start_after is None or key > start_after):
                data, etag = self.objects[key]
                yield ObjectMeta(key, etag, len(data), 0.0)

    def url_for(self, key: str) -> str:
        return f"mem://{key}"

    # -- test helpers
    def doc(self, key: str = KEY) -> Any:
        return json.loads(self.objects[key][0])

    def count(self, op: str, key: str = KEY) -> int:
        return sum(1 for o, k in self.ops if o == op and k == key)


@dataclass(frozen=True, slots=True)
class StepClock(Clock):
    """Monotonic time that moves only when the test says so; a fixed wall clock."""

    t: list[float] = field(default_factory=lambda: [1000.0])

    def monotonic(self) -> float:
        return self.t[0]

    def wall_us(self) -> int:
        return WALL_US

    def advance(self, seconds: float) -> None:
        self.t[0] += seconds


def watch_and_clock(ttl: float = TTL, **kw: Any) -> tuple[ClaimWatch, StepClock]:
    clock = StepClock()
    return ClaimWatch(ttl, clock=clock, **kw), clock


def claim_bytes(*, ttl_s: Any = TTL, released: bool | None = None, **more: Any) -> bytes:
    doc: dict[str, Any] = {"attempt": "other", "holder": "someone", "ttl_s": ttl_s, **more}
    if released is not None:
        doc["released"] = released
    return json.dumps(doc).encode()


async def claimed(
    store: MemStore | None = None, ttl: float = TTL
) -> tuple[MemStore, Claim, ClaimWatch, StepClock]:
    store = store or MemStore()
    watch, clock = watch_and_clock(ttl)
    c = await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert c is not None
    return store, c, watch, clock


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def md5(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


# ------------------------------------------------------------------------- holder_ttl_s


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'"ttl_s"', None),
        (b"{}", None),
        (b'{"TTL_S": 30}', None),
        (b'{"ttl_s": 30}', 30.0),
        (b'{"ttl_s": 0.5}', 0.5),
        (b'{"ttl_s": 1}', 1.0),
        (b'{"ttl_s": true}', None),
        (b'{"ttl_s": "30"}', None),
        (b'{"ttl_s": null}', None),
        (b'{"ttl_s": 0}', None),
        (b'{"ttl_s": -5}', None),
        (b'{"ttl_s": Infinity}', None),
        (b'{"ttl_s": NaN}', None),
    ],
)
def test_holder_ttl_is_read_only_when_sane(data: bytes, want: float | None) -> None:
    """A positive finite number (not a bool) under ``ttl_s`` of a JSON object, as a float; else
    None.  Kills every mutant of ``holder_ttl_s``."""
    got = holder_ttl_s(data)
    assert got == want
    if want is not None:
        assert type(got) is float


# ------------------------------------------------------------------------- ClaimWatch


@pytest.mark.parametrize("ttl", [0.0, -1.0])
def test_a_watch_needs_a_positive_ttl(ttl: float) -> None:
    with pytest.raises(ValueError, match=r"^ttl_s must be positive$"):
        ClaimWatch(ttl)


def test_a_watch_takes_a_ttl_under_a_second() -> None:
    watch = ClaimWatch(0.5)
    assert watch.ttl_s == 0.5 and watch.wait_s() == 0.5


def test_an_etag_is_opaque_but_for_its_quotes() -> None:
    """Only the quotes around an etag are dropped: other stores' etags (GCS's are base64) may
    begin or end with any character, an ``X`` included."""
    watch, clock = watch_and_clock(10.0)
    assert watch.expired("k", '"Xe1X"') is False
    clock.advance(10.0)
    assert watch.expired("k", "Xe1X") is True
    assert watch.expired("k", "e1") is False


def test_the_wait_is_the_longer_of_both_ttls() -> None:
    watch = ClaimWatch(100.0)
    assert watch.wait_s() == 100.0
    assert watch.wait_s(None) == 100.0
    assert watch.wait_s(300.0) == 300.0
    assert watch.wait_s(50.0) == 100.0


def test_a_claim_expires_after_showing_one_etag_for_the_wait() -> None:
    """First sight starts the wait (False); the same etag is dead exactly at the wait, not a
    moment before; another etag restarts it; quotes around an etag do not matter."""
    watch, clock = watch_and_clock(100.0)
    assert watch.expired("k", '"e1"') is False
    clock.advance(99.0)
    assert watch.expired("k", '"e1"') is False
    clock.advance(1.0)
    assert watch.expired("k", '"e1"') is True
    assert watch.expired("k", "e1") is True  # the bare etag is the same one
    assert watch.expired("k", "e2") is False  # a renewal: the wait starts again
    clock.advance(50.0)
    assert watch.expired("k", "e2") is False
    assert watch.expired("other", "e2") is False  # each key is watched apart
    clock.advance(50.0)
    assert watch.expired("k", "e2") is True
    assert watch.expired("other", "e2") is False


def test_a_longer_holder_ttl_is_waited_out() -> None:
    watch, clock = watch_and_clock(100.0)
    assert watch.expired("k", "e", 300.0) is False
    clock.advance(200.0)
    assert watch.expired("k", "e", 300.0) is False
    assert watch.expired("k", "e") is True  # judged by our own TTL, it is dead
    clock.advance(100.0)
    assert watch.expired("k", "e", 300.0) is True


def test_the_oldest_sightings_are_forgotten_past_the_bound() -> None:
    """Kills the bound's ``>=`` and ``popitem(last=True)``."""
    watch, clock = watch_and_clock(10.0, max_entries=2)
    watch.expired("a", "e")
    watch.expired("b", "e")
    clock.advance(10.0)
    assert watch.expired("b", "e") is True  # two sightings fit
    watch.expired("c", "e")  # "a" is the oldest sighting: forgotten
    assert watch.remaining_s("c") == 10.0
    clock.advance(10.0)
    assert watch.expired("c", "e") is True
    assert watch.expired("b", "e") is True
    assert watch.expired("a", "e") is False  # forgotten: seen anew


def test_a_repeated_sighting_is_the_newest() -> None:
    """A sighting of a new etag moves the key to the newest end (``move_to_end``)."""
    watch, clock = watch_and_clock(10.0, max_entries=2)
    watch.expired("a", "e1")
    watch.expired("b", "e1")
    watch.expired("a", "e2")  # a renewal of "a": newest now
    watch.expired("c", "e1")  # evicts "b", the oldest
    clock.advance(10.0)
    assert watch.expired("a", "e2") is True
    assert watch.expired("c", "e1") is True


def test_the_default_bound_is_4096_sightings() -> None:
    watch, clock = watch_and_clock(10.0)
    for i in range(4096):
        watch.expired(f"k{i}", "e")
    clock.advance(10.0)
    assert watch.expired("k0", "e") is True
    watch, clock = watch_and_clock(10.0)
    for i in range(4097):
        watch.expired(f"k{i}", "e")
    clock.advance(10.0)
    assert watch.expired("k0", "e") is False


def test_remaining_counts_down_from_the_first_sighting() -> None:
    watch, clock = watch_and_clock(100.0)
    assert watch.remaining_s("k") == 100.0
    assert watch.remaining_s("k", 300.0) == 300.0
    watch.expired("k", "e")
    clock.advance(30.0)
    assert watch.remaining_s("k") == 70.0
    assert watch.remaining_s("k", 300.0) == 270.0
    clock.advance(100.0)
    assert watch.remaining_s("k") == 0.0


def test_forget_restarts_the_wait_and_ignores_the_unknown() -> None:
    watch, clock = watch_and_clock(10.0)
    watch.forget("never seen")
    watch.expired("k", "e")
    clock.advance(10.0)
    watch.forget("k")
    assert watch.remaining_s("k") == 10.0
    assert watch.expired("k", "e") is False


# ----------------------------------------------------------- claim_released, released_copy


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"{damaged", False),
        (b"[1]", False),
        (b"{}", False),
        (b'{"released": true}', True),
        (b'{"released": false}', False),
        (b'{"released": "yes"}', False),
        (b'{"released": 1}', False),
        (b'{"RELEASED": true}', False),
    ],
)
def test_a_claim_is_released_only_when_it_says_so(data: bytes, want: bool) -> None:
    assert claim_released(data) is want


def test_released_copy_keeps_the_claim_and_adds_the_tombstone() -> None:
    """Sorted keys, compact separators, everything the claim said, ``released: true``; a
    damaged or non-object claim becomes a bare tombstone."""
    got = released_copy(b'{"z": 1, "a": {"b": 2, "a": 1}, "released": false}')
    assert got == b'{"a":{"a":1,"b":2},"released":true,"z":1}'
    assert released_copy(b"{damaged") == b'{"released":true}'
    assert released_copy(b"[1, 2]") == b'{"released":true}'
    assert claim_released(released_copy(b"{}"))


# ------------------------------------------------------------------------- release_if_dead


async def test_release_if_dead_frees_what_is_absent_or_released() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()
    assert await release_if_dead(store, KEY, watch) is True
    store.store(KEY, claim_bytes(released=True))
    assert await release_if_dead(store, KEY, watch) is True
    assert store.count("put") == 0


async def test_release_if_dead_releases_an_expired_claim_by_if_match() -> None:
    """A live claim stands (False, untouched) until it has shown one etag for the holder's TTL
    (the longer one here); then it is replaced by its released copy, and the sighting dropped."""
    store = MemStore()
    watch, clock = watch_and_clock(100.0)
    store.store(KEY, claim_bytes(ttl_s=300.0, renewal=3))
    assert await release_if_dead(store, KEY, watch) is False
    clock.advance(200.0)
    assert await release_if_dead(store, KEY, watch) is False
    assert store.count("put") == 0
    clock.advance(100.0)
    assert await release_if_dead(store, KEY, watch) is True
    assert store.doc() == {
        "attempt": "other",
        "holder": "someone",
        "ttl_s": 300.0,
        "renewal": 3,
        "released": True,
    }
    assert watch.remaining_s(KEY) == 100.0  # forgotten


async def test_release_if_dead_watches_each_claim_apart() -> None:
    """One watch serves every log of the process: two claims seen in turn each expire on their
    own wait (and each is released at its own key)."""
    store = MemStore()
    watch, clock = watch_and_clock(10.0)
    other = join("logs/y", CLAIM_PATH)
    store.store(KEY, claim_bytes(ttl_s=10.0))
    store.store(other, claim_bytes(ttl_s=10.0, attempt="y"))
    assert await release_if_dead(store, KEY, watch) is False
    assert await release_if_dead(store, other, watch) is False
    clock.advance(10.0)
    assert await release_if_dead(store, KEY, watch) is True
    assert await release_if_dead(store, other, watch) is True
    assert claim_released(store.objects[KEY][0]) and claim_released(store.objects[other][0])


async def test_release_if_dead_loses_to_a_renewal() -> None:
    """The If-Match put finds another etag: the holder is alive (False, its claim untouched)."""
    store = MemStore()
    watch, clock = watch_and_clock(10.0)
    store.store(KEY, claim_bytes(ttl_s=10.0))
    await release_if_dead(store, KEY, watch)
    clock.advance(10.0)

    async def renew(_: str) -> None:
        store.store(KEY, claim_bytes(renewal=1))

    store.before("put", "CLAIM$", renew)
    assert await release_if_dead(store, KEY, watch) is False
    assert store.doc()["renewal"] == 1 and not claim_released(store.objects[KEY][0])


async def test_release_if_dead_of_a_claim_deleted_meanwhile() -> None:
    store = MemStore()
    watch, clock = watch_and_clock(10.0)
    store.store(KEY, claim_bytes(ttl_s=10.0))
    await release_if_dead(store, KEY, watch)
    clock.advance(10.0)
    store.refuse("put", "CLAIM$", ObjectNotFound(KEY))
    assert await release_if_dead(store, KEY, watch) is True


# ------------------------------------------------------------------------- claim_log


async def test_no_claim_on_an_existing_log() -> None:
    store = MemStore()
    store.store(MKEY, Manifest.empty("w").to_bytes())
    watch, _ = watch_and_clock()
    assert await claim_log(store, P, purpose="fork", holder="h", watch=watch) is None
    assert KEY not in store.objects


async def test_a_fresh_claim_says_who_holds_it_and_for_how_long() -> None:
    store, c, _, _ = await claimed()
    doc = store.doc()
    assert set(doc) == {"attempt", "purpose", "holder", "renewal", "ttl_s", "claimed_us"}
    assert re.fullmatch(r"[0-9a-f]{32}", doc["attempt"])
    assert (doc["purpose"], doc["holder"], doc["renewal"], doc["ttl_s"], doc["claimed_us"]) == (
        "fork",
        "h",
        0,
        TTL,
        WALL_US,
    )
    assert store.objects[KEY][0] == json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    assert c.key == KEY and c.store is store
    assert c.etag == store.objects[KEY][1]
    assert c.attempt == doc["attempt"]
    assert c.may_still_land is False
    assert store.count("put") == 1


async def test_only_the_slashes_around_the_prefix_are_dropped() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()
    c = await claim_log(store, "/logs/X/", purpose="fork", holder="h", watch=watch)
    assert c is not None and c.key == "logs/X/CLAIM"
    store.store("logs/X/CLAIM", claim_bytes())
    with pytest.raises(CreationInProgress, match=r"^the creation of 'logs/X' is claimed"):
        await claim_log(MemStoreWith(store), "/logs/X/", purpose="f", holder="h", watch=watch)


def MemStoreWith(store: MemStore) -> MemStore:
    """The same objects behind a fresh request log."""
    fresh = MemStore()
    fresh.objects = store.objects
    return fresh


async def test_a_live_claim_is_in_progress_and_untouched() -> None:
    """CreationInProgress, naming the log and the longest remaining wait (the holder's TTL,
    counted from our first sighting); the live claim is never overwritten."""
    store = MemStore()
    store.store(KEY, claim_bytes(ttl_s=300.0))
    before = store.objects[KEY]
    watch, clock = watch_and_clock()
    with pytest.raises(CreationInProgress) as e:
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert str(e.value) == (
        "the creation of 'logs/x' is claimed by another attempt; retry in 300 s at most"
    )
    clock.advance(150.0)  # dead by our own TTL, not by the holder's
    with pytest.raises(CreationInProgress) as e:
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert str(e.value).endswith("retry in 150 s at most")
    assert store.objects[KEY] == before


async def test_a_released_claim_is_taken_at_once() -> None:
    store = MemStore()
    store.store(KEY, claim_bytes(released=True))
    old = store.objects[KEY][1]
    watch, _ = watch_and_clock()
    c = await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert c is not None and store.doc()["holder"] == "h"
    assert ("put", KEY) in store.ops and c.etag == store.objects[KEY][1] != old


async def test_an_expired_claim_is_taken_over_and_its_sighting_dropped() -> None:
    store = MemStore()
    store.store(KEY, claim_bytes(ttl_s=30.0))
    watch, clock = watch_and_clock()
    with pytest.raises(CreationInProgress):
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    clock.advance(TTL)
    c = await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert c is not None and c.etag == store.objects[KEY][1]
    assert store.doc()["holder"] == "h"
    assert watch.remaining_s(KEY) == TTL  # ours now: no sighting kept


async def test_a_claim_left_by_a_finished_creation_means_the_log_exists() -> None:
    store = MemStore()
    store.store(KEY, claim_bytes())
    watch, _ = watch_and_clock()

    async def created(_: str) -> None:
        store.store(MKEY, Manifest.empty("w").to_bytes())

    store.before("get", "CLAIM$", created)
    assert await claim_log(store, P, purpose="fork", holder="h", watch=watch) is None
    assert store.doc()["attempt"] == "other"


async def test_a_claim_deleted_meanwhile_is_looked_at_again() -> None:
    store = MemStore()
    store.store(KEY, claim_bytes())
    watch, _ = watch_and_clock()

    async def deleted(_: str) -> None:
        del store.objects[KEY]

    store.before("get", "CLAIM$", deleted)
    c = await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert c is not None and store.doc()["holder"] == "h"


async def test_a_take_over_raced_by_another_taker_loses() -> None:
    """Our If-Match put meets the other taker's claim: we never overwrite it, and it is a claim
    in progress (seen for the first time)."""
    store = MemStore()
    store.store(KEY, claim_bytes(released=True))
    watch, _ = watch_and_clock()

    async def taken(_: str) -> None:
        store.store(KEY, claim_bytes(attempt="winner"))

    store.before("put", "CLAIM$", lambda _: asyncio.sleep(0))  # our create-only put
    store.before("put", "CLAIM$", taken)  # the take-over's If-Match put
    with pytest.raises(CreationInProgress, match="claimed by another attempt"):
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert store.doc()["attempt"] == "winner"


async def test_a_take_over_raced_by_a_release_tries_again() -> None:
    store = MemStore()
    store.store(KEY, claim_bytes(released=True))
    watch, _ = watch_and_clock()

    async def released_again(_: str) -> None:
        store.store(KEY, claim_bytes(released=True, renewal=9))

    store.before("put", "CLAIM$", lambda _: asyncio.sleep(0))
    store.before("put", "CLAIM$", released_again)
    c = await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert c is not None and store.doc()["holder"] == "h"


async def test_a_claim_that_keeps_changing_gives_up_after_the_attempts() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()
    store.store(KEY, claim_bytes())

    async def gone(_: str) -> None:
        store.objects.pop(KEY, None)

    async def back(_: str) -> None:
        store.store(KEY, claim_bytes())

    for _ in range(10):
        store.before("put", "CLAIM$", back)
        store.before("get", "CLAIM$", gone)
    with pytest.raises(CreationInProgress) as e:
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert str(e.value) == "the claim on creating 'logs/x' kept changing"
    assert store.count("get") == 8
    store.hooks.clear()
    store.ops.clear()
    store.store(KEY, claim_bytes())
    for _ in range(3):
        store.before("put", "CLAIM$", back)
        store.before("get", "CLAIM$", gone)
    with pytest.raises(CreationInProgress, match="kept changing"):
        await claim_log(store, P, purpose="fork", holder="h", watch=watch, attempts=2)
    assert store.count("get") == 2


async def test_a_manifest_found_after_claiming_drops_the_claim() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()

    async def none_yet(_: str) -> None:
        pass

    async def created(_: str) -> None:
        store.store(MKEY, Manifest.empty("w").to_bytes())

    store.before("get", "manifest/MANIFEST$", none_yet)
    store.before("get", "manifest/MANIFEST$", created)
    assert await claim_log(store, P, purpose="fork", holder="h", watch=watch) is None
    assert KEY not in store.objects and store.count("delete") == 1


def leftovers(store: MemStore) -> None:
    for d in ("cursor/compaction.json", "log/f1", "snapshot/s1", "gc/plan"):
        store.store(join(P, d), b"dead")
    store.store("compacted/u/part", b"dead")
    store.store(join(P, "other/keep"), b"live")
    store.store("logs/x2/log/f1", b"another log")
    store.store("compacted/v/part", b"another log's")


async def test_claiming_cleans_what_dead_attempts_left() -> None:
    store = MemStore()
    leftovers(store)
    watch, _ = watch_and_clock()
    c = await claim_log(
        store, P, purpose="fork", holder="h", watch=watch, leftovers=["compacted/u/"]
    )
    assert c is not None
    assert sorted(store.objects) == [
        "compacted/v/part",
        KEY,
        join(P, "other/keep"),
        "logs/x2/log/f1",
    ]
    assert c.may_still_land is False


async def test_a_clean_up_refused_by_the_store_releases_the_claim() -> None:
    """A definite refusal (nothing may land): abandoned and released at once."""
    store = MemStore()
    leftovers(store)
    store.refuse("delete", "log/f1$", PreconditionFailed("x"))
    watch, _ = watch_and_clock()
    with pytest.raises(PreconditionFailed):
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert claim_released(store.objects[KEY][0])
    assert store.doc()["holder"] == "h"


async def test_an_ambiguous_clean_up_keeps_the_claim() -> None:
    store = MemStore()
    leftovers(store)
    store.refuse("delete", "log/f1$", StoreUnavailable("timeout"))
    watch, _ = watch_and_clock()
    with pytest.raises(StoreUnavailable):
        await claim_log(store, P, purpose="fork", holder="h", watch=watch)
    assert not claim_released(store.objects[KEY][0])


async def test_the_clean_up_deletes_in_batches_of_16_and_each_once() -> None:
    store = MemStore()
    for i in range(40):
        store.store(join(P, f"log/f{i:02d}"), b"dead")
    gate = asyncio.Event()
    started: list[int] = []

    async def held(_: str) -> None:
        started.append(sum(1 for o, _k in store.ops if o == "delete"))
        await gate.wait()

    store.before("delete", "log/f00$", held)
    watch, _ = watch_and_clock()
    task = asyncio.ensure_future(claim_log(store, P, purpose="fork", holder="h", watch=watch))
    await turns()
    assert sum(1 for o, _k in store.ops if o == "delete") == 16  # one batch, waiting on f00
    gate.set()
    assert await task is not None
    assert [k for k in store.objects if "/log/" in k] == []
    deleted = [k for o, k in store.ops if o == "delete"]
    assert sorted(deleted) == [join(P, f"log/f{i:02d}") for i in range(40)]


# ------------------------------------------------------------------------- Claim.guard


async def test_guard_renews_only_once_a_quarter_ttl_has_passed() -> None:
    store, c, _, clock = await claimed(ttl=100.0)
    await c.guard()
    clock.advance(22.0)  # past ttl/5, short of ttl/4
    await c.guard()
    assert store.count("put") == 1
    clock.advance(3.0)  # exactly ttl/4
    await c.guard()
    assert store.count("put") == 2
    assert store.doc()["renewal"] == 1 and c.etag == store.objects[KEY][1]
    clock.advance(24.0)  # counted from the renewal
    await c.guard()
    assert store.count("put") == 2
    clock.advance(1.0)
    await c.guard()
    doc = store.doc()
    assert doc["renewal"] == 2 and c.etag == store.objects[KEY][1]
    assert set(doc) == {"attempt", "purpose", "holder", "renewal", "ttl_s", "claimed_us"}
    assert (doc["purpose"], doc["holder"], doc["attempt"]) == ("fork", "h", c.attempt)


async def test_a_renewal_of_a_claim_without_a_count_starts_at_one() -> None:
    store = MemStore()
    etag = store.store(KEY, b'{"attempt":"a"}')
    watch, clock = watch_and_clock(100.0)
    c = Claim(store, KEY, etag, {"attempt": "a"}, watch, clock.monotonic())
    clock.advance(25.0)
    await c.guard()
    assert store.doc() == {"attempt": "a", "renewal": 1}
    assert store.objects[KEY][0] == b'{"attempt":"a","renewal":1}'


async def test_a_renewal_that_finds_another_claim_fences_us_off() -> None:
    """The If-Match renewal fails: ClaimLost, and every later guard refuses without asking
    the store; the taker's claim is never overwritten."""
    store, c, _, clock = await claimed(ttl=100.0)
    store.store(KEY, claim_bytes(attempt="taker"))
    clock.advance(25.0)
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: the claim was taken over"
    puts = store.count("put")
    clock.advance(25.0)
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: the claim was taken over"
    assert store.count("put") == puts
    assert store.doc()["attempt"] == "taker"
    await c.release()
    assert store.doc()["attempt"] == "taker" and store.count("put") == puts


async def test_a_renewal_the_store_cannot_answer_leaves_the_claim_usable() -> None:
    store, c, _, clock = await claimed(ttl=100.0)
    clock.advance(25.0)
    store.refuse("put", "CLAIM$", StoreUnavailable("down"), times=4)
    with pytest.raises(StoreUnavailable):
        await c.guard()
    await c.guard()  # renews now
    assert store.doc()["renewal"] == 1


# ------------------------------------------------------------------------- Claim.write


async def test_a_write_runs_guarded_and_answers_its_value() -> None:
    _, c, _, _ = await claimed()
    calls: list[bool] = []

    async def op() -> str:
        calls.append(c.may_still_land)
        return "done"

    assert await c.write(op) == "done"
    assert calls == [True] and c.may_still_land is False


async def test_writes_are_counted_while_in_flight() -> None:
    """Two writes in flight: ending one leaves the other counted."""
    _, c, _, _ = await claimed()
    gates = [asyncio.Event(), asyncio.Event()]

    def op(i: int) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            await gates[i].wait()

        return run

    tasks = [asyncio.ensure_future(c.write(op(i))) for i in range(2)]
    await turns()
    assert c.may_still_land is True
    gates[0].set()
    await tasks[0]
    assert c.may_still_land is True
    gates[1].set()
    await tasks[1]
    assert c.may_still_land is False


@pytest.mark.parametrize(
    "exc", [PreconditionFailed("k"), ObjectNotFound("k"), ClaimLost("replaced")]
)
async def test_a_refused_write_closes_the_claim_and_settles(exc: Exception) -> None:
    store, c, _, _ = await claimed()

    async def op() -> None:
        raise exc

    with pytest.raises(type(exc)):
        await c.write(op)
    assert c.may_still_land is False
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: no more writes under this claim (a write failed)"
    await c.release()
    assert claim_released(store.objects[KEY][0])


@pytest.mark.parametrize("exc", [StoreUnavailable("timeout"), OSError("reset"), ValueError("x")])
async def test_an_ambiguous_write_may_still_land(exc: Exception) -> None:
    store, c, _, _ = await claimed()

    async def op() -> None:
        raise exc

    with pytest.raises(type(exc)):
        await c.write(op)
    assert c.may_still_land is True
    await c.release()  # closes, but may not release: the claim must expire
    assert not claim_released(store.objects[KEY][0])
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == (
        "logs/x/CLAIM: no more writes under this claim (a write failed and may still land)"
    )


async def test_a_write_cancelled_in_flight_may_still_land() -> None:
    _, c, _, _ = await claimed()
    task = asyncio.ensure_future(c.write(lambda: asyncio.Event().wait()))
    await turns()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert c.may_still_land is True


async def test_a_closed_claim_issues_no_write() -> None:
    _, c, _, _ = await claimed()
    await c.release()
    ran: list[int] = []

    async def op() -> None:
        ran.append(1)

    with pytest.raises(ClaimLost):
        await c.write(op)
    assert ran == []


# ------------------------------------------------------------------------- Claim.release


async def test_release_writes_the_tombstone_by_if_match_once() -> None:
    store, c, _, _ = await claimed()
    before = store.doc()
    await c.release()
    assert store.doc() == {**before, "released": True}
    assert c.etag == store.objects[KEY][1]
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: the claim was taken over"  # given away
    puts = store.count("put")
    await c.release()
    assert store.count("put") == puts


async def test_release_while_a_write_is_in_flight_only_closes() -> None:
    store, c, _, _ = await claimed()
    gate = asyncio.Event()
    task = asyncio.ensure_future(c.write(gate.wait))
    await turns()
    await c.release()
    assert not claim_released(store.objects[KEY][0])
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: no more writes under this claim (released)"
    gate.set()
    await task


async def test_release_after_the_commit_was_sent_only_closes() -> None:
    store, c, _, _ = await claimed()
    c.commit_sent = True
    await c.release()
    assert not claim_released(store.objects[KEY][0])


async def test_release_never_overwrites_a_claim_taken_meanwhile() -> None:
    store, c, _, _ = await claimed()
    store.store(KEY, claim_bytes(attempt="taker"))
    await c.release()
    assert store.doc()["attempt"] == "taker"


@pytest.mark.parametrize(
    ("exc", "times"),
    [
        (PreconditionFailed(KEY), 1),
        (StoreUnavailable("down"), 4),
        (ObjectNotFound(KEY), 1),
        (OSError("reset"), 1),
    ],
)
async def test_a_release_the_store_refuses_is_given_up(exc: Exception, times: int) -> None:
    """Best effort: the claim then expires."""
    store, c, _, _ = await claimed()
    store.refuse("put", "CLAIM$", exc, times=times)
    await c.release()
    assert not claim_released(store.objects[KEY][0])
    assert store.count("put") == 1 + times


# ------------------------------------------------------------------------- Claim.abandon


async def test_abandon_releases_a_failed_attempt_with_nothing_in_flight() -> None:
    store, c, _, _ = await claimed()
    await c.abandon(ValueError("boom"))
    assert claim_released(store.objects[KEY][0])


async def test_abandon_of_a_process_death_keeps_the_claim() -> None:
    store, c, _, _ = await claimed()
    await c.abandon(SimulatedCrash("dead"))
    assert not claim_released(store.objects[KEY][0])
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == (
        "logs/x/CLAIM: no more writes under this claim (the attempt failed: SimulatedCrash)"
    )


async def test_abandon_keeps_a_claim_that_may_still_land() -> None:
    store, c, _, _ = await claimed()
    c.commit_sent = True
    await c.abandon(ValueError("boom"))
    assert not claim_released(store.objects[KEY][0])


async def test_abandon_of_a_lost_claim_writes_nothing() -> None:
    store, c, _, clock = await claimed(ttl=100.0)
    store.store(KEY, claim_bytes(attempt="taker"))
    clock.advance(25.0)
    with pytest.raises(ClaimLost):
        await c.guard()
    puts = store.count("put")
    await c.abandon(ValueError("boom"))
    assert store.count("put") == puts


async def test_abandon_of_an_interpreter_exit_keeps_the_claim() -> None:
    store, c, _, _ = await claimed()
    await c.abandon(KeyboardInterrupt())
    assert not claim_released(store.objects[KEY][0])


async def test_a_cancelled_attempt_releases_in_a_shielded_task() -> None:
    """The release runs as a task named after the claim and kept in ``_RELEASING`` until it
    ends; cancelling the abandoning task again does not stop it."""
    store, c, _, _ = await claimed()
    gate = asyncio.Event()
    seen: list[tuple[str, bool]] = []

    async def held(_: str) -> None:
        task = asyncio.current_task()
        assert task is not None
        seen.append((task.get_name(), task in claim_module._RELEASING))
        await gate.wait()

    store.before("put", "CLAIM$", held)
    abandoning = asyncio.ensure_future(c.abandon(asyncio.CancelledError()))
    await turns()
    assert seen == [("release:logs/x/CLAIM", True)]
    abandoning.cancel()
    await turns()
    assert abandoning.done() and not abandoning.cancelled()
    assert abandoning.result() is None
    gate.set()
    await turns()
    assert claim_released(store.objects[KEY][0])
    assert not claim_module._RELEASING


async def test_a_cancelled_attempt_releases_when_nothing_may_land() -> None:
    store, c, _, _ = await claimed()
    await c.abandon(asyncio.CancelledError())
    assert claim_released(store.objects[KEY][0])
    await turns()
    assert not claim_module._RELEASING


# ------------------------------------------------------------------------- Claim.finish


async def test_finish_deletes_the_claim_and_closes_it() -> None:
    store, c, _, _ = await claimed()
    await c.finish()
    assert KEY not in store.objects
    with pytest.raises(ClaimLost) as e:
        await c.guard()
    assert str(e.value) == "logs/x/CLAIM: no more writes under this claim (finished)"


async def test_the_first_reason_to_close_is_kept() -> None:
    _, c, _, _ = await claimed()
    await c.abandon(SimulatedCrash("dead"))
    await c.finish()
    with pytest.raises(ClaimLost, match=r"\(the attempt failed: SimulatedCrash\)$"):
        await c.guard()


@pytest.mark.parametrize("exc", [StoreUnavailable("down"), OSError("reset")])
async def test_finish_shrugs_off_a_store_failure(exc: Exception) -> None:
    store, c, _, _ = await claimed()
    store.refuse("delete", "CLAIM$", exc)
    await c.finish()
    assert KEY in store.objects


# ------------------------------------------------------------------------- run_all


async def test_run_all_waits_for_every_one() -> None:
    done: list[int] = []

    async def one(i: int) -> None:
        for _ in range(3 - i):
            await asyncio.sleep(0)
        done.append(i)

    await run_all(one(i) for i in range(3))
    assert sorted(done) == [0, 1, 2]


async def test_run_all_raises_the_first_failure_itself_after_every_one_ended() -> None:
    boom = ValueError("boom")
    ended: list[str] = []
    gate = asyncio.Event()

    async def fails() -> None:
        await asyncio.sleep(0)
        raise boom

    async def waits() -> None:
        try:
            await gate.wait()
        finally:
            ended.append("cancelled")

    with pytest.raises(ValueError) as e:
        await run_all([waits(), fails(), waits()])
    assert e.value is boom
    assert ended == ["cancelled", "cancelled"]


async def test_run_all_unwraps_a_nested_group() -> None:
    inner = KeyError("inner")

    async def fails() -> None:
        raise ExceptionGroup("outer", [ExceptionGroup("mid", [inner]), ValueError("later")])

    with pytest.raises(KeyError) as e:
        await run_all([fails()])
    assert e.value is inner


# ------------------------------------------------------------------ put_claimed, copy_claimed

K = join(P, "snapshot/s")


async def test_put_claimed_creates() -> None:
    store = MemStore()
    store.store(K + "x", b"unrelated")
    await put_claimed(store, K, b"ours")
    assert store.objects[K][0] == b"ours"


async def test_put_claimed_accepts_our_own_bytes_by_etag() -> None:
    store = MemStore()
    store.store(K, b"ours")
    await put_claimed(store, K, b"ours")
    assert store.count("get", K) == 0


async def test_put_claimed_refuses_other_bytes_under_a_plain_etag_unread() -> None:
    store = MemStore()
    store.store(K, b"theirs")
    with pytest.raises(ClaimLost) as e:
        await put_claimed(store, K, b"ours")
    assert str(e.value) == "logs/x/snapshot/s: an object other than ours appeared under our claim"
    assert store.objects[K][0] == b"theirs"
    assert store.count("get", K) == 0


async def test_put_claimed_trusts_an_upper_case_quoted_md5() -> None:
    store = MemStore()
    store.objects[K] = (b"theirs", f'"{md5(b"theirs").upper()}"')
    with pytest.raises(ClaimLost):
        await put_claimed(store, K, b"ours")
    assert store.count("get", K) == 0


async def test_put_claimed_takes_an_etag_ending_in_x_for_multipart() -> None:
    """Only quotes are dropped before judging an etag an MD5: an opaque etag that would be one
    but for a trailing ``X`` is not, so the bytes are compared."""
    store = MemStore()
    store.objects[K] = (b"ours", f'"{md5(b"ours")}X"')
    await put_claimed(store, K, b"ours")
    assert store.count("get", K) == 1


async def test_put_claimed_compares_the_bytes_under_a_multipart_etag() -> None:
    store = MemStore()
    store.multipart.add(K)
    store.store(K, b"ours")
    await put_claimed(store, K, b"ours")
    store.store(K, b"theirs")
    with pytest.raises(ClaimLost):
        await put_claimed(store, K, b"ours")
    assert store.objects[K][0] == b"theirs"


async def test_put_claimed_retries_a_conflict_that_did_not_land() -> None:
    store = MemStore()
    store.refuse("put", "snapshot/s$", PreconditionFailed(K))
    await put_claimed(store, K, b"ours")
    assert store.objects[K][0] == b"ours"


async def test_put_claimed_retries_a_multipart_object_gone_before_its_read() -> None:
    store = MemStore()
    store.multipart.add(K)
    store.store(K, b"theirs")

    async def gone(_: str) -> None:
        del store.objects[K]

    store.before("get", "snapshot/s$", gone)
    await put_claimed(store, K, b"ours")
    assert store.objects[K][0] == b"ours"


async def test_put_claimed_gives_up_after_its_attempts() -> None:
    store = MemStore()
    store.refuse("put", "snapshot/s$", PreconditionFailed(K), times=100)
    with pytest.raises(StoreUnavailable) as e:
        await put_claimed(store, K, b"ours")
    assert str(e.value) == "could not create logs/x/snapshot/s: the store kept refusing"
    assert store.count("put", K) == 8
    store.ops.clear()
    with pytest.raises(StoreUnavailable):
        await put_claimed(store, K, b"ours", attempts=3)
    assert store.count("put", K) == 3


SRC, DST = "logs/src/log/f", join(P, "log/f")


async def test_copy_claimed_copies_create_only() -> None:
    store = MemStore()
    store.store(SRC, b"fragment")
    store.store(SRC + "x", b"another")
    await copy_claimed(store, SRC, DST)
    assert store.objects[DST][0] == b"fragment"
    assert store.ops == [("copy", DST)]


async def test_copy_claimed_accepts_an_equal_etag_unread() -> None:
    store = MemStore()
    store.store(SRC, b"fragment")
    store.objects[DST] = (b"fragment", f'"{md5(b"fragment")}"')
    await copy_claimed(store, SRC, DST)
    assert store.count("get", DST) == 0 and store.count("get", SRC) == 0


@pytest.mark.parametrize(
    ("dst_etag", "src_etag"),
    [("abc-2", '"abc-2"'), ('"abc-2"', "abc-2"), ("Xabc-2X", "Xabc-2X"), ('"Xab"', "Xab")],
)
async def test_copy_claimed_accepts_equal_opaque_etags_unread(dst_etag: str, src_etag: str) -> None:
    """Etags equal but for their quotes name the same bytes, whatever else they hold."""
    store = MemStore()
    store.objects[SRC] = (b"fragment", src_etag)
    store.objects[DST] = (b"fragment", dst_etag)
    await copy_claimed(store, SRC, DST)
    assert store.count("get", DST) == 0 and store.count("get", SRC) == 0


async def test_copy_claimed_refuses_another_plain_md5_unread() -> None:
    store = MemStore()
    store.store(SRC, b"fragment")
    store.store(DST, b"theirs")
    with pytest.raises(ClaimLost) as e:
        await copy_claimed(store, SRC, DST)
    assert str(e.value) == (
        "logs/x/log/f: an object other than a copy of logs/src/log/f appeared under our claim"
    )
    assert store.objects[DST][0] == b"theirs"
    assert store.count("get", DST) == 0


@pytest.mark.parametrize("multipart", [{DST}, {SRC}, {DST, SRC}])
async def test_copy_claimed_compares_the_bytes_unless_both_etags_are_md5s(
    multipart: set[str],
) -> None:
    store = MemStore()
    store.multipart = set(multipart)
    store.store(SRC, b"fragment")
    store.store(DST, b"fragment")
    if multipart == {DST, SRC}:
        store.objects[DST] = (b"fragment", "f" * 31 + "1-2")  # another multipart layout
    await copy_claimed(store, SRC, DST)
    store.store(DST, b"theirs")
    with pytest.raises(ClaimLost):
        await copy_claimed(store, SRC, DST)


async def test_copy_claimed_compares_the_bytes_without_etags() -> None:
    store = MemStore()
    store.objects[SRC] = (b"fragment", "")
    store.objects[DST] = (b"theirs", "")
    with pytest.raises(ClaimLost):
        await copy_claimed(store, SRC, DST)
    store.objects[DST] = (b"fragment", "")
    await copy_claimed(store, SRC, DST)


async def test_copy_claimed_of_a_collected_source() -> None:
    store = MemStore()
    store.store(DST, b"theirs")
    with pytest.raises(ObjectNotFound):
        await copy_claimed(store, SRC, DST)


async def test_copy_claimed_retries_a_conflict_that_did_not_land() -> None:
    store = MemStore()
    store.store(SRC, b"fragment")
    store.refuse("copy", "log/f$", PreconditionFailed(DST))
    await copy_claimed(store, SRC, DST)
    assert store.objects[DST][0] == b"fragment"


async def test_copy_claimed_gives_up_after_its_attempts() -> None:
    store = MemStore()
    store.store(SRC, b"fragment")
    store.refuse("copy", "log/f$", PreconditionFailed(DST), times=100)
    with pytest.raises(StoreUnavailable) as e:
        await copy_claimed(store, SRC, DST)
    assert str(e.value) == "could not copy logs/src/log/f to logs/x/log/f: the store kept refusing"
    assert store.count("copy", DST) == 8
    store.ops.clear()
    with pytest.raises(StoreUnavailable):
        await copy_claimed(store, SRC, DST, attempts=2)
    assert store.count("copy", DST) == 2


# ------------------------------------------------------------------------- create_log


async def test_create_log_cleans_up_commits_and_drops_its_claim() -> None:
    store = MemStore()
    leftovers(store)
    watch, _ = watch_and_clock()
    m = Manifest.empty("w")
    seen: list[Any] = []

    async def at_commit(_: str) -> None:
        seen.append(store.doc())

    store.before("put", "manifest/MANIFEST$", at_commit)
    assert await create_log(store, P, m, holder="h", watch=watch, leftovers=["compacted/u/"])
    [doc] = seen
    assert (doc["purpose"], doc["holder"]) == ("create", "h")
    assert store.objects[MKEY][0] == m.to_bytes()
    assert sorted(store.objects) == [
        "compacted/v/part",
        MKEY,
        join(P, "other/keep"),
        "logs/x2/log/f1",
    ]


async def test_create_log_keeps_the_prefix_but_for_its_slashes() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()
    assert await create_log(store, "/logs/X/", Manifest.empty("w"), holder="h", watch=watch)
    assert "logs/X/manifest/MANIFEST" in store.objects
    assert await create_log(store, " logs/y ", Manifest.empty("w"), holder="h", watch=watch)
    assert " logs/y /manifest/MANIFEST" in store.objects


async def test_create_log_of_an_existing_log() -> None:
    store = MemStore()
    theirs = Manifest.empty("theirs").to_bytes()
    store.store(MKEY, theirs)
    watch, _ = watch_and_clock()
    assert await create_log(store, P, Manifest.empty("w"), holder="h", watch=watch) is False
    assert store.objects[MKEY][0] == theirs


async def test_create_log_loses_the_manifest_race() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()

    async def theirs(_: str) -> None:
        store.store(MKEY, b"theirs")

    store.before("put", "manifest/MANIFEST$", theirs)
    assert await create_log(store, P, Manifest.empty("w"), holder="h", watch=watch) is False
    assert store.objects[MKEY][0] == b"theirs"
    assert KEY not in store.objects


async def test_a_manifest_put_that_may_land_keeps_the_claim() -> None:
    store = MemStore()
    watch, _ = watch_and_clock()
    store.refuse("put", "manifest/MANIFEST$", StoreUnavailable("timeout"), times=4)
    with pytest.raises(StoreUnavailable):
        await create_log(store, P, Manifest.empty("w"), holder="h", watch=watch)
    assert not claim_released(store.objects[KEY][0])


async def test_a_creation_failing_before_its_commit_releases_its_claim() -> None:
    """The renewal before the manifest put fails (the store is down): nothing was sent, so the
    claim is released at once."""
    store = MemStore()
    watch, clock = watch_and_clock(100.0)

    async def late_and_down(_: str) -> None:
        clock.advance(25.0)
        store.refuse("put", "CLAIM$", StoreUnavailable("down"), times=4)

    store.before("get", "manifest/MANIFEST$", lambda _: asyncio.sleep(0))  # before claiming
    store.before("get", "manifest/MANIFEST$", late_and_down)  # after claiming
    with pytest.raises(StoreUnavailable):
        await create_log(store, P, Manifest.empty("w"), holder="h", watch=watch)
    assert MKEY not in store.objects
    assert claim_released(store.objects[KEY][0])


# -------------------------------------------------------------------------------------------
# Mutants not killed here, all equivalent (no input tells them apart):
#
# * ``ClaimWatch.expired``'s ``popitem(last=None)``: None is falsy, so it pops the oldest
#   sighting exactly as ``last=False`` does.
# * ``Claim.__init__``'s ``_lost = None`` and ``_unsettled = None``: both are only ever tested
#   for truth (``release`` sets ``_lost`` to True, ``write`` sets ``_unsettled`` to True), and in
#   ``may_still_land``'s ``... or self._unsettled or self.commit_sent`` a falsy ``_unsettled`` is
#   never the value answered: ``commit_sent`` (a bool) comes after it.
# * ``Claim.abandon``'s ``ProcessDeath or self._lost and self.may_still_land``: an attempt that
#   is lost, or whose writes may still land, then goes on to ``release()`` (or, cancelled, to a
#   shielded task running it), and ``release`` checks ``self._lost or self.may_still_land``
#   again under its lock and returns without a request.  The only trace is a release task that
#   does nothing.
# * ``released_copy``'s ``doc = ""`` for damaged bytes: ``""`` is not a dict either, so the
#   copy is the bare tombstone all the same.
