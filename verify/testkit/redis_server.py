"""A real redis-server on loopback: started, killed (its data gone), paused and resumed."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from .polling import wait_until_sync
from .ports import free_port


def redis_executable() -> str | None:
    """The redis-server binary, or None when it is not installed."""
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None
    )


class RedisServer:
    """redis-server on a fixed loopback port, without persistence (``durable``: every write is
    appended to its AOF and fsynced before the answer, the benchmarks' durable peer).

    ``stop()`` kills it, so a ``start()`` afterwards is a restart with nothing in memory: the case
    the advisory leader hint must survive.  ``pause()`` (SIGSTOP) leaves connections accepted by
    the kernel but never answered, which is what a stalled Redis looks like to a client.
    """

    def __init__(
        self,
        workdir: Path,
        port: int | None = None,
        executable: str | None = None,
        *,
        durable: bool = False,
    ) -> None:
        exe = executable or redis_executable()
        if exe is None:
            raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
        self.executable = exe
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.workdir = workdir
        self.durable = durable
        self.proc: subprocess.Popen[bytes] | None = None
        self.stops = 0

    def answers_ping(self) -> bool:
        """True if the port answers a RESP PING with +PONG."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart, empty) on the same port; returns once it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = self.workdir / "redis.log"
        with open(log, "ab") as out:  # the child keeps its own descriptor
            self.proc = subprocess.Popen(
                [
                    self.executable,
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    *(
                        ("--appendonly", "yes", "--appendfsync", "always")
                        if self.durable
                        else ("--appendonly", "no")
                    ),
                    "--dir",
                    str(self.workdir),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = self.proc

        def up() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited with {proc.returncode}:\n"
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            return self.answers_ping()

        try:
            wait_until_sync(up, f"redis-server to answer PING on port {self.port}", timeout_s)
        except TimeoutError:
            self.stop()
            raise

    def stop(self) -> None:
        """Kill the server (all its data is gone) and wait until it has exited."""
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGCONT)  # a paused server would not act on SIGTERM
        proc.kill()
        proc.wait(timeout=10)
        self.stops += 1

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel but never answered."""
        assert self.proc is not None and self.proc.poll() is None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT a paused server."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
