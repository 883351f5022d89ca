"""loghost: the log host server and its operator commands.

Commands:
  serve       run the log host (every option also as a LOGHOST_* variable)
  scrub       verify logs end to end: JSON lines on stdout, progress on stderr
  gc          advance one log's garbage collection by one pass
  dirty-logs  list the servers' dirty logs in a store (to adopt those of removed hosts)
  inspect     print a log's manifest summary, cursors and garbage (and its records)

Exit codes: 0 ok, 1 problems found, 2 usage or configuration, 3 unsupported store URL,
4 no such store or log, 5 gc: the log has no cursor, 6 store unreachable, 7 listen address in
use, 8 server id in use by a live host, 70 internal error (docs/OPERATIONS.md, "CLI exit codes").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import socket
import sys
import traceback
from collections.abc import Iterator
from typing import Any

from pydantic import ValidationError

from .cli_errors import CliError, ExitCode, check_existing_store, check_store_url, classify
from .httpserver import DrainingServer

PROG = "loghost"


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

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if sockets is not None and not self.should_exit:
            # uvicorn says where it listens only for sockets it bound itself.
            self._log_started_message(sockets)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loghost")
    except PackageNotFoundError:
        return "unknown (not installed)"


def _serve(args: argparse.Namespace) -> int:
    from . import jsonlog
    from .api import create_app, uvicorn_config
    from .auth import new_key
    from .cli_serve import StartingApp, bind_listen, report
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
        settings.parsed_tenant_quotas()  # a broken quota configuration stops here
        host, port = settings.host_port
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'settings'}: {err['msg']}"
            for err in e.errors()
        )
        raise CliError(ExitCode.USAGE, f"invalid configuration: {problems}") from None
    except ValueError as e:
        raise CliError(ExitCode.USAGE, f"invalid configuration: {e}") from None
    check_store_url(settings.store)
    if not keys and not settings.dev:
        raise CliError(
            ExitCode.USAGE,
            "no API keys configured (LOGHOST_API_KEYS=key=tenant,... or "
            "LOGHOST_API_KEYS_FILE); refusing to start.  For a local trial pass --dev "
            "to create a key.",
        )
    # The port before the store: a port in use must not first open and fence the dirty log.
    sock = bind_listen(settings.listen, host, port)
    if not keys:
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
    failure: list[CliError] = []
    uv: _GracefulServer | None = None

    def fatal(err: CliError) -> None:
        report(err)
        failure.append(err)
        if uv is not None:
            uv.should_exit = True

    app = StartingApp(create_app(server), server, on_fatal=fatal)
    config = uvicorn_config(app, settings)
    print(
        f"loghost {settings.server_id} serving {settings.store} on http://{settings.listen} "
        f"(docs at /docs)",
        flush=True,
    )
    uv = _GracefulServer(config, on_drain=app.begin_drain)
    uv.run(sockets=[sock])
    return int(failure[0].code) if failure else 0


async def _scrub(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

    from wal3 import open_store
    from wal3.scrub import find_logs, scrub_log

    check_existing_store(args.store)
    # Progress on stderr, and only when stderr is a terminal: stdout carries the JSON lines
    # alone, so ``loghost scrub STORE > report.jsonl`` writes a clean report.
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
            disable=not console.is_terminal,
            # rich would otherwise route print() through the console, i.e. onto stderr
            redirect_stdout=False,
            redirect_stderr=False,
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
    print(
        f"scrubbed {total} log(s): {total - failed} ok, {failed} with problems",
        file=sys.stderr,
        flush=True,
    )
    return ExitCode.PROBLEMS if failed or total == 0 else ExitCode.OK


async def _gc(args: argparse.Namespace) -> int:
    from wal3 import open_store
    from wal3.gc import GarbageCollector, GcOptions
    from wal3.layout import load_manifest

    check_existing_store(args.store)
    store = open_store(args.store)
    try:
        if await load_manifest(store, args.log) is None:
            raise CliError(ExitCode.NOT_FOUND, f"no log at {args.log!r} in {args.store!r}")
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

    check_existing_store(args.store)
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

    check_existing_store(args.store)
    store = open_store(args.store)
    try:
        loaded = await load_manifest(store, args.log)
        if loaded is None:
            raise CliError(ExitCode.NOT_FOUND, f"no log at {args.log!r} in {args.store!r}")
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


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (the command list, the exit codes), and wider columns."""

    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=32, width=100)


STORE_HELP = "the store: a directory path, file:///dir or s3://bucket/prefix"


def build_parser() -> argparse.ArgumentParser:
    """The command-line interface."""
    from .config import Settings

    def default(field: str) -> str:
        info = Settings.model_fields[field]
        extra = info.json_schema_extra
        shown = extra.get("shown_default") if isinstance(extra, dict) else None
        value = shown if shown is not None else info.default
        return "none" if value is None else str(value)

    first, _, rest = (__doc__ or "").partition("\n\n")
    codes = rest.partition("\n\n")[2]  # the command list is the subcommands' own
    p = argparse.ArgumentParser(
        prog=PROG, description=f"{first}\n\n{codes}", formatter_class=_HelpFormatter
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    p.add_argument(
        "--traceback",
        action="store_true",
        help="on an internal error (exit code 70) also print the traceback",
    )
    sub = p.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")

    s = sub.add_parser(
        "serve",
        help="run the log host (every option also as a LOGHOST_* variable)",
        description="Run the log host.  Every option is also a LOGHOST_* variable (the flag "
        "wins); README.md lists them all.",
        formatter_class=_HelpFormatter,
    )
    s.add_argument("--store", help=f"{STORE_HELP} [LOGHOST_STORE; default: {default('store')}]")
    s.add_argument(
        "--listen", help=f"HOST:PORT to listen on [LOGHOST_LISTEN; default: {default('listen')}]"
    )
    s.add_argument(
        "--server-id",
        help="stable id naming this server's dirty log; unique per store "
        f"[LOGHOST_SERVER_ID; default: {default('server_id')}]",
    )
    s.add_argument(
        "--advertise-url",
        help="the URL other servers redirect clients to "
        f"[LOGHOST_ADVERTISE_URL; default: {default('advertise_url')}]",
    )
    s.add_argument(
        "--redis",
        metavar="URL",
        help="redis:// URL of the advisory leader hint "
        f"[LOGHOST_REDIS_URL; default: {default('redis_url')}]",
    )
    s.add_argument(
        "--log-level",
        help="DEBUG, INFO, WARNING, ERROR or CRITICAL "
        f"[LOGHOST_LOG_LEVEL; default: {default('log_level')}]",
    )
    s.add_argument(
        "--header-timeout-s",
        type=float,
        metavar="S",
        help="close a connection whose request headers take longer "
        f"[LOGHOST_HEADER_TIMEOUT_S; default: {default('header_timeout_s')}]",
    )
    s.add_argument(
        "--body-timeout-s",
        type=float,
        metavar="S",
        help="close a connection whose request body takes longer "
        f"[LOGHOST_BODY_TIMEOUT_S; default: {default('body_timeout_s')}]",
    )
    s.add_argument(
        "--max-connections",
        type=int,
        metavar="N",
        help="open connections at most; more are closed "
        f"[LOGHOST_MAX_CONNECTIONS; default: {default('max_connections')}]",
    )
    s.add_argument(
        "--dev",
        action="store_true",
        help="with no API keys, create and print a service key [LOGHOST_DEV; default: off]",
    )
    s.set_defaults(func=_serve, is_async=False)

    sc = sub.add_parser(
        "scrub",
        help="verify logs end to end: JSON lines on stdout, exit 1 on any problem",
        description="Verify logs end to end.  One JSON line per log on stdout; progress on "
        "stderr when it is a terminal.  Exits 1 when a log has a problem or there is no log.",
        formatter_class=_HelpFormatter,
    )
    sc.add_argument("store", help=STORE_HELP)
    sc.add_argument(
        "--log", help="scrub this one log prefix, e.g. logs/<uuid> [default: every log]"
    )
    sc.add_argument(
        "--prefix", default="", help="scrub every log under this prefix [default: the root]"
    )
    sc.add_argument(
        "--concurrency",
        type=int,
        default=8,
        metavar="N",
        help="objects read at once [default: %(default)s]",
    )
    sc.set_defaults(func=_scrub, is_async=True)

    g = sub.add_parser(
        "gc",
        help="advance one log's garbage collection by one pass",
        description="Advance one log's garbage collection by one pass (the server does this "
        "continuously; a live writer merely rebases).  The log needs a cursor (exit code 5 "
        "otherwise).",
        formatter_class=_HelpFormatter,
    )
    g.add_argument("store", help=STORE_HELP)
    g.add_argument("log", help="the log prefix, e.g. logs/<uuid> or dirty/<server-id>")
    g.add_argument(
        "--grace-s",
        type=float,
        default=300.0,
        metavar="S",
        help="a plan's objects are deleted only this long after it was recorded "
        "[default: %(default)s]",
    )
    g.add_argument(
        "--max-fraction",
        type=float,
        default=0.9,
        metavar="F",
        help="one pass drops at most this share of the live bytes [default: %(default)s]",
    )
    g.add_argument(
        "--retain-fragments",
        type=int,
        default=256,
        metavar="N",
        help="keep the objects of the newest N sequence numbers after unlinking them "
        "(the idempotency window a reopened writer reads); 0 keeps none [default: %(default)s]",
    )
    g.add_argument(
        "--retain-s",
        type=float,
        default=900.0,
        metavar="S",
        help="how long those retained objects are kept at most [default: %(default)s]",
    )
    g.set_defaults(func=_gc, is_async=True)

    d = sub.add_parser(
        "dirty-logs",
        help="list the servers' dirty logs in a store (to adopt those of removed hosts)",
        description="List the servers' dirty logs in a store, one JSON line each: to find "
        "those of removed hosts, for POST /v1/dirty/adopt.  Reads only; exit code 4 when "
        "there is no store at that path.",
        formatter_class=_HelpFormatter,
    )
    d.add_argument("store", help=STORE_HELP)
    d.set_defaults(func=_dirty_logs, is_async=True)

    i = sub.add_parser(
        "inspect",
        help="print a log's manifest summary, cursors and garbage",
        description="Print a log's manifest summary, cursors and garbage plan as JSON, and "
        "with --records its records, one JSON line each.  Reads only.",
        formatter_class=_HelpFormatter,
    )
    i.add_argument("store", help=STORE_HELP)
    i.add_argument("log", help="the log prefix, e.g. logs/<uuid> or dirty/<server-id>")
    i.add_argument("--records", action="store_true", help="also print records [default: off]")
    i.add_argument(
        "--from",
        dest="from_",
        type=int,
        metavar="OFFSET",
        help="the first record's offset [default: the oldest]",
    )
    i.add_argument(
        "--limit",
        type=int,
        default=100,
        metavar="N",
        help="records printed at most [default: %(default)s]",
    )
    i.add_argument(
        "--dirty",
        action="store_true",
        help="decode bodies as 48-byte dirty records [default: off]",
    )
    i.set_defaults(func=_inspect, is_async=True)
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``loghost`` command: one line and a distinct exit code per failure."""
    args = build_parser().parse_args(argv)
    store = getattr(args, "store", None)
    try:
        if args.is_async:
            return int(asyncio.run(args.func(args)))
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        err = classify(e, store)
        if err is None:
            if args.traceback:
                traceback.print_exc()
            err = CliError(
                ExitCode.INTERNAL,
                f"internal error: {type(e).__name__}: {e} (--traceback shows where)",
            )
        print(f"{PROG}: error: {err.message}", file=sys.stderr, flush=True)
        return int(err.code)


if __name__ == "__main__":
    sys.exit(main())
