"""The quick form of the reliability scenarios with real host processes: kill -9 and restart, two hosts racing, Redis restarted empty (the others, and the
verdict every scenario must meet: test_reliability_quick.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.verify.test_reliability_quick import PROCESSES, check_scenario, params


@pytest.mark.parametrize("name", params(PROCESSES))
async def test_quick_scenario(name: str, tmp_path: Path) -> None:
    await check_scenario(name, tmp_path)
