"""``Committer`` (wal3/committer.py) rule by rule, driven directly: what it links and in which
write, what it answers and with what, when it rebases and when it hands over to recovery, how a
take-over is claimed and fenced, how snapshots are planned, linked and dropped, how the writer's
life ends, and what it logs.  Written against the mutation run of the module
(docs/RELIABILITY.md): each test names the mutants it kills; the equivalent and unkilled ones are
listed at the end of the file.

The committer is built as ``LogWriter`` builds it, with its real ``Lease`` (on a manual clock)
over an in-memory store whose requests a test can hold, fail or precede with another writer's
write, and with recording stand-ins for the batcher, recovery and the key window: a batch is
whatever a test puts in flight, so each rule is observable on its own.  The writer-level cases
are tests/wal3/test_writer.py and the adversary files.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

import pytest

from wal3 import LeaseOptions, LogWriterOptions, RetryOptions, SnapshotOptions
from wal3.committer import Committer
from wal3.errors import (
    LogSealed,
    ObjectNotFound,
    PreconditionFailed,
    SimulatedCrash,
    StoreUnavailable,
    WriterClosed,
)
from wal3.lease import Lease, lease_ms
from wal3.manifest import FragmentPointer, Manifest, Snapshot
from wal3.paths import MANIFEST_PATH, fragment_path, join
from wal3.setsum import Setsum
from wal3.store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

from .test_read_lease import ManualClock

PREFIX = "logs/x"
NAME = "w"
KEY = join(PREFIX, MANIFEST_PATH)
MANIFEST_RX = r"manifest/MANIFEST$"
SNAPSHOT_RX = r"/snapshot/SNAPSHOT\."


async def settle(turns: int = 300) -> None:
    """Let every ready task run (nothing here waits on real time)."""
    for _ in range(turns):
        await asyncio.sleep(0)


T = TypeVar("T")


async def done(aw: Awaitable[T]) -> T:
    """What ``aw`` answers, due once the ready tasks have run: it waits on nothing else here (a
    write that never comes fails the test at once instead of hanging it)."""
    task = asyncio.ensure_future(aw)
    for _ in range(5000):
        if task.done():
            return task.result()
        await asyncio.sleep(0)
    raise AssertionError(f"still waiting: {aw!r}")


# ------------------------------------------------------------------------------ the store

Action = Callable[[str, dict[str, Any]], Awaitable[None]]


@dataclass
class _Rule:
    op: str
    rx: re.Pattern[str]
    action: Action
    times: int


class Gate:
    """Holds one request until ``release`` is set; ``reached`` says it arrived."""

    def __init__(self) -> None:
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    async def __call__(self, key: str, kw: dict[str, Any]) -> None:
        self.reached.set()
        await self.release.wait()


class MemStore(ObjectStore):
    """Objects in a dict, etags the content MD5 (as S3 and the local store give them).  Before
    each request the first matching rules run (hold it, fail it, or write as another writer).
    Every request takes a few loop turns, as a round trip never answers at once."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self._rules: list[_Rule] = []

    def on(self, op: str, regex: str, action: Action, times: int = 1) -> None:
        self._rules.append(_Rule(op, re.compile(regex), action, times))

    def hold(self, op: str, regex: str) -> Gate:
        gate = Gate()
        self.on(op, regex, gate)
        return gate

    def fail(self, op: str, regex: str, error: Callable[[], BaseException], times: int = 1) -> None:
        async def act(key: str, kw: dict[str, Any]) -> None:
            raise error()

        self.on(op, regex, act, times)

    def puts(self, regex: str) -> list[dict[str, Any]]:
        """The puts that reached the store (held, failed or landed) for keys matching ``regex``."""
        return [kw for op, key, kw in self.requests if op == "put" and re.search(regex, key)]

    def manifest_puts(self) -> list[Manifest]:
        return [Manifest.from_bytes(kw["data"]) for kw in self.puts(MANIFEST_RX)]

    async def _before(self, op: str, key: str, kw: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self.requests.append((op, key, kw))
        for rule in list(self._rules):
            if rule.times > 0 and rule.op == op and rule.rx.search(key):
                rule.times -= 1
                await rule.action(key, kw)

    async def get(self, key: str) -> GetResult:
        await self._before("get", key, {})
        if key not in self.objects:
            raise ObjectNotFound(key)
        data = self.objects[key]
        return GetResult(data, content_etag(data))

    async def head(self, key: str) -> ObjectMeta:
        await self._before("head", key, {})
        if key not in self.objects:
            raise ObjectNotFound(key)
        data = self.objects[key]
        return ObjectMeta(key, content_etag(data), len(data), 0.0)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        check_condition(if_none_match, if_match)
        await self._before("put", key, {"data": data, "if_match": if_match})
        held = self.objects.get(key)
        if if_none_match is not None and held is not None:
            raise PreconditionFailed(key)
        if if_match is not None and (held is None or content_etag(held) != if_match.strip('"')):
            raise PreconditionFailed(key)
        self.objects[key] = data
        return content_etag(data)

    async def delete(self, key: str) -> None:
        await self._before("delete", key, {})
        self.objects.pop(key, None)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        for key in sorted(k for k in self.objects if k.startswith(prefix)):
            if start_after is None or key > start_after:
                yield ObjectMeta(key, content_etag(self.objects[key]), len(self.objects[key]), 0.0)

    def url_for(self, key: str) -> str:
        return f"mem://{key}"

    # Another writer of the log, writing the stored manifest directly.
    def rewrite(self, change: Callable[[Manifest], Manifest]) -> bytes:
        data = change(Manifest.from_bytes(self.objects[KEY])).to_bytes()
        self.objects[KEY] = data
        return data

    def stored(self) -> Manifest:
        return Manifest.from_bytes(self.objects[KEY])


def before_our_manifest_put(store: MemStore, action: Action, times: int = 1) -> None:
    """Run ``action`` before each of the next ``times`` conditional manifest puts."""
    store.on("put", MANIFEST_RX, action, times)


# --------------------------------------------------------------------- the other parts


def frag(seq: int, start: int, count: int = 1) -> FragmentPointer:
    return FragmentPointer(
        fragment_path(seq),
        seq,
        start,
        start + count,
        100 * count,
        Setsum.of(b"%d@%d" % (seq, start)),
    )


def root(n: int, *, writer: str = NAME, lease: int | None = 0, sealed: bool = False) -> Manifest:
    """A log of ``n`` one-record fragments (seq i holds offset i), as ``writer`` wrote it."""
    frags = tuple(frag(i, i) for i in range(1, n + 1))
    return Manifest(
        setsum=Setsum.sum(f.setsum for f in frags),
        acc_bytes=100 * n,
        writer=writer,
        fragments=frags,
        sealed=sealed,
        read_lease_ms=lease,
    )


def more_bytes(n: int) -> Callable[[Manifest], Manifest]:
    """An edit that leaves the tail alone (as a GC cut or a floor does): ``acc_bytes`` grows."""
    return lambda m: replace(m, acc_bytes=m.acc_bytes + n)


class FakeBatch:
    """A batch as the committer sees it: done or not, failed or not, and its pointer."""

    def __init__(self, seq: int, *, done: bool = True, error: BaseException | None = None):
        self.seq_no = seq
        self.done = done
        self.error = error
        self.pointer = frag(seq, seq)


class FakeBatcher:
    """Records what the committer tells the batcher; ``in_flight`` is the test's."""

    def __init__(self) -> None:
        self.flight: dict[int, FakeBatch] = {}
        self.queued = 0
        self.kicks = 0
        self.sealed_calls = 0
        self.acked: list[list[int]] = []
        self.failed_all: list[BaseException] = []
        self.bug: BaseException | None = None  # raised by ``in_flight`` (a bug in a part)
        self.fail_all_bug: BaseException | None = None

    @property
    def in_flight(self) -> dict[int, FakeBatch]:
        if self.bug is not None:
            raise self.bug
        return self.flight

    @property
    def idle(self) -> bool:
        return not self.queued and not self.flight

    @property
    def has_queued(self) -> bool:
        return self.queued > 0

    def kick(self) -> None:
        self.kicks += 1

    def fail_sealed(self) -> None:
        # As the real one: what is done in flight is answered (failed) and forgotten.
        self.sealed_calls += 1
        for seq in [s for s, b in self.flight.items() if b.done]:
            del self.flight[seq]

    def acknowledge(self, linked: list[FakeBatch]) -> None:
        self.acked.append([b.seq_no for b in linked])
        for b in linked:
            self.flight.pop(b.seq_no, None)

    def fail_all(self, err: BaseException) -> None:
        self.failed_all.append(err)
        self.flight.clear()
        if self.fail_all_bug is not None:
            raise self.fail_all_bug


class FakeKeys:
    def __init__(self) -> None:
        self.expired = 0
        self.failed: list[BaseException] = []

    def expire(self) -> None:
        self.expired += 1

    def fail_waiters(self, err: BaseException) -> None:
        self.failed.append(err)


class FakeRecovery:
    """Records each recovery; by default one reloads (unless handed the manifest), forgets the
    failed batches in flight and installs what it loaded, as the real one ends."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.stale = False
        self.calls: list[tuple[Manifest, str] | None] = []
        self.link_others: list[bool] = []  # what each recover() was asked
        self.stale_errors: list[BaseException] = []
        self.progress = 0

    def progressed(self) -> None:
        self.progress += 1

    async def recover(
        self, reloaded: tuple[Manifest, str] | None = None, *, link_others: bool = True
    ) -> None:
        self.calls.append(reloaded)
        self.link_others.append(link_others)
        if reloaded is None:
            reloaded = await self.rig.lease.load()
        assert reloaded is not None
        flight = self.rig.batcher.flight
        for seq in [s for s, b in flight.items() if b.done and b.error is not None]:
            del flight[seq]
        self.stale = False
        self.rig.c.installed(reloaded[0], reloaded[1], [])

    def go_stale(self, err: BaseException) -> None:
        self.stale_errors.append(err)
        self.stale = True
        self.rig.c.wake()  # the real one wakes the committer a moment later


class Rig:
    """One committer and its parts, as ``LogWriter.__init__`` wires them."""

    clock: ManualClock
    store: MemStore
    stats: collections.Counter[str]
    batcher: FakeBatcher
    keys: FakeKeys
    recovery: FakeRecovery
    lease: Lease
    c: Committer

    @classmethod
    async def make(
        cls,
        manifest: Manifest | None = None,
        *,
        lease_s: float = 0.0,
        ours: bool = True,
        start: bool = True,
        fragment_threshold: int = 100,
        snapshot_threshold: int = 20,
        max_age_s: float = 60.0,
        max_rebases: int = 64,
    ) -> Rig:
        rig = cls()
        rig.clock = ManualClock()
        rig.store = MemStore()
        rig.stats = collections.Counter()
        rig.batcher = FakeBatcher()
        rig.keys = FakeKeys()
        rig.recovery = FakeRecovery(rig)
        opts = LogWriterOptions(
            writer_name=NAME,
            clock=rig.clock,
            snapshot=SnapshotOptions(
                fragment_threshold=fragment_threshold,
                snapshot_threshold=snapshot_threshold,
                max_age_s=max_age_s,
            ),
            retry=RetryOptions(max_rebases=max_rebases),
            lease=LeaseOptions(read_lease_s=lease_s),
        )
        m = manifest if manifest is not None else root(2, lease=lease_ms(lease_s))
        data = m.to_bytes()
        rig.store.objects[KEY] = data
        etag = content_etag(data)
        rig.lease = Lease(
            rig.store, PREFIX, opts, held=lambda: (rig.c.manifest, rig.c.etag), healthy=lambda: True
        )
        if ours:
            rig.lease.adopt(etag, rig.clock.monotonic())  # the writer wrote it (or created it)
        rig.c = Committer(
            rig.store,
            PREFIX,
            opts,
            rig.stats,
            m,
            etag,
            rig.lease,
            cast(Any, rig.batcher),
            cast(Any, rig.keys),
        )
        if start:
            rig.c.start(cast(Any, rig.recovery), name=f"wal3-commit:{PREFIX}")
        return rig

    def in_flight(self, *batches: FakeBatch) -> None:
        for b in batches:
            self.batcher.flight[b.seq_no] = b
        self.c.wake()

    def edit(self, fn: Callable[[Manifest], Manifest]) -> asyncio.Task[Manifest]:
        return asyncio.ensure_future(self.c.edit(fn))

    async def close(self) -> None:
        self.batcher.queued = 0
        await self.c.close()


# ------------------------------------------------------------------------ what it holds


async def test_a_new_committer_holds_what_it_was_given_and_is_open() -> None:
    """Kills ``__init__``'s ``_manifest = None``, ``_etag = None``, ``_closing = None`` (closing is
    a bool), ``_closing = True`` and ``_failure = ""``, and ``check_open``'s ``is not`` turned
    ``is`` (an open writer refused)."""
    m = root(2)
    rig = await Rig.make(m)
    c = rig.c
    assert c.manifest is m and c.etag == content_etag(m.to_bytes())
    assert c.failure is None
    assert c.closing is False and c.closed is False
    c.check_open()
    await done(rig.close())
    assert c.closing is True and c.closed is True


async def test_recovery_is_reached_only_once_started() -> None:
    """The loop hands failed writes to the recovery ``start`` gave it; before that there is none
    (a guard, not a default).  Kills ``__init__``'s ``_recovery = ""``."""
    rig = await Rig.make(start=False)
    with pytest.raises(AssertionError, match="not started"):
        rig.c._rec  # noqa: B018
    rig.c.start(cast(Any, rig.recovery), name="wal3-commit:t")
    assert rig.c._rec is rig.recovery
    await done(rig.close())


async def test_the_commit_task_is_named_for_its_log() -> None:
    """Kills ``start``'s ``name=None`` and the call without a name."""
    rig = await Rig.make()
    assert f"wal3-commit:{PREFIX}" in {t.get_name() for t in asyncio.all_tasks()}
    await done(rig.close())


async def test_appends_and_edits_are_refused_with_the_reason_and_the_log() -> None:
    """Failed, sealed, closing: each refusal names the log (and the failure).  Kills the three
    ``check_open`` and the two ``edit`` ``WriterClosed(None)``/``LogSealed(None)`` mutants, and
    ``__init__``'s ``_prefix = None``."""
    sealed = await Rig.make(root(2, sealed=True))
    with pytest.raises(LogSealed, match=r"^log logs/x is sealed$"):
        sealed.c.check_open()
    await done(sealed.close())

    closing = await Rig.make()
    await done(closing.close())
    with pytest.raises(WriterClosed, match=r"^writer for logs/x is closing$"):
        closing.c.check_open()
    with pytest.raises(WriterClosed, match=r"^writer for logs/x is closing$"):
        await done(closing.c.edit(more_bytes(1)))

    dead = await Rig.make()
    dead.in_flight(FakeBatch(3, error=SimulatedCrash("crash here")))
    await settle()
    expected = r"^writer for logs/x failed: SimulatedCrash\('crash here'\)$"
    with pytest.raises(WriterClosed, match=expected):
        dead.c.check_open()
    with pytest.raises(WriterClosed, match=expected):
        await done(dead.c.edit(more_bytes(1)))
    await done(dead.close())


# ------------------------------------------------------------------------------ edits


async def test_an_edit_is_written_and_answered_with_the_manifest_installed() -> None:
    """An edit is applied to the held manifest, put over its etag, and answered with exactly what
    was installed; the next edit builds on it.  Each landing counts a manifest write, moves the
    key window and wakes the batcher.  Kills ``_Edit``'s ``fn = None`` and ``future = None``,
    every ``edit`` mutant that drops the edit or its loop, ``_write_manifest``'s ``new =
    edit.fn(None)``/``new = None``/``applied = None``/``edits = None``, the edit answered with
    ``set_result(None)`` or never (``edit.future.done()``), ``installed``'s ``manifest_writes``
    mutants (``= 1``, ``-= 1``, ``+= 2``, the key's spelling), ``etag = None`` and ``_stats``/
    ``_keys = None`` in ``__init__``; with the second edit, the loop that returns when no edit is
    left (``... or not self._edits``, ``(closing or idle) and ...``)."""
    rig = await Rig.make()
    first = await done(rig.c.edit(more_bytes(5)))
    assert first.acc_bytes == 205 and first.writer == NAME
    assert rig.store.stored() == first and rig.c.manifest is first
    assert rig.c.etag == content_etag(rig.store.objects[KEY])
    second = await done(rig.c.edit(more_bytes(7)))
    assert second.acc_bytes == 212 and rig.store.stored() == second
    assert rig.stats["manifest_writes"] == 2
    assert rig.keys.expired == 2 and rig.batcher.kicks >= 2
    assert [kw["if_match"] for kw in rig.store.puts(MANIFEST_RX)] == [
        content_etag(root(2).to_bytes()),
        content_etag(first.to_bytes()),
    ]
    await done(rig.close())


async def test_an_edit_that_raises_is_refused_alone() -> None:
    """Two edits in one write: the one that raises is answered with its own error and dropped;
    the other is applied and answered.  Kills ``_write_manifest``'s rejection mutants
    (``_edits.remove(None)``, ``edit.future.done()``, ``set_exception(None)``) and
    ``applied.append(None)``."""
    rig = await Rig.make()
    gate = rig.store.hold("put", MANIFEST_RX)
    first = rig.edit(more_bytes(1))
    await done(gate.reached.wait())  # the loop is writing ``first``: the next two share a write
    refusal = ValueError("not this one")

    def refuse(m: Manifest) -> Manifest:
        raise refusal

    bad = rig.edit(refuse)
    good = rig.edit(more_bytes(10))
    await settle()
    gate.release.set()
    assert (await done(first)).acc_bytes == 201
    with pytest.raises(ValueError) as caught:
        await done(bad)
    assert caught.value is refusal
    assert (await done(good)).acc_bytes == 211 == rig.store.stored().acc_bytes
    assert len(rig.store.puts(MANIFEST_RX)) == 2
    assert (await done(rig.c.edit(more_bytes(1)))).acc_bytes == 212  # nothing left behind
    await done(rig.close())


async def test_an_edit_sees_the_fragments_the_write_links_under_this_writers_name() -> None:
    """An edit transforms the manifest its write installs: the batches linked, named for this
    writer.  Kills ``with_fragments(..., None)`` (the edit saw no writer)."""
    rig = await Rig.make(root(2, writer="old"))
    seen: list[Manifest] = []

    def look(m: Manifest) -> Manifest:
        seen.append(m)
        return m

    rig.batcher.flight[3] = FakeBatch(3)
    task = rig.edit(look)  # wakes the loop with the batch and the edit both waiting
    linked = await done(task)
    assert [(m.writer, m.next_seq_no) for m in seen] == [(NAME, 4)]
    assert linked.next_seq_no == 4 and rig.batcher.acked == [[3]]
    await done(rig.close())


async def test_waiting_edits_fail_each_with_an_error_of_its_own() -> None:
    """``fail_edits`` fails every waiting edit with a fresh ``error()`` and forgets them.  Kills
    ``list(None)``, ``e.future.done()`` and ``set_exception(None)``."""
    rig = await Rig.make(start=False)  # nothing writes them
    a, b = rig.edit(more_bytes(1)), rig.edit(more_bytes(2))
    await settle()
    made: list[BaseException] = []

    def error() -> BaseException:
        made.append(StoreUnavailable(f"gone {len(made)}"))
        return made[-1]

    rig.c.fail_edits(error)
    errors = await asyncio.gather(a, b, return_exceptions=True)
    assert errors == made and len(made) == 2
    rig.c.fail_edits(error)  # none left
    assert len(made) == 2


# -------------------------------------------------------------------------- linking


async def test_batches_ready_in_sequence_are_linked_by_one_write_and_answered() -> None:
    """Every batch done from the manifest's next sequence number on is linked by one manifest
    write (If-Match on the held etag), then acknowledged; an open log fails nothing as sealed and
    nothing is recovered.  Kills the step's ``batcher, recovery = None``, ``seq = None``,
    ``inflight = None``, ``not in``, ``b = None``, ``is`` for ``is not`` on the error,
    ``ready.append(None)``, ``seq = 1``/``-= 1``/``+= 2``, ``failed = True``, ``not ready or
    failed``, the three ``not ready and not edits and snapshot is None`` mutants that skip a lone
    batch, ``_write_manifest(None, ...)``, ``sealed or in_flight``; ``_write_manifest``'s
    ``base.sealed or ready`` and the early-return mutants, ``with_fragments(None, ...)`` (answered
    but not linked), ``base_etag = None`` and ``put(new, None)`` (unconditional puts), the
    ``installed(...)`` mutants and ``acknowledge(None)``."""
    rig = await Rig.make()
    etag = rig.c.etag
    rig.in_flight(FakeBatch(3), FakeBatch(4))
    await settle()
    [put] = rig.store.puts(MANIFEST_RX)
    assert put["if_match"] == etag
    stored = rig.store.stored()
    assert [f.seq_no for f in stored.fragments] == [1, 2, 3, 4] and stored.writer == NAME
    assert rig.c.manifest == stored and rig.c.etag == content_etag(rig.store.objects[KEY])
    assert rig.batcher.acked == [[3, 4]]
    assert rig.batcher.sealed_calls == 0 and rig.recovery.calls == []
    assert rig.stats["manifest_writes"] == 1
    await done(rig.close())


async def test_a_batch_still_uploading_holds_back_those_behind_it() -> None:
    """Strict sequence order: nothing is linked past a batch not done yet; once it is, both go in
    one write.  Kills ``b.done`` for ``not b.done`` (a batch linked before its upload ended)."""
    rig = await Rig.make()
    head = FakeBatch(3, done=False)
    rig.in_flight(head, FakeBatch(4))
    await settle()
    assert rig.store.puts(MANIFEST_RX) == [] and rig.batcher.acked == []
    head.done = True
    rig.c.wake()
    await settle()
    assert rig.batcher.acked == [[3, 4]] and len(rig.store.puts(MANIFEST_RX)) == 1
    await done(rig.close())


async def test_an_edit_is_not_held_back_by_a_batch_still_uploading() -> None:
    """Kills the step's ``return`` for ``break`` at a batch not done (the edit waited for it)."""
    rig = await Rig.make()
    rig.batcher.flight[3] = FakeBatch(3, done=False)
    edited = await done(rig.edit(more_bytes(1)))
    assert edited.next_seq_no == 3 and rig.batcher.acked == [[]]
    rig.batcher.flight.clear()
    await done(rig.close())


async def test_a_failed_batch_is_recovered_after_those_before_it_are_linked() -> None:
    """What is ready before a failed batch is linked first; then recovery takes over (without a
    manifest: it loads its own).  Kills ``failed = None``/``False`` at an error, ``return`` for
    its ``break``, ``ready and failed``, and the step's ``return False`` after a write (the
    recovery never came)."""
    rig = await Rig.make()
    rig.in_flight(FakeBatch(3), FakeBatch(4, error=StoreUnavailable("upload failed")))
    await settle()
    [linking] = rig.store.manifest_puts()
    assert linking.next_seq_no == 4
    assert rig.recovery.calls == [None]
    assert rig.batcher.acked == [[3], []]  # the write, then what recovery installed
    await done(rig.close())


async def test_work_waiting_behind_a_recovery_goes_on_without_another_wake() -> None:
    """A failed batch at the head is recovered, and the edit that waited is written right after.
    Kills the step's ``return False`` after a recovery."""
    rig = await Rig.make()
    rig.batcher.flight[3] = FakeBatch(3, error=StoreUnavailable("upload failed"))
    edited = await done(rig.edit(more_bytes(1)))
    assert rig.recovery.calls == [None] and edited.acc_bytes == 201
    await done(rig.close())


async def test_a_stale_writer_recovers_before_it_writes_again() -> None:
    """The store failed mid-commit (a manifest load after a lost race): recovery is told the very
    error, the loop goes on, reloads first, and the edit is then written on what it loaded.
    Kills ``go_stale(None)``, ``break`` for the loop's ``continue`` and the step's ``return
    recovery.stale``."""
    rig = await Rig.make()

    async def race(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(more_bytes(1000))
        rig.store.fail("get", MANIFEST_RX, lambda: failure)

    failure = StoreUnavailable("manifest read refused")
    before_our_manifest_put(rig.store, race)
    edited = await done(rig.edit(more_bytes(1)))
    assert rig.recovery.stale_errors == [failure]
    assert rig.recovery.calls == [None]
    assert edited.acc_bytes == 1201 == rig.store.stored().acc_bytes
    await done(rig.close())


# ------------------------------------------------------------------- rebases and races


async def test_same_tail_races_are_rebased_up_to_max_rebases_then_recovered() -> None:
    """A lost race with someone who left the tail alone (GC, a floor, a seal) is rebased on what
    they wrote, at most ``retry.max_rebases`` times per write; one more, and recovery takes over
    with the manifest that last race loaded.  Each lost race is counted.  Kills ``rebases =
    None``/``= 1``, ``< max_rebases`` turned ``<=``, ``rebases = 1``/``-= 1``/``+= 2``,
    ``break`` for the rebase's ``continue``, ``recover(reloaded=None)``, ``loaded = None``, ``is
    not None`` on the load, the unpacking to None, ``same_tail(None)``, the rebase to None, every
    ``manifest_conflicts`` mutant, and (the writer held the log, so ``lost_to`` weighs a rival's
    claim) the ``lost_to`` argument mutants."""
    rig = await Rig.make(max_rebases=2)
    written: list[bytes] = []

    async def gc(key: str, kw: dict[str, Any]) -> None:
        written.append(rig.store.rewrite(more_bytes(1000)))

    before_our_manifest_put(rig.store, gc, times=2)
    edited = await done(rig.edit(more_bytes(1)))
    assert edited.acc_bytes == 2201 == rig.store.stored().acc_bytes  # both rebases kept
    assert rig.recovery.calls == [] and rig.stats["manifest_conflicts"] == 2

    written.clear()
    before_our_manifest_put(rig.store, gc, times=3)
    edited = await done(rig.edit(more_bytes(1)))
    assert rig.stats["manifest_conflicts"] == 5
    [reloaded] = rig.recovery.calls
    assert reloaded is not None
    assert (reloaded[0].to_bytes(), reloaded[1]) == (written[-1], content_etag(written[-1]))
    assert edited.acc_bytes == 5202 == rig.store.stored().acc_bytes
    await done(rig.close())


async def test_a_race_lost_to_an_append_goes_to_recovery_not_a_rebase() -> None:
    """Someone appended: the write is not rebased over their fragment; recovery takes over with
    what was loaded.  Kills ``same_tail(base) or rebases < max_rebases``."""
    rig = await Rig.make()

    async def append(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(lambda m: m.with_fragments([frag(3, 3)], "other"))

    before_our_manifest_put(rig.store, append)
    edited = await done(rig.edit(more_bytes(1)))
    [reloaded] = rig.recovery.calls
    assert reloaded is not None and reloaded[0].next_seq_no == 4
    assert rig.stats["manifest_conflicts"] == 1
    assert edited.next_seq_no == 4  # written after recovery, on the manifest it installed
    # Nothing of ours to link: the recovery links no orphan over another writer's manifest.
    assert rig.recovery.link_others == [False]
    await done(rig.close())


@pytest.mark.parametrize("ours", ["uploading", "queued", "ready"])
async def test_a_race_lost_with_work_of_ours_recovers_linking_others(ours: str) -> None:
    """With a batch in flight, queued or ready, recovery may link orphans over another writer's
    manifest (its claim first): ours must follow them.  Kills each operand of the committer's
    ``idle`` turned ``True``, and ``link_others=True``/``=idle``."""
    rig = await Rig.make()

    async def append(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(lambda m: m.with_fragments([frag(3, 3)], "other"))

    before_our_manifest_put(rig.store, append)
    if ours == "ready":
        rig.in_flight(FakeBatch(3))
    else:
        if ours == "uploading":
            rig.in_flight(FakeBatch(3, done=False))
        else:
            rig.batcher.queued = 1
        edit = rig.edit(more_bytes(1))
    await settle()
    assert rig.recovery.link_others == [True]
    rig.batcher.flight.clear()
    rig.batcher.queued = 0
    if ours != "ready":
        await done(edit)
    await done(rig.close())


async def test_a_manifest_that_vanished_ends_the_writer_by_name() -> None:
    """Kills ``WriterClosed(None)`` for "manifest of ... vanished"."""
    rig = await Rig.make()

    async def delete(key: str, kw: dict[str, Any]) -> None:
        del rig.store.objects[KEY]

    before_our_manifest_put(rig.store, delete)
    with pytest.raises(WriterClosed, match=r"^manifest of logs/x vanished$"):
        await done(rig.edit(more_bytes(1)))
    assert isinstance(rig.c.failure, WriterClosed)
    await done(rig.close())


async def test_a_failed_manifest_write_is_counted_logged_and_recovered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store error on the manifest put: counted, logged with the log and the error, and
    recovery reloads (it is given nothing: the write may have landed).  Twice, then the edit is
    written.  Kills every ``manifest_errors`` mutant and every mutant of the warning."""
    caplog.set_level(logging.WARNING, logger="wal3.writer")
    rig = await Rig.make()
    rig.store.fail("put", MANIFEST_RX, lambda: OSError("disk on fire"), times=2)
    edited = await done(rig.edit(more_bytes(1)))
    assert edited.acc_bytes == 201
    assert rig.stats["manifest_errors"] == 2 and rig.recovery.calls == [None, None]
    warnings = [r for r in caplog.records if r.name == "wal3.writer"]
    assert [(r.levelno, r.getMessage()) for r in warnings] == [
        (logging.WARNING, "manifest write for logs/x failed: OSError('disk on fire'); recovering")
    ] * 2
    await done(rig.close())


# ----------------------------------------------------------------------------- sealed


async def test_a_write_rebased_on_a_seal_still_takes_its_edit_but_no_fragment() -> None:
    """Another process sealed the log while a batch and an edit were being written: the rebased
    write applies the edit, links nothing, and fails what is in flight as sealed.  Kills
    ``ready = None`` after a seal."""
    rig = await Rig.make()

    async def seal(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(lambda m: m.with_sealed("other"))

    before_our_manifest_put(rig.store, seal)
    rig.batcher.flight[3] = FakeBatch(3)
    edited = await done(rig.edit(more_bytes(1)))
    assert edited.sealed and edited.next_seq_no == 3 and edited.acc_bytes == 201
    assert rig.store.stored() == edited
    assert rig.batcher.sealed_calls >= 1 and 3 not in rig.batcher.flight
    assert [3] not in rig.batcher.acked
    await done(rig.close())


async def test_a_write_rebased_on_a_seal_with_only_fragments_writes_nothing() -> None:
    """Kills ``_write_manifest``'s ``ready and not edits and snapshot is None`` (an empty write
    after the seal)."""
    rig = await Rig.make()

    async def seal(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(lambda m: m.with_sealed("other"))

    before_our_manifest_put(rig.store, seal)
    rig.in_flight(FakeBatch(3))
    await settle()
    assert len(rig.store.puts(MANIFEST_RX)) == 1  # the one that lost to the seal
    assert rig.batcher.sealed_calls == 1 and rig.c.manifest.sealed
    assert rig.batcher.acked == []
    await done(rig.close())


# ---------------------------------------------------------------- take-over and leases


async def test_a_take_over_claims_the_log_then_links_after_the_base_lease_fence() -> None:
    """Writing on a manifest another writer may still lease: the first write links nothing (the
    base under our name, recording the base's longer lease), and the batch is linked only once
    1.25 x the base's lease has passed since the claim landed.  Kills ``taking_over = None``,
    ``claiming = None``/``bool(None)``, ``new = None`` in the claim, ``stamped(new, None, ...)``
    and ``stamped(new, base, None)`` (the lease recorded would be ours), ``landed(None, ...)`` (no
    fence) and ``landed(..., None)`` (a fence for our own lease)."""
    rig = await Rig.make(root(2, writer="other", lease=10_000), lease_s=1.0, ours=False)
    rig.in_flight(FakeBatch(3))
    await settle()
    [claim] = rig.store.manifest_puts()
    assert (claim.next_seq_no, claim.writer, claim.read_lease_ms) == (3, NAME, 10_000)
    assert rig.batcher.acked == [[]]
    rig.clock.advance(12.0)
    await settle()
    assert rig.batcher.acked == [[]] and len(rig.store.puts(MANIFEST_RX)) == 1
    rig.clock.advance(0.5)  # 1.25 x 10 s after the claim landed
    await settle()
    assert rig.batcher.acked == [[], [3]]
    linking = rig.store.manifest_puts()[-1]
    assert (linking.next_seq_no, linking.read_lease_ms) == (4, 1000)
    await done(rig.close())


async def test_a_log_whose_writer_leased_nothing_is_written_without_a_claim() -> None:
    """The base records a lease of 0 (a host at 0): nobody may answer from it, so the write links
    at once, whatever this writer's own lease.  Kills ``takes_over(None, ...)`` (judged by our
    own lease)."""
    rig = await Rig.make(root(2, writer="other", lease=0), lease_s=1.0, ours=False)
    rig.in_flight(FakeBatch(3))
    await settle()
    [put] = rig.store.manifest_puts()
    assert put.next_seq_no == 4 and rig.batcher.acked == [[3]]
    await done(rig.close())


async def test_a_take_over_that_links_nothing_is_one_write() -> None:
    """An edit alone links no record, so it needs no claim: one write, recording the base's
    lease.  Kills ``claiming = bool(ready) or taking_over``."""
    rig = await Rig.make(root(2, writer="other", lease=10_000), lease_s=1.0, ours=False)
    edited = await done(rig.edit(more_bytes(1)))
    [put] = rig.store.manifest_puts()
    assert put == edited and (edited.acc_bytes, edited.read_lease_ms) == (201, 10_000)
    await done(rig.close())


def gc_edit(holder: str | Literal["keep"] | None = "keep") -> Callable[[Manifest], Manifest]:
    """A standalone collector's edit (the tail left alone), carrying the holder over as
    ``dataclasses.replace`` does, or naming another (a rival's claim edited since; None: a Rust
    collector, which drops the field)."""

    def edit(m: Manifest) -> Manifest:
        kept = m.lease_holder if holder == "keep" else holder
        return replace(m, acc_bytes=m.acc_bytes + 1000, writer="gc", lease_holder=kept)

    return edit


async def test_a_collectors_edit_of_our_manifest_is_rebased_onto_without_a_claim() -> None:
    """A collector edited the manifest this writer wrote (linking nothing, the holder carried
    over): the write is rebased onto it and links at once, with no claim and no fence, and the
    load that showed it raises no fence either.  The adversary of 741b3dd: every such rebase
    was a claim and a whole fence, and a collector editing every second held a first append
    for 1,083 virtual seconds.  Fails with ``holds`` always False (a claim, then the fence)."""
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))  # our put: the stored manifest records our holder
    ours = rig.store.stored()
    assert ours.lease_holder == rig.lease.holder and ours.writer == NAME
    assert rig.recovery.progress == 0  # an edit links no batch of ours

    async def gc(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(gc_edit())

    before_our_manifest_put(rig.store, gc)
    rig.in_flight(FakeBatch(3))
    await settle()
    assert rig.stats["manifest_conflicts"] == 1 and rig.recovery.calls == []
    assert rig.batcher.acked == [[], [3]]  # the edit, then the batch: no claim in between
    linking = rig.store.manifest_puts()[-1]
    assert (linking.next_seq_no, linking.acc_bytes, linking.writer) == (4, 1301, NAME)
    assert linking.lease_holder == rig.lease.holder
    assert rig.lease.fence_until == float("-inf")
    assert rig.recovery.progress == 1  # a row of raced recoveries is broken
    await done(rig.close())


@pytest.mark.parametrize("holder", [None, "0123456789abcdef"])
async def test_an_edit_under_another_holder_is_a_take_over(holder: str | None) -> None:
    """The same edit, but the manifest it edited stood under another writer's lease (a rival
    claimed ours in between, then a collector edited that; or a Rust collector dropped the
    field): a claim, and the batch is linked only after the fence.  Fails with ``holds``
    always True.  Under a rival's holder (its claim, edited by a collector: our tail, linking
    nothing) the writer first leaves the rival its fence (``lost_to``, the adversarial review of
    a1babb8); a manifest recording no holder is no writer's claim, so it claims at once."""
    rig = await Rig.make(lease_s=1.0)
    await done(rig.edit(more_bytes(1)))

    async def gc(key: str, kw: dict[str, Any]) -> None:
        rig.store.rewrite(gc_edit(holder))

    before_our_manifest_put(rig.store, gc)
    rig.in_flight(FakeBatch(3))
    await settle()
    if holder is not None:
        lost = rig.store.manifest_puts()[-1]
        assert lost.next_seq_no == 4, "no claim while the rival's fence runs"
        rig.clock.advance(1.25)
        await settle()
    claim = rig.store.manifest_puts()[-1]
    assert claim.next_seq_no == 3 and claim.lease_holder == rig.lease.holder
    assert rig.batcher.acked == [[], []]
    rig.clock.advance(1.25)
    await settle()
    assert rig.batcher.acked == [[], [], [3]]
    await done(rig.close())


async def test_a_write_proves_the_lease_from_when_it_was_issued() -> None:
    """A manifest put this writer made vouches for the manifest for ``read_lease_s`` from when it
    was issued (not answered).  Kills ``issued = None``, ``landed(base_etag, None, ...)`` and
    ``landed(base_etag, etag, None, ...)``."""
    rig = await Rig.make(lease_s=1.0)
    gate = rig.store.hold("put", MANIFEST_RX)
    task = rig.edit(more_bytes(1))
    await done(gate.reached.wait())
    rig.clock.advance(0.4)
    gate.release.set()
    await done(task)
    assert rig.lease.authored(rig.c.etag)
    assert rig.lease.remaining() == pytest.approx(0.6)
    await done(rig.close())


# ----------------------------------------------------------------------- long polls


class LoopTime:
    """The running loop's clock, frozen until ``advance`` (its timers follow it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        loop = asyncio.get_running_loop()
        self.now = loop.time()
        monkeypatch.setattr(loop, "time", lambda: self.now)

    def advance(self, seconds: float) -> None:
        self.now += seconds


async def test_a_long_poll_answers_at_once_when_it_cannot_wait(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The record at ``after_offset`` exists when the next offset passes it: True at once; with
    no time left (0 s, the clock not moving) False at once, without a wait.  Kills
    ``deadline = None``, ``+`` for ``-`` in ``remaining``, ``<`` for ``<=`` (both), ``and
    closed``, and ``return True`` on a timeout."""
    LoopTime(monkeypatch)
    rig = await Rig.make()  # next offset 3
    assert await done(rig.c.wait_for_commit(2, 0.0)) is True
    poll = asyncio.ensure_future(rig.c.wait_for_commit(3, 0.0))
    await settle()
    assert poll.done() and poll.result() is False
    await done(rig.close())


async def test_a_long_poll_waits_for_the_commit_that_passes_its_offset(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Half a second left: the poll waits, a write that does not pass the offset does not end it,
    the one that links the record does.  Kills ``remaining <= 1``, ``- timeout_s`` for ``+``,
    ``remaining = None``, ``event = None``, the ``wait_for`` mutants that drop or replace what it
    waits on, and the final ``return False``."""
    LoopTime(monkeypatch)
    rig = await Rig.make()
    poll = asyncio.ensure_future(rig.c.wait_for_commit(3, 0.5))
    await settle()
    assert not poll.done()
    await done(rig.c.edit(more_bytes(1)))  # a commit, not of offset 3
    await settle()
    assert not poll.done()
    rig.in_flight(FakeBatch(3))
    await settle()
    assert poll.done() and poll.result() is True
    await done(rig.close())


async def test_a_long_poll_times_out_false(monkeypatch: pytest.MonkeyPatch) -> None:
    """Kills ``suppress(None)`` around the wait and ``wait_for(..., None)`` (no timeout)."""
    time = LoopTime(monkeypatch)
    rig = await Rig.make()
    poll = asyncio.ensure_future(rig.c.wait_for_commit(3, 5.0))
    await settle()
    assert not poll.done()
    time.advance(5.0)
    await settle()
    assert poll.done() and poll.result() is False
    await done(rig.close())


async def test_a_long_poll_on_a_closed_writer_answers_false_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kills ``remaining <= 0 and self.closed``."""
    LoopTime(monkeypatch)
    rig = await Rig.make()
    await done(rig.close())
    poll = asyncio.ensure_future(rig.c.wait_for_commit(3, 100.0))
    await settle()
    assert poll.done() and poll.result() is False


# --------------------------------------------------------------------- the writer's life


async def test_process_death_in_a_batch_fails_everything_with_it() -> None:
    """A batch that saw the process die: the writer fails with that very error, and everything
    queued, in flight or waiting (edits, duplicate keys, long polls) fails with it, unwrapped.
    Kills the loop's ``_fail_everything(None)`` for ``ProcessDeath``, ``_failure = None``,
    ``wrapped = None``, ``isinstance(...) and False``, ``fail_all(None)``, ``fail_edits(None)``,
    ``lambda: None``, ``fail_waiters(None)`` and the committed event set to None."""
    rig = await Rig.make()
    death = SimulatedCrash("crash here")
    poll = asyncio.ensure_future(rig.c.wait_for_commit(3, 1000.0))
    rig.batcher.flight[3] = FakeBatch(3, error=death)
    edit = rig.edit(more_bytes(1))
    await settle()
    assert rig.c.failure is death and rig.c.closed
    with pytest.raises(SimulatedCrash) as caught:
        await done(edit)
    assert caught.value is death
    assert rig.batcher.failed_all == [death] and rig.keys.failed == [death]
    assert poll.done() and poll.result() is False
    assert rig.store.puts(MANIFEST_RX) == []
    await done(rig.close())


async def test_a_bug_in_the_loop_is_logged_and_fails_the_writer_as_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Anything unexpected kills the loop: logged with its traceback, the writer's failure is the
    error itself, and what waits fails with ``WriterClosed`` naming it.  Kills the loop's
    ``_fail_everything(None)`` for other errors, every mutant of the log line,
    ``isinstance(...) or True`` and the ``WriterClosed(repr(err))`` mutants."""
    caplog.set_level(logging.ERROR, logger="wal3.writer")
    rig = await Rig.make()
    bug = RuntimeError("bug in the batcher")
    rig.batcher.bug = bug
    with pytest.raises(WriterClosed, match=r"^RuntimeError\('bug in the batcher'\)$"):
        await done(rig.edit(more_bytes(1)))
    assert rig.c.failure is bug
    [wrapped] = rig.batcher.failed_all
    assert type(wrapped) is WriterClosed and str(wrapped) == repr(bug)
    [record] = [r for r in caplog.records if r.name == "wal3.writer"]
    assert (record.levelno, record.getMessage()) == (
        logging.ERROR,
        "wal3 committer for logs/x died",
    )
    assert record.exc_info is not None and record.exc_info[1] is bug
    rig.batcher.bug = None
    await done(rig.close())


async def test_a_cancelled_loop_fails_what_waits_as_cancelled() -> None:
    """The loop's task was cancelled (the event loop shutting down): what waits fails with
    ``WriterClosed`` saying so.  Kills the ``CancelledError`` branch's
    ``_fail_everything(None)`` and ``WriterClosed(None)``."""
    rig = await Rig.make()
    gate = rig.store.hold("put", MANIFEST_RX)
    edit = rig.edit(more_bytes(1))
    await done(gate.reached.wait())
    task = rig.c._task
    assert task is not None
    task.cancel()
    with pytest.raises(WriterClosed, match=r"^writer for logs/x was cancelled$"):
        await done(edit)
    failure = rig.c.failure
    assert isinstance(failure, WriterClosed) and str(failure) == "writer for logs/x was cancelled"


async def test_close_flushes_what_was_accepted_then_stops() -> None:
    """``close`` returns only once the edit being written landed and the loop ended; a second
    close returns at once.  Kills ``start``'s ``_task = None``, ``close``'s ``self._closing`` for
    ``not self._closing``, ``_closing = None``/``False``, ``is`` for ``is not`` on the task and
    ``shield(None)``, and the loop's ``... and self._edits`` (never ends)."""
    rig = await Rig.make()
    gate = rig.store.hold("put", MANIFEST_RX)
    edit = rig.edit(more_bytes(1))
    await done(gate.reached.wait())
    closing = asyncio.ensure_future(rig.c.close())
    await settle()
    assert not closing.done() and rig.c.closing is True
    gate.release.set()
    await settle()
    assert closing.done() and edit.done()
    assert rig.c.manifest.acc_bytes == 201 == rig.store.stored().acc_bytes
    task = rig.c._task
    assert task is not None and task.done()
    kicks = rig.batcher.kicks
    await done(rig.c.close())
    assert rig.batcher.kicks == kicks  # idempotent


async def test_closing_cuts_what_is_queued_but_an_open_writer_leaves_that_to_the_batcher() -> None:
    """With nothing to link, a step kicks the batcher only while closing (so appends queued
    behind a full pipeline are cut and flushed); open, the batcher's own policy cuts them.
    Kills ``self._closing or batcher.has_queued``."""
    rig = await Rig.make()
    rig.batcher.queued = 1
    rig.c.wake()
    await settle()
    assert rig.batcher.kicks == 0
    closing = asyncio.ensure_future(rig.c.close())
    await settle()
    assert rig.batcher.kicks == 2 and not closing.done()  # close's own, then the step's
    rig.batcher.queued = 0  # cut and flushed
    rig.c.wake()
    await settle()
    assert closing.done()


async def test_close_waits_out_a_snapshot_upload() -> None:
    """Kills ``close``'s ``is`` for ``is not`` on the snapshot task."""
    rig = await Rig.make(root(5), fragment_threshold=2)
    gate = rig.store.hold("put", SNAPSHOT_RX)
    await done(rig.c.edit(more_bytes(1)))  # its landing plans a snapshot
    await done(gate.reached.wait())
    closing = asyncio.ensure_future(rig.c.close())
    await settle()
    assert not closing.done()
    gate.release.set()
    await settle()
    assert closing.done() and closing.result() is None


async def test_close_does_not_raise_what_ended_the_loop_or_the_snapshot() -> None:
    """A loop that died of an error in its own clean-up, a snapshot upload that died of an
    error nobody expected: ``close`` still returns.  Kills both ``suppress(None)`` in
    ``close``."""
    rig = await Rig.make()
    rig.batcher.bug = RuntimeError("bug in the batcher")
    rig.batcher.fail_all_bug = RuntimeError("and in its clean-up")
    rig.c.wake()
    await settle()
    assert rig.c.failure is rig.batcher.bug
    await done(rig.c.close())

    snap = await Rig.make(root(5), fragment_threshold=2)
    gate = Gate()

    async def held_then_broken(key: str, kw: dict[str, Any]) -> None:
        await gate(key, kw)
        raise RuntimeError("store bug")

    snap.store.on("put", SNAPSHOT_RX, held_then_broken)
    await done(snap.c.edit(more_bytes(1)))
    await done(gate.reached.wait())
    closing = asyncio.ensure_future(snap.c.close())
    await settle()
    assert not closing.done()  # waiting for the upload
    gate.release.set()
    assert await done(closing) is None
    assert snap.stats["snapshots_written"] == 0


# -------------------------------------------------------------------------- snapshots


async def test_compact_writes_and_links_every_snapshot_the_thresholds_call_for() -> None:
    """From a root of six fragments (at most 2 in the root, runs of 2 roll up): two depth-1
    snapshots, rolled up into one of depth 2, each uploaded under the log's prefix, named for
    this writer, and counted.  Kills ``compact``'s ``written = None``/``1``, ``while False``,
    ``task = None`` (a busy loop), ``is`` for ``is not`` (both), ``shield(None)``, ``break`` for
    either ``continue``, ``edit(None)``, ``lambda m: None``, ``is not`` for ``is`` (both),
    ``written = 1``/``-= 1``/``+= 2``; ``__init__``'s ``_snapshot = ""`` and
    ``_snapshot_task = ""``; ``_maybe_snapshot``'s planning mutants (``None`` for the manifest,
    a threshold or the writer, a missing argument, ``snap = None``, ``is`` for ``is not``, the
    task not kept or not made); every ``_write_snapshot`` mutant of the upload's store, key and
    bytes, ``_snapshot = None``, the ``snapshots_written`` mutants and ``_snapshot_task = ""``."""
    rig = await Rig.make(root(6), fragment_threshold=2, snapshot_threshold=2)
    assert await done(rig.c.compact()) == 3
    m = rig.c.manifest
    assert rig.store.stored() == m
    assert [s.depth for s in m.snapshots] == [2] and [f.seq_no for f in m.fragments] == [5, 6]
    assert rig.stats["snapshots_written"] == 3
    snaps = {k: Snapshot.from_bytes(v) for k, v in rig.store.objects.items() if "/snapshot/" in k}
    assert sorted(snaps) == sorted(join(PREFIX, s.path) for s in snaps.values())
    assert {s.writer for s in snaps.values()} == {NAME}
    assert sorted(s.depth for s in snaps.values()) == [1, 1, 2]
    assert join(PREFIX, m.snapshots[0].path) in snaps
    assert await done(rig.c.compact()) == 0
    await done(rig.close())


async def test_compact_with_nothing_to_do_writes_nothing() -> None:
    """Kills ``compact``'s ``written = 1`` and ``while False`` (None)."""
    rig = await Rig.make(root(2), fragment_threshold=2)
    assert await done(rig.c.compact()) == 0
    assert rig.store.requests == []
    await done(rig.close())


async def test_a_snapshot_is_linked_by_one_write_of_its_own() -> None:
    """After a write leaves the root over the threshold, the oldest fragments are uploaded as a
    snapshot in the background and linked by the next write, here one of its own: exactly one
    write, then the snapshot is forgotten.  Kills ``snapshot = None`` in the step, ``snapshot is
    not None`` in both early returns, ``_write_manifest(ready, None)``, ``is`` for ``is not``
    before linking, ``snapped = None``, ``with_snapshot(None, ...)``, ``is not`` for ``is`` on
    the result, ``new = None`` for ``snapped``, ``is`` for ``is not`` after linking (another
    write), ``_snapshot = ""`` there, and ``_take_snapshot``'s ``is not``, unpacking to None and
    ``+ written``."""
    rig = await Rig.make(root(5), fragment_threshold=2)
    await done(rig.c.edit(more_bytes(1)))
    await settle()
    puts = rig.store.manifest_puts()
    assert len(puts) == 2
    linked = puts[1]
    assert [f.seq_no for f in linked.fragments] == [3, 4, 5] and len(linked.snapshots) == 1
    assert rig.c.manifest == linked and rig.stats["snapshots_written"] == 1
    await settle()
    assert len(rig.store.manifest_puts()) == 2 and rig.c.failure is None
    await done(rig.close())


async def test_a_snapshot_exactly_max_age_old_is_still_linked() -> None:
    """Only a snapshot *older* than ``max_age_s`` is dropped.  Kills ``>=`` for ``>``."""
    rig = await Rig.make(root(5), fragment_threshold=2, max_age_s=0.0)
    await done(rig.c.edit(more_bytes(1)))
    await settle()
    assert len(rig.c.manifest.snapshots) == 1
    await done(rig.close())


async def test_an_edit_sees_the_snapshot_its_write_links() -> None:
    """A snapshot that waits for a write is linked by it, before the write's edits, which see it
    under this writer's name.  Kills ``with_snapshot(snapshot, None)``."""
    rig = await Rig.make(root(5, writer="old"), fragment_threshold=2)
    snap_gate = rig.store.hold("put", SNAPSHOT_RX)
    await done(rig.c.edit(more_bytes(1)))
    await done(snap_gate.reached.wait())
    put_gate = rig.store.hold("put", MANIFEST_RX)
    busy = rig.edit(more_bytes(1))
    await done(put_gate.reached.wait())
    snap_gate.release.set()
    await settle()  # the snapshot is uploaded while the committer is busy
    seen: list[Manifest] = []

    def look(m: Manifest) -> Manifest:
        seen.append(m)
        return m

    looked = rig.edit(look)
    put_gate.release.set()
    await done(busy)
    await done(looked)
    [m] = seen
    assert m.writer == NAME and len(m.snapshots) == 1
    await done(rig.close())


async def test_a_snapshot_past_max_age_is_never_linked() -> None:
    """A snapshot that waited longer than ``max_age_s`` for a write (GC may by then take it for
    an orphan) is dropped, not linked; a fresh one is planned after that write, and ``compact``
    counts only what it linked.  Kills ``compact``'s ``before = None`` (a write that linked
    nothing counted), ``- written`` for ``+`` and ``_snapshot = ""`` on dropping (the next
    step broke)."""
    rig = await Rig.make(root(5), fragment_threshold=2, max_age_s=60.0)
    snap_gate = rig.store.hold("put", SNAPSHOT_RX)
    await done(rig.c.edit(lambda m: m))  # its landing plans a snapshot
    await done(snap_gate.reached.wait())
    put_gate = rig.store.hold("put", MANIFEST_RX)
    busy = rig.edit(lambda m: m)
    await done(put_gate.reached.wait())
    snap_gate.release.set()
    await settle()  # uploaded, waiting for the busy write to end
    rig.clock.advance(61.0)
    compacting = asyncio.ensure_future(rig.c.compact())
    await settle()
    put_gate.release.set()
    await done(busy)
    n = await done(compacting)
    assert n == len(rig.c.manifest.snapshots) == 0
    after = rig.store.manifest_puts()
    assert len(after) == 3 and after[2].snapshots == ()  # the write after the expiry
    await settle()  # the fresh snapshot, uploaded and linked
    assert len(rig.c.manifest.snapshots) == 1 and rig.c.failure is None
    await done(rig.close())


async def test_a_snapshot_whose_fragments_left_the_root_is_dropped_and_planned_again() -> None:
    """A collector's cut took the snapshot's fragments out of the root while it was uploaded:
    it cannot be linked, and a snapshot of the new root is planned at once.  Kills
    ``self._snapshot = snapshot = ""`` (nothing planned)."""
    rig = await Rig.make(root(5), fragment_threshold=2)
    gate = rig.store.hold("put", SNAPSHOT_RX)
    await done(rig.c.edit(lambda m: m))
    await done(gate.reached.wait())

    def cut(m: Manifest) -> Manifest:  # as GC does: the oldest two fragments leave
        gone = m.fragments[:2]
        return replace(
            m, fragments=m.fragments[2:], collected=m.collected + Setsum.sum(f.setsum for f in gone)
        )

    await done(rig.c.edit(cut))
    gate.release.set()
    await settle()
    m = rig.c.manifest
    assert [f.seq_no for f in m.fragments] == [5]
    [snap] = m.snapshots
    assert (snap.start, snap.limit) == (3, 5)
    assert rig.stats["snapshots_written"] == 2 and rig.c.failure is None
    await done(rig.close())


async def test_one_snapshot_is_uploaded_at_a_time_and_none_while_closing() -> None:
    """Writes that land while a snapshot uploads plan no other; a write that lands while the
    writer closes plans none.  Kills ``_maybe_snapshot``'s ``... and self._closing`` and
    ``_snapshot is not None and _snapshot_task is not None``."""
    rig = await Rig.make(root(5), fragment_threshold=2)
    gate = rig.store.hold("put", SNAPSHOT_RX)
    await done(rig.c.edit(more_bytes(1)))
    await done(gate.reached.wait())
    await done(rig.c.edit(more_bytes(1)))
    await settle()
    assert len(rig.store.puts(SNAPSHOT_RX)) == 1
    gate.release.set()
    await done(rig.close())

    closing = await Rig.make(root(5), fragment_threshold=2)
    put_gate = closing.store.hold("put", MANIFEST_RX)
    edit = closing.edit(more_bytes(1))
    await done(put_gate.reached.wait())
    closed = asyncio.ensure_future(closing.c.close())
    await settle()
    put_gate.release.set()
    await done(edit)
    await done(closed)
    await settle()
    assert closing.store.puts(SNAPSHOT_RX) == []


async def test_a_failed_snapshot_upload_is_logged_and_planned_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store error uploading a snapshot is logged with the log and the error, leaves nothing
    pending, and the next ``compact`` plans it again.  Kills every mutant of the warning."""
    caplog.set_level(logging.WARNING, logger="wal3.writer")
    rig = await Rig.make(root(5), fragment_threshold=2)
    rig.store.fail("put", SNAPSHOT_RX, lambda: OSError("no space"))
    await done(rig.c.edit(more_bytes(1)))
    await settle()
    [record] = [r for r in caplog.records if r.name == "wal3.writer"]
    assert (record.levelno, record.getMessage()) == (
        logging.WARNING,
        "snapshot upload for logs/x failed: OSError('no space')",
    )
    assert rig.c.manifest.snapshots == () and rig.stats["snapshots_written"] == 0
    assert await done(rig.c.compact()) == 2  # 5 fragments: two snapshots of 2 leave 1 in the root
    await done(rig.close())


async def test_process_death_uploading_a_snapshot_fails_the_writer() -> None:
    """Kills ``_write_snapshot``'s ``_fail_everything(None)``."""
    rig = await Rig.make(root(5), fragment_threshold=2)
    death = SimulatedCrash("crash in the snapshot")
    rig.store.fail("put", SNAPSHOT_RX, lambda: death)
    await done(rig.c.edit(more_bytes(1)))
    await settle()
    assert rig.c.failure is death and rig.batcher.failed_all == [death]
    await done(rig.close())


# -------------------------------------------------------------------------------------------
# Mutants not killed here, by group:
#
# Equivalent (no input tells them apart):
# * ``__init__``'s ``_task = ""``: ``start`` replaces it before anything reads it, and a close
#   of a committer never started awaits ``shield("")``, whose TypeError ``suppress(Exception)``
#   swallows: it returns as it would have.
# * ``_commit_step``'s ``failed = None``: it is only ever tested for truth, and None is falsy.
#
# Not killed (the difference is only in which write carries late work):
# * ``_write_manifest``'s ``break`` for the ``continue`` after a claim: ``_write_manifest`` then
#   returns, the step loop calls it again at once, and it re-reads the batches in flight, the
#   edits and the snapshot, so the claim's follow-up write links the same batches.  Only an edit
#   submitted (or a snapshot uploaded) during the claim's put changes write: with the mutant it
#   joins the follow-up write instead of the one after.  Nothing a caller or the store is told
#   differs but the number of manifest writes.
#
# Killed only by timing out: four of ``_commit_step``'s mutants make the loop spin without ever
# awaiting (``return True`` when there is nothing to do, and ``ready``, ``self._edits`` or
# ``snapshot is not None`` in the condition that says so).  pytest-timeout's exception is raised
# inside the spinning task, whose catch-all (``except BaseException``) swallows it, so the run
# ends at mutmut's own timeout (counted as timed out, i.e. killed).  A few more spin only after
# a test has already failed (``-x`` stops there).
