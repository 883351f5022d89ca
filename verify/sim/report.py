"""Summaries of seed ranges: text for the terminal, a markdown block for docs/RELIABILITY.md."""

from __future__ import annotations

import collections
import multiprocessing
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

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
        lines = [
            f"`python -m verify.sim --seeds {self.first}:{self.last} --jobs {self.jobs}`: "
            f"{self.seeds} seeds, {self.steps} steps, {self.ops} store operations, "
            f"{self.virtual_s:,.0f} s of virtual time in {self.wall_s:,.0f} s "
            f"({rate:.1f} seeds/s).",
            "",
            "| faults injected | count |",
            "|---|---:|",
        ]
        for k in sorted(self.faults):
            lines.append(f"| {k} | {self.faults[k]} |")
        lines += ["", "| actions | count |", "|---|---:|"]
        for k in sorted(self.stats):
            lines.append(f"| {k} | {self.stats[k]} |")
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


def run_range(a: int, b: int, *, jobs: int = 1, stop_on_failure: bool = False,
              progress: bool = True) -> Summary:
    """Run seeds [a, b) on ``jobs`` processes."""
    summary = Summary(a, b, jobs=jobs)
    started = time.perf_counter()
    chunks = _chunks(a, b)
    if jobs <= 1:
        results = (run_seeds(c) for c in chunks)
        for rs in results:
            for r in rs:
                summary.add(r)
            if progress:
                print(f"\r{summary.seeds}/{b - a} seeds, {len(summary.failures)} failing",
                      end="", file=sys.stderr)
            if stop_on_failure and summary.failures:
                break
    else:
        ctx = multiprocessing.get_context("spawn")  # pyarrow threads: never fork
        with ctx.Pool(jobs) as pool:
            for rs in pool.imap(run_seeds, chunks):
                for r in rs:
                    summary.add(r)
                if progress:
                    print(f"\r{summary.seeds}/{b - a} seeds, {len(summary.failures)} failing",
                          end="", file=sys.stderr)
                if stop_on_failure and summary.failures:
                    pool.terminate()
                    break
    if progress:
        print(file=sys.stderr)
    summary.failures.sort(key=lambda r: r.seed)
    summary.wall_s = time.perf_counter() - started
    return summary


def print_one(seed: int, *, verbose: bool = False) -> int:
    """Run one seed; print its trace when it fails (or always, verbosely)."""
    r = run_seed(seed, keep_trace=True)
    if verbose:
        print("\n".join(r.trace))
    if r.ok:
        print(f"seed {seed}: ok ({r.steps} steps, {r.ops} ops, faults {dict(r.faults)}, "
              f"{r.virtual_s:.1f} virtual s, {r.wall_s:.2f} s) trace {r.trace_hash[:16]}")
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
