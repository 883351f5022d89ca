"""Typed request and result models of the log host REST API.

Models ignore unknown fields so that a newer server adding fields does not break older clients;
they validate the fields the client relies on, so a malformed answer fails loudly at the boundary.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

MetadataValue = str | int | float | bool | None
Op = Literal["add", "update", "upsert", "delete"]
JsonObject = dict[str, Any]


class _Model(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Record(_Model):
    """One log record: an operation on one document id."""

    id: str
    op: Op
    document: str | None = None
    metadata: dict[str, MetadataValue] | None = None
    embedding: list[float] | None = None

    def to_json(self) -> str:
        """The compact JSON form used as a fragment body."""
        return json.dumps(self.model_dump(), separators=(",", ":"), ensure_ascii=False)


class AppendResult(_Model):
    """Where an appended batch landed."""

    first_offset: int
    count: int
    next_offset: int


class ReadRecord(_Model):
    """A record as read back, with its offset and append time."""

    offset: int
    timestamp_us: int
    record: Record


class ReadResult(_Model):
    """A page of records and the offset to continue from."""

    records: list[ReadRecord]
    next_offset: int


class LogState(_Model):
    """A log's offsets and sizes."""

    collection_id: str
    tenant: str
    oldest_offset: int
    next_offset: int
    compaction_offset: int
    setsum: str | None = None
    sealed: bool = False
    fragments: int = 0
    bytes: int = 0


class FragmentInfo(_Model):
    """One fragment: a Parquet object covering offsets [start, limit)."""

    url: str
    start: int
    limit: int
    num_bytes: int = 0
    setsum: str | None = None
    content_md5: str | None = None  # hex MD5 of the object, when the manifest records one


class Cursor(_Model):
    """A named cursor on a log; ``witness`` is what a compare-and-swap must present."""

    name: str
    offset: int
    epoch_us: int | None = None
    writer: str | None = None
    witness: str | None = None


class CompactionResult(_Model):
    """The compaction cursor after a ``POST .../compaction``."""

    compaction_offset: int


class DirtyLog(_Model):
    """One entry of a host's dirty set: a log with records not yet compacted."""

    tenant: str
    collection_id: str
    start: int
    limit: int
    num_records: int
    first_insertion_us: int = 0
    reinsert_count: int = 0
    score: float = 0.0


class DirtyResult(_Model):
    """A host's dirty set, highest score first."""

    server_id: str = ""
    logs: list[DirtyLog] = Field(default_factory=list)
