"""README.md's settings table is the settings object's, the shutdown grace is one value, and the
status-code list names every code (issue 22, item 5)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from host import settings_doc
from host.api import uvicorn_config
from host.config import Settings, env_name
from host.errors import ANSWERS

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
CHART_DIR = REPO / "helm" / "loghost"


def readme_rows() -> dict[str, tuple[str, str]]:
    """``variable -> (default, meaning)`` read off README.md's table (not via the generator)."""
    text = README.read_text(encoding="utf-8")
    body = text.split(settings_doc.BEGIN, 1)[1].split(settings_doc.END, 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in body.strip().splitlines()[2:]:  # after the header and the rule
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, line
        var = cells[0].strip("`")
        assert var not in rows, f"{var} twice"
        rows[var] = (cells[1], cells[2])
    return rows


def test_readme_table_is_the_generated_one() -> None:
    text = README.read_text(encoding="utf-8")
    assert settings_doc.current(text) == settings_doc.table(), (
        "README.md's settings table is out of date: run python -m host.settings_doc --write"
    )
    assert settings_doc.main(["--check"]) == 0


def test_readme_lists_every_setting_once_with_its_description_and_default() -> None:
    rows = readme_rows()
    fields = Settings.model_fields
    assert list(rows) == [env_name(n) for n in fields]
    assert len(rows) >= 40
    for name, field in fields.items():
        default, meaning = rows[env_name(name)]
        assert meaning == field.description, name
        value = field.get_default(call_default_factory=False)
        if isinstance(value, float) and value.is_integer():
            assert default == str(int(value)), name
        elif isinstance(value, int) and not isinstance(value, bool) and value < 100_000:
            assert default == str(value), name
    assert rows["LOGHOST_MAX_BUFFERED_BYTES"][0] == "256 MiB"
    assert rows["LOGHOST_BACKPRESSURE_UNCOMPACTED_RECORDS"][0] == "1,000,000"
    assert rows["LOGHOST_SERVER_ID"][0] == "hostname"
    assert rows["LOGHOST_STORE"][0] == "`./data/loghost`"


def test_check_fails_on_a_stale_table_and_write_fixes_it(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    text = README.read_text(encoding="utf-8")
    stale = text.replace(f"| `{env_name('max_wait_ms')}` |", "| `LOGHOST_MAX_WAIT_MSX` |")
    assert stale != text
    readme.write_text(stale, encoding="utf-8")
    assert settings_doc.main(["--check", "--readme", str(readme)]) == 1
    assert settings_doc.main(["--write", "--readme", str(readme)]) == 0
    assert readme.read_text(encoding="utf-8") == text
    assert settings_doc.main(["--check", "--readme", str(readme)]) == 0


def test_a_readme_without_markers_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="settings-table"):
        settings_doc.updated("# README\n\nno table here\n")


def test_every_error_code_is_in_the_status_code_list() -> None:
    text = " ".join(README.read_text(encoding="utf-8").split())
    start = text.index("Status codes:")
    listing = text[start : text.index("for anything else", start)]
    codes = {a.code for a in ANSWERS.values()}
    assert "no_cursors" in codes
    missing = sorted(c for c in codes if f"`{c}`" not in listing)
    assert missing == []
    for answer in ANSWERS.values():
        assert re.search(rf"\b{answer.status}\b", listing), answer


# --- the shutdown grace: one value ------------------------------------------------------


def test_the_chart_and_uvicorn_use_the_servers_shutdown_grace() -> None:
    default = Settings.model_fields["shutdown_grace_s"].default
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["host"]["config"]["shutdownGraceS"] == default
    assert uvicorn_config(object(), Settings()).timeout_graceful_shutdown == int(default)
    assert readme_rows()["LOGHOST_SHUTDOWN_GRACE_S"][0] == str(int(default))


def _render(values: dict[str, Any]) -> Any:
    helm = pytest.importorskip("helm_python")
    with helm.Chart.load(str(CHART_DIR)) as chart:
        return chart.render(
            {"store": {"url": "s3://acme-wal/loghost"}, **values}, name="loghost", namespace="logs"
        )


def test_a_null_chart_grace_is_checked_as_the_servers_default() -> None:
    """With ``shutdownGraceS: null`` the server drains for its default; the chart's termination
    check must count that, not 0."""
    import helm_python as helm

    default = int(Settings.model_fields["shutdown_grace_s"].default)
    host: dict[str, Any] = {"config": {"shutdownGraceS": None}, "preStopDelaySeconds": 5}
    with pytest.raises(helm.HelmRenderError, match=rf"\({5 + default}\)"):
        _render({"host": {**host, "terminationGracePeriodSeconds": 5 + default}})
    _render({"host": {**host, "terminationGracePeriodSeconds": 5 + default + 1}})
