"""Immutable compacted versions and the ``CURRENT.json`` pointer that installs them.

Layout under the store root, per collection::

    compacted/{collection_id}/v{version:016d}/part-{token}.parquet   one immutable version
    compacted/{collection_id}/CURRENT.json                           the installed version:
        {"version", "offset", "rows", "path", "installed_at", "history"}

``offset`` is the first log offset *not* folded into the version; ``path`` is the key (relative to
the store root) of the version's Parquet file.  The data file name carries a random per-attempt
token because two compactors racing on the same collection allocate the same version number:
with distinct names neither can overwrite the other's data, and the loser deletes exactly its own
file.  ``CURRENT.json`` is only ever written by conditional put — create-only for the first
version, ``If-Match`` the etag it was read at afterwards — so of two racing installs exactly one
wins.

Superseded versions are pruned (:func:`prune_versions`) once the newest ``keep`` versions are
safely elsewhere and a grace period has passed since they were superseded: a reader that read the
previous ``CURRENT.json`` may still be reading its file.  Supersession is dated by *installs*, never
by when files were written: version v stopped being current when version v+1 was installed.  (A
crashed compactor's never-installed attempt, or the winner's own file written long before its
install, say nothing about when v stopped being current.)

Install times are the **store's** clock, never a compactor's: ``installed_at`` (the installer's
wall clock) is informational only, since a compactor whose clock lags would date v's supersession
early and cut its grace short.  An install's store time is the Last-Modified of the
``CURRENT.json`` it wrote; the next installer reads the pointer together with that time (a head at
the etag it read) and records it in ``history`` as ``stored_at`` of the version it replaces.  The
pruner compares those times only with other store times: the newest Last-Modified it lists under
the collection is its "now" (a lower bound of the store's present), and the pointer's own
Last-Modified bounds from above every install it has no record of.  Both errors only delay a prune.
Last-Modified has a resolution of one second (S3 truncates it, and the HTTP date carries whole
seconds), so the difference of two such values may fall short of the real time between them by up
to a second: a file goes only once that difference is at least the grace *plus one second*
(``LAST_MODIFIED_SLACK_S``, as garbage collection allows for the same thing).
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
    parse_data_key,
    version_prefix,  # noqa: F401 - re-exported
)
from wal3.store import put_resolving

from .errors import CompactorError
from .fold import Row
from .parquet_io import rows_to_table

if TYPE_CHECKING:
    from wal3.store import ObjectMeta, ObjectStore

HISTORY_LIMIT = 32  # installs remembered in CURRENT.json; older supersessions are bounded above
# Last-Modified is whole seconds: two of them may differ by up to 1 s less than the real interval.
LAST_MODIFIED_SLACK_S = 1.0


class CorruptCurrent(CompactorError, ValueError):
    """``CURRENT.json`` exists but is not a valid pointer; it is never overwritten blindly."""


@dataclass(frozen=True, slots=True)
class CurrentVersion:
    """The installed version of a collection, with the etag ``CURRENT.json`` was read at."""

    version: int
    offset: int
    rows: int
    path: str
    etag: str
    installed_at: float | None = None  # installer's wall clock, informational; None in old pointers
    history: tuple[tuple[int, float], ...] = ()  # (version, installed_at), newest first
    # (version, store time of its install), newest first: what later installers read.
    stored: tuple[tuple[int, float], ...] = ()
    # The store's Last-Modified of the CURRENT.json this was read from (its install, by the
    # store's clock); None when unknown (e.g. just written by us).
    stored_at: float | None = None

    def document(self) -> dict[str, Any]:
        """The JSON object stored in ``CURRENT.json``."""
        doc: dict[str, Any] = {
            "version": self.version,
            "offset": self.offset,
            "rows": self.rows,
            "path": self.path,
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


def _decode(collection_id: str, data: bytes, etag: str) -> CurrentVersion:
    try:
        doc = json.loads(data)
        version, offset, rows, path = doc["version"], doc["offset"], doc["rows"], doc["path"]
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCurrent(f"{current_key(collection_id)}: {e!r}") from e
    ok = (
        all(isinstance(v, int) and not isinstance(v, bool) for v in (version, offset, rows))
        and isinstance(path, str)
        and version >= 1
        and offset >= 1
        and rows >= 0
    )
    if not ok:
        raise CorruptCurrent(f"{current_key(collection_id)}: invalid pointer {doc!r}")
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
        raise CorruptCurrent(f"{current_key(collection_id)}: invalid history: {e!r}") from e
    return CurrentVersion(
        version=version,
        offset=offset,
        rows=rows,
        path=path,
        etag=etag,
        installed_at=installed_at,
        history=tuple(history),
        stored=tuple(stored),
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
    """The next version after ``base``, with a fresh data key of its own."""
    version = base.version + 1 if base is not None else 1
    return PendingVersion(
        collection_id=collection_id,
        version=version,
        data_key=data_key(collection_id, version, token or uuid.uuid4().hex),
        base=base,
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


async def install_version(
    store: ObjectStore,
    pending: PendingVersion,
    *,
    offset: int,
    rows: int,
    now: float | None = None,
) -> InstallOutcome:
    """Point ``CURRENT.json`` at ``pending`` by conditional put; the loser discards its data.

    A lost race deletes this attempt's data file and returns ``installed=False``: the caller must
    then not advance the compaction cursor.  A store failure whose outcome is unknown propagates
    and deletes nothing, since the pointer may already name this data.
    """
    if offset < pending.start_offset:
        raise ValueError(f"offset {offset} is behind the base version's {pending.start_offset}")
    installed_at = time.time() if now is None else now
    earlier = pending.base.installs() if pending.base is not None else {}
    history = sorted({**earlier, pending.version: installed_at}.items(), reverse=True)
    stored = pending.base.store_installs() if pending.base is not None else {}
    new = CurrentVersion(
        version=pending.version,
        offset=offset,
        rows=rows,
        path=pending.data_key,
        etag="",
        installed_at=installed_at,
        history=tuple(history[:HISTORY_LIMIT]),
        stored=tuple(sorted(stored.items(), reverse=True)[:HISTORY_LIMIT]),
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
    return InstallOutcome(
        installed=True,
        current=CurrentVersion(
            version=new.version,
            offset=offset,
            rows=rows,
            path=new.path,
            etag=etag,
            installed_at=new.installed_at,
            history=new.history,
            stored=new.stored,
        ),
    )


async def discard_version(store: ObjectStore, pending: PendingVersion) -> None:
    """Delete this attempt's data file (only its own: a racing winner may share the version)."""
    await store.delete(pending.data_key)


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
    """Delete data no reader can still need: versions older than the newest ``keep`` and files
    of lost or crashed install attempts, each only once ``grace_s`` has passed since it was
    superseded.  Version v was superseded when v+1 was *installed*.

    Every time here is the store's (see the module docstring): an install's time is the
    Last-Modified its ``CURRENT.json`` had (recorded by the next installer), the pointer's current
    Last-Modified stands for every later install not on record (it can only be later), and "now"
    is the newest Last-Modified under the collection (the store's present is no earlier).  So no
    compactor's clock, however skewed, shortens the grace; a missing record only lengthens it.

    Files of versions newer than ``current`` belong to installs in flight and are never touched.
    Every comparison is of two Last-Modified values, each truncated to the second, so a file
    goes only once they are ``grace_s + LAST_MODIFIED_SLACK_S`` apart.
    """
    keep = max(1, keep)
    base = compacted_prefix(collection_id)
    by_version: dict[int, list[ObjectMeta]] = {}
    pointer_written: float | None = None
    store_now: float | None = None
    async for meta in store.list(base):
        store_now = meta.last_modified if store_now is None else max(store_now, meta.last_modified)
        if meta.key == current_key(collection_id):
            pointer_written = meta.last_modified
        of = parse_data_key(collection_id, meta.key)
        if of is not None:
            by_version.setdefault(of, []).append(meta)
    current_meta = next(
        (x for x in by_version.get(current.version, ()) if x.key == current.path), None
    )
    if current_meta is None or pointer_written is None or store_now is None:
        # CURRENT.json, or the file it names, is not in the listing (eventual listing, or
        # damage): not a state to delete anything in.
        return PruneReport([], sum(len(v) for v in by_version.values()))

    installs = current.store_installs()
    # The pointer now in the store was written at or after ``current``'s install (a later
    # install may have replaced it meanwhile): an upper bound for every install up to it.
    installs[current.version] = min(installs.get(current.version, pointer_written), pointer_written)

    def superseded_at(version: int) -> float:
        """When ``version`` stopped being current (store time), or a time no earlier than that."""
        if version + 1 in installs:
            return installs[version + 1]
        # Installs are in version order, so the oldest known later install bounds v+1's.
        return min(t for v, t in installs.items() if v > version)

    doomed: list[str] = []
    deferred = 0
    for version, files in by_version.items():
        if version > current.version:
            continue
        if version == current.version:
            # Attempts that lost the race for this version (or crashed before discarding).
            candidates = [(x, x.last_modified) for x in files if x.key != current.path]
        elif version > current.version - keep:
            continue
        else:
            when = superseded_at(version)
            candidates = [(x, when) for x in files]
        for meta, since in candidates:
            if since <= store_now - grace_s - LAST_MODIFIED_SLACK_S:
                doomed.append(meta.key)
            else:
                deferred += 1
    for key in doomed:
        await store.delete(key)
    return PruneReport(sorted(doomed), deferred)
