"""``loghost``'s failures: one ``loghost: error:`` line and a distinct exit code, never a traceback
(issue 22, items 1, 4 and 5).  Real subprocesses of the command, the local store, moto's S3."""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from host.cli import build_parser
from host.cli_errors import ExitCode
from verify.testkit import free_port, wait_until_sync

from .live import KEYS, live_server, log_path, record

LOG1 = str(uuid.UUID(int=303, version=4))
LOG2 = str(uuid.UUID(int=404, version=4))
UNSUPPORTED = "ftp://bucket/x"
UNSUPPORTED_LINE = (
    "loghost: error: unsupported store URL scheme 'ftp' in 'ftp://bucket/x': "
    "use a directory path, file:///dir or s3://bucket/prefix"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOGHOST_")}
    env.update(extra)
    return env


def _cmd() -> list[str]:
    script = Path(sys.executable).parent / "loghost"
    return [str(script)] if script.exists() else [sys.executable, "-m", "host.cli"]


def loghost(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run the ``loghost`` command to its end."""
    return subprocess.run(
        [*_cmd(), *args], capture_output=True, text=True, timeout=120, env=_env(**env)
    )


def only_line(out: subprocess.CompletedProcess[str]) -> str:
    """The single line a failure writes (asserting that it is one line and no traceback)."""
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


@pytest.fixture
async def store(tmp_path: Path) -> Path:
    """A store written by a real server: LOG1 with a compaction cursor, LOG2 without one."""
    root = tmp_path / "store"
    async with live_server(str(root)) as lv, lv.client("alice-key") as c, lv.client() as svc:
        for log in (LOG1, LOG2):
            r = await c.post(
                log_path("alice", log) + "/records", json={"records": [record("a"), record("b")]}
            )
            assert r.status_code == 200, r.text
        r = await svc.put(
            log_path("alice", LOG1) + "/cursors/compaction", json={"offset": 2, "witness": None}
        )
        assert r.status_code == 200, r.text
    return root


# ------------------------------------------------------------------------------- item 1: scrub


def test_scrub_to_a_file_writes_only_json_lines_and_no_progress(store: Path) -> None:
    out = loghost("scrub", str(store))
    assert out.returncode == ExitCode.OK, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3  # two tenant logs and the server's dirty log
    assert all(json.loads(line)["ok"] is True for line in lines)
    # stderr is not a terminal: the summary alone, no progress bar, no escape sequence
    assert out.stderr == "scrubbed 3 log(s): 3 ok, 0 with problems\n"


def test_scrub_shows_progress_on_a_terminal_stderr_and_keeps_stdout_clean(store: Path) -> None:
    leader, follower = os.openpty()
    try:
        proc = subprocess.Popen(
            [*_cmd(), "scrub", str(store)],
            stdout=subprocess.PIPE,
            stderr=follower,
            env=_env(TERM="xterm-256color", COLUMNS="100"),
            text=True,
        )
        os.close(follower)
        stdout, _ = proc.communicate(timeout=120)
        terminal = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed its end
                break
            if not chunk:
                break
            terminal += chunk
    finally:
        os.close(leader)
    assert proc.returncode == ExitCode.OK
    assert [json.loads(line)["ok"] for line in stdout.splitlines()] == [True] * 3
    assert "\x1b" not in stdout
    # the live display ran on the terminal (it hides the cursor while it draws)
    assert b"\x1b[?25l" in terminal, terminal
    assert b"scrubbed 3 log(s): 3 ok, 0 with problems" in terminal


# ------------------------------------------------------------------------- item 4: operators


def test_gc_of_a_log_without_cursors_exits_5(store: Path) -> None:
    out = loghost("gc", str(store), f"logs/{LOG2}")
    assert out.returncode == ExitCode.NO_CURSORS == 5
    assert only_line(out) == (
        f"loghost: error: logs/{LOG2} has no cursors: nothing can be collected "
        "(set a cursor first, e.g. the compaction one)"
    )
    assert out.stdout == ""


def test_gc_of_a_missing_log_exits_4(store: Path) -> None:
    missing = str(uuid.UUID(int=505, version=4))
    out = loghost("gc", str(store), f"logs/{missing}")
    assert out.returncode == ExitCode.NOT_FOUND == 4
    assert only_line(out) == f"loghost: error: no log at 'logs/{missing}' in '{store}'"
    assert not (store / "logs" / missing).exists()


def test_inspect_of_a_missing_log_exits_4(store: Path) -> None:
    out = loghost("inspect", str(store), "logs/nothing")
    assert out.returncode == ExitCode.NOT_FOUND
    assert only_line(out) == f"loghost: error: no log at 'logs/nothing' in '{store}'"


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--store", UNSUPPORTED],
        ["scrub", UNSUPPORTED],
        ["gc", UNSUPPORTED, "logs/x"],
        ["dirty-logs", UNSUPPORTED],
        ["inspect", UNSUPPORTED, "logs/x"],
    ],
    ids=lambda a: a[0],
)
def test_an_unsupported_store_url_exits_3_in_every_command(argv: list[str]) -> None:
    out = loghost(*argv, LOGHOST_API_KEYS=KEYS)
    assert out.returncode == ExitCode.STORE_URL == 3
    assert only_line(out) == UNSUPPORTED_LINE


@pytest.mark.parametrize("command", ["dirty-logs", "scrub", "inspect", "gc"])
def test_a_mistyped_store_path_exits_4_and_creates_nothing(tmp_path: Path, command: str) -> None:
    typo = tmp_path / "stroe"
    argv = [command, str(typo)] + (["logs/x"] if command in ("inspect", "gc") else [])
    out = loghost(*argv)
    assert out.returncode == ExitCode.NOT_FOUND == 4
    assert only_line(out) == f"loghost: error: no store at '{typo}': no such directory"
    assert out.stdout == ""
    assert not typo.exists()


def test_dirty_logs_of_a_directory_that_is_no_store_exits_4_and_writes_nothing(
    tmp_path: Path,
) -> None:
    plain = tmp_path / "plain"
    plain.mkdir()
    out = loghost("dirty-logs", str(plain))
    assert out.returncode == ExitCode.NOT_FOUND
    assert only_line(out) == (
        f"loghost: error: no store at '{plain}': the directory was never opened as a store"
    )
    assert list(plain.iterdir()) == []


def test_scrub_of_an_unreachable_s3_exits_6() -> None:
    port = free_port()  # nothing listens there
    out = loghost("scrub", "s3://bucket/root", AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
    assert out.returncode == ExitCode.STORE_UNAVAILABLE == 6
    line = only_line(out)
    assert line.startswith("loghost: error: store 's3://bucket/root' unreachable: "), line
    assert "gave up after 6 attempts" in line


def test_dirty_logs_of_a_missing_bucket_exits_4(moto_endpoint: str) -> None:
    out = loghost("dirty-logs", "s3://no-such-bucket/root", AWS_ENDPOINT_URL=moto_endpoint)
    assert out.returncode == ExitCode.NOT_FOUND
    assert only_line(out) == (
        "loghost: error: no store at 's3://no-such-bucket/root': the bucket does not exist"
    )


# ---------------------------------------------------------------------------------- serve


class Served:
    """A ``loghost serve`` subprocess whose stderr goes to a file (read when needed)."""

    def __init__(self, argv: list[str], err: Path, **env: str) -> None:
        self.err = err
        self._file = open(err, "wb")  # noqa: SIM115 - closed by stop()
        self.proc = subprocess.Popen(
            [*_cmd(), "serve", *argv],
            stdout=subprocess.DEVNULL,
            stderr=self._file,
            env=_env(LOGHOST_API_KEYS=KEYS, LOGHOST_ROLLUP_INTERVAL_S="3600", **env),
        )

    def stderr_lines(self) -> list[str]:
        return self.err.read_text().splitlines()

    def logged(self, level: str) -> list[str]:
        out = []
        for line in self.stderr_lines():
            if line.startswith("{"):
                doc: dict[str, Any] = json.loads(line)
                if doc.get("level") == level:
                    out.append(str(doc["msg"]))
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=60)
        self._file.close()
        return rc


@pytest.fixture
def served(tmp_path: Path) -> Iterator[list[Served]]:
    running: list[Served] = []
    yield running
    for s in running:
        s.stop()


def _status(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def test_serve_on_a_port_in_use_exits_7_before_opening_the_store(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        store = tmp_path / "store"
        out = loghost(
            "serve", "--store", str(store), "--listen", f"127.0.0.1:{port}", LOGHOST_API_KEYS=KEYS
        )
    assert out.returncode == ExitCode.ADDRESS_IN_USE == 7
    assert only_line(out) == (
        f"loghost: error: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert not store.exists()  # the store was never opened


def test_serve_with_invalid_settings_exits_2(tmp_path: Path) -> None:
    out = loghost("serve", "--store", str(tmp_path / "s"), "--max-connections", "0")
    assert out.returncode == ExitCode.USAGE == 2
    assert only_line(out) == (
        "loghost: error: invalid configuration: max_connections: "
        "Input should be greater than or equal to 1"
    )


def test_serve_with_an_unreachable_s3_stays_up_unready_until_it_answers(
    tmp_path: Path, served: list[Served]
) -> None:
    from moto.server import ThreadedMotoServer

    s3_port, port = free_port(), free_port()
    url = f"http://127.0.0.1:{port}"
    host = Served(
        ["--store", "s3://late-bucket/root", "--listen", f"127.0.0.1:{port}", "--server-id", "u"],
        tmp_path / "serve.err",
        AWS_ENDPOINT_URL=f"http://127.0.0.1:{s3_port}",
    )
    served.append(host)
    wait_until_sync(lambda: bool(host.logged("warning")), "the unreachable-store line")
    (warning,) = host.logged("warning")
    assert warning.startswith("store 's3://late-bucket/root' unreachable: head readyz-probe: ")
    assert warning.endswith("; not ready (/readyz answers 503) until it answers, retrying")
    assert "Traceback" not in host.err.read_text()
    assert _status(url + "/healthz") == 200  # alive: no restart
    assert httpx.get(url + "/healthz").json() == {"status": "starting", "server_id": "u"}
    r = httpx.get(url + "/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "unavailable"
    assert host.proc.poll() is None

    # The bucket exists before the host can reach S3 (moto's servers in one process share
    # their state): created through a first server on another port, the host's S3 then starts.
    # Created after the host's S3 started, a probe in between would find no bucket: exit 4.
    import boto3

    setup_port = free_port()
    setup = ThreadedMotoServer(ip_address="127.0.0.1", port=setup_port, verbose=False)
    setup.start()
    try:
        boto3.client(
            "s3", endpoint_url=f"http://127.0.0.1:{setup_port}", region_name="us-east-1"
        ).create_bucket(Bucket="late-bucket")
    finally:
        setup.stop()
    s3 = ThreadedMotoServer(ip_address="127.0.0.1", port=s3_port, verbose=False)
    s3.start()
    try:
        wait_until_sync(lambda: _status(url + "/readyz") == 200, "ready once S3 answers", 60)
        assert host.stop() == ExitCode.OK
    finally:
        s3.stop()


# Liveness records rewritten twice a second: a starting twin watches 1.5 beats (0.75 s).
BEATING = {"LOGHOST_MEMBERSHIP_INTERVAL_S": "0.5", "LOGHOST_MEMBERSHIP_TTL_S": "3"}


def test_two_hosts_with_one_server_id_the_second_is_refused_with_8(
    tmp_path: Path, served: list[Served]
) -> None:
    store = str(tmp_path / "store")
    first_port, second_port = free_port(), free_port()
    first = Served(
        [
            "--store",
            store,
            "--listen",
            f"127.0.0.1:{first_port}",
            "--server-id",
            "twin",
        ],
        tmp_path / "first.err",
        **BEATING,
    )
    served.append(first)
    wait_until_sync(
        lambda: _status(f"http://127.0.0.1:{first_port}/readyz") == 200, "first host ready", 60
    )
    out = loghost(
        "serve",
        "--store",
        store,
        "--listen",
        f"127.0.0.1:{second_port}",
        "--server-id",
        "twin",
        "--log-level",
        "ERROR",
        LOGHOST_API_KEYS=KEYS,
        **BEATING,
    )
    assert out.returncode == ExitCode.DUPLICATE_SERVER_ID == 8
    assert only_line(out) == (
        f"loghost: error: server id 'twin' is in use by a live host {socket.gethostname()} "
        f"pid {first.proc.pid} listening on http://127.0.0.1:{first_port}; "
        "give each host its own --server-id (LOGHOST_SERVER_ID)"
    )
    assert _status(f"http://127.0.0.1:{first_port}/readyz") == 200  # the first one is unharmed
    # A clean stop releases the id: the next host with it starts at once.
    assert first.stop() == ExitCode.OK
    again = Served(
        ["--store", store, "--listen", f"127.0.0.1:{second_port}", "--server-id", "twin"],
        tmp_path / "again.err",
    )
    served.append(again)
    wait_until_sync(
        lambda: _status(f"http://127.0.0.1:{second_port}/readyz") == 200, "second host ready", 60
    )
    assert again.logged("warning") == []  # no wait for a live twin


# ------------------------------------------------------------------------------ item 5: help


def test_version() -> None:
    from importlib.metadata import version

    out = loghost("--version")
    assert out.returncode == 0
    assert out.stdout == f"loghost {version('loghost')}\n"


def test_help_lists_every_command_without_restructured_text() -> None:
    out = loghost("--help")
    assert out.returncode == 0
    assert "``" not in out.stdout and ":func:" not in out.stdout
    for command in ("serve", "scrub", "gc", "dirty-logs", "inspect"):
        assert f"    {command}" in out.stdout, command
    assert "Exit codes: 0 ok" in out.stdout


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    raise AssertionError("no subcommands")


def test_every_flag_has_help_text_and_a_shown_default() -> None:
    missing = []
    for name, sub in _subparsers(build_parser()).items():
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            text = action.help or ""
            if not text:
                missing.append(f"{name} {action.dest}: no help")
            elif action.option_strings and "default" not in text and "required" not in text:
                missing.append(f"{name} {action.option_strings[0]}: no default shown")
    assert missing == []
