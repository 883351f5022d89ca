"""Choosing what to compact in a round: poll dirty sets, merge, assign, budget.

Every compactor polls every host, so all compactors see the same candidates; rendezvous hashing
then gives each collection to exactly one member without any coordination, and a membership change
moves only the collections whose top-ranked member changed (about 1/n of them).  If members ever
disagree about the membership, two compactors may pick the same collection: that is safe, because
``CURRENT.json`` is installed by conditional put and the loser discards its work.

Nobody may be left out either.  The membership is the *live* members (``membership.Liveness``), and
a collection whose owner makes no progress on it — its dirty ``start`` has not moved for
``takeover_s`` as this member has watched it — is taken over: the member ranked r-th for it (0 is
the owner) takes it once it has stalled for ``r × takeover_s``.  So a dead owner, an owner that is
alive but stuck, or members whose lists disagree delay a collection by a bounded time, never
forever: with n members, every member takes it after ``(n - 1) × takeover_s``.

The stall clocks outlive the process (``ProgressLedger``: one record per member in the store), so
a member run from cron (``--once``, a new process every round) still takes over.  They are wall
time, so a stamp from the future — taken while this member's clock ran ahead (a pod on a node whose
clock is off, a clock NTP then stepped back) — is clamped to now when loaded and when kept, as
``Liveness`` does with its ``since``: a fast clock can restart a stall clock, never hold it back
by the skew.  A poll that
failed for some host says nothing about that host's collections: they keep their clocks, and in
such a round the merged start is not compared (the lower start may be the missing host's).  Each
answering host's start is compared with what *that host* reported before instead: one that rose
is progress (the compaction cursor clips every host's start).  So a departed host still listed in
``COMPACTOR_HOSTS``, which fails every poll, does not make every collection look stalled.  What
is uncertain errs only towards taking over, i.e. towards duplicate (safe) work.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from wal3.errors import ObjectNotFound
from wal3.paths import COMPACTORS_PROGRESS_PREFIX, progress_key

from .models import DirtyLog, DirtyResult

if TYPE_CHECKING:
    from wal3.store import ObjectStore

    from .membership import Liveness

log = logging.getLogger(__name__)


class DirtySource(Protocol):
    """What the scheduler needs of a host client."""

    base_url: str

    async def dirty(
        self, *, min_records: int | None = None, limit: int | None = None, retry: bool = True
    ) -> DirtyResult:
        """The host's dirty set (``retry=False``: one attempt, a failure raised at once)."""
        ...


@dataclass(frozen=True, slots=True)
class Candidate:
    """A dirty log and the host that reported it."""

    host_url: str
    log: DirtyLog

    @property
    def key(self) -> tuple[str, str]:
        """Identity of the collection: (tenant, collection_id)."""
        return (self.log.tenant, self.log.collection_id)


@dataclass(frozen=True, slots=True)
class PollResult:
    """Everything the hosts reported, and the hosts that could not be polled."""

    candidates: list[Candidate]
    failed_hosts: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Selection:
    """A round's choice and why the rest was left out."""

    selected: list[Candidate]
    merged: int
    not_ours: int
    over_budget: int
    failed_hosts: dict[str, str]
    taken_over: int = 0  # selected although another member owns them (their owner stalled)
    members: tuple[str, ...] = ()  # the membership this round ranked over


async def poll_hosts(
    sources: Sequence[DirtySource], *, min_records: int | None = None, limit: int | None = None
) -> PollResult:
    """Poll every host's dirty set concurrently; one host failing does not stop the others.

    One attempt per host: the next round polls again, and a dead host still configured must not
    hold up every round by the client's retries with backoff (about 3 s: a departed host's
    adopted collections were compacted that much later than adoption plus one interval)."""

    async def one(src: DirtySource) -> list[Candidate]:
        got = await src.dirty(min_records=min_records, limit=limit, retry=False)
        return [Candidate(host_url=src.base_url, log=entry) for entry in got.logs]

    results = await asyncio.gather(*(one(s) for s in sources), return_exceptions=True)
    candidates: list[Candidate] = []
    failed: dict[str, str] = {}
    for src, res in zip(sources, results, strict=True):
        if isinstance(res, BaseException):
            if not isinstance(res, Exception):
                raise res  # cancellation and friends are not "a host failed"
            log.warning("polling %s failed: %s", src.base_url, res)
            failed[src.base_url] = str(res)
        else:
            candidates.extend(res)
    return PollResult(candidates=candidates, failed_hosts=failed)


def merge_candidates(candidates: Iterable[Candidate]) -> list[Candidate]:
    """One candidate per collection: the lowest ``start`` wins (it covers the most records)."""
    best: dict[tuple[str, str], Candidate] = {}
    for c in candidates:
        cur = best.get(c.key)
        # Ties go to the larger limit, then the host URL, so every compactor merges identically.
        rank = (c.log.start, -c.log.limit, c.host_url)
        if cur is None or rank < (cur.log.start, -cur.log.limit, cur.host_url):
            best[c.key] = c
    return [best[k] for k in sorted(best)]


def rendezvous_weight(member_id: str, collection_id: str) -> int:
    """A stable pseudo-random weight of (member, collection); the highest weight owns it."""
    member = member_id.encode()
    # Length-prefixing the member id makes ("ab", "c") and ("a", "bc") hash differently.
    data = len(member).to_bytes(4, "big") + member + collection_id.encode()
    digest = hashlib.blake2b(data, digest_size=8, person=b"compactor-rdv").digest()
    return int.from_bytes(digest, "big")


def owner_of(collection_id: str, members: Sequence[str]) -> str:
    """The member that owns a collection under rendezvous hashing."""
    if not members:
        raise ValueError("no members")
    # The member id breaks (astronomically unlikely) weight ties deterministically.
    return max(members, key=lambda m: (rendezvous_weight(m, collection_id), m))


def rank_of(member_id: str, collection_id: str, members: Sequence[str]) -> int:
    """Where a member stands in a collection's rendezvous order (0: the owner)."""
    order = sorted(members, key=lambda m: (rendezvous_weight(m, collection_id), m), reverse=True)
    return order.index(member_id) if member_id in order else len(order)


def assigned_to(
    candidates: Iterable[Candidate],
    member_id: str,
    members: Sequence[str],
    *,
    stalled_s: Callable[[Candidate], float] | None = None,
    takeover_s: float | None = None,
) -> list[Candidate]:
    """The candidates this member owns, plus those it takes over.

    With no other members it owns everything.  With ``takeover_s``, a candidate that has stalled
    (``stalled_s``) for at least ``rank × takeover_s`` is taken by the member of that rank.
    """
    if len(members) <= 1:
        return list(candidates)
    out: list[Candidate] = []
    for c in candidates:
        rank = rank_of(member_id, c.log.collection_id, members)
        if rank == 0 or (
            takeover_s is not None and stalled_s is not None and stalled_s(c) >= rank * takeover_s
        ):
            out.append(c)
    return out


def apply_budget(candidates: Iterable[Candidate], budget_records: int) -> list[Candidate]:
    """Highest score first, skipping collections that would overrun the budget of records.

    The top-scored collection is always taken, even alone over budget; otherwise a collection
    larger than the budget would never be compacted.
    """
    ordered = sorted(
        candidates,
        key=lambda c: (-c.log.score, -c.log.num_records, c.log.tenant, c.log.collection_id),
    )
    chosen: list[Candidate] = []
    used = 0
    for c in ordered:
        n = max(0, c.log.num_records)
        if not chosen or used + n <= budget_records:
            chosen.append(c)
            used += n
    return chosen


def select(
    candidates: Iterable[Candidate],
    *,
    member_id: str,
    members: Sequence[str],
    budget_records: int,
    min_records: int = 0,
    stalled_s: Callable[[Candidate], float] | None = None,
    takeover_s: float | None = None,
) -> Selection:
    """Merge, keep this member's share (and what it takes over) with at least ``min_records``,
    and apply the budget."""
    merged = merge_candidates(candidates)
    ours = assigned_to(merged, member_id, members, stalled_s=stalled_s, takeover_s=takeover_s)
    taken = (
        0
        if len(members) <= 1
        else sum(1 for c in ours if owner_of(c.log.collection_id, members) != member_id)
    )
    eligible = [c for c in ours if c.log.num_records >= min_records]
    chosen = apply_budget(eligible, budget_records)
    return Selection(
        selected=chosen,
        merged=len(merged),
        not_ours=len(merged) - len(ours),
        over_budget=len(eligible) - len(chosen),
        failed_hosts={},
        taken_over=taken,
        members=tuple(members),
    )


PROGRESS_PREFIX = COMPACTORS_PROGRESS_PREFIX
Progress = dict[tuple[str, str], tuple[int, float]]  # (tenant, cid) -> (dirty start, stalled since)
HostStarts = dict[tuple[str, str], dict[str, int]]  # (tenant, cid) -> host URL -> its dirty start


def _clamp(since: float, now: float) -> float:
    """A stall stamp, never later than ``now`` (a future stamp would hold a take-over back)."""
    return min(since, now)


class ProgressLedger:
    """This member's take-over clocks in the store (a plain put: only this member writes it), so
    that a new process — a restart, or every ``--once`` round — resumes them."""

    def __init__(self, store: ObjectStore, member_id: str) -> None:
        self.store = store
        self.member_id = member_id

    @property
    def key(self) -> str:
        """Where this member's clocks live (the id quoted: it is a key, not a path)."""
        return progress_key(self.member_id)

    async def load(self) -> tuple[Progress, HostStarts]:
        """The clocks and each host's last reported starts, as last saved (as stored: the
        scheduler clamps stamps from the future); empty when there are none (or they are
        damaged).  A ledger written before the hosts' starts were kept has none."""
        try:
            doc = json.loads((await self.store.get(self.key)).data)
            progress = {
                (str(t), str(c)): (int(start), float(since))
                for t, c, start, since in doc["collections"]
            }
            hosts: HostStarts = {}
            for t, c, url, start in doc.get("hosts", []):
                hosts.setdefault((str(t), str(c)), {})[str(url)] = int(start)
            return progress, hosts
        except ObjectNotFound:
            return {}, {}
        except (ValueError, KeyError, TypeError):
            log.warning("%s is damaged; take-over clocks start afresh", self.key)
            return {}, {}

    async def save(self, progress: Progress, hosts: HostStarts | None = None) -> None:
        """Replace the saved clocks (and the hosts' starts)."""
        rows = [[t, c, start, since] for (t, c), (start, since) in sorted(progress.items())]
        host_rows = [
            [t, c, url, start]
            for (t, c), starts in sorted((hosts or {}).items())
            for url, start in sorted(starts.items())
        ]
        body = json.dumps(
            {"member_id": self.member_id, "collections": rows, "hosts": host_rows},
            separators=(",", ":"),
        ).encode()
        await self.store.put(self.key, body)


class Scheduler:
    """Polls the hosts and selects this member's collections for one round."""

    def __init__(
        self,
        sources: Sequence[DirtySource],
        *,
        member_id: str,
        members: Sequence[str] = (),
        budget_records: int = 10_000_000,
        min_records: int = 1,
        dirty_limit: int | None = None,
        liveness: Liveness | None = None,
        takeover_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        ledger: ProgressLedger | None = None,
    ) -> None:
        """``liveness`` narrows the membership to live members; ``takeover_s`` bounds how long a
        collection may stall with its owner before the next member in rendezvous order takes it;
        ``ledger`` keeps the stall clocks across processes (``clock`` must then be wall time)."""
        members = list(dict.fromkeys(members))  # de-duplicated, order kept
        if members and member_id not in members:
            raise ValueError(f"member id {member_id!r} is not one of the members {members}")
        if takeover_s is not None and takeover_s <= 0:
            raise ValueError("takeover_s must be positive")
        self.sources = list(sources)
        self.member_id = member_id
        self.configured = members
        self.members = members or [member_id]
        self.budget_records = budget_records
        self.min_records = min_records
        self.dirty_limit = dirty_limit
        self.liveness = liveness
        self.takeover_s = takeover_s
        self._clock = clock
        self.ledger = ledger
        # Per collection: its dirty start when first seen, and since when it has not moved.
        self._progress: Progress = {}
        # Per collection: the start each host reported when last polled (hosts that failed since
        # keep theirs), to tell progress from a merge that lost its lowest start.
        self._host_starts: HostStarts = {}
        self._loaded = ledger is None
        self._saved: tuple[Progress, HostStarts] | None = None

    def _watch(
        self, candidates: Sequence[Candidate], *, failed: Iterable[str] = ()
    ) -> Callable[[Candidate], float]:
        """Note each collection's progress; returns how long each has stalled (as seen here).

        ``failed``: the hosts whose poll failed.  Then a collection may be missing, or show
        another host's later start, only because its host's poll failed: its clock goes on
        unless a host that answered reports a higher start than it did before.
        """
        failed = set(failed)
        now = self._clock()
        reported: HostStarts = {}
        for c in candidates:
            starts = reported.setdefault(c.key, {})
            starts[c.host_url] = min(c.log.start, starts.get(c.host_url, c.log.start))
        seen: Progress = {}
        for c in merge_candidates(candidates):
            old = self._progress.get(c.key)
            if old is not None and not failed:
                moved = old[0] != c.log.start
            elif old is not None:  # each answering host against itself: a rise is the cursor
                before = self._host_starts.get(c.key, {})
                moved = any(
                    url in before and start > before[url] for url, start in reported[c.key].items()
                )
            # A moved start is compaction progress (the cursor clips it): the clock restarts.
            if old is None or moved:
                seen[c.key] = (c.log.start, now)
            else:  # a stamp from the future (the clock was ahead then) counts from now
                seen[c.key] = (old[0], _clamp(old[1], now))
        hosts: HostStarts = {}
        if failed:
            for key, old in self._progress.items():
                seen.setdefault(key, (old[0], _clamp(old[1], now)))
            for key in seen:  # the failed hosts' last reports stand; the others' are replaced
                kept = {u: s for u, s in self._host_starts.get(key, {}).items() if u in failed}
                starts = {**kept, **reported.get(key, {})}
                if starts:
                    hosts[key] = starts
        else:
            hosts = reported
        self._progress = seen  # collections no longer dirty (per a complete poll) are forgotten
        self._host_starts = hosts
        return lambda c: now - seen[c.key][1] if c.key in seen else 0.0

    async def _load_progress(self) -> None:
        if self._loaded or self.ledger is None:
            return
        try:
            stored, stored_hosts = await self.ledger.load()
            now = self._clock()
            # A stamp from the future is clamped here, and so differs from the stored one: the
            # clamped clock is saved this round, and the future stamp is gone for good.
            self._progress = {
                **{k: (start, _clamp(since, now)) for k, (start, since) in stored.items()},
                **self._progress,
            }
            self._host_starts = {**stored_hosts, **self._host_starts}
            self._saved = (stored, stored_hosts)
            self._loaded = True
        except Exception as e:
            log.warning("could not load the take-over clocks: %r", e)

    async def _save_progress(self) -> None:
        current = (self._progress, self._host_starts)
        if self.ledger is None or not self._loaded or current == self._saved:
            return
        try:
            await self.ledger.save(*current)
            self._saved = (dict(self._progress), dict(self._host_starts))
        except Exception as e:
            log.warning("could not save the take-over clocks: %r", e)

    async def select_round(self) -> Selection:
        """Poll every host and choose this round's collections."""
        members = self.members
        if self.liveness is not None:
            await self.liveness.beat()
            members = await self.liveness.members(self.configured) or [self.member_id]
        await self._load_progress()
        polled = await poll_hosts(
            self.sources, min_records=self.min_records, limit=self.dirty_limit
        )
        stalled_s = self._watch(polled.candidates, failed=polled.failed_hosts)
        await self._save_progress()
        sel = select(
            polled.candidates,
            member_id=self.member_id,
            members=members,
            budget_records=self.budget_records,
            min_records=self.min_records,
            stalled_s=stalled_s,
            takeover_s=self.takeover_s,
        )
        if sel.taken_over:
            log.warning(
                "taking over %d collection(s) whose owner made no progress for %ss",
                sel.taken_over,
                self.takeover_s,
            )
        return Selection(
            selected=sel.selected,
            merged=sel.merged,
            not_ours=sel.not_ours,
            over_budget=sel.over_budget,
            failed_hosts=polled.failed_hosts,
            taken_over=sel.taken_over,
            members=sel.members,
        )
