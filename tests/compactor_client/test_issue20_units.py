"""Issue 20, items 4, 5 and 7 at unit level: prune grace by install time, fragment verification in
the executor, liveness and take-over in the scheduler.  (Real hosts and rounds: test_issue20_live.)
"""

from __future__ import annotations

import json
import os
import types
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from compactor_client import versions
from compactor_client.executor import ERROR_OFFSET, FragmentTask, read_fragment
from compactor_client.fold import Row
from compactor_client.models import DirtyLog
from compactor_client.scheduler import Candidate, Scheduler, owner_of
from compactor_client.versions import (
    allocate_version,
    install_version,
    prune_versions,
    read_current,
    write_rows,
)
from wal3.fragment import record_item
from wal3.localstore import LocalStore
from wal3.setsum import Setsum

# ------------------------------------------------------------------- item 4: prune grace


class _Clock:
    """A settable wall clock standing in for ``time`` inside compactor_client.versions."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


def _set_mtime(store: LocalStore, key: str, when: float) -> None:
    path = store.root / key  # type: ignore[attr-defined]
    os.utime(path, (when, when))


async def test_prune_dates_supersession_by_install_not_by_file_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1 stops being current when v2 is *installed* (t=1150), not when a crashed attempt at v2
    (t=1010) or the winner's own file (t=1100) was written; it must stay for the full grace."""
    store = LocalStore(tmp_path / "s")
    clock = _Clock(1000.0)
    monkeypatch.setattr(versions, "time", types.SimpleNamespace(time=clock.time))
    rows = [Row(id="a", document="x", metadata={}, embedding=None)]

    v1 = allocate_version("c", None)
    await write_rows(store, v1, rows)
    _set_mtime(store, v1.data_key, 1000.0)
    assert (await install_version(store, v1, offset=2, rows=1)).installed
    _set_mtime(store, versions.current_key("c"), 1000.0)  # the store's clock agrees, here
    cur1 = await read_current(store, "c")
    assert cur1 is not None

    crashed = allocate_version("c", cur1)  # a compactor that wrote v2's data and died
    await write_rows(store, crashed, rows)
    _set_mtime(store, crashed.data_key, 1010.0)
    v2 = allocate_version("c", cur1)
    await write_rows(store, v2, rows)
    _set_mtime(store, v2.data_key, 1100.0)  # written well before its install
    clock.now = 1150.0
    assert (await install_version(store, v2, offset=3, rows=1)).installed
    _set_mtime(store, versions.current_key("c"), 1150.0)
    cur2 = await read_current(store, "c")
    assert cur2 is not None

    v3 = allocate_version("c", cur2)
    await write_rows(store, v3, rows)
    _set_mtime(store, v3.data_key, 1160.0)
    clock.now = 1160.0
    assert (await install_version(store, v3, offset=4, rows=1)).installed
    _set_mtime(store, versions.current_key("c"), 1160.0)
    cur3 = await read_current(store, "c")
    assert cur3 is not None

    # The store's clock reads 1400 (the pointer dated then, as if rewritten): 250 s after v1
    # stopped being current (390 s after the crashed attempt's write), too early.
    _set_mtime(store, versions.current_key("c"), 1400.0)
    report = await prune_versions(store, cur3, "c", keep=2, grace_s=300.0)
    assert v1.data_key not in report.deleted
    assert await store.head(v1.data_key) is not None
    # Once the grace has passed since v2's install, v1 goes.
    _set_mtime(store, versions.current_key("c"), 1451.0)
    report = await prune_versions(store, cur3, "c", keep=2, grace_s=300.0)
    assert v1.data_key in report.deleted


async def test_install_records_its_time_and_keeps_a_bounded_history(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    rows = [Row(id="a", document="x", metadata={}, embedding=None)]
    cur = None
    for i in range(versions.HISTORY_LIMIT + 3):
        pending = allocate_version("c", cur)
        await write_rows(store, pending, rows)
        assert (
            await install_version(store, pending, offset=i + 2, rows=1, now=100.0 + i)
        ).installed
        cur = await read_current(store, "c")
        assert cur is not None and cur.installed_at == 100.0 + i
    assert cur is not None
    assert len(cur.history) == versions.HISTORY_LIMIT
    assert cur.history[0] == (cur.version, cur.installed_at)
    assert [v for v, _ in cur.history] == sorted((v for v, _ in cur.history), reverse=True)


# ---------------------------------------------------------- item 5: verify before folding


def _fragment(path: Path, bodies: list[bytes], start: int = 1, ts: int = 7) -> Setsum:
    offsets = list(range(start, start + len(bodies)))
    table = pa.table(
        {
            "offset": pa.array(offsets, pa.uint64()),
            "timestamp_us": pa.array([ts] * len(bodies), pa.uint64()),
            "body": pa.array(bodies, pa.binary()),
        }
    )
    pq.write_table(table, path)
    return Setsum.of_items(record_item(o, ts, b) for o, b in zip(offsets, bodies, strict=True))


def test_fragment_with_rewritten_body_fails_its_setsum(tmp_path: Path) -> None:
    """Valid Parquet, same offsets, same size, one body rewritten: the setsum catches it."""
    good = b'{"id":"a","op":"add","document":"original"}'
    recorded = _fragment(tmp_path / "f.parquet", [good])
    _fragment(tmp_path / "f.parquet", [good.replace(b"original", b"TAMPERED")])
    task = FragmentTask(
        cidx=0,
        url=(tmp_path / "f.parquet").as_uri(),
        start=1,
        limit=2,
        lo=1,
        hi=2,
        setsum=recorded.hexdigest(),
    )
    out = read_fragment(task)
    assert _error_kind(out) == "corrupt_fragment", out
    # The untampered fragment passes and yields its record.
    _fragment(tmp_path / "f.parquet", [good])
    out = read_fragment(task)
    assert out.column("offset").to_pylist() == [1] and out.column("note").null_count == 1
    assert out.column("id").to_pylist() == [json.loads(good)["id"]]


def test_fragment_failing_its_md5_is_corrupt(tmp_path: Path) -> None:
    _fragment(tmp_path / "f.parquet", [b'{"id":"a","op":"add"}'])
    task = FragmentTask(
        cidx=0,
        url=(tmp_path / "f.parquet").as_uri(),
        start=1,
        limit=2,
        lo=1,
        hi=2,
        content_md5="0" * 32,
    )
    assert _error_kind(read_fragment(task)) == "corrupt_fragment"


def _error_kind(batch: Any) -> str | None:
    """The kind of the error row ``read_fragment`` returned, or None when it read records."""
    if batch.num_rows != 1 or batch.column("offset")[0].as_py() != ERROR_OFFSET:
        return None
    return str(json.loads(batch.column("note")[0].as_py())["kind"])


# ------------------------------------------------------------ item 7: liveness, take-over


def _cand(cid: str, start: int = 1) -> Candidate:
    return Candidate(
        "http://h",
        DirtyLog(tenant="t", collection_id=cid, start=start, limit=start + 10, num_records=10),
    )


class _Source:
    base_url = "http://h"

    def __init__(self, cands: list[Candidate]) -> None:
        self.cands = cands

    async def dirty(
        self, *, min_records: int | None = None, limit: int | None = None, retry: bool = True
    ) -> Any:
        from compactor_client.models import DirtyResult

        return DirtyResult(logs=[c.log for c in self.cands])


async def test_a_stale_member_loses_its_share_at_once(tmp_path: Path) -> None:
    """c2 is listed but its liveness record is old: c1 ranks over {c1} and takes everything."""
    from compactor_client.membership import Liveness

    store = LocalStore(tmp_path / "s")
    now = [10_000.0]
    c2 = Liveness(store, "c2", ttl_s=60, clock=lambda: now[0] - 3600)
    await c2.beat()  # an hour ago
    cands = [_cand(f"col-{i}") for i in range(12)]
    theirs = [c for c in cands if owner_of(c.log.collection_id, ["c1", "c2"]) == "c2"]
    assert theirs, "the seed must give c2 a share"
    sched = Scheduler(
        [_Source(cands)],
        member_id="c1",
        members=["c1", "c2"],
        liveness=Liveness(store, "c1", ttl_s=60, clock=lambda: now[0]),
    )
    sel = await sched.select_round()
    assert {c.log.collection_id for c in sel.selected} == {c.log.collection_id for c in cands}
    assert sel.members == ("c1",)


async def test_a_stalled_owner_is_taken_over_in_rendezvous_order(tmp_path: Path) -> None:
    """Both members look alive (lists disagree, or the owner is stuck): the next member in
    rendezvous order takes a collection once it has made no progress for ``takeover_s``."""
    t = [0.0]
    cands = [_cand(f"col-{i}") for i in range(12)]
    theirs = {
        c.log.collection_id for c in cands if owner_of(c.log.collection_id, ["c1", "c2"]) == "c2"
    }
    assert theirs
    sched = Scheduler(
        [_Source(cands)], member_id="c1", members=["c1", "c2"], takeover_s=100.0, clock=lambda: t[0]
    )
    first = await sched.select_round()
    assert not theirs & {c.log.collection_id for c in first.selected}
    t[0] = 99.0
    assert not theirs & {c.log.collection_id for c in (await sched.select_round()).selected}
    t[0] = 100.0
    later = await sched.select_round()
    assert theirs <= {c.log.collection_id for c in later.selected}
    assert later.taken_over == len(theirs)
    # Progress by the owner (the dirty start moved) restarts the clock.
    moved = [_cand(c.log.collection_id, 5) if c.log.collection_id in theirs else c for c in cands]
    sched.sources = [_Source(moved)]
    t[0] = 150.0
    assert not theirs & {c.log.collection_id for c in (await sched.select_round()).selected}
