"""Shared setup for the GC-file reproductions."""
import asyncio, json, shutil, sys, tempfile
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from host.wal3 import LocalStore, LogWriter, LogWriterOptions, LogReader, Setsum
from host.wal3.cursors import CursorStore
from host.wal3.gc import GarbageCollector, GcOptions, Garbage, EMPTY_GARBAGE
from host.wal3.layout import GARBAGE_PATH, join, load_manifest
from host.wal3.manifest import MANIFEST_PATH, Manifest, Snapshot, SnapshotPointer, FragmentPointer
from host.wal3.store import put_resolving


class Clock:
    def __init__(self, now=2_000_000_000.0):
        self.now = now
    def __call__(self):
        return self.now


async def make_log(root, prefix, n=12, frag_threshold=4, snap_threshold=100):
    store = LocalStore(root)
    opts = LogWriterOptions(snapshot_fragment_threshold=frag_threshold,
                            snapshot_threshold=snap_threshold, writer_name="w")
    w = await LogWriter.open(store, prefix, opts)
    for i in range(n):
        await w.append(f"r{i+1}".encode())   # one record per fragment: offset i+1 holds "r{i+1}"
    await w.compact_manifest()
    await w.close()
    return store


async def manifest(store, prefix):
    return (await load_manifest(store, prefix))[0]


async def read_from(store, prefix, off):
    r = LogReader(store, prefix)
    return [(x.offset, x.body.decode()) for x in await r.read(off)]


async def put_garbage(store, prefix, data: bytes):
    key = join(prefix, GARBAGE_PATH)
    try:
        got = await store.get(key)
        await store.put(key, data, if_match=got.etag)
    except Exception:
        await store.put(key, data, if_none_match="*")


def tmp():
    return tempfile.mkdtemp(prefix="adv4-")
