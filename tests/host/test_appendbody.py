"""The append decoder (msgspec, ``host.appendbody``) against the published schema (pydantic,
``host.models.AppendRequest``), body for body: the same verdict, and when accepted the same
records stored (the bytes pydantic wrote, up to the ``+`` of a positive float exponent)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from host.appendbody import RecordLimits, decode_append
from host.errors import BadRequest
from host.models import MAX_RECORDS_PER_REQUEST, AppendRequest

LIMITS = RecordLimits(MAX_RECORDS_PER_REQUEST, 10_000, 100_000)
_EXP_PLUS = re.compile(rb"e\+(\d)")


def schema(raw: bytes) -> list[bytes] | None:
    """What the published schema stores for ``raw``, or None when it refuses it."""
    try:
        req = AppendRequest.model_validate_json(raw)
    except ValidationError:
        return None
    return [r.model_dump_json().encode() for r in req.records]


def decoder(raw: bytes) -> list[bytes] | None:
    try:
        return decode_append(raw, LIMITS)[1]
    except BadRequest:
        return None


def same_numbers(pydantic_bytes: bytes) -> bytes:
    """pydantic writes ``1e+16``, msgspec ``1e16``: the same JSON number."""
    return _EXP_PLUS.sub(rb"e\1", pydantic_bytes)


def agree(raw: bytes) -> None:
    want, got = schema(raw), decoder(raw)
    if want is None or got is None:
        assert (want, got) == (None, None), (raw[:300], want, got)
    else:
        assert got == [same_numbers(b) for b in want], raw[:300]


# Values a field may hold, valid or not (hypothesis mixes them, so most bodies are mostly valid).
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
metadata = st.one_of(
    st.none(),
    st.dictionaries(st.text(max_size=6), scalar, max_size=5),
    st.just([1]),
    st.just({"k": [1]}),
    st.just({"k": {"x": 1}}),
)
embedding = st.one_of(
    st.none(),
    st.lists(
        st.one_of(
            st.floats(allow_nan=False, allow_infinity=False, width=32),
            st.floats(allow_nan=False, allow_infinity=False),
            st.integers(min_value=-(10**40), max_value=10**40),
            st.booleans(),
            st.just("1"),
        ),
        max_size=6,
    ),
)
record = st.fixed_dictionaries(
    {
        "id": st.one_of(st.text(min_size=0, max_size=260), st.integers(), st.none()),
        "op": st.sampled_from(["add", "update", "upsert", "delete", "ADD", "", 3]),
    },
    optional={
        "document": st.one_of(st.none(), st.text(max_size=20), st.integers()),
        "metadata": metadata,
        "embedding": embedding,
        "extra": st.integers(),
    },
)
body: st.SearchStrategy[dict[str, Any]] = st.fixed_dictionaries(
    {"records": st.one_of(st.lists(record, max_size=4), st.just(None), st.just({}))},
    optional={
        "idempotency_key": st.one_of(st.text(max_size=258), st.integers(), st.none()),
        "other": st.integers(),
    },
)


@settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body)
@example({"records": [{"id": "a", "op": "add", "embedding": [10**40]}]})
@example({"records": [{"id": "a", "op": "add", "embedding": [3.4028234663852886e38, 1e16]}]})
@example({"records": [{"id": "a", "op": "add", "metadata": {"é": 1, "e": 2, "😀": 3, "z": 4}}]})
def test_the_decoder_agrees_with_the_schema(doc: dict[str, Any]) -> None:
    agree(json.dumps(doc, ensure_ascii=False).encode())
    agree(json.dumps(doc).encode())  # \\u escapes, surrogate pairs included


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"[1]",
        b"null",
        b'{"records":[{"id":"a","op":"add","embedding":[NaN]}]}',
        b'{"records":[{"id":"a","op":"add","embedding":[Infinity]}]}',
        b'{"records":[{"id":"a","op":"add","embedding":[1e400]}]}',
        b'{"records":[{"id":"a","op":"add","embedding":[1e39]}]}',
        b'{"records":[{"id":"\\ud800","op":"add"}]}',  # a lone surrogate
        b'{"records":[{"id":"a","op":"add"}]} x',
        b'\xef\xbb\xbf{"records":[{"id":"a","op":"add"}]}',  # a UTF-8 byte order mark
        b'{"records":[{"id":"a","op":"add"}]}'.decode().encode("utf-16"),
        b'{"records": [{"id": "\xff\xfe", "op": "add"}]}',  # not UTF-8
        b'{"records": [{"id": "\xc0\xaf", "op": "add"}]}',  # an overlong encoding
        b'{"records": [{"id": "\xed\xa0\x80", "op": "add"}]}',  # an encoded surrogate
        b'{"records":[{"id":"a","id":"b","op":"add"}]}',  # duplicate keys: the last wins
        b'{"records":[{"id":"a","op":"add","metadata":{"k":1,"k":2}}]}',
        b'{"records":[{"id":"a","op":"add","metadata":' + b"[" * 5000 + b"]" * 5000 + b"}]}",
        b'{"records":[{"id":"a","op":"add","embedding":[1,2.0,-0.0,5e-324]}]}',
        b'{"records":[{"id":"a\\u2028\\u0001\\"","op":"add","document":"\\/"}]}',
        *(  # the bounds, at and past them (code points, not bytes)
            json.dumps({"records": [{"id": c * n, "op": "add"}]}, ensure_ascii=False).encode()
            for c in ("a", "\u00e9", "\U0001f600")
            for n in (256, 257)
        ),
        *(
            json.dumps({"records": [{"id": "a", "op": "add"}], "idempotency_key": "k" * n}).encode()
            for n in (0, 256, 257)
        ),
    ],
)
def test_edge_bodies_agree(raw: bytes) -> None:
    agree(raw)


def test_errors_name_the_field_as_the_schema_does() -> None:
    def message(raw: bytes) -> str:
        with pytest.raises(BadRequest) as info:
            decode_append(raw, LIMITS)
        return str(info.value)

    assert message(b'{"records":[{"id":"a","op":"add"},{"id":1,"op":"add"}]}').startswith(
        "records.1.id: "
    )
    assert message(b'{"records":[{"id":"a","op":"add","x":1}]}').startswith("records.0.x: ")
    assert message(b'{"records":[{"id":"a","op":"add"}],"extra":1}').startswith("extra: ")
    assert message(b'{"records":[]}').startswith("records: ")
    assert message(b"{").startswith("body: ")
    big = message(b'{"records":[{"id":"a","op":"add","embedding":[%d]}]}' % 10**40)
    assert big == "records.0.embedding: element 0 does not fit a float32"
