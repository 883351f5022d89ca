"""The compactor's liveness probe watches the round loop itself, and its API key can be a file.

The chart sets ``COMPACTOR_HEARTBEAT_FILE``; ``compactor run`` touches that file before its first
round and after every round, and the probe (an exec of the command the chart renders) fails once
the file is older than ``compactor.heartbeat.maxAgeSeconds``.  ``/metrics`` is served by a thread
of its own and stays green while the loop hangs, so it is no longer the probe.

These tests run the real round loop (``compactor_client.cli.run``) against a real log host with
nothing dirty, so no Spark job starts: a stand-in session that only records the package shipped
to it is enough.  The probe command is taken from the rendered chart and run as rendered.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from compactor_client import cli
from tests.helm.test_chart import compactor_workload, container, env_of, render
from tests.host.live import SERVICE_KEY, live_server


class _SparkContext:
    def __init__(self) -> None:
        self.listFiles: list[str] = []

    def addPyFile(self, path: str) -> None:
        self.listFiles.append(path)


class _Spark:
    """Only what ``run`` touches when no collection is dirty."""

    def __init__(self) -> None:
        self.sparkContext = _SparkContext()


def _settings(url: str, store: Path, **env: str) -> cli.Settings:
    args = cli.build_parser().parse_args(["run", "--once"])
    base = {"COMPACTOR_HOSTS": url, "COMPACTOR_STORE": str(store), "COMPACTOR_MEMBER_ID": "c1"}
    return cli.settings_from(args, {**base, **env})


async def test_the_round_loop_touches_the_heartbeat_file(tmp_path: Path) -> None:
    beat = tmp_path / "heartbeat"
    store = tmp_path / "store"
    async with live_server(str(store)) as live:
        settings = _settings(
            live.url, store, COMPACTOR_API_KEY=SERVICE_KEY, COMPACTOR_HEARTBEAT_FILE=str(beat)
        )
        assert settings.heartbeat_file == str(beat)
        assert await cli.run(settings, spark=_Spark(), registry=CollectorRegistry()) == 0
        assert beat.is_file()
        # A stale heartbeat (a loop that hung an hour ago) is renewed by the next round.
        os.utime(beat, (1_000_000, 1_000_000))
        assert await cli.run(settings, spark=_Spark(), registry=CollectorRegistry()) == 0
        assert beat.stat().st_mtime > 1_000_000 + 3600


async def test_the_api_key_can_come_from_a_mounted_file(tmp_path: Path) -> None:
    key_file = tmp_path / "compactor-api-key"
    key_file.write_text(SERVICE_KEY + "\n")
    store = tmp_path / "store"
    async with live_server(str(store)) as live:
        settings = _settings(live.url, store, COMPACTOR_API_KEY_FILE=str(key_file))
        assert settings.api_key == SERVICE_KEY
        assert await cli.run(settings, spark=_Spark(), registry=CollectorRegistry()) == 0
    # The environment variable still wins, and a missing file is a configuration error.
    assert (
        _settings(
            "http://127.0.0.1:1", store, COMPACTOR_API_KEY="k", COMPACTOR_API_KEY_FILE=str(key_file)
        ).api_key
        == "k"
    )
    with pytest.raises(cli.SettingsError, match="COMPACTOR_API_KEY_FILE"):
        _settings("http://127.0.0.1:1", store, COMPACTOR_API_KEY_FILE=str(tmp_path / "absent"))


def _probe_command(chart: Any, probe: str, values: dict[str, Any] | None = None) -> list[str]:
    workload = compactor_workload(render(chart, values or {}))
    command = container(workload, "compactor")[probe]["exec"]["command"]
    assert command[0] == "python"  # the image's interpreter; here, this one
    return [sys.executable, *command[1:]]


@pytest.mark.parametrize("probe", ["livenessProbe", "startupProbe"])
def test_the_rendered_probe_fails_on_a_stale_or_missing_heartbeat(
    chart, tmp_path: Path, probe: str
) -> None:
    workload = compactor_workload(render(chart))
    path = env_of(workload, "compactor")["COMPACTOR_HEARTBEAT_FILE"]["value"]
    assert path.startswith("/tmp/"), "on the writable /tmp emptyDir"
    command = [part.replace(path, str(tmp_path / "beat")) for part in _probe_command(chart, probe)]
    assert str(tmp_path / "beat") in command

    def probe_ok() -> bool:
        return subprocess.run(command, check=False, capture_output=True, timeout=60).returncode == 0

    assert not probe_ok(), "no heartbeat yet: the loop has not started"
    (tmp_path / "beat").touch()
    assert probe_ok()
    old = time.time() - 3601  # older than the default maxAgeSeconds (3600)
    os.utime(tmp_path / "beat", (old, old))
    assert not probe_ok()


def test_the_probe_age_follows_the_values(chart) -> None:
    command = _probe_command(
        chart, "livenessProbe", {"compactor": {"heartbeat": {"maxAgeSeconds": 7200}}}
    )
    assert command[-1] == "7200"
    assert "7200" not in _probe_command(chart, "livenessProbe")
