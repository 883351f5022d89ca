"""API keys: who is calling, which tenant they act for, and which role they hold.

Roles (the one table of the role model is in README.md and docs/OPERATIONS.md):

* ``key=tenant:read`` – **reader**: a tenant's read-only key (state, records, cursors read).
* ``key=tenant``      – **tenant**: the application; a reader, plus append and its own cursors
  (create, move, delete), never a reserved cursor.
* ``key=*``           – **service**: compactors and operators; everything, on every tenant.

Keys are held only as SHA-256 digests and compared with ``hmac.compare_digest`` against every
configured digest (no early exit), so neither logs nor timing reveal them.  Keys come from
``LOGHOST_API_KEYS`` and, optionally, from a file (``LOGHOST_API_KEYS_FILE``, e.g. a mounted
Kubernetes Secret) that is re-read when it changes or on ``reload()`` (SIGHUP), without a restart.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import os
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from dirtylog import CURSOR_NAME as STABLE_PREFIX
from wal3.cursors import COMPACTION

from .errors import BadRequest, Forbidden, Unauthorized
from .watchedfile import Signature, file_signature

if TYPE_CHECKING:  # config imports this module
    from .config import Settings

_log = logging.getLogger("loghost.auth")

SERVICE = "*"
READ_SUFFIX = ":read"
# fullmatch, never ``$``: "acme\n" is not a tenant name (``$`` matches before a final newline).
_TENANT = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
_CURSOR = re.compile(r"[A-Za-z0-9_]{1,128}")
# Cursors the system moves.  A tenant moving one could break "the compaction cursor is never ahead
# of a compacted version" (the collector then purges records no compacted version holds).
RESERVED_CURSORS = frozenset({COMPACTION, STABLE_PREFIX})
# Names with these prefixes are kept for future system cursors.
RESERVED_CURSOR_PREFIXES = ("_", "loghost")


class Role(enum.IntEnum):
    """What a key may do; a higher role may do everything a lower one may."""

    READER = 1
    TENANT = 2
    SERVICE = 3

    @property
    def label(self) -> str:
        """How errors and docs name the role."""
        return {
            Role.READER: "a read-only tenant key (key=tenant:read)",
            Role.TENANT: "a tenant key (key=tenant)",
            Role.SERVICE: "a service key (key=*)",
        }[self]


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    tenant: str  # the tenant it acts for, or ``*`` for a service key
    key_id: str  # a short digest prefix, safe to log
    role: Role = Role.TENANT

    @property
    def is_service(self) -> bool:
        """Service keys (compactors, operators) act on every tenant and on /v1/dirty."""
        return self.role is Role.SERVICE


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def new_key() -> str:
    """A fresh random API key."""
    return "lh_" + secrets.token_urlsafe(24)


def check_tenant_name(tenant: str) -> str:
    """Return a valid tenant name or raise BadRequest."""
    if not _TENANT.fullmatch(tenant):
        raise BadRequest("tenant: must match [A-Za-z0-9_.-]{1,128}")
    return tenant


def is_reserved_cursor(name: str) -> bool:
    """Whether a cursor name belongs to the system (compared case-insensitively, since a
    case-insensitive store would map ``Compaction`` onto ``compaction``)."""
    folded = name.casefold()
    return folded in RESERVED_CURSORS or folded.startswith(RESERVED_CURSOR_PREFIXES)


def check_cursor_name(name: str) -> str:
    """Return a valid cursor name or raise BadRequest (the engine's rule, matched in full)."""
    if not _CURSOR.fullmatch(name):
        raise BadRequest(f"name: cursor names match [A-Za-z0-9_]{{1,128}}: {name[:64]!r}")
    return name


def parse_grant(spec: str) -> Principal:
    """The principal (less its key id) of a ``tenant``, ``tenant:read`` or ``*`` entry."""
    spec = spec.strip()
    if spec == SERVICE:
        return Principal(SERVICE, "", Role.SERVICE)
    tenant, role = spec, Role.TENANT
    if spec.endswith(READ_SUFFIX):
        tenant, role = spec[: -len(READ_SUFFIX)], Role.READER
    if not _TENANT.fullmatch(tenant):
        raise ValueError(
            f"API key entry: {spec!r} is not 'tenant', 'tenant:read' or '*' "
            "(tenant names match [A-Za-z0-9_.-]{1,128})"
        )
    return Principal(tenant, "", role)


def parse_keys(text: str, where: str = "LOGHOST_API_KEYS") -> dict[str, str]:
    """``key -> grant`` from ``key=tenant[:read]`` / ``key=*`` entries, separated by commas or
    new lines (a file may also hold ``#`` comment lines).  Raises ValueError naming ``where``."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        for part in line.split(","):
            part = part.strip()
            if not part:
                continue
            # The last "=": keys may end in base64 padding, grants never hold one.
            key, sep, grant = part.rpartition("=")
            key, grant = key.strip(), grant.strip()
            if not sep or not key or not grant:
                raise ValueError(f"{where}: entries are key=tenant, key=tenant:read or key=*")
            if len(key) > 512 or any(c.isspace() for c in key):
                raise ValueError(f"{where}: a key is at most 512 characters, without spaces")
            try:
                parse_grant(grant)
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from None
            if out.get(key, grant) != grant:
                raise ValueError(f"{where}: one key is listed with two different grants")
            out[key] = grant
    return out


def read_keys_file(path: str | os.PathLike[str]) -> dict[str, str]:
    """The keys of a keys file (the ``LOGHOST_API_KEYS`` format); OSError/ValueError on failure.

    A file with no key is refused like a broken one: a rewrite caught mid-truncation would
    otherwise lock every caller out, the service included."""
    keys = parse_keys(Path(path).read_text(encoding="utf-8"), f"API keys file {path}")
    if not keys:
        raise ValueError(f"API keys file {path}: holds no key")
    return keys


def merge_keys(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, str]:
    """The union of two key sets; ValueError if one key has two different grants."""
    out = dict(a)
    for k, g in b.items():
        if out.get(k, g) != g:
            raise ValueError(
                "a key is listed in both LOGHOST_API_KEYS and the keys file with different grants"
            )
        out[k] = g
    return out


_Entry = tuple[bytes, Principal]


class Authenticator:
    """Maps bearer keys to principals and decides what they may do."""

    def __init__(
        self, keys: Mapping[str, str], keys_file: str | os.PathLike[str] | None = None
    ) -> None:
        self._static = dict(keys)
        self._file = Path(keys_file) if keys_file else None
        self._file_sig: Signature | None = None
        self._entries: tuple[_Entry, ...] = ()
        if self._file is None:
            self._entries = self._build(self._static)
        elif not self.reload():
            raise ValueError(f"cannot use the API keys file {self._file}")

    @classmethod
    def from_settings(cls, settings: Settings) -> Authenticator:
        """From ``Settings.api_keys`` and ``Settings.api_keys_file``."""
        return cls(parse_keys(settings.api_keys), settings.api_keys_file)

    @staticmethod
    def _build(keys: Mapping[str, str]) -> tuple[_Entry, ...]:
        out = []
        for key, grant in keys.items():
            p = parse_grant(grant)
            digest = _digest(key)
            out.append((digest, Principal(p.tenant, digest.hex()[:8], p.role)))
        return tuple(out)

    def __bool__(self) -> bool:
        return bool(self._entries)

    # --------------------------------------------------------------------------- the file

    def _signature(self) -> Signature | None:
        assert self._file is not None
        return file_signature(self._file)

    def reload(self) -> bool:
        """Re-read the keys file now (SIGHUP).  On failure the keys in use stay; False."""
        if self._file is None:
            return True
        sig = self._signature()
        self._file_sig = sig
        try:
            entries = self._build(merge_keys(self._static, read_keys_file(self._file)))
        except (OSError, ValueError, UnicodeDecodeError) as e:
            _log.error("API keys file not loaded, the keys in use stay: %s", e)
            return False
        self._entries = entries  # one assignment: a request sees the old set or the new one
        _log.info("API keys loaded", extra={"keys": len(entries)})
        return True

    def _maybe_reload(self) -> None:
        # One stat per request: a changed Secret takes effect on the next request, no timer.
        if self._file is not None and self._signature() != self._file_sig:
            self.reload()

    # ---------------------------------------------------------------------- authentication

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <key>`` header; raises Unauthorized."""
        if not authorization:
            raise Unauthorized("missing Authorization: Bearer <key>")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key or len(key) > 512:
            raise Unauthorized("malformed Authorization header; expected Bearer <key>")
        self._maybe_reload()
        digest = _digest(key)
        found: Principal | None = None
        for known, who in self._entries:  # every entry, no early exit: constant time
            if hmac.compare_digest(known, digest):
                found = who
        if found is None:
            raise Unauthorized("unknown API key")
        return found

    # ----------------------------------------------------------------------- authorization

    @staticmethod
    def authorize(principal: Principal, tenant: str, needed: Role) -> None:
        """Allow ``principal`` to act on ``tenant``'s logs with ``needed``; raise Forbidden.

        A tenant matches only itself, exactly: not a prefix, not another case, not a dotted
        extension (``alice`` never acts for ``al``, ``Alice`` or ``alice.x``)."""
        check_tenant_name(tenant)
        if principal.role is Role.SERVICE:
            return
        if principal.tenant != tenant:
            raise Forbidden(
                f"this key may not act on tenant {tenant!r}: that needs a key of "
                f"tenant {tenant!r} or a service key (key=*)"
            )
        if principal.role < needed:
            raise Forbidden(f"this needs {needed.label}; this key is {principal.role.label}")

    @staticmethod
    def authorize_cursor_write(principal: Principal, tenant: str, name: str) -> None:
        """Creating, moving or deleting cursor ``name`` of ``tenant``: a tenant key for its own
        cursors, a service key for the reserved ones (``compaction``, ...); raise Forbidden."""
        Authenticator.authorize(principal, tenant, Role.READER)  # the tenant first
        check_cursor_name(name)
        if is_reserved_cursor(name) and principal.role is not Role.SERVICE:
            raise Forbidden(
                f"cursor {name!r} is reserved for the system: creating, moving or "
                f"deleting it needs {Role.SERVICE.label}"
            )
        Authenticator.authorize(principal, tenant, Role.TENANT)

    @staticmethod
    def authorize_tenant(principal: Principal, tenant: str) -> None:
        """Allow a tenant's own key (any role) or a service key on a tenant path; raise Forbidden."""
        Authenticator.authorize(principal, tenant, Role.READER)

    @staticmethod
    def require_service(principal: Principal) -> None:
        """Only service keys pass."""
        if principal.role is not Role.SERVICE:
            raise Forbidden(
                f"this endpoint needs {Role.SERVICE.label}; this key is {principal.role.label}"
            )
