"""Garbage collection in three verified, resumable phases.

1. **Compute**: after the cursor dance (cursors, manifest, cursors again) the cutoff is the lowest
   cursor.  Whole root pointers strictly below it become garbage; a snapshot straddling it is split
   (its live children go into a new snapshot, one per level).  The plan, with the setsum of
   everything it drops, is verified and written to ``gc/GARBAGE`` by conditional put.
2. **Apply**: the collector announces the cut in the manifest (a pending floor, ``gc_floor``),
   re-reads the cursors, and makes the cut by a compare-and-swap from a manifest that still
   holds its floor, through the writer's normal fenced manifest write: ``collected`` grows by
   exactly the discarded setsum and ``initial_offset``/``initial_seq_no`` move; the tail is
   untouched, so concurrent appends only rebase.  ``pin_cursor`` retracts a floor above the
   offset it pins, so no cut passes a pin it accepted (``GarbageCollector._phase2``).
3. **Delete**: once the grace interval has passed since the plan was seen applied (readers that
   loaded an older manifest are done with it; timed in-process, or on the store's clock),
   re-verify that nothing to delete is referenced, delete in rate-limited batches, then reset
   ``gc/GARBAGE``.

``gc/GARBAGE`` is the only state: a crash anywhere resumes from it, and deletes are idempotent.
It is in the Rust wal3 crate's schema, so either implementation resumes the other's plan.  It is
also data anyone can write, so nothing in it is trusted: phase 2 verifies every plan, tree and
leaves included, before applying it; phase 3 times the grace interval by its own observation and
deletes by what the manifest and the stored objects say, not by the plan's claims.
Orphans (fragments below the live range, unreferenced snapshots) are swept too, but only below
an oldest offset the manifest has shown for at least the grace interval (never by an object's
age: an old object may have been unlinked a moment ago).  Nothing at or above the live range is
ever deleted by the collector.  No local clock ever shortens a grace: across processes, time is
the store's (Last-Modified of ``gc/CLOCK``, written to read it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, overload

from .cursors import COMPACTION, CursorStore, Witness
from .errors import (
    CorruptFragment,
    CorruptManifest,
    CursorConflict,
    CursorNotFound,
    GarbageRejected,
    LogPurged,
    NoCursors,
    ObjectNotFound,
    PreconditionFailed,
)
from .layout import load_manifest
from .manifest import (
    U64_MAX,
    FragmentPointer,
    GcFloor,
    Manifest,
    Pointer,
    Snapshot,
    SnapshotPointer,
    loads,
)
from .manifest import (
    parse_position as _unpos,
)
from .manifest import (
    parse_setsum as _setsum,
)
from .paths import (
    CLOCK_PATH,
    GARBAGE_PATH,
    LOG_PREFIX,
    MANIFEST_PATH,
    OLDEST_PATH,
    SNAPSHOT_PREFIX,
    fragment_path,
    is_snapshot_path,
    join,
    parse_fragment_path,
)
from .reader import SnapshotCache
from .setsum import Setsum
from .store import ObjectStore, ensure_object, put_resolving

_log = logging.getLogger("wal3.gc")

ManifestEditor = Callable[[Callable[[Manifest], Manifest]], Awaitable[Manifest]]


class FloorLost(GarbageRejected):
    """The manifest no longer holds this collector's pending floor (a reader pinning below it
    retracted it, another collector replaced it, or a Rust writer dropped it): the cut is not
    made.  ``replaced``: another collector's floor stands in its place (that one is cutting)."""

    def __init__(self, message: str, *, replaced: bool) -> None:
        super().__init__(message)
        self.replaced = replaced


# Announcements per pass when a floor is found gone with none in its place (a pin retracted it,
# or a Rust writer's append dropped it): a Rust writer appending steadily lands in one
# announcement's window now and then, and ending the pass each time starved the collector.  Only
# an append inside every window still postpones the cut, to the next pass.  A floor another
# collector replaced is left to that collector (re-announcing would take turns cancelling).
_FLOOR_ATTEMPTS = 3


@dataclass(frozen=True)
class GcOptions:
    """How careful and how fast the collector is."""

    grace_s: float = 300.0
    # One plan drops at most this share of a log's live bytes (always at least its oldest root
    # pointer); the verifier refuses a plan over it, so a planning bug cannot empty a log at once.
    max_fraction: float = 0.9
    delete_batch: int = 64
    deletes_per_second: float = 500.0
    orphan_scan_limit: int = 10_000
    writer_name: str = "wal3-gc"
    # Unlinked fragments stay a while: their footers are the idempotency window a reopened
    # writer reads (the last ``retain_fragments`` sequence numbers, up to ``retain_s`` old).
    retain_fragments: int = 256
    retain_s: float = 900.0
    # A cursor the log cannot be collected past even when absent (then nothing is collected):
    # compaction folds records before they may go.  None for logs no compactor reads.
    intrinsic_cursor: str | None = COMPACTION


@overload
def _g_int(obj: dict[str, Any], key: str) -> int: ...
@overload
def _g_int(obj: dict[str, Any], key: str, *, optional: bool) -> int | None: ...
def _g_int(obj: dict[str, Any], key: str, *, optional: bool = False) -> int | None:
    v = obj.get(key)
    if v is None and optional:
        return None
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= U64_MAX:
        raise GarbageRejected(f"{GARBAGE_PATH}: {key} is not a u64: {v!r:.200}")
    return v


def _g_list(obj: dict[str, Any], key: str) -> list[Any]:
    v = obj.get(key)
    if not isinstance(v, list):
        raise GarbageRejected(f"{GARBAGE_PATH}: {key} is not a list: {v!r:.200}")
    return v


@dataclass(frozen=True)
class Garbage:
    """A plan of what to drop, persisted in ``gc/GARBAGE`` in the Rust wal3 crate's schema.

    The Rust fields say everything either implementation needs to apply and finish a plan:

    * ``snapshots_to_drop``: every snapshot pointer that goes, at any depth: whole ones below the
      cut, and the straddling snapshot that is split (one per level).  Root pointers among them
      leave the root; all of them are deleted in phase 3 unless still referenced.
    * ``snapshots_to_make``: the split snapshots, written (content-addressed) before the plan.
    * ``snapshot_for_root``: what replaces the straddling root snapshot (a new snapshot, or an
      existing child when only one is left), inserted first in the root.
    * ``fragments_to_drop_start``/``_limit``: the sequence numbers ``[start, limit)`` of every
      fragment dropped, root or nested; ``limit`` becomes the manifest's ``initial_seq_no``.
    * ``setsum_to_discard``: what ``collected`` grows by; ``first_to_keep``: the new
      ``initial_offset`` (no record at or above it is dropped).

    Our earlier schema maps onto these: ``drop_root`` and ``replace_root`` are the root pointers
    in ``snapshots_to_drop``; ``new_root`` is ``snapshot_for_root``; ``new_snapshots`` are
    ``snapshots_to_make`` (now whole, so anyone can install them); ``first_seq_to_delete``/
    ``first_seq_to_keep`` are ``fragments_to_drop_start``/``_limit``; ``cutoff`` reads as
    ``first_to_keep``; ``bytes_to_discard`` is derived from the manifest when verifying.

    Our phase state rides in two extension fields Rust's serde ignores (``Garbage`` has no
    ``deny_unknown_fields``, and Rust never rewrites a pending plan, only replaces or resets it):
    ``created_us`` (when planned) and ``applied_us`` (set when phase 2 finished).  Both are data
    anyone may write, so neither is trusted: every plan without ``applied_us`` — ours before
    phase 2, an older version's, any plan Rust wrote — is verified by phase 2 against the
    manifest and cursors before it is applied (:func:`verify_garbage`, :func:`verify_cut`), and
    ``applied_us`` only says "phase 2 is done": its value is never read (the grace interval is
    timed by the collector's own observation, see ``GarbageCollector._phase3``).

    The idle state is Rust's ``Garbage::empty()`` (:data:`EMPTY_GARBAGE`); ``from_bytes`` also
    reads ``{}`` (our idle state before issue 16) as idle.  Every malformed file raises
    :class:`GarbageRejected`, the GC file's one corruption error.
    """

    snapshots_to_drop: tuple[SnapshotPointer, ...]
    snapshots_to_make: tuple[Snapshot, ...]
    snapshot_for_root: SnapshotPointer | None
    fragments_to_drop_start: int
    fragments_to_drop_limit: int
    setsum_to_discard: Setsum
    first_to_keep: int
    created_us: int | None = None
    applied_us: int | None = None
    # A plan in the pre-issue-16 schema: it lacks the pointers Rust's fields need, so the
    # collector only resets it (deleting nothing); the orphan sweep reclaims what it dropped.
    legacy: bool = False

    # ------------------------------------------------------------- views in our terms

    @property
    def first_seq_to_delete(self) -> int:
        """The first fragment sequence number dropped."""
        return self.fragments_to_drop_start

    @property
    def first_seq_to_keep(self) -> int:
        """The first fragment sequence number kept (the new ``initial_seq_no``)."""
        return self.fragments_to_drop_limit

    @property
    def cutoff(self) -> int:
        """The offset the plan cuts at: nothing at or above it is dropped."""
        return self.first_to_keep

    @property
    def new_snapshots(self) -> tuple[str, ...]:
        """Paths of the snapshots the plan writes."""
        return tuple(s.path for s in self.snapshots_to_make)

    @property
    def snapshots_to_delete(self) -> tuple[str, ...]:
        """Paths phase 3 deletes (never one the plan itself writes)."""
        made = set(self.new_snapshots)
        return tuple(
            dict.fromkeys(
                p.path_to_snapshot for p in self.snapshots_to_drop if p.path_to_snapshot not in made
            )
        )

    @classmethod
    def empty(cls) -> Garbage:
        """Rust's ``Garbage::empty()``: the idle state."""
        return cls((), (), None, 0, 0, Setsum.zero(), 1)

    @classmethod
    def unlinking_root_snapshots(
        cls, m: Manifest, first_seq_to_keep: int, first_to_keep: int
    ) -> Garbage:
        """Repair garbage for a log whose collector deleted objects before unlinking them (an
        early Rust wal3 bug; the manifest then names snapshots that are gone): unlink every root
        snapshot wholly below ``first_to_keep`` without reading it, and drop no fragment by
        number (``[first_seq_to_keep, first_seq_to_keep)``).  The same plan as Rust's
        ``bug_patch_construct_garbage_from_manifest``; only for a bug you know you are fixing."""
        gone = tuple(s for s in m.snapshots if s.limit <= first_to_keep)
        return cls(
            gone,
            (),
            None,
            first_seq_to_keep,
            first_seq_to_keep,
            Setsum.sum(s.setsum for s in gone),
            first_to_keep,
        )

    def is_empty(self) -> bool:
        """Rust's test for the idle state: every Rust field as in ``empty()``."""
        return (
            not self.snapshots_to_drop
            and not self.snapshots_to_make
            and self.snapshot_for_root is None
            and self.fragments_to_drop_start == 0
            and self.fragments_to_drop_limit == 0
            and self.setsum_to_discard.is_zero()
            and self.first_to_keep == 1
        )

    # ------------------------------------------------------------------------ codec

    def to_bytes(self) -> bytes:
        """serde_json's compact encoding of Rust's ``Garbage`` (field order included), then our
        extensions when set."""
        root = self.snapshot_for_root
        parts = [
            b'{"snapshots_to_drop":[',
            b",".join(p.json_bytes() for p in self.snapshots_to_drop),
            b'],"snapshots_to_make":[',
            b",".join(s.to_bytes() for s in self.snapshots_to_make),
            b'],"snapshot_for_root":',
            b"null" if root is None else root.json_bytes(),
            b',"fragments_to_drop_start":',
            str(self.fragments_to_drop_start).encode(),
            b',"fragments_to_drop_limit":',
            str(self.fragments_to_drop_limit).encode(),
            # Rust serializes it always; we never write UUID fragments.
            b',"fragments_are_uuids":false',
            b',"setsum_to_discard":"',
            self.setsum_to_discard.hexdigest().encode(),
            b'","first_to_keep":{"offset":',
            str(self.first_to_keep).encode(),
            b"}",
        ]
        if self.created_us is not None:
            parts += [b',"created_us":', str(self.created_us).encode()]
        if self.applied_us is not None:
            parts += [b',"applied_us":', str(self.applied_us).encode()]
        parts.append(b"}")
        return b"".join(parts)

    @classmethod
    def from_bytes(cls, data: bytes) -> Garbage | None:
        """Parse ``gc/GARBAGE``; None for the idle state.  Raises GarbageRejected."""
        try:
            obj = loads(data, GARBAGE_PATH)
            if not isinstance(obj, dict):
                raise GarbageRejected(f"{GARBAGE_PATH} is not a JSON object")
            if not obj:
                return None  # our idle state before issue 16
            if "cutoff" in obj or "drop_root" in obj:
                return cls._from_legacy(obj)
            if (
                obj.get("fragments_are_uuids", False) is not False
                or obj.get("fragments_to_drop_uuid_limit") is not None
            ):
                raise GarbageRejected(
                    f"{GARBAGE_PATH} drops UUID-named fragments, which this engine does not support"
                )
            root = obj.get("snapshot_for_root")
            g = cls(
                snapshots_to_drop=tuple(
                    SnapshotPointer.from_json(p) for p in _g_list(obj, "snapshots_to_drop")
                ),
                snapshots_to_make=tuple(
                    Snapshot.from_json(s) for s in _g_list(obj, "snapshots_to_make")
                ),
                snapshot_for_root=None if root is None else SnapshotPointer.from_json(root),
                fragments_to_drop_start=_g_int(obj, "fragments_to_drop_start"),
                fragments_to_drop_limit=_g_int(obj, "fragments_to_drop_limit"),
                setsum_to_discard=_setsum(obj.get("setsum_to_discard"), "setsum_to_discard"),
                first_to_keep=_unpos(obj.get("first_to_keep"), "first_to_keep"),
                created_us=_g_int(obj, "created_us", optional=True),
                applied_us=_g_int(obj, "applied_us", optional=True),
            )
        except CorruptManifest as e:
            raise GarbageRejected(f"unparseable {GARBAGE_PATH}: {e}") from None
        return None if g.is_empty() else g

    @classmethod
    def _from_legacy(cls, obj: dict[str, Any]) -> Garbage:
        """What a pre-issue-16 plan says that readers need: its floor and whether it applied."""
        frags = obj.get("fragments_to_delete")
        if not isinstance(frags, dict):
            raise GarbageRejected(f"{GARBAGE_PATH}: legacy fragments_to_delete is malformed")
        return cls(
            snapshots_to_drop=(),
            snapshots_to_make=(),
            snapshot_for_root=None,
            fragments_to_drop_start=_g_int(frags, "first_seq_no"),
            fragments_to_drop_limit=_g_int(frags, "limit_seq_no"),
            setsum_to_discard=_setsum(obj.get("setsum_to_discard"), "setsum_to_discard"),
            first_to_keep=_unpos(obj.get("first_to_keep"), "first_to_keep"),
            created_us=_g_int(obj, "created_us", optional=True),
            applied_us=_g_int(obj, "applied_us", optional=True),
            legacy=True,
        )

    # ------------------------------------------------------------------------ apply

    def apply(
        self, m: Manifest, writer: str, *, entries: Sequence[Pointer] | None = None
    ) -> Manifest:
        """The manifest with this garbage removed; idempotent; raises GarbageRejected if stale.

        Rust's semantics (root snapshots listed in ``snapshots_to_drop`` and root fragments in
        ``[start, limit)`` leave, ``snapshot_for_root`` goes first, what left minus what came
        must be ``setsum_to_discard``), plus our checks: the result passes ``Manifest.check``
        (so only a prefix can go), its root is in root order as it stands (snapshots, then
        fragments: never re-sorted into order), and it keeps the tail.

        ``entries`` stands for ``m``'s root pointers when given: :meth:`VerifiedCut.edit` passes
        a root whose writer rolls it has undone, which may list a verified fragment before a
        snapshot that the cut keeps (no manifest can hold that; the result must not).
        """
        if self.legacy:
            raise GarbageRejected("a legacy plan is never applied")
        if m.oldest_offset >= self.first_to_keep:
            return m  # already applied (a retry after a lost response, a rebase, or by Rust)
        if self.fragments_to_drop_start > self.fragments_to_drop_limit:
            raise GarbageRejected("garbage's fragment range is inverted")
        drop = set(self.snapshots_to_drop)
        root = self.snapshot_for_root
        left = Setsum.zero()
        rest: list[Pointer] = []
        for e in m.entries if entries is None else entries:
            if isinstance(e, SnapshotPointer) and e in drop:
                if e != root:
                    left = left + e.setsum
            elif (
                isinstance(e, FragmentPointer)
                and self.fragments_to_drop_start <= e.seq_no < self.fragments_to_drop_limit
            ):
                left = left + e.setsum
            else:
                rest.append(e)
        came = Setsum.zero()
        if root is not None and root not in rest:
            came = root.setsum
            rest.insert(0, root)
        if left - came != self.setsum_to_discard:
            raise GarbageRejected(
                "garbage does not balance (or is stale): what it removes "
                "does not sum to its setsum_to_discard"
            )
        snapshots = tuple(p for p in rest if isinstance(p, SnapshotPointer))
        fragments = tuple(p for p in rest if isinstance(p, FragmentPointer))
        if (*snapshots, *fragments) != tuple(rest):
            raise GarbageRejected(
                "garbage leaves a root out of order (a fragment before a snapshot)"
            )
        new = replace(
            m,
            writer=writer,
            snapshots=snapshots,
            fragments=fragments,
            collected=m.collected + self.setsum_to_discard,
            initial_offset=self.first_to_keep,
            initial_seq_no=self.fragments_to_drop_limit,
        )
        try:
            new.check()
        except CorruptManifest as e:
            raise GarbageRejected(f"garbage does not apply: {e}") from None
        if new.next_offset != m.next_offset:
            raise GarbageRejected("garbage would move the log's tail")
        return new


EMPTY_GARBAGE: bytes = Garbage.empty().to_bytes()


@dataclass
class GcReport:
    """What one collector pass did."""

    phase: str = "idle"
    cutoff: int | None = None
    fragments_deleted: int = 0
    snapshots_deleted: int = 0
    orphans_deleted: int = 0
    setsum_discarded: str | None = None
    waiting_s: float = 0.0
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- tree helpers


async def _first_leaf_seq(
    store: ObjectStore, prefix: str, entries: Sequence[Pointer], cache: SnapshotCache
) -> int | None:
    """The sequence number of the oldest fragment under ``entries``."""
    if not entries:
        return None
    p = entries[0]
    while isinstance(p, SnapshotPointer):
        p = (await cache.get(store, prefix, p)).children[0]
    return p.seq_no


async def live_snapshot_paths(
    store: ObjectStore, prefix: str, m: Manifest, cache: SnapshotCache
) -> set[str]:
    """Every snapshot reachable from the manifest."""
    out: set[str] = set()
    stack: list[SnapshotPointer] = list(m.snapshots)
    while stack:
        p = stack.pop()
        out.add(p.path_to_snapshot)
        stack.extend((await cache.get(store, prefix, p)).snapshots)
    return out


async def min_live_seq(store: ObjectStore, prefix: str, m: Manifest, cache: SnapshotCache) -> int:
    """The lowest fragment sequence number the manifest can reach."""
    seq = await _first_leaf_seq(store, prefix, m.entries, cache)
    return seq if seq is not None else m.next_seq_no


async def plan_cut(
    store: ObjectStore,
    prefix: str,
    m: Manifest,
    cutoff: int,
    cache: SnapshotCache,
    writer: str,
    put_snapshot: Callable[[Snapshot], Awaitable[None]],
    now_us: int | None = None,
    *,
    keep_tail: bool = False,
    max_bytes: int | None = None,
) -> Garbage | None:
    """Plan dropping everything wholly below ``cutoff``; None when nothing would be dropped.

    ``put_snapshot`` stores each split snapshot (GC writes them under the log; fork under the
    new log).  ``keep_tail`` keeps the root's last fragment whatever the cutoff: its setsum is
    what the next fragment must follow, so without it read repair could not fence a stale
    speculative fragment.  ``max_bytes`` bounds what one plan drops (always at least the oldest
    root pointer, so collection still progresses).
    """
    cutoff = min(cutoff, m.next_offset)
    if keep_tail:
        cutoff = min(cutoff, m.fragments[-1].start if m.fragments else m.oldest_offset)
    entries = m.entries
    if max_bytes is not None:
        acc = 0
        for e in entries:
            if e.start >= cutoff:
                break
            if acc and acc + e.num_bytes > max_bytes:
                cutoff = e.start  # a boundary: nothing straddles it
                break
            acc += e.num_bytes
    i = 0
    while i < len(entries) and entries[i].limit <= cutoff:
        i += 1
    dropped = list(entries[:i])

    async def discards(ptr: Pointer) -> bool:
        """Whether some fragment under ``ptr`` (which starts below the cutoff) lies wholly below
        it: only then does the snapshot change.  Rebuilding an untouched snapshot would give the
        same content address, live and listed for deletion at once."""
        while isinstance(ptr, SnapshotPointer):
            first = (await cache.get(store, prefix, ptr)).children[0]
            if first.limit <= cutoff:
                return True
            ptr = first
        return False

    straddler = entries[i] if i < len(entries) else None
    if not (
        isinstance(straddler, SnapshotPointer)
        and straddler.start < cutoff
        and await discards(straddler)
    ):
        straddler = None
    discard = Setsum.zero()
    # Pointers, not paths: Rust's schema lists the pointers, and applies by pointer equality.
    to_delete: list[SnapshotPointer] = []
    created: list[Snapshot] = []
    for p in dropped:
        discard = discard + p.setsum
    # Every snapshot under a dropped pointer goes too.
    stack = [p for p in dropped if isinstance(p, SnapshotPointer)]
    while stack:
        p = stack.pop()
        to_delete.append(p)
        stack.extend((await cache.get(store, prefix, p)).snapshots)

    async def split(ptr: SnapshotPointer) -> SnapshotPointer:
        nonlocal discard
        snap = await cache.get(store, prefix, ptr)
        to_delete.append(ptr)
        kept: list[Pointer] = []
        for child in snap.children:
            if child.limit <= cutoff:
                discard = discard + child.setsum
                if isinstance(child, SnapshotPointer):
                    sub = [child]
                    while sub:
                        c = sub.pop()
                        to_delete.append(c)
                        sub.extend((await cache.get(store, prefix, c)).snapshots)
            elif (
                isinstance(child, SnapshotPointer)
                and child.start < cutoff
                and not kept
                and await discards(child)
            ):
                kept.append(await split(child))
            else:
                kept.append(child)
        if len(kept) == 1 and isinstance(kept[0], SnapshotPointer):
            # A snapshot of one snapshot would share its child's setsum, hence its name.
            return kept[0]
        new = Snapshot.build(kept, writer)
        await put_snapshot(new)
        cache.put(prefix, new)
        created.append(new)
        return new.to_pointer()

    new_root: tuple[SnapshotPointer, ...] = ()
    if straddler is not None:
        new_root = (await split(straddler),)
    if not dropped and straddler is None:
        return None
    old_first = await min_live_seq(store, prefix, m, cache)
    remaining = [*new_root, *entries[i + (1 if straddler is not None else 0) :]]
    first_keep_seq = await _first_leaf_seq(store, prefix, remaining, cache)
    if first_keep_seq is None:
        first_keep_seq = m.next_seq_no
    first_to_keep = remaining[0].start if remaining else m.next_offset
    made = {s.path for s in created}
    return Garbage(
        snapshots_to_drop=tuple(
            p for p in dict.fromkeys(to_delete) if p.path_to_snapshot not in made
        ),
        snapshots_to_make=tuple(created),
        snapshot_for_root=new_root[0] if new_root else None,
        fragments_to_drop_start=old_first,
        fragments_to_drop_limit=first_keep_seq,
        setsum_to_discard=discard,
        first_to_keep=first_to_keep,
        created_us=time.time_ns() // 1000 if now_us is None else now_us,
    )


def fraction_budget(m: Manifest, options: GcOptions) -> int:
    """The most bytes one plan may drop: ``max_fraction`` of the live bytes, and never less than
    the oldest root pointer (else a log dominated by one old pointer could never be collected)."""
    entries = m.entries
    if not entries:
        return 0
    return max(int(options.max_fraction * m.live_bytes), entries[0].num_bytes)


def verify_garbage(
    g: Garbage, m: Manifest, options: GcOptions, *, pinned_at: int | None = None
) -> None:
    """Refuse garbage whose setsums do not balance, that drops too much of the log, that drops the
    root's last fragment, or that drops anything at or above ``pinned_at`` (the lowest cursor)."""
    applied = g.apply(m, options.writer_name)
    if sum((e.setsum for e in applied.entries), Setsum.zero()) + applied.collected != m.setsum:
        raise GarbageRejected("garbage does not balance: live + collected + discarded != setsum")
    if applied.collected - m.collected != g.setsum_to_discard:
        raise GarbageRejected("collected does not grow by exactly the discarded setsum")
    if (applied.next_offset, applied.next_seq_no) != (m.next_offset, m.next_seq_no):
        raise GarbageRejected("garbage would move the log's tail")
    if m.fragments and (not applied.fragments or applied.fragments[-1] != m.fragments[-1]):
        raise GarbageRejected("garbage drops the root's last fragment, which fences writers")
    if pinned_at is not None and g.first_to_keep > pinned_at:
        raise GarbageRejected(
            f"garbage drops offsets up to {g.first_to_keep}, but a cursor pins {pinned_at}"
        )
    budget = fraction_budget(m, options)
    dropped_bytes = m.live_bytes - applied.live_bytes  # derived: Rust's schema has no byte count
    if dropped_bytes > budget:
        live = m.live_bytes or 1
        raise GarbageRejected(
            f"garbage drops {dropped_bytes / live:.1%} of the log, "
            f"more than the allowed {options.max_fraction:.1%}"
        )
    if g.first_seq_to_keep < g.first_seq_to_delete:
        raise GarbageRejected("fragment range to delete is inverted")


def _same_leaf(a: FragmentPointer, b: FragmentPointer) -> bool:
    """The same fragment in every field Rust keeps; ``content_md5`` (ours) may be missing on one
    side (Rust's writers drop it) but never different."""
    if (a.path, a.seq_no, a.start, a.limit, a.num_bytes, a.setsum) != (
        b.path,
        b.seq_no,
        b.start,
        b.limit,
        b.num_bytes,
        b.setsum,
    ):
        return False
    return a.content_md5 is None or b.content_md5 is None or a.content_md5 == b.content_md5


@dataclass(frozen=True)
class VerifiedCut:
    """What :func:`verify_cut` proved about a plan against one manifest."""

    # The plan's snapshots the new tree needs and the store lacks, in the plan's order.
    install: tuple[Snapshot, ...]
    # The root pointers the plan replaces: always a prefix of the root.  The edit must find them
    # unchanged, else the proof is about another manifest.
    removed: tuple[Pointer, ...]

    def edit(
        self, g: Garbage, writer: str, floor: GcFloor | None = None
    ) -> Callable[[Manifest], Manifest]:
        """The manifest edit applying ``g``, refusing a manifest whose oldest pointers changed
        since the proof (the writer may rebase it onto newer manifests: appends only).

        With ``floor``, the edit is the collector's commit point: it applies only to a manifest
        that still holds exactly that pending floor (compare-and-swap from it), and the cut
        removes it; else :class:`FloorLost`."""

        def fn(m: Manifest) -> Manifest:
            if m.oldest_offset >= g.first_to_keep:
                return m  # applied already (a retry, a rebase, another collector, or Rust)
            if floor is not None and m.gc_floor != floor:
                raise FloorLost(
                    f"the pending floor at {floor.offset} was retracted or replaced before the cut",
                    replaced=m.gc_floor is not None,
                )
            if m.entries[: len(self.removed)] != self.removed:
                # A writer that rolled some of the verified pointers into a snapshot meanwhile
                # (it links its pending snapshot in the very write that applies this edit, and
                # every collector edit gives it one more write) changed nothing the proof is
                # about: undo the roll and cut as verified (seed 8007 of the long simulation:
                # every pass was discarded while the writer worked through its snapshot backlog).
                unrolled = _unrolled(m.entries, self.removed)
                if unrolled is None:
                    raise GarbageRejected(
                        "the log's oldest pointers changed since the plan was verified"
                    )
                return replace(g.apply(m, writer, entries=unrolled), gc_floor=None)
            return replace(g.apply(m, writer), gc_floor=None)

        return fn


def _unrolled(
    entries: Sequence[Pointer], removed: tuple[Pointer, ...]
) -> tuple[Pointer, ...] | None:
    """The root ``entries`` with the verified root prefix ``removed`` back in place of the
    snapshots a writer rolled parts of it into since; None unless ``entries`` is exactly that.

    Each root pointer up to the end of ``removed`` must be either the next verified pointer
    itself or a snapshot pointer standing for a run of consecutive verified pointers: the same
    range, the same byte count and the same setsum as the run together (nested rolls included:
    a roll of rolls still sums to the run it covers).  So the cut removes exactly what was
    proved, by pointer, and the roll's own pointer only leaves the root with it; it is never
    deleted by this plan (phase 3 deletes what the plan lists, after re-checking what the
    manifest references) but swept as an orphan once it is wholly below the live range.  A roll
    reaching past ``removed`` (into what the plan keeps) is not undone: None.

    The result is not a manifest's root: when the writer also rolled kept fragments, it lists
    verified fragments before the kept roll.  The cut removes those, and
    :meth:`Garbage.apply` refuses any result still out of root order.
    """
    out: list[Pointer] = []
    i = k = 0
    while i < len(removed):
        if k >= len(entries):
            return None
        e = entries[k]
        k += 1
        if e == removed[i]:
            out.append(e)
            i += 1
            continue
        if not isinstance(e, SnapshotPointer) or e in removed or e.start != removed[i].start:
            return None
        j, acc, size = i, Setsum.zero(), 0
        while j < len(removed) and removed[j].limit <= e.limit:
            acc, size = acc + removed[j].setsum, size + removed[j].num_bytes
            j += 1
        if j == i or removed[j - 1].limit != e.limit or acc != e.setsum or size != e.num_bytes:
            return None
        out.extend(removed[i:j])
        i = j
    return (*out, *entries[k:])


async def verify_cut(store: ObjectStore, prefix: str, g: Garbage, m: Manifest) -> VerifiedCut:
    """Prove, by reading both trees, that applying ``g`` to ``m`` drops exactly the leaves below
    ``g.first_to_keep`` and keeps every other leaf unchanged; raises GarbageRejected.

    ``verify_garbage`` checks sums, and sums cannot see a tree that lies about ranges: a snapshot
    holding fragment 4's pointer relabelled [2, 5) balances, matches its own pointer, and once
    linked makes phase 3 delete fragments 2 and 3 (finding b2 of issue 16).  So the leaves are
    compared one by one: the root pointers the plan removes that reach the cut (read from the
    store, as the manifest references them now) against what it links instead
    (``snapshot_for_root``, read where readers will find it: the stored object when the path
    exists, since a create-only install keeps it, else the plan's ``snapshots_to_make``).  Equal
    pointers are not opened (same pointer, same content-addressed object), so a plan costs the
    snapshots along its split, not the tree.  Every new snapshot must pass ``check`` and match
    its pointer exactly (setsum, range, bytes, no deeper: Rust's wrapped lone child is deeper);
    the cut must fall between leaves; the first kept leaf must be ``fragments_to_drop_limit``.
    """
    cut = g.first_to_keep
    try:
        for snap in g.snapshots_to_make:
            snap.check()  # a plan carrying a malformed snapshot is malformed, used or not
        new = g.apply(m, "verify")
        now = set(new.entries)
        removed = tuple(e for e in m.entries if e not in now)
        if m.entries[: len(removed)] != removed:
            raise GarbageRejected("the plan removes root pointers that are not the oldest")
        before = set(m.entries)
        old: deque[Pointer] = deque(e for e in removed if e.limit > cut)
        fresh: deque[Pointer] = deque(e for e in new.entries if e not in before)
        planned: dict[str, Snapshot] = {}
        for snap in g.snapshots_to_make:
            planned.setdefault(snap.path, snap)  # a create-only install keeps the first
        cache = SnapshotCache(64)  # never the collector's: it holds what plans made
        opened: dict[str, Snapshot] = {}
        install: dict[str, Snapshot] = {}

        async def open_new(p: SnapshotPointer) -> Snapshot:
            snap = opened.get(p.path_to_snapshot)
            if snap is None:
                try:
                    got = await store.get(join(prefix, p.path_to_snapshot))
                    snap = Snapshot.from_bytes(got.data)
                except ObjectNotFound:
                    snap = planned.get(p.path_to_snapshot)
                    if snap is None:
                        raise GarbageRejected(
                            f"the plan links {p.path_to_snapshot}, which "
                            "neither the store nor the plan holds"
                        ) from None
                    install[snap.path] = snap
                opened[p.path_to_snapshot] = snap
            kids = snap.children
            if (
                snap.setsum != p.setsum
                or snap.depth > p.depth
                or kids[0].start != p.start
                or kids[-1].limit != p.limit
                or sum(k.num_bytes for k in kids) != p.num_bytes
            ):
                raise GarbageRejected(
                    f"{p.path_to_snapshot} is not what the plan's pointer "
                    f"[{p.start}, {p.limit}) says it is"
                )
            return snap

        def expand(side: deque[Pointer], children: Sequence[Pointer]) -> None:
            side.popleft()
            side.extendleft(reversed(children))

        first_kept: Pointer | None = None
        while old or fresh:
            if old and old[0].limit <= cut:
                old.popleft()  # wholly below the cut: dropped, never opened
                continue
            if not old or not fresh:
                gone = old[0] if old else fresh[0]
                raise GarbageRejected(
                    f"the plan's leaves are not the log's from {cut}: "
                    f"{gone.path} [{gone.start}, {gone.limit}) is unmatched"
                )
            a, b = old[0], fresh[0]
            if a.start < cut:  # straddles the cut: only what lies above it is kept
                if isinstance(a, FragmentPointer):
                    raise GarbageRejected(
                        f"first_to_keep {cut} falls inside leaf {a.path} [{a.start}, {a.limit})"
                    )
                expand(old, (await cache.get(store, prefix, a)).children)
            elif a == b:
                first_kept = first_kept or a
                old.popleft()
                fresh.popleft()
            elif isinstance(a, SnapshotPointer) and (
                isinstance(b, FragmentPointer) or a.limit - a.start >= b.limit - b.start
            ):
                expand(old, (await cache.get(store, prefix, a)).children)
            elif isinstance(b, SnapshotPointer):
                expand(fresh, (await open_new(b)).children)
            elif (
                isinstance(a, FragmentPointer)
                and isinstance(b, FragmentPointer)
                and _same_leaf(a, b)
            ):
                first_kept = first_kept or a
                old.popleft()
                fresh.popleft()
            else:
                raise GarbageRejected(
                    f"the plan's leaves are not the log's: it holds {b.path} "
                    f"[{b.start}, {b.limit}) where the log holds {a.path} "
                    f"[{a.start}, {a.limit})"
                )
        keep = first_kept if first_kept is not None else (new.entries[0] if new.entries else None)
        first_seq = (
            await _first_leaf_seq(store, prefix, [keep], cache)
            if keep is not None
            else m.next_seq_no
        )
    except (CorruptManifest, CorruptFragment) as e:
        raise GarbageRejected(f"a snapshot the plan reaches is unusable: {e}") from None
    if first_seq != g.fragments_to_drop_limit:
        raise GarbageRejected(
            f"the first kept leaf is fragment {first_seq}, but the plan keeps "
            f"from {g.fragments_to_drop_limit}"
        )
    return VerifiedCut(tuple(s for s in g.snapshots_to_make if install.get(s.path) is s), removed)


# ---------------------------------------------------------------------------- the collector


# When this process first saw each log's plan applied in the stored manifest, on the collector's
# monotonic clock: the start of the grace interval (never a time read from gc/GARBAGE, which
# anyone may write).  Module-level because collectors are made per pass (the server, the CLI)
# while the process, and what it saw, lives on; keyed weakly by the store object, so a new store
# object (a restart, a simulated crash) has seen nothing.  One entry per log and clock.
_SEEN_APPLIED: weakref.WeakKeyDictionary[
    ObjectStore, dict[tuple[str, int], tuple[tuple[Any, ...], Callable[[], float], float]]
] = weakref.WeakKeyDictionary()

# What the orphan sweep saw of each log: (monotonic time, oldest offset, first live sequence
# number) observations, oldest first.  Both values only grow, so an observation made at least a
# grace ago says that nothing below them has been reachable from the manifest since then.  Keyed
# like _SEEN_APPLIED (a new store object, i.e. a new process, has seen nothing).
_OBSERVED: weakref.WeakKeyDictionary[
    ObjectStore, dict[tuple[str, int], tuple[Callable[[], float], list[tuple[float, int, int]]]]
] = weakref.WeakKeyDictionary()

# S3's Last-Modified has whole seconds: a difference of two may be short by up to one.
_LAST_MODIFIED_SLACK_S = 1.0

# How often pin_cursor tries to retract a pending floor before it gives its pin up.
_RETRACT_ATTEMPTS = 8


def _plan_key(g: Garbage) -> tuple[Any, ...]:
    """What identifies a plan's cut (not its extension fields, which anyone may rewrite)."""
    return (
        g.first_to_keep,
        g.fragments_to_drop_start,
        g.fragments_to_drop_limit,
        g.setsum_to_discard.hexdigest(),
    )


class GarbageCollector:
    """Drives one log's garbage through the three phases; safe to crash and rerun anywhere.

    ``clock`` is wall time (plans' ``created_us``/``applied_us``, orphans' age); ``monotonic``
    measures the grace interval within this process (default: ``time.monotonic`` with the
    system wall clock, else ``clock`` itself, so an injected virtual clock drives both).
    """

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: GcOptions | None = None,
        *,
        edit_manifest: ManifestEditor | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._store = store
        self._prefix = prefix.strip("/")
        self._opts = options or GcOptions()
        self._edit = edit_manifest or self._edit_standalone
        self._clock = clock
        self._mono = (
            monotonic
            if monotonic is not None
            else (time.monotonic if clock is time.time else clock)
        )
        self._cache = SnapshotCache(256)
        self.cursors = CursorStore(store, prefix, self._opts.writer_name)

    async def _edit_standalone(self, fn: Callable[[Manifest], Manifest]) -> Manifest:
        """A fenced manifest edit without a writer (compare-and-swap until it lands)."""
        for _ in range(64):
            loaded = await load_manifest(self._store, self._prefix)
            if loaded is None:
                raise GarbageRejected(f"no log at {self._prefix}")
            m, etag = loaded
            new = fn(m)
            if new is m:
                return m
            try:
                await put_resolving(
                    self._store, join(self._prefix, MANIFEST_PATH), new.to_bytes(), if_match=etag
                )
                return new
            except PreconditionFailed:
                continue
        raise GarbageRejected("manifest kept changing under the collector")

    async def _load_garbage(self, *, normalize: bool = True) -> tuple[Garbage | None, str | None]:
        try:
            got = await self._store.get(join(self._prefix, GARBAGE_PATH))
        except ObjectNotFound:
            return None, None
        g = Garbage.from_bytes(got.data)
        if g is None and normalize and got.data.strip() == b"{}":
            # Our idle form before issue 16, which Rust cannot decode (its collector would fail
            # on this log for good): rewrite it as Rust's Garbage::empty().
            try:
                return None, await self._store_garbage(None, got.etag)
            except PreconditionFailed:
                return await self._load_garbage(normalize=False)  # someone else moved it on
        return g, got.etag

    async def _store_garbage(self, g: Garbage | None, etag: str | None) -> str:
        # Idle is Rust's Garbage::empty(), never "{}": Rust cannot decode "{}".
        data = g.to_bytes() if g is not None else EMPTY_GARBAGE
        key = join(self._prefix, GARBAGE_PATH)
        if etag is None:
            return await put_resolving(self._store, key, data, if_none_match="*")
        return await put_resolving(self._store, key, data, if_match=etag)

    def pinned_at(self, cursors: dict[str, Witness]) -> int:
        """The lowest offset the cursors pin: nothing at or above it may be dropped.  The intrinsic
        cursor pins offset 1 while it does not exist (nothing is compacted yet)."""
        low = min((w.cursor.offset for w in cursors.values()), default=1)
        name = self._opts.intrinsic_cursor
        if name is not None and name not in cursors:
            low = 1
        return low

    async def cutoff(self) -> tuple[int, Manifest] | None:
        """The cursor dance: the minimum cursor, consistent with the manifest read between.

        None when the cursors kept moving throughout (try again later)."""
        for _ in range(8):
            before = await self.cursors.load_all()
            loaded = await load_manifest(self._store, self._prefix)
            if loaded is None:
                raise GarbageRejected(f"no log at {self._prefix}")
            after = await self.cursors.load_all()
            if {k: v.etag for k, v in before.items()} == {k: v.etag for k, v in after.items()}:
                if not after:
                    raise NoCursors(f"{self._prefix} has no cursors: nothing can be collected")
                m = loaded[0]
                ahead = sorted(n for n, w in after.items() if w.cursor.offset > m.next_offset)
                if ahead:
                    # A cursor past the tail does not describe this log (a leftover of a fork
                    # that never committed, say): trusting it would collect what no compaction
                    # folded.  Collect nothing until it is put right.
                    _log.warning(
                        "%s: cursor(s) %s point past the tail %d; not collecting",
                        self._prefix,
                        ahead,
                        m.next_offset,
                    )
                    return 1, m
                return self.pinned_at(after), m
        return None

    async def run_once(self, *, sweep_orphans: bool = True) -> GcReport:
        """Advance garbage collection as far as it can go now."""
        report = GcReport()
        try:
            await self._run(report, sweep_orphans)
        except PreconditionFailed as e:
            # Another collector moved gc/GARBAGE on under this pass (it reset, marked or
            # finished the plan first): what it did stands, and the next pass resumes from it.
            report.phase = "busy"
            report.notes.append(f"another collector moved the plan on: {e}")
        return report

    async def _run(self, report: GcReport, sweep_orphans: bool) -> None:
        garbage, etag = await self._load_garbage()
        if garbage is None:
            garbage, etag = await self._phase1(report, etag)
            if garbage is None:
                if sweep_orphans and report.phase != "busy":
                    await self._sweep_orphans(report, None)
                return
        if garbage.legacy:
            # A pre-issue-16 plan lacks the pointers to apply it by Rust's rules.  Resetting
            # deletes nothing; what it already unlinked is below the live range, where the
            # orphan sweep reclaims it after the grace interval.
            report.notes.append("reset a plan in the pre-issue-16 schema")
            await self._store_garbage(None, etag)
            report.phase = "discarded"
            return
        if garbage.applied_us is None:
            garbage, etag = await self._phase2(report, garbage, etag)
            if garbage is None:
                return
        assert etag is not None
        await self._phase3(report, garbage, etag)
        if sweep_orphans and report.phase == "done":
            await self._sweep_orphans(report, None)

    async def _phase1(
        self, report: GcReport, etag: str | None
    ) -> tuple[Garbage | None, str | None]:
        dance = await self.cutoff()
        if dance is None:
            report.phase = "busy"
            report.notes.append("cursors kept moving during the dance; try again later")
            return None, etag
        cutoff, m = dance
        report.cutoff = cutoff
        if cutoff <= m.oldest_offset:
            return None, etag

        async def put_snapshot(s: Snapshot) -> None:
            await ensure_object(self._store, join(self._prefix, s.path), s.to_bytes())

        g = await plan_cut(
            self._store,
            self._prefix,
            m,
            cutoff,
            self._cache,
            self._opts.writer_name,
            put_snapshot,
            int(self._clock() * 1_000_000),
            keep_tail=True,
            max_bytes=fraction_budget(m, self._opts),
        )
        if g is None:
            return None, etag
        verify_garbage(g, m, self._opts, pinned_at=cutoff)
        try:
            etag = await self._store_garbage(g, etag)
        except PreconditionFailed:
            report.notes.append("another collector wrote the garbage file first")
            return await self._load_garbage()
        report.phase = "computed"
        report.setsum_discarded = g.setsum_to_discard.hexdigest()
        return g, etag

    async def _phase2(
        self, report: GcReport, g: Garbage, etag: str | None, attempts: int = _FLOOR_ATTEMPTS
    ) -> tuple[Garbage | None, str | None]:
        """Verify the plan against the stored manifest and the cursors, apply it, mark it
        applied.  Every plan is verified, ours included: ``created_us`` is a field anyone can
        write, and an older version of ours may have planned it.

        **The commit point is shared with ``pin_cursor``.**  Both sides pass through the
        manifest by compare-and-swap: (1) the collector announces the cut by writing a pending
        floor (``gc_floor``: the plan's ``first_to_keep`` and a fresh nonce) into the manifest;
        (2) *then* it re-reads the cursors, and discards the plan if one pins below the floor;
        (3) the cut is a compare-and-swap from a manifest that still holds exactly that floor,
        and removes it.  ``pin_cursor`` writes its cursor, *then* reads the manifest: a floor
        above its offset is retracted by compare-and-swap before the pin is accepted.  The
        nonce is written only in (1), and every manifest write is a compare-and-swap on the
        bytes it was computed from, so the floor, once gone, never comes back; a cut therefore
        lands only if the floor stood from (1) to (3).  For a pin accepted at ``c`` below the
        floor: its manifest read came before (1) (then its cursor was written before (2), which
        sees it: no cut), or between (1) and (3) (it saw the floor and retracted it: no cut), or
        after (3) (it saw the cut, and answered 410).  So no cut passes an accepted pin, however
        long the collector stalls anywhere, and whichever collector (or a second one working on
        the same plan) makes the cut.

        Crash order (collector): verify → floor written → cursors read → snapshots installed →
        cut (clears the floor) → ``applied_us`` written.  A crash before the cut leaves at most
        a floor nobody will cut with (the next pass writes its own, a pin retracts it) and a
        pending plan that is verified again; a crash after it leaves the plan in the manifest,
        which the next pass marks applied, **never discards** (whatever the cursors say then:
        the cut is made, and its grace must run before anything it unlinked is deleted).  A
        discard first clears any floor (so no collector in flight can cut with it), unless the
        manifest already holds the plan, which is then marked applied instead; then resets the
        file.  A crash between the two redoes phase 2.  Crash order (reader): a crash after its
        cursor write leaves a cursor that only pins more; after a retraction, a cursor and no
        floor: the cut is not made and the next phase 2 sees the cursor.

        A plan that fails verification is reset to ``Garbage::empty()``: nothing of it was
        applied, so nothing can be lost, and the log stays collectable (an operator is not
        needed); snapshots its author installed become orphans the sweep reclaims once the log
        is collected past them.  A floor lost before the cut (retracted, replaced by another
        collector's, or dropped by a Rust writer) is not cut with.  With no floor in its place,
        the pass starts over from the manifest read (a fresh floor, the cursors read again) up
        to ``_FLOOR_ATTEMPTS`` announcements in all; after those, or when another collector's
        floor replaced it (that one is cutting), the plan stays and the next pass decides again.
        """
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is None:
            raise GarbageRejected(f"no log at {self._prefix}")
        m = loaded[0]
        if m.oldest_offset >= g.first_to_keep:
            # Applied already: a crash after the cut, another collector, or Rust.  Never
            # discarded (the cursors no longer matter: the cut is made): marked, so the grace of
            # what it unlinked is timed and phase 3 deletes it.
            report.notes.append("the manifest holds the plan already")
            return await self._mark_applied(report, g, etag, m)
        try:
            verify_garbage(g, m, self._opts)
            cut = await verify_cut(self._store, self._prefix, g, m)
        except GarbageRejected as e:
            # Stale (the writer snapshotted the prefix meanwhile) or wrong: start over later.
            return await self._discard(report, g, etag, f"discarded garbage: {e}")
        floor = GcFloor(g.first_to_keep, secrets.token_hex(16))
        writer = self._opts.writer_name

        def announce(cur: Manifest) -> Manifest:
            if cur.oldest_offset >= floor.offset:
                return cur  # applied meanwhile
            return replace(cur, gc_floor=floor, writer=writer)

        announced = await self._edit(announce)
        if announced.oldest_offset >= g.first_to_keep:
            return await self._mark_applied(report, g, etag, announced)
        # Re-read the cursors *after* the floor is in the manifest: a reader that pinned before
        # this read is seen here; one that pins after it finds the floor and retracts it.
        pinned = self.pinned_at(await self.cursors.load_all())
        if pinned < g.first_to_keep:
            return await self._discard(
                report, g, etag, f"a cursor now pins {pinned}, below the plan's {g.first_to_keep}"
            )
        try:
            await self._install(cut)
            new = await self._edit(cut.edit(g, writer, floor))
        except FloorLost as e:
            if not e.replaced and attempts > 1:
                report.notes.append(f"{e}: announced again")
                return await self._phase2(report, g, etag, attempts - 1)
            report.phase = "busy"
            report.notes.append(f"{e}: the plan is decided again next pass")
            return None, None
        except GarbageRejected as e:
            return await self._discard(report, g, etag, f"discarded garbage: {e}")
        return await self._mark_applied(report, g, etag, new)

    async def _mark_applied(
        self, report: GcReport, g: Garbage, etag: str | None, m: Manifest
    ) -> tuple[Garbage | None, str | None]:
        """``m``, just read or written, holds the plan: the grace starts now (this process's
        observation), and the file says so (its Last-Modified dates the cut for others)."""
        self._seen_applied(g)
        await self._observe(m)
        # applied_us is for older versions of ours, which time the grace from it; this one
        # only reads that it is set.
        applied = replace(g, applied_us=int(self._clock() * 1_000_000))
        etag = await self._store_garbage(applied, etag)
        report.phase = "applied"
        return applied, etag

    async def _discard(
        self, report: GcReport, g: Garbage, etag: str | None, why: str
    ) -> tuple[Garbage | None, str | None]:
        """Give the plan up: clear any pending floor first (no collector in flight can cut
        with it any more), unless the manifest holds the plan by then (then it is marked
        applied, never discarded); then reset the file."""
        writer = self._opts.writer_name

        def clear(cur: Manifest) -> Manifest:
            if cur.oldest_offset >= g.first_to_keep or cur.gc_floor is None:
                return cur
            return replace(cur, gc_floor=None, writer=writer)

        after = await self._edit(clear)
        if after.oldest_offset >= g.first_to_keep:
            report.notes.append(f"not discarded ({why}): the manifest holds the plan")
            return await self._mark_applied(report, g, etag, after)
        _log.warning("%s: %s", self._prefix, why)
        report.notes.append(why)
        await self._store_garbage(None, etag)
        report.phase = "discarded"
        return None, None

    async def _install(self, cut: VerifiedCut) -> None:
        """Install the snapshots a verified plan needs, and make sure the store holds exactly
        them (a create-only put keeps whatever got there first)."""
        for snap in cut.install:
            key = join(self._prefix, snap.path)
            await ensure_object(self._store, key, snap.to_bytes())
            try:
                stored = Snapshot.from_bytes((await self._store.get(key)).data)
            except (ObjectNotFound, CorruptManifest):
                stored = None
            if stored != snap:
                raise GarbageRejected(f"{snap.path} in the store is not the snapshot verified")

    def _seen_applied(self, g: Garbage) -> float:
        """When this process first saw ``g`` applied (now, if it had not), monotonic time."""
        seen = _SEEN_APPLIED.setdefault(self._store, {})
        key = (self._prefix, id(self._mono))
        got = seen.get(key)
        if got is not None and got[0] == _plan_key(g) and got[1] is self._mono:
            return got[2]
        now = self._mono()
        seen[key] = (_plan_key(g), self._mono, now)
        return now

    def _forget_applied(self) -> None:
        _SEEN_APPLIED.get(self._store, {}).pop((self._prefix, id(self._mono)), None)

    async def _store_now(self) -> float:
        """The store's current time: the Last-Modified of a probe written now (``gc/CLOCK``).

        Any Last-Modified read is at most the store's time when it was read, so this is a lower
        bound of "now" on the clock that dates every object; no local clock is involved (a
        collector host with a fast clock cannot shorten a grace)."""
        key = join(self._prefix, CLOCK_PATH)
        await self._store.put(
            key, json.dumps({"writer": self._opts.writer_name}, separators=(",", ":")).encode()
        )
        return (await self._store.head(key)).last_modified

    async def _store_waited(self, etag: str) -> float:
        """How long ago, by the store's own clock, the applied plan was written: the store's
        now (:meth:`_store_now`) minus the plan file's Last-Modified, less S3's one-second
        resolution.  This lets a process that did not apply the plan (a restart, the CLI) finish
        it without waiting a whole grace again — on an idle log too, where nothing else writes
        — while no local clock and no time written in a file is involved.  It assumes whoever
        wrote the applied file had seen the plan in the manifest first, as phase 2 of ours does
        (phase 3 resets a marker the manifest contradicts)."""
        try:
            plan = await self._store.head(join(self._prefix, GARBAGE_PATH))
        except ObjectNotFound:
            return 0.0
        if plan.etag.strip('"') != etag.strip('"'):
            return 0.0  # the file changed since it was read: measure again next pass
        return await self._store_now() - plan.last_modified - _LAST_MODIFIED_SLACK_S

    async def _observe(self, m: Manifest) -> tuple[int, int]:
        """Note that the stored manifest, read (or written) just now, starts at ``m``'s oldest
        offset and first live sequence number; returns them."""
        seen = (m.oldest_offset, await min_live_seq(self._store, self._prefix, m, self._cache))
        per_store = _OBSERVED.setdefault(self._store, {})
        key = (self._prefix, id(self._mono))
        got = per_store.get(key)
        if got is None or got[0] is not self._mono:
            got = (self._mono, [])
            per_store[key] = got
        hist = got[1]
        if hist and (seen[0] < hist[-1][1] or seen[1] < hist[-1][2]):
            # The live range only grows in one log's life: a smaller one is another log at this
            # prefix (deleted and created again), and nothing seen of the old one says anything.
            hist.clear()
        if not hist or hist[-1][1:] != seen:
            hist.append((self._mono(), *seen))
        return seen

    def _observed_floor(self) -> tuple[int, int] | None:
        """The oldest offset and first live sequence number this process saw in the manifest at
        least a grace ago (both only grow, so nothing below them has been reachable since)."""
        got = _OBSERVED.get(self._store, {}).get((self._prefix, id(self._mono)))
        if got is None or got[0] is not self._mono:
            return None
        hist = got[1]
        now = self._mono()
        aged = [i for i, h in enumerate(hist) if now - h[0] >= self._opts.grace_s]
        if not aged:
            return None
        del hist[: aged[-1]]  # keep the newest aged observation and the younger ones
        return hist[0][1], hist[0][2]

    async def _marked_floor(self, seen: tuple[int, int]) -> tuple[int, int] | None:
        """The same as :meth:`_observed_floor` across processes (the CLI, a restart): the
        ``gc/OLDEST`` marker holds an oldest offset and first live sequence number a collector
        saw in the manifest before writing it, so its Last-Modified, on the store's clock, is
        after the manifest started there.  Aged past the grace, it is used, and replaced by
        ``seen`` (which then ages in its turn); absent, it is written.  Its values are capped
        by ``seen``: a marker claiming more than the manifest shows is not believed."""
        key = join(self._prefix, OLDEST_PATH)
        body = json.dumps(
            {"oldest_offset": seen[0], "first_live_seq_no": seen[1]}, separators=(",", ":")
        ).encode()
        try:
            meta = await self._store.head(key)
            got = await self._store.get(key)
        except ObjectNotFound:
            await self._store.put(key, body)
            return None
        if got.etag.strip('"') != meta.etag.strip('"'):
            return None  # rewritten in between: try again next pass
        try:
            obj = loads(got.data, OLDEST_PATH)
            if not isinstance(obj, dict):
                raise GarbageRejected(f"{OLDEST_PATH} is not a JSON object")
            marked = (_g_int(obj, "oldest_offset"), _g_int(obj, "first_live_seq_no"))
        except (CorruptManifest, GarbageRejected):
            await self._store.put(key, body)
            return None
        if (
            await self._store_now() - meta.last_modified - _LAST_MODIFIED_SLACK_S
            < self._opts.grace_s
        ):
            return None
        if marked != seen:
            await self._store.put(key, body)
        return min(marked[0], seen[0]), min(marked[1], seen[1])

    async def _phase3(self, report: GcReport, g: Garbage, etag: str) -> None:
        """Delete what the applied plan unlinked, once the grace interval has passed.

        The grace runs from this process's first sight of the plan in the manifest (monotonic
        time: a wall clock stepped forward does not shorten it), or by the store's clock from
        when the applied file was written (its Last-Modified against a probe's, so an idle log
        finishes too); ``applied_us`` is never read (finding e of issue 16: a file from 1970
        skipped the grace).  Across a restart the in-process part is lost,
        so the grace can only get longer, never shorter.  Crash order: the deletes are
        idempotent and the plan is reset last, so a crash in between redoes them.
        """
        assert g.applied_us is not None
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is None:
            raise GarbageRejected(f"no log at {self._prefix}")
        m = loaded[0]
        if m.oldest_offset < g.first_to_keep:
            # Marked applied, yet the manifest holds the plan: whoever marked it did so before
            # applying it (or never did).  Nothing it lists is unreferenced and no grace has
            # begun: resume it as pending, so phase 2 verifies it and marks it once it is seen
            # in the manifest.
            report.notes.append(
                "the plan is marked applied but the manifest holds it: resumed as pending"
            )
            pending = replace(g, applied_us=None)
            await self._phase2(report, pending, await self._store_garbage(pending, etag))
            return
        waited = self._mono() - self._seen_applied(g)
        if waited < self._opts.grace_s:
            waited = max(waited, await self._store_waited(etag))
        if waited < self._opts.grace_s:
            report.phase = "waiting"
            report.waiting_s = self._opts.grace_s - waited
            return
        # Affirmative checks right before deleting: no cursor pins what is listed (a reader that
        # pinned it after all keeps it; the pin must move or go before anything is deleted), and
        # nothing listed is referenced any more.  Only what passes is deleted.
        pinned = self.pinned_at(await self.cursors.load_all())
        if pinned < g.first_to_keep:
            report.phase = "pinned"
            report.notes.append(
                f"a cursor pins {pinned}, below the plan's {g.first_to_keep}: "
                "nothing deleted until it moves"
            )
            return
        first_live = await min_live_seq(self._store, self._prefix, m, self._cache)
        if first_live < g.first_seq_to_keep:
            report.notes.append("a fragment listed for deletion is still referenced: kept")
        live = await live_snapshot_paths(self._store, self._prefix, m, self._cache)
        if referenced := live & set(g.snapshots_to_delete):
            report.notes.append(
                f"{len(referenced)} snapshot(s) listed for deletion are still referenced: kept"
            )
        # The newest fragments are kept for the idempotency window; the sweep takes them later.
        upto = min(g.first_seq_to_keep, first_live, m.next_seq_no - self._opts.retain_fragments)
        keys = [
            join(self._prefix, fragment_path(s)) for s in range(max(1, g.first_seq_to_delete), upto)
        ]
        report.fragments_deleted = await self._delete(keys)
        # Only snapshot names: a plan is data from whoever wrote the file (Rust deletes any path
        # it lists), and "manifest/MANIFEST" or "../x" must never be deleted because of one.  And
        # only snapshots whose stored object starts below the cut (dropped whole, or split), by
        # what the object holds, not by the range the plan claims for it: one at or above the
        # cut may be a writer's upload about to be linked.
        names = [p for p in g.snapshots_to_delete if p not in live and is_snapshot_path(p)]
        report.snapshots_deleted = await self._delete(
            [
                join(self._prefix, p)
                for p in await self._starting_below(names, g.first_to_keep, report)
            ]
        )
        await self._store_garbage(None, etag)
        self._forget_applied()
        report.phase = "done"

    async def _starting_below(self, names: list[str], cut: int, report: GcReport) -> list[str]:
        """The snapshots among ``names`` whose stored object holds a record below ``cut``."""

        async def first_offset(name: str) -> int | None:
            try:
                snap = Snapshot.from_bytes((await self._store.get(join(self._prefix, name))).data)
            except ObjectNotFound:
                return None  # deleted already (a retried phase 3)
            except CorruptManifest:
                report.notes.append(f"unreadable snapshot {name} left in place")
                return None
            return snap.children[0].start

        out: list[str] = []
        step = max(1, self._opts.delete_batch)
        for i in range(0, len(names), step):
            chunk = names[i : i + step]
            starts = await asyncio.gather(*(first_offset(n) for n in chunk))
            out += [
                n
                for n, start in zip(chunk, starts, strict=True)
                if start is not None and start < cut
            ]
        return out

    async def _delete(self, keys: list[str]) -> int:
        """Delete in batches, no faster than the configured rate."""
        batch = max(1, self._opts.delete_batch)
        for i in range(0, len(keys), batch):
            chunk = keys[i : i + batch]
            started = time.monotonic()
            await asyncio.gather(*(self._store.delete(k) for k in chunk))
            budget = len(chunk) / self._opts.deletes_per_second
            elapsed = time.monotonic() - started
            if elapsed < budget and i + batch < len(keys):
                await asyncio.sleep(budget - elapsed)  # rate limit, not synchronisation
        return len(keys)

    async def _sweep_orphans(self, report: GcReport, _g: Garbage | None) -> None:
        """Delete objects no manifest will ever reference, once no reader can still be reading
        them: only below an oldest offset (and first live sequence number) the manifest has
        shown for at least the grace interval — by this process's observation, or by the
        ``gc/OLDEST`` marker on the store's clock — never by an object's age.  An object written
        long ago may have been unlinked a moment ago (by another collector's cut, by a plan Rust
        reset after we applied it, by a plan whose marker was lost to a crash), and a reader of
        the manifest before that cut may still be reading it."""
        garbage, _ = await self._load_garbage()
        if garbage is not None:
            return  # a plan in flight owns the objects around the cut; sweep after it finishes
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is None:
            return
        m = loaded[0]
        # A plan planned, applied and marked between the two reads owns what its cut unlinked
        # (its phase 3 deletes it after the grace): look again after the manifest read.
        again, _ = await self._load_garbage(normalize=False)
        if again is not None:
            return
        if self.pinned_at(await self.cursors.load_all()) < m.oldest_offset:
            report.notes.append("a cursor pins collected offsets: the sweep waits")
            return
        seen = await self._observe(m)
        floor = self._observed_floor()
        if floor is None or floor != seen:
            marked = await self._marked_floor(seen)
            if marked is not None:
                floor = (
                    marked
                    if floor is None
                    else (max(floor[0], marked[0]), max(floor[1], marked[1]))
                )
        if floor is None:
            report.notes.append("the live range has not been seen for a grace yet: the sweep waits")
            return
        # Never past what the manifest shows now, whatever was observed or marked before.
        swept_offset, swept_seq = min(floor[0], seen[0]), min(floor[1], seen[1])
        now = self._clock()
        horizon = now - self._opts.grace_s
        retain_horizon = now - max(self._opts.grace_s, self._opts.retain_s)
        retain_from = m.next_seq_no - self._opts.retain_fragments
        doomed: list[str] = []
        scanned = 0
        base = join(self._prefix, LOG_PREFIX)
        async for meta in self._store.list(base):
            scanned += 1
            if scanned > self._opts.orphan_scan_limit:
                break
            seq = parse_fragment_path(
                meta.key[len(self._prefix) + 1 :] if self._prefix else meta.key
            )
            if seq is None:
                continue
            if seq >= swept_seq:
                break  # keys list in sequence order: the rest is live, recent or beyond the tail
            if meta.last_modified < horizon and (
                seq < retain_from or meta.last_modified < retain_horizon
            ):
                doomed.append(meta.key)
        # An unlinked snapshot is only certainly dead once its whole range is below the live
        # range: above it, a writer may still link a snapshot with the same (content) name.
        live = await live_snapshot_paths(self._store, self._prefix, m, self._cache)
        async for meta in self._store.list(join(self._prefix, SNAPSHOT_PREFIX)):
            rel = meta.key[len(self._prefix) + 1 :] if self._prefix else meta.key
            if not is_snapshot_path(rel):
                continue  # not this log's snapshot (another log nested under this prefix)
            if rel in live or meta.last_modified >= horizon:
                continue
            try:
                snap = Snapshot.from_bytes((await self._store.get(meta.key)).data)
            except ObjectNotFound:
                continue
            except CorruptManifest:
                report.notes.append(f"unreadable snapshot {rel} left in place")
                continue
            if snap.children[-1].limit <= swept_offset:
                doomed.append(meta.key)
        report.orphans_deleted += await self._delete(doomed)


# ------------------------------------------------------------------------ pinning a position


async def pin_cursor(
    store: ObjectStore,
    prefix: str,
    cursors: CursorStore,
    name: str,
    offset: int,
    witness: str | None,
) -> Witness:
    """Create (``witness`` None) or compare-and-swap a cursor to ``offset``, then confirm that no
    garbage collection has passed it or is about to; raises LogPurged (after undoing the write)
    when one has.

    The reader's half of the collection dance: write the cursor, *then* read ``gc/GARBAGE`` and the
    stored manifest.  A plan pending in ``gc/GARBAGE`` above ``offset`` answers 410 (as before the
    floor existed: a collector of an older version applies it without a floor).  A pending floor
    above ``offset`` in the manifest (a collector between announcing its cut and making it) is
    retracted by compare-and-swap, and only then is the pin accepted; a manifest already cut past
    ``offset`` answers 410.  The collector writes its floor, *then* re-reads the cursors, and cuts
    only from a manifest still holding its floor: so either it sees this cursor, or this sees
    its floor and retracts it, or this sees the cut (the argument in full:
    ``GarbageCollector._phase2``).  The stored manifest is read, never a writer's in-memory one:
    another process may be collecting.  A retraction that keeps losing its compare-and-swap
    (a busy log) gives the pin up after a few attempts: 410, the conservative answer.
    """
    prefix = prefix.strip("/")
    before = await cursors.load(name) if witness is not None else None
    w = (
        await cursors.init(name, offset)
        if witness is None
        else await cursors.save(name, offset, witness)
    )
    floor = 0
    try:
        got = await store.get(join(prefix, GARBAGE_PATH))
        pending = Garbage.from_bytes(got.data)
        if pending is not None:
            floor = pending.first_to_keep
    except ObjectNotFound:
        pass
    key = join(prefix, MANIFEST_PATH)
    for _ in range(_RETRACT_ATTEMPTS):
        loaded = await load_manifest(store, prefix)
        if loaded is None:
            break
        m, etag = loaded
        floor = max(floor, m.oldest_offset)
        announced = m.gc_floor
        if offset >= floor and announced is not None and announced.offset > offset:
            # A collector announced a cut above this pin and may be about to make it: retract
            # its floor, so that cut can never land (it needs this very floor to be there).
            try:
                await put_resolving(store, key, replace(m, gc_floor=None).to_bytes(), if_match=etag)
            except PreconditionFailed:
                continue  # the manifest moved: look again (it may be cut by now)
        break
    else:
        floor = max(floor, offset + 1)  # could not retract: a collection is still in flight
    if offset >= floor:
        return w
    # Undo, so the cursor does not pin what is already gone (which would hold collection back).
    with contextlib.suppress(CursorConflict, CursorNotFound, ObjectNotFound, PreconditionFailed):
        if before is not None and before.etag == witness:
            await cursors.save(name, before.cursor.offset, w)
        else:
            current = await cursors.load(name)
            if current is not None and current.etag == w.etag:
                await cursors.delete(name)
    raise LogPurged(offset, floor)
