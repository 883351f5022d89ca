"""Forking a collection: its log (``wal3.fork``), its compacted version and its dirty mark.

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

**One creator per target.**  The target's cursor and ``CURRENT.json`` are written before its
manifest exists, so whoever creates the log must own them: a fork and the log's first write both
go through the target's creation claim (``wal3.claim``, ``create_collection_log``), which
serialises them and, before anything is written, removes what dead attempts left (cursors, copied
objects, ``compacted/{target}/``).  A fork that finds the claim held fails with
``CreationInProgress`` (409 ``contention``); so does a first write while a fork is in flight.  A
failed fork releases its claim only when none of its writes may still land (its copies, cursor and
``CURRENT.json`` are claimed writes, ``Claim.write``; a copy cancelled after it was issued or
ended by an ambiguous error may still land, and so may a manifest put that was sent): otherwise
the claim expires (twice the bound on one operation, ``claim_ttl_s``, or the holder's recorded TTL
when longer) and only then may the target be created or forked again.  The same holds for a
first write's claim (``create_collection_log``), including a request cancelled mid-way.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from wal3 import ObjectStore
from wal3.claim import (
    Claim,
    ClaimLost,
    ClaimWatch,
    CreationInProgress,
    claim_log,
    copy_claimed,
    create_log,
)
from wal3.errors import (
    ErrorKind,
    LogExists,
    LogPurged,
    ObjectNotFound,
    PreconditionFailed,
    Wal3Error,
)
from wal3.fork import fork_log
from wal3.layout import load_manifest
from wal3.manifest import Manifest
from wal3.paths import (  # the compactor's layout (compactor_client.versions writes it)
    compacted_prefix,
    copied_compacted_key,
    current_key,
)
from wal3.store import put_resolving

MarkDirty = Callable[[UUID, int, int], Awaitable[None]]


class CorruptCompactedPointer(Wal3Error):
    """The source's ``CURRENT.json`` is not a valid pointer: the fork refuses to guess a base."""

    kind = ErrorKind.DATA_LOSS  # a corrupt object in the store: 500 data_loss


# The spec's bound on one operation, as the dirty log's settle time uses it, whatever the grace.
_OPERATION_BOUND_S = 60.0


def claim_ttl_s(gc_grace_s: float, configured: float = 0.0) -> float:
    """How long a creation claim of this host must stand unchanged before another attempt may
    take it over: ``LOGHOST_CLAIM_TTL_S`` when set, else twice the bound on one operation,
    ``max(60 s, GC grace)`` (see ``wal3.claim``).  It is recorded in every claim this host
    makes, and observers wait for the longer of theirs and the holder's, so hosts whose
    settings differ (a rolling change) never take over each other's live claims."""
    if configured > 0:
        return configured
    return 2 * max(_OPERATION_BOUND_S, gc_grace_s)


async def create_collection_log(
    store: ObjectStore, collection_id: UUID, prefix: str, writer_name: str, claims: ClaimWatch
) -> bool:
    """Create a collection's log (empty) unless it exists, under its creation claim, removing
    what a dead fork left there first; False when it existed.  ``CreationInProgress`` while a
    fork into it is in flight (after a short wait: another host creating the same new log
    holds the claim only for a moment)."""
    delays = iter((0.05, 0.1, 0.2, 0.4))
    while True:
        if await load_manifest(store, prefix) is not None:
            return False
        try:
            return await create_log(
                store,
                prefix,
                Manifest.empty(writer_name),
                holder=writer_name,
                watch=claims,
                leftovers=[compacted_prefix(collection_id)],
            )
        except CreationInProgress:
            delay_s = next(delays, None)
            if delay_s is None:
                raise
            await asyncio.sleep(delay_s)  # back-off, bounded: then the caller hears 409


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
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("offset"), int)
        or not isinstance(doc.get("version"), int)
        or not _data_keys(doc)
    ):
        raise CorruptCompactedPointer(f"{current_key(cid)} is not a valid pointer: {doc!r}")
    return doc


def _data_keys(doc: dict[str, Any]) -> list[str] | None:
    """The files a pointer's version is made of: the runs of the leveled layout (``"format":
    2``, ``"runs"``), or the one ``"path"`` of the single-version layout; None when malformed."""
    if doc.get("format", 1) == 1:
        path = doc.get("path")
        return [path] if isinstance(path, str) else None
    runs = doc.get("runs")
    if doc.get("format") != 2 or not isinstance(runs, list):
        return None
    keys = [r["key"] for r in runs if isinstance(r, dict) and isinstance(r.get("key"), str)]
    if len(keys) != len(runs):
        return None  # a run that is not an object with a string key
    return keys or [""]  # an empty collection lists no runs: nothing to copy, still valid


async def _install_copy(
    store: ObjectStore, source: UUID, target: UUID, current: dict[str, Any], claim: Claim
) -> None:
    """Copy the version's files (its runs, or its one file), then point the target's
    ``CURRENT.json`` at the copies (all created: the claim cleaned up whatever a dead attempt
    left)."""
    renamed: dict[str, str] = {}
    for path in _data_keys(current) or []:
        if not path:
            continue
        new_path = copied_compacted_key(path, source, target)
        if new_path is None:
            raise CorruptCompactedPointer(
                f"compacted version {path!r} is not under {compacted_prefix(source)}"
            )
        renamed[path] = new_path
    for path, new_path in renamed.items():
        # Immutable, and ours (the claim cleaned up first): an object already there must be a copy.
        await claim.write(functools.partial(copy_claimed, store, path, new_path))
    now = time.time()
    doc = {
        **current,
        "installed_at": now,
        "history": [{"version": current["version"], "installed_at": now}],
    }
    if "path" in current:
        doc["path"] = renamed[current["path"]]
    if isinstance(current.get("runs"), list):
        doc["runs"] = [{**r, "key": renamed[r["key"]]} for r in current["runs"]]
        doc["retired"] = []  # the source's retired runs are the source's to prune
    body = json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()

    async def put_current() -> None:
        try:
            await put_resolving(store, current_key(target), body, if_none_match="*")
        except PreconditionFailed:
            # Cleaned up under our claim, yet there: another attempt wrote it after all.
            raise ClaimLost(f"{current_key(target)} appeared under our claim") from None

    await claim.write(put_current)


async def fork_collection(
    store: ObjectStore,
    *,
    source: UUID,
    target: UUID,
    source_prefix: str,
    target_prefix: str,
    source_manifest: Manifest,
    offset: int,
    writer_name: str,
    mark_dirty: MarkDirty,
    claims: ClaimWatch | None = None,
) -> ForkResult:
    """Fork ``source`` into ``target`` at ``offset`` (see the module docstring).

    ``claims``: this process's view of creation claims (the server's log manager keeps it);
    without one, a claim left by a crashed attempt is never judged expired here.
    """
    if await load_manifest(store, target_prefix) is not None:  # before judging the source
        raise LogExists(f"a log already exists at {target_prefix!r}")
    current = await _read_current(store, source)
    if current is not None and current["offset"] > source_manifest.next_offset:
        current = None  # not this log's data (a pointer past the tail): never a base
    cursor = current["offset"] if current is not None else 1
    start = min(offset, cursor)
    if start < source_manifest.oldest_offset:
        raise LogPurged(start, source_manifest.oldest_offset)

    watch = claims if claims is not None else ClaimWatch(claim_ttl_s(0.0))
    held: list[Claim] = []

    async def acquire() -> Claim | None:
        # From here on this attempt alone may write the target; what dead ones left is gone
        # (a stale CURRENT.json among it: with no source version, none may stand).
        claim = await claim_log(
            store,
            target_prefix,
            purpose="fork",
            holder=writer_name,
            watch=watch,
            leftovers=[compacted_prefix(target)],
        )
        held.extend([claim] if claim is not None else [])
        return claim

    async def before_commit(forked: Manifest) -> None:
        # Both before the manifest: a visible target always has its base and is always tracked.
        if current is not None:
            await _install_copy(store, source, target, current, held[0])
        if forked.next_offset > cursor:
            await mark_dirty(target, cursor, forked.next_offset - cursor)

    try:
        forked = await fork_log(
            store,
            source_prefix,
            target_prefix,
            from_offset=start,
            writer_name=writer_name,
            compaction_offset=cursor,
            before_commit=before_commit,
            acquire=acquire,
        )
    except LogExists:
        for claim in held:
            await claim.finish()  # a manifest exists (not ours): the claim means nothing now
        raise
    except BaseException as e:
        for claim in held:
            await claim.abandon(e)  # kept if a write of ours may still land: it expires then
        raise
    for claim in held:
        await claim.finish()
    return ForkResult(
        forked, forked.oldest_offset, cursor, current["version"] if current is not None else None
    )
