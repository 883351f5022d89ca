"""Issue 17, item 3, third scenario: Redis (the leader hint) killed mid-run and restarted empty.

Real processes (``verify.cluster``): 3 ``loghost serve`` over one local store behind HAProxy
(round-robin) with ``redis-server`` as the leader hint, 2 compactors.  Redis is only advisory: when
it is down the hosts route by membership (the liveness records in the store), and when it comes
back empty the hosts claim their logs again.

* Under load on 36 collections Redis is killed with -9, the load goes on, Redis is started again
  with nothing in it, the load goes on: no append fails, every acknowledged record is read back
  exactly once, every collection is compacted to its tail (and equals the reference fold).
* Routing: appends alternating over the hosts through the front, with a client that follows
  redirects but retries nothing, get 200 (after at most the redirects), never a 409, with Redis
  up, down, and back empty.

Every wait is a bounded poll of a condition; nothing asserts a duration.  Measured durations are
printed and written to ``bench/out/cluster_redis_*.json``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest

from compactor_client.client import LogHostClient
from compactor_client.errors import CompactorError
from verify.cluster import Cluster, start
from verify.cluster.core import TENANT, closed_after
from verify.cluster.workload import (
    COMPACTOR_ARGS,
    FAST_MEMBERSHIP,
    Timings,
    Workload,
    batch,
    check_fold,
)

pytestmark = pytest.mark.slow

N_COLLECTIONS = 36
CONCURRENCY = 24
PARALLEL = 3  # appends to one log at once in the routing test
BETWEEN = 15  # appends acknowledged between the events: each happens under load
# Leader hints that expire and renew at a test's pace (the default TTL is 10 s).
REDIS_HOST_ENV = {**FAST_MEMBERSHIP, "LOGHOST_LEADER_TTL_MS": "2000"}


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for both tests (each writes collections of its own): one start-up, one
    shutdown."""
    c = start(
        3,
        2,
        redis=True,
        workdir=tmp_path_factory.mktemp("cluster"),
        host_env=REDIS_HOST_ENV,
        compactor_args=COMPACTOR_ARGS,
    )
    with closed_after(c):
        yield c


@pytest.fixture
def cluster(shared_cluster: Cluster) -> Cluster:
    """The shared cluster with Redis up (a test that failed may have left it killed)."""
    shared_cluster.start_redis()
    return shared_cluster


async def test_redis_killed_and_restarted_empty_nothing_lost(cluster: Cluster) -> None:
    cids = [str(uuid.uuid4()) for _ in range(N_COLLECTIONS)]
    timings = Timings("redis_restart")

    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=8
    ) as client:
        w = Workload(client, CONCURRENCY)
        await w.load(cids, range(1))
        stop = asyncio.Event()
        load = asyncio.create_task(w.run(cids, stop))

        async def more(what: str) -> None:
            target = len(w.acked) + BETWEEN
            await w.until(lambda: len(w.acked) >= target, what, load)

        await more("appends with Redis up")
        cluster.kill_redis()
        timings.mark("redis_killed_at_s")
        await more("appends with Redis down")
        t0 = time.monotonic()
        await asyncio.to_thread(cluster.start_redis)
        timings.set("redis_start_s", round(time.monotonic() - t0, 3))
        timings.mark("redis_back_at_s")
        await more("appends with Redis back, empty")
        stop.set()
        await load
        timings.mark("load_done_at_s")

        assert not w.failed, f"{len(w.failed)} appends failed, e.g. {list(w.failed.items())[:3]}"
        timings.set("appends_acknowledged", len(w.acked))
        await w.read_back(cids)
        timings.set("records_checked", w.check_exactly_once(cids))
        await w.wait_compacted(cids)
        timings.mark("all_compacted_at_s")
        timings.latency_summary("append_latency", w.latencies)
        timings.write()

    await check_fold(cluster.store, w.read)


async def test_no_409_through_the_front_with_redis_up_down_and_back_empty(
    cluster: Cluster,
) -> None:
    """Appends go through the front (round-robin: consecutive requests land on different hosts),
    three to each log at once, so every log is asked of every host at the same moment."""
    cids = [str(uuid.uuid4()) for _ in range(12)]
    answers: Counter[str] = Counter()
    timings = Timings("redis_routing")
    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=0, max_redirects=3
    ) as client:
        b = 0

        async def one(cid: str, phase: str, b: int) -> None:
            try:
                await client.append(TENANT, cid, batch(cid, b), idempotency_key=f"{cid}/{b}")
                answers[f"{phase}: 200"] += 1
            except CompactorError as e:
                answers[f"{phase}: {e.status} {type(e).__name__}"] += 1

        async def rounds(n: int, phase: str) -> None:
            nonlocal b
            for _ in range(n):
                # Three appends to each log at once: round-robin sends them to three hosts.
                await asyncio.gather(
                    *(one(cid, phase, b + k) for cid in cids for k in range(PARALLEL))
                )
                b += PARALLEL

        await rounds(3, "redis up")
        cluster.kill_redis()
        await rounds(3, "redis down")
        await asyncio.to_thread(cluster.start_redis)
        await rounds(3, "redis back empty")
        timings.set("answers", dict(answers))
        timings.write()
    refused = {k: v for k, v in answers.items() if not k.endswith(": 200")}
    assert not refused, f"requests refused through the front: {refused} (all: {dict(answers)})"
