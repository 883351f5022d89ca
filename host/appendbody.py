"""Decoding an append body: msgspec, with the record limits checked before anything is validated.

The body is validated by ``msgspec`` against structs that mirror the schema ``host.models``
publishes (``AppendRequest``, ``Record``: the OpenAPI document stays pydantic's), straight from
the bytes and in C: validating 100 records with pydantic cost about 1 ms of event-loop CPU, the
largest single cost of a batched append (docs/PERFORMANCE.md §7).  ``tests/host/test_appendbody``
checks the two agree, body for body, on what they accept and on the bytes stored.

An append body's record count is checked while it is decoded (at most ``RecordLimits.records``),
and each record's metadata keys and embedding length on the parsed JSON, before any record is
validated; a large body is validated a slice of records at a time, so no single call holds the
GIL for long.  The records are returned as stored: compact JSON, metadata keys sorted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from .config import Settings
from .errors import BadRequest, RecordTooLarge
from .models import FLOAT32_MAX, MAX_RECORDS_PER_REQUEST, Op, finite_float32_error

# The smallest record in JSON ({"id":"a","op":"add"} and a comma): a body shorter than this many
# bytes per allowed record cannot hold too many, and needs no count before validation.
_MIN_RECORD_BYTES = 20
# Bodies larger than this are decoded on the decoder's threads, not on the event loop.
_DECODE_OFF_LOOP_BYTES = 256 << 10


class RecordIn(msgspec.Struct, forbid_unknown_fields=True):
    """``host.models.Record`` as msgspec decodes it (fields, order and bounds the same)."""

    id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    op: Op
    document: str | None = None
    metadata: dict[str, str | bool | int | float | None] | None = None
    # Floats bounded in C; an int (unbounded in JSON) is checked in ``_checked``.
    embedding: (
        list[int | Annotated[float, msgspec.Meta(ge=-FLOAT32_MAX, le=FLOAT32_MAX)]] | None
    ) = None


class AppendBody(msgspec.Struct, forbid_unknown_fields=True):
    """``host.models.AppendRequest`` as msgspec decodes it."""

    records: Annotated[
        list[RecordIn], msgspec.Meta(min_length=1, max_length=MAX_RECORDS_PER_REQUEST)
    ]
    idempotency_key: Annotated[str, msgspec.Meta(min_length=1, max_length=256)] | None = None


_BODY = msgspec.json.Decoder(AppendBody)


class _Counted(msgspec.Struct):
    """An append body's records, each left unparsed (``record_count``)."""

    records: list[msgspec.Raw]


_COUNTED = msgspec.json.Decoder(_Counted)
_RECORDS = msgspec.json.Decoder(list[RecordIn])
# Dict keys sorted (JSON objects are unordered: the same request in any key order is stored, and
# hashed, as the same bytes); struct fields keep the schema's order.
_ENCODER = msgspec.json.Encoder(order="deterministic")
_AT = re.compile(r"\[(\d+|\.\.\.)\]")
_UNKNOWN = re.compile(r"^Object contains unknown field `(.*)`$")


def _bad(e: msgspec.MsgspecError, slice_start: int | None = None) -> BadRequest:
    """A 400 naming the field as the schema does (``records.3.id: ...``).  ``slice_start``: the
    error is of a slice of the records, validated on its own, that starts there."""
    text = str(e)
    if not isinstance(e, msgspec.ValidationError):  # not JSON at all
        return BadRequest(f"body: {text}")
    message, _, path = text.partition(" - at `")
    dotted = _AT.sub(lambda m: "." + m.group(1), path.rstrip("`"))
    parts = [p for p in dotted.split(".") if p and p != "$"]
    unknown = _UNKNOWN.match(message)
    if unknown:
        parts, message = [*parts, unknown.group(1)], "extra fields are not permitted"
    if slice_start is not None:
        if parts and parts[0].isdigit():
            parts[0] = str(int(parts[0]) + slice_start)
        parts = ["records", *parts]
    return BadRequest(f"{'.'.join(parts) or 'body'}: {message}")


def _checked(records: list[RecordIn], offset: int = 0) -> list[RecordIn]:
    """What the structs cannot say: an embedding's ints fit float32 too (its floats are bounded
    by the struct; JSON has no NaN, and msgspec refuses a number out of a double's range)."""
    for i, rec in enumerate(records):
        emb = rec.embedding
        if emb and max(map(abs, emb)) > FLOAT32_MAX:
            raise BadRequest(f"records.{i + offset}.embedding: {finite_float32_error(emb)}")
    return records


class _TooManyObjects(Exception):
    """Raised from inside the JSON decoder to stop it early."""


def _count_records(raw: bytes, limit: int) -> Any:
    """Refuse a body with more than ``limit`` records before anything is validated; the decoded
    document, or None when it is left to the validator (not UTF-8, not JSON).

    The decoder stops as soon as the body holds more JSON objects than ``limit`` valid records
    can (a record and its metadata: two each), so an oversized body costs a bounded amount of
    work, not a parse of every record.
    """
    try:
        text = raw.decode("utf-8")  # strictly: json.loads would also take UTF-16 and -32
    except UnicodeDecodeError:
        return None
    budget = 2 * limit + 1
    seen = 0

    def hook(obj: dict[str, Any]) -> dict[str, Any]:
        nonlocal seen
        seen += 1
        if seen > budget:
            raise _TooManyObjects
        return obj

    try:
        doc = json.loads(text, object_hook=hook)
    except _TooManyObjects:
        raise BadRequest(f"records: at most {limit} per request") from None
    except (ValueError, RecursionError):
        return None
    if (
        isinstance(doc, dict)
        and isinstance(doc.get("records"), list)
        and len(doc["records"]) > limit
    ):
        raise BadRequest(f"records: at most {limit} per request")
    return doc


_CHUNK_RECORDS = 256
# Metadata entries and embedding elements one validation call may take at most (a slice of
# records is cut short when its records carry more): the validator holds the GIL for the call.
_CHUNK_VALUES = 65536
# The smallest embedding element or metadata entry in JSON ("0,"): a shorter body holds fewer
# than _CHUNK_VALUES values and is validated in one call.
_MIN_VALUE_BYTES = 2


@dataclass(frozen=True)
class RecordLimits:
    """What one append may carry: records, and per record metadata keys and embedding length."""

    records: int
    metadata_keys: int
    embedding_dims: int

    @classmethod
    def from_settings(cls, settings: Settings) -> RecordLimits:
        """The limits ``settings`` configure (records capped by the schema's own maximum)."""
        return cls(
            min(settings.max_records_per_request, MAX_RECORDS_PER_REQUEST),
            settings.max_metadata_keys,
            settings.max_embedding_dims,
        )


def _record_values(records: list[Any], limits: RecordLimits) -> list[int]:
    """Each record's metadata entries plus embedding elements, read off the parsed JSON (one
    ``len`` each); a record over ``limits`` is refused here, before anything is validated."""
    sizes = []
    for i, rec in enumerate(records):
        n = 0
        if isinstance(rec, dict):
            meta, emb = rec.get("metadata"), rec.get("embedding")
            if isinstance(meta, dict):
                if len(meta) > limits.metadata_keys:
                    raise RecordTooLarge(
                        f"records.{i}.metadata: {len(meta)} keys, at most "
                        f"{limits.metadata_keys} (LOGHOST_MAX_METADATA_KEYS)"
                    )
                n += len(meta)
            if isinstance(emb, list):
                if len(emb) > limits.embedding_dims:
                    raise RecordTooLarge(
                        f"records.{i}.embedding: {len(emb)} elements, at most "
                        f"{limits.embedding_dims} (LOGHOST_MAX_EMBEDDING_DIMS)"
                    )
                n += len(emb)
        sizes.append(n)
    return sizes


def _check_record_sizes(records: list[RecordIn], limits: RecordLimits) -> None:
    """The same limits on records validated already (small bodies, bounded by their size)."""
    for i, rec in enumerate(records):
        if rec.metadata is not None and len(rec.metadata) > limits.metadata_keys:
            raise RecordTooLarge(
                f"records.{i}.metadata: {len(rec.metadata)} keys, at most "
                f"{limits.metadata_keys} (LOGHOST_MAX_METADATA_KEYS)"
            )
        if rec.embedding is not None and len(rec.embedding) > limits.embedding_dims:
            raise RecordTooLarge(
                f"records.{i}.embedding: {len(rec.embedding)} elements, at most "
                f"{limits.embedding_dims} (LOGHOST_MAX_EMBEDDING_DIMS)"
            )


def _slices(sizes: list[int]) -> list[tuple[int, int]]:
    """``[start, end)`` slices of at most ``_CHUNK_RECORDS`` records and (unless one record is
    alone) ``_CHUNK_VALUES`` values."""
    out: list[tuple[int, int]] = []
    start, values = 0, 0
    for i, n in enumerate(sizes):
        if i > start and (i - start >= _CHUNK_RECORDS or values + n > _CHUNK_VALUES):
            out.append((start, i))
            start, values = i, 0
        values += n
    if start < len(sizes):
        out.append((start, len(sizes)))
    return out


def _stored(records: list[RecordIn]) -> list[bytes]:
    """The records as stored: compact JSON, fields in the schema's order, absent ones null,
    metadata keys sorted (``_ENCODER``).  pydantic wrote the same bytes, except that a float's
    positive exponent has no ``+`` (``1e16``, was ``1e+16``): the same number to every reader."""
    return [_ENCODER.encode(r) for r in records]


def _decode_in_chunks(doc: dict[str, Any], sizes: list[int]) -> tuple[AppendBody, list[bytes]]:
    """Validate a large append a slice of records at a time.

    The validator holds the GIL while it runs: in one call over thousands of records (or
    values) the decoding thread would stall the event loop as surely as decoding on it.  Between
    slices the loop gets its turn.  Each slice is validated from JSON again, so the rules are
    exactly the body's (``json.loads`` took ``NaN`` and lone surrogates; the JSON of the slice
    carries them to the validator, which refuses them as it would in the body).
    """
    records = doc["records"]
    parsed: list[RecordIn] = []
    for i, end in _slices(sizes):
        chunk = json.dumps(records[i:end]).encode()
        try:
            parsed.extend(_checked(_RECORDS.decode(chunk), i))
        except msgspec.MsgspecError as e:
            raise _bad(e, i) from None
    # The rest of the body, with one stand-in record (the real ones are validated above).
    envelope = {k: v for k, v in doc.items() if k != "records"}
    envelope["records"] = [{"id": "-", "op": "add"}]
    try:
        body = _BODY.decode(json.dumps(envelope).encode())
    except msgspec.MsgspecError as e:
        raise _bad(e) from None
    body.records = parsed
    return body, _stored(parsed)


def record_count(raw: bytes) -> int | None:
    """How many records an append body holds, counted without validating them: a tenth of
    the cost of ``decode_append`` (the quotas' ``precheck`` runs on it).  None: not an
    append body (``decode_append`` says why)."""
    try:
        return len(_COUNTED.decode(raw).records)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):  # nested too deep
        return None


def decode_append(raw: bytes, limits: RecordLimits) -> tuple[AppendBody, list[bytes]]:
    """Validate an append body; the records as stored (compact JSON)."""
    limit = limits.records
    if len(raw) > min(_MIN_RECORD_BYTES * limit, _MIN_VALUE_BYTES * _CHUNK_VALUES):
        # Large enough to hold too many records or values: counted on the parsed JSON before
        # any validation.
        doc = _count_records(raw, limit)
        if isinstance(doc, dict) and isinstance(doc.get("records"), list):
            sizes = _record_values(doc["records"], limits)
            if len(sizes) > _CHUNK_RECORDS or sum(sizes) > _CHUNK_VALUES:
                return _decode_in_chunks(doc, sizes)
    if not raw:
        raise BadRequest("body: a JSON object is required")
    try:
        body = _BODY.decode(raw)
    except msgspec.MsgspecError as e:
        raise _bad(e) from None
    except UnicodeDecodeError as e:  # msgspec's own error for a string that is not UTF-8
        raise BadRequest(f"body: not UTF-8 ({e.reason} at byte {e.start} of a string)") from None
    if len(body.records) > limit:
        raise BadRequest(f"records: at most {limit} per request")
    _check_record_sizes(body.records, limits)
    return body, _stored(_checked(body.records))


class AppendDecoder:
    """Decodes append bodies under one set of limits; a large body on the decoder's own threads
    (not the default executor: large bodies must not queue the store's I/O behind them)."""

    def __init__(self, limits: RecordLimits) -> None:
        self.limits = limits
        self._threads = concurrent.futures.ThreadPoolExecutor(
            max_workers=2, thread_name_prefix="decode"
        )

    async def decode(self, raw: bytes) -> tuple[AppendBody, list[bytes]]:
        """The request and its records as stored; the record count is checked before any
        record is validated, so the work per request is bounded."""
        if len(raw) > _DECODE_OFF_LOOP_BYTES:
            loop = asyncio.get_running_loop()
            return await loop.run_in_executor(self._threads, decode_append, raw, self.limits)
        return decode_append(raw, self.limits)

    def close(self) -> None:
        """Let the decoder's threads go (a decode under way finishes)."""
        self._threads.shutdown(wait=False)
