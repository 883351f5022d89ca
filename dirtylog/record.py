"""The 48-byte dirty-log record.

Layout (all integers little-endian)::

    0-15   collection_id               UUID bytes, RFC 4122 order
    16-23  log_position                u64, first collection-log offset the record covers
    24-31  num_records                 u64
    32-39  initial_insertion_epoch_us  u64
    40-43  reinsert_count              u32
    44     kind                        u8: 1 mark_dirty, 2 purge, 3 clear
    45     version                     u8 = 1
    46-47  reserved                    zero

A clear names what a compaction moved: ``collection_id`` is compacted below ``log_position`` (the
compaction cursor the host was told, ``POST .../compaction``; ``num_records`` and
``reinsert_count`` are 0).  A clear with the nil UUID and a zero position is a checkpoint: a
roll-up that found nothing left dirty (the only clear before issue 24, which every reader ignores).

Decoding is strict: any deviation is a :class:`DirtyRecordError`, never a silently skipped record,
because a skipped mark would drop a dirty collection.
"""

from __future__ import annotations

import enum
import struct
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import DirtyLogError

RECORD_SIZE = 48
RECORD_VERSION = 1

# '<' means no padding, so the format is exactly the table above.
_LAYOUT = struct.Struct("<16sQQQIBBH")
assert _LAYOUT.size == RECORD_SIZE

_U64_MAX = (1 << 64) - 1
_U32_MAX = (1 << 32) - 1

NIL_UUID = uuid.UUID(int=0)


class DirtyRecordError(DirtyLogError, ValueError):
    """A dirty-log record cannot be encoded or decoded."""


class RecordKind(enum.IntEnum):
    """What a dirty-log record says about its collection."""

    MARK_DIRTY = 1
    PURGE = 2
    CLEAR = 3


@dataclass(frozen=True, slots=True)
class DirtyRecord:
    """One decoded dirty-log record."""

    collection_id: uuid.UUID
    log_position: int
    num_records: int
    initial_insertion_epoch_us: int
    reinsert_count: int
    kind: RecordKind

    # ------------------------------------------------------------------------------ constructors

    @classmethod
    def mark(
        cls,
        collection_id: uuid.UUID,
        first_offset: int,
        num_records: int,
        now_us: int,
        reinsert_count: int = 0,
    ) -> DirtyRecord:
        """A mark_dirty record for ``num_records`` records starting at ``first_offset``."""
        # Collection offsets start at 1 and a fragment holds at least one record; anything else is
        # a caller bug we want to see at the write, not as a phantom range at roll-up time.
        if first_offset < 1:
            raise DirtyRecordError(f"first_offset must be >= 1, got {first_offset}")
        if num_records < 1:
            raise DirtyRecordError(f"num_records must be >= 1, got {num_records}")
        return cls(
            collection_id, first_offset, num_records, now_us, reinsert_count, RecordKind.MARK_DIRTY
        )

    @classmethod
    def purge(cls, collection_id: uuid.UUID, now_us: int) -> DirtyRecord:
        """A purge record: forget the collection's marks that precede it."""
        return cls(collection_id, 0, 0, now_us, 0, RecordKind.PURGE)

    @classmethod
    def clear(cls, now_us: int) -> DirtyRecord:
        """A checkpoint clear: a roll-up found nothing left dirty (nil UUID, zero fields)."""
        return cls(NIL_UUID, 0, 0, now_us, 0, RecordKind.CLEAR)

    @classmethod
    def compacted(cls, collection_id: uuid.UUID, offset: int, now_us: int) -> DirtyRecord:
        """A clear naming a collection: everything below ``offset`` is compacted."""
        if collection_id == NIL_UUID:
            raise DirtyRecordError("a compaction clear names a collection, not the nil UUID")
        if offset < 1:
            raise DirtyRecordError(f"compaction offset must be >= 1, got {offset}")
        return cls(collection_id, offset, 0, now_us, 0, RecordKind.CLEAR)

    @property
    def is_checkpoint(self) -> bool:
        """A clear that names no collection (a roll-up's checkpoint): it changes nothing."""
        return self.kind == RecordKind.CLEAR and self.collection_id == NIL_UUID

    # -------------------------------------------------------------------------------------- codec

    @property
    def end(self) -> int:
        """One past the last collection offset the record covers."""
        return self.log_position + self.num_records

    def validate(self) -> None:
        """Raise :class:`DirtyRecordError` unless every field fits its slot in the layout."""
        if not isinstance(self.collection_id, uuid.UUID):
            raise DirtyRecordError(f"collection_id must be a UUID, got {self.collection_id!r}")
        for name in ("log_position", "num_records", "initial_insertion_epoch_us"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _U64_MAX:
                raise DirtyRecordError(f"{name} out of u64 range: {value!r}")
        rc = self.reinsert_count
        if not isinstance(rc, int) or isinstance(rc, bool) or not 0 <= rc <= _U32_MAX:
            raise DirtyRecordError(f"reinsert_count out of u32 range: {rc!r}")
        try:
            RecordKind(self.kind)
        except ValueError:
            raise DirtyRecordError(f"unknown record kind {self.kind!r}") from None

    def encode(self) -> bytes:
        """The record's exact 48-byte body."""
        self.validate()
        return _LAYOUT.pack(
            self.collection_id.bytes,
            self.log_position,
            self.num_records,
            self.initial_insertion_epoch_us,
            self.reinsert_count,
            int(self.kind),
            RECORD_VERSION,
            0,
        )

    @classmethod
    def decode(cls, body: bytes) -> DirtyRecord:
        """Parse a 48-byte body; raise :class:`DirtyRecordError` on any deviation from the layout."""
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise DirtyRecordError(f"record body must be bytes, got {type(body).__name__}")
        if len(body) != RECORD_SIZE:
            raise DirtyRecordError(f"record body must be {RECORD_SIZE} bytes, got {len(body)}")
        cid, pos, n, t0, rc, kind, version, reserved = _LAYOUT.unpack(bytes(body))
        if version != RECORD_VERSION:
            raise DirtyRecordError(f"unsupported record version {version}")
        if reserved != 0:
            raise DirtyRecordError(f"reserved bytes must be zero, got {reserved:#06x}")
        try:
            record_kind = RecordKind(kind)
        except ValueError:
            raise DirtyRecordError(f"unknown record kind {kind}") from None
        return cls(uuid.UUID(bytes=cid), pos, n, t0, rc, record_kind)

    def as_dict(self) -> dict[str, Any]:
        """A JSON-friendly view, for operators."""
        return {
            "kind": RecordKind(self.kind).name.lower(),
            "collection_id": str(self.collection_id),
            "log_position": self.log_position,
            "num_records": self.num_records,
            "initial_insertion_epoch_us": self.initial_insertion_epoch_us,
            "reinsert_count": self.reinsert_count,
            "version": RECORD_VERSION,
        }
