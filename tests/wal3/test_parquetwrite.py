"""wal3/parquetwrite.py writes fragments by hand: pyarrow must read back exactly what its own
writer would have stored (rows, types, nullability, footer entries, statistics), for any records
a fragment may hold.  (An independent reader, Spark's parquet-java, reads them in
tests/compactor_client/test_pipeline.py.)"""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wal3.fragment import (
    META_KEYS,
    META_PREV,
    _write_with_pyarrow,
    decode_fragment,
    encode_fragment,
    read_footer,
    read_keys,
    records_setsum,
)
from wal3.parquetwrite import stored_snappy, write_fragment_parquet
from wal3.setsum import Setsum

U64_MAX = (1 << 64) - 1


def pyarrow_written(start: int, ts: int, bodies: list[bytes], meta: dict[bytes, bytes]) -> bytes:
    """The fragment as pyarrow's own writer stores it (what wal3 writes past 256 records)."""
    return _write_with_pyarrow(start, ts, bodies, meta)


def read(data: bytes) -> tuple[pa.Table, pq.FileMetaData]:
    f = pq.ParquetFile(pa.BufferReader(data))
    return f.read(), f.metadata


def stats(md: pq.FileMetaData, column: int) -> tuple[int, int, int]:
    s = md.row_group(0).column(column).statistics
    assert s is not None and s.has_min_max
    return s.min, s.max, s.null_count


bodies_st = st.lists(st.binary(max_size=300), min_size=1, max_size=40)
meta_st = st.dictionaries(st.binary(min_size=1, max_size=20), st.binary(max_size=200), max_size=20)


@settings(max_examples=150, deadline=None)
@given(
    bodies=bodies_st,
    start=st.integers(0, U64_MAX - 40),
    ts=st.integers(0, U64_MAX),
    meta=meta_st,
)
def test_pyarrow_reads_back_what_its_own_writer_would_have_stored(
    bodies: list[bytes], start: int, ts: int, meta: dict[bytes, bytes]
) -> None:
    ours, md = read(write_fragment_parquet(start, ts, bodies, meta))
    theirs, their_md = read(pyarrow_written(start, ts, bodies, meta))
    assert ours.schema.equals(theirs.schema, check_metadata=True)
    for i in range(3):  # the Parquet annotations too, legacy ones included (older readers)
        a, b = md.schema.column(i), their_md.schema.column(i)
        assert (a.physical_type, str(a.logical_type), a.converted_type) == (
            b.physical_type,
            str(b.logical_type),
            b.converted_type,
        )
    assert ours.equals(theirs)
    n = len(bodies)
    assert (md.num_rows, md.num_row_groups, md.num_columns) == (n, 1, 3)
    assert stats(md, 0) == (start, start + n - 1, 0)
    assert stats(md, 1) == (ts, ts, 0)
    for i in range(3):
        assert md.row_group(0).column(i).compression == "SNAPPY"


def test_a_large_fragment_reads_back_whole() -> None:
    # Several MiB and many thousand records: page sizes and offsets past one byte of varint, the
    # long form of every list header.
    rng = np.random.default_rng(7)
    bodies = [rng.bytes(int(k)) for k in rng.integers(0, 2000, 6000)]
    meta = {f"k{i}".encode(): b"v" * i for i in range(40)}
    data = write_fragment_parquet(1 << 40, 123, bodies, meta)
    ours, md = read(data)
    assert ours.column("body").to_pylist() == bodies
    assert ours.column("offset").to_pylist() == list(range(1 << 40, (1 << 40) + 6000))
    assert ours.schema.metadata == meta
    assert stats(md, 0) == (1 << 40, (1 << 40) + 5999, 0)


@pytest.mark.parametrize("entries", [14, 15, 16])
def test_footer_lists_at_the_edge_of_the_short_header(entries: int) -> None:
    # Thrift's compact lists carry their size in the header byte below 15 elements only.
    meta = {f"key{i}".encode(): f"value{i}".encode() for i in range(entries)}
    ours, _ = read(write_fragment_parquet(0, 1, [b"x"] * entries, meta))
    assert ours.schema.metadata == meta
    assert ours.column("offset").to_pylist() == list(range(entries))


@pytest.mark.parametrize("extra", [0, 400])  # written directly, and by pyarrow past 256
def test_the_fragment_round_trips_through_the_engines_readers(extra: int) -> None:
    prev = Setsum.of(b"before")
    keys = {"k1": (10, 2, "0" * 32), "k2": (12, 1, "f" * 32)}
    bodies = [b"a", b"", b"ccc"] + [b"%d" % i for i in range(extra)]
    f = encode_fragment(3, 10, 99, bodies, prev=prev, keys=keys, writer="w-1")
    d = decode_fragment(f.data)
    assert [(r.offset, r.timestamp_us, r.body) for r in d.records] == [
        (10 + i, 99, b) for i, b in enumerate(bodies)
    ]
    assert d.setsum == f.setsum == records_setsum(10, 99, bodies)
    assert d.prev == prev and d.keys == keys
    assert read_footer(f.data) == (prev, keys)
    # The timestamp comes from the statistics (the footer only), as for pyarrow's files.
    assert read_keys(f.data) == (keys, 99)
    footer = pq.ParquetFile(pa.BufferReader(f.data)).schema_arrow.metadata
    assert footer[META_PREV] == prev.hexdigest().encode()
    assert json.loads(footer[META_KEYS]) == {k: list(v) for k, v in keys.items()}


def test_two_writers_never_write_the_same_bytes() -> None:
    a = encode_fragment(1, 0, 5, [b"x"], writer="a").data
    b = encode_fragment(1, 0, 5, [b"x"], writer="b").data
    assert a != b and decode_fragment(a).setsum == decode_fragment(b).setsum


@given(st.lists(st.binary(max_size=64), min_size=1, max_size=20), st.integers(0, 1 << 62))
def test_a_few_records_sum_as_many_do(bodies: list[bytes], start: int) -> None:
    # A fragment's setsum is the setsum of its items (offset, timestamp, body), however many.
    many = Setsum.of_items(
        (start + i).to_bytes(8, "big") + (5).to_bytes(8, "big") + b for i, b in enumerate(bodies)
    )
    assert records_setsum(start, 5, bodies) == many


@pytest.mark.parametrize(
    "n", [0, 1, 59, 60, 61, 255, 256, 257, 4095, 65536, 65537, (1 << 24), (1 << 24) + 1]
)
def test_a_stored_snappy_block_decompresses_to_its_data(n: int) -> None:
    # Every tag a literal may take: its length in the tag (up to 60), or in 1 to 4 more bytes.
    data = bytes(i % 251 for i in range(n))
    block = stored_snappy(data)
    assert pa.decompress(block, decompressed_size=n, codec="snappy", asbytes=True) == data


@pytest.mark.parametrize(("bodies", "direct"), [(3, True), (257, False), (2, False)])
def test_big_fragments_go_through_pyarrow(bodies: int, direct: bool) -> None:
    # Past 256 records, or past 1 MiB of bodies (each column of a direct fragment is one page,
    # and Parquet caps a page at 2 GiB), pyarrow writes the fragment.
    size = 700_000 if bodies == 2 else 10
    f = encode_fragment(1, 0, 5, [b"x" * size] * bodies, writer="w")
    created_by = pq.ParquetFile(pa.BufferReader(f.data)).metadata.created_by
    assert (created_by == "wal3 python fragment writer") == direct
    assert [r.body for r in decode_fragment(f.data).records] == [b"x" * size] * bodies
