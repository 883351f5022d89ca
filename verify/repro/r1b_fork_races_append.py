"""R1b: R1 without any fault: a tenant's first append to the target lands while the fork is between
its cursor write and its manifest.  The fork answers LogExists; the tenant's new log keeps the
fork's compaction cursor (11) and CURRENT.json: its records [1, 7) are below the cursor, never
compacted, and GC collects them."""
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

S, T = uuid.UUID(int=1, version=4), uuid.UUID(int=2, version=4)

async def main():
    store = LocalStore(Path(tempfile.mkdtemp(prefix="r1b-", dir=None)) / "s")
    w = await LogWriter.open(store, log_prefix(S))
    for b in range(3):
        await w.append_many([b'{"id":"s","op":"add"}'] * 5)
    await w.close()
    path = f"compacted/{S}/v{1:016d}/part-x.parquet"
    await store.put(path, b"S rows")
    await store.put(current_key(S), json.dumps({"version": 1, "offset": 11, "rows": 1, "path": path}).encode())

    async def mark(cid, first, count):
        # Meanwhile the tenant appends to T for the first time (what POST .../records does:
        # LogWriter.open creates the log).
        t = await LogWriter.open(store, log_prefix(T))
        for b in range(3):
            await t.append_many([b'{"id":"t","op":"add"}'] * 2)
        await t.close()

    m = (await load_manifest(store, log_prefix(S)))[0]
    try:
        await fork_collection(store, source=S, target=T, source_prefix=log_prefix(S),
                              target_prefix=log_prefix(T), source_manifest=m, offset=16,
                              writer_name="t", mark_dirty=mark)
    except LogExists as e:
        print("fork ->", repr(e))
    tm = (await load_manifest(store, log_prefix(T)))[0]
    c = await CursorStore(store, log_prefix(T), "t").load(COMPACTION)
    print(f"T: log [{tm.oldest_offset}, {tm.next_offset}) (the tenant's 6 records), compaction cursor {c.cursor.offset}")
    t = await LogWriter.open(store, log_prefix(T))
    gc = GarbageCollector(store, log_prefix(T), GcOptions(grace_s=0), edit_manifest=t.edit_manifest)
    rep = await gc.run_once(); await gc.run_once()
    try:
        await LogReader(store, log_prefix(T)).read(1, Limits(max_records=10), manifest=t.manifest)
    except LogPurged as e:
        print("after GC (cutoff %s): read from 1 ->" % rep.cutoff, repr(e))
        print("VIOLATION: acknowledged records never compacted were collected")
    await t.close()

asyncio.run(main())
