"""A (Rust-readable) manifest near the top of u64: initial_offset = 2^64-3, initial_seq_no = 2^64-2.
Our writer appends past U64_MAX without complaint and installs a manifest Rust cannot decode and
that our own parser then rejects: the log is bricked by an ordinary append."""
import asyncio, sys
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parent))
from gc_common import *
from host.wal3.errors import CorruptManifest

P = "logs/k"
U = 2**64 - 1

async def main():
    store = LocalStore(tmp())
    m = Manifest(writer="rust", initial_offset=U - 2, initial_seq_no=U - 1)
    Manifest.from_bytes(m.to_bytes())
    await store.put(join(P, MANIFEST_PATH), m.to_bytes(), if_none_match="*")
    w = await LogWriter.open(store, P, LogWriterOptions(writer_name="w"))
    for i in range(4):
        try:
            pos = await w.append(b"x")
            print("append", i, "->", pos)
        except BaseException as e:
            print("append", i, type(e).__name__, str(e)[:100]); break
    await w.close()
    raw = (await store.get(join(P, MANIFEST_PATH))).data
    print("stored manifest tail:", raw[-160:])
    try:
        Manifest.from_bytes(raw); print("manifest still parses")
    except CorruptManifest as e:
        print("manifest now unparseable:", str(e)[:100])

asyncio.run(main())
