"""Same as b_, but a purely Rust-shaped plan (no created_us / applied_us): snapshots_to_make holds a
snapshot whose one fragment pointer names fragment 4's object while claiming range [2,5).  The
snapshot is internally consistent and matches snapshot_for_root exactly, so _check_before_apply
accepts it; the plan balances, first_to_keep=2 <= compaction cursor 3.  Phase 3 then deletes
fragments 1-3 (records 1..3; 3 is AT the compaction cursor)."""
import asyncio, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from gc_common import *
from dataclasses import replace
from host.wal3.fragment import fragment_path
from host.wal3.reader import SnapshotCache

P = "logs/b2"

def rust_plan(drop, make, root, start, limit, discard, ftk):
    return (b'{"snapshots_to_drop":[' + b",".join(p.json_bytes() for p in drop) +
            b'],"snapshots_to_make":[' + b",".join(s.to_bytes() for s in make) +
            b'],"snapshot_for_root":' + root.json_bytes() +
            b',"fragments_to_drop_start":%d,"fragments_to_drop_limit":%d,"fragments_are_uuids":false'
            b',"setsum_to_discard":"%s","first_to_keep":{"offset":%d}}'
            % (start, limit, discard.hexdigest().encode(), ftk))

async def main():
    store = await make_log(tmp(), P)
    await CursorStore(store, P, "t").init("compaction", 3)
    m = await manifest(store, P)
    s1 = m.snapshots[0]
    f4 = (await SnapshotCache().get(store, P, s1)).fragments[3]
    liar = replace(f4, start=2, content_md5=None)           # fragment 4's object, claimed as [2,5)
    liar = FragmentPointer(liar.path, liar.seq_no, 2, 5, liar.num_bytes, liar.setsum)
    T = Snapshot.build([liar], "garbage collection")
    T.check()
    plan = rust_plan([s1], [T], T.to_pointer(), 1, 4, s1.setsum - T.setsum, 2)
    await put_garbage(store, P, plan)
    clock = Clock()
    gc = GarbageCollector(store, P, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    print("run 1:", (await gc.run_once()).phase)
    clock.now += 61
    r = await gc.run_once()
    print("run 2:", r.phase, "fragments_deleted", r.fragments_deleted)
    for s in (1, 2, 3, 4):
        try:
            await store.head(join(P, fragment_path(s))); print(" fragment", s, "present")
        except Exception:
            print(" fragment", s, "DELETED")
    try:
        print(await read_from(store, P, 3))
    except BaseException as e:
        print("reader at compaction cursor 3:", type(e).__name__, str(e)[:100])

asyncio.run(main())
