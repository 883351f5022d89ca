"""Hostile JSON for every wal3 metadata document: only the typed corruption error may escape.

Manifests, snapshots and cursors raise ``CorruptManifest``; ``gc/GARBAGE`` raises
``GarbageRejected`` (docs/DESIGN.md, "Formats").  Inputs are valid documents from the Rust crate's
test data with values replaced, keys deleted or added, bytes cut or flipped, and arbitrary bytes.
Whatever parses must re-encode to something that parses back to the same value, and a parsed
garbage plan applied to (or verified against) a real manifest may only be refused with
``GarbageRejected``.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wal3.cursors import Cursor
from wal3.errors import CorruptManifest, GarbageRejected
from wal3.gc import EMPTY_GARBAGE, Garbage, GcOptions, verify_garbage
from wal3.manifest import Manifest, Snapshot

RUST = Path(__file__).parent / "fixtures" / "rust_wal3"
MANIFEST = json.loads((RUST / "bad_manifest1.json").read_text())
SNAPSHOT = json.loads((RUST / "bad_snapshots1.json").read_text())[0]
GARBAGE = json.loads((RUST / "deserialize_garbage_from_json.json").read_text())
CURSOR = {"position": {"offset": 42}, "epoch_us": 1700000000000000, "writer": "compactor"}
BASE = Manifest.from_bytes((RUST / "bad_manifest1.json").read_bytes())
# A plan that really applies to BASE: unlink its first root snapshot.
FIRST = MANIFEST["snapshots"][0]
APPLICABLE = {
    "snapshots_to_drop": [FIRST],
    "snapshots_to_make": [],
    "snapshot_for_root": None,
    "fragments_to_drop_start": 1,
    "fragments_to_drop_limit": 9,
    "fragments_are_uuids": False,
    "setsum_to_discard": FIRST["setsum"],
    "first_to_keep": FIRST["limit"],
    "applied_us": 5,
}

FUZZ = settings(
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**66), max_value=2**66)
    | st.sampled_from([0, 1, 2**64 - 1, 2**64, -1, 255, 256])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=70)
    | st.sampled_from(
        [
            "0" * 64,
            "f" * 64,
            "0" * 62 + "  ",
            "\ud800",
            "A" * 64,
            "018f0f72-7a4f-7b2e-b836-a49e4f8ea101",
        ]
    )
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn, base: Any) -> bytes:
    """``base`` with a few edits at random depths, then perhaps cut or flipped as bytes."""
    doc = json.loads(json.dumps(base))
    for _ in range(draw(st.integers(1, 4))):
        holder: Any = None
        key: Any = None
        node = doc
        while isinstance(node, (dict, list)) and node and draw(st.booleans()):
            keys = list(node) if isinstance(node, dict) else list(range(len(node)))
            holder, key = node, draw(st.sampled_from(keys))
            node = node[key]
        if holder is None:
            if isinstance(doc, dict):
                holder, key = doc, draw(st.sampled_from([*doc, "extra"]))
            else:
                doc = draw(json_values)
                continue
        op = draw(st.sampled_from(["replace", "delete", "add", "perturb", "perturb"]))
        if op == "perturb" and isinstance(
            holder[key] if isinstance(holder, list) or key in holder else None, str
        ):
            # Near misses of the real value (a setsum with a space in it, a path one byte off)
            # reach the checks that random values rarely do.
            text = holder[key]
            i = 2 * draw(st.integers(0, len(text) // 2))  # byte boundaries of hex text
            piece = draw(
                st.sampled_from([" ", "  ", "  ", "\n ", "+", "-", "G", "é", "0", "\ud800", ""])
            )
            cut = draw(st.sampled_from([len(piece), len(piece), 0, 1]))
            holder[key] = text[:i] + piece + text[i + cut :]
        elif op == "replace" or op == "perturb":
            holder[key] = draw(json_values)
        elif op == "delete":
            if isinstance(holder, dict):
                holder.pop(key, None)
            else:
                del holder[key]
        elif isinstance(holder, dict):
            holder[draw(st.text(max_size=20))] = draw(json_values)
        else:
            holder.append(draw(json_values))
    data = json.dumps(doc, ensure_ascii=draw(st.booleans())).encode("utf-8", "surrogatepass")
    tail = draw(st.sampled_from(["as is"] * 6 + ["cut", "flip"]))
    if tail == "cut" and data:
        data = data[: draw(st.integers(0, len(data) - 1))]
    elif tail == "flip" and data:
        i = draw(st.integers(0, len(data) - 1))
        data = data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1 :]
    return data


# Absurd nesting (RecursionError in Python's json), an int past the 4300-digit limit, a float
# overflow, a byte-order mark, a bare NaN.
HOSTILE = [
    b"[" * 100_000,
    b'{"a":' * 100_000,
    b"1e999999",
    b"9" * 5000,
    b"\xef\xbb\xbf{}",
    b"NaN",
    b'{"setsum":' + b"[" * 100_000,
]


def inputs(base: Any) -> st.SearchStrategy[bytes]:
    return (
        mutated(base)
        | mutated(base)
        | mutated(base)
        | mutated(base)
        | st.binary(max_size=200)
        | json_values.map(lambda v: json.dumps(v).encode("utf-8", "surrogatepass"))
        | st.integers(0, len(HOSTILE) - 1).map(lambda i: HOSTILE[i])
    )


def only(error: type[Exception], parse: Callable[[bytes], Any], data: bytes) -> Any:
    try:
        return parse(data)
    except error:
        return None


@FUZZ
@given(inputs(MANIFEST))
def test_manifest(data: bytes) -> None:
    m = only(CorruptManifest, Manifest.from_bytes, data)
    if m is not None:
        assert Manifest.from_bytes(m.to_bytes()) == m
        with contextlib.suppress(CorruptManifest):
            _ = m.next_seq_no  # may raise only CorruptManifest
        assert m.oldest_offset <= m.next_offset


@FUZZ
@given(inputs(SNAPSHOT))
def test_snapshot(data: bytes) -> None:
    s = only(CorruptManifest, Snapshot.from_bytes, data)
    if s is not None:
        assert Snapshot.from_bytes(s.to_bytes()) == s


@FUZZ
@given(inputs(CURSOR))
def test_cursor(data: bytes) -> None:
    c = only(CorruptManifest, Cursor.from_bytes, data)
    if c is not None:
        assert Cursor.from_bytes(c.to_bytes()) == c


@FUZZ
@given(inputs(GARBAGE) | inputs(APPLICABLE) | inputs(json.loads(EMPTY_GARBAGE)))
def test_garbage(data: bytes) -> None:
    g = only(GarbageRejected, Garbage.from_bytes, data)
    if g is None:
        return
    if not g.legacy:
        assert Garbage.from_bytes(g.to_bytes()) == g
    for act in (
        lambda: g.apply(BASE, "fuzz"),
        lambda: verify_garbage(g, BASE, GcOptions(max_fraction=1.0)),
        lambda: verify_garbage(g, BASE, GcOptions(), pinned_at=5000),
    ):
        try:
            out = act()
        except GarbageRejected:
            continue
        if isinstance(out, Manifest):
            out.check()
            assert out.setsum == BASE.setsum and out.next_offset == BASE.next_offset


def test_the_applicable_plan_applies() -> None:
    # Keeps test_garbage honest: its seed plan is one that really applies.
    g = Garbage.from_bytes(json.dumps(APPLICABLE).encode())
    assert g is not None
    new = g.apply(BASE, "t")
    assert new.oldest_offset == FIRST["limit"]["offset"] and new.collected == g.setsum_to_discard
