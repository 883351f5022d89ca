"""Shared checks for wal3 tests: read a whole log back and verify it end to end."""

from __future__ import annotations

from host.wal3 import LogReader, Manifest, ObjectStore, Setsum
from host.wal3.fragment import LogRecord, decode_fragment
from host.wal3.layout import join
from host.wal3.reader import SnapshotCache, resolve_fragments
from host.wal3.reader import Limits


async def read_all(store: ObjectStore, prefix: str) -> tuple[Manifest, list[LogRecord]]:
    """Every live record of a log, verified against the manifest's setsums."""
    reader = LogReader(store, prefix)
    manifest = await reader.manifest()
    records = await reader.read(manifest.oldest_offset, manifest=manifest)
    return manifest, records


async def recomputed_setsum(store: ObjectStore, prefix: str, manifest: Manifest) -> Setsum:
    """The setsum of every live fragment recomputed from the objects, plus what was collected."""
    pointers = await resolve_fragments(store, prefix.strip("/"), manifest.entries,
                                       manifest.oldest_offset, Limits(), SnapshotCache())
    total = manifest.collected
    for p in pointers:
        got = await store.get(join(prefix, p.path))
        total = total + decode_fragment(got.data).setsum
    return total


def assert_dense(records: list[LogRecord], first: int) -> None:
    """Offsets are contiguous from ``first``."""
    assert [r.offset for r in records] == list(range(first, first + len(records)))
