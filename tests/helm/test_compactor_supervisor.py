"""helm/image/compactor-supervisor.py against a fake Kubernetes API on loopback.

The supervisor is what makes compactor autoscaling coherent: it derives the
rendezvous member list from the StatefulSet's replica count and restarts the
compactor when the count changes. Here the "compactor" is a tiny script that
records the membership it was started with and how it was stopped.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

SUPERVISOR = Path(__file__).resolve().parents[2] / "helm" / "image" / "compactor-supervisor.py"
STS = "lh-compactor"
NS = "logs"
TOKEN = "test-token-123"

CHILD = r"""
import os, signal, sys, time
out, exit_code = sys.argv[1], int(sys.argv[2])
def note(line):
    with open(out, "a") as f:
        f.write(line + "\n")
def term(*_):
    note("term")
    time.sleep(0.3)  # "flushing": a second SIGTERM now would be noted twice
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
note(f"start {os.environ['COMPACTOR_MEMBER_ID']} {os.environ['COMPACTOR_MEMBERS']}")
if exit_code >= 0:
    time.sleep(0.3)
    note(f"exit {exit_code}")
    sys.exit(exit_code)
while True:
    time.sleep(0.02)
"""


class FakeAPI:
    """Serves GET /apis/apps/v1/namespaces/NS/statefulsets/STS with a settable replica count."""

    def __init__(self) -> None:
        self.replicas: int | None = 3
        self.failures_left = 0
        self.requests: list[tuple[str, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                api.requests.append((self.path, self.headers.get("Authorization")))
                if self.path != f"/apis/apps/v1/namespaces/{NS}/statefulsets/{STS}":
                    self.send_error(404)
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_error(401)
                    return
                if api.failures_left > 0:
                    api.failures_left -= 1
                    self.send_error(503)
                    return
                spec = {} if api.replicas is None else {"replicas": api.replicas}
                body = json.dumps({"kind": "StatefulSet", "spec": spec}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def __enter__(self) -> FakeAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def api():
    with FakeAPI() as fake:
        yield fake


def start(tmp_path: Path, api: FakeAPI, pod: str = f"{STS}-1", child_exit: int = -1) -> tuple[subprocess.Popen, Path]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = tmp_path / "events.log"
    child = tmp_path / "fake_compactor.py"
    child.write_text(CHILD)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MEMBERSHIP_STATEFULSET": STS,
        "MEMBERSHIP_NAMESPACE": NS,
        "MEMBERSHIP_POLL_S": "0.2",
        "MEMBERSHIP_STOP_GRACE_S": "5",
        "MEMBERSHIP_API_URL": api.url,
        "MEMBERSHIP_TOKEN_FILE": str(token),
        "POD_NAME": pod,
    }
    proc = subprocess.Popen(
        [sys.executable, str(SUPERVISOR), "--", sys.executable, str(child), str(out), str(child_exit)],
        env=env,
    )
    return proc, out


def events(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def wait_for(out: Path, predicate, timeout: float = 10.0) -> list[str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen = events(out)
        if predicate(seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"timed out; events so far: {events(out)}")


def stop(proc: subprocess.Popen) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=10)


def members(n: int) -> str:
    return ",".join(f"{STS}-{i}" for i in range(n))


def test_starts_with_the_statefulsets_members(tmp_path, api):
    proc, out = start(tmp_path, api)
    try:
        seen = wait_for(out, lambda e: len(e) >= 1)
        assert seen[0] == f"start {STS}-1 {members(3)}"
        path, auth = api.requests[0]
        assert path == f"/apis/apps/v1/namespaces/{NS}/statefulsets/{STS}"
        assert auth == f"Bearer {TOKEN}"
    finally:
        assert stop(proc) == 0
    seen = events(out)
    assert seen[-1] == "term", "SIGTERM must reach the compactor"
    assert seen.count("term") == 1, "exactly one SIGTERM: a second one can cut the flush short"


def test_restarts_with_new_members_when_scaled(tmp_path, api):
    proc, out = start(tmp_path, api)
    try:
        wait_for(out, lambda e: e == [f"start {STS}-1 {members(3)}"])
        api.replicas = 5  # HPA scales out
        seen = wait_for(out, lambda e: len(e) >= 3)
        assert seen[1:3] == ["term", f"start {STS}-1 {members(5)}"]
        api.replicas = 2  # scales in; this pod (ordinal 1) stays a member
        seen = wait_for(out, lambda e: len(e) >= 5)
        assert seen[3:5] == ["term", f"start {STS}-1 {members(2)}"]
        api.replicas = 1  # this pod is being removed: run nothing
        seen = wait_for(out, lambda e: len(e) >= 6)
        assert seen[5] == "term"
        time.sleep(0.6)
        assert len(events(out)) == 6, "a pod outside the member list must not compact"
        assert proc.poll() is None, "the supervisor waits to be terminated"
    finally:
        assert stop(proc) == 0
    assert events(out).count("term") == 3, "one SIGTERM per restart, never two"


def test_unchanged_membership_does_not_restart(tmp_path, api):
    proc, out = start(tmp_path, api)
    try:
        wait_for(out, lambda e: len(e) == 1)
        polls = len(api.requests)
        time.sleep(1.0)
        assert len(api.requests) >= polls + 3, "it keeps polling"
        assert len(events(out)) == 1
    finally:
        stop(proc)


def test_api_errors_keep_current_membership_and_startup_retries(tmp_path, api):
    api.failures_left = 3
    proc, out = start(tmp_path, api)
    try:
        seen = wait_for(out, lambda e: len(e) >= 1)
        assert seen == [f"start {STS}-1 {members(3)}"]
        api.failures_left = 5
        time.sleep(0.8)
        assert events(out) == seen, "an API hiccup must not restart the compactor"
    finally:
        stop(proc)


def test_missing_replicas_defaults_to_one(tmp_path, api):
    api.replicas = None
    proc, out = start(tmp_path, api, pod=f"{STS}-0")
    try:
        assert wait_for(out, lambda e: len(e) >= 1)[0] == f"start {STS}-0 {STS}-0"
    finally:
        stop(proc)


def test_compactor_exit_status_is_propagated(tmp_path, api):
    proc, out = start(tmp_path, api, child_exit=3)
    assert proc.wait(timeout=10) == 3
    assert events(out)[-1] == "exit 3"


def test_refuses_to_run_without_configuration(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--", "true"],
        env={"PATH": os.environ.get("PATH", "")}, capture_output=True, text=True, timeout=10,
    )
    assert result.returncode != 0
    assert "MEMBERSHIP_STATEFULSET" in result.stderr
