"""kill -9 of a real ``compactor run --once`` process at every step of a round, merges included.

Each round appends as many records as the collection's top level holds, so every round merges
levels (ratio 10: two runs of similar size break it).  The compactor is started as the leader of
its own session with ``COMPACTOR_CRASH_AT=<point>`` (``compactor_client.crashpoints``), so the
point SIGKILLs its whole process group exactly there: after an executor wrote a merge's output,
after it wrote every run, before and after the ``CURRENT.json`` put, after the cursor moved, in
the middle of a prune.

A round of 60 records folds in the driver (``--driver-fold-below``), with the functions a Spark
executor runs, so the rounds run with ``--engine local``: the same code, without a JVM that only
starts and stops (its start was nine tenths of this test's time).  The merge's kill runs twice:
there, and once more on Spark (``local[1]``, ``--driver-fold-below 0``), where the point is
reached in a PySpark worker and kills the whole session: driver, JVM and Python workers (whose
daemon has a process group of its own; killing only that group would leave the round running).

After every kill: ``CURRENT.json`` parses and every run it lists exists, the reader's state is the
oracle's fold of the log below its offset, and the cursor is not ahead of it.  At the end a clean
round completes: cursor at the tail, the oracle's whole state, and every orphan of the killed
rounds pruned (grace 0).
"""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from compactor_client.crashpoints import POINTS, VARIABLE
from compactor_client.fold import fold
from compactor_client.reader import read_state
from compactor_client.versions import read_current
from wal3.localstore import LocalStore

from .kit import Log, Served, make_host_app, normalise, random_records, state_view

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]
CID = "crashy"
MERGED = "fold:merged"  # the point the Spark round is killed at


def compactor(
    host: str, store: Path, crash_at: str | None, *, spark: bool = False
) -> subprocess.CompletedProcess[bytes]:
    """One ``compactor run --once``; ``spark``: the round's fold is a Spark job (else: in this
    process, as every round this small folds by default)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTOR_")}
    env.update(COMPACTOR_API_KEY="k", PYTHONPATH=str(ROOT))
    if crash_at is not None:
        env[VARIABLE] = crash_at
    engine = (
        ["--spark-master", "local[1]", "--driver-fold-below", "0"]
        if spark
        else ["--engine", "local"]
    )
    cmd = [
        sys.executable,
        "-m",
        "compactor_client",
        "run",
        "--hosts",
        host,
        "--store",
        str(store),
        *engine,
        "--once",
        "--member-id",
        "c1",
        "--no-progress",
        "--keep-versions",
        "1",
        "--prune-grace-s",
        "0",
    ]
    # A session of its own: the crash point kills this process group, never the test's.
    return subprocess.run(
        cmd, env=env, cwd=ROOT, capture_output=True, timeout=600, start_new_session=True
    )


async def check(store: LocalStore, log: Log, cursors: dict[str, int]) -> int:
    """The invariants after a kill; returns the installed version (0: none)."""
    cur = await read_current(store, CID)
    if cur is None:
        assert cursors.get(CID, 1) == 1
        return 0
    for r in cur.runs:
        assert (await store.get(r.key)).data, f"{r.key} listed but missing"
    assert cursors.get(CID, 1) <= cur.offset, "the cursor is ahead of its data"
    state = await read_state(store, CID)
    assert state_view(state.table) == normalise(fold({}, log.records[: cur.offset - 1]))
    return cur.version


def _age(folder: Path, seconds: float) -> None:
    """Set every file under ``folder`` (a LocalStore's objects) ``seconds`` further back."""
    for f in folder.rglob("*"):
        if f.is_file():
            st = f.stat()
            os.utime(f, (st.st_atime - seconds, st.st_mtime - seconds))


async def test_kill_9_at_every_step_of_a_round_merges_included(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LocalStore(root)
    rng = random.Random(15)
    log = Log(store, CID)
    cursors: dict[str, int] = {}
    calls: list[tuple[str, int]] = []
    with Served(make_host_app({CID: log}, [CID], cursors, calls)) as host:
        await log.append_fragment(random_records(rng, 60, ids=10_000))
        done = await asyncio.to_thread(compactor, host.url, root, None)
        assert done.returncode == 0, done.stderr[-3000:]
        assert await check(store, log, cursors) == 1
        killed: dict[str, int] = {}
        for point in POINTS:
            await log.append_fragment(random_records(rng, 60, ids=10_000))
            done = await asyncio.to_thread(compactor, host.url, root, point)
            killed[point] = done.returncode
            await check(store, log, cursors)
        # A merge's output written by a Spark executor (a PySpark worker).
        await log.append_fragment(random_records(rng, 60, ids=10_000))
        done = await asyncio.to_thread(compactor, host.url, root, MERGED, spark=True)
        killed["spark " + MERGED] = done.returncode
        await check(store, log, cursors)
        # Every point was reached, and killed the compactor there (SIGKILL: -9).
        assert killed == dict.fromkeys([*POINTS, "spark " + MERGED], -9), killed
        # A clean round (prunes follow installs: what the killed prune left goes now).  Every
        # object so far is dated 10 s back first: a prune judges ages by whole-second
        # Last-Modified times plus one second of slack, so an orphan the last killed round wrote
        # less than 2 s before the clean round's own writes would stay by the clock alone (the
        # suite failed so once), not by any rule this test checks.
        _age(root / "compacted", 10.0)
        await log.append_fragment(random_records(rng, 60, ids=10_000))
        done = await asyncio.to_thread(compactor, host.url, root, None)
        assert done.returncode == 0, done.stderr[-3000:]
    await check(store, log, cursors)
    cur = await read_current(store, CID)
    assert cur is not None and cur.offset == log.end == cursors[CID]
    # Orphans of the killed rounds (runs written, never installed) were pruned; what is left is
    # the current version's runs and those it retired just now (their grace, 0 s, is counted on
    # whole-second Last-Modified times: they go after the next install).
    files = {m.key async for m in store.list(f"compacted/{CID}/") if m.key.endswith(".parquet")}
    assert files <= {r.key for r in cur.runs} | {k for k, u in cur.retired if u == cur.version - 1}
