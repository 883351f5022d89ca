"""R5: prune dates supersession by installed_at, a compactor's own wall clock.  A compactor whose
clock lags (here by 20 min) installs v2; a correct compactor installs v3 one second later and
prunes: v1 stopped being current 1 s ago but is deleted at once (grace 300 s)."""
import asyncio, sys, tempfile
from pathlib import Path
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[2]))
from host.wal3 import LocalStore
from host.wal3.errors import ObjectNotFound
from compactor_client.fold import Row
from compactor_client.versions import (allocate_version, install_version, prune_versions,
                                       read_current, write_rows)

CID = "00000000-0000-4000-8000-0000000000aa"

async def install(store, now, offset):
    base = await read_current(store, CID)
    p = allocate_version(CID, base, token=f"t{offset}")
    await write_rows(store, p, [])
    out = await install_version(store, p, offset=offset, rows=0, now=now)
    assert out.installed
    return out.current

async def main():
    store = LocalStore(Path(tempfile.mkdtemp(prefix="r5-", dir=None)) / "s")
    T = 1_800_000_000.0
    await install(store, T - 3600, 10)                 # v1, an hour ago
    reader_sees = await read_current(store, CID)       # a reader reads CURRENT.json: v1
    print("reader read CURRENT.json at T-0.5: v%d %s" % (reader_sees.version, reader_sees.path))
    await install(store, T - 1200, 20)                 # v2 at real time T, by a clock 20 min slow
    cur = await install(store, T + 1, 30)              # v3 at T+1 by a correct clock
    rep = await prune_versions(store, cur, CID, keep=2, grace_s=300.0, now=T + 1)
    print("prune at T+1 deleted:", rep.deleted)
    try:
        await store.get(reader_sees.path); print("reader's file still there: held")
    except ObjectNotFound:
        print("VIOLATION: v1 stopped being current at T (1 s ago) and is already gone;"
              " the reader's read of", reader_sees.path, "fails")

asyncio.run(main())
