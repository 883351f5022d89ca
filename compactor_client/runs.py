"""Sorted runs of the leveled compacted layout, folded and merged on Arrow arrays.

A *run* is a Parquet file of one entry per document id, sorted by id, holding the *effect* that a
stretch of the log has on that id — not necessarily its state, since a round reads only the
records of its window and none of the collection's older data.  The semantics are exactly those of
``fold`` (the reference, in plain Python): an effect maps the id's state below the run (absent, or
a row) to its state above it, and every effect a sequence of records can have is one of

=====  ============  =====================================  ======================================
kind   name          if the id is absent below               if the id is a row ``r`` below
=====  ============  =====================================  ======================================
0      ``ROW``       the row in the main columns            the row in the main columns
1      ``TOMBSTONE`` absent                                  absent
2      ``UPDATE``    absent                                  ``r`` patched by the main columns
3      ``UPSERT``    the main columns' patch on an empty row ``r`` patched by the main columns
4      ``ADD``       the row in the main columns            ``r`` unchanged
5      ``GENERAL``   the row in the ``ins_*`` columns        ``r`` patched by the main columns
=====  ============  =====================================  ======================================

A patch replaces ``document`` and ``embedding`` where it has them (non-null) and merges
``metadata`` key by key, a null value removing the key; an empty row is (null, ``{}``, null).
Records are effects themselves (``add`` → ADD with null metadata values dropped, ``upsert`` →
UPSERT, ``update`` → UPDATE, ``delete`` → TOMBSTONE), effects compose (:func:`compose`), and the
composition of two effects is again one of the six, so a run of newer records over a run of older
ones is the newer run's effects composed over the older's, id by id.

The *bottom* run (nothing older below it) is resolved against "absent": it holds only ``ROW``
entries, which is a complete compacted version in the single-version layout's columns
(``id, document, metadata, embedding``) plus the ``kind`` and ``ins_*`` columns.  A version file of
that older layout (no ``kind`` column) reads as a bottom run.

Only ids that need it are touched in Python: a window's ids with a single record, and every id
present in only one of two runs being merged, are copied with Arrow ``take``; Python composes the
records of ids written more than once in a window, and merges an id present in both runs only when
the newer entry is a patch of the older.  This module runs on Spark executors: pyarrow, numpy and
the standard library only.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .fold import OPS, InvalidRecord, Scalar, metadata_json

ROW, TOMBSTONE, UPDATE, UPSERT, ADD, GENERAL = 0, 1, 2, 3, 4, 5
KIND_NAMES = ("row", "tombstone", "update", "upsert", "add", "general")
OP_KIND = {"add": ADD, "upsert": UPSERT, "update": UPDATE, "delete": TOMBSTONE}
ABSOLUTE = (ROW, TOMBSTONE)

EMBEDDING = pa.list_(pa.float32())
RUN_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("kind", pa.int8(), nullable=False),
        pa.field("document", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("embedding", EMBEDDING),
        pa.field("ins_document", pa.string()),
        pa.field("ins_metadata", pa.string()),
        pa.field("ins_embedding", EMBEDDING),
    ]
)
# What readers get: the single-version layout's columns (metadata is compact, key-sorted JSON).
STATE_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("document", pa.string()),
        pa.field("metadata", pa.string(), nullable=False),
        pa.field("embedding", EMBEDDING),
    ]
)
# Parsed records as the read stage emits them (one row per record of a window).
RECORD_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("id", pa.string(), nullable=False),
        pa.field("op", pa.int8(), nullable=False),
        pa.field("document", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("embedding", EMBEDDING),
    ]
)
EMPTY_MD = "{}"
SKETCH_K = 64  # hashes kept per run: overlaps of two runs are estimated to about 1/sqrt(k)


# ------------------------------------------------------------------------------ parsing records


def _check_metadata(md: Any) -> dict[str, Scalar] | None:
    if md is None:
        return None
    if not isinstance(md, dict):
        raise InvalidRecord(f"metadata must be an object, got {type(md).__name__}")
    for k, v in md.items():
        if not isinstance(k, str):  # pragma: no cover - JSON object keys are strings
            raise InvalidRecord(f"metadata key {k!r} is not a string")
        if v is not None and not isinstance(v, (str, int, float, bool)):
            raise InvalidRecord(f"metadata value of {k!r} is not a scalar")
    return md


_FLOAT_ONLY = frozenset({float})
_NUMBERS = frozenset({float, int})


def _check_embedding(emb: Any) -> list[float] | None:
    if emb is None:
        return None
    if not isinstance(emb, list):
        raise InvalidRecord("embedding must be a list of numbers")
    kinds = set(map(type, emb))  # bool is its own type: not a number here
    if kinds <= _FLOAT_ONLY:
        return emb  # floats as JSON decoded them: nothing to convert
    if not kinds <= _NUMBERS:
        raise InvalidRecord("embedding must be a list of numbers")
    try:
        return [float(x) for x in emb]
    except OverflowError:
        raise InvalidRecord("embedding value too large for a float") from None


def parse_records(offsets: Sequence[int], bodies: Sequence[bytes | str]) -> pa.Table:
    """Decode record bodies (compact JSON ``Record``s) into ``RECORD_SCHEMA`` columns.

    Validation is ``fold``'s: a malformed record raises ``InvalidRecord``.  An ``add``'s metadata
    is stored without its null values (an insert drops them); other ops keep them (a null removes
    the key from the row below).  Metadata is compact, key-sorted JSON, null when absent.
    """
    ids: list[str] = []
    ops: list[int] = []
    docs: list[str | None] = []
    mds: list[str | None] = []
    embs: list[list[float] | None] = []
    loads = json.loads
    for body in bodies:
        try:
            rec = loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise InvalidRecord(f"record body is not JSON: {e}") from e
        if not isinstance(rec, dict):
            raise InvalidRecord("record body is not a JSON object")
        rid = rec.get("id")
        op = rec.get("op")
        if not isinstance(rid, str):
            raise InvalidRecord(f"record id must be a string, got {rid!r}")
        if op not in OPS:
            raise InvalidRecord(f"unknown op {op!r} for id {rid!r}")
        ids.append(rid)
        ops.append(OP_KIND[op])
        if op == "delete":
            docs.append(None)
            mds.append(None)
            embs.append(None)
            continue
        doc = rec.get("document")
        if doc is not None and not isinstance(doc, str):
            raise InvalidRecord(f"document of {rid!r} must be a string or null")
        md = _check_metadata(rec.get("metadata"))
        emb = _check_embedding(rec.get("embedding"))
        docs.append(doc)
        if md is None:
            mds.append(None)
        elif op == "add":
            mds.append(metadata_json({k: v for k, v in md.items() if v is not None}))
        else:
            mds.append(_patch_json(md))
        embs.append(emb)
    return pa.table(
        {
            "offset": pa.array(offsets, pa.int64()),
            "id": pa.array(ids, pa.string()),
            "op": pa.array(ops, pa.int8()),
            "document": pa.array(docs, pa.string()),
            "metadata": pa.array(mds, pa.string()),
            "embedding": pa.array(embs, EMBEDDING),
        },
        schema=RECORD_SCHEMA,
    )


def _patch_json(md: Mapping[str, Scalar | None]) -> str:
    return json.dumps(dict(md), separators=(",", ":"), sort_keys=True, ensure_ascii=False)


# ------------------------------------------------------------------------------ the algebra
#
# In Python, an entry's values are *references*: indices into pools of Arrow values (a document
# column, an embedding column), -1 for null, so embeddings and documents never become Python
# objects; metadata is a dict.  A row is (doc, emb, md); a patch is (doc, emb, md) where -1 keeps
# the value below and a None value in md removes the key.


@dataclass(slots=True)
class Entry:
    """One id's effect (see the module docstring); refs index the caller's pools."""

    kind: int
    doc: int = -1
    emb: int = -1
    md: dict[str, Any] | None = None
    ins_doc: int = -1
    ins_emb: int = -1
    ins_md: dict[str, Any] | None = None


Row3 = tuple[int, int, dict[str, Any]]  # (doc, emb, metadata)
_ABSENT = None


def _clean(md: Mapping[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (md or {}).items() if v is not None}


def _patch(row: Row3, p: Row3) -> Row3:
    merged = dict(row[2])
    for k, v in p[2].items():
        if v is None:
            merged.pop(k, None)
        else:
            merged[k] = v
    return (p[0] if p[0] >= 0 else row[0], p[1] if p[1] >= 0 else row[1], merged)


def _then(p: Row3, q: Row3) -> Row3:
    """The patch ``q`` after the patch ``p``."""
    return (q[0] if q[0] >= 0 else p[0], q[1] if q[1] >= 0 else p[1], {**p[2], **q[2]})


def _split(e: Entry) -> tuple[Row3 | None, tuple[str, Row3] | None]:
    """(what absent below becomes, what a present row below becomes) of an entry: the second is
    ("row", r), ("patch", p) or None (absent)."""
    md = e.md or {}
    if e.kind == ROW:
        r = (e.doc, e.emb, md)
        return r, ("row", r)
    if e.kind == TOMBSTONE:
        return None, None
    p = (e.doc, e.emb, md)
    if e.kind == UPDATE:
        return None, ("patch", p)
    if e.kind == UPSERT:
        return (e.doc, e.emb, _clean(md)), ("patch", p)
    if e.kind == ADD:
        return (e.doc, e.emb, md), ("patch", (-1, -1, {}))
    return (e.ins_doc, e.ins_emb, e.ins_md or {}), ("patch", p)


def _apply_to_absent(upper_a: Row3 | None) -> Row3 | None:
    return upper_a


def _apply_to_row(upper_r: tuple[str, Row3] | None, row: Row3) -> Row3 | None:
    if upper_r is None:
        return None
    how, v = upper_r
    return v if how == "row" else _patch(row, v)


def compose(upper: Entry, lower: Entry) -> Entry:
    """The effect of ``lower`` followed by ``upper`` (``upper`` is newer)."""
    ua, ur = _split(upper)
    la, lr = _split(lower)
    # Absent below the pair: lower makes it la, then upper acts on that.
    a = _apply_to_absent(ua) if la is None else _apply_to_row(ur, la)
    # A row below the pair: lower makes it lr, then upper acts on that.
    r: tuple[str, Row3] | None
    if lr is None:
        r = None if ua is None else ("row", ua)
    elif lr[0] == "row":
        got = _apply_to_row(ur, lr[1])
        r = None if got is None else ("row", got)
    elif ur is None:
        r = None
    elif ur[0] == "row":
        r = ur
    else:
        r = ("patch", _then(lr[1], ur[1]))
    return _encode(a, r)


def _encode(a: Row3 | None, r: tuple[str, Row3] | None) -> Entry:
    if r is None:
        if a is not None:  # pragma: no cover - no sequence of records has this effect
            raise AssertionError("an effect that deletes rows but creates absent ones")
        return Entry(TOMBSTONE)
    how, v = r
    if how == "row":
        if a != v:  # pragma: no cover - an absolute effect is the same either way
            raise AssertionError("an absolute effect that depends on the state below")
        return Entry(ROW, v[0], v[1], v[2])
    if a is None:
        return Entry(UPDATE, v[0], v[1], v[2])
    if a == (v[0], v[1], _clean(v[2])):
        return Entry(UPSERT, v[0], v[1], v[2])
    if v == (-1, -1, {}):
        return Entry(ADD, a[0], a[1], a[2])
    return Entry(GENERAL, v[0], v[1], v[2], a[0], a[1], a[2])


def resolve_absent(e: Entry) -> Entry | None:
    """An entry with nothing below it: a ``ROW``, or None when the id ends up absent."""
    a, _ = _split(e)
    return None if a is None else Entry(ROW, a[0], a[1], a[2])


# ------------------------------------------------------------------------------ building tables


def _indices(refs: Sequence[int] | np.ndarray) -> pa.Array:
    arr = np.asarray(refs, dtype=np.int64)
    return pa.array(arr, pa.int64(), mask=arr < 0)


def _md_text(md: dict[str, Any] | None) -> str | None:
    return None if md is None else _patch_json(md)


def _concat(arrays: Sequence[pa.Array | pa.ChunkedArray], type_: pa.DataType) -> pa.ChunkedArray:
    chunks: list[pa.Array] = []
    for a in arrays:
        if isinstance(a, pa.ChunkedArray):
            chunks.extend(a.chunks)
        else:
            chunks.append(a)
    return pa.chunked_array(chunks, type_)


def empty_run() -> pa.Table:
    """A run with no entries."""
    return RUN_SCHEMA.empty_table()


def as_run(table: pa.Table) -> pa.Table:
    """A run table in ``RUN_SCHEMA`` from a stored file's table: a version of the single-version
    layout (no ``kind``) is a run of rows."""
    n = table.num_rows
    cols: dict[str, Any] = {}
    for f in RUN_SCHEMA:
        if f.name in table.column_names:
            cols[f.name] = table.column(f.name).cast(f.type)
        elif f.name == "kind":
            cols[f.name] = pa.array(np.zeros(n, np.int8), pa.int8())
        else:
            cols[f.name] = pa.nulls(n, f.type)
    return pa.table(cols, schema=RUN_SCHEMA)


def _md_dicts(column: pa.ChunkedArray | pa.Array, rows: np.ndarray) -> list[dict[str, Any] | None]:
    """The metadata of ``rows`` as dicts; equal texts share one dict (nothing here mutates a
    metadata dict: compositions build new ones), so repeated metadata is decoded once."""
    texts = column.take(pa.array(rows, pa.int64())).to_pylist() if len(rows) else []
    parsed: dict[str, dict[str, Any]] = {}
    out: list[dict[str, Any] | None] = []
    for t in texts:
        if t is None:
            out.append(None)
            continue
        md = parsed.get(t)
        if md is None:
            md = parsed[t] = json.loads(t)
        out.append(md)
    return out


def fold_window(records: pa.Table) -> pa.Table:
    """One window's records (``RECORD_SCHEMA``, any order, dense offsets checked by the caller)
    as a run: one entry per id, the composition of its records in offset order."""
    n = records.num_rows
    if n == 0:
        return empty_run()
    order = pc.sort_indices(records, sort_keys=[("id", "ascending"), ("offset", "ascending")])
    recs = records.take(order)
    ids = recs.column("id")
    # Group boundaries: where the id differs from the previous row's.
    if n > 1:
        differs = pc.not_equal(ids.slice(1), ids.slice(0, n - 1)).to_numpy(zero_copy_only=False)
        starts = np.concatenate(([0], np.flatnonzero(differs) + 1))
    else:
        starts = np.zeros(1, np.int64)
    sizes = np.diff(np.append(starts, n))
    single = sizes == 1
    groups = len(starts)

    kind = pc.cast(recs.column("op"), pa.int8()).to_numpy(zero_copy_only=False)[starts].copy()
    # By default an output row is its group's first record (exact for single-record groups).
    doc_ix = starts.astype(np.int64)
    emb_ix = starts.astype(np.int64)
    md_ix = starts.astype(np.int64)
    ins_doc_ix = np.full(groups, -1, np.int64)
    ins_emb_ix = np.full(groups, -1, np.int64)
    ins_md_ix = np.full(groups, -1, np.int64)
    extra_md: list[str | None] = []

    multi = np.flatnonzero(~single)
    if len(multi):
        op_np = recs.column("op").to_numpy(zero_copy_only=False)
        doc_valid = recs.column("document").is_valid().to_numpy(zero_copy_only=False)
        emb_valid = recs.column("embedding").is_valid().to_numpy(zero_copy_only=False)
        rows = np.concatenate([np.arange(starts[g], starts[g] + sizes[g]) for g in multi])
        mds = dict(zip(rows.tolist(), _md_dicts(recs.column("metadata"), rows), strict=True))
        base = n  # extra metadata strings are appended to the metadata pool after the records
        for g in multi.tolist():
            s0 = int(starts[g])
            e: Entry | None = None
            for i in range(s0, s0 + int(sizes[g])):
                k = int(op_np[i])
                md = mds[i]
                if k == TOMBSTONE:
                    rec = Entry(TOMBSTONE)
                else:
                    rec = Entry(
                        k,
                        i if doc_valid[i] else -1,
                        i if emb_valid[i] else -1,
                        md if md is not None else {},
                    )
                e = rec if e is None else compose(rec, e)
            assert e is not None
            kind[g] = e.kind
            doc_ix[g], emb_ix[g] = e.doc, e.emb
            ins_doc_ix[g], ins_emb_ix[g] = e.ins_doc, e.ins_emb
            if e.kind == TOMBSTONE:
                md_ix[g] = -1
            else:
                md_ix[g] = base + len(extra_md)
                extra_md.append(_md_text(e.md))
            if e.kind == GENERAL:
                ins_md_ix[g] = base + len(extra_md)
                extra_md.append(_md_text(e.ins_md))
    md_pool = _concat([recs.column("metadata"), pa.array(extra_md, pa.string())], pa.string())
    run = pa.table(
        {
            "id": ids.take(pa.array(starts, pa.int64())),
            "kind": pa.array(kind, pa.int8()),
            "document": recs.column("document").take(_indices(doc_ix)),
            "metadata": md_pool.take(_indices(md_ix)),
            "embedding": recs.column("embedding").take(_indices(emb_ix)),
            "ins_document": recs.column("document").take(_indices(ins_doc_ix)),
            "ins_metadata": md_pool.take(_indices(ins_md_ix)),
            "ins_embedding": recs.column("embedding").take(_indices(ins_emb_ix)),
        },
        schema=RUN_SCHEMA,
    )
    return _fill_empty_metadata(run)


def _fill_empty_metadata(run: pa.Table) -> pa.Table:
    """Null metadata means ``{}`` for every kind but TOMBSTONE (stored as written: ``{}``)."""
    md = run.column("metadata")
    if md.null_count == 0:
        return run
    filled = pc.fill_null(md, EMPTY_MD)
    return run.set_column(run.schema.get_field_index("metadata"), "metadata", filled)


def merge(upper: pa.Table, lower: pa.Table, *, bottom: bool) -> pa.Table:
    """The run equal to ``upper`` (newer) over ``lower`` (older); resolved against absent when
    ``bottom`` (nothing is older than ``lower``)."""
    upper, lower = as_run(upper), as_run(lower)
    nu, nl = upper.num_rows, lower.num_rows
    if nu == 0 or nl == 0:
        out = lower if nu == 0 else upper
        return resolve_bottom(out) if bottom else out
    lidx = pc.index_in(upper.column("id"), value_set=lower.column("id"))
    both_mask = lidx.is_valid().to_numpy(zero_copy_only=False)
    lidx_np = pc.fill_null(lidx, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    ukind = upper.column("kind").to_numpy()
    needs = both_mask & ~np.isin(ukind, ABSOLUTE)  # a patch of something below: compose
    shadowed = np.zeros(nl, dtype=bool)
    shadowed[lidx_np[both_mask]] = True
    keep_lower = np.flatnonzero(~shadowed)

    # Pools: [upper main, upper ins, lower main, lower ins] for documents and embeddings, and
    # the same for metadata plus the composed entries' metadata at the end.
    u_ins, l_main, l_ins = nu, 2 * nu, 2 * nu + nl
    out_id: list[np.ndarray] = []
    cols: dict[str, list[np.ndarray]] = {
        k: [] for k in ("kind", "doc", "emb", "md", "ins_doc", "ins_emb", "ins_md")
    }

    def bulk(rows: np.ndarray, main: int, ins: int, kinds: np.ndarray, id_base: int) -> None:
        out_id.append(rows + id_base)
        cols["kind"].append(kinds[rows])
        for name in ("doc", "emb", "md"):
            cols[name].append(rows + main)
            cols["ins_" + name].append(rows + ins)

    plain_upper = np.flatnonzero(~needs)
    bulk(plain_upper, 0, u_ins, ukind, 0)
    bulk(keep_lower, l_main, l_ins, lower.column("kind").to_numpy(), nu)

    composed_rows = np.flatnonzero(needs)
    extra_md: list[str | None] = []
    if len(composed_rows):
        lrows = lidx_np[composed_rows]
        uents = _entries(upper, composed_rows, 0, u_ins)
        lents = _entries(lower, lrows, l_main, l_ins)
        md_base = 2 * nu + 2 * nl
        n_c = len(composed_rows)
        c = {k: np.full(n_c, -1, np.int64) for k in ("doc", "emb", "md", "ins_doc", "ins_emb")}
        c_ins_md = np.full(n_c, -1, np.int64)
        c_kind = np.zeros(n_c, np.int8)
        for j, (ue, le) in enumerate(zip(uents, lents, strict=True)):
            e = compose(ue, le)
            c_kind[j] = e.kind
            c["doc"][j], c["emb"][j] = e.doc, e.emb
            c["ins_doc"][j], c["ins_emb"][j] = e.ins_doc, e.ins_emb
            if e.kind != TOMBSTONE:
                c["md"][j] = md_base + len(extra_md)
                extra_md.append(_md_text(e.md))
            if e.kind == GENERAL:
                c_ins_md[j] = md_base + len(extra_md)
                extra_md.append(_md_text(e.ins_md))
        out_id.append(composed_rows)
        cols["kind"].append(c_kind)
        for name in ("doc", "emb", "md", "ins_doc", "ins_emb"):
            cols[name].append(c[name])
        cols["ins_md"].append(c_ins_md)

    def pool(name: str, type_: pa.DataType, extra: list[Any] | None = None) -> pa.ChunkedArray:
        parts = [
            upper.column(name),
            upper.column("ins_" + name),
            lower.column(name),
            lower.column("ins_" + name),
        ]
        if extra is not None:
            parts.append(pa.array(extra, type_))
        return _concat(parts, type_)

    docs = pool("document", pa.string())
    embs = pool("embedding", EMBEDDING)
    mds = pool("metadata", pa.string(), extra_md)
    ids = _concat([upper.column("id"), lower.column("id")], pa.string())

    def cat(name: str) -> np.ndarray:
        return np.concatenate(cols[name]) if cols[name] else np.zeros(0, np.int64)

    id_ix = np.concatenate(out_id)
    out = pa.table(
        {
            "id": ids.take(pa.array(id_ix, pa.int64())),
            "kind": pa.array(cat("kind").astype(np.int8), pa.int8()),
            "document": docs.take(_indices(cat("doc"))),
            "metadata": mds.take(_indices(cat("md"))),
            "embedding": embs.take(_indices(cat("emb"))),
            "ins_document": docs.take(_indices(cat("ins_doc"))),
            "ins_metadata": mds.take(_indices(cat("ins_md"))),
            "ins_embedding": embs.take(_indices(cat("ins_emb"))),
        },
        schema=RUN_SCHEMA,
    )
    out = _fill_empty_metadata(out)
    out = out.take(pc.sort_indices(out.column("id")))
    return resolve_bottom(out) if bottom else out


def _entries(run: pa.Table, rows: np.ndarray, main: int, ins: int) -> list[Entry]:
    """Entries of ``run``'s ``rows``, their refs offset into the caller's pools."""
    take = pa.array(rows, pa.int64())
    kinds = run.column("kind").take(take).to_pylist()
    doc_ok = run.column("document").take(take).is_valid().to_pylist()
    emb_ok = run.column("embedding").take(take).is_valid().to_pylist()
    ins_doc_ok = run.column("ins_document").take(take).is_valid().to_pylist()
    ins_emb_ok = run.column("ins_embedding").take(take).is_valid().to_pylist()
    mds = _md_dicts(run.column("metadata"), rows)
    ins_mds = _md_dicts(run.column("ins_metadata"), rows)
    out = []
    for j, r in enumerate(rows.tolist()):
        out.append(
            Entry(
                kinds[j],
                main + r if doc_ok[j] else -1,
                main + r if emb_ok[j] else -1,
                mds[j] if mds[j] is not None else {},
                ins + r if ins_doc_ok[j] else -1,
                ins + r if ins_emb_ok[j] else -1,
                ins_mds[j] if ins_mds[j] is not None else {},
            )
        )
    return out


def resolve_bottom(run: pa.Table) -> pa.Table:
    """A run with nothing below it: only ``ROW`` entries (tombstones and update-only patches
    dropped, inserts taken)."""
    run = as_run(run)
    kind = run.column("kind").to_numpy()
    if run.num_rows == 0 or bool(np.all(kind == ROW)):
        return run
    keep = np.flatnonzero(np.isin(kind, (ROW, UPSERT, ADD, GENERAL)))
    run = run.take(pa.array(keep, pa.int64()))
    kind = kind[keep]
    general = kind == GENERAL
    upsert = kind == UPSERT
    mask = pa.array(general)
    doc = pc.if_else(mask, run.column("ins_document"), run.column("document"))
    emb = pc.if_else(mask, run.column("ins_embedding"), run.column("embedding"))
    md = pc.if_else(mask, run.column("ins_metadata"), run.column("metadata"))
    if upsert.any():
        # An upsert onto nothing inserts its patch without the keys it removes: only patches
        # with a null value (":null" in compact JSON) need Python.
        ups = np.flatnonzero(upsert)
        nulls = pc.match_substring(md.take(pa.array(ups, pa.int64())), ":null")
        fix = ups[pc.fill_null(nulls, False).to_numpy(zero_copy_only=False)]
        if len(fix):
            texts = md.take(pa.array(fix, pa.int64())).to_pylist()
            cleaned = [None if t is None else metadata_json(_clean(json.loads(t))) for t in texts]
            ix = np.arange(run.num_rows, dtype=np.int64)
            ix[fix] = run.num_rows + np.arange(len(fix), dtype=np.int64)
            md = _concat([md, pa.array(cleaned, pa.string())], pa.string()).take(pa.array(ix))
    n = run.num_rows
    out = pa.table(
        {
            "id": run.column("id"),
            "kind": pa.array(np.zeros(n, np.int8), pa.int8()),
            "document": doc,
            "metadata": pc.fill_null(md, EMPTY_MD),
            "embedding": emb,
            "ins_document": pa.nulls(n, pa.string()),
            "ins_metadata": pa.nulls(n, pa.string()),
            "ins_embedding": pa.nulls(n, EMBEDDING),
        },
        schema=RUN_SCHEMA,
    )
    return out


def state_table(bottom: pa.Table) -> pa.Table:
    """A resolved run as a collection's state (``STATE_SCHEMA``), metadata as canonical JSON."""
    run = resolve_bottom(bottom)
    md = run.column("metadata")
    # Canonical JSON as the reference fold writes it (metadata_json: sorted keys, no spaces);
    # runs store exactly that, so this only re-encodes files of other writers.
    return pa.table(
        {
            "id": run.column("id"),
            "document": run.column("document"),
            "metadata": md,
            "embedding": run.column("embedding"),
        },
        schema=STATE_SCHEMA,
    )


def materialize(runs: Sequence[pa.Table]) -> pa.Table:
    """The state of a stack of runs, newest first (``runs[0]`` on top)."""
    if not runs:
        return STATE_SCHEMA.empty_table()
    acc = as_run(runs[-1])
    for i in range(len(runs) - 2, -1, -1):
        acc = merge(runs[i], acc, bottom=False)
    return state_table(resolve_bottom(acc))


# ------------------------------------------------------------------------------ statistics


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def id_hashes(ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A 64-bit hash of every id, vectorised (numpy over the string buffers): a sum of the bytes
    weighted by pseudo-random numbers of their positions, then mixed (splitmix64)."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    arr = arr.cast(pa.large_string())
    n = len(arr)
    if n == 0:
        return np.zeros(0, np.uint64)
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    lengths = np.diff(offsets)
    h = lengths.astype(np.uint64)
    total = int(offsets[-1] - offsets[0])
    if total:
        data = np.frombuffer(bufs[2], dtype=np.uint8)[int(offsets[0]) : int(offsets[-1])]
        firsts = offsets[:-1] - offsets[0]
        pos = np.arange(total, dtype=np.int64) - np.repeat(firsts, lengths)
        weights = _splitmix(np.arange(int(lengths.max()), dtype=np.uint64))
        nonempty = lengths > 0
        with np.errstate(over="ignore"):
            contrib = (data.astype(np.uint64) + np.uint64(1)) * weights[pos]
            sums = np.add.reduceat(contrib, firsts[nonempty])
            h[nonempty] = h[nonempty] * np.uint64(0x100000001B3) + sums
    return _splitmix(h)


def sketch(ids: pa.Array | pa.ChunkedArray, k: int = SKETCH_K) -> str:
    """A bottom-k sketch of a run's ids (the k smallest hashes), base64 of little-endian u64."""
    h = np.unique(id_hashes(ids))[:k]
    return base64.b64encode(h.astype("<u8").tobytes()).decode()


def parse_sketch(text: str | None) -> np.ndarray | None:
    """A sketch back as sorted hashes (None when absent)."""
    if not text:
        return None
    return np.frombuffer(base64.b64decode(text), dtype="<u8").astype(np.uint64)


def overlap(a: np.ndarray | None, a_rows: int, b: np.ndarray | None, b_rows: int) -> float:
    """Estimated number of ids two runs share, from their bottom-k sketches (0 when unknown)."""
    if a is None or b is None or not len(a) or not len(b):
        return 0.0
    k = min(SKETCH_K, len(np.union1d(a, b)))
    union = np.union1d(a, b)[:k]
    both = np.intersect1d(np.intersect1d(a, b), union)
    j = len(both) / max(1, k)
    return j / (1.0 + j) * (a_rows + b_rows)


@dataclass(frozen=True, slots=True)
class RunStats:
    """What CURRENT.json records of a run, computed from its table."""

    rows: int
    bytes: int
    tombstones: int
    sketch: str


def stats_of(run: pa.Table) -> RunStats:
    """A run's entry counts, its in-memory size (Arrow bytes) and its id sketch."""
    kind = run.column("kind").to_numpy() if run.num_rows else np.zeros(0, np.int8)
    return RunStats(
        rows=run.num_rows,
        bytes=int(run.nbytes),
        tombstones=int(np.count_nonzero(kind == TOMBSTONE)),
        sketch=sketch(run.column("id")),
    )
