"""Adversarial tests of read repair's stop rule (0058483: ``LogWriter._repair`` stops once another
writer links the fragment it is linking, and after ``max_rebases`` links per call).

Every interleaving is forced by a scripted store (no sleeps as synchronisation): ``ScriptedStore``
lets a test hold a request until an event, lose a put's answer after it landed, fail a HEAD, or
let "another writer" act on the inner store right before one of our requests.  The other writer
is scripted too (``OtherWriter``): it uploads and links fragments with plain conditional puts, as any
writer of the format would.

The first five tests are the review's findings; each failed on 0058483 and passes since the fix
that followed it: a repair that met another writer linking (rule (a)), or that linked others'
orphans to the end, frees no retry (the append is charged an attempt, and answered
``LogContention`` when they run out), and an upload whose create-only put failed is "absent" only
when a HEAD shows other bytes at its key (a failed HEAD leaves it "unknown").
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from wal3 import (
    BatchOptions,
    LocalStore,
    LogContention,
    LogSealed,
    LogWriter,
    LogWriterOptions,
    ObjectStore,
    RetryOptions,
    StoreUnavailable,
    Wal3Error,
)
from wal3.fragment import fragment_path
from wal3.layout import join, load_manifest
from wal3.manifest import MANIFEST_PATH
from wal3.writer import FragmentInfo

from .scripted import (
    Hooked,
    OtherWriter,
    Script,
    ScriptedStore,
    Verdict,
    stays_ahead,
    verified_bodies,
)

PREFIX = "logs/adv"


def _frag_key(seq: int) -> str:
    return join(PREFIX, fragment_path(seq))


MANIFEST_KEY = join(PREFIX, MANIFEST_PATH)


async def _bodies(store: ObjectStore, prefix: str = PREFIX) -> list[bytes]:
    return await verified_bodies(store, prefix)


async def _open(store: ObjectStore) -> LogWriter:
    opts = LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1))
    return await LogWriter.open(store, PREFIX, opts)


# ------------------------------------------------------------------------------------ findings


async def test_append_chases_a_live_writer_whose_orphan_it_met_unlinked(tmp_path: Path) -> None:
    """Attack: the regression test of 0058483, minus its one line that lets the live writer
    link its first fragment *before* our append collides.  Here our append collides with the live
    writer's fragment while it is still in flight (uploaded, unlinked), which is the ordinary
    state of a pipelining writer.  Each round: our upload fails If-None-Match on its in-flight
    fragment; recovery reloads (nothing new linked: not contention), repair tries to link the
    orphan, the live writer links it first and uploads its next (rule (a) stops the repair);
    progress was made, so the append is re-encoded at no attempt's cost, and it collides with the
    next in-flight fragment.  The append is answered only once the other writer stops: here
    after all 40 of its rounds, in production never while it keeps writing (issue 21's hang)."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    rounds = {"left": 40, "used": 0}
    script = stays_ahead(other, rounds)  # a live writer, one fragment ahead

    w = await _open(ScriptedStore(inner, script))
    rounds["left"] = 0
    await w.append(b"ours")
    await other.upload_next()  # its fragment is in flight when we append
    rounds["left"] = 40
    with contextlib.suppress(LogContention):
        await w.append(b"collides")
    used = rounds["used"]
    rounds["left"] = 0
    await w.close()
    assert (await _bodies(inner))[:1] == [b"ours"]
    # 0058483 promises that a collided append stops chasing once the other writer links the
    # fragment being repaired: a round or two, not as many as the other writer makes.
    assert used <= 4, f"the append waited for {used} of the other writer's appends"


def _two_batches_with_lost_answers(
    head_faults: dict[int, int],
    after_head_faults: dict[int, Callable[[], Awaitable[object]]],
    first_repair_put: Callable[[], Awaitable[object]] | None,
) -> tuple[Script, dict[str, asyncio.Event]]:
    """A script for our fragments 2 and 3: fragment 2's put is held until fragment 3's arrives
    (both in flight at once); each lands but its answer is lost; HEADs of fragment ``s`` then
    fail ``head_faults[s]`` times (after the last, ``after_head_faults[s]`` runs); and
    ``first_repair_put`` runs just before our first If-Match manifest put after that (read
    repair's, the commit never got that far)."""
    ev = {"reached2": asyncio.Event(), "reached3": asyncio.Event()}
    lost = {2, 3}
    heads = dict(head_faults)
    state = {"repair_armed": first_repair_put is not None}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        for s in (2, 3):
            if key != _frag_key(s):
                continue
            if op == "put" and s in lost:
                lost.discard(s)
                ev[f"reached{s}"].set()
                if s == 2:
                    await ev["reached3"].wait()  # both uploads are in flight together
                return "lose"
            if op == "head" and heads.get(s, 0) > 0:
                heads[s] -= 1
                if heads[s] == 0 and s in after_head_faults:
                    await after_head_faults.pop(s)()
                return "fail"
        if (
            op == "put"
            and key == MANIFEST_KEY
            and kw["if_match"]
            and not lost
            and state["repair_armed"]
        ):
            state["repair_armed"] = False
            assert first_repair_put is not None
            await first_repair_put()
        return None

    return script, ev


async def test_rule_a_stop_then_failed_head_duplicates_an_append(tmp_path: Path) -> None:
    """Attack: our own fragment sitting behind the fragment another writer's repair linked.

    Our fragments 2 ("a") and 3 ("b") are in flight together; both land but their answers are
    lost, and the HEADs that would tell (``put_resolving``'s) fail, so both batches are
    ``upload == "unknown"`` with their bytes in the store.  Recovery's repair tries to link
    fragment 2 (our own); another writer's read repair links it first, so our put fails and the
    reload shows fragment 2 linked: rule (a) stops.  Before 0058483 repair went on and linked
    fragment 3 too (our bytes, acknowledged as ours).  Now fragment 3 is left at the tail, kept
    (it continues the log) and re-sent; its If-None-Match fails on its own bytes and the HEAD
    that would recognise them fails once more, so ``_upload`` records "absent".  The next
    recovery's repair links our bytes at 3, ``_linked_as_ours`` says no (an "absent" upload
    never counts), and "b" is re-encoded as fragment 4: one append, two copies, acknowledged."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    script, ev = _two_batches_with_lost_answers({2: 2, 3: 3}, {}, other.link_tail_orphan)
    w = await _open(ScriptedStore(inner, script))
    await w.append(b"ours")
    ta = asyncio.create_task(w.append(b"a"))
    await ev["reached2"].wait()
    tb = asyncio.create_task(w.append(b"b"))
    results = await asyncio.gather(ta, tb, return_exceptions=True)
    await w.close()
    assert other.links == 1  # the other writer's repair linked our fragment 2
    bodies = await _bodies(inner)
    acked = [
        body
        for body, r in zip((b"a", b"b"), results, strict=True)
        if not isinstance(r, BaseException)
    ]
    for body in acked:
        assert bodies.count(body) == 1, (bodies, results)
    assert bodies[:2] == [b"ours", b"a"], bodies


async def test_rule_a_stop_then_failed_head_answers_contention_for_a_written_append(
    tmp_path: Path,
) -> None:
    """Attack: as the test above, but while our fragment 3 is being re-sent the other writer's
    repair links it (our bytes) and appends one record of its own.  Our next recovery sees a
    foreign fragment, refuses fragment 3 as ours ("absent"), and answers "b" with
    ``LogContention`` ("not written") although "b" is in the log at fragment 3."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)

    async def other_links_ours_and_appends() -> None:
        await other.link_tail_orphan()  # our fragment 3, by its read repair
        await other.append(b"theirs")

    script, ev = _two_batches_with_lost_answers(
        {2: 2, 3: 3}, {3: other_links_ours_and_appends}, other.link_tail_orphan
    )
    w = await _open(ScriptedStore(inner, script))
    await w.append(b"ours")
    ta = asyncio.create_task(w.append(b"a"))
    await ev["reached2"].wait()
    tb = asyncio.create_task(w.append(b"b"))
    ra, rb = await asyncio.gather(ta, tb, return_exceptions=True)
    await w.close()
    bodies = await _bodies(inner)
    assert not isinstance(ra, BaseException) and bodies.count(b"a") == 1
    if isinstance(rb, LogContention):
        assert b"b" not in bodies, (
            f"'b' answered LogContention (not written) but the log is {bodies}"
        )
    else:
        assert not isinstance(rb, BaseException), rb
        assert bodies.count(b"b") == 1, bodies


async def test_repair_hook_failure_then_failed_head_duplicates_an_append(tmp_path: Path) -> None:
    """Control for finding 2: the same duplicate without any other writer, through the older
    way repair stops early (the hook fails for the fragment it repairs).  Our fragment 2 lands
    with its answer lost (HEADs fail); repair's hook fails, so the batch is kept and re-sent; the
    HEAD after its If-None-Match fails, "absent"; the next repair links our bytes, they are not
    counted ours, and the append is re-encoded: stored twice."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    lost = {2}
    heads = {2: 3}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if key == _frag_key(2):
            if op == "put" and 2 in lost:
                lost.discard(2)
                return "lose"
            if op == "head" and heads[2] > 0:
                heads[2] -= 1
                return "fail"
        return None

    repaired_calls: list[int] = []

    async def hook(info: FragmentInfo) -> None:
        if info.repaired:
            repaired_calls.append(info.seq_no)
            if len(repaired_calls) == 1:
                raise RuntimeError("dirty log briefly down")

    opts = LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1))
    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, opts, hook=hook)
    await w.append(b"ours")
    with contextlib.suppress(Wal3Error):
        await w.append(b"a")
    await w.close()
    bodies = await _bodies(inner)
    assert bodies.count(b"a") <= 1, bodies


async def test_append_chases_a_live_writer_that_our_repair_keeps_committing(tmp_path: Path) -> None:
    """Attack: the live writer never wins a manifest write of its own (its commit is slower than
    our repair; it learns its fragments were linked by our repair and goes on), and its next
    upload always reaches its slot just before ours.  Rule (a) never fires (nobody else links),
    the cap (64 per repair) never matters (one orphan per round), and each recovery links one
    fragment, so ``progress`` waives the append's attempt: it chases the other writer for as long
    as it uploads (40 rounds here)."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    budget = {"left": 0, "used": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and kw["if_none_match"] and "/log/" in key and budget["left"] > 0:
            budget["left"] -= 1
            budget["used"] += 1
            await other.upload_next()  # its in-flight fragment reaches the slot first
        return None

    w = await _open(ScriptedStore(inner, script))
    await w.append(b"ours")
    budget["left"] = 40
    # Its orphans look like a dead writer's backlog (nobody else links them): linking them is
    # free max_append_attempts rounds, then charged; out of attempts the answer is "another
    # writer kept appending" (LogContention), never a wait as long as it writes.
    with contextlib.suppress(LogContention, StoreUnavailable):
        await w.append(b"collides")
    used = budget["used"]
    budget["left"] = 0
    await w.close()
    assert (await _bodies(inner))[:1] == [b"ours"]
    assert used <= 2 * 3 + 1, f"the append waited for {used} of the other writer's fragments"


# ------------------------------------------------------------------ attacks that found nothing


def _count_manifest_puts(
    fail_first: int, before_nth: dict[int, Callable[[], Awaitable[object]]]
) -> Callable[[str, str, dict[str, Any]], Awaitable[Verdict]]:
    """Our If-Match manifest puts: the first ``fail_first`` fail (StoreUnavailable, nothing
    written: the commit gives up after put_resolving's 4 attempts and recovers); before the
    ``n``-th (1-based, counting the failed ones) ``before_nth[n]`` runs."""
    n = {"puts": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == MANIFEST_KEY and kw["if_match"]:
            n["puts"] += 1
            action = before_nth.pop(n["puts"], None)
            if action is not None:
                await action()
            if n["puts"] <= fail_first:
                return "fail"
        return None

    return script


async def _linked_seqs(store: ObjectStore) -> list[int]:
    m, _ = await load_manifest(store, PREFIX)  # type: ignore[misc]
    return [p.seq_no for p in m.fragments]


def _hold_first_fragment_until(last_seq: int, inner_script: Script) -> tuple[Script, asyncio.Event]:
    """Hold our first fragment upload until fragment ``last_seq``'s upload arrives (so every
    batch is in flight before the first commit), then defer to ``inner_script``."""
    arrived = asyncio.Event()
    state = {"held": False}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and kw.get("if_none_match") and "/log/" in key:
            if key == _frag_key(last_seq):
                arrived.set()
            elif not state["held"]:
                state["held"] = True
                await arrived.wait()
        return await inner_script(op, key, kw)

    return script, arrived


async def test_cap_reached_with_our_own_batches_beyond_it(tmp_path: Path) -> None:
    """Attack (b), the cap, with our own in-flight batches beyond it: five of our fragments are
    uploaded and their commit fails (the store is down for the manifest), so recovery's repair
    meets five orphans of ours and, with ``max_rebases=2``, links only two.  The three beyond the
    cap must be kept (bytes unchanged) and committed, every append acknowledged exactly once, in
    order, and every linked fragment marked by the hook first.  Found nothing: they are."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    hook = Hooked()
    script, _ = _hold_first_fragment_until(5, _count_manifest_puts(4, {}))
    opts = LogWriterOptions(
        writer_name="us", batch=BatchOptions(size_bytes=1), retry=RetryOptions(max_rebases=2)
    )
    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, opts, hook=hook)
    bodies = [f"b{i}".encode() for i in range(5)]
    results = await asyncio.gather(*(w.append(b) for b in bodies))
    await w.close()
    # The cap stopped repair with three of ours beyond it (on 7bc4187 repair linked all five:
    # this line, only, fails there; it pins that the attack reaches the new stop).
    assert w.stats["repaired"] == 2
    assert [r.offset for r in results] == [1, 2, 3, 4, 5]
    assert await _bodies(inner) == bodies
    assert set(await _linked_seqs(inner)) <= hook.seqs()


async def test_rule_a_with_our_settled_batches_behind_the_linked_one(tmp_path: Path) -> None:
    """Attack (a) on our own fragment: our fragments 1..4 are uploaded, their commit fails, and
    while our repair links fragment 1 (ours) another writer's read repair links it first, so
    ours stops with fragments 2..4 (ours, settled) unlinked behind it.  They must be kept and
    committed, not re-encoded (a duplicate) nor failed.  Found nothing: acknowledged once each."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    hook = Hooked()
    # Puts 1-4: the commit of 1..k fails; put 5 is repair's: the other writer links first.
    script, _ = _hold_first_fragment_until(4, _count_manifest_puts(4, {5: other.link_tail_orphan}))
    opts = LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1))
    w = await LogWriter.open(ScriptedStore(inner, script), PREFIX, opts, hook=hook)
    bodies = [f"b{i}".encode() for i in range(4)]
    results = await asyncio.gather(*(w.append(b) for b in bodies), return_exceptions=True)
    await w.close()
    assert other.links == 1
    # Our repair stopped on the other's link, rule (a) (on 7bc4187 it linked 2..4 itself:
    # this line, only, fails there; it pins that the attack reaches the new stop).
    assert w.stats["repaired"] == 0
    assert all(not isinstance(r, BaseException) for r in results), results
    assert await _bodies(inner) == bodies
    assert set(await _linked_seqs(inner)) <= hook.seqs()


async def test_rule_a_when_the_other_writer_also_seals(tmp_path: Path) -> None:
    """Attack (a) on a log being sealed: our fragments 1 and 2 are uploaded, their commit fails;
    while our repair links fragment 1 another writer links it and seals the log.  Fragment 1 is
    ours (acknowledged); fragment 2 gets ``LogSealed`` and must never appear (no later repair may
    link it: a sealed log takes no fragment).  Found nothing."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)

    async def link_and_seal() -> None:
        await other.link_tail_orphan()
        await other.seal()

    script, _ = _hold_first_fragment_until(2, _count_manifest_puts(4, {5: link_and_seal}))
    w = await _open(ScriptedStore(inner, script))
    r1, r2 = await asyncio.gather(w.append(b"one"), w.append(b"two"), return_exceptions=True)
    await w.close()
    assert not isinstance(r1, BaseException), r1
    assert isinstance(r2, LogSealed), r2
    assert await _bodies(inner) == [b"one"]
    w2 = await _open(inner)  # a later writer's recovery does not link it either
    with pytest.raises(LogSealed):
        await w2.append(b"three")
    await w2.close()
    assert await _bodies(inner) == [b"one"]


async def test_rule_a_stop_leaves_a_crashed_writers_orphans_for_the_next_round(
    tmp_path: Path,
) -> None:
    """Attack (a) when the writer that linked the fragment is *not* the live author: a crashed
    writer left fragments 2..4 (a pipelined chain); another recovering writer links 2 while our
    repair tries to, and then dies too.  Rule (a) assumes "its next fragments are its own to
    link": nobody will.  Our append must not wedge behind 3 and 4, and each fragment our
    repair links must be marked by the hook first.  Found nothing: the retry collides with 3,
    the next recovery links 3 and 4 (hooked), and the append lands after them."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    crashed = OtherWriter(inner, PREFIX, name="crashed")
    repairer = OtherWriter(inner, PREFIX, name="repairer")
    hook = Hooked()
    script = _count_manifest_puts(0, {2: repairer.link_tail_orphan})
    w = await LogWriter.open(
        ScriptedStore(inner, script),
        PREFIX,
        LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1)),
        hook=hook,
    )
    await w.append(b"ours")  # manifest put 1
    assert await crashed.upload_chain(3) == [2, 3, 4]
    pos = await w.append(b"collides")
    await w.close()
    assert repairer.links == 1 and pos.offset == 5
    assert await _bodies(inner) == [b"ours", b"crashed1", b"crashed2", b"crashed3", b"collides"]
    assert (3, True) in hook.calls and (4, True) in hook.calls
    assert set(await _linked_seqs(inner)) - {2} <= hook.seqs()


async def test_rule_a_after_our_repair_put_landed_unseen(tmp_path: Path) -> None:
    """Attack (a) with a lost answer: our repair's put of a crashed writer's orphan lands, its
    answer is lost, and before ``put_resolving``'s HEAD another writer appends on top, so the
    put reports a failed condition although it landed (we linked it; rule (a) thinks someone
    else did).  Our append must land once, after both, and nothing may be linked twice.  Found
    nothing."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    crashed = OtherWriter(inner, PREFIX, name="crashed")
    other = OtherWriter(inner, PREFIX)
    state = {"armed": False, "lost": 0}

    async def script(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if not state["armed"] or key != MANIFEST_KEY:
            return None
        if op == "put" and kw["if_match"] and not state["lost"]:
            state["lost"] = 1
            return "lose"
        if op == "head" and state["lost"] == 1:
            state["lost"] = 2
            await other.append(b"theirs")
        return None

    hook = Hooked()
    w = await LogWriter.open(
        ScriptedStore(inner, script),
        PREFIX,
        LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1)),
        hook=hook,
    )
    await w.append(b"ours")
    await crashed.upload_chain(1)
    state["armed"] = True
    pos = await w.append(b"collides")
    await w.close()
    assert state["lost"] == 2
    assert await _bodies(inner) == [b"ours", b"crashed1", b"theirs", b"collides"]
    assert pos.offset == 4
    assert (2, True) in hook.calls


async def test_open_on_more_orphans_than_the_cap(tmp_path: Path) -> None:
    """Attack (b) on the open path: a writer opens a log whose previous writer crashed with more
    orphans than one repair may link (``max_rebases=3``, seven orphans).  Opening does not
    repair; the first append collides, and recoveries must go on until every orphan is linked
    (hooked first) and the append lands after them.
    Found nothing."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    crashed = OtherWriter(inner, PREFIX, name="crashed")
    w0 = await _open(inner)
    await w0.append(b"ours")
    await w0.close()
    await crashed.upload_chain(7)
    hook = Hooked()
    # Linking others' orphans is free max_append_attempts rounds per append (then charged): a
    # backlog cut at the cap takes a few rounds (three here), a writer staying ahead more.
    w = await LogWriter.open(
        inner,
        PREFIX,
        LogWriterOptions(
            writer_name="us2",
            batch=BatchOptions(size_bytes=1),
            retry=RetryOptions(max_rebases=3, max_append_attempts=2),
        ),
        hook=hook,
    )
    pos = await w.append(b"after")
    await w.close()
    assert pos.offset == 9
    assert await _bodies(inner) == [
        b"ours",
        *(f"crashed{i}".encode() for i in range(1, 8)),
        b"after",
    ]
    assert {(s, True) for s in range(2, 9)} <= set(hook.calls)


async def test_our_batch_kept_behind_an_orphan_rule_a_left_then_its_writer_dies(
    tmp_path: Path,
) -> None:
    """Attack (a) on our own batch sitting behind the orphan that repair now leaves: our
    fragments 1 ("a") and 2 ("b") are in flight; 2's upload never lands (the store refuses all
    four tries: "unknown"), 1's commit fails.  While our repair links 1 (ours), another writer's
    repair links it first and uploads its own fragment 2 after it, then dies.  Rule (a) stops
    with its orphan at the tail, and our batch 2 still continues that tail exactly, so it is
    *kept* (not freed) although its slot is taken.  It must neither wedge nor be answered wrongly:
    its re-send fails, the next recovery links the dead writer's orphan (hooked first), and "b"
    is re-encoded at 3.  Found nothing: every append lands once, after the other's record."""
    inner = LocalStore(tmp_path / "s", fsync=False)
    other = OtherWriter(inner, PREFIX)
    hook = Hooked()

    async def link_ours_and_upload_its_own() -> None:
        await other.link_tail_orphan()  # our fragment 1, by its read repair
        await other.upload_next()  # its own fragment 2 (follows ours), never linked: it dies

    refusals = {"left": 4}

    async def refuse_fragment_2(op: str, key: str, kw: dict[str, Any]) -> Verdict:
        if op == "put" and key == _frag_key(2) and refusals["left"] > 0:
            refusals["left"] -= 1
            return "fail"
        return await manifest_script(op, key, kw)

    manifest_script = _count_manifest_puts(4, {5: link_ours_and_upload_its_own})
    script, _ = _hold_first_fragment_until(2, refuse_fragment_2)
    w = await LogWriter.open(
        ScriptedStore(inner, script),
        PREFIX,
        LogWriterOptions(writer_name="us", batch=BatchOptions(size_bytes=1)),
        hook=hook,
    )
    ra, rb = await asyncio.gather(w.append(b"a"), w.append(b"b"), return_exceptions=True)
    await w.close()
    assert other.links == 1 and refusals["left"] == 0
    assert not isinstance(ra, BaseException) and not isinstance(rb, BaseException), (ra, rb)
    assert await _bodies(inner) == [b"a", b"other1", b"b"]
    assert rb.offset == 3
    assert (2, True) in hook.calls
    # Two recoveries: the commit's (rule (a) stopped it), then the kept batch's failed re-send
    # (that repair linked the dead writer's orphan).  On 7bc4187 the first repair linked the
    # orphan at once: this line, only, fails there; it pins that the attack reaches the new stop.
    assert w.stats["recoveries"] == 2 and w.stats["repaired"] == 1
