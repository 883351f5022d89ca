"""``CursorStore.advance``: forward only, compare-and-swap, a bounded number of retries.

Written against the survivors of the first mutation run over wal3/cursors.py (verify.mutation):
an unconditional save (the witness dropped), a conflict ending the retries at once, an advance to
the current offset that writes anyway, the retry bound, and error messages without the name.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from wal3 import LocalStore
from wal3.cursors import CursorConflict, CursorNotFound, CursorStore

from .helpers import Gate, GateStore

NAME = "compaction"


class RacingStore(GateStore):
    """Before each of the next ``races`` cursor puts, another writer moves the cursor to
    ``ahead`` (so the put's witness is stale); counts the cursor puts that reach the store."""

    def __init__(self, inner: LocalStore, races: int, ahead: list[int]) -> None:
        super().__init__(inner)
        self.races, self.ahead, self.puts = races, ahead, 0
        self.rival = CursorStore(inner, "log", "rival")

    async def _before(self, op: str, key: str) -> list[Gate]:
        if op == "put" and "cursor/" in key:
            self.puts += 1
            if self.races > 0:  # every cursor already exists here: each put is a save
                self.races -= 1
                current = await self.rival.load(NAME)
                assert current is not None
                await self.rival.save(NAME, self.ahead.pop(0), current)
        return await super()._before(op, key)


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "s")


async def test_an_advance_racing_a_further_one_never_moves_the_cursor_back(
    local: LocalStore,
) -> None:
    await CursorStore(local, "log", "w").init(NAME, 5)
    store = RacingStore(local, races=1, ahead=[10])
    got = await CursorStore(store, "log", "w").advance(NAME, 7)
    # The save to 7 carried a stale witness: refused, retried, and 10 >= 7 ends it.
    assert got.cursor.offset == 10
    reread = await CursorStore(local, "log", "w").load(NAME)
    assert reread is not None and reread.cursor.offset == 10


async def test_an_advance_retries_a_conflict_and_lands(local: LocalStore) -> None:
    await CursorStore(local, "log", "w").init(NAME, 5)
    store = RacingStore(local, races=2, ahead=[6, 7])
    got = await CursorStore(store, "log", "w").advance(NAME, 9)
    assert got.cursor.offset == 9
    assert store.puts == 3  # two saves refused (a rival moved it first), then ours


async def test_an_advance_to_where_the_cursor_is_writes_nothing(local: LocalStore) -> None:
    await CursorStore(local, "log", "w").init(NAME, 5)
    store = RacingStore(local, races=0, ahead=[])
    cursors = CursorStore(store, "log", "w")
    before = await cursors.load(NAME)
    got = await cursors.advance(NAME, 5)
    assert got == before and store.puts == 0
    assert (await cursors.advance(NAME, 3)).cursor.offset == 5 and store.puts == 0


async def test_an_advance_gives_up_after_sixteen_conflicts_naming_the_cursor(
    local: LocalStore,
) -> None:
    await CursorStore(local, "log", "w").init(NAME, 1)
    store = RacingStore(local, races=100, ahead=list(range(2, 102)))
    with pytest.raises(CursorConflict, match=f"cursor {NAME} kept changing"):
        await CursorStore(store, "log", "w").advance(NAME, 1000)
    assert store.races == 100 - 16  # one refused save per attempt, 16 attempts
    with pytest.raises(CursorConflict):
        await CursorStore(store, "log", "w").advance(NAME, 1000, attempts=2)
    assert store.races == 100 - 18


async def test_deleting_a_missing_cursor_names_it(local: LocalStore) -> None:
    with pytest.raises(CursorNotFound, match="no cursor gone"):
        await CursorStore(local, "log", "w").delete("gone")


async def test_a_save_by_etag_is_a_compare_and_swap_naming_the_cursor(local: LocalStore) -> None:
    """``save`` takes a witness or its etag alone (what a client sends back as If-Match)."""
    cursors = CursorStore(local, "log", "w")
    first = await cursors.init(NAME, 5)
    moved = await cursors.save(NAME, 8, first.etag)
    assert moved.cursor.offset == 8 and moved.etag != first.etag
    with pytest.raises(CursorConflict, match=f"cursor {NAME} changed since it was read"):
        await cursors.save(NAME, 9, first.etag)
    reread = await cursors.load(NAME)
    assert reread is not None and reread.cursor.offset == 8


async def test_a_cursor_lives_under_its_log_prefix_exactly_as_given(local: LocalStore) -> None:
    """Only slashes around the prefix are dropped (as every other key of the log is built):
    spaces and letters at its ends are part of it."""
    cursors = CursorStore(local, " Xp X/", "w")
    saved = await cursors.save(NAME, 3, (await cursors.init(NAME, 2)).etag)
    assert saved.name == NAME and saved.cursor.offset == 3
    keys = [m.key async for m in local.list("")]
    assert keys == [f" Xp X/cursor/{NAME}.json"], keys


@pytest.mark.parametrize("offset", [0, -1])
async def test_a_cursor_below_offset_one_is_refused_with_its_reason(
    local: LocalStore, offset: int
) -> None:
    cursors = CursorStore(local, "log", "w")
    with pytest.raises(ValueError, match=r"^cursor offsets start at 1$"):
        await cursors.init(NAME, offset)
    assert [m.key async for m in local.list("")] == []
