"""R1: a fork that fails before its manifest leaves the target's compaction cursor (and a copied
CURRENT.json) behind; the target collection is later created by a plain append, inherits that
cursor, and GC purges acknowledged records that were never compacted.

Deterministic: in-process host (tests/host/live.py), LocalStore wrapped by FaultyStore; the only
fault is a transient 'error' on the target's manifest put (put_resolving's 4 attempts)."""
import asyncio, json, sys, tempfile, uuid
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from host.wal3 import LocalStore
from host.wal3.faulty import FaultRule, FaultyStore
from host.wal3.cursors import CursorStore, COMPACTION
from host.forks import current_key
from tests.host.live import live_server, log_path, record

SRC = "00000000-0000-4000-8000-000000000001"
DST = "00000000-0000-4000-8000-000000000002"

async def main() -> None:
    d = Path(tempfile.mkdtemp(prefix="r1-", dir=None))
    base = LocalStore(d / "store")
    faulty = FaultyStore(base, seed=1)
    async with live_server(store=faulty, gc_grace_s=0.0) as live:
        async with live.client("alice-key") as alice, live.client() as svc:
            for n in range(3):  # source [1, 16)
                r = await alice.post(log_path("alice", SRC) + "/records",
                                     json={"records": [record(f"s{n}-{i}") for i in range(5)]})
                assert r.status_code == 200, r.text
            # A compacted version of the source at offset 11 (as a compactor would leave it).
            path = f"compacted/{SRC}/v{1:016d}/part-x.parquet"
            await base.put(path, b"parquet bytes of the source's [1, 11)")
            await base.put(current_key(uuid.UUID(SRC)), json.dumps(
                {"version": 1, "offset": 11, "rows": 10, "path": path}).encode())
            r = await svc.post(log_path("alice", SRC) + "/compaction", json={"offset": 11})
            print("source compaction ->", r.status_code, r.json())

            # The fork hits a store outage on the target's manifest (its commit point).
            rule = faulty.add_rule(FaultRule("error", ops={"put"},
                                             key_regex=rf"{DST}/manifest/MANIFEST$", times=4))
            r = await svc.post(log_path("alice", SRC) + "/fork",
                               json={"target_collection_id": DST})
            print("fork ->", r.status_code, r.text[:160], "| fault fired", rule.fired)
            faulty.disable()
            c = await CursorStore(base, f"logs/{DST}", "x").load(COMPACTION)
            print("left behind: target compaction cursor =", c and c.cursor.offset,
                  "| target CURRENT.json =", json.loads((await base.get(current_key(uuid.UUID(DST)))).data))

            # The tenant gives up on the fork and writes the target collection itself.
            acked = []
            for n in range(3):
                r = await alice.post(log_path("alice", DST) + "/records",
                                     json={"records": [record(f"t{n}-{i}") for i in range(2)]})
                assert r.status_code == 200, r.text
                acked.append((r.json()["first_offset"], r.json()["next_offset"]))
            print("appends to target acknowledged at", acked)
            st = (await svc.get(log_path("alice", DST))).json()
            print("target state:", {k: st[k] for k in st if k in
                                    ("oldest_offset", "next_offset", "compaction_offset")})
            r = await svc.post(log_path("alice", DST) + "/gc")
            print("target gc ->", r.status_code, r.json())
            r = await alice.get(log_path("alice", DST) + "/records", params={"from_offset": 1})
            print("read target from 1 ->", r.status_code, r.text[:200])
            r = await svc.post("/v1/dirty/rollup")
            spans = {e["collection_id"]: (e["start"], e["limit"]) for e in r.json()["logs"]}
            print("dirty set after roll-up:", spans)
            print("VIOLATION: records", acked[0][0], "..", acked[-1][1] - 1,
                  "acknowledged, never compacted; cursor", c.cursor.offset,
                  "> tail", st["next_offset"], "; dirty span for target:", spans.get(DST))

asyncio.run(main())
