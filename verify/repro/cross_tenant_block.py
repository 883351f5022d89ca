"""One tenant blocks another tenant's appends: the server-wide buffered-bytes cap and the open-log
cap are shared by every tenant, first come first served.  The store is made slow (an S3 put of a
large object) and the caps are scaled down so the run stays small; at the defaults (256 MiB,
1024 logs) the same happens with 32 appends of 8 MiB, or 1024 concurrent small appends."""

import asyncio
import sys
import tempfile
import uuid

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import httpx

from tests.host.live import live_server
from wal3.localstore import LocalStore


class SlowStore(LocalStore):
    async def put(self, key, data, **kw):
        if key.startswith("logs/") and key.endswith(".parquet"):
            await asyncio.sleep(3)  # a slow object store (large object, S3 latency)
        return await super().put(key, data, **kw)


KEYS = "svc=*,ak=alice,bk=bob"


def body(n, size):
    return {"records": [{"id": str(i), "op": "add", "document": "x" * size} for i in range(n)]}


async def main():
    tmp = tempfile.mkdtemp(prefix="adv2-block-")
    async with live_server(
        store=SlowStore(f"{tmp}/store"), api_keys=KEYS, max_buffered_bytes=2 << 20, max_open_logs=4
    ) as L:
        bob = httpx.AsyncClient(base_url=L.url, headers={"Authorization": "Bearer bk"}, timeout=30)
        alice = httpx.AsyncClient(
            base_url=L.url, headers={"Authorization": "Bearer ak"}, timeout=30
        )
        a_log = f"/v1/tenants/alice/logs/{uuid.uuid4()}/records"
        # 1) buffered bytes: bob has 2 x 1 MiB in flight on 2 of his logs
        bob_tasks = [
            asyncio.create_task(
                bob.post(f"/v1/tenants/bob/logs/{uuid.uuid4()}/records", json=body(100, 10_400))
            )
            for _ in range(2)
        ]
        while L.server.manager.buffered_bytes < 2_000_000:
            await asyncio.sleep(0.01)
        print("buffered by bob:", L.server.manager.buffered_bytes)
        r = await alice.post(a_log, json=body(20, 1000))
        print("alice append, 20 KB (buffer cap):", r.status_code, r.text)
        print("bob:", [(t.status_code) for t in await asyncio.gather(*bob_tasks)])
        # 2) open logs: bob keeps 4 logs busy with small slow appends
        bob_tasks = [
            asyncio.create_task(
                bob.post(f"/v1/tenants/bob/logs/{uuid.uuid4()}/records", json=body(1, 10))
            )
            for _ in range(4)
        ]
        while sum(h.users for h in L.server.manager.handles() if h.tenant == "bob") < 4:
            await asyncio.sleep(0.01)
        r = await alice.post(f"/v1/tenants/alice/logs/{uuid.uuid4()}/records", json=body(1, 10))
        print("alice append (open-log cap):", r.status_code, r.text)
        print("bob:", [(t.status_code) for t in await asyncio.gather(*bob_tasks)])
        await bob.aclose()
        await alice.aclose()


asyncio.run(main())
