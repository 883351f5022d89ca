"""An in-process uvicorn server for tests and the harness."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn


class QuietUvicorn(uvicorn.Server):
    """A uvicorn server that leaves the process's signal handlers alone.

    uvicorn installs SIGINT/SIGTERM handlers for its own graceful exit; inside a test process or
    the harness, which run several servers and stop them by ``should_exit``, those handlers would
    take Ctrl-C away from the runner.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield
