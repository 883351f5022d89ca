"""The ``compactor`` command: ``compactor run --hosts ... --api-key ... --store ...``.

Every flag has an environment variable; a flag given on the command line wins over the variable,
which wins over the default.  Prefer ``COMPACTOR_API_KEY`` to ``--api-key``: command lines are
visible to every user of the machine.

Exit status (the numbers ``loghost`` uses for the same kinds; docs/OPERATIONS.md, "CLI exit
codes"): 0 when the round (``--once``) succeeded or the loop was stopped by a signal, 1 when a
``--once`` round had a failed collection or an unreachable host, 2 for bad configuration, 3 for an
unsupported store URL, 6 for an unreachable store, 7 when the metrics address is in use, 9 when a
host refuses the API key (checked before Spark starts), 70 for an internal error.  Each failure is
one ``compactor: error: ...`` line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import errno
import logging
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from .errors import CompactorError, Forbidden, LogHostUnavailable, Unauthorized

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from pyspark.sql import SparkSession

    from wal3.store import ObjectStore

    from .client import LogHostClient
    from .membership import Liveness
    from .metrics import CompactorMetrics
    from .pipeline import CompactionPipeline, Plan, RoundResult
    from .scheduler import DirtySource, Scheduler

log = logging.getLogger("compactor")


# Exit codes (host.cli_errors.ExitCode has the same numbers; the client does not import host).
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_STORE_URL = 3
EXIT_STORE_UNAVAILABLE = 6
EXIT_ADDRESS_IN_USE = 7
EXIT_KEY_REJECTED = 9
EXIT_INTERNAL = 70


class SettingsError(CompactorError, ValueError):
    """The configuration is incomplete or invalid."""


class CliFailure(CompactorError):
    """A failure ``compactor run`` reports as one line and exits with ``code``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


# A Spark job's fixed cost (scheduling, Python workers, Arrow hand-offs) is about what folding
# 10,000 records in one process takes (docs/PERFORMANCE.md, Compaction): smaller rounds fold in
# the driver.
DRIVER_FOLD_BELOW = 10_000


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything ``compactor run`` is configured with."""

    hosts: tuple[str, ...]
    api_key: str
    store: str
    member_id: str
    members: tuple[str, ...] = ()
    spark_master: str | None = None
    spark_remote: str | None = None  # sc://host:port: a Spark Connect server instead of a master
    spark_conf: tuple[tuple[str, str], ...] = ()
    # "driver": executors get the credentials the driver resolved (in the tasks' closures);
    # "executor": each executor uses its own AWS credential chain (instance roles, IRSA).
    s3_credentials: str = "driver"
    # "spark": rounds run on a SparkSession (spark_master / spark_remote); "local": in this
    # process with pyarrow (no JVM: small deployments, and the cluster-in-a-box tests).
    engine: str = "spark"
    level_ratio: float = 10.0
    # Rounds of fewer records fold in this process, not as a Spark job (whose fixed cost is
    # more than folding them); 0: every round on Spark.
    driver_fold_below: int = DRIVER_FOLD_BELOW
    spark_plan: str = "auto"  # the Spark job's plan: auto, one-stage or two-stage
    min_records: int = 1
    interval_s: float = 30.0
    budget_records: int = 10_000_000
    metrics_listen: str | None = None
    once: bool = False
    dirty_limit: int | None = None
    progress: bool = False
    keep_versions: int = 2
    prune_grace_s: float = 300.0
    liveness_ttl_s: float = 0.0  # 0: four intervals, at least 60 s
    takeover_s: float = 600.0
    # Touched before the first round and after every round: a liveness probe reads its age.
    heartbeat_file: str | None = None

    @property
    def effective_liveness_ttl_s(self) -> float:
        """How long a member's liveness record counts (a round may outlast one interval)."""
        return self.liveness_ttl_s or max(60.0, 4 * self.interval_s)


def _split(value: str | None) -> tuple[str, ...]:
    return tuple(p.strip() for p in (value or "").split(",") if p.strip())


def _num(name: str, value: str | None, kind: type[int] | type[float], default: float) -> float:
    if value is None or value == "":
        return default
    try:
        out = kind(value)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {value!r}") from None
    if out < 0:
        raise SettingsError(f"{name} must not be negative")
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``compactor`` command."""
    parser = argparse.ArgumentParser(
        prog="compactor",
        description="compactor: compacts the log hosts' dirty collections with Spark.\n\n"
        "Exit codes: 0 ok, 1 a --once round failed, 2 usage or configuration, 3 unsupported "
        "store URL,\n6 store unreachable, 7 metrics address in use, 9 API key rejected by a "
        "host, 70 internal error.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(title="commands", dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="poll the hosts and compact dirty collections",
        description="Poll the hosts and compact dirty collections.  Every flag has a "
        "COMPACTOR_* variable (in brackets, with the default after it); the flag wins.",
    )
    run.add_argument("--hosts", help="log host URLs, comma-separated [COMPACTOR_HOSTS; required]")
    run.add_argument(
        "--api-key",
        help="service API key [COMPACTOR_API_KEY or the file COMPACTOR_API_KEY_FILE; required]",
    )
    run.add_argument(
        "--store",
        help="object store URL: path, file:///dir or s3://bucket/prefix "
        "[COMPACTOR_STORE; required]",
    )
    run.add_argument("--member-id", help="this compactor's id [COMPACTOR_MEMBER_ID; hostname]")
    run.add_argument(
        "--members",
        help="all compactor ids, comma-separated [COMPACTOR_MEMBERS; the live records alone]",
    )
    run.add_argument(
        "--spark-master",
        help="Spark master: local[N], spark://host:port, k8s://https://host:port "
        "[COMPACTOR_SPARK_MASTER; spark-submit's or local[*]]",
    )
    run.add_argument(
        "--spark-remote",
        help="a Spark Connect server, sc://host:port, instead of a master "
        "[COMPACTOR_SPARK_REMOTE; off]",
    )
    run.add_argument(
        "--spark-conf",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="a Spark setting, repeatable [COMPACTOR_SPARK_CONF: KEY=VALUE,KEY=VALUE; none]",
    )
    run.add_argument(
        "--engine",
        choices=("spark", "local"),
        help="where rounds fold: on Spark, or in this process with pyarrow (no JVM) "
        "[COMPACTOR_ENGINE; spark]",
    )
    run.add_argument(
        "--s3-credentials",
        choices=("driver", "executor"),
        help="how executors sign S3 requests: with the credentials the driver resolved, or "
        "with their own AWS chain [COMPACTOR_S3_CREDENTIALS; driver]",
    )
    run.add_argument(
        "--driver-fold-below",
        help="rounds of fewer records fold in this process instead of a Spark job; 0: always "
        "Spark [COMPACTOR_DRIVER_FOLD_BELOW; 10000]",
    )
    run.add_argument(
        "--spark-plan",
        choices=("auto", "one-stage", "two-stage"),
        help="the Spark job's plan: one stage per collection share, or fragments read in "
        "parallel then shuffled by collection [COMPACTOR_SPARK_PLAN; auto]",
    )
    run.add_argument(
        "--level-ratio",
        help="size ratio between adjacent levels of compacted runs [COMPACTOR_LEVEL_RATIO; 10]",
    )
    run.add_argument(
        "--min-records", help="skip logs with fewer dirty records [COMPACTOR_MIN_RECORDS; 1]"
    )
    run.add_argument("--interval-s", help="seconds between rounds [COMPACTOR_INTERVAL_S; 30]")
    run.add_argument("--budget-records", help="records per round [COMPACTOR_BUDGET_RECORDS; 1e7]")
    run.add_argument(
        "--metrics-listen",
        help="serve Prometheus metrics on HOST:PORT [COMPACTOR_METRICS_LISTEN; off]",
    )
    run.add_argument(
        "--dirty-limit",
        help="dirty entries asked of each host [COMPACTOR_DIRTY_LIMIT; the host's default]",
    )
    run.add_argument(
        "--keep-versions",
        help="compacted versions kept per collection, the "
        "current one included [COMPACTOR_KEEP_VERSIONS; 2]",
    )
    run.add_argument(
        "--prune-grace-s",
        help="seconds a superseded version stays readable "
        "before it is deleted [COMPACTOR_PRUNE_GRACE_S; 300]",
    )
    run.add_argument(
        "--liveness-ttl-s",
        help="a member whose liveness record is older is "
        "treated as dead [COMPACTOR_LIVENESS_TTL_S; 4 intervals, >= 60]",
    )
    run.add_argument(
        "--takeover-s",
        help="a collection its owner made no progress on for this "
        "long goes to the next member in rendezvous order [COMPACTOR_TAKEOVER_S; 600]",
    )
    run.add_argument(
        "--once",
        action="store_true",
        default=None,
        help="run one round and exit (0 when it succeeded) [COMPACTOR_ONCE; off]",
    )
    run.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show progress bars [when stderr is a terminal]",
    )
    run.add_argument(
        "--log-level",
        default=os.environ.get("COMPACTOR_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR [COMPACTOR_LOG_LEVEL; INFO]",
    )
    return parser


def settings_from(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """Merge flags over environment variables over defaults into one ``Settings``."""

    def pick(flag: str | None, env: str) -> str | None:
        return flag if flag is not None else (environ.get(env) or None)

    hosts = _split(pick(args.hosts, "COMPACTOR_HOSTS"))
    api_key = pick(args.api_key, "COMPACTOR_API_KEY")
    if api_key is None and environ.get("COMPACTOR_API_KEY_FILE"):
        # A mounted Secret: the key stays out of the environment Spark's children inherit.
        try:
            with open(environ["COMPACTOR_API_KEY_FILE"], encoding="utf-8") as f:
                api_key = f.read().strip() or None
        except OSError as e:
            raise SettingsError(f"COMPACTOR_API_KEY_FILE: {e}") from None
    store = pick(args.store, "COMPACTOR_STORE")
    required = (("--hosts", hosts), ("--api-key", api_key), ("--store", store))
    missing = [name for name, value in required if not value]
    if missing:
        raise SettingsError(f"missing {', '.join(missing)} (or their COMPACTOR_* variables)")
    from wal3.storeurl import store_url_parts

    try:
        store_url_parts(str(store))
    except ValueError as e:
        raise CliFailure(EXIT_STORE_URL, str(e)) from None
    for h in hosts:
        if not h.startswith(("http://", "https://")):
            raise SettingsError(f"host URL {h!r} must start with http:// or https://")
    members = tuple(dict.fromkeys(_split(pick(args.members, "COMPACTOR_MEMBERS"))))
    member_id = pick(args.member_id, "COMPACTOR_MEMBER_ID")
    if member_id is None:
        if len(members) > 1:
            raise SettingsError("--members needs --member-id (which of them this compactor is)")
        member_id = members[0] if members else socket.gethostname()
    if members and member_id not in members:
        raise SettingsError(f"--member-id {member_id!r} is not in --members {','.join(members)}")
    once_env = environ.get("COMPACTOR_ONCE", "").lower() in ("1", "true", "yes")
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    dirty_limit = pick(args.dirty_limit, "COMPACTOR_DIRTY_LIMIT")
    min_records = pick(args.min_records, "COMPACTOR_MIN_RECORDS")
    interval_s = pick(args.interval_s, "COMPACTOR_INTERVAL_S")
    budget = pick(args.budget_records, "COMPACTOR_BUDGET_RECORDS")
    keep_versions = int(
        _num("keep-versions", pick(args.keep_versions, "COMPACTOR_KEEP_VERSIONS"), int, 2)
    )
    spark_master = pick(getattr(args, "spark_master", None), "COMPACTOR_SPARK_MASTER")
    spark_remote = pick(getattr(args, "spark_remote", None), "COMPACTOR_SPARK_REMOTE")
    if spark_master and spark_remote:
        raise SettingsError("--spark-master and --spark-remote are exclusive")
    if spark_remote and not spark_remote.startswith("sc://"):
        raise SettingsError(f"--spark-remote {spark_remote!r} must start with sc://")
    if spark_master and not spark_master.startswith(("local", "spark://", "k8s://", "yarn")):
        raise SettingsError(
            f"--spark-master {spark_master!r}: expected local[N], spark://..., k8s://... or yarn"
        )
    conf_items = getattr(args, "spark_conf", None)
    if conf_items is None:
        conf_items = list(_split(environ.get("COMPACTOR_SPARK_CONF")))
    spark_conf = []
    for item in conf_items:
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise SettingsError(f"--spark-conf {item!r} is not KEY=VALUE")
        spark_conf.append((key.strip(), value))
    s3_credentials = (
        pick(getattr(args, "s3_credentials", None), "COMPACTOR_S3_CREDENTIALS") or "driver"
    )
    engine = pick(getattr(args, "engine", None), "COMPACTOR_ENGINE") or "spark"
    if engine not in ("spark", "local"):
        raise SettingsError(f"engine must be spark or local, not {engine!r}")
    if engine == "local" and (spark_master or spark_remote):
        raise SettingsError("--engine local runs no Spark: drop --spark-master/--spark-remote")
    if s3_credentials not in ("driver", "executor"):
        raise SettingsError("s3-credentials must be driver or executor")
    level_ratio = float(
        _num(
            "level-ratio",
            pick(getattr(args, "level_ratio", None), "COMPACTOR_LEVEL_RATIO"),
            float,
            10.0,
        )
    )
    if level_ratio < 2:
        raise SettingsError("level-ratio must be at least 2")
    driver_fold_below = int(
        _num(
            "driver-fold-below",
            pick(getattr(args, "driver_fold_below", None), "COMPACTOR_DRIVER_FOLD_BELOW"),
            int,
            DRIVER_FOLD_BELOW,
        )
    )
    if driver_fold_below < 0:
        raise SettingsError("driver-fold-below must be at least 0")
    spark_plan = pick(getattr(args, "spark_plan", None), "COMPACTOR_SPARK_PLAN") or "auto"
    if spark_plan not in ("auto", "one-stage", "two-stage"):
        raise SettingsError(f"spark-plan must be auto, one-stage or two-stage, not {spark_plan!r}")
    if keep_versions < 1:
        raise SettingsError("keep-versions must be at least 1 (the current version)")
    return Settings(
        hosts=tuple(h.rstrip("/") for h in hosts),
        api_key=str(api_key),
        store=str(store),
        member_id=member_id,
        members=members,
        spark_master=spark_master,
        spark_remote=spark_remote,
        spark_conf=tuple(spark_conf),
        s3_credentials=s3_credentials,
        engine=engine,
        level_ratio=level_ratio,
        driver_fold_below=driver_fold_below,
        spark_plan=spark_plan,
        min_records=int(_num("min-records", min_records, int, 1)),
        interval_s=float(_num("interval-s", interval_s, float, 30.0)),
        budget_records=int(_num("budget-records", budget, int, 10_000_000)),
        metrics_listen=pick(args.metrics_listen, "COMPACTOR_METRICS_LISTEN"),
        once=bool(args.once) or once_env,
        dirty_limit=int(_num("dirty-limit", dirty_limit, int, 0)) or None,
        progress=bool(progress),
        keep_versions=keep_versions,
        prune_grace_s=float(
            _num("prune-grace-s", pick(args.prune_grace_s, "COMPACTOR_PRUNE_GRACE_S"), float, 300.0)
        ),
        liveness_ttl_s=float(
            _num(
                "liveness-ttl-s",
                pick(getattr(args, "liveness_ttl_s", None), "COMPACTOR_LIVENESS_TTL_S"),
                float,
                0.0,
            )
        ),
        heartbeat_file=environ.get("COMPACTOR_HEARTBEAT_FILE") or None,
        takeover_s=_positive(
            "takeover-s",
            _num(
                "takeover-s",
                pick(getattr(args, "takeover_s", None), "COMPACTOR_TAKEOVER_S"),
                float,
                600.0,
            ),
        ),
    )


def _positive(name: str, value: float) -> float:
    if value <= 0:
        raise SettingsError(f"{name} must be positive")
    return float(value)


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``PORT`` → (host, port); the host defaults to 127.0.0.1."""
    host, _, port = value.rpartition(":")
    try:
        return (host.strip("[]") or "127.0.0.1"), int(port)
    except ValueError:
        raise SettingsError(f"metrics listen address {value!r} is not HOST:PORT") from None


async def run(
    settings: Settings,
    *,
    spark: SparkSession | None = None,
    registry: CollectorRegistry | None = None,
    stop: asyncio.Event | None = None,
) -> int:
    """Run rounds until ``stop`` is set (or one round with ``once``); returns the exit status."""
    from prometheus_client import CollectorRegistry, start_http_server

    from .client import LogHostClient
    from .metrics import CompactorMetrics
    from .pipeline import CompactionPipeline
    from .sparkutil import build_session, ship_package
    from .stores import open_object_store

    registry = registry if registry is not None else CollectorRegistry()
    metrics = CompactorMetrics(registry)
    stop = stop if stop is not None else asyncio.Event()
    metrics_server: Any = None
    clients: dict[str, LogHostClient] = {}
    store: Any = None
    own_spark = spark is None
    heartbeat: asyncio.Task[None] | None = None
    try:
        if settings.metrics_listen:
            addr, port = parse_listen(settings.metrics_listen)
            try:
                metrics_server = start_http_server(port, addr=addr, registry=registry)
            except OSError as e:
                why = "address already in use" if e.errno == errno.EADDRINUSE else e.strerror
                raise CliFailure(
                    EXIT_ADDRESS_IN_USE, f"cannot listen on {settings.metrics_listen}: {why}"
                ) from None
        store = await open_object_store(settings.store)
        # Redirects only among the configured hosts: the service key goes nowhere else.
        clients = {
            h: LogHostClient(h, settings.api_key, redirect_hosts=list(settings.hosts))
            for h in settings.hosts
        }
        # Before Spark: a wrong key is one line and exit code 9, not a JVM and failing rounds.
        await check_key(clients)
        if spark is None and settings.engine == "spark":
            spark = build_session(
                settings.spark_master,
                remote=settings.spark_remote,
                conf=dict(settings.spark_conf),
            )
        if spark is not None:
            ship_package(spark)
        scheduler = make_scheduler(settings, store, list(clients.values()))
        assert scheduler.liveness is not None
        # Beat during rounds too: a long Spark job must not make this member look dead.
        heartbeat = asyncio.create_task(_heartbeat(scheduler.liveness), name="compactor-heartbeat")
        pipeline = CompactionPipeline(
            spark,
            store,
            clients,
            metrics=metrics,
            progress=settings.progress,
            keep_versions=settings.keep_versions,
            prune_grace_s=settings.prune_grace_s,
            ratio=settings.level_ratio,
            ship_credentials=settings.s3_credentials == "driver",
            driver_fold_below=settings.driver_fold_below,
            plan=cast("Plan", settings.spark_plan),
        )
        _touch(settings.heartbeat_file)
        while True:
            ok = await _one_round(scheduler, pipeline, metrics)
            _touch(settings.heartbeat_file)
            if settings.once:
                return 0 if ok else 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=settings.interval_s)
            if stop.is_set():
                return 0
    finally:
        if heartbeat is not None:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
        await asyncio.gather(*(c.aclose() for c in clients.values()), return_exceptions=True)
        if store is not None:
            with contextlib.suppress(Exception):
                await store.close()
        if own_spark and spark is not None:
            spark.stop()
        if isinstance(metrics_server, tuple):  # prometheus-client >= 0.20: (server, thread)
            metrics_server[0].shutdown()


async def check_key(clients: Mapping[str, LogHostClient]) -> None:
    """Ask every host for one dirty entry with the key: CliFailure(9) when one refuses it.

    An unreachable host proves nothing (it may come up later: rounds skip it meanwhile).
    """

    async def ask(url: str, client: LogHostClient) -> None:
        try:
            await client.dirty(limit=1)
        except (Unauthorized, Forbidden) as e:
            what = "unknown" if isinstance(e, Unauthorized) else "not a service key"
            raise CliFailure(
                EXIT_KEY_REJECTED,
                f"the host {url} rejected the API key ({e.status} {e.code}: {what}); "
                "give a service key (key=*) in --api-key or COMPACTOR_API_KEY[_FILE]",
            ) from None
        except LogHostUnavailable as e:
            log.warning("could not check the API key with %s: %s", url, e)

    for url, client in clients.items():
        await ask(url, client)


def make_scheduler(
    settings: Settings,
    store: ObjectStore,
    sources: Sequence[DirtySource],
    *,
    clock: Callable[[], float] = time.time,
) -> Scheduler:
    """The scheduler ``run`` uses: liveness records and this member's take-over clocks in
    ``store``, on wall time (both outlive the process: ``--once`` runs are one round each)."""
    from .membership import Liveness
    from .scheduler import ProgressLedger, Scheduler

    return Scheduler(
        list(sources),
        member_id=settings.member_id,
        members=settings.members,
        budget_records=settings.budget_records,
        min_records=settings.min_records,
        dirty_limit=settings.dirty_limit,
        liveness=Liveness(
            store, settings.member_id, ttl_s=settings.effective_liveness_ttl_s, clock=clock
        ),
        takeover_s=settings.takeover_s,
        clock=clock,
        ledger=ProgressLedger(store, settings.member_id),
    )


def _touch(path: str | None) -> None:
    """Mark the round loop alive (``COMPACTOR_HEARTBEAT_FILE``); a failure is only logged."""
    if path:
        try:
            with open(path, "a"):
                os.utime(path)
        except OSError as e:
            log.warning("could not touch the heartbeat file %s: %r", path, e)


async def _heartbeat(liveness: Liveness) -> None:
    """Renew this member's liveness record every third of its lifetime; failures are retried."""
    while True:
        await asyncio.sleep(liveness.ttl_s / 3)  # the renewal period, not a synchronisation
        try:
            await liveness.beat()
        except Exception as e:
            log.warning("could not renew the liveness record: %r", e)


async def _one_round(
    scheduler: Scheduler, pipeline: CompactionPipeline, metrics: CompactorMetrics
) -> bool:
    """Select and compact once; a bug in a round is logged and counted, not fatal to the loop."""
    try:
        selection = await scheduler.select_round()
        result = await pipeline.run_round(selection.selected, failed_hosts=selection.failed_hosts)
    except Exception:
        log.exception("compaction round failed")
        metrics.rounds.labels(outcome="failed").inc()
        metrics.failures.labels(stage="round").inc()
        return False
    _report(
        result,
        selection.merged,
        selection.not_ours,
        selection.over_budget,
        selection.taken_over,
        selection.members,
    )
    return result.ok


def _report(
    result: RoundResult,
    merged: int,
    not_ours: int,
    over_budget: int,
    taken_over: int = 0,
    members: Sequence[str] = (),
) -> None:
    from .logs import log_round
    from .pipeline import summarize

    summary = summarize(result)
    summary.update(
        dirty=merged,
        not_ours=not_ours,
        over_budget=over_budget,
        taken_over=taken_over,
        members=list(members),
    )
    log_round(log, summary)


SECRET_VARIABLES = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")


class RedactSecrets(logging.Filter):
    """Replaces secrets in every record a handler emits, whoever logged it.

    The compactor logs no secret itself, but at DEBUG the libraries under it may: botocore
    prints request headers (the access key id), Spark Connect's client the plans it sends —
    which carry the tasks' functions, and with them the S3 credentials the executors get.
    """

    def __init__(self, secrets: Sequence[str]) -> None:
        super().__init__()
        # Longest first, so a secret containing another is replaced whole; short values (a
        # placeholder like "x") would only garble logs.
        self.secrets = sorted({v for v in secrets if len(v) >= 6}, key=len, reverse=True)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        exc = record.exc_text or ""
        if any(v in text or v in exc for v in self.secrets):
            for v in self.secrets:
                text = text.replace(v, "***")
                exc = exc.replace(v, "***")
            record.msg, record.args = text, None
            record.exc_text = exc or None
        return True


def secrets_of(settings: Settings | None, environ: Mapping[str, str]) -> list[str]:
    """What must never reach a log: the API key and the store's credentials."""
    out = [environ.get(name, "") for name in SECRET_VARIABLES]
    if settings is not None:
        out.append(settings.api_key)
    return [v for v in out if v]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``compactor`` console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        settings = settings_from(args, os.environ)
        if settings.metrics_listen:
            parse_listen(settings.metrics_listen)
    except SettingsError as e:
        parser.error(str(e))  # exits 2
    except CliFailure as e:
        return _fail(e)
    from .logs import configure as configure_logs

    configure_logs(args.log_level, [RedactSecrets(secrets_of(settings, os.environ))])

    async def _main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, stop.set)
        return await run(settings, stop=stop)

    try:
        return asyncio.run(_main())
    except KeyboardInterrupt:
        return 130
    except CliFailure as e:
        return _fail(e)
    except Exception as e:
        from wal3 import StoreError, StoreUnavailable

        if isinstance(e, StoreUnavailable | StoreError):
            return _fail(CliFailure(EXIT_STORE_UNAVAILABLE, f"store {settings.store!r}: {e}"))
        log.exception("internal error")
        return _fail(CliFailure(EXIT_INTERNAL, f"internal error: {type(e).__name__}: {e}"))


def _fail(e: CliFailure) -> int:
    print(f"compactor: error: {e.message}", file=sys.stderr, flush=True)
    return e.code


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loghost")
    except PackageNotFoundError:
        return "unknown (not installed)"


if __name__ == "__main__":
    # Run as a file (``spark-submit compactor_client/cli.py run ...``): relative imports need the
    # package, so import it by name from the directory above this file.
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from compactor_client.cli import main as _package_main

    sys.exit(_package_main())
