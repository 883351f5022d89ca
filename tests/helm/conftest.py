"""The chart, loaded once per test module (helm-python-sdk: Helm's Go SDK, no helm binary)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import pytest

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "loghost"


@pytest.fixture(scope="module")
def chart() -> Iterator[Any]:
    with helm.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded
