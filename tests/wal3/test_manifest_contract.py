"""``wal3/manifest.py`` rule by rule: every refusal of the parser and of ``check`` with its text,
every boundary of the u64 / u8 fields, positions, transforms and snapshot planning.

The property tests (test_manifest.py) and the fuzzers (test_formats_fuzz.py) hold the invariants
and "every malformed value is CorruptManifest"; this file pins *which* value is refused and what
the operator reads, field by field, for the mutation run of the module (docs/RELIABILITY.md).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from wal3 import CorruptManifest, FragmentPointer, Manifest, Setsum, Snapshot
from wal3.errors import LogFull
from wal3.manifest import (
    U64_MAX,
    GcFloor,
    SnapshotPointer,
    ensure_room,
    loads,
    plan_snapshot,
)
from wal3.paths import fragment_path, snapshot_path

NONCE = "0123456789abcdef0123456789abcdef"
MD5 = "d41d8cd98f00b204e9800998ecf8427e"


def frag(seq: int, start: int, n: int, num_bytes: int | None = None) -> FragmentPointer:
    return FragmentPointer(
        fragment_path(seq),
        seq,
        start,
        start + n,
        100 + n if num_bytes is None else num_bytes,
        Setsum.of(f"{seq}:{start}:{n}".encode()),
    )


def log_of(*sizes: int, writer: str = "w") -> Manifest:
    m = Manifest.empty(writer)
    for n in sizes:
        m = m.with_fragments([frag(m.next_seq_no, m.next_offset, n)], writer)
    return m


def raw(m: Manifest) -> dict[str, Any]:
    obj = json.loads(m.to_bytes())
    assert isinstance(obj, dict)
    return obj


def refused(obj: Any, message: str) -> None:
    """``Manifest.from_bytes`` of ``obj`` raises CorruptManifest with exactly ``message``."""
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    with pytest.raises(CorruptManifest) as e:
        Manifest.from_bytes(data)
    assert str(e.value) == message


# ------------------------------------------------------------------------------ the parser


def test_bytes_that_are_not_json_name_what_they_were() -> None:
    with pytest.raises(CorruptManifest, match=r"^manifest is not JSON: "):
        Manifest.from_bytes(b"{")
    with pytest.raises(CorruptManifest, match=r"^snapshot is not JSON: "):
        loads(b"\xff", "snapshot")
    with pytest.raises(CorruptManifest, match=r"^snapshot is not JSON: "):
        Snapshot.from_bytes(b"{")
    with pytest.raises(CorruptManifest, match=r"^manifest is not JSON: "):
        Manifest.from_bytes(b"[" * 100_000)  # nesting past the recursion limit
    refused([1], "manifest is not a JSON object")


def test_top_level_fields_are_refused_by_name() -> None:
    good = raw(log_of(2, 3))
    refused({**good, "initial_seq_no": -1}, "initial_seq_no is not a u64 sequence number: -1")
    refused({**good, "initial_seq_no": True}, "initial_seq_no is not a u64 sequence number: True")
    refused(
        {**good, "initial_seq_no": "0198-uuid"},
        "initial_seq_no is not a u64 sequence number: '0198-uuid'",
    )
    refused({**good, "sealed": "yes"}, "sealed is not a boolean: 'yes'")
    refused({**good, "sealed": 1}, "sealed is not a boolean: 1")
    refused({**good, "setsum": "zz"}, "setsum is not a setsum: 'zz'")
    refused({**good, "collected": 7}, "collected is not a setsum: 7")
    refused(
        {**good, "acc_bytes": -1},
        f"manifest.acc_bytes is not an integer in [0, {U64_MAX}]: -1",
    )
    refused(
        {**good, "acc_bytes": U64_MAX + 1},
        f"manifest.acc_bytes is not an integer in [0, {U64_MAX}]: {U64_MAX + 1}",
    )
    refused(
        {**good, "acc_bytes": True},
        f"manifest.acc_bytes is not an integer in [0, {U64_MAX}]: True",
    )
    refused({**good, "writer": 5}, "manifest.writer is not a string: 5")
    refused({**good, "snapshots": {}}, "manifest.snapshots is not a list: {}")
    refused({**good, "fragments": "f"}, "manifest.fragments is not a list: 'f'")
    refused({**good, "initial_offset": 3}, "initial_offset is not a log position: 3")
    refused({**good, "read_lease_ms": -1}, "read_lease_ms is not a non-negative integer: -1")
    refused({**good, "read_lease_ms": True}, "read_lease_ms is not a non-negative integer: True")
    refused({**good, "read_lease_ms": 1.5}, "read_lease_ms is not a non-negative integer: 1.5")
    refused({**good, "gc_floor": 5}, "gc_floor is not a pending floor: 5")
    refused({**good, "lease_holder": 5}, "manifest.lease_holder is not a string: 5")


def test_a_lone_surrogate_is_refused_as_invalid_unicode() -> None:
    good = raw(log_of(1))
    data = json.dumps({**good, "writer": "PLACEHOLDER"}).replace("PLACEHOLDER", "\\ud800")
    refused(data.encode(), "manifest.writer is not valid Unicode: '\\ud800'")


def test_values_in_messages_are_cut_at_200_characters() -> None:
    good = raw(log_of(1))
    long = "s" * 500
    with pytest.raises(CorruptManifest) as e:
        Manifest.from_bytes(json.dumps({**good, "setsum": long}).encode())
    assert str(e.value) == "setsum is not a setsum: " + repr(long)[:200]


def test_optional_fields_read_as_their_defaults_and_limits_are_inclusive() -> None:
    good = raw(log_of(2))
    for key in (
        "collected",
        "writer",
        "snapshots",
        "sealed",
        "gc_floor",
        "read_lease_ms",
        "lease_holder",
    ):
        good.pop(key, None)
    good["setsum"] = raw(log_of(2))["setsum"]
    m = Manifest.from_bytes(json.dumps(good).encode())
    assert (m.collected, m.writer, m.snapshots, m.sealed) == (Setsum.zero(), "", (), False)
    assert (m.gc_floor, m.read_lease_ms, m.lease_holder) == (None, None, None)
    good.update(acc_bytes=U64_MAX, read_lease_ms=0, sealed=True, snapshots=None, fragments=None)
    good["setsum"] = "0" * 64
    m = Manifest.from_bytes(json.dumps(good).encode())
    assert (m.acc_bytes, m.read_lease_ms, m.sealed, m.entries) == (U64_MAX, 0, True, ())


def test_fragment_pointer_fields_are_refused_by_name() -> None:
    good = raw(log_of(1))
    f = good["fragments"][0]

    def with_frag(**change: Any) -> dict[str, Any]:
        return {**good, "fragments": [{**f, **change}]}

    refused({**good, "fragments": [5]}, "fragment is not an object: 5")
    refused(with_frag(path=1), "fragment.path is not a string: 1")
    refused(with_frag(seq_no=-1), f"fragment.seq_no is not an integer in [0, {U64_MAX}]: -1")
    refused(with_frag(start={"offset": -1}), "fragment.start is not a log position: {'offset': -1}")
    refused(
        with_frag(limit={"offset": "2"}), "fragment.limit is not a log position: {'offset': '2'}"
    )
    refused(
        with_frag(limit={"offset": True}), "fragment.limit is not a log position: {'offset': True}"
    )
    refused(
        with_frag(num_bytes=None), f"fragment.num_bytes is not an integer in [0, {U64_MAX}]: None"
    )
    refused(with_frag(setsum="ab"), "fragment.setsum is not a setsum: 'ab'")
    refused(
        with_frag(content_md5=MD5.upper()),
        f"fragment.content_md5 is not a hex MD5: {MD5.upper()!r}",
    )
    refused(
        with_frag(content_md5=MD5 + "0"), f"fragment.content_md5 is not a hex MD5: {MD5 + '0'!r}"
    )
    refused(with_frag(content_md5=5), "fragment.content_md5 is not a hex MD5: 5")
    m = Manifest.from_bytes(json.dumps(with_frag(content_md5=MD5)).encode())
    assert m.fragments[0].content_md5 == MD5
    assert (
        m.fragments[0].json_bytes()
        == json.dumps({**f, "content_md5": MD5}, separators=(",", ":")).encode()
    )


def test_snapshot_pointer_fields_are_refused_by_name() -> None:
    m = log_of(1, 1, 1)
    snap = Snapshot.build(m.fragments[:2], "w")
    rolled = m.with_snapshot(snap, "w")
    assert rolled is not None
    good = raw(rolled)
    s = good["snapshots"][0]

    def with_snap(**change: Any) -> dict[str, Any]:
        return {**good, "snapshots": [{**s, **change}]}

    refused({**good, "snapshots": ["s"]}, "snapshot pointer is not an object: 's'")
    refused(with_snap(setsum=None), "snapshot.setsum is not a setsum: None")
    refused(with_snap(path_to_snapshot=[]), "snapshot.path_to_snapshot is not a string: []")
    refused(with_snap(depth=256), "snapshot.depth is not an integer in [0, 255]: 256")
    refused(with_snap(depth=0), "snapshot pointer with depth 0")
    refused(with_snap(start=None), "snapshot.start is not a log position: None")
    refused(with_snap(limit=[]), "snapshot.limit is not a log position: []")
    refused(with_snap(num_bytes=-5), f"snapshot.num_bytes is not an integer in [0, {U64_MAX}]: -5")
    # Depth 255 parses (u8); the manifest is consistent at any depth >= 1.
    deep = Manifest.from_bytes(json.dumps(with_snap(depth=255)).encode())
    assert deep.snapshots[0].depth == 255
    assert rolled.snapshots[0].json_bytes() == json.dumps(s, separators=(",", ":")).encode()


def test_the_gc_floor_is_refused_unless_exactly_a_pending_floor() -> None:
    good = raw(log_of(1))
    for floor in (
        {"offset": 1},
        {"nonce": NONCE},
        {"offset": -1, "nonce": NONCE},
        {"offset": True, "nonce": NONCE},
        {"offset": 1, "nonce": NONCE.upper()},
        {"offset": 1, "nonce": NONCE[:-1]},
        {"offset": 1, "nonce": 5},
    ):
        refused({**good, "gc_floor": floor}, f"gc_floor is not a pending floor: {floor!r}")
    m = Manifest.from_bytes(
        json.dumps({**good, "gc_floor": {"offset": 1, "nonce": NONCE}}).encode()
    )
    assert m.gc_floor == GcFloor(1, NONCE)
    assert json.loads(m.to_bytes())["gc_floor"] == {"offset": 1, "nonce": NONCE}


def test_the_optional_fields_round_trip_and_are_written_only_when_set() -> None:
    m = log_of(1, 2)
    assert set(raw(m)) == {
        "setsum",
        "collected",
        "acc_bytes",
        "writer",
        "snapshots",
        "fragments",
    }
    full = Manifest(
        setsum=m.setsum,
        acc_bytes=m.acc_bytes,
        writer="wé",
        fragments=m.fragments,
        initial_offset=1,
        initial_seq_no=1,
        sealed=True,
        gc_floor=GcFloor(2, NONCE),
        read_lease_ms=0,
        lease_holder="0123456789abcdef",
    )
    data = full.to_bytes()
    assert "wé".encode() in data  # raw UTF-8, as serde writes it
    obj = json.loads(data)
    assert obj["initial_offset"] == {"offset": 1} and obj["initial_seq_no"] == 1
    assert obj["sealed"] is True and obj["read_lease_ms"] == 0
    assert obj["lease_holder"] == "0123456789abcdef"
    # A collector's edit (``replace``) and a seal carry the holder over; so does a cut.
    assert full.with_sealed("gc").lease_holder == "0123456789abcdef"
    assert Manifest.from_bytes(data) == full


# ------------------------------------------------------------------------------ check


def _bad(m: Manifest, message: str) -> None:
    with pytest.raises(CorruptManifest) as e:
        m.check()
    assert str(e.value) == message


def test_check_names_every_broken_invariant() -> None:
    m = log_of(2, 3)
    f1, f2 = m.fragments
    _bad(
        Manifest(setsum=m.setsum, fragments=(f1, f2), acc_bytes=U64_MAX + 1),
        "manifest holds a number that does not fit u64",
    )
    _bad(
        Manifest(setsum=m.setsum, fragments=(f1, f2), initial_seq_no=-1),
        "manifest holds a number that does not fit u64",
    )
    _bad(
        Manifest(setsum=m.setsum, fragments=(f1, f2), initial_offset=2),
        "manifest starts at 1, expected 2",
    )
    _bad(
        Manifest(setsum=m.setsum, fragments=(f1, f2), initial_seq_no=2),
        "first fragment is seq 1, expected 2",
    )
    _bad(
        Manifest(setsum=m.setsum + Setsum.of(b"x"), fragments=(f1, f2)),
        "setsum does not balance: live pointers + collected != setsum",
    )
    # The same manifest with what was collected accounted for balances.
    Manifest(
        setsum=m.setsum + Setsum.of(b"x"), collected=Setsum.of(b"x"), fragments=(f1, f2)
    ).check()
    empty_range = FragmentPointer(fragment_path(3), 3, 6, 6, 1, Setsum.of(b"e"))
    _bad(
        Manifest(setsum=m.setsum + empty_range.setsum, fragments=(f1, f2, empty_range)),
        f"manifest: {fragment_path(3)} has empty range [6, 6)",
    )
    gap = frag(3, 7, 1)
    _bad(
        Manifest(setsum=m.setsum + gap.setsum, fragments=(f1, f2, gap)),
        f"manifest: {fragment_path(3)} starts at 7, expected 6 (gap or overlap)",
    )
    skip = frag(4, 6, 1)
    _bad(
        Manifest(setsum=m.setsum + skip.setsum, fragments=(f1, f2, skip)),
        "manifest: fragment seq_no 4 follows 2",
    )
    wrong_path = FragmentPointer(fragment_path(9), 3, 6, 7, 1, Setsum.of(b"p"))
    _bad(
        Manifest(setsum=m.setsum + wrong_path.setsum, fragments=(f1, f2, wrong_path)),
        f"manifest: {fragment_path(9)} is not the path of fragment 3",
    )
    past = FragmentPointer(fragment_path(3), 3, 6, U64_MAX + 1, 1, Setsum.of(b"u"))
    _bad(
        Manifest(setsum=m.setsum + past.setsum, fragments=(f1, f2, past)),
        f"manifest: {fragment_path(3)} does not fit u64",
    )
    # At the edge: a fragment ending exactly at u64::MAX fits.
    edge = FragmentPointer(fragment_path(3), 3, 6, U64_MAX, 1, Setsum.of(b"u"))
    Manifest(setsum=m.setsum + edge.setsum, fragments=(f1, f2, edge)).check()
    # And the largest fragment number itself is one (u64::MAX, the last path there is).
    top = FragmentPointer(fragment_path(U64_MAX), U64_MAX, 0, 1, 1, Setsum.of(b"t"))
    Manifest(setsum=top.setsum, fragments=(top,)).check()


def test_a_collected_log_may_start_anywhere_without_initial_fields() -> None:
    m = log_of(2, 3, 4)
    kept = m.fragments[1:]
    cut = Manifest(
        setsum=m.setsum, collected=m.fragments[0].setsum, fragments=kept, acc_bytes=m.acc_bytes
    )
    cut.check()
    assert (cut.oldest_offset, cut.next_offset, cut.next_seq_no) == (3, 10, 4)
    # Snapshots first: the seq_no rule applies to a root of fragments only.
    Manifest(setsum=m.setsum, fragments=m.fragments, initial_offset=1, initial_seq_no=1).check()


def test_snapshot_check_names_every_broken_invariant() -> None:
    m = log_of(1, 2, 3)
    s = Snapshot.build(m.fragments[:2], "w")
    s.check()
    assert (s.depth, s.path, s.writer) == (1, snapshot_path(s.setsum), "w")

    def bad(snap: Snapshot, message: str) -> None:
        with pytest.raises(CorruptManifest) as e:
            snap.check()
        assert str(e.value) == message

    p = s.to_pointer()
    bad(
        Snapshot(s.path, 2, s.setsum, "w", (p,), s.fragments),
        f"{s.path} holds both snapshots and fragments",
    )
    bad(Snapshot(s.path, 1, s.setsum, "w"), f"{s.path} is empty")
    bad(Snapshot(s.path, 1, s.setsum, "w", (p,)), f"{s.path}: child depth is not below 1")
    bad(
        Snapshot(s.path, 2, s.setsum, "w", (), s.fragments),
        f"{s.path}: a snapshot of fragments has depth 1",
    )
    bad(
        Snapshot(s.path, 1, s.setsum + Setsum.of(b"x"), "w", (), s.fragments),
        f"{s.path}: setsum does not balance with its children",
    )
    bad(
        Snapshot("snapshot/SNAPSHOT.x", 1, s.setsum, "w", (), s.fragments),
        "snapshot/SNAPSHOT.x: path does not name its setsum",
    )
    gap = (m.fragments[0], m.fragments[2])
    gap_sum = Setsum.sum(f.setsum for f in gap)
    bad(
        Snapshot(snapshot_path(gap_sum), 1, gap_sum, "w", (), gap),
        f"{snapshot_path(gap_sum)}: {m.fragments[2].path} starts at 4, expected 2 (gap or overlap)",
    )
    # Depth above every child is enough (it need not be exactly one more).
    Snapshot(snapshot_path(p.setsum), 3, p.setsum, "w", (p,)).check()


def test_snapshots_build_point_and_parse() -> None:
    m = log_of(1, 2, 3, 4)
    a = Snapshot.build(m.fragments[:2], "w")
    b = Snapshot.build(m.fragments[2:], "w")
    top = Snapshot.build([a.to_pointer(), b.to_pointer()], "x")
    assert (top.depth, top.writer, top.children) == (2, "x", (a.to_pointer(), b.to_pointer()))
    deeper = Snapshot.build([top.to_pointer(), a.to_pointer()], "x")
    assert deeper.depth == 3  # one above its deepest child
    p = a.to_pointer()
    assert (p.start, p.limit, p.num_bytes, p.depth, p.path) == (1, 4, 101 + 102, 1, a.path)
    assert p.setsum == a.setsum == m.fragments[0].setsum + m.fragments[1].setsum
    with pytest.raises(ValueError, match=r"^a snapshot holds at least one pointer$"):
        Snapshot.build([], "w")
    with pytest.raises(ValueError, match=r"^a snapshot never holds both snapshots and fragments$"):
        Snapshot.build([p, m.fragments[2]], "w")
    assert Snapshot.from_bytes(top.to_bytes()) == top
    assert Snapshot.from_bytes(a.to_bytes()) == a
    obj = json.loads(a.to_bytes())
    assert list(obj) == ["path", "depth", "setsum", "writer", "snapshots", "fragments"]
    for data, message in (
        (b"5", "snapshot is not an object: 5"),
        (
            json.dumps({**obj, "depth": 256}).encode(),
            "snapshot.depth is not an integer in [0, 255]: 256",
        ),
        (json.dumps({**obj, "writer": 1}).encode(), "snapshot.writer is not a string: 1"),
        (json.dumps({**obj, "fragments": 1}).encode(), "snapshot.fragments is not a list: 1"),
        (json.dumps({**obj, "snapshots": 1}).encode(), "snapshot.snapshots is not a list: 1"),
        (json.dumps({**obj, "path": 1}).encode(), "snapshot.path is not a string: 1"),
        (json.dumps({**obj, "setsum": "x"}).encode(), "snapshot.setsum is not a setsum: 'x'"),
    ):
        with pytest.raises(CorruptManifest) as e:
            Snapshot.from_bytes(data)
        assert str(e.value) == message
    no_writer = {k: v for k, v in obj.items() if k != "writer"}
    assert Snapshot.from_bytes(json.dumps(no_writer).encode()).writer == ""


# ------------------------------------------------------------------------------ positions


def test_positions_of_every_shape_of_root() -> None:
    empty = Manifest.empty("w")
    assert (empty.oldest_offset, empty.next_offset, empty.next_seq_no) == (1, 1, 1)
    assert empty.tail_setsum is None and empty.live_bytes == 0
    forked = Manifest(initial_offset=40, initial_seq_no=7)
    assert (forked.oldest_offset, forked.next_offset, forked.next_seq_no) == (40, 40, 7)
    m = log_of(2, 3, 4)
    assert (m.oldest_offset, m.next_offset, m.next_seq_no) == (1, 10, 4)
    assert m.tail_setsum == m.fragments[-1].setsum
    assert m.live_bytes == 102 + 103 + 104
    s = Snapshot.build(m.fragments[:2], "w")
    rolled = m.with_snapshot(s, "w")
    assert rolled is not None
    assert (rolled.oldest_offset, rolled.next_offset, rolled.next_seq_no) == (1, 10, 4)
    assert rolled.live_bytes == m.live_bytes
    only_snapshots = Manifest(setsum=s.setsum, snapshots=(s.to_pointer(),))
    assert (only_snapshots.oldest_offset, only_snapshots.next_offset) == (1, 6)
    with pytest.raises(
        CorruptManifest, match=r"^manifest has snapshots but no fragment to number from$"
    ):
        _ = only_snapshots.next_seq_no


# ------------------------------------------------------------------------------ transforms


def test_with_fragments_follows_on_exactly_and_records_the_writer() -> None:
    m = log_of(2)
    assert m.with_fragments([], "other") is m
    nxt = frag(2, 3, 4)
    grown = m.with_fragments([nxt], "other")
    assert grown.writer == "other" and grown.fragments == (*m.fragments, nxt)
    assert grown.setsum == m.setsum + nxt.setsum
    assert grown.acc_bytes == m.acc_bytes + nxt.num_bytes
    for wrong, message in (
        (frag(3, 3, 4), "fragment 3@[3,7) does not follow 2@3"),
        (frag(2, 4, 4), "fragment 2@[4,8) does not follow 2@3"),
    ):
        with pytest.raises(CorruptManifest) as e:
            m.with_fragments([wrong], "w")
        assert str(e.value) == message
    # Two at once: the second follows the first.
    two = m.with_fragments([frag(2, 3, 1), frag(3, 4, 1)], "w")
    assert two.next_seq_no == 4 and two.next_offset == 5
    with pytest.raises(CorruptManifest, match=r"^fragment 3@\[5,6\) does not follow 3@4$"):
        m.with_fragments([frag(2, 3, 1), frag(3, 5, 1)], "w")


def test_the_running_byte_count_saturates_at_u64() -> None:
    m = Manifest(acc_bytes=U64_MAX - 10)
    grown = m.with_fragments([frag(1, 1, 1, num_bytes=100)], "w")
    assert grown.acc_bytes == U64_MAX
    exact = Manifest(acc_bytes=U64_MAX - 100).with_fragments([frag(1, 1, 1, num_bytes=100)], "w")
    assert exact.acc_bytes == U64_MAX


def test_the_log_is_full_exactly_at_u64() -> None:
    ensure_room(U64_MAX, 1, 1)  # the last sequence number
    ensure_room(1, U64_MAX - 5, 5)  # ending exactly at u64::MAX
    with pytest.raises(LogFull) as e:
        ensure_room(U64_MAX + 1, 1, 1)
    assert str(e.value) == (
        f"the log is full: fragment {U64_MAX + 1} would end at offset 2; offsets and sequence "
        f"numbers end at {U64_MAX} (u64)"
    )
    with pytest.raises(LogFull, match=re.escape(f"would end at offset {U64_MAX + 1};")):
        ensure_room(1, U64_MAX - 5, 6)
    near = Manifest(initial_offset=U64_MAX - 2, initial_seq_no=U64_MAX)
    last = FragmentPointer(
        fragment_path(U64_MAX), U64_MAX, U64_MAX - 2, U64_MAX, 1, Setsum.of(b"l")
    )
    assert near.with_fragments([last], "w").next_offset == U64_MAX
    over = FragmentPointer(
        fragment_path(U64_MAX), U64_MAX, U64_MAX - 2, U64_MAX + 1, 1, Setsum.of(b"o")
    )
    with pytest.raises(LogFull):
        near.with_fragments([over], "w")


def test_with_snapshot_replaces_exactly_the_run_it_covers() -> None:
    m = log_of(1, 1, 1, 1)
    f = m.fragments
    s = Snapshot.build(f[1:3], "w")
    rolled = m.with_snapshot(s, "other")
    assert rolled is not None and rolled.writer == "other"
    # A snapshot pointer goes with the snapshots, fragments around it with the fragments.
    assert rolled.snapshots == (s.to_pointer(),) and rolled.fragments == (f[0], f[3])
    assert m.with_snapshot(Snapshot.build(f[:2], "w"), "w") is not None
    # Not the run in the root: its first pointer absent, or what follows differs.
    assert m.with_snapshot(Snapshot.build([frag(9, 1, 1)], "w"), "w") is None
    shorter = Manifest(setsum=f[0].setsum + f[1].setsum, fragments=f[:2])
    assert shorter.with_snapshot(Snapshot.build(f[1:3], "w"), "w") is None


def test_tails_and_contained_fragments() -> None:
    m = log_of(1, 2)
    assert m.same_tail(log_of(1, 2)) and not m.same_tail(log_of(1, 2, 1))
    same_place = FragmentPointer(fragment_path(2), 2, 2, 4, 102, Setsum.of(b"another record"))
    other_tail = Manifest(setsum=m.fragments[0].setsum, fragments=m.fragments[:1]).with_fragments(
        [same_place], "w"
    )
    assert other_tail.next_offset == m.next_offset and not m.same_tail(other_tail)
    f2 = m.fragments[1]
    assert m.contains_fragment(f2.path, f2.setsum)
    assert m.contains_fragment(m.fragments[0].path, m.fragments[0].setsum)
    assert not m.contains_fragment(f2.path, Setsum.of(b"other"))
    assert not m.contains_fragment(fragment_path(3), f2.setsum)


def test_sealing_keeps_everything_else() -> None:
    m = log_of(1, 2)
    sealed = m.with_sealed("z")
    assert sealed.sealed and sealed.writer == "z"
    assert (sealed.fragments, sealed.setsum, sealed.acc_bytes) == (
        m.fragments,
        m.setsum,
        m.acc_bytes,
    )
    assert not m.sealed


# ------------------------------------------------------------------------------ planning


def test_plan_snapshot_thresholds_are_exact() -> None:
    m = log_of(*[1] * 4)
    assert plan_snapshot(m, fragment_threshold=4, snapshot_threshold=2, writer="w") is None
    s = plan_snapshot(m, fragment_threshold=3, snapshot_threshold=2, writer="p")
    assert s is not None and s.fragments == m.fragments[:3] and s.writer == "p"


def test_plan_snapshot_rolls_the_deepest_full_run_first() -> None:
    m = log_of(*[1] * 9)
    f = m.fragments
    a, b, c, d = (Snapshot.build(f[i : i + 2], "w") for i in (0, 2, 4, 6))
    m = m.with_snapshot(a, "w")
    assert m is not None
    m = m.with_snapshot(b, "w")
    assert m is not None
    # Two depth-1 snapshots and threshold 2: they roll up, before any fragment run.
    s = plan_snapshot(m, fragment_threshold=1, snapshot_threshold=2, writer="w")
    assert s is not None and s.depth == 2 and s.snapshots == (a.to_pointer(), b.to_pointer())
    assert plan_snapshot(m, fragment_threshold=5, snapshot_threshold=3, writer="w") is None
    up = m.with_snapshot(s, "w")
    assert up is not None
    up = up.with_snapshot(c, "w")
    assert up is not None
    up = up.with_snapshot(d, "w")
    assert up is not None
    # Depths 2, 1, 1 (then fragment 9): the depth-1 run of two is the full one.
    assert [p.depth for p in up.snapshots] == [2, 1, 1]
    s2 = plan_snapshot(up, fragment_threshold=5, snapshot_threshold=2, writer="w")
    assert s2 is not None and s2.snapshots == (c.to_pointer(), d.to_pointer())
    assert s2.writer == "w"  # a roll-up records its writer, as a fragment run's snapshot does
    s2q = plan_snapshot(up, fragment_threshold=5, snapshot_threshold=2, writer="q")
    assert s2q is not None and s2q.writer == "q"
    # A run is consecutive: depths 1, 2, 1 hold no run of two depth-1 pointers.
    mixed = Manifest(
        setsum=up.setsum,
        snapshots=(c.to_pointer(), up.snapshots[0], d.to_pointer()),
        fragments=up.fragments,
    )
    assert plan_snapshot(mixed, fragment_threshold=5, snapshot_threshold=2, writer="w") is None
    deep_first = Manifest(
        setsum=up.setsum,
        snapshots=(c.to_pointer(), d.to_pointer(), up.snapshots[0], up.snapshots[0]),
        fragments=up.fragments,
    )
    s3 = plan_snapshot(deep_first, fragment_threshold=5, snapshot_threshold=2, writer="w")
    assert s3 is not None and s3.depth == 3  # the depth-2 run, though a depth-1 run comes first


def test_snapshot_pointer_path_and_gc_floor_json() -> None:
    p = SnapshotPointer(Setsum.of(b"s"), "snapshot/SNAPSHOT.x", 1, 1, 2, 3)
    assert p.path == "snapshot/SNAPSHOT.x"
    assert GcFloor(5, NONCE).to_json() == {"offset": 5, "nonce": NONCE}


def test_an_empty_manifest_names_its_writer() -> None:
    m = Manifest.empty("host-a:7")
    assert m.writer == "host-a:7" and m.entries == () and m.next_offset == m.oldest_offset
    assert Manifest.from_bytes(m.to_bytes()).writer == "host-a:7"


def test_the_tail_decoders_refusals_name_what_is_wrong() -> None:
    """``tail_from_bytes`` refuses in the words ``from_bytes`` uses for the same faults."""
    good = json.loads(Manifest.empty("w").with_fragments([_tail_fragment()], "w").to_bytes())

    def refused(doc: object, text: str) -> None:
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        with pytest.raises(CorruptManifest) as caught:
            Manifest.tail_from_bytes(data)
        assert str(caught.value) == text

    with pytest.raises(CorruptManifest, match=r"^manifest is not JSON: "):
        Manifest.tail_from_bytes(b"{nope")
    refused([1], "manifest is not a JSON object")
    refused({**good, "fragments": 7}, "manifest.fragments is not a list: 7")
    refused({**good, "setsum": "x"}, "setsum is not a setsum: 'x'")
    refused({**good, "sealed": "yes"}, "sealed is not a boolean: 'yes'")


def _tail_fragment() -> FragmentPointer:
    return FragmentPointer(fragment_path(1), 1, 1, 3, 10, Setsum.of(b"tail"))
