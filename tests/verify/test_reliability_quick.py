"""The quick form of every reliability scenario (verify/reliability/), seeded and bounded.

Each runs real parts (uvicorn hosts in-process or as processes, redis-server, the compactor
under Spark) against a seeded fault schedule and asserts the verifier's verdict: nothing
acknowledged lost, nothing duplicated, every log scrubbed clean, no other violation, and the
scheduled faults really happened.  A failing scenario prints its violations; rerun it with
``python -m verify.reliability --quick --scenario NAME --seed SEED``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from verify.reliability.run import run_isolated
from verify.reliability.scenarios import SCENARIOS
from verify.testkit import redis_executable

SEED = 1

# The compactor scenario starts Spark twice (~15 s each): part of the suite, marked slow.
PARAMS = [
    pytest.param(
        name,
        marks=[pytest.mark.slow]
        if name in ("compactor_kill", "compaction_invariants", "soak")
        else [],
    )
    for name in SCENARIOS
]


@pytest.mark.parametrize("name", PARAMS)
async def test_quick_scenario(name: str, tmp_path: Path) -> None:
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
