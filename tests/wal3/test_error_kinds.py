"""Every engine error has a kind from a closed set (issue 18), and process deaths propagate.

``wal3.errors.ErrorKind`` is the closed set; the server maps kinds (not classes) to HTTP answers
in one table (tests/host/test_error_table.py checks that side).  A fault device's crash is known
to the writer only as ``ProcessDeath``: any subclass propagates, never retried or swallowed.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
from typing import Any

import pytest

import wal3
from wal3 import FaultRule, FaultyStore, LocalStore, LogWriter, WriterClosed
from wal3 import errors as w
from wal3.errors import ErrorKind, ProcessDeath, SimulatedCrash, Wal3Error


def _all_subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    todo = [cls]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in out:
                out.add(sub)
                todo.append(sub)
    return out


def _engine_error_classes() -> set[type[Wal3Error]]:
    """Every Wal3Error subclass of every wal3 module (and of the host, which defines one)."""
    for info in pkgutil.iter_modules(wal3.__path__):
        if info.name in ("s3store",):
            continue  # needs boto; its errors are the StoreError family
        importlib.import_module(f"wal3.{info.name}")
    importlib.import_module("host.forks")
    return {Wal3Error} | _all_subclasses(Wal3Error)


def test_the_set_of_kinds_is_pinned() -> None:
    # A new kind needs a row in the server's table and a decision about its HTTP answer: this
    # list changes with it, on purpose.
    assert {k.value for k in ErrorKind} == {
        "contention",
        "sealed",
        "full",
        "exists",
        "not_found",
        "purged",
        "cursor_conflict",
        "no_cursors",
        "gc_rejected",
        "backpressure",
        "invalid",
        "unavailable",
        "closed",
        "data_loss",
        "corrupt_fragment",
        "object_not_found",
        "process_death",
        "internal",
    }


def test_every_class_in_errors_declares_its_kind() -> None:
    declared = [
        c
        for _, c in inspect.getmembers(w, inspect.isclass)
        if issubclass(c, Wal3Error) and c.__module__ == w.__name__
    ]
    assert len(declared) >= 20
    for cls in declared:
        assert "kind" in cls.__dict__, f"{cls.__name__} declares no kind"
        assert isinstance(cls.__dict__["kind"], ErrorKind), cls


@pytest.mark.parametrize(
    "cls",
    sorted(_engine_error_classes(), key=lambda c: c.__qualname__),
    ids=lambda c: c.__qualname__,
)
def test_every_engine_error_has_a_kind_of_the_set(cls: type[Wal3Error]) -> None:
    assert isinstance(cls.kind, ErrorKind), cls
    assert cls.kind in set(ErrorKind)


def test_the_set_is_closed_a_class_cannot_invent_a_kind() -> None:
    with pytest.raises(TypeError, match="ErrorKind"):
        type("Invented", (Wal3Error,), {"kind": "something_else"})
    with pytest.raises(TypeError, match="ErrorKind"):
        type("Invented", (w.LogContention,), {"kind": None})
    with pytest.raises(ValueError):
        ErrorKind("something_else")
    # Inheriting a kind is fine: a subclass means what its parent means.
    sub: Any = type("Inherits", (w.LogSealed,), {})
    assert sub.kind is ErrorKind.SEALED


@pytest.mark.parametrize(
    ("cls", "kind"),
    [
        (w.PreconditionFailed, ErrorKind.CONTENTION),
        (w.LogContention, ErrorKind.CONTENTION),
        (w.LogSealed, ErrorKind.SEALED),
        (w.LogFull, ErrorKind.FULL),
        (w.LogExists, ErrorKind.EXISTS),
        (w.LogNotFound, ErrorKind.NOT_FOUND),
        (w.CursorNotFound, ErrorKind.NOT_FOUND),
        (w.LogPurged, ErrorKind.PURGED),
        (w.CursorConflict, ErrorKind.CURSOR_CONFLICT),
        (w.NoCursors, ErrorKind.NO_CURSORS),
        (w.GarbageRejected, ErrorKind.GC_REJECTED),
        (w.Backpressure, ErrorKind.BACKPRESSURE),
        (w.InvalidCursorName, ErrorKind.INVALID),
        (w.StoreUnavailable, ErrorKind.UNAVAILABLE),
        (w.WriterClosed, ErrorKind.CLOSED),
        (w.CorruptManifest, ErrorKind.DATA_LOSS),
        (w.ScrubFailed, ErrorKind.DATA_LOSS),
        (w.CorruptFragment, ErrorKind.CORRUPT_FRAGMENT),
        (w.ObjectNotFound, ErrorKind.OBJECT_NOT_FOUND),
        (w.StoreError, ErrorKind.INTERNAL),
        (w.ProcessDeath, ErrorKind.PROCESS_DEATH),
        (w.SimulatedCrash, ErrorKind.PROCESS_DEATH),
        (w.Wal3Error, ErrorKind.INTERNAL),
    ],
)
def test_each_class_kind(cls: type[Wal3Error], kind: ErrorKind) -> None:
    assert cls.kind is kind


def test_corruption_is_data_loss() -> None:
    for cls in (w.CorruptManifest, w.CorruptFragment, w.ScrubFailed):
        assert cls.kind.is_data_loss, cls
    assert {k for k in ErrorKind if k.is_data_loss} == {
        ErrorKind.DATA_LOSS,
        ErrorKind.CORRUPT_FRAGMENT,
    }
    from host.forks import CorruptCompactedPointer

    assert CorruptCompactedPointer.kind is ErrorKind.DATA_LOSS


def test_instances_carry_their_class_kind() -> None:
    assert w.LogPurged(3, 7).kind is ErrorKind.PURGED
    assert w.ScrubFailed(["a", "b"]).kind is ErrorKind.DATA_LOSS
    assert w.Backpressure("x").kind is ErrorKind.BACKPRESSURE


# ------------------------------------------------------------------------------ process death


def test_the_writer_knows_no_fault_device_by_name() -> None:
    import wal3.appends
    import wal3.batcher
    import wal3.committer
    import wal3.idempotency
    import wal3.lease
    import wal3.recovery
    import wal3.writer

    parts = [wal3.writer, wal3.appends, wal3.batcher, wal3.committer, wal3.recovery]
    parts += [wal3.idempotency, wal3.lease]  # the writer is all of these modules
    source = "".join(inspect.getsource(m) for m in parts)
    assert "SimulatedCrash" not in source
    assert "ProcessDeath" in source
    assert issubclass(SimulatedCrash, ProcessDeath)


class OtherDeath(ProcessDeath):
    """Another fault device's crash, which the writer has never heard of."""


class _OtherDevice(FaultyStore):
    """A FaultyStore whose crashes are OtherDeath instead of SimulatedCrash."""

    async def _before(self, plan: Any, op: str, key: str) -> None:
        try:
            await super()._before(plan, op, key)
        except SimulatedCrash as e:
            raise OtherDeath(str(e)) from None


@pytest.mark.parametrize("target", [r"manifest/MANIFEST$", r"/log/Bucket="])
async def test_any_process_death_propagates_and_is_never_retried(
    tmp_path: Any, target: str
) -> None:
    store = LocalStore(tmp_path / "store")
    faulty = _OtherDevice(store, seed=3)
    try:
        w1 = await LogWriter.open(faulty, "logs/death")
        await w1.append(b"durable")
        rule = faulty.add_rule(FaultRule("crash_before", ops={"put"}, key_regex=target, times=None))
        with pytest.raises(OtherDeath) as got:
            await w1.append(b"in-doubt")
        # The first crash ended the writer: nothing retried the put, nothing swallowed it.
        assert rule.fired == 1, rule
        assert isinstance(got.value, OtherDeath), repr(got.value)  # the death itself
        with pytest.raises(WriterClosed):
            await w1.append(b"after")
        assert rule.fired == 1, rule
        faulty.disable()
        w2 = await LogWriter.open(faulty, "logs/death")
        await w2.append(b"next")
        await w2.close()
    finally:
        await store.close()
