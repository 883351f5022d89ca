"""Fragments: Parquet layout, paths and setsum items."""

from __future__ import annotations

import io
import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wal3 import CorruptFragment, Setsum
from wal3.fragment import (
    decode_fragment,
    encode_fragment,
    fragment_path,
    parse_fragment_path,
    read_footer,
    record_item,
)


def test_paths() -> None:
    assert fragment_path(1) == "log/Bucket=0000000000000000/FragmentSeqNo=0000000000000001.parquet"
    assert fragment_path(4097) == (
        "log/Bucket=0000000000001000/FragmentSeqNo=0000000000001001.parquet"
    )
    for seq in (1, 4095, 4096, 4097, 123456789):
        assert parse_fragment_path(fragment_path(seq)) == seq
    assert (
        parse_fragment_path("log/Bucket=0000000000000000/FragmentSeqNo=0000000000001001.parquet")
        is None
    )
    assert parse_fragment_path("manifest/MANIFEST") is None
    with pytest.raises(ValueError):
        fragment_path(0)


def test_roundtrip_schema_and_setsum() -> None:
    bodies = [b"alpha", b"", b"\x00\xff" * 100]
    prev = Setsum.of(b"prev")
    frag = encode_fragment(3, 10, 1_700_000_000_000_000, bodies, prev=prev, keys={"k": (10, 3)})
    table = pq.read_table(io.BytesIO(frag.data))
    assert table.schema.field("offset").type == pa.uint64()
    assert table.schema.field("timestamp_us").type == pa.uint64()
    assert table.schema.field("body").type == pa.binary()
    meta = pq.ParquetFile(io.BytesIO(frag.data)).metadata
    assert meta.row_group(0).column(0).compression == "SNAPPY"
    assert table.column("offset").to_pylist() == [10, 11, 12]
    assert set(table.column("timestamp_us").to_pylist()) == {1_700_000_000_000_000}
    expected = Setsum.of_items(
        [struct.pack(">QQ", 10 + i, 1_700_000_000_000_000) + b for i, b in enumerate(bodies)]
    )
    assert frag.setsum == expected
    assert record_item(10, 5, b"x") == struct.pack(">QQ", 10, 5) + b"x"
    decoded = decode_fragment(frag.data)
    assert [r.body for r in decoded.records] == bodies
    assert decoded.setsum == frag.setsum
    assert decoded.prev == prev
    assert decoded.keys == {"k": (10, 3)}
    assert read_footer(frag.data) == (prev, {"k": (10, 3)})
    assert (frag.start, frag.limit, decoded.start, decoded.limit) == (10, 13, 10, 13)


def test_plain_rust_style_fragment_decodes() -> None:
    # A fragment without our footer keys (as another implementation writes it) still decodes.
    table = pa.table(
        {
            "offset": pa.array([1, 2], pa.uint64()),
            "timestamp_us": pa.array([9, 9], pa.uint64()),
            "body": pa.array([b"a", b"b"], pa.binary()),
        }
    )
    sink = io.BytesIO()
    pq.write_table(table, sink)
    d = decode_fragment(sink.getvalue())
    assert d.prev is None and d.keys == {}
    assert [r.offset for r in d.records] == [1, 2]


def test_corruption_detected() -> None:
    frag = encode_fragment(1, 1, 5, [b"x" * 1000])
    with pytest.raises(CorruptFragment):
        decode_fragment(frag.data[: len(frag.data) // 2])
    with pytest.raises(CorruptFragment):
        decode_fragment(b"not parquet at all")
    with pytest.raises(ValueError):
        encode_fragment(1, 1, 5, [])


def test_decoding_a_fragment_imports_no_pandas() -> None:
    """pyarrow imports pandas on a process's first ``to_numpy``: half a second on the event loop
    of whichever request or roll-up decoded the host's first fragment (the noisy-neighbour
    benchmark's 460 ms stall, issue 19), and pandas' memory in every host."""
    import subprocess
    import sys

    probe = (
        "import sys\n"
        "from wal3.fragment import decode_fragment, encode_fragment\n"
        "frag = encode_fragment(1, 5, 7, [b'a', b'b'], prev=None, keys={}, writer='w')\n"
        "got = decode_fragment(frag.data)\n"
        "assert [(r.offset, r.timestamp_us, r.body) for r in got.records] == "
        "[(5, 7, b'a'), (6, 7, b'b')], got\n"
        "print('pandas' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "False", out.stdout + out.stderr


@pytest.mark.parametrize(
    "offsets, stamps",
    [
        (pa.array([1, 2], pa.uint64()), pa.array([0, None], pa.uint64())),  # a null timestamp
        (pa.array([None, 2], pa.uint64()), pa.array([0, 0], pa.uint64())),  # a null offset
        (pa.array([1.0, 2.0], pa.float64()), pa.array([0, 0], pa.uint64())),  # not integers
        (pa.array([1, 2], pa.uint64()), pa.array(["0", "0"], pa.string())),
    ],
)
def test_offsets_and_timestamps_that_are_not_whole_numbers_are_corrupt(
    offsets: pa.Array, stamps: pa.Array
) -> None:
    table = pa.table(
        {"offset": offsets, "timestamp_us": stamps, "body": pa.array([b"a", b"b"], pa.binary())}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    with pytest.raises(CorruptFragment):
        decode_fragment(buf.getvalue())
