"""A fork of a collection compacted into several levels: the server copies every run its source's
``CURRENT.json`` lists (``host/forks.py``), and the target reads, and compacts on, as the source.
"""

from __future__ import annotations

import json
import random
import uuid
from pathlib import Path
from typing import Any

from compactor_client.fold import fold
from compactor_client.pipeline import CompactionPipeline
from compactor_client.reader import read_state
from compactor_client.versions import read_current
from host.forks import fork_collection
from wal3 import LocalStore, LogWriter
from wal3.layout import load_manifest
from wal3.paths import compacted_prefix, join, log_prefix

from .kit import HOST, normalise, random_records, state_view


class WalLog:
    """A real wal3 log for a collection, with the calls the pipeline makes of a host."""

    def __init__(self, store: LocalStore, cid: uuid.UUID) -> None:
        self.store, self.cid = store, cid
        self.records: list[dict[str, Any]] = []
        self.cursor = 1

    async def append(self, records: list[dict[str, Any]]) -> None:
        w = await LogWriter.open(self.store, log_prefix(self.cid))
        await w.append_many([json.dumps(r).encode() for r in records])
        await w.close()
        self.records += records

    async def fragments(self, tenant: str, collection_id: str, *, from_offset: int | None = None):  # type: ignore[no-untyped-def]
        from compactor_client.models import FragmentInfo

        loaded = await load_manifest(self.store, log_prefix(collection_id))
        assert loaded is not None
        prefix = log_prefix(collection_id)
        out = [
            FragmentInfo(
                url=self.store.url_for(join(prefix, f.path)),
                start=f.start,
                limit=f.limit,
                setsum=f.setsum.hexdigest(),
                content_md5=f.content_md5,
            )
            for f in loaded[0].fragments
        ]
        return [f for f in out if f.limit > (from_offset or 1)]

    async def compact(self, tenant: str, collection_id: str, offset: int) -> int:
        self.cursor = max(self.cursor, offset)
        return self.cursor


async def test_a_fork_copies_every_level_and_compacts_on(tmp_path: Path) -> None:
    from compactor_client.models import DirtyLog
    from compactor_client.scheduler import Candidate

    store = LocalStore(tmp_path / "s")
    src, dst = uuid.UUID(int=1, version=4), uuid.UUID(int=2, version=4)
    log = WalLog(store, src)
    rng = random.Random(9)
    pipe = CompactionPipeline(None, store, {HOST: log}, ratio=2.0)

    def cand(cid: uuid.UUID, start: int, end: int) -> Candidate:
        return Candidate(
            HOST,
            DirtyLog(
                tenant="t", collection_id=str(cid), start=start, limit=end, num_records=end - start
            ),
        )

    for n in (200, 5):  # a big bottom level, then a small one above it (ratio 2: no merge)
        start = len(log.records) + 1
        await log.append(random_records(rng, n, ids=150))
        res = await pipe.run_round([cand(src, start, len(log.records) + 1)])
        assert [o.status for o in res.outcomes] == ["compacted"]
    cur = await read_current(store, str(src))
    assert cur is not None and cur.levels == 2

    loaded = await load_manifest(store, log_prefix(src))
    assert loaded is not None

    async def mark(cid: Any, start: int, n: int) -> None:
        return None

    await fork_collection(
        store,
        source=src,
        target=dst,
        source_prefix=log_prefix(src),
        target_prefix=log_prefix(dst),
        source_manifest=loaded[0],
        offset=cur.offset,
        writer_name="t",
        mark_dirty=mark,
    )
    copied = await read_current(store, str(dst))  # refused as corrupt if a run were the source's
    assert copied is not None and copied.levels == 2 and copied.retired == ()
    assert all(r.key.startswith(compacted_prefix(dst)) for r in copied.runs)
    want = normalise(fold({}, log.records))
    assert state_view((await read_state(store, str(dst))).table) == want
    # The target compacts on from its copied levels.
    target = WalLog(store, dst)
    target.records = list(log.records)
    more = random_records(rng, 5, ids=150)
    await target.append(more)
    tpipe = CompactionPipeline(None, store, {HOST: target}, ratio=2.0)
    res = await tpipe.run_round([cand(dst, cur.offset, cur.offset + 5)])
    assert [o.status for o in res.outcomes] == ["compacted"], res.outcomes
    after = await read_state(store, str(dst))
    assert state_view(after.table) == normalise(fold({}, log.records + more))
