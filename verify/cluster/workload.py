"""The clients of the end-to-end cluster scenarios (issue 17, item 3): what they write, how they
write it through the front, and the checks every scenario ends with.

A collection gets batches in order (batch ``b`` only after batch ``b - 1`` was acknowledged), each
appended with the idempotency key ``{cid}/{b}`` by :class:`LogHostClient` (follows ``307
not_leader``, retries ambiguous failures of keyed appends).  Every acknowledged batch is recorded;
every failed one too, with the error.  Afterwards:

* :meth:`Workload.read_back` reads every collection through the front and
  :meth:`Workload.check_exactly_once` asserts each acknowledged record is there exactly once and
  nothing else is;
* :meth:`Workload.wait_compacted` polls until every collection's compaction cursor is at its tail;
* :func:`check_fold` compares the compacted state with the reference fold (``verify.oracle``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from compactor_client.client import LogHostClient
from compactor_client.errors import CompactorError, CursorConflict
from compactor_client.reader import read_collection
from verify.oracle import reference_fold
from verify.testkit import wait_until
from wal3 import paths

from .core import TENANT

PER_BATCH = 4
READER = "verify_reader"

# Membership fast enough for a test: a beat every 0.5 s, routed to for 2 s after the last one,
# adopted after 3 s; roll-ups every 0.5 s; a drain of 2 s on SIGTERM.
FAST_MEMBERSHIP = {
    "LOGHOST_MEMBERSHIP_INTERVAL_S": "0.5",
    "LOGHOST_MEMBERSHIP_TTL_S": "2",
    "LOGHOST_ADOPT_AFTER_S": "3",
    "LOGHOST_ROLLUP_INTERVAL_S": "0.5",
    "LOGHOST_SHUTDOWN_GRACE_S": "2",
}
COMPACTION_INTERVAL_S = 0.5  # between a compactor's rounds
COMPACTOR_ARGS = [
    *("--interval-s", str(COMPACTION_INTERVAL_S)),
    *("--min-records", "1", "--log-level", "WARNING"),
]


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


async def metric_sum(urls: Sequence[str], name: str) -> float:
    """The sum of a metric's samples over the hosts' ``/metrics``."""
    total = 0.0
    async with httpx.AsyncClient(timeout=5) as http:
        for url in urls:
            text = (await http.get(url + "/metrics")).text
            for line in text.splitlines():
                if line.startswith((name + " ", name + "{")):
                    total += float(line.rsplit(" ", 1)[1])
    return total


def manifest_writer(store: str, cid: str) -> str:
    """The server id of the host that last wrote a log's manifest (``loghost:<id>:<hex>``)."""
    doc = json.loads((Path(store) / paths.log_prefix(cid) / paths.MANIFEST_PATH).read_bytes())
    return str(doc.get("writer", "")).split(":")[1]


@dataclass
class Workload:
    """Keyed appends of ordered batches through one client; see the module doc."""

    client: LogHostClient
    concurrency: int = 24
    acked: dict[tuple[str, int], list[dict[str, Any]]] = field(default_factory=dict)
    failed: dict[tuple[str, int], str] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # seconds per acknowledged append
    read: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._sem = asyncio.Semaphore(self.concurrency)

    async def append(self, cid: str, b: int) -> None:
        recs = batch(cid, b)
        async with self._sem:
            t0 = time.monotonic()
            try:
                await self.client.append(TENANT, cid, recs, idempotency_key=f"{cid}/{b}")
                if b == 0:
                    # This reader means to read every record back: its own cursor pins the log
                    # from offset 1 against the collector, which runs once compacted.
                    with contextlib.suppress(CursorConflict):  # pinned by a lost answer
                        await self.client.put_cursor(TENANT, cid, READER, 1, witness=None)
            except CompactorError as e:
                self.failed[(cid, b)] = repr(e)
                return
            self.latencies.append(time.monotonic() - t0)
        self.acked[(cid, b)] = recs

    async def load(self, group: Sequence[str], batches: Iterable[int]) -> None:
        """A collection's batches in order, the collections in parallel."""
        for b in batches:
            await asyncio.gather(*(self.append(cid, b) for cid in group))

    async def run(self, group: Sequence[str], stop: asyncio.Event, first: int = 1) -> None:
        """Each collection of ``group`` appends its batches from ``first`` on, one after the
        other, until ``stop`` is set (the collections in parallel)."""

        async def one(cid: str) -> None:
            b = first
            while not stop.is_set():
                await self.append(cid, b)
                b += 1

        await asyncio.gather(*(one(cid) for cid in group))

    async def until(
        self, cond: Callable[[], bool], what: str, task: asyncio.Task[None], timeout_s: float = 60
    ) -> None:
        """Wait (a bounded poll) until ``cond`` holds while the load ``task`` runs; fails if the
        load ended first (the event the test means to cause would not be under load)."""
        await wait_until(lambda: cond() or task.done(), what, timeout_s, 0.01)
        if task.done():
            task.result()  # its exception, if any
            raise AssertionError(f"the load ended before: {what}")

    async def read_back(self, cids: Sequence[str]) -> None:
        """Read every collection from its oldest offset to its tail through the front."""

        async def one(cid: str) -> None:
            async with self._sem:
                state = await self.client.state(TENANT, cid)
                out: list[dict[str, Any]] = []
                at = state.oldest_offset
                while at < state.next_offset:
                    page = await self.client.read(TENANT, cid, from_offset=at, limit=1000)
                    out += [r.record.model_dump(exclude_none=True) for r in page.records]
                    at = page.next_offset
                self.read[cid] = out

        await asyncio.gather(*(one(cid) for cid in cids))

    def check_exactly_once(self, cids: Sequence[str]) -> int:
        """Every acknowledged record read back exactly once, and nothing else; returns how many
        records were checked."""
        by_cid: dict[str, list[dict[str, Any]]] = {cid: [] for cid in cids}
        for (cid, _b), recs in self.acked.items():
            by_cid[cid] += recs
        n = 0
        for cid in cids:
            got = Counter(key(r) for r in self.read[cid])
            want = Counter(key(r) for r in by_cid[cid])
            assert got == want, f"{cid}: read back {got - want} extra, {want - got} missing"
            n += sum(want.values())
        return n

    async def wait_compacted(self, cids: Sequence[str], timeout_s: float = 90) -> list[str]:
        """Poll until every collection's compaction cursor is at its tail; AssertionError naming
        how many are behind at the deadline.  Returns ``cids``."""
        behind: list[str] = list(cids)

        async def all_compacted() -> bool:
            async def check(cid: str) -> bool:
                async with self._sem:
                    s = await self.client.state(TENANT, cid)
                return s.compaction_offset < s.next_offset

            flags = await asyncio.gather(*(check(cid) for cid in behind))
            behind[:] = [cid for cid, late in zip(behind, flags, strict=True) if late]
            return not behind

        try:
            await wait_until(
                all_compacted, "every collection compacted to its tail", timeout_s, 0.5
            )
        except TimeoutError:
            raise AssertionError(
                f"{len(behind)} collections not compacted to their tail, e.g. {behind[:3]}"
            ) from None
        return list(cids)


async def check_fold(store: str, read: dict[str, list[dict[str, Any]]]) -> None:
    """The compacted state of every collection is the fold of the records read back."""
    for cid, records in read.items():
        state = await asyncio.to_thread(read_collection, store, cid)
        want = reference_fold(records)
        got = {
            row["id"]: {"document": row["document"], "metadata": json.loads(row["metadata"])}
            for row in state.table.to_pylist()
        }
        assert set(got) == set(want), cid
        for rid, row in want.items():
            assert got[rid]["document"] == row["document"], (cid, rid)
            assert got[rid]["metadata"] == row["metadata"], (cid, rid)


class Timings:
    """Named durations measured by a scenario, printed and written as JSON under ``bench/out/``
    (the numbers docs/OPERATIONS.md quotes; never asserted)."""

    def __init__(self, scenario: str) -> None:
        self.scenario = scenario
        self.values: dict[str, Any] = {}
        self._t0 = time.monotonic()

    def mark(self, name: str) -> float:
        """Seconds since the scenario began, recorded under ``name``."""
        at = round(time.monotonic() - self._t0, 3)
        self.values[name] = at
        return at

    def set(self, name: str, value: Any) -> None:
        self.values[name] = value

    async def time(self, name: str, aw: Awaitable[Any]) -> Any:
        """Await ``aw`` and record how long it took."""
        t0 = time.monotonic()
        try:
            return await aw
        finally:
            self.values[name] = round(time.monotonic() - t0, 3)

    def latency_summary(self, name: str, latencies: Sequence[float]) -> None:
        if latencies:
            xs = sorted(latencies)
            self.values[name] = {
                "n": len(xs),
                "p50_s": round(xs[len(xs) // 2], 3),
                "p99_s": round(xs[min(len(xs) - 1, int(len(xs) * 0.99))], 3),
                "max_s": round(xs[-1], 3),
            }

    def write(self) -> Path:
        out = Path(__file__).resolve().parents[2] / "bench" / "out"
        out.mkdir(parents=True, exist_ok=True)
        path = out / f"cluster_{self.scenario}.json"
        text = json.dumps({"scenario": self.scenario, **self.values}, indent=1)
        path.write_text(text + "\n")
        print(f"\n[{self.scenario}] timings ({path}):\n{text}", flush=True)
        return path
