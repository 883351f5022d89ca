"""One compaction round: plan on the driver, fold on Spark executors, install on the driver.

Order of effects for each collection, and why a crash anywhere is safe:

1. *Plan* (driver): read ``CURRENT.json`` (the base version: its runs by level, and its etag) and
   the fragment list from the base's ``offset`` to the tail.  Nothing is written.
2. *Fold* (one Spark job for all collections, on the DataFrame API): executors read the fragments
   in parallel with pyarrow (``mapInArrow``), Spark partitions the records by collection, and one
   ``applyInArrow`` call per collection folds its window into a new top run, merges levels as the
   level policy says, and writes every new run under fresh, unreferenced keys
   (``executor``).  A crash here leaves at most orphan runs; the old version stays current.
3. *Install* (driver): ``CURRENT.json`` is replaced by conditional put, listing the new stack of
   runs.  This single atomic write is the commit point: before it the old version is current,
   after it the new one.  Losing the race to another compactor deletes our runs and stops here.
4. *Advance* (driver): ``POST .../compaction {"offset": end}`` — only after the data is current,
   so the cursor is never ahead of its data.  A crash between 3 and 4 leaves the cursor behind
   ``CURRENT.json``; the next round folds from ``CURRENT.json``'s offset (not the cursor), so no
   record is applied twice, and it advances the cursor.
5. *Prune* (driver, best effort): runs no kept version lists go once the grace has passed
   (``versions.prune_versions``).

Runs are written by the executors, not the driver: a collection's rows never travel to the driver
(which would make driver memory the limit on a cluster) and the writes run in parallel.  The driver
holds one small task and one statistics row per collection, and keeps the only operation that
needs coordination, the conditional put of the pointer.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .crashpoints import crash_point
from .errors import CompactorError, LogHostError
from .executor import (
    READ_DDL,
    STATS_DDL,
    TASK_DDL,
    CollectionStats,
    FoldTask,
    FragmentTask,
    RunRef,
    fold_locally,
    fold_task_json,
    fragment_task_json,
    group_function,
    group_task_json,
    stage_functions,
)
from .integrity import UnverifiableFragmentError
from .levels import DEFAULT_MIN_REWARD, DEFAULT_RATIO
from .metrics import CompactorMetrics
from .models import FragmentInfo
from .parquet_io import S3Options
from .scheduler import Candidate
from .sparkutil import default_parallelism, is_connect, tag_jobs
from .versions import (
    CorruptCurrent,
    CurrentVersion,
    PendingVersion,
    RunEntry,
    allocate_version,
    discard_version,
    install_version,
    prune_versions,
    read_current,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from wal3.store import ObjectStore

log = logging.getLogger(__name__)

Status = Literal["compacted", "lost", "skipped", "failed"]


class LogApi(Protocol):
    """The host calls the pipeline makes (``LogHostClient`` satisfies it)."""

    async def fragments(
        self, tenant: str, collection_id: str, *, from_offset: int | None = None
    ) -> list[FragmentInfo]:
        """Fragments from ``from_offset`` to the tail."""
        ...

    async def compact(self, tenant: str, collection_id: str, offset: int) -> int:
        """Advance the compaction cursor."""
        ...


class PlanError(CompactorError):
    """A collection cannot be compacted as planned (gap in the log, corrupt pointer...)."""


@dataclass(frozen=True, slots=True)
class CollectionOutcome:
    """What a round did with one collection."""

    tenant: str
    collection_id: str
    status: Status
    version: int | None = None
    start: int | None = None
    end: int | None = None
    records_in: int = 0
    rows_out: int = 0
    levels: int = 0  # runs (one per level) of the installed version: what a reader merges
    merges: int = 0  # levels merged by this round
    bytes_out: int = 0  # bytes of runs written
    stage: str | None = None
    error: str | None = None
    error_kind: str | None = None  # typed cause of a failure: corrupt_fragment, gap, ...


@dataclass(frozen=True, slots=True)
class RoundResult:
    """Outcomes and totals of one round."""

    outcomes: list[CollectionOutcome]
    seconds: float
    spark_seconds: float = 0.0
    failed_hosts: dict[str, str] = field(default_factory=dict)
    # Where the round folded: "driver" (no Spark job), "one-stage" or "two-stage" (the Spark
    # job's plan), or "" when nothing was folded.
    fold: str = ""

    def count(self, status: Status) -> int:
        """How many collections ended with ``status``."""
        return sum(1 for o in self.outcomes if o.status == status)

    @property
    def ok(self) -> bool:
        """No collection failed and every host answered."""
        return self.count("failed") == 0 and not self.failed_hosts

    @property
    def records_in(self) -> int:
        """Records folded into installed versions."""
        return sum(o.records_in for o in self.outcomes if o.status == "compacted")

    @property
    def rows_out(self) -> int:
        """Run entries of installed versions."""
        return sum(o.rows_out for o in self.outcomes if o.status == "compacted")

    @property
    def merges(self) -> int:
        """Levels merged by installed versions."""
        return sum(o.merges for o in self.outcomes if o.status == "compacted")

    @property
    def max_levels(self) -> int:
        """The most levels (runs) any installed version has: a reader's read amplification."""
        return max((o.levels for o in self.outcomes if o.status == "compacted"), default=0)


@dataclass(slots=True)
class _Plan:
    cidx: int
    candidate: Candidate
    pending: PendingVersion
    start: int
    end: int
    fragments: list[FragmentInfo]
    base: tuple[RunRef, ...]
    outputs: tuple[tuple[str, str], ...]

    def fold_task(self, ratio: float, min_reward: float) -> FoldTask:
        return FoldTask(
            cidx=self.cidx,
            collection_id=self.candidate.log.collection_id,
            start=self.start,
            end=self.end,
            base=self.base,
            outputs=self.outputs,
            ratio=ratio,
            min_reward=min_reward,
        )

    def fragment_tasks(self) -> list[FragmentTask]:
        return [
            FragmentTask(
                cidx=self.cidx,
                url=f.url,
                start=f.start,
                limit=f.limit,
                lo=self.start,
                hi=self.end,
                setsum=f.setsum,
                content_md5=f.content_md5,
            )
            for f in self.fragments
        ]


def check_coverage(fragments: Sequence[FragmentInfo], start: int) -> tuple[list[FragmentInfo], int]:
    """The fragments overlapping [start, tail) and the tail, checking they leave no gap."""
    frags = sorted((f for f in fragments if f.limit > start), key=lambda f: f.start)
    if not frags:
        return [], start
    if frags[0].start > start:
        raise PlanError(
            f"log has no fragment for offsets [{start}, {frags[0].start}): purged below the "
            "compacted version"
        )
    for prev, nxt in itertools.pairwise(frags):
        if nxt.start != prev.limit:
            raise PlanError(f"fragments leave a gap or overlap at [{prev.limit}, {nxt.start})")
    return frags, frags[-1].limit


Plan = Literal["auto", "one-stage", "two-stage"]
PLANS: tuple[Plan, ...] = ("auto", "one-stage", "two-stage")
# Below this many fragments per task slot, reading a round's fragments in parallel (the
# two-stage plan) is not worth a shuffle.
FRAGMENTS_PER_SLOT = 4


def choose_plan(collections: int, fragments: int, parallelism: int) -> Plan:
    """The plan ``auto`` picks.  One stage (each collection read and folded in one task, no
    shuffle) whenever there are at least as many collections as task slots, or too few fragments
    to be worth spreading: every slot then has whole collections to fold.  Two stages (fragments
    read in parallel, then shuffled by collection) when a few collections hold many fragments,
    e.g. one large collection compacted from scratch: its reads are spread over every slot."""
    if collections >= parallelism or fragments <= parallelism * FRAGMENTS_PER_SLOT:
        return "one-stage"
    return "two-stage"


def run_compaction_job(
    spark: SparkSession,
    fold_tasks: Sequence[FoldTask],
    fragment_tasks: Sequence[FragmentTask],
    s3: S3Options | None = None,
    *,
    partitions: int | None = None,
    plan: Plan = "auto",
) -> list[CollectionStats]:
    """One Spark job folding many collections; returns one stats entry per fold task.

    DataFrame API only (so it runs on Spark Connect too).  Two plans (:func:`choose_plan`), both
    folding with the same executor functions:

    * one stage: one task row per slot, each a balanced share of whole collections (their fold
      tasks and fragments), read and folded by ``mapInArrow``; only task rows and statistics
      cross between the JVM and Python, nothing is shuffled;
    * two stages: task rows read by ``mapInArrow``, partitioned by collection, folded by
      ``groupBy(...).applyInArrow``; every row crossing the shuffle is an Arrow/Spark row of
      typed columns, never a Python object.
    """
    if not fold_tasks:
        return []
    parallelism = default_parallelism(spark)
    if plan == "auto":
        plan = choose_plan(len(fold_tasks), len(fragment_tasks), parallelism)
    if plan == "one-stage":
        return _one_stage_job(spark, fold_tasks, fragment_tasks, s3, parallelism, partitions)
    if plan != "two-stage":
        raise ValueError(f"plan must be one of {', '.join(PLANS)}, not {plan!r}")
    rows = [(t.cidx, fold_task_json(t)) for t in fold_tasks]
    rows += [(t.cidx, fragment_task_json(t)) for t in fragment_tasks]
    read_parts = max(1, min(len(rows), parallelism * 2))
    fold_parts = partitions or max(1, min(len(fold_tasks), parallelism * 2))
    read, fold = stage_functions(s3)
    # Interleaved, so that contiguous slices of the list share out the fragments evenly.
    random.Random(len(rows)).shuffle(rows)
    tasks = spark.createDataFrame(rows, schema=TASK_DDL)
    if is_connect(spark):
        # A local relation is one partition on Connect; a classic session already slices the
        # list into defaultParallelism partitions (no shuffle needed).
        tasks = tasks.repartition(read_parts)
    records = tasks.mapInArrow(read, READ_DDL)
    # Every row of a collection in one partition; one applyInArrow call per collection.
    stats = records.repartition(fold_parts, "cidx").groupBy("cidx").applyInArrow(fold, STATS_DDL)
    return [CollectionStats.from_row(r) for r in stats.collect()]


def _one_stage_job(
    spark: SparkSession,
    fold_tasks: Sequence[FoldTask],
    fragment_tasks: Sequence[FragmentTask],
    s3: S3Options | None,
    parallelism: int,
    partitions: int | None,
) -> list[CollectionStats]:
    by_cidx: dict[int, list[FragmentTask]] = {}
    for f in fragment_tasks:
        by_cidx.setdefault(f.cidx, []).append(f)
    # Longest first onto the least loaded share (LPT): shares of nearly equal records.
    shares: list[list[str]] = [[] for _ in range(min(len(fold_tasks), partitions or parallelism))]
    load = [0] * len(shares)
    for t in sorted(fold_tasks, key=lambda t: (t.start - t.end, t.cidx)):
        i = load.index(min(load))
        load[i] += t.end - t.start + 1
        shares[i].append(group_task_json(t, by_cidx.get(t.cidx, [])))
    rows = [(i, "[" + ",".join(share) + "]") for i, share in enumerate(shares)]
    tasks = spark.createDataFrame(rows, schema=TASK_DDL)
    if is_connect(spark) or len(rows) > parallelism:
        # A classic session slices a local list into defaultParallelism partitions, which is
        # one share each; Connect keeps it as one partition.
        tasks = tasks.repartition(len(rows))
    stats = tasks.mapInArrow(group_function(s3), STATS_DDL)
    return [CollectionStats.from_row(r) for r in stats.collect()]


def run_locally(
    fold_tasks: Sequence[FoldTask],
    fragment_tasks: Sequence[FragmentTask],
    s3: S3Options | None = None,
) -> list[CollectionStats]:
    """The job's two stages in this process, one collection after another, without Spark (the
    single-process baseline, and a pipeline built with ``spark=None``)."""
    by_cidx: dict[int, list[FragmentTask]] = {}
    for t in fragment_tasks:
        by_cidx.setdefault(t.cidx, []).append(t)
    return [fold_locally(t, by_cidx.get(t.cidx, []), s3) for t in fold_tasks]


class CompactionPipeline:
    """Runs compaction rounds over the collections a scheduler selected."""

    def __init__(
        self,
        spark: SparkSession | None,
        store: ObjectStore,
        apis: Mapping[str, LogApi],
        *,
        metrics: CompactorMetrics | None = None,
        s3: S3Options | None = None,
        progress: bool = False,
        console: Console | None = None,
        concurrency: int = 16,
        progress_interval_s: float = 0.5,
        keep_versions: int = 2,
        prune_grace_s: float = 300.0,
        ratio: float = DEFAULT_RATIO,
        min_reward: float = DEFAULT_MIN_REWARD,
        ship_credentials: bool = True,
        driver_fold_below: int = 0,
        plan: Plan = "auto",
    ) -> None:
        """``s3``: where S3 is and how executors sign in; by default the driver's environment,
        its credentials included unless ``ship_credentials`` is false (executors then use
        their own AWS chain).  ``ratio`` and ``min_reward``: the level policy (``levels``).
        ``spark`` None folds in this process instead (``run_locally``).  ``driver_fold_below``:
        a round of fewer records than this folds in this process too, with the same functions:
        a Spark job's fixed cost (scheduling, Python workers, Arrow hand-offs; about half a
        second here) is more than folding a few thousand records takes.  ``plan``: the Spark
        job's plan (:func:`choose_plan`)."""
        if plan not in PLANS:
            raise ValueError(f"plan must be one of {', '.join(PLANS)}, not {plan!r}")
        self.spark = spark
        self.driver_fold_below = driver_fold_below
        self.plan: Plan = plan
        self.store = store
        self.apis = apis
        self.metrics = metrics
        self._s3 = s3
        self.ship_credentials = ship_credentials
        self.ratio = ratio
        self.min_reward = min_reward
        self.progress = progress
        self.console = console
        self.progress_interval_s = progress_interval_s
        self.keep_versions = keep_versions
        self.prune_grace_s = prune_grace_s
        self._sem = asyncio.Semaphore(concurrency)

    @property
    def s3(self) -> S3Options:
        """The S3 options this round's tasks carry (resolved again every round, so credentials
        that rotate are picked up)."""
        if self._s3 is not None:
            return self._s3
        return S3Options.from_env(credentials=self.ship_credentials)

    # ------------------------------------------------------------------------------- planning

    async def _plan_one(self, cidx: int, cand: Candidate) -> _Plan | CollectionOutcome:
        tenant, cid = cand.log.tenant, cand.log.collection_id
        try:
            api = self.apis[cand.host_url]
            async with self._sem:
                base = await read_current(self.store, cid)
                start = base.offset if base is not None else 1
                frags, end = check_coverage(
                    await api.fragments(tenant, cid, from_offset=start), start
                )
                unverifiable = [f.url for f in frags if not (f.setsum or f.content_md5)]
                if unverifiable:
                    # Nothing unverified is compacted: no checksum, no fold.
                    raise UnverifiableFragmentError(
                        f"the host reported no checksum for {unverifiable[0]}"
                    )
                if end <= start:
                    if base is not None and cand.log.start < base.offset:
                        # A crash after installing left the cursor behind the data: catch it up.
                        await api.compact(tenant, cid, base.offset)
                    return CollectionOutcome(tenant, cid, "skipped", start=start, end=end)
        except (PlanError, CorruptCurrent, LogHostError, UnverifiableFragmentError) as e:
            return CollectionOutcome(
                tenant,
                cid,
                "failed",
                stage="plan",
                error=str(e),
                error_kind=getattr(e, "kind", None) or getattr(e, "code", None),
            )
        except Exception as e:
            log.exception("planning %s/%s failed", tenant, cid)
            return CollectionOutcome(tenant, cid, "failed", stage="plan", error=repr(e))
        pending = allocate_version(cid, base)
        runs = base.runs if base is not None else ()
        return _Plan(
            cidx=cidx,
            candidate=cand,
            pending=pending,
            start=start,
            end=end,
            fragments=frags,
            base=tuple(
                RunRef(
                    key=r.key,
                    url=self.store.url_for(r.key),
                    rows=r.rows,
                    bytes=r.bytes,
                    tombstones=r.tombstones,
                    sketch=r.sketch,
                )
                for r in runs
            ),
            outputs=tuple((self.store.url_for(k), k) for k in pending.run_keys()),
        )

    # ------------------------------------------------------------------------------- spark job

    def fold_where(self, plans: Sequence[_Plan]) -> str:
        """Where a round of these plans folds: "driver", or the Spark job's plan."""
        records = sum(p.end - p.start for p in plans)
        if self.spark is None or records < self.driver_fold_below:
            return "driver"
        if self.plan != "auto":
            return self.plan
        frags = sum(len(p.fragments) for p in plans)
        return choose_plan(len(plans), frags, default_parallelism(self.spark))

    def _spark_job(self, group: str, plans: Sequence[_Plan], where: str) -> list[CollectionStats]:
        frag_tasks = [t for p in plans for t in p.fragment_tasks()]
        fold_tasks = [p.fold_task(self.ratio, self.min_reward) for p in plans]
        if where == "driver" or self.spark is None:
            return run_locally(fold_tasks, frag_tasks, self.s3)
        # Job groups and tags are thread-local; set here, in the thread that submits the job.
        tag_jobs(self.spark, group, f"compaction of {len(plans)} collections")
        plan: Plan = "two-stage" if where == "two-stage" else "one-stage"
        return run_compaction_job(self.spark, fold_tasks, frag_tasks, self.s3, plan=plan)

    def _spark_progress(self, group: str) -> tuple[int, int]:
        if self.spark is None or is_connect(self.spark):
            return 0, 0  # Spark Connect has no status tracker: the bar shows time only
        tracker = self.spark.sparkContext.statusTracker()
        done = total = 0
        for job_id in tracker.getJobIdsForGroup(group):
            job = tracker.getJobInfo(job_id)
            for stage_id in job.stageIds if job else ():
                stage = tracker.getStageInfo(stage_id)
                if stage is not None:
                    total += stage.numTasks
                    done += stage.numCompletedTasks
        return done, total

    async def _run_spark(
        self, plans: Sequence[_Plan], progress: Progress, where: str
    ) -> list[CollectionStats]:
        group = f"compactor-{uuid.uuid4().hex[:12]}"
        task_id = progress.add_task("spark tasks" if where != "driver" else "folding", total=None)
        job = asyncio.ensure_future(asyncio.to_thread(self._spark_job, group, plans, where))
        if self.progress:
            # Refresh the display while the job runs; the job's completion ends the loop.
            while not (await asyncio.wait({job}, timeout=self.progress_interval_s))[0]:
                done, total = self._spark_progress(group)
                progress.update(task_id, completed=done, total=total or None)
        try:
            return await job
        finally:
            progress.update(task_id, completed=1, total=1)

    # ------------------------------------------------------------------------------ installing

    async def _install_one(self, plan: _Plan, stats: CollectionStats | None) -> CollectionOutcome:
        cand = plan.candidate
        tenant, cid = cand.log.tenant, cand.log.collection_id

        def outcome(status: Status, **kw: Any) -> CollectionOutcome:
            return CollectionOutcome(
                tenant,
                cid,
                status,
                version=plan.pending.version,
                start=plan.start,
                end=plan.end,
                **kw,
            )

        if stats is None or stats.error is not None:
            await self._discard(plan)
            error = stats.error if stats is not None else "no result from the Spark job"
            kind = stats.error_kind if stats is not None else None
            return outcome("failed", stage="fold", error=error, error_kind=kind)
        runs = tuple(RunEntry(r.key, r.rows, r.bytes, r.tombstones, r.sketch) for r in stats.runs)
        done = {
            "records_in": stats.records_in,
            "rows_out": stats.rows_out,
            "levels": len(runs),
            "merges": stats.merges,
            "bytes_out": stats.bytes_out,
        }
        async with self._sem:
            crash_point("install:before")
            try:
                installed = await install_version(
                    self.store,
                    plan.pending,
                    offset=plan.end,
                    rows=stats.rows_out,
                    runs=runs,
                    keep=self.keep_versions,
                    grace_s=self.prune_grace_s,
                )
            except Exception as e:
                return outcome("failed", stage="install", error=repr(e))
            if not installed.installed:
                return outcome("lost", stage="install", error="another compactor installed first")
            crash_point("install:after")
            try:
                await self.apis[cand.host_url].compact(tenant, cid, plan.end)
            except Exception as e:
                # The data is current; the cursor catches up next round (see module docstring).
                return outcome("failed", stage="cursor", error=str(e), **done)
            crash_point("cursor:after")
            await self._prune(cid, installed.current)
        return outcome("compacted", **done)

    async def _prune(self, cid: str, current: CurrentVersion | None) -> None:
        """Best effort: what is not pruned now is pruned after the next install."""
        if current is None:
            return
        try:
            await prune_versions(
                self.store, current, cid, keep=self.keep_versions, grace_s=self.prune_grace_s
            )
        except Exception as e:
            log.warning("could not prune old versions of %s: %r", cid, e)

    async def _discard(self, plan: _Plan) -> None:
        try:
            await discard_version(self.store, plan.pending)
        except Exception as e:
            log.warning("could not delete the runs of %s: %r", plan.pending.data_key, e)

    # ---------------------------------------------------------------------------------- round

    async def run_round(
        self, candidates: Sequence[Candidate], *, failed_hosts: Mapping[str, str] | None = None
    ) -> RoundResult:
        """Compact the given collections in one Spark job; never raises for one collection.

        ``failed_hosts`` (hosts the scheduler could not poll) only makes the round not ``ok``.
        """
        t0 = time.perf_counter()
        spark_seconds = 0.0
        outcomes: list[CollectionOutcome] = []
        seen: set[str] = set()
        unique: list[Candidate] = []
        for cand in candidates:
            cid = cand.log.collection_id
            if cid in seen:
                # Versions are keyed by collection id alone: two tenants sharing one would
                # overwrite each other's compacted data.
                outcomes.append(
                    CollectionOutcome(
                        cand.log.tenant,
                        cid,
                        "failed",
                        stage="plan",
                        error="collection id appears twice in a round",
                    )
                )
                continue
            seen.add(cid)
            unique.append(cand)

        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=self.console, disable=not self.progress) as progress:
            plan_task = progress.add_task("planning", total=len(unique))

            async def plan(i: int, c: Candidate) -> _Plan | CollectionOutcome:
                try:
                    return await self._plan_one(i, c)
                finally:
                    progress.advance(plan_task)

            planned = await asyncio.gather(*(plan(i, c) for i, c in enumerate(unique)))
            plans = [p for p in planned if isinstance(p, _Plan)]
            outcomes.extend(p for p in planned if isinstance(p, CollectionOutcome))

            stats_by_cidx: dict[int, CollectionStats] = {}
            where = ""
            if plans:
                where = self.fold_where(plans)
                t_spark = time.perf_counter()
                try:
                    stats = await self._run_spark(plans, progress, where)
                    stats_by_cidx = {s.cidx: s for s in stats}
                except Exception as e:
                    log.exception("compaction job failed")
                    await asyncio.gather(*(self._discard(p) for p in plans))
                    outcomes.extend(
                        CollectionOutcome(
                            p.candidate.log.tenant,
                            p.candidate.log.collection_id,
                            "failed",
                            version=p.pending.version,
                            start=p.start,
                            end=p.end,
                            stage="spark",
                            error=repr(e),
                        )
                        for p in plans
                    )
                    plans = []
                spark_seconds = time.perf_counter() - t_spark

            install_task = progress.add_task("installing", total=len(plans))

            async def install(p: _Plan) -> CollectionOutcome:
                try:
                    return await self._install_one(p, stats_by_cidx.get(p.cidx))
                finally:
                    progress.advance(install_task)

            outcomes.extend(await asyncio.gather(*(install(p) for p in plans)))

        result = RoundResult(
            outcomes=outcomes,
            seconds=time.perf_counter() - t0,
            spark_seconds=spark_seconds,
            failed_hosts=dict(failed_hosts or {}),
            fold=where,
        )
        self._record(result)
        return result

    def _record(self, result: RoundResult) -> None:
        # The round's one log line, failures included, is the caller's (``summarize``, and
        # ``compactor_client.logs.log_round`` in the CLI).
        m = self.metrics
        if m is None:
            return
        m.round_done(result.ok, result.seconds)
        for _ in result.failed_hosts:
            m.failures.labels(stage="poll").inc()
        for o in result.outcomes:
            if o.status == "compacted":
                m.collections.inc()
                m.records_in.inc(o.records_in)
                m.rows_out.inc(o.rows_out)
            elif o.status == "lost":
                m.races_lost.inc()
            elif o.status == "failed":
                m.failures.labels(stage=o.stage or "unknown").inc()


# Collections named in a round's summary line at most, of the compacted and of the failed.
SUMMARY_NAMES = 100


def summarize(result: RoundResult) -> dict[str, Any]:
    """A JSON-friendly summary of a round: counts, time, and the collections by name."""
    return {
        "collections": len(result.outcomes),
        "compacted": result.count("compacted"),
        "lost": result.count("lost"),
        "skipped": result.count("skipped"),
        "failed": result.count("failed"),
        "records_in": result.records_in,
        "rows_out": result.rows_out,
        "merges": result.merges,
        "max_levels": result.max_levels,
        "seconds": round(result.seconds, 3),
        "spark_seconds": round(result.spark_seconds, 3),
        "fold": result.fold,
        "failed_hosts": result.failed_hosts,
        # What was compacted and what failed, by name (at most SUMMARY_NAMES of each).
        "compacted_collections": [
            f"{o.tenant}/{o.collection_id}" for o in result.outcomes if o.status == "compacted"
        ][:SUMMARY_NAMES],
        "failures": [
            {
                "collection": f"{o.tenant}/{o.collection_id}",
                "stage": o.stage,
                "error": o.error,
                **({"error_kind": o.error_kind} if o.error_kind else {}),
            }
            for o in result.outcomes
            if o.status == "failed"
        ][:SUMMARY_NAMES],
    }
