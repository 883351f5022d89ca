"""Hosts' liveness records: two hosts with one server id on one store are refused.

Each ``loghost serve`` keeps ``hosts/live/{quoted server id}.json`` in the store
(``{"server_id", "instance", "hostname", "pid", "listen", "at"}``), renewed every third of its
lifetime and deleted on a clean stop.  A host starting with a server id whose record another
instance renewed less than ``ttl_s`` ago watches the record: when it is renewed again, that host
is alive and this one refuses to start (exit code 8); when it is not renewed within ``ttl_s``
(the other host died without deleting it), this one takes the id over.  So a restart after a
clean stop starts at once, and one after a crash waits at most ``ttl_s`` (no wait at all when
the record names this machine and a process that no longer exists).

Two hosts started within the same instant may both see no record; the renewal then notices the
other's record and the later one stops (``HostLiveness.renew`` returns the intruder).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote

from wal3 import ObjectNotFound, ObjectStore

from .cli_errors import CliError, ExitCode

HOSTS_LIVE_PREFIX = "hosts/live/"


def host_live_key(server_id: str) -> str:
    """Where a server id's liveness record lives (the id quoted: it is a key, not a path)."""
    return f"{HOSTS_LIVE_PREFIX}{quote(server_id, safe='')}.json"


@dataclass(frozen=True, slots=True)
class HostRecord:
    """One liveness record."""

    server_id: str
    instance: str
    hostname: str
    pid: int
    listen: str
    at: float

    def describe(self) -> str:
        """Who holds the record, for the refusal line."""
        return f"host {self.hostname} pid {self.pid} listening on {self.listen}"


class DuplicateServerId(CliError):
    """Another live host runs with this server id on this store."""

    def __init__(self, server_id: str, other: HostRecord) -> None:
        super().__init__(
            ExitCode.DUPLICATE_SERVER_ID,
            f"server id {server_id!r} is in use by a live {other.describe()}; "
            "give each host its own --server-id (LOGHOST_SERVER_ID)",
        )
        self.other = other


def _alive(record: HostRecord) -> bool:
    """False when the record's process is certainly gone: it ran on this machine (same host
    name) and its pid is this process's or no process's (a restart after kill -9, or a container
    restarted in the same pod).  Otherwise only watching the record can tell."""
    if record.hostname != socket.gethostname():
        return True
    if record.pid == os.getpid():
        return False
    try:
        os.kill(record.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True


class HostLiveness:
    """This host's liveness record: claimed at start, renewed, released at a clean stop."""

    def __init__(
        self,
        store: ObjectStore,
        server_id: str,
        listen: str,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.store = store
        self.server_id = server_id
        self.listen = listen
        self.ttl_s = ttl_s
        self.instance = uuid.uuid4().hex
        self.key = host_live_key(server_id)
        self._clock = clock
        self._monotonic = monotonic

    @property
    def renew_every_s(self) -> float:
        """The renewal period: a third of the record's lifetime."""
        return self.ttl_s / 3

    async def read(self) -> HostRecord | None:
        """The record in the store (None when absent or unreadable)."""
        try:
            doc = json.loads((await self.store.get(self.key)).data)
            return HostRecord(
                server_id=str(doc["server_id"]),
                instance=str(doc["instance"]),
                hostname=str(doc.get("hostname", "?")),
                pid=int(doc.get("pid", 0)),
                listen=str(doc.get("listen", "?")),
                at=float(doc["at"]),
            )
        except ObjectNotFound:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # damaged: it proves nothing

    async def claim(self, on_wait: Callable[[str], None] | None = None) -> None:
        """Take the server id, or raise DuplicateServerId when another host is alive with it."""
        other = await self.read()
        fresh = other is not None and self._clock() - other.at < self.ttl_s
        if other is not None and fresh and other.instance != self.instance and _alive(other):
            if on_wait is not None:
                on_wait(
                    f"server id {self.server_id!r} was in use by {other.describe()} "
                    f"{max(0.0, self._clock() - other.at):.0f} s ago; waiting up to "
                    f"{self.ttl_s:g} s to see whether it is still alive"
                )
            await self._watch(other)
        await self.beat()

    async def _watch(self, seen: HostRecord) -> None:
        deadline = self._monotonic() + self.ttl_s
        while self._monotonic() < deadline:
            # The poll period of a record renewed every ttl/3 (pacing, not synchronisation).
            await asyncio.sleep(min(1.0, self.ttl_s / 6))
            now = await self.read()
            if now is None:
                return  # released by a clean stop
            if now.instance != seen.instance or now.at != seen.at:
                raise DuplicateServerId(self.server_id, now)
        # Not renewed within its lifetime: its host died without releasing it.

    async def beat(self) -> None:
        """Write this host's record, stamped now."""
        body = {
            "server_id": self.server_id,
            "instance": self.instance,
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "listen": self.listen,
            "at": self._clock(),
        }
        await self.store.put(self.key, json.dumps(body).encode())

    async def renew(self) -> HostRecord | None:
        """Renew the record; returns the other host's record instead when one took it over."""
        now = await self.read()
        if now is not None and now.instance != self.instance:
            return now
        await self.beat()
        return None

    async def release(self) -> None:
        """Delete the record if it is still this host's (a clean stop: a restart need not wait)."""
        now = await self.read()
        if now is not None and now.instance == self.instance:
            await self.store.delete(self.key)
