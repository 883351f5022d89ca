"""A reused idempotency key with OTHER records answers 200 deduplicated:true (not 409) once the
first request's records are compacted and collected: the new records are silently dropped."""
import asyncio, sys, tempfile, uuid
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from tests.host.live import live_server

async def main():
    store = tempfile.mkdtemp(prefix="adv2-idemgc-") + "/store"
    async with live_server(store, gc_grace_s=0) as A:
        c, s = A.client("alice-key"), A.client()
        P = f"/v1/tenants/alice/logs/{uuid.uuid4()}"
        r = await c.post(P + "/records", json={"records": [{"id": "x", "op": "add"}], "idempotency_key": "K"}); print("first:", r.json())
        for i in range(5):
            await c.post(P + "/records", json={"records": [{"id": f"f{i}", "op": "add"}]})
        r = await c.post(P + "/records", json={"records": [{"id": "y", "op": "upsert", "document": "other"}], "idempotency_key": "K"})
        print("reuse K, other records (before GC):", r.status_code, r.text)
        print("compaction:", (await s.post(P + "/compaction", json={"offset": 4})).json())
        for _ in range(3):
            r = await s.post(P + "/gc"); print("gc:", r.status_code, r.json().get("phase"), r.json().get("cutoff"))
        print("state:", {k: v for k, v in (await c.get(P)).json().items() if k in ("oldest_offset", "next_offset")})
        r = await c.post(P + "/records", json={"records": [{"id": "y", "op": "upsert", "document": "other"}], "idempotency_key": "K"})
        print("reuse K, other records (after GC):", r.status_code, r.text)
        await c.aclose(); await s.aclose()

asyncio.run(main())
