"""The end-to-end verifier: uniquely tagged writers, long-polling tailers, and the final audit.

Writers append batches of uniquely tagged records (``metadata.tag``) to many collections over
the REST API at a variable, seeded rate.  Every keyed append is retried with the same
idempotency key after any failure (timeout, reset, 5xx, 409, 429, 307) until it is acknowledged
or its retry budget runs out; a small share of appends carry no key and are never re-sent after an
ambiguous failure (they may appear once, never twice).  A record counts as acknowledged only on a
200, at the offsets the 200 names.

Tailers long-poll ``GET .../records?from=N&wait_ms=W`` and check every page: it starts at N,
offsets are dense, and an offset never changes its record between two reads.

The audit (:func:`audit`), once faults are off and the writers are done: every acknowledged
record is in its log exactly once, at the offset it was acknowledged with (records below the
oldest retained offset must be below the compaction cursor and must have been seen there by a
tailer); no tag appears twice anywhere; offsets are dense from the oldest retained offset to the
tail; every log (collection logs and dirty logs) scrubs clean from the objects; and the dirty set
covers every collection's uncompacted records.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from verify.testkit import wait_until

from .infra import SERVICE_KEY, TENANT_KEYS

Hosts = Callable[[], Sequence[str]]


# ------------------------------------------------------------------------------------ model


@dataclass(frozen=True)
class Collection:
    tenant: str
    cid: str

    @property
    def path(self) -> str:
        return f"/v1/tenants/{self.tenant}/logs/{self.cid}"

    @property
    def key(self) -> str:
        return TENANT_KEYS[self.tenant]


def make_collections(seed: int, n: int) -> list[Collection]:
    rng = random.Random(f"collections:{seed}")
    return [
        Collection(
            rng.choice(("alice", "bob")), str(uuid.UUID(int=rng.getrandbits(128), version=4))
        )
        for _ in range(n)
    ]


@dataclass
class Workload:
    """How hard and how long the clients push."""

    collections: int = 6
    writers: int = 6
    appends_per_writer: int | None = 40  # None: until the stop event
    max_batch: int = 4
    keyless_fraction: float = 0.1
    mean_interval_s: float = 0.01  # writer pacing; the rate varies in seeded bursts and lulls
    tailed: int = 64  # collections tailed by their own long-poll reader; the rest by a sweeper
    wait_ms: int = 300
    retry_budget_s: float = 120.0
    request_timeout_s: float = 10.0
    gc_interval_s: float | None = None  # compaction + GC driver pacing (None: off)
    rollup_interval_s: float | None = None  # roll-up driver pacing (None: off)
    pin_interval_s: float | None = None  # reader cursors pinned, checked, moved back, dropped
    seal: int = 0  # collections sealed mid-run (their later appends are refused, not written)
    records: Callable[[random.Random, list[str]], list[dict[str, Any]]] | None = None


@dataclass
class Result:
    """One scenario run; the line the harness prints and the row the doc shows."""

    scenario: str
    seed: int
    acknowledged: int = 0
    read: int = 0
    lost: int = 0
    duplicated: int = 0
    faults: int = 0
    scrub_ok: bool = False
    violations: list[str] = field(default_factory=list)
    fault_kinds: dict[str, int] = field(default_factory=dict)
    unacked_present: int = 0
    unacked_absent: int = 0
    seconds: float = 0.0
    logs: int = 0
    notes: dict[str, Any] = field(default_factory=dict)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return (
            self.error is None
            and self.lost == 0
            and self.duplicated == 0
            and self.scrub_ok
            and not self.violations
        )

    def line(self) -> str:
        return (
            f"scenario={self.scenario} seed={self.seed} acknowledged={self.acknowledged} "
            f"read={self.read} lost={self.lost} duplicated={self.duplicated} "
            f"faults={self.faults} scrub={'ok' if self.scrub_ok else 'FAIL'} "
            f"violations={len(self.violations)} unacked_present={self.unacked_present} "
            f"unacked_absent={self.unacked_absent} logs={self.logs} "
            f"seconds={self.seconds:.1f}" + (f" error={self.error!r}" if self.error else "")
        )

    def as_dict(self) -> dict[str, Any]:
        d = dict(vars(self))
        d["ok"] = self.ok
        d["violations"] = self.violations[:50]
        d["violation_count"] = len(self.violations)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Result:
        r = cls(d["scenario"], int(d["seed"]))
        for k in vars(r):
            if k in d:
                setattr(r, k, d[k])
        extra = int(d.get("violation_count", len(r.violations))) - len(r.violations)
        if extra > 0:
            r.violations.append(f"... and {extra} more violations")
        return r


def tag_of(record: dict[str, Any]) -> str:
    """The unique tag of a record as the API returns it."""
    md = record.get("metadata") or {}
    tag = md.get("tag")
    return str(tag) if tag is not None else f"untagged:{record.get('id')}"


# ----------------------------------------------------------------------------------- ledger


class Run:
    """The shared state of one scenario run: what was sent, acknowledged and seen."""

    def __init__(
        self, name: str, seed: int, collections: list[Collection], hosts: Hosts, workload: Workload
    ) -> None:
        self.name = name
        self.seed = seed
        self.collections = collections
        self.by_cid = {c.cid: c for c in collections}
        self.hosts = hosts
        self.workload = workload
        self.acked: dict[str, tuple[str, int]] = {}  # tag -> (cid, offset)
        self.keyless: set[str] = set()  # tags sent without an idempotency key
        self.attempts: dict[str, list[str]] = {}  # first tag of an append -> its attempts
        self.t0 = time.monotonic()
        self.sent: dict[str, str] = {}  # every tag ever sent -> cid
        self.unresolved: set[str] = set()  # sent, never acknowledged
        self.seen: dict[str, dict[int, str]] = {c.cid: {} for c in collections}  # tailers
        self.tail_pos: dict[str, int] = {c.cid: 1 for c in collections}
        self.violations: list[str] = []
        self.http: Counter[str] = Counter()
        self.events: Counter[str] = Counter()  # process-level faults
        self.stop = asyncio.Event()  # writers in open-ended mode and every driver stop on it
        self.tail_stop = asyncio.Event()
        self.writers_done = 0
        self.rollups_in_flight = 0
        self.acked_records = 0
        self.acked_appends = 0
        self.compaction_sent: dict[str, int] = {}
        self.sealed: set[str] = set()  # collections a seal was asked for
        self.sealed_at: dict[str, int] = {}  # collection -> next offset its seal answered
        self.pins = 0  # pins acknowledged (and checked) by the pin driver
        # Redirects are followed by ``send``: httpx drops Authorization on a redirect to another
        # origin (another host's port), and a leader redirect must keep the caller's key.
        self.client = httpx.AsyncClient(
            follow_redirects=False,
            timeout=httpx.Timeout(workload.request_timeout_s, connect=5.0),
            limits=httpx.Limits(max_connections=512, max_keepalive_connections=128),
        )
        self.redirects = 0
        self.trace_file: Any = None  # set by a scenario when RELIABILITY_TRACE is set

    def trace(self, **event: Any) -> None:
        """Append one event to the run's trace (forensics for a failed run; off by default)."""
        if self.trace_file is not None:
            event["t"] = round(time.monotonic() - self.t0, 4)
            self.trace_file.write(json.dumps(event, default=str) + "\n")

    async def send(self, method: str, url: str, **kw: Any) -> httpx.Response:
        """One request, following up to 3 ``307 not_leader`` hops with the same key and body."""
        for _ in range(3):
            r = await self.client.request(method, url, **kw)
            if r.status_code not in (307, 308) or "location" not in r.headers:
                return r
            self.redirects += 1
            self.trace(ev="redirect", method=method, url=url, to=r.headers["location"])
            url = r.headers["location"]
            if not url.startswith("http://127.0.0.1:"):
                self.violation(f"redirect to a non-loopback location {url!r}")
                return r
        return r

    def violation(self, msg: str) -> None:
        if len(self.violations) < 10_000:
            self.violations.append(msg)

    def pick(self, rng: random.Random) -> str:
        hosts = self.hosts()
        return hosts[0] if len(hosts) == 1 else rng.choice(list(hosts))

    async def close(self) -> None:
        await self.client.aclose()
        if self.trace_file is not None:
            self.trace_file.close()


# ---------------------------------------------------------------------------------- writers


def default_records(rng: random.Random, tags: list[str]) -> list[dict[str, Any]]:
    return [{"id": t, "op": "add", "document": f"doc {t}", "metadata": {"tag": t}} for t in tags]


async def writer(run: Run, wid: int) -> None:
    """Append seeded batches to random collections at a variable rate until done or stopped."""
    wl = run.workload
    rng = random.Random(f"writer:{run.seed}:{wid}")
    make = wl.records or default_records
    seq = 0
    burst_left = 0
    interval = wl.mean_interval_s
    try:
        while not run.stop.is_set():
            if wl.appends_per_writer is not None and seq >= wl.appends_per_writer:
                break
            if burst_left <= 0:  # a new phase: a burst (fast), a lull (slow) or steady
                burst_left = rng.randint(5, 30)
                interval = wl.mean_interval_s * rng.choice((0.0, 0.2, 1.0, 1.0, 3.0))
            burst_left -= 1
            if interval > 0:
                await asyncio.sleep(rng.expovariate(1.0 / interval))  # rate pacing
            coll = rng.choice(run.collections)
            n = rng.randint(1, wl.max_batch)
            tags = [f"s{run.seed}w{wid}.{seq}.{j}" for j in range(n)]
            keyed = rng.random() >= wl.keyless_fraction
            key = f"{run.name}:{run.seed}:w{wid}:{seq}" if keyed else None
            seq += 1
            await append(run, rng, coll, tags, make(rng, tags), key)
    finally:
        run.writers_done += 1


async def append(
    run: Run,
    rng: random.Random,
    coll: Collection,
    tags: list[str],
    records: list[dict[str, Any]],
    key: str | None,
) -> bool:
    """One logical append, retried as the contract allows; True once acknowledged."""
    for t in tags:
        run.sent[t] = coll.cid
        run.unresolved.add(t)
        if key is None:
            run.keyless.add(t)
    history = run.attempts.setdefault(tags[0], [])
    body: dict[str, Any] = {"records": records}
    if key is not None:
        body["idempotency_key"] = key
    headers = {"Authorization": f"Bearer {coll.key}"}
    deadline = time.monotonic() + run.workload.retry_budget_s
    backoff = 0.02
    while True:
        url = run.pick(rng) + coll.path + "/records"
        retry_after = 0.0
        sent_at = time.monotonic() - run.t0
        try:
            r = await run.send("POST", url, json=body, headers=headers)
        except httpx.ConnectError:
            run.http["connect_error"] += 1  # never reached a server: safe to re-send, key or not
            history.append(f"{sent_at:.3f}s connect_error")
        except httpx.HTTPError as e:
            run.http[type(e).__name__] += 1
            history.append(f"{sent_at:.3f}s {type(e).__name__}")
            if key is None:
                return False  # ambiguous: it may be in the log once; never re-sent
        else:
            code = r.status_code
            run.http[str(code)] += 1
            history.append(f"{sent_at:.3f}s {code} {r.text[:160] if code != 200 else r.text}")
            if code == 200:
                got = r.json()
                first, count = int(got["first_offset"]), int(got["count"])
                if count != len(tags) or int(got["next_offset"]) != first + count:
                    run.violation(f"append to {coll.cid} answered {got} for {len(tags)} records")
                for i, t in enumerate(tags):
                    prev = run.acked.get(t)
                    if prev is not None and prev != (coll.cid, first + i):
                        run.violation(f"{t} acknowledged twice at {prev} and {first + i}")
                    run.acked[t] = (coll.cid, first + i)
                    run.unresolved.discard(t)
                run.acked_records += len(tags)
                run.acked_appends += 1
                run.trace(
                    ev="ack",
                    cid=coll.cid,
                    key=key,
                    tags=tags,
                    first=first,
                    url=str(r.url),
                    sent=sent_at,
                )
                return True
            err = _error_code(r)
            if code == 429:
                retry_after = min(2.0, float(r.headers.get("retry-after", "1") or 1))
            elif code == 409 and err == "contention":
                pass  # "not written": safe to re-send, key or not
            elif code == 409 and err == "sealed" and coll.cid in run.sealed:
                return False  # refused for good: not written
            elif code in (500, 502, 503, 504):
                if key is None:
                    return False  # ambiguous for a keyless append
            elif code == 307:
                pass  # a redirect loop longer than httpx follows: try again
            else:
                run.violation(f"append to {coll.cid}: unexpected {code} {r.text[:300]}")
                return False
        if (
            run.stop.is_set()
            and run.workload.appends_per_writer is None
            and time.monotonic() > deadline - run.workload.retry_budget_s + 30
        ):
            return False  # an open-ended run is winding down: give up after 30 s of retries
        if time.monotonic() > deadline:
            run.http["gave_up"] += 1
            return False
        await asyncio.sleep(max(retry_after, backoff * (0.5 + rng.random())))  # retry pacing
        backoff = min(1.0, backoff * 2)


def _error_code(r: httpx.Response) -> str | None:
    with contextlib.suppress(Exception):
        return str(r.json()["error"]["code"])
    return None


# ---------------------------------------------------------------------------------- tailers


def _check_page(run: Run, cid: str, start: int, body: dict[str, Any], who: str) -> int:
    """Check one page of records read from ``start``; returns the next offset to read."""
    recs = body["records"]
    seen = run.seen[cid]
    expect = start
    for rec in recs:
        off = int(rec["offset"])
        if off != expect:
            run.violation(f"{who} {cid}: expected offset {expect}, got {off} (not dense)")
            return start
        tag = tag_of(rec["record"])
        prev = seen.get(off)
        if prev is not None and prev != tag:
            run.violation(f"{who} {cid}@{off}: read {tag} where {prev} was read before")
        seen[off] = tag
        expect += 1
    nxt = int(body["next_offset"])
    if nxt != expect:
        run.violation(f"{who} {cid}: next_offset {nxt} after reading up to {expect - 1}")
        return expect
    return nxt


async def _read_page(
    run: Run, rng: random.Random, coll: Collection, start: int, limit: int, wait_ms: int, who: str
) -> int | None:
    """One read from ``start``: the new position, or None on a retryable failure."""
    try:
        r = await run.send(
            "GET",
            run.pick(rng) + coll.path + "/records",
            params={"from": start, "limit": limit, "wait_ms": wait_ms},
            headers={"Authorization": f"Bearer {coll.key}"},
            timeout=run.workload.request_timeout_s + wait_ms / 1000,
        )
    except httpx.HTTPError as e:
        run.http[f"read_{type(e).__name__}"] += 1
        return None
    run.http[f"read_{r.status_code}"] += 1
    if r.status_code == 200:
        body = r.json()
        if run.trace_file is not None:
            run.trace(
                ev="page",
                who=who,
                cid=coll.cid,
                start=start,
                url=str(r.url),
                recs=[
                    (x["offset"], tag_of(x["record"]), x["timestamp_us"]) for x in body["records"]
                ],
                next=body["next_offset"],
            )
        return _check_page(run, coll.cid, start, body, who)
    if r.status_code == 410:
        oldest = int(r.json()["error"].get("oldest_offset", start))
        run.violation(
            f"{who} {coll.cid}: purged at {start} (oldest {oldest}) before it was "
            f"read: compaction ran ahead of the reader"
        )
        return max(start, oldest)
    if r.status_code == 404:
        return None  # not written yet
    if r.status_code in (409, 429, 500, 502, 503, 504, 307):
        return None
    run.violation(f"{who} {coll.cid}: unexpected {r.status_code} {r.text[:200]}")
    return None


async def tailer(run: Run, coll: Collection, idx: int) -> None:
    """Long-poll one collection from offset 1 until told to stop."""
    rng = random.Random(f"tailer:{run.seed}:{idx}")
    while not run.tail_stop.is_set():
        pos = run.tail_pos[coll.cid]
        nxt = await _read_page(run, rng, coll, pos, 500, run.workload.wait_ms, "tailer")
        if nxt is None:
            await asyncio.sleep(0.02 + 0.05 * rng.random())  # retry pacing
            continue
        run.tail_pos[coll.cid] = nxt


async def sweeper(run: Run, colls: list[Collection]) -> None:
    """Read many collections in turn without waiting (the collections nobody long-polls)."""
    rng = random.Random(f"sweeper:{run.seed}")
    sem = asyncio.Semaphore(16)

    async def one(c: Collection) -> None:
        async with sem:
            nxt = await _read_page(run, rng, c, run.tail_pos[c.cid], 1000, 0, "sweeper")
            if nxt is not None:
                run.tail_pos[c.cid] = nxt

    while not run.tail_stop.is_set():
        started = time.monotonic()
        await asyncio.gather(*(one(c) for c in colls))
        spent = time.monotonic() - started
        await asyncio.sleep(max(0.05, 0.5 - spent))  # sweep pacing


# ---------------------------------------------------------------------------------- drivers


async def service_call(
    run: Run, method: str, path: str, rng: random.Random | None = None, **kw: Any
) -> httpx.Response | None:
    """One call with the service key to a random host; None on a transport failure."""
    rng = rng or random.Random()
    try:
        r = await run.send(
            method, run.pick(rng) + path, headers={"Authorization": f"Bearer {SERVICE_KEY}"}, **kw
        )
    except httpx.HTTPError as e:
        run.http[f"svc_{type(e).__name__}"] += 1
        return None
    last = path.rsplit("/", 1)[-1]
    run.http[f"svc_{'state' if len(last) == 36 else last}_{r.status_code}"] += 1
    if run.trace_file is not None and method == "POST":
        run.trace(
            ev="svc",
            path=path,
            body=kw.get("json"),
            status=r.status_code,
            answer=r.text[:300] if last != "rollup" else None,
        )
    return r


async def gc_driver(run: Run, interval_s: float) -> None:
    """Compact what the tailers have read (never more) and collect garbage, like a compactor."""
    rng = random.Random(f"gc:{run.seed}")
    while not run.stop.is_set():
        await asyncio.sleep(rng.expovariate(1.0 / interval_s))  # driver pacing
        coll = rng.choice(run.collections)
        target = run.tail_pos[coll.cid]
        if target <= run.compaction_sent.get(coll.cid, 1):
            continue
        r = await service_call(run, "POST", coll.path + "/compaction", rng, json={"offset": target})
        if r is not None and r.status_code == 200:
            run.compaction_sent[coll.cid] = target
            for _ in range(rng.randint(1, 2)):
                await service_call(run, "POST", coll.path + "/gc", rng)


async def pin_driver(run: Run, interval_s: float) -> None:
    """Readers pin positions with their own cursors, as the design's "emergency" cursor does:
    create at a random retained offset, move back, drop.  While a pin answered 200 stands, every
    record from it on must stay readable (never 410), whatever GC does meanwhile."""
    rng = random.Random(f"pins:{run.seed}")
    n = 0
    while not run.stop.is_set():
        await asyncio.sleep(rng.expovariate(1.0 / interval_s))  # driver pacing
        coll = rng.choice(run.collections)
        headers = {"Authorization": f"Bearer {coll.key}"}
        try:
            st = await run.send("GET", run.pick(rng) + coll.path, headers=headers)
            if st.status_code != 200:
                continue
            oldest, nxt = int(st.json()["oldest_offset"]), int(st.json()["next_offset"])
            name = f"pin{n}"
            n += 1
            at = rng.randint(oldest, nxt)
            r = await run.send(
                "PUT",
                run.pick(rng) + coll.path + f"/cursors/{name}",
                json={"offset": at, "witness": None},
                headers=headers,
            )
            run.http[f"pin_{r.status_code}"] += 1
            if r.status_code != 200:
                if r.status_code not in (404, 409, 410, 429, 503):
                    run.violation(f"pin {name} on {coll.cid}@{at}: {r.status_code} {r.text[:200]}")
                continue
            witness = r.json()["witness"]
            await _check_pinned(run, rng, coll, at, headers, f"{name}@{at}")
            if rng.random() < 0.5 and at > oldest:
                back = rng.randint(oldest, at - 1)
                r = await run.send(
                    "PUT",
                    run.pick(rng) + coll.path + f"/cursors/{name}",
                    json={"offset": back, "witness": witness},
                    headers=headers,
                )
                run.http[f"pin_back_{r.status_code}"] += 1
                if r.status_code == 200:
                    at = back
                elif r.status_code not in (409, 410, 429, 503):
                    run.violation(f"pin {name} back to {back}: {r.status_code} {r.text[:200]}")
            await asyncio.sleep(rng.uniform(0.0, 3 * interval_s))  # hold the pin a while
            await _check_pinned(run, rng, coll, at, headers, f"{name}@{at} (held)")
            run.pins += 1
            await run.send(
                "DELETE", run.pick(rng) + coll.path + f"/cursors/{name}", headers=headers
            )
        except httpx.HTTPError as e:
            run.http[f"pin_{type(e).__name__}"] += 1


async def _check_pinned(
    run: Run, rng: random.Random, coll: Collection, at: int, headers: dict[str, str], what: str
) -> None:
    r = await run.send(
        "GET",
        run.pick(rng) + coll.path + "/records",
        params={"from": at, "limit": 1},
        headers=headers,
    )
    if r.status_code == 410:
        run.violation(f"{coll.cid}: pinned {what} but offset {at} was collected: {r.text[:200]}")


async def seal_driver(run: Run, count: int) -> None:
    """Seal ``count`` collections once a third of the appends are acknowledged; garbage
    collection must still reach them, and no append may land after the seal answered."""
    rng = random.Random(f"seal:{run.seed}")
    wl = run.workload
    target = (wl.writers * (wl.appends_per_writer or 100)) // 3
    await wait_until(
        lambda: run.acked_appends >= target or run.stop.is_set(),
        "a third of the appends acknowledged",
        math.inf,  # the run's own deadline sets the stop event
        0.05,
    )
    for coll in rng.sample(run.collections, min(count, len(run.collections))):
        run.sealed.add(coll.cid)
        r = await service_call(run, "POST", coll.path + "/seal", rng)
        if r is not None and r.status_code == 200:
            run.sealed_at[coll.cid] = int(r.json()["next_offset"])
            run.trace(ev="sealed", cid=coll.cid, next_offset=run.sealed_at[coll.cid])


async def rollup_driver(run: Run, interval_s: float) -> None:
    """Roll the dirty log up now and then (the host's own loop is slowed down in scenarios)."""
    rng = random.Random(f"rollup:{run.seed}")
    while not run.stop.is_set():
        await asyncio.sleep(rng.expovariate(1.0 / interval_s))  # driver pacing
        run.rollups_in_flight += 1
        try:
            await service_call(run, "POST", "/v1/dirty/rollup", rng)
        finally:
            run.rollups_in_flight -= 1


# ------------------------------------------------------------------------------------ phases


@dataclass
class Load:
    """The running client side of a scenario."""

    run: Run
    writers: list[asyncio.Task[None]]
    readers: list[asyncio.Task[None]]
    drivers: list[asyncio.Task[None]]

    async def writers_finished(self, timeout_s: float) -> None:
        done, pending = await asyncio.wait(self.writers, timeout=timeout_s)
        for t in done:
            if t.exception() is not None:
                self.run.violation(f"writer crashed: {t.exception()!r}")
        if pending:
            self.run.violation(f"{len(pending)} writers still running after {timeout_s:.0f}s")
            self.run.stop.set()
            await asyncio.wait(pending, timeout=60)

    async def stop_drivers(self) -> None:
        self.run.stop.set()
        for t in self.drivers:
            t.cancel()
        await asyncio.gather(*self.drivers, return_exceptions=True)

    async def stop_readers(self) -> None:
        self.run.tail_stop.set()
        for t in self.readers:
            t.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)


def start_load(run: Run) -> Load:
    wl = run.workload
    trace_dir = os.environ.get("RELIABILITY_TRACE")
    if trace_dir and run.trace_file is None:
        path = Path(trace_dir) / f"trace-{run.name}-{run.seed}-{os.getpid()}.jsonl"
        run.trace_file = open(path, "w")  # noqa: SIM115 - closed with the run

    writers = [asyncio.create_task(writer(run, w), name=f"writer-{w}") for w in range(wl.writers)]
    tailed = run.collections[: wl.tailed]
    readers = [
        asyncio.create_task(tailer(run, c, i), name=f"tailer-{i}") for i, c in enumerate(tailed)
    ]
    rest = run.collections[wl.tailed :]
    if rest:
        readers.append(asyncio.create_task(sweeper(run, rest), name="sweeper"))
    drivers = []
    if wl.gc_interval_s:
        drivers.append(asyncio.create_task(gc_driver(run, wl.gc_interval_s), name="gc-driver"))
    if wl.rollup_interval_s:
        drivers.append(
            asyncio.create_task(rollup_driver(run, wl.rollup_interval_s), name="rollup-driver")
        )
    if wl.pin_interval_s:
        drivers.append(asyncio.create_task(pin_driver(run, wl.pin_interval_s), name="pin-driver"))
    if wl.seal:
        drivers.append(asyncio.create_task(seal_driver(run, wl.seal), name="seal-driver"))
    return Load(run, writers, readers, drivers)


async def log_states(run: Run, rng: random.Random | None = None) -> dict[str, dict[str, Any]]:
    """GET every collection's state (404: never written)."""
    out: dict[str, dict[str, Any]] = {}
    sem = asyncio.Semaphore(32)

    async def one(c: Collection) -> None:
        async with sem:
            for _ in range(50):
                r = await service_call(run, "GET", c.path, rng)
                if r is not None and r.status_code == 200:
                    out[c.cid] = r.json()
                    return
                if r is not None and r.status_code == 404:
                    return
                await asyncio.sleep(0.1)  # retry pacing
            run.violation(f"state of {c.cid} unavailable")

    await asyncio.gather(*(one(c) for c in run.collections))
    return out


async def drain_readers(load: Load, timeout_s: float = 120.0) -> None:
    """Wait (polling) until every reader has caught up with its log's tail, then stop them."""
    run = load.run
    states = await log_states(run)

    def caught_up() -> bool:
        return all(run.tail_pos[cid] >= st["next_offset"] for cid, st in states.items())

    try:
        await wait_until(caught_up, "readers to reach the tail", timeout_s, 0.05)
    except TimeoutError:
        behind = {
            cid: (run.tail_pos[cid], st["next_offset"])
            for cid, st in states.items()
            if run.tail_pos[cid] < st["next_offset"]
        }
        run.violation(
            f"readers never reached the tail of {len(behind)} logs: {list(behind.items())[:5]}"
        )
    await load.stop_readers()


async def settle_gc(run: Run) -> None:
    """Drive every log's garbage collection to rest so nothing deletes while we audit."""
    rng = random.Random(0)
    sem = asyncio.Semaphore(16)

    async def one(c: Collection) -> None:
        async with sem:
            last = "no answer"
            for _ in range(6):
                r = await service_call(run, "POST", c.path + "/gc", rng)
                if r is None:
                    continue
                if r.status_code == 404:
                    return
                if r.status_code == 200 and r.json().get("phase") in ("idle", "done"):
                    return
                if r.status_code == 409 and _error_code(r) == "no_cursors":
                    return
                last = f"{r.status_code} {r.text[:200]}"
            # Faults are off and GC's grace is 0 here: a collector that cannot come to rest is
            # wedged (a liveness failure, e.g. a sealed log refusing every plan).
            run.violation(f"{c.cid}: garbage collection did not come to rest: {last}")

    await asyncio.gather(*(one(c) for c in run.collections))


async def read_log(
    run: Run,
    coll: Collection,
    host: str,
    start: int,
    end: int,
    *,
    purged_to: list[int] | None = None,
) -> list[tuple[int, str]] | None:
    """Every record of ``coll`` in [start, end) through ``host``; None if it could not.

    With ``purged_to``, a read that finds its position collected meanwhile (410: compaction
    passed it and GC ran, while the load still runs) goes on from the oldest offset, and
    records it there; without, that is a failure like any other."""
    out: list[tuple[int, str]] = []
    pos = start
    tries = 0
    while pos < end:
        try:
            r = await run.send(
                "GET",
                host + coll.path + "/records",
                params={"from": pos, "limit": 1000},
                headers={"Authorization": f"Bearer {SERVICE_KEY}"},
            )
        except httpx.HTTPError:
            r = None
        if r is not None and r.status_code == 410 and purged_to is not None:
            oldest = int(r.json()["error"].get("oldest_offset", pos))
            if oldest > pos:
                purged_to.append(oldest)
                pos = oldest
                continue
        if r is None or r.status_code != 200:
            tries += 1
            if tries > 50:
                run.violation(
                    f"final read of {coll.cid} at {pos} via {host} failed: "
                    f"{None if r is None else (r.status_code, r.text[:200])}"
                )
                return None
            await asyncio.sleep(0.1)  # retry pacing
            continue
        body = r.json()
        if not body["records"]:
            break
        for rec in body["records"]:
            off = int(rec["offset"])
            if off != pos:
                run.violation(f"final read {coll.cid}: expected offset {pos}, got {off}")
                return out
            out.append((off, tag_of(rec["record"])))
            pos += 1
    return out


async def dirty_coverage(run: Run, hosts: Sequence[str], states: dict[str, dict[str, Any]]) -> None:
    """After a roll-up on every host, the dirty sets cover every uncompacted record.

    Tails come from ``states`` (sampled before the roll-up), compaction cursors are read again
    after it: a compaction whose client gave up may still land meanwhile and rightly clip the set.
    """
    spans: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for h in hosts:
        r = None
        for _ in range(20):
            try:
                r = await run.send(
                    "POST",
                    h + "/v1/dirty/rollup",
                    headers={"Authorization": f"Bearer {SERVICE_KEY}"},
                )
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                r = None
            await asyncio.sleep(0.2)  # retry pacing
        if r is None or r.status_code != 200:
            run.violation(f"roll-up on {h} failed: {None if r is None else r.text[:200]}")
            continue
        got = await run.client.get(
            h + "/v1/dirty",
            params={"min_records": 0, "limit": 100000},
            headers={"Authorization": f"Bearer {SERVICE_KEY}"},
        )
        for e in got.json()["logs"]:
            spans[e["collection_id"]].append((int(e["start"]), int(e["limit"])))
    after = await log_states(run)
    for cid, st in states.items():
        lo = int(after.get(cid, st)["compaction_offset"])
        hi = int(st["next_offset"])
        if hi <= lo:
            continue
        pos = lo
        for s, lim in sorted(spans.get(cid, [])):
            if s <= pos:
                pos = max(pos, lim)
        if pos < hi:
            run.violation(
                f"dirty set misses {cid}: uncompacted [{lo},{hi}) covered only to "
                f"{pos} by {sorted(spans.get(cid, []))}"
            )


async def scrub_store(store_root: Path) -> list[str]:
    """Scrub every log in a LocalStore directory from the objects; the problems found."""
    from wal3 import LocalStore
    from wal3.scrub import find_logs, scrub_log

    store = LocalStore(store_root)
    problems: list[str] = []
    try:
        n = 0
        async for prefix in find_logs(store):
            n += 1
            report = await scrub_log(store, prefix)
            problems += [f"{prefix}: {p}" for p in report.problems]
        if n == 0:
            problems.append("no logs found to scrub")
    finally:
        await store.close()
    return problems


async def audit(
    run: Run,
    result: Result,
    store_root: Path,
    *,
    read_hosts: Sequence[str] | None = None,
    check_dirty: bool = True,
    api_scrub: bool = True,
) -> dict[str, list[tuple[int, str]]]:
    """The final check (faults off, writers done, readers drained); fills ``result``."""
    hosts = list(read_hosts or run.hosts())
    await settle_gc(run)
    states = await log_states(run)
    final: dict[str, list[tuple[int, str]]] = {}
    counts: Counter[str] = Counter()
    read = 0
    for coll in run.collections:
        st = states.get(coll.cid)
        if st is None:
            final[coll.cid] = []
            if any(cid == coll.cid for cid, _ in run.acked.values()):
                run.violation(f"{coll.cid} has acknowledged records but no log")
            continue
        oldest, nxt = int(st["oldest_offset"]), int(st["next_offset"])
        recs: list[tuple[int, str]] | None = None
        for h in hosts:
            got = await read_log(run, coll, h, oldest, nxt)
            if got is None:
                continue
            if recs is None:
                recs = got
            elif got != recs:
                run.violation(f"hosts disagree on {coll.cid}: {len(got)} vs {len(recs)} records")
        recs = recs or []
        final[coll.cid] = recs
        if [o for o, _ in recs] != list(range(oldest, nxt)):
            run.violation(
                f"{coll.cid}: offsets not dense over [{oldest},{nxt}): got {len(recs)} records"
            )
        by_off = dict(recs)
        seen = run.seen[coll.cid]
        for off, tag in recs:
            if off in seen and seen[off] != tag:
                run.violation(f"{coll.cid}@{off}: final read {tag}, a tailer read {seen[off]}")
        below = {off: tag for off, tag in seen.items() if off < oldest}
        if len(below) != oldest - 1:
            missing = (oldest - 1) - len(below)
            run.violation(
                f"{coll.cid}: {missing} records below the oldest offset {oldest} were "
                f"purged before any reader saw them"
            )
        sealed_at = run.sealed_at.get(coll.cid)
        if sealed_at is not None and (nxt != sealed_at or not st.get("sealed")):
            run.violation(
                f"{coll.cid}: sealed at {sealed_at} but now ends at {nxt} "
                f"(sealed={st.get('sealed')})"
            )
        comp = int(st["compaction_offset"])
        if oldest > comp:
            run.violation(
                f"{coll.cid}: oldest offset {oldest} is above the compaction cursor {comp}"
            )
        for tag in list(by_off.values()) + list(below.values()):
            counts[tag] += 1
        read += len(recs) + len(below)
        st["_by_off"] = by_off
        st["_below"] = below
    result.read = read
    result.duplicated = sum(n - 1 for n in counts.values() if n > 1)
    dups = [t for t, n in counts.items() if n > 1]
    for tag in dups[:20]:
        where = [
            (cid, off)
            for cid, st in states.items()
            for off, t in list(st["_by_off"].items()) + list(st["_below"].items())
            if t == tag
        ]
        first = tag.rsplit(".", 1)[0] + ".0"
        run.violation(
            f"{tag} appears {counts[tag]} times at {where}; "
            f"{'keyless' if tag in run.keyless else 'keyed'}, acknowledged at "
            f"{run.acked.get(tag)}; attempts {run.attempts.get(first)}"
        )
    result.notes["duplicates"] = dups[:100]
    lost = 0
    for tag, (cid, off) in run.acked.items():
        st = states.get(cid)
        if st is None:
            lost += 1
            continue
        where = st["_by_off"] if off >= int(st["oldest_offset"]) else st["_below"]
        if where.get(off) != tag:
            lost += 1
            if lost <= 20:
                elsewhere = [c for c in states if tag in states[c]["_by_off"].values()]
                run.violation(
                    f"acknowledged {tag} at {cid}@{off} is not there (found "
                    f"{where.get(off)!r}; elsewhere: {elsewhere})"
                )
    result.lost = lost
    result.acknowledged = len(run.acked)
    present = set(counts)
    result.unacked_present = sum(1 for t in run.unresolved if t in present)
    result.unacked_absent = sum(1 for t in run.unresolved if t not in present)
    stray = [t for t in present if t not in run.sent]
    if stray:
        run.violation(f"{len(stray)} records nobody sent, e.g. {stray[:3]}")
    result.logs = len(states)
    # Scrub: through the API for each collection, and from the objects for every log.
    problems: list[str] = []
    if api_scrub:
        rng = random.Random(1)
        for coll in run.collections:
            if coll.cid not in states:
                continue
            r = await service_call(run, "GET", coll.path + "/scrub", rng)
            if r is None or r.status_code != 200 or not r.json().get("ok"):
                problems.append(f"api scrub {coll.cid}: {None if r is None else r.text[:300]}")
    problems += await scrub_store(store_root)
    result.scrub_ok = not problems
    for p in problems[:20]:
        run.violation(f"scrub: {p}")
    if check_dirty:
        await dirty_coverage(run, hosts, dict(states))
    for st in states.values():
        st.pop("_by_off", None)
        st.pop("_below", None)
    return final


def finish(run: Run, result: Result, started: float) -> Result:
    result.violations = list(run.violations)
    result.seconds = time.monotonic() - started
    result.notes.setdefault("http", dict(sorted(run.http.items())))
    result.notes["redirects_followed"] = run.redirects
    if run.events:
        result.notes["events"] = dict(run.events)
    return result


async def run_with(
    run: Run, during: Callable[[Load], Coroutine[Any, Any, None]] | None, timeout_s: float
) -> Load:
    """Start the load, run ``during`` beside it (the fault schedule), wait for the writers."""
    load = start_load(run)
    chaos = asyncio.create_task(during(load)) if during is not None else None
    try:
        if run.workload.appends_per_writer is not None:
            await load.writers_finished(timeout_s)
        else:
            await asyncio.wait(load.writers, timeout=timeout_s)
    finally:
        if chaos is not None:
            run.stop.set()
            try:
                await asyncio.wait_for(chaos, 180)
            except Exception as e:
                run.violation(f"fault schedule failed: {e!r}")
    await load.stop_drivers()
    await asyncio.wait(load.writers, timeout=120)
    return load


def dumps(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str)
