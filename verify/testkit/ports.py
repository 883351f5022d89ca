"""Free loopback ports, and waiting for a server to listen on one."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from typing import Any

from .polling import wait_until_sync


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def accepts_connections(port: int, timeout_s: float = 0.5) -> bool:
    """Whether something accepts TCP connections on 127.0.0.1:``port`` now."""
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout_s):
        return True
    return False


def wait_for_port(
    port: int, timeout_s: float = 20.0, proc: subprocess.Popen[Any] | None = None
) -> None:
    """Wait until 127.0.0.1:``port`` accepts connections: TimeoutError at the deadline, and
    RuntimeError as soon as ``proc`` (the server, when it is a child) has exited."""

    def listening() -> bool:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before listening")
        return accepts_connections(port)

    wait_until_sync(listening, f"something to listen on 127.0.0.1:{port}", timeout_s, 0.05)
