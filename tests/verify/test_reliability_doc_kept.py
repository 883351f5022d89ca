"""``--write-doc`` regenerates the harness's part of docs/RELIABILITY.md and keeps the rest."""

from __future__ import annotations

from verify.reliability.run import KEEP_MARKER, ROOT, _kept_part


def test_the_hand_written_sections_survive_a_rewrite() -> None:
    text = "generated\n" + KEEP_MARKER + " ... -->\n## Deterministic simulation\nkept\n"
    assert _kept_part(text).lstrip("\n").startswith(KEEP_MARKER)
    assert "kept" in _kept_part(text) and "generated" not in _kept_part(text)
    assert _kept_part("no marker here") == ""
    doc = (ROOT / "docs" / "RELIABILITY.md").read_text()
    assert "## Deterministic simulation" in _kept_part(doc)
