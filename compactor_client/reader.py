"""Reading compacted collections: one collection's state as an Arrow table, many as a DataFrame.

A collection's compacted state is the merge of the runs its ``CURRENT.json`` lists, newest level
first winning (``runs.materialize``); the result has the single-version layout's columns::

    id: string, document: string, metadata: string (compact key-sorted JSON), embedding: list<float32>

sorted by id.  Both layouts are read: a pointer of the single-version layout is one run.

Reading is correct while compactors install, merge and prune.  A read takes one ``CURRENT.json``
and then only immutable files that version lists, so it sees exactly that version however many
installs happen meanwhile; those files stay for the prune grace period after the version stops
being current (``versions``), and should one be gone (a read slower than the grace), the read
starts again from the then current pointer, a bounded number of times.

    from compactor_client.reader import read_collection, read_collections

    state = read_collection("s3://bucket/prefix", "c-42")      # CompactedState
    state.table, state.version, state.offset                    # offset: first record not in it

    df = read_collections(spark, "s3://bucket/prefix", ["c-1", "c-2"])   # on the executors
    df.groupBy("collection_id").count().show()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq

from .errors import CompactorError
from .parquet_io import S3Options, read_run
from .runs import STATE_SCHEMA, as_run, materialize

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from wal3.store import ObjectStore

T = TypeVar("T")
READ_ATTEMPTS = 5
STATES_DDL = (
    "collection_id STRING, version BIGINT, id STRING, document STRING, metadata STRING, "
    "embedding ARRAY<FLOAT>"
)


class StateUnavailable(CompactorError):
    """A collection's runs kept disappearing under the reader (reads slower than the grace)."""


@dataclass(frozen=True, slots=True)
class CompactedState:
    """One collection's compacted state at one installed version."""

    collection_id: str
    version: int  # 0: never compacted (an empty table)
    offset: int  # the first log offset not in the state (1 when never compacted)
    levels: int  # runs merged to read it
    table: pa.Table


async def read_state(
    store: ObjectStore, collection_id: str, *, attempts: int = READ_ATTEMPTS
) -> CompactedState:
    """A collection's current state through ``store`` (an empty state when never compacted)."""
    from wal3.errors import ObjectNotFound

    from .versions import read_current

    for _ in range(max(1, attempts)):
        current = await read_current(store, collection_id)
        if current is None:
            return CompactedState(collection_id, 0, 1, 0, STATE_SCHEMA.empty_table())
        try:
            datas = await asyncio.gather(*(store.get(r.key) for r in current.runs))
        except ObjectNotFound:
            continue  # pruned after a newer install: read that one
        tables = [as_run(pq.read_table(pa.BufferReader(d.data))) for d in datas]
        table = await asyncio.to_thread(materialize, tables)
        return CompactedState(
            collection_id, current.version, current.offset, len(current.runs), table
        )
    raise StateUnavailable(f"the runs of {collection_id} kept changing under the reader")


def read_collection(store_url: str, collection_id: str) -> CompactedState:
    """A collection's current state, from a store URL (a path, ``file://``, ``s3://...``).

    Synchronous; callable from inside a running event loop too (a notebook's), where it runs
    its own loop in a worker thread.  In async code prefer ``await read_state(store, cid)``.
    """
    from wal3.storeurl import open_store

    async def go() -> CompactedState:
        store = open_store(store_url)
        try:
            return await read_state(store, collection_id)
        finally:
            await store.close()

    return _run(go)


def _run(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to completion from synchronous code, inside a running loop or not."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


# ------------------------------------------------------------------------------- on Spark


def _materialize_rows(
    batches: Iterable[pa.RecordBatch], s3: S3Options | None = None
) -> Iterator[pa.RecordBatch]:
    """Executors: one task row (collection, version, run URLs) in, its state's rows out."""
    for batch in batches:
        for cid, version, urls in zip(
            batch.column("collection_id").to_pylist(),
            batch.column("version").to_pylist(),
            batch.column("urls").to_pylist(),
            strict=True,
        ):
            state = materialize([read_run(u, s3) for u in json.loads(urls)])
            n = state.num_rows
            out = pa.table(
                {
                    "collection_id": pa.array([cid] * n, pa.string()),
                    "version": pa.array([version] * n, pa.int64()),
                    "id": state.column("id"),
                    "document": state.column("document"),
                    "metadata": state.column("metadata"),
                    "embedding": state.column("embedding"),
                }
            )
            yield from out.to_batches()


def read_collections(
    spark: SparkSession,
    store: str | ObjectStore,
    collection_ids: Sequence[str],
    *,
    s3: S3Options | None = None,
) -> DataFrame:
    """Many collections' current states as one DataFrame (``STATES_DDL``), merged on executors.

    The driver reads each ``CURRENT.json`` (so the DataFrame is of the versions current now);
    executors read the runs, with ``s3`` (default: the driver's environment and credentials).
    Collections never compacted contribute no rows.  Like any DataFrame it is evaluated lazily:
    act on it within the prune grace period, or read the pointers again.
    """
    from .sparkutil import default_parallelism, ship_package
    from .versions import read_current

    async def pointers() -> list[tuple[str, int, str]]:
        from wal3.storeurl import open_store

        st = open_store(store) if isinstance(store, str) else store
        try:
            out = []
            for cid in collection_ids:
                cur = await read_current(st, cid)
                if cur is not None:
                    urls = [st.url_for(r.key) for r in cur.runs]
                    out.append((cid, cur.version, json.dumps(urls)))
            return out
        finally:
            if isinstance(store, str):
                await st.close()

    ship_package(spark)
    rows = _run(pointers)
    opts = s3 if s3 is not None else S3Options.from_env(credentials=True)
    parts = max(1, min(len(rows), default_parallelism(spark) * 2))
    tasks = spark.createDataFrame(
        rows, schema="collection_id STRING, version BIGINT, urls STRING"
    ).repartition(parts)

    def materialize_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        return _materialize_rows(batches, opts)

    return tasks.mapInArrow(materialize_rows, STATES_DDL)
