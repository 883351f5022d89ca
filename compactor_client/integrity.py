"""Verifying a fragment against its pointer before anything of it is folded.

Runs inside Spark executors: the standard library only (``hashlib``), no numpy, no host package.
The host reports each fragment's ``setsum`` (always) and ``content_md5`` (when the manifest
records it).  The MD5 proves every byte of the object; the setsum proves the records (offset,
timestamp, body), which is what compaction consumes.  Either failing means the object is not
what the log committed, and the collection must not be compacted from it.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

from .errors import CompactorError

# The setsum crate's primes (wal3/setsum.py); lane i is summed modulo PRIMES[i].
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
_U64 = struct.Struct(">QQ")


class CorruptFragmentError(CompactorError, ValueError):
    """A fragment does not match the checksum its pointer records (``kind`` names the error)."""

    kind = "corrupt_fragment"


class UnverifiableFragmentError(CompactorError, ValueError):
    """The host reported a fragment with no checksum: it cannot be verified, so it is not used."""

    kind = "unverifiable_fragment"


def setsum_hex(records: Iterable[tuple[int, int, bytes]]) -> str:
    """The setsum hex digest of ``(offset, timestamp_us, body)`` records (byte-compatible)."""
    acc = [0] * 8
    for offset, ts, body in records:
        lanes = _LANES.unpack(hashlib.sha3_256(_U64.pack(offset, ts) + body).digest())
        for i in range(8):
            acc[i] += lanes[i] % PRIMES[i]
    return _LANES.pack(*(a % p for a, p in zip(acc, PRIMES, strict=True))).hex()


def check_md5(url: str, data: bytes, content_md5: str) -> None:
    """Raise ``CorruptFragmentError`` unless ``data`` has the recorded MD5."""
    got = hashlib.md5(data, usedforsecurity=False).hexdigest()
    if got != content_md5.strip('"').lower():
        raise CorruptFragmentError(f"{url}: MD5 {got} differs from the recorded {content_md5}")


def check_setsum(url: str, records: Iterable[tuple[int, int, bytes]], setsum: str) -> None:
    """Raise ``CorruptFragmentError`` unless the records have the recorded setsum."""
    got = setsum_hex(records)
    if got != setsum.lower():
        raise CorruptFragmentError(f"{url}: setsum {got} differs from the recorded {setsum}")
