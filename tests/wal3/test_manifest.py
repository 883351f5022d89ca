"""Manifests and snapshots: invariants, setsum balance, JSON compatibility."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wal3 import CorruptManifest, FragmentPointer, Manifest, Setsum, Snapshot
from wal3.fragment import fragment_path
from wal3.manifest import plan_snapshot


def frag(seq: int, start: int, n: int) -> FragmentPointer:
    return FragmentPointer(
        fragment_path(seq), seq, start, start + n, 100 + n, Setsum.of(f"{seq}:{start}:{n}".encode())
    )


def grow(m: Manifest, sizes: list[int]) -> Manifest:
    for n in sizes:
        m = m.with_fragments([frag(m.next_seq_no, m.next_offset, n)], "w")
    return m


def total_live(m: Manifest) -> Setsum:
    s = Setsum.zero()
    for e in m.entries:
        s = s + e.setsum
    return s


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(1, 50), min_size=1, max_size=5), max_size=40),
    st.integers(2, 6),
    st.integers(2, 4),
)
def test_applied_fragments_and_snapshots_keep_invariants(
    batches: list[list[int]], fth: int, sth: int
) -> None:
    m = Manifest.empty("w")
    expected = Setsum.zero()
    snapshots: dict[str, Snapshot] = {}
    for sizes in batches:
        frags = []
        seq, off = m.next_seq_no, m.next_offset
        for n in sizes:
            frags.append(frag(seq, off, n))
            seq, off = seq + 1, off + n
        m = m.with_fragments(frags, "w")
        for f in frags:
            expected = expected + f.setsum
        m.check()
        snap = plan_snapshot(m, fragment_threshold=fth, snapshot_threshold=sth, writer="w")
        if snap is not None:
            snap.check()
            snapshots[snap.path] = snap
            m2 = m.with_snapshot(snap, "w")
            assert m2 is not None
            m2.check()
            assert m2.next_offset == m.next_offset and m2.next_seq_no == m.next_seq_no
            m = m2
        assert m.setsum == expected == total_live(m) + m.collected
        assert m.fragments, "the last fragment always stays in the root"
        # Depth never increases along the root: deeper (older) snapshots come first.
        depths = [s.depth for s in m.snapshots]
        assert depths == sorted(depths, reverse=True)
        assert Manifest.from_bytes(m.to_bytes()) == m
        assert_tail_agrees(m)
        assert_tail_agrees(m.with_sealed("w"))
    # Every snapshot reachable from the root expands to exactly the fragments written.
    leaves: list[FragmentPointer] = []

    def expand(ptrs) -> None:  # type: ignore[no-untyped-def]
        for p in ptrs:
            if isinstance(p, FragmentPointer):
                leaves.append(p)
            else:
                expand(snapshots[p.path_to_snapshot].children)

    expand(m.entries)
    assert [f.seq_no for f in leaves] == list(range(1, m.next_seq_no))
    assert sum((f.setsum for f in leaves), Setsum.zero()) == m.setsum


def assert_tail_agrees(m: Manifest) -> None:
    """``tail_from_bytes`` reads from the last pointers what the whole manifest says."""
    tail = Manifest.tail_from_bytes(m.to_bytes())
    assert (tail.next_offset, tail.sealed) == (m.next_offset, m.sealed)
    assert tail.next_seq_no == m.next_seq_no


def test_the_tail_of_an_empty_forked_or_foreign_manifest() -> None:
    assert_tail_agrees(Manifest.empty("w"))
    fork = Manifest(writer="w", initial_offset=41, initial_seq_no=7)
    assert_tail_agrees(fork)
    assert_tail_agrees(grow(fork, [2, 3]))
    # Snapshots but no fragment (only a foreign log): the offset is known, the number is not.
    m = grow(Manifest.empty("w"), [1, 2, 3, 4])
    snap = Snapshot.build(m.fragments, "w")
    obj = json.loads(m.to_bytes())
    obj["snapshots"] = [json.loads(snap.to_pointer().json_bytes())]
    obj["fragments"] = []
    tail = Manifest.tail_from_bytes(json.dumps(obj).encode())
    assert tail.next_offset == snap.to_pointer().limit
    with pytest.raises(CorruptManifest):
        tail.next_seq_no  # noqa: B018


def test_the_tail_of_a_corrupt_manifest_is_refused() -> None:
    obj = json.loads(grow(Manifest.empty("w"), [3, 2]).to_bytes())

    def refused(edit) -> None:  # type: ignore[no-untyped-def]
        o = json.loads(json.dumps(obj))
        edit(o)
        with pytest.raises(CorruptManifest):
            Manifest.tail_from_bytes(json.dumps(o).encode())

    refused(lambda o: o["fragments"][-1]["limit"].update(offset=-1))
    refused(lambda o: o["fragments"][-1].update(seq_no="2"))
    refused(lambda o: o["fragments"][-1].pop("setsum"))
    refused(lambda o: o.update(fragments="nope"))
    refused(lambda o: o.update(sealed="yes"))
    refused(lambda o: o.pop("setsum"))
    refused(lambda o: (o.update(fragments=[]), o.update(initial_seq_no=-1)))
    # A root without a fragment is decoded whole: read from defaults, its tail would be offset 1,
    # and the roll-up would drop every mark of the log (helper-8's review of 85eab44).
    refused(lambda o: o.pop("fragments"))
    refused(lambda o: o.update(fragments=[]))
    with pytest.raises(CorruptManifest):
        Manifest.tail_from_bytes(b"{}")
    with pytest.raises(CorruptManifest):
        Manifest.tail_from_bytes(b"[1]")
    with pytest.raises(CorruptManifest):
        Manifest.tail_from_bytes(b"{not json")


def test_json_matches_rust_field_names() -> None:
    m = grow(Manifest.empty("writer-1"), [3, 2])
    obj = json.loads(m.to_bytes())
    assert list(obj) == ["setsum", "collected", "acc_bytes", "writer", "snapshots", "fragments"]
    assert obj["fragments"][0] == {
        "path": fragment_path(1),
        "seq_no": 1,
        "start": {"offset": 1},
        "limit": {"offset": 4},
        "num_bytes": 103,
        "setsum": m.fragments[0].setsum.hexdigest(),
    }
    sealed = m.with_sealed("w")
    assert json.loads(sealed.to_bytes())["sealed"] is True
    assert Manifest.from_bytes(sealed.to_bytes()).sealed


def test_invariant_violations_are_detected() -> None:
    m = grow(Manifest.empty("w"), [3, 2, 4])
    obj = json.loads(m.to_bytes())

    def corrupt(edit) -> None:  # type: ignore[no-untyped-def]
        o = json.loads(json.dumps(obj))
        edit(o)
        with pytest.raises(CorruptManifest):
            Manifest.from_bytes(json.dumps(o).encode())

    corrupt(lambda o: o.update(setsum=Setsum.of(b"x").hexdigest()))  # balance
    corrupt(lambda o: o["fragments"][1]["start"].update(offset=5))  # gap
    corrupt(lambda o: o["fragments"][1].update(seq_no=7))  # seq order
    corrupt(lambda o: o["fragments"][0]["limit"].update(offset=1))  # empty range
    corrupt(lambda o: o["fragments"].pop(1))  # dropped fragment
    corrupt(lambda o: o.update(acc_bytes=-1))
    corrupt(lambda o: o.update(fragments="nope"))
    with pytest.raises(CorruptManifest):
        Manifest.from_bytes(b"{not json")
    with pytest.raises(CorruptManifest):
        m.with_fragments([frag(9, m.next_offset, 1)], "w")
    with pytest.raises(CorruptManifest):
        m.with_fragments([frag(m.next_seq_no, m.next_offset + 1, 1)], "w")


def test_snapshot_rejects_mixed_and_bad_setsum() -> None:
    m = grow(Manifest.empty("w"), [1, 1, 1])
    s = Snapshot.build(m.fragments[:2], "w")
    s.check()
    bad = json.loads(s.to_bytes())
    bad["setsum"] = Setsum.zero().hexdigest()
    with pytest.raises(CorruptManifest):
        Snapshot.from_bytes(json.dumps(bad).encode())
    with pytest.raises(ValueError):
        Snapshot.build([m.fragments[0], s.to_pointer()], "w")
    # A snapshot whose children are no longer a run of the root cannot be applied.
    assert m.with_snapshot(Snapshot.build([m.fragments[0], m.fragments[2]], "w"), "w") is None


def test_assembled_bytes_equal_plain_json_encoding() -> None:
    from dataclasses import replace

    m = grow(Manifest.empty('wr"iter\u00e9'), [3, 2, 5])
    snap = Snapshot.build(m.fragments[:2], "w")
    m = m.with_snapshot(snap, "w")  # type: ignore[assignment]
    m = replace(m, initial_offset=1, initial_seq_no=1, sealed=True)
    obj = {
        "setsum": m.setsum.hexdigest(),
        "collected": m.collected.hexdigest(),
        "acc_bytes": m.acc_bytes,
        "writer": m.writer,
        "snapshots": [s.to_json() for s in m.snapshots],
        "fragments": [f.to_json() for f in m.fragments],
        "initial_offset": {"offset": 1},
        "initial_seq_no": 1,
        "sealed": True,
    }
    assert m.to_bytes() == json.dumps(obj, separators=(",", ":")).encode()
    assert Manifest.from_bytes(m.to_bytes()) == m


@pytest.mark.parametrize(
    "fixture",
    sorted((Path(__file__).parent / "fixtures" / "rust_wal3").iterdir()),
    ids=lambda p: p.name,
)
def test_the_tail_of_every_rust_fixture_is_the_whole_manifests_or_refused(fixture: Path) -> None:
    data = fixture.read_bytes()
    try:
        whole = Manifest.from_bytes(data)
    except CorruptManifest:
        with pytest.raises(CorruptManifest):
            Manifest.tail_from_bytes(data)  # a GC file or a bad manifest is no tail either
        return
    assert_tail_agrees(whole)
    assert Manifest.tail_from_bytes(data) == Manifest.tail_from_bytes(whole.to_bytes())
