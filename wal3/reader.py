"""``LogReader``: find the fragments covering an offset and read records back, verified.

Readers never block writers.  A scan walks the root manifest and descends into snapshots only
where the requested offset lies inside one, so reading the tail never touches a snapshot.
Every fetched fragment is checked against the setsum its manifest pointer records.
"""

from __future__ import annotations

import asyncio
import collections
from dataclasses import dataclass, replace

from .errors import CorruptFragment, LogNotFound, LogPurged, ObjectNotFound
from .fragment import DecodedFragment, LogRecord, decode_fragment
from .layout import load_manifest
from .manifest import FragmentPointer, Manifest, Pointer, Snapshot, SnapshotPointer
from .paths import join
from .store import ObjectStore, content_etag

_DECODE_INLINE_BYTES = 256 << 10


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on one scan or read; at least one fragment is always returned when available."""

    max_records: int | None = None
    max_bytes: int | None = None
    max_files: int | None = None


def _check_named(snap: Snapshot, pointer: SnapshotPointer) -> None:
    """A snapshot must be what its pointer says: setsum, range, and no deeper than the pointer.

    A pointer may be deeper than its object: Rust's GC wraps a lone child in a snapshot one level
    up, which has the child's setsum and so its path, and links that depth to the child's object.
    Never shallower: a pointer's depth bounds the recursion below it (a snapshot naming itself
    one level down is refused, not followed for ever)."""
    kids = snap.children
    if (
        snap.setsum != pointer.setsum
        or snap.depth > pointer.depth
        or kids[0].start != pointer.start
        or kids[-1].limit != pointer.limit
    ):
        raise CorruptFragment(f"snapshot {pointer.path_to_snapshot} does not match its pointer")


class SnapshotCache:
    """A bounded LRU of decoded snapshots (they are immutable, so never stale)."""

    def __init__(self, capacity: int = 128) -> None:
        self._capacity = capacity
        self._items: collections.OrderedDict[str, Snapshot] = collections.OrderedDict()
        self.loads = 0

    def put(self, prefix: str, snap: Snapshot) -> None:
        """Remember a snapshot this process just wrote."""
        self._items[join(prefix, snap.path)] = snap
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)

    async def get(self, store: ObjectStore, prefix: str, pointer: SnapshotPointer) -> Snapshot:
        """The snapshot a pointer names, loading and verifying it on a miss."""
        key = join(prefix, pointer.path_to_snapshot)
        snap = self._items.get(key)
        if snap is not None:
            self._items.move_to_end(key)
            _check_named(snap, pointer)  # a hit answers another pointer too: check it as well
            return snap
        try:
            got = await store.get(key)
        except ObjectNotFound:
            raise CorruptFragment(f"snapshot {pointer.path_to_snapshot} is missing") from None
        snap = Snapshot.from_bytes(got.data)
        self.loads += 1
        _check_named(snap, pointer)
        self._items[key] = snap
        while len(self._items) > self._capacity:
            self._items.popitem(last=False)
        return snap


async def resolve_fragments(
    store: ObjectStore,
    prefix: str,
    entries: tuple[Pointer, ...] | list[Pointer],
    from_offset: int,
    limits: Limits,
    cache: SnapshotCache,
) -> list[FragmentPointer]:
    """Fragment pointers covering ``from_offset`` onwards, descending into snapshots as needed."""
    out: list[FragmentPointer] = []
    records = nbytes = 0

    def full() -> bool:
        if not out:
            return False
        return (
            (limits.max_files is not None and len(out) >= limits.max_files)
            or (limits.max_records is not None and records >= limits.max_records)
            or (limits.max_bytes is not None and nbytes >= limits.max_bytes)
        )

    async def walk(pointers: tuple[Pointer, ...] | list[Pointer]) -> None:
        nonlocal records, nbytes
        for p in pointers:
            if full():
                return
            if p.limit <= from_offset:
                continue
            if isinstance(p, FragmentPointer):
                out.append(p)
                records += p.limit - max(p.start, from_offset)
                nbytes += p.num_bytes
            else:
                snap = await cache.get(store, prefix, p)
                await walk(snap.children)

    await walk(entries)
    return out


async def tail_fragments(
    store: ObjectStore,
    prefix: str,
    entries: tuple[Pointer, ...] | list[Pointer],
    n: int,
    cache: SnapshotCache,
) -> list[FragmentPointer]:
    """The last ``n`` fragment pointers (oldest first), descending into snapshots as needed."""
    out: list[FragmentPointer] = []

    async def walk(pointers: tuple[Pointer, ...] | list[Pointer]) -> None:
        for p in reversed(pointers):
            if len(out) >= n:
                return
            if isinstance(p, FragmentPointer):
                out.append(p)
            else:
                await walk((await cache.get(store, prefix, p)).children)

    await walk(entries)
    out.reverse()
    return out


class LogReader:
    """Reads a log without coordinating with its writer."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        *,
        snapshot_cache: int = 128,
        fetch_concurrency: int = 8,
    ) -> None:
        self._store = store
        self._prefix = prefix.strip("/")
        self._cache = SnapshotCache(snapshot_cache)
        self._fetch_concurrency = fetch_concurrency

    @classmethod
    async def open(cls, store: ObjectStore, prefix: str) -> LogReader:
        """A reader for an existing log; raises LogNotFound."""
        reader = cls(store, prefix)
        await reader.manifest()
        return reader

    @property
    def snapshot_cache(self) -> SnapshotCache:
        """The reader's snapshot cache (exposed for tests and metrics)."""
        return self._cache

    async def manifest(self) -> Manifest:
        """The current manifest, freshly loaded."""
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is None:
            raise LogNotFound(f"no log at {self._prefix!r}")
        return loaded[0]

    async def scan(
        self, from_offset: int, limits: Limits = Limits(), *, manifest: Manifest | None = None
    ) -> list[FragmentPointer]:
        """Fragments covering ``from_offset`` onwards; raises LogPurged below the oldest offset."""
        m = manifest if manifest is not None else await self.manifest()
        if from_offset < m.oldest_offset:
            raise LogPurged(from_offset, m.oldest_offset)
        if from_offset >= m.next_offset:
            return []
        return await resolve_fragments(
            self._store, self._prefix, m.entries, from_offset, limits, self._cache
        )

    async def fetch(self, pointer: FragmentPointer) -> DecodedFragment:
        """Read one fragment and verify it against its pointer."""
        try:
            got = await self._store.get(join(self._prefix, pointer.path))
        except ObjectNotFound:
            raise CorruptFragment(f"fragment {pointer.path} is missing") from None
        # With the object's MD5 recorded, checking it proves every byte and saves hashing each
        # record; without it (a foreign log) the records' setsum is recomputed instead.
        by_md5 = pointer.content_md5 is not None
        if by_md5 and content_etag(got.data) != pointer.content_md5:
            raise CorruptFragment(f"fragment {pointer.path} does not match its recorded MD5")
        if len(got.data) < _DECODE_INLINE_BYTES:
            frag = decode_fragment(got.data, compute_setsum=not by_md5)
        else:
            frag = await asyncio.to_thread(decode_fragment, got.data, compute_setsum=not by_md5)
        if by_md5:
            frag = replace(frag, setsum=pointer.setsum)  # proven: the bytes are the ones hashed
        elif frag.setsum != pointer.setsum:
            raise CorruptFragment(f"fragment {pointer.path} does not match its setsum")
        if (frag.start, frag.limit) != (pointer.start, pointer.limit):
            raise CorruptFragment(f"fragment {pointer.path} does not cover its recorded range")
        return frag

    async def read(
        self, from_offset: int, limits: Limits = Limits(), *, manifest: Manifest | None = None
    ) -> list[LogRecord]:
        """Records from ``from_offset`` on, contiguous, verified, within ``limits``."""
        pointers = await self.scan(from_offset, limits, manifest=manifest)
        sem = asyncio.Semaphore(self._fetch_concurrency)

        async def one(p: FragmentPointer) -> DecodedFragment:
            async with sem:
                return await self.fetch(p)

        frags = await asyncio.gather(*(one(p) for p in pointers))
        out: list[LogRecord] = []
        nbytes = 0
        for frag in frags:
            for r in frag.records:
                if r.offset < from_offset:
                    continue
                if limits.max_records is not None and len(out) >= limits.max_records:
                    return out
                if limits.max_bytes is not None and out and nbytes + len(r.body) > limits.max_bytes:
                    return out
                out.append(r)
                nbytes += len(r.body)
        return out
