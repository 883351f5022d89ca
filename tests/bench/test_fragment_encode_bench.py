"""The fragment-encoding benchmark's quick form runs and reports every size, both writers."""

from __future__ import annotations

import argparse

from bench import fragment_encode


def test_the_quick_form_reports_both_writers_for_every_size() -> None:
    data = fragment_encode.run(True, argparse.Namespace())
    assert [r["records"] for r in data["rows"]] == list(fragment_encode.SIZES)
    for r in data["rows"]:
        assert r["direct_us"] > 0 and r["pyarrow_us"] > 0 and len(r["ratios"]) == 3
        assert r["ratio"] == sorted(r["ratios"])[1]
    text = fragment_encode.render(data)
    assert "pyarrow / direct" in text and "| 256 " in text
