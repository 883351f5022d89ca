"""Which compactors are alive: a liveness record per member in the object store.

Rendezvous hashing over ``--members`` alone gives a dead member's share to nobody: its collections
stay dirty, their backlog grows, and the hosts then refuse writes to them (429 ``compaction``).  So
every compactor writes ``compactors/live/{member_id}.json`` (``{"member_id", "at"}``) each round,
and ranks collections over the members whose record is younger than ``ttl_s`` (itself always
included).  Without ``--members`` the live records *are* the membership.

Liveness is one half; the other is the scheduler's take-over (``scheduler.Scheduler``): a collection
whose owner has made no progress on it within a bound goes to the next member in rendezvous order,
which also covers members whose lists disagree and owners that are alive but stuck.  Both are safe
to get wrong in either direction: two compactors on one collection race on ``CURRENT.json``'s
conditional put, and the loser discards its work.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING
from urllib.parse import quote, unquote

from host.wal3.errors import ObjectNotFound

if TYPE_CHECKING:
    from host.wal3.store import ObjectStore

LIVE_PREFIX = "compactors/live/"


class Liveness:
    """This member's heartbeat, and the set of members alive now."""

    def __init__(self, store: ObjectStore, member_id: str, *, ttl_s: float,
                 clock: Callable[[], float] = time.time) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.store = store
        self.member_id = member_id
        self.ttl_s = ttl_s
        self._clock = clock
        self._started = clock()

    @staticmethod
    def key(member_id: str) -> str:
        """Where a member's liveness record lives (the id quoted: it is a key, not a path)."""
        return f"{LIVE_PREFIX}{quote(member_id, safe='')}.json"

    async def beat(self) -> None:
        """Record that this member is alive now (a plain put: only this member writes it)."""
        body = json.dumps({"member_id": self.member_id, "at": self._clock()}).encode()
        await self.store.put(self.key(self.member_id), body)

    async def records(self) -> dict[str, float]:
        """Every member's last heartbeat time, as its record says."""
        out: dict[str, float] = {}
        keys = [meta.key async for meta in self.store.list(LIVE_PREFIX)]
        for key in keys:
            name = key[len(LIVE_PREFIX):]
            if not name.endswith(".json") or "/" in name:
                continue
            try:
                out[unquote(name[: -len(".json")])] = float(
                    json.loads((await self.store.get(key)).data)["at"])
            except (ObjectNotFound, ValueError, KeyError, TypeError):
                continue  # gone meanwhile, or damaged: it proves nothing about its member
        return out

    async def alive(self) -> set[str]:
        """Members whose record is younger than ``ttl_s``, this one always included."""
        now = self._clock()
        return {self.member_id} | {m for m, at in (await self.records()).items()
                                   if now - at < self.ttl_s}

    async def members(self, configured: Sequence[str]) -> list[str]:
        """The membership to rank over: the configured members that are alive, or, with none
        configured, every live member.

        A configured member with no record at all may be starting alongside us, so it counts as
        alive until this member has itself run for ``ttl_s`` (else every member would take every
        collection at a joint start); one whose record has gone stale is dead at once.
        """
        now = self._clock()
        records = await self.records()
        alive = {self.member_id} | {m for m, at in records.items() if now - at < self.ttl_s}
        if not configured:
            return sorted(alive)
        young = now - self._started < self.ttl_s
        return sorted(m for m in configured if m in alive or (young and m not in records))
