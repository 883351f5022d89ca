"""Mutation testing of the modules where a wrong line loses or duplicates data or leaks a tenant.

    python -m verify.mutation                     # every module below (long: run it by itself)
    python -m verify.mutation --module host/auth.py --module dirtylog/record.py
    python -m verify.mutation --write-docs        # also rewrite the table in docs/RELIABILITY.md
    python -m verify.mutation --module wal3/gc.py --resume   # go on after an interruption

Each module is mutated by mutmut in its own scratch worktree of HEAD (so edits in the working tree
never mix in), and each mutant runs only the tests of the module's fast subset that cover the
mutated function.  A mutant is *killed* when a test fails or times out; *survived* and *no tests*
(no test of the subset even runs the mutated function) both count against the score.  Results go
to ``bench/out/mutation/{module}.json`` with the diff of every surviving mutant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "out" / "mutation"
DOC = ROOT / "docs" / "RELIABILITY.md"
BEGIN, END = "<!-- mutation:begin -->", "<!-- mutation:end -->"
PACKAGES = ["wal3/", "host/", "dirtylog/", "compactor_client/", "verify/"]

# The fast dirty-log test files every roll-up module's subset starts from (each module adds its
# contract file).
DIRTYLOG_FAST = [
    "tests/dirtylog/test_dirtylog_coalesce.py",
    "tests/dirtylog/test_dirtylog_crash.py",
    "tests/dirtylog/test_dirtylog_handover.py",
    "tests/dirtylog/test_dirtylog_memory_and_hook.py",
    "tests/dirtylog/test_dirtylog_rollup.py",
    "tests/dirtylog/test_error_root.py",
    "tests/dirtylog/test_rollup_adversary.py",
    "tests/dirtylog/test_rollup_contract.py",
    "tests/dirtylog/test_rollup_incremental.py",
    "tests/dirtylog/test_rollup_tail_clip.py",
]

# The simulator's short form alone: the rest of tests/verify/test_sim.py (the ledger's resumption,
# replays) runs seeds as well, so mutmut's coverage map would run them for every engine mutant.
SIM_SHORT_FORM = "tests/verify/test_sim.py::test_short_form_finds_no_violation"

# module -> its fast test subset (what ``make mutation`` runs against each mutant)
TARGETS: dict[str, list[str]] = {
    "wal3/writer.py": ["tests/wal3", SIM_SHORT_FORM],
    "wal3/batcher.py": ["tests/wal3", SIM_SHORT_FORM],
    "wal3/committer.py": ["tests/wal3", SIM_SHORT_FORM],
    "wal3/recovery.py": ["tests/wal3", SIM_SHORT_FORM],
    # Modules with contract files written rule by rule against mutmut's own mutant list run
    # against those files alone: measured on their own, they kill every non-equivalent mutant
    # of idempotency, lease, claim, fork, cursors, manifest and gc (the equivalent ones are
    # listed at each file's end; docs/RELIABILITY.md).  The whole of tests/wal3 and the
    # simulator only added hours: mutmut runs every covering test of a surviving (equivalent)
    # mutant, the simulator's 300 seeds among them.
    "wal3/idempotency.py": [
        "tests/wal3/test_key_window.py",
        "tests/wal3/test_idempotency_hash.py",
        "tests/wal3/test_mutant_killers.py",
    ],
    "wal3/lease.py": [
        "tests/wal3/test_lease_rules.py",
        "tests/wal3/test_read_lease.py",
        "tests/wal3/test_committer_contract.py",
    ],
    # The writer's take-over and a log's fork: a wrong line there links a record twice or
    # forks a log that misses one.
    "wal3/claim.py": ["tests/wal3/test_claim_contract.py", "tests/wal3/test_claim_adversary.py"],
    "wal3/fork.py": ["tests/wal3/test_fork_contract.py"],
    "wal3/cursors.py": [
        "tests/wal3/test_cursors_contract.py",
        "tests/wal3/test_cursor_names.py",
        "tests/wal3/test_cursor_advance.py",
    ],
    "wal3/manifest.py": [
        "tests/wal3/test_manifest_contract.py",
        "tests/wal3/test_manifest.py",
        "tests/wal3/test_formats_fuzz.py",
    ],
    "wal3/gc.py": [
        "tests/wal3/test_gc_contract.py",
        "tests/wal3/test_gc_floor.py",
        "tests/wal3/test_gc_liveness.py",
        "tests/wal3/test_gc_foreign_plans.py",
        "tests/wal3/test_mutant_killers.py",
    ],
    "wal3/setsum.py": ["tests/wal3", SIM_SHORT_FORM],
    # The roll-up (issue 24): each module with the fast files of tests/dirtylog (the two
    # Hypothesis state machines, test_rollup_window_model.py and test_dirtylog_stateful.py, take
    # 15-20 s a run and are left to `make test`); mutmut runs only the tests covering each mutant.
    "dirtylog/rollup.py": DIRTYLOG_FAST,
    "dirtylog/dirtyset.py": [*DIRTYLOG_FAST, "tests/dirtylog/test_dirtyset_contract.py"],
    "dirtylog/coalesce.py": [*DIRTYLOG_FAST, "tests/dirtylog/test_coalesce_contract.py"],
    "dirtylog/window.py": [*DIRTYLOG_FAST, "tests/dirtylog/test_window_contract.py"],
    "dirtylog/record.py": ["tests/dirtylog"],
    "host/auth.py": [
        "tests/host/test_authz.py",
        "tests/host/test_auth_keys.py",
        "tests/host/test_auth_contract.py",
    ],
    "compactor_client/fold.py": ["tests/compactor_client/test_fold.py"],
    "compactor_client/versions.py": [
        "tests/compactor_client/test_versions.py",
        "tests/compactor_client/test_current_contract.py",
        "tests/compactor_client/test_issue20_prune_store_time.py",
        "tests/compactor_client/test_issue20_adversary.py",
    ],
}


@dataclass
class ModuleResult:
    """One module's mutation run."""

    module: str
    commit: str
    tests: list[str]
    killed: int = 0
    timeout: int = 0
    survived: int = 0
    no_tests: int = 0
    suspicious: int = 0
    skipped: int = 0
    total: int = 0
    seconds: float = 0.0
    survivors: dict[str, str] = field(default_factory=dict)  # mutant name -> its diff

    @property
    def score(self) -> float:
        """Killed (failed or timed out) over every mutant that could have been killed."""
        counted = self.killed + self.timeout + self.survived + self.no_tests + self.suspicious
        return (self.killed + self.timeout) / counted if counted else 1.0


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


# pytest-timeout's limit per test in a mutant's run, for tests without a limit of their own.
# The simulator's short form has its own (900 s: 300 seeds on 2 processes take 2-4 minutes on a
# busy 2-core machine, longer while mutmut collects its statistics with every line traced).  A
# mutant that hangs an engine test (a lock never released, a future never set) uses no CPU, so
# mutmut's CPU limit never ends it: this does, and every minute here is a minute of a mutation
# slot per hanging mutant (1,200 s before, when it was also the simulator's).
TEST_TIMEOUT_S = 180


def _config(module: str, tests: list[str]) -> str:
    timeout = TEST_TIMEOUT_S
    lines = [
        "",
        "[tool.mutmut]",
        f"source_paths = {json.dumps(PACKAGES)}",
        f"only_mutate = {json.dumps([module])}",
        f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
        'pytest_add_cli_args = ["-p", "no:cacheprovider", "-q", "-x", '
        f'"-p", "no:randomly", "--timeout", "{timeout}"]',
    ]
    return "\n".join(lines) + "\n"


# In a scratch worktree: the seconds its run has taken so far, rewritten every HEARTBEAT_S (a run
# interrupted by a reboot or a kill keeps what it had done, and ``--resume`` adds to it).
ELAPSED_FILE = ".mutation-seconds"
HEARTBEAT_S = 30.0


def resumable(work: Path) -> bool:
    """Whether ``work`` holds an interrupted run to go on with: mutmut's mutants and the
    configuration this module appended (mutmut keeps each finished mutant's result there)."""
    return (work / "mutants").is_dir() and "[tool.mutmut]" in (
        (work / "pyproject.toml").read_text(encoding="utf-8")
        if (work / "pyproject.toml").exists()
        else ""
    )


def _count_time(work: Path, base: float, stop: threading.Event) -> None:
    started = time.monotonic()
    while not stop.wait(HEARTBEAT_S):
        (work / ELAPSED_FILE).write_text(f"{base + time.monotonic() - started:.1f}\n")


def run_module(module: str, jobs: int, scratch: Path, *, resume: bool = False) -> ModuleResult:
    """Mutate ``module`` in a scratch worktree of HEAD and collect the outcome.

    With ``resume``, a worktree an interrupted run of the module left behind is used as it is:
    mutmut runs only the mutants without a result, and the row names that worktree's commit
    (the code its mutants were made from), not HEAD's."""
    tests = TARGETS[module]
    work = scratch / re.sub(r"[^A-Za-z0-9]+", "_", module)
    base = 0.0
    if resume and work.exists() and resumable(work):
        commit = _git("rev-parse", "--short", "HEAD", cwd=work)
        with contextlib.suppress(OSError, ValueError):
            base = float((work / ELAPSED_FILE).read_text())
        fresh = False
    else:
        commit = _git("rev-parse", "--short", "HEAD")
        if work.exists():
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(work)], cwd=ROOT, capture_output=True
            )
            shutil.rmtree(work, ignore_errors=True)
        _git("worktree", "add", "--detach", "-f", str(work), "HEAD")
        fresh = True
    tests = [t for t in tests if (work / t.partition("::")[0]).exists()]  # one not written yet
    result = ModuleResult(module, commit, tests)
    started = time.monotonic()
    stop = threading.Event()
    heartbeat = threading.Thread(target=_count_time, args=(work, base, stop), daemon=True)
    heartbeat.start()
    try:
        if fresh:
            with open(work / "pyproject.toml", "a", encoding="utf-8") as f:
                f.write(_config(module, tests))
        mutmut = str(Path(sys.executable).with_name("mutmut"))
        # COMPACTOR_CRASH_AT set to a name no crash point has: a mutant calling
        # ``crash_point(None)`` would otherwise match the unset variable and SIGKILL its whole
        # session (compactor_client/crashpoints.py).  mutmut runs in a session of its own, so a
        # mutant that kills its session ends this run with an error, never its caller.
        env = {**os.environ, "PYTHONHASHSEED": "0", "COMPACTOR_CRASH_AT": ""}
        run = subprocess.run(
            [mutmut, "run", "--max-children", str(jobs)],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            start_new_session=True,
        )
        # mutmut exits 1 when mutants survive, and also when it could not start (the tests
        # failing unmutated, say): then it leaves no mutants/ directory, and says why.
        if run.returncode not in (0, 1) or not (work / "mutants").is_dir():
            said = (run.stdout + run.stderr)[-3000:]
            raise RuntimeError(f"mutmut failed on {module} (exit {run.returncode}): {said}")
        subprocess.run([mutmut, "export-cicd-stats"], cwd=work, check=True, capture_output=True)
        stats = json.loads((work / "mutants" / "mutmut-cicd-stats.json").read_text())
        for key in ("killed", "timeout", "survived", "no_tests", "suspicious", "skipped", "total"):
            setattr(result, key, int(stats.get(key, 0)))
        checked = result.killed + result.timeout + result.survived + result.no_tests
        if result.total and not checked + result.suspicious:
            # Mutants generated, none run: the baseline failed (mutmut then exits 1 as well).
            said = (run.stdout + run.stderr)[-3000:]
            raise RuntimeError(f"mutmut ran no mutant of {module}: {said}")
        listing = subprocess.run(
            [mutmut, "results"], cwd=work, capture_output=True, text=True
        ).stdout
        for line in listing.splitlines():
            name, _, status = line.strip().rpartition(": ")
            if status.strip() in ("survived", "suspicious") and name:
                shown = subprocess.run(
                    [mutmut, "show", name], cwd=work, capture_output=True, text=True
                ).stdout
                result.survivors[name] = shown
    finally:
        stop.set()
        result.seconds = round(base + time.monotonic() - started, 1)
        subprocess.run(
            ["git", "worktree", "remove", "--force", str(work)], cwd=ROOT, capture_output=True
        )
    return result


def _save(result: ModuleResult) -> Path:
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / (re.sub(r"[^A-Za-z0-9]+", "_", result.module) + ".json")
    path.write_text(json.dumps({**asdict(result), "score": result.score}, indent=1))
    return path


def _load_all() -> list[dict[str, Any]]:
    if not OUT.exists():
        return []
    return [json.loads(p.read_text()) for p in sorted(OUT.glob("*.json"))]


def table(results: list[dict[str, Any]]) -> str:
    """The markdown table of every recorded module run."""
    rows = [
        "| module | commit | mutants | killed | timed out | survived | no test ran it | "
        "score | tests | minutes |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|",
    ]
    rows.extend(
        f"| `{r['module']}` | {r['commit']} | {r['total']} | {r['killed']} | "
        f"{r['timeout']} | {r['survived']} | {r['no_tests']} | "
        f"{float(r['score']):.0%} | {', '.join(f'`{t}`' for t in r['tests'])} | "
        f"{float(r['seconds']) / 60:.1f} |"
        for r in sorted(results, key=lambda r: str(r["module"]))
    )
    return "\n".join(rows)


_ROW = re.compile(
    r"^\| `(?P<module>[^`]+)` \| (?P<commit>\w+) \| (?P<total>\d+) \| (?P<killed>\d+) \| "
    r"(?P<timeout>\d+) \| (?P<survived>\d+) \| (?P<no_tests>\d+) \| (?P<score>\d+)% \| "
    r"(?P<tests>.*) \| (?P<minutes>[\d.]+) \|$"
)


def recorded_rows(text: str) -> list[dict[str, Any]]:
    """The module runs already in the document's table, as result dicts.

    ``bench/out`` is scratch (not committed), so a run on a new checkout knows only its own
    modules: the document is the record of the others, and a run replaces only its own rows."""
    if BEGIN not in text or END not in text:
        return []
    block = text[text.index(BEGIN) : text.index(END)]
    rows = []
    for line in block.splitlines():
        m = _ROW.match(line.strip())
        if m is None:
            continue
        g = m.groupdict()
        counts = {k: int(g[k]) for k in ("total", "killed", "timeout", "survived", "no_tests")}
        rows.append(
            {
                "module": g["module"],
                "commit": g["commit"],
                **counts,
                "score": int(g["score"]) / 100,
                "tests": re.findall(r"`([^`]+)`", g["tests"]),
                "seconds": float(g["minutes"]) * 60,
            }
        )
    return rows


def write_docs(results: list[dict[str, Any]]) -> None:
    """Replace the marked table in docs/RELIABILITY.md (append the section if absent): the
    modules of ``results`` get their new rows, every other module keeps the row it had."""
    text = DOC.read_text(encoding="utf-8")
    fresh = {str(r["module"]) for r in results}
    results = [r for r in recorded_rows(text) if r["module"] not in fresh] + results
    block = (
        f"{BEGIN}\nGenerated by `python -m verify.mutation --write-docs` (mutmut, one scratch "
        f"worktree per module).\n\n{table(results)}\n{END}"
    )
    if BEGIN in text and END in text:
        text = text[: text.index(BEGIN)] + block + text[text.index(END) + len(END) :]
    else:
        text = text.rstrip() + "\n\n## Mutation testing\n\n" + block + "\n"
    # A new file renamed over the old: others may be reading (or editing other sections of) it.
    tmp = DOC.with_name(f".{DOC.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(DOC)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m verify.mutation",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--module",
        action="append",
        choices=sorted(TARGETS),
        help="a module to mutate (repeatable; default: all)",
    )
    p.add_argument("--jobs", type=int, default=2, help="mutants run at once (default 2)")
    p.add_argument(
        "--scratch",
        type=Path,
        default=Path("/tmp/loghost-mutation"),
        help="where the scratch worktrees go",
    )
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="rewrite the table in docs/RELIABILITY.md from every recorded run",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the run an interruption left in the scratch worktree (its commit's "
        "code, only the mutants without a result); without it every run starts afresh at HEAD",
    )
    args = p.parse_args(argv)
    args.scratch.mkdir(parents=True, exist_ok=True)
    for module in args.module or list(TARGETS):
        r = run_module(module, args.jobs, args.scratch, resume=args.resume)
        path = _save(r)
        print(
            f"{module}: {r.total} mutants, {r.killed + r.timeout} killed, {r.survived} "
            f"survived, {r.no_tests} not run by any test: {r.score:.0%} in "
            f"{r.seconds / 60:.1f} min -> {path.relative_to(ROOT)}",
            flush=True,
        )
    if args.write_docs:
        write_docs(_load_all())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
