"""Issue 20, finding r6 (was ``verify/repro/r6_slow_commit_untracked.py``): a write whose manifest
commit lands long after its dirty mark stays in the dirty set.

The mark is written alongside the fragment upload; a roll-up that judges it settled (older than
the settle time) while the commit is still in flight used to clip it to the old tail and drop it,
so the write, acknowledged afterwards, was in no dirty set.  Here the settle time is 0 (every mark
is old enough at once) and the manifest put is held by a gate instead of taking 62 s.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

import host.dirty
from wal3 import LocalStore

from ..wal3.helpers import GateStore
from .live import live_server, log_path, metric, metrics_text, record

CID = "00000000-0000-4000-8000-0000000000c1"
PATH = log_path("alice", CID)


async def _rollup(c: httpx.AsyncClient) -> dict[str, tuple[int, int]]:
    r = await c.post("/v1/dirty/rollup")
    assert r.status_code == 200, r.text
    return {e["collection_id"]: (e["start"], e["limit"]) for e in r.json()["logs"]}


async def test_a_commit_landing_after_its_mark_settled_stays_dirty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(host.dirty, "MIN_SETTLE_S", 0.0, raising=False)
    store = GateStore(LocalStore(tmp_path / "s"))
    async with (
        live_server(store=store, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        r = await alice.post(PATH + "/records", json={"records": [record(0)]})
        assert r.status_code == 200, r.text
        assert (await _rollup(svc))[CID] == (1, 2)
        r = await svc.post(PATH + "/compaction", json={"offset": 2})
        assert r.status_code == 200, r.text
        assert CID not in await _rollup(svc)

        gate = store.hold("put", rf"logs/{CID}/manifest/MANIFEST$")
        slow = asyncio.create_task(
            alice.post(PATH + "/records", json={"records": [record(i) for i in range(1, 6)]})
        )
        try:
            await gate.reached.wait()  # uploaded and marked; the commit is in flight
            # The mark is "settled" by age, but the write may still land: it must stay.
            during = await _rollup(svc)
        finally:
            gate.release.set()  # (a failed assertion must not leave the server hanging)
        r = await slow
        assert during.get(CID) == (2, 7), during
        assert r.status_code == 200 and r.json()["first_offset"] == 2, r.text
        assert (await _rollup(svc)).get(CID) == (2, 7)
        assert metric(await metrics_text(svc), "loghost_dirty_untracked_collections") == 0


async def test_a_forks_mark_stays_while_its_manifest_is_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a fork: its target is marked before its manifest exists.  While the
    manifest put is in flight the target has no log (its tail reads 1), but its creation claim
    stands, so the mark is not settled."""
    monkeypatch.setattr(host.dirty, "MIN_SETTLE_S", 0.0, raising=False)
    store = GateStore(LocalStore(tmp_path / "s"))
    dst = "00000000-0000-4000-8000-0000000000c2"
    async with (
        live_server(store=store, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        for n in range(3):
            r = await alice.post(PATH + "/records", json={"records": [record(n)] * 5})
            assert r.status_code == 200, r.text
        gate = store.hold("put", rf"logs/{dst}/manifest/MANIFEST$")
        fork = asyncio.create_task(svc.post(PATH + "/fork", json={"target_collection_id": dst}))
        try:
            await gate.reached.wait()  # marked [1, 16); the manifest is on its way
            during = await _rollup(svc)
        finally:
            gate.release.set()
        r = await fork
        assert r.status_code == 200, r.text
        assert during.get(dst) == (1, 16), during
        assert (await _rollup(svc)).get(dst) == (1, 16)
