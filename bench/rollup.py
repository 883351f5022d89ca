"""Roll-up at scale (issue 24): the incremental pass over 100,000 dirty collections among
1,000,000 logs, and a compactor outage of an hour.

The store: collection logs live in an in-memory object store (``common.memory_store``) holding,
for every one of the 1,000,000 logs, its compaction cursor and its manifest as the real objects
(``wal3.cursors.Cursor``, ``wal3.manifest.Manifest`` bytes; a dirty log's manifest carries its
tail).  They are what the roll-up's fallback reads go to (``host.dirty.compaction_offsets_from_store``
and ``WalDirtyBackend.log_tails``, the server's own code).  The dirty log itself is a real wal3 log
(``LogWriter`` + ``host.dirty.WalDirtyBackend``, GC included) on a ``LocalStore`` with fsync, on
tmpfs when there is one.  Every request is counted by key class.  Time is virtual: a wall clock and
the roll-up's monotonic clock move 10 s per interval (settling, scores), so an hour takes as long as
its 360 passes (the dirty log's GC runs with grace 0 and keeps its last 256 unlinked fragments, not
the 900 s that would never pass); CPU is measured (``time.process_time``, the whole process, store threads included)
around each ``RollUp.run()``.

(a) Steady state: D dirty collections (a backlog marked before the host started; 10 records each)
    plus 1,000 logs appending one fragment per interval, compacted in the same interval (the
    compactor keeps up with them: 1,000 marks and 1,000 clear records per interval).  The first
    pass after the start folds the whole log (the rebuild); then 30 passes.  D = 1,000, 10,000,
    100,000 on the same 1,000,000-log store.
(b) Outage: 1,000 logs append a 10-record fragment each per interval; the compactor is down for an
    hour (360 passes), then pulls ``select(limit=500)`` per interval and compacts each to its tail
    (cursor + ``POST .../compaction``'s clear).  Writes go on until every log is compacted past
    where it stood when the outage ended, then stop; the set drains.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import gc
import hashlib
import os
import random
import resource
import shutil
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from . import common

NAME = "rollup"
INTERVAL_S = 10.0
CPU_TARGET = 0.05  # of one core, at one pass per INTERVAL_S

FULL: dict[str, Any] = {
    "logs": 1_000_000,
    "dirty": [1_000, 10_000, 100_000],
    "passes": 30,
    "appending": 1_000,
    "outage_s": 3600,
    "catchup_limit": 500,
}
QUICK: dict[str, Any] = {
    "logs": 20_000,
    "dirty": [200, 2_000],
    "passes": 6,
    "appending": 100,
    "outage_s": 600,
    "catchup_limit": 50,
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("rollup")
    g.add_argument(
        "--rollup-logs", type=int, default=None, help="logs in the store (default 1000000)"
    )
    g.add_argument(
        "--rollup-dirty",
        default=None,
        help="comma-separated dirty-set sizes for the steady state (default 1000,10000,100000)",
    )


# ------------------------------------------------------------------------------------ store


class _GcTimer:
    """CPU time the interpreter's cyclic garbage collector spends, by generation."""

    def __init__(self) -> None:
        self.spent: dict[int, float] = collections.defaultdict(float)
        self._t0 = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.process_time()
        else:
            self.spent[info["generation"]] += time.process_time() - self._t0

    def close(self) -> None:
        gc.callbacks.remove(self._callback)


_GC: _GcTimer | None = None


class _Clock:
    """Virtual time: epoch microseconds for records and scores, seconds for settling."""

    def __init__(self) -> None:
        self.now_us = 1_800_000_000_000_000

    def __call__(self) -> int:
        return self.now_us

    def mono(self) -> float:
        return self.now_us / 1e6

    def advance(self, seconds: float) -> None:
        self.now_us += int(seconds * 1e6)


def _split_store(dirty_root: Path) -> Any:
    """Keys under ``dirty/`` go to a LocalStore (fsync), the rest to memory; requests and bytes
    put are counted per key class ("dirty", "logs")."""
    from wal3 import LocalStore, ObjectStore
    from wal3.paths import DIRTY_PREFIX

    class Split(ObjectStore):
        def __init__(self) -> None:
            self.dirty = LocalStore(dirty_root)
            self.logs = common.memory_store()
            self.requests: collections.Counter[str] = collections.Counter()
            self.put_bytes: collections.Counter[str] = collections.Counter()

        def _pick(self, key: str, op: str) -> Any:
            cls = "dirty" if key.startswith(DIRTY_PREFIX) else "logs"
            self.requests[f"{cls} {op}"] += 1
            return self.dirty if cls == "dirty" else self.logs

        async def get(self, key: str) -> Any:
            return await self._pick(key, "get").get(key)

        async def head(self, key: str) -> Any:
            return await self._pick(key, "head").head(key)

        async def put(self, key: str, data: bytes, **kw: Any) -> str:
            store = self._pick(key, "put")
            self.put_bytes["dirty" if store is self.dirty else "logs"] += len(data)
            if store is self.dirty:  # fragment, manifest, snapshot, cursor, gc
                kind = key[len(DIRTY_PREFIX) :].split("/", 2)[1]
                self.put_bytes[f"dirty {kind}"] += len(data)
            return str(await store.put(key, data, **kw))

        async def delete(self, key: str) -> None:
            await self._pick(key, "delete").delete(key)

        async def list(self, prefix: str, *, start_after: str | None = None) -> Any:
            async for meta in self._pick(prefix, "list").list(prefix, start_after=start_after):
                yield meta

        def url_for(self, key: str) -> str:
            return str(self._pick(key, "url").url_for(key))

        async def close(self) -> None:
            await self.dirty.close()

        def snapshot(self) -> tuple[collections.Counter[str], collections.Counter[str]]:
            return collections.Counter(self.requests), collections.Counter(self.put_bytes)

    return Split()


def _diff(a: collections.Counter[str], b: collections.Counter[str]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in b if b[k] - a[k]}


class _Logs:
    """The collection logs in the store: each one's compaction cursor and manifest."""

    def __init__(self, store: Any, n: int) -> None:
        from wal3.cursors import Cursor
        from wal3.manifest import Manifest
        from wal3.paths import MANIFEST_PATH, cursor_path, join, log_prefix

        self._store = store
        self._join, self._prefix = join, log_prefix
        self._cursor_key, self._manifest_key = cursor_path("compaction"), MANIFEST_PATH
        self._Cursor, self._Manifest = Cursor, Manifest
        t0 = time.perf_counter()
        rng = random.Random(24)  # random v4 ids, as collections have: they do not compress
        self.ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(n)]
        cursor = Cursor(offset=1, epoch_us=0, writer="bench").to_bytes()
        manifest = Manifest.empty("bench").to_bytes()
        objects = store.logs.objects
        c_etag, m_etag = _etag(cursor), _etag(manifest)
        for cid in self.ids:
            p = log_prefix(cid)
            objects[join(p, self._cursor_key)] = (cursor, c_etag, 0.0)
            objects[join(p, self._manifest_key)] = (manifest, m_etag, 0.0)
        self.make_s = time.perf_counter() - t0
        self.tail: dict[uuid.UUID, int] = {}
        self.comp: dict[uuid.UUID, int] = {}

    def set_tail(self, cid: uuid.UUID, tail: int) -> None:
        """The log now ends at ``tail`` (as after a commit; no fragment left to link)."""
        m = self._Manifest(writer="bench", initial_offset=tail, initial_seq_no=tail)
        data = m.to_bytes()
        key = self._join(self._prefix(cid), self._manifest_key)
        self._store.logs.objects[key] = (data, _etag(data), 0.0)
        self.tail[cid] = tail

    def set_compaction(self, cid: uuid.UUID, offset: int) -> None:
        data = self._Cursor(offset=offset, epoch_us=0, writer="bench").to_bytes()
        key = self._join(self._prefix(cid), self._cursor_key)
        self._store.logs.objects[key] = (data, _etag(data), 0.0)
        self.comp[cid] = offset


def _etag(data: bytes) -> str:
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


class _Offsets:
    """The server's CompactionOffsets with no open logs: every cursor comes from the store."""

    def __init__(self, store: Any) -> None:
        self.store = store

    async def compaction_offsets(self, ids: Any) -> dict[uuid.UUID, int]:
        from host.dirty import compaction_offsets_from_store
        from wal3.paths import log_prefix

        return await compaction_offsets_from_store(self.store, ids, log_prefix, {})


class _Host:
    """One host's dirty log: a real wal3 log, its hook and its roll-up, on virtual time."""

    def __init__(self, store: Any, server_id: str, clock: _Clock) -> None:
        self.store, self.server_id, self.clock = store, server_id, clock

    async def __aenter__(self) -> _Host:
        from dirtylog import DirtyLogHook, RollUp
        from host.dirty import WalDirtyBackend, dirty_prefix
        from wal3 import LogWriter, LogWriterOptions
        from wal3.gc import GcOptions

        self.prefix = dirty_prefix(self.server_id)
        self.writer = await LogWriter.open(
            self.store, self.prefix, LogWriterOptions(writer_name=f"loghost:{self.server_id}")
        )
        # Time is virtual: GC's grace and the 900 s retention of unlinked fragments (the
        # idempotency window) would never elapse; the count-based 256 fragments stay.
        gc = GcOptions(grace_s=0, retain_s=0, writer_name=f"loghost-gc:{self.server_id}")
        self.backend = WalDirtyBackend(self.store, self.prefix, self.writer, gc)
        self.hook = DirtyLogHook(self.backend, self.clock)
        self.rollup = RollUp(
            self.backend, _Offsets(self.store), clock=self.clock, monotonic=self.clock.mono
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.writer.close()

    async def timed_pass(self) -> dict[str, Any]:
        r0, b0 = self.store.snapshot()
        gc0 = dict(_GC.spent) if _GC is not None else {}
        cpu0, t0 = time.process_time(), time.perf_counter()
        res = await self.rollup.run()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        gc1 = dict(_GC.spent) if _GC is not None else {}
        r1, b1 = self.store.snapshot()
        req = _diff(r0, r1)
        return {
            "cpu_s": cpu,
            "wall_s": wall,
            "dirty": len(res.entries),
            "records_read": res.records_read,
            "window": res.window,
            "relogged": res.relogged,
            "reinserted": res.reinserted,
            "compaction_lookups": res.compaction_lookups,
            "tail_lookups": res.tail_lookups,
            "retained": res.retained,
            "rebuilt": res.rebuilt,
            "requests": req,
            "requests_logs": sum(v for k, v in req.items() if k.startswith("logs")),
            "requests_dirty": sum(v for k, v in req.items() if k.startswith("dirty")),
            "dirty_bytes": b1["dirty"] - b0["dirty"],
            "dirty_bytes_by_kind": {
                k[len("dirty ") :]: v for k, v in _diff(b0, b1).items() if k.startswith("dirty ")
            },
            "gc_s": sum(gc1.get(g, 0.0) - gc0.get(g, 0.0) for g in gc1),
            "gc2_s": gc1.get(2, 0.0) - gc0.get(2, 0.0),
        }

    def stored_bytes(self, root: Path) -> int:
        base = root / self.prefix
        return sum((Path(d) / f).stat().st_size for d, _, files in os.walk(base) for f in files)


# ---------------------------------------------------------------------------- (a) steady state


async def _steady(store: Any, logs: _Logs, root: Path, d: int, cfg: dict[str, Any]) -> dict:
    from dirtylog import DirtyRecord

    clock = _Clock()
    a = cfg["appending"]
    # Disjoint slices of the store's logs: the backlog, and the logs appending meanwhile.
    index = cfg["dirty"].index(d)
    base = sum(cfg["dirty"][:index])
    backlog = logs.ids[base : base + d]
    appending = logs.ids[len(logs.ids) - a * (1 + index) :][:a]
    async with _Host(store, f"steady-{d}", clock) as host:
        t0 = time.perf_counter()
        bodies = []
        for cid in backlog:
            logs.set_tail(cid, 11)
            bodies.append(DirtyRecord.mark(cid, 1, 10, clock()).encode())
        for i in range(0, len(bodies), 1024):
            await host.backend.append_many(bodies[i : i + 1024])
        for cid in appending:
            logs.set_tail(cid, 1)
            logs.set_compaction(cid, 1)
        build_s = time.perf_counter() - t0
        start = await host.timed_pass()  # the rebuild: the whole retained log is folded once
        rows = []
        workload = []
        for _ in range(cfg["passes"]):
            clock.advance(INTERVAL_S)
            r0, b0 = store.snapshot()

            async def write(cid: uuid.UUID) -> None:
                tail = logs.tail[cid]
                await host.hook.mark_dirty(cid, tail, 1)
                logs.set_tail(cid, tail + 1)

            async def compact(cid: uuid.UUID) -> None:
                tail = logs.tail[cid]
                logs.set_compaction(cid, tail)
                await host.rollup.compacted(cid, tail)

            await asyncio.gather(*(write(c) for c in appending))
            await asyncio.gather(*(compact(c) for c in appending))
            r1, b1 = store.snapshot()
            workload.append({"dirty_bytes": b1["dirty"] - b0["dirty"], "requests": _diff(r0, r1)})
            rows.append(await host.timed_pass())
        # GET /v1/dirty's work, from memory: the best 1,000 of the set.
        cpu0 = time.process_time()
        chosen = host.rollup.select(min_records=1, limit=1000)
        select_s = time.process_time() - cpu0
        entries = host.rollup.entries()
        missing = [c for c in backlog if c not in entries or entries[c].limit < 11]
        # A restart: a new process folds the retained log once (the same cost as the start).
        host.rollup = type(host.rollup)(
            host.backend, _Offsets(store), clock=clock, monotonic=clock.mono
        )
        restart = await host.timed_pass()
        stored = host.stored_bytes(root)
    cpu = sorted(r["cpu_s"] for r in rows)
    return {
        "dirty": d,
        "build_s": build_s,
        "start": start,
        "restart": restart,
        "rows": rows,
        "workload": workload,
        "cpu_median_s": statistics.median(cpu),
        "cpu_p90_s": common.percentile(cpu, 90),
        "cpu_max_s": cpu[-1],
        "select_1000_s": select_s,
        "selected": len(chosen),
        "missing": len(missing),
        "restart_same": restart["dirty"] == len(entries),
        "stored_bytes": stored,
        "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


# ---------------------------------------------------------------------------------- (b) outage


async def _outage(store: Any, logs: _Logs, root: Path, cfg: dict[str, Any]) -> dict:
    clock = _Clock()
    a = cfg["appending"]
    ids = logs.ids[len(logs.ids) // 2 : len(logs.ids) // 2 + a]
    for cid in ids:
        logs.set_tail(cid, 1)
        logs.set_compaction(cid, 1)
    samples: list[dict[str, Any]] = []
    outage_passes = int(cfg["outage_s"] / INTERVAL_S)
    async with _Host(store, "outage", clock) as host:

        async def write(cid: uuid.UUID) -> None:
            tail = logs.tail[cid]
            await host.hook.mark_dirty(cid, tail, 10)
            logs.set_tail(cid, tail + 10)

        async def compact(cid: uuid.UUID) -> None:
            tail = logs.tail[cid]
            logs.set_compaction(cid, tail)
            await host.rollup.compacted(cid, tail)

        window: list[dict[str, Any]] = []

        def sample(phase: str, step: int) -> None:
            cpu = sorted(r["cpu_s"] for r in window)
            samples.append(
                {
                    "phase": phase,
                    "minute": step * INTERVAL_S / 60,
                    "dirty": window[-1]["dirty"],
                    "retained": window[-1]["retained"],
                    "stored_bytes": host.stored_bytes(root),
                    "cpu_median_s": statistics.median(cpu),
                    "cpu_max_s": cpu[-1],
                    "requests_max": max(r["requests_logs"] + r["requests_dirty"] for r in window),
                    "requests_logs_max": max(r["requests_logs"] for r in window),
                }
            )
            window.clear()

        step = 0
        for step in range(1, outage_passes + 1):
            clock.advance(INTERVAL_S)
            await asyncio.gather(*(write(c) for c in ids))
            window.append(await host.timed_pass())
            if step % 30 == 0:
                sample("outage", step)
        end_tails = {c: logs.tail[c] for c in ids}
        catchup = 0
        while any(logs.comp.get(c, 1) < end_tails[c] for c in ids):
            step += 1
            catchup += 1
            clock.advance(INTERVAL_S)
            chosen = host.rollup.select(min_records=1, limit=cfg["catchup_limit"])
            await asyncio.gather(*(compact(e.collection_id) for e in chosen))
            await asyncio.gather(*(write(c) for c in ids))
            window.append(await host.timed_pass())
            if catchup > 10 * a:
                raise RuntimeError("the compactor never caught up")
        sample("catch-up", step)
        drain = 0
        while host.rollup.entries():
            step += 1
            drain += 1
            clock.advance(INTERVAL_S)
            chosen = host.rollup.select(min_records=1, limit=cfg["catchup_limit"])
            await asyncio.gather(*(compact(e.collection_id) for e in chosen))
            window.append(await host.timed_pass())
            if drain > 10 * a:
                raise RuntimeError("the dirty set never drained")
        # A few passes more: the tail moves past the last relogs and GC reclaims them.
        for _ in range(3):
            step += 1
            clock.advance(INTERVAL_S)
            window.append(await host.timed_pass())
        sample("drained", step)
    return {
        "logs": a,
        "outage_passes": outage_passes,
        "catchup_passes": catchup,
        "drain_passes": drain,
        "samples": samples,
        "uncompacted_after": sum(1 for c in ids if logs.comp.get(c, 1) < logs.tail[c]),
    }


# ------------------------------------------------------------------------------------ run


async def _run(cfg: dict[str, Any]) -> dict[str, Any]:
    global _GC
    _GC = _GcTimer()
    shm = common.tmpfs_dir()
    root = Path(tempfile.mkdtemp(prefix="bench-rollup-", dir=shm or common.SCRATCH_DIR))
    out: dict[str, Any] = {"config": cfg, "dirty_store": "tmpfs" if shm else "disk"}
    store = _split_store(root)
    try:
        logs = _Logs(store, cfg["logs"])
        out["make_logs_s"] = logs.make_s
        out["objects"] = len(store.logs.objects)
        out["objects_tracked"] = len(gc.get_objects())  # what a full cyclic GC walks
        print(f"  . {cfg['logs']:,} logs in the store ({logs.make_s:.0f} s)", flush=True)
        out["steady"] = []
        for d in cfg["dirty"]:
            r = await _steady(store, logs, root, d, cfg)
            out["steady"].append(r)
            print(
                f"  . steady, {d:,} dirty: start {r['start']['cpu_s'] * 1e3:.0f} ms CPU; passes "
                f"median {r['cpu_median_s'] * 1e3:.1f} ms, max {r['cpu_max_s'] * 1e3:.1f} ms CPU",
                flush=True,
            )
        out["outage"] = await _outage(store, logs, root, cfg)
        o = out["outage"]
        print(
            f"  . outage: caught up in {o['catchup_passes']} passes, drained in "
            f"{o['drain_passes']}",
            flush=True,
        )
    finally:
        await store.close()
        shutil.rmtree(root, ignore_errors=True)
        _GC.close()
        _GC = None
    return out


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    if getattr(args, "rollup_logs", None):
        cfg["logs"] = args.rollup_logs
    if getattr(args, "rollup_dirty", None):
        cfg["dirty"] = [int(x) for x in args.rollup_dirty.split(",")]
    from dirtylog import (
        DEFAULT_COMPACTION_LOOKUPS,
        DEFAULT_TAIL_LOOKUPS,
        DEFAULT_WINDOW_RECORDS,
    )

    data = asyncio.run(_run(cfg))
    data.update(
        {
            "command": common.command_line(),
            "quick": quick,
            "machine": common.machine_info(),
            "window_records": DEFAULT_WINDOW_RECORDS,
            "max_compaction_lookups": DEFAULT_COMPACTION_LOOKUPS,
            "max_tail_lookups": DEFAULT_TAIL_LOOKUPS,
        }
    )
    return data


# ------------------------------------------------------------------------------ rendering


def _ms(s: float) -> float:
    return s * 1e3


def render(data: dict[str, Any]) -> str:
    cfg = data["config"]
    out: list[str] = []
    out.append(
        f"Store: {cfg['logs']:,} collection logs ({data['objects']:,} objects: each log's "
        f"compaction cursor and manifest, in memory, written in {data['make_logs_s']:.0f} s); "
        f"each host's dirty log a wal3 log on a LocalStore with fsync ({data['dirty_store']}).  "
        f"Roll-up defaults: window {data['window_records']:,} records, at most "
        f"{data['max_compaction_lookups']} compaction-cursor and {data['max_tail_lookups']} "
        f"tail reads per pass.  Virtual time, {INTERVAL_S:.0f} s per interval; CPU is "
        f"`time.process_time()` around `RollUp.run()` (the whole process)."
    )
    out.append("")
    out.append(
        f"(a) Steady state: D dirty collections (a backlog of 10 records each, marked before the "
        f"start) and {cfg['appending']:,} other logs appending one fragment per interval, "
        f"compacted in the same interval ({cfg['appending']:,} marks and "
        f"{cfg['appending']:,} clear records per interval).  {cfg['passes']} passes after the "
        f"start; store requests and dirty-log bytes are per pass."
    )
    out.append("")
    rows = []
    for s in data["steady"]:
        req_logs = [r["requests_logs"] for r in s["rows"]]
        req_dirty = [r["requests_dirty"] for r in s["rows"]]
        dbytes = [r["dirty_bytes"] for r in s["rows"]]
        wbytes = [w["dirty_bytes"] for w in s["workload"]]
        rows.append(
            [
                s["dirty"],
                _ms(s["start"]["cpu_s"]),
                _ms(s["cpu_median_s"]),
                _ms(s["cpu_max_s"]),
                100 * s["cpu_median_s"] / INTERVAL_S,
                100 * s["cpu_max_s"] / INTERVAL_S,
                f"{min(req_logs)}-{max(req_logs)}",
                f"{min(req_dirty)}-{max(req_dirty)}",
                statistics.median(r["relogged"] for r in s["rows"]),
                statistics.median(dbytes) / 1024,
                statistics.median(wbytes) / 1024,
                statistics.median(r["retained"] for r in s["rows"]),
                _ms(s["select_1000_s"]),
                _ms(max(r["gc2_s"] for r in s["rows"])),
            ]
        )
    out.append(
        common.md_table(
            [
                "dirty collections",
                "start (rebuild) ms CPU",
                "pass ms CPU, median",
                "pass ms CPU, max",
                "% of a core at 10 s, median",
                "% of a core, max",
                "collection-log requests per pass",
                "dirty-log requests per pass",
                "collections relogged per pass",
                "roll-up's dirty-log KiB per pass",
                "marks' and clears' dirty-log KiB per interval",
                "dirty-log records retained",
                "select(1,000) ms CPU",
                "interpreter's full GC in a pass, max ms",
            ],
            rows,
        )
    )
    out.append("")
    kinds = ["log", "manifest", "snapshot", "cursor", "gc"]
    out.append(
        "The roll-up's dirty-log bytes per pass by object (median KiB): fragments (`log/`: the "
        "relogs) follow the window and the new records; the manifest is rewritten per commit and "
        "holds at most 100 fragment pointers before wal3 snapshots them, so it stops growing once "
        "the retained log passes about 100 fragments."
    )
    out.append("")
    out.append(
        common.md_table(
            ["dirty collections", *kinds],
            [
                [s["dirty"]]
                + [
                    statistics.median(r["dirty_bytes_by_kind"].get(k, 0) for r in s["rows"]) / 1024
                    for k in kinds
                ]
                for s in data["steady"]
            ],
        )
    )
    out.append("")
    worst = max(s["cpu_max_s"] for s in data["steady"])
    top = data["steady"][-1]
    verdict = "PASS" if top["cpu_max_s"] <= CPU_TARGET * INTERVAL_S else "MISS"
    out.append(
        f"- target: roll-up CPU ≤ {CPU_TARGET:.0%} of one core at a {INTERVAL_S:.0f} s interval "
        f"with {top['dirty']:,} dirty: **{100 * top['cpu_median_s'] / INTERVAL_S:.2f} %** "
        f"(median pass), {100 * top['cpu_max_s'] / INTERVAL_S:.2f} % (worst pass) -> {verdict}.  "
        f"Worst pass of any size: {_ms(worst):.0f} ms, of which up to "
        f"{_ms(max(r['gc2_s'] for st in data['steady'] for r in st['rows'])):.0f} ms was the "
        f"interpreter's full (generation 2) garbage collection, which walks every object it "
        f"tracks in the process ({data['objects_tracked']:,} after the store was written) "
        f"whenever it runs."
    )
    most = ", ".join(
        f"{max(r['requests_logs'] + r['requests_dirty'] for r in s['rows']):,}"
        for s in data["steady"]
    )
    sizes = ", ".join(f"{s['dirty']:,}" for s in data["steady"])
    rebuilds = ", ".join(f"{_ms(s['restart']['cpu_s']):,.0f} ms" for s in data["steady"])
    kept = all(s["missing"] == 0 for s in data["steady"])
    same = all(s["restart_same"] for s in data["steady"])
    out.append(
        f"- target: store requests per pass independent of the dirty set: the most in any pass "
        f"was {most} at {sizes} dirty (the old pass made one cursor GET per dirty collection, "
        f"§5 (d))."
    )
    out.append(
        f"- every backlog collection stayed in the set: {'yes' if kept else 'NO'}; a restart "
        f"rebuilt the same set: {'yes' if same else 'NO'} (its one full fold: {rebuilds} CPU)."
    )
    out.append("")
    o = data["outage"]
    out.append(
        f"(b) Compactor outage: {o['logs']:,} logs append a 10-record fragment per interval; no "
        f"compaction for {o['outage_passes'] * INTERVAL_S / 60:.0f} minutes "
        f"({o['outage_passes']} passes), then the compactor pulls {cfg['catchup_limit']} per "
        f"interval and compacts each to its tail while writes go on; writes stop once every log "
        f"is compacted past where it stood when the outage ended.  Each row covers the passes "
        f"since the previous one."
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "phase",
                "minute",
                "dirty collections",
                "dirty-log records retained",
                "dirty-log bytes stored",
                "pass ms CPU, median",
                "pass ms CPU, max",
                "store requests per pass, max",
                "of which collection logs",
            ],
            [
                [
                    s["phase"],
                    s["minute"],
                    s["dirty"],
                    s["retained"],
                    s["stored_bytes"],
                    _ms(s["cpu_median_s"]),
                    _ms(s["cpu_max_s"]),
                    s["requests_max"],
                    s["requests_logs_max"],
                ]
                for s in o["samples"]
            ],
        )
    )
    out.append("")
    during = [s for s in o["samples"] if s["phase"] == "outage"]
    out.append(
        f"- target: during the outage the dirty log stayed at "
        f"{min(s['retained'] for s in during):,}-{max(s['retained'] for s in during):,} records "
        f"and the roll-up's worst pass at {max(_ms(s['cpu_max_s']) for s in during):.0f} ms CPU "
        f"(bounded: flat from the first sample to the last); after it every log was compacted "
        f"past its outage-end tail in {o['catchup_passes']} passes, and the set drained in "
        f"{o['drain_passes']} more once writes stopped "
        f"({'PASS' if o['uncompacted_after'] == 0 else 'MISS'}: "
        f"{o['uncompacted_after']} logs left uncompacted)."
    )
    return "\n".join(out) + "\n"


def summary_row(data: dict[str, Any]) -> str:
    """The roll-up's row of docs/PERFORMANCE.md's summary table (issue 24's targets), from the
    same results as :func:`render` (``--report --write-docs`` puts it on the line marked
    ``<!-- bench-row:rollup -->``)."""
    m = data["machine"]
    top = data["steady"][-1]
    logs = data["config"]["logs"]
    cpu_ok = top["cpu_max_s"] <= CPU_TARGET * INTERVAL_S
    most = [
        max(r["requests_logs"] + r["requests_dirty"] for r in s["rows"]) for s in data["steady"]
    ]
    sizes = " / ".join(f"{s['dirty']:,}" for s in data["steady"])
    o = data["outage"]
    during = [s for s in o["samples"] if s["phase"] == "outage"]
    outage_ok = o["uncompacted_after"] == 0
    kept = all(s["missing"] == 0 for s in data["steady"])
    target = (
        f"Incremental roll-up (issue 24): with {top['dirty']:,} dirty collections among "
        f"{logs:,} logs, CPU ≤ {CPU_TARGET:.0%} of one core at a {INTERVAL_S:.0f} s interval and "
        f"store requests per pass that do not depend on the dirty set; a "
        f"{o['outage_passes'] * INTERVAL_S / 60:.0f}-minute compactor outage stays bounded"
    )
    measured = (
        f"**{100 * top['cpu_median_s'] / INTERVAL_S:.2f} %** of a core (median pass, "
        f"{_ms(top['cpu_median_s']):.0f} ms CPU; worst {100 * top['cpu_max_s'] / INTERVAL_S:.2f} "
        f"%). At most {' / '.join(f'{n:,}' for n in most)} store requests in a pass at {sizes} "
        f"dirty (the pass before issue 24: one GET per dirty collection). Outage: the dirty log "
        f"held {max(s['retained'] for s in during):,} records at most, worst pass "
        f"{max(_ms(s['cpu_max_s']) for s in during):.0f} ms CPU; every log compacted "
        f"{o['catchup_passes']} passes after it. From `{data['command']}` "
        f"({m['date_utc']}, commit {m['git_head']}, load average "
        f"{m['loadavg_at_start'][0]:.1f})."
    )
    verdict = "**met** (§5)" if cpu_ok and outage_ok and kept else "**missed** (§5)"
    return f"| {target} | {measured} | {verdict} <!-- bench-row:rollup --> |"
