"""``GET /v1/dirty`` after a restart reads no store: the tenants of the dirty collections are
learnt in bulk by the roll-up pass that rebuilds the set, not per entry on each listing."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from pathlib import Path

from tests.host.live import live_server, log_path, record
from tests.wal3.helpers import GateStore
from wal3 import LocalStore, ObjectMeta
from wal3.paths import TENANT_PATH


class CountingStore(GateStore):
    """Delegates to ``inner`` and remembers every request as (op, key)."""

    def __init__(self, inner: LocalStore) -> None:
        super().__init__(inner)
        self.seen: list[tuple[str, str]] = []

    async def _before(self, op: str, key: str) -> list[object]:  # type: ignore[override]
        self.seen.append((op, key))
        return list(await super()._before(op, key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        self.seen.append(("list", prefix))
        async for m in self.inner.list(prefix, start_after=start_after):
            yield m


def _tenant_reads(requests: list[tuple[str, str]]) -> list[str]:
    return [key for op, key in requests if op == "get" and key.endswith("/" + TENANT_PATH)]


async def test_dirty_listing_after_a_restart_reads_no_tenant_per_entry(tmp_path: Path) -> None:
    store = CountingStore(LocalStore(tmp_path / "s"))
    owners = {uuid.uuid4(): ("alice" if i % 2 else "bob") for i in range(12)}
    settings = {"server_id": "tenants-0", "gc_grace_s": 0.0}
    async with live_server(store=store, **settings) as live, live.client() as svc:
        for cid, tenant in owners.items():
            r = await svc.post(log_path(tenant, cid) + "/records", json={"records": [record("r")]})
            assert r.status_code == 200, r.text  # answered once its dirty mark is durable

    # Restart: the same server id (so the same dirty log) over the same store, nothing cached.
    async with live_server(store=store, **settings) as live, live.client() as svc:
        await live.server.rollup_now()  # the pass that rebuilds the dirty set from the log
        before = len(store.seen)
        r = await svc.get("/v1/dirty", params={"min_records": 0})
        assert r.status_code == 200, r.text
        during = store.seen[before:]
        listed = {uuid.UUID(x["collection_id"]): x["tenant"] for x in r.json()["logs"]}
        assert listed == owners
        assert _tenant_reads(during) == [], "the listing read a TENANT per dirty collection"
        assert during == [], f"the listing reached the store: {during}"

        # A log written after the restart (bound by this process) and the dirty set's other
        # logs cost no TENANT read at the next pass nor at the listing after it.
        fresh = uuid.uuid4()
        r = await svc.post(log_path("alice", fresh) + "/records", json={"records": [record(1)]})
        assert r.status_code == 200, r.text
        before = len(store.seen)
        await live.server.rollup_now()
        r = await svc.get("/v1/dirty", params={"min_records": 0})
        listed = {uuid.UUID(x["collection_id"]): x["tenant"] for x in r.json()["logs"]}
        assert listed == {**owners, fresh: "alice"}
        assert _tenant_reads(store.seen[before:]) == []
