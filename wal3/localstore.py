"""``LocalStore``: the embedded object store, a directory on disk.

Objects are plain files under ``root``.  Writes go to a temporary file that is fsynced and then
renamed (or hard-linked, for create-only puts) into place, and the directory is fsynced, so a crash
never leaves a torn object visible.  Conditional replaces and deletes take an exclusive ``flock``
on a per-key lock file, so conditional puts are atomic across processes, not only across tasks.
Etags are the hex MD5 of the content, like S3's.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Literal, TypeVar

from .errors import ObjectNotFound, PreconditionFailed, StoreUnavailable
from .store import GetResult, ObjectMeta, ObjectStore, check_condition, content_etag

_T = TypeVar("_T")

_HIDDEN = ".wal3-local"  # temp files and lock files live here, outside the key space
_STALE_TEMP_S = 3600.0


class LocalStore(ObjectStore):
    """A directory used as an object store with atomic, crash-safe conditional writes."""

    def __init__(self, root_dir: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root_dir).resolve()
        self._fsync = fsync
        self._executor: ThreadPoolExecutor | None = None
        self._tmp = self.root / _HIDDEN / "tmp"
        self._locks = self.root / _HIDDEN / "locks"
        self._tmp.mkdir(parents=True, exist_ok=True)
        self._locks.mkdir(parents=True, exist_ok=True)
        self._sweep_stale_temps()

    def __repr__(self) -> str:
        return f"LocalStore({str(self.root)!r})"

    # ------------------------------------------------------------------------------- helpers

    def _path(self, key: str) -> Path:
        if not key or key.startswith("/") or "\\" in key:
            raise ValueError(f"invalid key {key!r}")
        parts = key.split("/")
        # An empty last part ("a/") would alias the key "a"; "." and ".." would escape the key space.
        if any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"invalid key {key!r}")
        if parts[0] == _HIDDEN:
            raise ValueError(f"reserved key {key!r}")
        return self.root.joinpath(*parts)

    def _sweep_stale_temps(self) -> None:
        now = time.time()
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self._tmp):
                with contextlib.suppress(FileNotFoundError):
                    if now - entry.stat().st_mtime > _STALE_TEMP_S:
                        os.unlink(entry.path)

    @contextlib.contextmanager
    def _key_lock(self, key: str) -> Iterator[None]:
        name = hashlib.sha256(key.encode()).hexdigest()[:32]
        fd = os.open(self._locks / name, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the flock

    def _fsync_dir(self, path: Path) -> None:
        if not self._fsync:
            return
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _write_temp(self, data: bytes) -> Path:
        tmp = self._tmp / uuid.uuid4().hex
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        return tmp

    @staticmethod
    def _read(path: Path, key: str) -> bytes:
        try:
            with open(path, "rb") as f:
                return f.read()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise ObjectNotFound(key) from None

    # ----------------------------------------------------------------------------- sync core

    def _get(self, key: str) -> GetResult:
        data = self._read(self._path(key), key)
        return GetResult(data=data, etag=content_etag(data))

    def _head(self, key: str) -> ObjectMeta:
        path = self._path(key)
        data = self._read(path, key)
        try:
            mtime = path.stat().st_mtime
        except FileNotFoundError:
            raise ObjectNotFound(key) from None
        return ObjectMeta(key=key, etag=content_etag(data), size=len(data), last_modified=mtime)

    def _put(self, key: str, data: bytes, if_none_match: str | None, if_match: str | None) -> str:
        path = self._path(key)
        etag = content_etag(data)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._write_temp(data)
        try:
            if if_none_match == "*":
                # link() is atomic and fails if the name exists: create-only without a lock.
                try:
                    os.link(tmp, path)
                except FileExistsError:
                    raise PreconditionFailed(key, "object exists") from None
            elif if_match is not None:
                with self._key_lock(key):
                    try:
                        current = content_etag(self._read(path, key))
                    except ObjectNotFound:
                        raise PreconditionFailed(key, "object missing") from None
                    if current != if_match.strip('"'):
                        raise PreconditionFailed(key, "etag mismatch")
                    os.replace(tmp, path)
            else:
                with self._key_lock(key):
                    os.replace(tmp, path)
            self._fsync_dir(path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return etag

    def _copy(self, src: str, dst: str, if_none_match: str | None) -> str:
        # Objects are immutable once written (replacing one renames a new file over the name),
        # so a hard link is a copy that never rewrites the bytes.
        src_path, dst_path = self._path(src), self._path(dst)
        data = self._read(src_path, src)
        dst_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp / uuid.uuid4().hex
        try:
            os.link(src_path, tmp)
        except FileNotFoundError:
            raise ObjectNotFound(src) from None
        try:
            if if_none_match == "*":
                try:
                    os.link(tmp, dst_path)
                except FileExistsError:
                    raise PreconditionFailed(dst, "object exists") from None
            else:
                with self._key_lock(dst):
                    os.replace(tmp, dst_path)
            self._fsync_dir(dst_path.parent)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        return content_etag(data)

    def _delete(self, key: str) -> None:
        path = self._path(key)
        with self._key_lock(key):
            try:
                os.unlink(path)
            except (FileNotFoundError, NotADirectoryError):
                return
        self._fsync_dir(path.parent)

    def _list(self, prefix: str, start_after: str | None) -> list[ObjectMeta]:
        # Walk only the directory that can hold the prefix, then filter by full key.
        base_dir = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        out: list[ObjectMeta] = []
        dir_parts = base_dir.split("/") if base_dir else []
        # No key lives under "..", "." or the hidden dir, so such a prefix matches nothing; walking
        # it would list files outside the key space.
        if prefix.startswith("/") or any(p in ("", ".", "..") for p in dir_parts):
            return out
        if dir_parts and dir_parts[0] == _HIDDEN:
            return out
        start = self.root.joinpath(*dir_parts) if dir_parts else self.root
        if not start.is_dir():
            return out
        for dirpath, dirnames, filenames in os.walk(start):
            rel_dir = os.path.relpath(dirpath, self.root)
            if rel_dir == ".":
                rel_dir = ""
                dirnames[:] = [d for d in dirnames if d != _HIDDEN]
            for name in filenames:
                key = f"{rel_dir}/{name}" if rel_dir else name
                if not key.startswith(prefix):
                    continue
                if start_after is not None and key <= start_after:
                    continue
                try:
                    st = os.stat(os.path.join(dirpath, name))
                except FileNotFoundError:
                    continue
                out.append(ObjectMeta(key=key, etag="", size=st.st_size, last_modified=st.st_mtime))
        out.sort(key=lambda m: m.key)
        return out

    # ------------------------------------------------------------------------------ async API

    async def get(self, key: str) -> GetResult:
        """Read a whole object; raises ObjectNotFound."""
        return await self._run(self._get, key)

    async def head(self, key: str) -> ObjectMeta:
        """Metadata of an object; raises ObjectNotFound."""
        return await self._run(self._head, key)

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        """Write an object atomically, optionally conditionally."""
        check_condition(if_none_match, if_match)
        return await self._run(self._put, key, bytes(data), if_none_match, if_match)

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        """Copy by hard link: the bytes are not rewritten."""
        return await self._run(self._copy, src, dst, if_none_match)

    async def delete(self, key: str) -> None:
        """Delete an object; a missing key is not an error."""
        await self._run(self._delete, key)

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        """Every object under ``prefix`` in key order.  Etags are left empty (use head)."""
        for meta in await self._run(self._list, prefix, start_after):
            yield meta

    def url_for(self, key: str) -> str:
        """A file:// URL of the object."""
        return self._path(key).as_uri()

    async def close(self) -> None:
        """Stop the store's I/O threads."""
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None

    async def _run(self, fn: Callable[..., _T], *args: Any) -> _T:
        # A pool of its own: blocking fsyncs of many logs must not queue behind the loop's
        # small default pool, and run_in_executor skips to_thread's per-call context copy.
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=32, thread_name_prefix="localstore")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EROFS):
                raise StoreUnavailable(f"local store I/O error: {e}") from e
            raise
