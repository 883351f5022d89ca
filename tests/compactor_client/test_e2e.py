"""End to end: real log hosts (local store and moto), ``compactor run --once`` as a process."""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from compactor_client.reader import read_collection
from verify.oracle import reference_fold
from wal3 import LocalStore

from ..host.live import SERVICE_KEY, live_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def random_records(rng: random.Random, n: int, ids: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(n):
        rid = f"doc-{rng.randrange(ids)}"
        op = rng.choice(["add", "add", "upsert", "upsert", "update", "delete"])
        rec: dict[str, Any] = {"id": rid, "op": op}
        if op != "delete":
            if rng.random() < 0.7:
                rec["document"] = f"text {rng.randrange(1000)}"
            if rng.random() < 0.6:
                rec["metadata"] = {
                    f"k{rng.randrange(4)}": rng.choice(
                        [None, rng.randrange(100), f"v{rng.randrange(9)}", True, 0.5]
                    )
                    for _ in range(rng.randint(1, 3))
                }
            if rng.random() < 0.5:
                rec["embedding"] = [round(rng.uniform(-1, 1), 3) for _ in range(4)]
        out.append(rec)
    return out


def run_compactor(
    hosts: list[str], store: str, env: dict[str, str], *extra: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "compactor_client",
            "run",
            "--hosts",
            ",".join(hosts),
            "--store",
            store,
            "--spark-master",
            "local[2]",
            "--once",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def compacted_rows(out_dir: Path, cid: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    current = json.loads((out_dir / f"compacted/{cid}/CURRENT.json").read_text())
    state = read_collection(str(out_dir), cid)  # the documented reader: every run, merged
    assert (state.version, state.offset) == (current["version"], current["offset"])
    rows = {}
    for row in state.table.to_pylist():
        emb = row["embedding"]
        rows[row["id"]] = {
            "document": row["document"],
            "metadata": json.loads(row["metadata"]),
            "embedding": None if emb is None else [round(x, 3) for x in emb],
        }
    return current, rows


def assert_matches(out_dir: Path, cid: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    current, got = compacted_rows(out_dir, cid)
    want = reference_fold(records)
    assert set(got) == set(want), cid
    for rid, row in want.items():
        assert got[rid]["document"] == row["document"], (cid, rid)
        assert got[rid]["metadata"] == row["metadata"], (cid, rid)
        assert got[rid]["embedding"] == row["embedding"], (cid, rid)
    assert current["format"] == 2 and current["rows"] >= len(want)
    return current


async def test_compactor_round_trip_on_local_and_s3_hosts(
    tmp_path: Path, moto_endpoint: str, s3_bucket: str
) -> None:
    rng = random.Random(6)
    out_dir = tmp_path / "compacted-store"
    env = dict(
        os.environ,
        COMPACTOR_API_KEY=SERVICE_KEY,
        AWS_ENDPOINT_URL=moto_endpoint,
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY="testing",
        AWS_REGION="us-east-1",
        COMPACTOR_PROGRESS="0",
    )
    written: dict[tuple[int, str], list[dict[str, Any]]] = {}
    os.environ["AWS_ENDPOINT_URL"] = moto_endpoint
    try:
        async with (
            live_server(str(tmp_path / "local"), gc_grace_s=0) as a,
            live_server(f"s3://{s3_bucket}/hostb", gc_grace_s=0) as b,
        ):
            hosts = [a, b]
            for h, live in enumerate(hosts):
                async with live.client() as c:
                    for j in range(3):
                        cid = str(uuid.UUID(int=(h << 8) + j + 1, version=4))
                        tenant = "alice" if j % 2 else "bob"
                        recs = random_records(rng, 60, 12)
                        written[(h, cid)] = recs
                        for i in range(0, len(recs), 7):  # several fragments per log
                            r = await c.post(
                                f"/v1/tenants/{tenant}/logs/{cid}/records",
                                json={"records": recs[i : i + 7]},
                            )
                            assert r.status_code == 200, r.text
                    assert (await c.post("/v1/dirty/rollup")).status_code == 200

            urls = [a.url, b.url]
            done = await asyncio.to_thread(run_compactor, urls, str(out_dir), env)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            first_versions = {}
            for (h, cid), recs in written.items():
                first_versions[cid] = assert_matches(out_dir, cid, recs)
                async with hosts[h].client() as c:
                    tenant = await _tenant_of(c, cid)
                    st = (await c.get(f"/v1/tenants/{tenant}/logs/{cid}")).json()
                    assert st["compaction_offset"] == st["next_offset"] == len(recs) + 1
            for live in hosts:
                async with live.client() as c:
                    assert (await c.get("/v1/dirty", params={"min_records": 0})).json()[
                        "logs"
                    ] == []
                    # GC reclaims everything compacted but the root's last fragment, which fences
                    # writers (grace 0: apply, then delete; each pass drops at most 90 %).
                    for h, cid in written:
                        if hosts[h] is not live:
                            continue
                        tenant = await _tenant_of(c, cid)
                        for _ in range(20):
                            r = await c.post(f"/v1/tenants/{tenant}/logs/{cid}/gc")
                            assert r.status_code == 200, r.text
                            if r.json()["phase"] == "idle":
                                break
                        st = (await c.get(f"/v1/tenants/{tenant}/logs/{cid}")).json()
                        assert st["fragments"] == 1 and st["oldest_offset"] < st["next_offset"]
                        if st["oldest_offset"] > 1:
                            r = await c.get(
                                f"/v1/tenants/{tenant}/logs/{cid}/records", params={"from": 1}
                            )
                            assert r.status_code == 410 and r.json()["error"]["code"] == "purged"

            # Round two builds on the previous version.
            for (h, cid), recs in list(written.items())[::2]:
                more = random_records(rng, 25, 12)
                async with hosts[h].client() as c:
                    tenant = await _tenant_of(c, cid)
                    r = await c.post(
                        f"/v1/tenants/{tenant}/logs/{cid}/records", json={"records": more}
                    )
                    assert r.status_code == 200
                recs.extend(more)
            for live in hosts:
                async with live.client() as c:
                    await c.post("/v1/dirty/rollup")
            done = await asyncio.to_thread(run_compactor, urls, str(out_dir), env)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            for i, ((_h, cid), recs) in enumerate(written.items()):
                current = assert_matches(out_dir, cid, recs)
                if i % 2 == 0:
                    assert current["version"] == first_versions[cid]["version"] + 1
                    assert current["offset"] == len(recs) + 1
                else:
                    assert current == first_versions[cid]
    finally:
        os.environ.pop("AWS_ENDPOINT_URL", None)


async def _tenant_of(c: Any, cid: str) -> str:
    for tenant in ("alice", "bob"):
        if (await c.get(f"/v1/tenants/{tenant}/logs/{cid}")).status_code == 200:
            return tenant
    raise AssertionError(f"no tenant owns {cid}")


async def test_two_compactors_two_hosts_each_collection_once(tmp_path: Path) -> None:
    rng = random.Random(7)
    out_dir = tmp_path / "out"
    env = dict(os.environ, COMPACTOR_API_KEY=SERVICE_KEY, COMPACTOR_PROGRESS="0")
    written: dict[str, list[dict[str, Any]]] = {}
    async with live_server(str(tmp_path / "s1")) as a, live_server(str(tmp_path / "s2")) as b:
        for h, live in enumerate((a, b)):
            async with live.client() as c:
                for j in range(8):
                    cid = str(uuid.UUID(int=(h << 8) + j + 1, version=4))
                    recs = random_records(rng, 20, 6)
                    written[cid] = recs
                    r = await c.post(
                        f"/v1/tenants/alice/logs/{cid}/records", json={"records": recs}
                    )
                    assert r.status_code == 200
                await c.post("/v1/dirty/rollup")
        urls = [a.url, b.url]
        runs = await asyncio.gather(
            *(
                asyncio.to_thread(
                    run_compactor, urls, str(out_dir), env, "--member-id", m, "--members", "c1,c2"
                )
                for m in ("c1", "c2")
            )
        )
        for done in runs:
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for cid, recs in written.items():
            current = assert_matches(out_dir, cid, recs)
            assert current["version"] == 1  # compacted exactly once this round
        # Racing duplicates (two compactors on the same collections) are covered without two
        # more Spark start-ups by test_pipeline.py::test_racing_pipelines_never_corrupt_current.
        store = LocalStore(out_dir)
        versions = [m.key async for m in store.list("compacted/") if m.key.endswith(".parquet")]
        assert len(versions) == len(written)  # no duplicate work left behind
