"""Scale: memory per open log, open/close cost, dirty-log bytes per fragment, roll-up time.

(a) Memory per open log.  A real ``loghost serve`` process (store on tmpfs, so opening 10,000
    logs takes seconds, not minutes; memory does not depend on the disk), idle close disabled,
    ``LOGHOST_MAX_OPEN_LOGS=20000``.  Logs are opened over HTTP by one small append each (32 at a
    time).  RSS (``/proc/PID/stat``) is sampled after 1 log (the code paths warm: "none") and at
    1k, 2.5k, 5k and 10k open logs; the server's ``loghost_open_logs`` gauge confirms the count.
    KiB per open log = (RSS at 10k - RSS at 1) / 9,999, and the least-squares slope over all
    samples.  Target: < 64 KiB.
(b) Open/close cost.  In-process, ``FaultyStore`` (no faults) over a ``LocalStore`` with fsync on
    the repository's disk: object-store requests per op from ``stats()``, and wall time per op,
    for the engine (``LogWriter.open`` of a new log, of an existing log, ``close``) and for the
    host (``LogManager.use(create=True)`` on a new collection, as the append path does, and the
    manager's flush-and-close of each log).
(c) Dirty-log bytes per fragment.  In-process server (``host.server.Server``) over a counting
    store: K collection-log fragments across N logs; every dirty-log record body must be exactly
    48 bytes; stored dirty-log bytes (fragment objects + manifest writes) per collection fragment.
(d) The incremental roll-up pass (issue 24) with 1,000 dirty logs among 100,000.  A LocalStore
    (fsync on for everything the roll-up writes) holding 100,000 collection logs created cheaply
    (TENANT, an empty manifest and a compaction cursor written directly as files), a dirty log (a
    real ``LogWriter`` on ``dirty/<id>``) with one mark for each dirty log, and ``RollUp.run()``
    with the server's defaults (head window, bounded fallbacks) through
    ``host.dirty.WalDirtyBackend`` and the server's own cursor lookup
    (``host.dirty.compaction_offsets_from_store``, only the fallback now).  Each run restarts the
    roll-up: the rebuild pass (folds the log from the cursor) and the next pass (nothing new: its
    head window).  1,000 dirty among 1,000 vs among 100,000 (the ratio should be ~1), then passes
    folding 100 / 1,000 / 10,000 new marks among 100,000 (after clear records emptied the set, as
    ``POST .../compaction`` writes them), and the rebuild of each.  Issue 24's own targets
    (100,000 dirty among 1,000,000, CPU per interval, an outage) are ``bench/rollup.py``'s.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import shutil
import statistics
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from . import common, loadgen

NAME = "scale"
TARGET_KIB = 64

FULL: dict[str, Any] = {
    "mem_points": [1, 1000, 2500, 5000, 10000],
    "open_n": 200,
    "dirty_logs": 100,
    "dirty_fragments": 2000,
    "rollup_total": 100_000,
    "rollup_dirty": 1000,
    "rollup_counts": [100, 1000, 10000],
    "rollup_repeats": 5,
    "untracked_counts": [500, 1000, 2000, 4000],
}
QUICK: dict[str, Any] = {
    "mem_points": [1, 400],
    "open_n": 20,
    "dirty_logs": 10,
    "dirty_fragments": 100,
    "rollup_total": 2000,
    "rollup_dirty": 100,
    "rollup_counts": [50, 100],
    "rollup_repeats": 1,
    "untracked_counts": [250, 500],
}


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scale")
    g.add_argument(
        "--scale-parts",
        default=None,
        help="comma-separated subset of memory,open,dirty,rollup (default: all)",
    )
    g.add_argument(
        "--scale-logs", type=int, default=None, help="open logs for the memory part (default 10000)"
    )
    g.add_argument(
        "--rollup-total",
        type=int,
        default=None,
        help="logs in the store for the roll-up part (default 100000)",
    )


# ------------------------------------------------------------------------------- stores


def counting_store(inner: Any) -> Any:
    """An ObjectStore wrapper counting requests and bytes per op and key class."""
    from wal3 import ObjectStore, paths

    class CountingStore(ObjectStore):
        def __init__(self) -> None:
            self.inner = inner
            self.ops: collections.Counter[str] = collections.Counter()
            self.bytes: collections.Counter[str] = collections.Counter()

        @staticmethod
        def klass(key: str) -> str:
            # logs/{cid}/... and dirty/{server}/...: the key inside the log is the third part.
            top, _, rest = key.partition("/")
            inside = rest.partition("/")[2]
            if inside == paths.MANIFEST_PATH:
                part = "manifest"
            elif inside.startswith(paths.LOG_PREFIX):
                part = "fragment"
            elif inside.startswith(paths.SNAPSHOT_PREFIX):
                part = "snapshot"
            elif inside.startswith(paths.CURSOR_PREFIX):
                part = "cursor"
            else:
                part = key.rsplit("/", 1)[-1]
            return f"{top}:{part}"

        def _count(self, op: str, key: str, n: int = 0) -> None:
            k = f"{op} {self.klass(key)}"
            self.ops[k] += 1
            self.bytes[k] += n

        async def get(self, key: str) -> Any:
            r = await inner.get(key)
            self._count("get", key, len(r.data))
            return r

        async def head(self, key: str) -> Any:
            self._count("head", key)
            return await inner.head(key)

        async def put(self, key: str, data: bytes, **kw: Any) -> str:
            etag: str = await inner.put(key, data, **kw)
            self._count("put", key, len(data))
            return etag

        async def delete(self, key: str) -> None:
            self._count("delete", key)
            await inner.delete(key)

        async def list(self, prefix: str, *, start_after: str | None = None) -> Any:
            self._count("list", prefix)
            async for m in inner.list(prefix, start_after=start_after):
                yield m

        async def copy(self, src: str, dst: str, **kw: Any) -> str:
            self._count("copy", dst)
            etag: str = await inner.copy(src, dst, **kw)
            return etag

        def url_for(self, key: str) -> str:
            return str(inner.url_for(key))

        async def close(self) -> None:
            await inner.close()

        def snapshot(self) -> tuple[collections.Counter[str], collections.Counter[str]]:
            return collections.Counter(self.ops), collections.Counter(self.bytes)

    return CountingStore()


def _settings(**kw: Any) -> Any:
    from host.config import Settings

    base: dict[str, Any] = {
        "api_keys": "benchkey=*",
        "server_id": "bench",
        "max_open_logs": 20000,
        "idle_close_s": 86400.0,
        "rollup_interval_s": 86400.0,
        "store": "unused",
    }
    base.update(kw)
    return Settings(**base)


def _diff(a: collections.Counter[str], b: collections.Counter[str]) -> dict[str, int]:
    return {k: b[k] - a[k] for k in sorted(set(a) | set(b)) if b[k] - a[k]}


# ------------------------------------------------------------------------------- (a) memory


def _open_logs_metric(base: str) -> int | None:
    with urllib.request.urlopen(base + "/metrics", timeout=30) as r:  # 127.0.0.1 only
        for line in r.read().decode().splitlines():
            if line.startswith("loghost_open_logs "):
                return int(float(line.split()[1]))
    return None


class _Probe:
    """GET /healthz every 100 ms on its own keep-alive connection: how long the event loop
    leaves a trivial request waiting (an event-loop stall shows as one slow probe)."""

    def __init__(self, port: int) -> None:
        import threading

        self.port = port
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                conn.request("GET", "/healthz")
                conn.getresponse().read()
            except OSError:
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=300)
                continue
            self.samples.append((t0, time.perf_counter() - t0))
            self._stop.wait(0.1)
        conn.close()

    def __enter__(self) -> _Probe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=600)

    def max_since(self, t0: float) -> float:
        return max((lat for t, lat in self.samples if t >= t0), default=float("nan"))


def _timed_rollup(base: str) -> float:
    req = urllib.request.Request(
        base + "/v1/dirty/rollup",
        data=b"",
        method="POST",
        headers={"Authorization": f"Bearer {loadgen.API_KEY}"},
    )
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:  # 127.0.0.1 only
        r.read()
    return time.perf_counter() - t0


def memory_part(points: list[int], work: Path, rollup_probe: bool) -> dict[str, Any]:
    shm = common.tmpfs_dir()
    base_dir = Path(tempfile.mkdtemp(prefix="scale-mem-", dir=shm)) if shm else work / "mem"
    samples = []
    # The periodic roll-up is pushed out of the way (its bookkeeping is quadratic in open logs,
    # see the roll-up rows below) so that opening 10,000 logs measures opening, not stalls.
    env = {"LOGHOST_ROLLUP_INTERVAL_S": "86400"}
    try:
        with loadgen.ServerProcess("host", base_dir, env=env) as srv, _Probe(srv.port) as probe:
            time.sleep(0.5)
            _, rss_fresh = srv.cpu_rss()
            paths = loadgen.log_paths(max(points), "mem", salt=0xA)
            body = loadgen.append_body(1)
            done = 0
            for target in points:
                t0 = time.perf_counter()
                opened = loadgen.open_logs(srv.base, paths[done:target], body, concurrency=32)
                el = time.perf_counter() - t0
                done = target
                time.sleep(1.0)  # let background work (dirty-log batches) settle
                _, rss = srv.cpu_rss()
                gauge = _open_logs_metric(srv.base)
                sample = {
                    "logs": target,
                    "rss": rss,
                    "open_logs_gauge": gauge,
                    "open_seconds": el,
                    "errors": opened["errors"],
                    "opens_per_s": opened["opens_per_s"],
                    "probe_max_opening_s": probe.max_since(t0),
                }
                if rollup_probe:
                    # POST /v1/dirty/rollup = what the server's roll-up loop runs every 10 s.
                    t1 = time.perf_counter()
                    sample["rollup_s"] = _timed_rollup(srv.base)
                    time.sleep(0.25)
                    sample["probe_max_rollup_s"] = probe.max_since(t1 - 0.2)
                samples.append(sample)
                print(
                    f"  . memory: {target:6} logs open (gauge {gauge}), RSS "
                    f"{rss / 2**20:.1f} MiB, opened at {opened['opens_per_s']:.0f}/s"
                    + (
                        f"; POST /v1/dirty/rollup {sample['rollup_s']:.2f} s, /healthz waited "
                        f"up to {sample['probe_max_rollup_s']:.2f} s"
                        if rollup_probe
                        else ""
                    ),
                    flush=True,
                )
    finally:
        if shm:
            shutil.rmtree(base_dir, ignore_errors=True)
    xs = [s["logs"] for s in samples]
    ys = [s["rss"] for s in samples]
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    den = sum((x - mx) ** 2 for x in xs)
    slope = (
        sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den if den else float("nan")
    )
    per = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if xs[-1] > xs[0] else float("nan")
    return {
        "store": "tmpfs" if shm else "disk",
        "rss_fresh": rss_fresh,
        "samples": samples,
        "kib_per_log": per / 1024,
        "kib_per_log_fit": slope / 1024,
    }


async def untracked_part(counts: list[int]) -> list[dict[str, Any]]:
    """Time ``Server.untracked_collections`` (run after every roll-up, on the event loop) with
    N open logs.  The handles are synthetic (``LogHandle`` objects without writers, injected into
    the manager) so that N can grow without opening N logs; the function is the server's own."""
    from host.manager import LogHandle
    from host.server import Server
    from wal3 import LocalStore

    shm = common.tmpfs_dir()
    root = Path(tempfile.mkdtemp(prefix="scale-untracked-", dir=shm))
    out = []
    try:
        server = Server(_settings(), store=LocalStore(root, fsync=False))
        await server.start()
        try:
            for n in counts:
                cids = [uuid.uuid4() for _ in range(n)]
                for cid in cids:
                    # A bare handle (no writer, reader or cursors): only its id and offset are read.
                    bare = LogHandle(cid, "bench", None, None, None, 1, 0.0)  # type: ignore[arg-type]
                    server.manager._open[cid] = bare
                known = dict.fromkeys(cids, 2)
                t0 = time.perf_counter()
                missing = server.untracked_collections(known)
                el = time.perf_counter() - t0
                out.append({"open_logs": n, "seconds": el, "untracked": len(missing)})
                print(
                    f"  . Server.untracked_collections with {n:,} open logs: {el * 1e3:.0f} ms",
                    flush=True,
                )
                server.manager._open.clear()
        finally:
            await server.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------- (b) open/close


async def open_close_part(n: int, work: Path) -> dict[str, Any]:
    from host.server import Server
    from wal3 import FaultyStore, LocalStore, LogWriter, LogWriterOptions

    out: dict[str, Any] = {}
    root = work / "openclose"
    faulty = FaultyStore(LocalStore(root), seed=0)
    opts = LogWriterOptions(writer_name="bench")

    def req() -> collections.Counter[str]:
        return collections.Counter(faulty.stats()["requests"])

    async def phase(name: str, fn: Any, items: list[Any]) -> Any:
        r0 = req()
        t0 = time.perf_counter()
        res = [await fn(x) for x in items]
        el = time.perf_counter() - t0
        d = _diff(r0, req())
        out[name] = {
            "n": len(items),
            "ms_per_op": el / len(items) * 1e3,
            "requests": {k: v / len(items) for k, v in d.items()},
            "requests_per_op": sum(d.values()) / len(items),
        }
        return res

    try:
        prefixes = [f"bench/{uuid.uuid4().hex[:12]}" for _ in range(n)]
        writers = await phase(
            "engine: open new log", lambda p: LogWriter.open(faulty, p, opts), prefixes
        )
        await phase("engine: close (no appends)", lambda w: w.close(), writers)
        writers = await phase(
            "engine: open existing log", lambda p: LogWriter.open(faulty, p, opts), prefixes
        )
        r0 = req()
        await asyncio.gather(*(w.append(b"x" * 100) for w in writers))
        out["(one 100 B append per open log)"] = {
            "n": n,
            "ms_per_op": float("nan"),
            "requests": {k: v / n for k, v in _diff(r0, req()).items()},
            "requests_per_op": sum(_diff(r0, req()).values()) / n,
        }
        await phase("engine: close (after an append)", lambda w: w.close(), writers)

        # The host's open: bind the tenant, claim the hint (none here), open the writer, load the
        # compaction cursor -- LogManager.use(create=True), exactly as POST .../records does.
        server = Server(_settings(), store=faulty)
        await server.start()
        try:
            cids = [uuid.uuid4() for _ in range(n)]

            async def host_open(cid: uuid.UUID) -> None:
                async with server.manager.use(cid, "bench", create=True):
                    pass

            await phase("host: open new collection (LogManager.use, create)", host_open, cids)
            r0, t0 = req(), time.perf_counter()
            await server.manager.close()  # flush-and-close every open log, as on shutdown
            el = time.perf_counter() - t0
            d = _diff(r0, req())
            out["host: close (LogManager.close, all at once)"] = {
                "n": n,
                "ms_per_op": el / n * 1e3,
                "requests": {k: v / n for k, v in d.items()},
                "requests_per_op": sum(d.values()) / n,
            }
        finally:
            await server.close()
    finally:
        await faulty.close()
        shutil.rmtree(root, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------- (c) dirty bytes


async def dirty_bytes_part(n_logs: int, n_frags: int, work: Path) -> dict[str, Any]:
    from dirtylog import DirtyRecord
    from host.server import Server
    from wal3 import LocalStore
    from wal3.paths import dirty_prefix

    shm = common.tmpfs_dir()
    root = Path(tempfile.mkdtemp(prefix="scale-dirty-", dir=shm or work))
    results: dict[str, Any] = {}
    try:
        for mode in ("serial", "concurrent"):
            store = counting_store(LocalStore(root / mode, fsync=False))
            server = Server(_settings(), store=store)
            await server.start()
            try:
                cids = [uuid.uuid4() for _ in range(n_logs)]
                for cid in cids:  # open first, so the counters only see appends
                    async with server.manager.use(cid, "bench", create=True):
                        pass
                ops0, bytes0 = store.snapshot()
                frags0 = dict.fromkeys(cids, 0)

                async def one(cid: uuid.UUID, k: int, server: Any = server) -> None:
                    async with server.manager.use(cid, "bench", create=True) as h:
                        for _ in range(k):
                            await h.writer.append(b'{"id":"x","op":"add"}')

                per = n_frags // n_logs
                if mode == "serial":
                    for cid in cids:
                        await one(cid, per)
                else:
                    await asyncio.gather(*(one(c, per) for c in cids))
                ops1, bytes1 = store.snapshot()
                handles = {h.collection_id: h for h in server.manager.handles()}
                frags = sum(handles[c].writer.stats["fragments_written"] - frags0[c] for c in cids)
                dops, dbytes = _diff(ops0, ops1), _diff(bytes0, bytes1)
                # Read back every dirty-log record written during the run.
                assert server.dirty is not None
                backend = server.dirty.backend
                recs = await backend.read(await backend.oldest_offset(), 1 << 30)
                sizes = collections.Counter(len(b) for _, b in recs)
                kinds = collections.Counter(DirtyRecord.decode(b).kind.name for _, b in recs)
                dirty_frag_bytes = dbytes.get("put dirty:fragment", 0)
                dirty_man_bytes = dbytes.get("put dirty:manifest", 0)
                results[mode] = {
                    "logs": n_logs,
                    "collection_fragments": frags,
                    "dirty_records": len(recs),
                    "record_sizes": dict(sizes),
                    "record_kinds": dict(kinds),
                    "dirty_fragment_puts": dops.get("put dirty:fragment", 0),
                    "dirty_manifest_puts": dops.get("put dirty:manifest", 0),
                    "dirty_fragment_bytes": dirty_frag_bytes,
                    "dirty_manifest_bytes": dirty_man_bytes,
                    "collection_fragment_bytes": dbytes.get("put logs:fragment", 0),
                    "collection_manifest_bytes": dbytes.get("put logs:manifest", 0),
                    "dirty_bytes_per_fragment": (dirty_frag_bytes + dirty_man_bytes) / frags,
                    "dirty_fragment_bytes_per_fragment": dirty_frag_bytes / frags,
                    "dirty_manifest_bytes_per_fragment": dirty_man_bytes / frags,
                    "marks_per_dirty_fragment": len(recs)
                    / max(1, dops.get("put dirty:fragment", 0)),
                    "prefix": dirty_prefix("bench"),
                }
                print(
                    f"  . dirty log ({mode}): {frags} fragments over {n_logs} logs -> "
                    f"{len(recs)} records of sizes {dict(sizes)}, "
                    f"{results[mode]['dirty_bytes_per_fragment']:.0f} stored B/fragment",
                    flush=True,
                )
            finally:
                await server.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


# ------------------------------------------------------------------------------- (d) roll-up


def _make_logs(root: Path, cids: list[uuid.UUID]) -> float:
    """Write each collection log's TENANT, empty manifest and compaction cursor as plain files."""
    from wal3 import paths
    from wal3.cursors import COMPACTION, Cursor
    from wal3.manifest import Manifest

    t0 = time.perf_counter()
    manifest = Manifest.empty("bench").to_bytes()
    tenant = json.dumps({"tenant": "bench"}).encode()
    cursor = Cursor(offset=1, epoch_us=time.time_ns() // 1000, writer="bench").to_bytes()
    objects = (
        (paths.TENANT_PATH, tenant),
        (paths.MANIFEST_PATH, manifest),
        (paths.cursor_path(COMPACTION), cursor),
    )
    subdirs = sorted({os.path.dirname(rel) for rel, _ in objects} - {""})
    os.makedirs(root / paths.LOGS_PREFIX, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    for cid in cids:
        d = f"{root}/{paths.log_prefix(cid)}"  # LocalStore: a key is a path
        os.mkdir(d)
        for sub in subdirs:
            os.mkdir(f"{d}/{sub}")
        for rel, data in objects:
            fd = os.open(f"{d}/{rel}", flags, 0o644)
            os.write(fd, data)
            os.close(fd)
    return time.perf_counter() - t0


class _Offsets:
    """The server's ``CompactionOffsets``, with no open logs: every cursor comes from the store.
    The incremental pass calls it only as its bounded fallback (``max_compaction_lookups``)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls = 0
        self.ids = 0

    async def compaction_offsets(self, ids: Any) -> dict[uuid.UUID, int]:
        from host.dirty import compaction_offsets_from_store
        from wal3.paths import log_prefix

        self.calls += 1
        self.ids += len(ids)
        return await compaction_offsets_from_store(self.store, ids, log_prefix, {})


class _RollupEnv:
    def __init__(self, root: Path, total: int) -> None:
        self.root = root
        self.total = total
        self.cids = [uuid.uuid4() for _ in range(total)]
        self.make_s = _make_logs(root, self.cids)
        self.pos = 1  # where the next marks start in every collection log

    async def __aenter__(self) -> _RollupEnv:
        from host.dirty import WalDirtyBackend
        from wal3 import FaultyStore, LocalStore, LogWriter, LogWriterOptions
        from wal3.gc import GcOptions
        from wal3.paths import dirty_prefix

        self.store = FaultyStore(LocalStore(self.root), seed=0)
        prefix = dirty_prefix("bench")
        self.writer = await LogWriter.open(
            self.store, prefix, LogWriterOptions(writer_name="loghost:bench")
        )
        self.backend = WalDirtyBackend(
            self.store, prefix, self.writer, GcOptions(writer_name="loghost-gc:bench")
        )
        self.offsets = _Offsets(self.store)
        self.restart()
        return self

    def restart(self) -> None:
        """A new ``RollUp`` (the server's defaults: window, bounded fallbacks), as after a host
        restart: its first pass rebuilds the dirty set from the ``stable_prefix`` cursor.

        Its monotonic clock stands still, so no mark settles (a real one would after 60 s) and
        no pass reads a log tail: the logs' empty manifests would clip every settled mark.  The
        tail fallback, bounded per pass, is measured by ``python -m bench --only rollup``."""
        from dirtylog import RollUp

        self.rollup = RollUp(self.backend, self.offsets, monotonic=lambda: 0.0)

    async def __aexit__(self, *exc: object) -> None:
        await self.writer.close()
        await self.store.close()

    async def mark(self, dirty: int) -> None:
        """One 10-record mark for each of the first ``dirty`` logs, from ``pos``."""
        from dirtylog import DirtyRecord

        now = time.time_ns() // 1000
        bodies = [DirtyRecord.mark(c, self.pos, 10, now).encode() for c in self.cids[:dirty]]
        await self._append(bodies)

    async def clear_all(self) -> None:
        """What ``POST .../compaction`` does for every dirty log (compacted past the marks):
        the clear records, batched, and the same note in memory."""
        from dirtylog import DirtyRecord

        now = time.time_ns() // 1000
        floor = self.pos + 10
        ids = list(self.rollup.entries())
        for cid in ids:
            self.rollup.note_compacted(cid, floor)
        await self._append([DirtyRecord.compacted(c, floor, now).encode() for c in ids])
        self.pos = floor

    async def _append(self, bodies: list[bytes]) -> None:
        for i in range(0, len(bodies), 1024):
            await self.backend.append_many(bodies[i : i + 1024])

    async def timed_run(self) -> dict[str, Any]:
        r0 = collections.Counter(self.store.stats()["requests"])
        c0 = self.offsets.ids
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        res = await self.rollup.run()
        cpu = time.process_time() - cpu0
        el = time.perf_counter() - t0
        d = _diff(r0, collections.Counter(self.store.stats()["requests"]))
        return {
            "seconds": el,
            "cpu_s": cpu,
            "entries": len(res.entries),
            "rebuilt": res.rebuilt,
            "records_read": res.records_read,
            "window": res.window,
            "relogged": res.relogged,
            "reinserted": res.reinserted,
            "retained": res.retained,
            "cursor_lookups": self.offsets.ids - c0,
            "tail_lookups": res.tail_lookups,
            "requests": d,
            "requests_total": sum(d.values()),
        }


async def rollup_part(
    total: int, dirty: int, counts: list[int], repeats: int, work: Path
) -> dict[str, Any]:
    shm = common.tmpfs_dir()
    out: dict[str, Any] = {
        "pass": "incremental",
        "total": total,
        "dirty": dirty,
        "store": "tmpfs" if shm else "disk",
    }
    base = Path(tempfile.mkdtemp(prefix="scale-rollup-", dir=shm or work))
    disk_base = Path(tempfile.mkdtemp(prefix="scale-rollup-", dir=work))
    try:
        small = _RollupEnv(base / "small", dirty)
        big = _RollupEnv(base / "big", total)
        # The same small case on the repository's disk: what tmpfs hides (fsync, metadata).
        disk = _RollupEnv(disk_base / "disk", dirty)
        out["make_small_s"], out["make_big_s"] = small.make_s, big.make_s
        print(
            f"  . roll-up: wrote {dirty:,} logs in {small.make_s:.1f} s and {total:,} logs in "
            f"{big.make_s:.1f} s",
            flush=True,
        )
        runs: dict[str, list[dict[str, Any]]] = {"small": [], "big": [], "disk": []}
        steady: dict[str, list[dict[str, Any]]] = {"small": [], "big": [], "disk": []}
        async with small as s, big as b, disk as k:
            await s.mark(dirty)
            await b.mark(dirty)
            await k.mark(dirty)
            for env in (s, b, k):  # warm-up (imports, thread pools, first encode), untimed
                await env.timed_run()
            # Alternate the stores so drift in the machine's load hits them alike.  Each repeat
            # restarts the roll-up: its first pass is the rebuild (it folds every record from
            # the cursor: the dirty set and the window's relogs of earlier passes); the pass after
            # it has nothing new to fold (its work is the head window).
            for _ in range(repeats):
                for name, env in (("small", s), ("big", b), ("disk", k)):
                    env.restart()
                    r = await env.timed_run()
                    runs[name].append(r)
                    q = await env.timed_run()
                    steady[name].append(q)
                    print(
                        f"  . roll-up: {dirty:,} dirty among {env.total:,} ({name}): rebuild "
                        f"{r['seconds'] * 1e3:.0f} ms ({r['records_read']} records read, "
                        f"{r['requests_total']} store requests), then a pass with nothing new "
                        f"{q['seconds'] * 1e3:.0f} ms ({q['relogged']} relogged, "
                        f"{q['requests_total']} store requests)",
                        flush=True,
                    )
            out["runs"] = runs
            out["steady"] = steady
            out["median_small_s"] = statistics.median(r["seconds"] for r in runs["small"])
            out["median_big_s"] = statistics.median(r["seconds"] for r in runs["big"])
            out["median_disk_s"] = statistics.median(r["seconds"] for r in runs["disk"])
            out["ratio"] = out["median_big_s"] / out["median_small_s"]
            # The incremental pass vs new marks, among ``total`` logs: each count starts from an
            # empty set (clear records for every dirty log, one pass), then ``n`` fresh marks and
            # the pass that folds them; then a restart and its rebuild of those ``n``.
            by_count = []
            for n in counts:
                await b.clear_all()
                await b.timed_run()
                await b.mark(n)
                r = await b.timed_run()
                r["dirty"] = n
                b.restart()
                rb = await b.timed_run()
                r["rebuild"] = rb
                by_count.append(r)
                print(
                    f"  . roll-up: {n:,} new marks among {total:,}: pass {r['seconds'] * 1e3:.0f} "
                    f"ms ({r['relogged']} relogged, {r['cursor_lookups']} cursor lookups); "
                    f"rebuild {rb['seconds'] * 1e3:.0f} ms ({rb['records_read']} records read)",
                    flush=True,
                )
            out["by_count"] = by_count
    finally:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(disk_base, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------- running


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    cfg = dict(QUICK if quick else FULL)
    parts = (getattr(args, "scale_parts", None) or "memory,open,dirty,rollup").split(",")
    if getattr(args, "scale_logs", None):
        top = args.scale_logs
        cfg["mem_points"] = sorted({1, *[p for p in cfg["mem_points"] if p < top], top})
    if getattr(args, "rollup_total", None):
        cfg["rollup_total"] = args.rollup_total
    data: dict[str, Any] = {
        "benchmark": NAME,
        "quick": quick,
        "command": common.command_line(),
        "machine": common.machine_info(),
        "config": cfg,
    }
    with common.scratch_dir("scale") as work:
        if "memory" in parts:
            data["memory"] = memory_part(cfg["mem_points"], work, True)
            data["untracked"] = asyncio.run(untracked_part(cfg["untracked_counts"]))
        if "open" in parts:
            data["open_close"] = asyncio.run(open_close_part(cfg["open_n"], work))
            for k, v in data["open_close"].items():
                print(
                    f"  . {k}: {v['requests_per_op']:.2f} requests, {v['ms_per_op']:.2f} ms",
                    flush=True,
                )
        if "dirty" in parts:
            data["dirty"] = asyncio.run(
                dirty_bytes_part(cfg["dirty_logs"], cfg["dirty_fragments"], work)
            )
        if "rollup" in parts:
            data["rollup"] = asyncio.run(
                rollup_part(
                    cfg["rollup_total"],
                    cfg["rollup_dirty"],
                    cfg["rollup_counts"],
                    cfg["rollup_repeats"],
                    work,
                )
            )
    if "memory" in data:
        data["plot"] = str(plot(data, common.img_path("scale_memory", quick)))
    return data


# ------------------------------------------------------------------------------- rendering


def render(data: dict[str, Any]) -> str:
    out: list[str] = []
    mem = data.get("memory")
    if mem:
        out.append(
            f"(a) Memory per open log: `loghost serve` with its store on "
            f"{mem['store']}, logs opened over HTTP by one 1-record append each "
            f"(32 at a time); RSS from /proc.  Fresh server: "
            f"{mem['rss_fresh'] / 2**20:.1f} MiB."
        )
        out.append("")
        out.append(
            common.md_table(
                [
                    "open logs",
                    "loghost_open_logs gauge",
                    "RSS MiB",
                    "KiB per log over the first",
                    "opened/s (HTTP, tmpfs)",
                    "POST /v1/dirty/rollup s",
                    "longest /healthz wait during it s",
                ],
                [
                    [
                        s["logs"],
                        s["open_logs_gauge"],
                        s["rss"] / 2**20,
                        (
                            (s["rss"] - mem["samples"][0]["rss"])
                            / 1024
                            / (s["logs"] - mem["samples"][0]["logs"])
                        )
                        if s["logs"] > mem["samples"][0]["logs"]
                        else None,
                        s["opens_per_s"],
                        s.get("rollup_s"),
                        s.get("probe_max_rollup_s"),
                    ]
                    for s in mem["samples"]
                ],
            )
        )
        out.append("")
        top = mem["samples"][-1]["logs"]
        verdict = "PASS" if mem["kib_per_log"] < TARGET_KIB else "MISS"
        out.append(
            f"- target: idle open logs cost under {TARGET_KIB} KiB each: "
            f"**{mem['kib_per_log']:.1f} KiB** per open log at {top:,} "
            f"(least-squares slope {mem['kib_per_log_fit']:.1f} KiB) -> {verdict} "
            f"({mem['kib_per_log'] / TARGET_KIB:.2f} of the budget)."
        )
        out.append("")
    un = data.get("untracked")
    if un:
        out.append(
            "After every roll-up (every `rollup_interval_s`, 10 s by default) the server "
            "runs `Server.untracked_collections` on its event loop.  For each open log it "
            "calls `_compaction_of`, which scans `manager.handles()`: O(open logs^2). "
            "Timed in-process with synthetic handles:"
        )
        out.append("")
        base = un[0]
        out.append(
            common.md_table(
                ["open logs", "ms (event loop blocked)", "ratio to first", "(logs ratio)^2"],
                [
                    [
                        u["open_logs"],
                        u["seconds"] * 1e3,
                        u["seconds"] / base["seconds"],
                        (u["open_logs"] / base["open_logs"]) ** 2,
                    ]
                    for u in un
                ],
            )
        )
        out.append("")
    oc = data.get("open_close")
    if oc:
        out.append(
            "(b) Open/close cost: FaultyStore (no faults) over LocalStore with fsync, "
            "in-process, sequential; object-store requests per operation by kind:"
        )
        out.append("")
        out.append(
            common.md_table(
                ["operation", "n", "ms per op", "requests per op", "by kind"],
                [
                    [
                        k,
                        v["n"],
                        v["ms_per_op"],
                        v["requests_per_op"],
                        ", ".join(f"{op} {c:g}" for op, c in v["requests"].items()),
                    ]
                    for k, v in oc.items()
                ],
            )
        )
        out.append("")
    dirty = data.get("dirty")
    if dirty:
        out.append(
            "(c) Dirty-log bytes per fragment (in-process server, counting store): every "
            "collection-log fragment appends one mark to the server's dirty log."
        )
        out.append("")
        rows = []
        for mode, d in dirty.items():
            rows.append(
                [
                    mode,
                    d["logs"],
                    d["collection_fragments"],
                    d["dirty_records"],
                    ", ".join(f"{k} B x {v}" for k, v in d["record_sizes"].items()),
                    d["dirty_fragment_puts"],
                    d["marks_per_dirty_fragment"],
                    d["dirty_fragment_bytes_per_fragment"],
                    d["dirty_manifest_bytes_per_fragment"],
                    d["dirty_bytes_per_fragment"],
                ]
            )
        out.append(
            common.md_table(
                [
                    "appends",
                    "logs",
                    "collection fragments",
                    "dirty records",
                    "record body sizes",
                    "dirty fragment puts",
                    "marks per dirty fragment",
                    "dirty fragment B/frag",
                    "dirty manifest B/frag",
                    "dirty stored B/frag",
                ],
                rows,
            )
        )
        out.append("")
        seen = sorted({int(k) for d in dirty.values() for k in d["record_sizes"]})
        out.append(
            f"- dirty-log record bodies are exactly 48 bytes: "
            f"{'PASS' if seen == [48] else 'MISS'} (body sizes seen: {seen})."
        )
        out.append("")
    ru = data.get("rollup")
    if ru and ru.get("pass") == "incremental":
        out.extend(_render_rollup(ru))
    elif ru:
        out.append(
            "(d) Roll-up: these results are from the full pass before issue 24's incremental "
            "one; rerun `python -m bench --only scale --scale-parts rollup` to measure it."
        )
    return "\n".join(out)


def _render_rollup(ru: dict[str, Any]) -> list[str]:
    """Part (d): the incremental pass (issue 24) against dirty logs and logs in the store."""
    out = [
        f"(d) Roll-up (`RollUp.run()` over `WalDirtyBackend`, the server's defaults: head window "
        f"and bounded fallbacks; LocalStore with fsync on {ru.get('store', 'disk')}): "
        f"{ru['dirty']:,} dirty logs among {ru['dirty']:,} vs among {ru['total']:,} logs in the "
        f"store (created in {ru['make_big_s']:.0f} s as plain files), and the small case again "
        f"on the repository's disk.  Each run restarts the roll-up: its first pass rebuilds the "
        f"set from the cursor, the next has nothing new to fold (its work is the head window).  "
        f"Runs alternate between the stores:",
        "",
    ]
    rows = []
    where = ru.get("store", "disk")
    for name, total, label in (
        ("small", ru["dirty"], where),
        ("big", ru["total"], where),
        ("disk", ru["dirty"], "repository disk"),
    ):
        for i, (r, q) in enumerate(zip(ru["runs"][name], ru["steady"][name], strict=True)):
            rows.append(
                [
                    f"{ru['dirty']:,} dirty among {total:,} ({label})",
                    i + 1,
                    r["seconds"] * 1e3,
                    r["records_read"],
                    r["requests_total"],
                    q["seconds"] * 1e3,
                    q["relogged"],
                    q["cursor_lookups"],
                    q["requests_total"],
                ]
            )
    out.append(
        common.md_table(
            [
                "case",
                "run",
                "rebuild ms",
                "records read",
                "store requests",
                "next pass ms",
                "relogged",
                "cursor lookups",
                "store requests",
            ],
            rows,
        )
    )
    out.append("")
    out.append(
        common.md_table(
            [
                f"new marks (among {ru['total']:,} logs)",
                "pass ms",
                "µs per new mark",
                "relogged",
                "cursor lookups",
                "store requests",
                "rebuild ms",
                "rebuild records read",
            ],
            [
                [
                    r["dirty"],
                    r["seconds"] * 1e3,
                    r["seconds"] / r["dirty"] * 1e6,
                    r["relogged"],
                    r["cursor_lookups"],
                    r["requests_total"],
                    r["rebuild"]["seconds"] * 1e3,
                    r["rebuild"]["records_read"],
                ]
                for r in ru["by_count"]
            ],
        )
    )
    out.append("")
    lookups = max(
        [q["cursor_lookups"] for qs in ru["steady"].values() for q in qs]
        + [r["cursor_lookups"] for r in ru["by_count"]]
    )
    out.append(
        f"- rebuild with {ru['dirty']:,} dirty among {ru['total']:,} vs among "
        f"{ru['dirty']:,}: **{ru['ratio']:.2f}** (medians {ru['median_big_s'] * 1e3:.0f} vs "
        f"{ru['median_small_s'] * 1e3:.0f} ms): the cost follows the dirty log, not the logs in "
        f"the store.  No pass read more than {lookups} compaction cursors (the bounded fallback; "
        f"compactions arrive as clear records)."
    )
    return out


def plot(data: dict[str, Any], path: Any) -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mem = data["memory"]
    fig, axes = plt.subplots(1, 2 if data.get("rollup") else 1, figsize=(11, 4.2), squeeze=False)
    ax = axes[0][0]
    xs = [s["logs"] for s in mem["samples"]]
    ys = [s["rss"] / 2**20 for s in mem["samples"]]
    ax.plot(xs, ys, "o-", label="loghost serve RSS")
    base = ys[0]
    ax.plot(
        xs,
        [base + (x - xs[0]) * TARGET_KIB / 1024 for x in xs],
        "--",
        color="tab:red",
        alpha=0.6,
        label=f"budget: {TARGET_KIB} KiB per open log",
    )
    ax.set_xlabel("open logs")
    ax.set_ylabel("RSS (MiB)")
    ax.set_title(f"memory vs open logs: {mem['kib_per_log']:.1f} KiB per log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ru = data.get("rollup")
    if ru:
        ax = axes[0][1]
        bc = ru["by_count"]
        incremental = ru.get("pass") == "incremental"
        ax.plot(
            [r["dirty"] for r in bc],
            [r["seconds"] * 1e3 for r in bc],
            "o-",
            label=f"{'pass folding the new marks' if incremental else 'dirty'}, "
            f"among {ru['total']:,} logs",
        )
        if incremental:
            ax.plot(
                [r["dirty"] for r in bc],
                [r["rebuild"]["seconds"] * 1e3 for r in bc],
                "^--",
                label="rebuild after a restart",
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("new marks" if incremental else "dirty logs")
        ax.set_ylabel("roll-up time (ms)")
        ax.set_title("roll-up pass time vs new marks" if incremental else "roll-up time")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"scale ({data['machine']['nproc']} cores, {data['machine']['date_utc']})", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
