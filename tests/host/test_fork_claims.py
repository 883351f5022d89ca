"""The creation claim (``wal3.claim``) under crashes and races: expiry only after the same
claim was seen unchanged for its TTL, one winner among takers, a taken-over claimant fenced off,
and a claim that is released or finished frees the target at once.  (Issue 20, r1/r2 follow-up.)
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import pytest

from host.forks import create_collection_log
from host.manager import log_prefix
from wal3 import LocalStore
from wal3.claim import (
    CLAIM_PATH,
    ClaimLost,
    ClaimWatch,
    CreationInProgress,
    claim_log,
    release_if_dead,
)
from wal3.errors import ObjectNotFound
from wal3.layout import join, load_manifest
from wal3.manifest import Manifest

from .claimkit import TTL_S, StepClock, stepped_watch

T = uuid.UUID(int=7, version=4)
PREFIX = log_prefix(T)


async def _claim(store: LocalStore, watch: ClaimWatch) -> object:
    return await claim_log(store, PREFIX, purpose="fork", holder="t", watch=watch)


async def test_a_held_claim_expires_only_after_its_ttl_unchanged(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    held = await _claim(store, ClaimWatch(TTL_S))
    assert held is not None
    watch, clock = stepped_watch()
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)  # first seen now
    clock.advance(TTL_S - 1)
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)
    clock.advance(1)
    assert await _claim(store, watch) is not None  # taken over


async def test_a_renewal_restarts_the_wait(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    holder_clock = StepClock()
    holder = await claim_log(
        store, PREFIX, purpose="fork", holder="a", watch=ClaimWatch(TTL_S, clock=holder_clock)
    )
    assert holder is not None
    watch, clock = stepped_watch()
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)
    clock.advance(TTL_S - 1)
    holder_clock.advance(TTL_S / 4)
    await holder.guard()  # a live claimant writing: it renews (a new etag)
    clock.advance(TTL_S - 1)  # long since the first sighting, but not since the renewal
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)


async def test_two_takers_of_an_expired_claim_one_wins(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    assert await _claim(store, ClaimWatch(TTL_S)) is not None  # then its process dies
    watches = [stepped_watch() for _ in range(2)]
    for w, c in watches:
        with pytest.raises(CreationInProgress):
            await _claim(store, w)
        c.advance(TTL_S)
    results = await asyncio.gather(*(_claim(store, w) for w, _ in watches), return_exceptions=True)
    won = [r for r in results if not isinstance(r, BaseException)]
    assert len(won) == 1 and won[0] is not None, results
    assert all(isinstance(r, CreationInProgress) for r in results if r not in won), results


async def test_a_taken_over_claimant_is_fenced_off(tmp_path: Path) -> None:
    """The old claimant was only slow: its next write finds its claim gone and stops."""
    store = LocalStore(tmp_path / "s")
    old_clock = StepClock()
    old = await claim_log(
        store, PREFIX, purpose="fork", holder="old", watch=ClaimWatch(TTL_S, clock=old_clock)
    )
    assert old is not None
    watch, clock = stepped_watch()
    with pytest.raises(CreationInProgress):
        await _claim(store, watch)
    clock.advance(TTL_S)
    new = await _claim(store, watch)
    assert new is not None
    old_clock.advance(TTL_S)  # the old one wakes up and wants to write
    with pytest.raises(ClaimLost):
        await old.guard()
    with pytest.raises(ClaimLost):
        await old.guard()  # and stays fenced
    await old.release()  # a fenced claimant's release cannot free the taker's claim
    with pytest.raises(CreationInProgress):
        await _claim(store, ClaimWatch(TTL_S))


async def test_a_released_claim_frees_the_target_at_once(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    held = await _claim(store, ClaimWatch(TTL_S))
    assert held is not None
    await held.release()  # e.g. the fork failed before sending its manifest
    assert await _claim(store, ClaimWatch(TTL_S)) is not None


async def test_a_commit_sent_keeps_the_claim(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    held = await _claim(store, ClaimWatch(TTL_S))
    assert held is not None
    held.commit_sent = True  # its manifest put may still land
    await held.release()
    with pytest.raises(CreationInProgress):
        await _claim(store, ClaimWatch(TTL_S))


async def test_a_creation_cleans_leftovers_and_drops_its_claim(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    for key in (
        f"{PREFIX}/cursor/compaction.json",
        f"{PREFIX}/log/Bucket=0/x.parquet",
        f"{PREFIX}/snapshot/SNAPSHOT.x",
        f"compacted/{T}/CURRENT.json",
        f"compacted/{T}/v0000000000000001/part-a.parquet",
    ):
        await store.put(key, b"left by a dead fork")
    await store.put(f"{PREFIX}/TENANT", json.dumps({"tenant": "alice"}).encode())
    assert await create_collection_log(store, T, PREFIX, "w", ClaimWatch(TTL_S))
    assert await load_manifest(store, PREFIX) is not None
    left = sorted(
        [m.key async for m in store.list(f"{PREFIX}/")]
        + [m.key async for m in store.list(f"compacted/{T}/")]
    )
    assert left == [f"{PREFIX}/TENANT", f"{PREFIX}/manifest/MANIFEST"]
    with pytest.raises(ObjectNotFound):
        await store.head(join(PREFIX, CLAIM_PATH))
    assert not await create_collection_log(store, T, PREFIX, "w", ClaimWatch(TTL_S))


async def test_a_leftover_claim_of_an_existing_log_does_not_block(tmp_path: Path) -> None:
    """A creation that committed and died before dropping its claim: the log exists, so the
    claim means nothing (a fork answers LogExists, a write just opens the log)."""
    store = LocalStore(tmp_path / "s")
    held = await _claim(store, ClaimWatch(TTL_S))
    assert held is not None
    await store.put(f"{PREFIX}/manifest/MANIFEST", Manifest.empty("w").to_bytes())
    assert await _claim(store, ClaimWatch(TTL_S)) is None


async def test_a_dead_claim_is_released_and_its_holder_fenced(tmp_path: Path) -> None:
    """What a roll-up does with a crashed fork's claim (so the fork's dirty mark does not stay
    for ever): after seeing it unchanged for its TTL it releases it, by If-Match, which also
    stops the holder should it only have been slow."""
    store = LocalStore(tmp_path / "s")
    holder_clock = StepClock()
    held = await claim_log(
        store, PREFIX, purpose="fork", holder="a", watch=ClaimWatch(TTL_S, clock=holder_clock)
    )
    assert held is not None
    key = join(PREFIX, CLAIM_PATH)
    watch, clock = stepped_watch()
    assert not await release_if_dead(store, key, watch)  # first seen now
    clock.advance(TTL_S - 1)
    assert not await release_if_dead(store, key, watch)
    clock.advance(1)
    assert await release_if_dead(store, key, watch)
    holder_clock.advance(TTL_S)
    with pytest.raises(ClaimLost):
        await held.guard()
    assert await _claim(store, ClaimWatch(TTL_S)) is not None  # free for the next attempt
