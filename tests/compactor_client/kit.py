"""Shared pieces of the compactor tests: logs of Parquet fragments in a store, a fake host API,
a stub log host served on loopback, and views of compacted states comparable to the oracle."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import socket
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import uvicorn
from fastapi import FastAPI, Request

from compactor_client.fold import Row, metadata_json
from compactor_client.models import DirtyLog, FragmentInfo
from compactor_client.scheduler import Candidate
from wal3.localstore import LocalStore

HOST = "http://host-a"


def random_records(rng: random.Random, n: int, ids: int = 12) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        md = None
        if rng.random() < 0.7:
            md = {
                rng.choice("klmn"): rng.choice([None, 1, 2.5, True, "v", rng.randint(0, 9)])
                for _ in range(rng.randint(0, 3))
            }
        out.append(
            {
                "id": f"doc-{rng.randrange(ids)}",
                "op": rng.choice(["add", "add", "upsert", "upsert", "update", "delete"]),
                "document": rng.choice([None, f"text {rng.randint(0, 99)}"]),
                "metadata": md,
                "embedding": rng.choice([None, [rng.uniform(-1, 1) for _ in range(3)]]),
            }
        )
    return out


def fragment_bytes(start: int, records: list[dict[str, Any]]) -> bytes:
    table = pa.table(
        {
            "offset": pa.array(range(start, start + len(records)), pa.uint64()),
            "timestamp_us": pa.array([1_000_000 + i for i in range(len(records))], pa.uint64()),
            "body": pa.array(
                [json.dumps(r, separators=(",", ":")).encode() for r in records], pa.binary()
            ),
        }
    )
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="snappy")
    return sink.getvalue().to_pybytes()


class Log:
    """One collection's log: its records and the fragments holding them in the store."""

    def __init__(self, store: LocalStore, cid: str) -> None:
        self.store, self.cid = store, cid
        self.records: list[dict[str, Any]] = []
        self.fragments: list[FragmentInfo] = []

    async def append_fragment(
        self, records: list[dict[str, Any]], *, corrupt: bool = False
    ) -> FragmentInfo:
        start = len(self.records) + 1
        key = f"logs/{self.cid}/{start:08d}.parquet"
        data = b"not parquet at all" if corrupt else fragment_bytes(start, records)
        await self.store.put(key, data)
        self.records.extend(records)
        frag = FragmentInfo(
            url=self.store.url_for(key),
            start=start,
            limit=start + len(records),
            num_bytes=len(data),
            content_md5=hashlib.md5(data).hexdigest(),
        )
        self.fragments.append(frag)
        return frag

    @property
    def end(self) -> int:
        return len(self.records) + 1


class FakeLogApi:
    """The two host calls the pipeline makes, over in-memory logs (the real host comes later)."""

    def __init__(self, logs: dict[str, Log], cursors: dict[str, int] | None = None) -> None:
        self.logs = logs
        self.cursors = cursors if cursors is not None else {}
        self.compact_calls: list[tuple[str, int]] = []

    async def fragments(
        self, tenant: str, collection_id: str, *, from_offset: int | None = None
    ) -> list[FragmentInfo]:
        return [f for f in self.logs[collection_id].fragments if f.limit > (from_offset or 1)]

    async def compact(self, tenant: str, collection_id: str, offset: int) -> int:
        self.compact_calls.append((collection_id, offset))
        self.cursors[collection_id] = max(self.cursors.get(collection_id, 1), offset)
        return self.cursors[collection_id]


def candidate(log: Log, start: int = 1) -> Candidate:
    return Candidate(
        HOST,
        DirtyLog(
            tenant="t",
            collection_id=log.cid,
            start=start,
            limit=log.end,
            num_records=log.end - start,
            score=1.0,
        ),
    )


def normalise(rows: dict[str, Row]) -> dict[str, tuple[Any, str, Any]]:
    """Rows comparable across the float32 round trip of embeddings."""
    return {
        k: (
            r.document,
            metadata_json(r.metadata),
            None if r.embedding is None else np.asarray(r.embedding, np.float32).tolist(),
        )
        for k, r in rows.items()
    }


def state_view(table: pa.Table) -> dict[str, tuple[Any, str, Any]]:
    """A reader's table in ``normalise``'s terms."""
    return {r["id"]: (r["document"], r["metadata"], r["embedding"]) for r in table.to_pylist()}


def make_host_app(
    logs: dict[str, Log], owned: list[str], cursors: dict[str, int], calls: list[tuple[str, int]]
) -> FastAPI:
    """A stub log host: dirty set, fragments and compaction for the collections it owns."""
    app = FastAPI()

    @app.get("/v1/dirty")
    async def dirty(request: Request) -> Any:
        out = []
        for cid in owned:
            start, end = cursors.get(cid, 1), logs[cid].end
            if end > start:
                out.append(
                    {
                        "tenant": "t",
                        "collection_id": cid,
                        "start": start,
                        "limit": end,
                        "num_records": end - start,
                        "first_insertion_us": 1,
                        "reinsert_count": 0,
                        "score": float(end - start),
                    }
                )
        return {"server_id": "stub", "logs": out}

    @app.get("/v1/tenants/{tenant}/logs/{cid}/fragments")
    async def fragments(tenant: str, cid: str, request: Request) -> Any:
        start = int(request.query_params.get("from", 1))
        return {"fragments": [f.model_dump() for f in logs[cid].fragments if f.limit > start]}

    @app.post("/v1/tenants/{tenant}/logs/{cid}/compaction")
    async def compaction(tenant: str, cid: str, request: Request) -> Any:
        offset = (await request.json())["offset"]
        calls.append((cid, offset))
        cursors[cid] = max(cursors.get(cid, 1), offset)
        return {"compaction_offset": cursors[cid]}

    return app


class Served:
    def __init__(self, app: FastAPI) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)  # bound and listening before start: no startup wait needed
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> Served:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@contextlib.contextmanager
def local_spark(app_name: str) -> Iterator[Any]:
    """A local[2] session for a test module (two partitions, no UI), the package shipped."""
    from compactor_client.sparkutil import build_session, ship_package

    session = build_session(
        "local[2]",
        app_name=app_name,
        ui=False,
        conf={"spark.default.parallelism": "2", "spark.sql.shuffle.partitions": "2"},
    )
    ship_package(session)
    try:
        yield session
    finally:
        session.stop()
