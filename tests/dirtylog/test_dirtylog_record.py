"""The 48-byte record codec: exact layout, round trips, strict rejection."""

from __future__ import annotations

import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dirtylog import RECORD_SIZE, DirtyRecord, DirtyRecordError, RecordKind

U64 = (1 << 64) - 1
U32 = (1 << 32) - 1

records = st.builds(
    DirtyRecord,
    collection_id=st.uuids(),
    log_position=st.integers(0, U64),
    num_records=st.integers(0, U64),
    initial_insertion_epoch_us=st.integers(0, U64),
    reinsert_count=st.integers(0, U32),
    kind=st.sampled_from(RecordKind),
)


@given(records)
def test_round_trip_over_all_field_ranges(record: DirtyRecord) -> None:
    body = record.encode()
    assert len(body) == RECORD_SIZE == 48
    assert DirtyRecord.decode(body) == record
    assert DirtyRecord.decode(bytearray(body)) == record


def test_exact_byte_layout_against_hand_built_bytes() -> None:
    cid = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    record = DirtyRecord(
        cid,
        0x0102030405060708,
        0x1112131415161718,
        0x2122232425262728,
        0x31323334,
        RecordKind.PURGE,
    )
    expected = (
        bytes.fromhex("00112233445566778899aabbccddeeff")  # UUID, RFC 4122 byte order
        + bytes.fromhex("0807060504030201")  # log_position LE
        + bytes.fromhex("1817161514131211")  # num_records LE
        + bytes.fromhex("2827262524232221")  # initial_insertion_epoch_us LE
        + bytes.fromhex("34333231")  # reinsert_count LE
        + bytes([2])  # kind purge
        + bytes([1])  # version
        + bytes(2)  # reserved
    )
    assert len(expected) == 48
    assert record.encode() == expected
    assert DirtyRecord.decode(expected) == record


def test_constructors() -> None:
    c = uuid.uuid4()
    mark = DirtyRecord.mark(c, 7, 3, 99)
    assert (mark.collection_id, mark.log_position, mark.num_records, mark.end) == (c, 7, 3, 10)
    assert (mark.initial_insertion_epoch_us, mark.reinsert_count, mark.kind) == (
        99,
        0,
        RecordKind.MARK_DIRTY,
    )
    assert mark.encode()[44] == 1
    purge = DirtyRecord.purge(c, 5)
    assert (purge.kind, purge.collection_id, purge.initial_insertion_epoch_us) == (
        RecordKind.PURGE,
        c,
        5,
    )
    clear = DirtyRecord.clear(5)
    assert clear.kind == RecordKind.CLEAR and clear.collection_id.int == 0
    assert clear.encode()[:32] == bytes(32) and clear.encode()[44] == 3
    with pytest.raises(DirtyRecordError):
        DirtyRecord.mark(c, 0, 3, 1)  # offsets start at 1
    with pytest.raises(DirtyRecordError):
        DirtyRecord.mark(c, 1, 0, 1)  # a fragment has records


@pytest.mark.parametrize("length", [0, 1, 47, 49, 96])
def test_decode_rejects_wrong_length(length: int) -> None:
    with pytest.raises(DirtyRecordError, match="48 bytes"):
        DirtyRecord.decode(bytes(length))


def _valid_body() -> bytearray:
    return bytearray(DirtyRecord.mark(uuid.uuid4(), 1, 1, 1).encode())


@pytest.mark.parametrize("kind", [0, 4, 255])
def test_decode_rejects_unknown_kind(kind: int) -> None:
    body = _valid_body()
    body[44] = kind
    with pytest.raises(DirtyRecordError, match="kind"):
        DirtyRecord.decode(bytes(body))


@pytest.mark.parametrize("version", [0, 2, 255])
def test_decode_rejects_bad_version(version: int) -> None:
    body = _valid_body()
    body[45] = version
    with pytest.raises(DirtyRecordError, match="version"):
        DirtyRecord.decode(bytes(body))


@pytest.mark.parametrize("index,value", [(46, 1), (47, 1), (47, 0x80)])
def test_decode_rejects_non_zero_reserved(index: int, value: int) -> None:
    body = _valid_body()
    body[index] = value
    with pytest.raises(DirtyRecordError, match="reserved"):
        DirtyRecord.decode(bytes(body))


def test_decode_rejects_non_bytes() -> None:
    with pytest.raises(DirtyRecordError):
        DirtyRecord.decode("x" * 48)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "field,value",
    [
        ("log_position", -1),
        ("log_position", U64 + 1),
        ("num_records", -1),
        ("num_records", U64 + 1),
        ("initial_insertion_epoch_us", -1),
        ("initial_insertion_epoch_us", U64 + 1),
        ("reinsert_count", -1),
        ("reinsert_count", U32 + 1),
        ("kind", 9),
        ("collection_id", "not-a-uuid"),
        ("log_position", 1.5),
        ("num_records", True),
    ],
)
def test_encode_rejects_out_of_range_fields(field: str, value: object) -> None:
    fields = {
        "collection_id": uuid.uuid4(),
        "log_position": 1,
        "num_records": 1,
        "initial_insertion_epoch_us": 1,
        "reinsert_count": 0,
        "kind": RecordKind.MARK_DIRTY,
    }
    fields[field] = value
    with pytest.raises(DirtyRecordError):
        DirtyRecord(**fields).encode()  # type: ignore[arg-type]


def test_encode_accepts_the_bounds() -> None:
    r = DirtyRecord(uuid.UUID(int=(1 << 128) - 1), U64, U64, U64, U32, RecordKind.CLEAR)
    body = r.encode()
    assert struct.unpack("<16sQQQIBBH", body)[1:] == (U64, U64, U64, U32, 3, 1, 0)
    assert DirtyRecord.decode(body) == r


@given(st.binary(min_size=48, max_size=48))
def test_decode_of_arbitrary_bytes_is_a_record_or_a_typed_error(body: bytes) -> None:
    try:
        record = DirtyRecord.decode(body)
    except DirtyRecordError:
        assert body[44] not in (1, 2, 3) or body[45] != 1 or body[46:48] != b"\0\0"
    else:
        assert record.encode() == body
