"""The code Spark executors run: read fragments, fold per collection, write versions.

Kept apart from the driver code so executors import only this module, ``fold`` and ``parquet_io``
(pyarrow and the standard library): no httpx, no host package, no event loop.

Records travel through Spark as ``((collection_index, offset), value)`` pairs so that
``repartitionAndSortWithinPartitions`` can put each collection in one partition, in offset order.
Values are tuples whose first item says what they are: ``("r", body)`` a record, ``("m",)`` the
per-collection marker (offset 0, so a collection with no records in its window still gets a fold
task), ``("e", message, kind)`` a read error (offset -1, so it is seen before any record).

Every fragment is verified against its pointer before any of its records is emitted: its MD5 when
the host reports one, else the setsum of its records (``integrity``).  A fragment that fails is an
error pair of kind ``corrupt_fragment``, which fails its collection: nothing unverified is folded.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import CompactorError
from .fold import fold, parse_body
from .integrity import CorruptFragmentError, check_md5, check_setsum
from .parquet_io import S3Options, read_bytes, read_version, rows_to_table, write_version

ERROR_OFFSET = -1
MARKER_OFFSET = 0

Keyed = tuple[tuple[int, int], tuple[Any, ...]]


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
class FoldTask:
    """Fold one collection's window [start, end) onto its base version and write ``out_url``."""

    cidx: int
    collection_id: str
    start: int
    end: int
    base_url: str | None
    out_url: str


@dataclass(frozen=True, slots=True)
class CollectionStats:
    """What folding one collection produced, or why it failed."""

    cidx: int
    collection_id: str
    records_in: int
    rows_out: int
    bytes_out: int
    error: str | None = None
    error_kind: str | None = None


def read_fragment_task(task: FragmentTask, s3: S3Options | None = None) -> list[Keyed]:
    """The window's records of one fragment as keyed pairs, or one error pair."""
    try:
        data = read_bytes(task.url, s3)
    except Exception as e:
        return [((task.cidx, ERROR_OFFSET), ("e", f"reading {task.url}: {e!r}", "read"))]
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
        keep = pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, hi))
        window = table.filter(keep)
        return [
            ((task.cidx, int(off)), ("r", body))
            for off, body in zip(
                window.column("offset").to_pylist(), window.column("body").to_pylist(), strict=True
            )
        ]
    except Exception as e:
        # Bytes that do not decode as the fragment the host vouched for are corrupt too.
        kind = getattr(e, "kind", None) or CorruptFragmentError.kind
        return [((task.cidx, ERROR_OFFSET), ("e", f"reading {task.url}: {e!r}", kind))]


def partition_of(key: tuple[int, int]) -> int:
    """Spark partition function: every record of a collection goes to the same partition."""
    return key[0]


def _records(task: FoldTask, items: Iterable[Keyed]) -> Iterator[dict[str, Any]]:
    """Decoded records in offset order, checking they are exactly [start, end)."""
    expected = task.start
    for (_, offset), value in items:
        kind = value[0]
        if kind == "e":
            raise FoldError(value[1], value[2] if len(value) > 2 else "read")
        if kind == "m":
            continue
        if offset != expected:
            raise GapError(f"expected offset {expected}, found {offset}")
        expected += 1
        yield parse_body(value[1])
    if expected != task.end:
        raise GapError(f"records end at offset {expected}, the window ends at {task.end}")


def fold_collection(
    task: FoldTask, items: Iterable[Keyed], s3: S3Options | None = None
) -> CollectionStats:
    """Fold one collection's sorted records onto its base and write the new version."""
    try:
        base = read_version(task.base_url, s3) if task.base_url else {}
        rows = fold(base, _records(task, items))
        size = write_version(task.out_url, rows_to_table(rows.values()), s3)
        return CollectionStats(
            cidx=task.cidx,
            collection_id=task.collection_id,
            records_in=task.end - task.start,
            rows_out=len(rows),
            bytes_out=size,
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


def fold_partition(
    items: Iterable[Keyed], tasks: Mapping[int, FoldTask], s3: S3Options | None = None
) -> Iterator[CollectionStats]:
    """Fold every collection of one sorted partition, one after another."""
    for cidx, group in itertools.groupby(items, key=lambda kv: kv[0][0]):
        yield fold_collection(tasks[cidx], group, s3)


def fold_partition_broadcast(
    items: Iterable[Keyed], tasks: Any, s3: S3Options | None = None
) -> Iterator[CollectionStats]:
    """``fold_partition`` taking a Spark broadcast of the task map."""
    return fold_partition(items, tasks.value, s3)
