"""The in-memory backend honours the DirtyLogBackend contract; the hook appends exactly one mark."""

from __future__ import annotations

import ast
import pathlib
import uuid

import pytest

from dirtylog import (
    CompactionOffsets,
    DirtyLogBackend,
    DirtyLogHook,
    DirtyRecord,
    MemoryCompactionOffsets,
    MemoryLogBackend,
    RecordKind,
)
from wal3.errors import (
    CursorConflict,
    CursorNotFound,
    InvalidCursorName,
    LogPurged,
    NoCursors,
    SimulatedCrash,
    StoreUnavailable,
)

from .helpers import FakeClock, cid


def test_memory_implementations_satisfy_the_protocols() -> None:
    assert isinstance(MemoryLogBackend(), DirtyLogBackend)
    assert isinstance(MemoryCompactionOffsets(), CompactionOffsets)


async def test_append_read_offsets_are_dense_from_one() -> None:
    b = MemoryLogBackend()
    assert (await b.oldest_offset(), await b.next_offset()) == (1, 1)
    assert await b.read(1, 10) == []
    assert await b.append_many([b"a", b"b"]) == 1
    assert await b.append_many([b"c"]) == 3
    assert await b.next_offset() == 4
    assert await b.read(1, 2) == [(1, b"a"), (2, b"b")]
    assert await b.read(2, 10) == [(2, b"b"), (3, b"c")]
    assert await b.read(4, 10) == []
    with pytest.raises(ValueError):
        await b.append_many([])
    with pytest.raises(ValueError):
        await b.read(1, 0)


async def test_cursors_cas_and_gc_purge() -> None:
    b = MemoryLogBackend()
    for i in range(5):
        await b.append_many([bytes([i])])
    assert await b.load_cursor("c") is None
    with pytest.raises(NoCursors):
        await b.collect_garbage()
    w1 = await b.create_cursor("c", 1)
    assert await b.load_cursor("c") == (1, w1)
    with pytest.raises(CursorConflict):
        await b.create_cursor("c", 2)
    w2 = await b.cas_cursor("c", 4, w1)
    assert w2 != w1
    with pytest.raises(CursorConflict):
        await b.cas_cursor("c", 5, w1)  # stale witness
    with pytest.raises(CursorNotFound):
        await b.cas_cursor("nope", 1, w1)
    with pytest.raises(InvalidCursorName):
        await b.create_cursor("bad-name", 1)
    with pytest.raises(ValueError):
        await b.cas_cursor("c", 7, w2)  # past the end
    await b.collect_garbage()
    assert await b.oldest_offset() == 4
    with pytest.raises(LogPurged) as info:
        await b.read(3, 1)
    assert (info.value.offset, info.value.oldest_offset) == (3, 4)
    assert await b.read(4, 5) == [(4, bytes([3])), (5, bytes([4]))]
    # GC honours the minimum of all cursors.
    await b.create_cursor("other", 4)
    w3 = await b.cas_cursor("c", 6, w2)
    await b.collect_garbage()
    assert await b.oldest_offset() == 4
    with pytest.raises(LogPurged):
        await b.cas_cursor("c", 2, w3)  # cannot point a cursor at reclaimed records


async def test_fault_before_effect_and_after_effect() -> None:
    b = MemoryLogBackend()
    b.inject_fault("append")
    with pytest.raises(SimulatedCrash):
        await b.append_many([b"x"])
    assert await b.next_offset() == 1  # nothing landed
    b.inject_fault("append", after=True, exc=StoreUnavailable("ambiguous"))
    with pytest.raises(StoreUnavailable):
        await b.append_many([b"x"])
    assert await b.next_offset() == 2  # it landed, the caller just did not hear
    b.inject_fault(None, skip=1)
    await b.next_offset()
    with pytest.raises(SimulatedCrash):
        await b.read(1, 1)
    assert b.pending_faults == 0
    with pytest.raises(ValueError):
        b.inject_fault("nonsense")
    assert b.trace[-1] == "read"


async def test_hook_appends_one_48_byte_mark_per_fragment() -> None:
    b = MemoryLogBackend()
    clock = FakeClock()
    hook = DirtyLogHook(b, clock)
    assert await hook.mark_dirty(cid(1), 11, 5) == 1
    clock.advance_s(1)
    assert await hook.mark_dirty(cid(2), 1, 1) == 2
    page = await b.read(1, 10)
    assert [len(body) for _, body in page] == [48, 48]
    assert DirtyRecord.decode(page[0][1]) == DirtyRecord(
        cid(1), 11, 5, clock.now_us - 1_000_000, 0, RecordKind.MARK_DIRTY
    )
    assert DirtyRecord.decode(page[1][1]).initial_insertion_epoch_us == clock.now_us


async def test_hook_failure_propagates_so_the_collection_write_fails() -> None:
    b = MemoryLogBackend()
    hook = DirtyLogHook(b, FakeClock())
    b.inject_fault("append", exc=StoreUnavailable("down"))
    with pytest.raises(StoreUnavailable):
        await hook.mark_dirty(cid(1), 1, 1)
    with pytest.raises(ValueError):
        await hook.mark_dirty(cid(1), 0, 1)  # invalid ranges are refused before any I/O
    assert await b.next_offset() == 1


async def test_hook_purge_dedupes_and_batches() -> None:
    b = MemoryLogBackend()
    hook = DirtyLogHook(b, FakeClock())
    assert await hook.purge([]) is None
    assert await hook.purge([cid(1), cid(2), cid(1)]) == 1
    assert b.calls["append"] == 1
    recs = [DirtyRecord.decode(body) for _, body in await b.read(1, 10)]
    assert [(r.kind, r.collection_id) for r in recs] == [
        (RecordKind.PURGE, cid(1)),
        (RecordKind.PURGE, cid(2)),
    ]


async def test_compaction_offsets_memory() -> None:
    c = MemoryCompactionOffsets()
    c.set(cid(1), 5)
    assert await c.compaction_offsets([cid(1), cid(2)]) == {cid(1): 5}
    assert c.get(cid(2)) == 1
    c.fail_next = SimulatedCrash("x")
    with pytest.raises(SimulatedCrash):
        await c.compaction_offsets([cid(1)])
    assert await c.compaction_offsets([cid(1)]) == {cid(1): 5}


def test_package_imports_nothing_of_the_server() -> None:
    """dirtylog may only import wal3.errors from the server tree; never FastAPI or Redis."""
    root = pathlib.Path(__file__).resolve().parents[2] / "dirtylog"
    files = sorted(root.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                assert top not in {"fastapi", "redis", "starlette", "uvicorn"}, (path, name)
                if top == "host":
                    assert name == "wal3.errors", (path, name)


def test_uuid_helper_is_stable() -> None:
    assert cid(0) == uuid.UUID(int=1)
