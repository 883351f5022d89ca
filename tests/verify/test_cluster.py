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
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from compactor_client.client import LogHostClient
from verify.cluster import Cluster, start
from verify.cluster.core import closed_after
from verify.cluster.workload import (
    COMPACTOR_ARGS,
    FAST_MEMBERSHIP,
    Timings,
    Workload,
    check_fold,
    metric_sum,
)
from verify.testkit import wait_until
from wal3 import paths

pytestmark = pytest.mark.slow

N_COLLECTIONS = 200
TAIL_GROUP = 50  # written before the kill only: compacted only if the dead host's log is adopted
BATCHES = 3
CONCURRENCY = 24


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start(
        3, 2, redis=False, workdir=tmp_path, host_env=FAST_MEMBERSHIP, compactor_args=COMPACTOR_ARGS
    )
    with closed_after(c):
        yield c


async def test_host_killed_under_load_nothing_lost_adopted_and_compacted(cluster: Cluster) -> None:
    cids = [str(uuid.uuid4()) for _ in range(N_COLLECTIONS)]
    tail, rest = cids[:TAIL_GROUP], cids[TAIL_GROUP:]
    victim = cluster.hosts[1]
    timings = Timings("kill9")

    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=8
    ) as client:
        w = Workload(client, CONCURRENCY)

        # The tail group is written only before the kill: what the victim led of it is left in
        # its dirty log alone.  Every other collection is created before the kill too: a log
        # whose creation the victim had claimed stays unwritable for the claim's TTL (2 x
        # max(60 s, the GC grace); wal3/claim.py says why), which this test does not wait out.
        await w.load(tail, range(BATCHES))
        await w.load(rest, range(1))
        assert not w.failed, w.failed
        rest_load = asyncio.create_task(w.load(rest, range(1, BATCHES)))
        before = len(tail) * BATCHES + len(rest)
        await w.until(
            lambda: len(w.acked) >= before + len(rest) // 2,
            "a quarter of the remaining load to be acknowledged",
            rest_load,
        )
        cluster.kill9(victim)  # under load, never restarted
        timings.mark("killed_at_s")
        await rest_load
        timings.mark("load_done_at_s")

        # A client that got an error (its retries ran out during the failover) sends the same
        # batch again with the same key: it must land once, whichever host takes it.
        # (``append`` records a second failure in ``failed`` again, so it is taken out first.)
        first_failures = sorted(w.failed)
        timings.set("failed_then_resent", len(first_failures))
        w.failed.clear()
        for cid, b in first_failures:
            await w.append(cid, b)
        assert not w.failed, w.failed
        assert len(w.acked) == N_COLLECTIONS * BATCHES

        # Every acknowledged record exactly once, through the front, and nothing else.
        await w.read_back(cids)
        w.check_exactly_once(cids)

        # The dead host's dirty log was adopted by a live host, with no operator call.
        live = [h.url for h in cluster.hosts if h is not victim]
        record = Path(cluster.store) / paths.host_live_key(victim.server_id)
        await wait_until(
            lambda: not record.exists(), "the victim's liveness record to be adopted", 30, 0.1
        )
        timings.mark("adopted_at_s")

        async def adopted() -> bool:
            return await metric_sum(live, "loghost_adopted_dirty_logs_total") >= 1

        await wait_until(adopted, "a live host to count the adoption", 10, 0.1)

        # Every collection compacted up to its tail, by the compactors alone (the tail group,
        # written only before the kill, only if the victim's dirty log was adopted).
        await w.wait_compacted(cids)
        timings.mark("all_compacted_at_s")
        timings.latency_summary("append_latency", w.latencies)
        timings.write()

    # The compacted state is the fold of the records read back (the independent oracle).
    await check_fold(cluster.store, w.read)
