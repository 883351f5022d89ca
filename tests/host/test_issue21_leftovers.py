"""Issue 21, the findings that stayed open after the first round: real uvicorn log hosts.

Each test names its finding (V2 … V8 of ``verify/repro/``, where each was a script first) and
failed on the code before its fix.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

from .live import Live, assert_error, live_server, log_path, record, wait_until

BOUND_S = 20.0  # generous: how long a test waits for the server to act, never a latency assert
KEYS = "svc=*,ak=alice,ar=alice:read,bk=bob"


def _port(lv: Live) -> int:
    return int(lv.url.rsplit(":", 1)[1])


def _waiting(lv: Live) -> int:
    return sum(h.waiters for h in lv.server.manager.handles())


# ------------------------------------------------------------ V8: long-poll share of read keys


async def test_read_only_key_cannot_take_its_tenants_whole_long_poll_cap(tmp_path: Path) -> None:
    """V8: a read-only key (``key=alice:read``) holding every long-poll it may must not starve
    the tenant's own key: that key's long-poll waits (and is answered), it is not a 429."""
    cid = str(uuid.uuid4())
    path = log_path("alice", cid) + "/records"
    async with live_server(str(tmp_path / "store"), api_keys=KEYS,
                           max_long_polls_per_tenant=2) as lv:
        async with lv.client("ak") as ak, lv.client("ar") as ar:
            assert (await ak.post(path, json={"records": [record("1")]})).status_code == 200
            params = {"from": 2, "wait_ms": 15_000}
            readers = [asyncio.create_task(ar.get(path, params=params)) for _ in range(2)]
            await wait_until(lambda: _waiting(lv) >= 2, "the reader's long-polls parked",
                             BOUND_S)
            # the read-only key is at its own cap ...
            err = assert_error(await ar.get(path, params=params), 429, "backpressure")
            assert err["reason"] == "long_poll"
            # ... and the tenant key still long-polls
            mine = asyncio.create_task(ak.get(path, params=params))
            await wait_until(lambda: _waiting(lv) >= 3 or mine.done(),
                             "the tenant key's long-poll parked", BOUND_S)
            r = await ak.post(path, json={"records": [record("2")]})
            assert r.status_code == 200, r.text
            for t in (mine, *readers):
                got = await t
                assert got.status_code == 200, got.text
                assert [x["record"]["id"] for x in got.json()["records"]] == ["2"]
