"""Object-store metrics: an ``ObjectStore`` that wraps the host's store and counts what it does.

The engine (``wal3``) knows nothing of Prometheus nor of the host; the host wraps the store it
opens (``host.server.Server``) in :class:`InstrumentedStore`, and every engine component it
builds talks to the wrapper.  Per operation (``get``, ``head``, ``put``, ``delete``, ``list``,
``copy``):

* ``loghost_store_requests_total{operation}``: calls made;
* ``loghost_store_errors_total{operation, kind}``: calls that raised, by :func:`error_kind`;
* ``loghost_store_request_duration_seconds{operation}``: how long each took.  A ``list`` is one
  request however many pages it fetches; its time is the time spent waiting for its entries, not
  the time its caller spent between them.

One request is one call of the engine: an S3 store's own retries are inside it.  The wrapper
adds no suspension point of its own (it awaits exactly what the wrapped store awaits), so it
does not change how tasks interleave.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Literal

from wal3 import ObjectStore
from wal3.errors import ObjectNotFound, PreconditionFailed, StoreError, StoreUnavailable
from wal3.store import GetResult, ObjectMeta

from .metrics import Metrics

OPERATIONS = ("get", "head", "put", "delete", "list", "copy")


def error_kind(exc: BaseException) -> str:
    """The ``kind`` label of a failed store call.

    ``not_found`` (a missing key, often the expected answer of a head) and
    ``precondition_failed`` (a conditional put that lost, the engine's synchronisation) are
    answers; ``unavailable`` (a transient failure past the store's retries), ``store_error`` (any
    other store failure, e.g. access denied) and ``error`` (anything else raised) are failures.
    """
    if isinstance(exc, ObjectNotFound):
        return "not_found"
    if isinstance(exc, PreconditionFailed):
        return "precondition_failed"
    if isinstance(exc, StoreUnavailable):
        return "unavailable"
    if isinstance(exc, StoreError):
        return "store_error"
    return "error"


class InstrumentedStore(ObjectStore):
    """``inner`` with a request count, an error count and a latency histogram per operation."""

    def __init__(self, inner: ObjectStore, metrics: Metrics) -> None:
        self.inner = inner
        self._requests = {op: metrics.store_requests.labels(op) for op in OPERATIONS}
        self._latency = {op: metrics.store_latency.labels(op) for op in OPERATIONS}
        self._errors = metrics.store_errors

    def __repr__(self) -> str:
        # What the host logs as its store: the wrapped store's URL-like name.
        return repr(self.inner)

    def _done(self, op: str, started: float, exc: BaseException | None = None) -> None:
        self._requests[op].inc()
        self._latency[op].observe(time.monotonic() - started)
        if exc is not None:
            self._errors.labels(op, error_kind(exc)).inc()

    @contextlib.contextmanager
    def _timed(self, op: str) -> Iterator[None]:
        """One call of ``op``: counted, timed, and its failure classified (synchronous: the
        wrapper adds no suspension point)."""
        started = time.monotonic()
        try:
            yield
        except Exception as e:
            self._done(op, started, e)
            raise
        self._done(op, started)

    async def get(self, key: str) -> GetResult:
        with self._timed("get"):
            return await self.inner.get(key)

    async def head(self, key: str) -> ObjectMeta:
        with self._timed("head"):
            return await self.inner.head(key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        with self._timed("put"):
            return await self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match)

    async def delete(self, key: str) -> None:
        with self._timed("delete"):
            await self.inner.delete(key)

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        with self._timed("copy"):
            return await self.inner.copy(src, dst, if_none_match=if_none_match)

    def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[ObjectMeta]:
        return self._list(prefix, start_after)

    async def _list(self, prefix: str, start_after: str | None) -> AsyncIterator[ObjectMeta]:
        entries = self.inner.list(prefix, start_after=start_after).__aiter__()
        waited = 0.0
        failure: BaseException | None = None
        try:
            while True:
                started = time.monotonic()
                try:
                    meta = await entries.__anext__()
                except StopAsyncIteration:
                    waited += time.monotonic() - started
                    break
                except Exception as e:
                    waited += time.monotonic() - started
                    failure = e
                    raise
                waited += time.monotonic() - started
                yield meta
        finally:
            # Also when the caller stops early: one request, the time it waited for entries.
            self._done("list", time.monotonic() - waited, failure)
            close = getattr(entries, "aclose", None)
            if close is not None:
                await close()

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    async def close(self) -> None:
        await self.inner.close()
