"""R6: the settle time (max(60 s, GC grace)) is assumed, not enforced: a write whose manifest
commit takes longer than 60 s after its mark (here: one slow manifest PUT, 62 s) has its mark
judged settled by a roll-up that runs meanwhile, clipped to the old tail and dropped; the write
is then acknowledged and the collection is in no dirty set.  In-process host, real clock (~65 s)."""
import asyncio, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import logging; logging.disable(logging.WARNING)
from host.wal3 import LocalStore
from host.wal3.faulty import FaultRule, FaultyStore
from tests.host.live import live_server, log_path, record, metrics_text, metric

CID = "00000000-0000-4000-8000-0000000000c1"

async def main():
    base = LocalStore(Path(tempfile.mkdtemp(prefix="r6-", dir=None)) / "store")
    faulty = FaultyStore(base, seed=1)
    async with live_server(store=faulty, gc_grace_s=0.0) as live:
        import httpx
        from tests.host.live import auth
        mk = lambda key: httpx.AsyncClient(base_url=live.url, headers=auth(key), timeout=120.0)
        async with mk("alice-key") as alice, mk("svc-key") as svc:
            r = await alice.post(log_path("alice", CID) + "/records", json={"records": [record(0)]})
            print("first append:", r.status_code, r.json())
            await svc.post("/v1/dirty/rollup")
            await svc.post(log_path("alice", CID) + "/compaction", json={"offset": 2})  # compacted
            rule = faulty.add_rule(FaultRule("latency", ops={"put"}, times=1, latency_s=62.0,
                                             key_regex=rf"logs/{CID}/manifest/MANIFEST$"))
            t0 = time.monotonic()
            slow = asyncio.create_task(alice.post(log_path("alice", CID) + "/records",
                                                  json={"records": [record(i) for i in range(1, 6)]}))
            await asyncio.sleep(61.0)
            r = await svc.post("/v1/dirty/rollup")
            print(f"roll-up at +{time.monotonic()-t0:.0f}s, write still in flight:",
                  [(e["collection_id"][-2:], e["start"], e["limit"]) for e in r.json()["logs"]])
            r = await slow
            print(f"slow append acknowledged at +{time.monotonic()-t0:.0f}s:", r.status_code, r.json())
            r = await svc.post("/v1/dirty/rollup")
            print("roll-up after it landed: dirty set =", r.json()["logs"])
            st = (await svc.get(log_path("alice", CID))).json()
            print("log state:", {k: st[k] for k in ("next_offset", "compaction_offset")})
            print("loghost_dirty_untracked_collections =",
                  metric(await metrics_text(svc), "loghost_dirty_untracked_collections"))
            if not r.json()["logs"]:
                print("VIOLATION: records [2, 7) acknowledged, uncompacted, in no dirty set")

asyncio.run(main())
