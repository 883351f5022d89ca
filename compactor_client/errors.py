"""The compactor's errors: :class:`CompactorError`, the root of every error class the package
defines, and the log host client's typed exceptions, one per error code of the REST API.

Every error class of ``compactor_client`` derives from :class:`CompactorError` (the client's
:class:`LogHostError` family, and the compaction errors: ``SettingsError``, ``PlanError``,
``FoldError``, ``GapError``, ``InvalidRecord``, ``CorruptCurrent``, ``CorruptFragmentError``,
``UnverifiableFragmentError``).  Those that were ``ValueError``s stay ``ValueError``s as well, so
existing handlers catch what they caught.
"""

from __future__ import annotations


class CompactorError(Exception):
    """Base class of every error ``compactor_client`` defines (client answers and compaction)."""


class LogHostError(CompactorError):
    """An error answer (or no answer) from a log host."""

    status: int = 0
    default_code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status
        self.code = code or self.default_code
        self.url = url

    def __str__(self) -> str:
        where = f" ({self.url})" if self.url else ""
        return f"{self.status} {self.code}: {self.message}{where}"


class LogHostUnavailable(LogHostError):
    """No usable answer: connection failure, timeout, or retries exhausted on a transport error."""

    default_code = "unavailable"


class InvalidRequest(LogHostError):
    """400: the request was malformed or its values were out of range."""

    status = 400
    default_code = "invalid"


class Unauthorized(LogHostError):
    """401: missing or unknown API key."""

    status = 401
    default_code = "unauthorized"


class Forbidden(LogHostError):
    """403: the key may not act on this tenant or endpoint."""

    status = 403
    default_code = "forbidden"


class NotFound(LogHostError):
    """404: the log (or cursor) does not exist."""

    status = 404
    default_code = "not_found"


class Conflict(LogHostError):
    """409: a state conflict; see the subclasses."""

    status = 409
    default_code = "conflict"


class Contention(Conflict):
    """409 ``contention``: another writer raced this one; the request was not applied."""

    default_code = "contention"


class Sealed(Conflict):
    """409 ``sealed``: the log is sealed and refuses writes."""

    default_code = "sealed"


class CursorConflict(Conflict):
    """409 ``cursor_conflict``: a cursor compare-and-swap presented a stale witness."""

    default_code = "cursor_conflict"


class Purged(LogHostError):
    """410 ``purged``: the requested offset is below the oldest retained offset."""

    status = 410
    default_code = "purged"


class Backpressure(LogHostError):
    """429 ``backpressure``: the host is overloaded; retry after ``retry_after_s``."""

    status = 429
    default_code = "backpressure"

    def __init__(
        self,
        message: str,
        *,
        retry_after_s: float | None = None,
        status: int | None = None,
        code: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code, url=url)
        self.retry_after_s = retry_after_s


class NotLeader(LogHostError):
    """307 ``not_leader``: another host leads this log (raised only when redirects run out)."""

    status = 307
    default_code = "not_leader"

    def __init__(
        self,
        message: str,
        *,
        location: str | None = None,
        status: int | None = None,
        code: str | None = None,
        url: str | None = None,
    ) -> None:
        super().__init__(message, status=status, code=code, url=url)
        self.location = location


class ServerError(LogHostError):
    """5xx: the host failed; for writes the outcome may be unknown."""

    status = 500
    default_code = "internal"


class CorruptFragment(ServerError):
    """500 ``corrupt_fragment``: a fragment in the store does not match its manifest pointer."""

    default_code = "corrupt_fragment"


_BY_CODE: dict[str, type[LogHostError]] = {
    "corrupt_fragment": CorruptFragment,
    "contention": Contention,
    "sealed": Sealed,
    "cursor_conflict": CursorConflict,
    "purged": Purged,
    "backpressure": Backpressure,
    "not_leader": NotLeader,
}

_BY_STATUS: dict[int, type[LogHostError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    410: Purged,
    429: Backpressure,
    307: NotLeader,
}


def error_class(status: int, code: str | None) -> type[LogHostError]:
    """The exception class for an HTTP status and an error code (the code wins when known)."""
    if code and code in _BY_CODE:
        return _BY_CODE[code]
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status >= 500:
        return ServerError
    return LogHostError
