"""Real parts shared by the tests, the reliability harness and the benchmarks.

One place for what all three start and wait on: loopback ports, bounded polling, an in-process
uvicorn that leaves signal handlers alone, a redis-server subprocess, and the facts of the machine
a report is made on.  Nothing here imports ``tests/``; everything binds 127.0.0.1.
"""

from .machine import command_line, machine_info
from .polling import wait_until, wait_until_sync
from .ports import accepts_connections, free_port, wait_for_port
from .redis_server import RedisServer, redis_executable
from .uvicorn_server import QuietUvicorn

__all__ = [
    "QuietUvicorn",
    "RedisServer",
    "accepts_connections",
    "command_line",
    "free_port",
    "machine_info",
    "redis_executable",
    "wait_for_port",
    "wait_until",
    "wait_until_sync",
]
