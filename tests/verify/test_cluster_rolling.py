"""Issue 17, item 3, second scenario: a rolling restart under load, end to end.

Real processes (``verify.cluster``): 3 ``loghost serve`` over one local store behind HAProxy
(round-robin, no Redis: membership routing), 2 compactors.  Clients append to 36 collections
through the front with idempotency keys, following redirects.  Under that load each host in turn
gets SIGTERM (it drains: its liveness record says ``draining``, requests in flight finish, its
logs are flushed) and is started again with the same server id, port and store before the next
one is stopped.  Then:

* not one request failed: every append was acknowledged at its first call from the application
  (the client's own redirects and keyed retries are the only help it gets);
* every acknowledged record is read back through the front exactly once, and nothing else;
* every collection is compacted up to its tail, and the compacted state is the reference fold.

Every wait is a bounded poll of a condition; nothing asserts a duration.  The durations it
measured are printed and written to ``bench/out/cluster_rolling_restart.json``.
"""

from __future__ import annotations

import asyncio
import time
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
)

pytestmark = pytest.mark.slow

N_COLLECTIONS = 36
CONCURRENCY = 24
# Appends acknowledged before each stop (the restarted host back in the rotation, the load
# flowing): the load runs throughout, so every restart happens under it.
BETWEEN = 10


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start(
        3, 2, redis=False, workdir=tmp_path, host_env=FAST_MEMBERSHIP, compactor_args=COMPACTOR_ARGS
    )
    with closed_after(c):
        yield c


async def test_rolling_restart_under_load_no_failed_request(cluster: Cluster) -> None:
    cids = [str(uuid.uuid4()) for _ in range(N_COLLECTIONS)]
    timings = Timings("rolling_restart")

    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=8
    ) as client:
        w = Workload(client, CONCURRENCY)
        await w.load(cids, range(1))  # every collection exists before the first restart
        timings.mark("created_at_s")
        stop = asyncio.Event()
        load = asyncio.create_task(w.run(cids, stop))
        restarts: list[dict[str, float]] = []
        for h in list(cluster.hosts):
            target = len(w.acked) + BETWEEN
            await w.until(
                lambda t=target: len(w.acked) >= t,  # type: ignore[misc]
                f"{BETWEEN} more appends acknowledged before stopping {h.server_id}",
                load,
            )
            t0 = time.monotonic()
            await asyncio.to_thread(cluster.stop, h)  # SIGTERM; returns once it has exited
            t1 = time.monotonic()
            await asyncio.to_thread(cluster.restart, h)  # returns once /readyz answers
            t2 = time.monotonic()
            restarts.append({"stop_s": round(t1 - t0, 3), "start_to_ready_s": round(t2 - t1, 3)})
        target = len(w.acked) + BETWEEN
        await w.until(lambda: len(w.acked) >= target, "appends after the last restart", load)
        timings.mark("restarts_done_at_s")
        stop.set()
        await load
        timings.mark("load_done_at_s")
        timings.set("restarts", restarts)

        # Zero failed requests: the client's own redirects and keyed retries were enough.
        assert not w.failed, f"{len(w.failed)} appends failed, e.g. {list(w.failed.items())[:3]}"
        timings.set("appends_acknowledged", len(w.acked))

        await w.read_back(cids)
        timings.set("records_checked", w.check_exactly_once(cids))
        await w.wait_compacted(cids)
        timings.mark("all_compacted_at_s")
        timings.latency_summary("append_latency", w.latencies)
        timings.write()

    await check_fold(cluster.store, w.read)
