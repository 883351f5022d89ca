"""``LogHostClient``: an async client for the log host REST API.

Retry policy (why each request may or may not be re-sent):

* A 307/308 with a ``Location`` (``not_leader``) is followed for every method, at most
  ``max_redirects`` hops: the follower did not apply the request, it only named the leader.
  With ``redirect_hosts`` only to those hosts (and the client's own): a ``Location`` comes from
  the leader hint in Redis, and the API key must not be sent wherever it points.
* A 429 (``backpressure``) is a definite rejection by contract, so it is retried for every method,
  waiting what ``Retry-After`` says (or an exponential backoff without one), at most
  ``max_retries`` times.  A ``Retry-After`` longer than ``max_retry_after_s`` is not waited out:
  the error is raised so the caller can decide.
* A connection that could not be opened (connect error/timeout, pool timeout) never reached the
  server, so it is retried for every method.
* Every retry starts again at the URL the caller named, never at a host a redirect pointed to:
  a leader that stopped answering is most likely dead, and only the hosts behind the caller's
  address know who leads now (retrying the dead leader's URL failed every retry).
* 502/503/504 and transport failures after the request was sent (read timeout, reset) are
  *ambiguous*: the server may have applied the request.  They are retried only for requests that
  are safe to repeat: reads, deletes, forward-only moves (``compact``), seal, gc, the dirty-set
  calls, and appends that carry an ``idempotency_key`` (the host de-duplicates by key).  An append
  without a key, a cursor compare-and-swap, and a fork raise instead, because repeating them could
  duplicate records, report a spurious ``cursor_conflict`` against our own earlier write, or fork
  twice.  Callers that want automatic retries of appends should pass an idempotency key.
"""

from __future__ import annotations

import asyncio
import email.utils
import json
import random
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any
from urllib.parse import quote, urljoin, urlsplit

import httpx

from .errors import (
    Backpressure,
    LogHostError,
    LogHostUnavailable,
    NotLeader,
    error_class,
)
from .models import (
    AppendResult,
    CompactionResult,
    Cursor,
    DirtyResult,
    FragmentInfo,
    JsonObject,
    LogState,
    ReadResult,
    Record,
)

SleepFn = Callable[[float], Awaitable[None]]

# Only the method-preserving redirects: a 301/302/303 would turn a POST into a GET.
_REDIRECTS = frozenset({307, 308})
_AMBIGUOUS_STATUSES = frozenset({502, 503, 504})
# Failures raised before any byte of the request reached a server: always safe to re-send.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)


def _seg(value: str) -> str:
    """One URL path segment, escaped so ids with '/' or spaces stay one segment."""
    return quote(value, safe="")


def parse_retry_after(value: str | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or HTTP-date), or None."""
    if value is None:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def _error_parts(resp: httpx.Response) -> tuple[str | None, str]:
    """The ``code`` and ``message`` of an error answer, tolerating non-JSON bodies."""
    try:
        body = resp.json()
    except (json.JSONDecodeError, UnicodeDecodeError, ValueError):
        return None, (resp.text[:500] or resp.reason_phrase)
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return (str(err["code"]) if "code" in err else None), str(err.get("message", ""))
    if isinstance(body, dict) and "detail" in body:  # FastAPI's default error shape
        return None, str(body["detail"])
    return None, str(body)[:500]


def _origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) of a URL, with the scheme's default port made explicit."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    port = parts.port or {"http": 80, "https": 443}.get(scheme)
    return scheme, (parts.hostname or "").lower(), port


class LogHostClient:
    """Async client of one log host (it follows ``not_leader`` redirects to others)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        timeout: float = 30.0,
        max_retries: int = 5,
        max_redirects: int = 3,
        max_retry_after_s: float = 60.0,
        backoff_base_s: float = 0.1,
        backoff_max_s: float = 5.0,
        redirect_hosts: Sequence[str] | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
        sleep: SleepFn = asyncio.sleep,
        rng: random.Random | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        # None: follow redirects anywhere (an application behind a load balancer); else only
        # to these origins and our own (the compactor passes every configured host).
        self._redirect_origins: frozenset[tuple[str, str, int | None]] | None = None
        if redirect_hosts is not None:
            self._redirect_origins = frozenset(_origin(u) for u in (self.base_url, *redirect_hosts))
        self.timeout = timeout
        self.max_retries = max_retries
        self.max_redirects = max_redirects
        self.max_retry_after_s = max_retry_after_s
        self._backoff_base_s = backoff_base_s
        self._backoff_max_s = backoff_max_s
        self._sleep = sleep  # injectable so tests observe waits without waiting
        self._rng = rng or random.Random()
        headers = {"Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self._http = httpx.AsyncClient(
            headers=headers, timeout=timeout, transport=transport, follow_redirects=False
        )

    def __repr__(self) -> str:
        return f"LogHostClient({self.base_url!r})"

    async def __aenter__(self) -> LogHostClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._http.aclose()

    # ------------------------------------------------------------------------------ transport

    def _backoff(self, attempt: int) -> float:
        """Exponential backoff with jitter, so many clients do not retry in lockstep."""
        ceiling = min(self._backoff_max_s, self._backoff_base_s * (2 ** max(0, attempt - 1)))
        return ceiling * (0.5 + 0.5 * self._rng.random())

    async def _request(
        self,
        method: str,
        path: str,
        *,
        idempotent: bool,
        params: Mapping[str, Any] | None = None,
        body: Any = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-request httpx timeout, not a deadline
        max_retries: int | None = None,
    ) -> Any:
        """Send one logical request with the retry/redirect policy of the module docstring
        (``max_retries``: this request's, else the client's)."""
        limit = self.max_retries if max_retries is None else max_retries
        origin = self.base_url + path
        first_query = {k: v for k, v in (params or {}).items() if v is not None} or None
        url, query = origin, first_query
        retries = 0
        hops = 0
        while True:
            try:
                resp = await self._http.request(
                    method,
                    url,
                    params=query,
                    json=body,
                    timeout=timeout if timeout is not None else self.timeout,
                )
            except _NOT_SENT as e:
                if retries < limit:
                    retries += 1
                    url, query, hops = origin, first_query, 0  # a retry: the caller's address
                    await self._sleep(self._backoff(retries))
                    continue
                raise LogHostUnavailable(f"cannot connect: {e!r}", url=url) from e
            except httpx.TransportError as e:
                if idempotent and retries < limit:
                    retries += 1
                    url, query, hops = origin, first_query, 0  # a retry: the caller's address
                    await self._sleep(self._backoff(retries))
                    continue
                what = "" if idempotent else "; the request may or may not have been applied"
                raise LogHostUnavailable(f"transport failure: {e!r}{what}", url=url) from e

            status = resp.status_code
            if 200 <= status < 300:
                if not resp.content:
                    return {}
                return resp.json()

            code, message = _error_parts(resp)
            location = resp.headers.get("location")
            if status in _REDIRECTS and location:
                target = urljoin(str(resp.request.url), location)
                if (
                    self._redirect_origins is not None
                    and _origin(target) not in self._redirect_origins
                ):
                    raise NotLeader(
                        f"refusing to follow a redirect to an unlisted host: {location}",
                        location=location,
                        status=status,
                        code=code,
                        url=url,
                    )
                if hops < self.max_redirects:
                    hops += 1
                    url = target
                    if urlsplit(url).query:
                        query = None  # the Location already carries the query string
                    continue
                raise NotLeader(
                    message or "too many redirects",
                    location=location,
                    status=status,
                    code=code,
                    url=url,
                )

            retry_after = parse_retry_after(resp.headers.get("retry-after"))
            retryable = status == 429 or (status in _AMBIGUOUS_STATUSES and idempotent)
            if retryable and retries < limit:
                delay = retry_after if retry_after is not None else self._backoff(retries + 1)
                if delay <= self.max_retry_after_s:
                    retries += 1
                    url, query, hops = origin, first_query, 0  # a retry: the caller's address
                    await self._sleep(delay)
                    continue

            cls = error_class(status, code)
            if cls is Backpressure:
                raise Backpressure(
                    message, retry_after_s=retry_after, status=status, code=code, url=url
                )
            raise cls(message, status=status, code=code, url=url)

    def _log(self, tenant: str, collection_id: str, *rest: str) -> str:
        tail = "".join("/" + _seg(p) for p in rest)
        return f"/v1/tenants/{_seg(tenant)}/logs/{_seg(collection_id)}{tail}"

    # ---------------------------------------------------------------------------- log data

    async def append(
        self,
        tenant: str,
        collection_id: str,
        records: Sequence[Record | Mapping[str, Any]],
        *,
        idempotency_key: str | None = None,
    ) -> AppendResult:
        """Append records; ambiguous failures are retried only when ``idempotency_key`` is set."""
        payload: JsonObject = {
            "records": [
                (r if isinstance(r, Record) else Record.model_validate(r)).model_dump()
                for r in records
            ]
        }
        if idempotency_key is not None:
            payload["idempotency_key"] = idempotency_key
        data = await self._request(
            "POST",
            self._log(tenant, collection_id, "records"),
            body=payload,
            idempotent=idempotency_key is not None,
        )
        return AppendResult.model_validate(data)

    async def read(
        self,
        tenant: str,
        collection_id: str,
        *,
        from_offset: int,
        limit: int | None = None,
        wait_ms: int | None = None,
    ) -> ReadResult:
        """Read records from ``from_offset``; with ``wait_ms`` long-poll for new ones."""
        # A long poll must not time out before the server answers.
        timeout = self.timeout + (wait_ms or 0) / 1000.0
        data = await self._request(
            "GET",
            self._log(tenant, collection_id, "records"),
            params={"from": from_offset, "limit": limit, "wait_ms": wait_ms},
            idempotent=True,
            timeout=timeout,
        )
        return ReadResult.model_validate(data)

    async def state(self, tenant: str, collection_id: str) -> LogState:
        """Offsets, compaction cursor and size of a log."""
        data = await self._request("GET", self._log(tenant, collection_id), idempotent=True)
        return LogState.model_validate(data)

    async def fragments(
        self, tenant: str, collection_id: str, *, from_offset: int | None = None
    ) -> list[FragmentInfo]:
        """The fragments holding offsets from ``from_offset`` to the tail, in offset order."""
        data = await self._request(
            "GET",
            self._log(tenant, collection_id, "fragments"),
            params={"from": from_offset},
            idempotent=True,
        )
        frags = [FragmentInfo.model_validate(f) for f in data["fragments"]]
        return sorted(frags, key=lambda f: f.start)

    # ------------------------------------------------------------------------------ cursors

    async def get_cursor(self, tenant: str, collection_id: str, name: str) -> Cursor:
        """Read a named cursor."""
        data = await self._request(
            "GET", self._log(tenant, collection_id, "cursors", name), idempotent=True
        )
        return Cursor.model_validate(data)

    async def put_cursor(
        self, tenant: str, collection_id: str, name: str, offset: int, *, witness: str | None
    ) -> Cursor:
        """Compare-and-swap a cursor (``witness=None`` creates); stale → ``CursorConflict``."""
        data = await self._request(
            "PUT",
            self._log(tenant, collection_id, "cursors", name),
            body={"offset": offset, "witness": witness},
            idempotent=False,  # a re-sent CAS could conflict with our own first attempt
        )
        if isinstance(data, dict) and "offset" in data:
            return Cursor.model_validate({"name": name, **data})
        return Cursor(name=name, offset=offset)

    async def delete_cursor(self, tenant: str, collection_id: str, name: str) -> None:
        """Delete a named cursor."""
        await self._request(
            "DELETE", self._log(tenant, collection_id, "cursors", name), idempotent=True
        )

    # ---------------------------------------------------------------------------- lifecycle

    async def compact(self, tenant: str, collection_id: str, offset: int) -> int:
        """Move the compaction cursor forward to ``offset``; returns the cursor after the call."""
        data = await self._request(
            "POST",
            self._log(tenant, collection_id, "compaction"),
            body={"offset": offset},
            idempotent=True,  # forward-only: repeating it is harmless
        )
        return CompactionResult.model_validate(data).compaction_offset

    async def seal(self, tenant: str, collection_id: str) -> JsonObject:
        """Seal the log against further appends."""
        return dict(
            await self._request("POST", self._log(tenant, collection_id, "seal"), idempotent=True)
        )

    async def fork(self, tenant: str, collection_id: str, target_collection_id: str) -> JsonObject:
        """Fork the log into ``target_collection_id``."""
        return dict(
            await self._request(
                "POST",
                self._log(tenant, collection_id, "fork"),
                body={"target_collection_id": target_collection_id},
                idempotent=False,  # a repeated fork would find its target already there
            )
        )

    async def gc(self, tenant: str, collection_id: str) -> JsonObject:
        """Garbage-collect the log below its cursors."""
        return dict(
            await self._request("POST", self._log(tenant, collection_id, "gc"), idempotent=True)
        )

    async def scrub(self, tenant: str, collection_id: str) -> JsonObject:
        """Verify the log's manifests and fragments."""
        return dict(
            await self._request("GET", self._log(tenant, collection_id, "scrub"), idempotent=True)
        )

    # ---------------------------------------------------------------------------- dirty set

    async def dirty(
        self, *, min_records: int | None = None, limit: int | None = None, retry: bool = True
    ) -> DirtyResult:
        """The host's dirty logs, highest score first (needs a service key); ``retry=False``:
        one attempt (a poll that the next round repeats)."""
        data = await self._request(
            "GET",
            "/v1/dirty",
            params={"min_records": min_records, "limit": limit},
            idempotent=True,
            max_retries=None if retry else 0,
        )
        return DirtyResult.model_validate(data)

    async def rollup(self) -> DirtyResult:
        """Force a roll-up of the dirty log and return the dirty set."""
        data = await self._request("POST", "/v1/dirty/rollup", idempotent=True)
        return DirtyResult.model_validate(data)

    async def purge(self) -> JsonObject:
        """Purge dirty-log entries that every compaction cursor has passed."""
        return dict(await self._request("POST", "/v1/dirty/purge", idempotent=True))


__all__ = ["LogHostClient", "LogHostError", "parse_retry_after"]
