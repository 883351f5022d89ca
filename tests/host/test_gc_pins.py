"""A cursor written over REST is checked against garbage collection done by another process.

At 3c61663 ``PUT .../cursors/{name}`` compared the offset only with the server's own writer's
in-memory manifest, which a collector in another process (``loghost gc``) does not update: the
server answered 200 to a cursor pinning deleted records.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from host.manager import log_prefix
from wal3 import LocalStore
from wal3.cursors import CursorStore
from wal3.gc import GarbageCollector, GcOptions

from .live import CID, assert_error, live_server, log_path, record

BASE = log_path("alice", CID)


async def test_a_cursor_below_another_process_collection_is_refused(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    async with live_server(root) as live, live.client("alice-key") as alice:
        for i in range(6):
            r = await alice.post(BASE + "/records", json={"records": [record(i)]})
            assert r.status_code == 200, r.text
        # Another process (the operator's `loghost gc`) compacts and collects behind the
        # server's back: the server's open writer still believes offset 1 is retained.
        outside = LocalStore(root)
        prefix = log_prefix(UUID(CID))
        await CursorStore(outside, prefix, "compactor").init("compaction", 5)
        gc = GarbageCollector(outside, prefix, GcOptions(grace_s=0, retain_fragments=0))
        assert (await gc.run_once()).phase == "done"
        await outside.close()
        assert_error(
            await alice.put(BASE + "/cursors/late", json={"offset": 2, "witness": None}),
            410,
            "purged",
        )
        # The refused pin is undone: it must not hold collection back either.
        assert (await alice.get(BASE + "/cursors/late")).status_code == 404
        ok = await alice.put(BASE + "/cursors/late", json={"offset": 5, "witness": None})
        assert ok.status_code == 200, ok.text
