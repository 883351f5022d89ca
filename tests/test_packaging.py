"""The bare install is the client only (issue 22, item 8): ``pip install loghost`` with no extras,
into a fresh venv, from the package index this machine is configured with, brings httpx and
pydantic and none of pyspark, fastapi, uvicorn, redis, pyarrow; and examples/log_app.py runs
there against a real log host (started from this venv, on 127.0.0.1).

Nothing here skips: without the package index, the install fails and so does the test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.host.live import spawn_server

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "log_app.py"
# What a bare install must not bring (the extras' dependencies, the heavy ones first).
ABSENT = ["pyspark", "pandas", "pyarrow", "numpy", "fastapi", "starlette", "uvicorn", "redis"]
ABSENT += ["aioboto3", "botocore", "pydantic_settings", "prometheus_client", "rich"]


def dist_name(requirement: str) -> str:
    """The distribution a requirement names (``"pyspark[connect]>=4.0,<5"`` -> ``pyspark``)."""
    m = re.match(r"[A-Za-z0-9_.-]+", requirement)
    assert m, requirement
    return m.group(0).lower()


def pyproject() -> dict[str, object]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_the_bare_dependencies_are_the_client_s_and_the_extras_name_the_rest() -> None:
    project = pyproject()["project"]
    assert isinstance(project, dict)
    assert sorted(dist_name(d) for d in project["dependencies"]) == ["httpx", "pydantic"]
    extras = project["optional-dependencies"]
    assert {"server", "compactor", "reader", "dev", "bench"} <= set(extras)
    assert any(d.startswith("pyspark") for d in extras["compactor"])
    assert not any(d.startswith(("pyspark", "pandas")) for d in extras["server"])
    for name in ("fastapi", "uvicorn", "redis"):
        assert any(d.startswith(name) for d in extras["server"]), name
    assert project["license"] == "Apache-2.0"
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
    # The Makefile installs what the suite and `make run` need.
    assert "-e '.[server,compactor,dev,bench]'" in (ROOT / "Makefile").read_text()


def source_copy(dest: Path) -> Path:
    """The files a build of the project reads (as helm/image/Dockerfile.dockerignore keeps them):
    pyproject.toml, README.md, LICENSE and the packages, so the build writes nothing here."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, dest / name)
    junk = shutil.ignore_patterns("__pycache__", "*.pyc")
    for pkg in ("wal3", "host", "dirtylog", "compactor_client"):
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=junk)
    return dest


def run(cmd: list[str], *, timeout: float, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, (
        f"{cmd}: {proc.returncode}\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}"
    )
    return proc


CHECK = """
import importlib.metadata, importlib.util, json, sys
import compactor_client
from compactor_client import LogHostClient, Record
from compactor_client.client import LogHostClient as Direct
import compactor_client.errors, compactor_client.models
assert LogHostClient is Direct and Record.__module__ == "compactor_client.models"
absent = %r
print(json.dumps({
    "file": compactor_client.__file__,
    "importable": [m for m in absent if importlib.util.find_spec(m) is not None],
    "loaded": sorted(m for m in sys.modules if m.split(".")[0] in absent),
    "requires": importlib.metadata.requires("loghost"),
    "dists": sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions()),
}))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_bare_install_runs_the_example_without_spark(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], timeout=120, cwd=tmp_path)
    python = str(venv / "bin" / "python")
    src = source_copy(tmp_path / "src")
    # A real install, dependencies and all, from the configured index (no --no-deps, no extras).
    run([python, "-m", "pip", "install", "-q", str(src)], timeout=400, cwd=tmp_path)

    got = json.loads(run([python, "-c", CHECK % ABSENT], timeout=60, cwd=tmp_path).stdout)
    assert Path(got["file"]).is_relative_to(venv), got["file"]  # the installed copy
    assert got["importable"] == [], "a bare install brings the extras' packages"
    assert got["loaded"] == []
    bare = sorted(dist_name(r) for r in got["requires"] if "extra ==" not in r)
    assert bare == ["httpx", "pydantic"]
    assert {"loghost", "httpx", "pydantic"} <= set(got["dists"])
    assert not {"pyspark", "fastapi", "uvicorn", "redis", "pyarrow"} & set(got["dists"])
    # The server's command says what it needs, in one line, instead of a traceback.
    cmd = subprocess.run(
        [str(venv / "bin" / "loghost"), "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert cmd.returncode == 2 and cmd.stdout == "", cmd
    assert cmd.stderr.startswith("loghost: error: the server is not installed (no module ")
    assert cmd.stderr.rstrip().endswith("pip install 'loghost[server]'")
    assert len(cmd.stderr.splitlines()) == 1, cmd.stderr

    # The example app, in that venv, against a real host on 127.0.0.1.
    store = tmp_path / "store"
    host = spawn_server(str(store), tmp_path, server_id="pkg")
    try:
        proc = run(
            [
                python,
                str(EXAMPLE),
                "--url",
                host.url,
                "--api-key",
                "alice-key",
                "--tenant",
                "alice",
                "--store",
                str(store),
                "--json",
            ],
            timeout=120,
            cwd=tmp_path,
        )
    finally:
        assert host.terminate() == 0
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["first_offset"] == 1 and summary["next_offset"] == 7
    assert summary["tailed"] == [1, 2, 3, 4, 5, 6]
    assert summary["compaction_offset"] == 1
    # Reading the compacted state needs pyarrow, which the bare install does not have.
    assert summary["compacted"] == {
        "available": False,
        "why": "needs pip install 'loghost[reader]' (pyarrow)",
    }
