"""Issue 20, items 2 and 3: a fork killed between any two of its steps, then retried.

Whatever step it dies at, the retry yields a target whose compaction cursor stands on the copied
compacted version, whose log holds every record at or above the cursor, and which was marked dirty
before its manifest made it visible.  The dead attempt's creation claim holds the target until it
expires (as seen by the retrying process); then the retry takes it over and starts clean.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from host.forks import current_key, fork_collection
from host.manager import log_prefix
from wal3 import LocalStore, LogWriter
from wal3.claim import CreationInProgress
from wal3.cursors import COMPACTION, CursorStore
from wal3.errors import ObjectNotFound, SimulatedCrash
from wal3.faulty import FaultKind, FaultRule, FaultyStore
from wal3.layout import load_manifest

from .claimkit import TTL_S, stepped_watch

SRC = uuid.UUID(int=1, version=4)
DST = uuid.UUID(int=2, version=4)

STEPS = [
    ("crash_after", r"/CLAIM$"),  # claimed, nothing written
    ("crash_before", r"/cursor/compaction\.json$"),  # objects copied, nothing else
    ("crash_after", r"/cursor/compaction\.json$"),  # cursor written
    ("crash_after", r"CURRENT\.json$"),  # compacted base installed
    ("crash_before", r"/manifest/MANIFEST$"),  # marked dirty, not yet visible
]


async def _source(store: LocalStore) -> None:
    """A source with records [1, 16) in three fragments and a compacted version at offset 6."""
    w = await LogWriter.open(store, log_prefix(SRC))
    for n in range(3):
        await w.append_many([b'{"id":"x","op":"upsert"}'] * 5)
        assert w.manifest.next_offset == 6 + 5 * n
    await w.close()
    path = f"compacted/{SRC}/v{1:016d}/part-t.parquet"
    await store.put(path, b"version bytes")
    await store.put(
        current_key(SRC), json.dumps({"version": 1, "offset": 6, "rows": 1, "path": path}).encode()
    )


@pytest.mark.parametrize("step", STEPS, ids=[f"{k}:{r}" for k, r in STEPS])
async def test_a_fork_killed_at_any_step_then_retried_is_whole(
    tmp_path: Path, step: tuple[FaultKind, str]
) -> None:
    base = LocalStore(tmp_path / "s")
    await _source(base)
    loaded = await load_manifest(base, log_prefix(SRC))
    assert loaded is not None
    marks: list[tuple[uuid.UUID, int, int]] = []

    async def mark(cid: uuid.UUID, first: int, count: int) -> None:
        # The mark must come before the target is visible.
        assert await load_manifest(base, log_prefix(cid)) is None
        marks.append((cid, first, count))

    faulty = FaultyStore(base, seed=1)
    kind, key = step
    rule = faulty.add_rule(FaultRule(kind, ops={"put"}, key_regex=key, times=1))
    watch, clock = stepped_watch()
    with pytest.raises(SimulatedCrash):
        await fork_collection(
            faulty,
            source=SRC,
            target=DST,
            source_prefix=log_prefix(SRC),
            target_prefix=log_prefix(DST),
            source_manifest=loaded[0],
            offset=11,
            writer_name="t",
            mark_dirty=mark,
            claims=watch,
        )
    assert rule.fired == 1
    assert await load_manifest(base, log_prefix(DST)) is None  # a crashed fork is invisible

    async def retry() -> object:
        return await fork_collection(
            base,
            source=SRC,
            target=DST,
            source_prefix=log_prefix(SRC),
            target_prefix=log_prefix(DST),
            source_manifest=loaded[0],
            offset=11,
            writer_name="t",
            mark_dirty=mark,
            claims=watch,
        )

    with pytest.raises(CreationInProgress):  # the dead attempt's claim, first seen now
        await retry()
    clock.advance(TTL_S)
    result = await retry()
    forked = await load_manifest(base, log_prefix(DST))
    assert forked is not None
    m = forked[0]
    cursor = await CursorStore(base, log_prefix(DST), "t").load(COMPACTION)
    current = json.loads((await base.get(current_key(DST))).data)
    assert cursor is not None and cursor.cursor.offset == current["offset"] == 6
    assert result.compaction_offset == 6 and m.oldest_offset <= 6 and m.next_offset == 16
    assert await base.head(current["path"]) is not None
    assert marks[-1] == (DST, 6, 10)
    with pytest.raises(ObjectNotFound):  # the claim is gone with the commit
        await base.head(f"{log_prefix(DST)}/CLAIM")


async def test_a_fork_below_the_compacted_version_keeps_the_cursor_on_it(tmp_path: Path) -> None:
    """The documented crash window (compaction cursor behind CURRENT.json) makes the default fork
    offset lie below the compacted version: the target still gets the version and a cursor on it,
    and its log starts at the requested offset."""
    store = LocalStore(tmp_path / "s")
    await _source(store)
    loaded = await load_manifest(store, log_prefix(SRC))
    assert loaded is not None
    marks: list[tuple[uuid.UUID, int, int]] = []

    async def mark(cid: uuid.UUID, first: int, count: int) -> None:
        marks.append((cid, first, count))

    result = await fork_collection(
        store,
        source=SRC,
        target=DST,
        source_prefix=log_prefix(SRC),
        target_prefix=log_prefix(DST),
        source_manifest=loaded[0],
        offset=3,
        writer_name="t",
        mark_dirty=mark,
    )
    assert result.compaction_offset == 6 and result.version == 1
    assert result.start <= 3
    assert marks == [(DST, 6, 10)]


async def test_a_fork_of_a_never_compacted_log_starts_at_1(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    w = await LogWriter.open(store, log_prefix(SRC))
    for _ in range(3):
        await w.append_many([b'{"id":"x","op":"upsert"}'] * 5)
    await w.close()
    loaded = await load_manifest(store, log_prefix(SRC))
    assert loaded is not None
    marks: list[tuple[uuid.UUID, int, int]] = []

    async def mark(cid: uuid.UUID, first: int, count: int) -> None:
        marks.append((cid, first, count))

    result = await fork_collection(
        store,
        source=SRC,
        target=DST,
        source_prefix=log_prefix(SRC),
        target_prefix=log_prefix(DST),
        source_manifest=loaded[0],
        offset=11,
        writer_name="t",
        mark_dirty=mark,
    )
    # No compacted data: no cursor ahead of what the log holds.
    assert (result.compaction_offset, result.start, result.version) == (1, 1, None)
    assert marks == [(DST, 1, 15)]
    with pytest.raises(ObjectNotFound):
        await store.head(current_key(DST))
