"""Cursor names and what ``init``/``load`` answer: written against the survivors of the full
mutation run over wal3/cursors.py (verify.mutation at 0a3481e): the name check's bounds and its
type guard, the error texts, and the witness's name."""

from __future__ import annotations

from pathlib import Path

import pytest

from wal3 import LocalStore
from wal3.cursors import Cursor, CursorStore, check_cursor_name
from wal3.errors import CorruptManifest, CursorConflict, InvalidCursorName


def test_a_name_of_128_characters_is_the_longest() -> None:
    assert check_cursor_name("a" * 128) == "a" * 128
    with pytest.raises(InvalidCursorName, match=r"at most 128"):
        check_cursor_name("a" * 129)


@pytest.mark.parametrize("name", [5, None, b"compaction", ["compaction"]])
def test_a_name_that_is_not_a_string_is_an_invalid_name(name: object) -> None:
    with pytest.raises(InvalidCursorName, match=r"\[A-Za-z0-9_\]\+"):
        check_cursor_name(name)  # type: ignore[arg-type]


async def test_init_and_load_answer_with_the_cursors_name(tmp_path: Path) -> None:
    cursors = CursorStore(LocalStore(tmp_path / "s"), "log", "w")
    created = await cursors.init("reader_1", 3)
    assert (created.name, created.cursor.offset) == ("reader_1", 3)
    loaded = await cursors.load("reader_1")
    assert loaded is not None and (loaded.name, loaded.etag) == ("reader_1", created.etag)
    with pytest.raises(CursorConflict, match="cursor reader_1 already exists"):
        await cursors.init("reader_1", 4)


def test_a_cursor_that_is_not_json_says_so() -> None:
    with pytest.raises(CorruptManifest, match=r"^cursor is not JSON"):
        Cursor.from_bytes(b"{not json")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[1]", r"^cursor is not a JSON object$"),
        (b'{"position": {"offset": 1}, "epoch_us": -1}', r"^cursor\.epoch_us is not a u64: -1$"),
        (b'{"position": {"offset": 1}, "epoch_us": true}', r"^cursor\.epoch_us is not a u64"),
        (b'{"position": {"offset": 1}, "writer": 7}', r"^cursor\.writer is not a string: 7$"),
        (b'{"position": "x"}', r"^cursor\.position is not a log position: 'x'$"),
        (b"{}", r"^cursor\.position is not a log position: None$"),
    ],
)
def test_a_damaged_cursor_names_what_is_wrong(data: bytes, message: str) -> None:
    with pytest.raises(CorruptManifest, match=message):
        Cursor.from_bytes(data)


def test_a_cursor_decodes_rusts_fields() -> None:
    c = Cursor.from_bytes(b'{"position": {"offset": 7}, "epoch_us": 5, "writer": "rust"}')
    assert (c.offset, c.epoch_us, c.writer) == (7, 5, "rust")
    bare = Cursor.from_bytes(b'{"position": {"offset": 7}}')
    assert (bare.epoch_us, bare.writer) == (0, "")


def test_epoch_us_is_any_u64() -> None:
    top = 2**64 - 1
    assert Cursor.from_bytes(b'{"position": {"offset": 1}, "epoch_us": %d}' % top).epoch_us == top
    with pytest.raises(CorruptManifest, match=r"^cursor\.epoch_us is not a u64"):
        Cursor.from_bytes(b'{"position": {"offset": 1}, "epoch_us": %d}' % (top + 1))


def test_a_cursor_is_stored_as_compact_json() -> None:
    """The bytes as serde_json writes them (Rust's wal3 stores cursors compactly): the survivors
    of the mutation run that dropped the separators wrote the same JSON with spaces."""
    c = Cursor(offset=7, epoch_us=5, writer="w")
    assert c.to_bytes() == b'{"position":{"offset":7},"epoch_us":5,"writer":"w"}'
    assert Cursor.from_bytes(c.to_bytes()) == c
