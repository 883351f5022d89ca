"""Advisory leader hints against a real redis-server: claims, redirects, renewal, loss, outages."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from host.leader import (
    LeaderHint,
    NullLeaderHint,
    RedisLeaderHint,
    decode_holder,
    leader_hint_from_url,
)
from verify.testkit.redis_server import RedisServer

PREFIX = "loghost:leader:"
MakeHint = Callable[..., RedisLeaderHint]


async def wait_until(
    predicate: Callable[[], Awaitable[bool] | bool], what: str, timeout_s: float = 10.0
) -> None:
    """Poll ``predicate`` until true; fail (not hang) after ``timeout_s``.  Never a timing assert."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = predicate()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for: {what}")
        await asyncio.sleep(0.02)  # polling interval of a bounded wait for a condition


@pytest.fixture
async def rclient(redis_server: Any) -> AsyncIterator[aioredis.Redis]:
    """An inspection client (default retries, so it reconnects after a Redis restart)."""
    client = aioredis.Redis.from_url(redis_server.url, decode_responses=True)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def make_hint(redis_server: Any) -> AsyncIterator[MakeHint]:
    """Build RedisLeaderHints on the test's Redis; all are closed at teardown."""
    hints: list[RedisLeaderHint] = []

    def make(server_id: str, url: str | None = None, **kw: Any) -> RedisLeaderHint:
        hint = RedisLeaderHint(
            redis_server.url, server_id, url or f"http://{server_id}.test:8080", **kw
        )
        hints.append(hint)
        return hint

    try:
        yield make
    finally:
        redis_server.resume()  # a test that paused Redis must not make teardown wait on it
        for hint in hints:
            await hint.close()


async def holder_of(rclient: aioredis.Redis, collection_id: str) -> dict[str, str] | None:
    """The decoded value of a log's leader key, or None if absent."""
    value = await rclient.get(PREFIX + collection_id)
    return None if value is None else decode_holder(value)


async def held_by(rclient: aioredis.Redis, collection_id: str, hint: RedisLeaderHint) -> bool:
    """True if the log's key holds exactly ``hint``'s value."""
    return await rclient.get(PREFIX + collection_id) == hint.value


# -- claims and redirects ----------------------------------------------------------------------


async def test_first_claimer_holds_and_second_is_redirected(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    a, b = make_hint("a"), make_hint("b")
    assert await a.claim("c1") is None
    assert await b.claim("c1") == "http://a.test:8080"
    assert await holder_of(rclient, "c1") == {
        "server_id": "a",
        "url": "http://a.test:8080",
        "incarnation": a.incarnation,
    }
    assert 0 < await rclient.pttl(PREFIX + "c1") <= a.ttl_ms
    assert a.held == {"c1"} and b.held == frozenset()
    # b is free to serve logs nobody holds.
    assert await b.claim("c2") is None
    assert await a.claim("c2") == "http://b.test:8080"
    assert a.failures == b.failures == 0


async def test_racing_claims_have_exactly_one_winner(make_hint: MakeHint) -> None:
    hints = [make_hint(f"s{i}") for i in range(8)]
    results = await asyncio.gather(*(h.claim("contended") for h in hints))
    winners = [h for h, r in zip(hints, results, strict=True) if r is None]
    assert len(winners) == 1
    assert {r for r in results if r is not None} == {winners[0].advertise_url}


async def test_same_server_id_reclaims_after_restart(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    lost: list[str] = []
    old = make_hint("pod-0", "http://10.0.0.1:8080", on_lost=lost.append)
    other = make_hint("pod-1")
    assert await old.claim("c") is None
    assert await old.claim("c") is None  # claiming again is fine and refreshes it
    assert await held_by(rclient, "c", old)

    # The restarted process has the same stable server id, a new incarnation and maybe a new URL.
    new = make_hint("pod-0", "http://10.0.0.2:8080")
    assert await new.claim("c") is None
    assert await held_by(rclient, "c", new)
    assert await other.claim("c") == "http://10.0.0.2:8080"

    # If the old process is in fact still alive, its next renewal learns it lost the log.
    await old.renew()
    assert lost == ["c"] and old.held == frozenset() and old.lost == 1
    assert await held_by(rclient, "c", new)


# -- release -----------------------------------------------------------------------------------


async def test_release_by_non_holder_does_nothing_by_holder_frees(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    a, b = make_hint("a"), make_hint("b")
    # b claims first, its key vanishes (as if expired), then a takes the log: b still thinks it holds it.
    assert await b.claim("c") is None
    await rclient.delete(PREFIX + "c")
    assert await a.claim("c") is None
    assert "c" in b.held

    await b.release("c")  # compare-and-delete: a's key survives
    assert await held_by(rclient, "c", a)
    await b.release("never-claimed")  # no-op

    await a.release("c")
    assert await rclient.exists(PREFIX + "c") == 0
    assert a.held == frozenset()
    assert await b.claim("c") is None  # free again
    assert a.failures == b.failures == 0


async def test_release_racing_a_renewal_does_not_leave_a_stale_key(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    a = make_hint("a")
    assert await a.claim("c") is None
    # Reproduce the interleaving deterministically: release()'s DEL lands before the renewal
    # script runs (the script re-creates the key), and the release is already recorded locally
    # when the renewal's result is processed.
    real_script = a._renew_script

    async def release_lands_first(**kw: Any) -> Any:
        await rclient.delete(PREFIX + "c")
        result = await real_script(**kw)
        await a.release("c")
        return result

    a._renew_script = release_lands_first
    await a.renew()
    assert a.reestablished == 1
    assert await rclient.exists(PREFIX + "c") == 0


# -- renewal and loss --------------------------------------------------------------------------


async def test_renewal_keeps_key_alive_past_its_ttl(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    renewed = make_hint("a", ttl_ms=600, renew_every_ms=100)
    control = make_hint("b", ttl_ms=600)  # never started: its key is not renewed
    await renewed.start()
    assert await renewed.claim("kept") is None
    assert await control.claim("unrenewed") is None

    # Once the control key (claimed later, same TTL) has expired, a full TTL has passed.
    await wait_until(lambda: _gone(rclient, "unrenewed"), "the unrenewed key to expire")
    assert await held_by(rclient, "kept", renewed)
    assert renewed.renewed >= 1
    assert renewed.reestablished == 0  # it was kept alive, never re-created after expiring
    assert renewed.failures == 0


async def test_takeover_after_expiry_triggers_on_lost(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    lost = asyncio.Event()
    released: list[str] = []

    async def on_lost(collection_id: str) -> None:
        # What the server does: close the log, which releases its hint.
        released.append(collection_id)
        await a.release(collection_id)
        lost.set()

    a = make_hint("a", ttl_ms=300, on_lost=on_lost)
    b = make_hint("b", ttl_ms=10_000)
    assert await a.claim("x") is None
    assert await a.claim("y") is None
    # a stalls (no renewal) past its TTL, and b takes the log over.
    await wait_until(lambda: _gone(rclient, "x"), "a's key to expire")
    assert await b.claim("x") is None

    await a.start()
    await asyncio.wait_for(lost.wait(), 10)
    assert released == ["x"]
    assert a.held == {"y"} and a.lost == 1
    assert await held_by(rclient, "x", b)  # a's release did not delete b's key
    await wait_until(lambda: held_by(rclient, "y", a), "a to re-establish its other, unstolen key")


# -- Redis outages -----------------------------------------------------------------------------


async def test_redis_stopped_claims_fail_open_and_count_failures(
    make_hint: MakeHint, redis_server: Any
) -> None:
    errors: list[BaseException] = []
    a = make_hint("a", retry_after_ms=60_000, on_failure=errors.append)
    b = make_hint("b", retry_after_ms=60_000)
    assert await a.claim("before") is None

    redis_server.stop()
    # Fails open: both servers serve (safety comes from wal3's conditional writes).
    assert await asyncio.wait_for(a.claim("during"), 5) is None
    assert await asyncio.wait_for(b.claim("before"), 5) is None
    assert a.failures == 1 and b.failures == 1
    assert len(errors) == 1 and isinstance(errors[0], RedisError | OSError)
    # The circuit breaker is open: no more attempts (or waits) for a while.
    assert await a.claim("during-2") is None
    assert a.failures == 1 and a.skipped == 1
    # Logs served while Redis was down are tracked so their claims can be established later.
    assert a.held == {"before", "during", "during-2"}


async def test_wedged_redis_claim_times_out_and_fails_open(
    make_hint: MakeHint, redis_server: Any
) -> None:
    errors: list[BaseException] = []
    a = make_hint("a", timeout_s=0.2, on_failure=errors.append)
    assert await a.claim("warm") is None  # a pooled connection exists before the wedge

    redis_server.pause()  # connections still accepted, nothing ever answered
    try:
        assert await asyncio.wait_for(a.claim("c"), 5) is None
        assert await asyncio.wait_for(a.release("warm"), 5) is None  # skipped by the breaker
    finally:
        redis_server.resume()
    assert a.failures == 1 and len(errors) == 1
    assert a.skipped == 1


async def test_redis_restarted_empty_renewal_reestablishes_claims(
    make_hint: MakeHint, redis_server: Any, rclient: aioredis.Redis
) -> None:
    a = make_hint("a", ttl_ms=600, renew_every_ms=100, retry_after_ms=100)
    b = make_hint("b")
    await a.start()
    assert await a.claim("c1") is None
    assert await a.claim("c2") is None

    redis_server.stop()
    await wait_until(lambda: a.failures >= 1, "a renewal to notice Redis is down")
    assert await asyncio.wait_for(a.claim("c3"), 5) is None  # opened during the outage

    redis_server.start()  # empty: no persistence
    for c in ("c1", "c2", "c3"):
        await wait_until(lambda c=c: held_by(rclient, c, a), f"renewal to re-establish {c}")
    assert a.reestablished >= 3
    assert await b.claim("c3") == a.advertise_url


# -- close, batching, odd values ---------------------------------------------------------------


async def test_close_releases_all_keys_and_only_ours(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    a = make_hint("a", renew_batch=7)  # several release batches
    b = make_hint("b")
    await a.start()
    mine = [f"log-{i}" for i in range(20)]
    for c in mine:
        assert await a.claim(c) is None
    assert await b.claim("theirs") is None
    assert await a.claim("stolen") is None
    await rclient.set(PREFIX + "stolen", b.value)  # taken over, not yet noticed by a

    await a.close()
    assert await rclient.exists(*(PREFIX + c for c in mine)) == 0
    assert await held_by(rclient, "theirs", b)
    assert await held_by(rclient, "stolen", b)
    assert a.held == frozenset()
    assert await a.claim("after-close") is None  # fail open, nothing written
    assert await rclient.exists(PREFIX + "after-close") == 0
    await a.close()  # idempotent


async def test_renewal_is_one_script_call_per_batch(tmp_path: Path) -> None:
    # A Redis of its own: the command counts are server-wide, and the worker's shared Redis may
    # still serve a hint another test's host process left renewing (a fourth call, seen once).
    server = RedisServer(tmp_path / "redis")
    server.start()
    a = RedisLeaderHint(server.url, "a", "http://a.test:8080", renew_batch=100)
    rclient = aioredis.from_url(server.url, decode_responses=True)
    try:
        for i in range(250):
            assert await a.claim(f"log-{i}") is None
        await a.renew()  # loads the script into Redis' cache
        await rclient.config_resetstat()
        await a.renew()
        stats = await rclient.info("commandstats")
        assert stats["cmdstat_evalsha"]["calls"] == 3
        assert "cmdstat_eval" not in stats
        assert a.renewed == 500
    finally:
        await a.close()
        await rclient.aclose()
        server.stop()


async def test_unparseable_value_fails_open_without_touching_it(
    make_hint: MakeHint, rclient: aioredis.Redis
) -> None:
    errors: list[BaseException] = []
    a = make_hint("a", on_failure=errors.append)
    await rclient.set(PREFIX + "weird", "not json")
    assert await a.claim("weird") is None
    assert await rclient.get(PREFIX + "weird") == "not json"
    assert "weird" not in a.held and a.failures == 1 and len(errors) == 1
    # Redis itself is healthy: the breaker did not open.
    assert await a.claim("normal") is None
    assert a.skipped == 0 and await held_by(rclient, "normal", a)


async def test_null_hint_and_factory(redis_server: Any) -> None:
    for url in (None, "", "  "):
        hint = leader_hint_from_url(url, "a", "http://a.test:8080")
        assert isinstance(hint, NullLeaderHint)
    null = NullLeaderHint()
    await null.start()
    assert await null.claim("c") is None
    await null.release("c")
    await null.close()
    assert null.failures == 0

    hint = leader_hint_from_url(redis_server.url, "a", "http://a.test:8080", ttl_ms=1234)
    try:
        assert isinstance(hint, RedisLeaderHint) and isinstance(hint, LeaderHint)
        assert hint.ttl_ms == 1234 and hint.renew_every_s == pytest.approx(0.411)
        assert await hint.claim("c") is None
    finally:
        await hint.close()
    with pytest.raises(ValueError):
        leader_hint_from_url("http://not-redis", "a", "http://a.test:8080")


async def _gone(rclient: aioredis.Redis, collection_id: str) -> bool:
    return await rclient.exists(PREFIX + collection_id) == 0
