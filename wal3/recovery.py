"""``Recovery``: what the writer does when a manifest write fails and was not merely rebased.

Fencing and recovery: a failed condition means someone else touched the log.  If nobody appended
(garbage collection, a snapshot, a seal by another process) the manifest write is rebased and
retried.  Otherwise the writer pauses, lets in-flight uploads settle, reloads the manifest, links
any orphan fragment that fits at the tail (read repair, so a crashed writer never wedges the log),
acknowledges its own fragments that turn out linked, and fails the rest with ``LogContention``.
Every fragment records the setsum of the fragment it must follow, so a stale speculative upload
can never be linked after someone else's fragment; such dead objects are overwritten in place.

"Fails the rest" in detail (``Recovery.recover``): a batch that still continues the log exactly
keeps its bytes and retries only what it lacks; the appends of one that can never be linked are
retried, or failed: ``LogContention`` only when another writer appended, else
``StoreUnavailable`` once out of attempts.  The rebase is the committer's (``committer.py``).

Whose a linked fragment is, is judged by its bytes (their MD5, or setsum): recovery keeps what
this writer encoded lately, never a name in a footer, which two processes may share.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from dataclasses import dataclass

from .appends import Append, Batch, FragmentHook, FragmentInfo
from .batcher import Batcher
from .committer import Committer
from .errors import (
    CorruptFragment,
    LogContention,
    LogFull,
    LogSealed,
    ObjectNotFound,
    PreconditionFailed,
    ProcessDeath,
    StoreUnavailable,
    WriterClosed,
)
from .fragment import decode_fragment
from .idempotency import KeyWindow
from .lease import Lease
from .manifest import FragmentPointer, Manifest, ensure_room
from .options import LogWriterOptions
from .paths import fragment_path, join
from .reader import Limits, SnapshotCache, resolve_fragments, tail_fragments
from .setsum import Setsum
from .store import ObjectStore, ResolvedPreconditionFailed, content_etag, etag_matches_content

_log = logging.getLogger("wal3.writer")  # one logger for every part of the writer


@dataclass(frozen=True, slots=True)
class _Repaired:
    """What a read repair left: the stored manifest and its etag, whether another writer linked
    the fragment it was linking (a live writer), whether it linked bytes this writer did not
    encode (others' orphans), and whether its claim of the log, or the link after it, lost to an
    edit that linked nothing (a collector's, during the fence): a rebase, not a failed try."""

    manifest: Manifest
    etag: str
    met_writer: bool
    linked_others: bool
    raced: bool = False


class Recovery:
    """Recovery and read repair, and what they need to remember: whether one is running, whether
    the writer lost track of the store, why repair last stopped early, and which bytes this
    writer encoded."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions,
        hook: FragmentHook | None,
        stats: collections.Counter[str],
        lease: Lease,
        batcher: Batcher,
        keys: KeyWindow,
        committer: Committer,
    ) -> None:
        self._store = store
        self._prefix = prefix
        self._opts = options
        self._hook = hook
        self._stats = stats
        self._lease = lease
        self._batcher = batcher
        self._keys = keys
        self._committer = committer
        self._loop = asyncio.get_running_loop()
        self._recovering = False
        self._stale = False  # the last recovery could not reload the manifest
        self._repair_blocked: Exception | None = None  # why read repair last stopped early
        self._raced_rounds = 0  # recoveries in a row whose repair lost its claim to an edit
        # seq -> setsum of every fragment this writer encoded lately: what is not in here and got
        # linked was appended by someone else (contention), not by our own earlier attempts.
        self._mine: collections.OrderedDict[int, tuple[str, Setsum]] = collections.OrderedDict()
        # MD5 of every fragment this writer encoded lately, earlier attempts at a slot included
        # (``_mine`` keeps only the latest per slot): bytes repair links that are not in here
        # are someone else's, whatever name their footer carries.
        self._encoded: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._snapshots = SnapshotCache(16)

    @property
    def recovering(self) -> bool:
        """A recovery is running (nothing new is cut meanwhile)."""
        return self._recovering

    @property
    def stale(self) -> bool:
        """The last recovery could not reload the manifest: reload before writing again."""
        return self._stale

    def note_encoded(self, seq_no: int, md5: str, setsum: Setsum) -> None:
        """This writer encoded a fragment for ``seq_no`` with these bytes."""
        self._mine[seq_no] = (md5, setsum)
        self._mine.move_to_end(seq_no)
        while len(self._mine) > 4 * self._opts.idempotency.window_fragments:
            self._mine.popitem(last=False)
        self._encoded[md5] = None
        while len(self._encoded) > 4 * self._opts.idempotency.window_fragments:
            self._encoded.popitem(last=False)

    # ----------------------------------------------------------------------------- recovery

    async def recover(
        self, reloaded: tuple[Manifest, str] | None = None, *, link_others: bool = True
    ) -> None:
        """Settle in-flight work, reload, read-repair, and decide every batch's fate.

        ``link_others`` False: the repair links nothing on a manifest another writer holds.  For
        a writer with nothing to append whose edit lost (the collector of a host that does not
        hold the log): the orphan is most likely the holder's next fragment, and linking it
        (after a claim, or under our name and lease where the holder records none) would make
        the holder's next write a take-over, fenced, for nothing this writer needs (the
        simulator's edit-only phase, seed 135).  The writer that appends next repairs it.

        A batch that is not linked either still continues the log exactly (its sequence number,
        start and predecessor match the reloaded tail): it keeps its bytes and only its missing
        upload or hook is retried, since those bytes may be in the store already and get linked
        by anyone's read repair.  Or it can never be linked (its slot is taken, or what it
        follows was not linked): then, and only then, its appends are free to be written anew,
        and "not written" (``LogContention``) is a true answer.
        """
        batcher, keys = self._batcher, self._keys
        self._recovering = True
        self._stats["recoveries"] += 1
        try:
            inflight = batcher.in_flight
            tasks = [b.task for b in inflight.values() if b.task is not None]
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
            base = self._committer.manifest
            causes = [b.error for b in inflight.values() if b.error is not None]
            if any(isinstance(c, StoreUnavailable) for c in causes):
                await asyncio.sleep(0.05)  # let a struggling store breathe before re-reading
            try:
                if reloaded is None:
                    reloaded = await self._lease.load()
                    if reloaded is None:
                        raise WriterClosed(f"manifest of {self._prefix} vanished")
                repaired = await self._repair(*reloaded, link_others=link_others)
                manifest, etag = repaired.manifest, repaired.etag
                linked: list[Batch] = []
                unsure: list[Batch] = []
                for b in inflight.values():
                    mine = await self._linked_as_ours(manifest, b)
                    if mine:
                        linked.append(b)
                    elif mine is None:
                        unsure.append(b)
                # Contention means another writer committed.  What we encoded ourselves, linked
                # by us or by anyone's read repair, is not contention.
                foreign = await self._foreign(reloaded[0], base)
                # Keys are learned from everything linked that this recovery does not acknowledge,
                # our own earlier attempts included (answered "maybe", then repaired), by path:
                # garbage collection may have unlinked them already.
                acked = {b.seq_no for b in linked}
                learned = [
                    s for s in range(base.next_seq_no, manifest.next_seq_no) if s not in acked
                ]
            except (StoreUnavailable, OSError) as e:
                self.go_stale(e)
                return
            self._stale = False
            self._committer.installed(manifest, etag, linked)
            for b in unsure:
                # Linked once and collected since, but its object is gone: we cannot tell whose.
                batcher.drop(b.seq_no)
                for a in b.appends:
                    batcher.reject(
                        a,
                        StoreUnavailable(
                            f"fragment {b.seq_no} of {self._prefix} may have been written"
                        ),
                    )
            leftovers = batcher.take_in_flight()
            # A recovery that moved the log on frees a retry, unless others moved it.  A writer
            # that linked what our repair was linking is alive: that costs an attempt.  Orphans
            # of others that our repair linked are free ``max_append_attempts`` times per
            # append: a dead writer's backlog is one pipeline deep (a few rounds when cut at
            # max_rebases), while a writer that keeps its fragments ahead of every retry would
            # be chased for as long as it writes; after that, each such round costs an attempt.
            moved = manifest.next_seq_no > base.next_seq_no
            met, linked_others = repaired.met_writer, repaired.linked_others
            # A repair whose claim (or the link after its fence) lost to an edit that linked
            # nothing was rebased, not refused: it costs no attempt, ``max_append_attempts``
            # times in a row (each such round waits out a whole fence, so the bound is counted
            # in rounds, not in the committer's cheap rebases).  A collector editing within every
            # fence would otherwise fail appends long after every fault (the simulator's seeds
            # 50465, 57203).  Past that, every race in the row is charged, and to the head kept
            # batch even when its upload settled: it waits on nothing else, and a collector
            # that edits for ever would hold it for ever (found by the adversary of this fix).
            # A round that linked something moved on: it is no race, whatever ended it.
            raced = repaired.raced and not moved
            free_race = raced and self._raced_rounds < self._opts.retry.max_append_attempts
            self._raced_rounds = self._raced_rounds + 1 if raced else 0
            batcher.forget_dead_below(manifest.next_seq_no)
            # Learn the keys of fragments others linked before deciding anything: a keyed append
            # whose key is in the log already is answered from there, never "not written".  Also
            # while the first load is still running (it started from an older manifest).
            keys.unlearned(learned)
            keys_known = True
            if keys.loaded and learned:
                try:
                    await keys.learn()
                except (StoreUnavailable, OSError) as e:
                    keys_known = False
                    # Until these footers are read, a queued keyed append might duplicate one.
                    why = f"store unavailable: {e}"
                    batcher.reject_queued_keyed(lambda: StoreUnavailable(why))
            keep, free = self._sort_leftovers(manifest, leftovers)
            retry: list[Append] = []
            for b in free:
                for a in b.appends:
                    known = keys.known(a.key) if a.key is not None else None
                    if known is not None:
                        batcher.resolve(a, known.as_duplicate(), None)
                        continue
                    if met:
                        a.met_writer = True
                        a.attempts += 1
                    elif moved and linked_others:
                        a.others_rounds += 1
                        if a.others_rounds > self._opts.retry.max_append_attempts:
                            a.attempts += 1
                    elif not moved and not free_race:
                        a.attempts += 1
                    if manifest.sealed:
                        batcher.reject(a, LogSealed(f"log {self._prefix} is sealed"))
                    elif a.key is not None and not keys_known:
                        batcher.reject(
                            a,
                            StoreUnavailable(
                                f"could not read what another writer appended to {self._prefix}"
                            ),
                        )
                    elif foreign:
                        self._stats["contention"] += 1
                        batcher.reject(
                            a,
                            LogContention(
                                f"another writer appended to {self._prefix}; not written"
                            ),
                        )
                    elif a.attempts >= self._opts.retry.max_append_attempts:
                        # Contention only when a writer was met (it linked a slot itself).
                        # Orphans our own repair kept linking ahead of us may be a dead
                        # writer's backlog met under hook failures: "another writer appended"
                        # would be false there (the simulator's seeds 27714, 40459, 44594).
                        batcher.reject(
                            a,
                            LogContention(
                                f"another writer kept appending to {self._prefix}; not written"
                            )
                            if a.met_writer
                            else self._give_up_error(b, a.others_rounds),
                        )
                    else:
                        retry.append(a)
            keep = self._retry_kept(keep, charge=not free_race, settled_too=raced, met=met)
            # Retried appends go first so the log keeps their order.
            batcher.requeue(retry)
            if keep:
                batcher.continue_after(keep[-1])
            else:
                batcher.restart_at(manifest)
            if manifest.sealed:
                batcher.fail_sealed()
        finally:
            self._recovering = False
        batcher.kick()

    def _sort_leftovers(
        self, manifest: Manifest, leftovers: list[Batch]
    ) -> tuple[list[Batch], list[Batch]]:
        """Split unlinked batches into those that still continue ``manifest`` exactly (kept, bytes
        unchanged) and those that can never be linked (free: their appends may go elsewhere)."""
        seq, off, prev = manifest.next_seq_no, manifest.next_offset, manifest.tail_setsum
        chain = not manifest.sealed
        keep: list[Batch] = []
        free: list[Batch] = []
        for b in leftovers:
            if (
                chain
                and b.frag is not None
                and b.seq_no == seq
                and b.start == off
                and b.prev_setsum == prev
            ):
                keep.append(b)
                seq, off, prev = seq + 1, b.frag.limit, b.frag.setsum
                continue
            chain = False
            free.append(b)
            if b.frag is not None and b.seq_no >= manifest.next_seq_no and b.upload != "absent":
                # Our own object there can never be linked (what it follows was not): overwrite
                # it in place.  If-Match on our bytes' etag: if someone replaced it, we lose.
                self._batcher.mark_dead(b.seq_no, content_etag(b.frag.data))
        return keep, free

    def _retry_kept(
        self,
        keep: list[Batch],
        charge: bool = True,
        settled_too: bool = False,
        met: bool = False,
    ) -> list[Batch]:
        """Put kept batches back in flight; those missing their upload or hook retry just that.

        The first unsettled one (the first one at all when ``settled_too``: the round's repair
        lost its claim, which is what stalls even a settled batch) is charged an attempt, unless
        ``charge`` is False (the round was a free rebase).  A batch out of attempts gives up with
        an ambiguous error (its bytes may be in the store and a later read repair may still link
        them), and so do the kept batches after it.  Unless its last upload found other bytes in
        its slot (``absent``): then its bytes are in no slot and never will be (only its own
        retries could put them there, and it retries no more), and each kept batch after it
        follows its setsum, so none of them can ever be linked: "not written", and
        ``LogContention`` when a writer was met (``met``: this round, or by one of its
        appends)."""
        batcher = self._batcher
        head = True
        for i, b in enumerate(keep):
            if b.settled and not (settled_too and head):
                b.error = None
                continue
            if not head:
                continue  # only the head batch is what stalls the log: charge it alone
            head = False
            if charge:
                b.attempts += 1
            if b.attempts >= self._opts.retry.max_append_attempts:
                cause = self._repair_blocked or b.error
                err: Exception
                if b.upload == "absent":
                    if met or any(a.met_writer for a in b.appends):
                        err = LogContention(
                            f"another writer's fragment holds slot {b.seq_no} of "
                            f"{self._prefix}; not written"
                        )
                    else:
                        err = StoreUnavailable(
                            f"{self._prefix}: not written: slot {b.seq_no} holds another "
                            f"fragment ({cause!r})"
                        )
                else:
                    err = StoreUnavailable(
                        f"fragment {b.seq_no} of {self._prefix} could not be linked "
                        f"({cause!r}); it may still appear"
                    )
                for gone in keep[i:]:
                    for a in gone.appends:
                        batcher.reject(a, err)
                keep = keep[:i]
                break
        for b in keep:
            batcher.put_back(b)
            if not b.settled:
                b.done, b.error = False, None
                # Read repair may have found a dead object in this batch's slot: replace it.
                b.overwrite_etag = batcher.take_dead(b.seq_no, b.overwrite_etag)
                delay = min(1.0, 0.02 * 2**b.attempts)
                batcher.retry(b, delay)
        return keep

    def progressed(self) -> None:
        """The committer linked batches of ours: a row of raced recoveries is broken."""
        self._raced_rounds = 0

    def go_stale(self, err: BaseException) -> None:
        """The store failed mid-commit: we cannot tell what is linked, so nothing in flight may be
        acknowledged.  Fail it (a retry with an idempotency key is safe) and reload first next
        time."""
        _log.warning("writer for %s lost track of the manifest: %r", self._prefix, err)
        self._stats["stale"] += 1
        self._batcher.reject_in_flight(lambda: StoreUnavailable(f"store unavailable: {err}"))
        self._committer.fail_edits(lambda: StoreUnavailable(f"store unavailable: {err}"))
        self._stale = True
        self._recovering = False
        self._loop.call_later(0.1, self._committer.wake)

    def _give_up_error(self, b: Batch, others_rounds: int = 0) -> BaseException:
        """Why a batch that can never be linked ran out of attempts: not written, and not
        contention (that is said only when another writer appended)."""
        if others_rounds > self._opts.retry.max_append_attempts:
            return StoreUnavailable(
                f"{self._prefix}: not written: others' orphan fragments took its slot "
                f"{others_rounds} times"
            )
        cause = self._repair_blocked if self._repair_blocked is not None else b.error
        return StoreUnavailable(
            f"{self._prefix}: not written after "
            f"{self._opts.retry.max_append_attempts} attempts ({cause!r})"
        )

    # --------------------------------------------------------------------- whose it is

    async def _since(self, manifest: Manifest, base: Manifest) -> list[FragmentPointer]:
        """Fragments ``manifest`` links beyond ``base``'s tail."""
        n = manifest.next_seq_no - base.next_seq_no
        if n <= 0:
            return []
        return await tail_fragments(self._store, self._prefix, manifest.entries, n, self._snapshots)

    def _is_ours(self, p: FragmentPointer) -> bool:
        """Whether a linked pointer names the fragment this writer encoded for its slot."""
        mine = self._mine.get(p.seq_no)
        if mine is None:
            return False
        md5, setsum = mine
        return p.content_md5 == md5 if p.content_md5 is not None else p.setsum == setsum

    async def _linked_as_ours(self, manifest: Manifest, b: Batch) -> bool | None:
        """Whether ``manifest`` linked this batch's very fragment (even folded into a snapshot, or
        collected since); None when that cannot be told any more."""
        frag = b.frag
        if frag is None or b.upload not in ("ok", "unknown") or b.seq_no >= manifest.next_seq_no:
            return False  # our bytes never reached the store, or the slot is not linked yet
        if frag.start >= manifest.oldest_offset:
            for p in reversed(manifest.fragments):
                if p.seq_no == b.seq_no:
                    return p.path == frag.path and self._is_ours(p)
            found = await resolve_fragments(
                self._store,
                self._prefix,
                manifest.snapshots,
                frag.start,
                Limits(max_files=1),
                self._snapshots,
            )
            return bool(found) and found[0].path == frag.path and self._is_ours(found[0])
        # Linked once and collected since (every slot below the tail was linked once, and its
        # object is never rewritten): the object tells whose it was, while GC keeps it.
        try:
            held = await self._store.head(join(self._prefix, frag.path))
        except ObjectNotFound:
            return None
        return etag_matches_content(held.etag, frag.data)

    async def _foreign(self, manifest: Manifest, base: Manifest) -> bool:
        """Whether someone else linked a fragment between ``base`` and ``manifest``."""
        first, end = base.next_seq_no, manifest.next_seq_no
        if end <= first:
            return False
        visible = {p.seq_no: p for p in await self._since(manifest, base)}
        for seq in range(first, end):
            p = visible.get(seq)
            if p is not None:
                if not self._is_ours(p):
                    return True
                continue
            mine = self._mine.get(seq)
            if mine is None:
                return True
            try:  # collected already: the object tells whose it was
                held = await self._store.head(join(self._prefix, fragment_path(seq)))
            except ObjectNotFound:
                return True
            if held.etag.strip('"') != mine[0]:
                return True
        return False

    # -------------------------------------------------------------------------- read repair

    async def _repair(self, manifest: Manifest, etag: str, *, link_others: bool) -> _Repaired:
        """Link the orphan fragments that follow the tail exactly (zero-action recovery).

        Orphans are what a writer left between its upload and its manifest write.  A live
        writer always has one there while it appends, so repair must not chase it: once another
        writer links the fragment being repaired, it is alive and links its own (stop), and no
        repair links more than ``max_rebases`` fragments (the next recovery goes on).  Either
        way the tail returned is a stored manifest, which is all recovery needs.
        """
        self._repair_blocked = None
        met_writer = linked_others = raced = False
        for _ in range(self._opts.retry.max_rebases):
            if manifest.sealed:
                break
            if not link_others and self._lease.others(manifest, etag):
                break
            seq = manifest.next_seq_no
            key = join(self._prefix, fragment_path(seq))
            try:
                got = await self._store.get(key)
            except ObjectNotFound:
                break
            try:
                decoded = await asyncio.to_thread(decode_fragment, got.data)
            except CorruptFragment:
                self._batcher.mark_dead(seq, got.etag)
                break
            # It must follow the tail exactly.  A fragment without ``wal3.prev`` (another
            # implementation's) is placed by position alone; with one, an empty root (a new log)
            # is followed only by a fragment that follows nothing.
            fits = decoded.start == manifest.next_offset and (
                decoded.prev is None or decoded.prev == manifest.tail_setsum
            )
            if not fits:
                # It follows a fragment that was never linked: nobody can ever link it.
                self._batcher.mark_dead(seq, got.etag)
                break
            try:
                ensure_room(seq, decoded.start, len(decoded.records))
            except LogFull:
                self._batcher.mark_dead(seq, got.etag)  # past u64::MAX: it can never be linked
                break
            ts = decoded.records[0].timestamp_us
            if self._hook is not None:
                try:
                    await self._hook(
                        FragmentInfo(seq, decoded.start, len(decoded.records), ts, True)
                    )
                except (ProcessDeath, asyncio.CancelledError):
                    raise
                except Exception as e:
                    _log.warning("hook failed repairing %s of %s: %r", seq, self._prefix, e)
                    self._repair_blocked = e
                    break
            pointer = FragmentPointer(
                fragment_path(seq),
                seq,
                decoded.start,
                decoded.limit,
                len(got.data),
                decoded.setsum,
                content_etag(got.data),
            )
            claimed = False
            claimed_from = manifest.lease_holder  # whose lease the log stood under
            try:
                if self._lease.takes_over(manifest, etag):
                    # Linked only on our own manifest, once fenced (the lease's "Claim"): the
                    # orphan's records must not show while an old holder's lease may answer.
                    await self._lease.yielded()
                    claimed = True
                    manifest, etag = await self._lease.claim(manifest, etag)
                await self._lease.wait_fence()
                new = self._lease.stamped(
                    manifest.with_fragments([pointer], self._opts.writer_name), manifest, etag
                )
                base_etag, issued = etag, self._opts.clock.monotonic()
                etag = await self._lease.put(new, base_etag, manifest)
                self._lease.landed(base_etag, etag, issued, manifest)
                manifest = new
                self._stats["repaired"] += 1
                linked_others = linked_others or pointer.content_md5 not in self._encoded
                _log.info("read-repaired fragment %s of %s", seq, self._prefix)
            except PreconditionFailed as e:
                loaded = await self._lease.load()
                if loaded is None:
                    raise WriterClosed(f"manifest of {self._prefix} vanished") from None
                self._lease.lost_to(loaded[0], loaded[1], manifest)
                manifest, etag = loaded
                if claimed:
                    # One claim (and its waits) per repair: recovery walks the manifest it
                    # loaded first, which must stay well within the collector's grace.  Lost to
                    # an edit that left the tail where it was and leases nothing (it carried
                    # over the holder we claimed from, or our claim's): a collector's race, and
                    # the next recovery claims again.  Lost to another writer's claim (a holder
                    # of its own) it is no race but a writer alive, charged as a round that
                    # moved nothing (not contention: that writer appended nothing yet).  The
                    # adversary of 741b3dd saw such rounds counted as free races end in "may
                    # still appear" for batches whose slot that writer's orphan held.
                    edited = manifest.lease_holder in (claimed_from, self._lease.holder)
                    raced = manifest.next_seq_no == seq and not manifest.sealed and edited
                    if raced:
                        self._repair_blocked = e  # what a batch out of attempts then names
                    break
                if manifest.next_seq_no > seq:
                    # Linked: by a live writer (its next fragments are its own to link), or by
                    # our own put whose answer was lost before someone else's edit (then we
                    # cannot say a writer was met: no contention is claimed on it).
                    met_writer = not isinstance(e, ResolvedPreconditionFailed)
                    break
        return _Repaired(manifest, etag, met_writer, linked_others, raced)
