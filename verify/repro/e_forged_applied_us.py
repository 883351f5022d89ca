"""Rust applies a plan (manifest edited) and the plan file carries an applied_us far in the past
(forged, or left by anything that is not us).  We never saw it applied, yet phase 3 runs at once
(grace_s=300): a reader holding the pre-GC manifest loses its fragments mid-read."""
import asyncio, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from gc_common import *
from dataclasses import replace
from host.wal3.gc import plan_cut, GcReport
from host.wal3.reader import SnapshotCache

P = "logs/e"

async def main():
    store = await make_log(tmp(), P)
    await CursorStore(store, P, "t").init("compaction", 10)
    m0, etag = await load_manifest(store, P)
    reader = LogReader(store, P)                                   # a reader that loaded M0
    async def put(s): await store.put(join(P, s.path), s.to_bytes())
    g = await plan_cut(store, P, m0, 10, SnapshotCache(), "rust", put, keep_tail=True)
    await store.put(join(P, MANIFEST_PATH), g.apply(m0, "rust").to_bytes(), if_match=etag)  # "Rust" phase 2
    await put_garbage(store, P, replace(g, created_us=None, applied_us=1).to_bytes())
    clock = Clock()
    r = await GarbageCollector(store, P, GcOptions(grace_s=300, retain_fragments=0), clock=clock).run_once()
    print("first run_once, grace 300 s:", r.phase, "fragments_deleted", r.fragments_deleted,
          "snapshots_deleted", r.snapshots_deleted)
    try:
        print((await reader.read(1, manifest=m0))[:2])
    except BaseException as e:
        print("reader on M0:", type(e).__name__, str(e)[:80])

asyncio.run(main())
