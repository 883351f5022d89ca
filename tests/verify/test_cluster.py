"""Issue 17, item 3, first scenario: a host killed with -9 in a cluster in a box, end to end.

Real processes (``verify.cluster``): 3 ``loghost serve`` over one local store, HAProxy in front
(round-robin, no Redis: membership routing), 2 compactors with membership (the compactor's own CLI,
folding in its process instead of on Spark: see verify/cluster/local_compactor.py).  Clients
append to 200 collections through the front with idempotency keys, following redirects; one host
is killed with -9 under load and never restarted.  Then:

* every acknowledged record is read back through the front exactly once (and nothing else);
* the dead host's liveness record is gone and a live host counted the adoption of its dirty log
  (with LOGHOST_ADOPT_AFTER_S=3), with no operator call;
* every collection is compacted up to its tail (its compaction cursor at ``next_offset``), and
  the compacted state equals the reference fold of what was read back (``verify.oracle``).

Every wait is a bounded poll of a condition; nothing asserts a duration.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from compactor_client.client import LogHostClient
from compactor_client.errors import CompactorError, CursorConflict
from compactor_client.reader import read_collection
from verify.cluster import Cluster, start
from verify.cluster.core import TENANT, process_tree_alive
from verify.oracle import reference_fold
from verify.testkit import wait_until
from wal3 import paths

pytestmark = pytest.mark.slow

N_COLLECTIONS = 200
TAIL_GROUP = 50  # written before the kill only: compacted only if the dead host's log is adopted
BATCHES = 3
PER_BATCH = 4
CONCURRENCY = 24
READER = "verify_reader"

FAST_MEMBERSHIP = {
    "LOGHOST_MEMBERSHIP_INTERVAL_S": "0.5",
    "LOGHOST_MEMBERSHIP_TTL_S": "2",
    "LOGHOST_ADOPT_AFTER_S": "3",
    "LOGHOST_ROLLUP_INTERVAL_S": "0.5",
    "LOGHOST_SHUTDOWN_GRACE_S": "2",
}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start(
        3,
        2,
        redis=False,
        workdir=tmp_path,
        host_env=FAST_MEMBERSHIP,
        compactor_args=["--interval-s", "0.5", "--min-records", "1", "--log-level", "WARNING"],
    )
    pids = [h.pid for h in c.hosts] + [x.child.pid for x in c.compactors]
    pids.append(c.haproxy.pid if c.haproxy else None)
    try:
        yield c
    finally:
        c.close()
        assert process_tree_alive(pids) == [], "a cluster process outlived close()"


def batch(cid: str, b: int) -> list[dict[str, Any]]:
    """Batch ``b`` of a collection: upserts of new ids, then (from the second batch) an update of
    one earlier id and a delete of another, so the fold has something to fold."""
    recs: list[dict[str, Any]] = [
        {
            "id": f"r{b}-{k}",
            "op": "upsert",
            "document": f"{cid}:{b}:{k}",
            "metadata": {"b": b, "k": k},
        }
        for k in range(PER_BATCH - (2 if b else 0))
    ]
    if b:
        recs.append(
            {"id": f"r{b - 1}-0", "op": "update", "document": f"{cid}:{b}:u", "metadata": {"u": b}}
        )
        recs.append({"id": f"r{b - 1}-1", "op": "delete", "document": f"{cid}:{b}:d"})
    return recs


def key(r: dict[str, Any]) -> str:
    return str(r["document"])  # unique per record written


async def metric_sum(urls: list[str], name: str) -> float:
    total = 0.0
    async with httpx.AsyncClient(timeout=5) as http:
        for url in urls:
            text = (await http.get(url + "/metrics")).text
            for line in text.splitlines():
                if line.startswith((name + " ", name + "{")):
                    total += float(line.rsplit(" ", 1)[1])
    return total


async def test_host_killed_under_load_nothing_lost_adopted_and_compacted(cluster: Cluster) -> None:
    cids = [str(uuid.uuid4()) for _ in range(N_COLLECTIONS)]
    tail, rest = cids[:TAIL_GROUP], cids[TAIL_GROUP:]
    victim = cluster.hosts[1]
    acked: dict[tuple[str, int], list[dict[str, Any]]] = {}
    failed: dict[tuple[str, int], str] = {}

    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=8
    ) as client:
        sem = asyncio.Semaphore(CONCURRENCY)

        async def append(cid: str, b: int) -> None:
            recs = batch(cid, b)
            async with sem:
                try:
                    await client.append(TENANT, cid, recs, idempotency_key=f"{cid}/{b}")
                    if b == 0:
                        # This reader means to read every record back: its own cursor pins the
                        # log from offset 1 against the collector, which runs once compacted.
                        with contextlib.suppress(CursorConflict):  # pinned by a lost answer
                            await client.put_cursor(TENANT, cid, READER, 1, witness=None)
                except CompactorError as e:
                    failed[(cid, b)] = repr(e)
                    return
            acked[(cid, b)] = recs

        async def load(group: list[str], batches: range) -> None:
            for b in batches:  # a collection's batches in order, collections in parallel
                await asyncio.gather(*(append(cid, b) for cid in group))

        # The tail group is written only before the kill: what the victim led of it is left in
        # its dirty log alone.  Every other collection is created before the kill too: a log
        # whose creation the victim had claimed stays unwritable for the claim's TTL (2 x
        # max(60 s, the GC grace); wal3/claim.py says why), which this test does not wait out.
        await load(tail, range(BATCHES))
        await load(rest, range(1))
        assert not failed, failed
        rest_load = asyncio.create_task(load(rest, range(1, BATCHES)))
        before = len(tail) * BATCHES + len(rest)
        await wait_until(
            lambda: len(acked) >= before + len(rest) // 2 or rest_load.done(),
            "a quarter of the remaining load to be acknowledged",
            timeout_s=60,
        )
        assert not rest_load.done(), "the load ended before the kill"
        cluster.kill9(victim)  # under load, never restarted
        await rest_load

        # A client that got an error (its retries ran out during the failover) sends the same
        # batch again with the same key: it must land once, whichever host takes it.
        # (``append`` records a second failure in ``failed`` again, so it is taken out first.)
        first_failures = sorted(failed)
        failed.clear()
        for cid, b in first_failures:
            await append(cid, b)
        assert not failed, failed
        assert len(acked) == N_COLLECTIONS * BATCHES

        # Every acknowledged record exactly once, through the front, and nothing else.
        read: dict[str, list[dict[str, Any]]] = {}

        async def read_all(cid: str) -> None:
            async with sem:
                state = await client.state(TENANT, cid)
                out: list[dict[str, Any]] = []
                at = state.oldest_offset
                while at < state.next_offset:
                    page = await client.read(TENANT, cid, from_offset=at, limit=1000)
                    out += [r.record.model_dump(exclude_none=True) for r in page.records]
                    at = page.next_offset
                read[cid] = out

        await asyncio.gather(*(read_all(cid) for cid in cids))
        for cid in cids:
            got = Counter(key(r) for r in read[cid])
            want = Counter(key(r) for b in range(BATCHES) for r in acked[(cid, b)])
            assert got == want, f"{cid}: read back {got - want} extra, {want - got} missing"

        # The dead host's dirty log was adopted by a live host, with no operator call.
        live = [h.url for h in cluster.hosts if h is not victim]
        record = Path(cluster.store) / paths.host_live_key(victim.server_id)
        await wait_until(
            lambda: not record.exists(), "the victim's liveness record to be adopted", 30, 0.1
        )

        async def adopted() -> bool:
            return await metric_sum(live, "loghost_adopted_dirty_logs_total") >= 1

        await wait_until(adopted, "a live host to count the adoption", 10, 0.1)

        # Every collection compacted up to its tail, by the compactors alone.
        behind: list[str] = list(cids)

        async def all_compacted() -> bool:
            async def check(cid: str) -> bool:
                async with sem:
                    s = await client.state(TENANT, cid)
                return s.compaction_offset < s.next_offset

            flags = await asyncio.gather(*(check(cid) for cid in behind))
            behind[:] = [cid for cid, late in zip(behind, flags, strict=True) if late]
            return not behind

        try:
            await wait_until(all_compacted, "every collection compacted to its tail", 90, 0.5)
        except TimeoutError:
            tail_behind = sorted(set(behind) & set(tail))
            raise AssertionError(
                f"{len(behind)} collections not compacted to their tail "
                f"({len(tail_behind)} of the tail group, written only before the kill)"
            ) from None

    # The compacted state is the fold of the records read back (the independent oracle).
    for cid in cids:
        state = await asyncio.to_thread(read_collection, cluster.store, cid)
        want = reference_fold(read[cid])
        got = {
            row["id"]: {"document": row["document"], "metadata": json.loads(row["metadata"])}
            for row in state.table.to_pylist()
        }
        assert set(got) == set(want), cid
        for rid, row in want.items():
            assert got[rid]["document"] == row["document"], (cid, rid)
            assert got[rid]["metadata"] == row["metadata"], (cid, rid)
