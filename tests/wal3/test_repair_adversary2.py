"""Second adversarial round on read repair's stop rule and the attempt charging that followed it
(0058483: ``_repair`` stops once another writer links the fragment it is linking, and after
``max_rebases`` links; 1cec3ff: a recovery whose progress came from others frees no retry, out of
attempts the append is answered ``LogContention`` if a writer was met, else ``StoreUnavailable``;
``_repaired_foreign`` does not count fragments whose footer names our writer; a failed or empty
HEAD after a failed create-only put leaves the upload "unknown").

Every interleaving is forced by a scripted store (no sleeps as synchronisation): ``ScriptedStore``
runs ``script(op, key, kwargs)`` before each request, which may act as another writer on the
inner store and says whether the request fails or loses its answer.  The other writer is
scripted too (``OtherWriter``): plain conditional puts, as any writer of the format would.
The first three tests are the round's findings; each failed on 1cec3ff and passes since the fix
that followed: a repair cut at ``max_rebases`` is charged like any linking of others' orphans;
"ours" is bytes this writer encoded (their MD5), never a name in a footer; and a repair put whose
condition was found failed only after an ambiguous attempt (``ResolvedPreconditionFailed``) does
not count as meeting a writer.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

from wal3 import (
    BatchOptions,
    LocalStore,
    LogContention,
    LogWriter,
    LogWriterOptions,
    ObjectStore,
    RetryOptions,
    StoreUnavailable,
)
from wal3.fragment import (
    encode_fragment,
    fragment_path,
    request_digest,
)
from wal3.layout import join, load_manifest
from wal3.manifest import MANIFEST_PATH

from .scripted import (
    Hooked,
    OtherWriter,
    ScriptedStore,
    Verdict,
    stays_ahead,
    verified_bodies,
)

PREFIX = "logs/adv2"
MANIFEST_KEY = join(PREFIX, MANIFEST_PATH)


def _frag_key(seq: int) -> str:
    return join(PREFIX, fragment_path(seq))


async def _bodies(store: ObjectStore, prefix: str = PREFIX) -> list[bytes]:
    return await verified_bodies(store, prefix)


async def _gc_touches_manifest(store: Any) -> None:
    """A collector's manifest edit that leaves the tail alone (here: it only names itself, as
    recording a pending cut would): a same-tail write, nobody appended."""
    m, etag = await load_manifest(store, PREFIX)
    await store.put(MANIFEST_KEY, replace(m, writer="gc").to_bytes(), if_match=etag)


async def _open(store: Any, name: str = "us", **retry: Any) -> Any:
    opts = LogWriterOptions(
        writer_name=name, batch=BatchOptions(size_bytes=1), retry=RetryOptions(**retry)
    )
    return await LogWriter.open(store, PREFIX, opts)


def _is_fragment(key: str) -> bool:
    return key.startswith(join(PREFIX, "log/"))


# ------------------------------------------------------------------------------------ findings


async def test_a_live_writer_deeper_than_the_cap_is_chased_for_free(tmp_path: Path) -> None:
    """Attack: the "our repair keeps committing" live writer of the first round, with a pipeline
    deeper than ``max_rebases`` (here 3 in flight, ``max_rebases=2``; the default pipeline is 8
    fragments).  Its commits always lose to our repair, and before each of our uploads it tops
    its pipeline up again.  Our upload collides with its first in-flight fragment; repair links
    two of its fragments and stops at the cap with a third waiting: "a backlog, the next
    recovery goes on", so the recovery counts as progress and costs the append nothing.  The
    retry collides with that third fragment, and so on: the append is re-encoded round after
    round at no attempt's cost for as long as the other writer uploads (20 rounds here).  The
    rule "a live writer holds an append for at most max_append_attempts recoveries" does not
    hold: a cut at the cap cannot tell a dead writer's backlog from a live writer ahead.  With
    the defaults (``max_rebases`` 64, ``max_inflight_fragments`` 8) one such writer is not deep
    enough; it takes a ``max_rebases`` below another writer's pipeline (or several writers, or
    same-tail edits during the repair: every failed put uses up one of its iterations)."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    rounds = {"left": 0, "used": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and kw["if_none_match"] and _is_fragment(key) and rounds["left"] > 0:
            rounds["left"] -= 1
            rounds["used"] += 1
            await other.top_up(3)  # its pipeline reaches our slot first, three deep
        return None

    w = await _open(ScriptedStore(inner, script), max_rebases=2)
    await w.append(b"ours")
    rounds["left"] = 20
    with contextlib.suppress(LogContention, StoreUnavailable):
        await w.append(b"collides")
    used = rounds["used"]
    rounds["left"] = 0
    await w.close()
    bodies = await _bodies(inner)
    assert bodies[0] == b"ours" and bodies.count(b"collides") <= 1, bodies
    assert used <= 2 * w.options.retry.max_append_attempts + 1, (  # free rounds, then charged
        f"the append was retried into {used} of the other writer's pipelines"
    )


async def test_a_live_writer_with_our_name_is_chased_for_free(tmp_path: Path) -> None:
    """Attack: finding 5 of the first round (a live writer whose uploads always reach our slot
    just before ours, and whose commits lose to our repair) when that writer has our name.
    ``_repaired_foreign`` skips fragments whose footer names our writer ("an earlier attempt of
    ours"), so each recovery that links the other's fragment is progress and frees the retry:
    the append chases it for as long as it uploads.  Two processes with one name are not
    hypothetical: the log host's dirty log is written by ``loghost:<server_id>`` (not unique per
    process, ``name_is_unique`` is False), and a restart racing its predecessor under one server
    id is what the manager's comment on its own (unique) names guards against; the default name
    ``host:pid`` is shared by two containers with the host's network namespace and pid 1."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    name = "loghost:s1"
    other = OtherWriter(
        inner, PREFIX, name=name
    )  # the predecessor process, still writing the dirty log
    rounds = {"left": 0, "used": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and kw["if_none_match"] and _is_fragment(key) and rounds["left"] > 0:
            rounds["left"] -= 1
            rounds["used"] += 1
            await other.upload_next()  # its in-flight fragment reaches the slot first
        return None

    w = await _open(ScriptedStore(inner, script), name=name)
    await w.append(b"ours")
    rounds["left"] = 40
    with contextlib.suppress(LogContention, StoreUnavailable):
        await w.append(b"collides")
    used = rounds["used"]
    rounds["left"] = 0
    await w.close()
    bodies = await _bodies(inner)
    assert bodies[0] == b"ours" and bodies.count(b"collides") <= 1, bodies
    assert used <= 2 * w.options.retry.max_append_attempts + 1, (  # free rounds, then charged
        f"the append waited for {used} of the other writer's fragments"
    )


async def test_gc_edit_over_our_lost_repair_put_answers_contention(tmp_path: Path) -> None:
    """Attack: rule (a) decides "a live writer linked it" from a failed put plus a reload that
    shows the slot linked.  Our own put, landed with its answer lost, gives the same picture
    once anything else is written over it before ``put_resolving``'s HEAD: a collector's
    same-tail edit (a cut, a pending floor) is enough, no writer involved.

    Only a crashed writer's orphan (uploaded after we opened, never linked by it) sits at slot
    2.  Our append collides with it; our repair links the orphan, that put lands but its answer
    is lost, and a collector edits the manifest before our HEAD, so ``put_resolving`` reports a
    failed condition.  The reload shows slot 2 linked: ``_repair_met_writer``.  The append, out
    of attempts, is answered ``LogContention`` ("another writer kept appending") although the
    only installs since we opened are ours and the collector's (the simulator's ``contention``
    check flags exactly this); the design's answer for a dead writer's orphan is
    ``StoreUnavailable``.  ``max_append_attempts=1`` makes the one collision the last attempt;
    with the default 3 the same coincidence does it on the last of three charged recoveries
    (e.g. after two other dead writers' orphans, each linked to the end and charged).  Before
    1cec3ff the recovery was progress and the append landed after the orphan."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    crashed = OtherWriter(inner, PREFIX, name="crashed")
    state = {"armed": False, "lost": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if not state["armed"] or key != MANIFEST_KEY:
            return None
        if op == "put" and kw["if_match"] and state["lost"] == 0:
            state["lost"] = 1
            return "lose"  # our repair's put of the orphan lands; its answer is lost
        if op == "head" and state["lost"] == 1:
            state["lost"] = 2
            await _gc_touches_manifest(inner)  # a collector writes before our HEAD
        return None

    hook = Hooked()
    w = await LogWriter.open(
        ScriptedStore(inner, script),
        PREFIX,
        LogWriterOptions(
            writer_name="us",
            batch=BatchOptions(size_bytes=1),
            retry=RetryOptions(max_append_attempts=1),
        ),
        hook=hook,
    )
    await w.append(b"ours")
    assert await crashed.upload_chain(1) == [2]
    state["armed"] = True
    r = await asyncio.gather(w.append(b"x"), return_exceptions=True)
    await w.close()
    assert state["lost"] == 2 and (2, True) in hook.calls
    bodies = await _bodies(inner)
    assert bodies[:2] == [b"ours", b"crashed1"], bodies
    # Nobody but us and a collector wrote the manifest since we opened: never "contention".
    assert not isinstance(r[0], LogContention), (r[0], bodies)


# ------------------------------------------------------------------ attacks that found nothing


async def test_keyed_retry_whose_first_attempt_lies_beyond_the_cap(tmp_path: Path) -> None:
    """Attack: idempotency keys learned from repaired fragments, with the cap in the way.  A
    crashed writer left a pipelined chain of four orphans; the last one holds the client's first
    attempt of a keyed append (answered ambiguously before the crash).  The client retries it on
    our writer (``max_rebases=2``).  Its batch collides with the first orphan; repair links two
    (capped: a backlog, the retry is free), the key is not among them, so it is re-encoded and
    collides again; the next repair links the last two and learns the key.  The retry must be
    answered as a duplicate of the orphan's records, never stored a second time.  Found
    nothing: it is."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    w0 = await _open(inner, name="w0")
    await w0.append(b"ours")
    await w0.close()
    m, _ = await load_manifest(inner, PREFIX)
    seq, off, prev = m.next_seq_no, m.next_offset, m.tail_setsum
    for i in range(4):
        bodies = [f"crashed{i}".encode()] if i < 3 else [b"keyed"]
        keys = {"k": (off, 1, request_digest([b"keyed"]))} if i == 3 else {}
        frag = encode_fragment(seq, off, 1_000 + i, bodies, prev=prev, keys=keys, writer="crashed")
        await inner.put(join(PREFIX, frag.path), frag.data, if_none_match="*")
        seq, off, prev = seq + 1, frag.limit, frag.setsum
    hook = Hooked()
    w = await LogWriter.open(
        inner,
        PREFIX,
        LogWriterOptions(
            writer_name="us", batch=BatchOptions(size_bytes=1), retry=RetryOptions(max_rebases=2)
        ),
        hook=hook,
    )
    r = await w.append_many([b"keyed"], idempotency_key="k")
    after = await w.append(b"after")
    await w.close()
    assert r.deduplicated and r.first_offset == 5, r
    assert after.offset == 6
    assert await _bodies(inner) == [
        b"ours",
        b"crashed0",
        b"crashed1",
        b"crashed2",
        b"keyed",
        b"after",
    ]
    assert {(s, True) for s in range(2, 6)} <= set(hook.calls)


async def test_backlog_past_the_cap_with_a_hook_fault_midway(tmp_path: Path) -> None:
    """Attack: a crashed writer's backlog larger than ``max_rebases`` (five orphans, cap 2) with
    the dirty log failing once in the middle of a repair (that repair stops early: not capped,
    and it linked another writer's orphan, so the append is charged).  The append must still be
    answered in a few recoveries, land once after the whole backlog, and every fragment repair
    linked must have been marked first.  Found nothing: one attempt is charged, it lands."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    w0 = await _open(inner, name="w0")
    await w0.append(b"ours")
    await w0.close()
    crashed = OtherWriter(inner, PREFIX, name="crashed")
    await crashed.upload_chain(5)
    marked: list[int] = []
    fail = {"at": 2}

    async def hook(info: Any) -> None:
        if info.repaired:
            fail["at"] -= 1
            if fail["at"] == -1:  # the third repaired fragment: the dirty log is briefly down
                raise RuntimeError("dirty log briefly down")
            marked.append(info.seq_no)

    w = await LogWriter.open(
        inner,
        PREFIX,
        LogWriterOptions(
            writer_name="us", batch=BatchOptions(size_bytes=1), retry=RetryOptions(max_rebases=2)
        ),
        hook=hook,
    )
    pos = await w.append(b"after")
    await w.close()
    assert pos.offset == 7
    assert w.stats["recoveries"] <= 4, w.stats
    assert await _bodies(inner) == [
        b"ours",
        *(f"crashed{i}".encode() for i in range(1, 6)),
        b"after",
    ]
    assert set(range(2, 7)) <= set(marked)  # every orphan repair linked was marked first


async def test_appends_answered_not_written_after_meeting_a_live_writer_stay_out(
    tmp_path: Path,
) -> None:
    """Attack: the "not written" answers 1cec3ff adds (``LogContention`` once a writer was met
    ``max_append_attempts`` times).  Three appends are pipelined (three fragments of ours in
    flight, all landed) when they collide with a live writer that links its in-flight fragment
    and uploads the next each time our repair tries to link (rule (a) every round).  Each round
    frees all three (charged); after three they are answered "not written".  Their landed
    objects must never be linked afterwards, by anyone's repair: a fresh writer then appends
    and reads the log.  Found nothing: none of them is in the log.  (On 7bc4187 and 0058483 it
    fails at the bound on rounds, the first round's finding 1, not at the safety checks.)"""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    rounds = {"left": 0, "used": 0}
    script = stays_ahead(other, rounds)  # a live writer, one fragment ahead

    w = await _open(ScriptedStore(inner, script))
    await w.append(b"ours")
    await other.upload_next()
    rounds["left"] = 40
    results = await asyncio.gather(
        *(w.append(b) for b in (b"a", b"b", b"c")), return_exceptions=True
    )
    rounds["left"] = 0
    await w.close()
    assert rounds["used"] <= 4, rounds
    later = await _open(inner, name="later")
    await later.append(b"later")
    await later.close()
    bodies = await _bodies(inner)
    for body, r in zip((b"a", b"b", b"c"), results, strict=True):
        if isinstance(r, (LogContention, StoreUnavailable)) and "not written" in str(r):
            assert body not in bodies, (body, r, bodies)
        else:
            assert not isinstance(r, BaseException), r
            assert bodies.count(body) == 1, (body, bodies)


async def test_unknown_upload_marked_dead_over_another_writers_orphan(tmp_path: Path) -> None:
    """Attack: 1cec3ff leaves an upload "unknown" when the HEAD after its failed create-only put
    fails, and ``_sort_leftovers`` marks a freed "unknown" batch's slot dead (to overwrite it
    with If-Match on our bytes' etag).  Here that slot holds another writer's orphan, not our
    bytes: our fragments 2 and 3 both collide with the other writer's in-flight 2 and 3, and the
    HEAD after 3's collision fails.  The recovery's repair links the other's 2 and the dirty log
    then fails for its 3 (repair stops there), so our 2 and 3 are freed, 3 "unknown" with the
    other's orphan at its slot, marked dead.  The retry at 3 must not replace the other's bytes
    (If-Match on ours fails), and must land after it.  Found nothing."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    arrived = asyncio.Event()
    state = {"armed": False, "head3": 1}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if not state["armed"]:
            return None
        if op == "put" and kw["if_none_match"] and key == _frag_key(3) and not arrived.is_set():
            await other.upload_chain(2)  # the other's 2 and 3 reach the slots first
            arrived.set()
        if op == "put" and kw["if_none_match"] and key == _frag_key(2):
            await arrived.wait()  # both our fragments are in flight together
        if op == "head" and key == _frag_key(3) and state["head3"] > 0:
            state["head3"] -= 1
            return "fail"
        return None

    repaired: list[int] = []

    async def hook(info: Any) -> None:
        if info.repaired:
            repaired.append(info.seq_no)
            if info.seq_no == 3 and repaired.count(3) == 1:
                raise RuntimeError("dirty log briefly down")

    w = await LogWriter.open(
        ScriptedStore(inner, script),
        PREFIX,
        LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1)),
        hook=hook,
    )
    await w.append(b"ours")
    held = (await inner.head(_frag_key(1))).etag
    state["armed"] = True
    ta = asyncio.create_task(w.append(b"a"))
    await asyncio.sleep(0)
    tb = asyncio.create_task(w.append(b"b"))
    results = await asyncio.gather(ta, tb, return_exceptions=True)
    await w.close()
    assert state["head3"] == 0 and repaired.count(3) >= 2, (state, repaired)
    assert (await inner.head(_frag_key(1))).etag == held
    bodies = await _bodies(inner)
    assert bodies[:3] == [b"ours", b"other1", b"other2"], bodies
    for body, r in zip((b"a", b"b"), results, strict=True):
        if isinstance(r, BaseException):
            assert "not written" in str(r) and body not in bodies, (r, bodies)
        else:
            assert bodies.count(body) == 1, bodies


async def _collect_through(store: Any, seq: int) -> None:
    """A collector's cut: unlink fragments up to ``seq`` and delete their objects."""
    m, etag = await load_manifest(store, PREFIX)
    keep = [p for p in m.fragments if p.seq_no > seq]
    gone = [p for p in m.fragments if p.seq_no <= seq]
    collected = m.collected
    for p in gone:
        collected = collected + p.setsum
    cut = replace(
        m,
        fragments=tuple(keep),
        collected=collected,
        writer="gc",
        initial_offset=keep[0].start,
        initial_seq_no=keep[0].seq_no,
    )
    cut.check()
    await store.put(MANIFEST_KEY, cut.to_bytes(), if_match=etag)
    for p in gone:
        await store.delete(join(PREFIX, p.path))


async def test_our_fragment_linked_and_collected_while_its_put_was_resolved(tmp_path: Path) -> None:
    """Attack: the "unknown" upload reaching ``_linked_as_ours`` with its key gone.  Our
    fragment 2 lands with its answer lost and the HEAD that would tell fails; the retried
    create-only put fails on our own bytes, and before the HEAD that follows, another writer's
    read repair links our fragment, appends its own, and a collector cuts and deletes ours.
    Every HEAD now finds nothing.  "a" was in the log: it must not be answered "not written"
    (on 7bc4187 the upload was "absent", ``_foreign`` saw a missing object of ours and called it
    contention: ``LogContention`` for a linked append).  Found nothing on 1cec3ff: the upload is
    "unknown" and the answer is "may have been written"."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    state = {"puts": 0, "heads": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if key != _frag_key(2):
            return None
        if op == "put":
            state["puts"] += 1
            return "lose" if state["puts"] == 1 else None
        if op == "head":
            state["heads"] += 1
            if state["heads"] == 1:
                return "fail"
            if state["heads"] == 2:
                await other.link_tail_orphan()  # our fragment 2, by its read repair
                await other.append()
                await _collect_through(inner, 2)
        return None

    w = await _open(ScriptedStore(inner, script))
    await w.append(b"ours")
    r = await asyncio.gather(w.append(b"a"), return_exceptions=True)
    await w.close()
    assert state["puts"] == 2 and state["heads"] >= 2, state
    m, _ = await load_manifest(inner, PREFIX)
    assert m.oldest_offset == 3 and m.next_offset == 4  # "a" was linked at 2, then collected
    assert isinstance(r[0], StoreUnavailable) and "not written" not in str(r[0]), r
