"""``compactor run``'s failures: one ``compactor: error:`` line and a distinct exit code, never a
traceback (issue 22, items 4 and 5).  Real subprocesses of the command against a real log host."""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import sys
from pathlib import Path

import pytest

from compactor_client.cli import build_parser
from tests.host.live import live_server

WRONG_KEY_LINE = (
    "compactor: error: the host {url} rejected the API key ({status}: {what}); "
    "give a service key (key=*) in --api-key or COMPACTOR_API_KEY[_FILE]"
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    # No Java: a Spark JVM started before the key check would fail differently (not exit 9).
    env["JAVA_HOME"] = "/nonexistent-java"
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if not (Path(p) / "java").exists()
    )
    env.update(extra)
    return env


async def compactor(*args: str, **env: str) -> tuple[int, str, str]:
    """Run ``python -m compactor_client`` to its end: (exit code, stdout, stderr)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "compactor_client",
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=_env(**env),
    )
    out, err = await asyncio.wait_for(proc.communicate(), 300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def only_error_line(stderr: str) -> str:
    """The one ``compactor: error:`` line (log lines may precede it), and no traceback."""
    assert "Traceback" not in stderr, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("compactor: error:")]
    assert len(lines) == 1, stderr
    return lines[0]


async def test_an_unsupported_store_url_exits_3() -> None:
    rc, _, err = await compactor(
        "run", "--hosts", "http://127.0.0.1:1", "--api-key", "k", "--store", "ftp://b/x"
    )
    assert rc == 3
    assert only_error_line(err) == (
        "compactor: error: unsupported store URL scheme 'ftp' in 'ftp://b/x': "
        "use a directory path, file:///dir or s3://bucket/prefix"
    )


@pytest.mark.parametrize(
    ("key", "status", "what"),
    [
        ("no-such-key", "401 unauthorized", "unknown"),
        ("alice-key", "403 forbidden", "not a service key"),
    ],
)
async def test_a_rejected_key_exits_9_before_spark_starts(
    tmp_path: Path, key: str, status: str, what: str
) -> None:
    async with live_server(str(tmp_path / "store")) as lv:
        rc, _, err = await compactor(
            "run",
            "--once",
            "--hosts",
            lv.url,
            "--store",
            str(tmp_path / "store"),
            "--spark-master",
            "local[1]",
            COMPACTOR_API_KEY=key,
        )
    assert rc == 9
    assert only_error_line(err) == WRONG_KEY_LINE.format(url=lv.url, status=status, what=what)
    assert "Java" not in err and "JAVA_HOME" not in err  # no JVM was attempted


async def test_a_metrics_address_in_use_exits_7(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        rc, _, err = await compactor(
            "run",
            "--once",
            "--hosts",
            "http://127.0.0.1:1",
            "--api-key",
            "k",
            "--store",
            str(tmp_path / "store"),
            "--metrics-listen",
            f"127.0.0.1:{port}",
        )
    assert rc == 7
    assert only_error_line(err) == (
        f"compactor: error: cannot listen on 127.0.0.1:{port}: address already in use"
    )
    assert not (tmp_path / "store").exists()  # before the store was opened


async def test_missing_settings_exit_2() -> None:
    rc, _, err = await compactor("run", "--hosts", "http://127.0.0.1:1")
    assert rc == 2
    assert err.splitlines()[-1] == (
        "compactor: error: missing --api-key, --store (or their COMPACTOR_* variables)"
    )


async def test_version_and_help() -> None:
    from importlib.metadata import version

    rc, out, _ = await compactor("--version")
    assert rc == 0 and out == f"compactor {version('loghost')}\n"
    rc, out, _ = await compactor("--help")
    assert rc == 0 and "``" not in out and "Exit codes: 0 ok" in out


def test_every_flag_has_help_text_and_a_shown_default() -> None:
    parser = build_parser()
    (subs,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    missing = []
    for action in subs.choices["run"]._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = action.help or ""
        # defaults are shown after the variable: [COMPACTOR_X; default]
        if not text or "[" not in text or not ("; " in text or text.startswith("show progress")):
            missing.append(action.option_strings[0])
    assert missing == []
