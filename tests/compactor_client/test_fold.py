"""The compaction fold: table-driven cases and properties against an independent model."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from compactor_client.fold import InvalidRecord, Row, fold, metadata_json, parse_body


def rec(
    op: str,
    rid: str = "a",
    doc: str | None = None,
    md: dict[str, Any] | None = None,
    emb: list[float] | None = None,
) -> dict[str, Any]:
    return {"id": rid, "op": op, "document": doc, "metadata": md, "embedding": emb}


def view(rows: dict[str, Row]) -> dict[str, tuple[Any, Any, Any]]:
    return {k: (r.document, r.metadata, r.embedding) for k, r in rows.items()}


BASE = {"a": Row(id="a", document="old", metadata={"k": 1, "x": "y"}, embedding=[1.0, 2.0])}

CASES: list[tuple[str, dict[str, Row], list[dict[str, Any]], dict[str, tuple[Any, Any, Any]]]] = [
    (
        "add inserts when absent",
        {},
        [rec("add", doc="d", md={"k": 1}, emb=[0.5])],
        {"a": ("d", {"k": 1}, [0.5])},
    ),
    (
        "add on present changes nothing",
        BASE,
        [rec("add", doc="new", md={"k": 2}, emb=[9.0])],
        {"a": ("old", {"k": 1, "x": "y"}, [1.0, 2.0])},
    ),
    ("update on absent changes nothing", {}, [rec("update", doc="d")], {}),
    (
        "update replaces given fields, keeps null ones",
        BASE,
        [rec("update", doc="new")],
        {"a": ("new", {"k": 1, "x": "y"}, [1.0, 2.0])},
    ),
    (
        "update replaces embedding",
        BASE,
        [rec("update", emb=[3.0])],
        {"a": ("old", {"k": 1, "x": "y"}, [3.0])},
    ),
    (
        "update merges metadata, null removes",
        BASE,
        [rec("update", md={"k": None, "n": True})],
        {"a": ("old", {"x": "y", "n": True}, [1.0, 2.0])},
    ),
    (
        "upsert inserts when absent",
        {},
        [rec("upsert", doc="d", md={"k": None, "j": 2.5})],
        {"a": ("d", {"j": 2.5}, None)},
    ),
    (
        "upsert updates when present",
        BASE,
        [rec("upsert", md={"x": "z"})],
        {"a": ("old", {"k": 1, "x": "z"}, [1.0, 2.0])},
    ),
    ("delete removes", BASE, [rec("delete")], {}),
    ("delete of absent is a no-op", {}, [rec("delete")], {}),
    (
        "delete then add re-inserts fresh",
        BASE,
        [rec("delete"), rec("add", doc="n")],
        {"a": ("n", {}, None)},
    ),
    (
        "add then update in order",
        {},
        [rec("add", doc="1"), rec("update", doc="2")],
        {"a": ("2", {}, None)},
    ),
    (
        "update before add does not apply",
        {},
        [rec("update", doc="2"), rec("add", doc="1")],
        {"a": ("1", {}, None)},
    ),
    (
        "ids are independent",
        BASE,
        [rec("add", rid="b", doc="b"), rec("delete", rid="a")],
        {"b": ("b", {}, None)},
    ),
    (
        "empty metadata object on update keeps metadata",
        BASE,
        [rec("update", md={})],
        {"a": ("old", {"k": 1, "x": "y"}, [1.0, 2.0])},
    ),
]


@pytest.mark.parametrize(("name", "prev", "records", "expected"), CASES, ids=[c[0] for c in CASES])
def test_fold_table(
    name: str,
    prev: dict[str, Row],
    records: list[dict[str, Any]],
    expected: dict[str, tuple[Any, Any, Any]],
) -> None:
    assert view(fold(prev, records)) == expected


def test_fold_does_not_mutate_previous_rows() -> None:
    prev = copy.deepcopy(BASE)
    fold(prev, [rec("update", doc="x", md={"k": None}, emb=[0.0]), rec("add", rid="z")])
    assert view(prev) == view(BASE)


@pytest.mark.parametrize(
    "bad",
    [
        {"id": 1, "op": "add"},
        {"id": "a", "op": "insert"},
        {"id": "a", "op": "add", "metadata": {"k": [1]}},
        {"id": "a", "op": "add", "metadata": "k=1"},
        {"id": "a", "op": "add", "embedding": ["x"]},
        {"id": "a", "op": "add", "document": 5},
    ],
)
def test_invalid_records_raise(bad: dict[str, Any]) -> None:
    with pytest.raises(InvalidRecord):
        fold({}, [bad])


def test_parse_body() -> None:
    assert parse_body(b'{"id":"a","op":"add"}') == {"id": "a", "op": "add"}
    with pytest.raises(InvalidRecord):
        parse_body(b"[1]")
    with pytest.raises(InvalidRecord):
        parse_body(b"\xff")


# ------------------------------------------------------------------- property tests vs a model


def model(prev: dict[str, tuple[Any, Any, Any]], records: list[dict[str, Any]]) -> dict[str, Any]:
    """An independent statement of the semantics: replay each id's own history separately."""
    out: dict[str, Any] = {}
    for rid in set(prev) | {r["id"] for r in records}:
        alive = rid in prev
        doc, md, emb = prev.get(rid, (None, {}, None))
        md = dict(md)
        for r in [r for r in records if r["id"] == rid]:
            given_md = r["metadata"] or {}
            if r["op"] == "delete":
                alive, doc, md, emb = False, None, {}, None
            elif not alive and r["op"] in ("add", "upsert"):
                alive = True
                doc, emb = r["document"], r["embedding"]
                md = {k: v for k, v in given_md.items() if v is not None}
            elif alive and r["op"] in ("update", "upsert"):
                doc = doc if r["document"] is None else r["document"]
                emb = emb if r["embedding"] is None else r["embedding"]
                md = {k: v for k, v in {**md, **given_md}.items() if v is not None}
        if alive:
            out[rid] = (doc, md, emb)
    return out


ids = st.sampled_from(["a", "b", "c", "d"])
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.text(max_size=3),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
)
records_st = st.builds(
    rec,
    op=st.sampled_from(["add", "update", "upsert", "delete"]),
    rid=ids,
    doc=st.one_of(st.none(), st.text(max_size=4)),
    md=st.one_of(st.none(), st.dictionaries(st.sampled_from(["k", "l", "m"]), scalars, max_size=3)),
    emb=st.one_of(st.none(), st.lists(st.floats(-1, 1, width=32), min_size=1, max_size=3)),
)
prev_st = st.dictionaries(
    ids,
    st.tuples(
        st.one_of(st.none(), st.text(max_size=3)),
        st.dictionaries(st.sampled_from(["k", "l"]), st.integers(0, 3), max_size=2),
        st.one_of(st.none(), st.lists(st.floats(-1, 1, width=32), max_size=2)),
    ),
    max_size=3,
)


def rows_of(prev: dict[str, tuple[Any, Any, Any]]) -> dict[str, Row]:
    return {
        k: Row(id=k, document=d, metadata=dict(m), embedding=e) for k, (d, m, e) in prev.items()
    }


@settings(max_examples=150, deadline=None)
@given(prev=prev_st, records=st.lists(records_st, max_size=25))
def test_fold_matches_model(prev: dict[str, Any], records: list[dict[str, Any]]) -> None:
    assert view(fold(rows_of(prev), records)) == model(prev, records)


@settings(max_examples=100, deadline=None)
@given(prev=prev_st, records=st.lists(records_st, max_size=25), cut=st.integers(0, 25))
def test_fold_is_incremental(prev: dict[str, Any], records: list[dict[str, Any]], cut: int) -> None:
    """Compacting in two rounds equals compacting once: what incremental compaction relies on."""
    once = fold(rows_of(prev), records)
    twice = fold(fold(rows_of(prev), records[:cut]), records[cut:])
    assert view(twice) == view(once)


# ------------------------------------------------------------ what an operator and Spark see


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"id": 1, "op": "add"}, r"^record id must be a string, got 1$"),
        ({"id": "a", "op": "insert"}, r"^unknown op 'insert' for id 'a'$"),
        ({"id": "a", "op": "add", "document": 5}, r"^document of 'a' must be a string or null$"),
        ({"id": "a", "op": "add", "metadata": "k=1"}, r"^metadata must be an object, got str$"),
        ({"id": "a", "op": "add", "metadata": {1: "x"}}, r"^metadata key 1 is not a string$"),
        (
            {"id": "a", "op": "add", "metadata": {"k": [1]}},
            r"^metadata value of 'k' is not a scalar$",
        ),
        ({"id": "a", "op": "add", "embedding": ["x"]}, r"^embedding must be a list of numbers$"),
        (
            {"id": "a", "op": "add", "embedding": [10**400]},
            r"^embedding value too large for a float$",
        ),
    ],
)
def test_invalid_records_say_what_is_wrong(bad: dict[str, Any], message: str) -> None:
    """The compactor fails a collection with this text: it must name the field and the value."""
    with pytest.raises(InvalidRecord, match=message):
        fold({}, [bad])


def test_parse_body_says_what_is_wrong() -> None:
    with pytest.raises(InvalidRecord, match=r"^record body is not a JSON object$"):
        parse_body(b"[1]")
    with pytest.raises(InvalidRecord, match=r"^record body is not JSON: "):
        parse_body(b"{")


def test_every_row_carries_its_own_id() -> None:
    rows = fold(
        {"a": Row(id="a", document="old")},
        [
            rec("upsert", rid="a", doc="new"),
            rec("add", rid="b"),
            rec("upsert", rid="c"),
            rec("update", rid="b", doc="b2"),
        ],
    )
    assert {k: r.id for k, r in rows.items()} == {"a": "a", "b": "b", "c": "c"}


def test_records_may_be_objects_as_spark_rows_are() -> None:
    """Inside Spark a record arrives as a Row (attribute access); a field it lacks is null."""
    from types import SimpleNamespace

    as_dicts = [
        rec("add", rid="a", doc="d", md={"k": 1}, emb=[1.0]),
        rec("update", rid="a", md={"k": None, "j": "x"}),
        {"id": "b", "op": "upsert"},
    ]
    as_objects = [SimpleNamespace(**r) for r in as_dicts[:2]] + [
        SimpleNamespace(id="b", op="upsert")
    ]
    assert view(fold({}, as_objects)) == view(fold({}, as_dicts))
    assert fold({}, as_objects)["b"] == Row(id="b")


def test_metadata_json_is_compact_sorted_and_keeps_unicode() -> None:
    assert metadata_json({"b": 1, "a": "é", "c": None}) == '{"a":"é","b":1,"c":null}'
