"""Idempotency keys carry a hash of their request (issue 21, V7).

A reused key with other records must be told apart from a retry even when the first append's
records are gone (compacted and collected): the key keeps ``request_digest`` of its bodies in the
writer's window and in the fragment footer.  Footers written before (``[first, count]``) still
read.
"""

from __future__ import annotations

import asyncio
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wal3 import BatchOptions, CorruptFragment, LogWriter, LogWriterOptions, ObjectStore
from wal3.fragment import (
    META_KEYS,
    decode_fragment,
    encode_fragment,
    read_footer,
    request_digest,
)


def _with_keys_footer(data: bytes, raw: bytes) -> bytes:
    """The same fragment with its ``wal3.keys`` footer replaced by ``raw``."""
    table = pq.ParquetFile(pa.BufferReader(data)).read()
    meta = dict(table.schema.metadata or {})
    meta[META_KEYS] = raw
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink)
    return bytes(sink.getvalue().to_pybytes())


def test_request_digest_tells_lists_of_bodies_apart() -> None:
    assert request_digest([b"ab", b"c"]) != request_digest([b"a", b"bc"])
    assert request_digest([b"x"]) == request_digest([b"x"])
    assert len(request_digest([b"x"])) == 32


def test_footer_keys_carry_the_hash_and_old_footers_still_read() -> None:
    digest = request_digest([b"a", b"b"])
    frag = encode_fragment(1, 1, 1, [b"a", b"b"], keys={"new": (1, 2, digest)})
    assert read_footer(frag.data)[1] == {"new": (1, 2, digest)}
    assert decode_fragment(frag.data).keys == {"new": (1, 2, digest)}
    # what earlier versions wrote: no hash, read as it is
    old = _with_keys_footer(frag.data, b'{"old":[1,2]}')
    assert read_footer(old)[1] == {"old": (1, 2)}
    # a later version's extra fields are ignored; a malformed hash is a corrupt footer
    later = _with_keys_footer(frag.data, json.dumps({"k": [1, 2, digest, 7]}).encode())
    assert read_footer(later)[1] == {"k": (1, 2, digest)}
    for bad in (b'{"k":[1,2,"zz"]}', b'{"k":[1,2,5]}', b"[1]"):
        with pytest.raises(CorruptFragment):
            read_footer(_with_keys_footer(frag.data, bad))


async def test_a_duplicate_answers_the_hash_of_the_first_request(store: ObjectStore) -> None:
    w = await LogWriter.open(store, "logs/h", LogWriterOptions(batch=BatchOptions(interval_s=0)))
    first = await w.append_many([b"x", b"y"], idempotency_key="k")
    assert first.digest == request_digest([b"x", b"y"]) and not first.deduplicated
    # live window, another body: the answer names the first request's hash, not this one's
    again = await w.append_many([b"other"], idempotency_key="k")
    assert again.deduplicated and again.digest == first.digest
    # concurrent duplicates share it too
    both = await asyncio.gather(
        w.append_many([b"z"], idempotency_key="k2"), w.append_many([b"w"], idempotency_key="k2")
    )
    assert both[0].digest == both[1].digest == request_digest([b"z"])
    await w.close()
    # a reopened writer learns it from the footer
    w2 = await LogWriter.open(store, "logs/h")
    learned = await w2.append_many([b"other"], idempotency_key="k")
    assert learned.deduplicated and learned.digest == first.digest
    assert (learned.first_offset, learned.count) == (first.first_offset, 2)
    assert (await w2.append_many([b"n"])).digest is None  # no key, no hash
    await w2.close()
