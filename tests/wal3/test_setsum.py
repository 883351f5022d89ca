"""Setsum: the Rust crate's test vector, algebra, and parsing."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wal3 import Setsum

WORDS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh"]
VECTOR = "c5b3fd4d01f2b8040f54ab7412ca53bbfc990e272a40add1c4ceba6b2fe472d5"


def items() -> list[bytes]:
    return [f"this is the {w} value".encode() for w in WORDS]


def test_rust_test_vector_in_any_order() -> None:
    rng = random.Random(7)
    for _ in range(5):
        order = items()
        rng.shuffle(order)
        total = Setsum.zero()
        for it in order:
            total = total + Setsum.of(it)
        assert total.hexdigest() == VECTOR
    assert Setsum.of_items(items()).hexdigest() == VECTOR


def test_zero_and_identity() -> None:
    assert Setsum.zero().hexdigest() == "0" * 64
    assert Setsum.zero().is_zero()
    s = Setsum.of(b"x")
    assert s + Setsum.zero() == s
    assert s - s == Setsum.zero()
    assert not (s - s)


def test_subtract_undoes_add() -> None:
    all_items = Setsum.of_items(items())
    for k in range(len(WORDS)):
        for subset in itertools.combinations(items(), k):
            rest = [i for i in items() if i not in subset]
            assert all_items - Setsum.of_items(list(subset)) == Setsum.of_items(rest)


@given(st.lists(st.binary(max_size=64), max_size=30), st.randoms())
def test_vectorised_sum_equals_incremental(data: list[bytes], rnd: random.Random) -> None:
    incremental = Setsum.zero()
    for d in data:
        incremental = incremental + Setsum.of(d)
    shuffled = list(data)
    rnd.shuffle(shuffled)
    assert Setsum.of_items(shuffled) == incremental
    assert Setsum.from_hexdigest(incremental.hexdigest()) == incremental


def test_multiset_not_set() -> None:
    a = Setsum.of(b"a")
    assert a + a != a
    assert Setsum.of_items([b"a", b"a"]) == a + a


@pytest.mark.parametrize("bad", ["", "00", "z" * 64, "f" * 64, "0" * 63])
def test_parse_rejects(bad: str) -> None:
    # "f"*64 has lanes >= their primes: not a reduced setsum.
    with pytest.raises(ValueError):
        Setsum.from_hexdigest(bad)


def test_each_lane_must_be_reduced_below_its_prime() -> None:
    """A lane equal to its prime is not reduced; Rust never writes one, and neither may we accept
    it (two encodings of one value would make equal setsums compare unequal)."""
    from wal3.setsum import PRIMES

    for i, p in enumerate(PRIMES):
        lanes = [0] * 8
        lanes[i] = p - 1
        assert Setsum(lanes).digest()  # the largest reduced value is fine
        assert Setsum.from_hexdigest(Setsum(lanes).hexdigest()) == Setsum(lanes)
        lanes[i] = p
        with pytest.raises(
            ValueError, match=r"^a setsum has eight lanes, each reduced modulo its prime$"
        ):
            Setsum(lanes)
        with pytest.raises(ValueError):
            Setsum.from_hexdigest(b"".join(x.to_bytes(4, "little") for x in lanes).hex())
    with pytest.raises(ValueError, match="eight lanes"):
        Setsum([0] * 7)


def test_a_bad_hex_digest_is_quoted_in_the_error() -> None:
    with pytest.raises(ValueError, match=r"^a setsum hex digest is 64 hex digits: 'zz'$"):
        Setsum.from_hexdigest("zz")


def test_distinct_setsums_hash_apart() -> None:
    """Setsums key dictionaries (the GC's and the simulator's bookkeeping): equal ones hash alike,
    distinct ones do not all collide."""
    a, b = Setsum.of(b"a"), Setsum.of(b"b")
    assert hash(a) == hash(Setsum.from_hexdigest(a.hexdigest()))
    assert len({hash(Setsum.of(bytes([i]))) for i in range(64)}) == 64
    assert hash(a) != hash(b)


@pytest.mark.parametrize("few", [1, 2, 7, 8, 9])
def test_a_few_digests_sum_as_numpy_sums_them(few: int) -> None:
    # Up to 8 digests are summed in Python, more with numpy: both give one setsum (the many
    # minus the same many is the few, through numpy's path on both sides).
    import hashlib

    digests = [hashlib.sha3_256(b"%d" % i).digest() for i in range(few + 40)]
    assert Setsum.of_digests(b"".join(digests[:few])) == Setsum.of_digests(
        b"".join(digests)
    ) - Setsum.of_digests(b"".join(digests[few:]))
    with pytest.raises(ValueError):
        Setsum.of_digests(b"".join(digests[:few])[:-1])
