"""Fork: a new, independent log whose content equals a source log from an offset to its tail.

Offsets, timestamps and setsums are identical: the fork's manifest carries the same ``setsum``,
with everything before the fork point accounted in ``collected``.  Fragments and snapshots are
copied object by object (server-side where the store can, a hard link on the local store) rather
than rewritten, and a snapshot straddling the fork point is split as garbage collection would.
Nothing is shared afterwards, so collecting one log never touches the other's objects.

Order of effects, and why a crash between any two is safe:

0. With a ``claim`` (``wal3.claim``, what the server always uses): the target's creation is
   claimed and what dead attempts left there is cleaned up first; every write below is a claimed
   write (``Claim.write``: guarded, and counted until it ends) that creates its object
   (If-None-Match) and accepts an object already there only if it holds exactly our bytes, so no
   other attempt's objects can be mixed with ours.
1. Copy every fragment and snapshot the target's root reaches (split snapshots are new objects),
   concurrently in one ``run_all`` (a task group: the first failure cancels the other copies and
   returns only once every one has ended).
2. Write the target's compaction cursor, when one is given (``compaction_offset``).  It must lie in
   the target's range: a cursor is never ahead of what the log (or a compacted version) holds.
3. ``before_commit(forked)``: the server copies the compacted version the cursor stands on and
   marks the target dirty, so the target is in a dirty set before anyone can see it.
4. Write the target's manifest, with If-None-Match: the commit point.

Before 4 the target does not exist: a crash leaves only unreferenced objects (and at worst a dirty
mark of a log with no records, which the roll-up drops) and the claim, which expires; the next
claimant — a retried fork or the log's first write — removes those objects before writing its own.
A failure is no different: the claim is released at once only when none of the fork's writes may
still land (none cancelled after it was issued, none ended in an ambiguous error, the manifest
put not sent); otherwise it expires like a crashed fork's, so no straggling copy lands after the
next claimant's clean-up.  After 4 the target is complete: cursor, compacted data and dirty mark
came first.  Without a claim (tools and tests that own the target), a retried fork overwrites the
cursor it left.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from .claim import Claim, ClaimLost, copy_claimed, put_claimed, run_all
from .cursors import COMPACTION, CursorStore
from .errors import (
    CursorConflict,
    LogExists,
    LogNotFound,
    LogPurged,
    PreconditionFailed,
)
from .gc import plan_cut
from .layout import load_manifest
from .manifest import FragmentPointer, Manifest, Pointer, Snapshot
from .paths import MANIFEST_PATH, join
from .reader import SnapshotCache
from .store import ObjectStore, ensure_copy, ensure_object, put_resolving

T = TypeVar("T")
BeforeCommit = Callable[[Manifest], Awaitable[None]]
# Claims the target (cleaning up dead attempts' leftovers); None when a log exists there.
AcquireClaim = Callable[[], Awaitable[Claim | None]]


async def fork_log(
    store: ObjectStore,
    source: str,
    target: str,
    *,
    from_offset: int | None = None,
    writer_name: str = "wal3-fork",
    concurrency: int = 16,
    compaction_offset: int | None = None,
    before_commit: BeforeCommit | None = None,
    acquire: AcquireClaim | None = None,
) -> Manifest:
    """Fork ``source`` into ``target`` from ``from_offset`` (default: its compaction cursor).

    ``compaction_offset`` gives the target a compaction cursor there (it must lie within the
    target's records, ``[from_offset, tail]``); ``before_commit`` runs after every object is in
    place and before the manifest makes the target visible (see the module docstring).  With
    ``acquire``, the target's creation claim is taken once the source is read, before the first
    write to the target (``wal3.claim``), kept alive while the fork runs and guards every
    write; the caller finishes or releases it.
    """
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
    if acquire is None:
        return await _fork_into(
            store,
            source,
            target,
            m,
            from_offset,
            writer_name,
            concurrency,
            compaction_offset,
            before_commit,
            None,
        )
    claim = await acquire()
    if claim is None:
        raise LogExists(f"a log already exists at {target!r}")
    async with claim.kept_alive():  # a live fork keeps the target, however long it takes
        return await _fork_into(
            store,
            source,
            target,
            m,
            from_offset,
            writer_name,
            concurrency,
            compaction_offset,
            before_commit,
            claim,
        )


async def _fork_into(
    store: ObjectStore,
    source: str,
    target: str,
    m: Manifest,
    from_offset: int,
    writer_name: str,
    concurrency: int,
    compaction_offset: int | None,
    before_commit: BeforeCommit | None,
    claim: Claim | None,
) -> Manifest:
    """Everything ``fork_log`` writes, from the source's manifest ``m`` (see its docstring)."""

    async def guard() -> None:
        if claim is not None:
            await claim.guard()

    async def write(op: Callable[[], Awaitable[T]]) -> T:
        # Under a claim: guarded, and counted until it ends (the claim is released only when no
        # write may still land).
        return await op() if claim is None else await claim.write(op)

    cache = SnapshotCache(256)
    created: set[str] = set()

    async def put_snapshot(s: Snapshot) -> None:
        created.add(s.path)
        key, body = join(target, s.path), s.to_bytes()
        if claim is None:
            await ensure_object(store, key, body)
        else:
            await write(lambda: put_claimed(store, key, body))

    garbage = await plan_cut(store, source, m, from_offset, cache, writer_name, put_snapshot)
    forked = garbage.apply(m, writer_name) if garbage is not None else m
    forked = Manifest(
        setsum=forked.setsum,
        collected=forked.collected,
        acc_bytes=forked.acc_bytes,
        writer=writer_name,
        snapshots=forked.snapshots,
        fragments=forked.fragments,
        initial_offset=forked.initial_offset,
        initial_seq_no=forked.initial_seq_no,
        sealed=False,
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
        src, dst = join(source, path), join(target, path)
        async with sem:
            if claim is None:
                await ensure_copy(store, src, dst)
            else:
                await write(lambda: copy_claimed(store, src, dst))

    await run_all(copy(p) for p in paths)
    if compaction_offset is not None:
        _check_compaction_offset(forked, compaction_offset)
        await write(
            lambda: _write_compaction_cursor(
                store, target, writer_name, forked, compaction_offset, claimed=claim is not None
            )
        )
    if before_commit is not None:
        await guard()
        await before_commit(forked)
    await guard()
    if claim is not None:
        claim.commit_sent = True  # from here on the target may appear: the claim must stay
    try:
        await put_resolving(
            store, join(target, MANIFEST_PATH), forked.to_bytes(), if_none_match="*"
        )
    except PreconditionFailed:
        raise LogExists(f"a log appeared at {target!r} during the fork") from None
    return forked


def _check_compaction_offset(forked: Manifest, offset: int) -> None:
    """Every record at or above the cursor must be in the log: GC trusts the cursor."""
    if not forked.oldest_offset <= offset <= forked.next_offset:
        raise ValueError(
            f"compaction offset {offset} is outside the fork's records "
            f"[{forked.oldest_offset}, {forked.next_offset}]"
        )


async def _write_compaction_cursor(
    store: ObjectStore,
    target: str,
    writer_name: str,
    forked: Manifest,
    offset: int,
    *,
    claimed: bool,
) -> None:
    """The target's compaction cursor: created (under a claim, where dead attempts' cursors were
    cleaned up), or replacing one a crashed earlier attempt left behind (without one)."""
    _check_compaction_offset(forked, offset)
    cursors = CursorStore(store, target, writer_name)
    if claimed:
        try:
            await cursors.init(COMPACTION, offset)
        except CursorConflict:
            # Cleaned up under our claim, yet there: another attempt wrote it after all.
            raise ClaimLost(f"{target}: a compaction cursor appeared under our claim") from None
        return
    existing = await cursors.load(COMPACTION)
    if existing is None:
        await cursors.init(COMPACTION, offset)
    else:
        # The target has no manifest yet (checked above), so nobody else owns its cursors: this
        # is a leftover of a fork that crashed before its commit point.
        await cursors.save(COMPACTION, offset, existing)
