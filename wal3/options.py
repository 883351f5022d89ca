"""``LogWriterOptions``: a writer's tuning, grouped by the part of the writer each group bounds.

Every field says what it bounds and why its default is what it is.  The defaults suit a log host
with thousands of small logs open at once: memory per open log is bounded by configuration, never
by traffic.  Groups (after Chroma's Rust wal3, whose writer takes ``SnapshotOptions`` and
``ThrottleOptions``):

* ``batch`` (``BatchOptions``): when a batch is cut and how much may be in flight;
* ``snapshot`` (``SnapshotOptions``): when the manifest's root is folded into snapshots;
* ``idempotency`` (``IdempotencyOptions``): how far back a retry with a key is recognised;
* ``retry`` (``RetryOptions``): how often an append, a rebase or a repair is tried again;
* ``lease`` (``LeaseOptions``): read leases and the fence a take-over raises.

``writer_name`` and ``clock`` are the writer's identity and its time source, not tuning.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field

from .clock import SYSTEM_CLOCK, Clock

FENCE_FACTOR = 1.25  # a take-over's fence over the lease it fences (clock-rate margin)


def default_writer_name() -> str:
    """A name identifying this process in manifests, for debugging."""
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class BatchOptions:
    """Group commit and back-pressure: when a batch becomes a fragment, and how much may wait."""

    # Queued bytes that cut a batch at once.  Large (8 MiB): a crowd of appends shares one
    # fragment and one manifest write; a lone append never waits for it (an idle pipeline cuts).
    size_bytes: int = 8 << 20
    # Records one fragment may hold: bounds a fragment's decode time and Parquet row group.
    max_records: int = 100_000
    # How long queued appends wait for company while fragments are in flight.  2 ms: long enough
    # to gather a crowd behind a manifest write, short next to an object-store round trip.
    interval_s: float = 0.002
    # Fragments encoded, uploaded or waiting to be linked at once (the pipeline's depth).  8
    # hides upload latency without letting one log hold many uploads of a shared store.
    max_inflight_fragments: int = 8
    # Bytes accepted but not yet acknowledged; past it an append fails at once with
    # ``Backpressure`` instead of queueing without bound.  64 MiB: eight full batches.
    max_outstanding_bytes: int = 64 << 20


@dataclass(frozen=True)
class SnapshotOptions:
    """Manifest compaction: when the oldest root pointers are folded into a snapshot."""

    # Fragments the root may hold before the oldest go into a depth-1 snapshot.  100 keeps the
    # root (about 280 B per fragment pointer) small enough that manifest bytes per append stay
    # flat as the log grows (docs/PERFORMANCE.md).
    fragment_threshold: int = 100
    # A run of this many same-depth snapshots in the root rolls up one level.  20 keeps the
    # root short while a tree of depth d holds about 100 x 20^(d-1) fragments.
    snapshot_threshold: int = 20
    # A snapshot written this long ago and still not linked is dropped, never linked: garbage
    # collection may by then treat it as an orphan.  60 s is well under half the collector's
    # default grace (300 s); a host sets at most half its own ``LOGHOST_GC_GRACE_S``.
    max_age_s: float = 60.0


@dataclass(frozen=True)
class IdempotencyOptions:
    """The dedup window: which retries with an idempotency key are answered from the log."""

    # The window, in fragments: keys of the last this many sequence numbers are recognised
    # (read from their footers on the first keyed append after open).  256 matches what the
    # collector keeps of the newest fragments (``GcOptions.retain_fragments``).
    window_fragments: int = 256
    # Keys kept in memory with their full answer.  10,000 bounds an open log's memory however
    # fast keyed appends arrive.
    window_keys: int = 10_000
    # Keys pushed out of ``window_keys`` while their fragment is still within
    # ``window_fragments``: kept as a hash -> sequence number each (about 100 bytes), and a
    # retry that matches one is answered from that fragment's footer.  Past this many, the
    # oldest go (the window then ends there).
    spill_keys: int = 100_000


@dataclass(frozen=True)
class RetryOptions:
    """How long the writer keeps trying before it answers an append with an error."""

    # Recoveries an append (or a kept fragment) may be charged before it fails.  3: a transient
    # store error or a collision is retried, a writer that keeps winning the race is not chased.
    max_append_attempts: int = 3
    # Bounds every loop that follows another process's progress: rebases of one manifest write
    # on edits that left the tail alone (GC, a snapshot, a seal), fragments one read repair
    # links (a dead writer's backlog is a pipeline deep; a live writer is never chased), and
    # attempts to create the manifest at open.  64 is far past any of those in practice.
    max_rebases: int = 64
    # A fragment whose upload is retried this long after its hook ran is marked again before it
    # is re-sent: whoever consumes the marks (the dirty log's roll-up) may by then have judged the
    # old mark settled, seen no fragment at its sequence number, and dropped it.  Below the
    # roll-up's settle time (at least 60 s), so a re-sent upload always has a young mark.
    remark_after_s: float = 30.0


@dataclass(frozen=True)
class LeaseOptions:
    """Read leases: when reads may be answered from the writer's memory (``writer`` module
    docstring)."""

    # How long a store check vouches for the manifest this writer wrote (``current_manifest``);
    # 0: never (every read loads the stored manifest, and nothing waits for a fence).  Off by
    # default: only a host that routes reads to the writer needs it (it sets 1 s).
    read_lease_s: float = 0.0
    # The lease assumed for a manifest that records none (``read_lease_ms`` absent: a Rust
    # writer's, which drops the field, or a version of this writer before it): at least the
    # longest read lease any writer of these logs holds, since such a write may have erased a
    # longer lease recorded in the manifest it replaced, which may still answer reads.  None:
    # ``read_lease_s`` (safe only while every writer of the log has the same setting).
    unrecorded_lease_s: float | None = None
    # ``writer_name`` belongs to this process alone (no other process ever uses it): a manifest
    # that names it was written here, by this writer or one before it (closed: one writer per
    # log per process), so opening it is no take-over.  Off by default: a default name is
    # host:pid, which a restarted process may reuse.
    name_is_unique: bool = False

    @property
    def fence_s(self) -> float:
        """How long acknowledgements wait after a take-over: the lease and a margin for clock
        rates (see the ``writer`` module docstring)."""
        return self.read_lease_s * FENCE_FACTOR


@dataclass(frozen=True)
class LogWriterOptions:
    """Tuning for a writer; the defaults suit a log host with many small logs."""

    # Names this writer in every manifest, snapshot and fragment it writes (debugging, and read
    # leases: an etag names one writer's bytes only if names are unique per process).
    writer_name: str = field(default_factory=default_writer_name)
    clock: Clock = SYSTEM_CLOCK  # wall time for record timestamps, monotonic for ages
    batch: BatchOptions = field(default_factory=BatchOptions)
    snapshot: SnapshotOptions = field(default_factory=SnapshotOptions)
    idempotency: IdempotencyOptions = field(default_factory=IdempotencyOptions)
    retry: RetryOptions = field(default_factory=RetryOptions)
    lease: LeaseOptions = field(default_factory=LeaseOptions)
