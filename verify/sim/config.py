"""What a seed decides about a run before it starts: actors, thresholds, fault rates."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .store import FaultRates


@dataclass(frozen=True)
class RunConfig:
    """Everything the seed fixes up front (the rest is drawn step by step)."""

    seed: int
    steps: int
    quiet_from: int  # from this step on: no faults, no crashes (liveness is checked)
    writers: int  # writer slots: 1 means one writer process at a time
    pipeline: int  # max_inflight_fragments
    batch_bytes: int
    appends_per_step: int
    keyed_p: float
    pad: int
    snapshot_fragment_threshold: int
    snapshot_threshold: int
    hook: bool
    hook_fail_p: float
    gc: bool
    gc_via_writer: bool  # as the server does: GarbageCollector(edit_manifest=writer.edit_manifest)
    grace_s: float
    window: int  # dedup window = retained fragments
    delete_batch: int
    rates: FaultRates
    writer_crash_p: float
    gc_crash_p: float
    seal_at: int | None
    fork_p: float
    tail_p: float  # chance a cursor goes to the tail rather than inside the log
    emergency_p: float
    # A second collector racing the first (the server and ``loghost gc``, or two servers across a
    # take-over); ``gc2_fresh``: it is a new process every pass, as the CLI is (no memory of what
    # it saw, standalone manifest edits).
    gc2: bool
    gc2_fresh: bool
    # Chance a collector pauses for seconds right after reading control state (cursors,
    # gc/GARBAGE); a quarter of it at any other store operation.
    gc_stall_p: float
    pin_w: float  # weight of pin_cursor calls (a reader's pin racing the collectors)
    # Writers' read lease (0: none).  With one, reads are also answered from a live writer's
    # memory as the log host does, take-overs claim and fence, and reads must be monotonic.
    lease_s: float
    # Writers configured differently (a rolling change of the setting): each writer draws its
    # own lease when it opens (0, a quarter of ``lease_s``, or ``lease_s``, the longest, which
    # every writer knows as the host's LOGHOST_READ_LEASE_MAX_MS).
    lease_mix: bool
    # From the quiet phase on, a collector whose manifest edits link nothing lands one every
    # ``busy_gc_s`` seconds on average (exponential gaps), shorter than most fences: the pace
    # of many collectors together, or of one with a short grace on a busy log (the adversarial
    # review of 741b3dd).  None: no such collector.
    busy_gc_s: float | None = None
    # From the quiet phase on, a second writer of the log that never appends: another host's,
    # whose collector (the server's, when ``gc_via_writer``) and announces of a floor of its own
    # edit the manifest through its ``edit_manifest`` (a leader split).  The holder must go on
    # without a fence: such an edit is no take-over (the adversarial review of b755610).
    edit_only: bool = False


def make_config(seed: int) -> RunConfig:
    """The run a seed stands for."""
    r = random.Random(f"wal3-sim-config:{seed}")
    steps = r.randint(60, 140)
    rates = r.choice(
        (
            FaultRates(),
            FaultRates(before=0.01, lost=0.01, sticky=0.002, conflict=0.2),
            FaultRates(before=0.03, lost=0.03, sticky=0.006, conflict=0.5),
            FaultRates(before=0.06, lost=0.06, sticky=0.01, conflict=0.5),
        )
    )
    seal = r.random() < 0.12
    quiet_from = steps * 2 // 3
    return RunConfig(
        seed=seed,
        steps=steps,
        quiet_from=quiet_from,
        writers=r.choices((1, 2, 3), (5, 3, 2))[0],
        pipeline=r.choice((1, 2, 4, 8, 8)),
        batch_bytes=r.choice((48, 200, 1000, 8 << 20)),
        appends_per_step=r.choice((1, 3, 8, 8)),
        keyed_p=r.choice((0.0, 0.3, 0.8)),
        pad=r.choice((0, 8, 40)),
        snapshot_fragment_threshold=r.randint(2, 4),
        snapshot_threshold=r.randint(2, 3),
        hook=r.random() < 0.6,
        hook_fail_p=r.choice((0.0, 0.05, 0.2, 0.4)),
        gc=r.random() < 0.85,
        gc_via_writer=r.random() < 0.4,
        grace_s=r.choice((2.0, 3.0, 5.0)),
        window=r.choice((2, 4, 16, 64)),
        delete_batch=r.choice((1, 3, 64)),
        rates=rates,
        writer_crash_p=r.choice((0.0, 0.0, 0.003, 0.01)),
        gc_crash_p=r.choice((0.0, 0.03, 0.1)),
        seal_at=r.randint(5, quiet_from) if seal else None,
        fork_p=r.choice((0.0, 0.02)),
        tail_p=r.choice((0.2, 0.5)),
        emergency_p=r.choice((0.1, 0.4)),
        # Drawn last, so the fields above are what they were before these existed.
        gc2=r.random() < 0.6,
        gc2_fresh=r.random() < 0.5,
        gc_stall_p=r.choice((0.1, 0.3, 0.6)),
        pin_w=r.choice((0.0, 1.0, 3.0)),
        lease_s=r.choice((0.0, 0.0, 0.0, 0.5, 2.0)),
        lease_mix=r.random() < 0.5,
        busy_gc_s=r.choice((None, None, None, 0.1, 0.4, 1.0)),
        edit_only=r.random() < 0.35,
    )
