"""A liveness probe of the writer's recovery against a busy collector and a rival writer (the
adversarial review of 741b3dd's raced-claim bound, 2026-12-02; its findings are in
docs/RELIABILITY.md, "Open: liveness under a busy collector").

    python -m verify.liveness_probe --seed 1 --writers 2 --conc 2 --gc-mean 5 --duration 300
    python -m verify.liveness_probe --writers 1 --conc 1 --gc-period 1.0 --duration 1500

At 741b3dd the first showed appends answered "may still appear" with no fault (a rival's claim
counted as an edit that linked nothing), the second a first append answered after about 1,080
virtual seconds (every committer rebase onto a collector's edit was a claim and a whole
fence).  Both ended with ``violations=0``: safety held, liveness was what was weak.  Since the
manifest records its lease holder (``lease_holder``, wal3/lease.py) the first answers only
acknowledgements and ``LogContention`` (longest gap without an acknowledgement 8.4 s, was 27 s),
the second acknowledges 32,956 appends, the longest gap 0.7 s (docs/RELIABILITY.md).

Virtual time (verify.sim.loop), a fault-free SimStore, ``--writers`` LogWriters on one log
(read lease ``--lease`` s, so every write on a manifest not its own is a claim + 1.25x fence),
and a collector whose manifest edits link nothing (gc_floor announced / retracted under the
name "gc", exactly the shape of wal3/gc.py's announce and clear edits).  The collector edits
at exponential intervals of mean ``--gc-mean`` s (or exactly every ``--gc-period`` s).

Each writer appends one record at a time in a loop (``--conc`` concurrent appenders each).
Prints per writer: acked, contention, failed (StoreUnavailable ...), the longest run of
virtual seconds without an ack on the log, and the recovery stats.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import secrets
from dataclasses import replace

from verify.sim import loop as simloop
from verify.sim.store import SimStore
from wal3 import BatchOptions, LeaseOptions, LogWriter, LogWriterOptions
from wal3.errors import LogContention, PreconditionFailed
from wal3.layout import load_manifest
from wal3.manifest import GcFloor
from wal3.paths import MANIFEST_PATH, join, log_prefix
from wal3.store import put_resolving

PREFIX = log_prefix("00000000-0000-4000-8000-00000000ad01")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--writers", type=int, default=1)
    ap.add_argument("--conc", type=int, default=2)
    ap.add_argument("--lease", type=float, default=2.0)
    ap.add_argument("--gc-mean", type=float, default=1.0)
    ap.add_argument("--gc-period", type=float, default=None)
    ap.add_argument("--gc-until", type=float, default=None, help="collector stops at this time")
    ap.add_argument("--duration", type=float, default=120.0)
    ap.add_argument("-v", action="store_true")
    ap.add_argument("--keyed", action="store_true", help="retry a failed append with its key")
    args = ap.parse_args()
    print(simloop.run(lambda lp: run(lp, args)))


async def run(lp: simloop.SimLoop, args: argparse.Namespace) -> str:
    rng = random.Random(args.seed)
    trace_lines: list[str] = []
    sim = SimStore(lp, random.Random(args.seed * 7 + 1), trace_lines.append)
    sim.faults_on = False
    clock = simloop.VirtualClock(lp)

    def opts(name: str) -> LogWriterOptions:
        return LogWriterOptions(
            writer_name=name,
            clock=clock,
            batch=BatchOptions(interval_s=0.001),
            lease=LeaseOptions(read_lease_s=args.lease),
        )

    writers = []
    for i in range(args.writers):
        store = sim.view(sim.actor(f"w{i}", faulty=False))
        writers.append(await LogWriter.open(store, PREFIX, opts(f"w{i}")))
    gcs = sim.view(sim.actor("gc", faulty=False))
    edits: collections.Counter[str] = collections.Counter()
    stop = False

    async def collector() -> None:
        key = join(PREFIX, MANIFEST_PATH)
        while not stop:
            if args.gc_until is not None and lp.time() >= args.gc_until:
                return
            gap = (
                args.gc_period if args.gc_period is not None else rng.expovariate(1 / args.gc_mean)
            )
            await asyncio.sleep(gap)
            loaded = await load_manifest(gcs, PREFIX)
            assert loaded is not None
            m, etag = loaded
            floor = (
                None if m.gc_floor is not None else GcFloor(m.oldest_offset, secrets.token_hex(16))
            )
            try:
                await put_resolving(
                    gcs, key, replace(m, gc_floor=floor, writer="gc").to_bytes(), if_match=etag
                )
                edits["ok"] += 1
            except PreconditionFailed:
                edits["lost"] += 1

    res: dict[str, collections.Counter[str]] = {
        f"w{i}": collections.Counter() for i in range(args.writers)
    }
    last_ack = [0.0]
    longest_gap = [0.0]
    lat = [0.0, 0.0]
    errors: dict[str, list[str]] = collections.defaultdict(list)

    answers: dict[bytes, list] = collections.defaultdict(list)

    async def appender(i: int, j: int) -> None:
        w = writers[i]
        n = 0
        retry = False
        while not stop:
            if not retry:
                n += 1
            body = f"w{i}-{j}-{n}".encode()
            key = body.decode() if args.keyed else None
            retry = False
            t0 = lp.time()
            try:
                r = await w.append_many([body], idempotency_key=key)
                answers[body].append(("dedup" if r.deduplicated else "acked", r.first_offset))
                res[f"w{i}"]["acked"] += 1
                t = lp.time()
                lat[0] = max(lat[0], t - t0)
                longest_gap[0] = max(longest_gap[0], t - last_ack[0])
                last_ack[0] = t
            except LogContention:
                answers[body].append(("contention", None))
                res[f"w{i}"]["contention"] += 1
                await asyncio.sleep(0.01)
            except Exception as e:
                res[f"w{i}"]["failed"] += 1
                answers[body].append(("failed", type(e).__name__))
                retry = args.keyed
                lat[1] = max(lat[1], lp.time() - t0)
                if len(errors[f"w{i}"]) < 3:
                    errors[f"w{i}"].append(f"t={lp.time():.1f} {e!r}"[:300])
                await asyncio.sleep(0.01)

    tasks = [asyncio.ensure_future(collector())]
    tasks += [
        asyncio.ensure_future(appender(i, j)) for i in range(args.writers) for j in range(args.conc)
    ]
    await asyncio.sleep(args.duration)
    longest_gap[0] = max(longest_gap[0], lp.time() - last_ack[0])
    stop = True
    await asyncio.sleep(30)
    for w in writers:
        await w.close()
    final = await LogWriter.open(sim.view(sim.actor("final", faulty=False)), PREFIX, opts("final"))
    await final.append_many([b"final"])
    await final.close()
    from wal3 import Limits, LogReader

    rd = await LogReader.open(sim.view(sim.actor("reader", faulty=False)), PREFIX)
    recs = await rd.read(1, Limits(max_files=10**6))
    where = collections.defaultdict(list)
    for r in recs:
        where[r.body].append(r.offset)
    bad = []
    for body, offs in where.items():
        if len(offs) > 1:
            bad.append(f"DUPLICATE {body!r} at {offs} answers={answers.get(body)}")
    for body, ans in answers.items():
        offs = where.get(body, [])
        for kind, off in ans:
            if kind in ("acked", "dedup") and off not in offs:
                bad.append(f"ACK AT WRONG OFFSET {body!r} acked {off} log {offs} answers={ans}")
            if kind == "contention" and offs:
                bad.append(f"CONTENTION BUT WRITTEN {body!r} at {offs} answers={ans}")
    last: dict[str, tuple[int, int]] = {}
    for r in recs:
        if r.body == b"final":
            continue
        wi, j, n = r.body.decode().split("-")
        k = f"{wi}-{j}"
        if k in last and last[k][0] >= int(n):
            bad.append(f"ORDER {r.body!r} at {r.offset} after n={last[k][0]} at {last[k][1]}")
        last[k] = (int(n), r.offset)
    nfailed_in_log = sum(
        1 for b, a in answers.items() if any(k == "failed" for k, _ in a) and b in where
    )
    out = [
        f"log records={len(recs)} failed-then-in-log={nfailed_in_log} violations={len(bad)}",
        *bad[:10],
    ]
    out += [
        f"seed={args.seed} gc edits={dict(edits)} longest no-ack gap={longest_gap[0]:.1f}s max ack latency={lat[0]:.1f}s max fail latency={lat[1]:.1f}s"
    ]
    for i, w in enumerate(writers):
        st = {
            k: v
            for k, v in w.stats.items()
            if k in ("recoveries", "repaired", "manifest_conflicts", "contention")
        }
        out.append(
            f"  w{i}: {dict(res[f'w{i}'])} stats={st} raced_rounds={w._recovery._raced_rounds}"
        )
        for e in errors[f"w{i}"]:
            out.append(f"     {e}")
    return "\n".join(out)


if __name__ == "__main__":
    main()
