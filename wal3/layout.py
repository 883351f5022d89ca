"""Where a log's objects live, and loading its manifest."""

from __future__ import annotations

from .errors import ObjectNotFound
from .manifest import MANIFEST_PATH, Manifest
from .store import ObjectStore

CURSOR_PREFIX = "cursor/"
GARBAGE_PATH = "gc/GARBAGE"
# The collector's store-clock objects (ours; Rust's collector reads only gc/GARBAGE):
# CLOCK_PATH is rewritten to read the store's "now" (its Last-Modified), never a local clock;
# OLDEST_PATH records an oldest offset the collector saw, dated by its own Last-Modified.
CLOCK_PATH = "gc/CLOCK"
OLDEST_PATH = "gc/OLDEST"
LOG_PREFIX = "log/"


def join(prefix: str, path: str) -> str:
    """The store key of ``path`` inside the log rooted at ``prefix``."""
    prefix = prefix.strip("/")
    return f"{prefix}/{path}" if prefix else path


async def load_manifest(store: ObjectStore, prefix: str) -> tuple[Manifest, str] | None:
    """The log's manifest and its etag, or None when the log does not exist."""
    try:
        got = await store.get(join(prefix, MANIFEST_PATH))
    except ObjectNotFound:
        return None
    return Manifest.from_bytes(got.data), got.etag
