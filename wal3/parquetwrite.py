"""A fragment's Parquet bytes, written directly.

A fragment is always the same file: three required columns (``offset`` uint64, ``timestamp_us``
uint64, ``body`` binary), one row group, one PLAIN data page per column, snappy, and a few
key-value entries in the footer.  pyarrow's general writer spends about 100 µs setting up a
writer, its properties and an Arrow schema for each file, which is most of a one-record
fragment's cost on a host that writes one fragment per request to thousands of logs.  This
module writes the same format by hand: the pages, and the footer in Thrift's compact protocol
(the encoding every Parquet footer uses).  pyarrow still reads every fragment, and
tests/wal3/test_parquetwrite.py checks that what it reads back, statistics and footer included,
is what pyarrow's own writer produces.

References: the Parquet format's ``parquet.thrift`` (field ids and enums below) and Thrift's
compact protocol specification.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from itertools import chain

import numpy as np
import pyarrow as pa

# parquet.thrift enums
_INT64, _BYTE_ARRAY = 2, 6  # Type
_REQUIRED = 0  # FieldRepetitionType
_UINT_64 = 14  # ConvertedType
_PLAIN, _RLE = 0, 3  # Encoding
_SNAPPY = 1  # CompressionCodec
_DATA_PAGE = 0  # PageType

# Thrift compact protocol types
_T_TRUE, _T_FALSE, _T_BYTE, _T_I32, _T_I64, _T_BINARY, _T_LIST, _T_STRUCT = 1, 2, 3, 5, 6, 8, 9, 12

_MAGIC = b"PAR1"
_SNAPPY_CODEC = pa.Codec("snappy")
_STORE_BELOW = 4096  # pages smaller than this are stored, not compressed (stored_snappy)
CREATED_BY = "wal3 python fragment writer"
_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _v(n: int) -> bytes:
    """A non-negative i32 or i64 value: zigzag, then varint."""
    return _uvarint(n << 1)


def _h(delta: int, ttype: int) -> bytes:
    """A field header: the field id's distance from the previous field's (1 to 15), and type."""
    return bytes([(delta << 4) | ttype])


def _bin(delta: int, value: bytes) -> bytes:
    return _h(delta, _T_BINARY) + _uvarint(len(value)) + value


def _list(delta: int, etype: int, size: int) -> bytes:
    head = _h(delta, _T_LIST)
    if size < 15:
        return head + bytes([(size << 4) | etype])
    return head + bytes([0xF0 | etype]) + _uvarint(size)


_STOP = b"\x00"
_I32, _I64 = _T_I32, _T_I64


def stored_snappy(data: bytes) -> bytes:
    """``data`` as a snappy block of one literal: valid snappy, not compressed.

    Small pages are stored so: compressing a few hundred bytes saves little, and pyarrow's
    compressor releases the GIL, so the event loop that encodes a tiny fragment then waits for
    the GIL from whichever store thread took it (up to the 5 ms switch interval)."""
    n = len(data)
    if n == 0:
        return b"\x00"
    head = _uvarint(n)  # the block's uncompressed length, then the literal's tag
    if n <= 60:
        return head + bytes([(n - 1) << 2]) + data
    size = ((n - 1).bit_length() + 7) // 8  # 1 to 4 bytes of length, tags 60 to 63
    return head + bytes([(59 + size) << 2]) + (n - 1).to_bytes(size, "little") + data


def _page(values: bytes, num_values: int) -> tuple[bytes, int]:
    """A snappy DATA_PAGE of PLAIN values: (page header + compressed values, the same size
    uncompressed)."""
    if len(values) < _STORE_BELOW:
        compressed = stored_snappy(values)
    else:
        compressed = _SNAPPY_CODEC.compress(values, asbytes=True)
    header = b"".join(
        (
            _PAGE_TYPE,  # 1: type DATA_PAGE
            _h(1, _I32),
            _v(len(values)),  # 2: uncompressed_page_size
            _h(1, _I32),
            _v(len(compressed)),  # 3: compressed_page_size
            _DATA_PAGE_HEADER,  # 5: DataPageHeader, from its num_values on
            _v(num_values),
            _DATA_PAGE_HEADER_END,
        )
    )
    return header + compressed, len(header) + len(values)


# Constant runs of the page header and footer, in field order (parquet.thrift's ids).
_PAGE_TYPE = _h(1, _I32) + _v(_DATA_PAGE)
_DATA_PAGE_HEADER = _h(2, _T_STRUCT) + _h(1, _I32)
_DATA_PAGE_HEADER_END = (
    _h(1, _I32) + _v(_PLAIN) + _h(1, _I32) + _v(_RLE) + _h(1, _I32) + _v(_RLE) + _STOP + _STOP
)


def _u64_column(name: bytes) -> bytes:
    # SchemaElement: type, repetition_type, name, converted_type, logicalType INTEGER(64, false)
    return b"".join(
        (
            _h(1, _I32) + _v(_INT64),
            _h(2, _I32) + _v(_REQUIRED),
            _bin(1, name),
            _h(2, _I32) + _v(_UINT_64),
            _h(4, _T_STRUCT),  # 10: LogicalType (a union)
            _h(10, _T_STRUCT),  # its 10: IntType
            _h(1, _T_BYTE) + bytes([64]),
            _h(1, _T_FALSE),  # isSigned
            _STOP + _STOP + _STOP,
        )
    )


_FOOTER_HEAD = b"".join(
    (
        _h(1, _I32) + _v(1),  # 1: version
        _list(1, _T_STRUCT, 4),  # 2: schema, the root and then the three columns
        _bin(4, b"schema") + _h(1, _I32) + _v(3) + _STOP,
        _u64_column(b"offset"),
        _u64_column(b"timestamp_us"),
        _h(1, _I32) + _v(_BYTE_ARRAY) + _h(2, _I32) + _v(_REQUIRED) + _bin(1, b"body") + _STOP,
        _h(1, _I64),  # 3: num_rows (its value follows)
    )
)
# 4: row_groups, one; its 1: columns, three
_ROW_GROUPS = _list(1, _T_STRUCT, 1) + _list(1, _T_STRUCT, 3)


def _column_meta(ptype: int, name: bytes) -> bytes:
    # ColumnChunk's 3: ColumnMetaData, up to its 5: num_values (whose value follows)
    return b"".join(
        (
            _h(1, _T_STRUCT),
            _h(1, _I32) + _v(ptype),
            _list(1, _I32, 2) + _v(_PLAIN) + _v(_RLE),  # encodings
            _list(1, _T_BINARY, 1) + _uvarint(len(name)) + name,  # path_in_schema
            _h(1, _I32) + _v(_SNAPPY),  # codec
            _h(1, _I64),
        )
    )


_COLUMNS = (
    _column_meta(_INT64, b"offset"),
    _column_meta(_INT64, b"timestamp_us"),
    _column_meta(_BYTE_ARRAY, b"body"),
)
_CREATED_BY = CREATED_BY.encode()
# column_orders: TYPE_ORDER for each column, without which readers ignore min_value and
# max_value (an unsigned column's statistics have no other form).
_FOOTER_END = (
    _list(1, _T_STRUCT, 3)  # 7: column_orders, after 6: created_by
    + (_h(1, _T_STRUCT) + _STOP + _STOP) * 3
    + _STOP
)


def write_fragment_parquet(
    start: int, timestamp_us: int, bodies: Sequence[bytes], metadata: dict[bytes, bytes]
) -> bytes:
    """The Parquet file of records ``start, start + 1, ...`` sharing ``timestamp_us``.

    The caller has checked that every offset fits u64, that there is at least one body, and
    that the bodies are far below Parquet's 2 GiB page size (each column is one page)."""
    n = len(bodies)
    last = start + n - 1
    if n <= 16:
        offsets = b"".join([_U64.pack(o) for o in range(start, start + n)])
    else:
        offsets = np.arange(start, start + n, dtype="<u8").tobytes()
    stamp = _U64.pack(timestamp_us)
    # PLAIN byte arrays: each body's length (u32 little-endian), then the body.
    data = b"".join(chain.from_iterable(zip(map(_U32.pack, map(len, bodies)), bodies, strict=True)))

    out = [_MAGIC]
    pos = len(_MAGIC)
    footer = [_FOOTER_HEAD, _v(n), _ROW_GROUPS]
    total_uncompressed = 0
    for meta, values, stats in zip(
        _COLUMNS,
        (offsets, stamp * n, data),
        ((_U64.pack(start), _U64.pack(last)), (stamp, stamp), None),
        strict=True,
    ):
        page, uncompressed = _page(values, n)
        out.append(page)
        total_uncompressed += uncompressed
        # ColumnChunk: 2 file_offset (0: no column metadata outside the footer), 3
        # ColumnMetaData (5 num_values, 6 total_uncompressed_size, 7 total_compressed_size,
        # 9 data_page_offset, 12 statistics)
        footer += (_h(2, _I64), _v(0), meta, _v(n), _h(1, _I64), _v(uncompressed))
        footer += (_h(1, _I64), _v(len(page)), _h(2, _I64), _v(pos))
        if stats is not None:
            # 12: Statistics: 3 null_count, 5 max_value, 6 min_value (unsigned values: only these)
            footer += (_h(3, _T_STRUCT), _h(3, _I64), _v(0))
            footer += (_bin(2, stats[1]), _bin(1, stats[0]), _STOP)
        footer += (_STOP, _STOP)
        pos += len(page)
    # RowGroup: 2 total_byte_size, 3 num_rows, 5 file_offset, 6 total_compressed_size
    footer += (_h(1, _I64), _v(total_uncompressed), _h(1, _I64), _v(n))
    footer += (_h(2, _I64), _v(len(_MAGIC)), _h(1, _I64), _v(pos - len(_MAGIC)), _STOP)
    delta = 2  # created_by (6) follows row_groups (4), or key_value_metadata (5) when present
    if metadata:
        footer.append(_list(1, _T_STRUCT, len(metadata)))  # 5: key_value_metadata
        for k, v in metadata.items():
            footer += (_bin(1, k), _bin(1, v), _STOP)
        delta = 1
    footer += (_bin(delta, _CREATED_BY), _FOOTER_END)
    tail = b"".join(footer)
    out += (tail, _U32.pack(len(tail)), _MAGIC)
    return b"".join(out)
