"""Adversarial review of ``LOGHOST_CLAIM_TTL_S`` (7daabbd, 4f9f0e5): the creation claim's TTL as
a setting, its validator, and whether every user of a claim judges it by the same TTL.

**Finding (fixed: no setting accepts infinity or NaN): an infinite TTL was accepted, and a host
running with it lost its live claims.**  The
validator refuses ``0 < v < 1`` and pydantic refuses NaN and negatives, but ``inf`` (also what
``LOGHOST_CLAIM_TTL_S=1e400`` parses to) passes: an operator who wants a dead host's claims never
to expire gets a host whose *live* claims any other host takes over after that host's own TTL.

* The holder records ``ttl_s`` in the claim so that observers wait for the longer of theirs and
  the holder's (the issue-20 fix for hosts whose TTLs differ, a rolling change).  ``json.dumps``
  writes an infinite float as ``Infinity``; ``holder_ttl_s`` reads it back and refuses it (not
  finite), so every observer judges the claim by its *own* TTL, as if the holder had said nothing.
* The holder never renews: ``Claim.guard`` renews once ``ttl_s / 4`` has passed, which for an
  infinite TTL is never, and ``kept_alive`` sleeps ``inf / 4``.  So nothing fences it off either:
  its next guarded write goes out under a claim that another host has taken over and built on.

The reproduction is issue 20's "a shorter local TTL takes over a live fork", with host A at
``claim_ttl_s=inf``: host B (``claim_ttl_s=1``) appends to the fork's target, and once B has seen
A's claim unchanged for its own second it creates the target, while A's fork is still running.
A's fork then writes the source's ``CURRENT.json`` into the log B created (A's guard has no
renewal due, ever), so B's log carries another log's compacted version.

What held up (pinned below where it adds coverage):

* Every user of the claim on one host gets the same TTL: the manager's watch (first writes and
  forks, ``host.services.lifecycle`` passes ``manager.claims``) and the dirty log's roll-up watch
  (``release_if_dead``) are both built from ``claim_ttl_s(gc_grace_s, claim_ttl_s)`` out of the
  same ``Settings``; ``fork_collection``'s own fallback watch is used only by callers that pass
  none (tests and tools).
* Across hosts whose finite settings differ, the holder's recorded TTL binds the observer: a host
  at the 1 s minimum does not take over, nor does its roll-up release, a live claim of a host at
  the derived TTL (test below).
* The claimant renews every quarter of its TTL (``kept_alive``), and a taken-over claimant's next
  renewal fails (If-Match), so with a finite TTL a slow claimant is fenced off before writing
  (``tests/host/test_fork_claims.py``); at the 1 s minimum that is four claim writes a second
  per creation in flight, the validator's stated reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from pydantic import ValidationError

from host.config import Settings
from host.forks import claim_ttl_s
from host.manager import log_prefix
from wal3 import LocalStore
from wal3.claim import ClaimWatch, CreationInProgress, claim_log, release_if_dead
from wal3.paths import CLAIM_PATH, join

from .claimkit import StepClock

SRC = "00000000-0000-4000-8000-0000000000c1"
DST = "00000000-0000-4000-8000-0000000000c2"


def _accepted(value: object) -> bool:
    try:
        Settings(claim_ttl_s=value)
    except ValidationError:
        return False
    return True


@pytest.mark.parametrize("value", ["inf", "1e400", "Infinity", "-inf"])
def test_an_infinite_claim_ttl_is_refused_at_start(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Was xfail(strict): ``inf`` passed, and host A (``claim_ttl_s=inf``) forking into DST lost
    its live claim to host B (``claim_ttl_s=1``), whose append created DST while A's fork ran;
    A then wrote the source's ``CURRENT.json`` into B's log (commit d3dd39e has the scenario).
    Now no setting accepts infinity or NaN, from the environment as from code."""
    assert not _accepted(value)
    monkeypatch.setenv("LOGHOST_CLAIM_TTL_S", value)
    with pytest.raises(ValidationError, match="claim_ttl_s"):
        Settings()


@pytest.mark.parametrize("name", ["gc_interval_s", "idle_close_s", "leader_ttl_ms"])
def test_no_setting_takes_infinity(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(f"LOGHOST_{name.upper()}", "inf")
    with pytest.raises(ValidationError, match=name):
        Settings()


async def test_a_minimum_ttl_host_waits_for_a_derived_ttl_holder(tmp_path: Path) -> None:
    """Hosts with different finite settings (a rolling change from the derived TTL to the 1 s
    minimum): the new host's first writes and its roll-up's ``release_if_dead`` both wait for
    the holder's recorded TTL, not their own, and take the claim over once it has passed."""
    store = LocalStore(tmp_path / "s")
    old = Settings(gc_grace_s=300.0)
    new = Settings(gc_grace_s=300.0, claim_ttl_s=1.0)
    holder_ttl = claim_ttl_s(old.gc_grace_s, old.claim_ttl_s)
    observer_ttl = claim_ttl_s(new.gc_grace_s, new.claim_ttl_s)
    assert (holder_ttl, observer_ttl) == (600.0, 1.0)
    prefix = log_prefix(uuid.UUID(DST))
    key = join(prefix, CLAIM_PATH)
    held = await claim_log(
        store, prefix, purpose="fork", holder="old", watch=ClaimWatch(holder_ttl, clock=StepClock())
    )
    assert held is not None
    clock = StepClock()
    appends = ClaimWatch(observer_ttl, clock=clock)  # the new host's manager
    rollups = ClaimWatch(observer_ttl, clock=clock)  # the new host's dirty-log roll-ups
    with pytest.raises(CreationInProgress):
        await claim_log(store, prefix, purpose="create", holder="new", watch=appends)
    assert not await release_if_dead(store, key, rollups)
    clock.advance(holder_ttl / 4)  # 150 of the new host's TTLs, inside one renewal period
    with pytest.raises(CreationInProgress):
        await claim_log(store, prefix, purpose="create", holder="new", watch=appends)
    assert not await release_if_dead(store, key, rollups)
    clock.advance(holder_ttl)  # the holder's own TTL has passed with no renewal: it is dead
    assert await release_if_dead(store, key, rollups)
    assert await claim_log(store, prefix, purpose="create", holder="new", watch=appends)


@pytest.mark.parametrize("value", ["nan", "-0.5", "0.999"])
def test_the_validator_refuses_nan_negatives_and_sub_second_values(value: str) -> None:
    assert not _accepted(value)
    assert _accepted("0") and _accepted("1")
