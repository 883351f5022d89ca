"""Prometheus metrics of one log host, on a registry of its own.

No ``*_created`` twin series: prometheus_client exports one per counter and histogram child by
default (the time it was first touched), which doubles the series and which no rule or panel
reads.  :func:`prometheus_client.disable_created_metrics` is process-wide, called when this module
is imported (the compactor's metrics module does the same).
"""

from __future__ import annotations

import collections
import platform
from collections.abc import Iterator

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from wal3.errors import NoCursors

from .heap import GcPauses

disable_created_metrics()

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# Object-store operations: a local disk answers in well under a millisecond, S3 in tens.
_STORE_BUCKETS = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)

# The ``method`` label of ``loghost_requests_total``: any other method is ``other`` (a client
# may send any token as a method; the label stays bounded).
HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})


def package_version() -> str:
    """The installed loghost distribution's version (``unknown`` when not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("loghost")
    except PackageNotFoundError:
        return "unknown"


class Metrics:
    """Every metric the server exports."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry or CollectorRegistry()
        self.build_info = Gauge(
            "loghost_build_info",
            "Always 1: the host's version, Python and HTTP parser (LOGHOST_HTTP_PARSER)",
            ["version", "python", "http_parser"],
            registry=r,
        )
        # route: the route's path template (``unmatched`` when no route took the request);
        # method: the HTTP method, or ``other``.
        self.requests = Counter(
            "loghost_requests_total", "HTTP requests", ["method", "route", "status"], registry=r
        )
        # Requests and records are counted apart: a ratio of 429 answers must divide by
        # requests (loghost_append_requests_total), a throughput by records.
        self.append_requests = Counter(
            "loghost_append_requests_total",
            "Append requests answered (POST .../records), by HTTP status",
            ["status"],
            registry=r,
        )
        self.append_records = Counter(
            "loghost_append_records_total",
            "Records appended durably (idempotent replays not counted)",
            registry=r,
        )
        self.append_bytes = Counter(
            "loghost_append_bytes_total", "Bytes of records appended", registry=r
        )
        self.append_latency = Histogram(
            "loghost_append_latency_seconds",
            "Time from request to durable append",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.read_latency = Histogram(
            "loghost_read_latency_seconds",
            "Time to serve a read",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.open_logs = Gauge("loghost_open_logs", "Logs open on this server", registry=r)
        self.long_polls = Gauge(
            "loghost_long_polls", "Reads waiting for records (wait_ms)", registry=r
        )
        self.opens = Counter("loghost_log_opens_total", "Logs opened", registry=r)
        self.evictions = Counter(
            "loghost_log_evictions_total", "Logs closed to make room (LRU)", registry=r
        )
        self.idle_closes = Counter(
            "loghost_log_idle_closes_total", "Logs closed when idle", registry=r
        )
        self.buffered_bytes = Gauge(
            "loghost_buffered_bytes", "Bytes accepted but not yet durable", registry=r
        )
        self.buffered_bytes_limit = Gauge(
            "loghost_buffered_bytes_limit",
            "LOGHOST_MAX_BUFFERED_BYTES: appends past it answer 429",
            registry=r,
        )
        # reason: batching (buffers full), compaction (backlog), long_poll (per-tenant cap),
        # fair_share (the tenant's share of the budget or the open-log cap), open_log_cap (every
        # open log busy), shutting_down.  Store write conflicts are not backpressure: they are
        # 409 contention, counted in loghost_contention_total.
        self.backpressure = Counter(
            "loghost_backpressure_total", "Requests refused with 429", ["reason"], registry=r
        )
        self.contention = Counter(
            "loghost_contention_total",
            "Appends refused 409 contention because another writer changed the log first",
            registry=r,
        )
        # The object store as the host uses it (host.storemetrics.InstrumentedStore): one
        # request per engine call (an S3 store's own retries are inside it).
        self.store_requests = Counter(
            "loghost_store_requests_total",
            "Object-store operations, by operation (get, head, put, delete, list, copy)",
            ["operation"],
            registry=r,
        )
        self.store_errors = Counter(
            "loghost_store_errors_total",
            "Object-store operations that raised, by operation and kind (not_found and "
            "precondition_failed are ordinary answers; unavailable and error are failures)",
            ["operation", "kind"],
            registry=r,
        )
        self.store_latency = Histogram(
            "loghost_store_request_duration_seconds",
            "Seconds an object-store operation took (a list: the time waiting for its pages)",
            ["operation"],
            buckets=_STORE_BUCKETS,
            registry=r,
        )
        self.leader_hint_failures = Counter(
            "loghost_leader_hint_failures_total",
            "Redis leader-hint operations that failed",
            registry=r,
        )
        self.live_hosts = Gauge(
            "loghost_live_hosts",
            "Hosts serving with a liveness record younger than LOGHOST_MEMBERSHIP_TTL_S",
            registry=r,
        )
        self.membership_failures = Counter(
            "loghost_membership_failures_total",
            "Liveness-record beats or refreshes that failed",
            registry=r,
        )
        self.adopted_dirty_logs = Counter(
            "loghost_adopted_dirty_logs_total",
            "Dirty logs of departed hosts adopted automatically by this host",
            registry=r,
        )
        self.departed_oldest_age = Gauge(
            "loghost_departed_host_oldest_age_seconds",
            "Seconds since the last beat of the longest-silent host not yet adopted (0: none)",
            registry=r,
        )
        self.redirects = Counter(
            "loghost_not_leader_redirects_total", "Requests redirected to the leader", registry=r
        )
        self.dirty_collections = Gauge(
            "loghost_dirty_collections", "Collections in the rolled-up dirty set", registry=r
        )
        self.dirty_oldest_age = Gauge(
            "loghost_dirty_oldest_uncompacted_age_seconds",
            "Age of the oldest uncompacted dirty entry",
            registry=r,
        )
        self.rollup_duration = Histogram(
            "loghost_rollup_duration_seconds",
            "Roll-up duration",
            buckets=(*_LATENCY_BUCKETS, 30.0, 60.0),
            registry=r,
        )
        self.python_gc_pause = GcPauses()  # observed once `loghost serve` installs it
        r.register(self.python_gc_pause)
        self.rollup_failures = Counter(
            "loghost_rollup_failures_total", "Roll-ups that failed", registry=r
        )
        self.reinsertions = Counter(
            "loghost_dirty_reinsertions_total", "Dirty entries re-appended by roll-ups", registry=r
        )
        self.dirty_fallback_lookups = Counter(
            "loghost_dirty_fallback_lookups_total",
            "Collection logs a roll-up read for what it was not told (bounded per pass)",
            ["kind"],
            registry=r,
        )
        self.dirty_log_records = Gauge(
            "loghost_dirty_log_records",
            "Dirty-log records from the stable_prefix cursor to the end, after a roll-up",
            registry=r,
        )
        self.untracked = Gauge(
            "loghost_dirty_untracked_collections",
            "Open collections with uncompacted records missing from the dirty set (must stay 0)",
            registry=r,
        )
        self.gc_deleted = Counter(
            "loghost_gc_deleted_objects_total",
            "Objects deleted by garbage collection",
            ["kind"],
            registry=r,
        )
        self.gc_runs = Counter(
            "loghost_gc_runs_total", "Garbage collection passes", ["phase"], registry=r
        )
        # reason="no_cursors" is the routine 409 on a log nothing has compacted yet (no cursor
        # pins it); reason="error" is every other failure, the one worth an alert.
        self.gc_failures = Counter(
            "loghost_gc_failures_total", "GC passes that failed", ["reason"], registry=r
        )
        self.scrub_failures = Counter(
            "loghost_scrub_failures_total", "Scrubs that found a problem", registry=r
        )
        self.idempotent_hits = Counter(
            "loghost_idempotent_replays_total",
            "Appends answered from the idempotency window",
            registry=r,
        )
        # Per tenant (host.quotas): admitted, throttled by quota, in flight; top N by traffic.
        # Not in ``registry``: its series name tenants, served only to the service key
        # (``/metrics/tenants``, host.routers.ops).
        self.tenants = TenantMetrics()

    def set_build_info(self, http_parser: str) -> None:
        """``loghost_build_info``: this process's version, Python and HTTP parser, value 1."""
        self.build_info.clear()
        self.build_info.labels(package_version(), platform.python_version(), http_parser).set(1)

    def request_done(self, method: str, route: str, status: int) -> None:
        """Count one answered HTTP request (``route``: the path template or ``unmatched``)."""
        m = method if method in HTTP_METHODS else "other"
        code = str(status)
        self.requests.labels(m, route, code).inc()
        if route == APPEND_ROUTE and m == "POST":
            self.append_requests.labels(code).inc()


# The append's route (host.routers.records): its requests are also loghost_append_requests_total.
APPEND_ROUTE = "/v1/tenants/{tenant}/logs/{collection_id}/records"

# The label of every tenant outside the top N.
OTHER_TENANT = "other"


class TenantMetrics(Collector):
    """Per-tenant admission metrics with a bounded cardinality: the ``top_n`` tenants by
    traffic (requests admitted plus throttled) keep their own ``tenant`` label, every other
    tenant is summed under ``other``.  Computed at each scrape from totals kept per tenant, so
    a tenant leaving the top N adds its totals to ``other`` (counters never go down); ties keep
    the tenants already labelled (no flapping)."""

    def __init__(self, top_n: int = 20) -> None:
        self.top_n = top_n
        self._admitted: collections.Counter[str] = collections.Counter()
        self._throttled: collections.Counter[tuple[str, str]] = collections.Counter()
        self._traffic: collections.Counter[str] = collections.Counter()
        self._in_flight: collections.Counter[str] = collections.Counter()
        self._in_flight_bytes: collections.Counter[str] = collections.Counter()
        self._labelled: set[str] = set()
        # Fair share (host.fairshare): requests that waited for their share, for how long in
        # all, and how many wait now.
        self._fair_waits: collections.Counter[str] = collections.Counter()
        self._fair_wait_s: dict[str, float] = {}
        self._fair_waiting: collections.Counter[str] = collections.Counter()

    def fair_waiting(self, tenant: str, delta: int) -> None:
        """A request of ``tenant`` starts (1) or stops (-1) waiting for its fair share."""
        self._fair_waiting[tenant] += delta
        if self._fair_waiting[tenant] <= 0:
            del self._fair_waiting[tenant]

    def fair_waited(self, tenant: str, seconds: float) -> None:
        """A request of ``tenant`` waited ``seconds`` for its fair share (granted or not)."""
        self._fair_waits[tenant] += 1
        self._fair_wait_s[tenant] = self._fair_wait_s.get(tenant, 0.0) + max(0.0, seconds)

    def admitted(self, tenant: str) -> None:
        """A request of ``tenant`` passed admission."""
        self._admitted[tenant] += 1
        self._traffic[tenant] += 1

    def throttled(self, tenant: str, quota: str) -> None:
        """A request of ``tenant`` was refused by ``quota``."""
        self._throttled[tenant, quota] += 1
        self._traffic[tenant] += 1

    def in_flight(self, tenant: str, requests: int, nbytes: int) -> None:
        """Add (or, negative, remove) admitted requests and bytes not yet done."""
        self._in_flight[tenant] += requests
        self._in_flight_bytes[tenant] += nbytes
        if self._in_flight[tenant] <= 0 and self._in_flight_bytes[tenant] <= 0:
            del self._in_flight[tenant]
            del self._in_flight_bytes[tenant]

    def labels(self) -> set[str]:
        """The tenants that keep their own label now: the top N by traffic."""
        ranked = sorted(
            self._traffic, key=lambda t: (-self._traffic[t], t not in self._labelled, t)
        )
        self._labelled = set(ranked[: self.top_n])
        return set(self._labelled)

    def collect(self) -> Iterator[Metric]:
        """The metrics, tenants outside the top N as ``other``."""
        own = self.labels()

        def label(t: str) -> str:
            return t if t in own else OTHER_TENANT

        admitted = CounterMetricFamily(
            "loghost_tenant_admitted",
            "Requests that passed a tenant's admission (quotas)",
            labels=["tenant"],
        )
        sums: collections.Counter[str] = collections.Counter()
        for t, n in self._admitted.items():
            sums[label(t)] += n
        for t, n in sorted(sums.items()):
            admitted.add_metric([t], n)
        yield admitted
        throttled = CounterMetricFamily(
            "loghost_tenant_throttled",
            "Requests refused 429 by a tenant quota, by quota",
            labels=["tenant", "quota"],
        )
        qsums: collections.Counter[tuple[str, str]] = collections.Counter()
        for (t, q), n in self._throttled.items():
            qsums[label(t), q] += n
        for (t, q), n in sorted(qsums.items()):
            throttled.add_metric([t, q], n)
        yield throttled
        for name, doc, values in (
            ("loghost_tenant_in_flight", "Admitted requests not yet done", self._in_flight),
            (
                "loghost_tenant_in_flight_bytes",
                "Bytes admitted but not yet durable (the pending_bytes quota)",
                self._in_flight_bytes,
            ),
        ):
            gauge = GaugeMetricFamily(name, doc, labels=["tenant"])
            gsums: collections.Counter[str] = collections.Counter()
            for t, n in values.items():
                gsums[label(t)] += n
            for t, n in sorted(gsums.items()):
                gauge.add_metric([t], n)
            yield gauge
        for name, doc, family, totals in (
            (
                "loghost_tenant_fair_waits",
                "Requests that waited for their fair share of the server-wide byte budget",
                CounterMetricFamily,
                self._fair_waits,
            ),
            (
                "loghost_tenant_fair_wait_seconds",
                "Seconds requests waited for their fair share, summed",
                CounterMetricFamily,
                self._fair_wait_s,
            ),
            (
                "loghost_tenant_fair_waiting",
                "Requests waiting for their fair share now",
                GaugeMetricFamily,
                self._fair_waiting,
            ),
        ):
            fam = family(name, doc, labels=["tenant"])
            fsums: dict[str, float] = {}
            for t, v in totals.items():
                fsums[label(t)] = fsums.get(label(t), 0.0) + v
            for t, v in sorted(fsums.items()):
                fam.add_metric([t], v)
            yield fam


def gc_failure_reason(exc: BaseException) -> str:
    """The ``reason`` label of ``loghost_gc_failures_total`` for a failed pass."""
    return "no_cursors" if isinstance(exc, NoCursors) else "error"
