"""Runs of the leveled layout folded and merged on Arrow arrays, against the reference fold.

The oracle is ``compactor_client.fold.fold`` (plain Python, record by record), itself checked
against ``verify.oracle.reference_fold`` in test_fold.py.  Any split of a log into windows, and any
order of merging the resulting runs, must give the oracle's state.
"""

from __future__ import annotations

import itertools
import json
import random
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor_client import runs
from compactor_client.executor import FoldTask, fold_collection
from compactor_client.fold import InvalidRecord, Row, fold, metadata_json
from compactor_client.levels import Level, Policy, candidates, choose, reward
from compactor_client.parquet_io import read_run, rows_to_table, write_run
from verify.oracle import reference_fold

from .test_fold import CASES, model, prev_st, records_st
from .test_fold import rows_of as fold_rows_of


def window(records: list[dict[str, Any]], start: int = 1) -> pa.Table:
    bodies = [json.dumps(r, separators=(",", ":")).encode() for r in records]
    return runs.parse_records(list(range(start, start + len(records))), bodies)


def state(table: pa.Table) -> dict[str, tuple[Any, Any, Any]]:
    return {r["id"]: (r["document"], r["metadata"], r["embedding"]) for r in table.to_pylist()}


def oracle(records: list[dict[str, Any]]) -> dict[str, tuple[Any, Any, Any]]:
    return {
        k: (r.document, metadata_json(r.metadata), r.embedding)
        for k, r in fold({}, records).items()
    }


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([0.5, -2.25]),
    st.sampled_from(["", "v", "é"]),
)
RECORD = st.fixed_dictionaries(
    {
        "id": st.sampled_from(["a", "b", "c", "d", ""]),
        "op": st.sampled_from(["add", "upsert", "update", "delete"]),
    },
    optional={
        "document": st.one_of(st.none(), st.sampled_from(["x", "y", ""])),
        "metadata": st.one_of(st.none(), st.dictionaries(st.sampled_from("klm"), SCALARS)),
        # Small integers and halves: exact in float32, so the comparison is exact too.
        "embedding": st.one_of(st.none(), st.lists(st.sampled_from([0.0, 1.5, -2.0]), max_size=3)),
    },
)


@settings(max_examples=120, deadline=None)
@given(st.lists(RECORD, max_size=30), st.lists(st.integers(0, 30), max_size=5), st.randoms())
def test_any_windows_any_merges_equal_the_oracle(
    records: list[dict[str, Any]], cuts: list[int], rnd: random.Random
) -> None:
    bounds = sorted({0, len(records), *(min(c, len(records)) for c in cuts)})
    stack: list[pa.Table] = []
    start = 1
    for lo, hi in itertools.pairwise(bounds):
        run = runs.fold_window(window(records[lo:hi], start))
        start += hi - lo
        stack.insert(0, run if stack else runs.resolve_bottom(run))
        while len(stack) > 1 and rnd.random() < 0.5:
            i = rnd.randrange(len(stack) - 1)
            stack[i : i + 2] = [runs.merge(stack[i], stack[i + 1], bottom=i + 2 == len(stack))]
    got = state(runs.materialize(stack))
    assert got == oracle(records)
    # ... and the independent oracle of the verifier agrees on ids and metadata.
    ref = reference_fold(records)
    assert set(got) == set(ref)
    assert {k: json.loads(v[1]) for k, v in got.items()} == {
        k: v["metadata"] for k, v in ref.items()
    }


def test_the_six_kinds_compose_as_the_table_says() -> None:
    cases = [
        ([{"id": "a", "op": "add", "document": "d", "metadata": {"k": 1, "z": None}}], runs.ADD),
        ([{"id": "a", "op": "upsert", "metadata": {"k": None}}], runs.UPSERT),
        ([{"id": "a", "op": "update", "document": "d"}], runs.UPDATE),
        ([{"id": "a", "op": "delete"}], runs.TOMBSTONE),
        ([{"id": "a", "op": "delete"}, {"id": "a", "op": "add", "document": "x"}], runs.ROW),
        (
            [
                {"id": "a", "op": "add", "document": "x"},
                {"id": "a", "op": "update", "metadata": {"k": 2}},
            ],
            runs.GENERAL,
        ),
    ]
    for records, kind in cases:
        run = runs.fold_window(window(records))
        assert run.column("kind").to_pylist() == [kind], records
    add = runs.fold_window(window(cases[0][0]))
    assert add.column("metadata").to_pylist() == ['{"k":1}']  # an insert drops null values
    general = runs.fold_window(window(cases[-1][0])).to_pylist()[0]
    assert (general["ins_document"], general["ins_metadata"]) == ("x", '{"k":2}')
    assert (general["document"], general["metadata"]) == (None, '{"k":2}')


def test_bottom_runs_hold_rows_only_and_tombstones_stay_above_the_bottom() -> None:
    older = runs.resolve_bottom(
        runs.fold_window(window([{"id": i, "op": "add", "document": i} for i in "abc"]))
    )
    newer = runs.fold_window(
        window([{"id": "a", "op": "delete"}, {"id": "z", "op": "update", "document": "q"}], 4)
    )
    assert set(newer.column("kind").to_pylist()) == {runs.TOMBSTONE, runs.UPDATE}
    middle = runs.merge(newer, older, bottom=False)
    assert runs.TOMBSTONE in middle.column("kind").to_pylist()  # still hides older rows
    bottom = runs.merge(newer, older, bottom=True)
    assert set(bottom.column("kind").to_pylist()) == {runs.ROW}
    assert bottom.column("id").to_pylist() == ["b", "c"]


def test_invalid_records_are_refused_as_the_fold_refuses_them() -> None:
    for bad in (
        b"not json",
        b"[1]",
        b'{"id": 1, "op": "add"}',
        b'{"id": "a", "op": "merge"}',
        b'{"id": "a", "op": "add", "document": 3}',
        b'{"id": "a", "op": "add", "metadata": [1]}',
        b'{"id": "a", "op": "add", "metadata": {"k": [1]}}',
        b'{"id": "a", "op": "add", "embedding": [true]}',
        b'{"id": "a", "op": "add", "embedding": "x"}',
    ):
        with pytest.raises(InvalidRecord):
            runs.parse_records([1], [bad])


def test_an_old_layout_version_reads_as_a_bottom_run(tmp_path: Any) -> None:
    from compactor_client.parquet_io import rows_to_table, write_version

    records = [{"id": "a", "op": "add", "document": "A", "metadata": {"k": 1}}]
    url = (tmp_path / "part.parquet").as_uri()
    write_version(url, rows_to_table(fold({}, records).values()))
    old = read_run(url)
    assert old.schema == runs.RUN_SCHEMA and old.column("kind").to_pylist() == [runs.ROW]
    newer = runs.fold_window(window([{"id": "a", "op": "update", "metadata": {"j": 2}}], 2))
    got = state(runs.materialize([newer, old]))
    assert got == oracle([*records, {"id": "a", "op": "update", "metadata": {"j": 2}}])


def test_run_files_round_trip(tmp_path: Any) -> None:
    run = runs.fold_window(window([{"id": "b", "op": "upsert", "embedding": [1.5]}]))
    url = (tmp_path / "r.parquet").as_uri()
    assert write_run(url, run) == (tmp_path / "r.parquet").stat().st_size
    assert read_run(url).equals(run)


# ---------------------------------------------------------------------------- sketches, policy


def test_id_hashes_are_deterministic_and_spread() -> None:
    ids = pa.array([f"doc-{i}" for i in range(5000)] + ["", "é", "doc-1"])
    h = runs.id_hashes(ids)
    assert h.dtype == np.uint64 and len(h) == len(ids)
    assert np.array_equal(h, runs.id_hashes(pa.chunked_array([ids[:10], ids[10:]])))
    assert h[1] == h[-1] and len(np.unique(h)) == 5002
    sliced = runs.id_hashes(ids.slice(3, 4))
    assert np.array_equal(sliced, h[3:7])


def test_sketches_estimate_overlap() -> None:
    a = pa.array([f"x{i}" for i in range(20_000)])
    b = pa.array([f"x{i}" for i in range(10_000, 40_000)])
    sa, sb = runs.parse_sketch(runs.sketch(a)), runs.parse_sketch(runs.sketch(b))
    est = runs.overlap(sa, 20_000, sb, 30_000)
    assert 5_000 < est < 20_000  # truly 10,000: a 64-hash sketch is within a factor of two
    disjoint = runs.parse_sketch(runs.sketch(pa.array([f"y{i}" for i in range(20_000)])))
    assert runs.overlap(sa, 20_000, disjoint, 20_000) < 2_000
    assert runs.overlap(None, 1, sb, 1) == 0.0


def test_levels_keep_their_size_ratio_and_merges_go_by_reward() -> None:
    policy = Policy(ratio=10, min_reward=1.0)
    # Sizes 1, 100, 10,000: every level at most a tenth of the one below: nothing to merge.
    assert choose([Level(1, 10), Level(100, 1000), Level(10_000, 100_000)], policy) is None
    # A new run as big as the one below breaks the ratio: merge those two.
    m = choose([Level(100, 1000), Level(100, 1000), Level(10_000, 100_000)], policy)
    assert m is not None and m.upper == 0 and m.over_ratio
    # Two pairs over their ratio: the one reclaiming more per byte written goes first.
    ids = pa.array([f"i{i}" for i in range(1000)])
    same = runs.sketch(ids)
    other = runs.sketch(pa.array([f"o{i}" for i in range(1000)]))
    stack = [
        Level(1000, 10_000, sketch=other),
        Level(1000, 10_000, sketch=same),
        Level(1000, 10_000, sketch=same),
    ]
    found = candidates(stack, policy)
    assert [c.upper for c in found] == [1, 0]  # levels 1 and 2 hold the same ids
    assert found[0].reward > 0.5 > found[1].reward
    # Within the ratio, a merge still happens when it reclaims more than it writes.
    tombs = Level(200, 6_400, tombstones=200, sketch=same)
    assert reward(tombs, Level(1000, 10_000, sketch=same), bottom=True) >= 1.0
    assert choose([tombs, Level(1000, 1_000_000, sketch=same)], policy) is None
    with pytest.raises(ValueError):
        Policy(ratio=1)


def test_a_fold_merges_until_every_level_keeps_its_ratio(tmp_path: Any) -> None:
    """Rounds of equal size: the stack behaves like a binary counter in base ``ratio`` and never
    holds a level within the ratio of the next; the state stays the oracle's."""
    rng = random.Random(3)
    all_records: list[dict[str, Any]] = []
    base: tuple[Any, ...] = ()
    from compactor_client.executor import RunRef

    for rnd in range(12):
        recs = [
            {
                "id": f"d{rng.randrange(400)}",
                "op": rng.choice(["add", "upsert", "delete"]),
                "document": "t",
            }
            for _ in range(50)
        ]
        start = len(all_records) + 1
        all_records += recs
        outs = tuple(
            ((tmp_path / f"r{rnd}-{n}.parquet").as_uri(), f"k{rnd}-{n}")
            for n in range(len(base) + 1)
        )
        task = FoldTask(0, "c", start, start + len(recs), base=base, outputs=outs, ratio=4)
        stats = fold_collection(task, window(recs, start))
        assert stats.error is None, stats.error
        urls = {k: u for u, k in outs} | {r.key: r.url for r in base}
        base = tuple(
            RunRef(r.key, urls[r.key], r.rows, r.bytes, r.tombstones, r.sketch) for r in stats.runs
        )
        sizes = [r.bytes for r in stats.runs]
        assert all(sizes[i] * 4 <= sizes[i + 1] for i in range(len(sizes) - 1)), sizes
        got = state(runs.materialize([read_run(r.url) for r in base]))
        assert got == oracle(all_records)


# ------------------------------------------------------- the fold's own tests, on this path


def arrow_fold(prev: dict[str, Row], records: list[dict[str, Any]]) -> dict[str, Any]:
    """``fold(prev, records)`` on the Arrow path: the previous rows as a bottom run (a version
    of the single-version layout), the records as a window run over it, read back merged."""
    base = runs.as_run(rows_to_table(prev.values()))
    top = runs.fold_window(window(records, 1)) if records else runs.empty_run()
    out = {}
    for r in runs.materialize([top, base] if prev else [top]).to_pylist():
        out[r["id"]] = (r["document"], json.loads(r["metadata"]), r["embedding"])
    return out


@pytest.mark.parametrize(("name", "prev", "records", "expected"), CASES, ids=[c[0] for c in CASES])
def test_the_fold_table_on_the_arrow_path(
    name: str, prev: dict[str, Row], records: list[dict[str, Any]], expected: dict[str, Any]
) -> None:
    assert arrow_fold(prev, records) == expected


@settings(max_examples=150, deadline=None)
@given(prev=prev_st, records=st.lists(records_st, max_size=25))
def test_the_arrow_path_matches_the_folds_model(
    prev: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    want = {
        k: (d, m, None if e is None else np.asarray(e, np.float32).tolist())
        for k, (d, m, e) in model(prev, records).items()
    }
    assert arrow_fold(fold_rows_of(prev), records) == want
