"""R2: two forks into the same target, interleaved.  Each writes the target's compaction cursor
and CURRENT.json 'replacing a leftover of a crashed attempt' (fork.py/forks.py assume nobody else
owns them before the manifest exists), but the other attempt is alive: the one that wins the
manifest ends up with the *loser's* cursor and compacted base.

Case 1 (two sources): the target holds source B's log [1, 6) but source A's cursor 11 and
CURRENT.json; GC then purges B's never-compacted records.
Case 2 (same source, retried with another offset around a compactor install): the target's log
starts at 11 but its cursor and CURRENT.json say 6: [6, 11) is not in the log.
Deterministic: interleaving forced with asyncio events inside the mark_dirty hook."""
import asyncio, json, sys, tempfile, uuid
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from host.forks import current_key, fork_collection
from host.manager import log_prefix
from host.wal3 import LocalStore, LogWriter, LogReader, Limits
from host.wal3.cursors import COMPACTION, CursorStore
from host.wal3.errors import LogExists, LogPurged
from host.wal3.gc import GarbageCollector, GcOptions
from host.wal3.layout import load_manifest

import contextvars
GATE = contextvars.ContextVar("GATE", default=None)

class GateStore:
    """Delegates to a store; in a task whose GATE is set, the first access to the target's compaction cursor waits."""
    def __init__(self, inner): self._inner = inner
    def __getattr__(self, name): return getattr(self._inner, name)
    async def _gate(self, key):
        g = GATE.get()
        if g is not None and key.endswith("cursor/compaction.json"):
            GATE.set(None); g[0].set(); await g[1].wait()
    async def get(self, key, *a, **kw):
        await self._gate(key); return await self._inner.get(key, *a, **kw)
    async def head(self, key, *a, **kw):
        await self._gate(key); return await self._inner.head(key, *a, **kw)
    async def put(self, key, data, **kw):
        await self._gate(key); return await self._inner.put(key, data, **kw)

U = lambda n: uuid.UUID(int=n, version=4)

async def mklog(store, cid, batches, n=5):
    w = await LogWriter.open(store, log_prefix(cid))
    for b in range(batches):
        await w.append_many([json.dumps({"id": f"{cid.int}-{b}-{i}", "op": "add"}).encode()
                             for i in range(n)])
    await w.close()

async def set_version(store, cid, version, offset):
    path = f"compacted/{cid}/v{version:016d}/part-x.parquet"
    await store.put(path, f"version {version} of {cid}".encode())
    await store.put(current_key(cid), json.dumps(
        {"version": version, "offset": offset, "rows": 1, "path": path}).encode())

async def fork(store, src, dst, offset, mark):
    m = (await load_manifest(store, log_prefix(src)))[0]
    return await fork_collection(store, source=src, target=dst, source_prefix=log_prefix(src),
                                 target_prefix=log_prefix(dst), source_manifest=m, offset=offset,
                                 writer_name="t", mark_dirty=mark)

async def interleave(store, first, second, between=None):
    """first runs to its dirty mark; second runs to its dirty mark (cursor + CURRENT written),
    then first commits its manifest, then second tries to."""
    a_marked, a_go, b_marked = asyncio.Event(), asyncio.Event(), asyncio.Event()
    async def mark_first(cid, s, n):
        a_marked.set(); await b_marked.wait()
    async def mark_second(cid, s, n):
        b_marked.set(); await a_go.wait()
    t1 = asyncio.create_task(first(mark_first))
    await a_marked.wait()
    if between: await between()
    t2 = asyncio.create_task(second(mark_second))
    r1 = await t1
    a_go.set()
    try:
        await t2; r2 = "committed"
    except LogExists as e:
        r2 = f"LogExists ({e})"
    return r1, r2

async def report(store, dst):
    m = (await load_manifest(store, log_prefix(dst)))[0]
    c = await CursorStore(store, log_prefix(dst), "t").load(COMPACTION)
    cur = json.loads((await store.get(current_key(dst))).data)
    print(f"  target log [{m.oldest_offset}, {m.next_offset}); compaction cursor {c.cursor.offset};"
          f" CURRENT.json offset {cur['offset']} path {cur['path']}")
    return m, c.cursor.offset

async def main():
    d = Path(tempfile.mkdtemp(prefix="r2-", dir=None))
    store = LocalStore(d / "s")
    print("case 1: two sources into one target")
    SA, SB, T = U(1), U(2), U(3)
    await mklog(store, SA, 3)          # [1, 16), compacted to 11
    await set_version(store, SA, 1, 11)
    await mklog(store, SB, 5, n=1)     # [1, 6), 5 fragments, never compacted
    r1, r2 = await interleave(store, lambda mk: fork(store, SB, T, 6, mk),
                              lambda mk: fork(store, SA, T, 16, mk))
    print("  fork SB->T:", (r1.compaction_offset, r1.start), "| fork SA->T:", r2)
    m, cursor = await report(store, T)
    assert cursor > m.next_offset
    w = await LogWriter.open(store, log_prefix(T))
    gc = GarbageCollector(store, log_prefix(T), GcOptions(grace_s=0), edit_manifest=w.edit_manifest)
    rep = await gc.run_once(); await gc.run_once()
    print("  GC on target: cutoff", rep.cutoff)
    try:
        await LogReader(store, log_prefix(T)).read(1, Limits(max_records=10), manifest=w.manifest)
        print("  read from 1 ok")
    except LogPurged as e:
        print("  read from 1 ->", repr(e))
    print("  VIOLATION: cursor", cursor, "> tail", m.next_offset,
          "; SB's never-compacted records below", w.manifest.oldest_offset, "are gone;"
          " base is SA's data")
    await w.close()

    print("case 2: same source, a retry with another offset while the first attempt is in flight,"
          " around a compactor install")
    S, T2 = U(4), U(5)
    await mklog(store, S, 3)           # [1, 16)
    await set_version(store, S, 1, 6)  # v1 @ 6
    gs = GateStore(store)
    l_reached, l_go = asyncio.Event(), asyncio.Event()
    w_marked, w_go, l_marked, l_go2 = asyncio.Event(), asyncio.Event(), asyncio.Event(), asyncio.Event()
    async def loser():
        GATE.set((l_reached, l_go))    # pause before it writes the target's cursor
        async def mk(cid, s, n): l_marked.set(); await l_go2.wait()
        return await fork(gs, S, T2, 6, mk)
    async def winner():
        async def mk(cid, s, n): w_marked.set(); await w_go.wait()
        return await fork(gs, S, T2, 11, mk)
    tl = asyncio.create_task(loser())
    await l_reached.wait()                 # attempt 1 read CURRENT.json (v1 @ 6), copied objects
    await set_version(store, S, 2, 11)     # a compactor installs v2 @ 11
    tw = asyncio.create_task(winner())     # attempt 2 (offset 11) reads v2 @ 11
    await w_marked.wait()                  # ... wrote cursor 11 and CURRENT v2
    l_go.set(); await l_marked.wait()      # attempt 1 writes cursor 6 and CURRENT v1
    w_go.set(); rw = await tw              # attempt 2 commits the manifest
    l_go2.set()
    try:
        await tl; rl = "committed"
    except LogExists as e:
        rl = "LogExists"
    print("  attempt (offset 11):", (rw.compaction_offset, rw.start), "| attempt (offset 6):", rl)
    m, cursor = await report(store, T2)
    print("  VIOLATION: cursor", cursor, "< oldest offset", m.oldest_offset,
          ": records [cursor, oldest) are not in the log; a compactor folding from CURRENT.json"
          " offset reads:")
    w = await LogWriter.open(store, log_prefix(T2))
    try:
        await LogReader(store, log_prefix(T2)).read(cursor, Limits(max_records=10), manifest=w.manifest)
    except LogPurged as e:
        print("   ", repr(e))
    await w.close()

asyncio.run(main())
