"""The Spark job's two plans and the driver fold (issue 15's throughput targets): each folds
exactly what the single-process fold does, ``auto`` picks the plan the docstring promises, and a
small round runs no Spark job at all."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from compactor_client import runs
from compactor_client.executor import CollectionStats, FoldTask, FragmentTask
from compactor_client.fold import fold
from compactor_client.parquet_io import read_run
from compactor_client.pipeline import (
    CompactionPipeline,
    choose_plan,
    run_compaction_job,
    run_locally,
)
from compactor_client.reader import read_state
from wal3.localstore import LocalStore

from .kit import (
    HOST,
    FakeLogApi,
    Log,
    candidate,
    fragment_bytes,
    local_spark,
    normalise,
    random_records,
    state_view,
)

SIZES = {"a": 90, "b": 7, "c": 41, "d": 1, "e": 63}  # records per collection: unequal shares


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    with local_spark("compactor-plan-tests") as session:
        yield session


def test_auto_picks_one_stage_unless_few_collections_hold_many_fragments() -> None:
    assert choose_plan(collections=16, fragments=80, parallelism=2) == "one-stage"
    assert choose_plan(collections=2, fragments=1_000, parallelism=2) == "one-stage"
    assert choose_plan(collections=1, fragments=8, parallelism=2) == "one-stage"
    assert choose_plan(collections=1, fragments=9, parallelism=2) == "two-stage"
    assert choose_plan(collections=3, fragments=1_000, parallelism=8) == "two-stage"
    assert choose_plan(collections=8, fragments=1_000, parallelism=8) == "one-stage"


def _tasks(
    root: Path, run: str, records: dict[str, list[dict[str, Any]]]
) -> tuple[list[FoldTask], list[FragmentTask]]:
    """Each collection in fragments of at most 10 records, its run written under ``run``."""
    folds, frags = [], []
    for cidx, (cid, recs) in enumerate(sorted(records.items())):
        for start in range(1, len(recs) + 1, 10):
            data = fragment_bytes(start, recs[start - 1 : start + 9])
            path = root / "logs" / cid / f"{start:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            limit = min(start + 10, len(recs) + 1)
            md5 = hashlib.md5(data).hexdigest()
            frags.append(
                FragmentTask(cidx, path.as_uri(), start, limit, 1, len(recs) + 1, content_md5=md5)
            )
        out = root / "out" / run / f"{cid}.parquet"
        out.parent.mkdir(parents=True, exist_ok=True)
        folds.append(FoldTask(cidx, cid, 1, len(recs) + 1, outputs=((out.as_uri(), f"{cid}"),)))
    return folds, frags


def _states(root: Path, run: str, stats: list[CollectionStats]) -> dict[str, Any]:
    assert [s.error for s in stats if s.error] == []
    out = {}
    for s in stats:
        table = read_run((root / "out" / run / f"{s.collection_id}.parquet").as_uri())
        out[s.collection_id] = (s.records_in, s.rows_out, state_view(runs.materialize([table])))
    return out


@pytest.mark.parametrize(
    ("plan", "partitions"), [("one-stage", None), ("one-stage", 4), ("two-stage", None)]
)
def test_each_plan_folds_what_the_single_process_fold_does(
    spark: Any, tmp_path: Path, plan: Any, partitions: int | None
) -> None:
    rng = random.Random(15)
    records = {cid: random_records(rng, n, ids=30) for cid, n in SIZES.items()}
    local = _states(tmp_path, "local", run_locally(*_tasks(tmp_path, "local", records)))
    stats = run_compaction_job(
        spark, *_tasks(tmp_path, plan, records), partitions=partitions, plan=plan
    )
    assert sorted(s.collection_id for s in stats) == sorted(SIZES)  # each collection once
    got = _states(tmp_path, plan, stats)
    assert got == local
    for cid, recs in records.items():
        assert got[cid][0] == len(recs)
        assert got[cid][2] == normalise(fold({}, recs))


def test_an_unknown_plan_is_refused(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="plan must be one of"):
        bad: Any = "three"  # not a Plan: the point
        run_compaction_job(
            spark, *_tasks(tmp_path, "x", {"a": [{"id": "1", "op": "add"}]}), plan=bad
        )
    with pytest.raises(ValueError, match="plan must be one of"):
        CompactionPipeline(None, LocalStore(tmp_path), {}, plan=bad)


class _NoSpark:
    """A session that fails any use: a round given it must not start a Spark job."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"a Spark job was started (SparkSession.{name})")


async def _round(
    tmp_path: Path, spark: Any, driver_fold_below: int, plan: Any = "auto"
) -> tuple[str, dict[str, Log], LocalStore]:
    store = LocalStore(tmp_path / "store")
    rng = random.Random(3)
    logs = {cid: Log(store, cid) for cid in ("p", "q", "r")}
    for log in logs.values():
        await log.append_fragment(random_records(rng, 6))
        await log.append_fragment(random_records(rng, 5))
    pipeline = CompactionPipeline(
        spark, store, {HOST: FakeLogApi(logs)}, driver_fold_below=driver_fold_below, plan=plan
    )
    result = await pipeline.run_round([candidate(log) for log in logs.values()])
    assert result.count("compacted") == 3, result.outcomes
    for cid, log in logs.items():
        state = await read_state(store, cid)
        assert state.offset == log.end
        assert state_view(state.table) == normalise(fold({}, log.records))
    return result.fold, logs, store


async def test_a_round_under_the_threshold_folds_in_the_driver(tmp_path: Path) -> None:
    where, _, _ = await _round(tmp_path, _NoSpark(), driver_fold_below=34)  # 33 records
    assert where == "driver"


@pytest.mark.parametrize("plan", ["auto", "two-stage"])
async def test_a_round_at_the_threshold_runs_on_spark(
    spark: Any, tmp_path: Path, plan: str
) -> None:
    where, _, _ = await _round(tmp_path, spark, driver_fold_below=33, plan=plan)
    assert where == ("one-stage" if plan == "auto" else plan)
