"""Forking a collection: its log (``host.wal3.fork``), its compacted version and its dirty mark.

The invariant a fork keeps: **the target's compaction cursor stands exactly on the compacted
version it copies (or at 1 with none), and every record at or above the cursor is in the target's
log.**  So the target is compactable at once: a compactor folds ``[cursor, tail)`` of the log onto
the copied version, just as it would on the source.

* With a source ``CURRENT.json`` at offset V: the version is copied, the cursor is V, and the log
  is forked from ``min(offset, V)`` (it must retain ``[V, offset)`` when V is below the requested
  offset; a version beyond the offset is still a correct base for the records above it).
* With none: nothing is compacted, the cursor is 1, and the log is forked from 1 — a log whose
  start was purged without a compacted version cannot be forked compactably (410 ``purged``).

The fork is a fragment-path event for the target: the forking host marks ``[cursor, tail)`` dirty
through its own dirty hook before the target's manifest makes the target visible, so a forked
backlog is compacted (and backpressure on it lifts) without waiting for a write to the target.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from host.wal3 import ObjectStore
from host.wal3.errors import LogExists, LogPurged, ObjectNotFound, PreconditionFailed, Wal3Error
from host.wal3.fork import fork_log
from host.wal3.layout import load_manifest
from host.wal3.manifest import Manifest
from host.wal3.store import ensure_copy, put_resolving

MarkDirty = Callable[[UUID, int, int], Awaitable[None]]


class CorruptCompactedPointer(Wal3Error):
    """The source's ``CURRENT.json`` is not a valid pointer: the fork refuses to guess a base."""

    kind = "corrupt_compacted_pointer"


def current_key(collection_id: UUID) -> str:
    """``compacted/{cid}/CURRENT.json`` (the compactor's layout, see compactor_client.versions)."""
    return f"compacted/{collection_id}/CURRENT.json"


@dataclass(frozen=True, slots=True)
class ForkResult:
    """What the fork created."""

    manifest: Manifest
    start: int  # the target's oldest offset
    compaction_offset: int  # the target's compaction cursor (the copied version's offset, or 1)
    version: int | None  # the copied compacted version, if any


async def _read_current(store: ObjectStore, cid: UUID) -> dict[str, Any] | None:
    try:
        got = await store.get(current_key(cid))
    except ObjectNotFound:
        return None
    try:
        doc = json.loads(got.data)
    except ValueError as e:
        raise CorruptCompactedPointer(f"{current_key(cid)}: {e}") from e
    if not isinstance(doc, dict) or not isinstance(doc.get("offset"), int) \
            or not isinstance(doc.get("path"), str) or not isinstance(doc.get("version"), int):
        raise CorruptCompactedPointer(f"{current_key(cid)} is not a valid pointer: {doc!r}")
    return doc


async def _install_copy(store: ObjectStore, source: UUID, target: UUID,
                        current: dict[str, Any]) -> None:
    """Copy the version file, then point the target's ``CURRENT.json`` at it."""
    path = str(current["path"])
    new_path = path.replace(f"compacted/{source}/", f"compacted/{target}/", 1)
    if new_path == path:
        raise CorruptCompactedPointer(f"compacted version {path!r} is not under "
                                      f"compacted/{source}/")
    await ensure_copy(store, path, new_path)  # immutable: a retried fork finds it in place
    now = time.time()
    doc = {**current, "path": new_path, "installed_at": now,
           "history": [{"version": current["version"], "installed_at": now}]}
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()
    key = current_key(target)
    try:
        await put_resolving(store, key, body, if_none_match="*")
    except PreconditionFailed:
        # The target's log does not exist yet (the manifest is written after this), so no
        # compactor has touched its CURRENT.json: this is a leftover of a crashed fork attempt.
        got = await store.get(key)
        await put_resolving(store, key, body, if_match=got.etag)


async def fork_collection(store: ObjectStore, *, source: UUID, target: UUID, source_prefix: str,
                          target_prefix: str, source_manifest: Manifest, offset: int,
                          writer_name: str, mark_dirty: MarkDirty) -> ForkResult:
    """Fork ``source`` into ``target`` at ``offset`` (see the module docstring)."""
    if await load_manifest(store, target_prefix) is not None:  # before judging the source
        raise LogExists(f"a log already exists at {target_prefix!r}")
    current = await _read_current(store, source)
    if current is not None and current["offset"] > source_manifest.next_offset:
        current = None  # not this log's data (a pointer past the tail): never a base
    cursor = current["offset"] if current is not None else 1
    start = min(offset, cursor)
    if start < source_manifest.oldest_offset:
        raise LogPurged(start, source_manifest.oldest_offset)

    async def before_commit(forked: Manifest) -> None:
        # Both before the manifest: a visible target always has its base and is always tracked.
        if current is not None:
            await _install_copy(store, source, target, current)
        else:
            # A crashed attempt from another source may have left a pointer: the target has no
            # compacted base, so none may stand (a compactor would fold onto foreign rows).
            await store.delete(current_key(target))
        if forked.next_offset > cursor:
            await mark_dirty(target, cursor, forked.next_offset - cursor)

    forked = await fork_log(store, source_prefix, target_prefix, from_offset=start,
                            writer_name=writer_name, compaction_offset=cursor,
                            before_commit=before_commit)
    return ForkResult(forked, forked.oldest_offset, cursor,
                      current["version"] if current is not None else None)
