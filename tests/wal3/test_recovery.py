"""Crash recovery and fault tolerance of the writer, driven by FaultyStore."""

from __future__ import annotations

import asyncio
import collections

import pytest

from wal3 import (
    BatchOptions,
    FaultRule,
    FaultyStore,
    LogContention,
    LogWriter,
    LogWriterOptions,
    ObjectStore,
    RetryOptions,
    Setsum,
    SimulatedCrash,
    StoreUnavailable,
    Wal3Error,
    WriterClosed,
)
from wal3.fragment import encode_fragment
from wal3.layout import join, load_manifest

from .helpers import assert_dense, read_all, recomputed_setsum
from .scripted import OtherWriter, ScriptedStore, stays_ahead

FRAGMENT = r"/log/Bucket="
MANIFEST = r"manifest/MANIFEST$"


async def _verify(store: ObjectStore, prefix: str) -> list[bytes]:
    manifest, records = await read_all(store, prefix)
    assert_dense(records, manifest.oldest_offset)
    assert manifest.setsum == await recomputed_setsum(store, prefix, manifest)
    return [r.body for r in records]


@pytest.mark.parametrize("kind", ["crash_before", "crash_after"])
async def test_crash_between_fragment_and_manifest_is_repaired(
    store: ObjectStore, kind: str
) -> None:
    faulty = FaultyStore(store, seed=1)
    w = await LogWriter.open(faulty, "logs/crash")
    await w.append(b"durable")
    # The next manifest write never happens (crash_before) or lands unseen (crash_after).
    rule = faulty.add_rule(FaultRule(kind, ops={"put"}, key_regex=MANIFEST, times=1))
    with pytest.raises((SimulatedCrash, WriterClosed)):
        await w.append(b"in-doubt")
    assert rule.fired == 1
    with pytest.raises(WriterClosed):
        await w.append(b"after-crash")
    faulty.disable()
    w2 = await LogWriter.open(faulty, "logs/crash")
    pos = await w2.append(b"next")  # must not wedge on the orphan at the next seq number
    await w2.close()
    bodies = await _verify(store, "logs/crash")
    # The unacknowledged record is there at most once (linked by read repair or by the crash).
    assert bodies == [b"durable", b"in-doubt", b"next"]
    assert pos.offset == 3


async def test_crash_after_fragment_upload_then_reopen(store: ObjectStore) -> None:
    faulty = FaultyStore(store, seed=2)
    w = await LogWriter.open(faulty, "logs/frag")
    faulty.add_rule(FaultRule("crash_after", ops={"put"}, key_regex=FRAGMENT, after=2, times=1))
    for i in range(2):
        await w.append(f"ok{i}".encode())
    with pytest.raises(Wal3Error):
        await w.append(b"orphaned")
    faulty.disable()
    w2 = await LogWriter.open(faulty, "logs/frag")
    await w2.append_many([b"n1", b"n2"])
    await w2.close()
    assert await _verify(store, "logs/frag") == [b"ok0", b"ok1", b"orphaned", b"n1", b"n2"]


async def test_lost_manifest_responses_are_resolved_not_retried(store: ObjectStore) -> None:
    faulty = FaultyStore(store, seed=3)
    w = await LogWriter.open(faulty, "logs/lost")
    rule = faulty.add_rule(
        FaultRule("lost_response", ops={"put"}, key_regex=MANIFEST, probability=0.5)
    )
    positions = [await w.append(f"l{i}".encode()) for i in range(20)]
    await w.close()
    assert rule.fired > 0
    assert [p.offset for p in positions] == list(range(1, 21))
    assert await _verify(store, "logs/lost") == [f"l{i}".encode() for i in range(20)]


async def test_precondition_storm_rebases_without_failing(store: ObjectStore) -> None:
    faulty = FaultyStore(store, seed=4, precondition_storm_rate=0.3)
    w = await LogWriter.open(faulty, "logs/storm")
    results = await asyncio.gather(
        *(w.append(f"s{i}".encode()) for i in range(40)), return_exceptions=True
    )
    await w.close()
    faulty.disable()
    assert faulty.stats()["faults"].get("precondition", 0) > 0
    acked = {r.offset for r in results if not isinstance(r, BaseException)}
    assert len(acked) == 40, [r for r in results if isinstance(r, BaseException)]
    assert sorted(await _verify(store, "logs/storm")) == sorted(f"s{i}".encode() for i in range(40))


async def test_errors_latency_and_lost_responses_with_idempotent_retries(
    store: ObjectStore,
) -> None:
    """Every record acknowledged exactly once, even with clients retrying through faults."""
    faulty = FaultyStore(
        store,
        seed=5,
        latency_s=0.001,
        jitter_s=0.003,
        error_rate=0.05,
        lost_response_rate=0.05,
        precondition_storm_rate=0.05,
    )
    opts = LogWriterOptions(batch=BatchOptions(interval_s=0.001))
    w = await LogWriter.open(faulty, "logs/faults", opts)
    acked: dict[str, int] = {}
    errors: list[str] = []

    async def client(c: int) -> None:
        nonlocal w
        for i in range(12):
            key = f"c{c}-{i}"
            for _attempt in range(30):
                try:
                    r = await w.append_many([key.encode()], idempotency_key=key)
                except (StoreUnavailable, LogContention) as e:
                    errors.append(repr(e))
                    continue
                except WriterClosed:
                    await asyncio.sleep(0)  # yield before the retry (bounded by attempts)
                    continue
                if key in acked:
                    assert acked[key] == r.first_offset
                acked[key] = r.first_offset
                break
            else:
                raise AssertionError(f"{key} never acknowledged: {errors[-5:]}")

    await asyncio.gather(*(client(c) for c in range(16)))
    await w.close()
    faulty.disable()
    assert faulty.faults_injected > 0
    bodies = await _verify(store, "logs/faults")
    counts = collections.Counter(b.decode() for b in bodies)
    assert set(counts) == set(acked)
    assert max(counts.values()) == 1


async def test_dead_orphan_is_overwritten_not_linked(store: ObjectStore) -> None:
    w = await LogWriter.open(store, "logs/dead")
    await w.append(b"first")
    # A stale speculative upload at seq 2: right start, but it follows a fragment never linked.
    stale = encode_fragment(2, 2, 1, [b"stale"], prev=Setsum.of(b"some other fragment"))
    await store.put(join("logs/dead", stale.path), stale.data, if_none_match="*")
    # And one at seq 3 that does not even start where it should.
    wrong = encode_fragment(3, 99, 1, [b"wrong"])
    await store.put(join("logs/dead", wrong.path), wrong.data, if_none_match="*")
    for i in range(3):
        await w.append(f"after{i}".encode())
    await w.close()
    assert await _verify(store, "logs/dead") == [b"first", b"after0", b"after1", b"after2"]
    loaded = await load_manifest(store, "logs/dead")
    assert loaded is not None and loaded[0].next_seq_no == 5
    assert w.stats["repaired"] == 0 and w.stats["recoveries"] >= 2


async def test_hook_failure_fails_the_write_and_is_retried_by_repair(store: ObjectStore) -> None:
    calls: list[tuple[int, bool]] = []
    failing = {"on": True}

    async def hook(info) -> None:  # type: ignore[no-untyped-def]
        calls.append((info.start, info.repaired))
        if failing["on"]:
            raise StoreUnavailable("dirty log down")

    w = await LogWriter.open(
        store, "logs/hook", LogWriterOptions(retry=RetryOptions(max_append_attempts=2)), hook=hook
    )
    with pytest.raises(StoreUnavailable):
        await w.append(b"tracked?")
    failing["on"] = False
    await w.append(b"later")
    await w.close()
    bodies = await _verify(store, "logs/hook")
    # The orphan from the failed write was linked only once the hook succeeded for it.
    assert bodies == [b"tracked?", b"later"]
    assert (1, True) in calls


async def test_repair_does_not_chase_a_live_writer(store: ObjectStore) -> None:
    """Issue 21 (regression of cf9978a's test, the cause was here): a writer whose append
    collided repaired orphans until none followed the tail.  With another writer appending
    all the time there always was one, so the recovery (and every request waiting on it) ran
    for as long as the other kept writing: past a client's 30 s timeout under load.  Once the
    other writer links the orphan being repaired, the repair stops."""
    prefix = "logs/chase"
    w = await LogWriter.open(store, prefix, LogWriterOptions(writer_name="us"))
    await w.append(b"ours")
    live = OtherWriter(store, prefix, "live")
    rounds = {"left": 40, "used": 0}
    script = stays_ahead(live, rounds)  # a live writer, one fragment ahead

    w._store = ScriptedStore(store, script)  # the same writer, now racing the live one
    await live.append()  # it appends one record, and its next is in flight
    await live.upload_next()
    with pytest.raises(LogContention):
        await w.append(b"collides")  # its upload collides with the live writer's in flight
    # Without the fix the repair lost all 40 races to the live writer (and would go on).
    assert rounds["used"] <= 2, rounds
    await w.close()
    assert (await _verify(store, prefix))[:1] == [b"ours"]
