"""Issue 20, item 6, on real hosts: a batch that loses to another writer leaves a mark past the
log's tail; once it has settled, roll-ups drop it instead of carrying it (and raising its score)
for ever."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import host.dirty

from .live import live_server, log_path, metric, metrics_text, record, wait_until


@pytest.fixture(autouse=True)
def _every_host_serves_every_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts here write one log on purpose (the store's fencing and the read lease, with no
    hint), so membership routing, which would redirect one to the other, is off."""
    monkeypatch.setenv("LOGHOST_ROUTING", "none")


CID = "3f1b6c2e-8d4a-4e1f-9a7b-5c2d1e0f4a31"
PATH = log_path("alice", CID)


async def _dirty(c: httpx.AsyncClient) -> dict[str, dict[str, int]]:
    r = await c.post("/v1/dirty/rollup")
    assert r.status_code == 200, r.text
    r = await c.get("/v1/dirty", params={"min_records": 0})
    assert r.status_code == 200, r.text
    return {e["collection_id"]: e for e in r.json()["logs"]}


async def test_a_lost_batchs_mark_leaves_the_dirty_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = str(tmp_path / "s")
    # Two hosts on one store without a leader hint: both serve the log, so one batch loses.
    # Marks settle after max(floor, gc grace): both lowered so the test need not wait minutes.
    monkeypatch.setattr(host.dirty, "MIN_SETTLE_S", 0.5, raising=False)
    async with (
        live_server(store, gc_grace_s=0) as a,
        live_server(store, gc_grace_s=0) as b,
        a.client() as ca,
        b.client() as cb,
    ):
        r = await cb.post(PATH + "/records", json={"records": [record("b0")]})
        assert r.status_code == 200, r.text  # offset 1, through b
        r = await ca.post(PATH + "/records", json={"records": [record("a0")]})
        assert r.status_code == 200 and r.json()["first_offset"] == 2, r.text
        # b still believes the tail is 2: its five records are marked [2, 7), then lose.
        r = await cb.post(
            PATH + "/records", json={"records": [record(f"b{i}") for i in range(1, 6)]}
        )
        assert r.status_code == 409, r.text
        assert (await cb.get(PATH)).json()["next_offset"] == 3

        # Nothing real is dropped: offset 2 (a's record, in b's mark) stays dirty on b.
        entry = (await _dirty(cb))[CID]
        assert entry["start"] == 1
        r = await cb.post(PATH + "/compaction", json={"offset": 3})
        assert r.status_code == 200, r.text

        async def gone() -> bool:
            return CID not in await _dirty(cb)

        # Before the fix [3, 7) was carried for ever, its reinsert count rising every roll-up.
        await wait_until(gone, "the lost batch's mark to leave b's dirty set", timeout_s=30)
        text = await metrics_text(cb)
        assert metric(text, "loghost_dirty_untracked_collections") == 0
        assert metric(text, "loghost_dirty_collections") == 0
