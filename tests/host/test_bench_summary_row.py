"""``python -m bench --report --write-docs`` writes the roll-up's summary row of
docs/PERFORMANCE.md (the line marked ``<!-- bench-row:rollup -->``), not a hand."""

from __future__ import annotations

from pathlib import Path

import pytest

import bench.__main__ as bench_main

MARK = "<!-- bench-row:rollup -->"


def test_the_performance_summary_has_one_generated_rollup_row() -> None:
    lines = [x for x in bench_main.DOCS.read_text().splitlines() if MARK in x]
    assert len(lines) == 1 and lines[0].startswith("| "), lines


def test_write_docs_replaces_the_marked_row_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docs = tmp_path / "PERFORMANCE.md"
    docs.write_text(
        "| target | measured | verdict |\n"
        "| :-- | :-- | :-- |\n"
        "| other | 1 | met |\n"
        f"| roll-up | old figures | old {MARK} |\n"
        "| last | 2 | met |\n"
    )
    monkeypatch.setattr(bench_main, "DOCS", docs)
    row = rf"| roll-up | 1.13 % \d | **met** {MARK} |"
    bench_main._write_docs({}, {"rollup": row})
    assert docs.read_text().splitlines()[2:] == ["| other | 1 | met |", row, "| last | 2 | met |"]
    with pytest.raises(ValueError):
        bench_main._write_docs({}, {"rollup": "| no marker |"})
