"""verify.mutation's table in docs/RELIABILITY.md: a run on a fresh checkout (bench/out holds only
its own modules) replaces its own rows and keeps every other module's recorded row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from verify import mutation


def _result(module: str, killed: int, survived: int) -> dict[str, Any]:
    total = killed + survived
    return {
        "module": module,
        "commit": "abc1234",
        "total": total,
        "killed": killed,
        "timeout": 0,
        "survived": survived,
        "no_tests": 0,
        "score": killed / total,
        "tests": ["tests/wal3", "tests/verify/test_sim.py"],
        "seconds": 90.0,
    }


def test_the_real_document_parses_row_for_row() -> None:
    text = mutation.DOC.read_text(encoding="utf-8")
    rows = mutation.recorded_rows(text)
    block = text[text.index(mutation.BEGIN) : text.index(mutation.END)]
    assert len(rows) == block.count("\n| `")
    assert mutation.table(rows) in block  # parsing and rendering are inverses


def test_a_run_keeps_other_modules_rows_and_replaces_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    doc = tmp_path / "RELIABILITY.md"
    before = [_result("a/one.py", 9, 1), _result("b/two.py", 5, 5)]
    doc.write_text(
        f"# title\n\n{mutation.BEGIN}\nheader\n\n{mutation.table(before)}\n{mutation.END}\ntail\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(mutation, "DOC", doc)
    mutation.write_docs([_result("b/two.py", 10, 0), _result("c/three.py", 3, 0)])
    rows = {r["module"]: r for r in mutation.recorded_rows(doc.read_text(encoding="utf-8"))}
    assert sorted(rows) == ["a/one.py", "b/two.py", "c/three.py"]
    assert (rows["a/one.py"]["killed"], rows["a/one.py"]["survived"]) == (9, 1)
    assert (rows["b/two.py"]["killed"], rows["b/two.py"]["survived"]) == (10, 0)
    assert doc.read_text(encoding="utf-8").endswith("tail\n")


def test_only_a_worktree_with_mutants_and_its_configuration_is_resumed(tmp_path: Path) -> None:
    """``--resume`` goes on only where mutmut left results under this tool's configuration; a
    half-made worktree (no mutants yet, or not configured) starts afresh."""
    work = tmp_path / "wal3_gc_py"
    work.mkdir()
    assert not mutation.resumable(work)
    (work / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    (work / "mutants").mkdir()
    assert not mutation.resumable(work)  # mutants, but not this tool's run
    (work / "pyproject.toml").write_text(mutation._config("wal3/gc.py", ["tests/wal3"]))
    assert mutation.resumable(work)
    (work / "mutants").rmdir()
    assert not mutation.resumable(work)
