"""The leveled compacted layout through the pipeline's own plan, install and prune code, folding in
this process (``CompactionPipeline(spark=None)``: the same executor functions, no Spark).

Invariants checked after every round: ``CURRENT.json`` parses and every run it lists exists;
the reader's state equals the oracle's fold of the log below ``offset``; the compaction cursor is
never ahead of ``offset``; at most one run per level and adjacent levels keep their size ratio.
Then the adversary's cases: an old single-version pointer migrating, a merge racing a prune, a
reader during a merge and a prune, a round retried after a crash between runs and pointer.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

import pytest

from compactor_client import versions
from compactor_client.fold import fold
from compactor_client.parquet_io import rows_to_table, write_version
from compactor_client.pipeline import CompactionPipeline
from compactor_client.reader import read_state
from compactor_client.versions import current_key, read_current
from wal3.errors import ObjectNotFound
from wal3.localstore import LocalStore
from wal3.paths import data_key

from .kit import HOST, FakeLogApi, Log, candidate, normalise, random_records, state_view

CID = "leveled"


async def check(store: LocalStore, log: Log, api: FakeLogApi, *, ratio: float = 10.0) -> Any:
    """The invariants of the module docstring; returns the current pointer."""
    cur = await read_current(store, log.cid)
    assert cur is not None
    for r in cur.runs:
        assert (await store.get(r.key)).data, r.key
    assert api.cursors.get(log.cid, 1) <= cur.offset
    state = await read_state(store, log.cid)
    assert state.version == cur.version
    assert state_view(state.table) == normalise(fold({}, log.records[: cur.offset - 1]))
    sizes = [r.bytes for r in cur.runs]
    assert all(b is not None for b in sizes)
    assert all(sizes[i] * ratio <= sizes[i + 1] for i in range(len(sizes) - 1)), sizes  # type: ignore[operator]
    return cur


def age_everything(root: Path, seconds: float) -> None:
    """Make ``seconds`` pass for the store: every object's Last-Modified (its mtime here), and
    the store times CURRENT.json records of earlier installs, move that far into the past."""
    for cur in root.rglob("CURRENT.json"):
        doc = json.loads(cur.read_text())
        for h in doc.get("history") or ():
            for k in ("installed_at", "stored_at"):
                if k in h:
                    h[k] -= seconds
        cur.write_text(json.dumps(doc))
    for f in root.rglob("*"):
        if f.is_file():
            st = f.stat()
            os.utime(f, (st.st_atime - seconds, st.st_mtime - seconds))


async def test_rounds_build_levels_that_keep_their_ratio_and_the_oracles_state(
    tmp_path: Path,
) -> None:
    store = LocalStore(tmp_path / "s")
    rng = random.Random(1)
    log = Log(store, CID)
    api = FakeLogApi({CID: log})
    pipe = CompactionPipeline(None, store, {HOST: api}, ratio=3.0, prune_grace_s=0.0)
    seen_levels, merges = set(), 0
    for n in range(14):
        await log.append_fragment(random_records(rng, rng.choice([5, 20, 60]), ids=200))
        res = await pipe.run_round([candidate(log, api.cursors.get(CID, 1))])
        assert [o.status for o in res.outcomes] == ["compacted"], res.outcomes
        cur = await check(store, log, api, ratio=3.0)
        assert res.outcomes[0].levels == cur.levels
        seen_levels.add(cur.levels)
        merges += res.merges
        if n % 4 == 3:
            age_everything(tmp_path / "s", 10)
    assert max(seen_levels) >= 2 and merges >= 3  # levels were built and merged
    # Nothing but what a kept version lists, or a retired run still within the kept window,
    # stays after prunes with no grace: every other file of 14 rounds went.
    age_everything(tmp_path / "s", 10)
    await log.append_fragment(random_records(rng, 1, ids=200))
    await pipe.run_round([candidate(log, api.cursors[CID])])
    cur = await read_current(store, CID)
    assert cur is not None
    files = {m.key async for m in store.list(f"compacted/{CID}/") if m.key.endswith(".parquet")}
    kept = {r.key for r in cur.runs} | {k for k, u in cur.retired if u >= cur.version - 1}
    assert files <= kept, files - kept


async def test_a_single_version_pointer_migrates_and_its_file_is_pruned_only_when_retired(
    tmp_path: Path,
) -> None:
    """An old compactor's version (format 1, one part file) reads as the bottom run; the next
    rounds list it until a merge retires it, and only then (past keep and grace) is it deleted."""
    store = LocalStore(tmp_path / "s")
    rng = random.Random(2)
    log = Log(store, CID)
    await log.append_fragment(random_records(rng, 800, ids=1000))
    old_rows = fold({}, log.records)
    key = data_key(CID, 1, "old")
    write_version(store.url_for(key), rows_to_table(old_rows.values()))
    legacy = {"version": 1, "offset": log.end, "rows": len(old_rows), "path": key}
    await store.put(current_key(CID), versions._encode(legacy), if_none_match="*")
    api = FakeLogApi({CID: log}, {CID: log.end})

    pipe = CompactionPipeline(None, store, {HOST: api}, ratio=10.0, prune_grace_s=0.0)
    await log.append_fragment(random_records(rng, 3, ids=1000))
    age_everything(tmp_path / "s", 10)
    await pipe.run_round([candidate(log, log.end - 3)])
    cur = await check(store, log, api)
    assert cur.format == 2 and [r.key for r in cur.runs][-1] == key  # still the bottom run
    assert cur.runs[-1].bytes is not None  # sized from its footer on the way

    # A big round: a merge into the bottom retires the old file; keep=2 keeps it one more install.
    await log.append_fragment(random_records(rng, 600, ids=1000))
    age_everything(tmp_path / "s", 10)
    await pipe.run_round([candidate(log, api.cursors[CID])])
    cur = await check(store, log, api)
    assert key not in {r.key for r in cur.runs} and (key, 2) in cur.retired
    assert (await store.get(key)).data  # version 2 lists it: kept
    await log.append_fragment(random_records(rng, 2, ids=1000))
    age_everything(tmp_path / "s", 10)
    await pipe.run_round([candidate(log, api.cursors[CID])])
    await check(store, log, api)
    with pytest.raises(ObjectNotFound):
        await store.get(key)


class RacingStore(LocalStore):
    """A LocalStore that runs ``hook`` (once) just before the first ``put`` of CURRENT.json."""

    hook: Any = None

    async def put(self, key: str, data: bytes, **kw: Any) -> Any:
        if key.endswith("CURRENT.json") and self.hook is not None:
            hook, self.hook = self.hook, None
            await hook()
        return await super().put(key, data, **kw)


async def test_a_merge_racing_another_install_and_its_prune_loses_cleanly(tmp_path: Path) -> None:
    """Compactor A folds and merges (its runs written) while compactor B installs the next
    version and prunes with no grace; A's install loses, deletes only its own runs, and B's
    prune deleted nothing B's version or a kept one lists."""
    store = RacingStore(tmp_path / "s")
    rng = random.Random(3)
    log = Log(store, CID)
    api = FakeLogApi({CID: log})
    setup = CompactionPipeline(None, store, {HOST: api}, ratio=3.0)
    for _ in range(2):
        await log.append_fragment(random_records(rng, 40, ids=100))
        await setup.run_round([candidate(log, api.cursors.get(CID, 1))])
    await log.append_fragment(random_records(rng, 40, ids=100))  # equal sizes: A must merge
    plain = LocalStore(tmp_path / "s")
    b = CompactionPipeline(None, plain, {HOST: api}, ratio=1000.0, prune_grace_s=0.0)

    async def b_round() -> None:
        age_everything(tmp_path / "s", 10)
        res = await b.run_round([candidate(log, api.cursors[CID])])
        assert [o.status for o in res.outcomes] == ["compacted"]

    store.hook = b_round
    a = CompactionPipeline(None, store, {HOST: api}, ratio=3.0, prune_grace_s=0.0)
    res = await a.run_round([candidate(log, api.cursors[CID])])
    assert [o.status for o in res.outcomes] == ["lost"]
    cur = await check(store, log, api, ratio=1000.0)
    files = {m.key async for m in store.list(f"compacted/{CID}/") if m.key.endswith(".parquet")}
    # The loser's runs (its new top run and its merge's output) are gone: every file left is
    # listed by the current version or recorded as retired by it.
    assert files <= {r.key for r in cur.runs} | {k for k, _ in cur.retired}


async def test_a_reader_during_a_merge_and_a_prune_sees_one_whole_version(tmp_path: Path) -> None:
    """The reader reads CURRENT.json of version v; before it reads the runs a merge installs
    v+1 and prunes v's runs (keep 1, no grace: the worst settings).  The reader notices the
    missing run and reads v+1 — never a mix of versions, never a partial state."""
    store = LocalStore(tmp_path / "s")
    rng = random.Random(4)
    log = Log(store, CID)
    api = FakeLogApi({CID: log})
    pipe = CompactionPipeline(None, store, {HOST: api}, ratio=3.0, keep_versions=1, prune_grace_s=0)
    for _ in range(2):
        await log.append_fragment(random_records(rng, 40, ids=100))
        await pipe.run_round([candidate(log, api.cursors.get(CID, 1))])

    class Interleaved(LocalStore):
        fired = False

        async def get(self, key: str) -> Any:
            if key.endswith(".parquet") and not self.fired:
                self.fired = True
                await log.append_fragment(random_records(rng, 200, ids=100))
                res = await pipe.run_round([candidate(log, api.cursors[CID])])
                assert res.merges >= 1  # the runs of the version being read were merged
                age_everything(tmp_path / "s", 10)
                await log.append_fragment(random_records(rng, 1, ids=100))
                await pipe.run_round([candidate(log, api.cursors[CID])])  # ... and pruned
                with pytest.raises(ObjectNotFound):
                    await super().get(key)
            return await super().get(key)

    reader_store = Interleaved(tmp_path / "s")
    before = await read_current(store, CID)
    state = await read_state(reader_store, CID)
    after = await read_current(store, CID)
    assert reader_store.fired and before is not None and after is not None
    assert state.version == after.version == before.version + 2  # the newest, whole
    assert state_view(state.table) == normalise(fold({}, log.records))


async def test_a_round_retried_after_a_crash_between_runs_and_pointer(tmp_path: Path) -> None:
    """A crash after the runs were written and before CURRENT.json leaves orphan runs of version
    v+1: nobody lists them, the prune leaves them alone while v+1 is not installed (an install
    may be in flight), the retried round installs v+1 with runs of its own, and the orphans go
    once the grace has passed since they were written."""
    store = LocalStore(tmp_path / "s")
    rng = random.Random(5)
    log = Log(store, CID)
    api = FakeLogApi({CID: log})
    pipe = CompactionPipeline(None, store, {HOST: api}, ratio=3.0, prune_grace_s=5.0)
    await log.append_fragment(random_records(rng, 40, ids=50))
    await pipe.run_round([candidate(log)])
    await log.append_fragment(random_records(rng, 40, ids=50))

    class Crash(Exception):
        pass

    class CrashingStore(LocalStore):
        async def put(self, key: str, data: bytes, **kw: Any) -> Any:
            if key.endswith("CURRENT.json"):
                raise Crash  # the process died here: nothing after this ran
            return await super().put(key, data, **kw)

    crashed = CompactionPipeline(None, CrashingStore(tmp_path / "s"), {HOST: api}, ratio=3.0)
    res = await crashed.run_round([candidate(log, api.cursors[CID])])
    assert [o.stage for o in res.outcomes] == ["install"]
    cur = await read_current(store, CID)
    assert cur is not None and cur.version == 1
    listed = {r.key for r in cur.runs}
    orphans = {m.key async for m in store.list(f"compacted/{CID}/v0000000000000002/")}
    assert orphans and not orphans & listed
    report = await versions.prune_versions(store, cur, CID, keep=1, grace_s=0.0)
    assert not set(report.deleted) & orphans  # version 2 may be an install in flight
    await check(store, log, api)  # the state is version 1's, whole

    res = await pipe.run_round([candidate(log, api.cursors[CID])])  # the retry
    assert [o.status for o in res.outcomes] == ["compacted"]
    cur = await check(store, log, api, ratio=3.0)
    assert cur.version == 2 and not {r.key for r in cur.runs} & orphans
    assert {m.key async for m in store.list(f"compacted/{CID}/v0000000000000002/")} >= orphans
    age_everything(tmp_path / "s", 60)
    await log.append_fragment(random_records(rng, 1, ids=50))
    await pipe.run_round([candidate(log, api.cursors[CID])])
    left = {m.key async for m in store.list(f"compacted/{CID}/")}
    assert not left & orphans
    await check(store, log, api, ratio=3.0)


async def test_a_retired_run_is_forgotten_only_once_it_could_be_pruned(tmp_path: Path) -> None:
    """The install that drops a retired entry does so only past keep and grace; a run whose
    entry is gone is then pruned by its version directory, never earlier than the entry said."""
    store = LocalStore(tmp_path / "s")
    rng = random.Random(6)
    log = Log(store, CID)
    api = FakeLogApi({CID: log})
    pipe = CompactionPipeline(None, store, {HOST: api}, ratio=3.0, prune_grace_s=3600.0)
    retired_at: dict[str, int] = {}
    for _ in range(8):
        await log.append_fragment(random_records(rng, 40, ids=100))
        await pipe.run_round([candidate(log, api.cursors.get(CID, 1))])
        cur = await read_current(store, CID)
        assert cur is not None
        for k, u in cur.retired:
            retired_at.setdefault(k, u)
        # Within the grace every retired run is still recorded and still there.
        assert set(retired_at) <= {k for k, _ in cur.retired}
        for k in retired_at:
            assert (await store.get(k)).data
    assert retired_at
    # Two hours later (store time), installs forget them and prunes delete them.  An install
    # dates "now" by its base's install (a lower bound of the store's present), so it is the
    # second install after the grace that forgets an entry.
    age_everything(tmp_path / "s", 7200)
    for _ in range(2):
        await log.append_fragment(random_records(rng, 40, ids=100))
        await pipe.run_round([candidate(log, api.cursors[CID])])
    cur = await read_current(store, CID)
    assert cur is not None
    assert not set(retired_at) & {k for k, _ in cur.retired}
    left = {m.key async for m in store.list(f"compacted/{CID}/")}
    assert not set(retired_at) & left
    await check(store, log, api, ratio=3.0)
