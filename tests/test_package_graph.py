"""The packages' dependency graph (issue 18): wal3 depends on none of the others, nothing
depends on the server package but the server itself (its tests, the harness and the benchmarks
drive it from outside), and nothing outside tests/ imports from it (what the tests share with
the harness and the benchmarks is in verify/testkit)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> top-level modules it must never import
FORBIDDEN: dict[str, set[str]] = {
    "wal3": {
        "host",
        "dirtylog",
        "compactor_client",
        "fastapi",
        "starlette",
        "uvicorn",
        "redis",
        "pyspark",
        "verify",
        "tests",
        "bench",
    },
    "dirtylog": {"host", "compactor_client", "fastapi", "redis", "pyspark", "verify", "tests"},
    "compactor_client": {"host", "dirtylog", "verify", "tests", "bench"},
    "host": {"compactor_client", "verify", "tests", "bench"},
    "verify": {"tests", "bench"},
    "bench": {"tests"},
}


def imported_tops(path: Path) -> set[str]:
    """The top-level names a module imports (absolute imports only; relative ones stay inside)."""
    tops: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            tops.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_it_may(package: str) -> None:
    files = sorted((ROOT / package).rglob("*.py"))
    assert files, package
    bad = {str(f.relative_to(ROOT)): sorted(imported_tops(f) & FORBIDDEN[package]) for f in files}
    assert not {f: b for f, b in bad.items() if b}


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    mod = tmp_path / "m.py"
    mod.write_text("from host.api import create_app\nimport redis.asyncio\nfrom .x import y\n")
    assert imported_tops(mod) == {"host", "redis"}
