"""loghost benchmarks.  Run ``python -m bench --help``.

``python -m bench``                 the full suite (6-10 minutes on 2 noisy cores)
``python -m bench --quick``         a smoke run, 15-25 s (results in bench/out/*.quick.json)
``python -m bench --only engine``   one benchmark (engine, manifest_growth, profile)
``python -m bench --profile``       also profile the append hot path with pyinstrument
``python -m bench --report``        re-render the tables from bench/out/*.json without running
``python -m bench --report --write-docs``  and refresh the generated blocks of docs/PERFORMANCE.md

Every benchmark prints Markdown tables headed by the exact command that produced them, writes its
results as JSON to ``bench/out/`` (gitignored) and its plots to ``docs/img/`` (quick runs keep
their plots in ``bench/out/`` so they never overwrite the documented ones).
"""

from __future__ import annotations

# name -> module (imported lazily by bench.__main__); "profile" only runs when asked for.
BENCHMARKS: dict[str, str] = {
    "engine": "bench.engine",
    "manifest_growth": "bench.manifest_growth",
    "profile": "bench.profile_append",
    "http": "bench.http",
    "scale": "bench.scale",
    "peers": "bench.peers",
    "http_profile": "bench.http_profile",
}
DEFAULT = ("engine", "manifest_growth", "http", "scale", "peers")
