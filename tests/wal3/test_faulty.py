"""FaultyStore: every fault kind does what it says, schedules replay from the seed, stats add up."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

import pytest

from wal3.errors import (
    ObjectNotFound,
    PreconditionFailed,
    SimulatedCrash,
    StoreUnavailable,
    Wal3Error,
)
from wal3.faulty import FaultRule, FaultyStore, InjectedFault
from wal3.localstore import LocalStore
from wal3.store import content_etag, put_resolving


@pytest.fixture
def inner(tmp_path: Path) -> LocalStore:
    """The real store underneath, to check what actually landed."""
    return LocalStore(tmp_path / "store", fsync=False)


class SleepRecorder:
    """Stands in for asyncio.sleep: records the delays instead of waiting them out."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


async def test_error_fails_before_reaching_the_store(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    rule = store.add_rule(FaultRule("error", ops={"put"}, times=1))
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"v")
    with pytest.raises(ObjectNotFound):
        await inner.get("k")
    await store.put("k", b"v")  # times=1: the next one goes through
    assert (await inner.get("k")).data == b"v"
    assert (rule.seen, rule.fired, rule.exhausted) == (2, 1, True)


async def test_lost_response_lands_but_reports_unavailable(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    store.add_rule(FaultRule("lost_response", ops={"put"}, times=1))
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"mine", if_none_match="*")
    assert (await inner.get("k")).data == b"mine"


async def test_lost_response_is_settled_by_put_resolving(inner: LocalStore) -> None:
    """The pairing wal3 relies on: a lost create is recognised as ours, not as a conflict."""
    store = FaultyStore(inner)
    store.add_rule(FaultRule("lost_response", ops={"put"}, key_regex="^manifest$", times=1))
    etag = await put_resolving(store, "manifest", b"v1", if_none_match="*")
    assert etag == content_etag(b"v1")
    store.add_rule(FaultRule("lost_response", ops={"put"}, key_regex="^manifest$", times=1))
    etag = await put_resolving(store, "manifest", b"v2", if_match=etag)
    assert (await inner.get("manifest")).data == b"v2"


async def test_put_resolving_retries_when_the_condition_still_holds(inner: LocalStore) -> None:
    """A put that failed before landing is retried, whichever quoting the caller's etag uses."""
    etag = await inner.put("k", b"v1")
    store = FaultyStore(inner)
    store.add_rule(FaultRule("error", ops={"put"}, times=1))
    await put_resolving(store, "k", b"v2", if_match=f'"{etag}"')
    assert (await inner.get("k")).data == b"v2"
    assert store.stats()["requests"] == {"put": 2, "head": 1}


async def test_lost_response_hides_a_real_failure_too(inner: LocalStore) -> None:
    """When the inner op itself failed, the caller still only sees the lost response."""
    await inner.put("k", b"theirs")
    store = FaultyStore(inner)
    store.add_rule(FaultRule("lost_response", ops={"put"}))
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"mine", if_none_match="*")
    assert (await inner.get("k")).data == b"theirs"


async def test_crash_before_does_not_write(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    store.add_rule(FaultRule("crash_before", ops={"put", "delete"}))
    with pytest.raises(SimulatedCrash):
        await store.put("k", b"v")
    with pytest.raises(ObjectNotFound):
        await inner.get("k")
    await inner.put("k", b"v")
    with pytest.raises(SimulatedCrash):
        await store.delete("k")
    assert (await inner.get("k")).data == b"v"


async def test_crash_after_at_an_exact_point(inner: LocalStore) -> None:
    """The brief's example: the third put of the manifest lands, then the process 'dies'."""
    store = FaultyStore(inner)
    rule = store.add_rule(
        FaultRule(
            ops={"put"},
            key_regex=r"manifest/MANIFEST$",
            kind="crash_after",
            after=2,
            times=1,
            probability=1.0,
        )
    )
    await store.put("log/manifest/MANIFEST", b"1")
    await store.put("log/fragment/1", b"frag")  # not matched: does not count towards `after`
    await store.put("log/manifest/MANIFEST", b"2")
    with pytest.raises(SimulatedCrash):
        await store.put("log/manifest/MANIFEST", b"3")
    assert (await inner.get("log/manifest/MANIFEST")).data == b"3"  # it landed
    await store.put("log/manifest/MANIFEST", b"4")
    assert (rule.seen, rule.fired) == (4, 1)
    assert list(store.history) == [
        InjectedFault(seq=3, op="put", key="log/manifest/MANIFEST", kind="crash_after")
    ]


async def test_simulated_crash_is_not_a_store_error(inner: LocalStore) -> None:
    """Code that handles store errors must not swallow a crash by accident."""
    store = FaultyStore(inner)
    store.add_rule(FaultRule("crash_before"))
    with pytest.raises(SimulatedCrash) as got:
        await store.get("k")
    assert isinstance(got.value, Wal3Error)
    assert not isinstance(got.value, StoreUnavailable)


async def test_precondition_hits_only_conditional_writes(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    rule = store.add_rule(FaultRule("precondition", times=2))
    await store.put("k", b"unconditional")  # not matched at all
    with pytest.raises(PreconditionFailed):
        await store.put("new", b"v", if_none_match="*")
    with pytest.raises(ObjectNotFound):
        await inner.get("new")  # refused without being performed
    etag = content_etag(b"unconditional")
    with pytest.raises(PreconditionFailed):
        await store.put("k", b"v2", if_match=etag)
    assert (await inner.get("k")).data == b"unconditional"
    await store.put("k", b"v2", if_match=etag)  # rule exhausted
    assert (rule.seen, rule.fired) == (3, 2)


async def test_precondition_on_conditional_copy(inner: LocalStore) -> None:
    await inner.put("src", b"v")
    store = FaultyStore(inner)
    store.add_rule(FaultRule("precondition", ops={"copy"}, times=1))
    await store.copy("src", "plain")  # unconditional copy: untouched
    with pytest.raises(PreconditionFailed):
        await store.copy("src", "dst", if_none_match="*")
    with pytest.raises(ObjectNotFound):
        await inner.get("dst")
    await store.copy("src", "dst", if_none_match="*")
    assert (await inner.get("dst")).data == b"v"


async def test_latency_rules_and_base_latency(inner: LocalStore) -> None:
    sleep = SleepRecorder()
    store = FaultyStore(inner, latency_s=0.01, jitter_s=0.02, sleep=sleep)
    store.add_rule(FaultRule("latency", ops={"get"}, latency_s=0.5, times=1))
    await store.put("k", b"v")
    await store.get("k")
    await store.get("k")
    assert len(sleep.delays) == 3
    assert all(0.01 <= d <= 0.03 for d in (sleep.delays[0], sleep.delays[2]))
    assert 0.51 <= sleep.delays[1] <= 0.53
    assert store.stats()["faults"] == {
        "latency": 1
    }  # base latency is the store's speed, not a fault


async def test_latency_combines_with_a_failure(inner: LocalStore) -> None:
    sleep = SleepRecorder()
    store = FaultyStore(inner, sleep=sleep)
    store.add_rule(FaultRule("latency", latency_s=0.25))
    store.add_rule(FaultRule("error", ops={"head"}))
    with pytest.raises(StoreUnavailable):
        await store.head("k")
    assert sleep.delays == [0.25]  # slow, then failed: like a timeout
    assert store.stats()["faults"] == {"latency": 1, "error": 1}


async def test_one_failure_per_request_and_later_rules_keep_their_turn(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    first = store.add_rule(FaultRule("error", ops={"get"}, times=1))
    second = store.add_rule(FaultRule("crash_before", ops={"get"}, times=1))
    with pytest.raises(StoreUnavailable):
        await store.get("k")
    with pytest.raises(SimulatedCrash):
        await store.get("k")
    with pytest.raises(ObjectNotFound):
        await store.get("k")
    assert (first.fired, second.fired) == (1, 1)


async def test_list_faults(inner: LocalStore) -> None:
    await inner.put("p/a", b"1")
    await inner.put("p/b", b"2")
    store = FaultyStore(inner)
    store.add_rule(FaultRule("error", ops={"list"}, key_regex="^p/$", times=1))
    with pytest.raises(StoreUnavailable):
        [m async for m in store.list("p/")]
    assert [m.key async for m in store.list("p/")] == ["p/a", "p/b"]
    store.add_rule(FaultRule("crash_after", ops={"list"}, times=1))
    with pytest.raises(SimulatedCrash):
        [m async for m in store.list("p/")]
    assert store.stats()["requests"] == {"list": 3}


async def test_same_seed_same_schedule(tmp_path: Path) -> None:
    async def run(seed: int, root: Path) -> list[tuple[int, str, str]]:
        store = FaultyStore(
            LocalStore(root, fsync=False),
            seed=seed,
            error_rate=0.2,
            lost_response_rate=0.1,
            precondition_storm_rate=0.3,
            jitter_s=0.01,
            sleep=SleepRecorder(),
        )
        store.add_rule(FaultRule("crash_before", ops={"get"}, probability=0.3))
        outcomes = []
        for i in range(150):
            key = f"k/{i % 7}"
            try:
                if i % 3 == 0:
                    await store.put(key, str(i).encode(), if_none_match="*")
                elif i % 3 == 1:
                    await store.put(key, str(i).encode())
                else:
                    await store.get(key)
                outcomes.append((i, "ok", ""))
            except Wal3Error as e:
                outcomes.append((i, type(e).__name__, ""))
        assert store.faults_injected == len(store.history)
        return outcomes + [(f.seq, f.op, f.kind) for f in store.history]

    a = await run(7, tmp_path / "a")
    b = await run(7, tmp_path / "b")
    c = await run(8, tmp_path / "c")
    assert a == b
    assert a != c
    kinds = {kind for _, _, kind in a if kind}
    assert kinds == {"error", "lost_response", "precondition", "crash_before"}


async def test_stats_count_requests_and_faults(inner: LocalStore) -> None:
    store = FaultyStore(inner)
    store.add_rule(FaultRule("error", ops={"head"}, times=2))
    store.add_rule(FaultRule("lost_response", ops={"delete"}, times=1))
    await store.put("k", b"v")
    await store.put("k2", b"v", if_none_match="*")
    await store.get("k")
    for _ in range(3):
        with contextlib.suppress(StoreUnavailable):
            await store.head("k")
    with pytest.raises(StoreUnavailable):
        await store.delete("k2")
    await store.copy("k", "k3")
    [m async for m in store.list("")]
    stats = store.stats()
    assert stats["requests"] == {"put": 2, "get": 1, "head": 3, "delete": 1, "copy": 1, "list": 1}
    assert stats["requests_total"] == 9
    assert stats["faults"] == {"error": 2, "lost_response": 1}
    assert stats["faults_injected"] == store.faults_injected == 3
    store.reset_stats()
    assert store.stats()["requests_total"] == 0 and store.faults_injected == 0 and not store.history


async def test_disable_and_enable(inner: LocalStore) -> None:
    sleep = SleepRecorder()
    store = FaultyStore(inner, error_rate=1.0, latency_s=1.0, sleep=sleep)
    with pytest.raises(StoreUnavailable):
        await store.put("k", b"v")
    store.disable()
    assert not store.enabled
    await store.put("k", b"v")  # recovers: no error, no latency
    assert (await store.get("k")).data == b"v"
    store.enable()
    with pytest.raises(StoreUnavailable):
        await store.get("k")
    with store.faults_disabled():
        assert (await store.get("k")).data == b"v"
    assert store.enabled
    assert sleep.delays == [1.0, 1.0]
    assert store.stats()["requests"] == {"put": 2, "get": 3}
    assert store.faults_injected == 2


async def test_background_storm_only_hits_conditional_puts(inner: LocalStore) -> None:
    store = FaultyStore(inner, precondition_storm_rate=1.0)
    await store.put("k", b"v")
    assert (await store.get("k")).data == b"v"
    with pytest.raises(PreconditionFailed):
        await store.put("k2", b"v", if_none_match="*")
    with pytest.raises(ObjectNotFound):
        await inner.get("k2")


async def test_probability_is_drawn_from_the_seed(inner: LocalStore) -> None:
    store = FaultyStore(inner, seed=3)
    rule = store.add_rule(FaultRule("error", ops={"head"}, probability=0.5))
    await inner.put("k", b"v")
    fired = []
    for _ in range(40):
        try:
            await store.head("k")
            fired.append(False)
        except StoreUnavailable:
            fired.append(True)
    assert 0 < sum(fired) < 40
    assert rule.fired == sum(fired)
    replay = FaultyStore(inner, seed=3)
    replay.add_rule(FaultRule("error", ops={"head"}, probability=0.5))
    again = []
    for _ in range(40):
        try:
            await replay.head("k")
            again.append(False)
        except StoreUnavailable:
            again.append(True)
    assert again == fired


async def test_delegates_url_and_close(inner: LocalStore) -> None:
    closed = []

    class Tracking(LocalStore):
        async def close(self) -> None:
            closed.append(True)

    tracked = Tracking(inner.root)
    store = FaultyStore(tracked, error_rate=1.0)
    assert store.url_for("a/b") == tracked.url_for("a/b")
    await store.close()
    assert closed == [True]
    assert store.stats()["requests_total"] == 0  # neither is a request


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": "explode"},
        {"kind": "error", "ops": {"rename"}},
        {"kind": "precondition", "ops": {"get"}},
        {"kind": "error", "probability": 1.5},
        {"kind": "error", "after": -1},
        {"kind": "latency"},
    ],
)
def test_rule_validation(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        FaultRule(**kwargs)  # type: ignore[arg-type]


def test_store_validation(inner: LocalStore) -> None:
    with pytest.raises(ValueError):
        FaultyStore(inner, error_rate=2.0)
    with pytest.raises(ValueError):
        FaultyStore(inner, latency_s=-1.0)
    with pytest.raises(re.error):
        FaultRule("error", key_regex="(")
