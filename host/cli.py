"""``loghost``: serve, and the operator commands scrub, gc and inspect."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import sys
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from .httpserver import DrainingServer


class _GracefulServer(DrainingServer):
    """uvicorn, except that a SIGTERM/SIGINT that led to a clean shutdown exits 0.

    (uvicorn re-raises the signal after shutting down, which makes a graceful stop look like a
    kill to supervisors.)  A second SIGINT still forces the exit.
    """

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)


def _serve(args: argparse.Namespace) -> int:
    from . import jsonlog
    from .api import create_app, uvicorn_config
    from .auth import new_key
    from .config import Settings, warn_unknown_env
    from .server import Server

    overrides = {
        k: v
        for k, v in {
            "store": args.store,
            "listen": args.listen,
            "server_id": args.server_id,
            "advertise_url": args.advertise_url,
            "redis_url": args.redis,
            "log_level": args.log_level,
            "header_timeout_s": args.header_timeout_s,
            "body_timeout_s": args.body_timeout_s,
            "max_connections": args.max_connections,
        }.items()
        if v is not None
    }
    if args.dev:
        overrides["dev"] = True
    try:
        settings = Settings(**overrides)
        keys = settings.parsed_api_keys()
    except (ValidationError, ValueError) as e:
        print(f"loghost: invalid configuration: {e}", file=sys.stderr)
        return 2
    if not keys:
        if not settings.dev:
            print(
                "loghost: no API keys configured (LOGHOST_API_KEYS=key=tenant,... or "
                "LOGHOST_API_KEYS_FILE); refusing to start.  For a local trial pass --dev "
                "to create a key.",
                file=sys.stderr,
            )
            return 2
        key = new_key()
        settings = settings.model_copy(update={"api_keys": f"{key}=*"})
        print(
            f"loghost --dev: created a service key (acts on every tenant):\n\n"
            f"    Authorization: Bearer {key}\n\n"
            f"  try: curl -s -H 'Authorization: Bearer {key}' "
            f'-d \'{{"records":[{{"id":"a","op":"add","document":"hello"}}]}}\' '
            f"http://{settings.listen}/v1/tenants/dev/logs/"
            f"00000000-0000-4000-8000-000000000001/records\n",
            flush=True,
        )
    jsonlog.configure(settings.log_level)
    warn_unknown_env()  # a misspelled LOGHOST_* variable is otherwise silently ignored
    server = Server(settings)
    # SIGHUP re-reads LOGHOST_API_KEYS_FILE now (a change is also noticed on the next request);
    # without a handler SIGHUP would end the process.
    signal.signal(signal.SIGHUP, lambda *_: server.auth.reload())
    config = uvicorn_config(create_app(server), settings)
    print(
        f"loghost {settings.server_id} serving {settings.store} on http://{settings.listen} "
        f"(docs at /docs)",
        flush=True,
    )
    _GracefulServer(config, on_drain=server.begin_drain).run()
    return 0


async def _scrub(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from wal3 import open_store
    from wal3.scrub import find_logs, scrub_log

    console = Console(stderr=True)
    store = open_store(args.store)
    failed = 0
    total = 0
    try:
        logs = (
            [args.log] if args.log is not None else [p async for p in find_logs(store, args.prefix)]
        )
        with Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            console=console,
            transient=True,
        ) as progress:
            task = progress.add_task("scrubbing", total=None)
            for prefix in logs:
                progress.update(task, description=f"scrub {prefix or '/'}")
                report = await scrub_log(
                    store,
                    prefix,
                    concurrency=args.concurrency,
                    progress=lambda n: progress.advance(task, n),
                )
                total += 1
                line = {
                    "log": prefix,
                    "ok": report.ok,
                    "fragments": report.fragments,
                    "snapshots": report.snapshots,
                    "records": report.records,
                    "bytes": report.bytes,
                    "setsum": report.setsum,
                    "problems": report.problems,
                }
                print(json.dumps(line), flush=True)
                failed += not report.ok
    finally:
        await store.close()
    console.print(f"scrubbed {total} log(s): {total - failed} ok, {failed} with problems")
    return 1 if failed or total == 0 else 0


async def _gc(args: argparse.Namespace) -> int:
    from wal3 import open_store
    from wal3.gc import GarbageCollector, GcOptions

    store = open_store(args.store)
    try:
        gc = GarbageCollector(
            store,
            args.log,
            GcOptions(
                grace_s=args.grace_s,
                max_fraction=args.max_fraction,
                retain_fragments=args.retain_fragments,
                retain_s=args.retain_s,
                writer_name="loghost-cli-gc",
            ),
        )
        report = await gc.run_once()
    finally:
        await store.close()
    print(json.dumps(vars(report), default=str))
    return 0


async def _dirty_logs(args: argparse.Namespace) -> int:
    from dirtylog import CURSOR_NAME
    from wal3 import open_store
    from wal3.cursors import CursorStore
    from wal3.layout import load_manifest
    from wal3.paths import DIRTY_PREFIX, dirty_server_id
    from wal3.scrub import find_logs

    store = open_store(args.store)
    try:
        async for prefix in find_logs(store, DIRTY_PREFIX):
            server_id = dirty_server_id(prefix)
            loaded = await load_manifest(store, prefix) if server_id is not None else None
            if loaded is None:
                continue
            m = loaded[0]
            w = await CursorStore(store, prefix, "inspect").load(CURSOR_NAME)
            cursor = w.cursor.offset if w is not None else m.oldest_offset
            print(
                json.dumps(
                    {
                        "server_id": server_id,
                        "log": prefix,
                        "next_offset": m.next_offset,
                        "stable_prefix": cursor,
                        "records_above_cursor": max(0, m.next_offset - cursor),
                        "writer": m.writer,
                    }
                )
            )
    finally:
        await store.close()
    return 0


async def _inspect(args: argparse.Namespace) -> int:
    from dirtylog import DirtyRecord, DirtyRecordError
    from wal3 import Limits, LogReader, ObjectNotFound, open_store
    from wal3.cursors import CursorStore
    from wal3.layout import load_manifest
    from wal3.paths import GARBAGE_PATH, join

    store = open_store(args.store)
    try:
        loaded = await load_manifest(store, args.log)
        if loaded is None:
            print(f"no log at {args.log!r}", file=sys.stderr)
            return 1
        m = loaded[0]
        cursors = await CursorStore(store, args.log, "inspect").load_all()
        try:
            garbage: Any = json.loads((await store.get(join(args.log, GARBAGE_PATH))).data)
        except ObjectNotFound:
            garbage = None
        print(
            json.dumps(
                {
                    "log": args.log,
                    "oldest_offset": m.oldest_offset,
                    "next_offset": m.next_offset,
                    "next_seq_no": m.next_seq_no,
                    "setsum": m.setsum.hexdigest(),
                    "collected": m.collected.hexdigest(),
                    "sealed": m.sealed,
                    "writer": m.writer,
                    "root_fragments": len(m.fragments),
                    "root_snapshots": len(m.snapshots),
                    "live_bytes": m.live_bytes,
                    "acc_bytes": m.acc_bytes,
                    "cursors": {
                        k: {
                            "offset": w.cursor.offset,
                            "writer": w.cursor.writer,
                            "epoch_us": w.cursor.epoch_us,
                        }
                        for k, w in cursors.items()
                    },
                    "garbage": garbage,
                },
                indent=2,
            )
        )
        if args.records:
            start = args.from_ if args.from_ is not None else m.oldest_offset
            recs = await LogReader(store, args.log).read(
                start, Limits(max_records=args.limit), manifest=m
            )
            for r in recs:
                out: dict[str, Any] = {"offset": r.offset, "timestamp_us": r.timestamp_us}
                if args.dirty:
                    try:
                        out["dirty"] = DirtyRecord.decode(r.body).as_dict()
                    except DirtyRecordError as e:
                        out["error"] = str(e)
                        out["hex"] = r.body.hex()
                else:
                    try:
                        out["body"] = json.loads(r.body)
                    except ValueError:
                        out["hex"] = r.body.hex()
                print(json.dumps(out, default=str))
    finally:
        await store.close()
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    p = argparse.ArgumentParser(prog="loghost", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="run the log host (every option also as LOGHOST_*)")
    s.add_argument("--store", help="a path, file:///dir or s3://bucket/prefix (LOGHOST_STORE)")
    s.add_argument("--listen", help="HOST:PORT (LOGHOST_LISTEN, default 127.0.0.1:8080)")
    s.add_argument("--server-id", help="stable id naming this server's dirty log")
    s.add_argument("--advertise-url", help="the URL other servers redirect clients to")
    s.add_argument("--redis", help="redis:// URL of the advisory leader hint (optional)")
    s.add_argument("--log-level", help="DEBUG, INFO, WARNING (LOGHOST_LOG_LEVEL)")
    s.add_argument(
        "--header-timeout-s",
        type=float,
        help="close a connection whose request headers take longer "
        "(LOGHOST_HEADER_TIMEOUT_S, default 10)",
    )
    s.add_argument(
        "--body-timeout-s",
        type=float,
        help="close a connection whose request body takes longer "
        "(LOGHOST_BODY_TIMEOUT_S, default 60)",
    )
    s.add_argument(
        "--max-connections",
        type=int,
        help="open connections at most; more are closed (LOGHOST_MAX_CONNECTIONS, default 4096)",
    )
    s.add_argument(
        "--dev",
        action="store_true",
        help="with no LOGHOST_API_KEYS, create and print a service key",
    )
    s.set_defaults(func=_serve, is_async=False)

    sc = sub.add_parser("scrub", help="verify logs end to end; exits 1 on any problem")
    sc.add_argument("store", help="a path, file:///dir or s3://bucket/prefix")
    sc.add_argument("--log", help="scrub this one log prefix (e.g. logs/<uuid>)")
    sc.add_argument("--prefix", default="", help="scrub every log under this prefix")
    sc.add_argument("--concurrency", type=int, default=8)
    sc.set_defaults(func=_scrub, is_async=True)

    g = sub.add_parser(
        "gc",
        help="advance one log's garbage collection (the server does this "
        "continuously; a live writer merely rebases)",
    )
    g.add_argument("store")
    g.add_argument("log", help="the log prefix, e.g. logs/<uuid> or dirty/<server-id>")
    g.add_argument("--grace-s", type=float, default=300.0)
    g.add_argument(
        "--max-fraction",
        type=float,
        default=0.9,
        help="one pass drops at most this share of the live bytes (default 0.9)",
    )
    g.add_argument(
        "--retain-fragments",
        type=int,
        default=256,
        help="keep the objects of the newest N sequence numbers after unlinking them "
        "(the idempotency window a reopened writer reads); 0 keeps none",
    )
    g.add_argument(
        "--retain-s",
        type=float,
        default=900.0,
        help="how long those retained objects are kept at most",
    )
    g.set_defaults(func=_gc, is_async=True)

    d = sub.add_parser(
        "dirty-logs",
        help="list the servers' dirty logs in a store (to find "
        "those of removed hosts, for POST /v1/dirty/adopt)",
    )
    d.add_argument("store")
    d.set_defaults(func=_dirty_logs, is_async=True)

    i = sub.add_parser("inspect", help="print a log's manifest summary, cursors and garbage")
    i.add_argument("store")
    i.add_argument("log", help="the log prefix")
    i.add_argument("--records", action="store_true", help="also print records")
    i.add_argument("--from", dest="from_", type=int)
    i.add_argument("--limit", type=int, default=100)
    i.add_argument("--dirty", action="store_true", help="decode bodies as 48-byte dirty records")
    i.set_defaults(func=_inspect, is_async=True)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``loghost`` command."""
    args = build_parser().parse_args(argv)
    if args.is_async:
        return asyncio.run(args.func(args))
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
