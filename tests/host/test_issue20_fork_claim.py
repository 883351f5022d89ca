"""Issue 20, findings r1, r1b and r2 (were ``verify/repro/r1_fork_leftover_cursor.py``,
``r1b_fork_races_append.py``, ``r2_concurrent_forks.py``): a fork's target is created by one
attempt at a time, and the log created there never inherits another attempt's compaction cursor,
``CURRENT.json``, compacted versions or copied fragments.

* r1: a fork fails at its commit point (store errors on the target's manifest); the tenant then
  writes the target itself.  Before: the new log kept the fork's cursor (11, past its tail) and
  compacted base.
* r1b: the tenant's first append lands while a fork is between its cursor write and its manifest.
  Before: the append created the log, which kept the fork's cursor, and the fork answered 409.
* r2: two forks into one target, interleaved.  Before: the winner kept the loser's cursor and
  ``CURRENT.json`` (case 1: another source's; case 2: the same source's older version, below the
  log's start).
* A crashed fork's copied fragments are not adopted by the log created there later.

Real host (``tests/host/live.py``) on a local store, or the fork code on a local store;
interleavings forced with gates, claims expired by moving the claim watch's clock.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from host.forks import current_key, fork_collection
from host.manager import log_prefix
from wal3 import FaultRule, FaultyStore, LocalStore, LogWriter, ObjectStore
from wal3.cursors import COMPACTION, CursorStore
from wal3.errors import LogContention, LogExists, ObjectNotFound
from wal3.layout import load_manifest

from ..wal3.helpers import GateStore
from .claimkit import TTL_S, source_with_version, stepped_watch
from .live import Live, live_server, log_path, read_all, record

SRC = "00000000-0000-4000-8000-000000000001"
DST = "00000000-0000-4000-8000-000000000002"


async def _append_to_target(
    live: Live, alice: httpx.AsyncClient, n: int, tag: str, advance: Callable[[], None]
) -> httpx.Response:
    """Append to DST; a 409 ``contention`` is the failed fork's claim standing: wait it out."""
    body = {"records": [record(f"{tag}-{i}") for i in range(n)]}
    r = await alice.post(log_path("alice", DST) + "/records", json=body)
    if r.status_code == 409 and r.json()["error"]["code"] == "contention":
        advance()
        r = await alice.post(log_path("alice", DST) + "/records", json=body)
    assert r.status_code == 200, r.text
    return r


async def _compacted_keys(store: ObjectStore, cid: str) -> list[str]:
    return [m.key async for m in store.list(f"compacted/{cid}/")]


async def test_r1_a_failed_forks_cursor_and_base_are_not_inherited(tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "store")
    faulty = FaultyStore(base, seed=1)
    async with (
        live_server(store=faulty, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        watch, clock = stepped_watch()
        live.server.manager.claims = watch  # (an attribute the fix adds; harmless before)
        await source_with_version(base, alice, svc, SRC, 5)
        # The fork hits a store outage on the target's manifest (its commit point).
        rule = faulty.add_rule(
            FaultRule("error", ops={"put"}, key_regex=rf"{DST}/manifest/MANIFEST$", times=4)
        )
        r = await svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        assert r.status_code != 200 and rule.fired == 4, r.text
        faulty.disable()

        # The tenant gives up on the fork and writes the target itself.  (The fork's manifest
        # put may still land: its claim holds the target until it expires.)
        acked = [
            (await _append_to_target(live, alice, 2, f"t{n}", lambda: clock.advance(TTL_S))).json()
            for n in range(3)
        ]
        assert [(a["first_offset"], a["next_offset"]) for a in acked] == [(1, 3), (3, 5), (5, 7)]
        st = (await svc.get(log_path("alice", DST))).json()
        assert (st["oldest_offset"], st["next_offset"]) == (1, 7)
        assert st["compaction_offset"] == 1, st  # before the fix: the fork's 11, past the tail
        assert await _compacted_keys(base, DST) == []  # no inherited base, no copied version
        assert await CursorStore(base, log_prefix(uuid.UUID(DST)), "t").load(COMPACTION) is None
        r = await svc.post(log_path("alice", DST) + "/gc")  # no cursor: nothing to collect
        assert r.status_code == 409 and r.json()["error"]["code"] == "no_cursors", r.text
        records = await read_all(alice, log_path("alice", DST), 1)
        assert [x["record"]["id"] for x in records] == [
            f"t{n}-{i}" for n in range(3) for i in range(2)
        ]
        r = await svc.post("/v1/dirty/rollup")
        spans = {e["collection_id"]: e["start"] for e in r.json()["logs"]}
        assert spans.get(DST) == 1, spans


async def test_r1b_a_first_append_during_a_fork_does_not_create_the_target(tmp_path: Path) -> None:
    base = LocalStore(tmp_path / "store")
    store = GateStore(base)
    async with (
        live_server(store=store, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        await source_with_version(base, alice, svc, SRC, 5)
        gate = store.hold("put", rf"logs/{DST}/manifest/MANIFEST$")
        fork = asyncio.create_task(
            svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        )
        try:
            await gate.reached.wait()  # cursor, base and mark written; manifest on its way
            during = await alice.post(
                log_path("alice", DST) + "/records", json={"records": [record("t0"), record("t1")]}
            )
        finally:
            gate.release.set()
        forked = await fork
        st = (await svc.get(log_path("alice", DST))).json()
        # One creator: the target is the fork, whole (before: the tenant's [1, 3) with cursor 11).
        assert st["oldest_offset"] <= st["compaction_offset"] <= st["next_offset"], st
        assert forked.status_code == 200, forked.text
        assert (st["compaction_offset"], st["next_offset"]) == (11, 16), st
        assert during.status_code == 409 and during.json()["error"]["code"] == "contention"
        # The tenant's retry appends to the forked log.
        r = await alice.post(
            log_path("alice", DST) + "/records", json={"records": [record("t0"), record("t1")]}
        )
        assert r.status_code == 200 and r.json()["first_offset"] == 16, r.text


async def test_a_crashed_forks_copied_fragments_are_not_adopted(tmp_path: Path) -> None:
    """A fork that died before its manifest left copies of the source's fragments at the
    target (the first with the empty log's ``prev``): the log created there must not link them
    by read repair."""
    base = LocalStore(tmp_path / "store")
    faulty = FaultyStore(base, seed=1)
    async with (
        live_server(store=faulty, gc_grace_s=0.0) as live,
        live.client("alice-key") as alice,
        live.client() as svc,
    ):
        watch, clock = stepped_watch()
        live.server.manager.claims = watch
        for n in range(3):
            r = await alice.post(
                log_path("alice", SRC) + "/records",
                json={"records": [record(f"s{n}-{i}") for i in range(5)]},
            )
            assert r.status_code == 200, r.text
        faulty.add_rule(
            FaultRule("crash_before", ops={"put"}, key_regex=rf"{DST}/manifest/MANIFEST$", times=1)
        )
        r = await svc.post(log_path("alice", SRC) + "/fork", json={"target_collection_id": DST})
        assert r.status_code != 200
        faulty.disable()
        copied = [m.key async for m in base.list(f"logs/{DST}/log/")]
        assert copied, "the crashed fork copied the source's fragments"

        await _append_to_target(live, alice, 2, "t", lambda: clock.advance(TTL_S))
        records = await read_all(alice, log_path("alice", DST), 1)
        assert [x["record"]["id"] for x in records] == ["t-0", "t-1"]


# ------------------------------------------------------------------------------ r2, engine


U = uuid.UUID


def _u(n: int) -> uuid.UUID:
    return uuid.UUID(int=n, version=4)


async def _mklog(store: ObjectStore, cid: U, batches: int, n: int = 5) -> None:
    w = await LogWriter.open(store, log_prefix(cid))
    for b in range(batches):
        await w.append_many(
            [json.dumps({"id": f"{cid.int}-{b}-{i}", "op": "add"}).encode() for i in range(n)]
        )
    await w.close()


async def _set_version(store: ObjectStore, cid: U, version: int, offset: int) -> None:
    path = f"compacted/{cid}/v{version:016d}/part-x.parquet"
    await store.put(path, f"version {version} of {cid}".encode())
    await store.put(
        current_key(cid),
        json.dumps({"version": version, "offset": offset, "rows": 1, "path": path}).encode(),
    )


Mark = Callable[[U, int, int], Awaitable[None]]


async def _fork(store: ObjectStore, src: U, dst: U, offset: int, mark: Mark) -> Any:
    loaded = await load_manifest(store, log_prefix(src))
    assert loaded is not None
    return await fork_collection(
        store,
        source=src,
        target=dst,
        source_prefix=log_prefix(src),
        target_prefix=log_prefix(dst),
        source_manifest=loaded[0],
        offset=offset,
        writer_name="t",
        mark_dirty=mark,
    )


async def _outcome(task: Awaitable[Any]) -> str:
    try:
        await task
    except (LogExists, LogContention) as e:  # did not commit: refused, or lost the manifest
        return type(e).__name__
    return "committed"


async def _assert_whole(store: ObjectStore, dst: U) -> tuple[int, int, int]:
    """The target's cursor stands on its CURRENT.json (or at 1 with none), inside its log;
    returns (oldest, cursor, next)."""
    loaded = await load_manifest(store, log_prefix(dst))
    assert loaded is not None
    m = loaded[0]
    c = await CursorStore(store, log_prefix(dst), "t").load(COMPACTION)
    assert c is not None
    try:
        cur: dict[str, Any] | None = json.loads((await store.get(current_key(dst))).data)
    except ObjectNotFound:
        cur = None
    assert c.cursor.offset == (cur["offset"] if cur is not None else 1), (c.cursor.offset, cur)
    assert m.oldest_offset <= c.cursor.offset <= m.next_offset, (
        m.oldest_offset,
        c.cursor.offset,
        m.next_offset,
    )
    if cur is not None:
        assert cur["path"].startswith(f"compacted/{dst}/")
        await store.head(cur["path"])
    return m.oldest_offset, c.cursor.offset, m.next_offset


async def test_r2_two_forks_from_two_sources_into_one_target(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    sa, sb, t = _u(1), _u(2), _u(3)
    await _mklog(store, sa, 3)  # [1, 16), compacted to 11
    await _set_version(store, sa, 1, 11)
    await _mklog(store, sb, 5, n=1)  # [1, 6), never compacted
    first_marked, second_marked, first_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def mark_first(cid: U, s: int, n: int) -> None:
        first_marked.set()
        await second_marked.wait()  # the second fork writes its cursor and base meanwhile

    async def mark_second(cid: U, s: int, n: int) -> None:
        second_marked.set()
        await first_done.wait()  # the first commits before our manifest

    async def run_first() -> Any:
        try:
            return await _fork(store, sb, t, 6, mark_first)
        finally:
            first_done.set()

    first = asyncio.create_task(run_first())
    await first_marked.wait()
    second_outcome = await _outcome(_fork(store, sa, t, 16, mark_second))
    second_marked.set()  # (refused before marking: let the first go on)
    first_outcome = await _outcome(first)
    assert (first_outcome, second_outcome) in {
        ("committed", "LogExists"),
        ("committed", "CreationInProgress"),
    }
    # sb's fork: never compacted, so no base and the cursor at 1 (before: sa's 11 and base).
    assert await _assert_whole(store, t) == (1, 1, 6)


async def test_r2_a_retried_fork_around_a_compactor_install(tmp_path: Path) -> None:
    """Same source, a retry with another offset while the first attempt is in flight, and a
    compactor installs a new version in between."""
    base = LocalStore(tmp_path / "s")
    store = GateStore(base)
    s, t = _u(4), _u(5)
    await _mklog(base, s, 3)  # [1, 16)
    await _set_version(base, s, 1, 6)  # v1 @ 6
    gate = store.hold("put", rf"logs/{t}/log/")  # one of its copies, before its cursor
    first_marked, second_over = asyncio.Event(), asyncio.Event()

    async def mark_first(cid: U, st: int, n: int) -> None:
        first_marked.set()
        await second_over.wait()

    async def mark_second(cid: U, st: int, n: int) -> None:
        gate.release.set()  # the first attempt now writes its cursor and base ...
        await first_marked.wait()  # ... after ours, before our manifest (so it was, before)

    first = asyncio.create_task(_fork(store, s, t, 6, mark_first))
    await gate.reached.wait()  # attempt 1 read v1 @ 6 and is copying objects
    await _set_version(base, s, 2, 11)  # a compactor installs v2 @ 11
    second = asyncio.create_task(_fork(store, s, t, 11, mark_second))
    second_outcome = await _outcome(second)
    second_over.set()
    gate.release.set()
    first_outcome = await _outcome(first)
    assert "committed" in (first_outcome, second_outcome), (first_outcome, second_outcome)
    await _assert_whole(base, t)  # before: cursor 6 below the log's start 11
