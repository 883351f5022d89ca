"""Issue 17, item 3, fourth scenario: scale-out from 2 hosts to 4 under load, end to end.

Real processes (``verify.cluster``): 2 ``loghost serve`` over one local store behind HAProxy
(round-robin, no Redis: membership routing), 2 compactors.  While 24 collections append through
the front, 2 hosts are added: started and put behind the front (HAProxy reloads its
configuration).  Then 24 new collections are written while the compactors are restarted one at a
time with the 4 host URLs (as the chart re-renders ``COMPACTOR_HOSTS``).  Afterwards:

* no append failed, every acknowledged record is read back exactly once;
* some of the new collections were written by the new hosts (their manifests name the writer);
* every collection is compacted to its tail (the new hosts' dirty logs are rolled up), and the
  compacted state is the reference fold.

Every wait is a bounded poll of a condition; nothing asserts a duration.  Measured durations are
printed and written to ``bench/out/cluster_scale_out.json``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
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
    manifest_writer,
)

pytestmark = pytest.mark.slow

N_OLD = 24
N_NEW = 24  # over 4 hosts, about half land on a new one
CONCURRENCY = 24
BETWEEN = 10  # appends acknowledged on 2 hosts before, on 4 hosts after: the load flows


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    c = start(
        2, 2, redis=False, workdir=tmp_path, host_env=FAST_MEMBERSHIP, compactor_args=COMPACTOR_ARGS
    )
    with closed_after(c):
        yield c


async def test_scale_out_2_to_4_under_load_new_hosts_take_new_logs(cluster: Cluster) -> None:
    old = [str(uuid.uuid4()) for _ in range(N_OLD)]
    new = [str(uuid.uuid4()) for _ in range(N_NEW)]
    timings = Timings("scale_out")

    async with LogHostClient(
        cluster.front_url, cluster.tenant_key, timeout=10, max_retries=8
    ) as client:
        w = Workload(client, CONCURRENCY)
        await w.load(old, range(1))
        stop = asyncio.Event()
        load = asyncio.create_task(w.run(old, stop))
        target = len(w.acked) + BETWEEN
        await w.until(lambda: len(w.acked) >= target, "appends on 2 hosts", load)
        t0 = time.monotonic()
        added = await asyncio.to_thread(cluster.add_hosts, 2, restart_compactors=False)
        timings.set("add_2_hosts_s", round(time.monotonic() - t0, 3))
        timings.mark("scaled_out_at_s")
        # The compactors learn the new hosts (restarted one at a time) while new logs are
        # written, beside the old ones' load.
        restart = asyncio.create_task(
            timings.time("restart_compactors_s", asyncio.to_thread(cluster.restart_compactors))
        )
        await w.load(new, range(3))
        await restart
        target = len(w.acked) + BETWEEN
        await w.until(lambda: len(w.acked) >= target, "appends on 4 hosts", load)
        stop.set()
        await load
        timings.mark("load_done_at_s")

        assert not w.failed, f"{len(w.failed)} appends failed, e.g. {list(w.failed.items())[:3]}"
        cids = old + new
        await w.read_back(cids)
        timings.set("records_checked", w.check_exactly_once(cids))

        # New hosts take new logs: some new collections' manifests were written by them.
        writers = Counter(manifest_writer(cluster.store, cid) for cid in new)
        timings.set("new_collections_by_writer", dict(sorted(writers.items())))
        by_new = sum(n for sid, n in writers.items() if sid in {h.server_id for h in added})
        assert by_new > 0, f"no new collection was written by a new host: {dict(writers)}"

        await w.wait_compacted(cids)
        timings.mark("all_compacted_at_s")
        timings.latency_summary("append_latency", w.latencies)
        timings.write()

    await check_fold(cluster.store, w.read)
