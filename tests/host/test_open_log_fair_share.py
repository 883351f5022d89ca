"""The open-log cap shared fairly (issue 19): with ``fair_share=weighted`` a tenant opening log
after log takes room from its own idle logs (or from tenants over their share), never from a
tenant within its share; at its share with nothing of its own idle it gets 429 ``fair_share``,
and with no open log idle at all 429 ``open_log_cap`` (not ``contention``, a store conflict).
``fifo`` keeps plain least-recently-used eviction."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from wal3 import LocalStore

from ..wal3.helpers import GateStore
from .live import live_server, log_path, record


def _open(lv: object, cid: str) -> bool:
    return any(str(h.collection_id) == cid for h in lv.server.manager.handles())  # type: ignore[attr-defined]


@pytest.mark.parametrize(("mode", "bob_kept"), [("weighted", True), ("fifo", False)])
async def test_a_tenant_opening_logs_evicts_its_own_not_anothers(
    tmp_path: Path, mode: str, bob_kept: bool
) -> None:
    b1, a1, a2, a3 = (str(uuid.uuid4()) for _ in range(4))
    async with (
        live_server(str(tmp_path / "s"), max_open_logs=3, fair_share=mode) as lv,
        lv.client("alice-key") as alice,
        lv.client("bob-key") as bob,
    ):
        body = {"records": [record("x")]}
        assert (await bob.post(log_path("bob", b1) + "/records", json=body)).status_code == 200
        for cid in (a1, a2, a3):  # the third needs room: the table holds b1, a1, a2
            r = await alice.post(log_path("alice", cid) + "/records", json=body)
            assert r.status_code == 200, r.text
        # bob's log is the least recently used; alice (2 of 3, share 1.5) gives up her own.
        assert _open(lv, b1) is bob_kept
        assert _open(lv, a1) is not bob_kept and _open(lv, a3)


async def test_a_tenant_at_its_share_with_nothing_idle_is_refused_not_another(
    tmp_path: Path,
) -> None:
    b1, a1, a2, b2 = (str(uuid.uuid4()) for _ in range(4))
    store = GateStore(LocalStore(tmp_path / "s"))
    async with (
        live_server(store=store, max_open_logs=2) as lv,
        lv.client("alice-key") as alice,
        lv.client("bob-key") as bob,
    ):
        body = {"records": [record("x")]}
        assert (await bob.post(log_path("bob", b1) + "/records", json=body)).status_code == 200
        # alice's first log stays busy: its fragment upload is held at the store.
        held = store.hold("put", rf"logs/{a1}/.*\.parquet$")
        busy = asyncio.create_task(alice.post(log_path("alice", a1) + "/records", json=body))
        try:
            await held.reached.wait()
            r = await alice.post(log_path("alice", a2) + "/records", json=body)
            assert r.status_code == 429, r.text  # before: bob's idle log was closed for it
            assert r.json()["error"]["reason"] == "fair_share" and r.headers["retry-after"]
            assert _open(lv, b1)
        finally:
            held.release.set()
        assert (await busy).status_code == 200
        # bob at his share takes room from his own idle log, and alice's is left alone.
        assert (await bob.post(log_path("bob", b2) + "/records", json=body)).status_code == 200
        assert _open(lv, b2) and _open(lv, a1) and not _open(lv, b1)


@pytest.mark.parametrize("mode", ["weighted", "fifo"])
async def test_a_full_cap_of_busy_logs_is_open_log_cap_not_contention(
    tmp_path: Path, mode: str
) -> None:
    """Every open log in use (here a lone tenant's): 429 reason ``open_log_cap``, its own
    reason and metric label; ``contention`` is left to store write conflicts (409)."""
    a1, a2 = (str(uuid.uuid4()) for _ in range(2))
    store = GateStore(LocalStore(tmp_path / "s"))
    async with (
        live_server(store=store, max_open_logs=1, fair_share=mode) as lv,
        lv.client("alice-key") as alice,
    ):
        body = {"records": [record("x")]}
        held = store.hold("put", rf"logs/{a1}/.*\.parquet$")
        busy = asyncio.create_task(alice.post(log_path("alice", a1) + "/records", json=body))
        try:
            await held.reached.wait()
            r = await alice.post(log_path("alice", a2) + "/records", json=body)
            assert r.status_code == 429, r.text
            assert r.json()["error"]["reason"] == "open_log_cap" and r.headers["retry-after"]
        finally:
            held.release.set()
        assert (await busy).status_code == 200
        text = (await alice.get("/metrics")).text
        assert 'loghost_backpressure_total{reason="open_log_cap"} 1.0' in text
        assert 'reason="contention"' not in text
        # once idle, the log gives way
        assert (await alice.post(log_path("alice", a2) + "/records", json=body)).status_code == 200
