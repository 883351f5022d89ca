"""Loopback ports for the servers tests start: chosen where no outgoing connection can take them,
and a cluster host that still lost its port to another process is started again elsewhere.

CI once failed at a cluster's start-up: ``host-2 exited with 70 ... [Errno 98] Address already
in use``. ``free_port`` handed out a port from the kernel's ephemeral range (``bind(0)``), the
range every outgoing connection's source port also comes from, and something took it before the
host bound it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import verify.cluster.core as core
from verify.testkit import free_port
from verify.testkit.ports import ephemeral_range


def test_free_port_is_outside_the_ephemeral_range_and_bindable() -> None:
    lo, hi = ephemeral_range()
    ports = {free_port() for _ in range(50)}
    assert all(not lo <= p <= hi for p in ports), sorted(ports)
    assert len(ports) > 1  # chosen at random, not one fixed port every caller races for
    for p in list(ports)[:5]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", p))


@pytest.fixture
def occupied() -> Iterator[int]:
    """A port something else listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def test_a_host_whose_port_was_taken_is_started_again_on_another(
    tmp_path: Path, occupied: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    handed = iter([occupied])
    monkeypatch.setattr(core, "free_port", lambda: next(handed, None) or free_port())
    cluster = core.Cluster(
        workdir=tmp_path,
        store=str(tmp_path / "store"),
        service_key="svc-test-key",
        tenant_key="t-test-key",
        front_port=0,
        hosts=[],
        timeout_s=60.0,
    )
    try:
        first = cluster._spawn_host("host-0")
        assert first.port == occupied
        h = cluster._await_first_start(first, "answer /healthz", core.Host.healthy)
        assert h.port != occupied
        assert [x.server_id for x in cluster.hosts] == ["host-0"]
        assert cluster.hosts[0] is h and h.healthy()
        assert "address already in use" in (tmp_path / "logs" / "host-0.log").read_text().lower()
    finally:
        cluster.close()
