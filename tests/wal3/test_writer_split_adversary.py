"""Adversarial review of the writer split (7e8ef06: writer.py as a facade over batcher.py,
committer.py, recovery.py, idempotency.py, lease.py, appends.py, options.py).

Each test attacks a seam the split created: state handed between the batcher, the committer and
recovery (appends queued while a recovery runs, a writer gone stale with keyed appends sharing
a fragment), another process changing the manifest under a stale etag (a snapshot roll, a seal,
a same-tail edit whose reload fails), error mapping ("not written" only when true), and hostile
input at the facade.  Interleavings are forced by a scripted store (``tests/wal3/scripted.py``):
the script runs before each request, may act as another process on the inner store, and says
whether the request fails; nothing is timed.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import pytest

from wal3 import (
    BatchOptions,
    IdempotencyOptions,
    LocalStore,
    LogContention,
    LogSealed,
    LogWriter,
    LogWriterOptions,
    SnapshotOptions,
    StoreUnavailable,
)
from wal3.fragment import fragment_path
from wal3.layout import join, load_manifest
from wal3.manifest import plan_snapshot
from wal3.paths import MANIFEST_PATH
from wal3.store import ensure_object

from .scripted import OtherWriter, ScriptedStore, Verdict, verified_bodies

PREFIX = "logs/split"
MANIFEST_KEY = join(PREFIX, MANIFEST_PATH)


def _frag_key(seq: int) -> str:
    return join(PREFIX, fragment_path(seq))


def _opts(name: str = "us", **kw: Any) -> LogWriterOptions:
    return LogWriterOptions(writer_name=name, **kw)


async def _settle(cond: Any, what: str) -> None:
    """Let ready tasks run until ``cond()`` holds (no time passes: only yields)."""
    for _ in range(200):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never reached: {what}")


# ------------------------------------------------------------- batcher / recovery seam


async def test_appends_queued_while_recovery_runs_land_after_the_repaired_batch(
    tmp_path: Path,
) -> None:
    """Attack: a manifest write fails outright (every put_resolving attempt), so recovery runs;
    while its read repair is held, plain and keyed appends queue behind it.  Recovery must
    acknowledge our own repaired fragment and hand the batcher the tail after it: the queued
    appends land once each, after it, at the offsets they were answered with."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    st = {"fail_puts": 0, "hold": False}
    in_repair, release = asyncio.Event(), asyncio.Event()

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == MANIFEST_KEY and st["fail_puts"] > 0:
            st["fail_puts"] -= 1
            return "fail"
        if op == "get" and key == _frag_key(2) and st["hold"]:
            st["hold"] = False
            in_repair.set()
            await release.wait()
        return None

    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, _opts())
    # Keyed, so the key window is loaded now: the keyed append below then queues without I/O.
    assert (await w.append_many([b"a"], idempotency_key="A")).first_offset == 1
    st["fail_puts"], st["hold"] = 4, True  # put_resolving's four attempts all fail
    tb = asyncio.create_task(w.append(b"b"))
    await in_repair.wait()
    queued = [asyncio.create_task(w.append(f"q{i}".encode())) for i in range(2)]
    keyed = asyncio.create_task(w.append_many([b"k"], idempotency_key="K"))
    nbytes = (1 + 32) + 2 * (2 + 32) + (1 + 32)  # bytes + 32 per record, as the batcher counts
    await _settle(lambda: w.outstanding_bytes == nbytes, "the appends queued behind recovery")
    release.set()
    pb = await tb
    offs = [(await t).offset for t in queued]
    rk = await keyed
    await w.close()
    assert w.stats["recoveries"] == 1 and w.stats["repaired"] == 1, w.stats
    assert (pb.offset, offs, rk.first_offset, rk.deduplicated) == (2, [3, 4], 5, False)
    assert await verified_bodies(inner, PREFIX) == [b"a", b"b", b"q0", b"q1", b"k"]


async def test_keyed_appends_sharing_a_fragment_keep_their_offsets_after_stale_and_reopen(
    tmp_path: Path,
) -> None:
    """Attack: two keyed appends share one fragment; its manifest write fails and so does the
    reload, so the writer goes stale and answers both "may have been written".  Retries of both
    keys (on the same writer, then on a reopened one) must get the offsets where each sits in
    the repaired fragment, not a second copy, and not each other's."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    st = {"down": False, "hold": True}
    reached, release = asyncio.Event(), asyncio.Event()

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == _frag_key(1) and st["hold"]:
            st["hold"] = False
            reached.set()
            await release.wait()
        if op == "put" and key == _frag_key(2):
            st["down"] = True  # the fragment lands; the manifest side of the store goes down
            return None
        if st["down"] and key == MANIFEST_KEY:
            return "fail"
        return None

    opts = _opts(batch=BatchOptions(max_inflight_fragments=1))
    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, opts)
    t0 = asyncio.create_task(w.append(b"first"))
    await reached.wait()
    # While fragment 1 is in flight (the pipeline is one deep) both keyed appends queue, so
    # they are cut together into fragment 2.
    t1 = asyncio.create_task(w.append_many([b"k1a", b"k1b"], idempotency_key="K1"))
    t2 = asyncio.create_task(w.append_many([b"k2"], idempotency_key="K2"))
    queued = (5 + 32) + (6 + 2 * 32) + (2 + 32)  # bytes + 32 per record, as batcher counts
    await _settle(lambda: w.outstanding_bytes == queued, "both keyed appends queued")
    release.set()
    assert (await t0).offset == 1
    for t in (t1, t2):
        with pytest.raises(StoreUnavailable):
            await t
    assert w.stats["stale"] >= 1, w.stats
    st["down"] = False
    r2 = await w.append_many([b"k2"], idempotency_key="K2")
    r1 = await w.append_many([b"k1a", b"k1b"], idempotency_key="K1")
    assert (r1.first_offset, r1.count, r1.deduplicated) == (2, 2, True)
    assert (r2.first_offset, r2.count, r2.deduplicated) == (4, 1, True)
    await w.close()
    w2 = await LogWriter.open(inner, PREFIX, _opts())
    again = [
        await w2.append_many([b"k1a", b"k1b"], idempotency_key="K1"),
        await w2.append_many([b"k2"], idempotency_key="K2"),
    ]
    await w2.close()
    assert [(r.first_offset, r.count, r.deduplicated) for r in again] == [
        (2, 2, True),
        (4, 1, True),
    ]
    assert await verified_bodies(inner, PREFIX) == [b"first", b"k1a", b"k1b", b"k2"]


# -------------------------------------------------- another process under a stale etag


async def test_snapshot_roll_by_another_process_during_a_write_is_rebased(tmp_path: Path) -> None:
    """Attack: another process rolls the oldest root fragments into a snapshot (same tail)
    between our upload and our manifest put.  Our If-Match fails; the committer must rebase on
    the rolled manifest (not recover, not fail), link our fragment after the roll, and leave
    every record readable exactly once with the setsum intact."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    st = {"roll": False, "rolled": 0}

    async def roll() -> None:
        m, etag = await load_manifest(inner, PREFIX)  # type: ignore[misc]
        snap = plan_snapshot(m, fragment_threshold=3, snapshot_threshold=100, writer="roller")
        assert snap is not None
        await ensure_object(inner, join(PREFIX, snap.path), snap.to_bytes())
        rolled = m.with_snapshot(snap, "roller")
        assert rolled is not None and rolled.same_tail(m)
        await inner.put(MANIFEST_KEY, rolled.to_bytes(), if_match=etag)
        st["rolled"] += 1

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == MANIFEST_KEY and st["roll"]:
            st["roll"] = False
            await roll()
        return None

    # Our own writer never snapshots here: only the other process's roll is in play.
    opts = _opts(snapshot=SnapshotOptions(fragment_threshold=1000))
    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, opts)
    for i in range(5):
        await w.append(f"r{i}".encode())
    st["roll"] = True
    last = await w.append(b"after-roll")
    await w.close()
    assert st["rolled"] == 1 and last.offset == 6
    assert w.stats["recoveries"] == 0 and w.stats["manifest_conflicts"] == 1, w.stats
    m, _ = await load_manifest(inner, PREFIX)  # type: ignore[misc]
    assert len(m.snapshots) == 1
    assert await verified_bodies(inner, PREFIX) == [
        b"r0",
        b"r1",
        b"r2",
        b"r3",
        b"r4",
        b"after-roll",
    ]


async def test_seal_by_another_process_during_a_write_answers_sealed_and_stays_out(
    tmp_path: Path,
) -> None:
    """Attack: another process seals the log between our upload and our manifest put.  The
    rebase sees a sealed manifest: the append is answered ``LogSealed`` (not written), and its
    uploaded fragment must never be linked, not by this writer and not by a reopen."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    st = {"seal": False}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == MANIFEST_KEY and st["seal"]:
            st["seal"] = False
            await other.seal()
        return None

    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, _opts())
    await w.append(b"kept")
    st["seal"] = True
    with pytest.raises(LogSealed):
        await w.append(b"sealed-out")
    await w.close()
    w2 = await LogWriter.open(inner, PREFIX, _opts("later"))
    with pytest.raises(LogSealed):
        await w2.append(b"nope")
    await w2.close()
    assert await verified_bodies(inner, PREFIX) == [b"kept"]


async def test_same_tail_edit_then_failed_reload_is_ambiguous_and_repaired_once(
    tmp_path: Path,
) -> None:
    """Attack (error mapping): another process makes a same-tail edit before our manifest put,
    and the reload after our failed condition fails too.  The writer cannot tell what is linked:
    the append must be answered ``StoreUnavailable`` (never "not written"), the writer must
    recover on its own, and the fragment (which fits the tail) appears exactly once."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    st = {"edit": False, "fail_get": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == MANIFEST_KEY and st["edit"]:
            st["edit"] = False
            m, etag = await load_manifest(inner, PREFIX)  # type: ignore[misc]
            await inner.put(MANIFEST_KEY, replace(m, writer="gc").to_bytes(), if_match=etag)
            st["fail_get"] = 1
        if op == "get" and key == MANIFEST_KEY and st["fail_get"] > 0:
            st["fail_get"] -= 1
            return "fail"
        return None

    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, _opts())
    await w.append(b"a")
    st["edit"] = True
    with pytest.raises(StoreUnavailable):
        await w.append(b"ambiguous")
    later = await w.append(b"later")
    await w.close()
    assert w.stats["stale"] == 1, w.stats
    assert later.offset == 3
    assert await verified_bodies(inner, PREFIX) == [b"a", b"ambiguous", b"later"]


async def test_contention_answer_is_true_even_for_a_keyed_retry(tmp_path: Path) -> None:
    """Attack: another writer appends into the slot our upload was heading for.  Our append is
    answered ``LogContention`` ("not written"): it must never appear (not via our repair, not
    after a reopen), and a retry with its key must append it once, not answer a duplicate."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    st = {"race": False}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == _frag_key(2) and kw["if_none_match"] and st["race"]:
            st["race"] = False
            await other.append(b"theirs")
        return None

    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, _opts())
    await w.append(b"a")
    st["race"] = True
    with pytest.raises(LogContention):
        await w.append_many([b"mine"], idempotency_key="M")
    r = await w.append_many([b"mine"], idempotency_key="M")
    assert (r.first_offset, r.deduplicated) == (3, False)
    await w.close()
    w2 = await LogWriter.open(inner, PREFIX, _opts("later"))
    assert (await w2.append_many([b"mine"], idempotency_key="M")).deduplicated
    await w2.close()
    assert await verified_bodies(inner, PREFIX) == [b"a", b"theirs", b"mine"]


# ------------------------------------------------------------------------ hostile input


@pytest.mark.parametrize("body", [5, [104, 105]], ids=["int", "list-of-ints"])
async def test_a_body_that_is_not_bytes_like_is_refused(tmp_path: Path, body: object) -> None:
    """Attack: a body that is not bytes-like.  ``bytes(5)`` is five zero bytes and
    ``bytes([104, 105])`` is ``b"hi"``: the facade's copy turned a caller's wrong type into a
    silently written record.  It must be refused and nothing written."""
    store = LocalStore(tmp_path / "s", fsync=False)
    w = await LogWriter.open(store, PREFIX, _opts())
    with pytest.raises(TypeError):
        await w.append_many([cast(bytes, body)])
    await w.append(b"ok")
    await w.close()
    assert await verified_bodies(store, PREFIX) == [b"ok"]


async def test_a_keyed_retry_after_reopen_answers_the_original_timestamp(tmp_path: Path) -> None:
    """Attack: the same key answered before and after a reopen.  Offsets agree (pinned above);
    the timestamp the first answer carried must too, or a client comparing answers sees two."""
    store = LocalStore(tmp_path / "s", fsync=False)
    w = await LogWriter.open(store, PREFIX, _opts())
    first = await w.append_many([b"x"], idempotency_key="T")
    await w.close()
    w2 = await LogWriter.open(store, PREFIX, _opts())
    again = await w2.append_many([b"x"], idempotency_key="T")
    await w2.close()
    assert again.deduplicated and again.first_offset == first.first_offset
    assert again.timestamp_us == first.timestamp_us


async def test_a_keyed_retry_answered_from_a_spilled_key_keeps_its_timestamp(
    tmp_path: Path,
) -> None:
    """The same, for a key pushed out of memory (``window_keys``) and answered from its
    fragment's footer by ``KeyWindow.spilled``: the fragment's timestamp, not 0."""
    store = LocalStore(tmp_path / "s", fsync=False)
    w = await LogWriter.open(
        store, PREFIX, _opts(idempotency=IdempotencyOptions(window_keys=1, spill_keys=10))
    )
    first = await w.append_many([b"x"], idempotency_key="A")
    await w.append_many([b"y"], idempotency_key="B")  # pushes A out to the spill
    again = await w.append_many([b"x"], idempotency_key="A")
    assert w.stats["dedup_footer_hits"] == 1  # answered from the footer
    await w.close()
    assert again.deduplicated and again.first_offset == first.first_offset
    assert first.timestamp_us > 0 and again.timestamp_us == first.timestamp_us
