"""Shared plumbing for the benchmark suite: machine facts, tables, JSON output, scratch dirs, moto.

Everything here is deliberately boring.  Benchmarks return plain dicts; :func:`md_table` renders
their rows as Markdown so the same text goes to the terminal and into ``docs/PERFORMANCE.md``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from verify.testkit import command_line as command_line  # re-exported: the benchmarks report it
from verify.testkit import free_port, wait_for_port
from verify.testkit import machine_info as machine_info

ROOT = Path(__file__).resolve().parent.parent
OUT_DIR = ROOT / "bench" / "out"
IMG_DIR = ROOT / "docs" / "img"
SCRATCH_DIR = OUT_DIR / "tmp"  # same disk as the repository, and gitignored with bench/out/

# Local benchmarks never talk to a real cloud: pin fake credentials before any client exists.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
os.environ.pop("AWS_PROFILE", None)


# ------------------------------------------------------------------------------------ facts


# command_line and machine_info live with the shared test infrastructure.


# ------------------------------------------------------------------------------------ stats


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) of already sorted values, nearest-rank; NaN when empty."""
    if not sorted_values:
        return math.nan
    k = max(0, min(len(sorted_values) - 1, math.ceil(q / 100.0 * len(sorted_values)) - 1))
    return float(sorted_values[k])


def fmt(x: Any, digits: int = 3) -> str:
    """A compact human rendering of a number (thousands separators, few significant digits)."""
    if x is None:
        return "-"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    if isinstance(x, float):
        if math.isnan(x):
            return "-"
        if x == 0:
            return "0"
        if abs(x) >= 1000:
            return f"{x:,.0f}"
        mag = math.floor(math.log10(abs(x)))
        decimals = max(0, digits - 1 - mag)
        return f"{x:.{decimals}f}"
    return str(x)


def md_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (left column left-aligned, the rest right-aligned)."""
    cells = [[str(h) for h in headers]] + [[fmt(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    out = []
    for n, r in enumerate(cells):
        padded = [r[0].ljust(widths[0])] + [
            c.rjust(w) for c, w in zip(r[1:], widths[1:], strict=True)
        ]
        out.append("| " + " | ".join(padded) + " |")
        if n == 0:
            seps = [":" + "-" * (widths[0] - 1)] + ["-" * (w - 1) + ":" for w in widths[1:]]
            out.append("| " + " | ".join(seps) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------ output


def out_path(name: str, quick: bool, suffix: str = ".json") -> Path:
    """Where a benchmark's results go; quick runs never overwrite a full run's files."""
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    return OUT_DIR / f"{name}{'.quick' if quick else ''}{suffix}"


def img_path(name: str, quick: bool) -> Path:
    """Plots of full runs go to docs/img/ (the docs embed them); quick plots stay in bench/out/."""
    if quick:
        return out_path(name, True, ".png")
    IMG_DIR.mkdir(parents=True, exist_ok=True)
    return IMG_DIR / f"{name}.png"


def write_json(name: str, quick: bool, data: dict[str, Any]) -> Path:
    """Write a benchmark's results (with the command and machine) as JSON; returns the path."""
    path = out_path(name, quick)
    path.write_text(json.dumps(data, indent=2, default=_json_default) + "\n")
    return path


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):  # numpy scalars
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def rel(path: Path) -> str:
    """A path relative to the repository root, for printing."""
    with contextlib.suppress(ValueError):
        return str(path.resolve().relative_to(ROOT))
    return str(path)


@contextlib.contextmanager
def scratch_dir(tag: str, base: Path | None = None) -> Iterator[Path]:
    """A fresh directory (by default under bench/out/tmp/, i.e. on the repository's disk)."""
    root = base or SCRATCH_DIR
    root.mkdir(parents=True, exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=root))
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def tmpfs_dir() -> Path | None:
    """/dev/shm when it is a writable directory (used where only bytes are measured, not time)."""
    p = Path("/dev/shm")
    return p if p.is_dir() and os.access(p, os.W_OK) else None


# ------------------------------------------------------------------------------------ moto


_MOTO_CHILD = """
import sys, threading
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
sys.stdin.read()  # until the parent closes our stdin (or dies)
server.stop()
"""


class MotoServer:
    """moto's S3 server in a child process on 127.0.0.1 (its own GIL, so it does not steal the
    benchmark's event loop; on a 2-core machine it still competes for the cores)."""

    def __init__(self) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> MotoServer:
        env = dict(os.environ)
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _MOTO_CHILD, str(self.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if line.strip() != "ready":
            self.__exit__(None, None, None)
            raise RuntimeError("moto server did not start")
        try:
            wait_for_port(self.port, 15, self._proc)
        except (TimeoutError, RuntimeError):
            self.__exit__(None, None, None)
            raise
        return self

    def create_bucket(self, name: str) -> str:
        import boto3

        client = boto3.client("s3", endpoint_url=self.endpoint, region_name="us-east-1")
        client.create_bucket(Bucket=name)
        return name

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            assert proc.stdin is not None
            proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.terminate()  # our own child, by its handle
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------------------------ memory


def memory_store() -> Any:
    """A bench-only in-memory ObjectStore with the same conditional-write semantics (create-only
    with ``if_none_match="*"``, replace with ``if_match``; etag = hex MD5), no threads, no disk.

    Used under ``FaultyStore`` to measure the engine against injected latency alone, without the
    local disk's own (noisy) time inside every request.
    """
    import hashlib

    from wal3 import ObjectMeta, ObjectNotFound, ObjectStore, PreconditionFailed
    from wal3.store import GetResult

    class MemoryStore(ObjectStore):
        def __init__(self) -> None:
            self.objects: dict[str, tuple[bytes, str, float]] = {}

        async def get(self, key: str) -> Any:
            try:
                data, etag, _ = self.objects[key]
            except KeyError:
                raise ObjectNotFound(key) from None
            return GetResult(data=data, etag=etag)

        async def head(self, key: str) -> Any:
            try:
                data, etag, mtime = self.objects[key]
            except KeyError:
                raise ObjectNotFound(key) from None
            return ObjectMeta(key=key, etag=etag, size=len(data), last_modified=mtime)

        async def put(
            self, key: str, data: bytes, *, if_none_match: Any = None, if_match: str | None = None
        ) -> str:
            cur = self.objects.get(key)
            if if_none_match == "*" and cur is not None:
                raise PreconditionFailed(key, "object exists")
            if if_match is not None and (cur is None or cur[1] != if_match.strip('"')):
                raise PreconditionFailed(key, "etag mismatch")
            etag = hashlib.md5(data, usedforsecurity=False).hexdigest()
            self.objects[key] = (bytes(data), etag, time.time())
            return etag

        async def delete(self, key: str) -> None:
            self.objects.pop(key, None)

        async def list(self, prefix: str, *, start_after: str | None = None) -> Any:
            for key in sorted(k for k in self.objects if k.startswith(prefix)):
                if start_after is None or key > start_after:
                    data, etag, mtime = self.objects[key]
                    yield ObjectMeta(key=key, etag=etag, size=len(data), last_modified=mtime)

        def url_for(self, key: str) -> str:
            return f"memory://{key}"

    return MemoryStore()
