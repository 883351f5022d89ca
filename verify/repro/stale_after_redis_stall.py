"""Stale reads with no end after a sub-second Redis stall: host A keeps answering from memory a
manifest that host B advanced (B failed open while Redis did not answer; A never noticed)."""
import asyncio, sys, tempfile, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent)); sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from redis_common import Redis, pause, resume
from tests.host.live import live_server, CID

P = f"/v1/tenants/alice/logs/{CID}"
REC = lambda i: {"records": [{"id": str(i), "op": "add"}]}

async def ids(c):
    r = await c.get(P + "/records", params={"from": 1, "limit": 100}, follow_redirects=False)
    if r.status_code != 200:
        return f"{r.status_code} -> {r.headers.get('location', '')[:30]}"
    return [x["record"]["id"] for x in r.json()["records"]]

async def main():
    tmp = tempfile.mkdtemp(prefix="adv2-stall-")
    rd = Redis(tmp); rd.start()
    store = f"{tmp}/store"
    try:
        kw = dict(redis_url=rd.url, leader_ttl_ms=15000)  # renewals every 5 s
        async with live_server(store, **kw) as A, live_server(store, **kw) as B:
            ca, cb = A.client("alice-key"), B.client("alice-key")
            r = await ca.post(P + "/records", json=REC(1)); print("append r1 via A:", r.status_code, r.json())
            print("read via A:", await ids(ca))
            n = A.server.leader.renewed               # just after one of A's renewals
            while A.server.leader.renewed == n: await asyncio.sleep(0.01)
            t0 = time.monotonic(); pause(rd)          # Redis stalls (SIGSTOP) ...
            r = await cb.post(P + "/records", json=REC(2))
            print("append r2 via B during the stall:", r.status_code, r.json())
            resume(rd); print("stall lasted %.2fs; A saw Redis failures: %d" % (time.monotonic() - t0, A.server.leader.failures))
            for t in range(4):
                await asyncio.sleep(5)
                print(f"t+{(t+1)*5}s read via A: {await ids(ca)}  via B: {await ids(cb)}  "
                      f"A.failures={A.server.leader.failures} A.renewed={A.server.leader.renewed} B.lost={B.server.leader.lost}")
            r = await ca.get(P, follow_redirects=False); print("state via A: next_offset", r.json().get("next_offset"))
            sa = A.client()   # a compactor that compacted r2 (B's dirty log named it) moves the cursor
            r = await sa.post(P + "/compaction", json={"offset": 3}); print("compaction offset=3 via A:", r.status_code, r.text)
            r = await sa.get(P + "/fragments"); print("fragments via A:", [(f["start"], f["limit"]) for f in r.json()["fragments"]])
            await ca.aclose(); await cb.aclose(); await sa.aclose()
    finally:
        resume(rd); rd.kill()

asyncio.run(main())
