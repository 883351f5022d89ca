"""loghost benchmarks.  Run ``python -m bench --help``.

``python -m bench``                 the full suite: engine, manifest_growth, http, scale, peers,
                                    compaction (about 16 minutes on 2 noisy cores)
``python -m bench --quick``         a smoke run of the same, about 60 s (bench/out/*.quick.json)
``python -m bench --only http``     any subset (engine, manifest_growth, http, scale, peers,
                                    compaction, profile, http_profile)
``python -m bench --profile``       also profile the engine's and the host's append paths
``python -m bench --report``        re-render the tables from bench/out/*.json without running
``python -m bench --report --write-docs``  and refresh the generated blocks of docs/PERFORMANCE.md

Every benchmark prints Markdown tables headed by the exact command that produced them, writes its
results as JSON to ``bench/out/`` (gitignored) and its plots to ``docs/img/`` (quick runs keep
their plots in ``bench/out/`` so they never overwrite the documented ones).  HTTP load comes from
``wrk`` when installed (else ``bench.loadgen``'s asyncio client); the peers (SlateDB, Chroma,
redis-py) live in ``bench/out/peers-venv``, created on first use.
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
    "compaction": "bench.compaction_bench",
    "rollup": "bench.rollup",
    "noisy_neighbour": "bench.noisy_neighbour",
    "fragment_encode": "bench.fragment_encode",
}
DEFAULT = ("engine", "manifest_growth", "http", "scale", "peers", "compaction", "rollup")
