"""Manifests and snapshots: the metadata that names every live object of a log.

The manifest (``manifest/MANIFEST``) is overwritten with conditional puts; snapshots
(``snapshot/SNAPSHOT.{setsum}``) are immutable and content-addressed.  The root manifest lists
snapshot pointers (oldest first) and then fragment pointers; a snapshot holds either snapshot
pointers of lower depth or fragment pointers, never both.  Every pointer carries the setsum of what
it names, so the root's ``setsum`` always equals the sum of its pointers plus ``collected`` (what
garbage collection removed).  JSON field names and the compact encoding follow the Rust wal3
crate byte for byte (docs/DESIGN.md, "Formats", says exactly what is shared and what is ours).

Every malformed value, whatever its shape, raises :class:`CorruptManifest` (never a bare
``KeyError``/``TypeError``/``RecursionError``): tests/wal3/test_formats_fuzz.py holds us to it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeGuard

from .errors import CorruptManifest, LogFull

# Re-exported: every key is spelled in wal3.paths, and older callers import them from here.
from .paths import MANIFEST_PATH as MANIFEST_PATH
from .paths import SNAPSHOT_PREFIX as SNAPSHOT_PREFIX
from .paths import fragment_path, snapshot_path
from .setsum import Setsum

# Rust's integers are u64 (positions, sequence numbers, sizes) and u8 (depths); serde rejects
# anything outside, so do we: a value Rust cannot read must never be written.
U64_MAX = (1 << 64) - 1
_MD5 = re.compile(r"[0-9a-f]{32}")


def _compact(obj: Any) -> bytes:
    # serde_json's compact form: no spaces, non-ASCII as raw UTF-8 (not \u escapes).
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


def loads(data: bytes, what: str) -> Any:
    """Decode JSON; any failure (bad UTF-8, bad syntax, absurd nesting) is CorruptManifest."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        raise CorruptManifest(f"{what} is not JSON: {e}") from None


def _array(pointers: Sequence[FragmentPointer | SnapshotPointer]) -> bytes:
    return b"[" + b",".join(p.json_bytes() for p in pointers) + b"]"


def _pos(offset: int) -> dict[str, int]:
    return {"offset": offset}


def _u64(v: Any) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= U64_MAX


def _unpos(value: Any, what: str) -> int:
    if isinstance(value, dict) and _u64(value.get("offset")):
        return int(value["offset"])
    raise CorruptManifest(f"{what} is not a log position: {value!r:.200}")


def _setsum(value: Any, what: str) -> Setsum:
    try:
        return Setsum.from_hexdigest(value)
    except (ValueError, TypeError):
        raise CorruptManifest(f"{what} is not a setsum: {value!r:.200}") from None


# Public names for the GC file's parser, which shares these field types.
parse_position = _unpos
parse_setsum = _setsum


def _md5(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _MD5.fullmatch(value):
        raise CorruptManifest(f"fragment.content_md5 is not a hex MD5: {value!r:.200}")
    return value


def _int(obj: dict[str, Any], key: str, what: str, limit: int = U64_MAX) -> int:
    v = obj.get(key)
    if not _u64(v) or v > limit:
        raise CorruptManifest(f"{what}.{key} is not an integer in [0, {limit}]: {v!r:.200}")
    return v


def _text(v: Any, what: str) -> str:
    # A lone surrogate (from a "\ud800" escape) is valid to Python's json, not to serde_json,
    # and cannot be encoded back to UTF-8.
    if not isinstance(v, str):
        raise CorruptManifest(f"{what} is not a string: {v!r:.200}")
    try:
        v.encode()
    except UnicodeEncodeError:
        raise CorruptManifest(f"{what} is not valid Unicode: {v!r:.200}") from None
    return v


def _str(obj: dict[str, Any], key: str, what: str) -> str:
    return _text(obj.get(key), f"{what}.{key}")


def _lease_ms(value: Any) -> int | None:
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise CorruptManifest(f"read_lease_ms is not a non-negative integer: {value!r:.200}")
    return value


def _lease_holder(value: Any) -> str | None:
    # Only ever compared with a writer's own token: any string will do.
    return None if value is None else _text(value, "manifest.lease_holder")


def _writer(obj: dict[str, Any], what: str) -> str:
    # Rust requires it; our older objects always had it.  Absent reads as "".
    return _text(obj.get("writer", ""), f"{what}.writer")


def _list(obj: dict[str, Any], key: str, what: str) -> list[Any]:
    v = obj.get(key)
    if v is None:
        return []
    if not isinstance(v, list):
        raise CorruptManifest(f"{what}.{key} is not a list: {v!r:.200}")
    return v


@dataclass(frozen=True, slots=True)
class FragmentPointer:
    """A manifest's reference to one fragment."""

    path: str
    seq_no: int
    start: int
    limit: int
    num_bytes: int
    setsum: Setsum
    # Hex MD5 of the object's bytes (an S3 single-part etag).  An extension the Rust crate
    # ignores: the setsum proves the records, this proves every byte, so scrub catches a flip
    # in Parquet metadata too, and readers can skip re-hashing records.
    content_md5: str | None = None
    _json: bytes | None = field(default=None, compare=False, repr=False)

    def json_bytes(self) -> bytes:
        """The compact JSON encoding, computed once (pointers are immutable and every manifest
        write re-encodes all of them)."""
        encoded = self._json
        if encoded is None:
            encoded = _compact(self.to_json())
            object.__setattr__(self, "_json", encoded)
        return encoded

    def to_json(self) -> dict[str, Any]:
        """JSON form, as the Rust crate writes it (plus ``content_md5`` when known)."""
        obj: dict[str, Any] = {
            "path": self.path,
            "seq_no": self.seq_no,
            "start": _pos(self.start),
            "limit": _pos(self.limit),
            "num_bytes": self.num_bytes,
            "setsum": self.setsum.hexdigest(),
        }
        if self.content_md5 is not None:
            obj["content_md5"] = self.content_md5
        return obj

    @classmethod
    def from_json(cls, obj: Any) -> FragmentPointer:
        """Parse and type-check a fragment pointer."""
        if not isinstance(obj, dict):
            raise CorruptManifest(f"fragment is not an object: {obj!r}")
        return cls(
            path=_str(obj, "path", "fragment"),
            seq_no=_int(obj, "seq_no", "fragment"),
            start=_unpos(obj.get("start"), "fragment.start"),
            limit=_unpos(obj.get("limit"), "fragment.limit"),
            num_bytes=_int(obj, "num_bytes", "fragment"),
            setsum=_setsum(obj.get("setsum"), "fragment.setsum"),
            content_md5=_md5(obj.get("content_md5")),
        )


@dataclass(frozen=True, slots=True)
class SnapshotPointer:
    """A reference to a snapshot, carrying the setsum and range of everything beneath it."""

    setsum: Setsum
    path_to_snapshot: str
    depth: int
    start: int
    limit: int
    num_bytes: int
    _json: bytes | None = field(default=None, compare=False, repr=False)

    def json_bytes(self) -> bytes:
        """The compact JSON encoding, computed once."""
        encoded = self._json
        if encoded is None:
            encoded = _compact(self.to_json())
            object.__setattr__(self, "_json", encoded)
        return encoded

    @property
    def path(self) -> str:
        """Path of the snapshot object."""
        return self.path_to_snapshot

    def to_json(self) -> dict[str, Any]:
        """JSON form, as the Rust crate writes it."""
        return {
            "setsum": self.setsum.hexdigest(),
            "path_to_snapshot": self.path_to_snapshot,
            "depth": self.depth,
            "start": _pos(self.start),
            "limit": _pos(self.limit),
            "num_bytes": self.num_bytes,
        }

    @classmethod
    def from_json(cls, obj: Any) -> SnapshotPointer:
        """Parse and type-check a snapshot pointer."""
        if not isinstance(obj, dict):
            raise CorruptManifest(f"snapshot pointer is not an object: {obj!r}")
        return cls(
            setsum=_setsum(obj.get("setsum"), "snapshot.setsum"),
            path_to_snapshot=_str(obj, "path_to_snapshot", "snapshot"),
            depth=_int(obj, "depth", "snapshot", 255),
            start=_unpos(obj.get("start"), "snapshot.start"),
            limit=_unpos(obj.get("limit"), "snapshot.limit"),
            num_bytes=_int(obj, "num_bytes", "snapshot"),
        )


Pointer = FragmentPointer | SnapshotPointer


def _path_of(seq_no: int) -> str | None:
    try:
        return fragment_path(seq_no)
    except ValueError:
        return None  # no fragment has that number


def ensure_room(seq_no: int, start: int, records: int) -> None:
    """Raise LogFull unless a fragment ``seq_no`` of ``records`` records from offset ``start``
    fits u64: its sequence number and its limit (``start + records``) at most u64::MAX.

    ``Manifest.with_fragments`` calls it, so no manifest past u64 is ever built; a writer should
    also call it before uploading a fragment, so that nothing at all is written for an append
    that can never be linked."""
    if seq_no > U64_MAX or start + records > U64_MAX:
        raise LogFull(
            f"the log is full: fragment {seq_no} would end at offset {start + records}; "
            f"offsets and sequence numbers end at {U64_MAX} (u64)"
        )


def _check_run(entries: Sequence[Pointer], where: str) -> None:
    """Ranges are non-empty and contiguous; fragment seq numbers are sequential; every number
    fits u64 (the parser ensures that for what it reads, this for what we build)."""
    prev: Pointer | None = None
    for e in entries:
        if e.start >= e.limit:
            raise CorruptManifest(f"{where}: {e.path} has empty range [{e.start}, {e.limit})")
        if e.limit > U64_MAX or (isinstance(e, FragmentPointer) and e.seq_no > U64_MAX):
            raise CorruptManifest(f"{where}: {e.path} does not fit u64")
        if isinstance(e, FragmentPointer) and e.path != _path_of(e.seq_no):
            # The collector goes by seq_no, readers by path: they must name the same object.
            raise CorruptManifest(f"{where}: {e.path} is not the path of fragment {e.seq_no}")
        if prev is not None:
            if e.start != prev.limit:
                raise CorruptManifest(
                    f"{where}: {e.path} starts at {e.start}, expected {prev.limit} (gap or overlap)"
                )
            if (
                isinstance(e, FragmentPointer)
                and isinstance(prev, FragmentPointer)
                and e.seq_no != prev.seq_no + 1
            ):
                raise CorruptManifest(f"{where}: fragment seq_no {e.seq_no} follows {prev.seq_no}")
        prev = e


def _sum(entries: Iterable[Pointer]) -> Setsum:
    return Setsum.sum(e.setsum for e in entries)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """An immutable interior node of the manifest tree."""

    path: str
    depth: int
    setsum: Setsum
    writer: str
    snapshots: tuple[SnapshotPointer, ...] = ()
    fragments: tuple[FragmentPointer, ...] = ()

    @classmethod
    def build(cls, children: Sequence[Pointer], writer: str) -> Snapshot:
        """A snapshot over consecutive pointers, all fragments or all snapshots."""
        if not children:
            raise ValueError("a snapshot holds at least one pointer")
        setsum = _sum(children)
        fragments = [c for c in children if isinstance(c, FragmentPointer)]
        if len(fragments) == len(children):
            return cls(snapshot_path(setsum), 1, setsum, writer, (), tuple(fragments))
        snapshots = [c for c in children if isinstance(c, SnapshotPointer)]
        if len(snapshots) == len(children):
            depth = max(c.depth for c in snapshots) + 1
            return cls(snapshot_path(setsum), depth, setsum, writer, tuple(snapshots), ())
        raise ValueError("a snapshot never holds both snapshots and fragments")

    @property
    def children(self) -> tuple[Pointer, ...]:
        """The pointers held, oldest first."""
        return self.snapshots if self.snapshots else self.fragments

    def to_pointer(self) -> SnapshotPointer:
        """The pointer a parent stores for this snapshot."""
        kids = self.children
        return SnapshotPointer(
            setsum=self.setsum,
            path_to_snapshot=self.path,
            depth=self.depth,
            start=kids[0].start,
            limit=kids[-1].limit,
            num_bytes=sum(k.num_bytes for k in kids),
        )

    def check(self) -> None:
        """Raise CorruptManifest unless the snapshot is internally consistent."""
        if self.snapshots and self.fragments:
            raise CorruptManifest(f"{self.path} holds both snapshots and fragments")
        if not self.children:
            raise CorruptManifest(f"{self.path} is empty")
        if self.snapshots and any(s.depth >= self.depth for s in self.snapshots):
            raise CorruptManifest(f"{self.path}: child depth is not below {self.depth}")
        if self.fragments and self.depth != 1:
            raise CorruptManifest(f"{self.path}: a snapshot of fragments has depth 1")
        _check_run(self.children, self.path)
        if _sum(self.children) != self.setsum:
            raise CorruptManifest(f"{self.path}: setsum does not balance with its children")
        if self.path != snapshot_path(self.setsum):
            raise CorruptManifest(f"{self.path}: path does not name its setsum")

    def to_bytes(self) -> bytes:
        """Compact JSON encoding."""
        return _compact(self.to_json())

    def to_json(self) -> dict[str, Any]:
        """JSON form, as the Rust crate writes it."""
        return {
            "path": self.path,
            "depth": self.depth,
            "setsum": self.setsum.hexdigest(),
            "writer": self.writer,
            "snapshots": [s.to_json() for s in self.snapshots],
            "fragments": [f.to_json() for f in self.fragments],
        }

    @classmethod
    def from_json(cls, obj: Any) -> Snapshot:
        """Parse and type-check a snapshot without checking its invariants (``check``)."""
        if not isinstance(obj, dict):
            raise CorruptManifest(f"snapshot is not an object: {obj!r:.200}")
        return cls(
            path=_str(obj, "path", "snapshot"),
            depth=_int(obj, "depth", "snapshot", 255),
            setsum=_setsum(obj.get("setsum"), "snapshot.setsum"),
            writer=_writer(obj, "snapshot"),
            snapshots=tuple(
                SnapshotPointer.from_json(s) for s in _list(obj, "snapshots", "snapshot")
            ),
            fragments=tuple(
                FragmentPointer.from_json(f) for f in _list(obj, "fragments", "snapshot")
            ),
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Snapshot:
        """Decode and check a snapshot; raises CorruptManifest."""
        snap = cls.from_json(loads(data, "snapshot"))
        snap.check()
        return snap


_NONCE = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True, slots=True)
class GcFloor:
    """A collector's pending cut, announced in the manifest before it is made (``gc_floor``).

    ``offset`` is the plan's ``first_to_keep``; ``nonce`` names one phase-2 attempt of one
    collector, so no other attempt (even of the same plan) can ever be mistaken for it.  The cut
    is made only by a compare-and-swap from a manifest that still holds this exact floor, and a
    reader pinning below ``offset`` retracts it (``wal3/gc.py``, ``pin_cursor``).  An
    extension Rust's serde ignores and drops on its next manifest write, which retracts it."""

    offset: int
    nonce: str

    def to_json(self) -> dict[str, Any]:
        return {"offset": self.offset, "nonce": self.nonce}

    @classmethod
    def from_json(cls, value: Any) -> GcFloor:
        if (
            not isinstance(value, dict)
            or not _u64(value.get("offset"))
            or not isinstance(value.get("nonce"), str)
            or not _NONCE.fullmatch(value["nonce"])
        ):
            raise CorruptManifest(f"gc_floor is not a pending floor: {value!r:.200}")
        return cls(int(value["offset"]), value["nonce"])


@dataclass(frozen=True, slots=True)
class Manifest:
    """The root of a log: everything live, the running setsum, and what was collected."""

    setsum: Setsum = field(default_factory=Setsum.zero)
    collected: Setsum = field(default_factory=Setsum.zero)
    acc_bytes: int = 0
    writer: str = ""
    snapshots: tuple[SnapshotPointer, ...] = ()
    fragments: tuple[FragmentPointer, ...] = ()
    initial_offset: int | None = None
    initial_seq_no: int | None = None
    sealed: bool = False
    # Ours: a collector's pending cut (see GcFloor); written only while one is in flight.
    gc_floor: GcFloor | None = None
    # Ours (Rust ignores it): the read lease its author may answer from it for, in ms (see
    # ``LogWriter``: a take-over fences for it).  None: not recorded (Rust, older writers).
    read_lease_ms: int | None = None
    # Ours (Rust ignores it): which writer's lease this manifest stands under, a token unique to
    # one writer's life (``wal3/lease.py``).  Every writer put stamps its own; an edit that
    # links nothing and leases nothing (a collector's, a seal, a pin's retraction) carries it
    # over (``dataclasses.replace``), so the holder can tell such an edit of its own manifest
    # from a take-over.  None: not recorded (Rust, older writers, a fork's first manifest).
    lease_holder: str | None = None

    # --------------------------------------------------------------------------- positions

    @property
    def entries(self) -> tuple[Pointer, ...]:
        """Root pointers in log order: snapshots, then fragments."""
        return (*self.snapshots, *self.fragments)

    @property
    def oldest_offset(self) -> int:
        """The lowest offset still readable."""
        if self.snapshots:
            return self.snapshots[0].start
        if self.fragments:
            return self.fragments[0].start
        return self.initial_offset if self.initial_offset is not None else 1

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets."""
        if self.fragments:
            return self.fragments[-1].limit
        if self.snapshots:
            return self.snapshots[-1].limit
        return self.initial_offset if self.initial_offset is not None else 1

    @property
    def next_seq_no(self) -> int:
        """The sequence number of the next fragment."""
        if self.fragments:
            return self.fragments[-1].seq_no + 1
        if self.snapshots:
            # Writers never snapshot the last fragment, so this only happens in a foreign log.
            raise CorruptManifest("manifest has snapshots but no fragment to number from")
        return self.initial_seq_no if self.initial_seq_no is not None else 1

    @property
    def tail_setsum(self) -> Setsum | None:
        """Setsum of the last fragment, which the next fragment must follow."""
        return self.fragments[-1].setsum if self.fragments else None

    @property
    def live_bytes(self) -> int:
        """Bytes of all live fragments."""
        return sum(e.num_bytes for e in self.entries)

    # ---------------------------------------------------------------------------- checking

    def check(self) -> None:
        """Raise CorruptManifest unless every invariant of the spec holds."""
        if any(s.depth < 1 for s in self.snapshots):
            raise CorruptManifest("snapshot pointer with depth 0")
        if not all(
            v is None or _u64(v) for v in (self.acc_bytes, self.initial_offset, self.initial_seq_no)
        ):
            # Never encode what serde (and our parser) cannot read back: the log would be bricked.
            raise CorruptManifest("manifest holds a number that does not fit u64")
        entries = self.entries
        _check_run(entries, "manifest")
        if entries:
            # Without initial_offset the first range may start anywhere (Rust accepts it, and
            # manifests collected by older Chroma releases look exactly like that).
            if self.initial_offset is not None and entries[0].start != self.initial_offset:
                raise CorruptManifest(
                    f"manifest starts at {entries[0].start}, expected {self.initial_offset}"
                )
            if (
                not self.snapshots
                and self.fragments
                and self.initial_seq_no is not None
                and self.fragments[0].seq_no != self.initial_seq_no
            ):
                raise CorruptManifest(
                    f"first fragment is seq {self.fragments[0].seq_no}, "
                    f"expected {self.initial_seq_no}"
                )
        if _sum(entries) + self.collected != self.setsum:
            raise CorruptManifest("setsum does not balance: live pointers + collected != setsum")

    # --------------------------------------------------------------------------- transforms

    @classmethod
    def empty(cls, writer: str) -> Manifest:
        """A new, empty log."""
        return cls(writer=writer)

    def with_fragments(self, frags: Sequence[FragmentPointer], writer: str) -> Manifest:
        """Append fragments at the tail; they must follow on exactly.

        Raises LogFull when one would need an offset limit or a sequence number past u64::MAX:
        Rust's serde and our parser reject such a manifest, so writing it would brick the log.
        The last usable fragment is sequence number u64::MAX ending at offset u64::MAX (Rust's
        ``next_fragment_seq_no`` is then None: the log is full for it too).
        """
        if not frags:
            return self
        seq, off = self.next_seq_no, self.next_offset
        for f in frags:
            if f.seq_no != seq or f.start != off:
                raise CorruptManifest(
                    f"fragment {f.seq_no}@[{f.start},{f.limit}) does not follow {seq}@{off}"
                )
            ensure_room(f.seq_no, f.start, f.limit - f.start)
            seq, off = seq + 1, f.limit
        return replace(
            self,
            setsum=self.setsum + _sum(frags),
            # Rust saturates the running byte count; so do we (it is informational).
            acc_bytes=min(U64_MAX, self.acc_bytes + sum(f.num_bytes for f in frags)),
            writer=writer,
            fragments=(*self.fragments, *frags),
        )

    def with_snapshot(self, snap: Snapshot, writer: str) -> Manifest | None:
        """Replace the run of root pointers a snapshot covers; None if they are not there."""
        kids = snap.children
        entries = self.entries
        for i, e in enumerate(entries):
            if e == kids[0]:
                if tuple(entries[i : i + len(kids)]) != tuple(kids):
                    return None
                rest = (*entries[:i], snap.to_pointer(), *entries[i + len(kids) :])
                return replace(
                    self,
                    writer=writer,
                    snapshots=tuple(p for p in rest if isinstance(p, SnapshotPointer)),
                    fragments=tuple(p for p in rest if isinstance(p, FragmentPointer)),
                )
        return None

    def with_sealed(self, writer: str) -> Manifest:
        """The same manifest, sealed."""
        return replace(self, sealed=True, writer=writer)

    def same_tail(self, other: Manifest) -> bool:
        """Whether both manifests end at the same fragment (no one appended in between)."""
        return (self.next_offset, self.tail_setsum) == (other.next_offset, other.tail_setsum)

    def contains_fragment(self, path: str, setsum: Setsum) -> bool:
        """Whether the root links exactly this fragment."""
        for f in reversed(self.fragments):
            if f.path == path:
                return f.setsum == setsum
        return False

    # ------------------------------------------------------------------------------ codec

    def to_bytes(self) -> bytes:
        """Compact JSON encoding (Rust field names; ``sealed`` and ``gc_floor`` only when set).

        Assembled from each pointer's cached encoding: byte for byte what ``json.dumps`` of the
        whole object with compact separators gives, without re-encoding every pointer per write.
        """
        parts = [
            b'{"setsum":"',
            self.setsum.hexdigest().encode(),
            b'","collected":"',
            self.collected.hexdigest().encode(),
            b'","acc_bytes":',
            str(self.acc_bytes).encode(),
            b',"writer":',
            _compact(self.writer),
            b',"snapshots":',
            _array(self.snapshots),
            b',"fragments":',
            _array(self.fragments),
        ]
        if self.initial_offset is not None:
            parts += [b',"initial_offset":{"offset":', str(self.initial_offset).encode(), b"}"]
        if self.initial_seq_no is not None:
            parts += [b',"initial_seq_no":', str(self.initial_seq_no).encode()]
        if self.sealed:
            parts.append(b',"sealed":true')
        if self.gc_floor is not None:
            parts += [b',"gc_floor":', _compact(self.gc_floor.to_json())]
        if self.read_lease_ms is not None:
            parts += [b',"read_lease_ms":', str(self.read_lease_ms).encode()]
        if self.lease_holder is not None:
            parts += [b',"lease_holder":', _compact(self.lease_holder)]
        parts.append(b"}")
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        """Decode and check a manifest; raises CorruptManifest."""
        obj = loads(data, "manifest")
        if not isinstance(obj, dict):
            raise CorruptManifest("manifest is not a JSON object")
        initial_offset = obj.get("initial_offset")
        initial_seq_no = obj.get("initial_seq_no")
        if initial_seq_no is not None and not _u64(initial_seq_no):
            # Rust's newer replicated logs name fragments by UUID; this engine does not.
            raise CorruptManifest(
                f"initial_seq_no is not a u64 sequence number: {initial_seq_no!r:.200}"
            )
        sealed = obj.get("sealed", False)
        if not isinstance(sealed, bool):
            raise CorruptManifest(f"sealed is not a boolean: {sealed!r:.200}")
        m = cls(
            setsum=_setsum(obj.get("setsum"), "setsum"),
            collected=_setsum(obj.get("collected", "0" * 64), "collected"),
            acc_bytes=_int(obj, "acc_bytes", "manifest"),
            writer=_writer(obj, "manifest"),
            snapshots=tuple(
                SnapshotPointer.from_json(s) for s in _list(obj, "snapshots", "manifest")
            ),
            fragments=tuple(
                FragmentPointer.from_json(f) for f in _list(obj, "fragments", "manifest")
            ),
            initial_offset=None
            if initial_offset is None
            else _unpos(initial_offset, "initial_offset"),
            initial_seq_no=initial_seq_no,
            sealed=sealed,
            gc_floor=None if obj.get("gc_floor") is None else GcFloor.from_json(obj["gc_floor"]),
            read_lease_ms=_lease_ms(obj.get("read_lease_ms")),
            lease_holder=_lease_holder(obj.get("lease_holder")),
        )
        m.check()
        return m

    @staticmethod
    def tail_from_bytes(data: bytes) -> ManifestTail:
        """Where the manifest ends, decoded from its last fragment pointer; raises
        CorruptManifest.

        For readers that want only the tail of many logs (the dirty log's roll-up judges up to 64
        a pass): a full ``from_bytes`` type-checks every pointer and sums every setsum, about 1 ms
        of the event loop for a root of 100 fragments, against a fifth of that here.  A root
        without a fragment is decoded whole (it is small): a tail read from defaults would be
        offset 1, and a roll-up trusting it drops every mark of the log (helper-8's review of
        85eab44: ``{}``, or a manifest whose lists were lost, read as a log that never landed a
        record).  With a fragment, the object must still be a manifest (its ``setsum`` parses),
        but pointers before the last are not checked, nor is the balance: a well-formed root
        that lost its newest pointers reads as shorter.  So this is no substitute for
        ``from_bytes`` where the log is read or written.
        """
        obj = loads(data, "manifest")
        if not isinstance(obj, dict):
            raise CorruptManifest("manifest is not a JSON object")
        fragments = _list(obj, "fragments", "manifest")
        if not fragments:
            m = Manifest.from_bytes(data)
            numbered = None if m.snapshots else m.next_seq_no
            return ManifestTail(m.next_offset, m.sealed, numbered)
        _setsum(obj.get("setsum"), "setsum")
        sealed = obj.get("sealed", False)
        if not isinstance(sealed, bool):
            raise CorruptManifest(f"sealed is not a boolean: {sealed!r:.200}")
        last = FragmentPointer.from_json(fragments[-1])
        return ManifestTail(last.limit, sealed, last.seq_no + 1)


@dataclass(frozen=True, slots=True)
class ManifestTail:
    """A manifest's end (``Manifest.tail_from_bytes``): what its next fragment would be; the
    same as ``Manifest.next_offset``, ``.next_seq_no`` and ``.sealed`` of the whole."""

    next_offset: int
    sealed: bool
    # None: snapshots but no fragment to number from, as only a foreign log has.
    numbered: int | None

    @property
    def next_seq_no(self) -> int:
        """The sequence number of the next fragment."""
        if self.numbered is None:
            raise CorruptManifest("manifest has snapshots but no fragment to number from")
        return self.numbered


def plan_snapshot(
    manifest: Manifest, *, fragment_threshold: int, snapshot_threshold: int, writer: str
) -> Snapshot | None:
    """The next snapshot worth writing, if the root has grown past a threshold.

    Runs of ``snapshot_threshold`` consecutive same-depth pointers roll up one level (deepest
    first, so the tree stays ordered by depth); otherwise the oldest ``fragment_threshold``
    fragments become a depth-1 snapshot.  The last fragment always stays in the root so the next
    sequence number remains computable.
    """
    snaps = manifest.snapshots
    for depth in sorted({s.depth for s in snaps}, reverse=True):
        run: list[SnapshotPointer] = []
        for s in snaps:
            if s.depth == depth:
                run.append(s)
                if len(run) == snapshot_threshold:
                    return Snapshot.build(run, writer)
            else:
                run = []
    if len(manifest.fragments) > fragment_threshold:
        return Snapshot.build(manifest.fragments[:fragment_threshold], writer)
    return None
