"""The code Spark executors run: read fragments into Arrow, fold each collection, write runs.

Kept apart from the driver code so executors import only this module, ``runs``, ``levels``,
``fold``, ``integrity`` and ``parquet_io`` (pyarrow, numpy and the standard library): no httpx, no
host package, no event loop.

The job is two DataFrame stages and nothing crosses them as a Python object:

1. ``mapInArrow(read_tasks)`` over a DataFrame of tasks ``(cidx, task)`` (JSON): a *fragment*
   task reads one fragment, verifies it against its pointer (its MD5 when the host reports one,
   else the setsum of its records: ``integrity``), keeps the records of its collection's window
   and decodes their bodies into Arrow columns (``READ_DDL``); a *fold* task becomes its
   collection's marker row (offset 0, the task in ``note``), so a collection always reaches
   stage 2 with its plan.  A fragment that cannot be read or verified is an error row (offset
   -1, ``{"error", "kind"}`` in ``note``) that fails its collection: nothing unverified is folded.
2. ``repartition(n, "cidx").groupBy("cidx").applyInArrow(fold_group)``: one call per collection
   with all its rows as one Arrow table; it checks that the records are exactly the window's
   offsets, folds them into a new top run (``runs.fold_window``), merges levels as the policy says
   (``levels``), writes the new runs under the keys the driver allocated, and returns one row of
   statistics (``STATS_DDL``) with the new stack of runs.  The driver installs it.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from . import runs
from .crashpoints import crash_point
from .errors import CompactorError
from .integrity import CorruptFragmentError, check_md5, check_setsum
from .levels import Level, Policy, choose
from .parquet_io import S3Options, read_bytes, read_run, run_footer, write_run

ERROR_OFFSET = -1
MARKER_OFFSET = 0

READ_DDL = (
    "cidx INT, offset BIGINT, id STRING, op TINYINT, document STRING, metadata STRING, "
    "embedding ARRAY<FLOAT>, note STRING"
)
READ_SCHEMA = pa.schema(
    [
        pa.field("cidx", pa.int32()),
        pa.field("offset", pa.int64()),
        pa.field("id", pa.string()),
        pa.field("op", pa.int8()),
        pa.field("document", pa.string()),
        pa.field("metadata", pa.string()),
        pa.field("embedding", runs.EMBEDDING),
        pa.field("note", pa.string()),
    ]
)
TASK_DDL = "cidx INT, task STRING"
STATS_DDL = (
    "cidx INT, collection_id STRING, records_in BIGINT, rows_out BIGINT, bytes_out BIGINT, "
    "runs STRING, merges INT, error STRING, error_kind STRING"
)
STATS_SCHEMA = pa.schema(
    [
        pa.field("cidx", pa.int32()),
        pa.field("collection_id", pa.string()),
        pa.field("records_in", pa.int64()),
        pa.field("rows_out", pa.int64()),
        pa.field("bytes_out", pa.int64()),
        pa.field("runs", pa.string()),
        pa.field("merges", pa.int32()),
        pa.field("error", pa.string()),
        pa.field("error_kind", pa.string()),
    ]
)


class GapError(CompactorError, ValueError):
    """The records of a collection's window are not exactly the dense offsets [start, end)."""

    kind = "gap"


class FoldError(CompactorError):
    """A collection's fold failed; ``kind`` is the typed cause (``corrupt_fragment``, ``gap``...)."""

    def __init__(self, message: str, kind: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class FragmentTask:
    """Read one fragment and keep the records of its collection's window [lo, hi)."""

    cidx: int
    url: str
    start: int
    limit: int
    lo: int
    hi: int
    setsum: str | None = None  # as the host's manifest records it
    content_md5: str | None = None  # hex MD5 of the object, when the manifest records one


@dataclass(frozen=True, slots=True)
class RunRef:
    """One run of a collection's stack as CURRENT.json lists it (top of the stack first)."""

    key: str
    url: str
    rows: int
    bytes: int | None = None  # Arrow bytes; None for an old-layout version (read from its footer)
    tombstones: int = 0
    sketch: str | None = None


@dataclass(frozen=True, slots=True)
class FoldTask:
    """Fold one collection's window [start, end) into a new top run over ``base`` (top first),
    merge levels as ``ratio``/``min_reward`` say, and write new runs to ``outputs`` (URL, key)."""

    cidx: int
    collection_id: str
    start: int
    end: int
    base: tuple[RunRef, ...] = ()
    outputs: tuple[tuple[str, str], ...] = ()
    ratio: float = 10.0
    min_reward: float = 1.0

    def to_json(self) -> str:
        """The task as the marker row carries it."""
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> FoldTask:
        """A task back from its marker row."""
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> FoldTask:
        """A task back from its JSON object."""
        d = dict(d)
        d["base"] = tuple(RunRef(**r) for r in d["base"])
        d["outputs"] = tuple((u, k) for u, k in d["outputs"])
        return cls(**d)


@dataclass(frozen=True, slots=True)
class NewRun:
    """One run of the stack a fold produced (top first): written now, or kept from the base."""

    key: str
    rows: int
    bytes: int
    tombstones: int
    sketch: str | None
    written: bool  # written by this fold (else a base run, unchanged)


@dataclass(frozen=True, slots=True)
class CollectionStats:
    """What folding one collection produced, or why it failed."""

    cidx: int
    collection_id: str
    records_in: int
    rows_out: int
    bytes_out: int
    runs: tuple[NewRun, ...] = ()
    merges: int = 0
    error: str | None = None
    error_kind: str | None = None

    def to_row(self) -> dict[str, Any]:
        """The statistics row stage 2 returns."""
        return {
            "cidx": self.cidx,
            "collection_id": self.collection_id,
            "records_in": self.records_in,
            "rows_out": self.rows_out,
            "bytes_out": self.bytes_out,
            "runs": json.dumps([dataclasses.asdict(r) for r in self.runs]),
            "merges": self.merges,
            "error": self.error,
            "error_kind": self.error_kind,
        }

    @classmethod
    def from_row(cls, row: Any) -> CollectionStats:
        """Statistics back from a collected row (a Spark Row or a dict)."""
        get = row.asDict() if hasattr(row, "asDict") else dict(row)
        return cls(
            cidx=int(get["cidx"]),
            collection_id=str(get["collection_id"]),
            records_in=int(get["records_in"] or 0),
            rows_out=int(get["rows_out"] or 0),
            bytes_out=int(get["bytes_out"] or 0),
            runs=tuple(NewRun(**r) for r in json.loads(get["runs"] or "[]")),
            merges=int(get["merges"] or 0),
            error=get["error"],
            error_kind=get["error_kind"],
        )


# ---------------------------------------------------------------------------------- stage 1


def fragment_task_json(t: FragmentTask) -> str:
    """A fragment task as a task row carries it."""
    return json.dumps({"fragment": dataclasses.asdict(t)}, separators=(",", ":"))


def fold_task_json(t: FoldTask) -> str:
    """A fold task as a task row carries it."""
    return json.dumps({"fold": json.loads(t.to_json())}, separators=(",", ":"))


def _note_rows(cidx: int, offset: int, note: str) -> pa.Table:
    return pa.Table.from_pydict(
        {
            "cidx": [cidx],
            "offset": [offset],
            "id": [None],
            "op": [None],
            "document": [None],
            "metadata": [None],
            "embedding": [None],
            "note": [note],
        },
        schema=READ_SCHEMA,
    )


def error_rows(cidx: int, message: str, kind: str) -> pa.Table:
    """The row that fails a collection (offset -1)."""
    return _note_rows(cidx, ERROR_OFFSET, json.dumps({"error": message, "kind": kind}))


def read_fragment(task: FragmentTask, s3: S3Options | None = None) -> pa.Table:
    """The window's records of one fragment, verified and decoded, or one error row."""
    try:
        data = read_bytes(task.url, s3)
    except Exception as e:
        return error_rows(task.cidx, f"reading {task.url}: {e!r}", "read")
    try:
        if task.content_md5:
            check_md5(task.url, data, task.content_md5)
        table = pq.read_table(pa.BufferReader(data), columns=["offset", "timestamp_us", "body"])
        if not task.content_md5 and task.setsum:
            check_setsum(
                task.url,
                zip(
                    table.column("offset").to_pylist(),
                    table.column("timestamp_us").to_pylist(),
                    table.column("body").to_pylist(),
                    strict=True,
                ),
                task.setsum,
            )
        offsets = table.column("offset")
        if table.num_rows:
            bounds = pc.min_max(offsets).as_py()
            if bounds["min"] < task.start or bounds["max"] >= task.limit:
                raise GapError(
                    f"fragment holds offsets {bounds['min']}..{bounds['max']}, "
                    f"outside its range [{task.start}, {task.limit})"
                )
        lo, hi = max(task.lo, task.start), min(task.hi, task.limit)
        # Records below the compaction start were folded already; at/after the end are next round's.
        window = table.filter(pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi)))
    except Exception as e:
        # Bytes that do not decode as the fragment the host vouched for are corrupt too.
        kind = getattr(e, "kind", None) or CorruptFragmentError.kind
        return error_rows(task.cidx, f"reading {task.url}: {e!r}", kind)
    try:
        body = window.column("body")
        try:
            # As text when it is valid UTF-8 (checked in one vectorised pass): json.loads then
            # skips detecting the encoding of every body.
            bodies = body.cast(pa.string()).to_pylist()
        except pa.ArrowInvalid:
            bodies = body.to_pylist()  # the parser says which record is not UTF-8 JSON
        recs = runs.parse_records(window.column("offset").to_pylist(), bodies)
    except Exception as e:
        return error_rows(task.cidx, f"decoding {task.url}: {e!r}", type(e).__name__)
    n = recs.num_rows
    return pa.Table.from_pydict(
        {
            "cidx": pa.array(np.full(n, task.cidx, np.int32), pa.int32()),
            "offset": recs.column("offset"),
            "id": recs.column("id"),
            "op": recs.column("op"),
            "document": recs.column("document"),
            "metadata": recs.column("metadata"),
            "embedding": recs.column("embedding"),
            "note": pa.nulls(n, pa.string()),
        },
        schema=READ_SCHEMA,
    )


def run_task(cidx: int, task: str, s3: S3Options | None = None) -> pa.Table:
    """One task row of stage 1: a fragment's records, or a fold task's marker row."""
    doc = json.loads(task)
    if "fold" in doc:
        return _note_rows(cidx, MARKER_OFFSET, json.dumps(doc["fold"]))
    return read_fragment(FragmentTask(**doc["fragment"]), s3)


def read_tasks(
    batches: Iterable[pa.RecordBatch], s3: S3Options | None = None
) -> Iterator[pa.RecordBatch]:
    """Stage 1 (``mapInArrow``): task rows in, record rows out."""
    for batch in batches:
        cidxs = batch.column("cidx").to_pylist()
        tasks = batch.column("task").to_pylist()
        for cidx, task in zip(cidxs, tasks, strict=True):
            yield from run_task(int(cidx), str(task), s3).to_batches()


# ---------------------------------------------------------------------------------- stage 2


@dataclass(slots=True)
class _Slot:
    """One level while the fold works: a run in memory (new) or one of the base's."""

    table: pa.Table | None
    ref: RunRef | None
    stats: runs.RunStats | None = None
    level: Level | None = None
    merged: bool = False  # the output of a merge (else the new top run, or a base run)
    s3: S3Options | None = field(default=None, repr=False)

    def describe(self) -> Level:
        if self.level is None:
            if self.stats is None and self.table is not None:
                self.stats = runs.stats_of(self.table)
            if self.stats is not None:
                st = self.stats
                self.level = Level(st.rows, st.bytes, st.tombstones, st.sketch)
            else:
                ref = self.ref
                assert ref is not None
                rows, nbytes = ref.rows, ref.bytes
                if nbytes is None:  # an old-layout version: its footer says how big it is
                    rows, nbytes = run_footer(ref.url, self.s3)
                self.level = Level(rows, nbytes, ref.tombstones, ref.sketch)
        return self.level

    def load(self) -> pa.Table:
        if self.table is None:
            assert self.ref is not None
            self.table = read_run(self.ref.url, self.s3)
        return self.table


def check_window(records: pa.Table, start: int, end: int) -> pa.Table:
    """The records sorted by offset, checked to be exactly [start, end)."""
    records = records.sort_by("offset")
    offs = records.column("offset").to_numpy()
    if len(offs) != end - start or (len(offs) and not np.array_equal(offs, np.arange(start, end))):
        got = np.setdiff1d(np.arange(start, end), offs)
        where = int(got[0]) if len(got) else int(offs[-1]) + 1 if len(offs) else start
        raise GapError(f"window [{start}, {end}) has {len(offs)} records; first missing {where}")
    return records


def fold_collection(
    task: FoldTask, records: pa.Table, s3: S3Options | None = None
) -> CollectionStats:
    """Fold one collection's records (``RECORD_SCHEMA`` columns) onto its base stack, merge
    levels, and write the new runs; never raises (a failure is in the statistics)."""
    try:
        window = runs.fold_window(
            check_window(records, task.start, task.end).select(runs.RECORD_SCHEMA.names)
        )
        stack = [_Slot(None, ref, s3=s3) for ref in task.base]
        if window.num_rows:
            top = window if stack else runs.resolve_bottom(window)
            stack.insert(0, _Slot(top, None, s3=s3))
        policy = Policy(task.ratio, task.min_reward)
        merges = 0
        while (m := choose([s.describe() for s in stack], policy)) is not None:
            bottom = m.upper + 1 == len(stack) - 1
            merged = runs.merge(stack[m.upper].load(), stack[m.upper + 1].load(), bottom=bottom)
            stack[m.upper : m.upper + 2] = [_Slot(merged, None, merged=True, s3=s3)]
            merges += 1
        # An empty run changes nothing: it is not written (an empty stack is an empty collection).
        stack = [s for s in stack if s.describe().rows > 0]
        outputs = list(task.outputs)
        out: list[NewRun] = []
        written = 0
        for s in stack:
            lv = s.describe()
            if s.ref is not None:
                out.append(NewRun(s.ref.key, lv.rows, lv.bytes, lv.tombstones, lv.sketch, False))
                continue
            if not outputs:
                raise FoldError("more new runs than allocated keys", "internal")
            url, key = outputs.pop(0)
            assert s.table is not None
            written += write_run(url, s.table, s3)
            out.append(NewRun(key, lv.rows, lv.bytes, lv.tombstones, lv.sketch, True))
            if s.merged:
                crash_point("fold:merged")
        crash_point("fold:written")
        return CollectionStats(
            cidx=task.cidx,
            collection_id=task.collection_id,
            records_in=task.end - task.start,
            rows_out=sum(r.rows for r in out),
            bytes_out=written,
            runs=tuple(out),
            merges=merges,
        )
    except Exception as e:
        return CollectionStats(
            cidx=task.cidx,
            collection_id=task.collection_id,
            records_in=0,
            rows_out=0,
            bytes_out=0,
            error=repr(e),
            error_kind=getattr(e, "kind", None) or type(e).__name__,
        )


def _group_stats(table: pa.Table, s3: S3Options | None) -> CollectionStats:
    offsets = table.column("offset").to_numpy()
    notes = table.column("note")
    cidx = int(table.column("cidx")[0].as_py())
    markers = np.flatnonzero(offsets == MARKER_OFFSET)
    if len(markers) != 1:
        return CollectionStats(cidx, "", 0, 0, 0, error="no fold task", error_kind="internal")
    task = FoldTask.from_json(str(notes[int(markers[0])].as_py()))
    errors = np.flatnonzero(offsets == ERROR_OFFSET)
    if len(errors):
        err = json.loads(str(notes[int(errors[0])].as_py()))
        e = FoldError(err["error"], err["kind"])
        return CollectionStats(
            task.cidx, task.collection_id, 0, 0, 0, error=repr(e), error_kind=e.kind
        )
    recs = table.filter(pc.greater(table.column("offset"), 0))
    return fold_collection(task, recs, s3)


def fold_group(table: pa.Table, s3: S3Options | None = None) -> pa.Table:
    """Stage 2 (``applyInArrow``): one collection's rows in, one statistics row out."""
    stats = _group_stats(table, s3)
    return pa.Table.from_pylist([stats.to_row()], schema=STATS_SCHEMA)


def group_task_json(task: FoldTask, fragments: Sequence[FragmentTask]) -> str:
    """One collection's whole job (its fold task and its fragments) as a row of the one-stage
    plan carries it."""
    return json.dumps(
        {
            "fold": json.loads(task.to_json()),
            "fragments": [dataclasses.asdict(f) for f in fragments],
        },
        separators=(",", ":"),
    )


def fold_groups(
    batches: Iterable[pa.RecordBatch], s3: S3Options | None = None
) -> Iterator[pa.RecordBatch]:
    """The one-stage plan (``mapInArrow``): rows of JSON lists of collection jobs in, one
    statistics row per collection out.  Each collection is read and folded in this task, by the
    same functions as the two-stage plan, so nothing crosses a shuffle at all."""
    for batch in batches:
        for text in batch.column("task").to_pylist():
            out = []
            for doc in json.loads(str(text)):  # a JSON array of group_task_json objects
                frags = [FragmentTask(**f) for f in doc["fragments"]]
                out.append(fold_locally(FoldTask.from_dict(doc["fold"]), frags, s3).to_row())
            yield from pa.Table.from_pylist(out, schema=STATS_SCHEMA).to_batches()


def stage_functions(
    s3: S3Options | None,
) -> tuple[
    Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]], Callable[[pa.Table], pa.Table]
]:
    """The two stages' functions with ``s3`` in their closures (how S3 settings and credentials
    reach executors).  Plain functions with type hints: ``applyInArrow`` infers its mode from them
    (a ``functools.partial`` has none)."""

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return read_tasks(batches, s3)

    def fold(table: pa.Table) -> pa.Table:
        return fold_group(table, s3)

    return read, fold


def group_function(
    s3: S3Options | None,
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The one-stage plan's function with ``s3`` in its closure (as :func:`stage_functions`)."""

    def read_and_fold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return fold_groups(batches, s3)

    return read_and_fold


def fold_locally(
    task: FoldTask, fragments: Iterable[FragmentTask], s3: S3Options | None = None
) -> CollectionStats:
    """Both stages for one collection in this process, no Spark (the single-process baseline of
    the benchmarks, and tests)."""
    parts = [run_task(task.cidx, fold_task_json(task), s3)]
    parts += [read_fragment(f, s3) for f in fragments]
    return _group_stats(pa.concat_tables(parts), s3)
