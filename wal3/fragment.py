"""Fragments: immutable Parquet files holding a contiguous run of a log's records.

Layout (compatible with the Rust wal3 crate): snappy Parquet with columns ``offset`` uint64,
``timestamp_us`` uint64 and ``body`` binary, one timestamp per fragment, stored at
``log/Bucket={b:016x}/FragmentSeqNo={seq:016x}.parquet`` with ``b = seq - seq % 4096``.  A record's
setsum item is ``offset`` (u64 BE) ‖ ``timestamp_us`` (u64 BE) ‖ ``body``.

Two optional key-value entries in the Parquet footer carry what only this implementation reads:
``wal3.prev`` is the setsum of the fragment this one must follow (so read repair never links a stale
speculative fragment after someone else's), and ``wal3.keys`` maps idempotency keys to the
``[first_offset, count, request_hash]`` of the append that carried them (so deduplication survives
restarts, and a reused key with other records is told apart even after those records are
collected).  The hash is ``request_digest`` of the append's bodies; fragments written before it
existed carry ``[first_offset, count]`` and are read as they are.  ``wal3.writer`` names the
writer, so no two writers ever produce the same bytes.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from .errors import CorruptFragment, LogFull
from .parquetwrite import write_fragment_parquet

# Re-exported: every key is spelled in wal3.paths, and older callers import them from here.
from .paths import BUCKET_SIZE as BUCKET_SIZE
from .paths import fragment_path
from .paths import parse_fragment_path as parse_fragment_path
from .setsum import Setsum

_U64_MAX = (1 << 64) - 1  # Rust's u64: sequence numbers and offset limits end here
_ITEM_PREFIX = struct.Struct(">QQ")
# Up to this many records and body bytes, a fragment is written by wal3/parquetwrite.py.
_DIRECT_MAX = 256
_DIRECT_MAX_BYTES = 1 << 20
_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.uint64(), nullable=False),
        pa.field("timestamp_us", pa.uint64(), nullable=False),
        pa.field("body", pa.binary(), nullable=False),
    ]
)
META_PREV = b"wal3.prev"
META_KEYS = b"wal3.keys"
META_WRITER = b"wal3.writer"
_DIGEST_HEX = re.compile(r"[0-9a-f]{32}")

# An idempotency key's entry: first offset, count and, when recorded, the request's hash.
KeyEntry = tuple[int, int] | tuple[int, int, str]


def request_digest(bodies: Sequence[bytes]) -> str:
    """The hash an idempotency key keeps of its append: 128 bits of SHA-256 over the bodies,
    each prefixed by its length (so no two different lists of bodies share the input)."""
    h = hashlib.sha256()
    for b in bodies:
        h.update(len(b).to_bytes(8, "big"))
        h.update(b)
    return h.hexdigest()[:32]


def key_digest(entry: KeyEntry) -> str | None:
    """The request hash of a key's entry, None when the fragment predates it."""
    return entry[2] if len(entry) > 2 else None


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One record of a log."""

    offset: int
    timestamp_us: int
    body: bytes


@dataclass(frozen=True, slots=True)
class EncodedFragment:
    """A fragment ready to upload, with what the manifest will record about it."""

    seq_no: int
    path: str
    data: bytes
    start: int
    limit: int
    timestamp_us: int
    setsum: Setsum

    @property
    def num_bytes(self) -> int:
        """Size of the object in bytes."""
        return len(self.data)

    @property
    def content_md5(self) -> str:
        """Hex MD5 of the object's bytes."""
        return hashlib.md5(self.data, usedforsecurity=False).hexdigest()


@dataclass(frozen=True, slots=True)
class DecodedFragment:
    """A fragment read back from the store."""

    records: list[LogRecord]
    setsum: Setsum
    prev: Setsum | None = None
    keys: dict[str, KeyEntry] = field(default_factory=dict)

    @property
    def start(self) -> int:
        """First offset held."""
        return self.records[0].offset

    @property
    def limit(self) -> int:
        """First offset after the fragment."""
        return self.records[-1].offset + 1


def record_item(offset: int, timestamp_us: int, body: bytes) -> bytes:
    """The bytes a record contributes to the setsum."""
    return _ITEM_PREFIX.pack(offset, timestamp_us) + body


def records_setsum(start: int, timestamp_us: int, bodies: list[bytes]) -> Setsum:
    """Setsum of consecutive records sharing one timestamp."""
    digests = b"".join(
        hashlib.sha3_256(_ITEM_PREFIX.pack(start + i, timestamp_us) + body).digest()
        for i, body in enumerate(bodies)
    )
    return Setsum.of_digests(digests)


def encode_fragment(
    seq_no: int,
    start: int,
    timestamp_us: int,
    bodies: list[bytes],
    *,
    prev: Setsum | None = None,
    keys: Mapping[str, KeyEntry] | None = None,
    writer: str | None = None,
) -> EncodedFragment:
    """Encode bodies as the fragment ``seq_no`` starting at offset ``start``.

    ``writer`` names the writer in the footer: two writers' fragments are then never the same
    bytes, even with equal records and timestamps, so a writer recognises its own by MD5."""
    if not bodies:
        raise ValueError("a fragment holds at least one record")
    n = len(bodies)
    if seq_no > _U64_MAX or start + n > _U64_MAX:
        raise LogFull(f"fragment {seq_no} of {n} records from offset {start} does not fit u64")
    meta: dict[bytes, bytes] = {}
    if prev is not None:
        meta[META_PREV] = prev.hexdigest().encode()
    if keys:
        meta[META_KEYS] = json.dumps(
            {k: list(v) for k, v in keys.items()}, separators=(",", ":")
        ).encode()
    if writer is not None:
        meta[META_WRITER] = writer.encode()
    if n <= _DIRECT_MAX and sum(map(len, bodies)) <= _DIRECT_MAX_BYTES:
        # Written directly (wal3/parquetwrite.py): pyarrow's writer costs about 200 µs of
        # set-up per file, most of a small fragment's cost.
        data = write_fragment_parquet(start, timestamp_us, bodies, meta)
    else:
        # pyarrow's writer, whose per-record work is in C++: past a few hundred records it is
        # the faster of the two, and it splits a large column into pages of about 1 MiB (the
        # direct writer puts each column in one page, whose size Parquet caps at 2 GiB).
        data = _write_with_pyarrow(start, timestamp_us, bodies, meta)
    return EncodedFragment(
        seq_no=seq_no,
        path=fragment_path(seq_no),
        data=data,
        start=start,
        limit=start + n,
        timestamp_us=timestamp_us,
        setsum=records_setsum(start, timestamp_us, bodies),
    )


def _write_with_pyarrow(
    start: int, timestamp_us: int, bodies: list[bytes], meta: dict[bytes, bytes]
) -> bytes:
    n = len(bodies)
    table = pa.Table.from_arrays(
        [
            pa.array(np.arange(start, start + n, dtype=np.uint64), type=pa.uint64()),
            pa.array(np.full(n, timestamp_us, dtype=np.uint64), type=pa.uint64()),
            pa.array(bodies, type=pa.binary()),
        ],
        schema=_SCHEMA.with_metadata(meta or None),
    )
    sink = pa.BufferOutputStream()  # cheaper than BytesIO
    # Statistics only where a reader uses them (offset ranges, the timestamp); dictionary
    # encoding only for the one repeated value (the timestamp).
    pq.write_table(
        table,
        sink,
        compression="snappy",
        write_statistics=["offset", "timestamp_us"],
        use_dictionary=["timestamp_us"],
    )
    data: bytes = sink.getvalue().to_pybytes()
    return data


def read_footer(data: bytes) -> tuple[Setsum | None, dict[str, KeyEntry]]:
    """The ``prev`` setsum and idempotency keys from a fragment's footer, without the rows."""
    try:
        schema = pq.read_schema(pa.BufferReader(data))
    except (pa.ArrowInvalid, OSError) as e:
        raise CorruptFragment(f"unreadable fragment: {e}") from e
    return _footer(schema.metadata or {})


def read_keys(data: bytes) -> tuple[dict[str, KeyEntry], int]:
    """A fragment's idempotency keys and its timestamp (one per fragment: what the appends it
    carried were answered with), reading the footer and, when the writer kept no statistics,
    the first timestamp; the timestamp is 0 when there are no keys (nothing asks for it)."""
    try:
        f = pq.ParquetFile(pa.BufferReader(data))
        keys = _footer(f.schema_arrow.metadata or {})[1]
        md = f.metadata
        if not keys or md.num_rows == 0 or md.num_row_groups == 0:
            return keys, 0
        column = md.row_group(0).column(f.schema_arrow.get_field_index("timestamp_us"))
        stats = column.statistics
        if column.is_stats_set and stats is not None and stats.has_min_max:
            return keys, int(stats.min)
        first = f.read_row_group(0, columns=["timestamp_us"]).column(0)[0].as_py()
        return keys, int(first)
    except (pa.ArrowInvalid, OSError, IndexError, TypeError, ValueError) as e:
        raise CorruptFragment(f"unreadable fragment: {e}") from e


def _key_entry(v: list[Any]) -> KeyEntry:
    first, count = int(v[0]), int(v[1])  # JSON values: int() takes them or raises (corrupt)
    if len(v) < 3:
        return first, count  # written before keys carried their request's hash
    digest = v[2]
    if not isinstance(digest, str) or not _DIGEST_HEX.fullmatch(digest):
        raise ValueError(f"request hash {digest!r}")
    return first, count, digest


def _footer(meta: dict[bytes, bytes]) -> tuple[Setsum | None, dict[str, KeyEntry]]:
    prev = None
    keys: dict[str, KeyEntry] = {}
    try:
        if META_PREV in meta:
            prev = Setsum.from_hexdigest(meta[META_PREV].decode())
        if META_KEYS in meta:
            keys = {k: _key_entry(v) for k, v in json.loads(meta[META_KEYS]).items()}
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        raise CorruptFragment(f"bad fragment footer: {e}") from e
    return prev, keys


def decode_fragment(data: bytes, *, compute_setsum: bool = True) -> DecodedFragment:
    """Decode a fragment and compute its setsum; raises CorruptFragment.

    With ``compute_setsum=False`` (the bytes were already verified by their MD5) the returned
    setsum is zero and no record is hashed.
    """
    try:
        # ParquetFile, not read_table: no lazy pyarrow.dataset import (0.4 s on first use).
        table = pq.ParquetFile(pa.BufferReader(data)).read()
        # Lists, not ``to_numpy()``: pyarrow imports pandas on its first ``to_numpy`` (0.5 s on
        # the event loop of whichever request or roll-up decodes a host's first fragment).
        columns = [table.column("offset"), table.column("timestamp_us")]
        if any(c.null_count or not pa.types.is_integer(c.type) for c in columns):
            raise CorruptFragment("fragment offsets and timestamps must be whole numbers")
        offsets: list[int] = columns[0].to_pylist()
        stamps: list[int] = columns[1].to_pylist()
        bodies: list[bytes] = table.column("body").to_pylist()
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise CorruptFragment(f"unreadable fragment: {e}") from e
    if len(bodies) == 0:
        raise CorruptFragment("empty fragment")
    if offsets != list(range(offsets[0], offsets[0] + len(offsets))):
        raise CorruptFragment("fragment offsets are not contiguous")
    records = [
        LogRecord(offset=o, timestamp_us=t, body=b)
        for o, t, b in zip(offsets, stamps, bodies, strict=True)
    ]
    setsum = Setsum.zero()
    if compute_setsum:
        setsum = Setsum.of_digests(
            b"".join(
                hashlib.sha3_256(record_item(r.offset, r.timestamp_us, r.body)).digest()
                for r in records
            )
        )
    prev, keys = _footer(table.schema.metadata or {})
    return DecodedFragment(records=records, setsum=setsum, prev=prev, keys=keys)
