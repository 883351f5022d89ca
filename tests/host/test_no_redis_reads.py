"""Without Redis (the chart's default: no hint, several replicas) a host must not answer reads
from its in-memory manifest: another host may have appended (adversarial review of issue 21)."""

from __future__ import annotations

from pathlib import Path

import pytest

from .live import CID, live_server, log_path, record


@pytest.fixture(autouse=True)
def _every_host_serves_every_log(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two hosts here write one log on purpose (the store's fencing and the read lease, with no
    hint), so membership routing, which would redirect one to the other, is off."""
    monkeypatch.setenv("LOGHOST_ROUTING", "none")


BASE = log_path("alice", CID)


async def test_without_a_hint_every_host_sees_every_acknowledged_append(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    async with live_server(store) as a, live_server(store) as b:
        async with a.client("alice-key") as ca, b.client("alice-key") as cb:
            assert (
                await ca.post(BASE + "/records", json={"records": [record(1)]})
            ).status_code == 200
            first = await ca.get(BASE + "/records", params={"from": 1})
            assert [r["record"]["id"] for r in first.json()["records"]] == ["1"]  # a has it open
            r = await cb.post(BASE + "/records", json={"records": [record(2)]})
            assert r.status_code == 200 and r.json()["first_offset"] == 2, r.text
            again = await ca.get(BASE + "/records", params={"from": 1})
            assert [x["record"]["id"] for x in again.json()["records"]] == ["1", "2"]
            assert (await ca.get(BASE)).json()["next_offset"] == 3
            polled = await ca.get(BASE + "/records", params={"from": 2, "wait_ms": 5000})
            assert [x["record"]["id"] for x in polled.json()["records"]] == ["2"]
