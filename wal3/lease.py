"""``Lease``: the writer's reads and writes of its manifest, and the read lease and the fence they
prove.

Every load and every put of the manifest by the writer goes through here, so the lease knows of
each one: a put it issued is counted while in flight (a lease-renewing HEAD overlapping it may see
our own next manifest), a write that landed on a base this writer did not write raises the fence,
and so does a load that shows someone else's manifest.

Read leases (``read_lease_s`` > 0): when may a reader answer from this writer's in-memory
manifest instead of loading the stored one?  Another process may have written the log (a second
writer is fenced, not prevented: the leader hint is advisory and may be wrong in any way), and
an answer must never miss a record that was acknowledged before it was asked for.  The store's
conditional writes are the only fence, so the rule is built on them and on monotonic clocks:

* **Lease.**  ``current_manifest()`` is the manifest in memory only if this writer wrote it itself
  (its etag is one our own put returned) and a store interaction *issued* less than
  ``read_lease_s`` ago proved it was still the stored one: our write (issued at ``i``, so the
  manifest was ours at some moment after ``i``) or a HEAD that found its etag
  (``confirm_lease``), and none of our manifest puts is in flight (one may have landed, its
  answer not back, so a reader of the store may already see more: ``leased_manifest`` waits
  for the answer).  A HEAD that finds another etag while one of our own manifest puts is
  in flight (or was issued during the HEAD) gives no lease but keeps authorship: the etag may be
  our own next manifest, its answer not back yet, and dropping authorship would make that write
  look like a take-over (the writer fencing itself).  If it is another writer's, our put's
  If-Match fails and recovery loads and fences it.  The manifest is read before the clock is, so
  a pause in between can only shorten the lease.  A manifest this writer merely loaded is never leased: its author may still
  write on top of it without fencing (its base is its own), and we would not know.  Etags are
  content hashes (S3, the local store), so "an etag our put returned" names our bytes only if no
  other writer can write byte-identical ones: every manifest names its writer, and writer names
  must be unique per process (the log host's are).
* **Fence.**  A writer whose manifest write lands on a base it did not write (a take-over: it
  loaded that base, so another writer may hold a lease on it) acknowledges nothing until
  ``1.25 x`` *the base's lease* after that write's answer arrived.  Likewise after every load
  that shows a manifest it did not write: what it then learns (idempotency keys of others'
  appends) is not answered before the fence either.
* **Claim.**  A take-over write links no record (``claim``: the base as it is, under this
  writer's name), and no write links records before the fence has passed (the committer's
  appends and recovery's read repair alike).  So no record becomes visible in the store while
  anyone's lease may still vouch for a manifest without it: reads are monotonic across hosts
  (a record one read returned, from a store load or a lease, every later read returns), not
  merely never missing an acknowledged one.  Linking at the take-over itself would let a host
  that loads the manifest show the record while the old holder's lease still answers without it.
* **Collectors' edits.**  A manifest edit that links nothing and leases nothing (garbage
  collection's announce, cut and clear, a pin's retraction, a seal by a tool) is no take-over
  when it edited a manifest of this writer's own: nobody but this writer can hold a lease in
  the chain since its last write, and the edit shows no record it did not know.  So the writer
  rebases onto it with no claim and no fence.  How it knows: every put of a writer records its
  holder token (``lease_holder``, unique to one writer's life; Rust ignores and drops the
  field), and such an edit carries the field over unchanged.  A manifest whose holder is
  another writer's, or unknown (Rust, an older version), is a take-over as before.  Without
  this, a collector editing a busy log more often than the fence made every commit a claim and
  a whole fence (the adversarial review of 741b3dd: a first append answered after 1,083
  virtual seconds under a collector editing every second), and every standalone collector's
  cut cost the writer a fence.  A writer's own edit that links nothing on a manifest it does
  not hold (the collector of a host that does not hold the log runs through that host's
  writer, during a leader split) is written the same way (``as_collector``): the holder's
  token and recorded lease stay, and the editing writer gains no authorship, so its own
  appends still claim the log first.  Written under its name, the edit would look to the
  holder like a rival's claim (``lost_to``), and the holder would leave its log alone for a
  fence that protects nothing, then claim it back and fence again (the adversarial review of
  b755610: 2.5 x lease per edit).  Nor does such a writer, its edit lost to a moved tail, link
  the holder's next fragment by read repair (``recover(link_others=False)``).
* **Whose lease.**  Every manifest this writer puts records its ``read_lease_s`` (the
  ``read_lease_ms`` field, which Rust ignores), a writer never leases a manifest for longer than
  it records (one without the field is not leased at all), and the fence is for the lease
  recorded in the base, never for the taker's own setting.  So writers configured differently
  (a rolling change of the setting, a host at 0) stay safe: the bound a holder's lease obeys is
  written next to the manifest it vouches for, by the holder.  (One fixed cluster-wide fence
  would also be safe, but would make every take-over pay the largest lease anyone may ever
  configure, and a host at 0 would still have to know it.)  A base without the field (Rust,
  a version of this writer before the field) is the exception: a writer that drops the field
  may have written it over a leased manifest, erasing the only record of that lease, so it is
  fenced for ``unrecorded_lease_s``, the longest lease any writer of the log may hold (the
  host's ``LOGHOST_READ_LEASE_MAX_MS``), or without one for this writer's own setting.  The fence a writer raised outlives it: ``open(authored=...)`` hands it to the next
  writer of the log in this process, whatever that one finds stored.

Why no stale read, case by case (H leases manifest M, another writer G acknowledges X):

1. G takes over M: its claim lands on M and links nothing, and X is linked only after the
   claim's fence.  H's last proof of M was issued before the claim landed (after it, the store
   held G's manifest and the proof would have failed), so H's lease ends before landing +
   ``read_lease_s``; G links X, and so acknowledges it, no sooner than landing + ``fence_s``
   (G's clock, measured from when it learned of the landing, later still).  Any read that can
   see X, and any read asked after the acknowledgement, finds H's lease over; H's HEAD then sees
   G's etag, and the read loads the stored manifest (X included).  The 25 % covers clock-rate
   differences.
2. G's write lands on a manifest G wrote itself.  Nobody else can lease it (only its author
   leases), so nobody answers from an older one: M was replaced by G's earlier take-over write,
   and G links records only once that write's fence has passed, as in 1.
3. H crashes, stalls, is suspended or is cut off from Redis: its lease only runs out; it never
   extends without a store round trip, so a stalled H that wakes up re-proves before it answers
   (``Clock.monotonic`` counts suspended time, so a suspend cannot stretch a lease).
4. X reached H through a load (H's recovery read it, or learned its key): H's answers based on
   that load wait for its own fence, which ends after G's (H loaded after X landed).
5. Redis restarts empty, stalls, fails over, or names two holders: nothing above reads it.

Costs: one HEAD per ``read_lease_s`` per log read from memory without being written (own writes
renew the lease for free), and after a take-over (a fail-over, a restart, a split between
hosts) one manifest write more (the claim) and a ``fence_s`` wait before the first records are
linked and acknowledged, never in the steady state.  With
``read_lease_s`` = 0 nothing is leased and nothing waits: every read loads the manifest.
"""

from __future__ import annotations

import asyncio
import math
import secrets
from collections.abc import Callable
from dataclasses import replace

from .errors import ObjectNotFound, StoreUnavailable
from .layout import load_manifest
from .manifest import Manifest
from .options import FENCE_FACTOR, LogWriterOptions
from .paths import MANIFEST_PATH, join
from .store import ObjectStore, put_resolving


def lease_ms(read_lease_s: float) -> int:
    """A lease in seconds as a manifest records it (``read_lease_ms``)."""
    return max(0, round(read_lease_s * 1000))


def _claims(current: Manifest, base: Manifest) -> bool:
    """Whether ``current`` is another writer's claim of ``base``: ``base`` the same but for its
    writer, lease and holder, or a claim of what a collector made of ``base`` meanwhile (an
    edit that links nothing carries ``base``'s holder over; a claim of it, or an edit of that
    claim, is under a holder of its own and ends at ``base``'s tail).  A rival claims what it
    loaded, and under a busy collector that is rarely our exact base: the adversary of a1babb8
    saw two writers claim the log back from each other after every collector edit."""
    same = replace(
        current,
        writer=base.writer,
        read_lease_ms=base.read_lease_ms,
        lease_holder=base.lease_holder,
    )
    if same == base:
        return True
    return (
        current.lease_holder is not None
        and current.lease_holder != base.lease_holder
        and current.same_tail(base)
    )


def new_holder() -> str:
    """A fresh holder token (``lease_holder``): 16 hex digits, unique to one writer's life."""
    return secrets.token_hex(8)


def bare_etag(etag: str) -> str:
    """An etag without the quotes S3 puts around it (callers may see either form)."""
    return etag.strip('"')


class Lease:
    """The writer's path to its stored manifest and what that path proves: which manifest this
    writer wrote (authorship), since when it is known to be the stored one (the lease), and
    before when nothing may be acknowledged (the fence)."""

    def __init__(
        self,
        store: ObjectStore,
        prefix: str,
        options: LogWriterOptions,
        held: Callable[[], tuple[Manifest, str]],
        healthy: Callable[[], bool],
        holder: str | None = None,
    ) -> None:
        """``held`` gives the manifest the writer holds in memory and its etag (what a lease
        vouches for); ``healthy`` whether the writer may vouch for it at all (not failed, not
        recovering, not lost track of the store); ``holder`` the token its manifests record
        (``new_holder()``, made here when not given)."""
        self._store = store
        self._prefix = prefix
        self._opts = options
        self._held = held
        self._healthy = healthy
        # This writer's holder token: every manifest it puts records it (``lease_holder``).
        # Unique to this object, not to the writer's name (names may be shared across processes
        # and are reused by the next writer of a log in this process).
        self._holder = holder if holder is not None else new_holder()
        # The etag of the newest manifest this writer put, when the latest proof that the stored
        # manifest was ours was issued, and the time before which nothing is acknowledged.
        self._authored: str | None = None
        self._lease_from: float | None = None
        self._fence_until = float("-inf")
        # Whether this writer ever held the log (a write of ours landed, or it adopted its own),
        # and before when it leaves a rival's claim alone (``lost_to``).
        self._held_once = False
        self._yield_until = float("-inf")
        self._confirming: asyncio.Task[bool] | None = None
        # Our manifest puts: in flight now, and issued ever.  A lease-renewing HEAD overlapping
        # one may see our own next manifest before its answer reaches us (``confirm``).
        self._puts_in_flight = 0
        self._puts_issued = 0
        self._no_put = asyncio.Event()  # set while no put of ours is in flight (``settled``)
        self._no_put.set()

    # ------------------------------------------------------------------------------ the store

    async def load(self) -> tuple[Manifest, str] | None:
        """Load the stored manifest (what it shows of others waits for the fence)."""
        loaded = await load_manifest(self._store, self._prefix)
        if loaded is not None:
            self.note_load(*loaded)
        return loaded

    async def put(self, new: Manifest, base_etag: str, base: Manifest | None = None) -> str:
        """Put ``new`` over ``base_etag`` (stored as ``base``; None: not known), counted in flight
        for ``confirm``.

        A take-over put that raises may have landed all the same (its answer lost, or the
        read-back found a collector's edit of it), recording our holder token: so the fence
        for ``base``'s lease is raised now, as ``landed`` would have, or a later load of it
        (``holds``: ours) would skip the fence and link at once while the old holder's lease
        still answers (the adversarial review of 53ad3c8, finding 1).  Now is no earlier than
        the landing, so the fence is no shorter than one measured from the answer."""
        self._puts_in_flight += 1
        self._puts_issued += 1
        self._no_put.clear()
        try:
            return await put_resolving(
                self._store, join(self._prefix, MANIFEST_PATH), new.to_bytes(), if_match=base_etag
            )
        except BaseException:
            # It may have landed (an answer lost, resolved or not) and been built on: the store
            # may show what the memory lacks.  No vouching until a write or a HEAD proves again.
            self._lease_from = None
            if not self.authored(base_etag) and not (base is not None and self.holds(base)):
                self._raise_fence(base)
            raise
        finally:
            self._puts_in_flight -= 1
            if not self._puts_in_flight:
                self._no_put.set()

    async def settled(self) -> None:
        """Return once every manifest put of ours in flight now has been answered (``remaining``
        vouches for nothing while one is)."""
        if self._puts_in_flight:
            await self._no_put.wait()

    def takes_over(self, base: Manifest, base_etag: str) -> bool:
        """Whether a write on ``base`` takes the log over from a writer that may still answer
        reads from it under a lease (it is another's, and its author's lease is not 0)."""
        return self.others(base, base_etag) and self._base_lease_s(base) > 0

    def others(self, manifest: Manifest, etag: str) -> bool:
        """Whether ``manifest`` (stored as ``etag``) stands under another writer's name: not
        ours, nor an edit of ours that leases nothing (``holds``)."""
        return not self.authored(etag) and not self.holds(manifest)

    def holds(self, manifest: Manifest) -> bool:
        """Whether ``manifest`` stands under this writer's lease: written by this writer, or an
        edit of that which links and leases nothing (a collector's), carried over."""
        return manifest.lease_holder is not None and manifest.lease_holder == self._holder

    @property
    def holder(self) -> str:
        """This writer's holder token (what its manifests record as ``lease_holder``)."""
        return self._holder

    async def claim(self, base: Manifest, base_etag: str) -> tuple[Manifest, str]:
        """Take the log over with a write of ``base`` that links nothing (the fence starts when
        it lands); PreconditionFailed if someone wrote the log meanwhile."""
        new = self.stamped(base, base, base_etag)
        new.check()
        issued = self._opts.clock.monotonic()
        etag = await self.put(new, base_etag, base)
        self.landed(base_etag, etag, issued, base)
        return new, etag

    def stamped(
        self, new: Manifest, base: Manifest | None = None, base_etag: str | None = None
    ) -> Manifest:
        """``new`` as this writer puts it (on ``base``, stored as ``base_etag``), under this
        writer's name, recording the lease a taker of it must fence for.

        That is this writer's own lease, and also, for as long as any older lease may still
        vouch for a manifest before ours, that lease: the base's when this write takes the log
        over (its fence only starts when the write lands), and while this writer fences, the
        lease that what is left of the fence stands for (which covers an inherited fence too,
        whose lease the reopened writer does not know).  Else a writer taking over from us would fence for our shorter lease (or
        none: a host at 0) while the older holder still answers reads.  The name also makes a
        write that changes nothing else (an identity edit, a claim) differ from another
        writer's manifest: the same bytes would keep their etag, and the old holder's HEADs
        would go on renewing its lease over our take-over."""
        ms = lease_ms(self._opts.lease.read_lease_s)
        if base is not None and base_etag is not None and not self.authored(base_etag):
            ms = max(ms, lease_ms(self._base_lease_s(base)))
        left = self._fence_until - self._opts.clock.monotonic()
        if left > 0:
            # A taker fences FENCE_FACTOR x this from its landing (after ours): past our fence.
            # (Recording ``left`` itself would compound by FENCE_FACTOR per take-over.)
            ms = max(ms, math.ceil(left / FENCE_FACTOR * 1000))
        name, holder = self._opts.writer_name, self._holder
        if new.read_lease_ms == ms and new.writer == name and new.lease_holder == holder:
            return new
        return replace(new, read_lease_ms=ms, writer=name, lease_holder=holder)

    def as_collector(self, new: Manifest, base: Manifest) -> Manifest:
        """``new``, an edit of ``base`` that links nothing, as a collector writes it: under
        ``base``'s writer, holder and recorded lease, so that it is no take-over (``landed`` is
        not called: this writer gains no authorship, and its next write with records claims).
        The writer's name stays too: a snapshot or seal linked here would name this writer, and
        a later writer of this process opening the log adopts a manifest under its own unique
        name as its own (``open``, ``name_is_unique``), leasing it while the holder, seeing its
        token, links on it unfenced (the adversarial review of ceff69c, helper-5)."""
        if (
            new.writer == base.writer
            and new.lease_holder == base.lease_holder
            and new.read_lease_ms == base.read_lease_ms
        ):
            return new
        return replace(
            new,
            writer=base.writer,
            lease_holder=base.lease_holder,
            read_lease_ms=base.read_lease_ms,
        )

    # ---------------------------------------------------------------------- what it proves

    def landed(
        self, base: str | None, etag: str, issued: float, base_manifest: Manifest | None
    ) -> None:
        """Our manifest write, issued at ``issued`` on top of ``base`` (``base_manifest``),
        landed as ``etag``."""
        if (
            base is not None
            and (self._authored is None or bare_etag(base) != bare_etag(self._authored))
            and not (base_manifest is not None and self.holds(base_manifest))
        ):
            # A take-over: whoever wrote ``base`` may hold a lease on it, as long as it says.
            self._raise_fence(base_manifest)
        self._authored, self._lease_from = etag, issued
        self._held_once = True

    def note_load(self, manifest: Manifest, etag: str) -> None:
        """We read a manifest from the store: what it shows of others waits for the fence (an
        edit of our own that links nothing shows nothing of others)."""
        if (
            self._authored is None or bare_etag(etag) != bare_etag(self._authored)
        ) and not self.holds(manifest):
            self._raise_fence(manifest)

    def adopt(self, etag: str, issued: float) -> None:
        """The stored manifest, read at ``issued``, is one this process wrote: ours."""
        self._authored, self._lease_from = etag, issued
        self._held_once = True

    def lost_to(self, current: Manifest, etag: str, base: Manifest) -> None:
        """Our write on ``base`` failed, and the store holds ``current``.  When that is another
        writer's claim of ``base`` (``_claims``: under its name and linking nothing, of ``base``
        or of a collector's edit of it; not a collector's edit alone, which carries our holder
        and comes at any time), and this writer held the log before, it leaves the log alone
        for the rival's fence (``yielded``) so the rival can link what it claimed for.  Two writers that claimed back at once would
        break each other's fences forever and link nothing (the leader hint is advisory: two
        hosts may both write a log while Redis is away); the rival, in turn, yields to our
        claim once it lost to it."""
        if (
            self._held_once
            and not self.authored(etag)
            and not self.holds(current)
            and _claims(current, base)
        ):
            lease = self._base_lease_s(current)
            if lease > 0:
                self._yield_until = max(
                    self._yield_until, self._opts.clock.monotonic() + FENCE_FACTOR * lease
                )

    async def yielded(self) -> None:
        """Return once a rival's claim this writer lost to had its fence (``lost_to``): call
        before taking the log over."""
        wait = self._yield_until - self._opts.clock.monotonic()
        if wait > 0:
            await self._opts.clock.sleep(wait)

    def inherit_fence(self, until: float) -> None:
        """The fence the log's previous writer in this process raised is this writer's too."""
        self._fence_until = max(self._fence_until, until)

    @property
    def fence_until(self) -> float:
        """Monotonic time before which this writer acknowledges nothing (a take-over)."""
        return self._fence_until

    def authored(self, etag: str) -> bool:
        """Whether ``etag`` (the manifest in memory) is one this writer wrote."""
        return self._authored is not None and bare_etag(etag) == bare_etag(self._authored)

    def remaining(self) -> float:
        """Seconds the read lease has left (0 when there is none)."""
        manifest, etag = self._held()
        lease = self._lease_s(manifest)
        if lease <= 0 or self._lease_from is None or not self.authored(etag) or not self._healthy():
            return 0.0
        if self._puts_in_flight:
            # Our next manifest may be in the store already, its answer not back: a reader of
            # the store may see records the one in memory lacks (``settled`` waits it out).
            return 0.0
        return max(0.0, self._lease_from + lease - self._opts.clock.monotonic())

    async def confirm(self) -> bool:
        """Renew the read lease with a HEAD of the manifest: True if it is still the one this
        writer wrote.  False when the store moved on (another writer wrote it) or cannot tell;
        the writer then stops vouching until it writes again."""
        if self._opts.lease.read_lease_s <= 0 or not self.authored(self._held()[1]):
            return False
        task = self._confirming
        if task is None:
            task = self._confirming = asyncio.ensure_future(self._confirm())
            task.add_done_callback(lambda _t: setattr(self, "_confirming", None))
        return await asyncio.shield(task)

    async def _confirm(self) -> bool:
        etag = self._held()[1]
        issued = self._opts.clock.monotonic()
        puts_before = self._puts_issued
        try:
            held = await self._store.head(join(self._prefix, MANIFEST_PATH))
        except (StoreUnavailable, ObjectNotFound, OSError):
            return False
        now_etag = self._held()[1]
        if now_etag != etag or not self.authored(now_etag):
            return self.remaining() > 0  # we wrote again meanwhile: that write proves it
        if bare_etag(held.etag) != bare_etag(etag):
            if self._puts_in_flight or self._puts_issued != puts_before:
                # Maybe our own next manifest, its answer not back yet: no lease now, but
                # authorship stays (dropping it would make that write look like a take-over
                # and fence us against ourselves).  If another writer's it is, our put's
                # If-Match fails and recovery loads (and fences) what it wrote.
                return False
            self._authored, self._lease_from = None, None  # someone else wrote the log
            return False
        if self._puts_issued != puts_before:
            # A put of ours was issued while the HEAD ran: it may have landed, failed and been
            # built on (``put`` then ended the lease); a HEAD older than it proves nothing.
            return self.remaining() > 0
        self._lease_from = max(self._lease_from or issued, issued)
        return True

    async def wait_fence(self) -> None:
        """Return once the fence (a take-over) has passed: an acknowledgement of anything this
        writer knows may be given then (see the module docstring)."""
        wait = self._fence_until - self._opts.clock.monotonic()
        if wait > 0:
            await self._opts.clock.sleep(wait)

    def _base_lease_s(self, manifest: Manifest | None) -> float:
        """How long a writer may answer reads from ``manifest`` (or, if it records no lease, from
        the one it replaced): the lease it records, whatever this host's own setting.  One that
        records none (Rust, a version of this host before the field) may have been written over
        a manifest recording a longer lease than ours, its record erased (a Rust collector's cut
        on a leased manifest: third adversarial round, 42aa49e), so it gets the longest lease
        any writer holds (``unrecorded_lease_s``) if that is known, else our own."""
        own = self._opts.lease.read_lease_s
        if manifest is None:
            return own
        if manifest.read_lease_ms is None:
            assumed = self._opts.lease.unrecorded_lease_s
            return own if assumed is None else max(own, assumed)
        return manifest.read_lease_ms / 1000.0

    def _lease_s(self, manifest: Manifest) -> float:
        """The lease on the manifest in memory: ours, never longer than it records (so a
        take-over, fencing for the recorded one, always outlasts it)."""
        recorded = manifest.read_lease_ms
        return min(self._opts.lease.read_lease_s, 0.0 if recorded is None else recorded / 1000.0)

    def _raise_fence(self, manifest: Manifest | None) -> None:
        lease = self._base_lease_s(manifest)
        if lease > 0:
            self._fence_until = max(
                self._fence_until, self._opts.clock.monotonic() + FENCE_FACTOR * lease
            )
