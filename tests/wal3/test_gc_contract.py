"""``wal3/gc.py`` rule by rule: what the garbage file holds and refuses, what a plan drops, what
the verifiers bound, which phase a pass reports with which counters and notes, how the grace is
timed, what is deleted in which order, and what ``pin_cursor`` answers.

Written against the mutation run of the module (docs/RELIABILITY.md, "Mutation testing"): each
test's docstring names the mutants it kills, by function and change.  The whole-pass tests
(test_lifecycle.py, test_gc_*.py) hold the invariants; this file drives the module's functions
directly on hand-made manifests, plans and an in-memory store with a settable clock, so each
refusal, bound and counter is pinned on its own.  Equivalent mutants are listed at the end.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, Literal

import pytest

import wal3.gc as gcmod
from wal3.cursors import COMPACTION, Cursor, CursorStore
from wal3.errors import (
    CursorConflict,
    GarbageRejected,
    LogPurged,
    NoCursors,
    ObjectNotFound,
    PreconditionFailed,
)
from wal3.gc import (
    EMPTY_GARBAGE,
    FloorLost,
    Garbage,
    GarbageCollector,
    GcOptions,
    GcReport,
    VerifiedCut,
    fraction_budget,
    live_snapshot_paths,
    min_live_seq,
    pin_cursor,
    plan_cut,
    verify_cut,
    verify_garbage,
)
from wal3.manifest import U64_MAX, FragmentPointer, GcFloor, Manifest, Snapshot, SnapshotPointer
from wal3.paths import (
    CLOCK_PATH,
    GARBAGE_PATH,
    MANIFEST_PATH,
    OLDEST_PATH,
    fragment_path,
    join,
)
from wal3.reader import SnapshotCache
from wal3.setsum import Setsum
from wal3.store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

P = "logs/c"
NONCE = "0123456789abcdef0123456789abcdef"

# ---------------------------------------------------------------------------- the fixtures


class MemStore(ObjectStore):
    """An in-memory store whose Last-Modified is a settable clock (``now``), that records every
    request in order, and can refuse chosen requests (``fail``: op and key regex)."""

    def __init__(self, now: float = 5_000.0) -> None:
        self.objects: dict[str, tuple[bytes, str, float]] = {}
        self.now = now
        self.ops: list[tuple[str, str]] = []
        self.fail: list[tuple[str, re.Pattern[str], BaseException]] = []
        self.on_put: Callable[[str], None] | None = None
        self.hooks: list[tuple[str, re.Pattern[str], Callable[[], None]]] = []

    def before(self, op: str, regex: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` once, right before the next ``op`` on a key matching ``regex``."""
        self.hooks.append((op, re.compile(regex), fn))

    def _check(self, op: str, key: str) -> None:
        self.ops.append((op, key))
        for i, (o, rx, fn) in enumerate(self.hooks):
            if o == op and rx.search(key):
                del self.hooks[i]
                fn()
                break
        for i, (o, rx, exc) in enumerate(self.fail):
            if o == op and rx.search(key):
                del self.fail[i]
                raise exc

    def refuse(self, op: str, regex: str, exc: BaseException) -> None:
        """Fail the next ``op`` on a key matching ``regex`` with ``exc``."""
        self.fail.append((op, re.compile(regex), exc))

    async def get(self, key: str) -> GetResult:
        self._check("get", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data, etag, _ = self.objects[key]
        return GetResult(data, etag)

    async def head(self, key: str) -> ObjectMeta:
        self._check("head", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data, etag, lm = self.objects[key]
        return ObjectMeta(key, etag, len(data), lm)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        self._check("put", key)
        check_condition(if_none_match, if_match)
        cur = self.objects.get(key)
        if if_none_match is not None and cur is not None:
            raise PreconditionFailed(key)
        if if_match is not None and (cur is None or cur[1] != if_match):
            raise PreconditionFailed(key)
        etag = content_etag(data)
        self.objects[key] = (data, etag, self.now)
        if self.on_put is not None:
            self.on_put(key)
        return etag

    async def delete(self, key: str) -> None:
        self._check("delete", key)
        self.objects.pop(key, None)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        for key in sorted(self.objects):
            if key.startswith(prefix) and (start_after is None or key > start_after):
                data, etag, lm = self.objects[key]
                yield ObjectMeta(key, etag, len(data), lm)

    def url_for(self, key: str) -> str:
        return f"mem://{key}"

    # -- test helpers
    def has(self, path: str, prefix: str = P) -> bool:
        return join(prefix, path) in self.objects

    def data(self, path: str, prefix: str = P) -> bytes:
        return self.objects[join(prefix, path)][0]

    def set_time(self, path: str, when: float, prefix: str = P) -> None:
        data, etag, _ = self.objects[join(prefix, path)]
        self.objects[join(prefix, path)] = (data, etag, when)

    def deleted(self) -> list[str]:
        return [k for op, k in self.ops if op == "delete"]


class Mono:
    """A settable monotonic clock (seconds)."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def frag(seq: int, start: int, n: int = 1, nbytes: int = 100) -> FragmentPointer:
    return FragmentPointer(
        fragment_path(seq), seq, start, start + n, nbytes, Setsum.of(f"f{seq}@{start}".encode())
    )


def chain(count: int, *, seq: int = 1, start: int = 1, nbytes: int = 100) -> list[FragmentPointer]:
    """``count`` one-record fragments from ``seq`` at offset ``start``."""
    return [frag(seq + i, start + i, 1, nbytes) for i in range(count)]


def snap(*children: FragmentPointer | SnapshotPointer) -> Snapshot:
    return Snapshot.build(list(children), "w")


def manifest(
    snapshots: tuple[SnapshotPointer, ...] | list[SnapshotPointer] = (),
    fragments: tuple[FragmentPointer, ...] | list[FragmentPointer] = (),
    *,
    collected: Setsum | None = None,
    initial_offset: int | None = None,
    initial_seq_no: int | None = None,
    gc_floor: GcFloor | None = None,
) -> Manifest:
    collected = collected if collected is not None else Setsum.zero()
    entries = [*snapshots, *fragments]
    return Manifest(
        setsum=Setsum.sum(e.setsum for e in entries) + collected,
        collected=collected,
        writer="w",
        snapshots=tuple(snapshots),
        fragments=tuple(fragments),
        initial_offset=initial_offset,
        initial_seq_no=initial_seq_no,
        gc_floor=gc_floor,
    )


def flat_log(count: int, nbytes: int = 100) -> Manifest:
    """``count`` one-record fragments, seq i at offset i, no snapshot."""
    return manifest((), chain(count, nbytes=nbytes))


def put_raw(store: MemStore, path: str, data: bytes, prefix: str = P) -> None:
    store.objects[join(prefix, path)] = (data, content_etag(data), store.now)


def put_manifest(store: MemStore, m: Manifest, prefix: str = P) -> None:
    put_raw(store, MANIFEST_PATH, m.to_bytes(), prefix)


def put_snapshots(store: MemStore, *snaps: Snapshot, prefix: str = P) -> None:
    for s in snaps:
        put_raw(store, s.path, s.to_bytes(), prefix)


def put_fragments(store: MemStore, seqs: range, prefix: str = P) -> None:
    for s in seqs:
        put_raw(store, fragment_path(s), b"PAR1", prefix)


def stored_manifest(store: MemStore, prefix: str = P) -> Manifest:
    return Manifest.from_bytes(store.data(MANIFEST_PATH, prefix))


def stored_plan(store: MemStore, prefix: str = P) -> Garbage | None:
    return Garbage.from_bytes(store.data(GARBAGE_PATH, prefix))


async def set_cursor(store: MemStore, name: str, offset: int, prefix: str = P) -> None:
    cs = CursorStore(store, prefix, "t")
    w = await cs.load(name)
    if w is None:
        await cs.init(name, offset)
    else:
        await cs.save(name, offset, w.etag)


def opts(**kw: Any) -> GcOptions:
    """Options for hand-made logs: no idempotency retention, no rate limit."""
    base: dict[str, Any] = {
        "grace_s": 60.0,
        "retain_fragments": 0,
        "retain_s": 0.0,
        "deletes_per_second": 1e12,
    }
    base.update(kw)
    return GcOptions(**base)


def collector(
    store: MemStore, o: GcOptions | None = None, mono: Mono | None = None, prefix: str = P
) -> GarbageCollector:
    mono = mono if mono is not None else Mono()
    return GarbageCollector(store, prefix, o or opts(), clock=mono, monotonic=mono)


def rejected(fn: Callable[[], Any], message: str) -> None:
    with pytest.raises(GarbageRejected) as e:
        fn()
    assert str(e.value) == message


def parse_refused(obj: Any, message: str) -> None:
    data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    rejected(lambda: Garbage.from_bytes(data), message)


S = [Setsum.of(b"a"), Setsum.of(b"b"), Setsum.of(b"c")]


def sptr(
    setsum: Setsum, start: int, limit: int, depth: int = 1, nbytes: int = 7
) -> SnapshotPointer:
    return SnapshotPointer(
        setsum, f"snapshot/SNAPSHOT.{setsum.hexdigest()}", depth, start, limit, nbytes
    )


def full_plan() -> Garbage:
    """A plan with every field set and distinct."""
    a, b = snap(*chain(2)), snap(*chain(2, seq=3, start=3))
    return Garbage(
        snapshots_to_drop=(sptr(S[0], 1, 3), sptr(S[1], 3, 5, depth=2, nbytes=9)),
        snapshots_to_make=(a, b),
        snapshot_for_root=sptr(S[2], 5, 8, nbytes=11),
        fragments_to_drop_start=3,
        fragments_to_drop_limit=7,
        setsum_to_discard=S[0] + S[1],
        first_to_keep=9,
        created_us=11,
        applied_us=12,
    )


# ------------------------------------------------------------------------- the garbage file


def test_the_plan_is_encoded_as_serde_writes_rusts_garbage_then_our_extensions() -> None:
    """Field order, separators, ``null`` root, ``fragments_are_uuids`` and the two extension
    fields, byte for byte.  Kills every ``to_bytes`` mutant (each literal, ``join(None)``,
    ``root = None``, the ``is None`` / ``is not None`` flips, ``parts =`` / ``-=``)."""
    g = full_plan()
    a, b = g.snapshots_to_make
    d0, d1 = g.snapshots_to_drop
    assert g.snapshot_for_root is not None
    expected = (
        b'{"snapshots_to_drop":['
        + d0.json_bytes()
        + b","
        + d1.json_bytes()
        + b'],"snapshots_to_make":['
        + a.to_bytes()
        + b","
        + b.to_bytes()
        + b'],"snapshot_for_root":'
        + g.snapshot_for_root.json_bytes()
        + b',"fragments_to_drop_start":3,"fragments_to_drop_limit":7,'
        + b'"fragments_are_uuids":false,"setsum_to_discard":"'
        + (S[0] + S[1]).hexdigest().encode()
        + b'","first_to_keep":{"offset":9},"created_us":11,"applied_us":12}'
    )
    assert g.to_bytes() == expected
    bare = replace(g, snapshot_for_root=None, created_us=None, applied_us=None)
    assert bare.to_bytes() == expected.replace(g.snapshot_for_root.json_bytes(), b"null").replace(
        b',"created_us":11,"applied_us":12}', b"}"
    )
    only_applied = replace(g, created_us=None)
    assert only_applied.to_bytes() == expected.replace(b',"created_us":11', b"")
    assert (
        b'{"snapshots_to_drop":[],"snapshots_to_make":[],"snapshot_for_root":null,'
        b'"fragments_to_drop_start":0,"fragments_to_drop_limit":0,"fragments_are_uuids":false,'
        b'"setsum_to_discard":"' + Setsum.zero().hexdigest().encode() + b'",'
        b'"first_to_keep":{"offset":1}}'
    ) == EMPTY_GARBAGE


def test_a_plan_reads_back_field_by_field() -> None:
    """Every field is read from its own key into its own attribute.  Kills ``from_bytes``'s
    key-name mutants (``"XX…XX"``, upper case), argument swaps and ``None``s of the ``cls(...)``
    call, ``root = None``, ``from_json(None)`` and the ``is None`` flips of the root."""
    g = full_plan()
    assert Garbage.from_bytes(g.to_bytes()) == g
    bare = replace(g, snapshot_for_root=None, created_us=None, applied_us=None)
    back = Garbage.from_bytes(bare.to_bytes())
    assert back == bare and back.legacy is False
    assert back.snapshot_for_root is None and back.created_us is None and back.applied_us is None
    # created_us and applied_us are independent: either may be there alone.
    only_created = replace(g, applied_us=None)
    assert Garbage.from_bytes(only_created.to_bytes()) == only_created


def test_the_idle_forms_read_as_no_plan() -> None:
    """Rust's ``Garbage::empty()`` and our old ``{}`` are idle; a plan differing from empty in
    any one Rust field is not.  Kills ``empty``'s argument mutants, ``not obj`` → ``obj``, the
    final ``is_empty`` test, and each ``and`` → ``or`` / comparison flip of ``is_empty``."""
    assert Garbage.from_bytes(EMPTY_GARBAGE) is None
    assert Garbage.from_bytes(b"{}") is None
    assert Garbage.from_bytes(b" {} ") is None
    e = Garbage.empty()
    assert e.is_empty()
    assert (e.snapshots_to_drop, e.snapshots_to_make, e.snapshot_for_root) == ((), (), None)
    assert (e.fragments_to_drop_start, e.fragments_to_drop_limit, e.first_to_keep) == (0, 0, 1)
    assert e.setsum_to_discard == Setsum.zero() and e.created_us is None
    p = sptr(S[0], 1, 2)
    variants = [
        replace(e, snapshots_to_drop=(p,)),
        replace(e, snapshots_to_make=(snap(frag(1, 1)),)),
        replace(e, snapshot_for_root=p),
        replace(e, fragments_to_drop_start=1),
        replace(e, fragments_to_drop_limit=1),
        replace(e, setsum_to_discard=S[0]),
        replace(e, first_to_keep=2),
    ]
    for v in variants:
        assert not v.is_empty(), v
        assert Garbage.from_bytes(v.to_bytes()) == v
    # The extension fields do not make a plan: empty with a stamp is still idle.
    assert Garbage.from_bytes(replace(e, created_us=5, applied_us=6).to_bytes()) is None


def test_each_malformed_field_is_refused_by_name() -> None:
    """Kills ``_g_int``'s and ``_g_list``'s mutants (the bounds ``0 <=`` / ``<= U64_MAX``, bools,
    ``optional``, the messages) and ``from_bytes``'s top-level refusals and their texts."""
    good = json.loads(full_plan().to_bytes())

    def with_(**kw: Any) -> dict[str, Any]:
        obj = dict(good)
        for k, v in kw.items():
            if v is ...:
                del obj[k]
            else:
                obj[k] = v
        return obj

    parse_refused([], "gc/GARBAGE is not a JSON object")
    parse_refused(3, "gc/GARBAGE is not a JSON object")
    with pytest.raises(GarbageRejected, match=r"^unparseable gc/GARBAGE: gc/GARBAGE is not JSON"):
        Garbage.from_bytes(b"{")
    for key in ("fragments_to_drop_start", "fragments_to_drop_limit"):
        parse_refused(with_(**{key: -1}), f"gc/GARBAGE: {key} is not a u64: -1")
        parse_refused(with_(**{key: True}), f"gc/GARBAGE: {key} is not a u64: True")
        parse_refused(with_(**{key: "3"}), f"gc/GARBAGE: {key} is not a u64: '3'")
        parse_refused(with_(**{key: ...}), f"gc/GARBAGE: {key} is not a u64: None")
        parse_refused(with_(**{key: U64_MAX + 1}), f"gc/GARBAGE: {key} is not a u64: {U64_MAX + 1}")
    for key in ("created_us", "applied_us"):
        parse_refused(with_(**{key: 1.5}), f"gc/GARBAGE: {key} is not a u64: 1.5")
        parse_refused(with_(**{key: -2}), f"gc/GARBAGE: {key} is not a u64: -2")
        parse_refused(with_(**{key: False}), f"gc/GARBAGE: {key} is not a u64: False")
    # The bounds themselves are u64s.
    edge = Garbage.from_bytes(
        json.dumps(
            with_(fragments_to_drop_start=0, fragments_to_drop_limit=U64_MAX, created_us=0)
        ).encode()
    )
    assert edge is not None
    assert (edge.fragments_to_drop_start, edge.fragments_to_drop_limit) == (0, U64_MAX)
    assert edge.created_us == 0
    long = "y" * 300
    parse_refused(
        with_(fragments_to_drop_start=long),
        f"gc/GARBAGE: fragments_to_drop_start is not a u64: {long!r:.200}",
    )
    for key in ("snapshots_to_drop", "snapshots_to_make"):
        parse_refused(with_(**{key: {}}), f"gc/GARBAGE: {key} is not a list: {{}}")
        parse_refused(with_(**{key: ...}), f"gc/GARBAGE: {key} is not a list: None")
    parse_refused(
        with_(snapshot_for_root=5),
        "unparseable gc/GARBAGE: snapshot pointer is not an object: 5",
    )
    parse_refused(
        with_(setsum_to_discard="zz"),
        "unparseable gc/GARBAGE: setsum_to_discard is not a setsum: 'zz'",
    )
    parse_refused(
        with_(first_to_keep=7),
        "unparseable gc/GARBAGE: first_to_keep is not a log position: 7",
    )
    parse_refused(
        with_(snapshots_to_make=[5]),
        "unparseable gc/GARBAGE: snapshot is not an object: 5",
    )


def test_uuid_named_fragments_are_refused_and_only_they() -> None:
    """``fragments_are_uuids`` absent or false and ``fragments_to_drop_uuid_limit`` absent or
    null are ours; anything else is refused with its text.  Kills the mutants of that test
    (``and`` for ``or``, ``get(None, …)``, the default ``True``/``None``, the key names, the
    ``is``/``is not`` flips, the message)."""
    good = json.loads(full_plan().to_bytes())
    msg = "gc/GARBAGE drops UUID-named fragments, which this engine does not support"
    for extra in (
        {"fragments_are_uuids": True},
        {"fragments_are_uuids": None},
        {"fragments_are_uuids": 0},
        {"fragments_to_drop_uuid_limit": "00000000-0000-0000-0000-000000000000"},
        {"fragments_to_drop_uuid_limit": 0},
    ):
        parse_refused({**good, **extra}, msg)
    for fine in (
        {},
        {"fragments_are_uuids": False},
        {"fragments_to_drop_uuid_limit": None},
        {"fragments_are_uuids": False, "fragments_to_drop_uuid_limit": None},
    ):
        obj = {k: v for k, v in good.items() if k != "fragments_are_uuids"}
        assert Garbage.from_bytes(json.dumps({**obj, **fine}).encode()) == full_plan()


def _legacy(**kw: Any) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "cutoff": 9,
        "fragments_to_delete": {"first_seq_no": 2, "limit_seq_no": 6},
        "setsum_to_discard": S[0].hexdigest(),
        "first_to_keep": {"offset": 9},
        "created_us": 21,
        "applied_us": 22,
    }
    obj.update(kw)
    return {k: v for k, v in obj.items() if v is not ...}


def test_a_pre_issue_16_plan_reads_as_legacy_with_its_floor() -> None:
    """Either ``cutoff`` or ``drop_root`` marks the old schema; its floor, fragment range,
    setsum and stamps are read.  Kills ``"cutoff" in obj or …`` → ``and``/``not in``/renamed
    keys, ``_from_legacy(None)``, and ``_from_legacy``'s field mutants."""
    g = Garbage.from_bytes(json.dumps(_legacy()).encode())
    assert g == Garbage((), (), None, 2, 6, S[0], 9, 21, 22, legacy=True)
    only_drop_root = _legacy(cutoff=..., drop_root=[])
    g2 = Garbage.from_bytes(json.dumps(only_drop_root).encode())
    assert g2 is not None and g2.legacy and g2.first_to_keep == 9
    unstamped = Garbage.from_bytes(json.dumps(_legacy(created_us=..., applied_us=...)).encode())
    assert unstamped is not None and (unstamped.created_us, unstamped.applied_us) == (None, None)
    # Not legacy without either key: a Rust-schema field is then missing.
    with pytest.raises(GarbageRejected, match="snapshots_to_drop is not a list"):
        Garbage.from_bytes(json.dumps(_legacy(cutoff=...)).encode())


def test_a_malformed_legacy_plan_is_refused_by_name() -> None:
    """Kills ``_from_legacy``'s refusal mutants and texts."""
    msg = "gc/GARBAGE: legacy fragments_to_delete is malformed"
    parse_refused(_legacy(fragments_to_delete=[2, 6]), msg)
    parse_refused(_legacy(fragments_to_delete=...), msg)
    parse_refused(
        _legacy(fragments_to_delete={"first_seq_no": 2}),
        "gc/GARBAGE: limit_seq_no is not a u64: None",
    )
    parse_refused(
        _legacy(fragments_to_delete={"limit_seq_no": 2}),
        "gc/GARBAGE: first_seq_no is not a u64: None",
    )
    parse_refused(
        _legacy(setsum_to_discard=1),
        "unparseable gc/GARBAGE: setsum_to_discard is not a setsum: 1",
    )
    parse_refused(
        _legacy(first_to_keep=None),
        "unparseable gc/GARBAGE: first_to_keep is not a log position: None",
    )
    parse_refused(_legacy(created_us=-1), "gc/GARBAGE: created_us is not a u64: -1")
    parse_refused(_legacy(applied_us="x"), "gc/GARBAGE: applied_us is not a u64: 'x'")


def test_the_views_in_our_terms() -> None:
    """``snapshots_to_delete`` lists each dropped path once, in order, never one the plan
    makes; the other views name their Rust fields."""
    a = snap(*chain(2))
    pa = a.to_pointer()
    p0, p1 = sptr(S[0], 1, 2), sptr(S[1], 2, 3)
    g = Garbage((p0, pa, p1, p0), (a,), None, 4, 8, S[0], 6)
    assert g.snapshots_to_delete == (p0.path, p1.path)
    assert g.new_snapshots == (a.path,)
    assert (g.first_seq_to_delete, g.first_seq_to_keep, g.cutoff) == (4, 8, 6)


def test_the_repair_plan_unlinks_root_snapshots_wholly_below_the_cut() -> None:
    """Kills ``unlinking_root_snapshots``' mutants: ``<=`` (a snapshot ending at the cut is
    dropped), each argument of the plan, and the setsum of what it drops."""
    s1, s2 = snap(*chain(2)), snap(*chain(2, seq=3, start=3))
    f = chain(2, seq=5, start=5)
    m = manifest([s1.to_pointer(), s2.to_pointer()], f)
    g = Garbage.unlinking_root_snapshots(m, 5, 5)
    assert g == Garbage((s1.to_pointer(), s2.to_pointer()), (), None, 5, 5, g.setsum_to_discard, 5)
    assert g.setsum_to_discard == s1.setsum + s2.setsum
    only_first = Garbage.unlinking_root_snapshots(m, 3, 4)
    assert (only_first.fragments_to_drop_start, only_first.fragments_to_drop_limit) == (3, 3)
    assert only_first.snapshots_to_drop == (s1.to_pointer(),)
    assert only_first.setsum_to_discard == s1.setsum
    applied = g.apply(m, "fix")
    assert applied.entries == tuple(f) and applied.initial_offset == 5


# --------------------------------------------------------------------------- Garbage.apply


def _two_snapshot_log(collected: Setsum | None = None) -> tuple[Manifest, Snapshot, Snapshot]:
    """Root ``[A(f1, f2), B(f3, f4), f5, f6]``, one record per fragment (seq i at offset i)."""
    f = chain(6)
    a, b = snap(f[0], f[1]), snap(f[2], f[3])
    return manifest([a.to_pointer(), b.to_pointer()], f[4:], collected=collected), a, b


def test_apply_drops_listed_root_snapshots_and_the_fragment_range() -> None:
    """The cut: listed root snapshots and fragments in ``[start, limit)`` leave, ``collected``
    grows by the discard, the range and writer move.  Kills ``apply``'s ``drop``/``left``/
    ``rest`` ``None``s, ``or`` for ``and`` (a kept snapshot), ``+``→``-``, ``<=``→``<`` and
    ``<``→``<=`` of the range, and the ``replace(...)`` argument mutants."""
    extra = S[2]
    m, a, b = _two_snapshot_log(collected=extra)
    f = m.fragments
    g = Garbage((a.to_pointer(),), (), None, 1, 3, a.setsum, 3)
    new = g.apply(m, "gc-writer")
    assert new == replace(
        m,
        writer="gc-writer",
        snapshots=(b.to_pointer(),),
        collected=extra + a.setsum,
        initial_offset=3,
        initial_seq_no=3,
    )
    # Fragments alone: [5, 6) drops f5 only, never f6 (the limit).
    flat = flat_log(4)
    g2 = Garbage((), (), None, 1, 3, flat.fragments[0].setsum + flat.fragments[1].setsum, 3)
    new2 = g2.apply(flat, "x")
    assert new2.fragments == flat.fragments[2:]
    assert (new2.initial_offset, new2.initial_seq_no, new2.writer) == (3, 3, "x")
    assert new2.collected == g2.setsum_to_discard
    del f


def test_apply_of_a_plan_the_manifest_holds_is_the_manifest_itself() -> None:
    """Idempotent: once ``oldest_offset >= first_to_keep`` the manifest comes back unchanged
    (the same object).  Kills ``>=`` → ``>``."""
    m, a, _ = _two_snapshot_log()
    g = Garbage((a.to_pointer(),), (), None, 1, 3, a.setsum, 3)
    done = g.apply(m, "w")
    assert g.apply(done, "other") is done
    assert Garbage((), (), None, 9, 1, S[0], 1).apply(m, "w") is m  # not even checked


def test_apply_refusals_and_their_texts() -> None:
    """Kills the messages and conditions of every ``apply`` refusal: legacy, inverted range
    (``>`` → ``>=``: an empty range is fine), not balancing (``left - came``, ``!=``), out of root
    order, not applying (``Manifest.check``) and moving the tail."""
    m, a, b = _two_snapshot_log()
    rejected(
        lambda: replace(Garbage.empty(), legacy=True).apply(m, "w"),
        "a legacy plan is never applied",
    )
    rejected(
        lambda: Garbage((a.to_pointer(),), (), None, 4, 3, a.setsum, 3).apply(m, "w"),
        "garbage's fragment range is inverted",
    )
    # An empty range is not inverted: dropping a snapshot only.
    ok = Garbage((a.to_pointer(),), (), None, 3, 3, a.setsum, 3).apply(m, "w")
    assert ok.entries == m.entries[1:] and ok.initial_seq_no == 3
    rejected(
        lambda: Garbage((a.to_pointer(),), (), None, 3, 3, b.setsum, 3).apply(m, "w"),
        "garbage does not balance (or is stale): what it removes "
        "does not sum to its setsum_to_discard",
    )
    # A given root listing a kept fragment before a kept snapshot.
    f5 = m.fragments[0]
    rejected(
        lambda: Garbage((a.to_pointer(),), (), None, 3, 3, a.setsum, 3).apply(
            m, "w", entries=(a.to_pointer(), f5, b.to_pointer(), m.fragments[1])
        ),
        "garbage leaves a root out of order (a fragment before a snapshot)",
    )
    flat = flat_log(5)
    f1 = flat.fragments[0]
    rejected(
        lambda: Garbage((), (), None, 1, 2, f1.setsum, 3).apply(flat, "w"),
        "garbage does not apply: manifest starts at 2, expected 3",
    )
    everything = Setsum.sum(x.setsum for x in flat.fragments)
    rejected(
        lambda: Garbage((), (), None, 1, 6, everything, 7).apply(flat, "w"),
        "garbage would move the log's tail",
    )
    # Dropping everything up to the tail keeps the tail: it applies (verify_garbage refuses).
    bare = Garbage((), (), None, 1, 6, everything, 6).apply(flat, "w")
    assert bare.entries == () and bare.next_offset == flat.next_offset


def test_apply_puts_the_new_root_snapshot_first_and_counts_it_in_the_balance() -> None:
    """``snapshot_for_root`` goes first, before the kept snapshots, and what came is subtracted
    from what left.  Kills ``root = None``, ``came`` mutants, ``or`` / ``is`` / ``in`` flips of
    ``root is not None and root not in rest``, and every ``rest.insert(0, root)`` mutant."""
    m, a, b = _two_snapshot_log()
    f1, f2 = chain(2)
    a2 = snap(f2)  # A split at offset 2: its live child f2 in a new snapshot
    g = Garbage((a.to_pointer(),), (a2,), a2.to_pointer(), 1, 2, f1.setsum, 2)
    new = g.apply(m, "w")
    assert new.snapshots == (a2.to_pointer(), b.to_pointer())
    assert new.fragments == m.fragments
    assert new.collected == f1.setsum and (new.initial_offset, new.initial_seq_no) == (2, 2)
    # A root already in place is not inserted twice (nor counted as come).
    again = Garbage((), (), b.to_pointer(), 1, 1, Setsum.zero(), 3)
    held = replace(m, snapshots=(b.to_pointer(),), initial_offset=None)
    held = replace(held, setsum=held.setsum - a.setsum)
    assert again.apply(held, "w").snapshots == (b.to_pointer(),)


def test_apply_walks_the_given_root_when_one_is_given() -> None:
    """``entries`` stands for the manifest's root when given, else the root is ``m``'s.  Kills
    the ``entries is None`` mutants (``and False``, ``or True``, ``is not``)."""
    m, a, b = _two_snapshot_log()
    g = Garbage((a.to_pointer(),), (), None, 1, 3, a.setsum, 3)
    # The writer rolled A and B into one snapshot AB; the cut is computed on the unrolled root.
    ab = snap(a.to_pointer(), b.to_pointer())
    rolled = manifest([ab.to_pointer()], m.fragments)
    new = g.apply(rolled, "w", entries=m.entries)
    assert new.snapshots == (b.to_pointer(),) and new.fragments == m.fragments
    assert g.apply(m, "w").snapshots == (b.to_pointer(),)


# ------------------------------------------------------------------- the verifier's bounds


def test_the_fraction_budget() -> None:
    """``max_fraction`` of the live bytes, never less than the oldest root pointer, zero for an
    empty log.  Kills every ``fraction_budget`` mutant."""
    assert fraction_budget(Manifest.empty("w"), opts()) == 0
    m = flat_log(10)  # 1,000 live bytes
    assert fraction_budget(m, opts(max_fraction=0.25)) == 250
    assert fraction_budget(m, opts(max_fraction=0.05)) == 100  # the oldest pointer
    big = manifest((), [frag(1, 1, 1, 950), *chain(5, seq=2, start=2, nbytes=10)])
    assert fraction_budget(big, opts(max_fraction=0.5)) == 950
    assert fraction_budget(flat_log(3, nbytes=7), opts(max_fraction=0.99)) == 20


def _drop_first(m: Manifest, n: int) -> Garbage:
    """A plan dropping the first ``n`` one-record fragments of a flat log."""
    gone = m.fragments[:n]
    return Garbage(
        (),
        (),
        None,
        gone[0].seq_no,
        gone[-1].seq_no + 1,
        Setsum.sum(x.setsum for x in gone),
        gone[-1].limit,
    )


def test_verify_garbage_bounds_what_one_plan_drops() -> None:
    """A plan may drop exactly the budget, not a byte more; the text names both shares.  Kills
    ``> budget`` → ``>=``, the ``budget``/``dropped_bytes``/``live`` mutants (``None``, ``+``,
    ``and 1``, ``*``) and ``fraction_budget(...)``'s argument mutants."""
    m = flat_log(10)
    o = opts(max_fraction=0.5)
    verify_garbage(_drop_first(m, 5), m, o)
    rejected(
        lambda: verify_garbage(_drop_first(m, 6), m, o),
        "garbage drops 60.0% of the log, more than the allowed 50.0%",
    )
    # The oldest pointer alone is always allowed, whatever the fraction.
    big = manifest((), [frag(1, 1, 1, 950), *chain(5, seq=2, start=2, nbytes=10)])
    verify_garbage(_drop_first(big, 1), big, opts(max_fraction=0.1))
    rejected(
        lambda: verify_garbage(_drop_first(big, 2), big, opts(max_fraction=0.1)),
        "garbage drops 96.0% of the log, more than the allowed 10.0%",
    )


def test_verify_garbage_keeps_the_last_fragment_and_the_tail() -> None:
    """Kills the last-fragment test's mutants (``or`` for either ``and``/``or``, ``not``,
    ``[+1]``, ``[-2]``, ``==``) and the tail test's (``==``, its text)."""
    m = flat_log(4)
    rejected(
        lambda: verify_garbage(_drop_first(m, 4), m, opts(max_fraction=1.0)),
        "garbage drops the root's last fragment, which fences writers",
    )
    verify_garbage(_drop_first(m, 3), m, opts(max_fraction=1.0))
    two = flat_log(3)
    verify_garbage(_drop_first(two, 1), two, opts(max_fraction=1.0))  # two fragments stay
    one = flat_log(2)
    verify_garbage(_drop_first(one, 1), one, opts(max_fraction=1.0))  # one fragment stays
    # An empty log and a plan that changes nothing: nothing to keep, nothing refused.
    verify_garbage(Garbage.empty(), Manifest.empty("w"), opts(), pinned_at=1)
    # Dropping every fragment with another fragment number: the tail's sequence moves.
    everything = Setsum.sum(x.setsum for x in m.fragments)
    rejected(
        lambda: verify_garbage(Garbage((), (), None, 1, 9, everything, 5), m, opts()),
        "garbage would move the log's tail",
    )


def test_verify_garbage_refuses_a_plan_past_the_lowest_cursor() -> None:
    """A plan may keep from exactly the lowest cursor, not one past it; without a cursor bound
    nothing is compared.  Kills ``or`` for ``and``, ``is`` for ``is not``, ``>`` → ``>=`` and
    the message."""
    m = flat_log(6)
    g = _drop_first(m, 3)  # keeps from 4
    verify_garbage(g, m, opts(), pinned_at=4)
    verify_garbage(g, m, opts())
    rejected(
        lambda: verify_garbage(g, m, opts(), pinned_at=3),
        "garbage drops offsets up to 4, but a cursor pins 3",
    )


def test_verify_garbage_checks_its_own_sums_on_a_manifest_it_does_not_change() -> None:
    """On a manifest the plan is already applied to, ``apply`` changes nothing, so the
    verifier's own sums speak: an unbalanced manifest, a plan with something to discard, an
    inverted range.  Kills the three sum checks' mutants (``-`` for ``+``, ``==``, ``+`` for
    ``-``, the ``sum`` argument mutants, the messages) and the range check's (``<=``)."""
    m = flat_log(5)
    done = _drop_first(m, 2).apply(m, "w")
    off = replace(done, setsum=done.setsum + S[0])
    rejected(
        lambda: verify_garbage(Garbage((), (), None, 1, 1, Setsum.zero(), 1), off, opts()),
        "garbage does not balance: live + collected + discarded != setsum",
    )
    rejected(
        lambda: verify_garbage(_drop_first(m, 2), done, opts()),
        "collected does not grow by exactly the discarded setsum",
    )
    rejected(
        lambda: verify_garbage(Garbage((), (), None, 4, 3, Setsum.zero(), 3), done, opts()),
        "fragment range to delete is inverted",
    )
    verify_garbage(Garbage((), (), None, 3, 3, Setsum.zero(), 3), done, opts())
    # With something collected before, the growth is still exactly the discard.
    m2 = manifest((), chain(5), collected=S[1])
    verify_garbage(_drop_first(m2, 2), m2, opts())


# ---------------------------------------------------------------------------------- plan_cut


class Made:
    """``plan_cut``'s ``put_snapshot``: records what it is given, stores nothing (so a plan
    that reads a snapshot it made must have it from the cache)."""

    def __init__(self) -> None:
        self.snaps: list[Snapshot] = []

    async def __call__(self, s: Snapshot) -> None:
        self.snaps.append(s)


async def _plan(
    store: MemStore, m: Manifest, cutoff: int, made: Made | None = None, **kw: Any
) -> Garbage | None:
    return await plan_cut(
        store, P, m, cutoff, SnapshotCache(), "gcw", made or Made(), kw.pop("now_us", 77), **kw
    )


def _flat_plan(m: Manifest, n: int, now_us: int = 77) -> Garbage:
    return replace(_drop_first(m, n), created_us=now_us)


async def test_plan_cut_drops_whole_pointers_below_the_cutoff() -> None:
    """A fragment ending at the cutoff goes, the one holding it stays.  Kills the ``i`` loop's
    mutants (``or``, ``<= len``, ``< cutoff``, ``i = 1``, ``i -= 1``, ``+= 2``), ``dropped``,
    ``discard`` and the ``Garbage(...)`` argument mutants, ``first_to_keep``'s and
    ``first_keep_seq``'s, and ``created_us`` (given, it is used as is)."""
    store = MemStore()
    m = flat_log(6)
    assert await _plan(store, m, 4) == _flat_plan(m, 3)
    assert await _plan(store, m, 2) == _flat_plan(m, 1)
    assert await _plan(store, m, 1) is None
    # Multi-record fragments: one straddling the cutoff is kept whole.
    wide = manifest((), [frag(1, 1, 3), frag(2, 4, 3), frag(3, 7, 3)])
    assert await _plan(store, wide, 6) == _flat_plan(wide, 1)
    assert await _plan(store, wide, 7) == _flat_plan(wide, 2)


async def test_plan_cut_clips_the_cutoff_at_the_tail_and_at_the_last_fragment() -> None:
    """Without ``keep_tail`` (the default) a cutoff past the tail drops everything; with it
    the last fragment stays; a log without fragments plans nothing.  Kills ``min(cutoff,
    m.next_offset)``'s mutants, the ``keep_tail`` default, the clip's (``and False``, ``or
    True``, ``[+1]``, ``[-2]``), ``straddler`` and ``remaining`` on an emptied root (``<= len``,
    ``or True``), and ``first_keep_seq is None``."""
    store = MemStore()
    m = flat_log(4)
    everything = Setsum.sum(x.setsum for x in m.fragments)
    assert await _plan(store, m, 99) == Garbage((), (), None, 1, 5, everything, 5, 77)
    assert await _plan(store, m, 99, keep_tail=True) == _flat_plan(m, 3)
    assert await _plan(store, m, 3, keep_tail=True) == _flat_plan(m, 2)
    assert await _plan(store, Manifest.empty("w"), 5, keep_tail=True) is None
    assert await _plan(store, Manifest.empty("w"), 5) is None


async def test_plan_cut_bounds_a_plan_by_bytes_at_a_pointer_boundary() -> None:
    """``max_bytes``: pointers are taken while their sum stays within it (exactly at it is
    fine), always at least the first one.  Kills the budget loop's mutants (``is``, ``acc``
    initial value, ``>= cutoff``'s neighbour ``break``→``return``, ``or``, ``-``, ``>=``,
    ``acc =``/``-=``, ``cutoff = None``, the second ``break``→``return``)."""
    store = MemStore()
    m = flat_log(10)
    assert await _plan(store, m, 11, max_bytes=250) == _flat_plan(m, 2)
    assert await _plan(store, m, 11, max_bytes=300) == _flat_plan(m, 3)
    assert await _plan(store, m, 5, max_bytes=10_000) == _flat_plan(m, 4)
    assert await _plan(store, m, 5, max_bytes=None) == _flat_plan(m, 4)
    big = manifest((), [frag(1, 1, 1, 950), *chain(5, seq=2, start=2, nbytes=10)])
    assert await _plan(store, big, 5, max_bytes=100) == _flat_plan(big, 1)


async def test_plan_cut_stamps_the_wall_clock_when_not_told_the_time() -> None:
    """Kills ``now_us is None``'s mutants and the microsecond conversion."""
    import time

    store = MemStore()
    m = flat_log(3)
    before = time.time_ns() // 1000
    g = await plan_cut(store, P, m, 2, SnapshotCache(), "gcw", Made())
    after = time.time_ns() // 1000
    assert g is not None and g.created_us is not None
    assert isinstance(g.created_us, int) and before <= g.created_us <= after


def _tree(store: MemStore) -> tuple[list[FragmentPointer], Snapshot, Snapshot, Snapshot]:
    """Fragments f1..f8 (seq i at offset i); A(f1, f2), B(f3, f4) and D(A, B) stored."""
    f = chain(8)
    a, b = snap(f[0], f[1]), snap(f[2], f[3])
    d = snap(a.to_pointer(), b.to_pointer())
    put_snapshots(store, a, b, d)
    return f, a, b, d


async def test_plan_cut_splits_a_straddling_snapshot_one_level() -> None:
    """A root snapshot straddling the cutoff is split when a fragment under it ends at or below
    the cutoff: its live children go into a new snapshot (by the collector's writer), stored,
    which leads the root.  Kills ``discards``' mutants (``<`` for ``<=``, ``True``/``False``,
    ``children[1]``), the straddler test's (``not``, ``and False``, ``discards(None)``,
    ``straddler = ""``), ``split``'s (``<``, the discard, ``Snapshot.build``'s arguments,
    ``put_snapshot(None)``, ``cache.put``'s, ``created.append(None)``), ``new_root``'s and the
    ``not dropped and straddler is None`` test's."""
    store = MemStore()
    f, a, b, _ = _tree(store)
    m = manifest([a.to_pointer(), b.to_pointer()], f[4:])
    made = Made()
    a2 = Snapshot.build([f[1]], "gcw")
    assert await _plan(store, m, 2, made) == Garbage(
        (a.to_pointer(),), (a2,), a2.to_pointer(), 1, 2, f[0].setsum, 2, 77
    )
    assert made.snaps == [a2] and a2.writer == "gcw"
    # Cut at 4: A goes whole, B is split.
    made = Made()
    b2 = Snapshot.build([f[3]], "gcw")
    assert await _plan(store, m, 4, made) == Garbage(
        (a.to_pointer(), b.to_pointer()),
        (b2,),
        b2.to_pointer(),
        1,
        4,
        a.setsum + f[2].setsum,
        4,
        77,
    )
    assert made.snaps == [b2]


async def test_plan_cut_leaves_a_snapshot_alone_unless_a_fragment_under_it_goes() -> None:
    """A snapshot whose first fragment straddles the cutoff is not rebuilt (the same content
    address would be live and listed for deletion at once): nothing to plan.  Kills
    ``discards``' final ``False`` → ``True`` and ``<=`` → ``<``'s neighbour cases."""
    store = MemStore()
    wide = [frag(1, 1, 2), frag(2, 3, 2), *chain(2, seq=3, start=5)]
    a = snap(wide[0], wide[1])
    put_snapshots(store, a)
    m = manifest([a.to_pointer()], wide[2:])
    assert await _plan(store, m, 2) is None
    a2 = Snapshot.build([wide[1]], "gcw")
    assert await _plan(store, m, 3) == Garbage(
        (a.to_pointer(),), (a2,), a2.to_pointer(), 1, 2, wide[0].setsum, 3, 77
    )


async def test_plan_cut_splits_nested_snapshots_level_by_level() -> None:
    """A depth-2 straddler: its straddling child is split in turn (only the first kept child
    can straddle), the rest kept as is, and one new snapshot per level is made, innermost
    first.  Kills ``discards``' ``ptr = first``/``ptr = None``, ``split``'s nested-split test
    (``or`` for ``and``, ``kept`` for ``not kept``, ``discards(None)``, ``split(None)``,
    ``append(None)``), the ``len(kept) == 1 and …`` test's mutants and ``kept[1]``."""
    store = MemStore()
    f, a, b, d = _tree(store)
    m = manifest([d.to_pointer()], f[4:])
    made = Made()
    a2 = Snapshot.build([f[1]], "gcw")
    d2 = Snapshot.build([a2.to_pointer(), b.to_pointer()], "gcw")
    assert await _plan(store, m, 2, made) == Garbage(
        (d.to_pointer(), a.to_pointer()), (a2, d2), d2.to_pointer(), 1, 2, f[0].setsum, 2, 77
    )
    assert made.snaps == [a2, d2]
    # At 4 the first child goes whole (with everything under it) and the second is split; one
    # snapshot of one snapshot is that snapshot: no new level is made.
    made = Made()
    b2 = Snapshot.build([f[3]], "gcw")
    assert await _plan(store, m, 4, made) == Garbage(
        (d.to_pointer(), a.to_pointer(), b.to_pointer()),
        (b2,),
        b2.to_pointer(),
        1,
        4,
        a.setsum + f[2].setsum,
        4,
        77,
    )
    assert made.snaps == [b2]
    # At 3 the first child goes whole and the second starts at the cut: kept as it is.
    assert await _plan(store, m, 3, made) == Garbage(
        (d.to_pointer(), a.to_pointer()), (), b.to_pointer(), 1, 3, a.setsum, 3, 77
    )


async def test_plan_cut_keeps_a_straddling_child_whose_fragments_all_stay() -> None:
    """Inside a split, a child snapshot straddling the cut whose first fragment stays is kept
    as it is, not rebuilt.  Kills the nested test's ``… or not kept`` mutant."""
    store = MemStore()
    f1, f2 = chain(2)
    f3, f4 = frag(3, 3, 3), frag(4, 6, 1)
    tail = chain(2, seq=5, start=7)
    a, b = snap(f1, f2), snap(f3, f4)
    d = snap(a.to_pointer(), b.to_pointer())
    put_snapshots(store, a, b, d)
    m = manifest([d.to_pointer()], tail)
    assert await _plan(store, m, 4) == Garbage(
        (d.to_pointer(), a.to_pointer()), (), b.to_pointer(), 1, 3, a.setsum, 3, 77
    )


async def test_plan_cut_lists_every_snapshot_under_a_dropped_pointer() -> None:
    """Kills the dropped-stack mutants (``stack``/``p`` ``None``, ``append(None)``,
    ``extend(None)``, ``cache.get``'s arguments) and ``dict.fromkeys``/``not in made``."""
    store = MemStore()
    f, a, b, d = _tree(store)
    m = manifest([d.to_pointer()], f[4:])
    assert await _plan(store, m, 6) == Garbage(
        (d.to_pointer(), b.to_pointer(), a.to_pointer()),
        (),
        None,
        1,
        6,
        d.setsum + f[4].setsum,
        6,
        77,
    )


async def test_the_tree_helpers() -> None:
    """``min_live_seq``: the first leaf, else the next sequence number; ``live_snapshot_paths``:
    every snapshot at any depth.  Kills their mutants and ``_first_leaf_seq``'s."""
    store = MemStore()
    f, a, b, d = _tree(store)
    cache = SnapshotCache()
    m = manifest([d.to_pointer()], f[4:])
    assert await min_live_seq(store, P, m, cache) == 1
    assert await min_live_seq(store, P, manifest((), f[5:]), cache) == 6
    assert await min_live_seq(store, P, replace(Manifest.empty("w"), initial_seq_no=9), cache) == 9
    assert await min_live_seq(store, P, manifest([b.to_pointer()], f[4:]), SnapshotCache()) == 3
    assert await live_snapshot_paths(store, P, m, SnapshotCache()) == {d.path, a.path, b.path}
    assert await live_snapshot_paths(store, P, manifest((), f), cache) == set()


# -------------------------------------------------------------------------------- verify_cut


async def _split_case(
    store: MemStore, *, stored: bool = False
) -> tuple[Manifest, Garbage, list[FragmentPointer], Snapshot, Snapshot]:
    """Root ``[A(f1, f2), B(f3, f4), f5, f6]`` cut at 2 by our planner (A split into A2)."""
    f, a, b, _ = _tree(store)
    m = manifest([a.to_pointer(), b.to_pointer()], f[4:6])
    g = await _plan(store, m, 2)
    assert g is not None
    a2 = g.snapshots_to_make[0]
    if stored:
        put_snapshots(store, a2)
    return m, g, f, a, a2


async def _refused_cut(store: MemStore, g: Garbage, m: Manifest, message: str) -> None:
    with pytest.raises(GarbageRejected) as e:
        await verify_cut(store, P, g, m)
    assert str(e.value) == message


async def test_verify_cut_proves_an_honest_split_and_names_what_to_install() -> None:
    """The plan's new snapshot is installed unless the store holds it already (then the
    stored one is what readers find); the removed prefix is named.  Kills ``verify_cut``'s
    bookkeeping mutants (``new``/``now``/``removed``/``before``/``fresh``/``planned``/
    ``opened``/``install`` ``None``s, ``not in`` → ``in``, ``== removed``, the loop's
    ``or True``/``[1]``/``< cut``/``break``/``<= cut``, ``first_kept and a``) and the return
    value's."""
    store = MemStore()
    m, g, _, a, a2 = await _split_case(store)
    assert await verify_cut(store, P, g, m) == VerifiedCut((a2,), (a.to_pointer(),))
    put_snapshots(store, a2)
    assert await verify_cut(store, P, g, m) == VerifiedCut((), (a.to_pointer(),))
    # Another writer's copy at that path (same content, other writer): readers find it, so
    # it is what is proved, and nothing is installed.
    store2 = MemStore()
    m2, g2, _, a_, a2_ = await _split_case(store2)
    put_snapshots(store2, replace(a2_, writer="someone"))
    assert await verify_cut(store2, P, g2, m2) == VerifiedCut((), (a_.to_pointer(),))
    # A plan listing the same snapshot twice installs the first (a create-only put keeps it).
    twice = replace(g, snapshots_to_make=(a2, replace(a2, writer="w2")))
    store3 = MemStore()
    _tree(store3)
    assert (await verify_cut(store3, P, twice, m)).install == (a2,)


async def test_verify_cut_of_whole_pointers_reads_nothing_new() -> None:
    """Dropping whole pointers: nothing fresh to prove, the first kept leaf is the kept
    root's.  Kills ``first_kept = ""`` and ``keep``'s mutants (``is``, ``or True``, ``and
    False``, ``entries[1]``), and ``first_seq``'s."""
    store = MemStore()
    f, a, b, d = _tree(store)
    m = manifest([a.to_pointer(), b.to_pointer()], f[4:6])
    g = Garbage((a.to_pointer(),), (), None, 1, 3, a.setsum, 3)
    assert await verify_cut(store, P, g, m) == VerifiedCut((), (a.to_pointer(),))
    g2 = Garbage((a.to_pointer(), b.to_pointer()), (), None, 1, 5, a.setsum + b.setsum, 5)
    assert await verify_cut(store, P, g2, m) == VerifiedCut((), (a.to_pointer(), b.to_pointer()))
    flat = flat_log(4)
    assert await verify_cut(store, P, _drop_first(flat, 2), flat) == VerifiedCut(
        (), tuple(flat.fragments[:2])
    )
    # Everything dropped: the first kept leaf is the next fragment's number.
    everything = _drop_first(flat, 4)
    assert (await verify_cut(store, P, everything, flat)).removed == flat.fragments
    await _refused_cut(
        store,
        replace(everything, fragments_to_drop_limit=6),
        flat,
        "the first kept leaf is fragment 5, but the plan keeps from 6",
    )
    del d


async def test_verify_cut_refuses_a_plan_keeping_from_another_fragment() -> None:
    """The first kept leaf must be ``fragments_to_drop_limit``, in a split and across whole
    pointers.  Kills the final check's mutants and its message."""
    store = MemStore()
    m, g, _, _, _ = await _split_case(store)
    await _refused_cut(
        store,
        replace(g, fragments_to_drop_limit=3),
        m,
        "the first kept leaf is fragment 2, but the plan keeps from 3",
    )
    _, a, _, _ = _tree(store)
    g2 = Garbage((a.to_pointer(),), (), None, 1, 4, a.setsum, 3)
    await _refused_cut(store, g2, m, "the first kept leaf is fragment 3, but the plan keeps from 4")


def _lying_root(
    m: Manifest, a: Snapshot, root: SnapshotPointer, made: tuple[Snapshot, ...] = ()
) -> Garbage:
    """Drop A, link ``root`` first (balanced whatever it claims)."""
    return Garbage((a.to_pointer(),), made, root, 1, 2, a.setsum - root.setsum, root.start)


async def test_verify_cut_opens_the_new_root_where_readers_will() -> None:
    """A linked snapshot neither stored nor planned is refused; one that is not what its
    pointer says (setsum, depth, first start, last limit, bytes: each on its own) is refused.
    Kills ``open_new``'s mutants: ``opened``/``store.get``/``join``/``from_bytes``/``planned``
    arguments, ``is``/``is not``, each ``or`` → ``and`` and comparison flip of the pointer
    check, ``kids[1]``/``kids[+1]``/``kids[-2]``, ``sum(None)``, and the messages."""
    store = MemStore()
    m, g, f, a, a2 = await _split_case(store)
    p = a2.to_pointer()
    await _refused_cut(
        store,
        replace(g, snapshots_to_make=()),
        m,
        f"the plan links {a2.path}, which neither the store nor the plan holds",
    )
    says = f"{a2.path} is not what the plan's pointer [2, 3) says it is"
    await _refused_cut(store, _lying_root(m, a, replace(p, setsum=S[0]), (a2,)), m, says)
    # Rust's wrapped lone child: the same name (same setsum), one level deeper.
    wrapped = Snapshot.build([a2.to_pointer()], "rust")
    assert wrapped.path == a2.path and wrapped.depth == 2
    st = MemStore()
    _tree(st)
    put_snapshots(st, wrapped)
    await _refused_cut(st, g, m, says)
    for lie in (
        replace(f[1], start=1, limit=3),  # kids[0].start differs (and the limit stays)
        replace(f[1], limit=4),
        replace(f[1], num_bytes=5),
    ):
        st = MemStore()
        _tree(st)
        forged = Snapshot(a2.path, 1, a2.setsum, "x", (), (lie,))
        st.objects[join(P, a2.path)] = (
            json.dumps(forged.to_json()).encode(),
            "e",
            st.now,
        )
        await _refused_cut(st, g, m, says)
    # The pointer claiming more bytes than its children hold.
    await _refused_cut(store, _lying_root(m, a, replace(p, num_bytes=101), (a2,)), m, says)
    # A pointer claiming to be deeper than its snapshot is fine (it is no deeper).
    deeper = replace(p, depth=2)
    assert (await verify_cut(store, P, _lying_root(m, a, deeper, (a2,)), m)).install == (a2,)


async def test_verify_cut_compares_leaves_one_by_one() -> None:
    """A new root that balances but holds another leaf (finding b2 of issue 16) is refused
    with both leaves named; a cut inside a leaf is refused.  Kills the leaf comparison's
    mutants (``_same_leaf``'s arguments, ``or`` for ``and``), ``a.start < cut`` → ``<=``,
    and the messages."""
    store = MemStore()
    m, _, f, a, _ = await _split_case(store)
    other = replace(f[1], setsum=S[1])
    liar = Snapshot.build([other], "x")
    await _refused_cut(
        store,
        _lying_root(m, a, liar.to_pointer(), (liar,)),
        m,
        f"the plan's leaves are not the log's: it holds {other.path} [2, 3) where the log "
        f"holds {f[1].path} [2, 3)",
    )
    # A cut inside a fragment: A's first fragment spans [1, 3).
    st = MemStore()
    wide = [frag(1, 1, 2), frag(2, 3, 1), *chain(2, seq=3, start=4)]
    aw = snap(wide[0], wide[1])
    put_snapshots(st, aw)
    mw = manifest([aw.to_pointer()], wide[2:])
    inner = sptr(S[2], 2, 4)
    await _refused_cut(
        st,
        Garbage((aw.to_pointer(),), (), inner, 1, 2, aw.setsum - S[2], 2),
        mw,
        f"first_to_keep 2 falls inside leaf {wide[0].path} [1, 3)",
    )


async def test_verify_cut_walks_nested_trees_on_both_sides() -> None:
    """A nested split is proved by opening the new levels and the old ones only where they
    differ; a plan whose snapshots are unusable is refused.  Kills ``expand``'s mutants, the
    width comparison (``+`` for ``-``, ``>`` for ``>=``, ``and``/``or``), ``first_kept`` in
    the fragment branch, and the ``except`` clause's message."""
    store = MemStore()
    f, _, _, d = _tree(store)
    m = manifest([d.to_pointer()], f[4:6])
    g = await _plan(store, m, 2)
    assert g is not None and len(g.snapshots_to_make) == 2
    assert await verify_cut(store, P, g, m) == VerifiedCut(g.snapshots_to_make, (d.to_pointer(),))
    # A malformed planned snapshot, and a missing stored one.
    empty = Snapshot("snapshot/SNAPSHOT." + "0" * 64, 1, Setsum.zero(), "x")
    with pytest.raises(GarbageRejected, match=r"^a snapshot the plan reaches is unusable: "):
        await verify_cut(store, P, replace(g, snapshots_to_make=(*g.snapshots_to_make, empty)), m)
    gone = MemStore()
    with pytest.raises(
        GarbageRejected, match=r"^a snapshot the plan reaches is unusable: snapshot .* is missing"
    ):
        await verify_cut(gone, P, g, m)


def _reads(store: MemStore, *snaps: Snapshot) -> list[bool]:
    return [("get", join(P, s.path)) in store.ops for s in snaps]


async def test_verify_cut_opens_only_the_snapshots_along_the_split() -> None:
    """Equal pointers are not opened: of two snapshots heading the two sides, the wider is
    expanded (the old one when as wide), so a kept subtree is matched by its pointer.  Kills
    the width comparison's mutants (``and`` for ``or``, ``+`` for either ``-``)."""
    f = chain(8)
    a, b, c = snap(f[0], f[1]), snap(f[2], f[3]), snap(f[4], f[5])
    a2 = Snapshot.build([f[1]], "gcw")
    # Old side wider: D(B, C) against the new root's B, C.
    store = MemStore()
    d = snap(b.to_pointer(), c.to_pointer())
    put_snapshots(store, a, b, c, d)
    m = manifest([a.to_pointer(), d.to_pointer()], f[6:])
    r = Snapshot.build([a2.to_pointer(), b.to_pointer(), c.to_pointer()], "gcw")
    g = Garbage((a.to_pointer(), d.to_pointer()), (a2, r), r.to_pointer(), 1, 2, f[0].setsum, 2)
    assert await verify_cut(store, P, g, m) == VerifiedCut(
        (a2, r), (a.to_pointer(), d.to_pointer())
    )
    assert _reads(store, a, d, b, c) == [True, True, False, False]
    # New side wider: Q(B, C) against the old root's B, C.
    store = MemStore()
    put_snapshots(store, a, b, c)
    m = manifest([a.to_pointer(), b.to_pointer(), c.to_pointer()], f[6:])
    q = Snapshot.build([b.to_pointer(), c.to_pointer()], "gcw")
    r = Snapshot.build([a2.to_pointer(), q.to_pointer()], "gcw")
    g = Garbage(
        (a.to_pointer(), b.to_pointer(), c.to_pointer()),
        (a2, q, r),
        r.to_pointer(),
        1,
        2,
        f[0].setsum,
        2,
    )
    got = await verify_cut(store, P, g, m)
    assert got.install == (a2, q, r) and got.removed == m.entries[:3]
    assert _reads(store, a, b, c) == [True, False, False]


async def test_verify_cut_matches_a_leaf_without_our_md5() -> None:
    """A Rust-written snapshot drops ``content_md5``: the leaf still matches, and it is the
    first kept one.  Kills ``first_kept`` in the same-leaf branch (``None``, ``and``)."""
    store = MemStore()
    md5 = "d41d8cd98f00b204e9800998ecf8427e"
    f = [replace(x, content_md5=md5) for x in chain(6)]
    a = snap(f[0], f[1])
    put_snapshots(store, a)
    m = manifest([a.to_pointer()], f[2:])
    rust = Snapshot.build([replace(f[1], content_md5=None)], "rust")
    g = Garbage((a.to_pointer(),), (rust,), rust.to_pointer(), 1, 2, f[0].setsum, 2)
    assert await verify_cut(store, P, g, m) == VerifiedCut((rust,), (a.to_pointer(),))


def test_same_leaf_is_every_rust_field_and_a_known_md5() -> None:
    """Kills every ``_same_leaf`` mutant."""
    x = frag(3, 3)
    md5 = "d41d8cd98f00b204e9800998ecf8427e"
    assert gcmod._same_leaf(x, x)
    for other in (
        replace(x, path=fragment_path(4)),
        replace(x, seq_no=4),
        replace(x, start=2),
        replace(x, limit=5),
        replace(x, num_bytes=1),
        replace(x, setsum=S[0]),
    ):
        assert not gcmod._same_leaf(x, other) and not gcmod._same_leaf(other, x)
    with_md5 = replace(x, content_md5=md5)
    assert gcmod._same_leaf(x, with_md5) and gcmod._same_leaf(with_md5, x)
    assert gcmod._same_leaf(with_md5, replace(x, content_md5=md5))
    assert not gcmod._same_leaf(with_md5, replace(x, content_md5="0" * 32))


# --------------------------------------------------------------------- the cut and its rolls


def test_unrolled_puts_the_verified_pointers_back_in_place_of_rolls() -> None:
    """Kills ``_unrolled``'s mutants: each refusal (not a snapshot, one of the verified
    pointers elsewhere, another start, a roll reaching into what is kept, another setsum,
    other bytes, the root ending early), the counters and the ``continue``."""
    f = chain(5)
    r12 = snap(f[0], f[1]).to_pointer()
    r123 = snap(r12, snap(f[2]).to_pointer()).to_pointer()  # a roll of rolls: depth 2
    removed = (f[0], f[1], f[2])
    un = gcmod._unrolled
    assert un((r12, f[2], f[3], f[4]), removed) == tuple(f)
    assert un((f[0], snap(f[1], f[2]).to_pointer(), f[3], f[4]), removed) == tuple(f)
    assert un(tuple(f), removed) == tuple(f)
    assert un((r12, f[2]), removed) == tuple(f[:3])
    # A roll of the whole verified prefix; of the prefix and a kept fragment: not undone.
    r1_3 = snap(f[0], f[1], f[2]).to_pointer()
    assert un((r1_3, f[3], f[4]), removed) == tuple(f)
    assert un((snap(f[0], f[1], f[2], f[3]).to_pointer(), f[4]), removed) is None
    assert r123.depth == 2
    assert un((r12, f[3]), removed) is None  # f3 is not f[2], nor a snapshot
    assert un((r12,), removed) is None  # the root ends before the prefix does
    assert un((f[0],), (f[0], f[1])) is None
    assert un((replace(r12, setsum=S[0]), f[2], f[3]), removed) is None
    assert un((replace(r12, num_bytes=1), f[2], f[3]), removed) is None
    assert un((replace(r12, start=0), f[2], f[3]), removed) is None
    # A snapshot pointer that is one of the verified ones, standing elsewhere.
    sp = snap(f[0]).to_pointer()
    assert un((sp, sp), (sp, f[1])) is None
    # A snapshot starting right but covering less than the first verified pointer.
    wide = (frag(1, 1, 3), frag(2, 4, 1))
    part = sptr(S[0], 1, 2)
    assert un((part, wide[1]), wide) is None
    # A fragment that is not the verified one, though it has its range, setsum and bytes.
    twin = replace(f[0], content_md5="d41d8cd98f00b204e9800998ecf8427e")
    assert un((twin, f[1], f[2], f[3]), removed) is None


def _cut_case() -> tuple[Manifest, Garbage, VerifiedCut, GcFloor]:
    m = flat_log(5)
    g = _drop_first(m, 2)
    return m, g, VerifiedCut((), tuple(m.fragments[:2])), GcFloor(3, NONCE)


def test_the_cut_needs_its_own_floor_and_removes_it() -> None:
    """With a floor, the edit applies only to a manifest holding exactly it, and the result
    holds none; a floor gone or replaced is ``FloorLost`` (``replaced`` says which).  Kills
    ``edit``'s floor mutants (``or``, ``is``, ``==``, the message and ``replaced``) and the
    ``gc_floor=None`` of the result."""
    m, g, cut, floor = _cut_case()
    fn = cut.edit(g, "gcw", floor)
    new = fn(replace(m, gc_floor=floor))
    assert new.gc_floor is None and new.writer == "gcw"
    assert new.entries == m.entries[2:] and new.initial_offset == 3
    with pytest.raises(FloorLost) as e:
        fn(m)
    assert str(e.value) == "the pending floor at 3 was retracted or replaced before the cut"
    assert e.value.replaced is False
    with pytest.raises(FloorLost) as e:
        fn(replace(m, gc_floor=GcFloor(3, "f" * 32)))
    assert e.value.replaced is True
    # Without a floor the edit cuts whatever floor the manifest holds, and clears it.
    plain = cut.edit(g, "gcw")(replace(m, gc_floor=GcFloor(9, "e" * 32)))
    assert plain.gc_floor is None and plain.entries == m.entries[2:]
    assert cut.edit(g, "gcw")(m).writer == "gcw"


def test_the_cut_of_an_applied_plan_is_the_manifest_itself() -> None:
    """Kills ``oldest_offset >= first_to_keep`` → ``>`` (checked before the floor)."""
    m, g, cut, floor = _cut_case()
    done = g.apply(m, "w")
    assert cut.edit(g, "gcw", floor)(done) is done
    exactly = replace(done, gc_floor=None)
    assert cut.edit(g, "gcw", floor)(exactly) is exactly


def test_the_cut_undoes_a_roll_of_the_verified_prefix_and_nothing_else() -> None:
    """Kills the roll branch's mutants: ``!= self.removed`` → ``==``, ``_unrolled``'s
    arguments, ``is None`` → ``is not``, ``g.apply``'s, and the refusal's text."""
    m, g, cut, floor = _cut_case()
    f = m.fragments
    roll = snap(f[0], f[1])
    rolled = manifest([roll.to_pointer()], f[2:], gc_floor=floor)
    new = cut.edit(g, "gcw", floor)(rolled)
    # The roll leaves the root with the verified prefix.
    assert new.entries == f[2:] and new.gc_floor is None and new.writer == "gcw"
    assert new.collected == g.setsum_to_discard
    other = manifest([snap(f[0], f[1], f[2]).to_pointer()], f[3:], gc_floor=floor)
    with pytest.raises(GarbageRejected) as e:
        cut.edit(g, "gcw", floor)(other)
    assert str(e.value) == "the log's oldest pointers changed since the plan was verified"


# ------------------------------------------------------------------------------ the collector


class Clocks:
    """The collector's wall clock (the store's time, so objects' ages are comparable) and its
    monotonic clock, both settable."""

    def __init__(self, store: MemStore) -> None:
        self.store = store
        self.mono = Mono()

    def wall(self) -> float:
        return self.store.now

    def advance(self, s: float) -> None:
        self.mono.now += s
        self.store.now += s


def gc_for(
    store: MemStore, clocks: Clocks, o: GcOptions | None = None, **kw: Any
) -> GarbageCollector:
    return GarbageCollector(store, P, o or opts(), clock=clocks.wall, monotonic=clocks.mono, **kw)


async def flat_setup(store: MemStore, n: int = 10, cursor: int | None = 6) -> Manifest:
    """A flat log of ``n`` one-record fragments, stored with their objects, and a compaction
    cursor at ``cursor``."""
    m = flat_log(n)
    put_manifest(store, m)
    put_fragments(store, range(1, n + 1))
    if cursor is not None:
        await set_cursor(store, COMPACTION, cursor)
    return m


def frag_key(seq: int) -> str:
    return join(P, fragment_path(seq))


async def test_a_pass_from_idle_plans_applies_and_waits_for_the_grace() -> None:
    """One pass: the plan is computed (cut at the cursor, the last fragment kept), applied
    (``collected`` grows by exactly the discard, the floor is gone) and marked; then it waits
    the whole grace, reporting what is left of it; after it, fragments below the cut are
    deleted in order and the plan is reset.  Kills ``run_once``'s and ``_run``'s flow mutants,
    ``_phase1``'s report (``cutoff``, ``setsum_discarded``), ``_mark_applied``'s
    (``applied_us``, ``phase``), ``_phase3``'s grace comparison and ``waiting_s``, the
    fragment key range, ``fragments_deleted``, ``_forget_applied``, and the "still referenced"
    fragment note's ``<`` → ``<=``."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    c = gc_for(store, clocks)
    r = await c.run_once()
    discard = Setsum.sum(x.setsum for x in m.fragments[:5])
    assert (r.phase, r.cutoff, r.setsum_discarded) == ("waiting", 6, discard.hexdigest())
    assert r.waiting_s == 60.0 and r.fragments_deleted == 0 and r.notes == []
    after = stored_manifest(store)
    assert after.oldest_offset == 6 and after.collected == discard and after.gc_floor is None
    assert after.writer == "wal3-gc" and after.initial_seq_no == 6
    plan = stored_plan(store)
    assert plan is not None and plan.first_to_keep == 6
    assert plan.created_us == plan.applied_us == int(store.now * 1_000_000)
    assert all(store.has(fragment_path(s)) for s in range(1, 11))
    clocks.advance(59.5)
    r = await c.run_once()
    assert (r.phase, r.waiting_s, r.cutoff) == ("waiting", 0.5, None)
    clocks.advance(0.5)
    store.ops.clear()
    r = await c.run_once(sweep_orphans=False)
    assert (r.phase, r.fragments_deleted, r.snapshots_deleted) == ("done", 5, 0)
    assert r.notes == []  # the plan's range is exactly what the manifest left: nothing kept
    assert store.deleted() == [frag_key(s) for s in range(1, 6)]
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE
    assert [s for s in range(1, 11) if store.has(fragment_path(s))] == list(range(6, 11))
    assert gcmod._SEEN_APPLIED[store] == {}
    # And the next pass finds nothing to do below the cursor.
    r = await c.run_once(sweep_orphans=False)
    assert (r.phase, r.cutoff) == ("idle", 6)


async def test_the_grace_is_inclusive_and_runs_from_first_sight() -> None:
    """Exactly ``grace_s`` after the plan was first seen applied is enough; the first sight is
    kept across passes and collectors of this process (same store object, same clock).  Kills
    ``waited < grace_s`` → ``<=`` (both), ``_seen_applied``'s mutants and ``_plan_key``'s."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    r = await gc_for(store, clocks).run_once()
    assert r.phase == "waiting"
    clocks.advance(30)
    r = await gc_for(store, clocks).run_once()
    assert (r.phase, r.waiting_s) == ("waiting", 30.0)
    clocks.advance(30)
    r = await gc_for(store, clocks).run_once(sweep_orphans=False)
    assert r.phase == "done"


async def test_a_new_process_times_the_grace_by_the_store_clock() -> None:
    """A collector that did not see the plan applied (another clock: another process) waits
    until the store's clock says the applied file is a grace old, less a second: the probe is
    ``gc/CLOCK``, written with the collector's name.  Kills ``_store_waited``'s and
    ``_store_now``'s mutants, the slack, and the ``max`` of the two waits."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    assert (await gc_for(store, clocks).run_once()).phase == "waiting"
    other = Clocks(store)  # a fresh monotonic clock: this process never saw the plan
    store.now += 60.5
    r = await gc_for(store, other, opts(writer_name="cli")).run_once(sweep_orphans=False)
    assert r.phase == "waiting"
    assert r.waiting_s == pytest.approx(0.5)
    assert json.loads(store.data(CLOCK_PATH)) == {"writer": "cli"}
    store.now += 0.5
    r = await gc_for(store, Clocks(store)).run_once(sweep_orphans=False)
    assert (r.phase, r.fragments_deleted) == ("done", 5)


async def test_the_store_clock_is_not_read_once_the_process_saw_the_grace() -> None:
    """Kills ``if waited < grace_s`` (the first) → ``>=``-like mutants: no probe is written
    when this process's own observation suffices."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    store.ops.clear()
    r = await c.run_once(sweep_orphans=False)
    assert r.phase == "done"
    assert ("put", join(P, CLOCK_PATH)) not in store.ops


async def test_a_plan_file_rewritten_between_read_and_head_counts_no_store_time() -> None:
    """``_store_waited``: the applied file must be the one read (its etag); gone, or
    rewritten, it says nothing (0).  Kills its ``!=`` → ``==``, ``strip`` and ``return 0.0``
    mutants."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    c = gc_for(store, clocks)
    await c.run_once()
    _, etag = await c._load_garbage()
    assert etag is not None
    store.now += 100
    assert await c._store_waited(etag) == pytest.approx(99.0)
    assert await c._store_waited(f'"{etag}"') == pytest.approx(99.0)
    assert await c._store_waited("other") == 0.0
    del store.objects[join(P, GARBAGE_PATH)]
    assert await c._store_waited(etag) == 0.0


async def test_phase_three_postpones_every_delete_while_a_cursor_pins_below_the_plan() -> None:
    """Kills ``_phase3``'s pin check (``<`` → ``<=``, the phase and its note)."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    await set_cursor(store, "reader", 5)
    store.ops.clear()
    r = await c.run_once()
    assert r.phase == "pinned"
    assert r.notes == ["a cursor pins 5, below the plan's 6: nothing deleted until it moves"]
    assert store.deleted() == []
    await set_cursor(store, "reader", 6)  # exactly at the plan's cut: no longer below it
    r = await c.run_once(sweep_orphans=False)
    assert (r.phase, r.fragments_deleted) == ("done", 5)


async def test_phase_three_keeps_the_idempotency_window() -> None:
    """The newest ``retain_fragments`` sequence numbers stay for a reopened writer.  Kills the
    ``upto`` mutants (``min``'s arguments, ``-`` → ``+``) and ``max(1, …)``."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store, cursor=8)
    c = gc_for(store, clocks, opts(retain_fragments=6))
    await c.run_once()
    clocks.advance(60)
    r = await c.run_once(sweep_orphans=False)
    # 11 - 6 = 5: fragments 1..4 go, 5..7 stay though below the cut.
    assert (r.phase, r.fragments_deleted) == ("done", 4)
    assert [s for s in range(1, 11) if store.has(fragment_path(s))] == list(range(5, 11))


class Editor:
    """A fenced manifest edit (compare-and-swap until it lands) whose ``n``-th call first
    lets the test change the stored manifest (``hooks[n]``: another writer, a pin, Rust)."""

    def __init__(self, store: MemStore) -> None:
        self.store = store
        self.calls = 0
        self.hooks: dict[int, Callable[[], Any]] = {}

    async def __call__(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        self.calls += 1
        hook = self.hooks.get(self.calls)
        if hook is not None:
            got = hook()
            if hasattr(got, "__await__"):
                await got
        while True:
            raw = await self.store.get(join(P, MANIFEST_PATH))
            m = Manifest.from_bytes(raw.data)
            new = fn(m)
            if new is m:
                return m
            try:
                await self.store.put(join(P, MANIFEST_PATH), new.to_bytes(), if_match=raw.etag)
                return new
            except PreconditionFailed:
                continue


def drop_floor(store: MemStore, *, replace_with: GcFloor | None = None) -> Callable[[], None]:
    """A writer dropping (or another collector replacing) the pending floor."""

    def fn() -> None:
        m = stored_manifest(store)
        put_manifest(store, replace(m, gc_floor=replace_with))

    return fn


async def _pending(store: MemStore, clocks: Clocks, o: GcOptions | None = None) -> Garbage:
    """Plan (phase 1 only) and return the pending plan."""
    c = gc_for(store, clocks, o)
    g, _ = await c._phase1(GcReport(), None)
    assert g is not None and stored_plan(store) == g
    return g


async def test_phase_one_reports_computed_and_writes_the_plan() -> None:
    """Kills ``_phase1``'s mutants on the plan it writes (``keep_tail``, ``max_bytes``,
    ``created_us``, the writer) and its report."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store, cursor=99)
    await set_cursor(store, COMPACTION, 11)
    r = GcReport()
    g, etag = await gc_for(store, clocks, opts(max_fraction=0.5))._phase1(r, None)
    assert (r.phase, r.cutoff) == ("computed", 11)
    assert g == replace(_drop_first(m, 5), created_us=int(store.now * 1_000_000))
    assert r.setsum_discarded == g.setsum_to_discard.hexdigest()
    assert etag == store.objects[join(P, GARBAGE_PATH)][1]
    # Without a bound the last fragment still stays.
    store2 = MemStore()
    m2 = await flat_setup(store2, cursor=11)
    g2, _ = await gc_for(store2, Clocks(store2), opts(max_fraction=1.0))._phase1(GcReport(), None)
    assert g2 is not None and g2.first_to_keep == 10 and g2.fragments_to_drop_limit == 10
    del m2


async def test_phase_one_with_nothing_below_the_cutoff_plans_nothing() -> None:
    """``cutoff <= oldest_offset``: no plan, no file, the cutoff reported.  Kills ``<=`` →
    ``<`` and the early returns."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store, cursor=1)
    r = await gc_for(store, clocks).run_once(sweep_orphans=False)
    assert (r.phase, r.cutoff, r.setsum_discarded) == ("idle", 1, None)
    assert not store.has(GARBAGE_PATH)
    put_manifest(store, replace(_drop_first(flat_log(10), 3).apply(flat_log(10), "w")))
    await set_cursor(store, COMPACTION, 4)
    r = await gc_for(store, clocks).run_once(sweep_orphans=False)
    assert (r.phase, r.cutoff) == ("idle", 4) and not store.has(GARBAGE_PATH)


async def test_a_plan_written_first_by_another_collector_is_taken_up() -> None:
    """Phase 1 losing the create-only put reads the other's plan and goes on with it.  Kills
    the ``PreconditionFailed`` branch (its note, ``_load_garbage``)."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    theirs = replace(_drop_first(m, 2), created_us=1)
    store.before("put", r"gc/GARBAGE$", lambda: put_raw(store, GARBAGE_PATH, theirs.to_bytes()))
    r = await gc_for(store, clocks).run_once()
    assert r.notes[0] == "another collector wrote the garbage file first"
    assert r.phase == "waiting" and stored_manifest(store).oldest_offset == 3
    plan = stored_plan(store)
    assert plan is not None and plan.first_to_keep == 3 and plan.created_us == 1


async def test_cursors_that_keep_moving_make_the_pass_busy_and_skip_the_sweep() -> None:
    """Eight dances at most, then ``busy`` with its note, and no sweep.  Kills ``cutoff``'s
    loop bound and etag comparison mutants, and ``report.phase != "busy"``."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    moves = [0]

    def move(_: str) -> None:
        pass

    async def mover() -> None:
        moves[0] += 1
        await set_cursor(store, COMPACTION, 6 + moves[0] % 2)

    class Moving(MemStore):
        pass

    c = gc_for(store, clocks)
    orig_load = c.cursors.load_all
    calls = [0]

    async def load_all() -> Any:
        calls[0] += 1
        got = await orig_load()
        if calls[0] % 2 == 1:
            await mover()
        return got

    c.cursors.load_all = load_all  # type: ignore[method-assign]
    store.ops.clear()
    r = await c.run_once()
    assert r.phase == "busy"
    assert r.notes == ["cursors kept moving during the dance; try again later"]
    assert calls[0] == 16
    assert not any(op == "list" for op, _ in store.ops)
    assert not store.has(GARBAGE_PATH)
    del move


async def test_the_dance_refusals() -> None:
    """No cursor at all is ``NoCursors``; no log is ``GarbageRejected``; a cursor past the tail
    collects nothing.  Kills ``cutoff``'s messages, ``not after``, ``> next_offset`` → ``>=``
    and the ``return 1, m``."""
    store = MemStore()
    clocks = Clocks(store)
    with pytest.raises(GarbageRejected) as e:
        await gc_for(store, clocks).cutoff()
    assert str(e.value) == "no log at logs/c"
    m = await flat_setup(store, cursor=None)
    with pytest.raises(NoCursors) as e2:
        await gc_for(store, clocks).run_once()
    assert str(e2.value) == "logs/c has no cursors: nothing can be collected"
    await set_cursor(store, COMPACTION, 12)
    assert await gc_for(store, clocks).cutoff() == (1, m)
    await set_cursor(store, COMPACTION, 11)  # the tail itself is fine
    assert await gc_for(store, clocks).cutoff() == (11, m)


async def test_the_lowest_cursor_pins_and_the_intrinsic_one_must_exist() -> None:
    """Kills ``pinned_at``'s mutants: ``min``'s default, the intrinsic cursor's test."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store, cursor=None)
    await set_cursor(store, "reader", 7)
    c = gc_for(store, clocks)
    assert await c.cutoff() == (1, m)  # no compaction cursor: nothing is compacted
    none = gc_for(store, clocks, opts(intrinsic_cursor=None))
    assert await none.cutoff() == (7, m)
    await set_cursor(store, COMPACTION, 9)
    assert await c.cutoff() == (7, m)
    assert c.pinned_at({}) == 1 and none.pinned_at({}) == 1
    named = gc_for(store, clocks, opts(intrinsic_cursor="reader"))
    cursors = await c.cursors.load_all()
    assert named.pinned_at(cursors) == 7
    assert named.pinned_at({COMPACTION: cursors[COMPACTION]}) == 1


async def test_a_legacy_plan_is_reset_and_nothing_else_happens() -> None:
    """Kills ``_run``'s legacy branch (its note, the reset, ``phase``, the early return)."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    put_raw(store, GARBAGE_PATH, json.dumps(_legacy(cutoff=3)).encode())
    store.ops.clear()
    r = await gc_for(store, clocks).run_once()
    assert (r.phase, r.notes) == ("discarded", ["reset a plan in the pre-issue-16 schema"])
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE
    assert stored_manifest(store).oldest_offset == 1
    assert not any(op in ("list", "delete") for op, _ in store.ops)


async def test_the_old_idle_form_is_rewritten_as_rusts() -> None:
    """``{}`` is rewritten as ``Garbage::empty()`` (Rust cannot decode ``{}``); if someone
    moved the file on meanwhile, theirs is read.  Kills ``_load_garbage``'s mutants."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    put_raw(store, GARBAGE_PATH, b"{}")
    c = gc_for(store, clocks)
    g, etag = await c._load_garbage()
    assert g is None and store.data(GARBAGE_PATH) == EMPTY_GARBAGE
    assert etag == store.objects[join(P, GARBAGE_PATH)][1]
    put_raw(store, GARBAGE_PATH, b" {} ")
    theirs = _drop_first(flat_log(10), 2)
    store.before("put", r"gc/GARBAGE$", lambda: put_raw(store, GARBAGE_PATH, theirs.to_bytes()))
    g, etag = await c._load_garbage()
    assert g == theirs and etag == content_etag(theirs.to_bytes())
    # Not normalized: left as it is.
    put_raw(store, GARBAGE_PATH, b"{}")
    assert await c._load_garbage(normalize=False) == (None, content_etag(b"{}"))
    assert store.data(GARBAGE_PATH) == b"{}"
    del store.objects[join(P, GARBAGE_PATH)]
    assert await c._load_garbage() == (None, None)


async def test_a_floor_lost_with_none_in_its_place_is_announced_again_three_times() -> None:
    """Kills ``_phase2``'s retry bound (``attempts > 1``, ``- 1``), its notes, the ``busy``
    phase and ``return None, None``."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    g = await _pending(store, clocks)
    ed = Editor(store)
    for n in (2, 4, 6, 8):
        ed.hooks[n] = drop_floor(store)
    c = gc_for(store, clocks, edit_manifest=ed)
    r = await c.run_once()
    lost = "the pending floor at 6 was retracted or replaced before the cut"
    assert r.phase == "busy"
    assert r.notes == [
        f"{lost}: announced again",
        f"{lost}: announced again",
        f"{lost}: the plan is decided again next pass",
    ]
    assert ed.calls == 6
    assert stored_plan(store) == g and stored_manifest(store).oldest_offset == 1


async def test_a_floor_lost_once_is_announced_again_and_cut() -> None:
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    ed = Editor(store)
    ed.hooks[2] = drop_floor(store)
    r = await gc_for(store, clocks, edit_manifest=ed).run_once()
    assert r.phase == "waiting" and stored_manifest(store).oldest_offset == 6
    assert r.notes == [
        "the pending floor at 6 was retracted or replaced before the cut: announced again"
    ]


async def test_a_floor_replaced_by_another_collector_is_left_to_it() -> None:
    """Kills ``not e.replaced`` → ``e.replaced``."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    ed = Editor(store)
    ed.hooks[2] = drop_floor(store, replace_with=GcFloor(6, "f" * 32))
    r = await gc_for(store, clocks, edit_manifest=ed).run_once()
    assert r.phase == "busy" and ed.calls == 2
    assert r.notes == [
        "the pending floor at 6 was retracted or replaced before the cut: "
        "the plan is decided again next pass"
    ]


async def test_the_floor_is_announced_by_the_collector_before_the_cursors_are_read() -> None:
    """The announcement writes the plan's ``first_to_keep`` and a fresh 32-hex nonce, by the
    collector's writer; a cursor pinning below it afterwards drops the plan (floor cleared,
    file reset), one pinning at it does not.  Kills ``announce``'s mutants, the re-read's
    ``<`` → ``<=``, and ``_discard``'s (``clear``, its note, ``phase``)."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    seen: list[Manifest] = []
    c = gc_for(store, clocks, o=opts(writer_name="gc-9"))
    orig_load = c.cursors.load_all

    async def load_all() -> Any:
        seen.append(stored_manifest(store))
        await set_cursor(store, "reader", 5)
        return await orig_load()

    c.cursors.load_all = load_all  # type: ignore[method-assign]
    g, etag = await c._load_garbage()
    assert g is not None
    r = await c._phase2(GcReport(), g, etag)
    assert r == (None, None)
    announced = seen[0]
    assert announced.gc_floor is not None and announced.gc_floor.offset == 6
    assert re.fullmatch(r"[0-9a-f]{32}", announced.gc_floor.nonce)
    assert announced.writer == "gc-9" and announced.oldest_offset == 1
    after = stored_manifest(store)
    assert after.gc_floor is None and after.oldest_offset == 1 and after.writer == "gc-9"
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE


async def test_a_cursor_pinning_below_after_the_announcement_drops_the_plan() -> None:
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    ed = Editor(store)

    async def pin(at: int) -> None:
        await set_cursor(store, "reader", at)

    ed.hooks[1] = lambda: None
    c = gc_for(store, clocks, edit_manifest=ed)
    orig = c.cursors.load_all
    calls = [0]

    async def load_all() -> Any:
        calls[0] += 1
        if calls[0] == 1:
            await pin(5)
        return await orig()

    c.cursors.load_all = load_all  # type: ignore[method-assign]
    r = await c.run_once()
    assert r.phase == "discarded"
    assert r.notes == ["a cursor now pins 5, below the plan's 6"]
    assert stored_manifest(store).gc_floor is None
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE


async def test_a_cursor_at_the_plans_cut_after_the_announcement_does_not_drop_it() -> None:
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    c = gc_for(store, clocks)
    orig = c.cursors.load_all
    calls = [0]

    async def load_all() -> Any:
        calls[0] += 1
        if calls[0] == 1:
            await set_cursor(store, "reader", 6)
        return await orig()

    c.cursors.load_all = load_all  # type: ignore[method-assign]
    r = await c.run_once()
    assert r.phase == "waiting" and stored_manifest(store).oldest_offset == 6


async def test_a_plan_the_manifest_holds_is_marked_applied_never_discarded() -> None:
    """At phase 2's start, at the announcement, and when a discard finds it: the cut is made,
    so the plan is marked (whatever the cursors say).  Kills the three ``>= first_to_keep``
    tests (→ ``>``), their notes, and ``_discard``'s mark-applied branch."""
    for where in ("start", "announce", "discard"):
        store = MemStore()
        clocks = Clocks(store)
        m = await flat_setup(store)
        g = await _pending(store, clocks)
        cut = g.apply(m, "other")
        ed = Editor(store)
        if where == "start":
            put_manifest(store, cut)
            await set_cursor(store, "reader", 2)
        elif where == "announce":
            ed.hooks[1] = lambda store=store, cut=cut: put_manifest(store, cut)
        else:
            # A pin makes phase 2 discard; the manifest holds the plan by the clear.
            await set_cursor(store, "reader", 2)
            ed.hooks[2] = lambda store=store, cut=cut: put_manifest(store, cut)
        c = gc_for(store, clocks, edit_manifest=ed)
        r = await c.run_once(sweep_orphans=False)
        plan = stored_plan(store)
        assert plan is not None and plan.applied_us is not None, where
        if where == "start":
            assert r.notes == ["the manifest holds the plan already"]
        elif where == "discard":
            assert r.notes == [
                "not discarded (a cursor now pins 2, below the plan's 6): the manifest holds "
                "the plan"
            ]
        else:
            assert r.notes == []
        assert r.phase in ("waiting", "pinned"), (where, r)


async def test_a_cut_made_exactly_at_the_plan_before_the_announcement_is_marked_as_it_is() -> None:
    """Another collector (or Rust) made exactly this cut between phase 2's read and its
    announcement: no floor is written into the cut manifest, and the plan is marked at once,
    the cursors unread (a reader pinning below is no reason to discard a cut that is made).
    Kills ``announce``'s ``>=`` → ``>`` and the test after it (``>=`` → ``>``)."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    g = await _pending(store, clocks)
    cut = g.apply(m, "other")

    async def cut_and_pin() -> None:
        put_manifest(store, cut)
        await set_cursor(store, "reader", 2)

    ed = Editor(store)
    ed.hooks[1] = cut_and_pin
    r = await gc_for(store, clocks, edit_manifest=ed).run_once(sweep_orphans=False)
    assert (r.phase, r.notes) == ("waiting", [])
    assert stored_manifest(store) == cut
    plan = stored_plan(store)
    assert plan is not None and plan.applied_us is not None


async def test_a_discard_clears_the_floor_by_the_collectors_name_and_logs_why(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The clear is the collector's write (its name), and the reason is logged; a manifest that
    holds the plan already keeps whatever floor it has (another collector's next cut).  Kills
    ``clear``'s ``writer=`` and ``>=`` → ``>``, and the warning's mutants (format and
    arguments)."""
    import logging

    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    g = await _pending(store, clocks)
    put_manifest(store, replace(m, gc_floor=GcFloor(6, NONCE)))  # written by "w"
    c = gc_for(store, clocks, opts(writer_name="gc-9"))
    _, etag = await c._load_garbage()
    caplog.set_level(logging.WARNING, logger="wal3.gc")
    r = GcReport()
    assert await c._discard(r, g, etag, "why") == (None, None)
    after = stored_manifest(store)
    assert (after.gc_floor, after.writer) == (None, "gc-9")
    assert [x.getMessage() for x in caplog.records if x.name == "wal3.gc"] == ["logs/c: why"]
    assert (r.phase, r.notes) == ("discarded", ["why"])
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE
    # Cut at the plan already, another collector's floor above it: left as it is.
    store2 = MemStore()
    clocks2 = Clocks(store2)
    m2 = await flat_setup(store2)
    g2 = await _pending(store2, clocks2)
    held = replace(g2.apply(m2, "other"), gc_floor=GcFloor(9, NONCE))
    put_manifest(store2, held)
    c2 = gc_for(store2, clocks2)
    _, etag2 = await c2._load_garbage()
    got, _ = await c2._discard(GcReport(), g2, etag2, "why")
    assert got is not None and got.applied_us is not None
    assert stored_manifest(store2) == held


async def test_a_plan_that_fails_verification_is_reset_deleting_nothing() -> None:
    """Kills phase 2's ``except GarbageRejected`` (the note's prefix) and ``_discard``'s
    reset."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    bad = replace(_drop_first(m, 3), setsum_to_discard=S[0])
    put_raw(store, GARBAGE_PATH, bad.to_bytes())
    store.ops.clear()
    r = await gc_for(store, clocks).run_once(sweep_orphans=False)
    assert r.phase == "discarded"
    assert r.notes == [
        "discarded garbage: garbage does not balance (or is stale): what it removes "
        "does not sum to its setsum_to_discard"
    ]
    assert store.data(GARBAGE_PATH) == EMPTY_GARBAGE and store.deleted() == []
    assert stored_manifest(store) == m


async def test_a_cut_refused_at_the_edit_is_discarded() -> None:
    """A roll reaching past the verified prefix at the cut: refused, the plan dropped and the
    floor cleared.  Kills the cut's ``except GarbageRejected``."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    await _pending(store, clocks)
    ed = Editor(store)

    def roll() -> None:
        cur = stored_manifest(store)
        f = cur.fragments
        r6 = snap(*f[:6])
        put_snapshots(store, r6)
        put_manifest(store, replace(cur, snapshots=(r6.to_pointer(),), fragments=f[6:]))

    ed.hooks[2] = roll
    r = await gc_for(store, clocks, edit_manifest=ed).run_once(sweep_orphans=False)
    assert r.phase == "discarded"
    assert r.notes == [
        "discarded garbage: the log's oldest pointers changed since the plan was verified"
    ]
    assert stored_manifest(store).gc_floor is None
    del m


async def test_the_new_snapshots_are_installed_and_checked_before_the_cut() -> None:
    """Kills ``_install``'s mutants: the object written, read back, compared."""
    store = MemStore()
    clocks = Clocks(store)
    f, a, b, _ = _tree(store)
    m = manifest([a.to_pointer(), b.to_pointer()], f[4:])
    put_manifest(store, m)
    await set_cursor(store, COMPACTION, 2)
    c = gc_for(store, clocks)
    g, _ = await c._phase1(GcReport(), None)
    assert g is not None and len(g.snapshots_to_make) == 1
    a2 = g.snapshots_to_make[0]
    # Phase 1 stored it already; an honest cut finds it.
    assert store.data(a2.path) == a2.to_bytes()
    del store.objects[join(P, a2.path)]
    r = await c.run_once(sweep_orphans=False)
    assert r.phase == "waiting" and store.data(a2.path) == a2.to_bytes()
    # A corrupt object at that path appearing after the proof: refused.
    store2 = MemStore()
    _tree(store2)
    put_manifest(store2, m)
    await set_cursor(store2, COMPACTION, 2)
    c2 = gc_for(store2, Clocks(store2))
    g2, _ = await c2._phase1(GcReport(), None)
    del store2.objects[join(P, a2.path)]
    ed = Editor(store2)
    ed.hooks[1] = lambda: put_raw(store2, a2.path, b"{}")
    c2 = gc_for(store2, Clocks(store2), edit_manifest=ed)
    r = await c2.run_once(sweep_orphans=False)
    assert r.phase == "discarded"
    assert r.notes == [f"discarded garbage: {a2.path} in the store is not the snapshot verified"]
    del g2


async def test_phase_two_and_three_need_the_log() -> None:
    """Kills the ``loaded is None`` mutants of phases 2 and 3 and their text."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    g = await _pending(store, clocks)
    del store.objects[join(P, MANIFEST_PATH)]
    with pytest.raises(GarbageRejected) as e:
        await gc_for(store, clocks).run_once()
    assert str(e.value) == "no log at logs/c"
    put_raw(store, GARBAGE_PATH, replace(g, applied_us=5).to_bytes())
    with pytest.raises(GarbageRejected) as e:
        await gc_for(store, clocks).run_once()
    assert str(e.value) == "no log at logs/c"
    del m


async def test_a_plan_marked_applied_that_the_manifest_does_not_hold_resumes_as_pending() -> None:
    """Kills ``_phase3``'s ``oldest_offset < first_to_keep`` branch: its note, the pending
    rewrite (``applied_us=None``) and phase 2 running on it."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    g = await _pending(store, clocks)
    put_raw(store, GARBAGE_PATH, replace(g, applied_us=1).to_bytes())
    await set_cursor(store, "reader", 3)
    r = await gc_for(store, clocks).run_once(sweep_orphans=False)
    assert r.notes[0] == "the plan is marked applied but the manifest holds it: resumed as pending"
    assert r.notes[1:] == ["a cursor now pins 3, below the plan's 6"]
    assert r.phase == "discarded" and store.data(GARBAGE_PATH) == EMPTY_GARBAGE


async def test_a_plan_resumed_as_pending_stays_pending_when_phase_two_is_busy() -> None:
    """The file is rewritten as pending (``applied_us`` cleared) before phase 2 runs, so a
    phase 2 that ends busy leaves exactly the pending plan.  Kills the rewrite's mutants
    (``applied_us`` kept, the file reset instead)."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    g = await _pending(store, clocks)
    put_raw(store, GARBAGE_PATH, replace(g, applied_us=1).to_bytes())
    ed = Editor(store)
    ed.hooks[2] = drop_floor(store, replace_with=GcFloor(6, "f" * 32))
    r = await gc_for(store, clocks, edit_manifest=ed).run_once(sweep_orphans=False)
    assert r.phase == "busy"
    assert stored_plan(store) == g


# ------------------------------------------------------------------ phase 3: what is deleted


async def _applied_tree_plan(store: MemStore, clocks: Clocks) -> tuple[Garbage, Snapshot, Snapshot]:
    """Root ``[A, B, f5, f6]`` cut at 4 (A whole, B split), applied and a grace old."""
    f, a, b, _ = _tree(store)
    put_manifest(store, manifest([a.to_pointer(), b.to_pointer()], f[4:6]))
    put_fragments(store, range(1, 7))
    await set_cursor(store, COMPACTION, 4)
    c = gc_for(store, clocks, opts(max_fraction=1.0))
    assert (await c.run_once()).phase == "waiting"
    clocks.advance(60)
    g = stored_plan(store)
    assert g is not None
    return g, a, b


async def test_phase_three_deletes_the_dropped_snapshots_and_fragments() -> None:
    """Kills the snapshot half of ``_phase3`` (``names``' filters, ``snapshots_deleted``) and
    ``_starting_below``'s (``start < cut``, the chunks, the ``None`` filter)."""
    store = MemStore()
    clocks = Clocks(store)
    g, a, b = await _applied_tree_plan(store, clocks)
    store.ops.clear()
    r = await gc_for(store, clocks, opts(max_fraction=1.0, delete_batch=0)).run_once(
        sweep_orphans=False
    )
    assert (r.phase, r.fragments_deleted, r.snapshots_deleted) == ("done", 3, 2)
    assert store.deleted() == [
        frag_key(1),
        frag_key(2),
        frag_key(3),
        join(P, a.path),
        join(P, b.path),
    ]
    assert g.snapshot_for_root is not None and store.has(g.snapshot_for_root.path)


async def test_phase_three_deletes_only_what_nothing_references() -> None:
    """A plan (anyone's) listing live snapshots, non-snapshot paths, snapshots at or above the
    cut, unreadable or missing ones, and fragments still live: only the dead ones below the cut
    go, with a note for each kind kept.  Kills the referenced checks' mutants and notes,
    ``is_snapshot_path``, ``first_offset``'s branches and notes, and ``start < cut`` → ``<=``
    (a snapshot starting exactly at the cut stays)."""
    store = MemStore()
    clocks = Clocks(store)
    g, a, b = await _applied_tree_plan(store, clocks)
    assert g.snapshot_for_root is not None
    live = g.snapshot_for_root
    f = chain(8)
    high = snap(f[5])  # starts at 6, above the cut at 4
    at_cut = snap(f[3], f[4])  # starts at the cut: a writer's upload, maybe
    junk = sptr(S[0], 1, 2)  # its object is unreadable
    missing = sptr(S[1], 1, 2)  # no object at all
    put_snapshots(store, high, at_cut)
    put_raw(store, junk.path, b"not json")
    evil = SnapshotPointer(S[2], MANIFEST_PATH, 1, 1, 2, 1)
    forged = replace(
        g,
        snapshots_to_drop=(
            *g.snapshots_to_drop,
            live,
            high.to_pointer(),
            at_cut.to_pointer(),
            junk,
            missing,
            evil,
        ),
        snapshots_to_make=(),
        fragments_to_drop_limit=5,  # claims fragment 4, which is live
    )
    put_raw(store, GARBAGE_PATH, forged.to_bytes())
    store.set_time(GARBAGE_PATH, store.now - 100)
    r = await gc_for(store, Clocks(store), opts(max_fraction=1.0)).run_once(sweep_orphans=False)
    assert r.phase == "done"
    assert r.notes == [
        "a fragment listed for deletion is still referenced: kept",
        "1 snapshot(s) listed for deletion are still referenced: kept",
        f"unreadable snapshot {junk.path} left in place",
    ]
    assert (r.fragments_deleted, r.snapshots_deleted) == (3, 2)
    for p in (live.path, high.path, at_cut.path, junk.path, MANIFEST_PATH):
        assert store.has(p), p
    assert not store.has(a.path) and not store.has(b.path)
    assert store.has(fragment_path(4))


async def test_phase_three_deletes_no_fragment_past_its_plan_though_the_log_moved_on() -> None:
    """Fragments a later cut unlinked (another collector's, Rust's) are that cut's to delete
    after its own grace: phase 3 stops at its plan's ``fragments_to_drop_limit`` even when the
    live range now starts past it.  Kills ``upto`` without ``first_seq_to_keep``."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    c = gc_for(store, clocks)
    assert (await c.run_once()).phase == "waiting"
    clocks.advance(60)
    cur = stored_manifest(store)
    later = Garbage((), (), None, 6, 8, Setsum.sum(x.setsum for x in cur.fragments[:2]), 8)
    put_manifest(store, later.apply(cur, "rust"))  # cut just now: 6 and 7 unlinked
    await set_cursor(store, COMPACTION, 8)
    r = await c.run_once(sweep_orphans=False)
    assert (r.phase, r.fragments_deleted) == ("done", 5)
    assert [s for s in range(1, 11) if store.has(fragment_path(s))] == list(range(6, 11))


async def test_deletes_are_batched_at_the_configured_rate() -> None:
    """``_delete``: batches of ``delete_batch`` (at least one), a pause of what the batch may
    take at ``deletes_per_second`` less what it took, none after the last.  Kills every
    ``_delete`` mutant."""
    import asyncio as aio
    import time as tm

    store = MemStore()
    clocks = Clocks(store)
    sleeps: list[float] = []
    now = [0.0]

    async def sleep(s: float) -> None:
        sleeps.append(round(s, 9))

    def mono() -> float:
        now[0] += 0.01  # each reading 10 ms on
        return now[0]

    saved_aio, saved_time = gcmod.asyncio, gcmod.time
    gcmod.asyncio = SimpleNamespace(sleep=sleep, gather=aio.gather)  # type: ignore[assignment]
    gcmod.time = SimpleNamespace(monotonic=mono, time=tm.time, time_ns=tm.time_ns)  # type: ignore[assignment]
    try:
        keys = [f"k{i}" for i in range(5)]
        for k in keys:
            store.objects[k] = (b"", "", 0.0)
        c = gc_for(store, clocks, opts(delete_batch=2, deletes_per_second=10.0))
        assert await c._delete(keys) == 5
        assert store.deleted() == keys and not any(k in store.objects for k in keys)
        assert sleeps == [0.19, 0.19]  # 2 / 10 s per batch, less the 10 ms it took
        sleeps.clear()
        one = gc_for(store, clocks, opts(delete_batch=0, deletes_per_second=1.0))
        assert await one._delete(["a", "b"]) == 2
        assert sleeps == [0.99]
        sleeps.clear()
        fast = gc_for(store, clocks, opts(delete_batch=2, deletes_per_second=1000.0))
        assert await fast._delete(keys) == 5 and sleeps == []
        assert await fast._delete([]) == 0
    finally:
        gcmod.asyncio, gcmod.time = saved_aio, saved_time


# ------------------------------------------------------------------------ the orphan sweep


async def _collected_log(store: MemStore, cursor: int = 6) -> Manifest:
    """A log already collected to offset 6 (fragments 6..10 live), orphans 1..5 still
    stored and a day old, no plan."""
    m = _drop_first(flat_log(10), 5).apply(flat_log(10), "w")
    put_manifest(store, m)
    put_fragments(store, range(1, 11))
    await set_cursor(store, COMPACTION, cursor)
    for s in range(1, 6):
        store.set_time(fragment_path(s), store.now - 86_400)
    return m


async def test_the_sweep_waits_a_grace_of_its_own_observation_then_deletes_below_it() -> None:
    """Kills the sweep's waiting branch (its note), ``_observe``/``_observed_floor``'s aging
    (``>=`` grace), the marker's first write, and the fragment scan (``seq >= swept_seq``'s
    ``break``, ``orphans_deleted``)."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    c = gc_for(store, clocks)
    r = await c.run_once()
    assert (r.phase, r.orphans_deleted) == ("idle", 0)
    assert r.notes == ["the live range has not been seen for a grace yet: the sweep waits"]
    assert json.loads(store.data(OLDEST_PATH)) == {"oldest_offset": 6, "first_live_seq_no": 6}
    clocks.advance(59)
    assert (await c.run_once()).orphans_deleted == 0
    clocks.advance(1)
    store.ops.clear()
    r = await c.run_once()
    assert (r.orphans_deleted, r.notes) == (5, [])
    assert store.deleted() == [frag_key(s) for s in range(1, 6)]
    assert all(store.has(fragment_path(s)) for s in range(6, 11))


async def test_the_sweep_keeps_what_is_recent_or_in_the_idempotency_window() -> None:
    """An orphan written within the grace stays; within the retained window it stays until it
    is ``retain_s`` old.  Kills the horizon mutants (``-`` → ``+``, ``max``'s arguments,
    ``<`` → ``<=``, ``and``/``or``, ``retain_from``)."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    store.set_time(fragment_path(5), store.now - 30)  # within the grace
    store.set_time(fragment_path(4), store.now - 200)  # past the grace, within retain_s
    store.set_time(fragment_path(3), store.now - 60)  # exactly a grace old
    c = gc_for(store, clocks, opts(retain_fragments=7, retain_s=300.0))
    await c.run_once()
    clocks.advance(60)
    r = await c.run_once()
    # retain_from = 11 - 7 = 4: 4 is in the window (200 + 60 s < 300 + ...), 1..3 are not.
    assert r.orphans_deleted == 3
    assert [s for s in range(1, 6) if store.has(fragment_path(s))] == [4, 5]


async def test_the_sweep_never_runs_beside_a_plan_or_below_a_pin() -> None:
    """Kills the sweep's guards: a plan in ``gc/GARBAGE`` (before and after the manifest
    read), no log, a cursor pinning below the oldest offset (``<`` → ``<=``, its note)."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    put_raw(store, GARBAGE_PATH, _drop_first(flat_log(10), 2).to_bytes())
    r = GcReport()
    await c._sweep_orphans(r, None)
    assert (r.orphans_deleted, r.notes) == (0, [])
    put_raw(store, GARBAGE_PATH, EMPTY_GARBAGE)
    store.before(
        "get",
        r"manifest/MANIFEST$",
        lambda: put_raw(store, GARBAGE_PATH, _drop_first(flat_log(10), 2).to_bytes()),
    )
    r = GcReport()
    await c._sweep_orphans(r, None)
    assert (r.orphans_deleted, r.notes) == (0, [])
    put_raw(store, GARBAGE_PATH, EMPTY_GARBAGE)
    await set_cursor(store, "reader", 5)
    r = GcReport()
    await c._sweep_orphans(r, None)
    assert r.notes == ["a cursor pins collected offsets: the sweep waits"]
    await set_cursor(store, "reader", 6)
    r = GcReport()
    await c._sweep_orphans(r, None)
    assert r.orphans_deleted == 5
    other = MemStore()
    r = GcReport()
    await gc_for(other, Clocks(other))._sweep_orphans(r, None)
    assert (r.notes, other.deleted()) == ([], [])


async def test_the_sweep_takes_unreferenced_snapshots_wholly_below_the_live_range() -> None:
    """Kills the snapshot scan's mutants: live ones, recent ones, those reaching the live
    range, unreadable (noted) and vanished ones, and names that are not this log's."""
    store = MemStore()
    clocks = Clocks(store)
    m = await _collected_log(store)
    f = chain(10)
    dead = snap(f[0], f[1])
    edge = snap(f[4])  # ends at 6: wholly below the live range
    reach = snap(f[5])  # [6, 7): not below it
    recent = snap(f[2])
    live = snap(f[5], f[6])
    put_snapshots(store, dead, edge, reach, recent, live)
    put_manifest(store, replace(m, snapshots=(live.to_pointer(),), fragments=m.fragments[2:]))
    put_raw(store, "snapshot/SNAPSHOT." + "1" * 64, b"junk")
    put_raw(store, "snapshot/other", b"x")
    for s in (dead, edge, reach, live):
        store.set_time(s.path, store.now - 86_400)
    store.set_time("snapshot/SNAPSHOT." + "1" * 64, store.now - 86_400)
    store.set_time("snapshot/other", store.now - 86_400)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    store.set_time(recent.path, store.now - 59)
    r = await c.run_once()
    assert f"unreadable snapshot snapshot/SNAPSHOT.{'1' * 64} left in place" in r.notes
    assert not store.has(dead.path) and not store.has(edge.path)
    for s in (reach, recent, live):
        assert store.has(s.path)
    assert store.has("snapshot/other")
    assert r.orphans_deleted == 5 + 2


async def test_the_sweep_scans_at_most_its_limit() -> None:
    """Kills ``scanned > orphan_scan_limit`` → ``>=`` and the counter's mutants."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    c = gc_for(store, clocks, opts(orphan_scan_limit=3))
    await c.run_once()
    clocks.advance(60)
    r = await c.run_once()
    assert r.orphans_deleted == 3
    assert [s for s in range(1, 6) if store.has(fragment_path(s))] == [4, 5]


async def test_a_fresh_process_sweeps_by_the_aged_marker_capped_by_the_manifest() -> None:
    """``gc/OLDEST`` a grace old on the store's clock (less the slack) lets a new process
    sweep below it, never past what the manifest shows; a younger one, a malformed one, one
    rewritten between head and get do not.  Kills ``_marked_floor``'s mutants."""
    store = MemStore()
    await _collected_log(store)
    put_raw(store, OLDEST_PATH, json.dumps({"oldest_offset": 4, "first_live_seq_no": 4}).encode())
    store.set_time(OLDEST_PATH, store.now - 60.5)
    r = await gc_for(store, Clocks(store)).run_once()
    assert r.orphans_deleted == 0  # 59.5 s by the store's clock: not a grace yet
    store.set_time(OLDEST_PATH, store.now - 61)
    r = await gc_for(store, Clocks(store)).run_once()
    assert r.orphans_deleted == 3  # below 4 only
    assert json.loads(store.data(OLDEST_PATH)) == {"oldest_offset": 6, "first_live_seq_no": 6}
    # A marker claiming more than the manifest shows is capped by it.
    store2 = MemStore()
    await _collected_log(store2)
    put_raw(store2, OLDEST_PATH, json.dumps({"oldest_offset": 9, "first_live_seq_no": 9}).encode())
    store2.set_time(OLDEST_PATH, store2.now - 100)
    r = await gc_for(store2, Clocks(store2)).run_once()
    assert r.orphans_deleted == 5 and store2.has(fragment_path(6))
    # Malformed: rewritten with what is seen, and nothing swept.
    for bad in (b"[]", b"{", json.dumps({"oldest_offset": -1, "first_live_seq_no": 1}).encode()):
        store3 = MemStore()
        await _collected_log(store3)
        put_raw(store3, OLDEST_PATH, bad)
        store3.set_time(OLDEST_PATH, store3.now - 100)
        r = await gc_for(store3, Clocks(store3)).run_once()
        assert r.orphans_deleted == 0, bad
        assert json.loads(store3.data(OLDEST_PATH)) == {
            "oldest_offset": 6,
            "first_live_seq_no": 6,
        }
    # Rewritten between its head and its get: not used this pass.
    store4 = MemStore()
    await _collected_log(store4)
    put_raw(store4, OLDEST_PATH, json.dumps({"oldest_offset": 6, "first_live_seq_no": 6}).encode())
    store4.set_time(OLDEST_PATH, store4.now - 100)
    store4.before(
        "get",
        r"gc/OLDEST$",
        lambda: put_raw(store4, OLDEST_PATH, b'{"oldest_offset":5,"first_live_seq_no":5}'),
    )
    r = await gc_for(store4, Clocks(store4)).run_once()
    assert r.orphans_deleted == 0


async def test_a_smaller_live_range_is_another_log_and_forgets_the_old_one() -> None:
    """``_observe``: history is per log life; a live range that shrank clears it, and only a
    change is recorded.  Kills the ``_observe`` mutants (``<`` on either value, ``or``,
    ``clear``, ``append``) and ``_observed_floor``'s (the newest aged observation kept)."""
    store = MemStore()
    clocks = Clocks(store)
    m = await _collected_log(store)
    c = gc_for(store, clocks)
    assert await c._observe(m) == (6, 6)
    assert await c._observe(m) == (6, 6)
    clocks.advance(60)
    assert c._observed_floor() == (6, 6)
    smaller = flat_log(3)
    assert await c._observe(smaller) == (1, 1)
    assert c._observed_floor() is None
    clocks.advance(60)
    assert c._observed_floor() == (1, 1)
    later = _drop_first(flat_log(3), 1).apply(flat_log(3), "w")
    assert await c._observe(later) == (2, 2)
    assert c._observed_floor() == (1, 1)
    clocks.advance(60)
    assert c._observed_floor() == (2, 2)
    # Another monotonic clock has seen nothing.
    assert gc_for(store, Clocks(store))._observed_floor() is None


async def test_the_sweep_keeps_an_orphan_exactly_a_grace_or_retain_s_old() -> None:
    """The horizons are exclusive: an object written exactly a grace ago (a fragment, a
    snapshot), or a retained fragment exactly ``retain_s`` old, may still be read by a reader of
    the manifest that unlinked it.  Kills ``<`` → ``<=`` on both fragment horizons and the
    snapshot's ``>=`` → ``>``."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    c = gc_for(store, clocks, opts(retain_fragments=8, retain_s=300.0))
    await c.run_once()
    clocks.advance(60)
    dead = snap(*chain(2))
    put_snapshots(store, dead)
    store.set_time(dead.path, store.now - 60)
    # retain_from = 11 - 8 = 3: 1 is below the window, 4 in it.
    store.set_time(fragment_path(1), store.now - 60)
    store.set_time(fragment_path(4), store.now - 300)
    r = await c.run_once()
    assert r.orphans_deleted == 3
    assert [s for s in range(1, 6) if store.has(fragment_path(s))] == [1, 4]
    assert store.has(dead.path)


async def test_the_snapshot_scan_passes_over_what_it_keeps_to_what_follows() -> None:
    """A name under ``log/`` that is not a fragment's, one under ``snapshot/`` that is not a
    snapshot's, a recent snapshot and one that vanished before its read are passed over, not
    the end of the scan.  Kills the four ``continue`` → ``break``."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    f = chain(10)
    recent, vanishing, *dead = sorted((snap(f[i]) for i in range(5)), key=lambda s: s.path)
    put_snapshots(store, recent, vanishing, *dead)
    put_raw(store, "snapshot/0", b"x")  # lists before every snapshot name
    put_raw(store, "log/0", b"x")  # lists before every fragment name
    for p in ("log/0", "snapshot/0", vanishing.path, *(s.path for s in dead)):
        store.set_time(p, store.now - 86_400)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    store.set_time(recent.path, store.now - 30)
    store.before(
        "get", re.escape(vanishing.path) + "$", lambda: store.objects.pop(join(P, vanishing.path))
    )
    r = await c.run_once()
    assert r.orphans_deleted == 5 + 3
    assert not any(store.has(s.path) for s in dead)
    assert store.has(recent.path) and store.has("snapshot/0") and store.has("log/0")


async def test_a_log_at_the_store_root_is_swept_too() -> None:
    """With an empty prefix keys are the log's paths themselves.  Kills both ``if
    self._prefix`` → ``or True`` (the first character of every key cut off)."""
    store = MemStore()
    clocks = Clocks(store)
    m = _drop_first(flat_log(10), 5).apply(flat_log(10), "w")
    put_manifest(store, m, "")
    put_fragments(store, range(1, 11), "")
    await set_cursor(store, COMPACTION, 6, "")
    dead = snap(*chain(2))
    put_snapshots(store, dead, prefix="")
    for p in (*(fragment_path(s) for s in range(1, 6)), dead.path):
        store.set_time(p, store.now - 86_400, "")
    c = GarbageCollector(store, "", opts(), clock=clocks.wall, monotonic=clocks.mono)
    await c.run_once()
    clocks.advance(60)
    r = await c.run_once()
    assert r.orphans_deleted == 6
    assert [s for s in range(1, 11) if store.has(fragment_path(s), "")] == list(range(6, 11))
    assert not store.has(dead.path, "")


async def test_the_sweep_reads_every_live_snapshot_from_the_store() -> None:
    """A live snapshot off the first leaf's path is in no cache yet when the sweep lists what is
    live.  Kills ``live_snapshot_paths(None, …)``."""
    store = MemStore()
    clocks = Clocks(store)
    m = await _collected_log(store)
    f = m.fragments
    s1, s2 = snap(f[0], f[1]), snap(f[2], f[3])
    put_snapshots(store, s1, s2)
    put_manifest(store, replace(m, snapshots=(s1.to_pointer(), s2.to_pointer()), fragments=f[4:]))
    for s in (s1, s2):
        store.set_time(s.path, store.now - 86_400)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    r = await c.run_once()
    assert r.orphans_deleted == 5 and store.has(s1.path) and store.has(s2.path)


async def test_the_sweeps_second_look_at_the_plan_file_writes_nothing() -> None:
    """Kills the second ``_load_garbage(normalize=False)`` → ``True``: an old idle form written
    meanwhile is the next pass's to rewrite."""
    store = MemStore()
    clocks = Clocks(store)
    await _collected_log(store)
    c = gc_for(store, clocks)
    await c.run_once()
    clocks.advance(60)
    store.before("get", r"manifest/MANIFEST$", lambda: put_raw(store, GARBAGE_PATH, b"{}"))
    r = GcReport()
    await c._sweep_orphans(r, None)
    assert store.data(GARBAGE_PATH) == b"{}" and r.orphans_deleted == 5


def _two_record_log() -> tuple[list[FragmentPointer], Manifest]:
    """Ten two-record fragments (seq s at offset 2s - 1), not collected: once cut, its oldest
    offset and first live sequence number differ."""
    f = [frag(s, 2 * s - 1, 2) for s in range(1, 11)]
    return f, manifest((), f)


async def test_the_sweep_goes_to_the_higher_of_the_observed_and_the_marked_bounds() -> None:
    """This process's aged observation and an aged ``gc/OLDEST`` marker each say the live range
    started at least there a grace ago: the sweep goes up to the higher of the two, offset by
    offset and sequence number by sequence number (on a log where they differ), capped by the
    manifest, and rewrites the marker with what the manifest shows; once the observation is the
    manifest's own, the marker is not consulted at all.  Kills the merge's mutants (``or`` →
    ``and``, ``is not None``, ``==``, ``or True``, ``max``'s arguments and indices),
    ``swept_offset``'s indices, ``_marked_floor``'s returned and written indices, and
    ``_observed_floor``'s returned index."""
    for observed, marked in ((2, 4), (4, 2)):  # fragments cut in each earlier state seen
        store = MemStore()
        clocks = Clocks(store)
        f, full = _two_record_log()
        m = _drop_first(full, 5).apply(full, "w")  # oldest offset 11, first live seq 6
        put_manifest(store, m)
        put_fragments(store, range(1, 11))
        await set_cursor(store, COMPACTION, 11)
        c = gc_for(store, clocks)
        await c._observe(_drop_first(full, observed).apply(full, "w"))
        o = _drop_first(full, marked).apply(full, "w")
        body = {"oldest_offset": o.oldest_offset, "first_live_seq_no": o.fragments[0].seq_no}
        put_raw(store, OLDEST_PATH, json.dumps(body).encode())
        snaps = [snap(f[0], f[1]), snap(f[2]), snap(f[3]), snap(f[4])]  # limits 5, 7, 9, 11
        put_snapshots(store, *snaps)
        for p in (*(fragment_path(s) for s in range(1, 6)), *(s.path for s in snaps)):
            store.set_time(p, store.now - 86_400)
        clocks.advance(60)
        store.set_time(OLDEST_PATH, store.now - 100)
        r = GcReport()
        await c._sweep_orphans(r, None)
        # Both bounds are (9, 5): fragments below 5, snapshots ending at or below 9.
        assert [s for s in range(1, 11) if store.has(fragment_path(s))] == list(range(5, 11))
        assert [store.has(s.path) for s in snaps] == [False, False, False, True], observed
        assert r.orphans_deleted == 4 + 3
        assert json.loads(store.data(OLDEST_PATH)) == {"oldest_offset": 11, "first_live_seq_no": 6}
        clocks.advance(60)
        del store.objects[join(P, OLDEST_PATH)]
        await c._sweep_orphans(GcReport(), None)
        assert not store.has(OLDEST_PATH)


async def test_the_observed_range_compares_each_value_with_its_own() -> None:
    """On a log whose oldest offset and first live sequence number differ: the same range seen
    again is one observation, aging from the first sight; another log at the prefix with a lower
    oldest offset (the same first sequence number) forgets it.  Kills ``_observe``'s index and
    ``or`` → ``and`` mutants and ``_observed_floor``'s returned index."""
    store = MemStore()
    clocks = Clocks(store)
    c = gc_for(store, clocks)
    _, full = _two_record_log()
    m = _drop_first(full, 5).apply(full, "w")
    assert await c._observe(m) == (11, 6)
    clocks.advance(60)
    assert await c._observe(m) == (11, 6)
    assert len(gcmod._OBSERVED[store][(P, id(clocks.mono))][1]) == 1
    assert c._observed_floor() == (11, 6)
    other = _drop_first(flat_log(10), 5).apply(flat_log(10), "w")
    assert await c._observe(other) == (6, 6)
    assert c._observed_floor() is None


# -------------------------------------------------------------------------------- pin_cursor


async def _pin(
    store: MemStore, offset: int, name: str = "reader", witness: str | None = None
) -> Any:
    return await pin_cursor(store, P, CursorStore(store, P, "r"), name, offset, witness)


async def test_a_pin_at_or_above_everything_collected_is_accepted() -> None:
    """Kills ``pin_cursor``'s acceptance (``offset >= floor`` → ``>``) and the cursor it
    writes."""
    store = MemStore()
    await _collected_log(store)
    w = await _pin(store, 6)
    assert w.cursor.offset == 6
    got = await CursorStore(store, P, "t").load("reader")
    assert got is not None and got.cursor.offset == 6 and got.etag == w.etag


async def test_a_pin_below_a_collected_or_planned_offset_is_undone_and_purged() -> None:
    """Below the manifest's oldest offset, or below a plan pending in ``gc/GARBAGE``: 410, and
    the cursor written is undone (deleted when created, restored when moved).  Kills the
    plan and manifest floor mutants, ``max``'s, the undo's and ``LogPurged``'s arguments."""
    store = MemStore()
    await _collected_log(store)
    with pytest.raises(LogPurged) as e:
        await _pin(store, 5)
    assert (e.value.offset, e.value.oldest_offset) == (5, 6)
    assert await CursorStore(store, P, "t").load("reader") is None
    # A plan pending past the manifest's oldest offset.
    put_raw(store, GARBAGE_PATH, _drop_first(flat_log(10), 7).to_bytes())
    with pytest.raises(LogPurged) as e:
        await _pin(store, 7)
    assert (e.value.offset, e.value.oldest_offset) == (7, 8)
    w = await _pin(store, 8)
    with pytest.raises(LogPurged):
        await _pin(store, 7, witness=w.etag)
    back = await CursorStore(store, P, "t").load("reader")
    assert back is not None and back.cursor.offset == 8
    # An idle file is no floor.
    put_raw(store, GARBAGE_PATH, EMPTY_GARBAGE)
    assert (await _pin(store, 6, name="other")).cursor.offset == 6


async def test_a_pin_retracts_a_pending_floor_above_it() -> None:
    """A floor above the pin is removed from the stored manifest (compare-and-swap); one at
    or below it is left.  Kills the retraction test's mutants (``and``/``or``, ``>`` →
    ``>=``, ``offset >= floor``), and the put's."""
    store = MemStore()
    m = await _collected_log(store)
    put_manifest(store, replace(m, gc_floor=GcFloor(9, NONCE)))
    assert (await _pin(store, 8)).cursor.offset == 8
    assert stored_manifest(store) == m
    put_manifest(store, replace(m, gc_floor=GcFloor(8, NONCE)))
    assert (await _pin(store, 8, name="second")).cursor.offset == 8
    held = stored_manifest(store).gc_floor
    assert held is not None and held.offset == 8
    # Below the oldest offset nothing is retracted: the pin is refused anyway.
    put_manifest(store, replace(m, gc_floor=GcFloor(9, NONCE)))
    with pytest.raises(LogPurged):
        await _pin(store, 5, name="third")
    held = stored_manifest(store).gc_floor
    assert held is not None and held.offset == 9


async def test_a_retraction_that_keeps_losing_gives_the_pin_up() -> None:
    """Eight lost compare-and-swaps: 410 at ``offset + 1``; one lost, then won: accepted.
    Kills the retry loop's mutants (``continue`` → ``break``, the ``else`` floor)."""
    store = MemStore()
    m = await _collected_log(store)
    floored = replace(m, gc_floor=GcFloor(9, NONCE))
    put_manifest(store, floored)
    for _ in range(8):
        store.refuse("put", r"manifest/MANIFEST$", PreconditionFailed("manifest"))
    with pytest.raises(LogPurged) as e:
        await _pin(store, 8)
    assert (e.value.offset, e.value.oldest_offset) == (8, 9)
    assert await CursorStore(store, P, "t").load("reader") is None
    store.fail.clear()
    for _ in range(7):
        store.refuse("put", r"manifest/MANIFEST$", PreconditionFailed("manifest"))
    assert (await _pin(store, 8)).cursor.offset == 8
    assert stored_manifest(store).gc_floor is None


async def test_a_pin_on_a_log_without_manifest_goes_by_the_plan() -> None:
    """Kills the ``loaded is None`` → ``break`` mutants."""
    store = MemStore()
    put_raw(store, GARBAGE_PATH, _drop_first(flat_log(10), 3).to_bytes())
    with pytest.raises(LogPurged) as e:
        await _pin(store, 3)
    assert e.value.oldest_offset == 4
    assert (await _pin(store, 4)).cursor.offset == 4


def put_cursor_raw(store: MemStore, name: str, offset: int) -> None:
    """Another writer's cursor, written behind the pin's back."""
    put_raw(store, f"cursor/{name}.json", Cursor(offset, 1, "other").to_bytes())


async def test_a_pin_writes_its_cursor_by_create_or_compare_and_swap() -> None:
    """Creating (no witness) a cursor that exists, or moving one by a stale witness, is a
    conflict that leaves the cursor as it was; a create does not read the cursor first (a
    corrupt one is a conflict too).  Kills the write's mutants (``init`` → ``save`` without a
    witness, ``save``'s witness → None) and ``before`` read always."""
    store = MemStore()
    await _collected_log(store)
    w = await _pin(store, 7)
    with pytest.raises(CursorConflict):
        await _pin(store, 8)
    with pytest.raises(CursorConflict):
        await _pin(store, 9, witness="stale")
    got = await CursorStore(store, P, "t").load("reader")
    assert got is not None and (got.cursor.offset, got.etag) == (7, w.etag)
    put_raw(store, "cursor/junk.json", b"not json")
    with pytest.raises(CursorConflict):
        await _pin(store, 7, name="junk")


async def test_a_pin_reads_the_log_at_its_prefix_less_only_slashes() -> None:
    """Kills ``prefix.strip(None)`` and ``strip("XX/XX")``."""
    for given, prefix in (("/Xl/", "Xl"), (" l", " l")):
        store = MemStore()
        put_manifest(store, _drop_first(flat_log(10), 5).apply(flat_log(10), "w"), prefix)
        with pytest.raises(LogPurged):
            await pin_cursor(store, given, CursorStore(store, prefix, "r"), "reader", 5, None)


async def test_a_pin_exactly_at_the_oldest_offset_retracts_a_floor_above_it() -> None:
    """The pin is accepted, so the floor above it must go (else that cut passes an accepted
    pin).  Kills the retraction's ``offset >= floor`` → ``>``."""
    store = MemStore()
    m = await _collected_log(store)
    put_manifest(store, replace(m, gc_floor=GcFloor(9, NONCE)))
    assert (await _pin(store, 6)).cursor.offset == 6
    assert stored_manifest(store) == m


async def test_a_retraction_is_a_compare_and_swap_on_the_manifest_it_read() -> None:
    """An append landing between the pin's read and its retraction is kept: the retraction
    loses, reads again, and retracts from the new manifest.  Kills the put's ``if_match``
    mutants (None, absent)."""
    store = MemStore()
    m = await _collected_log(store)
    floored = replace(m, gc_floor=GcFloor(9, NONCE))
    put_manifest(store, floored)
    f11 = frag(11, 11)
    grown = replace(
        floored, fragments=(*floored.fragments, f11), setsum=floored.setsum + f11.setsum
    )
    store.before("put", r"manifest/MANIFEST$", lambda: put_manifest(store, grown))
    assert (await _pin(store, 8)).cursor.offset == 8
    assert stored_manifest(store) == replace(grown, gc_floor=None)


async def test_the_undo_of_a_refused_pin_is_best_effort_and_leaves_others_cursors() -> None:
    """Whatever the undo meets (the cursor moved, re-created or deleted by someone else, the
    store refusing the delete), the answer is 410, and another writer's cursor stays as it is.
    Kills the ``suppress`` list's mutants, the restore's witness → None and the delete's
    ``and`` → ``or``."""
    store = MemStore()
    await _collected_log(store)
    plan_read = r"gc/GARBAGE$"
    # Moved by another writer after the pin wrote it: the restore loses its compare-and-swap.
    w = await _pin(store, 8)
    store.before("get", plan_read, lambda: put_cursor_raw(store, "reader", 9))
    with pytest.raises(LogPurged):
        await _pin(store, 5, witness=w.etag)
    got = await CursorStore(store, P, "t").load("reader")
    assert got is not None and got.cursor.offset == 9
    # Re-created by another writer after the pin created it.
    store.before("get", plan_read, lambda: put_cursor_raw(store, "second", 9))
    with pytest.raises(LogPurged):
        await _pin(store, 5, name="second")
    got = await CursorStore(store, P, "t").load("second")
    assert got is not None and got.cursor.offset == 9
    # Deleted by someone else between the undo's read and its delete.
    third = join(P, "cursor/third.json")
    store.before("head", re.escape(third) + "$", lambda: store.objects.pop(third))
    with pytest.raises(LogPurged):
        await _pin(store, 5, name="third")
    # The store refusing the delete.
    fourth = join(P, "cursor/fourth.json")
    for exc in (ObjectNotFound(fourth), PreconditionFailed(fourth)):
        store.refuse("delete", re.escape(fourth) + "$", exc)
        with pytest.raises(LogPurged):
            await _pin(store, 5, name="fourth")
        del store.objects[fourth]


# ------------------------------------------------------------------- the collector's plumbing


async def test_the_collector_strips_only_slashes_from_its_prefix() -> None:
    """Kills ``prefix.strip(None)`` and ``strip("XX/XX")`` (the text names the log)."""
    store = MemStore()
    for given in ("/Xl/", "Xl"):
        with pytest.raises(GarbageRejected) as e:
            await GarbageCollector(store, given).cutoff()
        assert str(e.value) == "no log at Xl"


def test_the_collector_clocks_default_to_the_system_or_the_injected_one() -> None:
    """Kills ``__init__``'s monotonic default mutants (``or True``, ``and False``, ``is
    not``)."""
    import time as tm

    store = MemStore()
    assert GarbageCollector(store, P)._mono is tm.monotonic
    wall = Mono()
    assert GarbageCollector(store, P, clock=wall)._mono is wall
    mono = Mono()
    assert GarbageCollector(store, P, clock=wall, monotonic=mono)._mono is mono


async def test_the_standalone_edit_is_a_compare_and_swap_with_a_bound() -> None:
    """A manifest replaced between the edit's read and its write is read again (never
    overwritten); one that keeps changing gives up after 64 tries; no log is refused.  Kills
    ``_edit_standalone``'s mutants."""
    store = MemStore()
    clocks = Clocks(store)
    m = await flat_setup(store)
    c = gc_for(store, clocks)
    sealed = replace(m, sealed=True)
    store.before("put", r"manifest/MANIFEST$", lambda: put_manifest(store, sealed))
    new = await c._edit_standalone(lambda cur: replace(cur, writer="edited"))
    assert new.sealed and new.writer == "edited" and stored_manifest(store) == new
    assert await c._edit_standalone(lambda cur: cur) == new
    for _ in range(64):
        store.refuse("put", r"manifest/MANIFEST$", PreconditionFailed("manifest"))
    with pytest.raises(GarbageRejected) as e:
        await c._edit_standalone(lambda cur: replace(cur, writer="x"))
    assert str(e.value) == "manifest kept changing under the collector"
    assert store.fail == []
    for _ in range(63):
        store.refuse("put", r"manifest/MANIFEST$", PreconditionFailed("manifest"))
    assert (await c._edit_standalone(lambda cur: replace(cur, writer="y"))).writer == "y"
    del store.objects[join(P, MANIFEST_PATH)]
    with pytest.raises(GarbageRejected) as e:
        await c._edit_standalone(lambda cur: cur)
    assert str(e.value) == "no log at logs/c"


async def test_the_idle_form_rewritten_by_someone_else_is_read_not_rewritten_again() -> None:
    """Kills ``_load_garbage(normalize=False)`` → ``None``/``True`` in the lost race."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    put_raw(store, GARBAGE_PATH, b"{}")
    store.before("put", r"gc/GARBAGE$", lambda: put_raw(store, GARBAGE_PATH, b" {}"))
    assert await gc_for(store, clocks)._load_garbage() == (None, content_etag(b" {}"))
    assert store.data(GARBAGE_PATH) == b" {}"


async def test_a_plan_moved_on_under_the_pass_makes_it_busy() -> None:
    """Kills ``run_once``'s ``PreconditionFailed`` branch (phase, note)."""
    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store)
    await _pending(store, clocks)
    store.refuse("put", r"gc/GARBAGE$", PreconditionFailed(join(P, GARBAGE_PATH)))
    r = await gc_for(store, clocks).run_once()
    assert r.phase == "busy"
    assert r.notes == [
        "another collector moved the plan on: precondition failed for logs/c/gc/GARBAGE"
    ]


async def test_a_cursor_past_the_tail_is_logged_by_name(caplog: pytest.LogCaptureFixture) -> None:
    """Kills the warning's mutants (format and arguments).  The level is set on ``wal3.gc``
    itself: the simulator, run in the same process by mutmut or a pytest worker, sets ``wal3``
    to CRITICAL, which a handler alone would inherit."""
    import logging

    store = MemStore()
    clocks = Clocks(store)
    await flat_setup(store, cursor=12)
    await set_cursor(store, "reader", 13)
    caplog.set_level(logging.WARNING, logger="wal3.gc")
    assert (await gc_for(store, clocks).cutoff())[0] == 1  # type: ignore[index]
    assert [r.getMessage() for r in caplog.records if r.name == "wal3.gc"] == [
        "logs/c: cursor(s) ['compaction', 'reader'] point past the tail 11; not collecting"
    ]


class QuotedStore(MemStore):
    """A store whose etags come quoted, as S3 sends them, and opaque (not hex digests: some
    stores' begin with an ``X``): a comparison must strip exactly the quotes."""

    def requote(self) -> None:
        for k, (d, e, lm) in self.objects.items():
            if not e.startswith('"'):
                self.objects[k] = (d, f'"X{e}"', lm)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        self.requote()
        return self.objects[key][1]


async def test_quoted_opaque_etags_are_compared_bare() -> None:
    """A new process finishes a plan by the store's clock, and sweeps by an aged marker, on a
    store that quotes its etags.  Kills ``_store_waited``'s and ``_marked_floor``'s ``strip``
    mutants (``None``, ``'XX"XX'``)."""
    store = QuotedStore()
    clocks = Clocks(store)
    await flat_setup(store)
    store.requote()
    assert (await gc_for(store, clocks).run_once()).phase == "waiting"
    store.now += 100
    r = await gc_for(store, Clocks(store)).run_once(sweep_orphans=False)
    assert (r.phase, r.fragments_deleted) == ("done", 5)
    store2 = QuotedStore()
    await _collected_log(store2)
    put_raw(store2, OLDEST_PATH, json.dumps({"oldest_offset": 6, "first_live_seq_no": 6}).encode())
    store2.set_time(OLDEST_PATH, store2.now - 100)
    store2.requote()
    r = await gc_for(store2, Clocks(store2)).run_once()
    assert r.orphans_deleted == 5


def test_a_collector_that_saw_nothing_has_no_floor_and_forgets_nothing() -> None:
    """Kills ``_observed_floor``'s and ``_forget_applied``'s ``{}`` defaults (→ None, absent)
    and ``pop``'s default."""
    store = MemStore()
    c = gc_for(store, Clocks(store))
    assert c._observed_floor() is None
    c._forget_applied()
    assert gcmod._SEEN_APPLIED.get(store) is None


# ------------------------------------------------------------------------ equivalent mutants
#
# Judged equivalent (no input tells them apart), by function:
#
# verify_garbage
#   * ``g.apply(m, None)``: the applied manifest's writer is never read.
#   * ``live = m.live_bytes or 2``: a plan over budget drops bytes, so ``live_bytes`` is never
#     zero there.
# plan_cut
#   * the budget loop's ``e.start >= cutoff`` → ``>``: past that entry every start is above the
#     cutoff, so the only extra step can set ``cutoff = e.start``, which is the cutoff itself.
#   * ``straddler.start < cutoff`` and the nested ``child.start < cutoff`` → ``<=``: a pointer
#     starting at the cutoff has no fragment ending at or below it (``discards`` is False).
#   * ``split``'s ``cache.get(None, …)`` and ``min_live_seq(None, …)``: every snapshot they read
#     was loaded into the plan's cache just before (by ``discards`` or the dropped stack), so the
#     store argument is never used.
#   * ``remaining``'s ``i - (…)``, ``(… and False)`` and ``1`` → ``2``: with a straddler,
#     ``remaining`` starts with the new root whatever follows, and only ``remaining[0]`` is read.
# _unrolled
#   * ``j == i or …`` → ``and``: ``j == i`` with the last verified pointer ending at the roll's
#     limit would need the first verified pointer to end past the last one.
# verify_cut
#   * ``g.apply(m, None)`` / ``"XXverifyXX"`` / ``"VERIFY"``: the writer of the proof's manifest
#     is never read.
#   * the "not the oldest" refusal's three text mutants: ``apply`` only lets a prefix go (the
#     kept pointers must stay contiguous from ``first_to_keep`` to the unchanged tail), so it
#     never fires.
#   * ``removed … if e.limit > cut`` → ``>=``: such a pointer is popped at once by the loop.
#   * ``SnapshotCache(65)``: a capacity.
#   * ``opened.get`` → ``None`` (2) and ``opened[…] = None``: a cache of what ``open_new`` read;
#     reading again gives the same snapshot (and ``planned`` the same object).
#   * ``old or fresh`` → ``and``, ``not old or not fresh`` → ``and`` and the "unmatched" branch
#     (``gone`` and its text, 6): both sides tile ``[cut, first kept pointer)`` with
#     non-empty, contiguous leaves (``Manifest.check``, ``Snapshot.check`` and the pointer
#     check), and every step pops or expands both in step, so they run out together.
#   * the width comparison's ``>=`` → ``>``: for two snapshots of equal width either order of
#     expansion opens the same snapshots and compares the same leaves.
# GarbageCollector.__init__
#   * ``SnapshotCache(257)``: a capacity.
#   * ``CursorStore(store, prefix, None)``: the collector only reads cursors; the writer name
#     is stamped on cursor writes.
# _load_garbage
#   * ``normalize=None`` in the lost race: falsy, as ``False``.
# _phase1
#   * ``cutoff <= m.oldest_offset`` → ``<``: at a cutoff equal to the oldest offset no pointer
#     lies wholly below it, so ``plan_cut`` returns None before reading anything.
#   * ``verify_garbage``'s ``pinned_at=None`` and its omission: ``plan_cut`` never keeps from
#     above its cutoff (``first_to_keep`` is the start of the first pointer reaching past it),
#     so the check cannot fire; phase 2 reads the cursors again anyway.
# _install
#   * ``stored = ""`` for a missing or unreadable object: like None, unequal to every snapshot.
# _starting_below
#   * ``max(2, …)``: how many reads run at once, not what they find.
#   * ``zip``'s ``strict`` → None, False or absent (3): ``gather`` returns one result per name.
# _delete
#   * ``elapsed < budget`` → ``<=``: when equal the extra pause is ``sleep(0)``, no pause.
# _sweep_orphans
#   * the second ``normalize=None``: falsy, as ``False``.
#   * ``orphans_deleted +=`` → ``=``: a pass sweeps at most once, into a report at 0.
# _store_now
#   * the probe's ``separators`` (None, absent, ``"XX,XX"``): its body is never read, only its
#     Last-Modified (and a one-key object has no item separator).
# _marked_floor
#   * the marker's ``separators`` → None or absent: whitespace in JSON that only ``json.loads``
#     reads (DESIGN fixes its fields, not its bytes).
#   * ``loads(…, None)`` and the "not a JSON object" text → None: the error is caught and the
#     marker rewritten; its text is never seen.
# pin_cursor
#   * ``floor = 0`` → ``1``: a cursor's offset is at least 1 (the cursor write refuses less
#     first), so ``offset >= floor`` is the same, and a 410 has a floor above the offset.
