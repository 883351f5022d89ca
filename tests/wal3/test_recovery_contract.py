"""``Recovery`` (wal3/recovery.py) rule by rule, driven directly: the writer's parts wired as
``LogWriter`` wires them but without its commit loop, so each test calls ``recover`` where the
committer would, on a local store whose requests can be failed, counted or preceded by another
writer's step.  Written against the mutation run of the module (docs/RELIABILITY.md): each test
names the mutants it kills (by the code each one changes); the equivalent ones, which no input
tells apart, are listed at the end of the file.  The writer-level cases are test_recovery.py and
the repair adversary files."""

from __future__ import annotations

import asyncio
import collections
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

import wal3.batcher as batcher_module
import wal3.recovery as recovery_module
from wal3 import (
    BatchOptions,
    IdempotencyOptions,
    LeaseOptions,
    LogWriter,
    LogWriterOptions,
    RetryOptions,
)
from wal3.appends import Append, AppendResult, Batch, FragmentInfo
from wal3.batcher import Batcher
from wal3.committer import Committer
from wal3.errors import LogContention, LogSealed, StoreUnavailable, WriterClosed
from wal3.fragment import EncodedFragment, encode_fragment, request_digest
from wal3.idempotency import KeyWindow
from wal3.layout import load_manifest
from wal3.lease import Lease
from wal3.localstore import LocalStore
from wal3.manifest import U64_MAX, FragmentPointer, Manifest, Snapshot
from wal3.parquetwrite import write_fragment_parquet
from wal3.paths import MANIFEST_PATH, fragment_path, join
from wal3.recovery import Recovery
from wal3.setsum import Setsum
from wal3.store import ObjectMeta, content_etag

from .scripted import OtherWriter, ScriptedStore, Verdict
from .test_read_lease import ManualClock

# Each test takes a fraction of a second; a mutant that hangs one is cut short.
pytestmark = pytest.mark.timeout(20)

PREFIX = "logs/r"
MANIFEST = join(PREFIX, MANIFEST_PATH)


def frag_key(seq: int) -> str:
    return join(PREFIX, fragment_path(seq))


# ------------------------------------------------------------------------------------ the store


@dataclass
class Rule:
    """Requests ``op`` on keys matching ``pattern`` (and ``only``, given the request's put
    arguments): the next ``times`` of them first run ``step`` (if any), then get ``verdict``."""

    op: str
    pattern: str
    verdict: Verdict = None
    step: Callable[[], Awaitable[None]] | None = None
    times: int = 1
    only: Callable[[dict[str, Any]], bool] | None = None
    hits: int = 0


class Stage(ScriptedStore):
    """A local store whose requests are counted and can be failed, or preceded by a step of
    another process (an exact interleaving, never a timed one); HEADs may answer S3's quoted
    etags."""

    def __init__(self, root: Path) -> None:
        self.local = LocalStore(root, fsync=False)
        super().__init__(self.local, self._script)
        self.requests: list[tuple[str, str]] = []
        self.rules: list[Rule] = []
        self.quote = False
        self.rigs: list[Rig] = []

    def when(
        self,
        op: str,
        pattern: str,
        verdict: Verdict = None,
        *,
        step: Callable[[], Awaitable[None]] | None = None,
        times: int = 1,
        only: Callable[[dict[str, Any]], bool] | None = None,
    ) -> Rule:
        rule = Rule(op, pattern, verdict, step, times, only)
        self.rules.append(rule)
        return rule

    def count(self, op: str, pattern: str) -> int:
        return sum(1 for o, k in self.requests if o == op and re.search(pattern, k))

    async def _script(self, op: str, key: str, kw: dict[str, Any]) -> Verdict:
        self.requests.append((op, key))
        for r in self.rules:
            if r.hits < r.times and r.op == op and re.search(r.pattern, key):
                if r.only is not None and not r.only(kw):
                    continue
                r.hits += 1
                if r.step is not None:
                    await r.step()
                return r.verdict
        return None

    async def head(self, key: str) -> ObjectMeta:
        meta = await super().head(key)
        return replace(meta, etag=f'"{meta.etag}"') if self.quote else meta


def conditional(kw: dict[str, Any]) -> bool:
    return kw.get("if_match") is not None


@pytest.fixture
async def stage(tmp_path: Path) -> AsyncIterator[Stage]:
    s = Stage(tmp_path / "store")
    yield s
    for rig in s.rigs:
        rig.stop()
    await asyncio.sleep(0)
    await s.local.close()


async def new_log(stage: Stage, records: int = 1) -> None:
    """A log whose manifest this writer's name wrote, ``records`` fragments of one record."""
    w = await LogWriter.open(stage.local, PREFIX, LogWriterOptions(writer_name="us"))
    for i in range(records):
        await w.append(f"r{i}".encode())
    await w.close()


async def stored(stage: Stage) -> tuple[Manifest, str]:
    loaded = await load_manifest(stage.local, PREFIX)
    assert loaded is not None
    return loaded


# -------------------------------------------------------------------------------------- the rig


def options(
    *, attempts: int = 3, rebases: int = 64, window: int = 256, **kw: Any
) -> LogWriterOptions:
    """Every append its own batch, cut at once (``size_bytes=1``)."""
    return LogWriterOptions(
        writer_name="us",
        batch=BatchOptions(size_bytes=1),
        retry=RetryOptions(max_append_attempts=attempts, max_rebases=rebases),
        idempotency=IdempotencyOptions(window_fragments=window),
        **kw,
    )


class Rig:
    """The writer's parts, wired as ``LogWriter`` wires them, without the commit loop."""

    def __init__(
        self,
        store: Stage,
        opts: LogWriterOptions,
        manifest: Manifest,
        etag: str,
        hook: Callable[[Any], Awaitable[None]] | None,
    ) -> None:
        self.stats: collections.Counter[str] = collections.Counter()
        self.lease = Lease(
            store,
            PREFIX,
            opts,
            held=lambda: (self.committer.manifest, self.committer.etag),
            healthy=lambda: True,
        )
        self.keys = KeyWindow(
            store,
            PREFIX,
            opts.idempotency,
            self.stats,
            next_seq_no=lambda: self.committer.manifest.next_seq_no,
            on_learned=lambda: self.batcher.drop_known_keys(),
        )
        self.batcher = Batcher(store, PREFIX, opts, hook, self.stats, self.keys, manifest)
        self.committer = Committer(
            store, PREFIX, opts, self.stats, manifest, etag, self.lease, self.batcher, self.keys
        )
        self.recovery = Recovery(
            store,
            PREFIX,
            opts,
            hook,
            self.stats,
            self.lease,
            self.batcher,
            self.keys,
            self.committer,
        )
        self.batcher.attach(self.committer, self.recovery)

    @classmethod
    async def open(
        cls,
        stage: Stage,
        opts: LogWriterOptions | None = None,
        *,
        hook: Callable[[Any], Awaitable[None]] | None = None,
        authored: bool = True,
    ) -> Rig:
        """The writer of the stored manifest (``authored``: its own, as after its own write)."""
        opts = opts or options()
        manifest, etag = await stored(stage)
        rig = cls(stage, opts, manifest, etag, hook)
        if authored:
            rig.lease.adopt(etag, opts.clock.monotonic())
        else:
            rig.lease.note_load(manifest, etag)
        stage.rigs.append(rig)
        return rig

    def stop(self) -> None:
        self.batcher.cancel_timer()
        self.batcher.fail_all(WriterClosed("test over"))

    def submit(self, body: bytes, key: str | None = None) -> Append:
        return self.batcher.submit([body], key)

    def batch_of(self, a: Append) -> Batch:
        [b] = [b for b in self.batcher.in_flight.values() if a in b.appends]
        return b

    async def batch(self, body: bytes, key: str | None = None) -> tuple[Append, Batch]:
        """An append, cut into its own batch, whose upload (and hook) has run."""
        a = self.submit(body, key)
        b = self.batch_of(a)
        assert b.task is not None
        await b.task
        return a, b


def failed(a: Append) -> BaseException:
    """What ``a`` was failed with (it must have been answered, and not with a result)."""
    assert a.future.done(), "not answered"
    err = a.future.exception()
    assert err is not None, a.future.result()
    return err


def refused(a: Append, cls: type[BaseException], text: str) -> None:
    """``a`` failed with exactly this error."""
    err = failed(a)
    assert (type(err), str(err)) == (cls, text)


def pending(a: Append) -> bool:
    return not a.future.done()


def fail_encoding(monkeypatch: pytest.MonkeyPatch, *seqs: int) -> None:
    """Encoding the fragments ``seqs`` fails (a batch that can never be linked, its slot free)."""

    def encode(seq_no: int, *args: Any, **kw: Any) -> EncodedFragment:
        if seq_no in seqs:
            raise RuntimeError(f"cannot encode {seq_no}")
        return encode_fragment(seq_no, *args, **kw)

    monkeypatch.setattr(batcher_module, "encode_fragment", encode)


def lose_upload(stage: Stage, seq: int, times: int = 4) -> None:
    """The next ``times`` puts of fragment ``seq`` fail (4: one upload's every attempt)."""
    stage.when("put", re.escape(frag_key(seq)), "fail", times=times)


def our_batch(
    rig: Rig,
    seq: int,
    start: int,
    prev: Setsum | None,
    appends: list[Append],
    *,
    upload: str,
    ts: int = 5_000,
) -> Batch:
    """A batch in flight as the batcher leaves one (encoded, noted, its task over), for states a
    real upload reaches only through a lost answer or several appends in one fragment."""
    loop = asyncio.get_running_loop()
    follows: asyncio.Future[Setsum | None] = loop.create_future()
    follows.set_result(prev)
    b = Batch(seq, start, ts, appends, follows, loop, None)
    keys: dict[str, tuple[int, int, str]] = {}
    off = start
    for a in appends:
        if a.key is not None and a.digest is not None:
            keys[a.key] = (off, len(a.bodies), a.digest)
            rig.keys.wait_on(a.key, a.shared)  # type: ignore[arg-type]
        off += len(a.bodies)
    bodies = [body for a in appends for body in a.bodies]
    frag = encode_fragment(seq, start, ts, bodies, prev=prev, keys=keys, writer="us")
    b.frag, b.md5, b.prev_setsum = frag, frag.content_md5, prev
    b.encoded.set_result(frag.setsum)
    rig.recovery.note_encoded(seq, frag.content_md5, frag.setsum)
    b.upload, b.hooked, b.done = upload, True, True
    rig.batcher.put_back(b)
    return b


def append(body: bytes, key: str | None = None) -> Append:
    return Append([body], key, asyncio.get_running_loop())


def pointer(f: EncodedFragment, *, md5: bool = True) -> FragmentPointer:
    """The pointer a writer links for ``f`` (a Rust writer's carries no MD5)."""
    return FragmentPointer(
        f.path, f.seq_no, f.start, f.limit, len(f.data), f.setsum, f.content_md5 if md5 else None
    )


async def link(stage: Stage, ptr: FragmentPointer, writer: str = "them") -> None:
    """Another writer links ``ptr`` at the stored tail."""
    m, etag = await stored(stage)
    await stage.local.put(MANIFEST, m.with_fragments([ptr], writer).to_bytes(), if_match=etag)


async def theirs(
    stage: Stage,
    bodies: list[bytes],
    *,
    key: str | None = None,
    ts: int = 7_000,
    linked: bool = True,
) -> EncodedFragment:
    """Another writer's fragment after the stored tail (one append of ``bodies``, keyed or not),
    uploaded and, if ``linked``, linked."""
    m, _ = await stored(stage)
    keys = {} if key is None else {key: (m.next_offset, len(bodies), request_digest(bodies))}
    f = encode_fragment(
        m.next_seq_no, m.next_offset, ts, bodies, prev=m.tail_setsum, keys=keys, writer="them"
    )
    await stage.local.put(join(PREFIX, f.path), f.data, if_none_match="*")
    if linked:
        await link(stage, pointer(f))
    return f


async def collect(stage: Stage, below: int, *, delete: bool) -> None:
    """A collector's cut: fragments below seq ``below`` leave the manifest (their setsum goes to
    ``collected``) and, if ``delete``, their objects go too."""
    m, etag = await stored(stage)
    gone = [p for p in m.fragments if p.seq_no < below]
    cut = replace(
        m,
        fragments=tuple(p for p in m.fragments if p.seq_no >= below),
        collected=m.collected + Setsum.sum(p.setsum for p in gone),
        writer="gc",
    )
    cut.check()
    await stage.local.put(MANIFEST, cut.to_bytes(), if_match=etag)
    if delete:
        for p in gone:
            await stage.local.delete(join(PREFIX, p.path))


async def fold(stage: Stage, n: int) -> Snapshot:
    """Another writer folds the oldest ``n`` root fragments into a snapshot."""
    m, etag = await stored(stage)
    snap = Snapshot.build(m.fragments[:n], "them")
    await stage.local.put(join(PREFIX, snap.path), snap.to_bytes(), if_none_match="*")
    folded = m.with_snapshot(snap, "them")
    assert folded is not None
    await stage.local.put(MANIFEST, folded.to_bytes(), if_match=etag)
    return snap


class SleepSpy:
    """Recovery's ``asyncio``, recording the pauses it takes (each one a turn of the loop)."""

    def __init__(self) -> None:
        self.delays: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, delay: float) -> None:
        self.delays.append(delay)
        await asyncio.sleep(0)


def spy_sleeps(monkeypatch: pytest.MonkeyPatch) -> SleepSpy:
    spy = SleepSpy()
    monkeypatch.setattr(recovery_module, "asyncio", spy)
    return spy


def spy_retries(monkeypatch: pytest.MonkeyPatch, rig: Rig) -> list[tuple[int, float]]:
    """The (seq, delay) of every kept batch's retry."""
    calls: list[tuple[int, float]] = []
    real = rig.batcher.retry

    def retry(b: Batch, delay_s: float) -> None:
        calls.append((b.seq_no, delay_s))
        real(b, delay_s)

    monkeypatch.setattr(rig.batcher, "retry", retry)
    return calls


# ------------------------------------------------------------------------------ recovery itself


async def test_a_recovery_is_counted_and_seen_running_while_it_runs(stage: Stage) -> None:
    """A writer is not recovering (nor stale) until a recovery runs, is recovering while one
    runs, and not after; each recovery counts once in
    ``recoveries``; a recovery handed the manifest its caller loaded does not load it again,
    and installs it.  Kills the initial ``_recovering`` / ``_stale`` mutants (None, True),
    ``_recovering = True`` at the start (None, False), ``_recovering = False`` at the end
    (None, True), the counter's mutants, ``reloaded is not None`` and ``installed`` with None
    for the manifest or the etag."""
    await new_log(stage)
    rig = await Rig.open(stage)
    assert rig.recovery.recovering is False and rig.recovery.stale is False
    seen: list[bool] = []

    async def look() -> None:
        seen.append(rig.recovery.recovering)

    stage.when("get", re.escape(MANIFEST), step=look)
    await rig.recovery.recover()
    assert seen == [True] and rig.recovery.recovering is False
    await OtherWriter(stage.local, PREFIX, "them").append()
    loaded = await stored(stage)
    gets = stage.count("get", re.escape(MANIFEST))
    await rig.recovery.recover(reloaded=loaded)
    assert stage.count("get", re.escape(MANIFEST)) == gets
    assert (rig.committer.manifest, rig.committer.etag) == loaded
    assert rig.stats["recoveries"] == 2 and rig.recovery.stale is False


async def test_uploads_in_flight_settle_before_recovery_decides(stage: Stage) -> None:
    """Recovery first waits for every upload in flight: one still running when it starts is
    judged once done (here, found and linked by repair), never while running.  Kills ``tasks``'
    ``is`` for ``is not`` and ``gather`` without the tasks."""
    await new_log(stage)
    rig = await Rig.open(stage)
    go = asyncio.Event()

    async def hold() -> None:
        await go.wait()

    stage.when("put", re.escape(frag_key(2)), step=hold)
    a = rig.submit(b"ours")
    b = rig.batch_of(a)
    seen: list[bool] = []

    async def look() -> None:
        seen.append(b.done)

    stage.when("get", re.escape(MANIFEST), step=look)
    recovering = asyncio.create_task(rig.recovery.recover())
    for _ in range(5):
        await asyncio.sleep(0)
    go.set()
    await recovering
    assert seen == [True]
    assert a.future.result() == AppendResult(2, 1, b.timestamp_us)


async def test_losing_track_of_the_store_fails_what_is_in_flight(
    monkeypatch: pytest.MonkeyPatch, stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    """The reload failed: nothing in flight can be acknowledged, so its appends and the edits
    waiting fail ``StoreUnavailable`` naming the store's error; the writer is stale (it cuts
    nothing new until a recovery reloads), says so in the log and in ``stale``, and wakes its
    committer 0.1 s later; the next good recovery clears it.  Kills ``go_stale(None)``, every
    mutant of ``go_stale``'s log line, counter, two rejections, ``_stale = True``, the
    ``call_later``, ``_loop = None``, and ``_stale = False`` after a good recovery (None,
    True)."""
    caplog.set_level("WARNING", logger="wal3.writer")
    loop = asyncio.get_running_loop()
    later: list[tuple[float, object]] = []
    real_later = loop.call_later

    def call_later(delay: float, callback: Callable[..., object], *args: Any) -> Any:
        later.append((delay, callback))
        return real_later(delay, callback, *args)

    await new_log(stage)
    rig = await Rig.open(stage)
    monkeypatch.setattr(loop, "call_later", call_later)
    a, _ = await rig.batch(b"ours")
    edit = asyncio.create_task(rig.committer.edit(lambda m: m))
    await asyncio.sleep(0)
    stage.when("get", re.escape(MANIFEST), "fail", times=2)
    await rig.recovery.recover()
    why = f"scripted get failure of {MANIFEST}"
    refused(a, StoreUnavailable, f"store unavailable: {why}")
    with pytest.raises(StoreUnavailable) as info:
        await edit
    assert str(info.value) == f"store unavailable: {why}"
    assert rig.recovery.stale is True and rig.recovery.recovering is False
    assert (0.1, rig.committer.wake) in later
    queued = rig.submit(b"later")
    assert pending(queued) and not rig.batcher.in_flight  # stale: nothing is cut
    await rig.recovery.recover()
    assert rig.stats["stale"] == 2
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        f"writer for logs/r lost track of the manifest: StoreUnavailable({why!r})"
    ] * 2
    await rig.recovery.recover()
    assert rig.recovery.stale is False and rig.stats["stale"] == 2
    # Our fragment 2 was in the store: repair linked it (its append had an ambiguous answer).
    assert rig.stats["repaired"] == 1 and rig.batch_of(queued).seq_no == 3


async def test_going_stale_outside_a_recovery_leaves_it_not_recovering(stage: Stage) -> None:
    """The committer goes stale on its own (a manifest write failed): that ends no recovery it
    was not in, and leaves none running.  Kills ``_recovering = False`` -> None / True in
    ``go_stale``."""
    await new_log(stage)
    rig = await Rig.open(stage)
    rig.recovery.go_stale(OSError("disk"))
    assert rig.recovery.recovering is False and rig.recovery.stale is True


async def test_a_manifest_gone_before_recovery_closes_the_writer(stage: Stage) -> None:
    """The manifest is gone when recovery reloads: ``WriterClosed``, naming the log.  Kills
    ``WriterClosed(None)`` at the reload and ``is not None`` there."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await stage.local.delete(MANIFEST)
    with pytest.raises(WriterClosed) as info:
        await rig.recovery.recover()
    assert str(info.value) == "manifest of logs/r vanished"
    assert rig.recovery.recovering is False


async def test_the_bytes_this_writer_encoded_are_remembered_for_four_windows(
    stage: Stage,
) -> None:
    """What this writer encoded (latest per slot, and every MD5) is remembered for the last
    ``4 x window_fragments`` fragments, oldest forgotten first.  Kills ``note_encoded``'s
    mutants: ``None`` values, ``move_to_end(None)``, ``>=``, ``/``, ``5 *``, ``last=True``."""
    await new_log(stage)
    rig = await Rig.open(stage, options(window=2))
    notes = [(seq, f"{seq:032x}", Setsum.of(bytes([seq]))) for seq in range(1, 11)]
    for seq, md5, setsum in notes:
        rig.recovery.note_encoded(seq, md5, setsum)
    rig.recovery.note_encoded(4, "f" * 32, Setsum.of(b"again"))  # a later attempt at slot 4
    mine, encoded = rig.recovery._mine, rig.recovery._encoded
    assert list(mine) == [3, 5, 6, 7, 8, 9, 10, 4]
    assert mine[10] == (notes[9][1], notes[9][2]) and mine[4] == ("f" * 32, Setsum.of(b"again"))
    assert list(encoded) == [md5 for _, md5, _ in notes[3:]] + ["f" * 32]


# ----------------------------------------------------------------------------------- contention


async def test_another_writers_append_fails_ours_as_contention(stage: Stage) -> None:
    """Another writer linked seq 2 while ours was in flight there, and ours at 3 followed it:
    both are answered "not written" (``LogContention``, once each in ``stats``), nothing is
    read-repaired, no HEAD is needed (the manifest tells whose each linked fragment is), and our
    object at 3, which follows nothing linked, is overwritten by the next fragment cut there.
    Kills ``foreign = None``, ``_foreign``'s ``return False`` for a fragment not ours and its
    ``if self._is_ours(p)`` unnegated, the ``contention`` counter's mutants,
    ``LogContention(None)`` and the ``reject`` mutants there, and the HEADs of ``_foreign``
    with ``p = None`` / ``get(None)`` / ``is None`` and of ``_since`` with ``n <= 1``."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await OtherWriter(stage.local, PREFIX, "them").append()
    a2, b2 = await rig.batch(b"ours-2")
    a3, b3 = await rig.batch(b"ours-3")
    assert (b2.upload, b3.upload) == ("absent", "ok")
    heads = stage.count("head", ".")
    await rig.recovery.recover()
    for a in (a2, a3):
        refused(a, LogContention, "another writer appended to logs/r; not written")
    assert rig.stats["contention"] == 2 and rig.stats["repaired"] == 0
    assert stage.count("head", ".") == heads
    a4 = rig.submit(b"next")
    b4 = rig.batch_of(a4)
    assert b3.frag is not None
    assert b4.seq_no == 3 and b4.overwrite_etag == content_etag(b3.frag.data)
    assert b4.task is not None
    await b4.task
    assert b4.upload == "ok"


async def test_after_our_own_fragment_theirs_is_still_contention(stage: Stage) -> None:
    """Another writer's repair linked our fragment 2, then it appended 3 where ours was headed:
    2 is acknowledged, 3 is contention.  Kills ``_foreign``'s ``continue`` -> ``break`` (it
    stopped at the first fragment of ours)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    a2, b2 = await rig.batch(b"ours-2")
    await them.link_tail_orphan()
    await them.append()
    a3, b3 = await rig.batch(b"ours-3")
    assert b3.upload == "absent"
    await rig.recovery.recover()
    assert a2.future.result() == AppendResult(2, 1, b2.timestamp_us)
    refused(a3, LogContention, "another writer appended to logs/r; not written")


async def test_a_fragment_in_a_slot_we_never_encoded_is_someone_elses(
    monkeypatch: pytest.MonkeyPatch, stage: Stage
) -> None:
    """Another writer linked 2 where our batch never got encoded: a linked fragment this writer
    has no bytes for is someone else's, so our append is contention.  Kills ``_is_ours``'
    ``return True`` when nothing was noted for the slot."""
    await new_log(stage)
    fail_encoding(monkeypatch, 2)
    rig = await Rig.open(stage)
    await OtherWriter(stage.local, PREFIX, "them").append()
    a, b = await rig.batch(b"ours")
    assert b.frag is None
    await rig.recovery.recover()
    refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_equal_records_under_another_name_are_not_ours(stage: Stage) -> None:
    """Another writer linked at slot 2 the very records ours holds (same offsets, timestamp and
    bodies, so the same setsum) under its own name: by its MD5 it is not ours, so our append is
    contention, and so is that of our batch 3 (whose upload's answer was lost), though it
    follows that setsum: nothing after a batch that can never be linked is kept.  Kills
    ``_is_ours``' ``... and False`` (setsums compared) and ``chain = True`` after a free
    batch."""
    await new_log(stage)
    rig = await Rig.open(stage)
    m, _ = await stored(stage)
    a2, a3 = append(b"same"), append(b"next")
    b2 = our_batch(rig, 2, 2, m.tail_setsum, [a2], upload="unknown", ts=7_000)
    assert b2.frag is not None
    our_batch(rig, 3, 3, b2.frag.setsum, [a3], upload="unknown")  # not in the store
    f = await theirs(stage, [b"same"], ts=7_000)
    assert f.setsum == b2.frag.setsum and f.content_md5 != b2.md5
    await rig.recovery.recover()
    for a in (a2, a3):
        refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_our_dead_object_overwritten_and_linked_by_another_is_theirs(stage: Stage) -> None:
    """Our fragment 2 followed a setsum that was never linked (dead); another writer overwrote
    it in place and linked its own there.  The pointer names our path, but not our bytes:
    contention.  Kills ``p.path == frag.path or self._is_ours(p)``."""
    await new_log(stage)
    rig = await Rig.open(stage)
    a = append(b"ours")
    b = our_batch(rig, 2, 2, Setsum.of(b"never linked"), [a], upload="ok")
    assert b.frag is not None
    await stage.local.put(frag_key(2), b.frag.data)
    await OtherWriter(stage.local, PREFIX, "them").append()
    assert (await stage.local.get(frag_key(2))).data != b.frag.data
    await rig.recovery.recover()
    refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_our_object_at_the_tail_slot_is_not_linked_though_its_offset_was_collected(
    stage: Stage,
) -> None:
    """Another writer linked 2 with ten records and 3 after it, and a collector cut 2: our 4,
    uploaded at the free slot 4, starts at an offset below the oldest one left, yet its slot is
    the tail's next and nothing links it.  It is contention, never acknowledged (its object
    matches our bytes, but it was never linked).  Kills ``b.seq_no > manifest.next_seq_no``
    (for ``>=``), which sent it to the HEAD of its own object and answered it written."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await theirs(stage, [b"t"] * 10)
    await theirs(stage, [b"t"])
    a2, _ = await rig.batch(b"ours-2")
    a3, _ = await rig.batch(b"ours-3")
    a4, b4 = await rig.batch(b"ours-4")
    assert (b4.seq_no, b4.start, b4.upload) == (4, 4, "ok")
    await collect(stage, 3, delete=False)
    await rig.recovery.recover()
    for a in (a2, a3, a4):
        refused(a, LogContention, "another writer appended to logs/r; not written")


# ------------------------------------------------------------ the retry budget of a free append


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "outcome"),
    [(0, 1, "contention"), (2, 3, "contention"), (0, 2, "retry")],
)
async def test_meeting_a_live_writer_costs_an_attempt(
    stage: Stage, attempts: int, max_attempts: int, outcome: str
) -> None:
    """Our repair was linking the orphan at the tail when its writer linked it first (a plain
    precondition failure, the manifest past the slot): that writer is alive, so each such round
    costs our append an attempt and marks it ``met_writer``; out of attempts it is "another
    writer kept appending".  The other writer's link survives.  Kills ``met_writer = True`` ->
    None/False, the three ``a.attempts += 1`` mutants there, ``claimed = True`` at the start,
    ``met_writer = None`` / ``isinstance`` unnegated, the repair's ``lease.load()`` and
    ``lease.put`` mutants (``put(new, None)`` overwrote the other's link), ``_Repaired(...,
    None, ...)`` and ``return`` for ``break``."""
    await new_log(stage)
    rig = await Rig.open(stage, options(attempts=max_attempts))
    them = OtherWriter(stage.local, PREFIX, "them")
    await them.upload_next()
    a, b = await rig.batch(b"ours")
    assert b.upload == "absent"
    a.attempts = attempts

    async def they_link() -> None:
        await them.link_tail_orphan()

    stage.when("put", re.escape(MANIFEST), step=they_link, only=conditional)
    await rig.recovery.recover()
    m, _ = await stored(stage)
    assert m.writer == "them" and m.next_seq_no == 3
    assert rig.stats["repaired"] == 0 and rig.stats["contention"] == 0
    assert a.met_writer is True and a.attempts == attempts + 1
    if outcome == "contention":
        refused(a, LogContention, "another writer kept appending to logs/r; not written")
    else:
        assert pending(a) and rig.batch_of(a).seq_no == 3  # requeued, cut again after theirs


@pytest.mark.parametrize(
    ("rounds", "attempts", "outcome"),
    [(0, 0, "retry"), (3, 2, "chased"), (2, 2, "retry"), (3, 1, "retry")],
)
async def test_linking_a_dead_writers_orphans_is_free_three_times(
    stage: Stage, rounds: int, attempts: int, outcome: str
) -> None:
    """Our repair linked another (dead) writer's orphan over our slot: that round is free
    (``others_rounds`` counts it) until it has happened more than ``max_append_attempts`` (3)
    times; each round after costs an attempt, and an append out of attempts that way was "kept
    appending" against (a ``StoreUnavailable``: no writer was met, so not contention).  Kills the ``others_rounds += 1`` mutants, its ``>`` -> ``>=``, the
    ``a.attempts += 1`` mutants of that branch, ``kept_ahead = None``, ``met_writer or
    kept_ahead`` -> ``and`` and the ``... and False`` form of that condition, and
    ``linked_others`` -> None / ``and`` / ``in`` and ``_Repaired(..., None)`` (no others)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await OtherWriter(stage.local, PREFIX, "dead").upload_next()
    a, _b = await rig.batch(b"ours")
    a.others_rounds, a.attempts = rounds, attempts
    await rig.recovery.recover()
    m, _ = await stored(stage)
    assert m.next_seq_no == 3 and m.writer == "us" and rig.stats["repaired"] == 1
    assert (a.others_rounds, a.met_writer) == (rounds + 1, False)
    assert a.attempts == attempts + (1 if rounds + 1 > 3 else 0)
    if outcome == "chased":
        # Not LogContention: no writer was met, the orphans may be a dead writer's.
        refused(
            a,
            StoreUnavailable,
            f"logs/r: not written: others' orphan fragments took its slot {rounds + 1} times",
        )
    else:
        assert pending(a) and rig.batch_of(a).seq_no == 3


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "rounds", "outcome"),
    [
        (0, 1, 0, "give up"),
        (2, 3, 0, "give up"),
        (0, 2, 0, "retry"),
        (2, 3, 3, "give up"),
        (2, 3, 4, "chased"),
    ],
)
async def test_a_recovery_that_moved_nothing_costs_an_attempt(
    monkeypatch: pytest.MonkeyPatch,
    stage: Stage,
    attempts: int,
    max_attempts: int,
    rounds: int,
    outcome: str,
) -> None:
    """A batch that can never be linked (its encoding failed) on a log nobody moved: each such
    recovery costs its appends an attempt; out of attempts they are "not written after N
    attempts (cause)", a ``StoreUnavailable`` (nobody else appended), unless earlier rounds of
    others' orphans passed the budget (then "took its slot N times", also ``StoreUnavailable``).  Kills ``not moved`` -> ``moved``,
    ``moved`` with ``>=``, the ``a.attempts += 1`` mutants of that branch, ``>=`` -> ``>`` on
    the budget, ``kept_ahead``'s ``>`` -> ``>=``, the ``... or True`` form of the message's
    condition, ``_give_up_error(None)`` and its ``cause`` mutants, ``_repair_blocked = ""``,
    ``_foreign``'s ``return True`` on an unmoved log, ``met_writer = linked_others = True``; on
    an empty log (no tail setsum) also the ``or`` mutants of the chain test (a batch without a
    fragment kept) and of the dead-object test (one without a fragment marked dead)."""
    await new_log(stage, 0)
    fail_encoding(monkeypatch, 1)
    rig = await Rig.open(stage, options(attempts=max_attempts))
    a, b = await rig.batch(b"ours")
    assert b.frag is None and b.upload == "pending"
    a.attempts, a.others_rounds = attempts, rounds
    await rig.recovery.recover()
    assert (a.attempts, a.others_rounds, a.met_writer) == (attempts + 1, rounds, False)
    if outcome == "give up":
        refused(
            a,
            StoreUnavailable,
            f"logs/r: not written after {max_attempts} attempts (RuntimeError('cannot encode 1'))",
        )
    elif outcome == "chased":
        refused(
            a,
            StoreUnavailable,
            f"logs/r: not written: others' orphan fragments took its slot {rounds} times",
        )
    else:
        assert pending(a) and rig.batch_of(a).seq_no == 1
    assert rig.stats["contention"] == 0


async def test_giving_up_names_the_hook_that_blocked_repair(
    monkeypatch: pytest.MonkeyPatch, stage: Stage
) -> None:
    """When read repair stopped because the fragment hook failed, that failure is the cause an
    append that gives up names (not its own batch's error).  Kills ``_give_up_error``'s
    ``... is not None) and False`` and ``is`` for ``is not``, and ``_repair_blocked = None``."""
    await new_log(stage, 0)
    fail_encoding(monkeypatch, 1)

    async def hook(info: FragmentInfo) -> None:
        if info.repaired:
            raise StoreUnavailable("dirty log down")

    rig = await Rig.open(stage, options(attempts=1), hook=hook)
    await OtherWriter(stage.local, PREFIX, "dead").upload_next()  # an orphan at 1 to repair
    a, _ = await rig.batch(b"ours")
    await rig.recovery.recover()
    refused(
        a,
        StoreUnavailable,
        "logs/r: not written after 1 attempts (StoreUnavailable('dirty log down'))",
    )
    assert rig.stats["repaired"] == 0


# ---------------------------------------------------------------------------------- read repair


async def test_read_repair_links_our_own_orphans_and_acknowledges_them(
    monkeypatch: pytest.MonkeyPatch, stage: Stage, caplog: pytest.LogCaptureFixture
) -> None:
    """Our fragments 2 and 3 were uploaded and the manifest write failed: repair links each
    (the hook told first, ``repaired=True``), exactly as the batch would have been linked, and
    both appends are answered; that moved the log by our own bytes, so the append of batch 4
    (never encodable) is retried free.  The repaired manifest is the one the writer now holds,
    and its own (authored).  No HEAD was needed.  Kills the pointer's mutants (every field),
    the ``with_fragments`` / ``stamped`` argument mutants not listed as equivalent, ``put``
    with None for the manifest or a missing argument,
    ``landed`` missing an argument or with None for the etag, the repair counter's, the
    ``read-repaired`` log line's, the hook call's (``FragmentInfo`` fields, ``repaired``,
    ``hook is None``), ``ts = None`` and ``records[1]``, ``takes_over(manifest, None)``,
    ``installed`` with None for manifest or etag, ``_Repaired(manifest, None, ...)``, ``etag =
    None``, ``moved = None``, ``moved or linked_others`` and ``linked_others`` with ``in``."""
    calls: list[FragmentInfo] = []

    async def hook(info: FragmentInfo) -> None:
        calls.append(info)

    caplog.set_level("INFO", logger="wal3.writer")
    await new_log(stage)
    fail_encoding(monkeypatch, 4)
    rig = await Rig.open(stage, hook=hook)
    a2, b2 = await rig.batch(b"ours-2")
    a3, b3 = await rig.batch(b"ours-3")
    a4, b4 = await rig.batch(b"ours-4")
    assert b4.frag is None
    heads = stage.count("head", ".")
    await rig.recovery.recover()
    assert stage.count("head", ".") == heads
    assert a2.future.result() == AppendResult(2, 1, b2.timestamp_us)
    assert a3.future.result() == AppendResult(3, 1, b3.timestamp_us)
    m, etag = await stored(stage)
    assert b2.frag is not None and b3.frag is not None
    assert m.fragments[-2:] == (pointer(b2.frag), pointer(b3.frag))
    assert m.writer == "us" and rig.stats["repaired"] == 2
    assert (rig.committer.manifest, rig.committer.etag) == (m, etag)
    assert rig.lease.authored(etag)
    assert calls[-2:] == [
        FragmentInfo(2, 2, 1, b2.timestamp_us, True),
        FragmentInfo(3, 3, 1, b3.timestamp_us, True),
    ]
    assert [r.getMessage() for r in caplog.records if r.levelname == "INFO"] == [
        "read-repaired fragment 2 of logs/r",
        "read-repaired fragment 3 of logs/r",
    ]
    assert (a4.attempts, a4.others_rounds) == (0, 0) and pending(a4)


async def test_our_first_fragment_is_acknowledged_from_the_manifest_alone(stage: Stage) -> None:
    """The log's first fragment, ours, repaired: found in the manifest (it starts at the oldest
    offset), acknowledged with no HEAD.  Kills ``>=`` -> ``>`` against ``oldest_offset``."""
    await new_log(stage, 0)
    rig = await Rig.open(stage)
    a, b = await rig.batch(b"first")
    heads = stage.count("head", ".")
    await rig.recovery.recover()
    assert a.future.result() == AppendResult(1, 1, b.timestamp_us)
    assert stage.count("head", ".") == heads


async def test_repair_retries_past_an_edit_that_appended_nothing(stage: Stage) -> None:
    """Our repair's manifest write lost to an edit that moved no tail (a collector's, say): it
    reloads and links the orphan on the new manifest; nobody was met.  Kills ``> seq`` ->
    ``>= seq`` and ``claimed = True`` at the start (both stopped there, the orphan unlinked)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    a, b = await rig.batch(b"ours")

    async def edit() -> None:
        m, etag = await stored(stage)
        await stage.local.put(MANIFEST, replace(m, writer="gc").to_bytes(), if_match=etag)

    stage.when("put", re.escape(MANIFEST), step=edit, only=conditional)
    await rig.recovery.recover()
    assert a.future.result() == AppendResult(2, 1, b.timestamp_us)
    assert rig.stats["repaired"] == 1 and not a.met_writer


async def test_a_manifest_gone_while_repairing_closes_the_writer(stage: Stage) -> None:
    """The manifest vanished under our repair's write: ``WriterClosed``, naming the log.  Kills
    ``WriterClosed(None)`` there (and ``is not None``)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await rig.batch(b"ours")

    async def delete() -> None:
        await stage.local.delete(MANIFEST)

    stage.when("put", re.escape(MANIFEST), step=delete, only=conditional)
    with pytest.raises(WriterClosed) as info:
        await rig.recovery.recover()
    assert str(info.value) == "manifest of logs/r vanished"
    assert rig.recovery.recovering is False


def _bad_object(kind: str) -> bytes:
    """What can sit at slot 2 of a one-fragment log and never be linked there."""
    if kind == "stale":  # a speculative upload that followed a fragment never linked
        return encode_fragment(2, 2, 9, [b"x"], prev=Setsum.of(b"elsewhere")).data
    if kind == "misplaced":  # another implementation's (no ``prev``), at the wrong offset
        return encode_fragment(2, 7, 9, [b"x"]).data
    return b"not parquet"


@pytest.mark.parametrize("kind", ["garbage", "misplaced", "stale"])
async def test_an_object_that_can_never_be_linked_is_overwritten(stage: Stage, kind: str) -> None:
    """An unreadable object, or one that does not follow the tail (the wrong ``prev``, or no
    ``prev`` and the wrong start), is never linked: it is marked dead, and the next fragment cut
    at its slot replaces it (If-Match on its etag).  Kills ``mark_dead`` with None for the
    sequence number or the etag (unreadable, not following), ``return`` for those ``break``s,
    ``start == ... or`` (the misplaced one linked), ``prev is not None or`` and ``!=`` for the
    prev (the stale one linked), ``fits`` unnegated, and ``forget_dead_below(None)``."""
    await new_log(stage)
    data = _bad_object(kind)
    await stage.local.put(frag_key(2), data)
    rig = await Rig.open(stage)
    await rig.recovery.recover()
    assert rig.stats["repaired"] == 0 and (await stored(stage))[0].next_seq_no == 2
    a = rig.submit(b"ours")
    b = rig.batch_of(a)
    assert (b.seq_no, b.overwrite_etag) == (2, content_etag(data))
    assert b.task is not None
    await b.task
    assert b.upload == "ok"


@pytest.mark.parametrize("prev", ["tail", "none"])
async def test_an_orphan_that_follows_the_tail_is_linked(stage: Stage, prev: str) -> None:
    """An orphan at the tail's slot and offset is linked whether it names the tail as its
    ``prev`` or names none (another implementation's: placed by position alone).  Kills ``fits
    = None``, ``!=`` for the start, ``prev is None and ...`` and ``!=`` for the prev."""
    await new_log(stage)
    m, _ = await stored(stage)
    f = encode_fragment(2, 2, 9, [b"x"], prev=m.tail_setsum if prev == "tail" else None)
    await stage.local.put(frag_key(2), f.data)
    rig = await Rig.open(stage)
    await rig.recovery.recover()
    assert rig.stats["repaired"] == 1
    assert (await stored(stage))[0].fragments[-1] == pointer(f)


async def test_an_orphan_past_the_last_offset_is_dead(stage: Stage) -> None:
    """A log whose next offset is u64::MAX, and an orphan there holding one record: it fits the
    tail but would end past u64, so it is marked dead, never linked.  Kills the ``mark_dead``
    mutants of the ``LogFull`` branch and ``return`` for its ``break``."""
    full = Manifest(initial_offset=U64_MAX, writer="us")
    await stage.local.put(MANIFEST, full.to_bytes(), if_none_match="*")
    data = write_fragment_parquet(U64_MAX, 9, [b"x"], {})  # our encoder refuses to write it
    await stage.local.put(frag_key(1), data)
    rig = await Rig.open(stage)
    await rig.recovery.recover()
    assert rig.stats["repaired"] == 0
    assert rig.batcher.take_dead(1, None) == content_etag(data)


@pytest.mark.parametrize("slot3", ["free", "theirs"])
async def test_our_objects_past_an_unlinkable_batch_are_marked_dead(
    stage: Stage, slot3: str
) -> None:
    """Repair linked a dead writer's orphan over our 2 and stopped at its cap (one): our 3,
    uploaded but following our 2, can never be linked, so the next fragment cut at 3 replaces
    it in place; had our upload at 3 found another's bytes there, nothing of ours is to be
    replaced.  Kills the dead-marking test's ``>`` and ``==`` / ``"XXabsentXX"`` /
    ``"ABSENT"`` forms and its first ``or``, and ``mark_dead(None, ...)``."""
    await new_log(stage)
    rig = await Rig.open(stage, options(rebases=1))
    dead = OtherWriter(stage.local, PREFIX, "dead")
    await dead.upload_chain(1 if slot3 == "free" else 2)
    a2, b2 = await rig.batch(b"ours-2")
    a3, b3 = await rig.batch(b"ours-3")
    assert (b2.upload, b3.upload) == ("absent", "ok" if slot3 == "free" else "absent")
    await rig.recovery.recover()
    assert rig.stats["repaired"] == 1 and pending(a2) and pending(a3)
    again = rig.batch_of(a2)
    assert again.seq_no == 3
    assert b3.frag is not None
    assert again.overwrite_etag == (content_etag(b3.frag.data) if slot3 == "free" else None)


# --------------------------------------------------------------------------------- kept batches


@pytest.mark.parametrize(
    ("attempts", "max_attempts", "delay"), [(0, 3, 0.04), (2, 10, 0.16), (9, 20, 1.0)]
)
async def test_a_batch_that_still_continues_the_log_keeps_its_bytes(
    monkeypatch: pytest.MonkeyPatch, stage: Stage, attempts: int, max_attempts: int, delay: float
) -> None:
    """Our upload of 2 failed (the store was down for it) and 3 and 4 followed it: all three
    still continue the log exactly, so they stay in flight with their bytes; only 2 (the one
    that stalls the log) is charged an attempt and retried, after 0.02 s x 2^attempts (at most
    1 s), its error cleared and not done until that retry ends; 3 and 4, settled, wait to be
    linked; the next batch follows 4.  A store failure in flight also made recovery pause 50 ms
    before reloading.  Kills ``_sort_leftovers``' chain mutants (``chain`` None or sealed-based,
    each ``==`` negated, ``frag is None``, ``seq - 1`` / ``seq + 2``, ``break``), ``keep =
    None``, ``continue_after(None)`` / ``keep[+1]`` / ``keep[-2]``, ``_retry_kept``'s ``head``
    mutants, the ``b.attempts += 1`` mutants, ``b.error = ""``, ``put_back(None)``,
    ``not b.settled`` unnegated, ``b.done`` True, the delay's mutants and ``retry``'s, and the
    pause's (``any`` / ``is`` / ``sleep(None)`` / ``1.05``)."""
    await new_log(stage)
    rig = await Rig.open(stage, options(attempts=max_attempts))
    lose_upload(stage, 2)
    a2, b2 = await rig.batch(b"ours-2")
    a3, b3 = await rig.batch(b"ours-3")
    a4, b4 = await rig.batch(b"ours-4")
    assert (b2.upload, b3.upload, b4.upload) == ("unknown", "ok", "ok")
    b2.attempts = attempts
    retries = spy_retries(monkeypatch, rig)
    sleeps = spy_sleeps(monkeypatch)
    await rig.recovery.recover()
    assert sleeps.delays == [0.05]
    assert [rig.batcher.in_flight.get(s) for s in (2, 3, 4)] == [b2, b3, b4]
    assert (b2.attempts, b3.attempts, b4.attempts) == (attempts + 1, 0, 0)
    assert (b2.done, b2.error, b3.done, b3.error, b4.error) == (False, None, True, None, None)
    [(seq, after)] = retries
    assert seq == 2 and abs(after - delay) < 1e-9
    assert all(pending(a) for a in (a2, a3, a4))
    a5 = rig.submit(b"ours-5")
    b5 = rig.batch_of(a5)
    assert b5.seq_no == 5 and b5.start == 5 and b5.prev is b4.encoded
    if delay < 0.1:
        assert b2.task is not None
        await b2.task
        assert (b2.upload, b2.error, b2.done) == ("ok", None, True)


async def test_a_kept_batch_out_of_attempts_fails_with_those_after_it(stage: Stage) -> None:
    """The stalling batch ran out of attempts: its appends and those of every kept batch after
    it fail with one ambiguous error naming the cause ("it may still appear": the bytes may be
    linked yet), and the next batch goes at the tail again.  Kills ``>`` for ``>=`` on the
    budget, ``cause = None``, ``cause``
    with ``and``, ``err = None``, the message's mutants, ``reject`` with None or missing
    arguments, and ``keep = None`` / ``keep[:i]`` there."""
    await new_log(stage)
    rig = await Rig.open(stage, options(attempts=3))
    lose_upload(stage, 2)
    a2, b2 = await rig.batch(b"ours-2")
    a3, _ = await rig.batch(b"ours-3")
    b2.attempts = 2
    cause = b2.error
    await rig.recovery.recover()
    text = f"fragment 2 of logs/r could not be linked ({cause!r}); it may still appear"
    for a in (a2, a3):
        refused(a, StoreUnavailable, text)
    assert not rig.batcher.in_flight
    assert rig.batch_of(rig.submit(b"again")).seq_no == 2


@pytest.mark.parametrize("attempts", [0, 2])
async def test_a_hook_failing_in_repair_keeps_the_fragment_unlinked(
    stage: Stage, caplog: pytest.LogCaptureFixture, attempts: int
) -> None:
    """The hook fails for our orphan 2 when repair calls it: repair stops there (logged, naming
    the fragment, the log and the error) and 2, settled, stays in flight; the batches after it
    whose uploads failed are kept, and only the first of them is charged (the second is not);
    out of attempts it fails naming the hook's error, while 2 stays.  Kills the hook-failure
    log line's mutants, ``_repair_blocked = None``, ``return`` for that ``break``, ``continue``
    -> ``break`` for a settled batch, ``head = True`` after the head, and ``break`` ->
    ``return`` once one ran out (2 was left out)."""

    async def hook(info: FragmentInfo) -> None:
        if info.repaired:
            raise StoreUnavailable("dirty log down")

    caplog.set_level("WARNING", logger="wal3.writer")
    await new_log(stage)
    rig = await Rig.open(stage, options(attempts=3), hook=hook)
    a2, b2 = await rig.batch(b"ours-2")
    lose_upload(stage, 3)
    lose_upload(stage, 4)
    a3, b3 = await rig.batch(b"ours-3")
    a4, b4 = await rig.batch(b"ours-4")
    b3.attempts = attempts
    await rig.recovery.recover()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "hook failed repairing 2 of logs/r: StoreUnavailable('dirty log down')"
    ]
    assert rig.stats["repaired"] == 0
    assert rig.batcher.in_flight.get(2) is b2 and b2.done and b2.error is None
    if attempts == 0:
        assert (b3.attempts, b4.attempts) == (1, 0)
        assert all(pending(a) for a in (a2, a3, a4))
    else:
        text = (
            "fragment 3 of logs/r could not be linked (StoreUnavailable('dirty log down')); "
            "it may still appear"
        )
        refused(a3, StoreUnavailable, text)
        refused(a4, StoreUnavailable, text)
        assert pending(a2) and rig.batch_of(rig.submit(b"next")).seq_no == 3


async def test_a_kept_batch_replaces_the_dead_object_repair_found_in_its_slot(stage: Stage) -> None:
    """A stale speculative upload (following a fragment never linked) sat at slot 2 when ours
    went there: our upload found other bytes, but our batch still continues the log.  Repair
    marks the stale object dead, so the kept batch's retry overwrites it (If-Match on its etag)
    and lands.  Kills ``take_dead(None, ...)`` and ``overwrite_etag = None`` there."""
    await new_log(stage)
    rig = await Rig.open(stage)
    stale = encode_fragment(2, 2, 9, [b"stale"], prev=Setsum.of(b"never linked")).data
    await stage.local.put(frag_key(2), stale)
    a, b = await rig.batch(b"ours")
    assert b.upload == "absent" and b.overwrite_etag is None
    await rig.recovery.recover()
    assert rig.batcher.in_flight.get(2) is b and b.overwrite_etag == content_etag(stale)
    assert b.task is not None
    await b.task
    assert b.upload == "ok" and pending(a)


async def test_a_kept_batch_keeps_the_dead_object_it_must_replace(stage: Stage) -> None:
    """A batch cut at a dead object's slot overwrites it (If-Match); its upload failed and it
    is kept: the retry still replaces that object.  Kills ``take_dead(b.seq_no, None)``."""
    await new_log(stage)
    await stage.local.put(frag_key(2), b"not parquet")
    rig = await Rig.open(stage)
    await rig.recovery.recover()
    dead = content_etag(b"not parquet")
    lose_upload(stage, 2, times=8)
    await stage.local.delete(frag_key(2))  # swept meanwhile: repair finds nothing to mark
    _a, b = await rig.batch(b"ours")
    assert b.overwrite_etag == dead and b.upload == "unknown"
    await rig.recovery.recover()
    assert rig.batcher.in_flight.get(2) is b and b.overwrite_etag == dead


# --------------------------------------------------------------------------------------- sealed


async def test_a_sealed_log_fails_everything_in_flight_and_queued(stage: Stage) -> None:
    """Another process sealed the log while our fragment 2 was uploaded and 3's upload failed:
    repair does not run, nothing is kept (though both continue the log exactly; 3, kept, would
    be retried and answered only once that ended), and the appends in flight and queued fail
    with ``LogSealed`` at once.  Kills ``return`` for the sealed ``break``, ``chain = sealed``, the
    chain test's ``or`` mutants, and the ``LogSealed`` ``reject``'s mutants and message."""
    await new_log(stage)
    rig = await Rig.open(stage)
    a2, _b2 = await rig.batch(b"ours-2")
    lose_upload(stage, 3)
    a3, b3 = await rig.batch(b"ours-3")
    assert b3.upload == "unknown"
    await OtherWriter(stage.local, PREFIX, "them").seal()
    queued: list[Append] = []

    async def arrives() -> None:
        queued.append(rig.submit(b"queued"))

    stage.when("get", re.escape(MANIFEST), step=arrives)
    await rig.recovery.recover()
    assert rig.committer.manifest.sealed and rig.stats["repaired"] == 0
    for a in (a2, a3, *queued):
        refused(a, LogSealed, "log logs/r is sealed")
    assert not rig.batcher.in_flight and len(queued) == 1


# ----------------------------------------------------------------------------- idempotency keys


async def test_a_key_another_writer_linked_is_answered_from_the_log(stage: Stage) -> None:
    """Another writer linked an append with key ``k`` (a client's retry through another host)
    over our fragment holding ``k`` again, ``j`` and an unkeyed append: its keys are learned
    first, so ``k`` is answered as that duplicate; ``j`` (not in the log) and the unkeyed one
    are contention, each.  Kills ``learned``'s ``range`` mutants and ``in`` for ``not in``,
    ``known = None`` and its ``and False``, ``known(None)``, ``is`` for ``is not`` (both), the
    ``resolve`` mutants, ``continue`` -> ``break`` after it, ``keys_known`` None/False at the
    start, and ``a.key is not None or / and keys_known`` forms."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await rig.keys.ensure_loaded()
    m, _ = await stored(stage)
    f = await theirs(stage, [b"retried"], key="k")
    k, j, u = append(b"retried", "k"), append(b"j", "j"), append(b"u")
    our_batch(rig, 2, 2, m.tail_setsum, [k, j, u], upload="absent")
    await rig.recovery.recover()
    assert k.future.result() == AppendResult(
        2, 1, f.timestamp_us, True, request_digest([b"retried"])
    )
    for a in (j, u):
        refused(a, LogContention, "another writer appended to logs/r; not written")
    assert rig.stats["contention"] == 2


async def test_keys_that_cannot_be_read_fail_keyed_appends_only(stage: Stage) -> None:
    """The footer of the fragment another writer linked cannot be read: a keyed append might
    duplicate one of its keys, so keyed appends fail ``StoreUnavailable`` (in flight: "could
    not read what another writer appended"; queued meanwhile: "store unavailable: ..."), while
    unkeyed ones go on as usual (contention in flight, still queued).  Kills ``keys_known =
    True`` in the ``except``, ``why = None``, ``reject_queued_keyed(None)`` / ``lambda: None``
    / ``StoreUnavailable(None)``, the ``keys_known`` test's ``or`` / ``is`` / unnegated forms,
    and that ``reject``'s mutants and message."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await rig.keys.ensure_loaded()
    m, _ = await stored(stage)
    await theirs(stage, [b"theirs"], key="k2")
    k1, u = append(b"k1", "k1"), append(b"u")
    our_batch(rig, 2, 2, m.tail_setsum, [k1, u], upload="absent")
    queued: list[Append] = []

    async def arrive() -> None:
        queued.extend([rig.submit(b"qk", "qk"), rig.submit(b"qu")])

    stage.when("get", re.escape(MANIFEST), step=arrive)
    stage.when("get", re.escape(frag_key(2)), "fail")
    await rig.recovery.recover()
    refused(k1, StoreUnavailable, "could not read what another writer appended to logs/r")
    refused(u, LogContention, "another writer appended to logs/r; not written")
    qk, qu = queued
    refused(
        qk,
        StoreUnavailable,
        f"store unavailable: scripted get failure of {frag_key(2)}",
    )
    assert pending(qu) and rig.batch_of(qu).seq_no == 3


async def test_keys_are_learned_only_once_the_window_was_loaded(stage: Stage) -> None:
    """Before the first keyed append loaded the window, a recovery reads no footer of what
    others linked (the first load will); once loaded, one with nothing new reads none either.
    Kills ``keys.loaded or learned`` and ``range(manifest.next_seq_no)`` /
    ``range(base.next_seq_no)`` (which asked for fragment 0)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    await theirs(stage, [b"theirs"], key="k")
    await rig.recovery.recover()
    assert stage.count("get", re.escape(frag_key(2))) == 0 and rig.keys.known("k") is None
    await rig.keys.ensure_loaded()
    assert stage.count("get", re.escape(frag_key(2))) == 1 and rig.keys.known("k") is not None
    await rig.recovery.recover()
    assert stage.count("get", re.escape(frag_key(2))) == 1


# ------------------------------------------------------------------- whose a linked fragment is


@pytest.mark.parametrize("upload", ["ok", "absent"])
async def test_a_fragment_collected_since_is_judged_by_its_object(
    stage: Stage, upload: str
) -> None:
    """Our fragment 2 was linked (by another writer's repair), or theirs was over ours, and then
    collected.  While its object is kept, its bytes tell whose it is: ours is acknowledged.
    Theirs, once its object is gone too, is plain contention: a batch whose upload found other
    bytes there never held the slot, so there is nothing to be unsure of.  Kills the HEAD's
    mutants (``held = None``, ``head(None)``, ``join`` with None or one argument,
    ``etag_matches_content`` with None or one argument), and ``_linked_as_ours``' ``and``
    forms of its first test (which sent the ``absent`` batch to the HEAD: "may have been
    written")."""
    await new_log(stage)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    if upload == "absent":
        await them.append()
    a, b = await rig.batch(b"ours")
    assert b.upload == upload
    if upload == "ok":
        await them.link_tail_orphan()
    await them.append()
    await collect(stage, 3, delete=False)
    if upload == "ok":
        await rig.recovery.recover()
        assert a.future.result() == AppendResult(2, 1, b.timestamp_us)
        return
    await stage.local.delete(frag_key(2))
    await rig.recovery.recover()
    refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_ours_collected_and_gone_may_have_been_written(stage: Stage) -> None:
    """Our fragment 2, linked by another writer's repair, was collected and its object deleted:
    nobody can tell whether it was ours, so its append fails "may have been written" and the
    batch leaves the pipeline.  Kills ``unsure.append(None)``, ``drop(None)``, the unsure
    ``reject``'s mutants and message."""
    await new_log(stage)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    a, _b = await rig.batch(b"ours")
    await them.link_tail_orphan()
    await them.append()
    await collect(stage, 3, delete=True)
    await rig.recovery.recover()
    refused(a, StoreUnavailable, "fragment 2 of logs/r may have been written")
    assert 2 not in rig.batcher.in_flight


@pytest.mark.parametrize("quoted", [False, True])
async def test_our_fragments_collected_since_are_not_contention(
    monkeypatch: pytest.MonkeyPatch, stage: Stage, quoted: bool
) -> None:
    """Another writer's repair linked our 2 and 3, and a collector cut 2 (its object kept): the
    log moved by our own bytes only, which HEAD of 2 tells (S3 quotes the etag), so the append
    of our batch 4 (never encodable) is retried, not contention.  Kills ``_foreign``'s ``mine =
    None`` / ``get(None)`` / ``is not None``, ``held = None``, ``head(None)``, every ``join``
    and ``fragment_path`` mutant there, ``strip(None)``, ``==`` for ``!=`` and ``mine[1]``."""
    await new_log(stage)
    fail_encoding(monkeypatch, 4)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    a2, _ = await rig.batch(b"ours-2")
    a3, _ = await rig.batch(b"ours-3")
    await them.link_tail_orphan()
    await them.link_tail_orphan()
    a4, b4 = await rig.batch(b"ours-4")
    assert b4.frag is None
    await collect(stage, 3, delete=False)
    stage.quote = quoted
    await rig.recovery.recover()
    assert a2.future.done() and a3.future.done() and not a2.future.exception()
    assert pending(a4) and (a4.attempts, a4.others_rounds) == (0, 0)


async def test_ours_collected_and_gone_is_contention_for_the_rest(
    monkeypatch: pytest.MonkeyPatch, stage: Stage
) -> None:
    """As above, but the collected fragment's object is gone: nobody can tell it was ours, so
    what could not be linked is contention.  Kills ``return False`` on ``ObjectNotFound``."""
    await new_log(stage)
    fail_encoding(monkeypatch, 4)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    await rig.batch(b"ours-2")
    await rig.batch(b"ours-3")
    await them.link_tail_orphan()
    await them.link_tail_orphan()
    a4, _ = await rig.batch(b"ours-4")
    await collect(stage, 3, delete=True)
    await rig.recovery.recover()
    refused(a4, LogContention, "another writer appended to logs/r; not written")


async def test_contention_is_judged_fragment_by_fragment(stage: Stage) -> None:
    """``_foreign`` on hand-made histories: a collected fragment this writer never encoded is
    someone else's, and so is one whose object holds other bytes than ours, whatever follows;
    the log unmoved is nobody's.  Kills ``return False`` for an unknown collected fragment and
    for one whose etag differs, and ``return True`` for an unmoved log."""
    await new_log(stage)
    rig = await Rig.open(stage)
    base, _ = await stored(stage)
    assert await rig.recovery._foreign(base, base) is False
    await theirs(stage, [b"t2"])
    f3 = await theirs(stage, [b"t3"])
    await collect(stage, 3, delete=False)
    m, _ = await stored(stage)
    rig.recovery.note_encoded(3, f3.content_md5, f3.setsum)  # as if 3 were our bytes
    assert await rig.recovery._foreign(m, base) is True  # 2: never encoded here
    other = encode_fragment(2, 2, 1, [b"other"], writer="us")
    rig.recovery.note_encoded(2, other.content_md5, other.setsum)
    assert await rig.recovery._foreign(m, base) is True  # 2: other bytes than ours


async def test_ours_folded_into_a_snapshot_is_acknowledged(stage: Stage) -> None:
    """Our fragment 2 was linked by another writer's repair and folded into a snapshot: found
    there, it is acknowledged.  Kills ``_snapshots = None`` / ``SnapshotCache(None)``, every
    ``resolve_fragments`` argument mutant, ``found = None``, ``bool(None)``, ``found[1]``
    (both), ``!=`` for the path and ``_is_ours(None)``; and, the new fragments lying partly in
    the snapshot, ``tail_fragments``' prefix and cache mutants."""
    await new_log(stage)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    a, b = await rig.batch(b"ours")
    await them.link_tail_orphan()
    await them.append()
    await them.append()
    await fold(stage, 3)
    a5, _b5 = await rig.batch(b"ours-5")
    await rig.recovery.recover()
    assert a.future.result() == AppendResult(2, 1, b.timestamp_us)
    refused(a5, LogContention, "another writer appended to logs/r; not written")


async def test_a_slot_folded_with_fewer_records_than_ours_holds_nothing_of_ours(
    stage: Stage,
) -> None:
    """Another writer's fragments 2 and 3 hold one record each where ours held two and one, and
    were folded into a snapshot: our 3 starts past the snapshot's end, so nothing is found for
    it (not ours) and both our appends are contention.  Kills ``bool(found) and ... or`` and
    ``bool(found) or ...`` (an empty search indexed)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    m, _ = await stored(stage)
    a2 = Append([b"x", b"y"], None, asyncio.get_running_loop())
    b2 = our_batch(rig, 2, 2, m.tail_setsum, [a2], upload="unknown")
    assert b2.frag is not None
    a3 = append(b"z")
    our_batch(rig, 3, 4, b2.frag.setsum, [a3], upload="unknown")
    for _ in range(3):
        await theirs(stage, [b"t"])
    await fold(stage, 3)
    await rig.recovery.recover()
    for a in (a2, a3):
        refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_contention_reads_only_the_pointers_past_our_tail(stage: Stage) -> None:
    """Deciding whether someone else appended reads the pointers past the tail this writer
    held, no further: with the older fragments in a snapshot, it loads none.  Kills ``n =
    manifest.next_seq_no + base.next_seq_no``."""
    await new_log(stage, 3)
    await fold(stage, 2)
    rig = await Rig.open(stage)
    await OtherWriter(stage.local, PREFIX, "them").append()
    a, _ = await rig.batch(b"ours")
    await rig.recovery.recover()
    refused(a, LogContention, "another writer appended to logs/r; not written")
    assert stage.count("get", "snapshot/") == 0


async def test_contention_is_found_inside_a_snapshot(stage: Stage) -> None:
    """Another writer appended 2 and 3 and folded them (with 1) into a snapshot: telling whose
    they are reads that snapshot.  Kills ``tail_fragments(None, ...)`` (a snapshot no earlier
    step had loaded)."""
    await new_log(stage)
    rig = await Rig.open(stage)
    them = OtherWriter(stage.local, PREFIX, "them")
    for _ in range(3):
        await them.append()
    await fold(stage, 3)
    a, b = await rig.batch(b"ours")
    assert b.upload == "absent"
    await rig.recovery.recover()
    refused(a, LogContention, "another writer appended to logs/r; not written")
    assert stage.count("get", "snapshot/") == 1


async def test_ours_linked_by_a_pointer_without_md5_is_ours_by_setsum(stage: Stage) -> None:
    """A writer that records no MD5 (Rust's) linked our fragment 2 (its answer lost to us:
    ``unknown``): the setsum tells it is ours, and it is acknowledged.  Kills ``_is_ours``'
    ``... or True``, ``is`` for ``is not`` and ``!=`` for the setsum, and the ``"unknown"``
    mutants of ``_linked_as_ours``."""
    await new_log(stage)
    rig = await Rig.open(stage)
    a, b = await rig.batch(b"ours")
    b.upload = "unknown"  # its answer was lost: the batch cannot tell whether it landed
    assert b.frag is not None
    await link(stage, pointer(b.frag, md5=False), "rust")
    await rig.recovery.recover()
    assert a.future.result() == AppendResult(2, 1, b.timestamp_us)


# -------------------------------------------------------------------------- taking the log over


class Clock(ManualClock):
    """A manual clock that tells when someone starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        object.__setattr__(self, "waiting", asyncio.Event())

    async def sleep(self, seconds: float) -> None:
        self.waiting.set()  # type: ignore[attr-defined]
        await super().sleep(seconds)


async def leased_by_them(stage: Stage, lease_ms: int = 1000) -> None:
    """The stored manifest becomes another writer's, recording a read lease."""
    m, etag = await stored(stage)
    await stage.local.put(
        MANIFEST, replace(m, writer="them", read_lease_ms=lease_ms).to_bytes(), if_match=etag
    )


async def take_over(
    stage: Stage, own_lease_s: float, attempts: int = 3, records: int = 1
) -> tuple[Rig, Clock, Append]:
    """A rig that loaded another writer's leased manifest (of ``records`` fragments), an orphan
    of theirs at the tail, and our append in flight over it."""
    await new_log(stage, records)
    await leased_by_them(stage)
    clock = Clock()
    opts = options(attempts=attempts, clock=clock, lease=LeaseOptions(read_lease_s=own_lease_s))
    rig = await Rig.open(stage, opts, authored=False)
    await OtherWriter(stage.local, PREFIX, "them").upload_next()
    a, b = await rig.batch(b"ours")
    assert b.upload == "absent"
    return rig, clock, a


async def sleeping(clock: Clock, task: asyncio.Task[None]) -> None:
    """Return once ``task`` waits on ``clock``; if it ended instead, raise what it raised."""
    waiting = asyncio.ensure_future(clock.waiting.wait())  # type: ignore[attr-defined]
    await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    if task.done():
        task.result()
        raise AssertionError("it never waited")


def manifest_puts(stage: Stage) -> int:
    return stage.count("put", re.escape(MANIFEST))


@pytest.mark.parametrize("own_lease_s", [0.0, 1.0])
async def test_repair_over_a_leased_manifest_claims_it_and_waits_the_fence(
    stage: Stage, own_lease_s: float
) -> None:
    """Repairing over another writer's manifest that records a lease (1 s) first claims the log
    (a write linking nothing) and links the orphan only once that lease's fence (1.25 s) has
    passed, whatever this writer's own lease; the manifest it then holds is its own, leased
    from its write.  Kills ``takes_over(None, ...)`` (our own lease judged), ``claim`` with
    None for the manifest or a missing argument, ``manifest, etag = None`` there, and
    ``landed`` with None for the etag (not ours) or the time (no lease)."""
    rig, clock, a = await take_over(stage, own_lease_s)
    puts = manifest_puts(stage)
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    m, _ = await stored(stage)
    assert manifest_puts(stage) == puts + 1 and (m.writer, m.next_seq_no) == ("us", 2)
    clock.advance(1.25)
    await recovering
    m, etag = await stored(stage)
    assert manifest_puts(stage) == puts + 2 and m.next_seq_no == 3
    assert rig.stats["repaired"] == 1 and rig.lease.authored(etag)
    assert (rig.lease.remaining() > 0) is (own_lease_s > 0)
    assert pending(a) and a.others_rounds == 1


async def test_a_claim_lost_to_the_orphans_writer_ends_the_repair(stage: Stage) -> None:
    """Our claim landed, then the orphan's writer linked it before our link: the repair stops
    (one claim per repair) without taking that writer for one met while linking, so our append
    is retried free.  Kills ``claimed = True`` -> None / False and ``return`` for that
    ``break``."""
    rig, clock, a = await take_over(stage, 1.0, attempts=1)
    them = OtherWriter(stage.local, PREFIX, "them")
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await them.link_tail_orphan()
    clock.advance(1.25)
    await recovering
    m, _ = await stored(stage)
    assert (m.writer, m.next_seq_no) == ("them", 3) and rig.stats["repaired"] == 0
    assert pending(a) and (a.attempts, a.met_writer) == (0, False)


async def gc_edit(stage: Stage) -> None:
    """A collector's cut of fragment 1 (of 2): an edit that links nothing, the tail stays."""
    await collect(stage, 2, delete=False)


@pytest.mark.parametrize(
    ("attempts", "raced_before", "charged"),
    [(1, 0, False), (1, 1, True), (1, 5, True), (3, 2, False), (3, 3, True)],
)
@pytest.mark.parametrize("ours_uploaded", [False, True])
async def test_a_claim_lost_to_an_edit_that_linked_nothing_is_a_rebase(
    stage: Stage, attempts: int, raced_before: int, charged: bool, ours_uploaded: bool
) -> None:
    """Our claim landed, then a collector's edit (linking nothing) landed during the fence, so
    the link after it lost its condition: the repair stops (one claim per repair) and reports
    a race, and that recovery costs our kept batch nothing, ``max_append_attempts`` recoveries
    in a row; every race in the row after those is charged like a round that moved nothing,
    even to a batch whose upload settled (repair was linking our own fragment: without the
    charge a collector editing for ever holds it for ever).  The simulator's seeds 50465 and
    57203 failed appends after every fault, a collector editing within each fence.  Kills
    ``raced`` -> True / False, its ``==`` -> ``!=``, the bound's ``<`` -> ``<=``, the count's
    ``+ 1`` and its reset, ``charge=not free_race`` -> ``charge=True``, ``if charge``
    inverted, ``settled_too`` -> False / True and its ``and head`` -> ``or``, and
    ``_repair_blocked = e`` dropped.  (``and not manifest.sealed`` dropped is equivalent: a
    sealed log keeps nothing and fails everything, so whether a race on one counts does not
    matter.)"""
    if ours_uploaded:
        # No orphan: the kept batch is our own, uploaded and hooked (settled), and linking it
        # needs the claim.
        await new_log(stage, 2)
        await leased_by_them(stage)
        clock = Clock()
        opts = options(attempts=attempts, clock=clock, lease=LeaseOptions(read_lease_s=1.0))
        rig = await Rig.open(stage, opts, authored=False)
        a, b = await rig.batch(b"ours")
        assert b.settled
    else:
        rig, clock, a = await take_over(stage, 1.0, attempts=attempts, records=2)
        b = rig.batch_of(a)
        assert not b.settled
    rig.recovery._raced_rounds = raced_before
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await gc_edit(stage)
    clock.advance(1.25)
    await recovering
    m, _ = await stored(stage)
    assert (m.writer, m.next_seq_no) == ("gc", 3) and rig.stats["repaired"] == 0
    assert rig.recovery._raced_rounds == raced_before + 1
    if charged and attempts == 1:
        cause = f"PreconditionFailed('precondition failed for {MANIFEST}: etag mismatch')"
        if ours_uploaded:
            refused(
                a,
                StoreUnavailable,
                f"fragment 3 of logs/r could not be linked ({cause}); it may still appear",
            )
        else:
            # Our upload found the orphan in slot 3: our bytes are in no slot and never will
            # be, so "not written" (no writer was met: the orphan's may be dead).
            assert b.upload == "absent"
            refused(
                a, StoreUnavailable, f"logs/r: not written: slot 3 holds another fragment ({cause})"
            )
    else:
        assert pending(a) and b.attempts == (1 if charged else 0) and rig.batch_of(a) is b


async def rival_claim(stage: Stage) -> None:
    """Another writer claims the log as it stands (a take-over of its own: its name, its holder,
    nothing linked), as the adversary of 741b3dd's second writer did."""
    m, etag = await stored(stage)
    claim = replace(m, writer="rival", lease_holder="feedfacefeedface", read_lease_ms=1000)
    await stage.local.put(MANIFEST, claim.to_bytes(), if_match=etag)


async def test_a_claim_lost_to_another_writers_claim_is_no_race(stage: Stage) -> None:
    """Our claim landed, then another writer claimed the log from us before our link: that is
    a writer alive, not a collector's race (the claim records a holder that is neither ours nor
    the one we claimed from).  So the round is charged, and our batch, whose slot holds the
    orphan (its upload found it there), is answered "not written": it can never appear (not
    ``LogContention``: nobody appended).  The adversary of 741b3dd: such rounds counted as free
    races and ended in "it may still appear" for batches that never could.  Fails with the
    holder test dropped (``edited`` always True)."""
    rig, clock, a = await take_over(stage, 1.0, attempts=1)
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await rival_claim(stage)
    clock.advance(1.25)
    await recovering
    m, _ = await stored(stage)
    assert (m.writer, m.next_seq_no) == ("rival", 2) and rig.stats["repaired"] == 0
    assert rig.recovery._raced_rounds == 0
    refused(
        a,
        StoreUnavailable,
        "logs/r: not written: slot 2 holds another fragment (PreconditionFailed('precondition "
        f"failed for {frag_key(2)}: object exists'))",
    )


async def test_a_claim_lost_to_a_collectors_edit_of_the_base_is_a_race(stage: Stage) -> None:
    """Our claim itself lost to a collector's edit of the manifest we claimed from (the holder
    carried over: the one we claimed from): a race, free while the row is short.  Kills
    ``claimed_from = None`` (the holder compared with nobody's: the round charged)."""
    rig, _clock, a = await take_over(stage, 1.0, attempts=1, records=2)
    claimed_from = (await stored(stage))[0].lease_holder
    assert claimed_from is not None
    stage.when("put", re.escape(MANIFEST), step=lambda: gc_edit(stage), only=conditional)
    await rig.recovery.recover()
    m, _ = await stored(stage)
    assert (m.writer, m.lease_holder) == ("gc", claimed_from)
    assert rig.recovery._raced_rounds == 1
    assert pending(a) and a.attempts == 0


async def test_a_given_up_batch_whose_appends_met_a_writer_is_contention(stage: Stage) -> None:
    """The kept batch whose slot holds another writer's orphan runs out of attempts (a race
    charged), and one of its appends met a writer in an earlier recovery (it was retried after
    another writer appended): "not written" is ``LogContention``.  Kills ``met or any(...)`` ->
    ``and`` and the ``LogContention`` built as None or without its text."""
    rig, clock, a = await take_over(stage, 1.0, attempts=1, records=2)
    a.met_writer = True
    rig.recovery._raced_rounds = 1  # the row is long: this race is charged
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await gc_edit(stage)
    clock.advance(1.25)
    await recovering
    refused(a, LogContention, "another writer's fragment holds slot 3 of logs/r; not written")


async def test_a_failed_link_on_a_collectors_edit_of_ours_raises_no_fence(stage: Stage) -> None:
    """Repair links an orphan on a manifest a collector edited from ours (held, not authored),
    and the link's put fails for good: nothing was taken over, so no fence (a put that raises is
    fenced only when it took the log over).  Kills ``put(new, base_etag)`` without the base (or
    None): the failure then fences for this writer's own lease."""
    await new_log(stage, 1)
    clock = Clock()
    opts = options(clock=clock, lease=LeaseOptions(read_lease_s=1.0))
    rig = await Rig.open(stage, opts)
    m, etag = await stored(stage)
    await stage.local.put(
        MANIFEST,
        replace(m, writer="gc", lease_holder=rig.lease.holder, read_lease_ms=1000).to_bytes(),
        if_match=etag,
    )
    await OtherWriter(stage.local, PREFIX, "them").upload_next()
    stage.when("put", re.escape(MANIFEST), "fail", times=8, only=conditional)
    await rig.recovery.recover()
    assert rig.recovery.stale and stage.count("put", re.escape(MANIFEST)) >= 1
    assert rig.lease.fence_until == float("-inf")


async def test_a_race_in_a_round_others_moved_on_is_no_race(stage: Stage) -> None:
    """The reload showed another writer's appends (the log moved on), then our claim lost to a
    collector's edit: not a race in the row (``raced and not moved``), so the row starts over.
    Fails with ``and not moved`` dropped (the count goes to 1)."""
    rig, clock, a = await take_over(stage, 1.0, attempts=3)
    them = OtherWriter(stage.local, PREFIX, "them")
    await them.link_tail_orphan()  # slot 2: linked by them (the log moved on)
    await them.upload_next()  # slot 3: their next orphan, which our repair claims to link
    rig.recovery._raced_rounds = 2
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await gc_edit(stage)
    clock.advance(1.25)
    await recovering
    m, _ = await stored(stage)
    assert (m.writer, m.next_seq_no) == ("gc", 3)
    assert rig.recovery._raced_rounds == 0
    # Its slot was linked by them: "not written", and contention (they appended).
    refused(a, LogContention, "another writer appended to logs/r; not written")


async def test_linking_our_batches_breaks_a_row_of_races(stage: Stage) -> None:
    """``progressed`` (the committer calls it when a write links batches of ours) resets the
    count of raced recoveries in a row.  Fails with the reset dropped."""
    rig, _clock, _a = await take_over(stage, 1.0)
    rig.recovery._raced_rounds = 2
    rig.recovery.progressed()
    assert rig.recovery._raced_rounds == 0


async def test_a_raced_repair_costs_a_free_append_nothing(
    monkeypatch: pytest.MonkeyPatch, stage: Stage
) -> None:
    """The same race, with our batch one that can never be linked (its encoding failed): its
    append is retried without being charged, and a later recovery that is not a race resets
    the count of races in a row.  Kills ``not moved and not raced`` -> ``or`` and dropping
    ``not raced``."""
    await new_log(stage, 2)
    await leased_by_them(stage)
    clock = Clock()
    opts = options(attempts=1, clock=clock, lease=LeaseOptions(read_lease_s=1.0))
    rig = await Rig.open(stage, opts, authored=False)
    await OtherWriter(stage.local, PREFIX, "them").upload_next()
    fail_encoding(monkeypatch, 3)
    a, b = await rig.batch(b"ours")
    assert b.frag is None
    recovering = asyncio.create_task(rig.recovery.recover())
    await sleeping(clock, recovering)
    await gc_edit(stage)
    clock.advance(1.25)
    await recovering
    assert pending(a) and a.attempts == 0 and rig.recovery._raced_rounds == 1
    # The edit landed on our claim and carried its holder over: the next recovery neither
    # claims nor fences again (nothing waits on the clock), nobody races it, and it links the
    # orphan.
    m, _ = await stored(stage)
    assert rig.lease.holds(m) and m.writer == "gc"
    clock.waiting.clear()  # type: ignore[attr-defined]
    await rig.recovery.recover()
    assert not clock.waiting.is_set()  # type: ignore[attr-defined]
    m, _ = await stored(stage)
    assert m.next_seq_no == 4 and rig.stats["repaired"] == 1
    assert rig.recovery._raced_rounds == 0


async def test_a_claim_that_loses_its_condition_overwrites_nothing(stage: Stage) -> None:
    """The orphan's writer linked it between our reload and our claim: the claim's condition
    fails and the repair stops, its link standing.  Kills ``claim(manifest, None)`` (an
    unconditional claim over that link, then a repair of our own)."""
    rig, clock, _a = await take_over(stage, 1.0)
    them = OtherWriter(stage.local, PREFIX, "them")

    async def they_link() -> None:
        await them.link_tail_orphan()

    # Before the claim, whatever its condition.
    stage.when("put", re.escape(MANIFEST), step=they_link)
    recovering = asyncio.create_task(rig.recovery.recover())
    waiting = asyncio.ensure_future(clock.waiting.wait())  # type: ignore[attr-defined]
    await asyncio.wait({recovering, waiting}, return_when=asyncio.FIRST_COMPLETED)
    waiting.cancel()
    clock.advance(1.25)  # a claim that landed (it must not) waits for its fence: let it go on
    await recovering
    m, _ = await stored(stage)
    assert (m.writer, m.next_seq_no) == ("them", 3) and rig.stats["repaired"] == 0


async def test_linking_over_a_manifest_that_records_no_lease_raises_no_fence(stage: Stage) -> None:
    """Another writer's manifest records a lease of 0 (a host that answers no reads from
    memory): our repair links the orphan on it directly, with no claim, and raises no fence
    (nothing anyone acknowledged can be missed), even though our own lease is 1 s.  Kills
    ``landed(..., None)`` (the fence then sized by our own lease)."""
    await new_log(stage)
    await leased_by_them(stage, 0)
    clock = Clock()
    rig = await Rig.open(
        stage, options(clock=clock, lease=LeaseOptions(read_lease_s=1.0)), authored=False
    )
    await OtherWriter(stage.local, PREFIX, "them").upload_next()
    puts = manifest_puts(stage)
    await rig.recovery.recover()
    assert manifest_puts(stage) == puts + 1 and rig.stats["repaired"] == 1
    assert rig.lease.fence_until == float("-inf")


# ------------------------------------------------------------------------- equivalent mutants
#
# The mutants of wal3/recovery.py that no input tells apart from the module (26 of the 590 that
# mutmut runs; the four of line 51, module level, it does not run), grouped by why:
#
# * A value never read before it is replaced: ``_repair_blocked = ""`` in ``__init__`` (every
#   ``_repair`` sets None before anything reads it); ``_encoded[md5] = ""`` (only the keys are
#   read).
# * None where False is only ever tested for truth: ``popitem(last=None)`` (both LRUs: the oldest
#   still goes), ``keys_known = None`` in the ``except`` (read only as ``not keys_known``),
#   ``chain = None``, ``head = None``, ``met_writer = linked_others = None`` (read for truth, and
#   ``linked_others or ...``), ``claimed = None``.
# * ``SnapshotCache(17)``: the cache's size, not what it answers.
# * ``gather(*tasks, return_exceptions=None / False)`` and without it (3): a batch's task never
#   raises (``_run_batch`` and ``_retry_batch`` keep any exception, BaseException included, as
#   the batch's error), so there is nothing for ``gather`` to raise.
# * ``keys.known(a.key) if (a.key is not None) or True``: ``known(None)`` is None (no key is).
# * ``_retry_kept``'s ``continue`` -> ``break`` for an unsettled batch after the head: all the
#   rest of the loop would do is ``b.error = None`` for settled batches, whose error is None
#   already (a batch is settled only when its last upload and hook both succeeded).
# * ``_since``'s ``n < 0`` and ``_foreign``'s ``end < first``: ``_foreign`` calls ``_since`` only
#   past its own ``end <= first`` test, so n is never 0; with ``end == first`` the loop is empty
#   and ``_foreign`` returns False just the same.
# * ``Limits(max_files=None)`` / ``Limits(max_files=2)``: the search past our fragment also
#   reads the snapshots after it, which ``_foreign``'s walk back from the tail to the writer's
#   old tail reads in the same recovery anyway (same cache, same requests); ``found[0]`` decides.
# * ``strip('XX"XX')``: an etag is quoted lowercase hex; there is no ``X`` to strip.
# * ``stamped(new, None, etag)``, ``stamped(new, manifest, None)``, ``stamped(new, etag)``,
#   ``stamped(new, manifest)`` (4): the base only matters to ``stamped`` when it is not this
#   writer's and records a lease, and then repair has claimed the log first (the base is ours);
#   a base that is not ours here records no lease, and ``max(ours, 0)`` is ours.  Likewise
#   ``landed(None, ...)``: a base etag not ours raises the fence of that base's lease, 0 here.
# * ``with_fragments([pointer], None)``: ``stamped`` names the writer on it anyway.
#
# Added with 53ad3c8 (the mutation run at 435a5c3: 645 mutants: 607 killed, 38 survived; the
# three of them this file did not kill then are killed by the three tests written after it:
# ``claimed_from = None``, ``met and any(...)`` with the ``LogContention`` built as None or
# without its text, and ``put(new, base_etag)`` without its base):
# * ``_retry_kept``'s defaults (``charge=False``, ``settled_too=True``, ``met=True``) and
#   ``_give_up_error``'s ``others_rounds=1``: their one caller passes each argument.
# * ``_retry_kept(..., met=None)`` and without ``met`` (2): not killed, and no input found that
#   tells them apart.  The round's ``met`` is set only when another writer linked the slot the
#   repair was linking, and then no batch of ours can be kept (the slot after that writer's
#   fragment follows its setsum, never ours); a kept batch whose appends met a writer earlier is
#   answered by ``a.met_writer`` (killed above).
