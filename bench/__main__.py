"""``python -m bench [--quick] [--only NAME[,NAME]] [--profile] [--report]``."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any

from . import BENCHMARKS, DEFAULT, common


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description="wal3 / loghost benchmarks.  Prints Markdown tables, writes JSON to "
        "bench/out/ and plots to docs/img/.",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="short smoke form (seconds); results go to bench/out/*.quick.*",
    )
    p.add_argument(
        "--only", default=None, help=f"comma-separated subset of {', '.join(BENCHMARKS)}"
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="also profile the engine's append path and the host's HTTP append path "
        "(pyinstrument; bench/out/profile-*, bench/out/http-profile-*)",
    )
    p.add_argument(
        "--report",
        action="store_true",
        help="do not run: re-render the tables from the JSON in bench/out/",
    )
    p.add_argument(
        "--write-docs",
        action="store_true",
        help="with --report: replace the generated blocks of docs/PERFORMANCE.md "
        "(between <!-- bench:NAME --> and <!-- /bench:NAME -->)",
    )
    for name in BENCHMARKS:
        mod = importlib.import_module(BENCHMARKS[name])
        if hasattr(mod, "add_arguments"):
            mod.add_arguments(p)
    return p


def _header(name: str, data: dict[str, Any]) -> str:
    m = data["machine"]
    # Runs before 2026-11-22 16:40 recorded the machine when the benchmark ended.
    when = "at start" if m.get("recorded_at") == "start" else "at the end of the run"
    return "\n".join(
        [
            f"## {name}{' (quick)' if data.get('quick') else ''}",
            "",
            f"Command: `{data['command']}`",
            "",
            f"Machine: {m['nproc']} cores; `{m['uname']}`; Python {m['python']}.  Recorded {when}: "
            f"{m['date_utc']}, load average {', '.join(f'{x:.2f}' for x in m['loadavg_at_start'])}, "
            f"commit {m['git_head']}.",
            "",
        ]
    )


DOCS = common.ROOT / "docs" / "PERFORMANCE.md"


def _write_docs(blocks: dict[str, str], rows: dict[str, str] | None = None) -> None:
    """Replace each generated block of docs/PERFORMANCE.md with freshly rendered tables, and
    each summary-table row marked ``<!-- bench-row:NAME -->`` with the one NAME's
    ``summary_row`` renders (a whole table line: a block's markers would break the table)."""
    import re

    text = DOCS.read_text()
    for name, row in (rows or {}).items():
        marker = f"<!-- bench-row:{name} -->"
        if marker not in row or "\n" in row:
            raise ValueError(f"{name}'s summary row must be one line carrying {marker}")
        line = re.compile(rf"^\|.*{re.escape(marker)}.*$", re.M)
        if not line.search(text):
            print(f"(docs: no summary row for {name})")
            continue
        text = line.sub(row.replace("\\", "\\\\"), text)
        print(f"(docs: updated summary row {name})")
    for name, body in blocks.items():
        pattern = re.compile(rf"(<!-- bench:{name} -->\n)(?:.*?\n)?(<!-- /bench:{name} -->)", re.S)
        if not pattern.search(text):
            print(f"(docs: no block for {name})")
            continue

        def fill(m: re.Match[str], body: str = body) -> str:
            return m.group(1) + body.rstrip() + "\n" + m.group(2)

        text = pattern.sub(fill, text)
        print(f"(docs: updated block {name})")
    DOCS.write_text(text)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BENCHMARKS]
        if unknown:
            print(
                f"unknown benchmark(s): {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}",
                file=sys.stderr,
            )
            return 2
    else:
        names = list(DEFAULT)
    if args.profile:
        names += [n for n in ("profile", "http_profile") if n not in names]

    if args.report:
        if args.only is None:
            names += [n for n in ("profile", "http_profile") if n not in names]
        blocks: dict[str, str] = {}
        rows: dict[str, str] = {}
        for name in names:
            path = common.out_path(name, args.quick)
            if not path.exists():
                print(f"(no results for {name} at {common.rel(path)})\n")
                continue
            data = json.loads(path.read_text())
            mod = importlib.import_module(BENCHMARKS[name])
            text = _header(name, data).split("\n", 2)[2] + "\n" + mod.render(data)
            blocks[name] = text
            if hasattr(mod, "summary_row"):
                rows[name] = mod.summary_row(data)
            print(_header(name, data))
            print(mod.render(data))
            print()
        if args.write_docs:
            if args.quick:
                print("--write-docs only takes full runs", file=sys.stderr)
                return 2
            _write_docs(blocks, rows)
        return 0

    t_all = time.perf_counter()
    for name in names:
        mod = importlib.import_module(BENCHMARKS[name])
        print(
            f"# running {name}{' (quick)' if args.quick else ''}: {common.command_line()}",
            flush=True,
        )
        machine = {**common.machine_info(), "recorded_at": "start"}
        t0 = time.perf_counter()
        data = mod.run(args.quick, args)
        data["machine_at_end"] = data.get("machine")
        data["machine"] = machine
        data["elapsed_s"] = time.perf_counter() - t0
        path = common.write_json(name, args.quick, data)
        print()
        print(_header(name, data))
        print(mod.render(data))
        print()
        print(
            f"(results: {common.rel(path)}"
            + (f"; plot: {common.rel(Path(data['plot']))}" if data.get("plot") else "")
            + f"; {data['elapsed_s']:.1f} s)"
        )
        print(flush=True)
    print(f"# done in {time.perf_counter() - t_all:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
