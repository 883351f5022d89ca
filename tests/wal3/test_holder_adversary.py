"""Adversarial review of 53ad3c8 (``lease_holder``: a collector's edit of a writer's own
manifest is no take-over; a lost claim to another writer's claim is charged; "not written" for
a kept batch whose slot holds other bytes; ``Recovery.progressed``).

Each finding's test failed on 53ad3c8's engine (it passed at its parent, 8030450, where B
fences and acknowledges r2 at +5.5 s or +8.0 s, after A's lease ran out at +5.0 s) and passes
since the fix: a take-over put that raises raises the fence for its base's lease
(``Lease.put``), as ``landed`` does for one whose answer arrives.  Time is a manual clock; interleavings are forced with
a scripted store (``tests/wal3/scripted.py``); the only real sleep is a bounded poll over
recovery's own 50 ms breather after a store error, never a synchronisation.

1. **A claim whose answer is lost is fenced by nobody.**  ``holds`` says a manifest recording
   this writer's token stands under this writer's lease alone.  But a take-over claim records
   the taker's token the moment it *lands*, while the fence for it is raised only by
   ``landed``, i.e. only when the claim's answer arrives.  B (lease 2 s) opened the log long
   ago (its load's fence has passed) and appends r2 over A's manifest M_A: it claims, the
   claim lands (C, holder B) and its answer is lost.  Either (a) a collector edits C before
   ``put_resolving``'s HEAD (C', holder B carried over): ``ResolvedPreconditionFailed``, the
   committer reloads C' (``note_load``: held, no fence) and rebases onto it (``takes_over``:
   held, no claim), linking r2 at once; or (b) the store stays unavailable through
   ``put_resolving``'s retries: recovery reloads C (held, no fence) and read repair links r2
   at once (``takes_over`` false, ``wait_fence`` long passed).  Either way r2 is acknowledged
   while A's lease, renewed by a HEAD just before the claim landed, still answers M_A without
   r2: a read of the store returns r2, a later read through A's lease misses it (an
   acknowledged record).  Before the change the reload of C (not authored) raised the fence
   for the lease C records (A's 2 s).  ``LogWriter.claim()`` (an identity edit, "so the fence
   starts") breaks the same way: it returns with no fence running, and the append after it
   links at once.  Severity: safety (reads across hosts neither monotonic nor complete).
   Needs a lost answer on the claim plus a collector's edit before the read-back (or sticky
   503s on the manifest key through ``put_resolving``'s four attempts), with the taker's load
   older than its fence (a host opens a writer for a read, appends later).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from wal3 import LocalStore, LogWriter
from wal3.layout import load_manifest
from wal3.manifest import GcFloor
from wal3.paths import MANIFEST_PATH, join

from .scripted import ScriptedStore, Verdict
from .test_read_lease import ManualClock, _opts, _settle

PREFIX = "logs/held"
MKEY = join(PREFIX, MANIFEST_PATH)


async def _collector_announce(inner: LocalStore) -> None:
    """A standalone collector's edit (an announce: ``replace`` under its own name, which
    carries ``lease_holder`` over), on whatever is stored."""
    loaded = await load_manifest(inner, PREFIX)
    assert loaded is not None
    m, etag = loaded
    edited = replace(m, gc_floor=GcFloor(m.oldest_offset, "f" * 32), writer="gc")
    await inner.put(MKEY, edited.to_bytes(), if_match=etag)


async def _never_misses(
    inner: LocalStore, clock: ManualClock, a: LogWriter, b: LogWriter, acked: asyncio.Task[Any]
) -> None:
    """Let B run, moving the clock 0.1 s only while B waits for a fence, until it acknowledged
    r2: from then on A's lease must not answer without r2 (the clock stands still while this
    is checked)."""
    polls = 0
    while not acked.done() and clock.monotonic() < 1020.0 and polls < 2000:
        await _settle()
        if acked.done():
            break
        if b.fencing:
            clock.advance(0.1)
        else:
            polls += 1  # a bounded poll: recovery sleeps 50 ms of real time after a store error
            await asyncio.sleep(0.005)
    r2 = await asyncio.wait_for(acked, 10)  # a bound on a hang, not a timing assert
    stored = await load_manifest(inner, PREFIX)  # a reader of the store sees r2 ...
    assert stored is not None and stored[0].next_offset > r2.offset
    m = a.current_manifest()  # ... and a later read through A's lease must too
    assert m is None or m.next_offset > r2.offset, (
        f"r2 (offset {r2.offset}) acknowledged by B at +{clock.monotonic() - 1000.0:.1f} s, "
        f"but A's lease answers up to offset {m.next_offset}, without it"
    )


@pytest.mark.parametrize("after_lost_claim", ["collector_edit", "store_outage"])
@pytest.mark.parametrize("claim_by", ["append", "LogWriter.claim"])
async def test_a_lost_claim_answer_still_fences_the_taker(
    tmp_path: Path, after_lost_claim: str, claim_by: str
) -> None:
    inner = LocalStore(tmp_path / "store")
    clock = ManualClock()
    state: dict[str, Any] = {"armed": False, "lost": False, "outage": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if key != MKEY:
            return None
        if op == "put" and kw["if_match"] and state["armed"] and not state["lost"]:
            # B's claim over M_A: it lands, its answer is lost.
            state["lost"] = True
            if after_lost_claim == "store_outage":
                state["outage"] = 7  # put_resolving's HEADs and retries fail (4 attempts)
            return "lose"
        if state["lost"] and after_lost_claim == "collector_edit" and op == "head":
            if not state.get("edited"):
                state["edited"] = True
                await _collector_announce(inner)  # before put_resolving reads the key back
            return None
        if state["outage"] > 0 and op in ("head", "put"):
            state["outage"] -= 1
            return "fail"
        return None

    store = ScriptedStore(inner, script)
    a = await LogWriter.open(store, PREFIX, _opts(clock, "A", lease_s=2.0))
    await a.append(b"r1")
    b = await LogWriter.open(store, PREFIX, _opts(clock, "B", lease_s=2.0))
    clock.advance(3.0)  # B's fence from its load (2.5 s) has passed
    assert await a.confirm_lease()  # A serves reads from M_A: renewed just now
    state["armed"] = True
    if claim_by == "LogWriter.claim":
        await b.claim()  # the take-over write (links nothing), "so the fence starts"
        assert state["lost"]
    acked = asyncio.create_task(b.append(b"r2"))
    await _never_misses(inner, clock, a, b, acked)
    assert state["lost"]
    for w in (a, b):
        await w.close()
