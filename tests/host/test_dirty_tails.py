"""``WalDirtyBackend.log_tails``: the collection logs' tails the roll-up clips settled marks to,
read from the store (the manifest's last pointers, then the object at its next number)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from host.dirty import WalDirtyBackend, dirty_prefix
from wal3 import CorruptManifest, LocalStore, LogWriter
from wal3.claim import ClaimWatch, claim_log
from wal3.gc import GcOptions
from wal3.paths import MANIFEST_PATH, fragment_path, join, log_prefix


async def _backend(store: LocalStore) -> tuple[WalDirtyBackend, LogWriter]:
    writer = await LogWriter.open(store, dirty_prefix("s1"))
    return WalDirtyBackend(store, dirty_prefix("s1"), writer, GcOptions()), writer


async def _log(store: LocalStore, appends: int) -> tuple[uuid.UUID, LogWriter]:
    cid = uuid.uuid4()
    writer = await LogWriter.open(store, log_prefix(cid))
    for n in range(appends):
        await writer.append_many([f"r{n}".encode(), b"x"])
    return cid, writer


async def test_tails_are_the_logs_next_offsets(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    backend, dirty = await _backend(store)
    a, wa = await _log(store, 3)
    b, wb = await _log(store, 0)
    absent = uuid.uuid4()
    tails = await backend.log_tails([a, b, absent])
    # a: three fragments of two records; b: created, empty; absent: no manifest, no claim.
    assert tails == {a: 7, b: 1}
    for w in (wa, wb, dirty):
        await w.close()


async def test_an_object_at_the_next_number_means_a_write_may_still_land(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    backend, dirty = await _backend(store)
    cid, writer = await _log(store, 2)
    await writer.close()
    # An upload that has landed but is not linked yet: its commit may still land.
    await store.put(join(log_prefix(cid), fragment_path(3)), b"an unlinked fragment")
    assert await backend.log_tails([cid]) == {cid: None}
    # A sealed log takes no fragment: its tail is final whatever lies at the next number.
    sealer = await LogWriter.open(store, log_prefix(cid))
    await sealer.seal()
    assert await backend.log_tails([cid]) == {cid: 5}
    await sealer.close()
    await dirty.close()


async def test_a_log_being_created_has_no_tail_yet(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    backend, dirty = await _backend(store)
    cid = uuid.uuid4()
    claim = await claim_log(
        store, log_prefix(cid), purpose="fork", holder="h1", watch=ClaimWatch(3600.0)
    )
    assert claim is not None
    assert await backend.log_tails([cid]) == {cid: None}
    await dirty.close()


async def test_a_corrupt_tail_fails_the_lookup(tmp_path: Path) -> None:
    """The roll-up relogs every mark when the lookup fails: a corrupt tail never clips one."""
    store = LocalStore(tmp_path)
    backend, dirty = await _backend(store)
    cid, writer = await _log(store, 1)
    await writer.close()
    key = join(log_prefix(cid), MANIFEST_PATH)
    data = (await store.get(key)).data
    await store.put(key, data.replace(b'"limit":{"offset":3}', b'"limit":{"offset":-3}'))
    with pytest.raises(CorruptManifest):
        await backend.log_tails([cid])
    # Not a manifest at all, or one that lost its pointers: read from defaults, its tail would be
    # offset 1, below every mark (helper-8's review of 85eab44).
    for corrupt in (b"{}", data.replace(b'"fragments":[', b'"lost":[')):
        await store.put(key, corrupt)
        with pytest.raises(CorruptManifest):
            await backend.log_tails([cid])
    await dirty.close()
