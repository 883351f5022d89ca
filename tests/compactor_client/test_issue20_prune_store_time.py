"""Issue 20, finding r5 (was ``verify/repro/r5_prune_clock_skew.py``): the prune grace is dated by
the store's own clock (Last-Modified), never by an installing compactor's wall clock.

A compactor whose clock lags by 20 minutes installs v2; a correct one installs v3 a moment later
and prunes.  v1 stopped being current a moment ago, so a reader that read the old ``CURRENT.json``
must still find its file; before the fix v1 was deleted at once (its supersession was dated by
v2's skewed ``installed_at``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import compactor_client.versions as versions_module
from compactor_client.fold import Row
from compactor_client.versions import (
    CorruptCurrent,
    CurrentVersion,
    PruneReport,
    RunEntry,
    allocate_version,
    current_key,
    data_key,
    install_version,
    prune_versions,
    read_current,
    run_key,
    write_rows,
)
from wal3.localstore import LocalStore
from wal3.store import ObjectMeta

CID = "00000000-0000-4000-8000-0000000000aa"
ROWS = [Row(id="a", document="x", metadata={}, embedding=None)]


async def _install(store: LocalStore, installer_clock: float, offset: int) -> CurrentVersion:
    base = await read_current(store, CID)
    pending = allocate_version(CID, base, token=f"t{offset}")
    await write_rows(store, pending, ROWS)
    out = await install_version(store, pending, offset=offset, rows=1, now=installer_clock)
    assert out.installed and out.current is not None
    return out.current


def _age(store: LocalStore, key: str, seconds: float) -> None:
    """Make the store date an object ``seconds`` in the past (its Last-Modified)."""
    when = time.time() - seconds
    os.utime(store.root / key, (when, when))  # type: ignore[attr-defined]


async def test_a_slow_installer_clock_does_not_shorten_the_grace(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    real = time.time()
    await _install(store, real - 3600, 10)  # v1; its installer's clock says an hour ago
    reader = await read_current(store, CID)  # a reader holds v1's path
    assert reader is not None and reader.version == 1
    await _install(store, real - 1200, 20)  # v2, by a compactor whose clock is 20 min slow
    cur = await _install(store, real + 1, 30)  # v3, by a correct clock
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert reader.path not in report.deleted
    assert (await store.get(reader.path)).data  # the reader's read still works


async def test_the_grace_runs_on_the_stores_clock(tmp_path: Path) -> None:
    """Once the store dates v2's install (v1's supersession) past the grace, v1 goes, whatever
    the installers' clocks say (here they run an hour fast)."""
    store = LocalStore(tmp_path / "s")
    fast = time.time() + 3600
    v1 = await _install(store, fast, 10)
    await _install(store, fast + 1, 20)
    # The store wrote v2's CURRENT.json 400 s ago (as v3's installer reads it).
    _age(store, current_key(CID), 400.0)
    cur = await _install(store, fast + 2, 30)
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert report.deleted == [v1.path]
    # And with v2 installed only 200 s before v3 (by the store), v2 stays after v4.
    _age(store, current_key(CID), 200.0)
    cur = await _install(store, fast + 3, 40)
    report = await prune_versions(store, cur, CID, keep=2, grace_s=300.0)
    assert report.deleted == [] and report.deferred == 1


# ------------------------------------------------------------------------------------------------
# Each rule of ``prune_versions``, one at a time, on hand-built pointers and store times (the
# tests above check whole rounds).  Every time below is a Last-Modified the test sets itself.

P = "00000000-0000-4000-8000-0000000000ac"
T0 = 1_700_000_000.0


def _part(version: int, tag: str = "a") -> str:
    return data_key(P, version, tag)


def _run(version: int, tag: str) -> str:
    return run_key(P, version, tag)


async def _layout(store: LocalStore, times: dict[str, float]) -> None:
    """Objects under the collection, each with the Last-Modified the store reports for it."""
    for key, when in times.items():
        await store.put(key, b"x")
        os.utime(store.root / key, (when, when))


def _pointer(
    version: int,
    runs: list[str],
    *,
    stored: dict[int, float] | None = None,
    stored_at: float | None = None,
    retired: dict[str, int] | None = None,
) -> CurrentVersion:
    return CurrentVersion(
        version=version,
        offset=10 * version,
        rows=1,
        runs=tuple(RunEntry(key=k, rows=1) for k in runs),
        etag='"e"',
        stored=tuple(sorted((stored or {}).items(), reverse=True)),
        stored_at=stored_at,
        retired=tuple((retired or {}).items()),
    )


async def _listed(store: LocalStore) -> set[str]:
    return {m.key async for m in store.list(f"compacted/{P}/")}


async def test_defaults_keep_two_versions_and_a_grace_of_300_s_ending_inclusively(
    tmp_path: Path,
) -> None:
    """v1 stopped being current when v2 was installed, exactly 300 s + the 1 s slack before the
    store's present: with the defaults (keep 2, grace 300 s) it goes, v2 stays."""
    store = LocalStore(tmp_path / "s")
    await _layout(
        store,
        {
            current_key(P): T0 + 301.0,
            _part(1): T0 - 100.0,
            _part(2): T0 - 10.0,
            _part(3): T0 + 250.0,
        },
    )
    cur = _pointer(3, [_part(3)], stored={2: T0, 3: T0 + 301.0})
    report = await prune_versions(store, cur, P)
    assert report == PruneReport([_part(1)], 0)
    assert await _listed(store) == {current_key(P), _part(2), _part(3)}


async def test_the_grace_ends_at_grace_plus_the_one_second_slack(tmp_path: Path) -> None:
    """At ``grace + 1 s`` a file goes; half a second short of it, it is deferred."""
    for age, deleted in ((401.0, True), (400.5, False), (400.0, False)):
        store = LocalStore(tmp_path / str(age))
        await _layout(store, {current_key(P): T0 + age, _part(1): T0 - 50.0, _part(2): T0})
        cur = _pointer(2, [_part(2)], stored={2: T0})
        report = await prune_versions(store, cur, P, keep=1, grace_s=400.0)
        assert report == (PruneReport([_part(1)], 0) if deleted else PruneReport([], 1)), age


async def test_keep_below_one_keeps_the_current_version_as_keep_one_does(tmp_path: Path) -> None:
    """``keep=0`` is ``keep=1``: a run last listed by v2 goes once v3's install is past the
    grace, and one the current version retired (v3 lists it) is neither deleted nor deferred."""
    store = LocalStore(tmp_path / "s")
    await _layout(
        store,
        {
            current_key(P): T0,
            _run(1, "gone"): T0 - 10.0,
            _run(2, "kept"): T0 - 10.0,
            _run(3, "now"): T0,
            _run(4, "in-flight"): T0 + 1000.0,
        },
    )
    retired = {_run(1, "gone"): 2, _run(2, "kept"): 3}
    cur = _pointer(3, [_run(3, "now")], stored={3: T0}, retired=retired)
    report = await prune_versions(store, cur, P, keep=0, grace_s=300.0)
    assert report == PruneReport([_run(1, "gone")], 0)
    report = await prune_versions(store, cur, P, keep=-5, grace_s=300.0)
    assert report == PruneReport([], 0)
    assert _run(2, "kept") in await _listed(store)


async def test_a_version_is_dated_by_the_install_of_the_next_one(tmp_path: Path) -> None:
    """v1 stopped being current when v2 was installed: that record dates it, even when a later
    install is on record with an older store time (one store node's clock behind another's)."""
    store = LocalStore(tmp_path / "s")
    await _layout(store, {current_key(P): T0 + 1000.0, _part(1): T0 - 5000.0, _part(4): T0})
    # v2 installed recently; v4's record is older (and stands for v3's, not on record).
    cur = _pointer(4, [_part(4)], stored={2: T0 + 900.0, 4: T0 - 2000.0})
    report = await prune_versions(store, cur, P, keep=1, grace_s=300.0)
    assert report == PruneReport([], 1)
    # With v2's install as old as the grace allows, v1 goes.
    cur = _pointer(4, [_part(4)], stored={2: T0 + 699.0, 4: T0 + 950.0})
    report = await prune_versions(store, cur, P, keep=1, grace_s=300.0)
    assert report == PruneReport([_part(1)], 0)


async def test_without_the_next_install_on_record_the_oldest_later_one_dates_it(
    tmp_path: Path,
) -> None:
    """v2's install is not on record: v1 is dated by the oldest later install (v3's), never by
    its own install or an earlier one."""
    store = LocalStore(tmp_path / "s")
    await _layout(store, {current_key(P): T0 + 1000.0, _part(1): T0 - 5000.0, _part(4): T0})
    cur = _pointer(4, [_part(4)], stored={1: T0 - 4000.0, 3: T0 + 800.0, 4: T0 + 900.0})
    assert (await prune_versions(store, cur, P, keep=1, grace_s=300.0)) == PruneReport([], 1)
    cur = _pointer(4, [_part(4)], stored={1: T0 - 4000.0, 3: T0 + 600.0, 4: T0 + 900.0})
    report = await prune_versions(store, cur, P, keep=1, grace_s=300.0)
    assert report == PruneReport([_part(1)], 0)


async def test_the_current_install_is_dated_by_its_record_or_the_pointers_last_modified(
    tmp_path: Path,
) -> None:
    """v2 stopped being current at v3's install: its own store time when on record, else the
    pointer's Last-Modified (no earlier than that install), and the earlier of the two when
    both are known."""
    newest = {_part(4, "in-flight"): T0 + 1000.0}  # the store's present: an install in flight

    async def prune(name: str, pointer_at: float, stored_at: float | None) -> PruneReport:
        store = LocalStore(tmp_path / name)
        await _layout(
            store, {current_key(P): pointer_at, _part(2): T0 - 100.0, _part(3): T0, **newest}
        )
        cur = _pointer(3, [_part(3)], stored={2: T0 - 50.0}, stored_at=stored_at)
        return await prune_versions(store, cur, P, keep=1, grace_s=300.0)

    gone, deferred = PruneReport([_part(2)], 0), PruneReport([], 1)
    assert await prune("pointer-old", T0 + 600.0, None) == gone
    assert await prune("pointer-young", T0 + 900.0, None) == deferred
    assert await prune("record-older", T0 + 900.0, T0 + 600.0) == gone
    assert await prune("pointer-older", T0 + 600.0, T0 + 900.0) == gone
    assert await prune("both-young", T0 + 900.0, T0 + 800.0) == deferred


async def test_nothing_goes_unless_the_pointer_and_every_live_run_are_listed(
    tmp_path: Path,
) -> None:
    """Without CURRENT.json in the listing, or with a run it lists missing, nothing is deleted
    and every compacted file counts as deferred; with exactly the live runs listed, nothing is
    deferred."""
    old = {_part(1): T0 - 9000.0, _part(2): T0 - 9000.0, _run(3, "live"): T0}
    cur = _pointer(3, [_run(3, "live")], stored={2: T0 - 8000.0, 3: T0})

    store = LocalStore(tmp_path / "no-pointer")
    await _layout(store, old)
    assert await prune_versions(store, cur, P, keep=1, grace_s=0.0) == PruneReport([], 3)
    assert await _listed(store) == set(old)

    store = LocalStore(tmp_path / "no-run")
    await _layout(store, {current_key(P): T0, _part(1): T0 - 9000.0, _part(2): T0 - 9000.0})
    assert await prune_versions(store, cur, P, keep=1, grace_s=0.0) == PruneReport([], 2)

    store = LocalStore(tmp_path / "only-live")
    await _layout(store, {current_key(P): T0, _run(3, "live"): T0})
    assert await prune_versions(store, cur, P, keep=1, grace_s=0.0) == PruneReport([], 0)

    store = LocalStore(tmp_path / "nothing")
    assert await prune_versions(store, cur, P, keep=1, grace_s=0.0) == PruneReport([], 0)


async def test_a_file_skipped_does_not_end_the_scan(tmp_path: Path) -> None:
    """In the store's key order, a live run, a retired run a kept version lists and a kept
    version's file each come before a file that goes: all three are skipped, the scan goes on."""
    store = LocalStore(tmp_path / "s")
    await _layout(
        store,
        {
            current_key(P): T0 + 1000.0,
            _run(1, "a-live"): T0 - 900.0,  # the current version still lists it
            _run(1, "b-retired-kept"): T0 - 900.0,  # retired by v3, which is kept
            _run(1, "c-orphan"): T0 - 900.0,  # never listed: an attempt's that lost
            _part(3, "a-kept"): T0 - 900.0,  # v3's single-version file, v3 being kept
            _run(3, "b-orphan"): T0 - 900.0,
            _run(4, "now"): T0 + 1000.0,
        },
    )
    cur = _pointer(
        4,
        [_run(4, "now"), _run(1, "a-live")],
        stored={3: T0, 4: T0 + 1000.0},
        retired={_run(1, "b-retired-kept"): 3},
    )
    report = await prune_versions(store, cur, P, keep=2, grace_s=300.0)
    assert report == PruneReport([_run(1, "c-orphan"), _run(3, "b-orphan")], 0)
    assert await _listed(store) == {
        current_key(P),
        _run(1, "a-live"),
        _run(1, "b-retired-kept"),
        _part(3, "a-kept"),
        _run(4, "now"),
    }


async def test_the_crash_point_is_reached_once_after_the_first_delete(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prune:mid`` (where the kill -9 tests stop a prune) comes once, after the first file
    went and before the second."""
    store = LocalStore(tmp_path / "s")
    await _layout(
        store,
        {current_key(P): T0, _part(1): T0 - 900.0, _part(2): T0 - 900.0, _part(3): T0 + 10.0},
    )
    seen: list[tuple[str, set[str]]] = []

    def crash_point(name: str) -> None:
        seen.append((name, {k for k in (_part(1), _part(2)) if (store.root / k).exists()}))

    monkeypatch.setattr(versions_module, "crash_point", crash_point)
    cur = _pointer(3, [_part(3)], stored={2: T0 - 800.0, 3: T0})
    report = await prune_versions(store, cur, P, keep=1, grace_s=0.0)
    assert report == PruneReport([_part(1), _part(2)], 0)
    assert seen == [("prune:mid", {_part(2)})]


async def test_a_run_dropped_by_this_install_stays_recorded_as_retired(tmp_path: Path) -> None:
    """v2 drops v1's run: it is recorded as retired until 1, even with a zero grace, since v2's
    own install (v1's supersession) is not on record yet.  Each attempt names its run keys."""
    store = LocalStore(tmp_path / "s")
    first = allocate_version(P, None, token="a")
    assert first.run_keys() == [run_key(P, 1, "a-0")]
    await install_version(store, first, offset=10, rows=1, runs=(RunEntry(first.run_key(0), 1),))
    base = await read_current(store, P)
    assert base is not None and base.stored_at is not None
    second = allocate_version(P, base, token="b")
    assert second.run_keys() == [run_key(P, 2, "b-0"), run_key(P, 2, "b-1")]
    out = await install_version(
        store,
        second,
        offset=20,
        rows=1,
        runs=(RunEntry(second.run_key(0), 1),),
        keep=1,
        grace_s=0.0,
    )
    assert out.current is not None and out.current.retired == ((run_key(P, 1, "a-0"), 1),)


async def _base_pointer(
    store: LocalStore, stored: dict[int, float], retired: list[tuple[str, int]]
) -> CurrentVersion:
    """v5 (one run, ``retired`` recorded, installs of ``stored`` on record), installed at T0 by
    the store's clock."""
    cur = CurrentVersion(
        version=5,
        offset=50,
        rows=1,
        runs=(RunEntry(key=_run(5, "top"), rows=1),),
        etag="",
        installed_at=1.0,
        history=tuple((v, 1.0) for v in sorted(stored, reverse=True)),
        stored=tuple(sorted(stored.items(), reverse=True)),
        retired=tuple(retired),
    )
    await store.put(current_key(P), json.dumps(cur.document()).encode())
    os.utime(store.root / current_key(P), (T0, T0))
    got = await read_current(store, P)
    assert got is not None and got.stored_at == T0
    return got


async def _retired_by_v6(
    tmp_path: Path,
    name: str,
    stored: dict[int, float],
    retired: list[tuple[str, int]],
    keep: int | None,
    grace_s: float | None = 300.0,
) -> tuple[tuple[str, int], ...]:
    store = LocalStore(tmp_path / name)
    base = await _base_pointer(store, stored, retired)
    pending = allocate_version(P, base, token="n")
    out = await install_version(
        store,
        pending,
        offset=60,
        rows=1,
        runs=(RunEntry(pending.run_key(0), 1),),
        keep=keep,
        grace_s=grace_s,
    )
    assert out.current is not None
    return out.current.retired


async def test_an_install_forgets_retired_runs_past_the_kept_window_and_the_grace(
    tmp_path: Path,
) -> None:
    """v6 replaces v5 (the store's present is v5's install, T0): a retired record goes once its
    run could be pruned already, i.e. superseded ``grace + 1 s`` before T0 or earlier; the rest,
    and v5's own run retired now, stay, newest first (then by key)."""
    stored = {2: T0 - 1000.0, 3: T0 - 301.0, 4: T0 - 300.5}
    retired = [(_run(1, "a"), 1), (_run(2, "b"), 2), (_run(3, "d"), 3), (_run(3, "c"), 3)]
    assert await _retired_by_v6(tmp_path, "keep1", stored, retired, keep=1) == (
        (_run(5, "top"), 5),
        (_run(3, "c"), 3),
        (_run(3, "d"), 3),
    )
    # Without the pruner's settings nothing is forgotten.
    everything = ((_run(5, "top"), 5), (_run(3, "c"), 3), (_run(3, "d"), 3))
    everything += ((_run(2, "b"), 2), (_run(1, "a"), 1))
    assert await _retired_by_v6(tmp_path, "no-keep", stored, retired, keep=None) == everything
    assert (
        await _retired_by_v6(tmp_path, "no-grace", stored, retired, keep=1, grace_s=None)
        == everything
    )


async def test_an_install_keeps_retired_runs_a_kept_version_lists(tmp_path: Path) -> None:
    """With keep 4, v6 keeps v3..v6: a run last listed by v3 stays however old its supersession;
    one last listed by v2 goes."""
    stored = {3: T0 - 1000.0, 4: T0 - 1000.0}
    retired = [(_run(3, "kept"), 3), (_run(2, "gone"), 2)]
    assert await _retired_by_v6(tmp_path, "keep4", stored, retired, keep=4) == (
        (_run(5, "top"), 5),
        (_run(3, "kept"), 3),
    )


async def test_a_pointer_gone_between_its_read_and_its_head_reads_as_none(
    tmp_path: Path,
) -> None:
    class Vanishing(LocalStore):
        async def head(self, key: str) -> ObjectMeta:
            await self.delete(key)
            return await super().head(key)

    store = Vanishing(tmp_path / "s")
    await store.put(current_key(P), b'{"version": 1, "offset": 1, "rows": 0, "path": "p"}')
    assert await read_current(store, P) is None


async def test_a_format_one_pointer_with_a_path_not_a_string_is_corrupt(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "s")
    await store.put(current_key(P), b'{"version": 1, "offset": 1, "rows": 0, "path": 5}')
    with pytest.raises(CorruptCurrent) as e:
        await read_current(store, P)
    assert str(e.value) == f"{current_key(P)}: invalid runs: TypeError('path is not a string')"
