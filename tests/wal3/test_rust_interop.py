"""Interoperation with Chroma's Rust wal3 and setsum crates (issue 16).

The fixtures are the Rust crates' own test data (tests/wal3/fixtures/README.md names the commits
and paths).  Where a test needs Rust's behaviour rather than its data, it uses a small model of it
written from the Rust sources at that commit: what serde's derive demands of ``Garbage``
(``rust_decode_garbage``) and what ``Manifest::apply_garbage`` and GC phase 3 do (``rust_apply``,
``rust_phase3_paths``).  The models work on plain JSON, independently of our classes.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from wal3 import (
    FaultRule,
    FaultyStore,
    GarbageRejected,
    LocalStore,
    LogWriter,
    LogWriterOptions,
    ObjectNotFound,
    ObjectStore,
    SimulatedCrash,
    SnapshotOptions,
)
from wal3.cursors import CursorStore
from wal3.errors import CorruptManifest
from wal3.gc import (
    EMPTY_GARBAGE,
    Garbage,
    GarbageCollector,
    GcOptions,
    live_snapshot_paths,
    plan_cut,
)
from wal3.layout import GARBAGE_PATH, join, load_manifest
from wal3.manifest import MANIFEST_PATH, FragmentPointer, Manifest, Snapshot
from wal3.reader import SnapshotCache
from wal3.scrub import scrub_log
from wal3.setsum import Setsum
from wal3.store import put_resolving

from .helpers import assert_dense, read_all

FIXTURES = Path(__file__).parent / "fixtures"
RUST = FIXTURES / "rust_wal3"
SMALL = LogWriterOptions(snapshot=SnapshotOptions(fragment_threshold=3, snapshot_threshold=2))
ZERO = "0" * 64


def canonical(obj: Any) -> bytes:
    """serde_json's compact encoding of a JSON value whose keys are in struct order."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def lanes(s: Setsum) -> list[int]:
    return list(struct.unpack("<8I", s.digest()))


# ------------------------------------------------------------------------------------ setsum


VECTORS = json.loads((FIXTURES / "setsum" / "test_vectors.json").read_text())


def test_setsum_crate_vectors() -> None:
    v = VECTORS
    for case in ("add_state_no_modulus", "add_state_exactly_primes"):
        got = Setsum(v[case]["lhs"]) + Setsum(v[case]["rhs"])
        assert lanes(got) == v[case]["expected"], case
    inv = v["invert_state_desc"]
    assert lanes(Setsum.zero() - Setsum(inv["state_in"])) == inv["expected"]
    visual = v["hash_to_state_visual"]
    digest = struct.pack("<8I", *visual["lanes_le_u32"])
    assert lanes(Setsum.of_digests(digest)) == visual["expected"]
    assert lanes(Setsum.of(b"")) == v["empty_item_to_state"]["expected"]
    seven = v["seven_values"]
    items = [s.encode() for s in seven["items"]]
    for order in (items, items[::-1], [items[i] for i in (4, 3, 2, 5, 6, 1, 0)]):
        acc = Setsum.zero()
        for it in order:
            acc = acc + Setsum.of(it)
        assert list(acc.digest()) == seven["digest_bytes"]
        assert Setsum.of_items(order).hexdigest() == seven["hexdigest"]
    assert Setsum.from_hexdigest(seven["hexdigest"]) == Setsum.of_items(items)
    assert Setsum.from_hexdigest(seven["hexdigest"].upper()) == Setsum.of_items(items)
    # merge and remove, as the crate's setsum_merge_two_sets / setsum_remove_two_sets
    one, two = Setsum.of_items(items[:4]), Setsum.of_items(items[4:])
    assert (one + two).hexdigest() == seven["hexdigest"]
    assert (Setsum.of_items(items) - one - two).is_zero()


@pytest.mark.parametrize(
    "text",
    [
        "0" * 62 + "  ",
        " " + "0" * 63,
        "0" * 63,
        "0" * 65,
        "+f" + "0" * 62,
        "0x" + "0" * 62,
        "g" * 64,
        "é" * 32,
        "\u0660" * 64,
    ],
)
def test_malformed_setsum_hex_is_typed(text: str) -> None:
    with pytest.raises(ValueError):
        Setsum.from_hexdigest(text)
    doc = json.loads((RUST / "bad_manifest1.json").read_text())
    doc["setsum"] = text
    with pytest.raises(CorruptManifest):
        Manifest.from_bytes(canonical(doc))


# --------------------------------------------------------------------- manifests, snapshots


def _snapshots_fixture() -> list[dict[str, Any]]:
    return json.loads((RUST / "bad_snapshots1.json").read_text())


@pytest.mark.parametrize("name", ["bad_manifest1.json", "s3_AA_construct_garbage_MANIFEST"])
def test_rust_manifests_parse_and_reencode_byte_for_byte(name: str) -> None:
    raw = (RUST / name).read_bytes()
    m = Manifest.from_bytes(raw)
    assert m.to_bytes() == canonical(json.loads(raw))
    assert Manifest.from_bytes(m.to_bytes()) == m
    if name.startswith("s3_AA"):
        assert m.to_bytes() == raw  # Rust's own compact bytes, as stored in production
        assert (len(m.snapshots), len(m.fragments)) == (693, 1059)
        assert (m.oldest_offset, m.next_offset, m.next_seq_no) == (1, 3521399, 1420324)


def test_rust_snapshots_parse_check_and_match_their_pointers() -> None:
    snaps = {}
    for obj in _snapshots_fixture():
        s = Snapshot.from_bytes(json.dumps(obj, indent=2).encode())  # whitespace is irrelevant
        assert s.to_bytes() == canonical(obj)
        snaps[s.path] = s
    m = Manifest.from_bytes((RUST / "bad_manifest1.json").read_bytes())
    stack = list(m.snapshots)
    seen = 0
    while stack:
        p = stack.pop()
        assert snaps[p.path_to_snapshot].to_pointer() == p
        stack.extend(snaps[p.path_to_snapshot].snapshots)
        seen += 1
    assert seen == len(snaps) == 13


def test_manifest_without_initial_offset_may_start_anywhere() -> None:
    # What older Chroma releases left after collecting: the prefix gone, `collected` holding it,
    # and no initial_offset.  Built from the production manifest by unlinking its snapshots.
    doc = json.loads((RUST / "s3_AA_construct_garbage_MANIFEST").read_bytes())
    gone = Setsum.sum(Setsum.from_hexdigest(s["setsum"]) for s in doc["snapshots"])
    doc["snapshots"] = []
    doc["collected"] = gone.hexdigest()
    raw = canonical(doc)
    m = Manifest.from_bytes(raw)
    assert m.to_bytes() == raw
    assert m.oldest_offset == doc["fragments"][0]["start"]["offset"] == 3520251
    assert m.next_seq_no == 1420324
    # Rust's own check stays: initial_offset, when present, is where the log starts.
    doc["initial_offset"] = {"offset": 1}
    with pytest.raises(CorruptManifest, match="starts at 3520251, expected 1"):
        Manifest.from_bytes(canonical(doc))
    doc["initial_offset"] = {"offset": 3520251}
    assert Manifest.from_bytes(canonical(doc)).initial_offset == 3520251
    # And the setsum must still balance.
    doc["collected"] = ZERO
    with pytest.raises(CorruptManifest, match="balance"):
        Manifest.from_bytes(canonical(doc))


def test_sealed_is_an_extension_rust_drops() -> None:
    m = Manifest.from_bytes((RUST / "bad_manifest1.json").read_bytes())
    sealed = m.with_sealed("us")
    obj = json.loads(sealed.to_bytes())
    assert obj.pop("sealed") is True and "sealed" not in json.loads(m.to_bytes())
    # What Rust writes back (it ignores the field) is the same manifest, unsealed.
    assert Manifest.from_bytes(canonical(obj)) == sealed.__class__(
        **{**{f: getattr(sealed, f) for f in sealed.__dataclass_fields__}, "sealed": False}
    )


def test_non_ascii_is_written_as_serde_json_writes_it() -> None:
    m = Manifest.from_bytes((RUST / "bad_manifest1.json").read_bytes())
    doc = json.loads(m.to_bytes())
    doc["writer"] = 'gc ✓ \x01\x7f "q"'
    raw = canonical(doc)
    assert b"\xe2\x9c\x93" in raw and b"\\u0001" in raw  # raw UTF-8, control characters escaped
    assert Manifest.from_bytes(raw).to_bytes() == raw
    doc["writer"] = "\ud800"  # a lone surrogate: serde_json refuses it, and so do we
    with pytest.raises(CorruptManifest):
        Manifest.from_bytes(json.dumps(doc).encode())


def test_uuid_named_fragments_are_refused_with_a_typed_error() -> None:
    doc = json.loads((RUST / "bad_manifest1.json").read_text())
    doc["fragments"][0]["seq_no"] = "018f0f72-7a4f-7b2e-b836-a49e4f8ea101"
    with pytest.raises(CorruptManifest):
        Manifest.from_bytes(canonical(doc))
    doc = json.loads((RUST / "bad_manifest1.json").read_text())
    doc["initial_seq_no"] = "018f0f72-7a4f-7b2e-b836-a49e4f8ea101"
    with pytest.raises(CorruptManifest):
        Manifest.from_bytes(canonical(doc))


# ------------------------------------------------------------------- a model of Rust's side


def _u64(v: Any) -> int:
    assert isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**64, v
    return v


def _pos(v: Any) -> int:
    assert isinstance(v, dict)
    return _u64(v["offset"])


def _hex(v: Any) -> Setsum:
    assert isinstance(v, str) and len(v) == 64
    return Setsum.from_hexdigest(v)


def _rust_pointer(p: Any) -> None:
    _hex(p["setsum"])
    assert isinstance(p["path_to_snapshot"], str)
    assert 0 <= _u64(p["depth"]) <= 255
    _pos(p["start"]), _pos(p["limit"]), _u64(p["num_bytes"])


def _rust_fragment(f: Any) -> None:
    assert isinstance(f["path"], str)
    _u64(f["seq_no"]), _pos(f["start"]), _pos(f["limit"]), _u64(f["num_bytes"]), _hex(f["setsum"])


def rust_decode_garbage(obj: Any) -> dict[str, Any]:
    """What serde's derive of Rust's ``Garbage`` demands: every field without a default present
    and well typed (``snapshot_for_root`` is an Option, ``fragments_are_uuids`` defaults to
    false); unknown fields are ignored (no ``deny_unknown_fields``)."""
    assert isinstance(obj, dict)
    for p in obj["snapshots_to_drop"]:
        _rust_pointer(p)
    for s in obj["snapshots_to_make"]:
        assert isinstance(s["path"], str) and isinstance(s["writer"], str)
        _u64(s["depth"]), _hex(s["setsum"])
        for p in s["snapshots"]:
            _rust_pointer(p)
        for f in s["fragments"]:
            _rust_fragment(f)
    if obj.get("snapshot_for_root") is not None:
        _rust_pointer(obj["snapshot_for_root"])
    _u64(obj["fragments_to_drop_start"]), _u64(obj["fragments_to_drop_limit"])
    assert isinstance(obj.get("fragments_are_uuids", False), bool)
    _hex(obj["setsum_to_discard"]), _pos(obj["first_to_keep"])
    return obj


RUST_EMPTY = {
    "snapshots_to_drop": [],
    "snapshots_to_make": [],
    "snapshot_for_root": None,
    "fragments_to_drop_start": 0,
    "fragments_to_drop_limit": 0,
    "fragments_are_uuids": False,
    "setsum_to_discard": ZERO,
    "first_to_keep": {"offset": 1},
}


def rust_is_empty(obj: dict[str, Any]) -> bool:
    known = {k: obj.get(k, False if k == "fragments_are_uuids" else None) for k in RUST_EMPTY}
    return known == RUST_EMPTY


def _oldest(man: dict[str, Any]) -> int:
    entries = man["snapshots"] + man["fragments"]
    if entries:
        return min(e["start"]["offset"] for e in entries)
    return man.get("initial_offset", {"offset": 1})["offset"]


def _next(man: dict[str, Any]) -> int:
    entries = man["snapshots"] + man["fragments"]
    if entries:
        return max(e["limit"]["offset"] for e in entries)
    return man.get("initial_offset", {"offset": 1})["offset"]


def rust_apply(man: dict[str, Any], g: dict[str, Any]) -> dict[str, Any] | None:
    """``Manifest::apply_garbage`` on plain JSON: None when there is nothing to do; raises
    AssertionError where Rust returns an error."""
    assert not rust_is_empty(g), "cannot apply empty garbage"
    start, limit = g["fragments_to_drop_start"], g["fragments_to_drop_limit"]
    root = g.get("snapshot_for_root")
    if (
        limit <= man.get("initial_seq_no", 1)
        and not any(p in man["snapshots"] for p in g["snapshots_to_drop"])
        and not g["snapshots_to_make"]
    ):
        return None
    assert start <= limit, "Garbage has start > limit"
    if limit == 0:
        return None
    new = copy.deepcopy(man)
    acc = Setsum.zero()
    for p in g["snapshots_to_drop"]:
        if p in new["snapshots"]:
            if p != root:
                acc = acc + _hex(p["setsum"])
            new["snapshots"].remove(p)
    for f in list(new["fragments"]):
        if start <= f["seq_no"] < limit:
            acc = acc + _hex(f["setsum"])
            new["fragments"].remove(f)
    came = Setsum.zero()
    if root is not None and root not in new["snapshots"]:
        came = _hex(root["setsum"])
        new["snapshots"].insert(0, root)
    assert acc - came == _hex(g["setsum_to_discard"]), "Setsum mismatch"
    new["collected"] = (_hex(new["collected"]) + _hex(g["setsum_to_discard"])).hexdigest()
    new["initial_offset"] = g["first_to_keep"]
    new["initial_seq_no"] = limit
    # Manifest::scrub, then the two end-point checks.
    live = Setsum.sum(_hex(e["setsum"]) for e in new["snapshots"] + new["fragments"])
    assert _hex(new["setsum"]) == live + _hex(new["collected"]), "scrub: setsum"
    for run in (new["snapshots"], new["fragments"]):
        for a, b in itertools.pairwise(run):
            assert a["limit"] == b["start"], "scrub: gap"
    if new["snapshots"] and new["fragments"]:
        assert new["snapshots"][-1]["limit"] == new["fragments"][0]["start"], "scrub: gap"
    assert new["initial_offset"]["offset"] == _oldest(new), "scrub: initial offset"
    assert _oldest(new) <= g["first_to_keep"]["offset"]
    assert _next(new) == _next(man), "next log position moved"
    return new


def rust_phase3_paths(g: dict[str, Any]) -> list[str]:
    """What Rust's phase 3 deletes, unconditionally: every snapshot in ``snapshots_to_drop`` and
    the fragments numbered ``[start, limit)``."""
    from wal3.fragment import fragment_path

    return [p["path_to_snapshot"] for p in g["snapshots_to_drop"]] + [
        fragment_path(s) for s in range(g["fragments_to_drop_start"], g["fragments_to_drop_limit"])
    ]


# -------------------------------------------------------------------------------- gc/GARBAGE


def test_idle_garbage_is_rusts_empty() -> None:
    assert canonical(RUST_EMPTY) == EMPTY_GARBAGE
    assert Garbage.from_bytes(EMPTY_GARBAGE) is None
    older = dict(RUST_EMPTY)
    del older["fragments_are_uuids"]  # Rust before UUID fragments
    assert Garbage.from_bytes(canonical(older)) is None
    assert Garbage.from_bytes(b"{}") is None  # ours before issue 16
    assert Garbage.from_bytes(json.dumps(RUST_EMPTY, indent=4).encode()) is None


def test_rusts_serialized_garbage_parses_and_reencodes() -> None:
    raw = (RUST / "deserialize_garbage_from_json.json").read_bytes()
    g = Garbage.from_bytes(raw)
    assert g is not None
    # the assertions of gc.rs's deserialize_garbage_from_json
    assert len(g.snapshots_to_drop) == 1
    d = g.snapshots_to_drop[0]
    assert d.setsum.hexdigest() == (
        "25bdf4e28c8079d3e0324db417fa28eede29f8d7cc34c71fac19c39ca4691792"
    )
    assert d.path_to_snapshot == "snapshot/SNAPSHOT." + d.setsum.hexdigest()
    assert (d.depth, d.start, d.limit, d.num_bytes) == (1, 1, 2379, 3796051)
    assert len(g.snapshots_to_make) == 1
    made = g.snapshots_to_make[0]
    assert made.setsum.hexdigest() == "abcd1234" * 8
    assert (made.depth, made.writer, len(made.fragments)) == (2, "garbage collection", 1)
    assert made.fragments[0].seq_no == 1
    root = g.snapshot_for_root
    assert root is not None and root.setsum.hexdigest() == (
        "1b5797c4029b6664a74ccebba552f95767a22731a375cdddc0538afd01e88116"
    )
    assert (root.start, root.limit) == (2379, 4816)
    assert (g.fragments_to_drop_start, g.fragments_to_drop_limit) == (100, 200)
    assert g.setsum_to_discard.hexdigest() == (
        "c921d21a0820be5d3b6f2d90942648f2853188bb0e3c6a22fe3dbd81c1e1c380"
    )
    assert g.first_to_keep == 900883
    assert (g.applied_us, g.created_us) == (None, None)
    # serde_json::to_string(&garbage): struct order, fragments_are_uuids always written.
    obj = json.loads(raw)
    expect = {
        k: obj[k]
        for k in (
            "snapshots_to_drop",
            "snapshots_to_make",
            "snapshot_for_root",
            "fragments_to_drop_start",
            "fragments_to_drop_limit",
        )
    }
    expect["fragments_are_uuids"] = False
    expect.update(setsum_to_discard=obj["setsum_to_discard"], first_to_keep=obj["first_to_keep"])
    assert g.to_bytes() == canonical(expect)
    assert Garbage.from_bytes(g.to_bytes()) == g


def test_case_seen_in_the_wild() -> None:
    # gc.rs's case_seen_in_the_wild: the repair plan for a log whose snapshots were deleted
    # before the manifest let go of them.
    m = Manifest.from_bytes((RUST / "s3_AA_construct_garbage_MANIFEST").read_bytes())
    g = Garbage.unlinking_root_snapshots(m, 806913, 900883)
    assert (g.fragments_to_drop_start, g.fragments_to_drop_limit) == (806913, 806913)
    assert g.setsum_to_discard.hexdigest() == (
        "c921d21a0820be5d3b6f2d90942648f2853188bb0e3c6a22fe3dbd81c1e1c380"
    )
    assert g.first_to_keep == 900883
    assert g.snapshots_to_drop and all(s.limit <= 900883 for s in g.snapshots_to_drop)
    # Applied, by us and by the model of Rust, it gives the same manifest, which we accept.
    ours = g.apply(m, m.writer)
    theirs = rust_apply(json.loads(m.to_bytes()), json.loads(g.to_bytes()))
    assert theirs is not None and ours.to_bytes() == canonical(theirs)
    assert (ours.oldest_offset, ours.next_offset) == (900883, m.next_offset)
    assert ours.collected == g.setsum_to_discard
    assert Manifest.from_bytes(ours.to_bytes()) == ours
    assert g.apply(ours, m.writer) is ours  # idempotent


async def _store_snapshots(store: ObjectStore, prefix: str) -> None:
    for obj in _snapshots_fixture():
        await store.put(join(prefix, obj["path"]), json.dumps(obj, indent=2).encode())


async def test_bad_manifest1_collects_at_9340(tmp_path: Path) -> None:
    # s3_bad_manifest1.rs: Garbage::new(bad_manifest1, first_to_keep=9340) must succeed.  Rust
    # drops every fragment whose range ends at or below 9340 (fragments 1..=15, the last of them
    # inside a snapshot that straddles the cut), so the expectations come from the leaves.
    store = LocalStore(tmp_path / "s")
    await _store_snapshots(store, "logs/b")
    m = Manifest.from_bytes((RUST / "bad_manifest1.json").read_bytes())
    leaves = sorted(
        (f for obj in _snapshots_fixture() for f in obj["fragments"]), key=lambda f: f["seq_no"]
    )
    gone = [f for f in leaves if f["limit"]["offset"] <= 9340]
    assert [f["seq_no"] for f in gone] == list(range(1, 16))

    async def put(s: Snapshot) -> None:
        await store.put(join("logs/b", s.path), s.to_bytes())

    g = await plan_cut(store, "logs/b", m, 9340, SnapshotCache(), "gc", put, now_us=1)
    assert g is not None
    assert (g.fragments_to_drop_start, g.fragments_to_drop_limit) == (1, 16)
    assert g.first_to_keep == gone[-1]["limit"]["offset"] == 8837
    assert g.setsum_to_discard == Setsum.sum(Setsum.from_hexdigest(f["setsum"]) for f in gone)
    assert {p.path_to_snapshot for p in g.snapshots_to_drop} == {
        o["path"] for o in _snapshots_fixture()
    }  # all 13: dropped whole or split
    obj = rust_decode_garbage(json.loads(g.to_bytes()))
    theirs = rust_apply(json.loads(m.to_bytes()), obj)
    ours = g.apply(m, m.writer)
    assert theirs is not None and canonical(theirs) == ours.to_bytes()
    assert ours.oldest_offset == 8837 and ours.next_offset == m.next_offset
    # The new root snapshot holds exactly the kept leaf of the straddler.
    assert ours.snapshots[0] == g.snapshot_for_root
    new = Snapshot.from_bytes((await store.get(join("logs/b", ours.snapshots[0].path))).data)
    assert [f.seq_no for f in new.fragments] == [16]


@pytest.mark.parametrize(
    "bad",
    [
        b"",
        b"[]",
        b"null",
        b'{"cutoff": 5}',
        b"[" * 50_000,
        b"\xff\xfe",
        canonical({**RUST_EMPTY, "fragments_are_uuids": True}),
        canonical(
            {**RUST_EMPTY, "fragments_to_drop_uuid_limit": "018f0f72-7a4f-7b2e-b836-a49e4f8ea101"}
        ),
        canonical({**RUST_EMPTY, "fragments_to_drop_start": -1}),
        canonical({**RUST_EMPTY, "fragments_to_drop_start": 2**64}),
        canonical({**RUST_EMPTY, "first_to_keep": 5}),
        canonical({**RUST_EMPTY, "setsum_to_discard": "0" * 62 + "  "}),
        canonical({**RUST_EMPTY, "snapshots_to_drop": [{"setsum": ZERO}]}),
        canonical({**RUST_EMPTY, "snapshots_to_make": {}}),
        canonical({**RUST_EMPTY, "applied_us": "soon"}),
        canonical({k: v for k, v in RUST_EMPTY.items() if k != "first_to_keep"}),
    ],
)
def test_malformed_garbage_is_rejected_with_a_typed_error(bad: bytes) -> None:
    with pytest.raises(GarbageRejected):
        Garbage.from_bytes(bad)


# ---------------------------------------------------------------------- handing a log over


async def _log(tmp_path: Path, prefix: str, cut: int) -> tuple[LocalStore, Clock]:
    store = LocalStore(tmp_path / "store")
    w = await LogWriter.open(store, prefix, SMALL)
    for i in range(30):
        await w.append(f"r{i}".encode())
    await w.compact_manifest()
    await w.close()
    await CursorStore(store, prefix, "t").init("compaction", cut)
    return store, Clock()


class Clock:
    """A settable clock so grace intervals pass without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def _plan_only(store: ObjectStore, prefix: str, clock: Clock) -> tuple[bytes, Manifest]:
    """Run our phase 1 and stop: the crash point right after the plan is written."""
    faulty = FaultyStore(store, seed=1)
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=r"gc/GARBAGE$", times=1))
    gc = GarbageCollector(faulty, prefix, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    with pytest.raises(SimulatedCrash):
        await gc.run_once()
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    return (await store.get(join(prefix, GARBAGE_PATH))).data, loaded[0]


async def _rust_phase2(store: ObjectStore, prefix: str, plan: dict[str, Any]) -> Manifest:
    """Rust resumes our plan: apply it to the stored manifest by its rules, write it back."""
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    m, etag = loaded
    new = rust_apply(json.loads(m.to_bytes()), plan)
    assert new is not None
    await put_resolving(store, join(prefix, MANIFEST_PATH), canonical(new), if_match=etag)
    return Manifest.from_bytes(canonical(new))


async def _live(store: ObjectStore, prefix: str) -> tuple[Manifest, set[str]]:
    loaded = await load_manifest(store, prefix)
    assert loaded is not None
    m = loaded[0]
    return m, await live_snapshot_paths(store, prefix, m, SnapshotCache())


async def _finish_ours(store: ObjectStore, prefix: str, clock: Clock) -> None:
    gc = GarbageCollector(store, prefix, GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    assert (await store.get(join(prefix, GARBAGE_PATH))).data == EMPTY_GARBAGE


async def _intact(store: ObjectStore, prefix: str, first: int) -> None:
    manifest, records = await read_all(store, prefix)
    assert manifest.oldest_offset == first
    assert_dense(records, first)
    assert [r.body for r in records] == [f"r{i}".encode() for i in range(first - 1, 30)]
    report = await scrub_log(store, prefix)
    assert report.ok, report.problems


@pytest.mark.parametrize("cut", [5, 14, 17, 26])
async def test_our_plan_is_resumed_by_rust_and_handed_back(tmp_path: Path, cut: int) -> None:
    store, clock = await _log(tmp_path, "logs/h", cut)
    raw, before = await _plan_only(store, "logs/h", clock)
    plan = rust_decode_garbage(json.loads(raw))
    assert not rust_is_empty(plan) and plan["first_to_keep"]["offset"] <= cut
    g = Garbage.from_bytes(raw)
    assert g is not None and g.applied_us is None and g.created_us is not None
    # Rust's phase 2 applies it exactly as ours would ...
    after = await _rust_phase2(store, "logs/h", plan)
    assert after.to_bytes() == g.apply(before, before.writer).to_bytes()
    # ... and every path Rust's phase 3 would then delete unconditionally is unreferenced.
    m, live = await _live(store, "logs/h")
    doomed = set(rust_phase3_paths(plan))
    assert not doomed & live
    leaves = {f.path for f in await _leaves(store, "logs/h", m)}
    assert not doomed & leaves
    # We pick the applied plan back up: record it applied, wait out the grace, delete, reset.
    await _finish_ours(store, "logs/h", clock)
    await _intact(store, "logs/h", plan["first_to_keep"]["offset"])
    for path in doomed:
        with pytest.raises(ObjectNotFound):
            await store.head(join("logs/h", path))


async def _leaves(store: ObjectStore, prefix: str, m: Manifest) -> list[FragmentPointer]:
    from wal3.reader import Limits, resolve_fragments

    return await resolve_fragments(
        store, prefix, m.entries, m.oldest_offset, Limits(), SnapshotCache()
    )


@pytest.mark.parametrize("cut", [5, 17, 26])
async def test_rust_phase3_after_our_phase2_keeps_the_log_intact(tmp_path: Path, cut: int) -> None:
    # Ours applies (phase 2 records applied_us) and then Rust runs its phase 3 on our file:
    # it deletes what the plan lists without looking and resets to Garbage::empty().
    store, clock = await _log(tmp_path, "logs/r", cut)
    gc = GarbageCollector(store, "logs/r", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    raw = (await store.get(join("logs/r", GARBAGE_PATH))).data
    plan = rust_decode_garbage(json.loads(raw))
    assert "applied_us" in plan  # our extension, which Rust ignores
    for path in rust_phase3_paths(plan):
        with contextlib.suppress(ObjectNotFound):
            await store.delete(join("logs/r", path))
    await store.put(join("logs/r", GARBAGE_PATH), canonical(RUST_EMPTY))
    await _intact(store, "logs/r", plan["first_to_keep"]["offset"])
    report = await gc.run_once()  # and ours carries on from Rust's idle file
    assert report.phase in ("idle", "done", "waiting")


@pytest.mark.parametrize("rust_applied", [False, True])
async def test_a_plan_rust_wrote_is_resumed_by_ours(tmp_path: Path, rust_applied: bool) -> None:
    store, clock = await _log(tmp_path, "logs/w", 17)
    raw, _ = await _plan_only(store, "logs/w", clock)
    # Make it Rust's: no extension fields, its own order of snapshots_to_drop, and (for the
    # not-yet-applied case) the split snapshots not yet in the store, which we must install.
    obj = json.loads(raw)
    del obj["created_us"]
    obj["snapshots_to_drop"].reverse()
    rust_decode_garbage(obj)
    assert obj["snapshots_to_make"], "the cut must split a snapshot for this test to bite"
    await store.put(join("logs/w", GARBAGE_PATH), canonical(obj))
    if rust_applied:
        await _rust_phase2(store, "logs/w", obj)
    else:
        for s in obj["snapshots_to_make"]:
            await store.delete(join("logs/w", s["path"]))
    gc = GarbageCollector(store, "logs/w", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    r1 = await gc.run_once()
    assert r1.phase == "waiting", r1.notes
    g = Garbage.from_bytes((await store.get(join("logs/w", GARBAGE_PATH))).data)
    assert g is not None and g.applied_us == int(clock.now * 1_000_000)  # grace starts now
    # Nothing is deleted before the grace interval has passed.
    for path in rust_phase3_paths(obj):
        if not path.startswith("snapshot/") or path not in {
            s["path"] for s in obj["snapshots_to_make"]
        }:
            await store.head(join("logs/w", path))
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    await _intact(store, "logs/w", obj["first_to_keep"]["offset"])


async def _garbage_file(store: ObjectStore, prefix: str, obj: dict[str, Any]) -> None:
    await store.put(join(prefix, GARBAGE_PATH), canonical(obj))


@pytest.mark.parametrize(
    "mutation",
    [
        "setsum",
        "inverted",
        "missing_root_snapshot",
        "drops_tail",
        "past_cursor",
        "bad_snapshot",
    ],
)
async def test_inconsistent_foreign_plans_are_discarded_not_applied(
    tmp_path: Path, mutation: str
) -> None:
    store, clock = await _log(tmp_path, "logs/x", 17)
    raw, before = await _plan_only(store, "logs/x", clock)
    obj = json.loads(raw)
    del obj["created_us"]
    if mutation == "setsum":
        obj["setsum_to_discard"] = (_hex(obj["setsum_to_discard"]) + Setsum.of(b"x")).hexdigest()
    elif mutation == "inverted":
        obj["fragments_to_drop_start"] = obj["fragments_to_drop_limit"] + 1
    elif mutation == "missing_root_snapshot":
        obj["snapshots_to_make"] = []
        for s in json.loads(raw)["snapshots_to_make"]:
            await store.delete(join("logs/x", s["path"]))
    elif mutation == "drops_tail":  # what Rust plans when a cursor sits at the tail
        obj["fragments_to_drop_limit"] = before.next_seq_no
        obj["setsum_to_discard"] = (before.setsum - before.collected).hexdigest()
        obj["snapshots_to_drop"] = [p.to_json() for p in before.snapshots]
        obj["snapshot_for_root"] = None
        obj["snapshots_to_make"] = []
        obj["first_to_keep"] = {"offset": before.next_offset}
    elif mutation == "past_cursor":
        obj["first_to_keep"] = {"offset": 18}
    elif mutation == "bad_snapshot":
        obj["snapshots_to_make"][0]["depth"] = 7
    await _garbage_file(store, "logs/x", obj)
    gc = GarbageCollector(store, "logs/x", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    report = await gc.run_once()
    assert report.phase == "discarded", report.notes
    after, _ = await _live(store, "logs/x")
    assert after.to_bytes() == before.to_bytes()  # nothing applied
    assert (await store.get(join("logs/x", GARBAGE_PATH))).data == EMPTY_GARBAGE
    # and collection goes on with a plan of our own
    await _finish_ours(store, "logs/x", clock) if (await gc.run_once()).phase == "waiting" else None
    manifest, records = await read_all(store, "logs/x")
    assert_dense(records, manifest.oldest_offset)
    assert (await scrub_log(store, "logs/x")).ok


async def test_a_plan_in_the_old_schema_is_reset(tmp_path: Path) -> None:
    store, clock = await _log(tmp_path, "logs/l", 17)
    legacy = {
        "cutoff": {"offset": 17},
        "drop_root": [],
        "replace_root": None,
        "new_root": [],
        "new_snapshots": [],
        "snapshots_to_delete": [],
        "fragments_to_delete": {"first_seq_no": 1, "limit_seq_no": 9},
        "first_to_keep": {"offset": 9},
        "setsum_to_discard": ZERO,
        "bytes_to_discard": 0,
        "created_us": 1,
        "applied_us": None,
    }
    await _garbage_file(store, "logs/l", legacy)
    g = Garbage.from_bytes(canonical(legacy))
    assert g is not None and g.legacy and g.first_to_keep == 9
    with pytest.raises(GarbageRejected):
        g.apply(Manifest(), "x")
    gc = GarbageCollector(store, "logs/l", GcOptions(grace_s=0, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "discarded"
    assert (await store.get(join("logs/l", GARBAGE_PATH))).data == EMPTY_GARBAGE
    await gc.run_once()
    await gc.run_once()
    manifest, records = await read_all(store, "logs/l")
    assert manifest.oldest_offset > 1
    assert_dense(records, manifest.oldest_offset)


async def test_rusts_wrapped_lone_child_is_read_and_collected(tmp_path: Path) -> None:
    # When a split leaves a level with one child snapshot, Rust's Garbage::new wraps it: it makes
    # a snapshot one level deeper over that child, which has the child's setsum, hence its path.
    # Rust installs the child first (IfNotExist: the wrapper's put finds the path taken) and
    # links a depth-2 pointer to the depth-1 object; Rust never compares the depths.  This is
    # what Rust does on bad_manifest1 at 9340.  We must read, scrub and collect such a log.
    store, clock = await _log(tmp_path, "logs/z", 20)
    raw, _ = await _plan_only(store, "logs/z", clock)
    ours = Garbage.from_bytes(raw)
    assert ours is not None and ours.snapshot_for_root is not None
    child = ours.snapshot_for_root
    wrapper = Snapshot.build([child], "garbage collection")
    assert wrapper.path == child.path_to_snapshot and wrapper.depth == child.depth + 1
    obj = json.loads(raw)
    del obj["created_us"]
    obj["snapshots_to_make"].append(json.loads(wrapper.to_bytes()))
    obj["snapshot_for_root"] = wrapper.to_pointer().to_json()
    await _rust_phase2(store, "logs/z", rust_decode_garbage(obj))
    m, _ = await _live(store, "logs/z")
    assert m.snapshots[0].depth == child.depth + 1  # the pointer is deeper than the object
    await _intact(store, "logs/z", obj["first_to_keep"]["offset"])
    # Rust's phase 3 on it, then ours collects further over the wrapped pointer.
    for path in rust_phase3_paths(obj):
        with contextlib.suppress(ObjectNotFound):
            await store.delete(join("logs/z", path))
    await store.put(join("logs/z", GARBAGE_PATH), EMPTY_GARBAGE)
    await _intact(store, "logs/z", obj["first_to_keep"]["offset"])
    cursors = CursorStore(store, "logs/z", "t")
    witness = await cursors.load("compaction")
    assert witness is not None
    await cursors.save("compaction", 26, witness)
    gc = GarbageCollector(store, "logs/z", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    for _ in range(3):
        await gc.run_once()
        clock.now += 61
    manifest, records = await read_all(store, "logs/z")
    assert manifest.oldest_offset > obj["first_to_keep"]["offset"]
    assert_dense(records, manifest.oldest_offset)
    assert (await scrub_log(store, "logs/z")).ok


async def test_rusts_wrapped_plan_is_resumed_by_ours(tmp_path: Path) -> None:
    # The same Rust plan, not yet applied when we find it: we re-install its snapshots in its
    # order (the child first, so the path holds the child) and apply it as Rust would.
    store, clock = await _log(tmp_path, "logs/y", 20)
    raw, before = await _plan_only(store, "logs/y", clock)
    obj = json.loads(raw)
    child = Garbage.from_bytes(raw).snapshot_for_root  # type: ignore[union-attr]
    assert child is not None
    wrapper = Snapshot.build([child], "garbage collection")
    del obj["created_us"]
    obj["snapshots_to_make"].append(json.loads(wrapper.to_bytes()))
    obj["snapshot_for_root"] = wrapper.to_pointer().to_json()
    for s in obj["snapshots_to_make"]:
        with contextlib.suppress(ObjectNotFound):
            await store.delete(join("logs/y", s["path"]))
    await _garbage_file(store, "logs/y", obj)
    gc = GarbageCollector(store, "logs/y", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    m, _ = await _live(store, "logs/y")
    expect = rust_apply(json.loads(before.to_bytes()), obj)
    assert expect is not None
    assert m.entries == Manifest.from_bytes(canonical(expect)).entries
    stored = Snapshot.from_bytes((await store.get(join("logs/y", child.path_to_snapshot))).data)
    assert stored.depth == child.depth  # the child, not the wrapper, holds the path
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    await _intact(store, "logs/y", obj["first_to_keep"]["offset"])


async def test_phase3_deletes_only_snapshot_names_a_plan_lists(tmp_path: Path) -> None:
    # A plan is data from whoever wrote gc/GARBAGE: paths outside snapshot/ are never deleted.
    store, clock = await _log(tmp_path, "logs/d", 17)
    gc = GarbageCollector(store, "logs/d", GcOptions(grace_s=60, retain_fragments=0), clock=clock)
    assert (await gc.run_once()).phase == "waiting"
    obj = json.loads((await store.get(join("logs/d", GARBAGE_PATH))).data)
    await store.put(join("logs", "victim"), b"x")
    for path in ("manifest/MANIFEST", "cursor/compaction.json", "../victim", "gc/GARBAGE"):
        p = dict(obj["snapshots_to_drop"][0])
        p["path_to_snapshot"] = path
        obj["snapshots_to_drop"].append(p)
    await _garbage_file(store, "logs/d", obj)
    clock.now += 61
    assert (await gc.run_once()).phase == "done"
    await store.head(join("logs", "victim"))
    await store.head(join("logs/d", "cursor/compaction.json"))
    await _intact(store, "logs/d", obj["first_to_keep"]["offset"])


async def test_our_old_idle_file_is_rewritten_as_rusts(tmp_path: Path) -> None:
    # "{}" (our idle state before issue 16) makes Rust's collector fail on the log for good, so
    # the first pass of ours that finds it rewrites it as Garbage::empty(), even with nothing
    # to collect.
    store, clock = await _log(tmp_path, "logs/o", 1)
    await store.put(join("logs/o", GARBAGE_PATH), b"{}")
    gc = GarbageCollector(store, "logs/o", GcOptions(grace_s=60), clock=clock)
    assert (await gc.run_once()).phase == "idle"
    data = (await store.get(join("logs/o", GARBAGE_PATH))).data
    assert data == EMPTY_GARBAGE and rust_is_empty(rust_decode_garbage(json.loads(data)))
