"""``Batcher`` (wal3/batcher.py) rule by rule, driven directly: fake committer and recovery (the
two flags each that hold back cutting, and what the batcher tells them), an in-memory store that
logs every request with its condition, a recording fragment hook, manual wall and monotonic time,
and the batch interval's timer run by the test.  What is pinned: when a batch is cut and what it
holds, where it goes (sequence number, offsets, the setsum it follows, its timestamp), what its
fragment holds (records, keys, writer, ``prev``), how its upload and its hook run and what each
outcome leaves on the batch, retries and re-marks, back-pressure, and how appends are answered or
failed.  Written against the mutation run of the module (docs/RELIABILITY.md); each test names
the mutants it kills.  Equivalent mutants are listed, with why, at the end of the file.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, Literal, cast

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import wal3.batcher as batcher_module
from wal3.appends import Append, AppendResult, Batch, FragmentInfo
from wal3.batcher import _INLINE_ENCODE_BYTES, Batcher
from wal3.clock import Clock
from wal3.errors import (
    Backpressure,
    LogFull,
    LogSealed,
    ObjectNotFound,
    PreconditionFailed,
    StoreUnavailable,
    WriterClosed,
)
from wal3.fragment import META_WRITER, decode_fragment, encode_fragment, read_footer
from wal3.idempotency import KeyWindow
from wal3.manifest import U64_MAX, FragmentPointer, Manifest
from wal3.options import BatchOptions, IdempotencyOptions, LogWriterOptions
from wal3.paths import fragment_path, join
from wal3.setsum import Setsum
from wal3.store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

if TYPE_CHECKING:
    from wal3.committer import Committer
    from wal3.recovery import Recovery

PREFIX = "t/log"
TAIL = Setsum.of(b"the tail fragment")
WALL = 7_000_000  # microseconds; any fixed reading: the tests never read the real clock


def frag_key(seq: int) -> str:
    return join(PREFIX, fragment_path(seq))


def tail_manifest(seq: int = 4, start: int = 10, limit: int = 20, tail: Setsum = TAIL) -> Manifest:
    """A log whose last fragment is ``seq`` over ``[start, limit)`` with setsum ``tail``."""
    return Manifest(fragments=(FragmentPointer(fragment_path(seq), seq, start, limit, 1, tail),))


def body(nbytes: int) -> list[bytes]:
    """One record whose append counts exactly ``nbytes`` (32 bytes of overhead per record)."""
    return [b"x" * (nbytes - 32)]


class Now:
    wall = WALL
    mono = 1000.0


class ManualTime(Clock):
    """Wall and monotonic time that move only when the test sets them."""

    now: Now

    def __init__(self) -> None:
        object.__setattr__(self, "now", Now())  # Clock is a frozen slotted dataclass

    def wall_us(self) -> int:
        return self.now.wall

    def monotonic(self) -> float:
        return self.now.mono


class Timer:
    def __init__(self, delay: float, callback: Callable[..., object], args: tuple[object, ...]):
        self.delay, self.callback, self.args = delay, callback, args
        self.cancelled = self.fired = False

    def cancel(self) -> None:
        self.cancelled = True

    def fire(self) -> None:
        assert not self.cancelled and not self.fired
        self.fired = True
        self.callback(*self.args)


class Timers:
    """Stands in for the loop the batcher keeps: futures come from the running loop, and a
    ``call_later`` is only recorded, so the batch interval runs out when the test says."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self.handles: list[Timer] = []

    def create_future(self) -> asyncio.Future[Any]:
        return self._loop.create_future()

    def call_later(self, delay: float, callback: Callable[..., object], *args: object) -> Timer:
        t = Timer(delay, callback, args)
        self.handles.append(t)
        return t

    @property
    def armed(self) -> list[Timer]:
        return [t for t in self.handles if not t.cancelled and not t.fired]


Script = Callable[[str, str], Awaitable[None]]


class MemStore(ObjectStore):
    """Objects in a dict with their MD5 as etag (quoted on HEAD, as S3 gives it); conditions as
    S3 honours them; every request logged as ``(op, key, if_none_match, if_match)``.  ``script``
    runs before each request and may hold it or raise."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.requests: list[tuple[str, str, str | None, str | None]] = []
        self.script: Script | None = None

    async def _before(
        self, op: str, key: str, inm: str | None = None, im: str | None = None
    ) -> None:
        self.requests.append((op, key, inm, im))
        if self.script is not None:
            await self.script(op, key)

    async def get(self, key: str) -> GetResult:
        await self._before("get", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        return GetResult(self.objects[key], content_etag(self.objects[key]))

    async def head(self, key: str) -> ObjectMeta:
        await self._before("head", key)
        if key not in self.objects:
            raise ObjectNotFound(key)
        data = self.objects[key]
        return ObjectMeta(key, f'"{content_etag(data)}"', len(data), 0.0)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        check_condition(if_none_match, if_match)
        await self._before("put", key, if_none_match, if_match)
        have = self.objects.get(key)
        if if_none_match == "*" and have is not None:
            raise PreconditionFailed(key)
        if if_match is not None and (have is None or content_etag(have) != if_match):
            raise PreconditionFailed(key)
        self.objects[key] = bytes(data)
        return content_etag(data)

    async def delete(self, key: str) -> None:
        await self._before("delete", key)
        self.objects.pop(key, None)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        for key in sorted(k for k in self.objects if k.startswith(prefix)):
            if start_after is None or key > start_after:
                yield ObjectMeta(key, "", len(self.objects[key]), 0.0)

    def url_for(self, key: str) -> str:
        return f"mem://{key}"

    def fail_puts(self, n: int) -> None:
        """The next ``n`` puts fail with ``StoreUnavailable``, writing nothing."""
        left = [n]

        async def script(op: str, key: str) -> None:
            if op == "put" and left[0] > 0:
                left[0] -= 1
                raise StoreUnavailable(f"put {key} refused")

        self.script = script

    def hold_puts(self, seq: int | None = None) -> asyncio.Event:
        """Puts (of fragment ``seq`` only, if given) wait until the event is set."""
        release = asyncio.Event()

        async def script(op: str, key: str) -> None:
            if op == "put" and (seq is None or key == frag_key(seq)):
                await release.wait()

        self.script = script
        return release


class Parts:
    """The committer and the recovery as the batcher sees them: the flags that hold back
    cutting, the committer's wake-ups, and the encodings recovery is told of."""

    def __init__(self) -> None:
        self.failure: BaseException | None = None
        self.closing = False
        self.recovering = False
        self.stale = False
        self.wakes = 0
        self.encoded: list[tuple[int, str, Setsum]] = []

    def wake(self) -> None:
        self.wakes += 1

    def note_encoded(self, seq_no: int, md5: str, setsum: Setsum) -> None:
        self.encoded.append((seq_no, md5, setsum))


class Hook:
    """A fragment hook that records what it is told; it may wait on ``gate`` or fail."""

    def __init__(self) -> None:
        self.calls: list[FragmentInfo] = []
        self.gate: asyncio.Event | None = None
        self.errors: list[BaseException] = []

    async def __call__(self, info: FragmentInfo) -> None:
        self.calls.append(info)
        if self.gate is not None:
            await self.gate.wait()
        if self.errors:
            raise self.errors.pop(0)


class World:
    """A batcher built as ``LogWriter`` builds it, its parts faked.  The log's tail is fragment
    4 over [10, 20): the first batch goes to fragment 5 from offset 20 and follows ``TAIL``."""

    def __init__(
        self, *, manifest: Manifest | None = None, hook: Hook | None = None, **batch: Any
    ) -> None:
        self.store = MemStore()
        self.clock = ManualTime()
        self.stats: collections.Counter[str] = collections.Counter()
        self.parts = Parts()
        self.hook = hook
        self.opts = LogWriterOptions(
            writer_name="w1", clock=self.clock, batch=BatchOptions(**batch)
        )
        self.keys = KeyWindow(
            self.store,
            PREFIX,
            IdempotencyOptions(),
            self.stats,
            next_seq_no=lambda: 100,
            on_learned=lambda: self.b.drop_known_keys(),  # as LogWriter wires it
        )
        self.b = Batcher(
            self.store,
            PREFIX,
            self.opts,
            hook,
            self.stats,
            self.keys,
            manifest if manifest is not None else tail_manifest(),
        )
        self.b.attach(cast("Committer", self.parts), cast("Recovery", self.parts))
        self.timers = Timers(asyncio.get_running_loop())
        # The interval timer is the only thing the batcher schedules on its loop: run it by hand.
        self.b._loop = self.timers  # type: ignore[assignment]

    def batch(self, seq: int) -> Batch:
        return self.b.in_flight[seq]

    def pending_bytes_add_up(self) -> None:
        """The queued-bytes count that cuts a batch by size is the bytes queued, always."""
        assert self.b._pending_bytes == sum(a.nbytes for a in self.b._pending)


async def finish(b: Batch) -> None:
    """Wait for ``b``'s upload task (a safety net of 5 s, never reached when the code is right)
    and re-raise whatever crashed it."""
    assert b.task is not None
    await asyncio.wait({b.task}, timeout=5)
    assert b.task.done(), "the batch's task hung"
    b.task.result()


async def until(cond: Callable[[], bool], turns: int = 200) -> None:
    """Yield to the loop until ``cond`` holds: a few turns when the batcher is right, and
    bounded, so a broken one fails here instead of spinning."""
    for _ in range(turns):
        if cond():
            return
        await asyncio.sleep(0)
    raise AssertionError("not reached")


async def finish_all(w: World, *batches: Batch) -> None:
    for b in batches:
        await finish(b)


def writer_of(data: bytes) -> bytes | None:
    meta = pq.read_schema(pa.BufferReader(data)).metadata or {}
    return meta.get(META_WRITER)


def hand_batch(w: World, seq: int, start: int, appends: list[Append] | None = None) -> Batch:
    """A batch made as recovery hands one back (kept in flight, or the one to continue after)."""
    loop = asyncio.get_running_loop()
    prev: asyncio.Future[Setsum | None] = loop.create_future()
    prev.set_result(None)
    return Batch(seq, start, WALL, appends or [], prev, loop, None)


# ------------------------------------------------------------------------------ cutting one


async def test_an_idle_pipeline_cuts_an_append_at_once_and_uploads_its_fragment() -> None:
    """The lone append on an idle pipeline becomes fragment ``next_seq_no`` from ``next_offset``
    at once, stamped with the wall clock, following the manifest's tail; its fragment is created
    with ``If-None-Match: *`` under the log's prefix; recovery learns its MD5 and setsum; the
    committer is woken; the append waits for the link.  Kills, in ``__init__``, ``None`` for the
    store, prefix, stats, next sequence number, next offset, last timestamp, tail and its
    ``_resolved(None)``; ``kick``'s ``failure is None``, ``idle = None``, ``idle =
    self._inflight``, ``if (idle or ...)`` and ``idle and committer.closing``, the
    ``pending or room`` loop (arms a timer with nothing queued) and the ``None.cancel()`` of the
    two timer-cancel mutants; ``_start_batch``'s ``Batch`` argument mutants (but the dead
    etag's), ``_dead.pop(seq)``, the task's name, ``task = None`` and ``_run_batch(None)``;
    ``_run_batch``'s ``prev = None``, ``prev_setsum = None``, ``writer = None``, ``frag``/``md5``
    ``= None``, the ``note_encoded`` and inline ``encode_fragment`` argument mutants (but
    ``keys``) and ``done = None/False``; ``_settle``'s ``== "ok"``, upload-job and no-hook
    mutants; ``_upload``'s key and normal-put mutants and ``"ok"`` texts."""
    w = World()
    a = w.b.submit([b"one", b"two"], None)
    assert list(w.b.in_flight) == [5]
    b = w.batch(5)
    assert (b.seq_no, b.start, b.count, b.appends, b.timestamp_us) == (5, 20, 2, [a], WALL)
    assert b.overwrite_etag is None
    assert not w.b.has_queued and not w.b.idle
    assert w.b.outstanding_bytes == a.nbytes == 3 + 3 + 2 * 32
    assert b.task is not None and b.task.get_name() == "wal3-frag:5"
    assert not w.timers.handles  # nothing is left to wait for
    await finish(b)
    assert b.done is True and b.error is None
    assert b.upload == "ok" and b.hooked is True and b.settled is True
    frag = b.frag
    assert frag is not None and (frag.seq_no, frag.start, frag.limit) == (5, 20, 22)
    data = w.store.objects[frag_key(5)]
    assert data == frag.data
    assert w.store.requests == [("put", frag_key(5), "*", None)]
    d = decode_fragment(data)
    assert [(r.offset, r.timestamp_us, r.body) for r in d.records] == [
        (20, WALL, b"one"),
        (21, WALL, b"two"),
    ]
    assert d.prev == TAIL and b.prev_setsum == TAIL
    assert writer_of(data) == b"w1"
    assert b.md5 == content_etag(data)
    assert w.parts.encoded == [(5, content_etag(data), frag.setsum)]
    assert b.encoded.result() == frag.setsum
    assert w.stats["fragments_written"] == 1
    assert w.parts.wakes == 1
    assert not a.future.done()  # answered only once a manifest links it


async def test_each_batch_follows_the_one_before_and_stamps_strictly_later() -> None:
    """While closing every append is cut at once: batches take consecutive sequence numbers
    and offsets, each fragment records the setsum of the one before as ``prev``, and a clock
    that stands still still stamps each batch later than the last (a jump forward is taken as
    is).  Kills ``_start_batch``'s ``next_seq`` ``= 1``/``-= 1``/``+= 2``, ``next_offset =
    count``/``-= count``, ``tail = None``; ``_run_batch``'s ``encoded.set_result(None)``;
    ``_now_us``'s ``last_ts - 1`` and ``+ 2``; ``fragments_written`` ``= 1``."""
    w = World()
    w.parts.closing = True
    a1 = w.b.submit([b"a"], None)
    a2 = w.b.submit([b"b", b"c"], None)
    w.clock.now.wall = WALL + 50
    a3 = w.b.submit([b"d"], None)
    assert list(w.b.in_flight) == [5, 6, 7]
    b5, b6, b7 = (w.batch(s) for s in (5, 6, 7))
    assert [b.appends for b in (b5, b6, b7)] == [[a1], [a2], [a3]]
    assert [b.start for b in (b5, b6, b7)] == [20, 21, 23]
    await finish_all(w, b5, b6, b7)
    assert [b.error for b in (b5, b6, b7)] == [None, None, None]
    stamps = [decode_fragment(w.store.objects[frag_key(s)]).records[0].timestamp_us for s in (5, 6)]
    assert stamps == [WALL, WALL + 1] and b7.timestamp_us == WALL + 50
    assert b5.frag is not None and b6.frag is not None
    assert read_footer(w.store.objects[frag_key(6)])[0] == b5.frag.setsum
    assert read_footer(w.store.objects[frag_key(7)])[0] == b6.frag.setsum
    assert w.stats["fragments_written"] == 3


async def test_a_clock_reading_zero_still_stamps_from_one() -> None:
    """Stamps are ``max(wall, last + 1)`` from a last of 0: a wall clock at 0 stamps 1, 2, ...
    Kills ``__init__``'s ``_last_ts = 1``."""
    w = World()
    w.clock.now.wall = 0
    w.parts.closing = True
    w.b.submit([b"a"], None)
    w.b.submit([b"b"], None)
    assert [w.batch(5).timestamp_us, w.batch(6).timestamp_us] == [1, 2]
    await finish_all(w, w.batch(5), w.batch(6))


# ----------------------------------------------------------------------------- the queue


async def test_back_pressure_refuses_past_the_outstanding_bound_and_counts_refusals() -> None:
    """Bytes accepted and not acknowledged may reach ``max_outstanding_bytes`` exactly; an
    append past it is refused at once, with the bytes outstanding and the log in the message,
    reason ``batching``, and counted each time.  Kills ``submit``'s ``-`` for ``+``, ``>=`` for
    ``>``, the counter's ``= 1``/``-= 1``/``+= 2`` and its renamed keys, the message's ``None``
    and its dropped argument, the reason's ``None`` and its renamed texts,
    ``outstanding = nbytes``/``-= nbytes``, and ``__init__``'s ``_outstanding_bytes = 1``."""
    w = World(max_outstanding_bytes=200)
    w.parts.recovering = True  # nothing is cut: only the accounting is at work
    w.b.submit(body(100), None)
    assert w.b.outstanding_bytes == 100
    w.b.submit(body(100), None)
    assert w.b.outstanding_bytes == 200
    for n in (1, 2):
        with pytest.raises(Backpressure) as e:
            w.b.submit(body(32), None)
        assert str(e.value) == "200 bytes outstanding on t/log"
        assert e.value.reason == "batching"
        assert w.stats["backpressure"] == n
    assert w.b.outstanding_bytes == 200


async def test_a_keyed_append_is_what_its_duplicates_wait_on() -> None:
    """A queued append with a key registers its shared future with the key window (duplicates
    arriving meanwhile wait on it) and carries its key and request digest; one without a key
    registers nothing.  Kills ``submit``'s ``Append(bodies, None, ...)``, both ``is``-for-``is
    not`` mutants of the key test and the ``wait_on`` argument mutants."""
    w = World()
    w.parts.recovering = True
    a = w.b.submit([b"a"], "k")
    u = w.b.submit([b"u"], None)
    assert a.key == "k" and a.digest is not None and a.shared is not None
    assert w.keys.waiter("k") is a.shared
    assert u.shared is None and w.keys._waiters == {"k": a.shared}


# --------------------------------------------------------------------- when a batch is cut


async def test_a_busy_pipeline_cuts_when_the_bytes_queued_reach_size_bytes() -> None:
    """With a fragment in flight, appends wait for company until ``size_bytes`` are queued:
    one byte short waits, exactly ``size_bytes`` cuts.  Kills ``__init__``'s ``_pending_bytes =
    1``, ``submit``'s ``pending_bytes = nbytes``/``-= nbytes``, ``kick``'s ``timer_fired and
    pending_bytes >= size`` and ``>`` for ``>=``, and ``_start_batch``'s ``pending_bytes =
    nbytes``/``+= nbytes``."""
    w = World(size_bytes=201)
    release = w.store.hold_puts()
    w.b.submit(body(40), None)  # idle: cut at once, its upload held
    a = w.b.submit(body(100), None)
    b = w.b.submit(body(100), None)
    assert list(w.b.in_flight) == [5]  # 200 of 201 bytes
    c = w.b.submit(body(32), None)
    assert list(w.b.in_flight) == [5, 6] and w.batch(6).appends == [a, b]
    w.pending_bytes_add_up()
    d = w.b.submit(body(169), None)  # 32 + 169: exactly 201
    assert list(w.b.in_flight) == [5, 6, 7] and w.batch(7).appends == [c, d]
    assert not w.b.has_queued
    w.pending_bytes_add_up()
    release.set()
    await finish_all(w, *w.b.in_flight.values())


async def test_the_batch_interval_cuts_what_waits_and_is_armed_once_per_wait() -> None:
    """On a busy pipeline a small append arms the interval timer (once, however many appends
    join it); when it runs out everything queued is cut, and the next wait arms a new timer.
    Kills ``__init__``'s ``_timer = ""`` and ``_timer_fired = True``; ``kick``'s ``is not`` for
    ``is`` in the arming test, ``_timer = None``, the four ``call_later`` argument mutants and
    ``_timer_fired = True`` at its end; ``_on_timer``'s three mutants."""
    w = World(interval_s=0.25)
    release = w.store.hold_puts()
    w.b.submit([b"first"], None)
    a = w.b.submit([b"a"], None)
    b = w.b.submit([b"b"], None)
    assert list(w.b.in_flight) == [5]
    (timer,) = w.timers.handles
    assert timer.delay == 0.25 and w.timers.armed == [timer]
    timer.fire()
    assert list(w.b.in_flight) == [5, 6] and w.batch(6).appends == [a, b]
    assert not w.b.has_queued and not w.timers.armed
    w.b.submit([b"c"], None)
    assert list(w.b.in_flight) == [5, 6] and len(w.timers.armed) == 1
    assert len(w.timers.handles) == 2
    w.b.cancel_timer()
    release.set()
    await finish_all(w, w.batch(5), w.batch(6))


async def test_a_queue_drained_by_size_cancels_its_timer_and_the_next_wait_arms_anew() -> None:
    """The timer of appends that were then cut by size is cancelled (and forgotten: the next
    wait arms its own).  Kills ``kick``'s ``not pending or timer is not None``, ``pending and
    ...``, ``not pending and timer is None`` and ``_timer = ""`` after the cancel."""
    w = World(size_bytes=200)
    release = w.store.hold_puts()
    w.b.submit([b"first"], None)
    w.b.submit(body(100), None)
    (t1,) = w.timers.handles
    w.b.submit(body(100), None)
    assert list(w.b.in_flight) == [5, 6]
    assert t1.cancelled and not w.timers.armed
    w.b.submit([b"next"], None)
    assert len(w.timers.handles) == 2 and len(w.timers.armed) == 1
    w.b.cancel_timer()
    assert not w.timers.armed
    w.b.cancel_timer()  # again: harmless
    release.set()
    await finish_all(w, w.batch(5), w.batch(6))


async def test_cancel_timer_without_a_timer_is_a_no_op() -> None:
    """Kills ``cancel_timer``'s ``is`` for ``is not`` (``None.cancel()``, and an armed timer
    left running)."""
    w = World()
    w.b.cancel_timer()
    release = w.store.hold_puts()
    w.b.submit([b"first"], None)
    w.b.submit([b"a"], None)
    (t,) = w.timers.handles
    w.b.cancel_timer()
    assert t.cancelled
    release.set()
    await finish(w.batch(5))


async def test_a_full_pipeline_cuts_nothing_even_when_closing() -> None:
    """``max_inflight_fragments`` in flight: nothing more is cut, even for a closing writer, and
    no timer is armed (the committer kicks when a batch is done).  Kills ``kick``'s ``<=`` for
    ``<`` and ``pending or room`` (which cut past the bound while closing)."""
    w = World(max_inflight_fragments=1)
    release = w.store.hold_puts()
    w.b.submit([b"first"], None)
    w.parts.closing = True
    w.b.submit([b"a"], None)
    assert list(w.b.in_flight) == [5] and w.b.has_queued and not w.timers.handles
    release.set()
    await finish(w.batch(5))


async def test_a_closing_writer_cuts_at_once_on_a_busy_pipeline() -> None:
    """Kills ``kick``'s ``committer.closing and self._timer_fired`` (closing alone no longer
    cut) and ``idle and committer.closing``."""
    w = World()
    release = w.store.hold_puts()
    w.b.submit([b"first"], None)
    w.parts.closing = True
    a = w.b.submit([b"a"], None)
    assert list(w.b.in_flight) == [5, 6] and w.batch(6).appends == [a]
    assert not w.timers.handles
    release.set()
    await finish_all(w, w.batch(5), w.batch(6))


async def test_a_recovering_failed_or_stale_writer_cuts_nothing() -> None:
    """Each on its own holds back cutting: a recovery in progress, a failed committer, a stale
    manifest (which wakes the committer to reload it instead).  Kills ``kick``'s ``recovering
    and failure is not None``."""
    for state in ("recovering", "failure", "stale"):
        w = World()
        if state == "recovering":
            w.parts.recovering = True
        elif state == "failure":
            w.parts.failure = RuntimeError("crashed")
        else:
            w.parts.stale = True
        w.b.submit([b"a"], None)
        assert not w.b.in_flight and w.b.has_queued and not w.timers.handles, state
        assert w.parts.wakes == (1 if state == "stale" else 0), state


async def test_a_batch_put_back_by_recovery_makes_the_pipeline_busy() -> None:
    """A batch recovery keeps is in flight again (``put_back``): the next append waits for the
    interval like any behind an upload.  Kills ``__init__``'s ``_timer_fired = True`` (which cut
    it at once) and ``put_back``'s ``= None``."""
    w = World()
    kept = hand_batch(w, 5, 20)
    kept.frag = encode_fragment(5, 20, WALL, [b"k"], writer="w1")
    kept.encoded.set_result(kept.frag.setsum)
    w.b.put_back(kept)
    w.b.continue_after(kept)
    assert w.b.in_flight[5] is kept and not w.b.idle
    w.b.submit([b"a"], None)
    assert list(w.b.in_flight) == [5] and w.b.has_queued and len(w.timers.armed) == 1
    w.b.cancel_timer()


async def test_requeued_appends_go_back_to_the_head_of_the_queue_in_order() -> None:
    """Appends freed by recovery go ahead of what was queued since, in their order, and their
    bytes count again.  Kills every ``requeue`` mutant."""
    w = World()
    w.parts.recovering = True
    a = w.b.submit([b"a"], None)
    b = w.b.submit([b"b", b"b2"], None)
    w.parts.recovering = False
    w.b.kick()
    freed = w.batch(5)
    await finish(freed)
    assert w.b.take_in_flight() == [freed]  # it can never be linked: its appends are free
    w.parts.recovering = True
    c = w.b.submit([b"c"], None)
    w.b.requeue(freed.appends)
    w.pending_bytes_add_up()
    w.b.restart_at(tail_manifest())
    w.parts.recovering = False
    w.b.kick()
    assert w.batch(5).appends == [a, b, c]
    await finish(w.batch(5))


# -------------------------------------------------------------------- what a batch holds


async def test_a_batch_takes_appends_while_they_fit_size_bytes_exactly() -> None:
    """Appends join a batch while its bytes stay at most ``size_bytes`` (an exact fit joins);
    the next starts another batch, and nothing popped is lost.  Kills ``_start_batch``'s
    ``nbytes = nrec = 1``, ``appends or (...)``, ``and`` for ``or``, ``nbytes - a.nbytes``,
    ``>=`` for ``>`` on bytes, ``return`` for ``break``, ``nbytes = a.nbytes``/``-=``, and
    ``_pending[1]``."""
    w = World(size_bytes=200)
    w.parts.recovering = True
    a = w.b.submit(body(100), None)
    b = w.b.submit(body(100), None)
    c = w.b.submit(body(33), None)
    d = w.b.submit(body(34), None)
    w.parts.recovering = False
    w.parts.closing = True
    w.b.kick()
    assert [w.batch(s).appends for s in w.b.in_flight] == [[a, b], [c, d]]
    w.pending_bytes_add_up()
    await finish_all(w, w.batch(5), w.batch(6))


async def test_a_batch_takes_appends_while_they_fit_max_records_exactly() -> None:
    """The same for ``max_records``: 2 + 1 records fit 3, the next starts a new batch.  Kills
    ``_start_batch``'s ``nrec - len(...)``, ``>=`` for ``>`` on records and ``nrec =
    len(...)``/``-=``."""
    w = World(max_records=3)
    w.parts.recovering = True
    a = w.b.submit([b"1", b"2"], None)
    b = w.b.submit([b"3"], None)
    c = w.b.submit([b"4"], None)
    d = w.b.submit([b"5", b"6"], None)
    e = w.b.submit([b"7", b"8"], None)
    w.parts.recovering = False
    w.parts.closing = True
    w.b.kick()
    assert [w.batch(s).appends for s in w.b.in_flight] == [[a, b], [c, d], [e]]
    assert [w.batch(s).start for s in w.b.in_flight] == [20, 23, 26]
    await finish_all(w, *w.b.in_flight.values())


async def test_an_append_larger_than_size_bytes_is_a_batch_of_its_own() -> None:
    """Kills ``_start_batch``'s ``appends or (...)`` (an empty batch cut before it)."""
    w = World(size_bytes=50)
    a = w.b.submit(body(100), None)
    assert w.batch(5).appends == [a]
    await finish(w.batch(5))
    assert w.batch(5).error is None


async def test_a_batch_past_u64_fails_its_appends_and_those_behind_uploading_nothing() -> None:
    """A batch that would end past u64::MAX is never uploaded: its appends and every append
    queued behind it fail with the ``LogFull``, their keys released; the slot is not used up (a
    batch that fits goes there next).  Kills ``_start_batch``'s ``ensure_room`` argument
    mutants, the ``reject`` argument mutants of both loops, and ``_pending_bytes =
    None``/``= 1`` after them."""
    w = World(manifest=tail_manifest(4, U64_MAX - 10, U64_MAX - 1), max_records=2)
    w.parts.recovering = True
    a = w.b.submit([b"a1", b"a2"], "ka")
    b = w.b.submit([b"b"], "kb")
    w.parts.recovering = False
    w.b.kick()
    err = a.future.exception()
    assert isinstance(err, LogFull) and b.future.exception() is err
    assert a.shared is not None and a.shared.exception() is err
    assert not w.b.in_flight and not w.b.has_queued and w.b.outstanding_bytes == 0
    assert w.b._pending_bytes == 0
    assert w.keys.waiter("ka") is None and w.keys.waiter("kb") is None
    assert not w.store.requests
    c = w.b.submit([b"c"], None)  # ends at u64::MAX exactly: it fits
    assert (w.batch(5).start, w.batch(5).appends) == (U64_MAX - 1, [c])
    await finish(w.batch(5))
    assert w.batch(5).upload == "ok"


# --------------------------------------------------------------------- what a fragment holds


async def test_a_fragment_records_each_keyed_append_at_its_offsets() -> None:
    """The footer maps each key to its append's first offset, count and request digest;
    appends without a key take their offsets but no entry.  Kills ``_run_batch``'s ``keys =
    None``, ``off = None``, the two ``is`` mutants of the key test, ``keys[...] = None``,
    ``off = len(...)``/``-=``, and the inline ``keys=None`` and dropped ``keys``."""
    w = World()
    w.parts.recovering = True
    k1 = w.b.submit([b"a", b"b"], "k1")
    w.b.submit([b"c"], None)
    k2 = w.b.submit([b"d"], "k2")
    w.parts.recovering = False
    w.b.kick()
    await finish(w.batch(5))
    prev, keys = read_footer(w.store.objects[frag_key(5)])
    assert prev == TAIL
    assert keys == {"k1": (20, 2, k1.digest), "k2": (23, 1, k2.digest)}


async def test_a_large_batch_encodes_off_the_loop_into_the_same_fragment() -> None:
    """A batch of ``_INLINE_ENCODE_BYTES`` or more is encoded in a thread, into a fragment with
    all the inline one has: records, timestamps, ``prev``, keys and writer.  Kills every
    ``asyncio.to_thread(encode_fragment, ...)`` argument mutant and its ``frag = None``."""
    w = World()
    w.parts.recovering = True
    big = w.b.submit([b"x" * _INLINE_ENCODE_BYTES], "big")
    small = w.b.submit([b"s1", b"s2"], "small")
    w.parts.recovering = False
    w.b.kick()
    b = w.batch(5)
    await finish(b)
    assert b.error is None
    data = w.store.objects[frag_key(5)]
    d = decode_fragment(data)
    assert [(r.offset, r.timestamp_us) for r in d.records] == [(20, WALL), (21, WALL), (22, WALL)]
    assert [r.body for r in d.records] == [b"x" * _INLINE_ENCODE_BYTES, b"s1", b"s2"]
    prev, keys = read_footer(data)
    assert prev == TAIL
    assert keys == {"big": (20, 1, big.digest), "small": (21, 2, small.digest)}
    assert writer_of(data) == b"w1"


async def test_only_batches_under_the_inline_bound_encode_on_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Bytes (with the per-record overhead) below ``_INLINE_ENCODE_BYTES`` encode on the loop;
    exactly that many go to a thread.  Kills ``_run_batch``'s ``<=`` for ``<`` and
    ``sum(None)``."""
    on_loop: list[bool] = []
    real = encode_fragment  # what wal3.batcher imported
    loop_thread = threading.get_ident()

    def spy(*args: Any, **kwargs: Any) -> Any:
        on_loop.append(threading.get_ident() == loop_thread)
        return real(*args, **kwargs)

    monkeypatch.setattr(batcher_module, "encode_fragment", spy)
    w = World()
    w.parts.closing = True
    w.b.submit(body(_INLINE_ENCODE_BYTES - 1), None)
    w.b.submit(body(_INLINE_ENCODE_BYTES), None)
    await finish_all(w, w.batch(5), w.batch(6))
    assert on_loop == [True, False]


# -------------------------------------------------------------------- where the next goes


async def test_continue_after_puts_the_next_batch_behind_a_kept_one() -> None:
    """The next batch takes the kept batch's sequence number + 1, its limit, and follows its
    setsum.  Kills ``continue_after``'s ``is`` for ``is not``, ``= None``, ``- 1``, ``+ 2`` and
    ``tail = None``."""
    w = World()
    last = hand_batch(w, 8, 30)
    last.frag = encode_fragment(8, 30, WALL, [b"k1", b"k2"], writer="w1")
    last.encoded.set_result(last.frag.setsum)
    w.b.continue_after(last)
    w.b.submit([b"a"], None)
    b = w.batch(9)
    assert b.start == 32
    await finish(b)
    assert b.error is None and read_footer(w.store.objects[frag_key(9)])[0] == last.frag.setsum


async def test_restart_at_puts_the_next_batch_behind_a_manifests_tail() -> None:
    """Kills ``restart_at``'s four mutants (sequence number, offset, tail, ``_resolved(None)``)
    and ``_resolved``'s ``set_result(None)``."""
    w = World()
    w.parts.closing = True
    w.b.submit([b"a"], None)
    other = Setsum.of(b"someone else's tail")
    w.b.restart_at(tail_manifest(11, 50, 60, other))
    w.b.submit([b"b"], None)
    assert list(w.b.in_flight) == [5, 12]
    b = w.batch(12)
    assert b.start == 60
    await finish_all(w, w.batch(5), b)
    assert b.error is None and read_footer(w.store.objects[frag_key(12)])[0] == other


async def test_a_batch_whose_predecessor_failed_to_encode_fails_with_it_down_the_chain() -> None:
    """A batch follows its predecessor's setsum; if that never comes (its encoding failed) the
    batch fails with the same error, uploads nothing, and passes the failure on through its own
    ``encoded`` future; it is done and the committer is woken.  Kills ``_run_batch``'s ``error =
    None``, ``if b.encoded.done()``, ``set_exception(None)`` and ``done = None/False``."""
    w = World()
    last = hand_batch(w, 8, 30)
    last.frag = encode_fragment(8, 30, WALL, [b"k"], writer="w1")
    boom = StoreUnavailable("encoding 8 failed")
    last.encoded.set_exception(boom)
    last.encoded.exception()
    w.b.continue_after(last)
    w.b.submit([b"a"], None)
    b = w.batch(9)
    await finish(b)
    assert b.error is boom and b.done is True
    assert b.encoded.done() and b.encoded.exception() is boom
    assert not w.store.requests and w.parts.wakes == 1


# ------------------------------------------------------------------ the upload's outcomes


async def test_an_object_of_another_writer_at_the_key_makes_the_upload_absent() -> None:
    """Someone else's fragment 5 is never overwritten: the create fails, a HEAD shows other
    bytes, the upload is ``absent``.  Kills ``_upload``'s ``is`` for ``is not`` on the dead
    etag, the normal put's unconditional mutants, ``etag_matches_content`` inverted and the
    ``"absent"`` texts."""
    w = World()
    theirs = encode_fragment(5, 20, 1, [b"theirs"], writer="w2").data
    w.store.objects[frag_key(5)] = theirs
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "absent" and isinstance(b.error, PreconditionFailed)
    assert w.store.objects[frag_key(5)] == theirs
    assert w.store.requests == [("put", frag_key(5), "*", None), ("head", frag_key(5), None, None)]
    assert w.stats["fragments_written"] == 0


async def test_a_head_that_fails_after_a_lost_create_leaves_the_upload_unknown() -> None:
    """A failed create whose HEAD fails too tells nothing: ``unknown``, failed with the HEAD's
    error.  Kills the first ``"unknown"`` texts."""
    w = World()
    w.store.objects[frag_key(5)] = b"something"

    async def script(op: str, key: str) -> None:
        if op == "head":
            raise StoreUnavailable("head refused")

    w.store.script = script
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "unknown" and isinstance(b.error, StoreUnavailable)


async def test_a_retried_upload_finds_its_own_bytes_and_is_ok() -> None:
    """A put that failed ambiguously leaves the upload ``unknown``; when the retry's create
    fails because our own bytes are there (the first attempt landed after all), it is ``ok``.
    Kills the outer ``"unknown"`` texts and ``_upload``'s ``held = None``, ``head(None)`` after
    a failed create, inverted ``etag_matches_content`` and its argument mutants; ``retry``'s
    ``task = None``, name mutants and ``_retry_batch`` argument mutants; ``_retry_batch``'s
    ``sleep(None)``, ``_settle(None)``, ``done = None/False``."""
    w = World()
    w.store.fail_puts(4)  # every attempt of put_resolving
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "unknown" and isinstance(b.error, StoreUnavailable)
    assert b.frag is not None
    w.store.objects[frag_key(5)] = b.frag.data  # it had landed
    w.store.requests.clear()
    b.done, b.error = False, None  # as recovery hands a kept batch back (``_retry_kept``)
    w.b.retry(b, 0)
    assert b.task is not None and b.task.get_name() == "wal3-frag-retry:5"
    await finish(b)
    assert b.upload == "ok" and b.error is None and b.done is True
    assert w.store.requests == [("put", frag_key(5), "*", None), ("head", frag_key(5), None, None)]
    assert w.stats["fragments_written"] == 1
    assert w.parts.wakes == 2


async def test_a_retry_that_fails_again_records_its_error() -> None:
    """Kills ``_retry_batch``'s ``error = None``."""
    w = World()
    w.store.fail_puts(8)
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    b.done, b.error = False, None
    w.b.retry(b, 0)
    await finish(b)
    assert b.upload == "unknown" and isinstance(b.error, StoreUnavailable) and b.done


async def test_a_dead_object_in_the_slot_is_overwritten_by_its_etag() -> None:
    """Recovery marks our own unlinkable object at a slot dead: the next batch there replaces
    it with ``If-Match`` on its etag (and the mark is used up).  Kills ``mark_dead``'s ``=
    None``, ``_start_batch``'s ``_dead.pop(None, None)``/``pop(None)`` and ``Batch(..., None)``,
    and the ``If-Match`` put's argument mutants."""
    w = World()
    dead = encode_fragment(5, 20, 1, [b"dead"], writer="w1").data
    w.store.objects[frag_key(5)] = dead
    w.b.mark_dead(5, content_etag(dead))
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    assert b.overwrite_etag == content_etag(dead)
    await finish(b)
    assert b.upload == "ok" and b.error is None and b.frag is not None
    assert w.store.objects[frag_key(5)] == b.frag.data
    assert w.store.requests == [("put", frag_key(5), None, content_etag(dead))]
    assert w.b.take_dead(5, "none") == "none"


async def test_a_dead_object_replaced_meanwhile_is_left_alone() -> None:
    """If the dead object was replaced (the key is taken by someone else's bytes), nothing is
    overwritten: the upload is ``absent``.  Kills the ``If-Match`` put's ``if_match=None`` and
    its dropped condition, and ``head(None)`` after it (a blind create)."""
    w = World()
    dead = encode_fragment(5, 20, 1, [b"dead"], writer="w1").data
    theirs = encode_fragment(5, 20, 1, [b"theirs"], writer="w2").data
    w.store.objects[frag_key(5)] = theirs
    w.b.mark_dead(5, content_etag(dead))
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "absent" and isinstance(b.error, PreconditionFailed)
    assert w.store.objects[frag_key(5)] == theirs
    assert w.store.requests == [
        ("put", frag_key(5), None, content_etag(dead)),
        ("head", frag_key(5), None, None),
        ("head", frag_key(5), None, None),
    ]


async def test_a_dead_object_gone_meanwhile_frees_the_slot_for_a_create() -> None:
    """If the dead object is gone, the slot is free again: created with ``If-None-Match: *``.
    Kills that create's argument mutants (``None`` store, key or data, no or a bad
    condition)."""
    w = World()
    w.b.mark_dead(5, content_etag(b"collected"))
    w.b.submit([b"ours"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "ok" and b.error is None and b.frag is not None
    assert w.store.objects[frag_key(5)] == b.frag.data
    assert w.store.requests == [
        ("put", frag_key(5), None, content_etag(b"collected")),
        ("head", frag_key(5), None, None),
        ("put", frag_key(5), "*", None),
    ]


# ----------------------------------------------------------------------------- the hook


async def test_the_hook_learns_each_fragment_and_runs_alongside_the_upload() -> None:
    """The hook is told the fragment's sequence number, start, count and timestamp; the mark
    is dated when it was issued, not when it returned.  Kills ``__init__``'s ``_hook = None``,
    ``_settle``'s ``is not`` for ``is``, ``elif b.hooked``, the ``_mark``/``FragmentInfo``
    argument mutants and ``limit + start``; ``_mark``'s ``is`` for ``is not``, ``issued =
    None``, ``hook(None)``, ``hooked = None/False`` and ``hooked_at = None``."""
    hook = Hook()
    hook.gate = asyncio.Event()
    w = World(hook=hook)
    w.b.submit([b"a", b"b", b"c"], None)
    b = w.batch(5)
    await until(lambda: bool(hook.calls))
    w.clock.now.mono = 1007.0
    hook.gate.set()
    await finish(b)
    assert hook.calls == [FragmentInfo(5, 20, 3, WALL)]
    assert b.hooked is True and b.hooked_at == 1000.0 and b.settled is True and b.error is None


async def test_an_upload_that_fails_waits_for_the_hook_before_the_batch_is_done() -> None:
    """The upload and the hook run together and the batch is done only once both are: a
    failed upload does not leave a mark still running behind a batch recovery may retry.
    Kills ``_settle``'s ``return_exceptions=None``/``False`` and its dropped argument."""
    hook = Hook()
    hook.gate = asyncio.Event()
    w = World(hook=hook)
    w.store.fail_puts(4)
    w.b.submit([b"a"], None)
    b = w.batch(5)
    await until(lambda: len(w.store.requests) == 8)  # four puts and their heads, all failing
    for _ in range(20):  # ample turns for a batch that did not wait to be marked done
        await asyncio.sleep(0)
    assert not b.done and w.parts.wakes == 0
    hook.gate.set()
    await finish(b)
    assert b.done and isinstance(b.error, StoreUnavailable) and b.hooked and w.parts.wakes == 1


async def test_a_failed_hook_fails_the_batch_but_not_the_upload_and_a_retry_only_marks() -> None:
    """A hook that fails leaves the batch failed with its error, the upload done; the retry
    runs the hook alone (nothing is re-sent).  Kills ``_settle``'s ``!= "XXokXX"``/``"OK"``
    (a re-sent upload) and ``== "ok"``."""
    hook = Hook()
    hook.errors.append(StoreUnavailable("dirty log down"))
    w = World(hook=hook)
    w.b.submit([b"a"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "ok" and b.hooked is False and isinstance(b.error, StoreUnavailable)
    b.done, b.error = False, None
    w.b.retry(b, 0)
    await finish(b)
    assert b.error is None and b.settled is True and len(hook.calls) == 2
    assert [r[0] for r in w.store.requests] == ["put"]


@pytest.mark.parametrize(("age", "remarked"), [(29.0, False), (30.0, True)])
async def test_an_upload_retried_remark_after_s_after_its_mark_is_marked_again(
    age: float, remarked: bool
) -> None:
    """A fragment whose upload is retried ``remark_after_s`` (30 s) or more after its mark was
    issued is marked again first; a younger mark stands.  Kills ``_retry_batch``'s ``or`` for
    the last ``and``, ``== "ok"``, ``+ hooked_at``, ``>`` for ``>=`` and ``hooked = True``."""
    hook = Hook()
    w = World(hook=hook)
    w.store.fail_puts(4)
    w.b.submit([b"a"], None)
    b = w.batch(5)
    await finish(b)
    assert b.upload == "unknown" and b.hooked and b.hooked_at == 1000.0
    w.clock.now.mono = 1000.0 + age
    b.done, b.error = False, None
    w.b.retry(b, 0)
    await finish(b)
    assert b.upload == "ok" and b.error is None and b.settled
    assert len(hook.calls) == (2 if remarked else 1)
    assert b.hooked_at == (1000.0 + age if remarked else 1000.0)


async def test_retrying_a_settled_batch_sends_and_marks_nothing() -> None:
    """Only an upload still missing makes an old mark worth renewing: a batch uploaded and
    marked long ago is left as it is.  Kills ``_retry_batch``'s ``hooked or upload != "ok"``
    and ``!= "XXokXX"``/``"OK"`` (and the ``or`` mutant again)."""
    hook = Hook()
    w = World(hook=hook)
    w.b.submit([b"a"], None)
    b = w.batch(5)
    await finish(b)
    assert b.settled
    w.clock.now.mono = 5000.0
    w.store.requests.clear()
    b.done = False
    w.b.retry(b, 0)
    await finish(b)
    assert b.settled and b.error is None and len(hook.calls) == 1 and not w.store.requests


# ------------------------------------------------------------------------------ answering


async def test_acknowledge_answers_each_append_at_its_offsets_and_remembers_its_key() -> None:
    """A linked batch's appends are answered with their first offset, count, the batch's
    timestamp and their digest; their keys are remembered with the fragment; the batch leaves
    flight and its bytes stop counting.  Kills ``acknowledge``'s ``pop(None, ...)``,
    ``pop(None)``, ``off = None``, ``r = None``, every ``AppendResult`` and ``resolve``
    argument mutant, ``off = len(...)``/``-=``; ``resolve``'s ``outstanding = nbytes``/``+=``
    and ``a.answer(None)``."""
    w = World()
    w.parts.recovering = True
    a1 = w.b.submit([b"a", b"b"], "k1")
    a2 = w.b.submit([b"c", b"d", b"e"], None)
    a3 = w.b.submit([b"f"], "k3")
    w.parts.recovering = False
    w.b.kick()
    b = w.batch(5)
    await finish(b)
    w.b.acknowledge([b])
    r1 = AppendResult(20, 2, WALL, digest=a1.digest)
    assert a1.future.result() == r1 and a1.shared is not None and a1.shared.result() == r1
    assert a2.future.result() == AppendResult(22, 3, WALL)
    assert a3.future.result() == AppendResult(25, 1, WALL, digest=a3.digest)
    assert w.keys.known("k1") == r1 and w.keys.waiter("k1") is None
    assert not w.b.in_flight and w.b.idle and w.b.outstanding_bytes == 0


async def test_a_batch_linked_after_it_left_flight_is_still_answered() -> None:
    """Recovery may have taken a batch out of flight before the manifest linking it is known
    to have landed: acknowledging it answers its appends all the same.  Kills
    ``acknowledge``'s ``pop(b.seq_no)`` without a default."""
    w = World()
    a = w.b.submit([b"a"], None)
    b = w.batch(5)
    await finish(b)
    assert w.b.take_in_flight() == [b]
    w.b.acknowledge([b])
    assert a.future.result() == AppendResult(20, 1, WALL)


async def test_resolve_and_reject_answer_the_caller_and_the_key_window() -> None:
    """``resolve`` answers an append (remembering its key with the fragment it is in);
    ``reject`` fails it (and releases its key, so duplicates stop waiting on it); both stop
    counting its bytes.  Kills ``resolve``'s ``is`` for ``is not`` and ``keys.resolved``
    argument mutants; ``reject``'s ``outstanding`` mutants, ``is`` for ``is not``, the
    ``keys.rejected`` argument mutants and ``fail(None)``."""
    w = World()
    w.parts.recovering = True
    k = w.b.submit([b"k"], "K")
    u = w.b.submit([b"u"], None)
    j = w.b.submit([b"j"], "J")
    r = AppendResult(40, 1, 99, digest=k.digest)
    w.b.resolve(k, r, 7)
    assert k.future.result() is r and w.keys.known("K") == r and w.keys.waiter("K") is None
    assert w.b.outstanding_bytes == u.nbytes + j.nbytes
    err = StoreUnavailable("no")
    w.b.reject(u, err)
    assert u.future.exception() is err and w.b.outstanding_bytes == j.nbytes
    w.b.reject(j, err)
    assert j.future.exception() is err and j.shared is not None and j.shared.exception() is err
    assert w.keys.waiter("J") is None and w.b.outstanding_bytes == 0


async def test_keys_learned_from_the_log_answer_their_queued_appends_as_duplicates() -> None:
    """Read repair learns from a fragment's footer that key A is in the log already: the queued
    append with key A is answered as a duplicate of it and leaves the queue; the rest stay, in
    order.  Kills every ``drop_known_keys`` mutant but the two equivalent ones."""
    w = World()
    release = w.store.hold_puts()
    first = w.b.submit([b"first"], None)
    u1 = w.b.submit([b"u1"], None)
    ka = w.b.submit([b"a"], "A")
    kb = w.b.submit([b"b"], "B")
    u2 = w.b.submit([b"u2"], None)
    digest = ka.digest
    assert digest is not None
    f3 = encode_fragment(3, 7, 1234, [b"a"], keys={"A": (7, 1, digest)}, writer="w0")
    w.store.objects[frag_key(3)] = f3.data
    w.keys.unlearned([3])
    await w.keys.learn()  # calls drop_known_keys, as the writer wires it
    dup = AppendResult(7, 1, 1234, deduplicated=True, digest=digest)
    assert ka.future.result() == dup and ka.shared is not None and ka.shared.result() == dup
    assert w.keys.waiter("A") is None and w.keys.waiter("B") is kb.shared
    assert w.b.outstanding_bytes == first.nbytes + u1.nbytes + kb.nbytes + u2.nbytes
    w.pending_bytes_add_up()
    w.parts.closing = True
    w.b.kick()
    assert w.batch(6).appends == [u1, kb, u2]
    w.b.cancel_timer()
    release.set()
    await finish_all(w, w.batch(5), w.batch(6))


async def test_reject_queued_keyed_fails_only_the_keyed_each_with_its_own_error() -> None:
    """Kills every ``reject_queued_keyed`` mutant."""
    w = World()
    w.parts.recovering = True
    u1 = w.b.submit([b"u1"], None)
    ka = w.b.submit([b"a"], "A")
    u2 = w.b.submit([b"u2"], None)
    kb = w.b.submit([b"b"], "B")
    w.b.reject_queued_keyed(lambda: StoreUnavailable("keys unknown"))
    ea, eb = ka.future.exception(), kb.future.exception()
    assert isinstance(ea, StoreUnavailable) and isinstance(eb, StoreUnavailable) and ea is not eb
    assert w.keys.waiter("A") is None and w.keys.waiter("B") is None
    assert not u1.future.done() and not u2.future.done()
    assert w.b.outstanding_bytes == u1.nbytes + u2.nbytes
    w.pending_bytes_add_up()
    w.parts.recovering = False
    w.parts.closing = True
    w.b.kick()
    assert w.batch(5).appends == [u1, u2]
    await finish(w.batch(5))


# -------------------------------------------------------------------------------- failing


async def _busy_with_done_batch(w: World) -> tuple[asyncio.Event, Append, Append, Append, Append]:
    """Fragment 5 held in its upload, fragment 6 uploaded (done, not linked), two queued."""
    release = w.store.hold_puts(5)
    held = w.b.submit([b"held"], None)
    w.parts.closing = True
    done = w.b.submit([b"done"], None)
    w.parts.closing = False
    await finish(w.batch(6))
    q1 = w.b.submit([b"q1"], None)
    q2 = w.b.submit([b"q2"], "q2")
    return release, held, done, q1, q2


async def test_a_seal_fails_what_is_queued_and_what_has_landed_not_what_uploads() -> None:
    """Kills ``fail_sealed``'s ``err = None``, ``LogSealed(None)`` and ``fail_queued(None)``;
    ``fail_queued``'s ``a = None``, the ``reject`` argument mutants of both loops,
    ``_pending_bytes = None``/``= 1`` and ``list(None)``."""
    w = World()
    release, held, done, q1, q2 = await _busy_with_done_batch(w)
    w.b.fail_sealed()
    err = q1.future.exception()
    assert isinstance(err, LogSealed) and str(err) == "log t/log is sealed"
    assert q2.future.exception() is err and done.future.exception() is err
    assert w.keys.waiter("q2") is None
    assert not held.future.done() and list(w.b.in_flight) == [5]
    assert not w.b.has_queued and w.b.outstanding_bytes == held.nbytes
    assert w.b._pending_bytes == 0
    w.b.cancel_timer()
    release.set()
    await finish(w.batch(5))


async def test_fail_all_fails_everything_and_stops_the_uploads() -> None:
    """Kills ``fail_all``'s ``fail_queued(None)``, ``list(None)``, ``reject`` argument mutants
    and ``task is None`` (an upload left running)."""
    w = World()
    _, held, done, q1, q2 = await _busy_with_done_batch(w)  # never released: fail_all stops it
    b5 = w.batch(5)
    err = WriterClosed("stopped")
    w.b.fail_all(err)
    assert all(a.future.exception() is err for a in (held, done, q1, q2))
    assert not w.b.in_flight and not w.b.has_queued and w.b.outstanding_bytes == 0
    await finish(b5)  # cancelled in its held put: the task ends, recording why
    assert b5.done and isinstance(b5.error, asyncio.CancelledError)


async def test_reject_in_flight_fails_every_batch_in_flight_each_with_its_own_error() -> None:
    """Kills every ``reject_in_flight`` mutant."""
    w = World()
    release, held, done, q1, _ = await _busy_with_done_batch(w)
    b5 = w.batch(5)
    w.b.reject_in_flight(lambda: StoreUnavailable("lost track"))
    e1, e2 = held.future.exception(), done.future.exception()
    assert isinstance(e1, StoreUnavailable) and isinstance(e2, StoreUnavailable) and e1 is not e2
    assert not w.b.in_flight and not q1.future.done() and w.b.has_queued
    w.b.cancel_timer()
    release.set()
    await finish(b5)


# --------------------------------------------------------------------- in-flight bookkeeping


async def test_take_in_flight_hands_batches_back_in_sequence_order() -> None:
    """Kills every ``take_in_flight`` mutant (``key=None`` cannot order batches; a constant key
    keeps insertion order)."""
    w = World()
    b7, b3 = hand_batch(w, 7, 40), hand_batch(w, 3, 10)
    w.b.put_back(b7)
    w.b.put_back(b3)
    assert w.b.take_in_flight() == [b3, b7]
    assert not w.b.in_flight and w.b.take_in_flight() == []
    w.b.put_back(b3)
    w.b.drop(3)
    assert not w.b.in_flight


async def test_dead_slots_are_taken_once_and_forgotten_below_the_linked_tail() -> None:
    """Kills ``take_dead``'s four mutants and ``forget_dead_below``'s ``<=`` for ``<``."""
    w = World()
    for seq in (3, 4, 5):
        w.b.mark_dead(seq, f"etag{seq}")
    assert w.b.take_dead(9, "kept") == "kept" and w.b.take_dead(9, None) is None
    assert w.b.take_dead(4, "kept") == "etag4" and w.b.take_dead(4, "kept") == "kept"
    w.b.forget_dead_below(5)
    assert w.b.take_dead(3, None) is None and w.b.take_dead(5, None) == "etag5"


async def test_the_batcher_refuses_to_cut_before_it_is_attached() -> None:
    """Pins ``_parts``' refusal (``attach``'s ``= None`` fails every other test)."""
    store = MemStore()
    opts = LogWriterOptions(writer_name="w1", batch=BatchOptions())
    stats: collections.Counter[str] = collections.Counter()
    keys = KeyWindow(store, PREFIX, IdempotencyOptions(), stats, lambda: 1, lambda: None)
    b = Batcher(store, PREFIX, opts, None, stats, keys, Manifest.empty("w"))
    with pytest.raises(AssertionError, match="not attached"):
        b.kick()


# Equivalent mutants (no input tells them apart), by function.  They are the 10 of the 469
# mutants mutmut runs (4 more are module level, not run) that this file leaves alive; it kills
# the other 459 on its own, each applied by hand in a scratch worktree.
#
# __init__
# - ``_committer = ""`` and ``_recovery = ""``: ``_parts`` asserts both are set, so either one
#   alone still fails the assertion before ``attach``, and ``attach`` overwrites both.
# - ``_timer_fired = None``: only ever read as a truth value, and None is falsy like False.
# submit
# - ``key is not None or item.shared is not None``: ``Append`` makes ``shared`` exactly when it
#   has a key, so the two tests always agree.
# - ``Backpressure(message, )``: "batching" is the reason's default.
# drop_known_keys
# - ``... if (a.key is not None) or True else None``: ``known(None)`` is None (no key None is
#   ever stored), what the ``else`` gives.
# - ``resolved(a.key, None, None)``: ``KeyWindow.resolved`` ignores the answer when
#   ``seq_no`` is None (it only pops the waiter).
# kick
# - ``_timer_fired = None`` at the end: read only as a truth value.
# _run_batch
# - ``a.key is not None or a.digest is not None``: an append has a digest exactly when it has
#   a key.
# _retry_batch
# - ``hooked = None`` for ``False``: ``hooked`` is only read as a truth value (``settled``,
#   ``_settle``'s ``not b.hooked``, the re-mark test).
