"""The routes' auth dependencies: who is calling (``Authorization: Bearer``), and whether its key
may act on the path's tenant, log and cursor (the role table is in README.md).

One flat dependency per route (a chain of them costs a fifth of a small request), named for the
role the route needs; each resolves the caller, checks the role, parses the collection id and
tags the request's log lines with tenant and collection id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple
from uuid import UUID

from starlette.requests import Request

from .. import jsonlog
from ..auth import Authenticator, Principal, Role, check_cursor_name
from ..errors import Unauthorized
from ..httpserver import connection_ticket
from ..requests import parse_uuid


class LogScope(NamedTuple):
    """A request on one log: its tenant, its collection id, and the caller."""

    tenant: str
    cid: UUID
    principal: Principal


class Access:
    """The dependencies, over one server's keys."""

    def __init__(self, auth: Authenticator) -> None:
        self._auth = auth
        # What each dependency needs, as the API description states it (``x-required-key``).
        self.needs: dict[Callable[..., Any], str] = {
            self.reader_scope: "a key of this tenant (read-only or not) or a service key",
            self.cursor_reader_scope: "a key of this tenant (read-only or not) or a service key",
            self.tenant_scope: "a tenant key of this tenant (not read-only) or a service key",
            self.cursor_writer_scope: "a tenant key of this tenant (not read-only) or a service "
            "key; a service key for reserved names (compaction, stable_prefix, names starting "
            "with _ or loghost)",
            self.service_scope: "a service key",
            self.service: "a service key",
        }

    def principal(self, request: Request) -> Principal:
        """The caller (401 without exactly one valid key)."""
        values = request.headers.getlist("authorization")
        if len(values) > 1:
            raise Unauthorized("more than one Authorization header")
        who = self._auth.authenticate(values[0] if values else None)
        ticket = connection_ticket(request.scope)
        if ticket is not None:
            ticket.mark_authenticated()  # the connection cap no longer closes it for strangers
        return who

    @staticmethod
    def _acting_for(request: Request, tenant: str) -> None:
        """The request was authorized for ``tenant``: its connection notes it (a refusal that
        follows another tenant's request on a shared connection is not held; httpserver)."""
        ticket = connection_ticket(request.scope)
        if ticket is not None:
            ticket.note_tenant(tenant)

    def _scope(self, who: Principal, tenant: str, collection_id: str) -> LogScope:
        cid = parse_uuid(collection_id)
        jsonlog.tenant.set(tenant)
        jsonlog.collection_id.set(str(cid))
        return LogScope(tenant, cid, who)

    def role_scope(
        self, request: Request, tenant: str, collection_id: str, needed: Role
    ) -> LogScope:
        """The caller, checked for ``needed`` on ``tenant``, and the log: the dependencies'
        check, for a route that does not go through FastAPI's dependencies."""
        who = self.principal(request)
        self._auth.authorize(who, tenant, needed)
        scope = self._scope(who, tenant, collection_id)
        self._acting_for(request, tenant)  # a well-formed request, authorized
        return scope

    async def reader_scope(self, request: Request, tenant: str, collection_id: str) -> LogScope:
        """Any key of the tenant, or a service key."""
        return self.role_scope(request, tenant, collection_id, Role.READER)

    async def tenant_scope(self, request: Request, tenant: str, collection_id: str) -> LogScope:
        """A tenant key of the tenant (not read-only), or a service key."""
        return self.role_scope(request, tenant, collection_id, Role.TENANT)

    async def service_scope(self, request: Request, tenant: str, collection_id: str) -> LogScope:
        """A service key."""
        return self.role_scope(request, tenant, collection_id, Role.SERVICE)

    async def cursor_reader_scope(
        self, request: Request, tenant: str, collection_id: str, name: str
    ) -> LogScope:
        """Reading any cursor: any key of the tenant, or a service key."""
        scope = self.role_scope(request, tenant, collection_id, Role.READER)  # 401 before any 400
        check_cursor_name(name)
        return scope

    async def cursor_writer_scope(
        self, request: Request, tenant: str, collection_id: str, name: str
    ) -> LogScope:
        """A tenant's own cursors; the reserved ones (``compaction``, ...) need a service key."""
        who = self.principal(request)
        self._auth.authorize_cursor_write(who, tenant, name)
        scope = self._scope(who, tenant, collection_id)
        self._acting_for(request, tenant)
        return scope

    async def service(self, request: Request) -> Principal:
        """A service key (routes outside any tenant: the dirty set)."""
        who = self.principal(request)
        self._auth.require_service(who)
        return who
