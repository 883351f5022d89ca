"""``verify/liveness_probe.py`` with recovery instrumented: prints each repair's outcome (raced,
the raced rounds before it) and each ``_retry_kept`` call between ``--from`` and ``--to``
virtual seconds.

    python -m verify.liveness_probe_trace --from 100 --to 130 --seed 1 --writers 2 --conc 2 --gc-mean 5
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import wal3.recovery as recovery
from verify import liveness_probe


def main() -> None:
    t0 = float(sys.argv.pop(sys.argv.index("--from") + 1))
    t1 = float(sys.argv.pop(sys.argv.index("--to") + 1))
    sys.argv.remove("--from")
    sys.argv.remove("--to")
    real_repair, real_keep = recovery.Recovery._repair, recovery.Recovery._retry_kept

    def shown() -> bool:
        return t0 <= asyncio.get_running_loop().time() <= t1

    async def repair(self: Any, manifest: Any, etag: Any, *, link_others: bool) -> Any:
        r = await real_repair(self, manifest, etag, link_others=link_others)
        if shown():
            print(
                f"{asyncio.get_running_loop().time():9.3f} {self._opts.writer_name} repair from "
                f"tail {manifest.next_seq_no} (by {manifest.writer}) -> tail "
                f"{r.manifest.next_seq_no} by {r.manifest.writer} raced={r.raced} "
                f"raced_rounds_before={self._raced_rounds} blocked={self._repair_blocked!r:.60}"
            )
        return r

    def keep(self: Any, kept: Any, charge: bool = True, settled_too: bool = False) -> Any:
        if shown():
            batches = [(b.seq_no, b.upload, b.settled, b.attempts) for b in kept]
            print(
                f"{asyncio.get_running_loop().time():9.3f} {self._opts.writer_name}   "
                f"kept={batches} charge={charge} settled_too={settled_too}"
            )
        return real_keep(self, kept, charge, settled_too)

    recovery.Recovery._repair = repair  # type: ignore[method-assign]
    recovery.Recovery._retry_kept = keep  # type: ignore[method-assign,assignment]
    liveness_probe.main()


if __name__ == "__main__":
    main()
