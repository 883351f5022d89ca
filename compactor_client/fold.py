"""The compaction fold: applying log records, in offset order, on top of a compacted version.

This is the reference semantics, in plain Python so it also runs inside Spark executors (it
imports nothing but the standard library):

* ``add``    inserts when the id is absent, else changes nothing;
* ``upsert`` inserts when absent, else updates;
* ``update`` updates when present, else changes nothing;
* ``delete`` removes the id.

An update replaces ``document`` and ``embedding`` when the record gives them (non-null) and merges
``metadata`` key by key, a null value removing the key.  An insert takes the record's fields as they
are, except that null metadata values are dropped (a null means "no such key").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import CompactorError

Scalar = str | int | float | bool | None
OPS = frozenset({"add", "update", "upsert", "delete"})


class InvalidRecord(CompactorError, ValueError):
    """A record that is not a well-formed Record (bad id, op or field types)."""


@dataclass(slots=True)
class Row:
    """One live document of a compacted collection."""

    id: str
    document: str | None = None
    metadata: dict[str, Scalar] = field(default_factory=dict)
    embedding: list[float] | None = None


def metadata_json(metadata: Mapping[str, Scalar]) -> str:
    """Compact, key-sorted JSON of a metadata object (sorted so output is deterministic)."""
    return json.dumps(dict(metadata), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def _field(record: Mapping[str, Any] | Any, name: str) -> Any:
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


def _check_metadata(md: Any) -> dict[str, Scalar] | None:
    if md is None:
        return None
    if not isinstance(md, Mapping):
        raise InvalidRecord(f"metadata must be an object, got {type(md).__name__}")
    for k, v in md.items():
        if not isinstance(k, str):
            raise InvalidRecord(f"metadata key {k!r} is not a string")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise InvalidRecord(f"metadata value of {k!r} is not a scalar")
    return dict(md)


def _check_embedding(emb: Any) -> list[float] | None:
    if emb is None:
        return None
    if not isinstance(emb, (list, tuple)) or not all(
        isinstance(x, (int, float)) and not isinstance(x, bool) for x in emb
    ):
        raise InvalidRecord("embedding must be a list of numbers")
    try:
        return [float(x) for x in emb]
    except OverflowError:
        raise InvalidRecord("embedding value too large for a float") from None


Metadata = dict[str, Scalar]


def _insert(rid: str, doc: str | None, md: Metadata | None, emb: list[float] | None) -> Row:
    clean: Metadata = {k: v for k, v in (md or {}).items() if v is not None}
    return Row(id=rid, document=doc, metadata=clean, embedding=emb)


def _update(row: Row, doc: str | None, md: Metadata | None, emb: list[float] | None) -> Row:
    # A new Row rather than mutation: the caller's previous rows must stay untouched.
    merged = dict(row.metadata)
    for k, v in (md or {}).items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    return Row(
        id=row.id,
        document=doc if doc is not None else row.document,
        metadata=merged,
        embedding=emb if emb is not None else row.embedding,
    )


def apply(rows: dict[str, Row], record: Mapping[str, Any] | Any) -> None:
    """Apply one record to ``rows`` in place (``rows`` must be owned by the caller)."""
    rid = _field(record, "id")
    op = _field(record, "op")
    if not isinstance(rid, str):
        raise InvalidRecord(f"record id must be a string, got {rid!r}")
    if op not in OPS:
        raise InvalidRecord(f"unknown op {op!r} for id {rid!r}")
    if op == "delete":
        rows.pop(rid, None)
        return
    doc = _field(record, "document")
    if doc is not None and not isinstance(doc, str):
        raise InvalidRecord(f"document of {rid!r} must be a string or null")
    md = _check_metadata(_field(record, "metadata"))
    emb = _check_embedding(_field(record, "embedding"))
    current = rows.get(rid)
    if current is None:
        if op in ("add", "upsert"):
            rows[rid] = _insert(rid, doc, md, emb)
    elif op in ("update", "upsert"):
        rows[rid] = _update(current, doc, md, emb)
    # add on a present id, update on an absent id: no change by definition.


def fold(
    previous_rows: Mapping[str, Row], records: Iterable[Mapping[str, Any] | Any]
) -> dict[str, Row]:
    """Apply ``records`` (already in offset order) on top of ``previous_rows``; returns new rows."""
    rows = dict(previous_rows)
    for record in records:
        apply(rows, record)
    return rows


def parse_body(body: bytes | str) -> dict[str, Any]:
    """Decode a fragment body (compact JSON of a Record)."""
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise InvalidRecord(f"record body is not JSON: {e}") from e
    if not isinstance(value, dict):
        raise InvalidRecord("record body is not a JSON object")
    return value
