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

from wal3.errors import ObjectNotFound
from wal3.paths import COMPACTORS_LIVE_PREFIX, live_key, parse_live_key

if TYPE_CHECKING:
    from wal3.store import ObjectStore

LIVE_PREFIX = COMPACTORS_LIVE_PREFIX


class Liveness:
    """This member's heartbeat, and the set of members alive now."""

    def __init__(
        self,
        store: ObjectStore,
        member_id: str,
        *,
        ttl_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("ttl_s must be positive")
        self.store = store
        self.member_id = member_id
        self.ttl_s = ttl_s
        self._clock = clock
        self._started = clock()
        # When this member first beat, as its own record says (learned by the first beat): a
        # process started from cron for one round is not "young" when the member is not.
        self._since: float | None = None

    @staticmethod
    def key(member_id: str) -> str:
        """Where a member's liveness record lives (the id quoted: it is a key, not a path)."""
        return live_key(member_id)

    async def beat(self) -> None:
        """Record that this member is alive now (a plain put: only this member writes it).

        The record keeps ``since``, this member's first beat ever, across processes.
        """
        now = self._clock()
        if self._since is None:
            recorded = await self._recorded_since()
            self._since = recorded if recorded is not None and recorded <= now else now
        body = json.dumps({"member_id": self.member_id, "at": now, "since": self._since}).encode()
        await self.store.put(self.key(self.member_id), body)

    async def _recorded_since(self) -> float | None:
        """When this member first beat, from its own record (an older record without ``since``
        proves a beat at ``at``); None when it never beat."""
        try:
            doc = json.loads((await self.store.get(self.key(self.member_id))).data)
            return float(doc.get("since", doc["at"]))
        except ObjectNotFound:
            return None
        except (ValueError, KeyError, TypeError, AttributeError):
            return None  # damaged: it proves nothing; start afresh

    async def records(self) -> dict[str, float]:
        """Every member's last heartbeat time, as its record says."""
        out: dict[str, float] = {}
        keys = [meta.key async for meta in self.store.list(LIVE_PREFIX)]
        for key in keys:
            member = parse_live_key(key)
            if member is None:
                continue
            try:
                out[member] = float(json.loads((await self.store.get(key)).data)["at"])
            except (ObjectNotFound, ValueError, KeyError, TypeError):
                continue  # gone meanwhile, or damaged: it proves nothing about its member
        return out

    async def alive(self) -> set[str]:
        """Members whose record is younger than ``ttl_s``, this one always included."""
        now = self._clock()
        return {self.member_id} | {
            m for m, at in (await self.records()).items() if now - at < self.ttl_s
        }

    async def members(self, configured: Sequence[str]) -> list[str]:
        """The membership to rank over: the configured members that are alive, or, with none
        configured, every live member.

        A configured member with no record at all may be starting alongside us, so it counts as
        alive until this member has itself been alive for ``ttl_s`` since its first beat on record
        (else every member would take every collection at a joint start); one whose record has
        gone stale is dead at once.  The first beat, not this process's start: a member run from
        cron (``--once``) is a new process every round, and would otherwise wait for ever for a
        member that died before its first beat.
        """
        now = self._clock()
        records = await self.records()
        alive = {self.member_id} | {m for m, at in records.items() if now - at < self.ttl_s}
        if not configured:
            return sorted(alive)
        first = self._since if self._since is not None else self._started
        young = now - first < self.ttl_s
        return sorted(m for m in configured if m in alive or (young and m not in records))
