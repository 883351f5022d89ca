"""Loading a log's manifest (where its objects live is ``wal3.paths``)."""

from __future__ import annotations

from .errors import ObjectNotFound
from .manifest import Manifest
from .paths import (  # re-exported for older callers; every key is spelled in wal3.paths
    CLOCK_PATH,  # noqa: F401 - re-exported
    CURSOR_PREFIX,  # noqa: F401 - re-exported
    GARBAGE_PATH,  # noqa: F401 - re-exported
    LOG_PREFIX,  # noqa: F401 - re-exported
    MANIFEST_PATH,
    OLDEST_PATH,  # noqa: F401 - re-exported
    join,
)
from .store import ObjectStore


async def load_manifest(store: ObjectStore, prefix: str) -> tuple[Manifest, str] | None:
    """The log's manifest and its etag, or None when the log does not exist."""
    try:
        got = await store.get(join(prefix, MANIFEST_PATH))
    except ObjectNotFound:
        return None
    return Manifest.from_bytes(got.data), got.etag
