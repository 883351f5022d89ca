"""Open an object store from a URL: a path or ``file:///dir`` for LocalStore, ``s3://bucket/prefix``
for S3Store."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote, urlsplit

from .store import ObjectStore

_USAGE = "use a directory path, file:///dir or s3://bucket/prefix"


@dataclass(frozen=True, slots=True)
class StoreURL:
    """A parsed store URL: ``scheme`` is "file" or "s3"; ``location`` is the directory (file) or
    the bucket (s3); ``prefix`` is the key prefix inside the bucket ("" for file)."""

    scheme: str
    location: str
    prefix: str = ""


def store_url_parts(url: str) -> StoreURL:
    """Parse a store URL without opening anything; raises ValueError on anything unsupported."""
    if not url:
        raise ValueError(f"empty store URL: {_USAGE}")
    if "://" not in url:
        # A bare path (relative or absolute).  "c:" style drive letters are not a concern on the
        # platforms wal3 runs on, but a stray "scheme:" without slashes is most likely a typo.
        head = url.split("/", 1)[0]
        if head.endswith(":") and len(head) > 1:
            raise ValueError(f"unsupported store URL {url!r}: {_USAGE}")
        return StoreURL("file", url)
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file URL {url!r} names a remote host: {_USAGE}")
        path = unquote(parts.path)
        if not path:
            raise ValueError(f"file URL {url!r} has no path: {_USAGE}")
        return StoreURL("file", path)
    if scheme == "s3":
        if not parts.netloc:
            raise ValueError(f"s3 URL {url!r} has no bucket: {_USAGE}")
        if parts.query or parts.fragment:
            raise ValueError(f"s3 URL {url!r} must not carry a query or fragment")
        return StoreURL("s3", parts.netloc, unquote(parts.path).strip("/"))
    raise ValueError(f"unsupported store URL scheme {parts.scheme!r} in {url!r}: {_USAGE}")


def open_store(
    url: str,
    *,
    endpoint_url: str | None = None,
    region: str | None = None,
    **kw: Any,
) -> ObjectStore:
    """Open the store a URL names; extra keyword arguments go to the store's constructor."""
    parts = store_url_parts(url)
    if parts.scheme == "file":
        if endpoint_url is not None or region is not None:
            raise ValueError("endpoint_url and region only apply to s3:// stores")
        from .localstore import LocalStore

        return LocalStore(parts.location, **kw)
    from .s3store import S3Store

    return S3Store(
        parts.location,
        parts.prefix,
        endpoint_url=endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None,
        region=region
        or os.environ.get("AWS_REGION")
        or os.environ.get("AWS_DEFAULT_REGION")
        or None,
        **kw,
    )
