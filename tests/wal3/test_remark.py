"""A fragment re-sent long after its dirty mark is marked again first (issue 20, adversary of the
r6 fix: the roll-up may have judged the old mark settled, found no fragment at its sequence
number and dropped it; a re-sent upload that then lands would be in no dirty set)."""

from __future__ import annotations

from pathlib import Path

from wal3 import LocalStore, LogWriter, LogWriterOptions
from wal3.clock import Clock
from wal3.faulty import FaultRule, FaultyStore
from wal3.writer import FragmentInfo


class _Steps(Clock):
    """Monotonic time that moves only when a test says so."""

    def __init__(self) -> None:
        object.__setattr__(self, "state", {"now": 1000.0})

    def monotonic(self) -> float:
        return float(self.state["now"])  # type: ignore[attr-defined]


async def _append_with_failed_first_upload(tmp_path: Path, pause_s: float) -> list[int]:
    """One append whose first fragment upload fails (the store answers 503); ``pause_s`` of
    monotonic time pass between the hook and the retry.  Returns the seq_no of every mark."""
    store = FaultyStore(LocalStore(tmp_path / "store"))
    # Four failed puts exhaust put_resolving: the batch goes to recovery, which re-sends it.
    store.add_rule(FaultRule("error", ops={"put"}, key_regex=r"/log/", times=4))
    clock = _Steps()
    marks: list[int] = []

    async def hook(info: FragmentInfo) -> None:
        marks.append(info.seq_no)
        if len(marks) == 1:
            clock.state["now"] += pause_s  # type: ignore[attr-defined]

    w = await LogWriter.open(store, "logs/a", LogWriterOptions(clock=clock), hook=hook)
    try:
        assert (await w.append_many([b"x"])).first_offset == 1
    finally:
        await w.close()
    return marks


async def test_a_fragment_resent_after_its_mark_aged_is_marked_again(tmp_path: Path) -> None:
    marks = await _append_with_failed_first_upload(tmp_path, pause_s=31.0)
    assert marks == [1, 1], "the re-sent fragment was not marked again"


async def test_a_prompt_retry_keeps_its_mark(tmp_path: Path) -> None:
    marks = await _append_with_failed_first_upload(tmp_path, pause_s=0.0)
    assert marks == [1]
