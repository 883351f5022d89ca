"""One tenant blocks another tenant's appends: the server-wide buffered-bytes cap and the open-log
cap are shared by every tenant, first come first served.  The store is made slow (an S3 put of a
large object) and the caps are scaled down so the run stays small; at the defaults (256 MiB,
1024 logs) the same happens with 32 appends of 8 MiB, or 1024 concurrent small appends."""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import httpx

from verify import keys
from verify.reliability.infra import InProcessHost
from verify.testkit import wait_until
from wal3.localstore import LocalStore

_FRAGMENT = re.compile(keys.in_collection_log(keys.FRAGMENT))


class SlowStore(LocalStore):
    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        if _FRAGMENT.search(key):
            await asyncio.sleep(3)  # a slow object store (large object, S3 latency)
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


KEYS = "svc=*,ak=alice,bk=bob"


def body(n: int, size: int) -> dict[str, Any]:
    return {"records": [{"id": str(i), "op": "add", "document": "x" * size} for i in range(n)]}


async def main() -> None:
    tmp = tempfile.mkdtemp(prefix="adv2-block-")
    host = InProcessHost(
        SlowStore(f"{tmp}/store"),
        {"api_keys": KEYS, "max_buffered_bytes": 2 << 20, "max_open_logs": 4},
    )
    await host.start()
    manager = host.server.manager
    try:
        bob = httpx.AsyncClient(
            base_url=host.url, headers={"Authorization": "Bearer bk"}, timeout=30
        )
        alice = httpx.AsyncClient(
            base_url=host.url, headers={"Authorization": "Bearer ak"}, timeout=30
        )
        a_log = f"/v1/tenants/alice/logs/{uuid.uuid4()}/records"
        # 1) buffered bytes: bob has 2 x 1 MiB in flight on 2 of his logs
        bob_tasks = [
            asyncio.create_task(
                bob.post(f"/v1/tenants/bob/logs/{uuid.uuid4()}/records", json=body(100, 10_400))
            )
            for _ in range(2)
        ]
        await wait_until(lambda: manager.buffered_bytes >= 2_000_000, "bob's bytes buffered")
        print("buffered by bob:", manager.buffered_bytes)
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
        await wait_until(
            lambda: sum(h.users for h in manager.handles() if h.tenant == "bob") >= 4,
            "bob's 4 logs open",
        )
        r = await alice.post(f"/v1/tenants/alice/logs/{uuid.uuid4()}/records", json=body(1, 10))
        print("alice append (open-log cap):", r.status_code, r.text)
        print("bob:", [(t.status_code) for t in await asyncio.gather(*bob_tasks)])
        await bob.aclose()
        await alice.aclose()
    finally:
        await host.stop()


if __name__ == "__main__":
    asyncio.run(main())
