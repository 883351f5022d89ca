"""The compaction pipeline on a real local SparkSession over Parquet fragments in a LocalStore.

One SparkSession for the module (startup is the slow part); each test runs one or two rounds.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import random
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from prometheus_client import CollectorRegistry
from rich.console import Console

from compactor_client import cli, runs
from compactor_client.executor import ERROR_OFFSET, FoldTask, FragmentTask, read_fragment
from compactor_client.fold import fold
from compactor_client.metrics import CompactorMetrics
from compactor_client.models import FragmentInfo
from compactor_client.parquet_io import S3Options, read_run
from compactor_client.pipeline import (
    CompactionPipeline,
    PlanError,
    RoundResult,
    check_coverage,
    run_compaction_job,
)
from compactor_client.reader import read_state
from compactor_client.versions import current_key, read_current
from wal3.localstore import LocalStore

from .kit import (
    HOST,
    FakeLogApi,
    Log,
    Served,
    candidate,
    fragment_bytes,
    local_spark,
    make_host_app,
    normalise,
    random_records,
    state_view,
)


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark("compactor-tests") as session:
        yield session


# ------------------------------------------------------------------------------------ helpers


async def assert_current_matches(store: LocalStore, log: Log, *, version: int) -> None:
    cur = await read_current(store, log.cid)
    assert cur is not None
    assert (cur.version, cur.offset) == (version, log.end)
    expected = fold({}, log.records)
    state = await read_state(store, log.cid)
    assert (state.version, state.offset, state.levels) == (version, log.end, len(cur.runs))
    assert state_view(state.table) == normalise(expected)
    assert state.table.schema.field("embedding").type == pa.list_(pa.float32())
    assert state.table.column("id").to_pylist() == sorted(expected)
    assert cur.rows == sum(r.rows for r in cur.runs) >= len(expected)
    # The bottom run holds rows only: tombstones are dropped there and only there.
    bottom = read_run(store.url_for(cur.runs[-1].key))
    assert set(bottom.column("kind").to_pylist()) <= {runs.ROW}


async def parquet_keys(store: LocalStore, cid: str) -> set[str]:
    return {m.key async for m in store.list(f"compacted/{cid}/") if m.key.endswith(".parquet")}


async def listed_keys(store: LocalStore, cid: str) -> tuple[set[str], set[str]]:
    """(keys the current version lists, keys it records as retired)."""
    cur = await read_current(store, cid)
    assert cur is not None
    return {r.key for r in cur.runs}, {k for k, _ in cur.retired}


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    return registry.get_sample_value(name, labels) or 0.0


# -------------------------------------------------------------------------------------- tests


def test_fragment_task_windows_and_range_checks(tmp_path: Path) -> None:
    """Records below the window start and at/after its end are left out; bad ranges are errors."""
    path = tmp_path / "f.parquet"
    path.write_bytes(fragment_bytes(10, random_records(random.Random(1), 10)))
    url = path.as_uri()
    got = read_fragment(FragmentTask(cidx=3, url=url, start=10, limit=20, lo=13, hi=17))
    assert got.column("offset").to_pylist() == [13, 14, 15, 16]
    assert set(got.column("cidx").to_pylist()) == {3} and got.column("note").null_count == 4
    # A fragment holding offsets outside the range its listing claims is an error, not data.
    bad = read_fragment(FragmentTask(cidx=3, url=url, start=12, limit=20, lo=12, hi=20))
    assert bad.num_rows == 1 and bad.column("offset").to_pylist() == [ERROR_OFFSET]
    assert json.loads(bad.column("note")[0].as_py())["kind"] == "gap"


def test_check_coverage() -> None:
    f = [FragmentInfo(url="u1", start=1, limit=5), FragmentInfo(url="u2", start=5, limit=9)]
    assert check_coverage(f, 3) == (f, 9)
    assert check_coverage(f, 9) == ([], 9)
    with pytest.raises(PlanError):
        check_coverage(f[1:], 1)  # purged below the start
    with pytest.raises(PlanError):
        check_coverage([f[0], FragmentInfo(url="u3", start=6, limit=9)], 1)  # gap


async def test_two_rounds_build_on_previous_version(spark: Any, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    rng = random.Random(7)
    logs = {cid: Log(store, cid) for cid in ["alpha", "beta", "gamma", "delta", "zeta"]}
    for _ in range(3):
        await logs["alpha"].append_fragment(random_records(rng, 40))
    await logs["beta"].append_fragment(random_records(rng, 15))
    await logs["zeta"].append_fragment(random_records(rng, 5))
    await logs["gamma"].append_fragment(random_records(rng, 10))
    await logs["gamma"].append_fragment(random_records(rng, 10))
    del logs["gamma"].fragments[0]  # purged: the log no longer starts at offset 1
    await logs["delta"].append_fragment(random_records(rng, 10), corrupt=True)

    api = FakeLogApi(logs)
    registry = CollectorRegistry()
    pipeline = CompactionPipeline(spark, store, {HOST: api}, metrics=CompactorMetrics(registry))

    r1 = await pipeline.run_round([candidate(log) for log in logs.values()])
    status = {o.collection_id: o for o in r1.outcomes}
    assert {k: o.status for k, o in status.items()} == {
        "alpha": "compacted",
        "beta": "compacted",
        "zeta": "compacted",
        "gamma": "failed",
        "delta": "failed",
    }
    assert status["gamma"].stage == "plan" and "purged" in (status["gamma"].error or "")
    assert status["delta"].stage == "fold"
    assert not r1.ok
    for cid in ("alpha", "beta", "zeta"):
        await assert_current_matches(store, logs[cid], version=1)
    assert sorted(api.compact_calls) == [("alpha", 121), ("beta", 16), ("zeta", 6)]
    # The failed collections have no version, no pointer and no leftover data file.
    for cid in ("gamma", "delta"):
        assert await read_current(store, cid) is None
        assert await parquet_keys(store, cid) == set()
    assert r1.records_in == 140 and sample(registry, "compactor_records_in_total") == 140
    assert sample(registry, "compactor_collections_compacted_total") == 3
    assert sample(registry, "compactor_rows_out_total") == r1.rows_out > 0
    assert sample(registry, "compactor_failures_total", stage="plan") == 1
    assert sample(registry, "compactor_failures_total", stage="fold") == 1
    assert sample(registry, "compactor_rounds_total", outcome="failed") == 1
    assert sample(registry, "compactor_round_seconds_count") == 1

    # ---- round 2: new records on top of version 1
    v1_alpha = (await listed_keys(store, "alpha"))[0]
    await logs["alpha"].append_fragment(random_records(rng, 25))
    # beta's log now lists one fragment that also holds the already-compacted offsets 1..15:
    # they must be skipped (folding them twice would not be idempotent).
    more = random_records(rng, 15)
    beta_all = logs["beta"].records + more
    merged = fragment_bytes(1, beta_all)
    await store.put("logs/beta/merged.parquet", merged)
    logs["beta"].records = beta_all
    logs["beta"].fragments = [
        FragmentInfo(
            url=store.url_for("logs/beta/merged.parquet"),
            start=1,
            limit=31,
            content_md5=hashlib.md5(merged).hexdigest(),
        )
    ]
    # delta's log is repaired; zeta gets nothing new but its cursor was lost behind the data
    # (a crash between installing CURRENT.json and advancing the cursor).
    logs["delta"].records, logs["delta"].fragments = [], []
    await logs["delta"].append_fragment(random_records(rng, 12))
    api.cursors["zeta"] = 1
    api.compact_calls.clear()

    r2 = await pipeline.run_round(
        [
            candidate(logs[c], start=api.cursors.get(c, 1))
            for c in ("alpha", "beta", "delta", "zeta")
        ]
    )
    status = {o.collection_id: o.status for o in r2.outcomes}
    assert status == {
        "alpha": "compacted",
        "beta": "compacted",
        "delta": "compacted",
        "zeta": "skipped",
    }
    assert r2.ok
    await assert_current_matches(store, logs["alpha"], version=2)
    await assert_current_matches(store, logs["beta"], version=2)
    await assert_current_matches(store, logs["delta"], version=1)
    assert {o.collection_id: o.records_in for o in r2.outcomes if o.status == "compacted"} == {
        "alpha": 25,
        "beta": 15,
        "delta": 12,
    }
    assert sorted(api.compact_calls) == [("alpha", 146), ("beta", 31), ("delta", 13), ("zeta", 6)]
    # Version 1 of alpha is still readable: runs are immutable, and the previous version is kept.
    for key in v1_alpha:
        assert await store.get(key)
    assert sample(registry, "compactor_rounds_total", outcome="ok") == 1

    # ---- round 3: version 3 of alpha pushes version 1 out of the kept window (2 by default);
    # with no grace it is deleted right after the install, version 2 stays for its readers.
    v2_alpha = (await listed_keys(store, "alpha"))[0]
    # Prune dates supersession on the store's clock, whole seconds with one second of slack:
    # make version 2's install a minute old (Last-Modified is the file's mtime here).
    for f in (tmp_path / "store").rglob("*"):
        if f.is_file():
            st = f.stat()
            os.utime(f, (st.st_atime - 60, st.st_mtime - 60))
    await logs["alpha"].append_fragment(random_records(rng, 5))
    pruning = CompactionPipeline(spark, store, {HOST: api}, prune_grace_s=0.0)
    r3 = await pruning.run_round([candidate(logs["alpha"], start=api.cursors["alpha"])])
    assert [o.status for o in r3.outcomes] == ["compacted"]
    await assert_current_matches(store, logs["alpha"], version=3)
    v3_alpha = (await listed_keys(store, "alpha"))[0]
    # Exactly what the kept versions (2 and 3) list remains: version 1's runs that no kept
    # version lists are gone, past the grace.
    assert await parquet_keys(store, "alpha") == v2_alpha | v3_alpha


async def test_racing_pipelines_never_corrupt_current(spark: Any, tmp_path: Path) -> None:
    """Two compactors on the same collections at once: one version wins each, cursor never ahead."""
    store = LocalStore(tmp_path / "store")
    rng = random.Random(11)
    logs = {cid: Log(store, cid) for cid in ["r1", "r2", "r3"]}
    for log in logs.values():
        await log.append_fragment(random_records(rng, 30))
        await log.append_fragment(random_records(rng, 30))
    cursors: dict[str, int] = {}
    api_a, api_b = FakeLogApi(logs, cursors), FakeLogApi(logs, cursors)
    pa_ = CompactionPipeline(spark, store, {HOST: api_a})
    pb_ = CompactionPipeline(spark, store, {HOST: api_b})
    cands = [candidate(log) for log in logs.values()]

    ra, rb = await asyncio.gather(pa_.run_round(cands), pb_.run_round(cands))
    assert ra.count("failed") == rb.count("failed") == 0
    for cid, log in logs.items():
        mine = [o for r in (ra, rb) for o in r.outcomes if o.collection_id == cid]
        assert 1 <= sum(o.status == "compacted" for o in mine) <= 2
        cur = await read_current(store, cid)
        assert cur is not None and cur.offset == log.end
        await assert_current_matches(store, log, version=cur.version)
        # Losers deleted their runs: every file left is listed, or retired, by the current one.
        live, retired = await listed_keys(store, cid)
        assert await parquet_keys(store, cid) <= live | retired
        assert cursors[cid] == cur.offset
    calls = api_a.compact_calls + api_b.compact_calls
    assert all(offset == logs[cid].end for cid, offset in calls)


class RacingApi(FakeLogApi):
    """Lets another compactor run a whole round after this one has read CURRENT.json."""

    def __init__(self, logs: dict[str, Log], cursors: dict[str, int], rival: Any) -> None:
        super().__init__(logs, cursors)
        self.rival = rival
        self.rival_result: RoundResult | None = None

    async def fragments(
        self, tenant: str, collection_id: str, *, from_offset: int | None = None
    ) -> list[FragmentInfo]:
        if self.rival_result is None:
            self.rival_result = await self.rival()
        return await super().fragments(tenant, collection_id, from_offset=from_offset)


async def test_loser_of_a_race_discards_and_does_not_advance(spark: Any, tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    log = Log(store, "contested")
    await log.append_fragment(random_records(random.Random(3), 20))
    cursors: dict[str, int] = {}
    winner_api = FakeLogApi({"contested": log}, cursors)
    out = io.StringIO()
    winner = CompactionPipeline(
        spark,
        store,
        {HOST: winner_api},
        progress=True,
        console=Console(file=out, force_terminal=False, width=100),
        progress_interval_s=0.05,
    )
    cands = [candidate(log)]
    loser_api = RacingApi({"contested": log}, cursors, lambda: winner.run_round(cands))
    loser = CompactionPipeline(spark, store, {HOST: loser_api})

    lost = await loser.run_round(cands)
    assert loser_api.rival_result is not None
    assert [o.status for o in loser_api.rival_result.outcomes] == ["compacted"]
    assert [(o.status, o.version) for o in lost.outcomes] == [("lost", 1)]
    assert lost.ok  # losing a race is not a failure
    assert loser_api.compact_calls == [] and winner_api.compact_calls == [("contested", 21)]
    cur = await read_current(store, "contested")
    assert cur is not None and cur.version == 1
    assert await parquet_keys(store, "contested") == {r.key for r in cur.runs}
    await assert_current_matches(store, log, version=1)
    assert "spark tasks" in out.getvalue() and "installing" in out.getvalue()


def test_spark_job_reads_and_writes_s3_through_pyarrow(
    spark: Any, moto_endpoint: str, s3_bucket: str
) -> None:
    """Executors reach S3 with pyarrow's own client: no hadoop-aws jars, no s3a:// config."""
    import boto3

    s3 = S3Options.from_env({"AWS_ENDPOINT_URL": moto_endpoint, "AWS_REGION": "us-east-1"})
    boto = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    rng = random.Random(9)
    expected, frag_tasks, fold_tasks = {}, [], []
    for cidx, cid in enumerate(["s1", "s2"]):
        records = random_records(rng, 30)
        expected[cid] = fold({}, records)
        for start in (1, 16):
            key = f"logs/{cid}/{start}.parquet"
            boto.put_object(
                Bucket=s3_bucket,
                Key=key,
                Body=fragment_bytes(start, records[start - 1 : start + 14]),
            )
            url = f"s3://{s3_bucket}/{key}"
            frag_tasks.append(FragmentTask(cidx, url, start, start + 15, 1, 31))
        out = (f"s3://{s3_bucket}/out/{cid}.parquet", f"out/{cid}.parquet")
        fold_tasks.append(FoldTask(cidx, cid, 1, 31, outputs=(out,)))
    stats = run_compaction_job(spark, fold_tasks, frag_tasks, s3)
    assert sorted((s.collection_id, s.error, s.records_in) for s in stats) == [
        ("s1", None, 30),
        ("s2", None, 30),
    ]
    for cid in ("s1", "s2"):
        got = runs.materialize([read_run(f"s3://{s3_bucket}/out/{cid}.parquet", s3)])
        assert state_view(got) == normalise(expected[cid])


# ------------------------------------------------------------- the CLI against stub hosts


async def test_cli_two_compactors_two_hosts_each_collection_once(
    spark: Any, tmp_path: Path
) -> None:
    store = LocalStore(tmp_path / "store")
    rng = random.Random(5)
    cids = [f"col-{i}" for i in range(8)]
    logs = {cid: Log(store, cid) for cid in cids}
    for log in logs.values():
        await log.append_fragment(random_records(rng, rng.randint(5, 30)))
    cursors: dict[str, int] = {}
    calls: list[tuple[str, int]] = []
    # Host A owns the first half, host B the rest, and both report col-0 (e.g. after a failover).
    app_a = make_host_app(logs, cids[:4], cursors, calls)
    app_b = make_host_app(logs, [*cids[4:], "col-0"], cursors, calls)
    with Served(app_a) as host_a, Served(app_b) as host_b:
        common = {
            "hosts": (host_a.url, host_b.url),
            "api_key": "k",
            "store": (tmp_path / "store").as_uri(),
            "members": ("m1", "m2"),
            "once": True,
            "budget_records": 10_000,
        }
        regs = [CollectorRegistry(), CollectorRegistry()]
        codes = await asyncio.gather(
            cli.run(cli.Settings(member_id="m1", **common), spark=spark, registry=regs[0]),
            cli.run(cli.Settings(member_id="m2", **common), spark=spark, registry=regs[1]),
        )
    assert list(codes) == [0, 0]
    assert sorted(cid for cid, _ in calls) == cids  # every collection exactly once
    for cid, log in logs.items():
        await assert_current_matches(store, log, version=1)
        assert cursors[cid] == log.end
    per_member = [sample(r, "compactor_collections_compacted_total") for r in regs]
    assert sum(per_member) == len(cids) and all(n > 0 for n in per_member)
    raw = json.loads((await store.get(current_key("col-0"))).data)
    assert {"format", "version", "offset", "rows", "runs", "retired"} <= set(raw)
    assert raw["format"] == 2


async def test_cli_once_exits_1_when_a_host_is_unreachable(spark: Any, tmp_path: Path) -> None:
    with socket.socket() as s:  # a loopback port with nothing listening
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    registry = CollectorRegistry()
    settings = cli.Settings(
        hosts=(dead,), api_key="k", store=str(tmp_path / "store"), member_id="solo", once=True
    )
    assert await cli.run(settings, spark=spark, registry=registry) == 1
    assert sample(registry, "compactor_failures_total", stage="poll") == 1
    assert sample(registry, "compactor_rounds_total", outcome="failed") == 1


def test_cli_settings_flags_env_and_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    parser = cli.build_parser()
    env = {
        "COMPACTOR_HOSTS": "http://a:1,http://b:2/",
        "COMPACTOR_API_KEY": "envkey",
        "COMPACTOR_STORE": "/data/store",
        "COMPACTOR_MIN_RECORDS": "7",
        "COMPACTOR_MEMBERS": "x,y",
        "COMPACTOR_MEMBER_ID": "y",
        "COMPACTOR_INTERVAL_S": "2.5",
    }
    s = cli.settings_from(parser.parse_args(["run", "--min-records", "9", "--once"]), env)
    assert s.hosts == ("http://a:1", "http://b:2") and s.api_key == "envkey"
    assert s.min_records == 9 and s.interval_s == 2.5 and s.once and s.members == ("x", "y")
    assert s.spark_master is None and s.budget_records == 10_000_000
    assert s.keep_versions == 2 and s.prune_grace_s == 300.0
    s = cli.settings_from(
        parser.parse_args(["run", "--keep-versions", "3"]), {**env, "COMPACTOR_PRUNE_GRACE_S": "60"}
    )
    assert s.keep_versions == 3 and s.prune_grace_s == 60.0
    with pytest.raises(cli.SettingsError):
        cli.settings_from(parser.parse_args(["run", "--keep-versions", "0"]), env)
    with pytest.raises(cli.SettingsError):
        cli.settings_from(parser.parse_args(["run"]), {})
    with pytest.raises(cli.SettingsError):
        cli.settings_from(parser.parse_args(["run", "--member-id", "z"]), env)
    with pytest.raises(cli.SettingsError):
        cli.settings_from(parser.parse_args(["run", "--min-records", "many"]), env)
    assert s.engine == "spark"
    s = cli.settings_from(parser.parse_args(["run", "--engine", "local"]), env)
    assert s.engine == "local"
    assert (
        cli.settings_from(parser.parse_args(["run"]), {**env, "COMPACTOR_ENGINE": "local"}).engine
        == "local"
    )
    with pytest.raises(cli.SettingsError, match="engine local runs no Spark"):
        cli.settings_from(
            parser.parse_args(["run", "--engine", "local", "--spark-master", "local[1]"]), env
        )
    with pytest.raises(cli.SettingsError, match="engine must be spark or local"):
        cli.settings_from(parser.parse_args(["run"]), {**env, "COMPACTOR_ENGINE": "gpu"})
    assert cli.parse_listen(":9100") == ("127.0.0.1", 9100)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["run", "--hosts", "http://a:1"])  # no key, no store
    assert exit_info.value.code == 2


async def test_read_collections_gives_many_states_as_one_dataframe(
    spark: Any, tmp_path: Path
) -> None:
    """The reader's Spark side: every collection's runs merged on the executors, one DataFrame."""
    from compactor_client.reader import read_collections

    store = LocalStore(tmp_path / "store")
    rng = random.Random(13)
    logs = {cid: Log(store, cid) for cid in ("ra", "rb", "rc")}
    api = FakeLogApi(logs)
    pipeline = CompactionPipeline(spark, store, {HOST: api}, ratio=2.0)
    for _ in range(3):  # several rounds: several levels to merge on read
        for log in logs.values():
            await log.append_fragment(random_records(rng, 15, ids=30))
        await pipeline.run_round([candidate(log, api.cursors.get(c, 1)) for c, log in logs.items()])
    df = read_collections(spark, str(tmp_path / "store"), [*logs, "never-compacted"])
    rows = df.collect()
    for cid, log in logs.items():
        got = {
            r["id"]: (r["document"], r["metadata"], r["embedding"])
            for r in rows
            if r["collection_id"] == cid
        }
        assert got == normalise(fold({}, log.records)), cid
    assert {r["collection_id"] for r in rows} == set(logs)


def test_spark_reads_the_engines_fragments(spark: Any, tmp_path: Path) -> None:
    """wal3 writes its fragments' Parquet by hand (wal3/parquetwrite.py); Spark's own Parquet
    reader (parquet-java, an implementation independent of pyarrow's) must read them: offsets
    as unsigned 64-bit (Spark's DECIMAL(20, 0)), the shared timestamp, every body."""
    from wal3.fragment import encode_fragment

    expected = []
    for seq, (start, n) in enumerate([(0, 1), (1, 17), (18, 300), ((1 << 64) - 6, 5)]):
        bodies = [f"record {start + i}".encode() * (i % 4) for i in range(n)]
        f = encode_fragment(seq + 1, start, 1_700_000_000_000_000 + seq, bodies, writer="w")
        (tmp_path / f"f{seq}.parquet").write_bytes(f.data)
        expected += [(start + i, 1_700_000_000_000_000 + seq, b) for i, b in enumerate(bodies)]
    rows = spark.read.parquet(str(tmp_path)).collect()
    got = sorted((int(r["offset"]), int(r["timestamp_us"]), bytes(r["body"])) for r in rows)
    assert got == sorted(expected)
