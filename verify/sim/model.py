"""The model: what the store must hold, checked as objects land and after every step.

Checks (each violation names its check):

* ``manifest``: every manifest that lands decodes and passes ``Manifest.check`` (contiguous ranges,
  sequential fragment numbers, setsum balance); it never regresses (tail, oldest offset).
* ``reachable``: everything the manifest reaches exists, matches its pointer (snapshots: the same
  pointer; fragments: the recorded MD5, setsum and range), and the leaves are contiguous.
* ``stable``: a record, once observed at an offset, never changes (offset, timestamp, body).
* ``acked``: an acknowledged append is in the log at the offsets it was answered with, once, and
  with the timestamp it was answered with (a retry answered from an idempotency key included:
  from memory, a spilled key's footer, or a key learned after a restart).
* ``once``: no append (acknowledged or not) is in the log twice; no idempotency key twice within
  the dedup window.
* ``contention``: an append answered ``LogContention`` is never in the log, and the answer is only
  given when another writer appended since this writer opened.
* ``overwrite``: a fragment object that was ever linked is never overwritten.
* ``cursor-delete``: no linked fragment holding an offset at or above a cursor that exists at
  that moment is deleted.
* ``cursor-reach``: an established pin (a cursor written at or above the oldest offset, with no
  pending plan cutting above it when re-checked) keeps its offset readable: oldest <= offset.
* ``plan``: a garbage plan never cuts above the highest value that any cursor held throughout the
  collector pass that computed it.
* ``grace``: no object the log's manifest referenced within the last ``grace_s`` (virtual time) is
  deleted, and no fragment at or above an accepted pin (``pin_cursor`` answered it) is deleted
  while the pin stands: a reader that loaded an older manifest may still be reading it.  When
  each object stopped being reachable from the stored manifest is recorded as manifests land.
* ``lease-read`` and ``monotonic`` (seeds with read leases): a read of the primary log, from the
  store or through a live writer's leased memory as the log host answers, returns every record
  acknowledged before it began, and every record a read that finished before it began returned.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field

from wal3.cursors import Cursor
from wal3.errors import CorruptFragment, CorruptManifest, GarbageRejected
from wal3.fragment import DecodedFragment, decode_fragment
from wal3.gc import Garbage
from wal3.manifest import FragmentPointer, Manifest, Snapshot
from wal3.paths import (
    CURSOR_PREFIX,
    GARBAGE_PATH,
    LOG_PREFIX,
    MANIFEST_PATH,
    SNAPSHOT_PREFIX,
    join,
    parse_fragment_path,
)
from wal3.writer import AppendResult

from .store import Actor, Obj


class Violation(Exception):
    """An invariant failed."""

    def __init__(self, check: str, detail: str) -> None:
        super().__init__(f"[{check}] {detail}")
        self.check = check
        self.detail = detail

    def __reduce__(self) -> tuple[type[Violation], tuple[str, str]]:
        return (Violation, (self.check, self.detail))  # results cross process boundaries


def encode_body(attempt: int, index: int, pad: int) -> bytes:
    """A record body naming its append attempt and position, so duplicates are visible."""
    return f"a{attempt}.{index}|".encode() + b"x" * pad


def decode_body(body: bytes) -> tuple[int, int] | None:
    """(attempt, index) of a body written by the simulation."""
    head = body.split(b"|", 1)[0]
    if not head.startswith(b"a"):
        return None
    a, _, i = head[1:].partition(b".")
    try:
        return int(a), int(i)
    except ValueError:
        return None


@dataclass(eq=False)
class Attempt:
    """One call of ``append_many``."""

    id: int
    logical: int  # attempts of one logical append share an idempotency key
    key: str | None
    count: int
    writer: str  # the writer process (actor) it was given to
    writer_opened: float
    outcome: str = "pending"  # pending | acked | dedup | contention | failed | lost
    result: AppendResult | None = None
    error: str = ""


@dataclass
class LogView:
    """What one walk of a log found."""

    manifest: Manifest
    leaves: list[FragmentPointer]


@dataclass
class _Log:
    prefix: str
    manifest: Manifest | None = None
    verified: set[tuple[str, str | None]] = field(default_factory=set)


class Model:
    """Tracks every append attempt and checks the store's truth against it."""

    def __init__(
        self,
        prefix: str,
        now: Callable[[], float],
        trace: Callable[[str], None],
        objects: dict[str, Obj],
        dedup_window: int,
        grace_s: float = 0.0,
    ) -> None:
        self.prefix = prefix
        self.now = now
        self.trace = trace
        self.objects = objects
        self.dedup_window = dedup_window
        self.grace_s = grace_s
        # The primary log's root pointers (by path) -> every object key reachable under each, and
        # when each key stopped being reachable from the stored manifest.
        self.roots: dict[str, frozenset[str]] = {}
        self.left_at: dict[str, float] = {}
        self._closures: dict[str, frozenset[str]] = {}
        self.violations: list[Violation] = []
        self.attempts: dict[int, Attempt] = {}
        self.logicals: dict[int, list[int]] = {}
        self.logs: dict[str, _Log] = {prefix: _Log(prefix)}
        self.observed: dict[str, dict[int, tuple[int, bytes, int]]] = {prefix: {}}
        self.where: dict[int, dict[int, int]] = {}  # attempt -> index -> offset (primary log)
        self.linked: dict[tuple[str, str], tuple[int, int]] = {}  # (key, md5) -> [start, limit)
        self.seq_appends: list[tuple[float, str]] = []  # (time, actor) of installs adding fragments
        self.cursor_hist: dict[str, list[tuple[float, int | None]]] = {}
        self.progress_key: str | None = None  # a cursor that is only ever advanced (cursor-back)
        self.established: dict[str, tuple[str, int]] = {}  # cursor -> (etag, offset)
        self.gc_started: dict[str, float] = {}  # collector actor -> start of its current pass
        self.unverified: list[int] = []
        # Reads of the primary log: the next offset past every record acknowledged so far, and
        # the highest next offset a finished read returned (``monotonic``).
        self.acked_next = 1
        self.visible_next = 1
        self.root_emptied = False  # a collector once dropped every root pointer (no tail left)
        self.onto_empty: list[tuple[int, int, str]] = []  # linked while the root had no tail
        self._decoded: dict[str, DecodedFragment] = {}
        self._snaps: dict[str, Snapshot] = {}
        self._manifests: dict[str, Manifest] = {}

    # ---------------------------------------------------------------------------- helpers

    def violate(self, check: str, detail: str) -> None:
        v = Violation(check, detail)
        self.trace(f"VIOLATION {v}")
        self.violations.append(v)

    def add_log(self, prefix: str) -> None:
        self.logs.setdefault(prefix, _Log(prefix))
        self.observed.setdefault(prefix, {})

    def _parse_manifest(self, data: bytes, etag: str) -> Manifest:
        m = self._manifests.get(etag)
        if m is None:
            m = Manifest.from_bytes(data)
            self._manifests[etag] = m
        return m

    def cursors_now(self, prefix: str) -> dict[str, int]:
        """Cursor name -> offset, as stored right now."""
        base = join(prefix, CURSOR_PREFIX)
        out: dict[str, int] = {}
        for k, o in self.objects.items():
            if k.startswith(base) and k.endswith(".json"):
                try:
                    out[k[len(base) : -5]] = Cursor.from_bytes(o.data).offset
                except CorruptManifest:
                    self.violate("cursor", f"{k} does not decode")
        return out

    # ------------------------------------------------------------------- store observations

    def on_put(self, actor: Actor, key: str, old: Obj | None, new: Obj) -> None:
        try:
            self._on_put(actor, key, old, new)
        except Exception as e:
            self.violate("model", f"observing a put of {key}: {e!r}")

    def on_delete(self, actor: Actor, key: str, old: Obj) -> None:
        try:
            self._on_delete(actor, key, old)
        except Exception as e:
            self.violate("model", f"observing a delete of {key}: {e!r}")

    def _on_put(self, actor: Actor, key: str, old: Obj | None, new: Obj) -> None:
        if old is not None and (key, old.etag) in self.linked and old.etag != new.etag:
            self.violate("overwrite", f"{actor.name} overwrote linked fragment {key}")
        for prefix in self.logs:
            if key == join(prefix, MANIFEST_PATH):
                self._on_manifest(actor, prefix, old, new)
                return
        if key.startswith(join(self.prefix, CURSOR_PREFIX)):
            try:
                off: int | None = Cursor.from_bytes(new.data).offset
            except CorruptManifest:
                off = None
            hist = self.cursor_hist.setdefault(key, [])
            if key == self.progress_key and hist and off is not None:
                last = hist[-1][1]  # None: deleted since, so it starts afresh
                if last is not None and off < last:
                    self.violate(
                        "cursor-back",
                        f"{actor.name} moved {key} back from {last} to {off} (only ever advanced)",
                    )
            hist.append((self.now(), off))
        elif key == join(self.prefix, GARBAGE_PATH):
            self._on_garbage(actor, new)

    def _on_manifest(self, actor: Actor, prefix: str, old: Obj | None, new: Obj) -> None:
        try:
            m = self._parse_manifest(new.data, new.etag)
        except CorruptManifest as e:
            self.violate("manifest", f"{actor.name} installed a bad manifest: {e}")
            return
        if prefix == self.prefix and not m.entries and m.next_offset > 1:
            self.root_emptied = True
        if prefix == self.prefix:
            self._track_reachable(m)
        for f in m.fragments:
            if f.content_md5 is not None:
                self.linked[(join(prefix, f.path), f.content_md5)] = (f.start, f.limit)
        if old is None:
            return
        try:
            before = self._parse_manifest(old.data, old.etag)
        except CorruptManifest:
            return
        if m.next_offset < before.next_offset or m.oldest_offset < before.oldest_offset:
            self.violate(
                "manifest",
                f"{actor.name} moved the manifest back: "
                f"[{before.oldest_offset},{before.next_offset}) -> "
                f"[{m.oldest_offset},{m.next_offset})",
            )
        if prefix == self.prefix and m.next_offset > before.next_offset:
            self.seq_appends.append((self.now(), actor.name))
            if before.tail_setsum is None and before.next_offset > 1:  # emptied by GC, not new
                self.onto_empty.append((before.next_offset, m.next_offset, actor.name))

    def _on_garbage(self, actor: Actor, new: Obj) -> None:
        try:
            g = Garbage.from_bytes(new.data)
        except GarbageRejected as e:
            self.violate("plan", f"unparseable garbage: {e}")
            return
        if g is None or g.applied_us is not None:
            return
        # Nothing below first_to_keep survives the plan (in both GC file schemas, old and Rust's).
        cut = g.first_to_keep
        started = self.gc_started.get(actor.name)
        if started is None:
            return
        now = self.now()
        for key, hist in self.cursor_hist.items():
            at_start: int | None = None
            highest: int | None = None
            gone = False
            for t, off in hist:
                if t <= started:
                    at_start = off
                elif t <= now:
                    if off is None:
                        gone = True
                    elif highest is None or off > highest:
                        highest = off
            if at_start is None or gone:
                continue  # did not exist throughout the pass
            top = max(at_start, highest or at_start)
            if cut > top:
                self.violate(
                    "plan",
                    f"{actor.name} planned to keep only from {cut} although "
                    f"{key} stayed at or below {top} throughout its pass",
                )

    def _closure(self, key: str) -> frozenset[str]:
        """Every object key reachable through a snapshot (itself included); snapshots are
        content-addressed and immutable, so their closures are cached by key."""
        got = self._closures.get(key)
        if got is not None:
            return got
        o = self.objects.get(key)
        if o is None:
            return frozenset((key,))  # missing: ``reachable`` reports it
        snap = self._snaps.get(o.etag)
        if snap is None:
            try:
                snap = Snapshot.from_bytes(o.data)
            except CorruptManifest:
                return frozenset((key,))
            self._snaps[o.etag] = snap
        keys = {key}
        for c in snap.children:
            if isinstance(c, FragmentPointer):
                keys.add(join(self.prefix, c.path))
            else:
                k = join(self.prefix, c.path_to_snapshot)
                keys |= self._closure(k)
        out = frozenset(keys)
        self._closures[key] = out
        return out

    def _track_reachable(self, m: Manifest) -> None:
        """Note when objects stop being reachable from the stored manifest (``grace``)."""
        roots: dict[str, frozenset[str]] = {}
        for e in m.entries:
            if isinstance(e, FragmentPointer):
                k = join(self.prefix, e.path)
                roots[k] = frozenset((k,))
            else:
                k = join(self.prefix, e.path_to_snapshot)
                roots[k] = self.roots.get(k) or self._closure(k)
        gone = [k for k in self.roots if k not in roots]
        if gone:
            now = self.now()
            kept: set[str] = set().union(*roots.values()) if roots else set()
            for k in gone:
                for key in self.roots[k]:
                    if key not in kept:
                        self.left_at[key] = now
        for keys in roots.values():
            for key in keys:
                self.left_at.pop(key, None)
        self.roots = roots

    def _check_grace(self, actor: Actor, key: str, rng: tuple[int, int] | None) -> None:
        if any(key in keys for keys in self.roots.values()):
            self.violate("grace", f"{actor.name} deleted {key}, which the manifest references")
            return
        left = self.left_at.get(key)
        if left is not None and self.now() - left < self.grace_s:
            self.violate(
                "grace",
                f"{actor.name} deleted {key} {self.now() - left:.3f}s after "
                f"the manifest stopped referencing it (grace {self.grace_s}s)",
            )
        if rng is None:
            return
        for name, (etag, off) in self.established.items():
            o = self.objects.get(join(self.prefix, f"{CURSOR_PREFIX}{name}.json"))
            if o is not None and o.etag == etag and rng[1] > off:
                self.violate(
                    "grace",
                    f"{actor.name} deleted {key} holding [{rng[0]},{rng[1]}) "
                    f"while the accepted pin {name} stands at {off}",
                )

    def _on_delete(self, actor: Actor, key: str, old: Obj) -> None:
        if key.startswith(join(self.prefix, CURSOR_PREFIX)):
            self.cursor_hist.setdefault(key, []).append((self.now(), None))
            return
        if key.startswith((join(self.prefix, LOG_PREFIX), join(self.prefix, SNAPSHOT_PREFIX))):
            self._check_grace(actor, key, self.linked.get((key, old.etag)))
        rng = self.linked.get((key, old.etag))
        if rng is None:
            return
        prefix = next((p for p in self.logs if key.startswith(join(p, LOG_PREFIX))), None)
        if prefix is None:
            return
        cursors = self.cursors_now(prefix)
        if cursors:
            name = min(cursors, key=lambda n: (cursors[n], n))
            if rng[1] > cursors[name]:
                self.violate(
                    "cursor-delete",
                    f"{actor.name} deleted {key} holding "
                    f"[{rng[0]},{rng[1]}) while cursor {name} pins {cursors[name]}",
                )

    # -------------------------------------------------------------------------- appends

    def new_attempt(
        self, logical: int | None, key: str | None, count: int, writer: str, opened: float
    ) -> Attempt:
        aid = len(self.attempts) + 1
        a = Attempt(aid, logical if logical is not None else aid, key, count, writer, opened)
        self.attempts[aid] = a
        self.logicals.setdefault(a.logical, []).append(aid)
        return a

    def settle(
        self,
        a: Attempt,
        outcome: str,
        result: AppendResult | None = None,
        error: BaseException | None = None,
    ) -> None:
        a.outcome = outcome
        a.result = result
        a.error = repr(error) if error is not None else ""
        self.trace(
            f"append a{a.id} ({a.writer}, key={a.key}) -> {outcome} "
            + (
                f"@{result.first_offset}+{result.count}{' dedup' if result.deduplicated else ''}"
                if result is not None
                else a.error
            )
        )
        if outcome in ("acked", "dedup"):
            self.unverified.append(a.id)
            if result is not None:
                self.acked_next = max(self.acked_next, result.next_offset)
        if outcome == "contention":
            if a.id in self.where:
                self.violate(
                    "contention",
                    f"a{a.id} was answered LogContention but is in the "
                    f"log at {sorted(self.where[a.id].values())}",
                )
            others = [w for t, w in self.seq_appends if t >= a.writer_opened and w != a.writer]
            if not others:
                self.violate(
                    "contention",
                    f"a{a.id} was answered LogContention by {a.writer} "
                    "but no other writer appended since it opened",
                )

    def saw_read(self, who: str, next_offset: int, floor: int, acked: int) -> None:
        """A read of the primary log returned what lies below ``next_offset``; when it began,
        finished reads had returned up to ``floor`` and appends were acknowledged up to
        ``acked``.  It may miss neither (``monotonic``: a record one read returned, every later
        read returns; ``lease-read``: no acknowledged record is missed)."""
        if next_offset < acked:
            self.violate(
                "lease-read",
                f"{who} read up to {next_offset}, records up to {acked} were acknowledged",
            )
        if next_offset < floor:
            self.violate(
                "monotonic", f"{who} read up to {next_offset}, an earlier read returned {floor}"
            )
        self.visible_next = max(self.visible_next, next_offset)

    # ------------------------------------------------------------------------- the walk

    def walk(self, prefix: str) -> LogView | None:
        """Walk a log's whole tree in the store's truth, checking everything reachable."""
        obj = self.objects.get(join(prefix, MANIFEST_PATH))
        if obj is None:
            if self.logs[prefix].manifest is not None:
                self.violate("manifest", f"{prefix}: the manifest vanished")
            return None
        try:
            m = self._parse_manifest(obj.data, obj.etag)
        except CorruptManifest as e:
            self.violate("manifest", f"{prefix}: {e}")
            return None
        self.logs[prefix].manifest = m
        leaves: list[FragmentPointer] = []
        stack = list(reversed(m.entries))
        while stack:
            p = stack.pop()
            if isinstance(p, FragmentPointer):
                leaves.append(p)
                continue
            key = join(prefix, p.path_to_snapshot)
            o = self.objects.get(key)
            if o is None:
                self.violate("reachable", f"{key} is linked but missing")
                continue
            snap = self._snaps.get(o.etag)
            if snap is None:
                try:
                    snap = Snapshot.from_bytes(o.data)
                except CorruptManifest as e:
                    self.violate("reachable", f"{key}: {e}")
                    continue
                self._snaps[o.etag] = snap
            if dataclasses.replace(snap.to_pointer()) != p:
                self.violate("reachable", f"{key} does not match its pointer")
            stack.extend(reversed(snap.children))
        prev: FragmentPointer | None = None
        for f in leaves:
            if prev is not None and (f.start != prev.limit or f.seq_no != prev.seq_no + 1):
                self.violate(
                    "reachable",
                    f"{prefix}: {f.path} [{f.start},{f.limit}) seq "
                    f"{f.seq_no} follows {prev.path} [{prev.start},{prev.limit})",
                )
            if parse_fragment_path(f.path) != f.seq_no:
                self.violate("reachable", f"{prefix}: {f.path} is not seq {f.seq_no}")
            prev = f
        if leaves and leaves[0].start != m.oldest_offset:
            self.violate(
                "reachable",
                f"{prefix}: first leaf starts at {leaves[0].start}, "
                f"oldest offset is {m.oldest_offset}",
            )
        for f in leaves:
            self._check_leaf(prefix, f)
        return LogView(m, leaves)

    def _check_leaf(self, prefix: str, f: FragmentPointer) -> None:
        log = self.logs[prefix]
        key = join(prefix, f.path)
        o = self.objects.get(key)
        if o is None:
            self.violate("reachable", f"{key} [{f.start},{f.limit}) is linked but missing")
            return
        if (key, f.content_md5) in log.verified and o.etag == f.content_md5:
            return
        if f.content_md5 is not None and o.etag != f.content_md5:
            self.violate("reachable", f"{key}: bytes differ from the recorded MD5")
            return
        if f.content_md5 is not None:
            self.linked[(key, f.content_md5)] = (f.start, f.limit)
        d = self._decoded.get(o.etag)
        if d is None:
            try:
                d = decode_fragment(o.data)
            except CorruptFragment as e:
                self.violate("reachable", f"{key}: {e}")
                return
            self._decoded[o.etag] = d
        if d.setsum != f.setsum or (d.start, d.limit) != (f.start, f.limit):
            self.violate("reachable", f"{key}: records do not match the pointer")
            return
        log.verified.add((key, f.content_md5))
        seen = self.observed[prefix]
        for r in d.records:
            had = seen.get(r.offset)
            if had is not None:
                if had[:2] != (r.timestamp_us, r.body):
                    self.violate(
                        "stable",
                        f"{prefix}@{r.offset} was {had[1][:16]!r} "
                        f"ts={had[0]}, now {r.body[:16]!r} ts={r.timestamp_us}",
                    )
                continue
            seen[r.offset] = (r.timestamp_us, r.body, f.seq_no)
            if prefix == self.prefix:
                self._record(r.offset, r.body, f.seq_no)

    def _record(self, offset: int, body: bytes, seq: int) -> None:
        ident = decode_body(body)
        if ident is None:
            self.violate("stable", f"@{offset}: a body nobody wrote: {body[:20]!r}")
            return
        aid, idx = ident
        a = self.attempts.get(aid)
        if a is None:
            self.violate("stable", f"@{offset}: a body of an unknown append a{aid}")
            return
        places = self.where.setdefault(aid, {})
        if idx in places:
            self.violate(
                "once",
                f"a{aid}.{idx} is in the log twice: @{places[idx]} and @{offset}"
                f" (append answered {a.outcome} "
                + (f"@{a.result.first_offset}" if a.result is not None else a.error)
                + ")",
            )
            return
        places[idx] = offset
        if a.outcome == "contention":
            by = next((w for lo, hi, w in self.onto_empty if lo <= offset < hi), None)
            self.violate(
                "contention",
                f"a{aid} ({a.writer}: {a.error}) was answered "
                f"LogContention but is in the log @{offset}"
                + (f" (linked by {by} onto a root GC emptied)" if by else ""),
            )
        if a.key is not None and idx == 0:
            for other in self.logicals[a.logical]:
                if other == aid or other not in self.where or 0 not in self.where[other]:
                    continue
                o_off = self.where[other][0]
                o_seq = self.observed[self.prefix][o_off][2]
                if abs(seq - o_seq) <= self.dedup_window:
                    self.violate(
                        "once",
                        f"idempotency key {a.key} is in the log twice: "
                        f"a{other}@{o_off} (seq {o_seq}) and a{aid}@{offset} (seq {seq})",
                    )

    # ------------------------------------------------------------------------ the check

    def check(self) -> None:
        """Everything checkable from the store's truth right now."""
        views = {p: self.walk(p) for p in list(self.logs)}
        view = views[self.prefix]
        if view is None:
            return
        m = view.manifest
        seen = self.observed[self.prefix]
        still: list[int] = []
        for aid in self.unverified:
            a = self.attempts[aid]
            r = a.result
            assert r is not None
            missing = False
            for i in range(r.count):
                off = r.first_offset + i
                rec = seen.get(off)
                if rec is None:
                    if off >= m.next_offset or off >= m.oldest_offset:
                        self.violate(
                            "acked",
                            f"a{aid} was acknowledged @{r.first_offset}+"
                            f"{r.count} but @{off} is not in the log "
                            f"[{m.oldest_offset},{m.next_offset})",
                        )
                    missing = True
                    break
                ident = decode_body(rec[1])
                ok = (
                    ident is not None
                    and ident[1] == i
                    and (
                        ident[0] == aid
                        if a.outcome == "acked"
                        else ident[0] in self.logicals[a.logical]
                    )
                )
                if not ok:
                    self.violate(
                        "acked",
                        f"a{aid} was acknowledged @{r.first_offset}+{r.count}"
                        f" ({a.outcome}) but @{off} holds {rec[1][:16]!r}",
                    )
                    break
                if rec[0] != r.timestamp_us:
                    self.violate(
                        "acked",
                        f"a{aid} was acknowledged @{r.first_offset}+{r.count} ({a.outcome}) "
                        f"with timestamp {r.timestamp_us}, but @{off} has {rec[0]}",
                    )
                    break
            if missing:
                continue
        self.unverified = still
        for name, (etag, off) in self.established.items():
            o = self.objects.get(join(self.prefix, f"{CURSOR_PREFIX}{name}.json"))
            if o is not None and o.etag == etag and m.oldest_offset > off:
                self.violate(
                    "cursor-reach",
                    f"cursor {name} pins {off} (established) but the "
                    f"oldest readable offset is {m.oldest_offset}",
                )
