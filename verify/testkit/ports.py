"""Free loopback ports, and waiting for a server to listen on one."""

from __future__ import annotations

import contextlib
import random
import socket
import subprocess
from pathlib import Path
from typing import Any

from .polling import wait_until_sync


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range of ephemeral ports (Linux's default when it cannot be read)."""
    with contextlib.suppress(OSError, ValueError):
        lo, hi = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(lo), int(hi)
    return 32768, 60999


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, chosen outside the kernel's
    ephemeral range.

    A port handed out by ``bind(("127.0.0.1", 0))`` comes from that range, and so does the source
    port of every outgoing connection (to moto, redis, another host): between this call and the
    server's own bind one of them could take it, and the server exits with EADDRINUSE (seen on CI,
    a cluster host). Outside that range only another ``free_port`` caller competes, at random.
    """
    lo, hi = ephemeral_range()
    span = range(10000, lo) if lo - 10000 >= 1000 else range(hi + 1, 65536)
    rng = random.Random()
    for _ in range(500):
        port = rng.choice(span)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {span.start}..{span.stop - 1}")


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
