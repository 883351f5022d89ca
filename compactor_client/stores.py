"""Opening the object store from a URL, the same URL forms the log host takes."""

from __future__ import annotations

from wal3.store import ObjectStore
from wal3.storeurl import open_store


async def open_object_store(url: str) -> ObjectStore:
    """The store at ``url``: a path or ``file:///dir`` (a local directory), or ``s3://b/prefix``."""
    return open_store(url)
