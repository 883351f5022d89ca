"""``KeyWindow`` (wal3/idempotency.py) rule by rule, driven directly over a store holding hand-made
fragments: which keys stay whole in memory, which spill to a pointer at their footer and how
many, the window's edge, the answers a footer gives, waiters failing, and fragments learned after
the first load.  Written against the mutation run of the module (docs/RELIABILITY.md)."""

from __future__ import annotations

import asyncio
import collections
from pathlib import Path

import pytest

from wal3.appends import AppendResult
from wal3.errors import WriterClosed
from wal3.fragment import encode_fragment
from wal3.idempotency import KeyWindow
from wal3.localstore import LocalStore
from wal3.options import IdempotencyOptions
from wal3.paths import fragment_path, join

PREFIX = "t/log"
DIGEST = "ab" * 16


class World:
    def __init__(self, tmp: Path, **opts: int) -> None:
        self.store = LocalStore(tmp, fsync=False)
        self.stats: collections.Counter[str] = collections.Counter()
        self.next_seq = 1
        self.learned = 0
        self.kw = KeyWindow(
            self.store,
            PREFIX,
            IdempotencyOptions(**opts),
            self.stats,
            next_seq_no=lambda: self.next_seq,
            on_learned=self._on_learned,
        )

    def _on_learned(self) -> None:
        self.learned += 1

    async def fragment(self, seq: int, keys: dict[str, tuple[int, int, str]], ts: int) -> None:
        """Fragment ``seq`` holding one record per key (offsets as the keys say)."""
        start = min(v[0] for v in keys.values())
        count = max(v[0] + v[1] for v in keys.values()) - start
        f = encode_fragment(seq, start, ts, [b"r"] * count, keys=keys, writer="w")
        await self.store.put(join(PREFIX, fragment_path(seq)), f.data)
        self.next_seq = max(self.next_seq, seq + 1)


def result(first: int, ts: int = 7) -> AppendResult:
    return AppendResult(first, 1, ts, digest=DIGEST)


async def test_a_key_answered_without_waiters_is_remembered(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.kw.resolved("k", result(3), 1)  # nobody waited on it: nothing to pop, no error
    assert w.kw.known("k") == result(3)
    w.kw.resolved("j", result(4), None)  # answered from a known key: not remembered again
    assert w.kw.known("j") is None


async def test_fail_waiters_fails_the_pending_and_leaves_the_answered(tmp_path: Path) -> None:
    w = World(tmp_path)
    loop = asyncio.get_running_loop()
    pending, answered = loop.create_future(), loop.create_future()
    answered.set_result(result(1))
    w.kw.wait_on("a", pending)
    w.kw.wait_on("b", answered)
    err = WriterClosed("stopped")
    w.kw.fail_waiters(err)
    assert pending.exception() is err
    assert answered.result() == result(1)
    assert w.kw.waiter("a") is None and w.kw.waiter("b") is None


async def test_window_keys_are_kept_whole_and_no_more(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=2, spill_keys=0)
    w.kw.resolved("a", result(0), 1)
    w.kw.resolved("b", result(1), 1)
    assert len(w.kw) == 2 and w.kw.known("a") and w.kw.known("b")
    w.kw.resolved("c", result(2), 1)
    assert len(w.kw) == 2 and w.kw.known("a") is None  # the oldest went first
    assert await w.kw.spilled("a") is None  # and nothing spilled: spill_keys is 0


async def test_a_key_pushed_out_is_answered_from_its_footer(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=1, spill_keys=1)
    await w.fragment(5, {"a": (10, 2, DIGEST), "b": (12, 1, "cd" * 16)}, ts=99)
    w.kw.resolved("a", AppendResult(10, 2, 99, digest=DIGEST), 5)
    w.kw.resolved("b", AppendResult(12, 1, 99, digest="cd" * 16), 5)
    assert w.kw.known("a") is None
    assert await w.kw.spilled("a") == AppendResult(10, 2, 99, digest=DIGEST)
    assert await w.kw.spilled("a") == AppendResult(10, 2, 99, digest=DIGEST)
    assert w.stats["dedup_footer_hits"] == 2
    assert await w.kw.spilled("zz") is None  # never seen


async def test_spill_keys_bound_the_spilled_oldest_first(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=1, spill_keys=2)
    keys = {k: (i, 1, DIGEST) for i, k in enumerate("abcd")}
    await w.fragment(1, keys, ts=5)
    for k, (first, _, _) in keys.items():
        w.kw.resolved(k, result(first, 5), 1)
    # d whole in memory; c and b spilled (2 of them); a pushed out of the spill too.
    assert w.kw.known("d") == result(3, 5)
    assert await w.kw.spilled("c") == result(2, 5)
    assert await w.kw.spilled("b") == result(1, 5)
    assert await w.kw.spilled("a") is None


async def test_the_window_edge_is_inclusive(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=1, spill_keys=4, window_fragments=3)
    await w.fragment(2, {"a": (0, 1, DIGEST), "b": (1, 1, DIGEST)}, ts=1)
    w.kw.resolved("a", result(0, 1), 2)
    w.kw.resolved("b", result(1, 1), 2)
    w.next_seq = 5  # fragments 2, 3, 4 are the window: 2 is its first
    assert await w.kw.spilled("a") == result(0, 1)
    w.next_seq = 6  # 2 left it
    assert await w.kw.spilled("a") is None


async def test_keys_learned_from_footers_spill_to_their_fragment(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=1, spill_keys=8)
    await w.fragment(1, {"a": (0, 1, DIGEST)}, ts=11)
    await w.fragment(2, {"b": (1, 1, DIGEST)}, ts=12)
    assert w.kw.loaded is False
    await w.kw.ensure_loaded()
    assert w.kw.loaded and w.learned == 1
    assert w.kw.known("b") == result(1, 12)
    assert await w.kw.spilled("a") == result(0, 11)  # pushed out, its fragment remembered
    w.kw.expire()  # every learned key has its fragment: expiring compares sequence numbers
    assert w.kw.known("b") == result(1, 12)


async def test_fragments_linked_after_the_first_load_are_learned(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.fragment(1, {"a": (0, 1, DIGEST)}, ts=3)
    await w.kw.ensure_loaded()
    await w.fragment(2, {"b": (1, 1, DIGEST)}, ts=4)  # read repair or another writer linked it
    w.kw.unlearned([2])
    await w.kw.ensure_loaded()
    assert w.kw.known("b") == result(1, 4)
    assert w.learned == 2


@pytest.mark.parametrize("missing", [True, False])
async def test_a_fragment_collected_long_ago_teaches_nothing(tmp_path: Path, missing: bool) -> None:
    w = World(tmp_path)
    if not missing:
        await w.fragment(1, {"a": (0, 1, DIGEST)}, ts=3)
    w.next_seq = 2
    await w.kw.ensure_loaded()
    assert (w.kw.known("a") is None) == missing


async def test_expire_keeps_the_window_edge_and_forgets_what_left_it(tmp_path: Path) -> None:
    # Memory is bounded by the window: keys, their fragments and spilled pointers past it go
    # (the private maps are what that bound is about), and the window's first fragment stays.
    w = World(tmp_path, window_keys=2, spill_keys=8, window_fragments=3)
    await w.fragment(2, {"a": (0, 1, DIGEST), "b": (1, 1, DIGEST)}, ts=1)
    await w.fragment(3, {"c": (2, 1, DIGEST), "d": (3, 1, DIGEST)}, ts=2)
    for k, first, seq in (("a", 0, 2), ("b", 1, 2), ("c", 2, 3), ("d", 3, 3)):
        w.kw.resolved(k, result(first, seq - 1), seq)
    assert len(w.kw._spill) == 2  # a and b, pointing at fragment 2
    w.next_seq = 5  # the window is 2, 3, 4
    w.kw.expire()
    assert len(w.kw._spill) == 2
    assert await w.kw.spilled("a") == result(0, 1)
    w.next_seq = 6  # 2 left: a and b go; c and d (fragment 3) stay whole
    w.kw.expire()
    assert w.kw._spill == {} and set(w.kw._key_seq) == {"c", "d"}
    assert w.kw.known("c") == result(2, 2)
    w.next_seq = 7
    w.kw.expire()
    assert len(w.kw) == 0 and w.kw._key_seq == {}


# ------------------------------------------------- pinned against the mutants of the module


class GatedStore(LocalStore):
    """A local store whose gets wait for ``gate`` (counting how many wait at once)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fsync=False)
        self.gate = asyncio.Event()
        self.waiting = 0
        self.most = 0

    async def get(self, key: str):  # type: ignore[no-untyped-def]
        self.waiting += 1
        self.most = max(self.most, self.waiting)
        await self.gate.wait()
        self.waiting -= 1
        return await super().get(key)


async def test_an_append_waited_on_is_the_waiter_until_answered(tmp_path: Path) -> None:
    w = World(tmp_path)
    shared = asyncio.get_running_loop().create_future()
    w.kw.wait_on("k", shared)
    assert w.kw.waiter("k") is shared and w.kw.waiter("j") is None
    w.kw.resolved("k", result(3), 1)
    assert w.kw.waiter("k") is None
    w.kw.wait_on("j", shared)
    w.kw.resolved("j", result(4), None)  # answered from a key known: no waiter either
    assert w.kw.waiter("j") is None


async def test_a_rejection_drops_only_the_waiter_it_names(tmp_path: Path) -> None:
    w = World(tmp_path)
    loop = asyncio.get_running_loop()
    first, second = loop.create_future(), loop.create_future()
    w.kw.wait_on("k", second)  # a later append with the key waits on its own future
    w.kw.rejected("k", first)  # the earlier one failing leaves it
    assert w.kw.waiter("k") is second
    w.kw.rejected("k", second)
    assert w.kw.waiter("k") is None


async def test_a_key_answered_again_is_the_newest_in_memory(tmp_path: Path) -> None:
    w = World(tmp_path, window_keys=2, spill_keys=0)
    w.kw.resolved("a", result(0), 1)
    w.kw.resolved("b", result(1), 1)
    w.kw.resolved("a", result(0), 2)  # answered again: now the newest
    w.kw.resolved("c", result(2), 2)
    assert w.kw.known("a") == result(0) and w.kw.known("b") is None


@pytest.mark.parametrize("damage", ["missing", "corrupt", "other-keys"])
async def test_a_spilled_key_whose_footer_fails_is_no_answer(tmp_path: Path, damage: str) -> None:
    w = World(tmp_path, window_keys=1, spill_keys=4)
    if damage == "corrupt":
        await w.store.put(join(PREFIX, fragment_path(1)), b"not a fragment")
    elif damage == "other-keys":  # a hash collision: the footer at the pointer lacks the key
        await w.fragment(1, {"x": (0, 1, DIGEST)}, ts=3)
    w.next_seq = 2
    w.kw.resolved("a", result(0), 1)
    w.kw.resolved("b", result(1), 1)  # pushes a out, pointing at fragment 1
    assert await w.kw.spilled("a") is None
    assert w.stats["dedup_footer_hits"] == 0


async def test_the_first_load_reads_exactly_the_window_below_the_tail(tmp_path: Path) -> None:
    w = World(tmp_path, window_fragments=2)
    for seq in (1, 2, 3, 4):
        await w.fragment(seq, {f"k{seq}": (seq, 1, DIGEST)}, ts=seq)
    w.next_seq = 4  # fragment 4 is past the tail (written, not linked): not the log's yet
    await w.kw.ensure_loaded()
    assert w.kw.loaded is True
    assert [k for k in ("k1", "k2", "k3", "k4") if w.kw.known(k)] == ["k2", "k3"]


async def test_a_key_in_memory_keeps_its_first_answer_over_a_footer(tmp_path: Path) -> None:
    w = World(tmp_path)
    await w.fragment(1, {"k": (0, 1, DIGEST), "j": (1, 1, DIGEST)}, ts=3)
    w.kw.resolved("k", result(9, 9), 1)  # answered before the footer was read
    await w.kw.ensure_loaded()
    assert w.kw.known("k") == result(9, 9)
    assert w.kw.known("j") == result(1, 3)


async def test_footers_are_read_sixteen_at_a_time(tmp_path: Path) -> None:
    w = World(tmp_path)
    w.store = GatedStore(tmp_path)
    w.kw._store = w.store
    w.next_seq = 40
    loading = asyncio.ensure_future(w.kw.ensure_loaded())
    for _ in range(50):
        await asyncio.sleep(0)
    assert w.store.waiting == 16
    w.store.gate.set()
    await loading
    assert w.store.most == 16 and w.kw.loaded


# -------------------------------------------------------------------------------------------
# Mutants not killed here, all equivalent (no input tells them apart):
#
# * ``_remember``'s ``popitem(last=None)``: None is falsy, so the oldest key goes, as with False.
# * ``_remember``'s ``_key_seq.pop(old)`` (no default), and ``expire``'s ``_key_seq.get(key)``
#   / ``get(key, None)`` and ``_key_seq.pop(key)``: every key in ``_keys`` has its fragment in
#   ``_key_seq`` (both are set together in ``_remember`` and dropped together), so the default
#   is never used.
# * ``_remember``'s ``seq is not None or spill_keys > 0`` and ``spill_keys >= 0``: ``seq`` is
#   never None (see above), and with ``spill_keys`` at 0 (or below) the pointer the mutant adds
#   is dropped at once by the bound right after it: the spill stays empty.
# * ``expire``'s ``return`` for the spill loop's ``break``: it is the last statement.
# * ``learn``'s ``return {}, 1`` for a collected fragment: with no keys its timestamp is unused.
# * ``learn``'s ``zip(..., strict=False / None / absent)``: ``found`` is gathered from ``seqs``,
#   one answer each, so the lengths always match.
