"""Summaries of seed ranges: text for the terminal, a markdown block for docs/RELIABILITY.md."""

from __future__ import annotations

import collections
import json
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .run import RunResult, run_seed, run_seeds

DOCS = Path(__file__).resolve().parents[2] / "docs" / "RELIABILITY.md"
BEGIN = "<!-- verify.sim:summary:begin -->"
END = "<!-- verify.sim:summary:end -->"
CHUNK = 25


@dataclass
class Summary:
    """Totals over a range of seeds."""

    first: int
    last: int
    seeds: int = 0
    steps: int = 0
    ops: int = 0
    virtual_s: float = 0.0
    wall_s: float = 0.0
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    stats: collections.Counter[str] = field(default_factory=collections.Counter)
    failures: list[RunResult] = field(default_factory=list)
    jobs: int = 1
    commit: str = ""
    sittings: int = 1  # processes the range was run in (a ledger resumes an interrupted run)

    @property
    def ok(self) -> bool:
        return not self.failures

    def add(self, r: RunResult) -> None:
        self.seeds += 1
        self.steps += r.steps
        self.ops += r.ops
        self.virtual_s += r.virtual_s
        self.faults.update(r.faults)
        self.stats.update(r.stats)
        if not r.ok:
            self.failures.append(r)

    def known_bugs(self) -> dict[int, list[int]]:
        """Known bug of 3c61663 -> the failing seeds that show it."""
        from .known import classify

        out: dict[int, list[int]] = {}
        for r in sorted(self.failures, key=lambda r: r.seed):
            for bug in sorted(classify(r)):
                out.setdefault(bug, []).append(r.seed)
        return out

    def markdown(self) -> str:
        rate = self.seeds / self.wall_s if self.wall_s else 0.0
        at = f" at commit {self.commit}" if self.commit else ""
        sittings = f", in {self.sittings} sittings" if self.sittings > 1 else ""
        lines = [
            f"`python -m verify.sim --seeds {self.first}:{self.last} --jobs {self.jobs}`{at}: "
            f"{self.seeds} seeds, {self.steps} steps, {self.ops} store operations, "
            f"{self.virtual_s:,.0f} s of virtual time in {self.wall_s:,.0f} s{sittings} "
            f"({rate:.1f} seeds/s).",
            "",
            "| faults injected | count |",
            "|---|---:|",
        ]
        lines.extend(f"| {k} | {self.faults[k]} |" for k in sorted(self.faults))
        lines += ["", "| actions | count |", "|---|---:|"]
        lines.extend(f"| {k} | {self.stats[k]} |" for k in sorted(self.stats))
        lines.append("")
        if self.failures:
            by_check: dict[str, list[int]] = collections.defaultdict(list)
            for r in self.failures:
                by_check[r.violations[0].check].append(r.seed)
            lines.append(f"Violations in {len(self.failures)} seeds:")
            lines.append("")
            for check, seeds in sorted(by_check.items()):
                shown = ", ".join(str(s) for s in seeds[:10])
                lines.append(f"- `{check}`: {len(seeds)} seeds (first: {shown})")
                r0 = next(r for r in self.failures if r.seed == seeds[0])
                lines.append(f"  - seed {r0.seed}: {r0.violations[0]}")
        else:
            lines.append("Violations: none.")
        return "\n".join(lines)


def _chunks(a: int, b: int) -> list[list[int]]:
    return [list(range(i, min(b, i + CHUNK))) for i in range(a, b, CHUNK)]


class Ledger:
    """Chunks of a range already run, kept in a JSON-lines file so a long run survives its
    process: an interrupted ``--seeds A:B --ledger F`` resumes where it stopped.

    The first line names the range, the commit it began at and the git trees of the engine and
    simulator (:data:`SOURCE_TREES`); a ledger is only resumed by the same range over the same,
    unmodified trees (at that commit or any later one that left them alone), so its totals
    describe one piece of code.  Each further line is one finished chunk's totals; failing seeds are stored by number
    and re-run (deterministically) when the ledger is loaded, to rebuild their traces.
    """

    def __init__(self, path: Path, first: int, last: int) -> None:
        self.path = path
        self.first, self.last = first, last
        self.commit = source_commit()
        self.trees = source_trees()
        self.done: dict[int, dict[str, Any]] = {}  # parsed JSON lines
        self.sittings = 1
        if path.exists():
            lines = path.read_text().splitlines()
            head = json.loads(lines[0])
            if (head["first"], head["last"], head.get("trees")) != (first, last, self.trees):
                raise SystemExit(
                    f"{path} is a ledger of --seeds {head['first']}:{head['last']} over trees "
                    f"{head.get('trees')} (commit {head['commit']}), not of {first}:{last} "
                    f"over {self.trees} (commit {self.commit})"
                )
            self.commit = str(head["commit"])  # the run is reported at the commit it began at
            for line in lines[1:]:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:  # the last line of a run killed mid-write
                    continue
                if entry.get("sitting"):
                    self.sittings += 1
                    continue
                self.done[int(entry["chunk"])] = entry
            with open(path, "a") as f:  # this process is one more sitting
                f.write(json.dumps({"sitting": True}) + "\n")
            self.sittings += 1
        else:
            path.write_text(
                json.dumps(
                    {"first": first, "last": last, "commit": self.commit, "trees": self.trees}
                )
                + "\n"
            )

    def record(self, chunk: list[int], results: list[RunResult]) -> None:
        entry = {
            "chunk": chunk[0],
            "seeds": len(results),
            "steps": sum(r.steps for r in results),
            "ops": sum(r.ops for r in results),
            "virtual_s": sum(r.virtual_s for r in results),
            "wall_s": sum(r.wall_s for r in results),
            "faults": dict(
                sum((collections.Counter(r.faults) for r in results), collections.Counter())
            ),
            "stats": dict(
                sum((collections.Counter(r.stats) for r in results), collections.Counter())
            ),
            "failing": [r.seed for r in results if not r.ok],
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(entry, sort_keys=True) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def replay_into(self, summary: Summary) -> None:
        """Add the recorded chunks' totals to ``summary`` (re-running their failing seeds)."""
        for entry in self.done.values():
            summary.seeds += int(entry["seeds"])
            summary.steps += int(entry["steps"])
            summary.ops += int(entry["ops"])
            summary.virtual_s += float(entry["virtual_s"])
            # The chunks of a sitting ran ``jobs`` at a time: their seeds' time over ``jobs``.
            summary.wall_s += float(entry["wall_s"]) / max(1, summary.jobs)
            summary.faults.update(entry["faults"])
            summary.stats.update(entry["stats"])
            for seed in entry["failing"]:
                summary.failures.append(run_seed(int(seed)))


# What a seed's run depends on: the engine and the simulator (it imports nothing else of ours).
SOURCE_TREES = ("wal3", "verify/sim")


def _git(*args: str) -> str:
    root = Path(__file__).resolve().parents[2]
    return subprocess.run(
        ["git", *args], cwd=root, capture_output=True, text=True, check=False
    ).stdout.strip()


def source_commit() -> str:
    """HEAD of the checkout the simulator runs from, if the engine and simulator are unmodified
    there; else what differs, which no ledger accepts."""
    head = _git("rev-parse", "--short=12", "HEAD")
    dirty = _git("status", "--porcelain", "--", *SOURCE_TREES)
    return f"{head}+modified" if dirty else head


def source_trees() -> str:
    """The git tree ids of the engine and the simulator at HEAD ("+modified" when the checkout
    differs): a seed replays the same at every commit with these trees, so a ledger resumes
    across commits that changed only other parts of the repository."""
    ids = [_git("rev-parse", "--short=12", f"HEAD:{t}") for t in SOURCE_TREES]
    dirty = _git("status", "--porcelain", "--", *SOURCE_TREES)
    return ",".join(ids) + ("+modified" if dirty else "")


def _results(chunks: list[list[int]], jobs: int) -> Iterator[tuple[list[int], list[RunResult]]]:
    if jobs <= 1:
        for c in chunks:
            yield c, run_seeds(c)
        return
    ctx = multiprocessing.get_context("spawn")  # pyarrow threads: never fork
    with ctx.Pool(jobs) as pool:
        yield from zip(chunks, pool.imap(run_seeds, chunks), strict=True)
        pool.terminate()


def run_range(
    a: int,
    b: int,
    *,
    jobs: int = 1,
    stop_on_failure: bool = False,
    progress: bool = True,
    ledger: Path | None = None,
) -> Summary:
    """Run seeds [a, b) on ``jobs`` processes (resuming ``ledger`` when given)."""
    summary = Summary(a, b, jobs=jobs)
    book = Ledger(ledger, a, b) if ledger is not None else None
    chunks = _chunks(a, b)
    if book is not None:
        summary.commit, summary.sittings = book.commit, book.sittings
        book.replay_into(summary)
        chunks = [c for c in chunks if c[0] not in book.done]
    wall_before = summary.wall_s
    started = time.perf_counter()
    for chunk, rs in _results(chunks, jobs):
        for r in rs:
            summary.add(r)
        if book is not None:
            book.record(chunk, rs)
        if progress:
            print(
                f"\r{summary.seeds}/{b - a} seeds, {len(summary.failures)} failing",
                end="",
                file=sys.stderr,
            )
        if stop_on_failure and summary.failures:
            break
    if progress:
        print(file=sys.stderr)
    summary.failures.sort(key=lambda r: r.seed)
    elapsed = time.perf_counter() - started
    # Wall time: this sitting's elapsed time plus the seeds' own time in earlier sittings.
    summary.wall_s = wall_before + elapsed
    return summary


def print_one(seed: int, *, verbose: bool = False) -> int:
    """Run one seed; print its trace when it fails (or always, verbosely)."""
    r = run_seed(seed, keep_trace=True)
    if verbose:
        print("\n".join(r.trace))
    if r.ok:
        print(
            f"seed {seed}: ok ({r.steps} steps, {r.ops} ops, faults {dict(r.faults)}, "
            f"{r.virtual_s:.1f} virtual s, {r.wall_s:.2f} s) trace {r.trace_hash[:16]}"
        )
        return 0
    if not verbose:
        print("\n".join(r.trace[-200:]))
    print(f"\nseed {seed}: FAILED {r.violations[0].check}")
    for v in r.violations[:5]:
        print(f"  {v}")
    print(f"trace {r.trace_hash[:16]}; replay: python -m verify.sim --seed {seed} -v")
    return 1


def write_docs(summary: Summary, path: Path = DOCS) -> None:
    """Replace the marked summary block of docs/RELIABILITY.md."""
    text = path.read_text()
    block = f"{BEGIN}\n{summary.markdown()}\n{END}"
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        text = head + block + tail
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)
