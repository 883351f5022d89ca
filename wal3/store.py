"""The object-store interface every wal3 component talks to.

Keys are relative to the store's root (a directory, or ``bucket/prefix``).  Conditional puts are
the only synchronisation primitive wal3 relies on: ``if_none_match="*"`` creates, ``if_match=etag``
replaces; a failed condition always raises :class:`PreconditionFailed`, whatever the backend said.
"""

from __future__ import annotations

import abc
import hashlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Literal

from .errors import ObjectNotFound, PreconditionFailed, StoreUnavailable


@dataclass(frozen=True, slots=True)
class ObjectMeta:
    """What a head or a list entry tells about an object."""

    key: str
    etag: str
    size: int
    last_modified: float  # seconds since the epoch


@dataclass(frozen=True, slots=True)
class GetResult:
    """An object's bytes and the etag they were read at."""

    data: bytes
    etag: str


def content_etag(data: bytes) -> str:
    """The content-derived etag (hex MD5, as S3 gives for single-part uploads)."""
    return hashlib.md5(data, usedforsecurity=False).hexdigest()


def check_condition(if_none_match: str | None, if_match: str | None) -> None:
    """Reject a put condition no store supports (a programming error, not a store failure)."""
    if if_none_match is not None and if_none_match != "*":
        raise ValueError("if_none_match only supports '*'")
    if if_none_match is not None and if_match is not None:
        raise ValueError("give at most one condition")


def etag_matches_content(etag: str, data: bytes) -> bool:
    """Whether an etag names exactly these bytes."""
    return etag.strip('"') == content_etag(data)


class ObjectStore(abc.ABC):
    """Async object storage with conditional writes."""

    @abc.abstractmethod
    async def get(self, key: str) -> GetResult:
        """Read a whole object; raises :class:`ObjectNotFound`."""

    @abc.abstractmethod
    async def head(self, key: str) -> ObjectMeta:
        """Metadata of an object; raises :class:`ObjectNotFound`."""

    @abc.abstractmethod
    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        """Write an object, optionally conditionally, and return its new etag."""

    @abc.abstractmethod
    async def delete(self, key: str) -> None:
        """Delete an object; deleting a missing key is not an error."""

    @abc.abstractmethod
    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectMeta]:
        """Every object whose key starts with ``prefix``, in key order, fetched page by page."""

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        """Copy an object; backends that can copy server-side override this."""
        got = await self.get(src)
        return await self.put(dst, got.data, if_none_match=if_none_match)

    @abc.abstractmethod
    def url_for(self, key: str) -> str:
        """A ``file://`` or ``s3://`` URL a bulk reader can open directly."""

    async def close(self) -> None:  # noqa: B027 - a default, not abstract: a store may hold nothing
        """Release connections and pools."""


class ResolvedPreconditionFailed(PreconditionFailed):
    """A condition ``put_resolving`` found failed only after an ambiguous attempt: the key no
    longer holds our bytes, but one of our attempts may have landed before someone replaced it."""


async def put_resolving(
    store: ObjectStore,
    key: str,
    data: bytes,
    *,
    if_none_match: Literal["*"] | None = None,
    if_match: str | None = None,
    attempts: int = 4,
) -> str:
    """A conditional put that settles ambiguous outcomes by reading the key back.

    When a put fails without telling whether it landed (a lost response, a 5xx), retrying it with
    the same condition would turn our own success into a precondition failure.  Instead the key is
    re-read: if it holds exactly our bytes the put succeeded; if the condition still holds the put
    is retried; otherwise the condition failed for real.
    """
    last: StoreUnavailable | None = None
    for _ in range(attempts):
        try:
            return await store.put(key, data, if_none_match=if_none_match, if_match=if_match)
        except PreconditionFailed:
            # Our own earlier attempt may be what broke the condition.
            if last is None:
                raise
            try:
                meta = await store.head(key)
            except ObjectNotFound:
                raise ResolvedPreconditionFailed(key, "object vanished") from None
            if etag_matches_content(meta.etag, data):
                return meta.etag
            raise ResolvedPreconditionFailed(key, "replaced after an ambiguous put") from last
        except StoreUnavailable as e:
            last = e
            try:
                meta = await store.head(key)
            except ObjectNotFound:
                if if_match is not None:
                    raise ResolvedPreconditionFailed(
                        key, "object missing after ambiguous put"
                    ) from e
                continue
            except StoreUnavailable:
                continue
            if etag_matches_content(meta.etag, data):
                return meta.etag
            if if_none_match is not None:
                raise ResolvedPreconditionFailed(key, "another object exists") from e
            # S3 quotes its etags and callers may pass either form: compare them bare.
            if if_match is not None and meta.etag.strip('"') != if_match.strip('"'):
                raise ResolvedPreconditionFailed(key, "etag moved") from e
    assert last is not None
    raise last


async def ensure_object(store: ObjectStore, key: str, data: bytes, *, attempts: int = 8) -> None:
    """Make sure a content-addressed object exists (snapshots), whoever wrote it.

    A failed create-only put is not proof of existence: S3 answers 409 when another request is
    writing the same key at that moment, and that write may fail.  So look before trusting it.
    """
    for _ in range(attempts):
        try:
            await put_resolving(store, key, data, if_none_match="*")
            return
        except PreconditionFailed:
            try:
                await store.head(key)
                return
            except ObjectNotFound:
                continue  # the conflicting write did not land: try again
    raise StoreUnavailable(f"could not create {key}: the store kept refusing")


async def ensure_copy(store: ObjectStore, src: str, dst: str, *, attempts: int = 8) -> None:
    """Copy an immutable object unless ``dst`` already holds it (e.g. a retried fork)."""
    for _ in range(attempts):
        try:
            await store.copy(src, dst, if_none_match="*")
            return
        except PreconditionFailed:
            try:
                await store.head(dst)
                return
            except ObjectNotFound:
                continue
    raise StoreUnavailable(f"could not copy {src} to {dst}: the store kept refusing")
