"""``python -m verify.sim --seed N [-v]`` or ``--seeds A:B [--jobs 2] [--write-docs]``."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def _reexec_with_fixed_hash_seed() -> None:
    # str hashes (set and dict-of-set orders) must not vary between replays of a seed.
    if os.environ.get("PYTHONHASHSEED") != "0":
        env = dict(os.environ, PYTHONHASHSEED="0")
        os.execve(sys.executable, [sys.executable, "-m", "verify.sim", *sys.argv[1:]], env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m verify.sim", description="deterministic simulation of the wal3 engine"
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="run one seed; print its trace on failure")
    group.add_argument("--seeds", help="a range A:B of seeds (B excluded)")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the whole trace")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes for a range")
    parser.add_argument(
        "--write-docs", action="store_true", help="write the summary into docs/RELIABILITY.md"
    )
    parser.add_argument(
        "--ledger",
        type=Path,
        default=None,
        help="a JSON-lines file of finished chunks: an interrupted range resumes "
        "from it (same range, same unmodified commit)",
    )
    parser.add_argument(
        "--stop-on-failure", action="store_true", help="stop a range at the first failing seed"
    )
    parser.add_argument(
        "--classify",
        action="store_true",
        help="name which known bug (the six of 3c61663, two of b25d620's GC "
        "review) each failure shows",
    )
    args = parser.parse_args(argv)

    import wal3

    from .report import print_one, run_range, write_docs

    print(f"engine: {os.path.dirname(wal3.__file__)}", file=sys.stderr)
    if args.seed is not None:
        return print_one(args.seed, verbose=args.verbose)
    a, _, b = args.seeds.partition(":")
    summary = run_range(
        int(a), int(b), jobs=args.jobs, stop_on_failure=args.stop_on_failure, ledger=args.ledger
    )
    print(summary.markdown())
    if args.classify:
        from .known import BUGS

        found = summary.known_bugs()
        print()
        print("| bug | first seed | seeds showing it |")
        print("|---|---:|---:|")
        for bug, what in BUGS.items():
            seeds = found.get(bug, [])
            print(f"| {bug}: {what} | {seeds[0] if seeds else 'not found'} | {len(seeds)} |")
    if args.write_docs:
        write_docs(summary)
    return 0 if summary.ok else 1


if __name__ == "__main__":
    _reexec_with_fixed_hash_seed()
    sys.exit(main())
