"""Shared checks for wal3 tests: read a whole log back and verify it end to end."""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal

from wal3 import (
    LocalStore,
    LogReader,
    LogWriter,
    LogWriterOptions,
    Manifest,
    ObjectStore,
    Setsum,
    SnapshotOptions,
)
from wal3.cursors import CursorStore
from wal3.fragment import LogRecord, decode_fragment
from wal3.layout import join
from wal3.reader import Limits, SnapshotCache, resolve_fragments
from wal3.store import GetResult, ObjectMeta


async def read_all(store: ObjectStore, prefix: str) -> tuple[Manifest, list[LogRecord]]:
    """Every live record of a log, verified against the manifest's setsums."""
    reader = LogReader(store, prefix)
    manifest = await reader.manifest()
    records = await reader.read(manifest.oldest_offset, manifest=manifest)
    return manifest, records


async def recomputed_setsum(store: ObjectStore, prefix: str, manifest: Manifest) -> Setsum:
    """The setsum of every live fragment recomputed from the objects, plus what was collected."""
    pointers = await resolve_fragments(
        store,
        prefix.strip("/"),
        manifest.entries,
        manifest.oldest_offset,
        Limits(),
        SnapshotCache(),
    )
    total = manifest.collected
    for p in pointers:
        got = await store.get(join(prefix, p.path))
        total = total + decode_fragment(got.data).setsum
    return total


class Clock:
    """A settable clock (seconds) so grace intervals pass without sleeping."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


async def fill(w: LogWriter, n: int, tag: str = "r") -> None:
    """Append ``n`` records ``{tag}0`` … one at a time (one fragment each)."""
    for i in range(n):
        await w.append(f"{tag}{i}".encode())


def assert_dense(records: list[LogRecord], first: int) -> None:
    """Offsets are contiguous from ``first``."""
    assert [r.offset for r in records] == list(range(first, first + len(records)))


class Gate:
    """One request the ``GateStore`` holds: ``reached`` is set when it arrives, and it proceeds
    once ``release`` is set.  ``landed`` is set when a request matching it has completed;
    ``cancelled`` when it was cancelled while held (it then never reaches the store)."""

    def __init__(self, op: str, regex: str, hold: bool) -> None:
        self.op, self.rx, self.hold = op, re.compile(regex), hold
        self.armed = True
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.landed = asyncio.Event()
        self.cancelled = asyncio.Event()


class GateStore(ObjectStore):
    """Delegates to ``inner``; requests matching an armed gate wait for the test (interleavings
    are forced by events, never by sleeps)."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner = inner
        self.gates: list[Gate] = []

    def hold(self, op: str, regex: str) -> Gate:
        """Hold the next matching request until ``release`` is set."""
        g = Gate(op, regex, True)
        self.gates.append(g)
        return g

    def watch(self, op: str, regex: str) -> Gate:
        """Signal ``landed`` once the next matching request has completed."""
        g = Gate(op, regex, False)
        self.gates.append(g)
        return g

    async def _before(self, op: str, key: str) -> list[Gate]:
        hit = [g for g in self.gates if g.armed and g.op == op and g.rx.search(key)]
        for g in hit:
            g.armed = False
            g.reached.set()
            if g.hold:
                try:
                    await g.release.wait()
                except asyncio.CancelledError:
                    g.cancelled.set()
                    raise
        return hit

    @staticmethod
    def _after(hit: list[Gate]) -> None:
        for g in hit:
            g.landed.set()

    async def get(self, key: str) -> GetResult:
        hit = await self._before("get", key)
        r = await self.inner.get(key)
        self._after(hit)
        return r

    async def head(self, key: str) -> ObjectMeta:
        hit = await self._before("head", key)
        r = await self.inner.head(key)
        self._after(hit)
        return r

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        hit = await self._before("put", key)
        r = await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
        self._after(hit)
        return r

    async def delete(self, key: str) -> None:
        hit = await self._before("delete", key)
        await self.inner.delete(key)
        self._after(hit)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        async for m in self.inner.list(prefix, start_after=start_after):
            yield m

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)


async def twelve_record_log(root: Path, prefix: str, cursor: int) -> tuple[LocalStore, Manifest]:
    """The GC tests' log: twelve records, one per fragment (offset i holds ``r{i}``), the first
    eight in two depth-1 snapshots of four, and a compaction cursor at ``cursor`` (our own
    planner cuts it at 10 for a cursor at 10: both snapshots and fragment 9 go)."""
    store = LocalStore(root)
    opts = LogWriterOptions(
        writer_name="w", snapshot=SnapshotOptions(fragment_threshold=4, snapshot_threshold=100)
    )
    w = await LogWriter.open(store, prefix, opts)
    for i in range(12):
        await w.append(f"r{i + 1}".encode())
    await w.compact_manifest()
    m = w.manifest
    await w.close()
    await CursorStore(store, prefix, "t").init("compaction", cursor)
    return store, m


def age_objects(root: Path, seconds: float) -> None:
    """Move every object's Last-Modified back by ``seconds`` (as if written that long ago: the
    local store's Last-Modified is the file's mtime)."""
    for d, _, files in os.walk(root):
        for f in files:
            path = os.path.join(d, f)
            st = os.stat(path)
            os.utime(path, (st.st_atime - seconds, st.st_mtime - seconds))


def record_bodies(lo: int, hi: int) -> list[bytes]:
    """The bodies ``r{lo}`` … ``r{hi - 1}`` of :func:`twelve_record_log`."""
    return [f"r{i}".encode() for i in range(lo, hi)]
