"""Adversarial checks of the fair open-log cap (issue 19, d74c91e: ``_make_room`` and
``_open_shares`` in host/manager.py).

Interleavings are forced by holding store requests (``GateStore``), never by sleeps.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from wal3 import LocalStore

from ..wal3.helpers import GateStore
from .live import Live, live_server, log_path, record

BODY = {"records": [record("x")]}


def _open_of(lv: Live, tenant: str) -> list[str]:
    return sorted(str(h.collection_id) for h in lv.server.manager.handles() if h.tenant == tenant)


async def test_sequential_opens_stop_at_the_share(tmp_path: Path) -> None:
    """The baseline the race below breaks: one open after another, alice (share 2 of 4 beside
    bob) takes room from her own idle logs once at her share, and bob keeps both of his."""
    b1, b2, a1, a2, a3 = (str(uuid.uuid4()) for _ in range(5))
    async with (
        live_server(str(tmp_path / "s"), max_open_logs=4, fair_share="weighted") as lv,
        lv.client("alice-key") as alice,
        lv.client("bob-key") as bob,
    ):
        for cid in (b1, b2):
            assert (await bob.post(log_path("bob", cid) + "/records", json=BODY)).status_code == 200
        for cid in (a1, a2, a3):
            r = await alice.post(log_path("alice", cid) + "/records", json=BODY)
            assert r.status_code == 200, r.text
        assert _open_of(lv, "bob") == sorted([b1, b2])
        assert len(_open_of(lv, "alice")) == 2


async def test_concurrent_opens_do_not_pass_the_share(tmp_path: Path) -> None:
    """Cap 4, alice and bob weight 1 (share 2 each); bob holds 2 idle logs.  Alice opens 3 logs
    at once: a1 and a2 are past ``_make_room`` (counted in ``_opening``, not in
    ``_tenant_open``) when a3 asks for room, so alice looks at 0 of her share of 2 and a3 takes
    bob's idle log, although bob is within his share.  Sequentially (above) a3 would have
    evicted alice's own log instead.  Ends with alice holding 3 of 4 and bob 1."""
    b1, b2, a1, a2, a3 = (str(uuid.uuid4()) for _ in range(5))
    store = GateStore(LocalStore(tmp_path / "s"))
    async with (
        live_server(store=store, max_open_logs=4, fair_share="weighted") as lv,
        lv.client("alice-key") as alice,
        lv.client("bob-key") as bob,
    ):
        for cid in (b1, b2):
            assert (await bob.post(log_path("bob", cid) + "/records", json=BODY)).status_code == 200
        # a1 and a2 are held at their creation claim, i.e. after _make_room let them in.
        g1 = store.hold("put", rf"{a1}/CLAIM$")
        g2 = store.hold("put", rf"{a2}/CLAIM$")
        t1 = asyncio.create_task(alice.post(log_path("alice", a1) + "/records", json=BODY))
        t2 = asyncio.create_task(alice.post(log_path("alice", a2) + "/records", json=BODY))
        try:
            await g1.reached.wait()
            await g2.reached.wait()
            r3 = await alice.post(log_path("alice", a3) + "/records", json=BODY)
        finally:
            g1.release.set()
            g2.release.set()
        r1, r2 = await t1, await t2
        assert r1.status_code == 200 and r2.status_code == 200, (r1.text, r2.text)
        # Fair: a3 waits its turn (429 fair_share) or bob keeps his logs; never alice 3, bob 1.
        assert r3.status_code == 429 or _open_of(lv, "bob") == sorted([b1, b2]), (
            r3.status_code,
            _open_of(lv, "alice"),
            _open_of(lv, "bob"),
        )
        assert len(_open_of(lv, "alice")) <= 2, (_open_of(lv, "alice"), _open_of(lv, "bob"))
