"""Opening the object store from a URL, the same URL forms the log host takes."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING
from urllib.parse import urlsplit
from urllib.request import url2pathname

if TYPE_CHECKING:
    from host.wal3.store import ObjectStore


async def open_object_store(url: str) -> ObjectStore:
    """The store at ``url``: a path or ``file:///dir`` (a local directory), or ``s3://b/prefix``."""
    try:
        from host.wal3.storeurl import open_store
    except ModuleNotFoundError as e:
        # Only tolerate the module itself being absent (it is being written); a broken import
        # inside it must surface.
        if e.name not in ("host.wal3.storeurl", "host.wal3", "host"):
            raise
    else:
        store = open_store(url)
        if inspect.isawaitable(store):
            store = await store
        return store  # type: ignore[no-any-return]
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        from host.wal3.localstore import LocalStore

        return LocalStore(url2pathname(parts.path) if parts.scheme == "file" else url)
    raise ValueError(f"store URL {url!r} needs host.wal3.storeurl, which is not available")
