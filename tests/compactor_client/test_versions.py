"""Versions and the conditional install of CURRENT.json, on a real LocalStore."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path

import pytest

from compactor_client.fold import Row
from compactor_client.parquet_io import read_version
from compactor_client.versions import (
    CorruptCurrent,
    allocate_version,
    current_key,
    install_version,
    prune_versions,
    read_current,
    write_rows,
)
from wal3.errors import ObjectNotFound, StoreUnavailable
from wal3.localstore import LocalStore


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "store")


def rows(*ids: str) -> list[Row]:
    return [Row(id=i, document=f"doc-{i}", metadata={"i": i}, embedding=[1.5]) for i in ids]


async def keys(store: LocalStore, prefix: str = "compacted/") -> list[str]:
    return [m.key async for m in store.list(prefix)]


async def test_first_then_second_version(store: LocalStore) -> None:
    assert await read_current(store, "c1") is None
    v1 = allocate_version("c1", None)
    assert v1.version == 1 and v1.start_offset == 1
    assert v1.data_key.startswith("compacted/c1/v0000000000000001/")
    await write_rows(store, v1, rows("a", "b"))
    out1 = await install_version(store, v1, offset=11, rows=2)
    assert out1.installed

    cur = await read_current(store, "c1")
    assert cur is not None
    assert (cur.version, cur.offset, cur.rows, cur.path) == (1, 11, 2, v1.data_key)
    doc = json.loads((await store.get(current_key("c1"))).data)
    assert {k: doc[k] for k in ("format", "version", "offset", "rows", "runs", "retired")} == {
        "format": 2,
        "version": 1,
        "offset": 11,
        "rows": 2,
        "runs": [{"key": v1.data_key, "level": 0, "rows": 2, "tombstones": 0}],
        "retired": [],
    }
    assert doc["history"] == [{"version": 1, "installed_at": doc["installed_at"]}]

    v2 = allocate_version("c1", cur)
    assert v2.version == 2 and v2.start_offset == 11
    await write_rows(store, v2, rows("a"))
    assert (await install_version(store, v2, offset=20, rows=1)).installed
    cur2 = await read_current(store, "c1")
    assert cur2 is not None and (cur2.version, cur2.offset, cur2.path) == (2, 20, v2.data_key)
    assert set(read_version(store.url_for(cur2.path))) == {"a"}
    # Older versions stay readable: they are immutable, readers may still hold them.
    assert set(read_version(store.url_for(v1.data_key))) == {"a", "b"}


@pytest.mark.parametrize("with_base", [False, True])
async def test_racing_installers_one_wins_loser_discarded(
    store: LocalStore, with_base: bool
) -> None:
    base = None
    if with_base:
        v1 = allocate_version("c", None)
        await write_rows(store, v1, rows("x"))
        assert (await install_version(store, v1, offset=5, rows=1)).installed
        base = await read_current(store, "c")
    # Both compactors read the same base, so both allocate the same version number.
    a = allocate_version("c", base)
    b = allocate_version("c", base)
    assert a.version == b.version and a.data_key != b.data_key
    await write_rows(store, a, rows("a1", "a2"))
    await write_rows(store, b, rows("b1"))

    # Real concurrency: LocalStore runs each put in its own thread under a per-key flock.
    out_a, out_b = await asyncio.gather(
        install_version(store, a, offset=30, rows=2), install_version(store, b, offset=31, rows=1)
    )
    assert [out_a.installed, out_b.installed].count(True) == 1
    winner, loser = (a, b) if out_a.installed else (b, a)

    cur = await read_current(store, "c")
    assert cur is not None and cur.path == winner.data_key and cur.version == winner.version
    assert cur.offset == (30 if winner is a else 31)
    assert len(read_version(store.url_for(cur.path))) == cur.rows
    with pytest.raises(ObjectNotFound):
        await store.get(loser.data_key)
    assert winner.data_key in await keys(store)


async def test_stale_base_loses(store: LocalStore) -> None:
    v1 = allocate_version("c", None)
    await write_rows(store, v1, rows("a"))
    await install_version(store, v1, offset=3, rows=1)
    base = await read_current(store, "c")
    fast, slow = allocate_version("c", base), allocate_version("c", base)
    await write_rows(store, fast, rows("f"))
    assert (await install_version(store, fast, offset=9, rows=1)).installed
    # The slow compactor finishes later, against a pointer that moved under it.
    await write_rows(store, slow, rows("s"))
    assert not (await install_version(store, slow, offset=7, rows=1)).installed
    cur = await read_current(store, "c")
    assert cur is not None and cur.path == fast.data_key and cur.offset == 9


async def test_install_never_goes_backwards(store: LocalStore) -> None:
    v1 = allocate_version("c", None)
    await write_rows(store, v1, rows("a"))
    await install_version(store, v1, offset=10, rows=1)
    v2 = allocate_version("c", await read_current(store, "c"))
    with pytest.raises(ValueError):
        await install_version(store, v2, offset=9, rows=0)


async def test_corrupt_current_is_reported_not_overwritten(store: LocalStore) -> None:
    await store.put(current_key("c"), b'{"version": "one"}')
    with pytest.raises(CorruptCurrent):
        await read_current(store, "c")


class FlakyPointerStore(LocalStore):
    """A LocalStore whose puts of CURRENT.json fail ambiguously (landed, then 'unavailable')."""

    async def put(  # type: ignore[no-untyped-def]
        self, key, data, *, if_none_match=None, if_match=None
    ):
        etag = await super().put(key, data, if_none_match=if_none_match, if_match=if_match)
        if key.endswith("CURRENT.json"):
            raise StoreUnavailable("response lost")
        return etag

    async def head(self, key):  # type: ignore[no-untyped-def]
        if key.endswith("CURRENT.json"):
            raise StoreUnavailable("still down")
        return await super().head(key)


async def test_ambiguous_install_keeps_data(tmp_path: Path) -> None:
    """When the pointer put's outcome is unknown, the data it may name must not be deleted."""
    store = FlakyPointerStore(tmp_path / "s")
    v1 = allocate_version("c", None)
    await write_rows(store, v1, rows("a"))
    with pytest.raises(StoreUnavailable):
        await install_version(store, v1, offset=4, rows=1)
    cur = await read_current(store, "c")
    assert cur is not None and cur.path == v1.data_key  # it had landed after all...
    assert (await store.get(v1.data_key)).data  # ...and its data is still there


def _set_mtime(store: LocalStore, key: str, when: float) -> None:
    """Set the store's Last-Modified of an object (the local store's clock is the file's)."""
    path = store.root / key
    os.utime(path, (when, when))


def _store_clock_reads(store: LocalStore, cid: str, when: float) -> None:
    """The store's clock reads ``when``: CURRENT.json is dated then (as if rewritten then);
    prunes measure the grace on the store's clock, never on their own."""
    _set_mtime(store, current_key(cid), when)


async def _install_next(
    store: LocalStore, cid: str, offset: int, *, crashed_attempt: bool = False
) -> str:
    """Install the next version (optionally leaving a crashed rival's file beside it)."""
    base = await read_current(store, cid)
    if crashed_attempt:
        rival = allocate_version(cid, base)
        await write_rows(store, rival, rows("rival"))
    pending = allocate_version(cid, base)
    await write_rows(store, pending, rows(f"v{offset}"))
    assert (await install_version(store, pending, offset=offset, rows=1)).installed
    return pending.data_key


async def test_prune_keeps_the_newest_versions_and_waits_out_the_grace(store: LocalStore) -> None:
    paths = [
        await _install_next(store, "c", 10 * (i + 1), crashed_attempt=(i == 3)) for i in range(5)
    ]
    cur = await read_current(store, "c")
    assert cur is not None and cur.version == 5 and cur.path == paths[4]
    before = set(await keys(store))
    rival = next(k for k in before if "/v0000000000000004/" in k and k != paths[3])

    # Within the grace period nothing goes, however old the version.
    young = await prune_versions(store, cur, "c", keep=2, grace_s=3600.0)
    assert young.deleted == [] and young.deferred == 3
    assert set(await keys(store)) == before

    t0 = time.time()
    _store_clock_reads(store, "c", t0 + 7200.0)
    report = await prune_versions(store, cur, "c", keep=2, grace_s=3600.0)
    # Versions 1-3 are gone, 4 (the previous one, which readers may hold) and 5 stay, and so
    # does the crashed rival of version 4: it is inside the kept window and harmless.
    assert report.deleted == sorted(paths[:3])
    assert set(await keys(store)) == before - set(paths[:3])
    assert set(read_version(store.url_for(cur.path))) == {"v50"}
    assert rival in await keys(store)

    # The next install pushes version 4 out of the window: its real file and its rival go.
    newest = await _install_next(store, "c", 60)
    cur = await read_current(store, "c")
    assert cur is not None and cur.path == newest
    _store_clock_reads(store, "c", t0 + 2 * 7200.0)  # v6 read v5 as installed at t0 + 7200
    report = await prune_versions(store, cur, "c", keep=2, grace_s=3600.0)
    assert report.deleted == sorted([paths[3], rival])
    assert sorted(await keys(store)) == sorted([current_key("c"), paths[4], newest])


async def test_prune_leaves_the_current_and_in_flight_versions(store: LocalStore) -> None:
    await _install_next(store, "c", 10)
    cur = await read_current(store, "c")
    assert cur is not None
    # A loser's file in the current version, and an install of version 2 in flight.
    loser = allocate_version("c", None)
    await write_rows(store, loser, rows("loser"))
    in_flight = allocate_version("c", cur)
    await write_rows(store, in_flight, rows("next"))
    _set_mtime(store, loser.data_key, time.time() - 10.0)  # the store wrote the loser 10 s ago
    report = await prune_versions(store, cur, "c", keep=1, grace_s=5.0)
    assert report.deleted == [loser.data_key]
    remaining = await keys(store)
    assert cur.path in remaining and in_flight.data_key in remaining


async def test_prune_deletes_nothing_when_current_names_a_missing_file(store: LocalStore) -> None:
    await _install_next(store, "c", 10)
    await _install_next(store, "c", 20)
    await _install_next(store, "c", 30)
    cur = await read_current(store, "c")
    assert cur is not None
    await store.delete(cur.path)
    before = set(await keys(store))
    report = await prune_versions(store, cur, "c", keep=1, grace_s=0.0)
    assert report.deleted == [] and set(await keys(store)) == before
