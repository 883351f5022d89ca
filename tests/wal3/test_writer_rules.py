"""``LogWriter`` (wal3/writer.py), the facade, rule by rule: what it answers, what it keeps of
the caller's arguments, and when its in-memory manifest may answer a read.  Written against the
mutation run of the module (docs/RELIABILITY.md): each test names the survivors it kills.  The
jobs behind the facade have their own tests (the batcher, committer and recovery through
test_writer.py and the adversary files; the lease in test_lease_rules.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

import pytest

from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions
from wal3.errors import LogContention, ObjectNotFound, PreconditionFailed
from wal3.localstore import LocalStore
from wal3.paths import MANIFEST_PATH
from wal3.store import GetResult

from .helpers import read_all
from .test_read_lease import ManualClock, _claimed, _opts, _settle


def _store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store", fsync=False)


async def test_append_answers_the_offset_and_timestamp_the_record_was_written_with(
    tmp_path: Path,
) -> None:
    """Kills ``append``'s ``LogPosition(r.first_offset, None)``."""
    store = _store(tmp_path)
    w = await LogWriter.open(store, "logs/ts", LogWriterOptions(batch=BatchOptions(interval_s=0)))
    first = await w.append(b"one")
    second = await w.append(b"two")
    await w.close()
    _, records = await read_all(store, "logs/ts")
    assert [(r.offset, r.timestamp_us) for r in records] == [
        (first.offset, first.timestamp_us),
        (second.offset, second.timestamp_us),
    ]
    assert isinstance(first.timestamp_us, int) and first.timestamp_us > 0


async def test_bodies_that_are_buffers_are_copied_when_appended(tmp_path: Path) -> None:
    """A bytearray or memoryview body is accepted and copied before the call returns control:
    the caller may reuse its buffer.  Kills ``_as_body``'s ``memoryview(None)``."""
    store = _store(tmp_path)
    w = await LogWriter.open(store, "logs/buf", LogWriterOptions(batch=BatchOptions(interval_s=0)))
    buf = bytearray(b"first")
    view = memoryview(bytearray(b"second"))
    result = await w.append_many([buf, view, b"third"])
    buf[:] = b"XXXXX"
    view[:] = b"YYYYYY"
    await w.close()
    _, records = await read_all(store, "logs/buf")
    assert [r.body for r in records] == [b"first", b"second", b"third"]
    assert result.first_offset == records[0].offset and result.count == 3


async def test_the_prefix_is_kept_without_its_outer_slashes_only(tmp_path: Path) -> None:
    """``prefix.strip("/")``: only slashes go, and only at the ends (a prefix may start or end
    with any other character).  Kills ``strip(None)`` and ``strip("XX/XX")``; the store the
    writer reports is the one it writes to (kills ``self._store = None``)."""
    store = _store(tmp_path)
    w = await LogWriter.open(store, "/Xlogs/ a X/", LogWriterOptions())
    assert w.prefix == "Xlogs/ a X"
    assert w.store is store
    await w.append(b"r")
    await w.close()
    _, records = await read_all(store, "Xlogs/ a X")
    assert [r.body for r in records] == [b"r"]


async def test_a_writer_that_is_recovering_or_failed_vouches_for_nothing(tmp_path: Path) -> None:
    """The read lease vouches for the in-memory manifest only while the writer is healthy: not
    failed, not recovering, not stale, each on its own.  Kills the two ``_healthy`` mutants
    that turn one ``and`` into ``or``."""
    clock = ManualClock()
    store = _store(tmp_path)
    opts = LogWriterOptions(
        writer_name="A",
        clock=clock,
        batch=BatchOptions(interval_s=0),
        lease=LeaseOptions(read_lease_s=10.0),
    )
    w = await LogWriter.open(store, "logs/h", opts)
    await w.append(b"r1")
    assert w.current_manifest() is not None  # healthy and leased
    recovery, committer = w._recovery, w._committer
    for recovering, stale, failure in (
        (True, False, None),
        (False, True, None),
        (False, False, RuntimeError("crashed")),
    ):
        # The three states as their jobs set them (private: a real recovery cannot be held
        # half-way from here without a gated store, and a failure ends the writer).
        recovery._recovering, recovery._stale, committer._failure = recovering, stale, failure
        assert w.current_manifest() is None, (recovering, stale, failure)
        assert w.lease_remaining() == 0
    recovery._recovering, recovery._stale, committer._failure = False, False, None
    assert w.current_manifest() is not None
    await w.close()


async def test_the_commit_task_is_named_for_its_log(tmp_path: Path) -> None:
    """A task dump (asyncio debug, py-spy, a hung test's report) names each log's committer.
    Kills ``start(..., name=None)``."""
    w = await LogWriter.open(_store(tmp_path), "logs/named", LogWriterOptions())
    names = {t.get_name() for t in asyncio.all_tasks()}
    assert "wal3-commit:logs/named" in names
    await w.close()


class _VanishingManifestStore(LocalStore):
    """A manifest that is there when created and gone when read: every open's create loses to
    it and every load misses it (another process creating and deleting the log, forever)."""

    async def get(self, key: str) -> GetResult:
        if key.endswith(MANIFEST_PATH):
            raise ObjectNotFound(key)
        return await super().get(key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        if key.endswith(MANIFEST_PATH):
            raise PreconditionFailed(key)
        return await super().put(key, data, if_none_match=if_none_match, if_match=if_match)


async def test_an_open_that_never_settles_names_the_log(tmp_path: Path) -> None:
    """After ``max_rebases`` rounds of create-lost and load-missed, ``open`` gives up with a
    ``LogContention`` that names the log.  Kills ``LogContention(None)``."""
    store = _VanishingManifestStore(tmp_path / "store", fsync=False)
    with pytest.raises(LogContention, match="could not open logs/churn: the manifest kept"):
        await LogWriter.open(store, "logs/churn", LogWriterOptions())


async def test_a_take_over_at_open_is_fenced_for_the_lease_the_log_records(
    tmp_path: Path,
) -> None:
    """B (1 s leases) opens a log A wrote with 10 s leases: A may answer reads from memory for
    10 s, so what B loaded waits FENCE_FACTOR x 10 s before B tells anyone, not x 1 s (the host
    waits ``wait_fence`` before it answers from an open writer).  Kills ``open``'s
    ``note_load(None, etag)`` (a fence sized by B's own setting)."""
    clock = ManualClock()
    store = _store(tmp_path)
    a = await LogWriter.open(store, "logs/f", _opts(clock, "A", 10.0))
    await a.append(b"r1")
    b = await LogWriter.open(store, "logs/f", _opts(clock, "B", 1.0))
    t = asyncio.create_task(b.wait_fence())
    for step in (0.0, 1.3, 5.0, 6.0):  # 12.3 s: past B's own 1.25 s, short of A's 12.5 s
        clock.advance(step)
        await _settle()
        assert not t.done()
    clock.advance(0.3)
    await t
    await a.close()
    await b.close()


async def test_an_open_told_it_wrote_nothing_is_a_take_over(tmp_path: Path) -> None:
    """``authored=(None, fence)``: the previous writer of this process did not know it wrote
    the stored manifest, so the open fences like any take-over (and keeps that fence).  Kills
    ``authored[1] and ...`` for ``authored[0] and ...`` (which took the etag of None)."""
    clock = ManualClock()
    store = _store(tmp_path)
    a = await LogWriter.open(store, "logs/n", _opts(clock, "A", 1.0))
    await a.append(b"r1")
    await a.close()
    again = await LogWriter.open(
        store, "logs/n", _opts(clock, "A", 1.0), authored=(None, float("-inf"))
    )
    assert not again.authored and again.current_manifest() is None
    t = asyncio.create_task(again.append(b"r2"))
    await _claimed(again, store, "logs/n", "A", 2)
    await _settle()
    assert not t.done()
    clock.advance(1.25)
    assert (await t).offset == 2
    await again.close()


async def test_an_empty_append_is_refused_by_name(tmp_path: Path) -> None:
    """An empty append raises before anything is queued.  Kills the two mutants of the message."""
    w = await LogWriter.open(_store(tmp_path), "logs/e", LogWriterOptions())
    with pytest.raises(ValueError, match=r"^append at least one record$"):
        await w.append_many([])
    assert w.manifest.next_offset == 1  # nothing written
    await w.close()
