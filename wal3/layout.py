"""Loading a log's manifest (where its objects live is ``wal3.paths``)."""

from __future__ import annotations

from .errors import ObjectNotFound
from .manifest import Manifest, ManifestTail

# Re-exported: every key is spelled in wal3.paths, and older callers import them from here.
from .paths import CLOCK_PATH as CLOCK_PATH
from .paths import CURSOR_PREFIX as CURSOR_PREFIX
from .paths import GARBAGE_PATH as GARBAGE_PATH
from .paths import LOG_PREFIX as LOG_PREFIX
from .paths import MANIFEST_PATH, join
from .paths import OLDEST_PATH as OLDEST_PATH
from .store import ObjectStore


async def load_manifest(store: ObjectStore, prefix: str) -> tuple[Manifest, str] | None:
    """The log's manifest and its etag, or None when the log does not exist."""
    try:
        got = await store.get(join(prefix, MANIFEST_PATH))
    except ObjectNotFound:
        return None
    return Manifest.from_bytes(got.data), got.etag


async def load_manifest_tail(store: ObjectStore, prefix: str) -> ManifestTail | None:
    """Where the log's manifest ends (``Manifest.tail_from_bytes``: its last pointers alone are
    decoded), or None when the log does not exist."""
    try:
        got = await store.get(join(prefix, MANIFEST_PATH))
    except ObjectNotFound:
        return None
    return Manifest.tail_from_bytes(got.data)
