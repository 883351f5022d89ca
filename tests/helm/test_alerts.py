"""The chart's alerting rules, run against synthetic series, and the metrics they (and the Grafana
dashboard) read, checked against what a real host and the compactor export.

Rule tests use ``promtool test rules`` (Prometheus' own evaluator; Debian's ``prometheus``
package, which ``make test`` installs): for every alert a series that must fire it and one that
must not, with the labels it fires with.  The rules file is the ``spec`` of the rendered
PrometheusRule; ``promtool check rules`` also parses every annotation template.

The metric names and label names each rule and each dashboard query selects are checked against
``/metrics`` of a real host (in-process, after a few requests, including a GC of a log with no
cursors, the routine 409 that ``reason="no_cursors"`` keeps out of ``LoghostGcFailures``) and
against the compactor's registry.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from compactor_client.metrics import CompactorMetrics
from host.metrics import Metrics
from tests.helm.test_chart import CHART_DIR, MONITORED_AUTOSCALED, NAMESPACE, merge, render
from tests.host.live import CID, live_server, record

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "OPERATIONS.md"
# `make promtool` unpacks it into the venv (from Debian's prometheus package) when it is not on PATH.
PROMTOOL = shutil.which("promtool") or shutil.which(
    "promtool", path=str(Path(sys.executable).parent)
)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None and not os.environ.get("CI"),
    reason="promtool is not installed (make promtool)",
)

# Labels the ServiceMonitors' scrapes add to every series; the rules select on namespace/service.
SCRAPE_LABELS = {"namespace", "service", "pod", "instance", "job", "endpoint", "container"}
H = 'namespace="logs", service="loghost-headless"'
C = 'namespace="logs", service="loghost-compactor"'
RECORDS = "/v1/tenants/{tenant}/logs/{collection_id}/records"
POST_RECORDS = f'method="POST", route="{RECORDS}"'
GET_RECORDS = f'method="GET", route="{RECORDS}"'


@pytest.fixture(scope="module")
def rule(chart) -> dict[str, Any]:
    return render(chart, MONITORED_AUTOSCALED).get("PrometheusRule", "loghost")


def alerts_of(rule: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


# --- cases: for every alert, series that must fire it and series that must not -------------


@dataclass
class Case:
    alert: str
    name: str
    series: list[tuple[str, str]]  # (series selector, promtool values notation), interval 1m
    eval_time: str
    fires: list[dict[str, str]] = field(default_factory=list)  # labels of each firing alert

    @property
    def id(self) -> str:
        return f"{self.alert}-{self.name}"


def hist(metric: str, labels: str, buckets: dict[str, str]) -> list[tuple[str, str]]:
    return [(f'{metric}_bucket{{{labels}, le="{le}"}}', values) for le, values in buckets.items()]


UP_H0 = (f'up{{{H}, pod="loghost-0"}}', "1x60")
UP_C0 = (f'up{{{C}, pod="loghost-compactor-7d9f-abcde"}}', "1x60")

CASES = [
    # Target down or absent.
    Case(
        "LoghostHostsAbsent",
        "no-host-target",
        [UP_C0],
        "15m",
        [{"namespace": "logs", "service": "loghost-headless", "severity": "critical"}],
    ),
    Case("LoghostHostsAbsent", "host-scraped", [UP_H0, UP_C0], "15m"),
    Case(
        "LoghostHostDown",
        "down-10m",
        [UP_H0, (f'up{{{H}, pod="loghost-1"}}', "0x20")],
        "10m",
        [
            {
                "namespace": "logs",
                "service": "loghost-headless",
                "pod": "loghost-1",
                "severity": "warning",
            }
        ],
    ),
    Case(
        "LoghostHostDown",
        "3m-blip",
        [UP_H0, (f'up{{{H}, pod="loghost-1"}}', "1x5 0 0 0 1x10")],
        "10m",
    ),
    Case(
        "LoghostCompactorsAbsent",
        "no-compactor-target",
        [UP_H0],
        "20m",
        [{"namespace": "logs", "service": "loghost-compactor", "severity": "critical"}],
    ),
    Case("LoghostCompactorsAbsent", "compactor-scraped", [UP_H0, UP_C0], "20m"),
    Case(
        "LoghostCompactorDown",
        "down-15m",
        [(f'up{{{C}, pod="c-1"}}', "0x20")],
        "15m",
        [
            {
                "namespace": "logs",
                "service": "loghost-compactor",
                "pod": "c-1",
                "severity": "warning",
            }
        ],
    ),
    Case("LoghostCompactorDown", "up", [(f'up{{{C}, pod="c-1"}}', "1x20")], "15m"),
    # Dirty sets.
    Case(
        "LoghostDirtyUntrackedCollections",
        "untracked",
        [(f'loghost_dirty_untracked_collections{{{H}, pod="loghost-2"}}', "1x20")],
        "10m",
        [{"pod": "loghost-2", "severity": "critical"}],
    ),
    Case(
        "LoghostDirtyUntrackedCollections",
        "zero",
        [(f'loghost_dirty_untracked_collections{{{H}, pod="loghost-2"}}', "0x20")],
        "10m",
    ),
    Case(
        "LoghostUncompactedTooOld",
        "2000s",
        [(f'loghost_dirty_oldest_uncompacted_age_seconds{{{H}, pod="loghost-0"}}', "2000x30")],
        "20m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostUncompactedTooOld",
        "1000s",
        [(f'loghost_dirty_oldest_uncompacted_age_seconds{{{H}, pod="loghost-0"}}', "1000x30")],
        "20m",
    ),
    Case(
        "LoghostUncompactedTooOldCritical",
        "8000s",
        [(f'loghost_dirty_oldest_uncompacted_age_seconds{{{H}, pod="loghost-0"}}', "8000x30")],
        "20m",
        [{"pod": "loghost-0", "severity": "critical"}],
    ),
    Case(
        "LoghostUncompactedTooOldCritical",
        "2000s",
        [(f'loghost_dirty_oldest_uncompacted_age_seconds{{{H}, pod="loghost-0"}}', "2000x30")],
        "20m",
    ),
    # Backpressure: 429 append *requests* over append requests (loghost_append_requests_total),
    # per host. 10 of 100 appends refused while 2,000 records a minute are appended: a
    # records-based ratio (10/2000 = 0.5%) stayed quiet.
    Case(
        "LoghostBackpressure",
        "10pct-of-append-requests",
        [
            (f'loghost_append_requests_total{{{H}, pod="loghost-0", status="200"}}', "0+90x30"),
            (f'loghost_append_requests_total{{{H}, pod="loghost-0", status="429"}}', "0+10x30"),
            (f'loghost_backpressure_total{{{H}, pod="loghost-0", reason="batching"}}', "0+10x30"),
            (f'loghost_append_records_total{{{H}, pod="loghost-0"}}', "0+2000x30"),
            (f'loghost_append_requests_total{{{H}, pod="loghost-1", status="200"}}', "0+100x30"),
        ],
        "25m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostBackpressure",
        "1pct",
        [
            (f'loghost_append_requests_total{{{H}, pod="loghost-0", status="200"}}', "0+99x30"),
            (f'loghost_append_requests_total{{{H}, pod="loghost-0", status="429"}}', "0+1x30"),
        ],
        "25m",
    ),
    # Reads refused 429 (long_poll) do not make appends look refused: only append requests
    # count, on both sides of the ratio.
    Case(
        "LoghostBackpressure",
        "read-429s-only",
        [
            (f'loghost_append_requests_total{{{H}, pod="loghost-0", status="200"}}', "0+100x30"),
            (
                f'loghost_requests_total{{{H}, pod="loghost-0", {GET_RECORDS}, status="429"}}',
                "0+50x30",
            ),
            (
                f'loghost_requests_total{{{H}, pod="loghost-0", {POST_RECORDS}, status="200"}}',
                "0+100x30",
            ),
        ],
        "25m",
    ),
    # 5xx rate: API requests only, not the probes.
    Case(
        "LoghostServerErrors",
        "5pct-503",
        [
            (
                f'loghost_requests_total{{{H}, pod="loghost-1", {POST_RECORDS}, status="200"}}',
                "0+95x30",
            ),
            (
                f'loghost_requests_total{{{H}, pod="loghost-1", {POST_RECORDS}, status="503"}}',
                "0+5x30",
            ),
        ],
        "25m",
        [{"pod": "loghost-1", "severity": "warning"}],
    ),
    Case(
        "LoghostServerErrors",
        "unready-probes-only",
        [
            (
                f'loghost_requests_total{{{H}, pod="loghost-1", {POST_RECORDS}, status="200"}}',
                "0+100x30",
            ),
            (
                f'loghost_requests_total{{{H}, pod="loghost-1", method="GET", route="/readyz", '
                'status="503"}',
                "0+12x30",
            ),
        ],
        "25m",
    ),
    # Latency SLO: p99 of append latency.
    Case(
        "LoghostAppendLatencySLO",
        "p99-2s",
        hist(
            "loghost_append_latency_seconds",
            f'{H}, pod="loghost-0"',
            {"0.5": "0+50x40", "1.0": "0+50x40", "2.5": "0+100x40", "+Inf": "0+100x40"},
        ),
        "30m",
        [{"severity": "warning"}],
    ),
    Case(
        "LoghostAppendLatencySLO",
        "p99-0.5s",
        hist(
            "loghost_append_latency_seconds",
            f'{H}, pod="loghost-0"',
            {"0.5": "0+100x40", "1.0": "0+100x40", "2.5": "0+100x40", "+Inf": "0+100x40"},
        ),
        "30m",
    ),
    # Buffered bytes near the cap (the host exports its cap).
    Case(
        "LoghostBufferedBytesNearLimit",
        "86pct",
        [
            (f'loghost_buffered_bytes{{{H}, pod="loghost-0"}}', "230000000x20"),
            (f'loghost_buffered_bytes_limit{{{H}, pod="loghost-0"}}', "268435456x20"),
        ],
        "10m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostBufferedBytesNearLimit",
        "37pct",
        [
            (f'loghost_buffered_bytes{{{H}, pod="loghost-0"}}', "100000000x20"),
            (f'loghost_buffered_bytes_limit{{{H}, pod="loghost-0"}}', "268435456x20"),
        ],
        "10m",
    ),
    # Roll-ups.
    Case(
        "LoghostRollupSlow",
        "p99-60s",
        hist(
            "loghost_rollup_duration_seconds",
            f'{H}, pod="loghost-0"',
            {"30.0": "0x40", "60.0": "0+1x40", "+Inf": "0+1x40"},
        ),
        "30m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostRollupSlow",
        "p99-1s",
        hist(
            "loghost_rollup_duration_seconds",
            f'{H}, pod="loghost-0"',
            {"1.0": "0+6x40", "30.0": "0+6x40", "60.0": "0+6x40", "+Inf": "0+6x40"},
        ),
        "30m",
    ),
    Case(
        "LoghostRollupFailures",
        "half-fail",
        [
            (f'loghost_rollup_failures_total{{{H}, pod="loghost-0"}}', "0+3x30"),
            (f'loghost_rollup_duration_seconds_count{{{H}, pod="loghost-0"}}', "0+3x30"),
        ],
        "25m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostRollupFailures",
        "every-roll-up-fails",
        [
            (f'loghost_rollup_failures_total{{{H}, pod="loghost-0"}}', "0+6x30"),
            (f'loghost_rollup_duration_seconds_count{{{H}, pod="loghost-0"}}', "0x30"),
        ],
        "25m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostRollupFailures",
        "one-failure",
        [
            (f'loghost_rollup_failures_total{{{H}, pod="loghost-0"}}', "0x10 1x20"),
            (f'loghost_rollup_duration_seconds_count{{{H}, pod="loghost-0"}}', "0+6x30"),
        ],
        "25m",
    ),
    # GC failures, without the routine 409 no_cursors.
    Case(
        "LoghostGcFailures",
        "errors",
        [
            (f'loghost_gc_failures_total{{{H}, pod="loghost-0", reason="error"}}', "0+1x70"),
        ],
        "65m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostGcFailures",
        "only-no-cursors",
        [
            (f'loghost_gc_failures_total{{{H}, pod="loghost-0", reason="no_cursors"}}', "0+5x70"),
            (f'loghost_gc_failures_total{{{H}, pod="loghost-0", reason="error"}}', "0x70"),
        ],
        "65m",
    ),
    Case(
        "LoghostContention",
        "2-per-s",
        [(f'loghost_contention_total{{{H}, pod="loghost-0"}}', "0+120x40")],
        "30m",
        [{"pod": "loghost-0", "severity": "warning"}],
    ),
    Case(
        "LoghostContention",
        "0.5-per-s",
        [(f'loghost_contention_total{{{H}, pod="loghost-0"}}', "0+30x40")],
        "30m",
    ),
    Case(
        "LoghostLeaderHintFailures",
        "failing",
        [(f'loghost_leader_hint_failures_total{{{H}, pod="loghost-0"}}', "0+1x60")],
        "50m",
        [{"pod": "loghost-0", "severity": "info"}],
    ),
    Case(
        "LoghostLeaderHintFailures",
        "healthy",
        [(f'loghost_leader_hint_failures_total{{{H}, pod="loghost-0"}}', "0x60")],
        "50m",
    ),
    # Compaction progress: failed rounds are not progress.
    Case(
        "LoghostCompactionStalled",
        "only-failed-rounds",
        [
            (f'loghost_dirty_collections{{{H}, pod="loghost-0"}}', "5x60"),
            (f'compactor_rounds_total{{{C}, pod="c-1", outcome="failed"}}', "0+1x60"),
            (f'compactor_rounds_total{{{C}, pod="c-1", outcome="ok"}}', "0x60"),
            (f'compactor_collections_compacted_total{{{C}, pod="c-1"}}', "0x60"),
        ],
        "50m",
        [{"severity": "critical"}],
    ),
    Case(
        "LoghostCompactionStalled",
        "no-compactor-series",
        [
            (f'loghost_dirty_collections{{{H}, pod="loghost-0"}}', "5x60"),
        ],
        "50m",
        [{"severity": "critical"}],
    ),
    Case(
        "LoghostCompactionStalled",
        "clean-rounds",
        [
            (f'loghost_dirty_collections{{{H}, pod="loghost-0"}}', "5x60"),
            (f'compactor_rounds_total{{{C}, pod="c-1", outcome="ok"}}', "0+1x60"),
            (f'compactor_collections_compacted_total{{{C}, pod="c-1"}}', "0x60"),
        ],
        "50m",
    ),
    Case(
        "LoghostCompactionStalled",
        "one-poisoned-collection",
        [
            (f'loghost_dirty_collections{{{H}, pod="loghost-0"}}', "5x60"),
            (f'compactor_rounds_total{{{C}, pod="c-1", outcome="failed"}}', "0+1x60"),
            (f'compactor_collections_compacted_total{{{C}, pod="c-1"}}', "0+3x60"),
        ],
        "50m",
    ),
    Case(
        "LoghostCompactionStalled",
        "nothing-dirty",
        [
            (f'loghost_dirty_collections{{{H}, pod="loghost-0"}}', "0x60"),
        ],
        "50m",
    ),
    Case(
        "LoghostCompactorFailures",
        "spark-failing",
        [(f'compactor_failures_total{{{C}, pod="c-1", stage="spark"}}', "0+1x40")],
        "35m",
        [{"pod": "c-1", "severity": "warning"}],
    ),
    Case(
        "LoghostCompactorFailures",
        "none",
        [(f'compactor_failures_total{{{C}, pod="c-1", stage="spark"}}', "0x40")],
        "35m",
    ),
]


def test_every_alert_has_a_firing_and_a_quiet_case(rule):
    names = set(alerts_of(rule))
    firing = {c.alert for c in CASES if c.fires}
    quiet = {c.alert for c in CASES if not c.fires}
    assert names == firing == quiet, (names ^ firing, names ^ quiet)


def _rules_file(rule: dict[str, Any], path: Path, *, annotations: bool) -> Path:
    groups = json.loads(json.dumps(rule["spec"]["groups"]))
    if not annotations:  # promtool compares annotations too; the cases check labels
        for g in groups:
            for r in g["rules"]:
                r.pop("annotations", None)
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return path


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    if PROMTOOL is None:
        pytest.fail("promtool is required in CI (make promtool)")
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False
    )


@needs_promtool
def test_promtool_checks_the_rules_and_their_templates(rule, tmp_path):
    out = _promtool(
        "check", "rules", str(_rules_file(rule, tmp_path / "rules.yaml", annotations=True))
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"SUCCESS: {len(alerts_of(rule))} rules found" in out.stdout, out.stdout


@needs_promtool
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_rule_against_synthetic_series(rule, tmp_path, case):
    rules = _rules_file(rule, tmp_path / "rules.yaml", annotations=False)
    test = {
        "rule_files": [rules.name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [{"series": s, "values": v} for s, v in case.series],
                "alert_rule_test": [
                    {
                        "eval_time": case.eval_time,
                        "alertname": case.alert,
                        "exp_alerts": [{"exp_labels": labels} for labels in case.fires],
                    }
                ],
            }
        ],
    }
    (tmp_path / "test.yaml").write_text(yaml.safe_dump(test, sort_keys=False))
    out = _promtool("test", "rules", str(tmp_path / "test.yaml"))
    assert out.returncode == 0, f"{case.id}:\n{out.stdout}{out.stderr}"


@needs_promtool
def test_promtool_catches_a_wrong_expectation(rule, tmp_path):
    """The harness can fail: a quiet case claimed to fire is reported."""
    case = next(c for c in CASES if c.alert == "LoghostGcFailures" and not c.fires)
    wrong = Case(
        case.alert,
        "wrong",
        case.series,
        case.eval_time,
        [{"pod": "loghost-0", "severity": "warning"}],
    )
    with pytest.raises(AssertionError, match="LoghostGcFailures"):
        test_rule_against_synthetic_series(rule, tmp_path, wrong)


# --- annotations and runbooks ------------------------------------------------------------


def github_anchor(heading: str) -> str:
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def runbooks() -> dict[str, str]:
    """Anchor -> text of each subsection of "## Runbooks" in docs/OPERATIONS.md."""
    text = OPERATIONS.read_text()
    start = text.index("\n## Runbooks\n")
    end = text.find("\n## ", start + 1)
    section = text[start : end if end != -1 else len(text)]
    out = {}
    for part in section.split("\n### ")[1:]:
        heading, _, body = part.partition("\n")
        out[github_anchor(heading)] = body
    return out


def test_every_alert_has_a_description_and_a_runbook_section(rule):
    books = runbooks()
    for name, item in alerts_of(rule).items():
        ann = item["annotations"]
        assert ann.get("summary") and len(ann.get("description", "")) > 40, name
        base, _, anchor = ann["runbook_url"].partition("#")
        assert base == "docs/OPERATIONS.md", ann["runbook_url"]  # runbookBaseUrl's default
        assert anchor in books, f"{name}: no runbook #{anchor} under Runbooks in docs/OPERATIONS.md"
        assert name in books[anchor] or github_anchor(name) == anchor, name
        # Each runbook says what the alert means, how to check, and what to do.
        for part in ("Meaning", "Check", "Action"):
            assert f"**{part}" in books[anchor], f"{name}: runbook #{anchor} has no **{part}**"
    # No runbook for an alert that no longer exists (LoghostScrubFailures could never fire).
    anchors = {
        item["annotations"]["runbook_url"].partition("#")[2] for item in alerts_of(rule).values()
    }
    assert set(books) == anchors, set(books) ^ anchors


def test_runbook_base_url_is_a_value(chart):
    rule = render(
        chart,
        merge(
            MONITORED_AUTOSCALED,
            {
                "metrics": {
                    "prometheusRule": {
                        "runbookBaseUrl": "https://git.example.com/loghost/blob/main/docs/OPERATIONS.md"
                    }
                }
            },
        ),
    ).get("PrometheusRule", "loghost")
    for name, item in alerts_of(rule).items():
        assert item["annotations"]["runbook_url"].startswith(
            "https://git.example.com/loghost/blob/main/docs/OPERATIONS.md#"
        ), name


# --- every metric and label a rule or the dashboard selects exists ------------------------

SELECTOR = re.compile(r"\b([a-zA-Z_:][a-zA-Z0-9_:]*)\{([^{}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*"')


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names) of every selector in a PromQL expression."""
    return [(m.group(1), set(MATCHER.findall(m.group(2)))) for m in SELECTOR.finditer(expr)]


def exported(metrics_objects: list[Any]) -> dict[str, set[str]]:
    """Sample name -> label names, from prometheus_client metric objects."""
    out: dict[str, set[str]] = {}
    for m in metrics_objects:
        labels = set(m._labelnames)
        kind = m._type
        if kind == "counter":
            out[m._name + "_total"] = labels
        elif kind == "histogram":
            for suffix in ("_bucket", "_count", "_sum"):
                out[m._name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            out[m._name] = labels
    return out


def metric_objects(holder: Any) -> list[Any]:
    return [v for v in vars(holder).values() if hasattr(v, "_labelnames") and hasattr(v, "_type")]


@pytest.fixture(scope="module")
def host_scrape(tmp_path_factory) -> tuple[str, dict[str, set[str]]]:
    """/metrics of a real host after appends, a read, a 404 and a GC of a log with no cursors."""
    import asyncio

    async def scrape() -> tuple[str, dict[str, set[str]]]:
        store = tmp_path_factory.mktemp("store")
        async with live_server(str(store)) as live, live.client() as c:
            base = f"/v1/tenants/alice/logs/{CID}"
            r = await c.post(base + "/records", json={"records": [record(1), record(2)]})
            assert r.status_code == 200, r.text
            assert (await c.get(base + "/records", params={"from": 1})).status_code == 200
            assert (
                await c.get("/v1/tenants/alice/logs/00000000-0000-4000-8000-00000000dead")
            ).status_code == 404
            gc = await c.post(base + "/gc")
            assert gc.status_code == 409 and gc.json()["error"]["code"] == "no_cursors", gc.text
            async with httpx.AsyncClient(base_url=live.url) as anonymous:
                text = (await anonymous.get("/metrics")).text
            return text, exported(metric_objects(live.server.metrics))

    return asyncio.run(scrape())


def scraped_names(text: str) -> set[str]:
    names: set[str] = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(s.name for s in family.samples)
        if family.type == "counter":
            names.add(family.name + "_total")
        if family.type == "histogram":
            names.update(family.name + s for s in ("_bucket", "_count", "_sum"))
    return names


def scraped_labels(text: str) -> dict[str, set[str]]:
    """Sample name -> label names seen in an exposition text."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, set()).update(s.labels)
    return out


@pytest.fixture(scope="module")
def known(host_scrape) -> dict[str, set[str]]:
    """What a rule or a panel may select: the names in a live host's ``/metrics`` and in the
    compactor's exposition, with the label names their metric objects declare (a labelled
    metric never touched in the scrape still names its labels)."""
    text, host = host_scrape
    compactor = exported(metric_objects(CompactorMetrics(CollectorRegistry())))
    compactor_text = generate_latest(CompactorMetrics(CollectorRegistry()).registry).decode()
    live_names = scraped_names(text) | scraped_names(compactor_text)
    both = {**host, **compactor}
    missing = set(both) - live_names
    assert not missing, f"metric objects not in the /metrics text: {missing}"
    seen = {**scraped_labels(text), **scraped_labels(compactor_text)}
    exposed = {
        name: both.get(name, set()) | seen.get(name, set())
        for name in live_names
        if name in both or name in seen
    }
    return {**exposed, "up": set()}  # up: Prometheus' own, per scrape target


def test_the_gc_no_cursors_409_is_labelled_routine(host_scrape):
    text, _ = host_scrape
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
    }
    assert samples[("loghost_gc_failures_total", (("reason", "no_cursors"),))] == 1.0
    assert ("loghost_gc_failures_total", (("reason", "error"),)) not in samples
    # The cap the buffered-bytes alert divides by is exported.
    assert samples[("loghost_buffered_bytes_limit", ())] == 256 << 20
    assert Metrics().gc_failures._labelnames == ("reason",)


def _check_selectors(where: str, expr: str, known: dict[str, set[str]]) -> int:
    found = selectors(expr)
    for name, labels in found:
        assert name in known, f"{where}: {name} is not exported by the host or the compactor"
        extra = labels - SCRAPE_LABELS - known[name]
        assert not extra, f"{where}: {name} has no label(s) {extra}"
    return len(found)


def test_every_metric_an_alert_selects_exists(rule, known):
    for name, item in alerts_of(rule).items():
        assert _check_selectors(name, item["expr"], known), f"{name}: no selector"


def dashboard() -> dict[str, Any]:
    return json.loads((CHART_DIR / "dashboards" / "loghost.json").read_text())


def test_dashboard_loads_and_selects_only_exported_metrics(rule, known):
    board = dashboard()
    assert board["uid"] == "loghost" and board["title"]
    variables = {v["name"] for v in board["templating"]["list"]}
    assert {"datasource", "namespace", "release"} <= variables
    targets = [
        (p["title"], t["expr"]) for p in board["panels"] if p["type"] != "row" for t in p["targets"]
    ]
    assert len(targets) >= 20
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    used: set[str] = set()
    for title, expr in targets:
        assert _check_selectors(title, expr, known), f"{title}: no selector in {expr}"
        assert re.findall(r"\$(\w+)", expr) and set(re.findall(r"\$(\w+)", expr)) <= variables, expr
        used.update(name for name, _ in selectors(expr))
    # Every alert's metric is also on the dashboard, so a firing alert can be looked at.
    for name, item in alerts_of(rule).items():
        for metric, _ in selectors(item["expr"]):
            base = re.sub(r"_(bucket|count|sum)$", "", metric)
            assert any(u.startswith(base) for u in used), (
                f"{name}: {metric} is on no dashboard panel"
            )


def test_dashboard_shows_requests_records_store_builds_and_the_last_round():
    exprs = " ".join(
        t["expr"] for p in dashboard()["panels"] if p["type"] != "row" for t in p["targets"]
    )
    used = {name for name, _ in selectors(exprs)}
    assert {
        "loghost_append_requests_total",
        "loghost_append_records_total",
        "loghost_store_requests_total",
        "loghost_store_errors_total",
        "loghost_store_request_duration_seconds_bucket",
        "loghost_build_info",
        "compactor_last_successful_round_timestamp_seconds",
    } <= used, used
    assert "loghost_appends_total" not in used
    assert "sum by (method, route, status) (rate(loghost_requests_total" in exprs


def test_dashboard_configmap(chart):
    r = render(
        chart,
        {"grafana": {"dashboard": {"enabled": True, "annotations": {"grafana_folder": "loghost"}}}},
    )
    cm = r.get("ConfigMap", "loghost-dashboard")
    assert cm["metadata"]["namespace"] == NAMESPACE
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "loghost"}
    assert json.loads(cm["data"]["loghost.json"]) == dashboard()
    elsewhere = render(
        chart, {"grafana": {"dashboard": {"enabled": True, "namespace": "monitoring"}}}
    )
    assert elsewhere.get("ConfigMap", "loghost-dashboard")["metadata"]["namespace"] == "monitoring"
    assert not render(chart).has("ConfigMap", "loghost-dashboard")
