"""helm/image/compactor-supervisor.py against a fake Kubernetes API on loopback.

The supervisor is what makes compactor autoscaling coherent: it derives the
rendezvous member list from the API (a StatefulSet's replica count, or a
Deployment's live pods) and restarts the compactor when the list changes. Here
the "compactor" is a tiny script that records the membership it was started
with and how it was stopped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from verify.testkit import wait_until_sync

SUPERVISOR = Path(__file__).resolve().parents[2] / "helm" / "image" / "compactor-supervisor.py"
STS = "lh-compactor"
NS = "logs"
TOKEN = "test-token-123"
SELECTOR = "app.kubernetes.io/component=compactor,app.kubernetes.io/instance=lh"
DEPLOY_POD = "lh-compactor-7c9d5b8f6d-abcde"

# No sleeps: the fake compactor notes how it started and each SIGTERM, and exits on the first.
# That the supervisor signals a flushing compactor only once is checked deterministically
# in-process (test_*_signals_the_compactor_once), with a child that stays alive until waited for.
CHILD = r"""
import os, signal, sys
out, exit_code = sys.argv[1], int(sys.argv[2])
def note(line):
    with open(out, "a") as f:
        f.write(line + "\n")
def term(*_):
    note("term")
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
note(f"start {os.environ['COMPACTOR_MEMBER_ID']} {os.environ['COMPACTOR_MEMBERS']}")
if exit_code >= 0:
    note(f"exit {exit_code}")
    sys.exit(exit_code)
while True:
    signal.pause()  # idle until signalled
"""


def pod(
    name: str, phase: str = "Running", deleting: bool = False, node: str | None = "node-1"
) -> dict:
    meta: dict = {"name": name, "namespace": NS}
    if deleting:
        meta["deletionTimestamp"] = "2024-05-01T12:00:00Z"
    spec = {"nodeName": node} if node else {}
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


class FakeAPI:
    """Serves GET /apis/apps/v1/namespaces/NS/statefulsets/STS with a settable replica count,
    and GET /api/v1/namespaces/NS/pods?labelSelector=SELECTOR with a settable pod list."""

    def __init__(self) -> None:
        self.replicas: int | None = 3
        self.pods: list[dict] = []
        self.failures_left = 0
        self.failures_served = 0  # 503s actually answered, so a test can see they happened
        self.requests: list[tuple[str, str | None]] = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                api.requests.append((self.path, self.headers.get("Authorization")))
                url = urllib.parse.urlsplit(self.path)
                if (
                    url.path == f"/apis/apps/v1/namespaces/{NS}/statefulsets/{STS}"
                    and not url.query
                ):
                    spec = {} if api.replicas is None else {"replicas": api.replicas}
                    reply = {"kind": "StatefulSet", "spec": spec}
                elif url.path == f"/api/v1/namespaces/{NS}/pods":
                    if urllib.parse.parse_qs(url.query) != {"labelSelector": [SELECTOR]}:
                        self.send_error(400)
                        return
                    reply = {"kind": "PodList", "items": api.pods}
                else:
                    self.send_error(404)
                    return
                if self.headers.get("Authorization") != f"Bearer {TOKEN}":
                    self.send_error(401)
                    return
                if api.failures_left > 0:
                    api.failures_left -= 1
                    api.failures_served += 1
                    self.send_error(503)
                    return
                body = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

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


def start(
    tmp_path: Path,
    api: FakeAPI,
    pod: str = f"{STS}-1",
    child_exit: int = -1,
    mode: str | None = None,
    stderr: int | None = None,
) -> tuple[subprocess.Popen, Path]:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    out = tmp_path / "events.log"
    child = tmp_path / "fake_compactor.py"
    child.write_text(CHILD)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "MEMBERSHIP_NAMESPACE": NS,
        "MEMBERSHIP_POLL_S": "0.2",
        "MEMBERSHIP_STOP_GRACE_S": "5",
        "MEMBERSHIP_API_URL": api.url,
        "MEMBERSHIP_TOKEN_FILE": str(token),
        "POD_NAME": pod,
    }
    if mode == "pods":  # what the chart sets for a Deployment
        env.update(MEMBERSHIP_MODE="pods", MEMBERSHIP_SELECTOR=SELECTOR)
    else:  # statefulset; mode=None leaves MEMBERSHIP_MODE unset (its default)
        env["MEMBERSHIP_STATEFULSET"] = STS
        if mode:
            env["MEMBERSHIP_MODE"] = mode
    proc = subprocess.Popen(
        [
            sys.executable,
            str(SUPERVISOR),
            "--",
            sys.executable,
            str(child),
            str(out),
            str(child_exit),
        ],
        env=env,
        stderr=stderr,
    )
    return proc, out


def events(out: Path) -> list[str]:
    return out.read_text().splitlines() if out.exists() else []


def wait_for(out: Path, predicate, timeout: float = 10.0) -> list[str]:
    wait_until_sync(lambda: predicate(events(out)), f"an event; so far: {events(out)}", timeout)
    return events(out)


def wait_for_polls(api: FakeAPI, n: int, timeout: float = 10.0) -> None:
    """Wait until the API has seen n more requests. The supervisor polls one request at a
    time, so once request k+1 arrives it has acted on the answer to request k."""
    target = len(api.requests) + n
    wait_until_sync(lambda: len(api.requests) >= target, f"{target} API requests", timeout)


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
        wait_for_polls(api, 3)  # it has acted on at least two more answers saying "1 replica"
        assert len(events(out)) == 6, "a pod outside the member list must not compact"
        assert proc.poll() is None, "the supervisor waits to be terminated"
    finally:
        assert stop(proc) == 0
    assert events(out).count("term") == 3, "one SIGTERM per restart, never two"


def test_unchanged_membership_does_not_restart(tmp_path, api):
    proc, out = start(tmp_path, api)
    try:
        wait_for(out, lambda e: len(e) == 1)
        wait_for_polls(api, 3)  # it keeps polling, and has acted on two unchanged answers
        assert len(events(out)) == 1
    finally:
        stop(proc)


def test_api_errors_keep_current_membership_and_startup_retries(tmp_path, api):
    api.failures_left = 3
    proc, out = start(tmp_path, api)
    try:
        seen = wait_for(out, lambda e: len(e) >= 1)
        assert seen == [f"start {STS}-1 {members(3)}"]
        assert api.failures_served == 3, "the start waited out three failed reads"
        api.failures_left = 5
        wait_until_sync(lambda: api.failures_served == 8, "five more failed reads")
        wait_for_polls(api, 2)  # it has acted on the last failure and on a good answer after it
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


def json_lines(text: str) -> list[dict]:
    """Every stderr line of the supervisor is one JSON object shaped like the compactor's."""
    lines = [json.loads(line) for line in text.splitlines()]
    for line in lines:
        assert list(line)[:4] == ["ts", "level", "logger", "msg"], line
        assert line["logger"] == "compactor.supervisor", line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", line["ts"]), line
    return lines


def test_logs_are_json_lines(tmp_path, api):
    proc, _ = start(tmp_path, api, child_exit=3, stderr=subprocess.PIPE)
    _, err = proc.communicate(timeout=10)
    assert proc.returncode == 3
    lines = json_lines(err.decode())
    assert [(x["level"], x["msg"].split(" ")[0]) for x in lines] == [
        ("info", "starting"),
        ("warning", "compactor"),
    ], lines
    assert lines[0]["member_id"] == f"{STS}-1" and lines[0]["members"] == 3
    assert lines[1] == {**lines[1], "msg": "compactor exited with status 3", "status": 3}


def test_refuses_to_run_without_configuration(tmp_path):
    result = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--", "true"],
        env={"PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=10,
    )
    assert result.returncode == 2
    (line,) = json_lines(result.stderr)
    assert line["level"] == "error" and "MEMBERSHIP_STATEFULSET" in line["msg"], line


# --- pods mode (the chart's Deployment) -----------------------------------------


def load_supervisor():
    spec = importlib.util.spec_from_file_location("compactor_supervisor", SUPERVISOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_members_from_a_pod_list():
    members_from_pods = load_supervisor().members_from_pods
    pods = [
        pod("lh-compactor-b-2", "Pending"),
        pod("lh-compactor-a-1", "Running"),
        pod("lh-compactor-c-3", "Running", deleting=True),  # terminating: leaving now
        pod("lh-compactor-d-4", "Succeeded"),
        pod("lh-compactor-e-5", "Failed"),
        pod("lh-compactor-f-6", "Unknown"),
        pod("lh-compactor-g-7", "Pending", deleting=True),
        {"metadata": {"name": "lh-compactor-h-8"}},  # no status yet: not counted
        pod("lh-compactor-i-9", "Pending", node=None),  # fits nowhere: must not take a share
    ]
    assert members_from_pods(pods, "lh-compactor-z-0") == [
        "lh-compactor-a-1",
        "lh-compactor-b-2",
        "lh-compactor-z-0",
    ]
    # Our own pod is a member even if the list does not (yet) show it as live.
    assert members_from_pods([pod("lh-compactor-a-1", "Failed")], "lh-compactor-a-1") == [
        "lh-compactor-a-1"
    ]
    assert members_from_pods([], "me") == ["me"]


def test_pods_mode_starts_with_the_live_pods(tmp_path, api):
    api.pods = [
        pod("lh-compactor-x", "Running"),
        pod("lh-compactor-gone", "Running", deleting=True),
        pod("lh-compactor-done", "Succeeded"),
    ]
    proc, out = start(tmp_path, api, pod=DEPLOY_POD, mode="pods")
    try:
        seen = wait_for(out, lambda e: len(e) >= 1)
        # Own name included although the list did not show it; sorted.
        assert seen[0] == f"start {DEPLOY_POD} {DEPLOY_POD},lh-compactor-x"
        path, auth = api.requests[0]
        url = urllib.parse.urlsplit(path)
        assert url.path == f"/api/v1/namespaces/{NS}/pods"
        assert urllib.parse.parse_qs(url.query) == {"labelSelector": [SELECTOR]}
        assert auth == f"Bearer {TOKEN}"
        assert not any("statefulsets" in p for p, _ in api.requests)
    finally:
        assert stop(proc) == 0
    assert events(out).count("term") == 1


def test_pods_mode_restarts_when_the_member_set_changes(tmp_path, api):
    me = pod(DEPLOY_POD, "Running")
    api.pods = [me, pod("lh-compactor-x", "Running")]
    proc, out = start(tmp_path, api, pod=DEPLOY_POD, mode="pods")
    try:
        wait_for(out, lambda e: e == [f"start {DEPLOY_POD} {DEPLOY_POD},lh-compactor-x"])
        api.pods = [
            me,
            pod("lh-compactor-x", "Running"),
            pod("lh-compactor-a", "Pending"),
        ]  # scaled out
        seen = wait_for(out, lambda e: len(e) >= 3)
        assert seen[1:3] == [
            "term",
            f"start {DEPLOY_POD} {DEPLOY_POD},lh-compactor-a,lh-compactor-x",
        ]
        # The new pod turning Running is not a membership change: no restart.
        api.pods = [me, pod("lh-compactor-x", "Running"), pod("lh-compactor-a", "Running")]
        wait_for_polls(api, 3)
        assert len(events(out)) == 3
        api.pods = [
            me,
            pod("lh-compactor-x", "Running", deleting=True),
            pod("lh-compactor-a", "Running"),
        ]
        seen = wait_for(out, lambda e: len(e) >= 5)
        assert seen[3:5] == ["term", f"start {DEPLOY_POD} {DEPLOY_POD},lh-compactor-a"]
        api.pods = [me]  # down to this pod alone: it still runs, with just itself
        seen = wait_for(out, lambda e: len(e) >= 7)
        assert seen[5:7] == ["term", f"start {DEPLOY_POD} {DEPLOY_POD}"]
        assert proc.poll() is None
    finally:
        assert stop(proc) == 0
    assert events(out).count("term") == 4, "one SIGTERM per restart, never two"


def test_pods_mode_api_errors_keep_current_membership(tmp_path, api):
    api.pods = [pod("lh-compactor-x", "Running")]
    proc, out = start(tmp_path, api, pod=DEPLOY_POD, mode="pods")
    try:
        seen = wait_for(out, lambda e: len(e) >= 1)
        api.failures_left = 1_000  # more than the polls below, whatever is in flight
        api.pods = []  # would be a change, but every answer fails meanwhile
        wait_for_polls(api, 3)
        assert events(out) == seen, "an API hiccup must not restart the compactor"
    finally:
        stop(proc)


def test_an_explicit_statefulset_mode_is_the_default_behaviour(tmp_path, api):
    proc, out = start(tmp_path, api, mode="statefulset")
    try:
        assert wait_for(out, lambda e: len(e) >= 1)[0] == f"start {STS}-1 {members(3)}"
    finally:
        stop(proc)


@pytest.mark.parametrize(
    "env, message",
    [
        ({"MEMBERSHIP_MODE": "pods"}, "MEMBERSHIP_SELECTOR"),
        ({"MEMBERSHIP_MODE": "dns", "MEMBERSHIP_STATEFULSET": STS}, "MEMBERSHIP_MODE"),
    ],
)
def test_refuses_bad_mode_configuration(env, message):
    result = subprocess.run(
        [sys.executable, str(SUPERVISOR), "--", "true"],
        env={
            "PATH": os.environ.get("PATH", ""),
            "MEMBERSHIP_NAMESPACE": NS,
            "POD_NAME": DEPLOY_POD,
            "MEMBERSHIP_API_URL": "http://127.0.0.1:9",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    assert result.returncode == 2
    (line,) = json_lines(result.stderr)
    assert line["level"] == "error" and message in line["msg"], line


# --- signalling the compactor exactly once (in-process, deterministic) ------------


class FlushingChild:
    """A stand-in for the compactor's Popen that keeps flushing (stays alive) until waited for,
    so every signal the supervisor sends it in the meantime is recorded."""

    def __init__(self, during_wait=None) -> None:
        self.signals: list[int] = []
        self.returncode: int | None = None
        self.during_wait = during_wait  # what happens while the supervisor waits for the flush

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, signum: int) -> None:
        self.signals.append(signum)

    def terminate(self) -> None:
        self.signals.append(signal.SIGTERM)

    def kill(self) -> None:
        self.signals.append(signal.SIGKILL)
        self.returncode = -signal.SIGKILL

    def wait(self, timeout: float | None = None) -> int:
        if self.during_wait is not None:
            during, self.during_wait = self.during_wait, None
            during()
        if self.returncode is None:
            self.returncode = 0  # the flush finished
        return self.returncode


def supervisor_with(child: FlushingChild):
    module = load_supervisor()
    cfg = module.Config(
        {
            "MEMBERSHIP_STATEFULSET": STS,
            "MEMBERSHIP_NAMESPACE": NS,
            "MEMBERSHIP_API_URL": "http://127.0.0.1:9",
            "POD_NAME": f"{STS}-0",
        }
    )
    sup = module.Supervisor(cfg, ["compactor", "run"])
    sup.child = child  # as start() leaves it: running, not yet signalled
    sup.child_signalled = False
    return sup


def test_a_forwarded_sigterm_signals_the_compactor_once():
    child = FlushingChild()
    sup = supervisor_with(child)
    sup.on_signal(signal.SIGTERM, None)  # the kubelet stops the pod
    sup.on_signal(signal.SIGTERM, None)  # ... and says so again while the compactor flushes
    assert sup.stopping
    assert sup.stop() == 0  # what run() does next
    assert child.signals == [signal.SIGTERM], "a second SIGTERM can cut the flush short"


def test_a_restart_signals_the_compactor_once_even_if_the_pod_is_stopped_meanwhile():
    child = FlushingChild()
    sup = supervisor_with(child)
    assert sup.stop() == 0  # membership changed: stop it to restart
    assert child.signals == [signal.SIGTERM]
    sup2 = supervisor_with(FlushingChild())
    child2 = sup2.child
    # The pod is stopped while the restart waits for the compactor's flush.
    child2.during_wait = lambda: sup2.on_signal(signal.SIGTERM, None)
    assert sup2.stop() == 0
    assert child2.signals == [signal.SIGTERM]
    assert sup2.stopping and sup2.child is None  # run() returns instead of starting a new one
