"""The connection cap is server-wide and taken before authentication: one client that opens
max_connections keep-alive connections (one cheap request each, then idle for keep_alive_s=75 s)
shuts every tenant out.  Scaled: max_connections=20."""
import asyncio, sys, tempfile, socket
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import httpx
from tests.host.live import live_server, CID

async def main():
    tmp = tempfile.mkdtemp(prefix="adv2-conn-")
    async with live_server(f"{tmp}/store", max_connections=20) as L:
        port = int(L.url.rsplit(":", 1)[1])
        hog = []
        for _ in range(20):
            s = socket.create_connection(("127.0.0.1", port)); s.settimeout(3)
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); await asyncio.to_thread(s.recv, 4096)   # no key needed
            hog.append(s)
        await asyncio.sleep(11)   # past the header timeout: these are idle keep-alive connections
        async with httpx.AsyncClient(base_url=L.url, headers={"Authorization": "Bearer alice-key"}) as c:
            for i in range(3):
                try:
                    r = await c.post(f"/v1/tenants/alice/logs/{CID}/records", json={"records": [{"id": "1", "op": "add"}]})
                    print("alice append:", r.status_code)
                except Exception as e:
                    print("alice append failed:", type(e).__name__, e)
        for s in hog: s.close()

asyncio.run(main())
