"""Membership routing while two hosts' views differ (issue 17): an append that meets another
host's write answers 200 or a 307 to the owner, never ``409 contention``.

Found by the rolling-restart scenario (tests/verify/test_cluster_rolling.py): a host that came
back is the owner of its logs in its own view at once, while the others keep writing them until
their next refresh; whichever append then lost the manifest's condition answered 409 and the
client failed.  Now the host that meets the contention refreshes its view: if another host owns
the log it redirects there, if it still owns it, it retries the append itself.

Here beats are hours apart, so a view changes only when the test (or the fix) refreshes it.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from host.membership import rendezvous_owner

from .live import live_server, record

ROUTING: dict[str, Any] = {"routing": "membership"}


def _owned_by(sid: str, among: list[Any]) -> str:
    """A log id whose rendezvous owner among ``among`` (records) is ``sid``."""
    return next(
        c
        for c in (str(uuid.UUID(int=i)) for i in range(1, 1000))
        if (o := rendezvous_owner(c, among)) is not None and o.server_id == sid
    )


async def test_a_host_with_a_stale_view_redirects_after_contention(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    async with live_server(store, server_id="a", **ROUTING) as a:
        async with live_server(store, server_id="b", **ROUTING) as b:
            # b joined after a's last refresh: a still sees itself alone; b sees both.
            assert [r.server_id for r in a.server.membership.live()] == ["a"]
            cid = _owned_by("b", b.server.membership.live())
            url = f"/v1/tenants/alice/logs/{cid}/records"
            async with a.client() as ca, b.client() as cb:
                r = await ca.post(url, json={"records": [record(1)]})  # a's stale view: a's
                assert r.status_code == 200, r.text
                r = await cb.post(url, json={"records": [record(2)]})  # b owns it
                assert r.status_code == 200, r.text
                # a's writer meets b's append: a looks again and redirects to b (was a 409).
                r = await ca.post(url, json={"records": [record(3)]})
                assert r.status_code == 307, r.text
                assert r.headers["location"].startswith(b.url + "/")
                r = await cb.post(url, json={"records": [record(3)]})
                assert r.status_code == 200, r.text
                assert r.json()["first_offset"] == 3  # the 307 wrote nothing


async def test_the_owner_retries_an_append_a_stale_host_raced(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    async with live_server(store, server_id="a", **ROUTING) as a:
        async with live_server(store, server_id="b", **ROUTING) as b:
            cid = _owned_by("b", b.server.membership.live())
            url = f"/v1/tenants/alice/logs/{cid}/records"
            async with a.client() as ca, b.client() as cb:
                r = await cb.post(url, json={"records": [record(1)]})  # b, the owner, opens it
                assert r.status_code == 200, r.text
                # a, whose view is stale, writes the log behind b's back.
                r = await ca.post(url, json={"records": [record(2)]})
                assert r.status_code == 200, r.text
                # b's writer meets a's append; b still owns the log: it retries (was a 409).
                r = await cb.post(url, json={"records": [record(3)], "idempotency_key": "k3"})
                assert r.status_code == 200, r.text
                assert r.json()["first_offset"] == 3
                page = await cb.get(url, params={"from": 1})
                assert [x["record"]["id"] for x in page.json()["records"]] == ["1", "2", "3"]
