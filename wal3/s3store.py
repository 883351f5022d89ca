"""``S3Store``: wal3's object store on S3 (or anything that speaks S3 conditional writes).

One long-lived aiobotocore client per store, with botocore's own retries switched off so that this
class alone decides what may be retried: every idempotent request is retried with full-jitter
exponential backoff on throttling, 5xx and connection failures, but a conditional put is never
retried blindly after an ambiguous failure.  A conditional put that may have landed is settled by
reading the key back, the same decision :func:`wal3.store.put_resolving` makes: our exact bytes
there means it succeeded, the condition still holding means it is safe to try again, anything else
means the condition failed.

Etags are kept exactly as S3 returns them (quoted hex MD5 for single-part objects) from get, head,
put, list and copy alike, so any of them can be handed back as ``if_match``.
"""

from __future__ import annotations

import asyncio
import base64
import builtins
import contextlib
import hashlib
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Literal, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from .errors import ObjectNotFound, PreconditionFailed, StoreError, StoreUnavailable
from .store import (
    GetResult,
    ObjectMeta,
    ObjectStore,
    check_condition,
    etag_matches_content,
)

T = TypeVar("T")

# S3 and S3-compatibles spell "slow down" several ways; all of them mean the request was refused
# before it did anything, so even a conditional put may simply be sent again.
_THROTTLE_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequests",
        "TooManyRequestsException",
        "BandwidthLimitExceeded",
        "ProvisionedThroughputExceededException",
    }
)
# Transient server-side failures that do not say whether the request was applied.
_TRANSIENT_CODES = frozenset(
    {
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
    }
)
# Transport failures: the request may or may not have reached the store.
_TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (
    HTTPClientError,  # ConnectionClosedError, ReadTimeoutError, ResponseStreamingError, ...
    BotoConnectionError,  # EndpointConnectionError, ConnectTimeoutError, ...
    aiohttp.ClientError,  # a body stream that breaks while we read it
    asyncio.TimeoutError,
    ConnectionError,
)

_Retry = Literal["throttle", "transient"]


# aiobotocore ships no type information (pyproject ignores its imports): its classes are Any.
class _NoResendHTTPSession(AIOHTTPSession):  # type: ignore[misc]
    """aiobotocore's aiohttp session with aiohttp's silent resend switched off.

    aiohttp re-sends an "idempotent" request (PUT included) once when the server drops the
    connection.  For a conditional put whose response was lost, that resend fails its condition
    against our own write and turns success into PreconditionFailed, so S3Store must see the
    dropped connection and settle it itself.
    """

    async def _get_session(self, proxy_url: Any) -> Any:
        session = await super()._get_session(proxy_url)
        # Private aiohttp knob (no public one exists); the drop tests catch it if it ever moves.
        session._retry_connection = False
        return session


_session: Any = None


def _shared_session() -> Any:
    """One aioboto3 session per process: a fresh session re-parses the S3 service model (~0.3 s),
    a shared one hands out clients in ~0.05 s, which matters with a store per tenant."""
    global _session
    if _session is None:
        import aioboto3  # deferred: importing it costs ~0.5 s and LocalStore users never need it

        _session = aioboto3.Session()
    return _session


def _error_code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def _status(e: ClientError) -> int:
    return int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def _retry_kind(e: BaseException) -> _Retry | None:
    """Whether a failure is worth retrying: "throttle" (certainly not applied), "transient"
    (maybe applied) or None (a definite answer)."""
    if isinstance(e, ClientError):
        code, status = _error_code(e), _status(e)
        if code in _THROTTLE_CODES or status == 429:
            return "throttle"
        if code in _TRANSIENT_CODES or status >= 500:
            return "transient"
        return None
    if isinstance(e, _TRANSPORT_ERRORS):
        return "transient"
    return None


def _is_condition_failure(e: ClientError, *, if_match: bool) -> bool:
    code, status = _error_code(e), _status(e)
    if status == 412 or code == "PreconditionFailed":
        return True
    # A conditional write racing another one on the same key.
    if status == 409 or code == "ConditionalRequestConflict":
        return True
    # S3 answers If-Match on a missing key with 404; for wal3 that is a failed condition.
    return if_match and _is_not_found(e)


def _is_not_found(e: ClientError) -> bool:
    """A missing key (a missing bucket is a configuration error, not a missing object)."""
    code = _error_code(e)
    return code != "NoSuchBucket" and (_status(e) == 404 or code in ("NoSuchKey", "NotFound"))


def _quoted(etag: str) -> str:
    # HTTP wants entity tags quoted; accept either form from callers.
    return '"' + etag.strip('"') + '"'


def _same_etag(a: str, b: str) -> bool:
    return a.strip('"') == b.strip('"')


class S3Store(ObjectStore):
    """A bucket (and optional key prefix) used as a wal3 object store."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        endpoint_url: str | None = None,
        region: str | None = None,
        max_pool_connections: int = 64,
        max_attempts: int = 6,
        base_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        list_page_size: int = 1000,
        connect_timeout_s: float = 10.0,
        read_timeout_s: float = 60.0,
        server_side_conditional_copy: bool = False,
    ) -> None:
        if not bucket:
            raise ValueError("bucket must not be empty")
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 1 <= list_page_size <= 1000:
            raise ValueError("list_page_size must be between 1 and 1000")
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.endpoint_url = endpoint_url or os.environ.get("AWS_ENDPOINT_URL") or None
        self.region = region
        self.max_attempts = max_attempts
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s
        self.list_page_size = list_page_size
        # CopyObject honours If-None-Match on AWS, but some S3-compatible servers (moto among them)
        # silently ignore it and overwrite.  A silent overwrite would break wal3's create-only
        # invariant, so conditional copies go through get + conditional put unless the caller
        # knows the backend enforces the condition server-side.
        self.server_side_conditional_copy = server_side_conditional_copy
        self._config = AioConfig(
            http_session_cls=_NoResendHTTPSession,
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            # This class owns retries; botocore retrying underneath would retry conditional puts
            # blindly and multiply the attempt budget.
            retries={"total_max_attempts": 1, "mode": "standard"},
            # Custom endpoints (moto, MinIO, ...) rarely have wildcard DNS for virtual hosts.
            s3={"addressing_style": "path" if self.endpoint_url else "auto"},
            # Plain bodies with a Content-MD5 (set below) work on every S3-compatible server;
            # streaming trailer checksums do not.
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        self._lock = asyncio.Lock()
        self._stack: contextlib.AsyncExitStack | None = None
        self._client: Any = None
        self._rng = random.Random()

    def __repr__(self) -> str:
        where = f" at {self.endpoint_url}" if self.endpoint_url else ""
        return f"S3Store({self.url_for('')!r}{where})"

    # ----------------------------------------------------------------------------- plumbing

    def _full(self, key: str) -> str:
        if not key or key.startswith("/"):
            raise ValueError(f"invalid key {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    def _full_prefix(self, prefix: str) -> str:
        return f"{self.prefix}/{prefix}" if self.prefix else prefix

    def _relative(self, full_key: str) -> str:
        return full_key[len(self.prefix) + 1 :] if self.prefix else full_key

    async def _s3(self) -> Any:
        """The shared client, created on first use."""
        if self._client is not None:
            return self._client
        async with self._lock:
            if self._client is None:
                stack = contextlib.AsyncExitStack()
                self._client = await stack.enter_async_context(
                    _shared_session().client(
                        "s3",
                        endpoint_url=self.endpoint_url,
                        region_name=self.region,
                        config=self._config,
                    )
                )
                self._stack = stack
        return self._client

    async def close(self) -> None:
        """Close the client and its connection pool; the store reconnects if used again."""
        async with self._lock:
            stack, self._stack, self._client = self._stack, None, None
            if stack is not None:
                await stack.aclose()

    async def _backoff(self, attempt: int) -> None:
        # Full jitter: spreads retries of many writers that were throttled together.
        cap = min(self.max_backoff_s, self.base_backoff_s * (2**attempt))
        await asyncio.sleep(self._rng.uniform(0.0, cap))

    async def _retrying(self, what: str, call: Callable[[Any], Awaitable[T]]) -> T:
        """Run an idempotent request, retrying transient failures; definite answers propagate."""
        last: BaseException | None = None
        for attempt in range(self.max_attempts):
            if attempt:
                await self._backoff(attempt - 1)
            try:
                return await call(await self._s3())
            except (ClientError, *_TRANSPORT_ERRORS) as e:
                if _retry_kind(e) is None:
                    raise
                last = e
        raise StoreUnavailable(
            f"{what}: gave up after {self.max_attempts} attempts: {last}"
        ) from last

    def _unexpected(self, what: str, e: BotoCoreError | ClientError) -> StoreError:
        return StoreError(f"{what}: {e}")

    # ---------------------------------------------------------------------------------- reads

    async def get(self, key: str) -> GetResult:
        """Read a whole object; raises ObjectNotFound."""
        full = self._full(key)

        async def call(s3: Any) -> GetResult:
            resp = await s3.get_object(Bucket=self.bucket, Key=full)
            # Reading the body is inside the retried call: a stream cut halfway is transient.
            async with resp["Body"] as body:
                data = await body.read()
            return GetResult(data=data, etag=resp["ETag"])

        try:
            return await self._retrying(f"get {key}", call)
        except ClientError as e:
            if _is_not_found(e):
                raise ObjectNotFound(key) from None
            raise self._unexpected(f"get {key}", e) from e

    async def head(self, key: str) -> ObjectMeta:
        """Metadata of an object; raises ObjectNotFound."""
        full = self._full(key)

        async def call(s3: Any) -> Any:
            return await s3.head_object(Bucket=self.bucket, Key=full)

        try:
            resp = await self._retrying(f"head {key}", call)
        except ClientError as e:
            if _is_not_found(e):
                raise ObjectNotFound(key) from None
            raise self._unexpected(f"head {key}", e) from e
        return ObjectMeta(
            key=key,
            etag=resp["ETag"],
            size=int(resp["ContentLength"]),
            last_modified=resp["LastModified"].timestamp(),
        )

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        """Every object whose key starts with ``prefix``, in key order, one page per request."""
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Prefix": self._full_prefix(prefix),
            "MaxKeys": self.list_page_size,
        }
        if start_after is not None:
            params["StartAfter"] = self._full_prefix(start_after)
        while True:
            page_params = dict(params)

            async def call(s3: Any, page_params: dict[str, Any] = page_params) -> Any:
                return await s3.list_objects_v2(**page_params)

            try:
                page = await self._retrying(f"list {prefix}", call)
            except ClientError as e:
                raise self._unexpected(f"list {prefix}", e) from e
            for obj in page.get("Contents", ()):
                yield ObjectMeta(
                    key=self._relative(obj["Key"]),
                    etag=obj["ETag"],
                    size=int(obj["Size"]),
                    last_modified=obj["LastModified"].timestamp(),
                )
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated") or not token:
                return
            params.pop("StartAfter", None)  # the token already encodes where to resume
            params["ContinuationToken"] = token

    # --------------------------------------------------------------------------------- writes

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        """Write an object, optionally conditionally; returns the new etag."""
        check_condition(if_none_match, if_match)
        full = self._full(key)
        data = bytes(data)
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": full,
            "Body": data,
            # Lets the server reject a body corrupted on the way.
            "ContentMD5": base64.b64encode(
                hashlib.md5(data, usedforsecurity=False).digest()
            ).decode(),
        }
        if if_none_match is not None:
            params["IfNoneMatch"] = "*"
        if if_match is not None:
            params["IfMatch"] = _quoted(if_match)

        async def call(s3: Any) -> str:
            resp = await s3.put_object(**params)
            return str(resp["ETag"])

        if if_none_match is None and if_match is None:
            try:
                return await self._retrying(f"put {key}", call)
            except ClientError as e:
                raise self._unexpected(f"put {key}", e) from e
        try:
            return await self._conditional(
                f"put {key}",
                key,
                call,
                lambda etag: etag_matches_content(etag, data),
                if_none_match=if_none_match,
                if_match=if_match,
            )
        except ClientError as e:
            raise self._unexpected(f"put {key}", e) from e

    async def _conditional(
        self,
        what: str,
        key: str,
        call: Callable[[Any], Awaitable[str]],
        is_ours: Callable[[str], bool],
        *,
        if_none_match: str | None,
        if_match: str | None,
    ) -> str:
        """Run a conditional write, settling every ambiguous failure by reading the key back."""
        last: BaseException | None = None
        maybe_landed = False
        for attempt in range(self.max_attempts):
            if attempt:
                await self._backoff(attempt - 1)
            try:
                return await call(await self._s3())
            except ClientError as e:
                if _is_condition_failure(e, if_match=if_match is not None):
                    if maybe_landed:
                        # An earlier attempt that looked lost may be what broke the condition.
                        with contextlib.suppress(ObjectNotFound):
                            meta = await self.head(key)
                            if is_ours(meta.etag):
                                return meta.etag
                    raise PreconditionFailed(key, _error_code(e) or str(_status(e))) from None
                kind = _retry_kind(e)
                if kind is None:
                    raise  # a definite answer; the caller maps it
                last = e
            except _TRANSPORT_ERRORS as e:
                kind = "transient"
                last = e
            if kind == "throttle":
                continue  # refused before it did anything: sending it again is safe
            maybe_landed = True
            etag = await self._settle(key, is_ours, if_none_match=if_none_match, if_match=if_match)
            if etag is not None:
                return etag
        raise StoreUnavailable(
            f"{what}: gave up after {self.max_attempts} attempts: {last}"
        ) from last

    async def _settle(
        self,
        key: str,
        is_ours: Callable[[str], bool],
        *,
        if_none_match: str | None,
        if_match: str | None,
    ) -> str | None:
        """After an ambiguous conditional write: our etag if it landed, None if the condition
        still holds (retry), PreconditionFailed if it no longer does.  A head that itself keeps
        failing raises StoreUnavailable: we must not guess."""
        try:
            meta = await self.head(key)
        except ObjectNotFound:
            if if_match is not None:
                raise PreconditionFailed(key, "object missing after an ambiguous write") from None
            return None
        if is_ours(meta.etag):
            return meta.etag
        if if_none_match is not None:
            raise PreconditionFailed(key, "another object exists")
        if if_match is not None and not _same_etag(meta.etag, if_match):
            raise PreconditionFailed(key, "etag moved")
        return None

    async def delete(self, key: str) -> None:
        """Delete an object; a missing key is not an error."""
        full = self._full(key)

        async def call(s3: Any) -> None:
            await s3.delete_object(Bucket=self.bucket, Key=full)

        try:
            await self._retrying(f"delete {key}", call)
        except ClientError as e:
            if _is_not_found(e):
                return
            raise self._unexpected(f"delete {key}", e) from e

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        """Copy an object server-side (CopyObject); raises ObjectNotFound if ``src`` is missing."""
        if if_none_match is not None and if_none_match != "*":
            raise ValueError("if_none_match only supports '*'")
        if if_none_match is not None and not self.server_side_conditional_copy:
            # get + create-only put: correct on every backend, and the put settles ambiguity.
            return await super().copy(src, dst, if_none_match=if_none_match)
        params: dict[str, Any] = {
            "Bucket": self.bucket,
            "Key": self._full(dst),
            "CopySource": {"Bucket": self.bucket, "Key": self._full(src)},
        }
        if if_none_match is not None:
            params["IfNoneMatch"] = "*"

        async def call(s3: Any) -> str:
            resp = await s3.copy_object(**params)
            return str(resp["CopyObjectResult"]["ETag"])

        try:
            if if_none_match is None:
                return await self._retrying(f"copy {src} -> {dst}", call)
            # Single-part copies keep the source's MD5 etag, which identifies "our" bytes.
            src_etag = (await self.head(src)).etag
            return await self._conditional(
                f"copy {src} -> {dst}",
                dst,
                call,
                lambda etag: _same_etag(etag, src_etag),
                if_none_match=if_none_match,
                if_match=None,
            )
        except ClientError as e:
            if _is_not_found(e):
                raise ObjectNotFound(src) from None
            raise self._unexpected(f"copy {src} -> {dst}", e) from e

    def url_for(self, key: str) -> str:
        """The ``s3://bucket/prefix/key`` URL of an object."""
        parts: builtins.list[str] = [p for p in (self.prefix, key) if p]
        return f"s3://{self.bucket}/" + "/".join(parts)
