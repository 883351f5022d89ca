"""Request and response bodies of the REST API (the contract other programs are built against)."""

from __future__ import annotations

from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)


class Op(str, Enum):
    """What a record does to its id."""

    add = "add"
    update = "update"
    upsert = "upsert"
    delete = "delete"


MetadataValue = StrictStr | StrictBool | StrictInt | StrictFloat | None


class Record(BaseModel):
    """One operation on a collection; stored as its compact UTF-8 JSON."""

    model_config = _STRICT

    id: StrictStr = Field(min_length=1, max_length=256)
    op: Op
    document: StrictStr | None = None
    metadata: dict[StrictStr, MetadataValue] | None = None
    embedding: list[StrictFloat | StrictInt] | None = None


class AppendRequest(BaseModel):
    """``POST .../records``."""

    model_config = _STRICT

    records: list[Record] = Field(min_length=1)
    idempotency_key: StrictStr | None = Field(default=None, min_length=1, max_length=256)


class AppendResponse(BaseModel):
    """Where an append landed, once durable."""

    first_offset: int
    count: int
    next_offset: int


class CursorPut(BaseModel):
    """``PUT .../cursors/{name}``: compare-and-swap (``witness`` null creates)."""

    model_config = _STRICT

    offset: StrictInt = Field(ge=1)
    witness: StrictStr | None = None


class CursorOut(BaseModel):
    """A cursor and the witness a compare-and-swap must present."""

    name: str
    offset: int
    epoch_us: int
    writer: str
    witness: str


class CompactionRequest(BaseModel):
    """``POST .../compaction``: everything below ``offset`` is compacted."""

    model_config = _STRICT

    offset: StrictInt = Field(ge=1)


class CompactionResponse(BaseModel):
    """The compaction cursor after the move."""

    compaction_offset: int


class ForkRequest(BaseModel):
    """``POST .../fork``."""

    model_config = _STRICT

    target_collection_id: StrictStr
    offset: StrictInt | None = Field(default=None, ge=1)


class LogState(BaseModel):
    """``GET /v1/tenants/{tenant}/logs/{collection_id}``."""

    collection_id: str
    tenant: str
    oldest_offset: int
    next_offset: int
    compaction_offset: int
    setsum: str
    sealed: bool
    fragments: int
    bytes: int


class FragmentOut(BaseModel):
    """A fragment a bulk reader can open directly."""

    url: str
    start: int
    limit: int
    num_bytes: int
    setsum: str


class FragmentsResponse(BaseModel):
    """``GET .../fragments``."""

    fragments: list[FragmentOut]


class PurgeRequest(BaseModel):
    """``POST /v1/dirty/purge``."""

    model_config = _STRICT

    collection_ids: list[StrictStr] = Field(min_length=1, max_length=10_000)


class DirtyLogOut(BaseModel):
    """One dirty collection as compactors see it."""

    tenant: str
    collection_id: str
    start: int
    limit: int
    num_records: int
    first_insertion_us: int
    reinsert_count: int
    score: float


class DirtyResponse(BaseModel):
    """``GET /v1/dirty``."""

    server_id: str
    logs: list[DirtyLogOut]


class ErrorBody(BaseModel):
    """The ``error`` member of every error response."""

    code: str
    message: str


class ErrorResponse(BaseModel):
    """Every error answer."""

    error: ErrorBody
