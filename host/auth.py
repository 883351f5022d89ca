"""API keys: who is calling, and whether they may act on a tenant.

Keys are held only as SHA-256 digests, looked up by digest, so neither logs nor timing reveal them.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass

from .errors import BadRequest, Forbidden, Unauthorized

SERVICE = "*"
_TENANT = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller."""

    tenant: str
    key_id: str  # a short digest prefix, safe to log

    @property
    def is_service(self) -> bool:
        """Service keys (compactors, operators) act on every tenant and on /v1/dirty."""
        return self.tenant == SERVICE


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_key() -> str:
    """A fresh random API key."""
    return "lh_" + secrets.token_urlsafe(24)


def check_tenant_name(tenant: str) -> str:
    """Return a valid tenant name or raise BadRequest."""
    if not _TENANT.match(tenant):
        raise BadRequest("tenant: must match [A-Za-z0-9_.-]{1,128}")
    return tenant


class Authenticator:
    """Maps bearer keys to principals."""

    def __init__(self, keys: dict[str, str]) -> None:
        self._by_digest = {_digest(k): t for k, t in keys.items()}

    def __bool__(self) -> bool:
        return bool(self._by_digest)

    def authenticate(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer <key>`` header; raises Unauthorized."""
        if not authorization:
            raise Unauthorized("missing Authorization: Bearer <key>")
        scheme, _, key = authorization.strip().partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key or len(key) > 512:
            raise Unauthorized("malformed Authorization header; expected Bearer <key>")
        digest = _digest(key)
        tenant = self._by_digest.get(digest)
        if tenant is None:
            raise Unauthorized("unknown API key")
        return Principal(tenant=tenant, key_id=digest[:8])

    @staticmethod
    def authorize_tenant(principal: Principal, tenant: str) -> None:
        """Allow a tenant's own key or a service key on a tenant path; raise Forbidden."""
        check_tenant_name(tenant)
        if not principal.is_service and principal.tenant != tenant:
            raise Forbidden("this key may not act on another tenant")

    @staticmethod
    def require_service(principal: Principal) -> None:
        """Only service keys pass."""
        if not principal.is_service:
            raise Forbidden("this endpoint needs a service key")
