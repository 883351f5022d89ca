"""Request and response bodies of the REST API (the contract other programs are built against)."""

from __future__ import annotations

import math
from enum import StrEnum
from typing import Annotated

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
)

_STRICT = ConfigDict(extra="forbid", allow_inf_nan=False)
# The most records one append may carry (``LOGHOST_MAX_RECORDS_PER_REQUEST`` may lower it).
MAX_RECORDS_PER_REQUEST = 10_000


class Op(StrEnum):
    """What a record does to its id."""

    add = "add"
    update = "update"
    upsert = "upsert"
    delete = "delete"


MetadataValue = StrictStr | StrictBool | StrictInt | StrictFloat | None
FLOAT32_MAX = 3.4028234663852886e38
_FLOAT32_MAX = FLOAT32_MAX  # the name bench/http_profile.py's prototypes import


def finite_float32_error(values: list[float | int]) -> str | None:
    """Why ``values`` cannot be an embedding (materialised as float32: no huge ints, no
    overflow), or None when every element fits."""
    try:  # the common case in one pass of C loops; the slow loop only names the culprit
        if all(map(math.isfinite, values)) and max(map(abs, values), default=0) <= _FLOAT32_MAX:
            return None
    except OverflowError:
        pass
    for i, x in enumerate(values):
        try:
            f = float(x)
        except OverflowError:
            return f"element {i} does not fit a float32"
        if not math.isfinite(f) or abs(f) > _FLOAT32_MAX:
            return f"element {i} does not fit a float32"
    return None


def _finite_float32(values: list[float | int] | None) -> list[float | int] | None:
    if values is not None:
        why = finite_float32_error(values)
        if why is not None:
            raise ValueError(why)
    return values


def _sorted_keys(metadata: dict[str, MetadataValue] | None) -> dict[str, MetadataValue] | None:
    # JSON objects are unordered: a record is stored (and its request hashed) with its metadata
    # keys sorted, so the same request in any key order is the same bytes.
    if not metadata:
        return metadata
    return dict(sorted(metadata.items()))


class Record(BaseModel):
    """One operation on a collection; stored as its compact UTF-8 JSON."""

    model_config = _STRICT

    id: StrictStr = Field(min_length=1, max_length=256)
    op: Op
    document: StrictStr | None = None
    metadata: Annotated[dict[StrictStr, MetadataValue] | None, AfterValidator(_sorted_keys)] = None
    embedding: Annotated[list[StrictFloat | StrictInt] | None, AfterValidator(_finite_float32)] = (
        None
    )


class AppendRequest(BaseModel):
    """``POST .../records``."""

    model_config = _STRICT

    records: list[Record] = Field(min_length=1, max_length=MAX_RECORDS_PER_REQUEST)
    idempotency_key: StrictStr | None = Field(default=None, min_length=1, max_length=256)


class AppendResponse(BaseModel):
    """Where an append landed, once durable."""

    first_offset: int
    count: int
    next_offset: int
    # Present (true) when the idempotency key was seen and nothing was appended.
    deduplicated: bool | None = None


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
    content_md5: str | None = None  # the object's hex MD5 when the manifest records it


class FragmentsResponse(BaseModel):
    """``GET .../fragments``."""

    fragments: list[FragmentOut]


class PurgeRequest(BaseModel):
    """``POST /v1/dirty/purge``."""

    model_config = _STRICT

    collection_ids: list[StrictStr] = Field(min_length=1, max_length=10_000)


class AdoptRequest(BaseModel):
    """``POST /v1/dirty/adopt``."""

    model_config = _STRICT

    server_id: StrictStr = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class AdoptResponse(BaseModel):
    """What an adoption moved; ``collections`` is how many were still dirty."""

    adopted_server_id: str
    collections: int
    records_read: int
    cursor_from: int
    cursor_to: int


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
