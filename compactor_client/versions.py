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
by when files were written: ``installed_at`` is when a version became current, and ``history`` lists
the last installs (``[{"version", "installed_at"}]``, newest first), so version v stopped being
current at the install time of version v+1.  (A crashed compactor's never-installed attempt, or the
winner's own file written long before its install, say nothing about when v stopped being current.)
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from host.wal3.errors import ObjectNotFound, PreconditionFailed
from host.wal3.store import put_resolving

from .fold import Row
from .parquet_io import rows_to_table

if TYPE_CHECKING:
    from host.wal3.store import ObjectMeta, ObjectStore

COMPACTED_PREFIX = "compacted"
CURRENT_NAME = "CURRENT.json"
HISTORY_LIMIT = 32  # installs remembered in CURRENT.json; older supersessions are bounded above


class CorruptCurrent(ValueError):
    """``CURRENT.json`` exists but is not a valid pointer; it is never overwritten blindly."""


def current_key(collection_id: str) -> str:
    """Key of a collection's ``CURRENT.json``."""
    return f"{COMPACTED_PREFIX}/{collection_id}/{CURRENT_NAME}"


def version_prefix(collection_id: str, version: int) -> str:
    """Key prefix (directory) of one version of a collection."""
    return f"{COMPACTED_PREFIX}/{collection_id}/v{version:016d}/"


def data_key(collection_id: str, version: int, token: str) -> str:
    """Key of the Parquet file one install attempt writes for a version."""
    return f"{version_prefix(collection_id, version)}part-{token}.parquet"


@dataclass(frozen=True, slots=True)
class CurrentVersion:
    """The installed version of a collection, with the etag ``CURRENT.json`` was read at."""

    version: int
    offset: int
    rows: int
    path: str
    etag: str
    installed_at: float | None = None  # wall-clock seconds; None in pointers older than the field
    history: tuple[tuple[int, float], ...] = ()  # (version, installed_at), newest first

    def document(self) -> dict[str, Any]:
        """The JSON object stored in ``CURRENT.json``."""
        doc: dict[str, Any] = {
            "version": self.version,
            "offset": self.offset,
            "rows": self.rows,
            "path": self.path,
        }
        if self.installed_at is not None:
            doc["installed_at"] = self.installed_at
            doc["history"] = [{"version": v, "installed_at": t} for v, t in self.history]
        return doc

    def installs(self) -> dict[int, float]:
        """Known install times by version (this one's included)."""
        out = dict(self.history)
        if self.installed_at is not None:
            out[self.version] = self.installed_at
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
    try:
        if installed_at is not None:
            installed_at = float(installed_at)
        for h in doc.get("history") or ():
            history.append((int(h["version"]), float(h["installed_at"])))
    except (ValueError, KeyError, TypeError) as e:
        raise CorruptCurrent(f"{current_key(collection_id)}: invalid history: {e!r}") from e
    return CurrentVersion(version=version, offset=offset, rows=rows, path=path, etag=etag,
                          installed_at=installed_at, history=tuple(history))


async def read_current(store: ObjectStore, collection_id: str) -> CurrentVersion | None:
    """The installed version of a collection, or None before its first compaction."""
    try:
        got = await store.get(current_key(collection_id))
    except ObjectNotFound:
        return None
    return _decode(collection_id, got.data, got.etag)


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
    store: ObjectStore, pending: PendingVersion, *, offset: int, rows: int,
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
    new = CurrentVersion(
        version=pending.version, offset=offset, rows=rows, path=pending.data_key, etag="",
        installed_at=installed_at, history=tuple(history[:HISTORY_LIMIT]),
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
            version=new.version, offset=offset, rows=rows, path=new.path, etag=etag,
            installed_at=new.installed_at, history=new.history,
        ),
    )


async def discard_version(store: ObjectStore, pending: PendingVersion) -> None:
    """Delete this attempt's data file (only its own: a racing winner may share the version)."""
    await store.delete(pending.data_key)


_DATA_KEY = re.compile(r"^v(\d{16})/part-[^/]+\.parquet$")


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
    now: float | None = None,
) -> PruneReport:
    """Delete data no reader can still need: versions older than the newest ``keep`` and files
    of lost or crashed install attempts, each only once ``grace_s`` has passed since it was
    superseded.  Version v was superseded when v+1 was *installed* (``CURRENT.json``'s history);
    without that record, the latest install (``CURRENT.json``'s own write time) bounds it above.

    Files of versions newer than ``current`` belong to installs in flight and are never touched.
    """
    keep = max(1, keep)
    now = time.time() if now is None else now
    base = f"{COMPACTED_PREFIX}/{collection_id}/"
    by_version: dict[int, list[ObjectMeta]] = {}
    pointer_written: float | None = None
    async for meta in store.list(base):
        if meta.key == current_key(collection_id):
            pointer_written = meta.last_modified
        m = _DATA_KEY.match(meta.key[len(base):])
        if m is not None:
            by_version.setdefault(int(m.group(1)), []).append(meta)
    current_meta = next((x for x in by_version.get(current.version, ()) if x.key == current.path),
                        None)
    if current_meta is None:
        # CURRENT.json names a file the listing does not show (eventual listing, or damage):
        # not a state to delete anything in.
        return PruneReport([], sum(len(v) for v in by_version.values()))

    installs = current.installs()
    # No later install can postdate the pointer's last write (nor the present).
    latest_install = min(now, pointer_written if pointer_written is not None else now)

    def superseded_at(version: int) -> float:
        """When ``version`` stopped being current, or a time no earlier than that."""
        if version + 1 in installs:
            return installs[version + 1]
        later = [t for v, t in installs.items() if v > version]
        # Installs are in version order, so the oldest known later install bounds v+1's.
        return min(later, default=latest_install)

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
            if since <= now - grace_s:
                doomed.append(meta.key)
            else:
                deferred += 1
    for key in doomed:
        await store.delete(key)
    return PruneReport(sorted(doomed), deferred)
