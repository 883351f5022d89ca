"""``wal3.cursors`` rule by rule, past what test_cursor_names.py and test_cursor_advance.py pin:
what ``list`` and ``load_all`` answer, what ``delete`` removes, and what a stored cursor records
(the clock's wall time, the writer).  Written against the mutation run of the module
(docs/RELIABILITY.md): each test pins one rule; the mutants left, all equivalent, are listed at
the end of the file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from wal3 import LocalStore
from wal3.clock import Clock
from wal3.cursors import Cursor, CursorStore
from wal3.errors import CursorNotFound
from wal3.store import ObjectMeta

NAME = "compaction"


class WallClock(Clock):
    def __init__(self, us: int) -> None:
        object.__setattr__(self, "us", us)

    def wall_us(self) -> int:
        return int(self.us)  # type: ignore[attr-defined]


class GhostStore(LocalStore):
    """A local store whose listings also name ``ghosts`` (cursors deleted after the listing)."""

    def __init__(self, root: Path, ghosts: list[str]) -> None:
        super().__init__(root, fsync=False)
        self.ghosts = ghosts

    async def list(  # type: ignore[override]
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        async for meta in super().list(prefix, start_after=start_after):
            yield meta
        for key in self.ghosts:
            yield ObjectMeta(key=key, etag="", size=0, last_modified=0.0)


@pytest.fixture
def local(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "s", fsync=False)


async def test_a_stored_cursor_records_the_clocks_wall_time_and_its_writer(
    local: LocalStore,
) -> None:
    cursors = CursorStore(local, "log", "w1", clock=WallClock(1_234_567))
    made = await cursors.init(NAME, 3)
    assert made.cursor == Cursor(offset=3, epoch_us=1_234_567, writer="w1")
    stored = await local.get(f"log/cursor/{NAME}.json")
    assert Cursor.from_bytes(stored.data) == made.cursor
    assert stored.etag.strip('"') == made.etag.strip('"')


async def test_list_names_every_cursor_and_nothing_else(local: LocalStore) -> None:
    cursors = CursorStore(local, "log", "w")
    for name in ("b", "a_1", NAME):
        await cursors.init(name, 1)
    await local.put("log/cursor/notes.txt", b"x")  # another suffix
    await local.put("log/cursor/deeper/c.json", b"{}")  # deeper in the tree
    await local.put("log/cursorx.json", b"{}")  # beside the folder, not in it
    await CursorStore(local, "other", "w").init("z", 1)  # another log's
    assert sorted(await cursors.list()) == sorted(["b", "a_1", NAME])
    assert await CursorStore(local, "empty", "w").list() == []


async def test_load_all_skips_a_cursor_deleted_after_the_listing(tmp_path: Path) -> None:
    store = GhostStore(tmp_path / "s", ghosts=["log/cursor/gone.json"])
    cursors = CursorStore(store, "log", "w")
    made = await cursors.init(NAME, 4)
    everything = await cursors.load_all()
    assert list(everything) == [NAME]
    assert everything[NAME].cursor == made.cursor and everything[NAME].name == NAME


async def test_delete_removes_the_cursor_and_only_it(local: LocalStore) -> None:
    cursors = CursorStore(local, "log", "w")
    await cursors.init(NAME, 2)
    await cursors.init("keep", 2)
    await cursors.delete(NAME)
    assert await cursors.load(NAME) is None
    assert await cursors.list() == ["keep"]
    with pytest.raises(CursorNotFound):
        await cursors.delete(NAME)


async def test_a_save_answers_the_etag_the_store_now_holds(local: LocalStore) -> None:
    cursors = CursorStore(local, "log", "w")
    first = await cursors.init(NAME, 2)
    moved = await cursors.save(NAME, 5, first)
    assert moved.etag is not None and moved.etag.strip('"') != first.etag.strip('"')
    again = await cursors.save(NAME, 6, moved)  # the answered witness is a current one
    stored = await cursors.load(NAME)
    assert stored is not None and stored.cursor == again.cursor and stored.etag == again.etag


async def test_an_advance_of_a_missing_cursor_creates_it_there(local: LocalStore) -> None:
    cursors = CursorStore(local, "log", "w")
    made = await cursors.advance("reader_2", 7)
    assert (made.name, made.cursor.offset) == ("reader_2", 7)
    stored = await cursors.load("reader_2")
    assert stored is not None and stored.cursor == made.cursor
    assert await cursors.list() == ["reader_2"]


# -------------------------------------------------------------------------------------------
# Mutants not killed here: none (with test_cursor_names.py and test_cursor_advance.py, every
# mutant of the module is killed).
