"""Setsum: an order-free, incremental checksum of a multiset of byte strings.

Byte-compatible with the Rust ``setsum`` crate: each item is hashed with SHA3-256, the digest is
read as eight little-endian u32 lanes, and lane ``i`` is reduced and summed modulo ``PRIMES[i]``.
Adding and removing items are O(1), so a manifest can carry the checksum of everything ever written
and prove, after garbage collection or compaction, that nothing was lost or altered.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable

import numpy as np

PRIMES: tuple[int, ...] = (
    4294967291,
    4294967279,
    4294967231,
    4294967197,
    4294967189,
    4294967161,
    4294967143,
    4294967111,
)
_LANES = struct.Struct("<8I")
# Exactly 64 hex digits.  ``bytes.fromhex`` alone would skip whitespace (64 characters with spaces
# decode to fewer than 32 bytes); Rust's crate also accepts upper case, so do we.
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_PRIMES_NP = np.array(PRIMES, dtype=np.uint64)
_SMALLEST_PRIME = min(PRIMES)
_FEW_DIGESTS_BYTES = 8 * 32  # up to 8 digests, of_digests sums without numpy


class Setsum:
    """An immutable setsum value."""

    __slots__ = ("_lanes",)

    def __init__(self, lanes: Iterable[int] = (0, 0, 0, 0, 0, 0, 0, 0)) -> None:
        lanes = tuple(int(x) for x in lanes)
        if len(lanes) != 8 or any(not 0 <= x < p for x, p in zip(lanes, PRIMES, strict=True)):
            raise ValueError("a setsum has eight lanes, each reduced modulo its prime")
        self._lanes: tuple[int, ...] = lanes

    # ----------------------------------------------------------------------------- building

    @classmethod
    def zero(cls) -> Setsum:
        """The setsum of the empty set."""
        return cls()

    @classmethod
    def of(cls, item: bytes) -> Setsum:
        """The setsum of a single item."""
        lanes = _LANES.unpack(hashlib.sha3_256(item).digest())
        return cls(x % p for x, p in zip(lanes, PRIMES, strict=True))

    @classmethod
    def of_items(cls, items: Iterable[bytes]) -> Setsum:
        """The setsum of many items, summed in one vectorised pass."""
        digests = b"".join(hashlib.sha3_256(item).digest() for item in items)
        return cls.of_digests(digests)

    @classmethod
    def of_digests(cls, digests: bytes) -> Setsum:
        """Sum concatenated 32-byte SHA3-256 digests."""
        if not digests:
            return cls()
        if len(digests) <= _FEW_DIGESTS_BYTES and len(digests) % 32 == 0:
            # A few digests (a small fragment's records): numpy's set-up costs more than
            # summing them one by one.
            acc = [0, 0, 0, 0, 0, 0, 0, 0]
            for lanes_of_one in _LANES.iter_unpack(digests):
                for i, x in enumerate(lanes_of_one):
                    acc[i] += x
            return cls._trusted(tuple(a % p for a, p in zip(acc, PRIMES, strict=True)))
        lanes = np.frombuffer(digests, dtype="<u4").reshape(-1, 8).astype(np.uint64)
        lanes %= _PRIMES_NP
        # Each reduced lane is < 2**32, so 2**32 of them still fit in a u64 sum.
        total = np.zeros(8, dtype=np.uint64)
        for chunk in range(0, lanes.shape[0], 1 << 31):
            total = (total + lanes[chunk : chunk + (1 << 31)].sum(axis=0)) % _PRIMES_NP
        return cls._trusted(tuple(int(x) for x in total))

    @classmethod
    def _trusted(cls, lanes: tuple[int, ...]) -> Setsum:
        # Lanes already reduced by our own arithmetic: skip validation on the hot path.
        obj = object.__new__(cls)
        obj._lanes = lanes
        return obj

    @classmethod
    def sum(cls, values: Iterable[Setsum]) -> Setsum:
        """The sum of many setsums, reducing once per lane."""
        acc = [0, 0, 0, 0, 0, 0, 0, 0]
        for v in values:
            la = v._lanes
            acc[0] += la[0]
            acc[1] += la[1]
            acc[2] += la[2]
            acc[3] += la[3]
            acc[4] += la[4]
            acc[5] += la[5]
            acc[6] += la[6]
            acc[7] += la[7]
        return cls._trusted(tuple(a % p for a, p in zip(acc, PRIMES, strict=True)))

    # --------------------------------------------------------------------------- arithmetic

    def __add__(self, other: Setsum) -> Setsum:
        return Setsum._trusted(
            tuple((a + b) % p for a, b, p in zip(self._lanes, other._lanes, PRIMES, strict=True))
        )

    def __sub__(self, other: Setsum) -> Setsum:
        return Setsum._trusted(
            tuple((a - b) % p for a, b, p in zip(self._lanes, other._lanes, PRIMES, strict=True))
        )

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Setsum) and self._lanes == other._lanes

    def __hash__(self) -> int:
        return hash(self._lanes)

    def __bool__(self) -> bool:
        return any(self._lanes)

    def is_zero(self) -> bool:
        """Whether this is the setsum of the empty set."""
        return not any(self._lanes)

    # ------------------------------------------------------------------------------ encoding

    def digest(self) -> bytes:
        """The 32-byte digest: the lanes written back little-endian."""
        return _LANES.pack(*self._lanes)

    def hexdigest(self) -> str:
        """The 64-character lowercase hex digest."""
        return self.digest().hex()

    @classmethod
    def from_hexdigest(cls, text: str) -> Setsum:
        """Parse a hex digest; raises ValueError on anything malformed.

        Stricter than the Rust crate in two hostile cases only: it would accept a ``+`` before a
        byte's digits and lanes not reduced modulo their prime; neither is ever written by either
        implementation.
        """
        if not isinstance(text, str) or not _HEX64.fullmatch(text):
            raise ValueError(f"a setsum hex digest is 64 hex digits: {text!r:.80}")
        lanes: tuple[int, ...] = _LANES.unpack(bytes.fromhex(text))
        if max(lanes) < _SMALLEST_PRIME:
            return cls._trusted(lanes)  # every lane is reduced: a manifest parses thousands
        return cls(lanes)

    def __repr__(self) -> str:
        return f"Setsum({self.hexdigest()})"

    def __str__(self) -> str:
        return self.hexdigest()
