"""The 48-byte record's exact contract: bytes, errors that name the field, the operator view.

Written against the mutants that survived `make mutation` on dirtylog/record.py: each test pins
something another program (a roll-up, `/v1/dirty/inspect`, an operator) relies on.
"""

from __future__ import annotations

import uuid

import pytest

from dirtylog.record import RECORD_SIZE, DirtyRecord, DirtyRecordError, RecordKind

CID = uuid.UUID("6d1f7a52-3c3e-4a5c-9d1e-0f2b7c9a1e01")


def test_purge_and_clear_encode_with_zero_fields() -> None:
    """Purge and clear carry only a collection (or nil) and a time: every other field is 0."""
    purge = DirtyRecord.purge(CID, 0x0102030405060708).encode()
    assert purge == (
        CID.bytes
        + bytes(8)
        + bytes(8)
        + bytes.fromhex("0807060504030201")
        + bytes(4)
        + bytes([2, 1])
        + bytes(2)
    )
    clear = DirtyRecord.clear(5).encode()
    assert clear == bytes(16) + bytes(16) + (5).to_bytes(8, "little") + bytes(4) + bytes(
        [3, 1, 0, 0]
    )
    assert len(purge) == len(clear) == RECORD_SIZE


def test_mark_encodes_every_field_little_endian() -> None:
    body = DirtyRecord.mark(CID, 7, 300, 1_000, reinsert_count=0x01020304).encode()
    assert body[16:24] == (7).to_bytes(8, "little")
    assert body[24:32] == (300).to_bytes(8, "little")
    assert body[32:40] == (1_000).to_bytes(8, "little")
    assert body[40:44] == bytes([4, 3, 2, 1])
    assert body[44:] == bytes([1, 1, 0, 0])
    assert DirtyRecord.decode(body) == DirtyRecord(
        CID, 7, 300, 1_000, 0x01020304, RecordKind.MARK_DIRTY
    )


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: DirtyRecord.mark(CID, 0, 1, 1), "first_offset"),
        (lambda: DirtyRecord.mark(CID, 1, 0, 1), "num_records"),
        (
            lambda: DirtyRecord("not a uuid", 1, 1, 1, 0, RecordKind.MARK_DIRTY).encode(),  # type: ignore[arg-type]
            "collection_id",
        ),
        (
            lambda: DirtyRecord(CID, 1 << 64, 1, 1, 0, RecordKind.MARK_DIRTY).encode(),
            "log_position",
        ),
        (
            lambda: DirtyRecord(CID, 1, 1, 1, 1 << 32, RecordKind.MARK_DIRTY).encode(),
            "reinsert_count",
        ),
        (lambda: DirtyRecord(CID, 1, 1, 1, True, RecordKind.MARK_DIRTY).encode(), "reinsert_count"),
        (lambda: DirtyRecord(CID, 1, 1, 1, 0, 9).encode(), "kind"),  # type: ignore[arg-type]
        (lambda: DirtyRecord.decode("x" * 48), "bytes, got str"),  # type: ignore[arg-type]
    ],
)
def test_errors_name_what_is_wrong(build, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DirtyRecordError, match=field):
        build()


def test_the_operator_view_has_the_documented_keys() -> None:
    view = DirtyRecord.mark(CID, 7, 3, 11, reinsert_count=2).as_dict()
    assert view == {
        "kind": "mark_dirty",
        "collection_id": str(CID),
        "log_position": 7,
        "num_records": 3,
        "initial_insertion_epoch_us": 11,
        "reinsert_count": 2,
        "version": 1,
    }
