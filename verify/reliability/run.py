"""``python -m verify.reliability``: the end-to-end reliability verifier under seeded faults.

The promise under test: every acknowledged write is read back exactly once, and the setsum proves
the data at rest intact.  Each scenario runs writers (uniquely tagged records, idempotency keys,
retries), long-polling readers and a fault schedule derived from its seed, then audits: every
acknowledged record read back exactly once at its offset, no record twice, dense offsets, every log
scrubbed clean, the dirty set complete.  One line per run::

    scenario=<name> seed=<s> acknowledged=<n> read=<n> lost=<n> duplicated=<n> faults=<n> scrub=<ok|FAIL> ...

Forms:

``python -m verify.reliability --quick``
    one seed of every scenario, small (about 3 minutes on 2 cores; what tests/verify runs).
``python -m verify.reliability``
    the long form: ``--seeds 6`` seeds of every scenario (19 scenarios, 108 seeded schedules
    counting the soak) plus a 10-minute soak with 1,000 logs; about an hour on 2 cores.
    ``--write-doc`` rewrites docs/RELIABILITY.md with the results.
``python -m verify.reliability --scenario crash_gc_apply --seed 17``
    rerun one schedule.

Exit status 1 if any run lost or duplicated a record, failed a scrub, or broke another check.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from verify.testkit import command_line, machine_info, redis_executable
from wal3 import paths

from .core import Result
from .infra import ROOT
from .scenarios import SCENARIOS, Options, seeds_for

DOC = ROOT / "docs" / "RELIABILITY.md"
OUT = ROOT / "bench" / "out"
DEFAULT_SEEDS = 6
LONG_COMMAND = "python -m verify.reliability --write-doc"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m verify.reliability",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="scenarios:\n" + "\n".join(f"  {n:24s} {d}" for n, (_, d) in SCENARIOS.items()),
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="small bounded form of each scenario (one seed unless --seeds)",
    )
    p.add_argument(
        "--seeds",
        type=int,
        default=None,
        help=f"seeds per store-fault scenario (default {DEFAULT_SEEDS}; 1 with "
        f"--quick); kill9/two_hosts/redis_restart get 2/3 of that, "
        f"compactor_kill half, the soak one",
    )
    p.add_argument("--first-seed", type=int, default=1, help="the first seed (default 1)")
    p.add_argument("--seed", type=int, default=None, help="run exactly this seed")
    p.add_argument(
        "--soak-seconds", type=float, default=600.0, help="duration of the long soak (default 600)"
    )
    p.add_argument("--logs", type=int, default=1000, help="logs in the long soak (default 1000)")
    p.add_argument(
        "--scenario", default=None, help="comma-separated scenarios to run (default: all)"
    )
    p.add_argument(
        "--write-doc", action="store_true", help="rewrite docs/RELIABILITY.md with these results"
    )
    p.add_argument(
        "--keep",
        action="store_true",
        help="keep every run's directory (stores, host logs); failing runs are always kept",
    )
    p.add_argument(
        "--workdir", default=None, help="where run directories go (default: a temporary directory)"
    )
    return p


async def run_one(
    name: str, seed: int, quick: bool, workdir: Path, opts: Options | None = None
) -> Result:
    """Run one scenario with one seed in ``workdir`` (created), in this process."""
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    fn, _ = SCENARIOS[name]
    started = time.monotonic()
    try:
        result = await fn(seed, quick, workdir, opts or Options())
    except Exception as e:
        result = Result(name, seed, error=repr(e), seconds=time.monotonic() - started)
    return result


def time_limit(name: str, quick: bool, opts: Options) -> float:
    """The hard limit of one run (a hung host must fail the run, not stall the harness)."""
    if name == "soak":
        return (10.0 if quick else opts.soak_seconds) + 900.0
    if name in ("compactor_kill", "compaction_invariants"):
        return 600.0 if quick else 1500.0
    return 180.0 if quick else 600.0


async def run_isolated(
    name: str,
    seed: int,
    quick: bool,
    workdir: Path,
    opts: Options | None = None,
    timeout_s: float | None = None,
) -> Result:
    """Run one scenario in a child process with a hard time limit.

    In-process scenarios share the event loop with their host: a host that livelocks its loop
    would freeze the harness.  The child dumps every thread's stack to ``workdir/hang.txt``
    shortly before the limit; then it is killed and the run reported as hung.
    """
    opts = opts or Options()
    limit = timeout_s or time_limit(name, quick, opts)
    await asyncio.to_thread(workdir.mkdir, parents=True, exist_ok=True)
    out = workdir / "result.json"
    cmd = [
        sys.executable,
        "-m",
        "verify.reliability",
        "--_child",
        name,
        str(seed),
        "1" if quick else "0",
        str(workdir),
        str(limit - 10),
        str(opts.soak_seconds),
        str(opts.soak_logs),
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    started = time.monotonic()
    log = await asyncio.to_thread(open, workdir / "child.log", "ab")
    with log:
        proc = await asyncio.create_subprocess_exec(
            *cmd,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            await asyncio.wait_for(proc.wait(), limit)
        except (TimeoutError, asyncio.CancelledError):
            _kill_group(proc.pid)
            await proc.wait()
            hang = workdir / "hang.txt"
            where = _hang_summary(hang) if hang.exists() else "no stack dump"
            return Result(
                name,
                seed,
                error=f"hung: no result after {limit:.0f}s ({where}); stacks in {hang}",
                seconds=time.monotonic() - started,
            )
        finally:
            _kill_group(proc.pid)  # whatever the child left behind (hosts, redis, Spark)
    if not out.exists():
        hang = workdir / "hang.txt"
        if proc.returncode == 3 and hang.exists():
            return Result(
                name,
                seed,
                error=f"hung: the event loop stalled for {STALL_S:.0f}s "
                f"({_hang_summary(hang)}); stacks in {hang}",
                seconds=time.monotonic() - started,
            )
        tail = (workdir / "child.log").read_text(errors="replace")[-1500:]
        return Result(
            name,
            seed,
            error=f"child exited {proc.returncode} without a result: {tail}",
            seconds=time.monotonic() - started,
        )
    return Result.from_dict(json.loads(out.read_text()))


def _kill_group(pgid: int) -> None:
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)  # the child's own session: it and what it started


def _hang_summary(path: Path) -> str:
    """The innermost host frame of the busy thread in a faulthandler dump."""
    lines = path.read_text(errors="replace").splitlines()
    frames = [ln.strip() for ln in lines if ln.strip().startswith("File ")]
    for f in frames:
        if "/host/" in f or "/wal3/" in f or "/dirtylog/" in f:
            return f
    return frames[0] if frames else "see the dump"


STALL_S = 30.0
_last_beat = [time.monotonic()]


async def _heartbeat() -> None:
    while True:
        _last_beat[0] = time.monotonic()
        await asyncio.sleep(0.5)  # the heartbeat the stall watchdog looks for


def _start_stall_watchdog(wd: Path, hang: Any) -> None:
    """A thread that notices an event loop making no progress (a livelocked in-process host
    freezes the harness with it): it dumps every stack and ends the child."""
    import faulthandler
    import threading

    def watch() -> None:
        while True:
            time.sleep(1.0)  # the watchdog's own clock, in its own thread
            if time.monotonic() - _last_beat[0] > STALL_S:
                hang.write(f"event loop stalled for more than {STALL_S:.0f}s\n")
                hang.flush()
                faulthandler.dump_traceback(file=hang, all_threads=True)
                hang.flush()
                os._exit(3)

    threading.Thread(target=watch, name="stall-watchdog", daemon=True).start()


def _child(argv: list[str]) -> int:
    """``--_child NAME SEED QUICK WORKDIR DUMP_AFTER SOAK_S LOGS``: one run, result as JSON."""
    import faulthandler

    name, seed, quick, workdir, dump_after, soak_s, logs = argv
    wd = Path(workdir)
    _setup_logging(wd / "host.log")
    hang = open(wd / "hang.txt", "w")  # noqa: SIM115 - kept open for faulthandler
    faulthandler.dump_traceback_later(float(dump_after), exit=False, file=hang)
    opts = Options(soak_seconds=float(soak_s), soak_logs=int(logs))

    async def main() -> Result:
        beat = asyncio.create_task(_heartbeat())
        try:
            return await run_one(name, int(seed), quick == "1", wd, opts)
        finally:
            beat.cancel()

    _start_stall_watchdog(wd, hang)
    result = asyncio.run(main())
    faulthandler.cancel_dump_traceback_later()
    hang.close()
    if (wd / "hang.txt").stat().st_size == 0:
        (wd / "hang.txt").unlink()
    (wd / "result.json").write_text(json.dumps(result.as_dict(), default=str))
    return 0


def _setup_logging(path: Path) -> None:
    """Host and engine warnings go to a file; only failures of the harness to the terminal."""
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    root.handlers.clear()
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.WARNING)


async def _main(args: argparse.Namespace) -> tuple[list[Result], float]:
    names = list(SCENARIOS)
    if args.scenario:
        names = [n.strip() for n in args.scenario.split(",") if n.strip()]
        unknown = [n for n in names if n not in SCENARIOS]
        if unknown:
            raise SystemExit(f"unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
    if redis_executable() is None and "redis_restart" in names:
        print("# redis-server not installed: skipping redis_restart", flush=True)
        names.remove("redis_restart")
    nseeds = args.seeds if args.seeds is not None else (1 if args.quick else DEFAULT_SEEDS)
    seeds = (
        [args.seed]
        if args.seed is not None
        else list(range(args.first_seed, args.first_seed + nseeds))
    )
    opts = Options(soak_seconds=args.soak_seconds, soak_logs=args.logs)
    base = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="reliability-"))
    _setup_logging(base / "harness.log")
    print(f"# {command_line()}  (run directories under {base})", flush=True)
    results: list[Result] = []
    t0 = time.monotonic()
    for name in names:
        mine = seeds if args.seed is not None else seeds[: seeds_for(name, len(seeds))]
        for seed in mine:
            workdir = base / f"{name}-{seed}"
            r = await run_isolated(name, seed, args.quick, workdir, opts)
            results.append(r)
            print(r.line(), flush=True)
            if not r.ok:
                for v in r.violations[:10]:
                    print(f"#   {v}", flush=True)
                print(f"#   kept {workdir}", flush=True)
            elif not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    return results, time.monotonic() - t0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--_child"]:
        return _child(argv[1:])
    args = _parser().parse_args(argv)
    results, seconds = asyncio.run(_main(args))
    bad = [r for r in results if not r.ok]
    total = {
        k: sum(getattr(r, k) for r in results)
        for k in ("acknowledged", "read", "lost", "duplicated", "faults")
    }
    print(
        f"# {len(results)} runs in {seconds:.0f}s: "
        + " ".join(f"{k}={v}" for k, v in total.items())
        + f" scrub_failures={sum(not r.scrub_ok for r in results)} failed_runs={len(bad)}",
        flush=True,
    )
    OUT.mkdir(parents=True, exist_ok=True)
    out = OUT / f"reliability{'.quick' if args.quick else ''}.json"
    data = {
        "command": command_line(),
        "machine": _machine(),
        "seconds": seconds,
        "quick": args.quick,
        "results": [r.as_dict() for r in results],
    }
    out.write_text(json.dumps(data, indent=1, default=str) + "\n")
    print(f"# results: {out.relative_to(ROOT)}", flush=True)
    if args.write_doc:
        DOC.write_text(render_doc(data) + _kept_part(DOC.read_text() if DOC.exists() else ""))
        print(f"# wrote {DOC.relative_to(ROOT)}", flush=True)
    return 1 if bad else 0


def _machine() -> dict[str, Any]:
    """The shared machine facts, plus whether the tree had uncommitted changes."""
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no"],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    ).stdout.strip()
    return {**machine_info(), "git_dirty": bool(dirty)}


# ------------------------------------------------------------------------------------ doc

# Bugs this verifier found, each with its regression test (tests/verify/test_reliability_regressions.py):
# (found by, test, what goes wrong, status).
FIXED_7 = "fixed (384b0ed)"
FINDINGS: list[tuple[str, str, str, str]] = [
    (
        "storms",
        "test_regression_writer_links_snapshot_that_a_409_kept_out_of_the_store",
        "a snapshot put that fails its condition (S3's 409 ConditionalRequestConflict) is taken as "
        "proof the snapshot exists, and the manifest links a snapshot that was never written: reads "
        "through it fail, acknowledged records are unreadable, scrub fails "
        "(`LogWriter._write_snapshot`)",
        FIXED_7,
    ),
    (
        "storms",
        "test_regression_gc_links_split_snapshot_that_a_409_kept_out_of_the_store",
        "the same in garbage collection: a split snapshot is assumed written after a failed "
        "condition and phase 2 installs a root pointing at nothing (`GarbageCollector._phase1`)",
        FIXED_7,
    ),
    (
        "(review of the same pattern)",
        "test_regression_fork_links_fragment_copy_that_a_409_kept_out_of_the_store",
        "the same in fork: a fragment copy that fails its condition is taken as already copied "
        "and the fork references a fragment it does not have (`fork_log`)",
        FIXED_7,
    ),
    (
        "crash_fragment_manifest, crash_snapshot, soak",
        "test_regression_cancelled_close_livelocks_the_next_request_for_that_log",
        "when the request awaiting a log's close is cancelled (client gone), a finished task stays "
        "in `LogManager._closing`; the next request for that log spins on "
        "`await asyncio.shield(<done task>)`, which never yields: the host's event loop livelocks "
        "and it stops answering everything, health checks included",
        FIXED_7,
    ),
    (
        "crash_snapshot, crash_gc_apply",
        "test_regression_idempotency_keys_in_snapshotted_fragments_are_forgotten_on_reopen",
        "a reopened writer (restart, failover) learns idempotency keys only from the root's "
        "fragments: keys in fragments already folded into snapshots are forgotten and a client's "
        "retry after a crash appends its records a second time",
        FIXED_7,
    ),
    (
        "redis_restart, two_hosts",
        "test_regression_writer_repeats_a_batch_another_writer_linked_into_a_snapshot",
        "`Manifest.contains_fragment` only looks at the root: when another host read-repairs a "
        "writer's fragment and snapshots fold it, the writer's recovery does not see its batch "
        'linked and appends it again (duplicate, second copy acknowledged) or answers 409 "not '
        'written" for records that are in the log',
        FIXED_7,
    ),
    (
        "two_hosts",
        "test_regression_append_joining_a_reads_open_of_a_new_log_gets_404",
        "`LogManager._get_or_open` shares one open per log regardless of `create`: an append that "
        "arrives while a read is opening a new log (tenant bound, manifest not yet written) gets "
        'the read\'s 404 "never written"',
        FIXED_7,
    ),
    (
        "crash_rollup_cursor (long form)",
        "test_regression_keys_of_fragments_repaired_while_keys_load_are_dropped",
        "after a restart, keys of an orphan fragment that read repair links while the writer's "
        "first idempotency-key load is still reading footers are never learned "
        "(`LogWriter._recover` learns them only `if self._keys_loaded`): the client's retry of the "
        "append that wrote the orphan is appended a second time",
        "open",
    ),
    (
        "crash_fragment_manifest, crash_gc_reset (crash + compaction + GC)",
        "test_regression_idempotency_window_ends_at_the_gc_cutoff_after_reopen",
        "a reopened writer learns idempotency keys only from fragments still live in the "
        "manifest: once a compactor and GC have moved the oldest offset past an append, a client "
        "retrying it after a crash or failover gets it appended again, however recent it is "
        "(the window is `dedup_window_fragments` in name, the uncompacted tail in fact)",
        "open",
    ),
]


def _kinds(rs: list[dict[str, Any]]) -> str:
    total: dict[str, int] = {}
    for r in rs:
        for k, v in (r.get("fault_kinds") or {}).items():
            total[k] = total.get(k, 0) + int(v)
    return ", ".join(f"{k} {v:,}" for k, v in sorted(total.items()) if v) or "-"


def _seeds(rs: list[dict[str, Any]]) -> str:
    s = sorted(int(r["seed"]) for r in rs)
    if len(s) > 2 and s == list(range(s[0], s[-1] + 1)):
        return f"{s[0]}-{s[-1]}"
    return ",".join(map(str, s))


def _mib(kib: Any) -> str:
    return "-" if not kib else f"{int(kib) / 1024:.0f} MiB"


KEEP_MARKER = "<!-- kept by verify.reliability --write-doc"


def _kept_part(text: str) -> str:
    """What follows the marker: the simulator's, the engine's and mutation testing's sections
    are not this generator's to rewrite."""
    i = text.find(KEEP_MARKER)
    return "" if i < 0 else "\n" + text[i:]


def render_doc(data: dict[str, Any]) -> str:
    results: list[dict[str, Any]] = data["results"]
    m = data["machine"]
    by: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by.setdefault(r["scenario"], []).append(r)
    rows = []
    for name, rs in by.items():
        ok = sum(1 for r in rs if r["ok"])
        rows.append(
            f"| {name} | {_seeds(rs)} | {sum(r['faults'] for r in rs):,} | {_kinds(rs)} | "
            f"{sum(r['acknowledged'] for r in rs):,} | {sum(r['read'] for r in rs):,} | "
            f"{sum(r['lost'] for r in rs)} | {sum(r['duplicated'] for r in rs)} | "
            f"{sum(1 for r in rs if r['scrub_ok'])}/{len(rs)} ok | "
            f"{ok}/{len(rs)} | {sum(r['seconds'] for r in rs):.0f} |"
        )
    per_seed = [
        f"| {r['scenario']} | {r['seed']} | {r['faults']:,} | {r['acknowledged']:,} | "
        f"{r['read']:,} | {r['lost']} | {r['duplicated']} | "
        f"{'ok' if r['scrub_ok'] else 'FAIL'} | {len(r['violations'])} | "
        f"{r['unacked_present']}/{r['unacked_absent']} | {r['seconds']:.1f} |"
        for r in results
    ]
    soak = [r for r in results if r["scenario"] == "soak"]
    soak_md = "(the soak was not part of this run)"
    if soak:
        s = soak[0]
        mem = s["notes"].get("memory", {})
        samples = ", ".join(f"{t:.0f}s {_mib(k)}" for t, k in mem.get("samples", []))
        soak_md = "\n".join(
            [
                f"One host process (`python -m verify.reliability.host`, i.e. `Server` + uvicorn over a "
                f"FaultyStore) served **{s['logs']:,} logs** for **{s['notes'].get('seconds_of_load', 0):.0f} s** "
                f"of load: {s['notes'].get('appends_acknowledged', 0):,} appends "
                f"({s['acknowledged']:,} records) acknowledged, {s['faults']:,} store faults injected "
                f"({_kinds([s])}), lost {s['lost']}, duplicated {s['duplicated']}, scrub "
                f"{'ok' if s['scrub_ok'] else 'FAIL'}.",
                "",
                "| host RSS at start (idle) | after warm-up | peak | end of load | after the audit |",
                "|---:|---:|---:|---:|---:|",
                f"| {_mib(mem.get('start_kib'))} | {_mib(mem.get('warm_kib'))} | "
                f"{_mib(mem.get('peak_kib'))} | {_mib(mem.get('end_kib'))} | "
                f"{_mib(mem.get('after_audit_kib'))} |",
                "",
                f"RSS samples (time since the load started): {samples or '-'}.",
            ]
        )
    total_ack = sum(r["acknowledged"] for r in results)
    total_lost = sum(r["lost"] for r in results)
    total_dup = sum(r["duplicated"] for r in results)
    total_faults = sum(r["faults"] for r in results)
    failed = [r for r in results if not r["ok"]]
    scen_md = "\n".join(f"| `{n}` | {d} |" for n, (_, d) in SCENARIOS.items())
    findings_md = "\n".join(
        f"| {by} | `{test}` | {what} | {status} |" for by, test, what, status in FINDINGS
    )

    def _short(text: str, n: int = 240) -> str:
        text = " ".join(str(text).split())
        return text if len(text) <= n else text[:n] + "..."

    failed_md = (
        "none."
        if not failed
        else "\n\n"
        + "\n".join(
            f"- `{r['scenario']}` seed {r['seed']} "
            f"(`python -m verify.reliability --scenario {r['scenario']} --seed {r['seed']}"
            f"{' --quick' if data['quick'] else ''}`): "
            + _short(r.get("error") or (r["violations"][0] if r["violations"] else "failed"))
            + (
                f" (+{r.get('violation_count', len(r['violations'])) - 1} more)"
                if r.get("violation_count", len(r["violations"])) > 1
                else ""
            )
            for r in failed
        )
    )
    current = paths.CURRENT_NAME  # the compactors' pointer object
    return f"""# Reliability

The promise: **every acknowledged write is read back exactly once, and the setsum proves the data
at rest intact.**  This page is generated by `verify/reliability/` (do not edit by hand) and shows
what the verifier did to the log host and what it found.

## Results

Command: `{data["command"]}` ({"quick form" if data["quick"] else "long form"}), {len(results)}
seeded runs in {data["seconds"] / 60:.0f} minutes.

Machine: {m["nproc"]} cores; `{m["uname"]}`; Python {m["python"]}; {m["date_utc"]}; commit
{m["git_head"]}{" with uncommitted changes" if m.get("git_dirty") else ""}.

**Totals: {total_ack:,} records acknowledged, {total_lost} lost, {total_dup} duplicated,
{total_faults:,} faults injected, {sum(1 for r in results if r["scrub_ok"])}/{len(results)} runs
scrubbed clean, {len(results) - len(failed)}/{len(results)} runs without any violation.**

Failed runs: {failed_md}

| scenario | seeds | faults | fault kinds | acknowledged | read | lost | duplicated | scrub | runs ok | seconds |
|:--|:--|--:|:--|--:|--:|--:|--:|:--|--:|--:|
{chr(10).join(rows)}

*acknowledged*: records whose append got a 200.  *read*: records read back by the audit (plus
records below a log's oldest offset that a tailer read before GC removed them).  *lost*: an
acknowledged record missing from its log, or not at the offset its 200 named.  *duplicated*:
extra copies of any tag anywhere (acknowledged or not).  *faults*: store faults the FaultyStore
injected (every kind it counts, including each crash point), or the process-level events (kill -9,
Redis stops, compactor kills; for two hosts, the 409s their fencing produced).  *scrub*: every log
(collection logs and dirty logs) verified from the objects by `scrub_log`, and every collection also
through `GET .../scrub`.

### Soak: memory of the host

{soak_md}

Reading it: ten minutes show the memory at the start and the end of the load, not whether the
growth levels off.  What an open log holds grows with its traffic only up to fixed bounds: its
manifest until a snapshot or GC trims it (`LOGHOST_SNAPSHOT_FRAGMENT_THRESHOLD`), and its
idempotency keys, which expire with their fragments (the last 256) and are capped at 10,000 per
log.  The figure after the audit is higher because the audit reads every log back.

## How to run and reproduce

- Quick form (also part of `make test` through `tests/verify/test_reliability_quick.py`):
  `python -m verify.reliability --quick` (about 3 minutes on 2 cores).
- Long form, as above: `{LONG_COMMAND}` (= `make reliability` plus `--write-doc`):
  {DEFAULT_SEEDS} seeds of every scenario and a 600 s soak with 1,000 logs; about an hour
  on 2 cores.  `--seeds 100` runs 100 seeds of every scenario (about 15 hours).
- One schedule: `python -m verify.reliability --scenario NAME --seed S [--quick]`.  Everything
  random (fault rates, rule positions, crash points and their order, kill points, writer plans,
  batch sizes, rates, collection ids) is drawn from `random.Random` seeded with S, so the same
  seed gives the same schedule.  Which of several concurrent requests a probabilistic fault lands
  on depends on timing, so the exact interleaving is not bit-for-bit reproducible.
- Each run prints one line `scenario= seed= acknowledged= read= lost= duplicated= faults= scrub=`
  (then violations, unacknowledged records present/absent, logs, seconds); the exit status is 1
  if any run lost or duplicated a record, failed a scrub or broke another check.  A failing run's
  directory (the store, host logs, compactor logs) is kept and its path printed; JSON results go
  to `bench/out/reliability[.quick].json`.

## What the verifier does

**Writers** append batches of 1-6 uniquely tagged records (`metadata.tag`) to random collections
of two tenants at a seeded variable rate (bursts, lulls, steady phases).  90% of appends carry an
idempotency key and are retried with it after *any* failure (connection error, timeout, 5xx, 409
contention, 429, redirect loop) until acknowledged; 10% carry none and are only re-sent when the
request certainly did not land (connection refused, 409 contention, 429) - after an ambiguous
failure they are given up (such a record may appear once, never twice).  A record is
*acknowledged* only on a 200, at the offsets the 200 names.

**Readers** long-poll every collection (`GET .../records?from=N&wait_ms=W`, a sweeper reads the
rest when there are more than 32-64 logs) and check every page: it starts at N, offsets are dense,
`next_offset` follows the last record, and an offset never shows a different record than before
(a reader never sees data that is later rolled back).

**Drivers** act like compactors and operators: they move compaction cursors to what the readers
have read (never further) and run GC (`gc_grace_s=0`, so phase 3 deletes at once), and roll the
dirty log up, all under the same faults.

**The audit**, with faults off and writers done: readers must reach every log's tail; GC is
driven to rest; every log is read back from its oldest offset through the API.  Then: every
acknowledged record is in its log exactly once and at its acknowledged offset (below the oldest
offset it must be below the compaction cursor and must have been read there by a reader); no tag
appears twice anywhere; offsets are dense; nothing appears that nobody sent; every log scrubs
clean (setsum of the live fragments plus `collected` equals the manifest's setsum, every fragment's
records hash to its pointer's setsum, ranges contiguous); and after a roll-up the dirty sets of the
hosts cover every collection's uncompacted range.

**Crashes** (in-process scenarios): the FaultyStore raises `SimulatedCrash` at the scheduled point;
a `CrashLatch` around the store then fails every later request of that server incarnation, so
the "dead" process can write nothing more (not even while shutting down).  The harness restarts a
fresh `Server` + uvicorn on the same store, port and server id, arms the next crash point, and the
clients retry with their keys.  GC and roll-up crash points are *phase-gated*: the latch observes
`gc/GARBAGE` (plan, applied, reset) and the `stable_prefix` cursor, so a rule fires only inside
the phase it names.

## Bugs found

Each has a regression test in `tests/verify/test_reliability_regressions.py` that fails until it is fixed.

| found by | regression test | what goes wrong | status |
|:--|:--|:--|:--|
{findings_md}

## Scenarios

| scenario | what is done to the host |
|:--|:--|
{scen_md}

Per-scenario details: store-fault scenarios run one in-process host (real uvicorn on 127.0.0.1)
over `FaultyStore(LocalStore)` (no fsync: the crashes emulated are process deaths, which the page
cache survives); quick form 6 writers x 30 appends into 6 collections, long form 10 writers x 80
appends into 16 collections, batches of 1-4 (quick) or 1-6 records, snapshots every 2-6
fragments.  Crash scenarios arm 2
(quick) or 4 (long) crash points one after another.  `kill9`, `two_hosts`, `redis_restart` and
`compactor_kill` run `python -m host.cli serve` processes (and `redis-server`, and
`python -m compactor_client run --once` with Spark `local[2]`).  In `compactor_kill` every log also
carries a reader cursor at 1 so the audit can fold the whole log: after the kill every
`{current}` must be readable, no cursor ahead of its `{current}` offset and each version equal
to a reference fold (`verify/oracle.py`) of the log up to
its offset; after the rerun every cursor must equal its `{current}` offset and the log's tail.

## Covered and not covered

Covered: the faults above, on the embedded `LocalStore`; one and two host processes; Redis loss;
compactor death; GC and roll-up phases; snapshots; LRU eviction under load (the quick soak keeps
40 of its 100 logs open); 1,000 logs on one host for the long soak (at the default
`max_open_logs=1024`, with idle closing after 30 s, roll-ups every 10 s and continuous compaction
and GC).

Not covered here: S3 itself (moto and the S3 fault proxy are exercised by `tests/wal3` and
`tests/compactor_client`; FaultyStore's `error` stands for a 5xx/429 that outlived the S3 client's
retries); disk corruption and torn writes (scrub detects them, see `tests/wal3`); clock skew;
network partitions between hosts other than Redis going away; more than two hosts; bad input and
security (a colleague's suite); performance (see docs/PERFORMANCE.md).  Timing-dependent
interleavings are sampled, not enumerated: a clean run is evidence, not proof.

## Per-seed results

| scenario | seed | faults | acknowledged | read | lost | duplicated | scrub | violations | unacked present/absent | seconds |
|:--|--:|--:|--:|--:|--:|--:|:--|--:|--:|--:|
{chr(10).join(per_seed)}
"""
