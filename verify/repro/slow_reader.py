"""A reader that never reads its answers pins them in server memory with no time limit: each GET
…/records builds the whole answer (up to max_request_bytes, 8 MiB) and uvicorn waits for the
socket to drain for ever (no write timeout; the header/body/keep-alive timeouts do not apply).
A read-only key with N such connections holds N x 8 MiB."""
import sys, time, tempfile, socket
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
import httpx
from tests.host.live import spawn_server, CID

def rss(pid):
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"): return int(l.split()[1]) // 1024
tmp = Path(tempfile.mkdtemp(prefix="adv2-slowread-"))
p = spawn_server(str(tmp / "store"), tmp, api_keys="svc=*,ak=alice,ar=alice:read")
P = f"/v1/tenants/alice/logs/{CID}"
socks = []
try:
    H = {"Authorization": "Bearer ak"}
    for i in range(8):   # 8 MiB of records
        r = httpx.post(p.url + P + "/records", headers=H, timeout=60,
                       json={"records": [{"id": f"{i}-{j}", "op": "add", "document": "x" * 2000} for j in range(500)]})
        assert r.status_code == 200, r.text
    print("RSS before: %d MiB" % rss(p.proc.pid))
    for _ in range(40):
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", p.port))
        s.sendall(f"GET {P}/records?from=1&limit=10000 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer ar\r\n\r\n".encode())
        socks.append(s)          # ... and never read
    for t in (3, 15, 30):
        time.sleep(t - (0 if t == 3 else (3 if t == 15 else 15)))
        print(f"t+{t}s RSS: {rss(p.proc.pid)} MiB, connections still open:",
              sum(1 for s in socks if s.fileno() != -1), "healthz:", httpx.get(p.url + "/healthz").status_code)
    s0 = socks[0]; s0.settimeout(5); got = 0
    try:
        while got < 8_000_000:
            b = s0.recv(1 << 20)
            if not b: break
            got += len(b)
    except socket.timeout: pass
    print(f"after 30 s the first connection still delivers its answer: {got} bytes")
finally:
    for s in socks: s.close()
    p.terminate()
