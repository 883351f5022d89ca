"""Fixtures shared by the host tests."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI

from . import live as live_module


@pytest.fixture(scope="module")
def recorded_apps() -> Iterator[list[FastAPI]]:
    """``live_server`` builds its app with ``live.create_app``: record what it builds."""
    apps: list[FastAPI] = []
    real = live_module.create_app

    def recording(server: Any) -> FastAPI:
        app = real(server)
        apps.append(app)
        return app

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(live_module, "create_app", recording)
        yield apps
