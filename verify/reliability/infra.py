"""Real parts for the reliability verifier: log hosts in-process and as processes, redis-server,
and the "process died here" latch over a :class:`~wal3.faulty.FaultyStore`.

Everything listens on 127.0.0.1 only.  Nothing here waits by sleeping: readiness and exits are
polled with deadlines.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx

from verify.testkit import QuietUvicorn, free_port, wait_until, wait_until_sync
from wal3 import ObjectStore, SimulatedCrash, paths
from wal3.store import GetResult, ObjectMeta

T = TypeVar("T")

ROOT = Path(__file__).resolve().parents[2]
SERVICE_KEY = "svc-key"
API_KEYS = f"{SERVICE_KEY}=*,alice-key=alice,bob-key=bob"
TENANT_KEYS = {"alice": "alice-key", "bob": "bob-key"}

_log = logging.getLogger("verify.reliability")


def rss_kib(pid: int) -> int | None:
    """VmRSS of a process in KiB (from /proc), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# ------------------------------------------------------------------------------- crash latch


class CrashLatch(ObjectStore):
    """One process incarnation's view of the store.

    ``FaultyStore`` raises :class:`SimulatedCrash` at the injection point; a real process would be
    dead from that instant.  The latch makes it so: after the first crash every later request of
    this incarnation fails with ``SimulatedCrash`` without reaching the store, so no background
    task, graceful close or flush of the "dead" server can write anything more.  The harness then
    starts a fresh server (a new latch) on the same store: a restart.

    ``observers`` see every request that succeeded: ``(op, key, data)`` (data for puts only); the
    GC-phase scenarios use that to arm a crash at "the next manifest write after the plan landed".
    """

    def __init__(self, inner: ObjectStore, name: str = "") -> None:
        self.inner = inner
        self.name = name
        self.dead: BaseException | None = None
        self.crashed = asyncio.Event()
        self.observers: list[Callable[[str, str, bytes | None], None]] = []

    def __repr__(self) -> str:
        return f"CrashLatch({self.inner!r}, dead={self.dead is not None})"

    def _check(self) -> None:
        if self.dead is not None:
            raise SimulatedCrash(f"process {self.name} is dead: {self.dead}")

    def _die(self, e: BaseException) -> None:
        if self.dead is None:
            self.dead = e
            self.crashed.set()

    def _seen(self, op: str, key: str, data: bytes | None = None) -> None:
        for obs in list(self.observers):
            obs(op, key, data)

    async def _call(
        self, op: str, key: str, fn: Callable[[], Awaitable[T]], data: bytes | None = None
    ) -> T:
        self._check()
        try:
            out = await fn()
        except SimulatedCrash as e:
            self._die(e)
            raise
        self._check()  # died while this request was in flight: its answer is never seen
        self._seen(op, key, out.data if isinstance(out, GetResult) else data)
        return out

    async def get(self, key: str) -> GetResult:
        return await self._call("get", key, lambda: self.inner.get(key))

    async def head(self, key: str) -> ObjectMeta:
        return await self._call("head", key, lambda: self.inner.head(key))

    async def put(
        self,
        key: str,
        data: bytes,
        *,
        if_none_match: Literal["*"] | None = None,
        if_match: str | None = None,
    ) -> str:
        return await self._call(
            "put",
            key,
            lambda: self.inner.put(key, data, if_none_match=if_none_match, if_match=if_match),
            data,
        )

    async def delete(self, key: str) -> None:
        await self._call("delete", key, lambda: self.inner.delete(key))

    async def list(
        self, prefix: str, *, start_after: str | None = None
    ) -> AsyncIterator[ObjectMeta]:
        self._check()
        try:
            async for meta in self.inner.list(prefix, start_after=start_after):
                self._check()
                yield meta
        except SimulatedCrash as e:
            self._die(e)
            raise

    async def copy(self, src: str, dst: str, *, if_none_match: Literal["*"] | None = None) -> str:
        return await self._call(
            "copy", dst, lambda: self.inner.copy(src, dst, if_none_match=if_none_match)
        )

    def url_for(self, key: str) -> str:
        return self.inner.url_for(key)

    async def close(self) -> None:
        """The shared store outlives every incarnation: nothing to close."""


# ------------------------------------------------------------------------- in-process host


@dataclass
class InProcessHost:
    """A real uvicorn log host in this process over a shared (faulty) store, restartable.

    Each incarnation gets its own :class:`CrashLatch`; :meth:`restart` stops the current one (a
    dead incarnation cannot write anything while it shuts down) and starts a fresh ``Server`` on
    the same port, store and server id, as a process supervisor would.
    """

    store: ObjectStore
    settings: dict[str, Any]
    observers: list[Callable[[str, str, bytes | None], None]] = field(default_factory=list)
    port: int = field(default_factory=free_port)
    server_id: str = "h0"
    latch: CrashLatch | None = None
    server: Any = None
    restarts: int = 0
    start_failures: int = 0
    _userver: Any = None
    _task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        from host.api import create_app, uvicorn_config
        from host.config import Settings
        from host.server import Server

        base: dict[str, Any] = {
            "store": "unused",
            "listen": f"127.0.0.1:{self.port}",
            "api_keys": API_KEYS,
            "server_id": self.server_id,
            "rollup_interval_s": 3600.0,
            "idle_close_s": 3600.0,
            "gc_interval_s": 3600.0,
            "log_level": "WARNING",
            # A restart after an injected crash watches the crashed incarnation's liveness
            # record for 1.5 beats (it cannot drain through a dead store): keep that short.
            "membership_interval_s": 0.2,
            "membership_ttl_s": 2.0,
        }
        base.update(self.settings)
        for attempt in range(20):
            self.latch = CrashLatch(self.store, f"{self.server_id}#{self.restarts}.{attempt}")
            self.latch.observers.extend(self.observers)
            settings = Settings(**base)
            self.server = Server(settings, store=self.latch)
            self._userver = QuietUvicorn(
                uvicorn_config(create_app(self.server), settings, timeout_graceful_shutdown=10)
            )
            self._task = asyncio.create_task(self._userver.serve(), name=f"uvicorn-{self.port}")
            await wait_until(self._serving_or_gone, "uvicorn to start", 60)
            if not self._task.done():
                return
            # Startup itself hit an injected crash (e.g. opening the dirty log): try again, as a
            # supervisor would restart a process that died while starting.
            with contextlib.suppress(BaseException):
                await self._task
            self.start_failures += 1
            if self.latch.dead is None:
                raise RuntimeError("in-process log host failed to start")
        raise RuntimeError("in-process log host kept crashing while starting")

    def _serving_or_gone(self) -> bool:
        assert self._userver is not None and self._task is not None
        return bool(self._userver.started) or self._task.done()

    async def stop(self) -> None:
        if self._userver is None:
            return
        self._userver.should_exit = True
        assert self._task is not None
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(self._task), 60)
        if not self._task.done():
            self._userver.force_exit = True
            with contextlib.suppress(BaseException):
                await self._task
        self._userver = None

    async def restart(self) -> None:
        await self.stop()
        self.restarts += 1
        await self.start()

    @property
    def crashed(self) -> bool:
        return self.latch is not None and self.latch.dead is not None


# --------------------------------------------------------------------------- process hosts


@dataclass
class ProcHost:
    """A log host as its own process (``python -m host.cli serve`` or the faulty launcher)."""

    store_dir: Path
    log_dir: Path
    server_id: str = "p0"
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    faulty_args: list[str] | None = None  # set: run verify.reliability.host with these arguments
    proc: subprocess.Popen[bytes] | None = None
    kills: int = 0
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self, timeout_s: float = 60.0) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHOST_")}
        env.update(
            {
                "LOGHOST_API_KEYS": API_KEYS,
                "LOGHOST_LOG_LEVEL": "WARNING",
                "LOGHOST_ROLLUP_INTERVAL_S": "3600",
                "LOGHOST_GC_INTERVAL_S": "3600",
                "LOGHOST_IDLE_CLOSE_S": "3600",
                # A host restarted after kill -9 watches its predecessor's liveness record for
                # 1.5 beats before taking it over (a live twin would rewrite it): keep it short.
                "LOGHOST_MEMBERSHIP_INTERVAL_S": "0.2",
                "LOGHOST_MEMBERSHIP_TTL_S": "2",
            }
        )
        env.update(self.env)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        # ``loghost serve`` (host.cli.main), with faulthandler on SIGUSR1 so a host that stops
        # answering can be asked where it is stuck (see ``dump_stacks``).
        boot = (
            "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, "
            "all_threads=True); from {mod} import main; sys.exit(main(sys.argv[1:]))"
        )
        if self.faulty_args is None:
            cmd = [sys.executable, "-c", boot.format(mod="host.cli"), "serve"]
        else:
            cmd = [
                sys.executable,
                "-c",
                boot.format(mod="verify.reliability.host"),
                *self.faulty_args,
            ]
        cmd += [
            "--store",
            str(self.store_dir),
            "--listen",
            f"127.0.0.1:{self.port}",
            "--server-id",
            self.server_id,
        ]
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log = self.log_dir / f"host-{self.server_id}.log"
        with open(log, "ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT
            )
        self.starts += 1
        proc = self.proc

        def healthy() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"log host exited: {log.read_text(errors='replace')[-3000:]}")
            try:
                return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        try:
            wait_until_sync(healthy, f"log host {self.server_id} to be healthy", timeout_s, 0.05)
        except TimeoutError:
            self.kill9()
            raise RuntimeError("log host did not become healthy") from None

    def kill9(self) -> None:
        """SIGKILL our child: no flush, no goodbye."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
            self.kills += 1

    def terminate(self) -> None:
        """SIGTERM our child and wait for its graceful exit (SIGKILL after 60 s)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)

    def rss_kib(self) -> int | None:
        return rss_kib(self.proc.pid) if self.proc is not None else None

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"host-{self.server_id}.log"

    async def responsive(self, timeout_s: float = 10.0) -> str | None:
        """None if the host answers /healthz; else where its main thread is stuck."""
        if self.proc is None or self.proc.poll() is not None:
            return (
                f"host {self.server_id} is not running (exit {self.proc and self.proc.returncode})"
            )
        try:
            async with httpx.AsyncClient(timeout=timeout_s) as c:
                if (await c.get(self.url + "/healthz")).status_code == 200:
                    return None
        except httpx.HTTPError:
            pass
        return f"host {self.server_id} stopped answering /healthz; {await self.dump_stacks()}"

    async def dump_stacks(self) -> str:
        """SIGUSR1 the host (faulthandler) and return the innermost frame of its main thread."""
        assert self.proc is not None
        before = self.log_path.stat().st_size if self.log_path.exists() else 0
        self.proc.send_signal(signal.SIGUSR1)
        text = ""

        def dumped() -> bool:
            nonlocal text
            text = self.log_path.read_text(errors="replace")[before:]
            return "most recent call first" in text and text.rstrip().endswith(")")

        with contextlib.suppress(TimeoutError):  # a partial dump is still worth reporting
            await wait_until(dumped, "the stack dump", 5.0, 0.05)
        frames = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("File ")]
        inner = [f for f in frames if "/host/" in f or "/wal3/" in f or "/dirtylog/" in f]
        return (
            f"main thread in: {inner[0] if inner else (frames[0] if frames else 'unknown')} "
            f"(full dump in {self.log_path})"
        )


# ------------------------------------------------------------------------ store inspection


def compacted_objects(root: Path) -> tuple[int, int]:
    """(data files of either layout, ``CURRENT.json`` pointers) the compactors wrote into the
    LocalStore at ``root`` (whose keys are its paths)."""
    parts = currents = 0
    base = root / paths.COMPACTED_PREFIX
    if not base.is_dir():
        return 0, 0
    for coll in base.iterdir():
        for dirpath, _dirs, files in os.walk(coll):
            for f in files:
                key = (Path(dirpath) / f).relative_to(root).as_posix()
                if paths.parse_compacted_key(coll.name, key) is not None:
                    parts += 1
                elif key == paths.current_key(coll.name):
                    currents += 1
    return parts, currents
