"""The quick form of every reliability scenario (verify/reliability/), seeded and bounded.

Each runs real parts (uvicorn hosts in-process or as processes, redis-server, the compactor
under Spark) against a seeded fault schedule and asserts the verifier's verdict: nothing
acknowledged lost, nothing duplicated, every log scrubbed clean, no other violation, and the
scheduled faults really happened.  A failing scenario prints its violations; rerun it with
``python -m verify.reliability --quick --scenario NAME --seed SEED``.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from verify.reliability.run import run_isolated
from verify.reliability.scenarios import SCENARIOS
from verify.testkit import redis_executable

SEED = 1

# The scenarios run as three files, so that pytest-xdist (--dist loadfile) puts them on both
# workers: the in-process store scenarios here, the host-process ones and the compactor ones in
# test_reliability_quick_processes.py and test_reliability_quick_compactor.py.
PROCESSES = ("kill9", "two_hosts", "redis_restart")
COMPACTOR = ("compactor_kill", "compaction_invariants", "soak")


def params(names: Iterable[str]) -> list[Any]:
    # Every scenario takes 14-130 s (the compactor's start Spark twice, ~15 s each): part of the
    # suite, marked slow (so their files run first, tests/conftest.py).  Every scenario has its
    # own time limit in the harness (verify.reliability.run.time_limit: 180 s quick, 600 s for
    # the compactor's, 910 s for the soak; a hang is reported with the stacks): pytest's must not
    # cut it first (the compactor's took 119 s on CI, over 300 s on a loaded machine).
    return [
        pytest.param(
            name,
            marks=[pytest.mark.slow, pytest.mark.timeout(1000 if name in COMPACTOR else 600)],
        )
        for name in names
    ]


async def check_scenario(name: str, tmp_path: Path) -> None:
    """Run one scenario's quick form and assert the verifier's verdict."""
    if name == "redis_restart" and redis_executable() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    r = await run_isolated(name, SEED, True, tmp_path / name)
    print(r.line())
    detail = "\n".join([r.line(), *r.violations[:20], f"notes: {r.notes}"])
    assert r.error is None, detail
    assert r.acknowledged > 0 and r.read >= r.acknowledged, detail
    assert r.lost == 0, detail
    assert r.duplicated == 0, detail
    assert r.scrub_ok, detail
    assert not r.violations, detail
    assert r.faults > 0, f"the scheduled faults never happened\n{detail}"


def test_every_scenario_is_in_one_of_the_three_files() -> None:
    assert set(PROCESSES) | set(COMPACTOR) <= set(SCENARIOS)


@pytest.mark.parametrize(
    "name", params(n for n in SCENARIOS if n not in PROCESSES and n not in COMPACTOR)
)
async def test_quick_scenario(name: str, tmp_path: Path) -> None:
    await check_scenario(name, tmp_path)
