"""The dirty log through a real server: 48-byte marks per fragment, roll-up, the pull API."""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Sequence
from pathlib import Path

import pytest

from dirtylog import DirtyLogHook, DirtyRecord, RecordKind, RollUp
from host.dirty import WalDirtyBackend, dirty_prefix
from host.manager import log_prefix
from wal3 import FaultRule, FaultyStore, LocalStore, LogReader, LogWriter, ObjectStore
from wal3.cursors import CursorStore
from wal3.faulty import FaultKind
from wal3.gc import GcOptions
from wal3.layout import load_manifest

from .live import live_server, record


def _ids(n: int) -> list[str]:
    return [str(uuid.UUID(int=0xABC0000 + i, version=4)) for i in range(n)]


async def _dirty_records(store: LocalStore, server_id: str) -> list[bytes]:
    reader = LogReader(store, dirty_prefix(server_id))
    m = await reader.manifest()
    return [r.body for r in await reader.read(m.oldest_offset, manifest=m)]


async def test_one_mark_per_fragment_and_the_pull_api(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    async with live_server(str(store_dir)) as live:
        ids = _ids(6)
        async with live.client() as c:
            # Concurrent appends per collection: group commit makes fewer fragments than calls.
            async def write(cid: str, n: int) -> None:
                await asyncio.gather(
                    *(
                        c.post(
                            f"/v1/tenants/alice/logs/{cid}/records",
                            json={"records": [record(f"{cid}-{i}")]},
                        )
                        for i in range(n)
                    )
                )

            await asyncio.gather(*(write(cid, 3 + i) for i, cid in enumerate(ids)))
            store = LocalStore(store_dir)
            fragments = 0
            for cid in ids:
                loaded = await load_manifest(store, log_prefix(uuid.UUID(cid)))
                assert loaded is not None
                fragments += loaded[0].next_seq_no - 1
            bodies = await _dirty_records(store, live.settings.server_id)
            assert all(len(b) == 48 for b in bodies)
            marks = [DirtyRecord.decode(b) for b in bodies]
            assert all(m.kind == RecordKind.MARK_DIRTY and m.reinsert_count == 0 for m in marks)
            assert len(marks) == fragments  # exactly one 48-byte record per fragment

            r = await c.post("/v1/dirty/rollup")
            assert r.status_code == 200
            body = r.json()
            assert body["server_id"] == live.settings.server_id
            listed = {e["collection_id"]: e for e in body["logs"]}
            assert set(listed) == set(ids)
            for i, cid in enumerate(ids):
                e = listed[cid]
                assert (e["tenant"], e["start"], e["limit"], e["num_records"]) == (
                    "alice",
                    1,
                    4 + i,
                    3 + i,
                )
                assert set(e) == {
                    "tenant",
                    "collection_id",
                    "start",
                    "limit",
                    "num_records",
                    "first_insertion_us",
                    "reinsert_count",
                    "score",
                }
            scores = [e["score"] for e in (await c.get("/v1/dirty")).json()["logs"]]
            assert scores == sorted(scores, reverse=True)
            assert len((await c.get("/v1/dirty", params={"min_records": 7})).json()["logs"]) == 2

            # Compaction to the tail drops a collection at the next roll-up ...
            for cid in ids[:3]:
                tail = (await c.get(f"/v1/tenants/alice/logs/{cid}")).json()["next_offset"]
                r = await c.post(f"/v1/tenants/alice/logs/{cid}/compaction", json={"offset": tail})
                assert r.json() == {"compaction_offset": tail}
            # (noted in memory at once)
            assert {
                e["collection_id"]
                for e in (await c.get("/v1/dirty", params={"min_records": 0})).json()["logs"]
            } == set(ids[3:])
            r = await c.post("/v1/dirty/rollup")
            assert {e["collection_id"] for e in r.json()["logs"]} == set(ids[3:])
            # ... partial compaction narrows the range ...
            r = await c.post(f"/v1/tenants/alice/logs/{ids[3]}/compaction", json={"offset": 3})
            r = await c.post("/v1/dirty/rollup")
            e = {e["collection_id"]: e for e in r.json()["logs"]}[ids[3]]
            assert (e["start"], e["limit"], e["num_records"]) == (3, 7, 4)
            # ... and new appends bring a compacted collection back.
            await c.post(
                f"/v1/tenants/alice/logs/{ids[0]}/records", json={"records": [record("again")]}
            )
            r = await c.post("/v1/dirty/rollup")
            back = {e["collection_id"]: e for e in r.json()["logs"]}[ids[0]]
            assert back["start"] == back["limit"] - 1

            # Purge drops a collection; inspect decodes raw records for operators.
            r = await c.post("/v1/dirty/purge", json={"collection_ids": [ids[5]]})
            assert r.status_code == 200
            r = await c.post("/v1/dirty/rollup")
            assert ids[5] not in {e["collection_id"] for e in r.json()["logs"]}
            inspected = (await c.get("/v1/dirty/inspect", params={"limit": 5})).json()
            assert inspected["records"] and "kind" in str(inspected["records"][0])
            assert (
                await c.get("/v1/dirty", headers={"Authorization": "Bearer alice-key"})
            ).status_code == 403

            metrics = (await c.get("/metrics")).text
            for name in (
                "loghost_dirty_collections ",
                "loghost_dirty_oldest_uncompacted_age_seconds",
                "loghost_rollup_duration_seconds_count",
                "loghost_dirty_reinsertions_total",
                "loghost_dirty_untracked_collections 0.0",
            ):
                assert name in metrics, name


@pytest.mark.parametrize(
    "crash",
    [
        ("crash_after", r"dirty/srv/manifest/MANIFEST$", 0),  # re-append landed, not seen
        ("crash_before", r"dirty/srv/manifest/MANIFEST$", 0),  # re-append lost
        ("crash_before", r"cursor/stable_prefix\.json$", 1),  # cursor not advanced
        ("crash_after", r"cursor/stable_prefix\.json$", 1),  # cursor advanced, not seen
        ("crash_after", r"dirty/srv/gc/GARBAGE$", 0),  # in the dirty log's own GC
    ],
)
async def test_rollup_crash_at_each_step_loses_nothing(
    tmp_path: Path, crash: tuple[FaultKind, str, int]
) -> None:
    kind, key, after = crash
    base = LocalStore(tmp_path / "s")
    ids = [uuid.UUID(int=i + 1, version=4) for i in range(5)]
    compacted: dict[uuid.UUID, int] = {}

    class Offsets:
        async def compaction_offsets(self, wanted: Sequence[uuid.UUID]) -> dict[uuid.UUID, int]:
            return {c: compacted[c] for c in wanted if c in compacted}

    async def open_backend(store: ObjectStore) -> WalDirtyBackend:
        w = await LogWriter.open(store, dirty_prefix("srv"))
        return WalDirtyBackend(store, dirty_prefix("srv"), w, GcOptions(grace_s=0))

    backend = await open_backend(base)
    hook = DirtyLogHook(backend)
    for i, cid in enumerate(ids):
        await hook.mark_dirty(cid, 1, 10 + i)
    await RollUp(backend, Offsets()).run()  # a first, clean roll-up
    compacted[ids[0]] = 11  # fully compacted
    compacted[ids[1]] = 5  # partly
    await hook.mark_dirty(ids[2], 13, 2)
    await backend.writer.close()

    faulty = FaultyStore(base, seed=3)
    rule = faulty.add_rule(FaultRule(kind, ops={"put"}, key_regex=key, after=after, times=1))
    crashed_backend = await open_backend(faulty)
    crashed = None
    for _ in range(3):
        try:
            result = await RollUp(crashed_backend, Offsets()).run()
        except Exception as e:
            crashed = e
            break
        if result.gc_error is not None:  # GC is best effort inside a roll-up
            crashed = result.gc_error
            break
    assert rule.fired == 1 and crashed is not None
    faulty.disable()
    fresh = await open_backend(faulty)
    result = await RollUp(fresh, Offsets()).run()
    ranges = {cid: (e.start, e.limit) for cid, e in result.entries.items()}
    assert ranges == {ids[1]: (5, 12), ids[2]: (1, 15), ids[3]: (1, 14), ids[4]: (1, 15)}
    # And it keeps converging.
    again = await RollUp(fresh, Offsets()).run()
    assert {cid: (e.start, e.limit) for cid, e in again.entries.items()} == ranges
    await fresh.writer.close()


async def test_no_collection_with_uncompacted_records_falls_out(tmp_path: Path) -> None:
    """Seeded random appends, compactions and roll-ups: the invariant after every roll-up."""
    rng = random.Random(20261122)
    async with live_server(str(tmp_path / "store")) as live:
        server = live.server
        ids = [uuid.UUID(int=0x5000 + i, version=4) for i in range(12)]
        async with live.client() as c:
            for step in range(60):
                op = rng.random()
                cid = rng.choice(ids)
                if op < 0.55:
                    n = rng.randint(1, 4)
                    r = await c.post(
                        f"/v1/tenants/alice/logs/{cid}/records",
                        json={"records": [record(f"{step}-{j}") for j in range(n)]},
                    )
                    assert r.status_code == 200
                elif op < 0.8:
                    st = await c.get(f"/v1/tenants/alice/logs/{cid}")
                    if st.status_code == 200:
                        body = st.json()
                        target = rng.randint(body["compaction_offset"], body["next_offset"])
                        r = await c.post(
                            f"/v1/tenants/alice/logs/{cid}/compaction", json={"offset": target}
                        )
                        assert r.status_code == 200
                else:
                    before = {
                        h.collection_id: h.writer.manifest.next_offset
                        for h in server.manager.handles()
                    }
                    await server.rollup_now()
                    assert server.untracked_collections(before) == set()
                    assert server.dirty is not None
                    entries = server.dirty.rollup.entries()
                    for h in server.manager.handles():
                        comp = h.compaction_offset
                        if h.collection_id in before and before[h.collection_id] > comp:
                            e = entries[h.collection_id]
                            assert e.start <= comp and e.limit >= before[h.collection_id]
            metrics = (await c.get("/metrics")).text
            assert "loghost_dirty_untracked_collections 0.0" in metrics
        # The dirty log's consumed prefix is reclaimed by its own GC over time.
        cursor = await CursorStore(server.store, dirty_prefix(live.settings.server_id), "t").load(
            "stable_prefix"
        )
        assert cursor is not None and cursor.cursor.offset > 1


async def test_a_departed_servers_dirty_set_is_adopted(tmp_path: Path) -> None:
    """Scale-in without a drain: another host adopts the removed host's dirty log."""
    store_dir = str(tmp_path / "store")
    ids = _ids(4)
    async with live_server(store_dir, server_id="gone") as gone, gone.client() as c:
        for i, cid in enumerate(ids):
            r = await c.post(
                f"/v1/tenants/alice/logs/{cid}/records",
                json={"records": [record(f"r{j}") for j in range(i + 1)]},
            )
            assert r.status_code == 200, r.text
        # ids[0] gets compacted before the host goes: it must not be handed over.
        r = await c.post(f"/v1/tenants/alice/logs/{ids[0]}/compaction", json={"offset": 2})
        assert r.status_code == 200
    # "gone" is stopped (its pod removed); "live" shares the store and never wrote these logs.
    async with live_server(store_dir, server_id="live") as live, live.client() as c:
        assert (await c.post("/v1/dirty/rollup")).json()["logs"] == []
        r = await c.post("/v1/dirty/adopt", json={"server_id": "gone"})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["adopted_server_id"] == "gone" and body["collections"] == 3
        listed = {e["collection_id"]: e for e in (await c.get("/v1/dirty")).json()["logs"]}
        assert {k: (e["tenant"], e["start"], e["limit"]) for k, e in listed.items()} == {
            ids[1]: ("alice", 1, 3),
            ids[2]: ("alice", 1, 4),
            ids[3]: ("alice", 1, 5),
        }
        # A second adoption finds nothing new; bad requests are refused with the error shape.
        again = await c.post("/v1/dirty/adopt", json={"server_id": "gone"})
        assert again.status_code == 200 and again.json()["collections"] == 0
        for bad, status in (
            (json_body("live"), 400),
            (json_body("nobody"), 404),
            (json_body("a/b"), 400),
            (json_body(".."), 400),
            ({"server_id": 7}, 400),
            ({}, 400),
        ):
            r = await c.post("/v1/dirty/adopt", json=bad)
            assert r.status_code == status, (bad, r.text)
            assert set(r.json()["error"]) >= {"code", "message"}
        tenant_key = {"Authorization": "Bearer alice-key"}
        assert (
            await c.post("/v1/dirty/adopt", json=json_body("gone"), headers=tenant_key)
        ).status_code == 403
    # The departed host comes back after all: it finds its set handed over (nothing lost, no
    # stale entries), and new writes are tracked by it as usual.
    async with live_server(store_dir, server_id="gone") as back, back.client() as c:
        assert (await c.post("/v1/dirty/rollup")).json()["logs"] == []
        await c.post(f"/v1/tenants/alice/logs/{ids[0]}/records", json={"records": [record("n")]})
        assert [e["collection_id"] for e in (await c.post("/v1/dirty/rollup")).json()["logs"]] == [
            ids[0]
        ]


def json_body(server_id: str) -> dict[str, str]:
    return {"server_id": server_id}
