"""Two processes appending to one log on LocalStore: fenced, nothing acknowledged lost or doubled."""

from __future__ import annotations

import asyncio
import collections
import multiprocessing as mp
from pathlib import Path

from wal3 import LocalStore, LogContention, LogWriter, LogWriterOptions

from .helpers import assert_dense, read_all, recomputed_setsum


def _writer_process(
    root: str, name: str, n: int, start: mp.synchronize.Event, out: mp.Queue[object]
) -> None:
    async def main() -> list[tuple[int, str]]:
        store = LocalStore(root)
        w = await LogWriter.open(store, "logs/shared", LogWriterOptions(writer_name=name))
        acked: list[tuple[int, str]] = []
        start.wait()
        for i in range(n):
            body = f"{name}-{i}"
            for _attempt in range(50):
                try:
                    pos = await w.append(body.encode())
                except LogContention:
                    continue
                acked.append((pos.offset, body))
                break
        await w.close()
        return acked

    out.put(asyncio.run(main()))


async def test_two_processes_race_on_one_log(tmp_path: Path) -> None:
    root = str(tmp_path / "store")
    LocalStore(root)
    ctx = mp.get_context("spawn")
    start = ctx.Event()
    out: mp.Queue[object] = ctx.Queue()
    procs = [
        ctx.Process(target=_writer_process, args=(root, name, 40, start, out))
        for name in ("P", "Q")
    ]
    for p in procs:
        p.start()
    start.set()
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    acked = [a for r in results for a in r]  # type: ignore[union-attr]
    store = LocalStore(root)
    manifest, records = await read_all(store, "logs/shared")
    assert_dense(records, 1)
    by_offset = {r.offset: r.body.decode() for r in records}
    assert len({o for o, _ in acked}) == len(acked)
    for offset, body in acked:
        assert by_offset[offset] == body
    # A record retried after contention is never in the log twice.
    assert max(collections.Counter(by_offset.values()).values()) == 1
    assert manifest.setsum == await recomputed_setsum(store, "logs/shared", manifest)
