"""Issue 20, items 2, 3, 5 and 7, end to end: real log hosts on loopback, real compactor rounds
(``compactor_client.cli.run`` with one local SparkSession for the module).

* 2: a fork's inherited backlog is in the dirty set at once, so it gets compacted and writable.
* 3: a fork at an offset other than the source's ``CURRENT.json`` offset compacts correctly.
* 5: a fragment whose body was rewritten is refused by the host (``corrupt_fragment``) and by the
  compactor (the collection fails, nothing is installed).
* 7: a member listed in ``--members`` that is dead does not leave its share uncompacted.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from prometheus_client import CollectorRegistry

from compactor_client import cli
from compactor_client.scheduler import owner_of
from wal3 import LocalStore

from ..host.live import (
    SERVICE_KEY,
    Live,
    assert_error,
    live_server,
    log_path,
    metric,
    metrics_text,
    record,
)
from .kit import local_spark
from .test_e2e import compacted_rows, reference_fold

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark("issue20-tests") as session:
        yield session


async def compact_round(
    spark: Any, live: Live, store_dir: Path, member_id: str = "c1", members: tuple[str, ...] = ()
) -> int:
    """Roll the host's dirty log up, then one real compactor round against ``live``; its exit
    status (0: every collection ok)."""
    async with live.client() as c:
        assert (await c.post("/v1/dirty/rollup")).status_code == 200
    settings = cli.Settings(
        hosts=(live.url,),
        api_key=SERVICE_KEY,
        store=str(store_dir),
        member_id=member_id,
        members=members,
        once=True,
        min_records=1,
    )
    return await cli.run(settings, spark=spark, registry=CollectorRegistry())


async def append(c: Any, cid: str, recs: list[dict[str, Any]], status: int = 200) -> Any:
    r = await c.post(log_path("alice", cid) + "/records", json={"records": recs})
    assert r.status_code == status, r.text
    return r


def batch(tag: str, n: int) -> list[dict[str, Any]]:
    return [record(f"{tag}-{i % 3}", "upsert", document=f"{tag} {i}") for i in range(n)]


def assert_compacted_view(store_dir: Path, cid: str, records: list[dict[str, Any]]) -> None:
    current, got = compacted_rows(store_dir, cid)
    want = reference_fold(records)
    assert {k: v["document"] for k, v in got.items()} == {k: v["document"] for k, v in want.items()}
    assert current["rows"] == len(want)


# ----------------------------------------------------------------------------------- item 2


async def test_a_forked_backlog_is_dirty_compacted_and_then_writable(
    spark: Any, tmp_path: Path
) -> None:
    store_dir = tmp_path / "s"
    src, dst = str(uuid.uuid4()), str(uuid.uuid4())
    async with (
        live_server(str(store_dir), backpressure_uncompacted_records=5) as live,
        live.client() as c,
    ):
        written = batch("a", 8)
        await append(c, src, written)
        r = await c.post(log_path("alice", src) + "/fork", json={"target_collection_id": dst})
        assert r.status_code == 200, r.text
        # The inherited backlog (8 >= 5) refuses writes until it is compacted ...
        await append(c, dst, [record("x")], status=429)
        # ... so the fork itself must have put the target in the dirty set.
        await c.post("/v1/dirty/rollup")
        dirty = {e["collection_id"] for e in (await c.get("/v1/dirty")).json()["logs"]}
        assert dst in dirty, dirty
        assert metric(await metrics_text(c), "loghost_dirty_untracked_collections") == 0
        assert await compact_round(spark, live, store_dir) == 0
        assert_compacted_view(store_dir, dst, written)
        await append(c, dst, [record("x")])  # writable again


# ----------------------------------------------------------------------------------- item 3


@pytest.mark.parametrize("fork_at", [11, 8], ids=["boundary", "straddling"])
async def test_a_fork_away_from_the_current_offset_compacts_correctly(
    spark: Any, tmp_path: Path, fork_at: int
) -> None:
    store_dir = tmp_path / "s"
    src, dst = str(uuid.uuid4()), str(uuid.uuid4())
    async with live_server(str(store_dir)) as live, live.client() as c:
        a, b, d = batch("a", 5), batch("b", 5), batch("d", 5)
        await append(c, src, a)
        assert await compact_round(spark, live, store_dir) == 0  # CURRENT.json offset 6
        await append(c, src, b)  # [6, 11)
        await append(c, src, d)  # [11, 16)
        r = await c.post(
            log_path("alice", src) + "/fork", json={"target_collection_id": dst, "offset": fork_at}
        )
        assert r.status_code == 200, r.text
        state = r.json()
        # The invariant: the cursor stands on the copied version, and the log holds what is above.
        current = json.loads((store_dir / f"compacted/{dst}/CURRENT.json").read_text())
        assert state["compaction_offset"] == current["offset"] == 6
        assert state["oldest_offset"] <= state["compaction_offset"]
        more = batch("e", 2)
        await append(c, dst, more)
        assert await compact_round(spark, live, store_dir) == 0
        assert_compacted_view(store_dir, dst, a + b + d + more)
        assert_compacted_view(store_dir, src, a + b + d)


# ----------------------------------------------------------------------------------- item 5


def _tamper(path: Path) -> None:
    """Rewrite one body in place: still valid Parquet with the same offsets and footer."""
    table = pq.read_table(path)
    bodies = [b.replace(b"original", b"TAMPERED") for b in table.column("body").to_pylist()]
    assert bodies != table.column("body").to_pylist()
    new = table.set_column(
        table.schema.get_field_index("body"), "body", pa.array(bodies, pa.binary())
    )
    pq.write_table(new.replace_schema_metadata(table.schema.metadata), path)


async def test_the_host_answers_a_tampered_fragment_as_corrupt(tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    cid = str(uuid.uuid4())
    async with live_server(str(store_dir)) as live, live.client() as c:
        await append(c, cid, [record("doc", "upsert", document="original")])
        frags = list((store_dir / "logs" / cid / "log").rglob("*.parquet"))
        assert len(frags) == 1
        _tamper(frags[0])
        r = await c.get(log_path("alice", cid) + "/records", params={"from": 1})
        assert_error(r, 500, "corrupt_fragment")


async def test_the_compactor_refuses_a_tampered_fragment(spark: Any, tmp_path: Path) -> None:
    store_dir = tmp_path / "s"
    cid = str(uuid.uuid4())
    async with live_server(str(store_dir)) as live, live.client() as c:
        await append(c, cid, [record("doc", "upsert", document="original")])
        frags = list((store_dir / "logs" / cid / "log").rglob("*.parquet"))
        assert len(frags) == 1
        _tamper(frags[0])
        assert await compact_round(spark, live, store_dir) == 1  # the collection failed
        assert not (store_dir / f"compacted/{cid}/CURRENT.json").exists()
        assert (await c.get(log_path("alice", cid))).json()["compaction_offset"] == 1


# ----------------------------------------------------------------------------------- item 7


async def test_a_dead_member_does_not_leave_its_share_uncompacted(
    spark: Any, tmp_path: Path
) -> None:
    store_dir = tmp_path / "s"
    cids = [str(uuid.UUID(int=i + 1, version=4)) for i in range(8)]
    theirs = [x for x in cids if owner_of(x, ["c1", "c2"]) == "c2"]
    assert theirs, "the ids must give c2 a share"
    # c2 ran once, an hour ago, and is gone for good: its liveness record is stale.
    await LocalStore(store_dir).put(
        "compactors/live/c2.json", json.dumps({"member_id": "c2", "at": 0.0}).encode()
    )
    async with live_server(str(store_dir)) as live, live.client() as c:
        for x in cids:
            await append(c, x, batch(x[:4], 3))
        assert await compact_round(spark, live, store_dir, "c1", ("c1", "c2")) == 0
        for x in cids:
            state = (await c.get(log_path("alice", x))).json()
            assert state["compaction_offset"] == state["next_offset"], (x, x in theirs)
