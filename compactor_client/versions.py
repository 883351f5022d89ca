"""The ``CURRENT.json`` pointer of a collection's compacted data: its runs by level, installed by
conditional put, and pruning of what no reader can still need.

Layout under the store root, per collection (every key built by ``wal3.paths``)::

    compacted/{collection_id}/CURRENT.json                          the installed version
    compacted/{collection_id}/v{version:016d}/run-{token}.parquet   a sorted run (``runs``)
    compacted/{collection_id}/v{version:016d}/part-{token}.parquet  a whole version of the
                                                                    single-version layout

``CURRENT.json`` (format 2, the leveled layout)::

    {"format": 2, "version": V, "offset": O, "rows": R,
     "runs": [{"key", "level", "rows", "bytes", "tombstones", "sketch"}, ...],   level 0 first
     "retired": [{"key", "until"}, ...],
     "installed_at": ..., "history": [{"version", "installed_at", "stored_at"?}, ...]}

``offset`` is the first log offset *not* folded into the version; ``runs`` are its runs, newest
(level 0) first, each a key relative to the store root with its entry count, Arrow size,
tombstones and id sketch (``runs.stats_of``); ``rows`` is the sum of the runs' entries (an upper
bound of the documents: a reader merges the runs, ``reader``).  A run is written into the
directory of the version whose install attempt wrote it, under a random per-attempt token: two
compactors racing on the same collection allocate the same version number, and with distinct names
neither can overwrite the other's data, and the loser deletes exactly its own files.
``CURRENT.json`` is only ever written by conditional put — create-only for the first version,
``If-Match`` the etag it was read at afterwards — so of two racing installs exactly one wins.
That put is the commit point: runs are written before it and unreferenced until it succeeds.

**Migration.**  A pointer of the single-version layout (format 1: ``{"version", "offset", "rows",
"path", ...}``, no ``format``) reads as one bottom-level run, ``path``, of ``rows`` rows; the next
install writes format 2 with that run still listed (or merged away and retired), so collections
migrate one install at a time and a format-1 version stays readable.  Compactors of the
single-version layout refuse a format-2 pointer (no ``path``: ``CorruptCurrent``), so they never
overwrite one.

**Retention.**  A run is listed by every version from the one that wrote it until a merge replaces
it; the install that drops it records it in ``retired`` with ``until``, the last version that
listed it.  Pruning (:func:`prune_versions`) keeps every file a kept version lists (the newest
``keep``, the current one included: a reader that read an earlier ``CURRENT.json`` may still be
reading it) and deletes the rest once a grace period has passed since they stopped being listed:
a retired run once ``until`` is out of the kept window and ``until + 1`` was installed ``grace``
ago; a run no version lists or retired (an attempt that lost the race or crashed: nobody ever
read it) once it was written ``grace`` ago, if its version is not newer than the current one (an
install may be in flight); a version file of the single-version layout as such versions always
were, by its version directory.  A retired entry leaves the
record only once the run could be deleted anyway (out of the kept window and past the grace, by
the installer's settings), so forgetting it never makes a run go sooner.

Supersession is dated by *installs*, never by when files were written: version v stopped being
current when version v+1 was installed.  Install times are the **store's** clock, never a
compactor's: ``installed_at`` (the installer's wall clock) is informational only, since a
compactor whose clock lags would date v's supersession early and cut its grace short.  An
install's store time is the Last-Modified of the ``CURRENT.json`` it wrote; the next installer
reads the pointer together with that time (a head at the etag it read) and records it in
``history`` as ``stored_at`` of the version it replaces.  The pruner compares those times only with
other store times: the newest Last-Modified it lists under the collection is its "now" (a lower
bound of the store's present), and the pointer's own Last-Modified bounds from above every install
it has no record of.  Both errors only delay a prune.  Last-Modified has a resolution of one second
(S3 truncates it, and the HTTP date carries whole seconds), so the difference of two such values
may fall short of the real time between them by up to a second: a file goes only once that
difference is at least the grace *plus one second* (``LAST_MODIFIED_SLACK_S``, as garbage
collection allows for the same thing).
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from wal3.errors import ObjectNotFound, PreconditionFailed, StoreUnavailable
from wal3.paths import (  # the layout above; current_key and friends are re-exported from here
    CURRENT_NAME,  # noqa: F401 - re-exported
    compacted_prefix,
    current_key,
    data_key,
    parse_compacted_key,
    parse_run_key,
    run_key,
    version_prefix,  # noqa: F401 - re-exported
)
from wal3.store import put_resolving

from .crashpoints import crash_point
from .errors import CompactorError
from .fold import Row
from .parquet_io import rows_to_table

if TYPE_CHECKING:
    from wal3.store import ObjectMeta, ObjectStore

HISTORY_LIMIT = 32  # installs remembered in CURRENT.json; older supersessions are bounded above
# Last-Modified is whole seconds: two of them may differ by up to 1 s less than the real interval.
LAST_MODIFIED_SLACK_S = 1.0


FORMAT = 2  # CURRENT.json of the leveled layout; a pointer without "format" is format 1


class CorruptCurrent(CompactorError, ValueError):
    """``CURRENT.json`` exists but is not a valid pointer; it is never overwritten blindly."""


@dataclass(frozen=True, slots=True)
class RunEntry:
    """One run a version lists: its key (relative to the store root) and what the level policy
    needs to know of it; ``bytes`` is None for a version of the single-version layout."""

    key: str
    rows: int
    bytes: int | None = None
    tombstones: int = 0
    sketch: str | None = None

    def document(self, level: int) -> dict[str, Any]:
        """The entry as ``runs`` lists it."""
        doc: dict[str, Any] = {"key": self.key, "level": level, "rows": self.rows}
        if self.bytes is not None:
            doc["bytes"] = self.bytes
        doc["tombstones"] = self.tombstones
        if self.sketch:
            doc["sketch"] = self.sketch
        return doc


@dataclass(frozen=True, slots=True)
class CurrentVersion:
    """The installed version of a collection, with the etag ``CURRENT.json`` was read at."""

    version: int
    offset: int
    rows: int
    runs: tuple[RunEntry, ...]  # level 0 (newest) first
    etag: str
    installed_at: float | None = None  # installer's wall clock, informational; None in old pointers
    history: tuple[tuple[int, float], ...] = ()  # (version, installed_at), newest first
    # (version, store time of its install), newest first: what later installers read.
    stored: tuple[tuple[int, float], ...] = ()
    # The store's Last-Modified of the CURRENT.json this was read from (its install, by the
    # store's clock); None when unknown (e.g. just written by us).
    stored_at: float | None = None
    retired: tuple[tuple[str, int], ...] = ()  # (key, last version that listed it)
    format: int = FORMAT

    @property
    def path(self) -> str:
        """The bottom run's key (a format-1 pointer's ``path``)."""
        return self.runs[-1].key if self.runs else ""

    @property
    def levels(self) -> int:
        """How many levels (runs) a reader merges."""
        return len(self.runs)

    def document(self) -> dict[str, Any]:
        """The JSON object stored in ``CURRENT.json`` (always format 2)."""
        doc: dict[str, Any] = {
            "format": FORMAT,
            "version": self.version,
            "offset": self.offset,
            "rows": self.rows,
            "runs": [r.document(level) for level, r in enumerate(self.runs)],
            "retired": [{"key": k, "until": u} for k, u in self.retired],
        }
        if self.installed_at is not None:
            stored = dict(self.stored)
            # Every entry keeps ``installed_at`` (older compactors require it); a version known
            # only by its store time (an old pointer had none) reuses that.
            installed = {**stored, **dict(self.history)}
            doc["installed_at"] = self.installed_at
            history: list[dict[str, Any]] = []
            for v in sorted(installed, reverse=True)[:HISTORY_LIMIT]:
                entry: dict[str, Any] = {"version": v, "installed_at": installed[v]}
                if v in stored:
                    entry["stored_at"] = stored[v]
                history.append(entry)
            doc["history"] = history
        return doc

    def installs(self) -> dict[int, float]:
        """Install times by version as the installers' clocks said (informational)."""
        out = dict(self.history)
        if self.installed_at is not None:
            out[self.version] = self.installed_at
        return out

    def store_installs(self) -> dict[int, float]:
        """Install times by version on the store's clock, as far as known (this one's included
        when it was read with its Last-Modified)."""
        out = dict(self.stored)
        if self.stored_at is not None:
            out[self.version] = self.stored_at
        return out


@dataclass(frozen=True, slots=True)
class PendingVersion:
    """A version being built: where its data goes and which version it must replace."""

    collection_id: str
    version: int
    data_key: str
    base: CurrentVersion | None
    token: str = ""

    @property
    def max_runs(self) -> int:
        """How many new runs this attempt may write: one per level at most, the new top run
        included (each merge replaces two runs by one)."""
        return (len(self.base.runs) if self.base is not None else 0) + 1

    def run_key(self, n: int) -> str:
        """The key of this attempt's ``n``-th new run."""
        return run_key(self.collection_id, self.version, f"{self.token}-{n}")

    def run_keys(self) -> list[str]:
        """Every key this attempt may write a run to."""
        return [self.run_key(n) for n in range(self.max_runs)]

    @property
    def start_offset(self) -> int:
        """The first log offset this version has to fold (offsets start at 1)."""
        return self.base.offset if self.base is not None else 1


@dataclass(frozen=True, slots=True)
class InstallOutcome:
    """Whether an install won; ``current`` is the newly installed pointer when it did."""

    installed: bool
    current: CurrentVersion | None


def _encode(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _decode(collection_id: str, data: bytes, etag: str) -> CurrentVersion:
    key = current_key(collection_id)
    try:
        doc = json.loads(data)
        version, offset, rows = doc["version"], doc["offset"], doc["rows"]
        fmt = doc.get("format", 1)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCurrent(f"{key}: {e!r}") from e
    ok = all(_int(v) for v in (version, offset, rows)) and version >= 1 and offset >= 1
    if not ok or rows < 0:
        raise CorruptCurrent(f"{key}: invalid pointer {doc!r}")
    own = compacted_prefix(collection_id)
    runs: list[RunEntry] = []
    retired: list[tuple[str, int]] = []
    try:
        if fmt == 1:
            path = doc["path"]
            if not isinstance(path, str):
                raise TypeError("path is not a string")
            runs.append(RunEntry(key=path, rows=rows))  # one bottom-level run: the whole version
        elif fmt == FORMAT:
            for r in doc["runs"]:
                entry = RunEntry(
                    key=str(r["key"]),
                    rows=int(r["rows"]),
                    bytes=None if r.get("bytes") is None else int(r["bytes"]),
                    tombstones=int(r.get("tombstones") or 0),
                    sketch=r.get("sketch") or None,
                )
                if not entry.key.startswith(own):
                    # A pointer naming another collection's files (a copy that was not rewritten)
                    # is refused: its runs would be pruned under it by their owner.
                    raise ValueError(f"run {entry.key!r} is not under {own}")
                runs.append(entry)
            retired.extend((str(r["key"]), int(r["until"])) for r in doc.get("retired") or ())
        else:
            raise ValueError(f"unknown format {fmt!r}")
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCurrent(f"{key}: invalid runs: {e!r}") from e
    installed_at = doc.get("installed_at")
    history: list[tuple[int, float]] = []
    stored: list[tuple[int, float]] = []
    try:
        if installed_at is not None:
            installed_at = float(installed_at)
        for h in doc.get("history") or ():
            history.append((int(h["version"]), float(h["installed_at"])))
            if h.get("stored_at") is not None:
                stored.append((int(h["version"]), float(h["stored_at"])))
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CorruptCurrent(f"{key}: invalid history: {e!r}") from e
    return CurrentVersion(
        version=version,
        offset=offset,
        rows=rows,
        runs=tuple(runs),
        etag=etag,
        installed_at=installed_at,
        history=tuple(history),
        stored=tuple(stored),
        retired=tuple(retired),
        format=fmt,
    )


def _same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')


async def read_current(store: ObjectStore, collection_id: str) -> CurrentVersion | None:
    """The installed version of a collection, or None before its first compaction.

    It comes with the store's Last-Modified of the pointer (``stored_at``), read by a head at the
    same etag, so the install that replaces it can record when, by the store's clock, this version
    became current.  If the pointer keeps changing under us, or the head fails, ``stored_at``
    stays None: the next install then records nothing for it, which only delays prunes.
    """
    key = current_key(collection_id)
    for _ in range(3):
        try:
            got = await store.get(key)
        except ObjectNotFound:
            return None
        current = _decode(collection_id, got.data, got.etag)
        try:
            meta = await store.head(key)
        except ObjectNotFound:
            continue  # replaced and gone meanwhile (a test, or an operator): read again
        except StoreUnavailable:
            return current  # the time is only a record for prunes: unknown delays them
        if _same_etag(meta.etag, got.etag):
            return dataclasses.replace(current, stored_at=meta.last_modified)
    return current


def allocate_version(
    collection_id: str, base: CurrentVersion | None, *, token: str | None = None
) -> PendingVersion:
    """The next version after ``base``, with a fresh token (and data key) of its own."""
    version = base.version + 1 if base is not None else 1
    token = token or uuid.uuid4().hex
    return PendingVersion(
        collection_id=collection_id,
        version=version,
        data_key=data_key(collection_id, version, token),
        base=base,
        token=token,
    )


def encode_rows(rows: Iterable[Row]) -> bytes:
    """A version's Parquet bytes (snappy), for writers that put whole objects."""
    sink = pa.BufferOutputStream()
    pq.write_table(rows_to_table(rows), sink, compression="snappy")
    return sink.getvalue().to_pybytes()


async def write_rows(store: ObjectStore, pending: PendingVersion, rows: Iterable[Row]) -> int:
    """Write a pending version's data through the store (create-only); returns its size."""
    data = encode_rows(rows)
    await store.put(pending.data_key, data, if_none_match="*")
    return len(data)


def _superseded_at(installs: dict[int, float], version: int) -> float | None:
    """When ``version`` stopped being current (store time), or a time no earlier than that;
    None when no later install is on record."""
    if version + 1 in installs:
        return installs[version + 1]
    # Installs are in version order, so the oldest known later install bounds v+1's.
    later = [t for v, t in installs.items() if v > version]
    return min(later) if later else None


def _retire(
    base: CurrentVersion | None,
    runs: tuple[RunEntry, ...],
    new_version: int,
    keep: int | None,
    grace_s: float | None,
) -> tuple[tuple[str, int], ...]:
    """The new pointer's ``retired``: the base's, plus the base's runs this version drops, less
    entries whose runs could be pruned already (out of the kept window and past the grace, on
    the store's clock: the base's own install time is a lower bound of the present)."""
    if base is None:
        return ()
    listed = {r.key for r in runs}
    out = dict(base.retired)
    for r in base.runs:
        if r.key not in listed:
            out[r.key] = base.version
    if keep is not None and grace_s is not None and base.stored_at is not None:
        installs = base.store_installs()
        now = base.stored_at
        for k, until in list(out.items()):
            when = _superseded_at(installs, until)
            if (
                until <= new_version - max(1, keep)
                and when is not None
                and when <= now - grace_s - LAST_MODIFIED_SLACK_S
            ):
                del out[k]
    return tuple(sorted(out.items(), key=lambda kv: (-kv[1], kv[0])))


async def install_version(
    store: ObjectStore,
    pending: PendingVersion,
    *,
    offset: int,
    rows: int,
    runs: tuple[RunEntry, ...] | None = None,
    now: float | None = None,
    keep: int | None = None,
    grace_s: float | None = None,
) -> InstallOutcome:
    """Point ``CURRENT.json`` at ``runs`` (level 0 first; by default the single run
    ``pending.data_key`` of ``rows`` rows) by conditional put; the loser discards its files.

    ``keep`` and ``grace_s`` (the pruner's settings) let the install forget retired runs that
    could be pruned already.  A lost race deletes this attempt's files and returns
    ``installed=False``: the caller must then not advance the compaction cursor.  A store failure
    whose outcome is unknown propagates and deletes nothing, since the pointer may already name
    this attempt's files.
    """
    if offset < pending.start_offset:
        raise ValueError(f"offset {offset} is behind the base version's {pending.start_offset}")
    if runs is None:
        runs = (RunEntry(key=pending.data_key, rows=rows),)
    installed_at = time.time() if now is None else now
    earlier = pending.base.installs() if pending.base is not None else {}
    history = sorted({**earlier, pending.version: installed_at}.items(), reverse=True)
    stored = pending.base.store_installs() if pending.base is not None else {}
    new = CurrentVersion(
        version=pending.version,
        offset=offset,
        rows=rows,
        runs=runs,
        etag="",
        installed_at=installed_at,
        history=tuple(history[:HISTORY_LIMIT]),
        stored=tuple(sorted(stored.items(), reverse=True)[:HISTORY_LIMIT]),
        retired=_retire(pending.base, runs, pending.version, keep, grace_s),
    )
    body = _encode(new.document())
    try:
        if pending.base is None:
            etag = await put_resolving(
                store, current_key(pending.collection_id), body, if_none_match="*"
            )
        else:
            etag = await put_resolving(
                store, current_key(pending.collection_id), body, if_match=pending.base.etag
            )
    except PreconditionFailed:
        await discard_version(store, pending)
        return InstallOutcome(installed=False, current=None)
    return InstallOutcome(installed=True, current=dataclasses.replace(new, etag=etag))


async def discard_version(store: ObjectStore, pending: PendingVersion) -> None:
    """Delete this attempt's files (only its own: a racing winner may share the version): its
    data key and every run key it was allocated (absent ones are no error)."""
    await store.delete(pending.data_key)
    if pending.token:
        for key in pending.run_keys():
            await store.delete(key)


@dataclass(frozen=True, slots=True)
class PruneReport:
    """What a prune deleted and what it left for later (still inside the grace period)."""

    deleted: list[str]
    deferred: int


async def prune_versions(
    store: ObjectStore,
    current: CurrentVersion,
    collection_id: str,
    *,
    keep: int = 2,
    grace_s: float = 300.0,
) -> PruneReport:
    """Delete data no reader can still need (see the module docstring): runs no kept version
    lists, once ``grace_s`` has passed since they stopped being listed, and files of lost or
    crashed install attempts.  Version v was superseded when v+1 was *installed*.

    Every time here is the store's: an install's time is the Last-Modified its ``CURRENT.json``
    had (recorded by the next installer), the pointer's current Last-Modified stands for every
    later install not on record (it can only be later), and "now" is the newest Last-Modified
    under the collection (the store's present is no earlier).  So no compactor's clock, however
    skewed, shortens the grace; a missing record only lengthens it.

    Files of versions newer than ``current`` belong to installs in flight and are never touched.
    Every comparison is of two Last-Modified values, each truncated to the second, so a file
    goes only once they are ``grace_s + LAST_MODIFIED_SLACK_S`` apart.
    """
    keep = max(1, keep)
    base = compacted_prefix(collection_id)
    files: list[tuple[int, ObjectMeta]] = []
    pointer_written: float | None = None
    store_now: float | None = None
    async for meta in store.list(base):
        store_now = meta.last_modified if store_now is None else max(store_now, meta.last_modified)
        if meta.key == current_key(collection_id):
            pointer_written = meta.last_modified
        of = parse_compacted_key(collection_id, meta.key)
        if of is not None:
            files.append((of, meta))
    live = {r.key for r in current.runs}
    listed = {m.key for _, m in files}
    if not live <= listed or pointer_written is None or store_now is None:
        # CURRENT.json, or a file it names, is not in the listing (eventual listing, or
        # damage): not a state to delete anything in.
        return PruneReport([], len(files))

    installs = current.store_installs()
    # The pointer now in the store was written at or after ``current``'s install (a later
    # install may have replaced it meanwhile): an upper bound for every install up to it.
    installs[current.version] = min(installs.get(current.version, pointer_written), pointer_written)
    retired = dict(current.retired)
    oldest_kept = current.version - keep + 1

    doomed: list[str] = []
    deferred = 0
    for version, meta in files:
        if version > current.version or meta.key in live:
            continue  # an install in flight, or the current version's own
        since: float | None
        if meta.key in retired:
            until = retired[meta.key]
            if until >= oldest_kept:
                continue  # a kept version lists it
            since = _superseded_at(installs, until)
        elif version == current.version or parse_run_key(collection_id, meta.key) is not None:
            # Attempts that lost the race for this version (or crashed before discarding), and
            # runs no version lists or retired: every run ever listed is listed, or recorded
            # as retired until it may go, so an unrecorded run is an attempt's that never won
            # (or one whose grace had passed when its record was dropped).  Nobody read it.
            since = meta.last_modified
        elif version >= oldest_kept:
            continue  # a kept version of the single-version layout, or an attempt beside one
        else:
            since = _superseded_at(installs, version)
        if since is not None and since <= store_now - grace_s - LAST_MODIFIED_SLACK_S:
            doomed.append(meta.key)
        else:
            deferred += 1
    for n, key in enumerate(doomed):
        await store.delete(key)
        if n == 0:
            crash_point("prune:mid")
    return PruneReport(sorted(doomed), deferred)
