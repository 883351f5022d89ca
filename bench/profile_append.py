"""Where the append hot path spends its time (``python -m bench --profile``).

Four parts, all measured in one run:

1. **pyinstrument** profiles of the event-loop thread while 256 appenders hammer one log, on
   ``LocalStore`` (fsync, same disk) and on ``FaultyStore(20 ms)``.  Full trees go to
   ``bench/out/profile-<store>.html`` and ``.txt``; the table below sums the time under the
   functions that matter (``epoll`` = the loop idle, waiting for I/O or worker threads).
2. **Committer timeline** on ``FaultyStore(20 ms)``: wrappers time every manifest put (outside and
   inside the fault injector) and every fragment upload, so each manifest-write cycle splits into
   the injected 20 ms, the inner store's own time, waiting for the next fragment's upload, and the
   rest (event-loop work between two manifest writes).  ``measured / bound`` is exactly
   ``20 ms / mean cycle``.
3. **Manifest CPU per write** (``with_fragments`` + ``check`` + ``to_bytes``, what the committer
   does before every manifest put) at realistic root sizes, against a prototype in this file that
   caches each immutable pointer's JSON and sums setsum lanes once (same bytes, asserted).
4. **Option variants** on ``FaultyStore(20 ms)`` at 256 appenders (no engine change): the
   measured/bound ratio with other options, another store under the injector (LocalStore without
   fsync, or the bench-only MemoryStore: injected latency only) or spread arrivals.
5. **Ack path**: what it costs to wake a group of waiting appenders and have each submit again,
   awaiting through ``asyncio.shield`` (as ``append_many`` does) or not.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from wal3.batcher import Batcher
from wal3.committer import Committer
from wal3.writer import LogWriter

from . import common
from .engine import LATENCY_S, drive

NAME = "profile"


# Functions whose cumulative time is reported (matched on "Class.function" or "function").  The
# writer's own are named from the functions themselves, so a rename or a move to another part
# fails here at import instead of silently reporting 0 s for a name nothing has any more.
def _q(fn: Callable[..., Any]) -> str:
    return str(fn.__qualname__)


KEYS = [
    ("epoll (loop idle: waiting for I/O / threads)", ("epoll.poll", "poll")),
    (
        f"{_q(Committer._write_manifest)} (committer, excl. awaits)",
        (_q(Committer._write_manifest),),
    ),
    ("  Manifest.to_bytes", ("Manifest.to_bytes",)),
    ("  Manifest.check", ("Manifest.check",)),
    ("  Manifest.with_fragments", ("Manifest.with_fragments",)),
    (f"{_q(Committer.installed)} (acking appends)", (_q(Committer.installed),)),
    (f"{_q(Batcher._run_batch)} (encode + start upload)", (_q(Batcher._run_batch),)),
    ("  encode_fragment", ("encode_fragment",)),
    ("  EncodedFragment.content_md5", ("EncodedFragment.content_md5",)),
    (f"{_q(LogWriter.append_many)} (per-append entry)", (_q(LogWriter.append_many),)),
    ("appender coroutine (incl. append -> append_many)", ("appender",)),
    ("to_thread / run_in_executor (thread hand-off)", ("to_thread", "run_in_executor")),
    ("FaultyStore._run (injected sleep scheduling)", ("FaultyStore._run",)),
]


def add_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("profile")
    g.add_argument(
        "--profile-seconds",
        type=float,
        default=None,
        help="profiled seconds per store (default 4, quick 1)",
    )


# ----------------------------------------------------------------------------- 1. pyinstrument


def _key(frame: Any) -> str:
    return f"{frame.class_name}.{frame.function}" if frame.class_name else str(frame.function)


def summarize(root: Any, total: float) -> dict[str, float]:
    """Cumulative seconds under each key (a frame nested in the same key is not counted twice)."""
    acc: collections.Counter[str] = collections.Counter()

    def walk(frame: Any, active: frozenset[str]) -> None:
        k = _key(frame)
        if k not in active:
            acc[k] += frame.time
            active = active | {k}
        for c in frame.children:
            walk(c, active)

    walk(root, frozenset())
    out = {}
    for label, names in KEYS:
        out[label] = sum(acc.get(n, 0.0) for n in names)
    out["(profile wall time)"] = total
    return out


def top_self(root: Any, n: int = 15) -> list[tuple[str, float]]:
    acc: dict[str, float] = collections.defaultdict(float)

    def walk(frame: Any) -> None:
        if frame.function == "[self]" or not frame.children:
            parent = frame.parent
            k = _key(parent) if frame.function == "[self]" and parent is not None else _key(frame)
            acc[k] += frame.time
            return
        for c in frame.children:
            walk(c)

    walk(root)
    return sorted(acc.items(), key=lambda kv: kv[1], reverse=True)[:n]


async def profile_store(kind: str, seconds: float, appenders: int = 256) -> dict[str, Any]:
    from pyinstrument import Profiler

    from wal3 import FaultyStore, LocalStore, LogWriter, LogWriterOptions

    with common.scratch_dir(f"profile-{kind}") as d:
        inner = LocalStore(d)
        store = FaultyStore(inner, seed=0, latency_s=LATENCY_S) if kind == "faulty" else inner
        w = await LogWriter.open(store, "prof", LogWriterOptions(writer_name="bench"))
        prof = Profiler(interval=0.001, async_mode="disabled")
        c0 = time.process_time()
        prof.start()
        res = await drive(w, 1024, appenders, 0.3, seconds)
        prof.stop()
        c1 = time.process_time()
        await w.close()
        await store.close()
    session = prof.last_session
    assert session is not None, "the profiler ran"
    tag = f"profile-{kind}-x{appenders}"
    html = common.out_path(tag, False, ".html")
    txt = common.out_path(tag, False, ".txt")
    html.write_text(prof.output_html())
    txt.write_text(prof.output_text(unicode=True, color=False, show_all=False))
    root = session.root_frame()
    return {
        "store": f"{kind} x{appenders}",
        "appends_per_s": res["appends_per_s"],
        "records_per_fragment": res["records_per_fragment"],
        "records_per_manifest_write": res["records_per_manifest_write"],
        "manifest_writes": res["manifest_writes"],
        "appends": res["appends"],
        "wall_s": session.duration,
        "process_cpu_s": c1 - c0,
        "summary": summarize(root, session.duration),
        "top_self": top_self(root),
        "html": common.rel(html),
        "txt": common.rel(txt),
    }


# ----------------------------------------------------------------------------- 2. timeline


def _timing_store(inner: Any, log: list[tuple[str, str, float, float, Any]], tag: str) -> Any:
    from wal3 import ObjectStore
    from wal3.paths import MANIFEST_PATH, parse_fragment_path

    class Timing(ObjectStore):
        async def get(self, key: str) -> Any:
            return await inner.get(key)

        async def head(self, key: str) -> Any:
            return await inner.head(key)

        async def put(
            self, key: str, data: bytes, *, if_none_match: Any = None, if_match: str | None = None
        ) -> str:
            t0 = time.perf_counter()
            etag: str = await inner.put(key, data, if_none_match=if_none_match, if_match=if_match)
            t1 = time.perf_counter()
            rel = key.split("/", 1)[-1]  # the log's prefix is one segment
            seq = parse_fragment_path(rel)
            if rel == MANIFEST_PATH:
                log.append((tag, "manifest", t0, t1, data))
            elif seq is not None:
                log.append((tag, "fragment", t0, t1, seq))
            return etag

        async def delete(self, key: str) -> None:
            await inner.delete(key)

        async def list(self, prefix: str, *, start_after: str | None = None) -> AsyncIterator[Any]:
            async for m in inner.list(prefix, start_after=start_after):
                yield m

        def url_for(self, key: str) -> str:
            return str(inner.url_for(key))

        async def close(self) -> None:
            await inner.close()

    return Timing()


async def timeline(
    seconds: float,
    options: dict[str, Any] | None = None,
    inner_fsync: bool | None = True,
    think_s: float = 0.0,
    size: int = 1024,
) -> dict[str, Any]:
    """Run FaultyStore(20 ms) x 256 appenders and split each manifest-write cycle
    (``inner_fsync=None`` puts the bench-only MemoryStore under the fault injector)."""
    from wal3 import BatchOptions, FaultyStore, LocalStore, LogWriter, LogWriterOptions
    from wal3.paths import MANIFEST_PATH, join

    log: list[tuple[str, str, float, float, Any]] = []
    with common.scratch_dir("timeline") as d:
        inner = _timing_store(
            common.memory_store() if inner_fsync is None else LocalStore(d, fsync=inner_fsync),
            log,
            "inner",
        )
        store = _timing_store(FaultyStore(inner, seed=0, latency_s=LATENCY_S), log, "outer")
        w = await LogWriter.open(
            store,
            f"tl-{uuid.uuid4().hex[:6]}",
            LogWriterOptions(writer_name="bench", batch=BatchOptions(**(options or {}))),
        )
        warm = 0.5
        t_begin = time.perf_counter()
        res = await drive(w, size, 256, warm, seconds, think_s)
        await w.close()
        manifest_bytes = w.manifest.to_bytes()
        await store.close()
        # Reference: the same LocalStore's conditional manifest put, synchronously, on an idle
        # loop right after the run -- what the inner put costs without contention.
        ref = LocalStore(d, fsync=bool(inner_fsync))
        key = join("ref", MANIFEST_PATH)
        etag = ref._put(key, manifest_bytes, "*", None)
        samples = []
        for i in range(30):
            data = manifest_bytes + b" " * (i % 2)
            t0 = time.perf_counter()
            etag = ref._put(key, data, None, etag)
            samples.append(time.perf_counter() - t0)
        samples.sort()
        idle_put = samples[len(samples) // 2] if inner_fsync is not None else 0.0
    lo, hi = t_begin + warm, t_begin + warm + res["window_s"]
    outer_m = [
        (t0, t1, data) for tag, kind, t0, t1, data in log if tag == "outer" and kind == "manifest"
    ]
    inner_m = [t1 - t0 for tag, kind, t0, t1, _ in log if tag == "inner" and kind == "manifest"]
    frag_ready = {
        seq: t1 for tag, kind, t0, t1, seq in log if tag == "outer" and kind == "fragment"
    }
    frag_puts = [
        t1 - t0
        for tag, kind, t0, t1, _ in log
        if tag == "outer" and kind == "fragment" and lo <= t0 and t1 <= hi
    ]
    # Last fragment each manifest links (parsed after the run, off the hot path).
    last_seq = []
    for _, _, data in outer_m:
        frags = json.loads(data)["fragments"]
        last_seq.append(frags[-1]["seq_no"] if frags else 0)
    cycles = []
    for k in range(1, len(outer_m)):
        _, e0, _ = outer_m[k - 1]
        s1, e1, _ = outer_m[k]
        if not (lo <= s1 and e1 <= hi):
            continue
        gap = max(0.0, s1 - e0)
        nxt = frag_ready.get(last_seq[k - 1] + 1)
        wait = min(gap, max(0.0, nxt - e0)) if nxt is not None else 0.0
        cycles.append(
            {
                "put_s": e1 - s1,
                "gap_s": gap,
                "wait_upload_s": wait,
                "loop_work_s": gap - wait,
                "linked": max(0, last_seq[k] - last_seq[k - 1]),
            }
        )
    n = len(cycles) or 1
    mean = {
        k: sum(c[k] for c in cycles) / n
        for k in ("put_s", "gap_s", "wait_upload_s", "loop_work_s", "linked")
    }
    inner_mean = sum(inner_m) / len(inner_m) if inner_m else 0.0
    cycle = mean["put_s"] + mean["gap_s"]
    return {
        "options": options or {},
        "appends_per_s": res["appends_per_s"],
        "records_per_manifest_write": res["records_per_manifest_write"],
        "io_ratio": res["appends_per_s"] / ((1 / LATENCY_S) * res["records_per_manifest_write"]),
        "p50_ms": res["p50_ms"],
        "p99_ms": res["p99_ms"],
        "cycles": len(cycles),
        "mean_cycle_ms": cycle * 1e3,
        "injected_ms": LATENCY_S * 1e3,
        "inner_put_ms": inner_mean * 1e3,
        "inner_put_idle_ms": idle_put * 1e3,
        "put_other_ms": (mean["put_s"] - LATENCY_S - inner_mean) * 1e3,
        "wait_upload_ms": mean["wait_upload_s"] * 1e3,
        "loop_work_ms": mean["loop_work_s"] * 1e3,
        "fragments_per_manifest_write": mean["linked"],
        "timeline_ratio": LATENCY_S / cycle if cycle else float("nan"),
        "mean_put_ms": mean["put_s"] * 1e3,
        "fragment_put_ms": (sum(frag_puts) / len(frag_puts) * 1e3) if frag_puts else float("nan"),
        "put_busy": mean["put_s"] / cycle if cycle else float("nan"),
    }


# ----------------------------------------------------------------------------- 3. manifest CPU


def _synthetic_manifest(root_frags: int, snaps_per_depth: list[int]) -> tuple[Any, list[Any]]:
    """A manifest shaped like the writer's: snapshot pointers (deepest first), then fragments."""
    from wal3.manifest import FragmentPointer, Manifest, SnapshotPointer
    from wal3.paths import fragment_path, snapshot_path
    from wal3.setsum import Setsum

    rng = os.urandom
    off, seq = 1, 1
    snaps = []
    for depth in range(len(snaps_per_depth), 0, -1):
        for _ in range(snaps_per_depth[depth - 1]):
            s = Setsum.of(rng(16))
            span = 100 * 20 ** (depth - 1)
            snaps.append(
                SnapshotPointer(s, snapshot_path(s), depth, off, off + span * 10, span * 1700)
            )
            off += span * 10
            seq += span
    frags = []
    total = Setsum.zero()
    for sp in snaps:
        total = total + sp.setsum
    for _ in range(root_frags + 1):
        s = Setsum.of(rng(16))
        frags.append(
            FragmentPointer(fragment_path(seq), seq, off, off + 10, 11_000, s, rng(16).hex())
        )
        off += 10
        seq += 1
    for f in frags[:-1]:
        total = total + f.setsum
    m = Manifest(setsum=total, writer="bench", snapshots=tuple(snaps), fragments=tuple(frags[:-1]))
    m.check()
    return m, frags[-1:]


class FastCodec:
    """Prototype: per-pointer JSON cached on first use (pointers are immutable), setsum lanes
    summed as plain ints with one modulo per lane.  Produces exactly ``Manifest.to_bytes()``."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, bytes]] = {}

    def _enc(self, p: Any) -> bytes:
        hit = self._cache.get(id(p))
        if hit is not None and hit[0] is p:
            return hit[1]
        b = json.dumps(p.to_json(), separators=(",", ":")).encode()
        self._cache[id(p)] = (p, b)
        return b

    def to_bytes(self, m: Any) -> bytes:
        head = {
            "setsum": m.setsum.hexdigest(),
            "collected": m.collected.hexdigest(),
            "acc_bytes": m.acc_bytes,
            "writer": m.writer,
        }
        tail: dict[str, Any] = {}
        if m.initial_offset is not None:
            tail["initial_offset"] = {"offset": m.initial_offset}
        if m.initial_seq_no is not None:
            tail["initial_seq_no"] = m.initial_seq_no
        if m.sealed:
            tail["sealed"] = True
        out = json.dumps(head, separators=(",", ":")).encode()[:-1]
        out += b',"snapshots":[' + b",".join(self._enc(s) for s in m.snapshots) + b"]"
        out += b',"fragments":[' + b",".join(self._enc(f) for f in m.fragments) + b"]"
        if tail:
            out += b"," + json.dumps(tail, separators=(",", ":")).encode()[1:-1]
        return out + b"}"

    @staticmethod
    def balanced(m: Any) -> bool:
        from wal3.setsum import PRIMES

        lanes = [e.setsum._lanes for e in m.entries] + [m.collected._lanes]
        total = tuple(sum(col) % p for col, p in zip(zip(*lanes, strict=True), PRIMES, strict=True))
        return bool(total == m.setsum._lanes)


def _median_us(fns: dict[str, Any], min_time_s: float, blocks: int = 7) -> dict[str, float]:
    """Median over interleaved blocks of the µs per call of each function (noise-robust: every
    function sees the same background load)."""
    per: dict[str, list[float]] = {k: [] for k in fns}
    block = min_time_s / blocks / len(fns)
    for fn in fns.values():
        fn()
    for _ in range(blocks):
        for k, fn in fns.items():
            n, t0 = 0, time.perf_counter()
            while True:
                fn()
                n += 1
                el = time.perf_counter() - t0
                if el >= block and n >= 3:
                    break
            per[k].append(el / n * 1e6)
    return {k: sorted(v)[len(v) // 2] for k, v in per.items()}


def _encoders(base: Any, nxt: list[Any]) -> tuple[Callable[[], bytes], Callable[[], bytes]]:
    """The default manifest encoding of ``base`` plus ``nxt`` and the prototype's."""
    from wal3.manifest import _check_run

    def default() -> bytes:
        m = base.with_fragments(nxt, "bench")
        m.check()
        data: bytes = m.to_bytes()
        return data

    codec = FastCodec()

    def fast() -> bytes:
        codec._cache.pop(id(nxt[0]), None)  # the new pointer is never cached yet
        m = base.with_fragments(nxt, "bench")
        _check_run(m.entries, "manifest")  # the structural part of check() stays
        assert codec.balanced(m)
        return codec.to_bytes(m)

    return default, fast


def manifest_cpu(min_time_s: float = 0.3) -> list[dict[str, Any]]:
    shapes = [
        ("mean root at 10^3 frags", 50, [10]),
        ("mean root at 10^5 frags", 50, [10, 10, 2]),
        ("largest root at 10^5 frags", 100, [19, 19, 2]),
    ]
    out = []
    for label, nf, snaps in shapes:
        base, nxt = _synthetic_manifest(nf, snaps)
        default, fast = _encoders(base, nxt)
        assert default() == fast(), "prototype must produce identical bytes"
        res: dict[str, Any] = {
            "shape": label,
            "root_fragments": nf + 1,
            "root_snapshots": sum(snaps),
            "manifest_bytes": len(default()),
        }
        m = base.with_fragments(nxt, "bench")
        fns = {
            "default_us": default,
            "prototype_us": fast,
            "check_us": m.check,
            "to_bytes_us": m.to_bytes,
        }
        res.update(_median_us(fns, min_time_s))
        res["speedup"] = res["default_us"] / res["prototype_us"]
        out.append(res)
    return out


# ----------------------------------------------------------------------------- 5. ack path


async def ack_path(n: int = 128, rounds: int = 300) -> dict[str, float]:
    """µs per append to resolve ``n`` waiting appenders and have each resume and register a new
    future -- awaited through ``asyncio.shield`` (as ``LogWriter.append_many`` does) or directly."""
    loop = asyncio.get_running_loop()

    async def one(shield: bool) -> float:
        futs: list[Any] = [None] * n
        ready = asyncio.Event()
        count = 0

        async def waiter(i: int) -> None:
            nonlocal count
            while True:
                f = loop.create_future()
                futs[i] = f
                count += 1
                if count == n:
                    ready.set()
                try:
                    await (asyncio.shield(f) if shield else f)
                except asyncio.CancelledError:
                    return

        tasks = [asyncio.create_task(waiter(i)) for i in range(n)]
        await ready.wait()
        t0 = time.perf_counter()
        for _ in range(rounds):
            ready.clear()
            count = 0
            for f in futs:
                f.set_result(None)
            await ready.wait()
        dt = time.perf_counter() - t0
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return dt / rounds / n * 1e6

    shield, plain = [], []
    for _ in range(3):  # interleaved; medians
        shield.append(await one(True))
        plain.append(await one(False))
    shield.sort()
    plain.sort()
    return {
        "appenders": n,
        "shield_us": shield[1],
        "plain_us": plain[1],
        "ratio": shield[1] / plain[1],
    }


# ----------------------------------------------------------------------------- driver


REPEATS = 2


def _merge(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean of repeated timeline runs, keeping the spread of the headline ratio."""
    out = dict(runs[0])
    for k, v in runs[0].items():
        if isinstance(v, float):
            out[k] = sum(r[k] for r in runs) / len(runs)
    ratios = [r["io_ratio"] for r in runs]
    out["io_ratio_min"], out["io_ratio_max"], out["repeats"] = min(ratios), max(ratios), len(runs)
    return out


VARIANTS: list[tuple[str, dict[str, Any], bool | None, float, int]] = [
    # (label, BatchOptions overrides, inner LocalStore fsync / None = MemoryStore, think, size)
    ("defaults (batch_interval_s=0.002, max_inflight_fragments=8)", {}, True, 0.0, 1024),
    ("defaults, inner LocalStore(fsync=False)", {}, False, 0.0, 1024),
    ("defaults, inner MemoryStore (no disk)", {}, None, 0.0, 1024),
    ("batch_interval_s=0, inner MemoryStore", {"interval_s": 0.0}, None, 0.0, 1024),
    ("appenders think U(0, 5 ms), inner MemoryStore", {}, None, 0.005, 1024),
    ("defaults, 4 KiB records", {}, True, 0.0, 4096),
    ("4 KiB records, inner MemoryStore", {}, None, 0.0, 4096),
]


def run(quick: bool, args: argparse.Namespace) -> dict[str, Any]:
    seconds = getattr(args, "profile_seconds", None) or (1.0 if quick else 4.0)

    async def go() -> dict[str, Any]:
        profiles = []
        for kind, n in (("local", 1), ("local", 256), ("faulty", 256)):
            p = await profile_store(kind, seconds, n)
            print(
                f"  . profiled {kind}: {p['appends_per_s']:.0f} appends/s -> {p['html']}",
                flush=True,
            )
            profiles.append(p)
        runs: dict[str, list[dict[str, Any]]] = {}
        chosen = VARIANTS[:1] if quick else VARIANTS
        for rep in range(1 if quick else REPEATS):  # interleaved, so noise hits all variants
            for label, opts, fsync, think, size in chosen:
                t = await timeline(seconds * (1 if quick else 0.75), opts, fsync, think, size)
                t["label"] = label
                print(
                    f"  . timeline #{rep + 1} {label}: ratio {t['io_ratio']:.2f}, cycle "
                    f"{t['mean_cycle_ms']:.1f} ms",
                    flush=True,
                )
                runs.setdefault(label, []).append(t)
        ack = await ack_path()
        return {
            "profiles": profiles,
            "timelines": [_merge(v) for v in runs.values()],
            "ack_path": ack,
        }

    data = asyncio.run(go())
    data["manifest_cpu"] = manifest_cpu(0.3 if quick else 1.5)
    data.update(
        benchmark=NAME,
        quick=quick,
        command=common.command_line(),
        machine=common.machine_info(),
        config={"seconds": seconds, "appenders": 256, "record_bytes": 1024},
    )
    return data


def render(data: dict[str, Any]) -> str:
    out = [
        "pyinstrument, event-loop thread, 256 appenders x 1 KiB (cumulative seconds under each "
        "function; % of the profiled wall time):",
        "",
    ]
    profs = data["profiles"]
    rows = []
    for label, _ in KEYS:
        row: list[Any] = [label]
        for p in profs:
            s = p["summary"][label]
            row += [s, 100 * s / p["wall_s"]]
        rows.append(row)
    headers = ["function"]
    for p in profs:
        headers += [f"{p['store']} s", f"{p['store']} %"]
    out.append(common.md_table(headers, rows))
    out.append("")
    out.append(
        common.md_table(
            [
                "store",
                "appends/s (profiled)",
                "rec/fragment",
                "rec/manifest write",
                "process CPU / wall",
                "profile",
            ],
            [
                [
                    p["store"],
                    p["appends_per_s"],
                    p["records_per_fragment"],
                    p["records_per_manifest_write"],
                    p["process_cpu_s"] / p["wall_s"],
                    f"{p['html']}, {p['txt']}",
                ]
                for p in profs
            ],
        )
    )
    out.append("")
    reps = data["timelines"][0].get("repeats", 1)
    out.append(
        "Committer timeline on FaultyStore(20 ms), 256 appenders x 1 KiB unless said: one "
        "manifest-write "
        "cycle = put (injected 20 ms + inner LocalStore put + other) + gap (waiting for the "
        "next fragment's upload + event-loop work).  measured/bound = 20 ms / cycle.  "
        f"Mean of {reps} interleaved run(s) per variant; '(idle ref)' is the same "
        "LocalStore's manifest put timed alone right after the run:"
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "variant",
                "appends/s",
                "rec/manifest write",
                "measured/bound",
                "(min..max)",
                "cycle ms",
                "inner put ms",
                "(idle ref)",
                "put other ms",
                "wait upload ms",
                "loop work ms",
                "put busy",
                "fragment put ms",
                "frags/manifest write",
                "p50 ms",
                "p99 ms",
            ],
            [
                [
                    t["label"],
                    t["appends_per_s"],
                    t["records_per_manifest_write"],
                    t["io_ratio"],
                    f"{t.get('io_ratio_min', t['io_ratio']):.2f}..{t.get('io_ratio_max', t['io_ratio']):.2f}",
                    t["mean_cycle_ms"],
                    t["inner_put_ms"],
                    t.get("inner_put_idle_ms"),
                    t["put_other_ms"],
                    t["wait_upload_ms"],
                    t["loop_work_ms"],
                    t["put_busy"],
                    t.get("fragment_put_ms"),
                    t["fragments_per_manifest_write"],
                    t["p50_ms"],
                    t["p99_ms"],
                ]
                for t in data["timelines"]
            ],
        )
    )
    out.append("")
    out.append(
        "(put busy = mean manifest put / cycle: the share of time a manifest write is in "
        "flight; the injected 20 ms is only part of each put.)"
    )
    out.append("")
    out.append(
        "Manifest CPU per write (with_fragments + check + to_bytes of one more fragment), "
        "default vs the cached-JSON / lane-sum prototype in bench/profile_append.py "
        "(identical bytes):"
    )
    out.append("")
    out.append(
        common.md_table(
            [
                "root shape",
                "frag ptrs",
                "snap ptrs",
                "manifest B",
                "default µs",
                "  check µs",
                "  to_bytes µs",
                "prototype µs",
                "speedup",
            ],
            [
                [
                    m["shape"],
                    m["root_fragments"],
                    m["root_snapshots"],
                    m["manifest_bytes"],
                    m["default_us"],
                    m["check_us"],
                    m["to_bytes_us"],
                    m["prototype_us"],
                    m["speedup"],
                ]
                for m in data["manifest_cpu"]
            ],
        )
    )
    out.append("")
    ack = data.get("ack_path")
    if ack:
        out.append(
            f"Ack path ({ack['appenders']} waiting appenders resolved and re-registered, "
            f"no I/O): awaiting through `asyncio.shield` costs {ack['shield_us']:.2f} µs "
            f"per append vs {ack['plain_us']:.2f} µs awaiting the future directly "
            f"({ack['ratio']:.1f}x)."
        )
        out.append("")
    out.append("Top self time (event-loop thread):")
    out.append("")
    out.extend(
        f"- {p['store']}: "
        + "; ".join(f"{k} {100 * v / p['wall_s']:.1f}%" for k, v in p["top_self"][:8])
        for p in profs
    )
    return "\n".join(out)
