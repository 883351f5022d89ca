"""The quick form of the reliability scenarios with the compactor under Spark, and the soak (the others, and the
verdict every scenario must meet: test_reliability_quick.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verify.test_reliability_quick import COMPACTOR, check_scenario, params


@pytest.mark.parametrize("name", params(COMPACTOR))
async def test_quick_scenario(name: str, tmp_path: Path) -> None:
    await check_scenario(name, tmp_path)
