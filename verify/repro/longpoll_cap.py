"""A read-only key (key=alice:read) takes every long-poll slot of tenant alice: the application's
own tenant key (key=alice) then gets 429 on its long-polls until the reader lets go."""
import asyncio, sys, tempfile, socket, time
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import httpx
from tests.host.live import live_server, CID

KEYS = "svc=*,ak=alice,ar=alice:read,bk=bob"
P = f"/v1/tenants/alice/logs/{CID}"

async def main():
    tmp = tempfile.mkdtemp(prefix="adv2-lp-")
    async with live_server(f"{tmp}/store", api_keys=KEYS, max_long_polls_per_tenant=4) as L:
        ak = httpx.AsyncClient(base_url=L.url, headers={"Authorization": "Bearer ak"}, timeout=40)
        await ak.post(P + "/records", json={"records": [{"id": "1", "op": "add"}]})
        port = int(L.url.rsplit(":", 1)[1])
        socks = []
        for _ in range(4):   # the read-only key: 4 long-polls of 30 s, raw sockets
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"GET {P}/records?from=2&wait_ms=30000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ar\r\n\r\n".encode())
            socks.append(s)
        while L.server.manager._waits.get("alice", 0) < 4: await asyncio.sleep(0.01)
        r = await ak.get(P + "/records", params={"from": 2, "wait_ms": 1000})
        print("tenant key long-poll:", r.status_code, r.text)
        for s in socks: s.close()
        t = time.monotonic()
        while L.server.manager._waits.get("alice", 0) > 0 and time.monotonic() - t < 5: await asyncio.sleep(0.01)
        print("after the reader hung up: waits =", L.server.manager._waits.get("alice", 0), "in %.2fs" % (time.monotonic() - t))
        r = await ak.get(P + "/records", params={"from": 2, "wait_ms": 500}); print("tenant key long-poll:", r.status_code, r.text)
        await ak.aclose()

asyncio.run(main())
