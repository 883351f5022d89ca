"""Cursors: named positions that pin a log against garbage collection.

Each cursor is its own object, ``cursor/{name}.json`` = ``{"position": {"offset": N},
"epoch_us": ..., "writer": ...}``, so pinning the log never contends with the manifest.  Updates
are compare-and-swap: the caller presents the witness (etag) it loaded, and a stale witness fails
with :class:`CursorConflict`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .clock import SYSTEM_CLOCK, Clock
from .errors import (
    CorruptManifest,
    CursorConflict,
    CursorNotFound,
    InvalidCursorName,
    ObjectNotFound,
    PreconditionFailed,
)
from .manifest import U64_MAX, loads, parse_position
from .paths import CURSOR_PREFIX, cursor_name, cursor_path, join
from .store import ObjectStore, put_resolving

COMPACTION = "compaction"
_NAME = re.compile(r"[A-Za-z0-9_]+")


def check_cursor_name(name: str) -> str:
    """Return ``name`` if it is a valid cursor name, else raise InvalidCursorName."""
    # fullmatch: "$" would accept a trailing newline ("compaction\n" naming a second cursor).
    if not isinstance(name, str) or len(name) > 128 or not _NAME.fullmatch(name):
        raise InvalidCursorName(f"cursor names match [A-Za-z0-9_]+ (at most 128): {name!r}")
    return name


@dataclass(frozen=True, slots=True)
class Cursor:
    """A position in the log and who put it there, when."""

    offset: int
    epoch_us: int
    writer: str

    def to_bytes(self) -> bytes:
        """The JSON object stored for the cursor."""
        return json.dumps(
            {"position": {"offset": self.offset}, "epoch_us": self.epoch_us, "writer": self.writer},
            separators=(",", ":"),
        ).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Cursor:
        """Parse a stored cursor; raises CorruptManifest."""
        obj = loads(data, "cursor")
        if not isinstance(obj, dict):
            raise CorruptManifest("cursor is not a JSON object")
        offset = parse_position(obj.get("position"), "cursor.position")
        epoch = obj.get("epoch_us", 0)
        # Rust's fields: a u64 and a string; anything else is corrupt, not a bare TypeError.
        if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch <= U64_MAX:
            raise CorruptManifest(f"cursor.epoch_us is not a u64: {epoch!r:.200}")
        writer = obj.get("writer", "")
        if not isinstance(writer, str):
            raise CorruptManifest(f"cursor.writer is not a string: {writer!r:.200}")
        return cls(offset=offset, epoch_us=epoch, writer=writer)


@dataclass(frozen=True, slots=True)
class Witness:
    """A loaded cursor together with the etag a compare-and-swap must present."""

    name: str
    cursor: Cursor
    etag: str


class CursorStore:
    """The cursors of one log."""

    def __init__(
        self, store: ObjectStore, prefix: str, writer: str, *, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._store = store
        self._clock = clock
        self._prefix = prefix.strip("/")
        self._writer = writer

    def _key(self, name: str) -> str:
        return join(self._prefix, cursor_path(check_cursor_name(name)))

    def _new(self, offset: int) -> Cursor:
        if offset < 1:
            raise ValueError("cursor offsets start at 1")
        return Cursor(offset=offset, epoch_us=self._clock.wall_us(), writer=self._writer)

    async def init(self, name: str, offset: int) -> Witness:
        """Create a cursor; raises CursorConflict when it already exists."""
        cursor = self._new(offset)
        try:
            etag = await put_resolving(
                self._store, self._key(name), cursor.to_bytes(), if_none_match="*"
            )
        except PreconditionFailed:
            raise CursorConflict(f"cursor {name} already exists") from None
        return Witness(name, cursor, etag)

    async def load(self, name: str) -> Witness | None:
        """The cursor and its witness, or None when it does not exist."""
        try:
            got = await self._store.get(self._key(name))
        except ObjectNotFound:
            return None
        return Witness(name, Cursor.from_bytes(got.data), got.etag)

    async def save(self, name: str, offset: int, witness: Witness | str) -> Witness:
        """Compare-and-swap: move the cursor if ``witness`` is still current."""
        etag = witness.etag if isinstance(witness, Witness) else witness
        cursor = self._new(offset)
        try:
            new_etag = await put_resolving(
                self._store, self._key(name), cursor.to_bytes(), if_match=etag
            )
        except PreconditionFailed:
            raise CursorConflict(f"cursor {name} changed since it was read") from None
        return Witness(name, cursor, new_etag)

    async def advance(self, name: str, offset: int, *, attempts: int = 16) -> Witness:
        """Move a cursor forward to ``offset`` (creating it), never back; retries CAS races."""
        for _ in range(attempts):
            current = await self.load(name)
            try:
                if current is None:
                    return await self.init(name, offset)
                if current.cursor.offset >= offset:
                    return current
                return await self.save(name, offset, current)
            except CursorConflict:
                continue
        raise CursorConflict(f"cursor {name} kept changing")

    async def delete(self, name: str) -> None:
        """Remove a cursor (it stops pinning the log); raises CursorNotFound."""
        key = self._key(name)
        try:
            await self._store.head(key)
        except ObjectNotFound:
            raise CursorNotFound(f"no cursor {name}") from None
        await self._store.delete(key)

    async def list(self) -> list[str]:
        """Names of every cursor."""
        base = join(self._prefix, CURSOR_PREFIX)
        names = []
        async for meta in self._store.list(base):
            name = cursor_name(meta.key[len(base) :])
            if name is not None:
                names.append(name)
        return names

    async def load_all(self) -> dict[str, Witness]:
        """Every cursor with its witness."""
        out: dict[str, Witness] = {}
        for name in await self.list():
            w = await self.load(name)
            if w is not None:
                out[name] = w
        return out
