"""Fork: a new, independent log whose content equals a source log from an offset to its tail.

Offsets, timestamps and setsums are identical: the fork's manifest carries the same ``setsum``,
with everything before the fork point accounted in ``collected``.  Fragments and snapshots are
copied object by object (server-side where the store can, a hard link on the local store) rather
than rewritten, and a snapshot straddling the fork point is split as garbage collection would.
Nothing is shared afterwards, so collecting one log never touches the other's objects.  The
target's manifest is written last, with If-None-Match: a crashed fork is invisible and can be
retried.
"""

from __future__ import annotations

import asyncio

from .cursors import COMPACTION, CursorStore
from .errors import LogExists, LogNotFound, LogPurged, PreconditionFailed
from .gc import plan_cut
from .layout import join, load_manifest
from .manifest import MANIFEST_PATH, FragmentPointer, Manifest, Pointer, Snapshot
from .reader import SnapshotCache
from .store import ObjectStore, ensure_copy, ensure_object, put_resolving


async def fork_log(store: ObjectStore, source: str, target: str, *, from_offset: int | None = None,
                   writer_name: str = "wal3-fork", concurrency: int = 16) -> Manifest:
    """Fork ``source`` into ``target`` from ``from_offset`` (default: its compaction cursor)."""
    source, target = source.strip("/"), target.strip("/")
    loaded = await load_manifest(store, source)
    if loaded is None:
        raise LogNotFound(f"no log at {source!r}")
    if await load_manifest(store, target) is not None:
        raise LogExists(f"a log already exists at {target!r}")
    m = loaded[0]
    if from_offset is None:
        cursor = await CursorStore(store, source, writer_name).load(COMPACTION)
        from_offset = cursor.cursor.offset if cursor is not None else m.oldest_offset
    if from_offset < m.oldest_offset:
        raise LogPurged(from_offset, m.oldest_offset)
    from_offset = min(from_offset, m.next_offset)

    cache = SnapshotCache(256)
    created: set[str] = set()

    async def put_snapshot(s: Snapshot) -> None:
        created.add(s.path)
        await ensure_object(store, join(target, s.path), s.to_bytes())

    garbage = await plan_cut(store, source, m, from_offset, cache, writer_name, put_snapshot)
    forked = garbage.apply(m, writer_name) if garbage is not None else m
    forked = Manifest(
        setsum=forked.setsum, collected=forked.collected, acc_bytes=forked.acc_bytes,
        writer=writer_name, snapshots=forked.snapshots, fragments=forked.fragments,
        initial_offset=forked.initial_offset, initial_seq_no=forked.initial_seq_no, sealed=False,
    )
    forked.check()

    # Copy everything the new root reaches (split snapshots were written to the target already).
    paths: list[str] = []
    stack: list[Pointer] = list(forked.entries)
    while stack:
        p = stack.pop()
        if isinstance(p, FragmentPointer):
            paths.append(p.path)
            continue
        snap = await cache.get(store, source if p.path not in created else target, p)
        if p.path not in created:
            paths.append(p.path)
        stack.extend(snap.children)
    sem = asyncio.Semaphore(concurrency)

    async def copy(path: str) -> None:
        async with sem:
            await ensure_copy(store, join(source, path), join(target, path))

    await asyncio.gather(*(copy(p) for p in paths))
    try:
        await put_resolving(store, join(target, MANIFEST_PATH), forked.to_bytes(),
                            if_none_match="*")
    except PreconditionFailed:
        raise LogExists(f"a log appeared at {target!r} during the fork") from None
    return forked
