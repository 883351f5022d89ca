"""What ran where: the command line and the machine a report was made on."""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def command_line() -> str:
    """The exact command that started this process (what a reader types to reproduce a table)."""
    argv = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    with contextlib.suppress(ValueError):
        exe = Path(argv[0])
        if exe.is_absolute() and exe.is_relative_to(ROOT):
            argv[0] = str(exe.relative_to(ROOT))
    return shlex.join(argv)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(
            cmd, capture_output=True, text=True, check=False, cwd=ROOT
        ).stdout.strip()
    except OSError:
        return ""


def machine_info() -> dict[str, Any]:
    """The facts a reader needs to judge a number: cores, kernel, Python, date, load, commit."""
    return {
        "nproc": _run(["nproc"]) or str(os.cpu_count()),
        "uname": _run(["uname", "-a"]) or " ".join(platform.uname()),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "date_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "loadavg_at_start": list(os.getloadavg()),
        "git_head": _run(["git", "rev-parse", "--short", "HEAD"]),
    }
