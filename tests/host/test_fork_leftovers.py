"""A fork retried from a never-compacted source must not keep a version pointer a crashed
attempt from another source left at the target (adversarial review of issue 20)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from host.forks import ForkResult, current_key, fork_collection
from host.manager import log_prefix
from wal3 import FaultRule, FaultyStore, LocalStore, LogWriter, ObjectStore
from wal3.claim import ClaimWatch, CreationInProgress
from wal3.errors import ObjectNotFound, SimulatedCrash
from wal3.layout import load_manifest

from .claimkit import TTL_S, stepped_watch


async def _log(store: LocalStore, cid: uuid.UUID, n: int) -> None:
    w = await LogWriter.open(store, log_prefix(cid))
    for i in range(n):
        await w.append(json.dumps({"id": f"{i}", "op": "add"}).encode())
    await w.close()


async def _fork(
    store: ObjectStore, src: uuid.UUID, dst: uuid.UUID, offset: int, watch: ClaimWatch
) -> ForkResult:
    loaded = await load_manifest(store, log_prefix(src))
    assert loaded is not None
    m = loaded[0]

    async def mark(*_: object) -> None:
        return None

    return await fork_collection(
        store,
        source=src,
        target=dst,
        source_prefix=log_prefix(src),
        target_prefix=log_prefix(dst),
        source_manifest=m,
        offset=offset,
        writer_name="t",
        mark_dirty=mark,
        claims=watch,
    )


async def test_a_retry_from_an_uncompacted_source_drops_a_stale_version_pointer(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "s")
    a, b, t = (uuid.UUID(int=n, version=4) for n in (1, 2, 3))
    await _log(store, a, 15)
    path = f"compacted/{a}/v{1:016d}/part-x.parquet"
    await store.put(path, b"A's rows")
    await store.put(
        current_key(a), json.dumps({"version": 1, "offset": 11, "rows": 3, "path": path}).encode()
    )
    await _log(store, b, 20)  # never compacted
    faulty = FaultyStore(store, seed=1)
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"CURRENT\.json$", times=1))
    watch, clock = stepped_watch()
    with pytest.raises(SimulatedCrash):
        await _fork(faulty, a, t, 16, watch)
    with pytest.raises(CreationInProgress):  # until the dead attempt's claim expires
        await _fork(store, b, t, 21, watch)
    clock.advance(TTL_S)
    await _fork(store, b, t, 21, watch)
    with pytest.raises(ObjectNotFound):
        await store.get(current_key(t))
