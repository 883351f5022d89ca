"""The Helm chart under helm/loghost, rendered offline with the Helm SDK.

Every rendered manifest is validated against the Kubernetes OpenAPI schemas that
kubernetes-validate ships (strict mode: unknown fields fail), using the newest
Kubernetes version it has. The Prometheus Operator CRDs (ServiceMonitor,
PrometheusRule) are not in those schemas; they are checked against the subset
of their CRD schemas written below, also strict.

Beyond validity the tests check the wiring the programs depend on: the server id
is the pod name, the advertise URL is the pod's headless DNS name, probes hit
/healthz and /readyz on the serving port, compactors get every host's per-pod
URL and a member list that matches their own pod names (StatefulSet) or the
supervisor's pod listing (Deployment, the default), and credentials are only
ever referenced from Secrets.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
import shutil
import tomllib
import typing
from pathlib import Path
from typing import Any

import helm_python as helm  # helm-python-sdk: Helm v4 Go SDK via a bundled C library; no helm binary
import jsonschema
import kubernetes_validate
import pytest
import yaml
from packaging.version import Version

from wal3 import paths

REPO = Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "helm" / "loghost"
IMAGE_DIR = REPO / "helm" / "image"

# Newest Kubernetes the installed kubernetes-validate has schemas for.
K8S_VERSION = kubernetes_validate.latest_version()

RELEASE = "loghost"
NAMESPACE = "logs"
# store.url is required (no default: a default bucket would be one the operator does not own);
# every rendering below starts from this, as an install would with its own values file.
STORE_URL = "s3://acme-wal/loghost"
BASE_VALUES: dict[str, Any] = {"store": {"url": STORE_URL}}

# The metrics the host and compactor export (the contract with the server code).
KNOWN_METRICS = {
    "loghost_requests_total",
    "loghost_rollup_failures_total",
    "loghost_gc_failures_total",
    "loghost_buffered_bytes",
    "loghost_buffered_bytes_limit",
    "loghost_append_requests_total",
    "loghost_append_records_total",
    "loghost_append_bytes_total",
    "loghost_append_latency_seconds",
    "loghost_open_logs",
    "loghost_log_evictions_total",
    "loghost_backpressure_total",
    "loghost_contention_total",
    "loghost_leader_hint_failures_total",
    "loghost_dirty_collections",
    "loghost_dirty_oldest_uncompacted_age_seconds",
    "loghost_rollup_duration_seconds",
    "loghost_dirty_reinsertions_total",
    "loghost_dirty_untracked_collections",
    "loghost_gc_deleted_objects_total",
    "loghost_scrub_failures_total",
    "compactor_rounds_total",
    "compactor_round_seconds",
    "compactor_collections_compacted_total",
    "compactor_records_in_total",
    "compactor_rows_out_total",
    "compactor_failures_total",
    "compactor_last_successful_round_timestamp_seconds",
    "loghost_build_info",
    "loghost_store_requests_total",
    "loghost_store_errors_total",
    "loghost_store_request_duration_seconds",
}


def merge(*dicts: dict[str, Any]) -> dict[str, Any]:
    """Deep-merge value overlays (later wins), like several -f files."""
    out: dict[str, Any] = {}
    for d in dicts:
        for key, value in d.items():
            if isinstance(value, dict) and isinstance(out.get(key), dict):
                out[key] = merge(out[key], value)
            else:
                out[key] = copy.deepcopy(value)
    return out


# --- realistic value sets -----------------------------------------------------

S3_EXISTING_SECRET = {
    "store": {
        "url": "s3://acme-wal/prod/loghost",
        "s3": {
            "region": "eu-central-1",
            "endpointUrl": "https://minio.storage.svc.cluster.local:9000",
            "existingSecret": "acme-s3-credentials",
            "accessKeyIdKey": "access-key",
            "secretAccessKeyKey": "secret-key",
            "sessionTokenKey": "session-token",
        },
    },
    "apiKeys": {
        "existingSecret": "acme-loghost-keys",
        "hostKey": "api-keys",
        "compactorKey": "service-key",
    },
}
EXTERNAL_REDIS = {
    "redis": {"enabled": True, "existingSecret": "acme-redis", "existingSecretKey": "url"}
}
EXTERNAL_REDIS_URL = {
    "redis": {"enabled": True, "url": "redis://redis-master.redis.svc.cluster.local:6379/0"}
}
# Compactor workload kinds (compactor.workload; Deployment is the default).
STATEFULSET = {"compactor": {"workload": "StatefulSet"}}
DEPLOYMENT = {"compactor": {"workload": "Deployment"}}
WORKLOADS = {"Deployment": DEPLOYMENT, "StatefulSet": STATEFULSET}
EXTERNAL_SPARK = {
    "compactor": {
        "replicas": 2,
        # Two compactors in the default Deployment: members come from the pod list.
        "membership": {"mode": "kubernetes"},
        "spark": {
            "master": "spark://spark-master.spark.svc.cluster.local:7077",
            "driverMemory": "1g",
            "conf": {"spark.executor.memory": "4g", "spark.sql.shuffle.partitions": 64},
        },
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"memory": "2Gi"}},
    }
}
# Three compactors with a static member list: only a StatefulSet can do that.
FIVE_REPLICAS = {"host": {"replicas": 5}, "compactor": {"replicas": 3, "workload": "StatefulSet"}}
MONITORED_AUTOSCALED = {
    "service": {"type": "LoadBalancer"},
    "compactor": {
        "membership": {"mode": "kubernetes", "pollSeconds": 15},
        "autoscaling": {"enabled": True, "minReplicas": 2, "maxReplicas": 6},
        "podDisruptionBudget": {"enabled": True, "maxUnavailable": 1},
    },
    "metrics": {
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "prometheusRule": {"enabled": True},
    },
    "host": {"antiAffinity": "hard"},
}
IRSA = {
    "serviceAccount": {
        "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/loghost"}
    },
    "store": {"s3": {"existingSecret": ""}},
}
LOCAL_DEV = {
    "store": {"url": "file:///data/wal"},
    "host": {"replicas": 1, "persistence": {"enabled": True, "size": "5Gi"}},
    "compactor": {"enabled": False},
}
LOCAL_SHARED = {
    "store": {"url": "/data/wal", "local": {"existingClaim": "loghost-rwx"}},
    "host": {"replicas": 2},
}

# Every extension point at once: a TLS MinIO's CA bundle mounted in both pods (what
# extraVolumes exists for), init containers and sidecars, envFrom, the S3 credentials and the
# compactor key as files, NetworkPolicies, an Ingress, the Grafana dashboard, monitoring.
CA_BUNDLE_VOLUME = {"name": "minio-ca", "configMap": {"name": "minio-ca-bundle"}}
CA_BUNDLE_MOUNT = {"name": "minio-ca", "mountPath": "/etc/ssl/minio", "readOnly": True}
CA_BUNDLE_ENV = {"name": "AWS_CA_BUNDLE", "value": "/etc/ssl/minio/ca.crt"}
SIDECAR = {
    "name": "log-shipper",
    "image": "registry.example.com/shipper:1.2",
    "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}},
}
INIT = {
    "name": "wait-for-minio",
    "image": "registry.example.com/loghost:0.1.0",
    "command": [
        "python",
        "-c",
        "import socket; socket.create_connection(('minio.storage', 9000), 5)",
    ],
}
PEER_INGRESS_NS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress-nginx"}}
}
PEER_MONITORING = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
}
EGRESS_S3 = {
    "to": [{"ipBlock": {"cidr": "10.20.0.0/16"}}],
    "ports": [{"port": 9000, "protocol": "TCP"}],
}
EXTENDED = merge(
    S3_EXISTING_SECRET,
    MONITORED_AUTOSCALED,
    {
        "store": {"s3": {"credentialsFile": {"enabled": True, "key": "credentials"}}},
        "host": {
            "extraVolumes": [CA_BUNDLE_VOLUME],
            "extraVolumeMounts": [CA_BUNDLE_MOUNT],
            "extraEnv": [CA_BUNDLE_ENV],
            "extraEnvFrom": [{"configMapRef": {"name": "loghost-extra"}}],
            "initContainers": [INIT],
            "sidecars": [SIDECAR],
        },
        "compactor": {
            "extraVolumes": [CA_BUNDLE_VOLUME],
            "extraVolumeMounts": [CA_BUNDLE_MOUNT],
            "extraEnv": [CA_BUNDLE_ENV],
            "extraEnvFrom": [{"secretRef": {"name": "spark-extra"}}],
            "initContainers": [INIT],
            "sidecars": [SIDECAR],
        },
        "networkPolicy": {
            "enabled": True,
            "apiFrom": [PEER_INGRESS_NS],
            "metricsFrom": [PEER_MONITORING],
            "egress": [EGRESS_S3],
        },
        "ingress": {
            "enabled": True,
            "className": "nginx",
            "annotations": {"nginx.ingress.kubernetes.io/proxy-body-size": "16m"},
            "hosts": [
                {"host": "logs.example.com", "paths": [{"path": "/v1", "pathType": "Prefix"}]}
            ],
            "tls": [{"secretName": "logs-example-tls", "hosts": ["logs.example.com"]}],
        },
        "grafana": {"dashboard": {"enabled": True}},
    },
)

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "extended": EXTENDED,
    "extended-external-spark-statefulset": merge(EXTENDED, EXTERNAL_SPARK, STATEFULSET),
    "s3-existing-secret": S3_EXISTING_SECRET,
    "external-redis-secret": EXTERNAL_REDIS,
    "external-redis-url": EXTERNAL_REDIS_URL,
    "external-spark": EXTERNAL_SPARK,
    "five-replicas": FIVE_REPLICAS,
    "monitored-autoscaled": MONITORED_AUTOSCALED,
    "monitored-autoscaled-statefulset": {
        **MONITORED_AUTOSCALED,
        "compactor": {**MONITORED_AUTOSCALED["compactor"], "workload": "StatefulSet"},
    },
    "irsa-ambient-credentials": IRSA,
    "local-dev": LOCAL_DEV,
    "local-shared-claim": LOCAL_SHARED,
}


# --- rendering helpers --------------------------------------------------------


class Rendered:
    """A rendered release: parsed objects by (kind, name), plus NOTES.txt."""

    def __init__(self, manifests: dict[str, str]) -> None:
        self.notes = ""
        self.objects: list[dict[str, Any]] = []
        for path, text in manifests.items():
            if path.endswith("NOTES.txt"):
                self.notes = text
                continue
            self.objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
        self.by_key: dict[tuple[str, str], dict[str, Any]] = {}
        for obj in self.objects:
            key = (obj["kind"], obj["metadata"]["name"])
            assert key not in self.by_key, f"duplicate object {key}"
            self.by_key[key] = obj

    def get(self, kind: str, name: str) -> dict[str, Any]:
        assert (kind, name) in self.by_key, (
            f"{kind}/{name} not rendered; have {sorted(self.by_key)}"
        )
        return self.by_key[(kind, name)]

    def kinds(self, kind: str) -> list[dict[str, Any]]:
        return [o for o in self.objects if o["kind"] == kind]

    def has(self, kind: str, name: str) -> bool:
        return (kind, name) in self.by_key


def render(
    chart,
    values: dict[str, Any] | None = None,
    name: str = RELEASE,
    namespace: str = NAMESPACE,
    **options: Any,
) -> Rendered:
    """Render with BASE_VALUES under ``values``; ``options`` go to the SDK (is_upgrade, ...)."""
    return Rendered(
        chart.render(merge(BASE_VALUES, values or {}), name=name, namespace=namespace, **options)
    )


def lint(values: dict[str, Any] | None = None, **options: Any) -> dict[str, Any]:
    """``helm lint`` of the chart with BASE_VALUES under ``values``."""
    return helm.lint(str(CHART_DIR), merge(BASE_VALUES, values or {}), **options)


def host_sts(r: Rendered, name: str = RELEASE) -> dict[str, Any]:
    return r.get("StatefulSet", name)


def compactor_sts(r: Rendered, name: str = RELEASE) -> dict[str, Any]:
    return r.get("StatefulSet", f"{name}-compactor")


def compactor_deploy(r: Rendered, name: str = RELEASE) -> dict[str, Any]:
    return r.get("Deployment", f"{name}-compactor")


def compactor_workload(r: Rendered, name: str = RELEASE) -> dict[str, Any]:
    """The compactor workload, whichever kind was rendered (exactly one of them)."""
    found = [
        r.by_key[(kind, f"{name}-compactor")]
        for kind in ("Deployment", "StatefulSet")
        if (kind, f"{name}-compactor") in r.by_key
    ]
    assert len(found) == 1, [w["kind"] for w in found]
    return found[0]


def workloads(r: Rendered) -> list[dict[str, Any]]:
    return r.kinds("StatefulSet") + r.kinds("Deployment")


def container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    matches = [c for c in containers if c["name"] == name]
    assert len(matches) == 1, [c["name"] for c in containers]
    return matches[0]


def env_list(workload: dict[str, Any], cname: str) -> list[dict[str, Any]]:
    return container(workload, cname).get("env", [])


def env_of(workload: dict[str, Any], cname: str) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for item in env_list(workload, cname):
        assert item["name"] not in out, f"env {item['name']} set twice"
        out[item["name"]] = item
    return out


def env_value(workload: dict[str, Any], cname: str, var: str) -> str:
    item = env_of(workload, cname)[var]
    assert "value" in item, f"{var} is not a plain value: {item}"
    return item["value"]


def expand(value: str, bindings: dict[str, str]) -> str:
    """Kubernetes $(VAR) expansion."""
    return re.sub(
        r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: bindings.get(m.group(1), m.group(0)), value
    )


def pod_labels(workload: dict[str, Any]) -> dict[str, str]:
    return workload["spec"]["template"]["metadata"]["labels"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def host_advertise_urls(r: Rendered, name: str = RELEASE) -> list[str]:
    """The advertise URL each host pod ends up with, after $(POD_NAME) expansion."""
    sts = host_sts(r, name)
    template = env_value(sts, "loghost", "LOGHOST_ADVERTISE_URL")
    return [
        expand(template, {"POD_NAME": f"{sts['metadata']['name']}-{i}"})
        for i in range(sts["spec"]["replicas"])
    ]


# --- CRD schemas (subset of prometheus-operator's, strict) -----------------------

_META = {
    "type": "object",
    "required": ["name", "namespace"],
    "properties": {
        "name": {"type": "string"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}
_LABEL_SELECTOR = {
    "type": "object",
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array"},
    },
    "additionalProperties": False,
}
_DURATION = {
    "type": "string",
    "pattern": "^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$",
}
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "ServiceMonitor"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "required": ["selector", "endpoints"],
                "additionalProperties": False,
                "properties": {
                    "selector": _LABEL_SELECTOR,
                    "namespaceSelector": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "any": {"type": "boolean"},
                            "matchNames": {"type": "array", "items": {"type": "string"}},
                        },
                    },
                    "endpoints": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "port": {"type": "string"},
                                "path": {"type": "string"},
                                "scheme": {"enum": ["http", "https"]},
                                "interval": _DURATION,
                                "scrapeTimeout": _DURATION,
                                "honorLabels": {"type": "boolean"},
                                "authorization": {
                                    "type": "object",
                                    "additionalProperties": False,
                                    "required": ["credentials"],
                                    "properties": {
                                        "type": {"type": "string"},
                                        "credentials": {
                                            "type": "object",
                                            "additionalProperties": False,
                                            "required": ["name", "key"],
                                            "properties": {
                                                "name": {"type": "string"},
                                                "key": {"type": "string"},
                                                "optional": {"type": "boolean"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
    ("monitoring.coreos.com/v1", "PrometheusRule"): {
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
        "properties": {
            "apiVersion": {"const": "monitoring.coreos.com/v1"},
            "kind": {"const": "PrometheusRule"},
            "metadata": _META,
            "spec": {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "groups": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "required": ["name", "rules"],
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "minLength": 1},
                                "interval": _DURATION,
                                "rules": {
                                    "type": "array",
                                    "items": {
                                        "type": "object",
                                        "required": ["expr"],
                                        "additionalProperties": False,
                                        "properties": {
                                            "alert": {
                                                "type": "string",
                                                "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                                            },
                                            "record": {"type": "string"},
                                            "expr": {"type": "string", "minLength": 1},
                                            "for": _DURATION,
                                            "labels": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                            "annotations": {
                                                "type": "object",
                                                "additionalProperties": {"type": "string"},
                                            },
                                        },
                                    },
                                },
                            },
                        },
                    }
                },
            },
        },
    },
}


def validate_object(obj: dict[str, Any]) -> None:
    crd = CRD_SCHEMAS.get((obj.get("apiVersion"), obj.get("kind")))
    if crd is not None:
        jsonschema.validate(obj, crd)
        return
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


# --- lint & schema-validity of every rendering ------------------------------------


def test_validator_is_current_and_strict():
    assert Version(K8S_VERSION) >= Version("1.33"), K8S_VERSION
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "x"},
        "spec": {"ports": [{"port": 80}], "clusterIp": "None"},  # typo'd field
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSION, strict=True)


def test_lint_strict_has_no_errors_or_warnings():
    report = lint(strict=True, namespace=NAMESPACE, kube_version=f"v{K8S_VERSION}")
    assert report["total_charts_linted"] == 1
    assert report["errors"] == []
    serious = [m for m in report["messages"] if m["severity"] >= 2]
    assert serious == [], serious


@pytest.mark.parametrize(
    "scenario",
    [
        "s3-existing-secret",
        "external-spark",
        "monitored-autoscaled",
        "monitored-autoscaled-statefulset",
        "five-replicas",
        "local-dev",
    ],
)
def test_lint_strict_with_overrides(scenario):
    report = lint(SCENARIOS[scenario], strict=True, namespace=NAMESPACE)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_lint_reports_schema_violation():
    report = lint({"host": {"replicas": 0}}, strict=True)
    assert report["errors"], "lint must surface a values.schema.json violation"


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_manifest_validates(chart, scenario):
    r = render(chart, SCENARIOS[scenario])
    assert r.objects
    for obj in r.objects:
        try:
            validate_object(obj)
        except (kubernetes_validate.ValidationError, jsonschema.ValidationError) as exc:
            pytest.fail(
                f"{scenario}: {obj['kind']}/{obj['metadata']['name']}: "
                f"{'.'.join(map(str, exc.path))}: {exc.message}"
            )
        assert obj["metadata"]["namespace"] == NAMESPACE, obj["metadata"]
    assert not r.kinds("Secret"), "the chart must never create Secrets from values"


def test_default_render_has_the_expected_objects(chart):
    r = render(chart)
    expected = {
        ("StatefulSet", "loghost"),
        ("Service", "loghost-headless"),
        ("Service", "loghost"),
        ("PodDisruptionBudget", "loghost"),
        ("Deployment", "loghost-compactor"),
        ("Service", "loghost-compactor"),
        ("ServiceAccount", "loghost"),
        ("Pod", "loghost-test-healthz"),  # the `helm test` hook (tests.enabled)
    }
    assert set(r.by_key) == expected
    # The StatefulSet kind swaps only the workload object.
    r = render(chart, STATEFULSET)
    assert set(r.by_key) == expected - {("Deployment", "loghost-compactor")} | {
        ("StatefulSet", "loghost-compactor")
    }


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_optional_objects_appear_when_enabled(chart, kind):
    r = render(chart, merge(MONITORED_AUTOSCALED, WORKLOADS[kind]))
    assert compactor_workload(r)["kind"] == kind
    for key in [
        ("HorizontalPodAutoscaler", "loghost-compactor"),
        ("PodDisruptionBudget", "loghost-compactor"),
        ("Role", "loghost-compactor"),
        ("RoleBinding", "loghost-compactor"),
        ("ServiceMonitor", "loghost"),
        ("ServiceMonitor", "loghost-compactor"),
        ("PrometheusRule", "loghost"),
    ]:
        assert r.has(*key), key


# --- host wiring ------------------------------------------------------------------


@pytest.mark.parametrize("values", [{}, FIVE_REPLICAS], ids=["3-hosts", "5-hosts"])
def test_server_id_is_the_pod_name(chart, values):
    r = render(chart, values)
    sts = host_sts(r)
    env = env_of(sts, "loghost")
    # The downward API gives exactly the pod name, which for a StatefulSet is
    # "<statefulset name>-<ordinal>": stable across restarts and reschedules.
    assert env["LOGHOST_SERVER_ID"] == {
        "name": "LOGHOST_SERVER_ID",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
    }
    assert sts["kind"] == "StatefulSet"
    assert sts["metadata"]["name"] == RELEASE
    assert sts["spec"]["replicas"] == (values.get("host", {}).get("replicas", 3))
    assert "LOGHOST_SERVER_ID" not in sts["spec"]["template"]["metadata"].get("annotations", {})


def test_server_ids_follow_a_renamed_release(chart):
    r = render(chart, {}, name="prod")
    sts = host_sts(r, "prod-loghost")
    assert (
        env_of(sts, "loghost")["LOGHOST_SERVER_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.name"
    )
    assert host_advertise_urls(r, "prod-loghost")[0] == (
        "http://prod-loghost-0.prod-loghost-headless.logs.svc.cluster.local:8080"
    )


def test_advertise_url_is_the_pods_headless_dns_name(chart):
    r = render(chart, FIVE_REPLICAS)
    sts = host_sts(r)
    headless = r.get("Service", sts["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    assert selects(headless["spec"]["selector"], pod_labels(sts))
    urls = host_advertise_urls(r)
    assert urls == [
        f"http://loghost-{i}.loghost-headless.{NAMESPACE}.svc.cluster.local:8080" for i in range(5)
    ]
    # $(POD_NAME) only expands if POD_NAME is the pod name and defined earlier.
    env = env_of(sts, "loghost")
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_env_references_are_defined_before_use(chart):
    for values in SCENARIOS.values():
        r = render(chart, values)
        for sts in workloads(r):
            for c in sts["spec"]["template"]["spec"]["containers"]:
                seen: set[str] = set()
                for item in c.get("env", []):
                    for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", item.get("value", "")):
                        assert ref in seen, (
                            f"{c['name']}: {item['name']} uses $({ref}) before it is defined"
                        )
                    seen.add(item["name"])


def test_listen_address_matches_container_port(chart):
    for values in [{}, {"host": {"port": 9000}}]:
        r = render(chart, values)
        sts = host_sts(r)
        c = container(sts, "loghost")
        port = c["ports"][0]
        assert port["name"] == "http"
        assert env_value(sts, "loghost", "LOGHOST_LISTEN") == f"0.0.0.0:{port['containerPort']}"
        assert host_advertise_urls(r)[0].endswith(f":{port['containerPort']}")
        assert c["args"] == ["loghost", "serve"]


def test_probes_point_at_the_real_endpoints(chart):
    sts = host_sts(render(chart))
    c = container(sts, "loghost")
    named_ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert named_ports[c[probe]["httpGet"]["port"]] == 8080


def test_shutdown_gets_time_to_flush(chart):
    for values in [
        {},
        {"host": {"config": {"shutdownGraceS": 90}, "terminationGracePeriodSeconds": 120}},
    ]:
        sts = host_sts(render(chart, values))
        spec = sts["spec"]["template"]["spec"]
        c = container(sts, "loghost")
        sleep_cmd = c["lifecycle"]["preStop"]["exec"]["command"]
        assert sleep_cmd[0] == "sleep"
        pre_stop = int(sleep_cmd[1])
        assert pre_stop > 0
        shutdown = int(env_value(sts, "loghost", "LOGHOST_SHUTDOWN_GRACE_S"))
        assert spec["terminationGracePeriodSeconds"] > pre_stop + shutdown >= 30


def test_too_short_termination_grace_is_refused(chart):
    with pytest.raises(helm.HelmRenderError, match="terminationGracePeriodSeconds"):
        render(
            chart, {"host": {"terminationGracePeriodSeconds": 30, "config": {"shutdownGraceS": 30}}}
        )


def test_resources_pdb_and_anti_affinity(chart):
    r = render(chart)
    sts = host_sts(r)
    c = container(sts, "loghost")
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    pdb = r.get("PodDisruptionBudget", "loghost")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(sts))
    # The host PDB must not also cover compactor pods.
    assert not selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(compactor_workload(r)))
    soft = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = soft["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert selects(term["labelSelector"]["matchLabels"], pod_labels(sts))

    hard = host_sts(render(chart, {"host": {"antiAffinity": "hard"}}))
    req = hard["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert selects(req[0]["labelSelector"]["matchLabels"], pod_labels(hard))
    none = host_sts(render(chart, {"host": {"antiAffinity": "none"}}))
    assert "affinity" not in none["spec"]["template"]["spec"]


@pytest.mark.parametrize("scenario", ["defaults", "local-dev", "external-spark", "five-replicas"])
def test_security_context(chart, scenario):
    r = render(chart, SCENARIOS[scenario])
    assert len(workloads(r)) == (1 if scenario == "local-dev" else 2)
    for sts in workloads(r):
        spec = sts["spec"]["template"]["spec"]
        assert spec["securityContext"]["runAsNonRoot"] is True
        assert spec["securityContext"]["runAsUser"] != 0
        for c in spec["containers"]:
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            assert "/tmp" in mounts
            volumes = {v["name"]: v for v in spec["volumes"]}
            assert "emptyDir" in volumes[mounts["/tmp"]]


def test_client_service_reaches_serving_hosts_only(chart):
    r = render(chart)
    sts = host_sts(r)
    client = r.get("Service", "loghost")
    assert client["spec"].get("clusterIP") != "None"
    assert selects(client["spec"]["selector"], pod_labels(sts))
    # A pod relabelled loghost/serving=false (draining) leaves the client Service
    # but stays in the headless Service and the StatefulSet.
    drained = dict(pod_labels(sts), **{"loghost/serving": "false"})
    assert not selects(client["spec"]["selector"], drained)
    assert selects(r.get("Service", "loghost-headless")["spec"]["selector"], drained)
    assert selects(sts["spec"]["selector"]["matchLabels"], drained)
    assert client["spec"]["ports"][0]["targetPort"] == "http"


# --- compactor wiring ----------------------------------------------------------


@pytest.mark.parametrize(
    "scenario",
    [
        "defaults",
        "five-replicas",
        "external-spark",
        "s3-existing-secret",
        "monitored-autoscaled-statefulset",
    ],
)
def test_compactor_gets_every_host_url(chart, scenario):
    r = render(chart, SCENARIOS[scenario])
    hosts = env_value(compactor_workload(r), "compactor", "COMPACTOR_HOSTS").split(",")
    # Exactly the URLs the hosts advertise themselves under, one per pod, in ordinal order.
    assert hosts == host_advertise_urls(r)
    assert len(hosts) == host_sts(r)["spec"]["replicas"]


def test_extra_hosts_are_appended(chart):
    r = render(chart, {"compactor": {"extraHosts": ["http://old-host-7.example.svc:8080"]}})
    hosts = env_value(compactor_workload(r), "compactor", "COMPACTOR_HOSTS").split(",")
    assert hosts == [*host_advertise_urls(r), "http://old-host-7.example.svc:8080"]


def test_version_pruning_is_configurable(chart):
    env = env_of(compactor_workload(render(chart)), "compactor")
    assert "COMPACTOR_KEEP_VERSIONS" not in env and "COMPACTOR_PRUNE_GRACE_S" not in env
    sts = compactor_workload(render(chart, {"compactor": {"keepVersions": 3, "pruneGraceS": 600}}))
    assert env_value(sts, "compactor", "COMPACTOR_KEEP_VERSIONS") == "3"
    assert env_value(sts, "compactor", "COMPACTOR_PRUNE_GRACE_S") == "600"
    with pytest.raises(helm.HelmValuesError):
        render(chart, {"compactor": {"keepVersions": 0}})


@pytest.mark.parametrize("replicas", [1, 3])
def test_static_membership_matches_pod_names(chart, replicas):
    r = render(chart, merge(STATEFULSET, {"compactor": {"replicas": replicas}}))
    sts = compactor_sts(r)
    env = env_of(sts, "compactor")
    assert sts["spec"]["replicas"] == replicas
    assert sts["spec"]["serviceName"] == "loghost-compactor"
    assert r.get("Service", "loghost-compactor")["spec"]["clusterIP"] == "None"
    assert env["COMPACTOR_MEMBER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    members = env["COMPACTOR_MEMBERS"]["value"].split(",")
    # The pods the StatefulSet will create, by name: each one finds itself in the list.
    assert members == [f"{sts['metadata']['name']}-{i}" for i in range(replicas)]
    assert container(sts, "compactor")["args"] == ["compactor", "run"]
    assert not r.has("Role", "loghost-compactor")
    assert sts["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    assert not r.has("Deployment", "loghost-compactor")


def test_kubernetes_membership_and_hpa_are_coherent(chart):
    r = render(chart, merge(MONITORED_AUTOSCALED, STATEFULSET))
    sts = compactor_sts(r)
    env = env_of(sts, "compactor")
    assert "replicas" not in sts["spec"], "the HPA owns the replica count"
    assert "COMPACTOR_MEMBERS" not in env, (
        "members come from the supervisor, not a stale rendered list"
    )
    assert env["COMPACTOR_MEMBER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["MEMBERSHIP_MODE"]["value"] == "statefulset"
    assert env["MEMBERSHIP_STATEFULSET"]["value"] == sts["metadata"]["name"]
    assert "MEMBERSHIP_SELECTOR" not in env
    assert env["MEMBERSHIP_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["MEMBERSHIP_POLL_S"]["value"] == "15"
    assert container(sts, "compactor")["args"] == ["compactor-supervisor", "--", "compactor", "run"]
    pod = sts["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is True

    hpa = r.get("HorizontalPodAutoscaler", "loghost-compactor")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "name": sts["metadata"]["name"],
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)

    role = r.get("Role", "loghost-compactor")
    assert role["rules"] == [
        {
            "apiGroups": ["apps"],
            "resources": ["statefulsets"],
            "resourceNames": [sts["metadata"]["name"]],
            "verbs": ["get"],
        }
    ]
    binding = r.get("RoleBinding", "loghost-compactor")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    # Hosts never get an API token.
    assert host_sts(r)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def parse_selector(text: str) -> dict[str, str]:
    return dict(part.split("=", 1) for part in text.split(","))


def supervisor_config(workload: dict[str, Any]):
    """The supervisor's Config built from the container env the chart renders, with the
    downward-API fields filled in as the kubelet would: proves the two agree on names."""
    spec = importlib.util.spec_from_file_location(
        "compactor_supervisor", IMAGE_DIR / "compactor-supervisor.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    fields = {
        "metadata.name": "loghost-compactor-6d4cf56db6-q2xlz",
        "metadata.namespace": NAMESPACE,
        "status.podIP": "10.0.0.7",
    }
    env = {"MEMBERSHIP_API_URL": "https://10.96.0.1:443"}
    for item in env_list(workload, "compactor"):
        if "value" in item:
            env[item["name"]] = item["value"]
        elif "fieldRef" in item.get("valueFrom", {}):
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return module.Config(env)


def test_default_compactor_is_a_single_deployment(chart):
    r = render(chart)
    deploy = compactor_deploy(r)
    assert not r.has("StatefulSet", "loghost-compactor")
    spec = deploy["spec"]
    assert deploy["metadata"]["labels"]["app.kubernetes.io/component"] == "compactor"
    assert spec["replicas"] == 1
    assert spec["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "loghost",
        "app.kubernetes.io/instance": RELEASE,
        "app.kubernetes.io/component": "compactor",
    }
    assert selects(spec["selector"]["matchLabels"], pod_labels(deploy))
    # Nor may it select host pods (they share name/instance labels).
    assert not selects(spec["selector"]["matchLabels"], pod_labels(host_sts(r)))
    # StatefulSet-only fields stay out; a Deployment gets a one-at-a-time, no-surge rollout.
    for field in ("serviceName", "podManagementPolicy", "volumeClaimTemplates", "updateStrategy"):
        assert field not in spec, field
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
    }
    # One compactor, no API access: no member list, so it owns every collection.
    env = env_of(deploy, "compactor")
    assert container(deploy, "compactor")["args"] == ["compactor", "run"]
    assert env["COMPACTOR_MEMBER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert "COMPACTOR_MEMBERS" not in env
    assert not [name for name in env if name.startswith("MEMBERSHIP_")]
    assert spec["template"]["spec"]["automountServiceAccountToken"] is False
    assert not r.has("Role", "loghost-compactor") and not r.has("RoleBinding", "loghost-compactor")
    # The compactor contract: every host URL, the Spark master, the store, no inline credentials.
    assert env_value(deploy, "compactor", "COMPACTOR_HOSTS").split(",") == host_advertise_urls(r)
    assert env_value(deploy, "compactor", "COMPACTOR_SPARK_MASTER") == "local[*]"
    assert env_value(deploy, "compactor", "COMPACTOR_STORE") == STORE_URL
    refs = secret_refs(r)
    assert mounted_secret_file(deploy, "compactor", "COMPACTOR_API_KEY_FILE") == (
        "loghost-api-keys",
        "COMPACTOR_API_KEY",
    )
    assert "COMPACTOR_API_KEY" not in env
    assert refs[("loghost-compactor", "AWS_SECRET_ACCESS_KEY")] == (
        "loghost-s3",
        "AWS_SECRET_ACCESS_KEY",
    )
    for obj in r.objects:
        validate_object(obj)


@pytest.mark.parametrize("replicas", [2, 5])
def test_deployment_with_static_membership_refuses_more_than_one_replica(chart, replicas):
    values = {"compactor": {"replicas": replicas}}
    # The schema refuses it, and its error lists the three ways out.
    with pytest.raises(helm.HelmValuesError) as err:
        chart.validate_schema(merge(BASE_VALUES, values))
    message = str(err.value)
    assert "/compactor/replicas" in message and "want 1" in message
    assert "/compactor/membership/mode" in message and "'kubernetes'" in message
    assert "/compactor/workload" in message and "'StatefulSet'" in message
    with pytest.raises(helm.HelmValuesError):
        render(chart, values)
    report = lint(values, strict=True, namespace=NAMESPACE)
    assert report["errors"], "lint must surface the refusal too"
    # Each named fix renders.
    for fix in (
        {"membership": {"mode": "kubernetes"}},
        {"workload": "StatefulSet"},
        {"replicas": 1},
    ):
        r = render(chart, merge(values, {"compactor": fix}))
        assert compactor_workload(r)["kind"] == fix.get("workload", "Deployment")
    # A disabled compactor is not checked.
    chart.validate_schema(merge(BASE_VALUES, values, {"compactor": {"enabled": False}}))


def test_deployment_with_static_membership_is_also_refused_at_render(tmp_path):
    # For installs that skip schema validation: the same combination fails in the templates,
    # with a message that names the fix. Checked on a copy of the chart without the schema rule.
    copy_dir = tmp_path / "loghost"
    shutil.copytree(CHART_DIR, copy_dir)
    schema_path = copy_dir / "values.schema.json"
    schema = json.loads(schema_path.read_text())
    rules = schema["properties"]["compactor"]["allOf"]
    kept = [rule for rule in rules if "workload" not in json.dumps(rule["if"])]
    assert len(kept) == len(rules) - 1
    schema["properties"]["compactor"]["allOf"] = kept
    schema_path.write_text(json.dumps(schema))
    with helm.Chart.load(str(copy_dir)) as loaded:
        loaded.validate_schema(merge(BASE_VALUES, {"compactor": {"replicas": 3}}))
        with pytest.raises(helm.HelmRenderError) as err:
            render(loaded, {"compactor": {"replicas": 3}})
    message = str(err.value)
    assert "compactor.replicas=3" in message
    assert (
        "compactor.membership.mode=kubernetes" in message
        and "compactor.workload=StatefulSet" in message
    )


def test_deployment_kubernetes_membership_lists_pods(chart):
    r = render(
        chart,
        merge(
            DEPLOYMENT,
            {"compactor": {"replicas": 3, "membership": {"mode": "kubernetes", "pollSeconds": 20}}},
        ),
    )
    deploy = compactor_deploy(r)
    env = env_of(deploy, "compactor")
    pod = deploy["spec"]["template"]["spec"]
    assert deploy["spec"]["replicas"] == 3
    assert container(deploy, "compactor")["args"] == [
        "compactor-supervisor",
        "--",
        "compactor",
        "run",
    ]
    assert "COMPACTOR_MEMBERS" not in env, "members come from the supervisor's pod list"
    assert env["COMPACTOR_MEMBER_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["MEMBERSHIP_MODE"]["value"] == "pods"
    assert "MEMBERSHIP_STATEFULSET" not in env
    # The supervisor lists exactly the pods the Deployment selects.
    assert (
        parse_selector(env["MEMBERSHIP_SELECTOR"]["value"])
        == deploy["spec"]["selector"]["matchLabels"]
    )
    assert env["MEMBERSHIP_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["MEMBERSHIP_POLL_S"]["value"] == "20"
    assert pod["automountServiceAccountToken"] is True

    role = r.get("Role", "loghost-compactor")
    assert role["metadata"]["namespace"] == NAMESPACE
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}]
    binding = r.get("RoleBinding", "loghost-compactor")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "loghost-compactor",
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": pod["serviceAccountName"], "namespace": NAMESPACE}
    ]
    assert not r.kinds("ClusterRole") and not r.kinds("ClusterRoleBinding"), "nothing cluster-wide"
    assert host_sts(r)["spec"]["template"]["spec"]["automountServiceAccountToken"] is False
    for obj in r.objects:
        validate_object(obj)


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_supervisor_accepts_the_rendered_environment(chart, kind):
    r = render(chart, merge(MONITORED_AUTOSCALED, WORKLOADS[kind]))
    workload = compactor_workload(r)
    cfg = supervisor_config(workload)
    assert cfg.namespace == NAMESPACE
    assert cfg.poll_s == 15
    assert cfg.pod_name == "loghost-compactor-6d4cf56db6-q2xlz"
    if kind == "Deployment":
        assert cfg.mode == "pods"
        assert parse_selector(cfg.selector) == workload["spec"]["selector"]["matchLabels"]
    else:
        assert (cfg.mode, cfg.statefulset) == ("statefulset", "loghost-compactor")


def test_hpa_and_pdb_follow_the_deployment(chart):
    r = render(chart, MONITORED_AUTOSCALED)
    deploy = compactor_deploy(r)
    assert "replicas" not in deploy["spec"], "the HPA owns the replica count"
    hpa = r.get("HorizontalPodAutoscaler", "loghost-compactor")
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "loghost-compactor",
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
    pdb = r.get("PodDisruptionBudget", "loghost-compactor")
    assert selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(deploy))
    assert not selects(pdb["spec"]["selector"]["matchLabels"], pod_labels(host_sts(r)))
    assert r.get("Role", "loghost-compactor")["rules"][0]["resources"] == ["pods"]


def test_compactor_service_is_the_same_for_both_kinds(chart):
    # Switching compactor.workload on an installed release must not need a change to the
    # Service's immutable clusterIP; it stays the headless metrics target either way.
    services = [
        render(chart, WORKLOADS[kind]).get("Service", "loghost-compactor")
        for kind in sorted(WORKLOADS)
    ]
    assert services[0] == services[1]
    assert services[0]["spec"]["clusterIP"] == "None"


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_notes_name_the_compactor_workload(chart, kind):
    notes = render(chart, WORKLOADS[kind]).notes
    assert f"Compactors: {kind} loghost-compactor, Spark master local[*]" in notes


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_spark_local_mode(chart, kind):
    sts = compactor_workload(render(chart, WORKLOADS[kind]))
    assert sts["kind"] == kind
    env = env_of(sts, "compactor")
    assert env["COMPACTOR_SPARK_MASTER"]["value"] == "local[*]"
    assert env["SPARK_LOCAL_IP"]["value"] == "127.0.0.1"
    args = env["PYSPARK_SUBMIT_ARGS"]["value"].split()
    assert args[-1] == "pyspark-shell"
    assert args[:2] == ["--driver-memory", env["SPARK_DRIVER_MEMORY"]["value"]]
    assert env["COMPACTOR_METRICS_LISTEN"]["value"] == "0.0.0.0:9090"
    c = container(sts, "compactor")
    assert c["ports"] == [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}]
    # The probes watch the round loop's heartbeat file, not /metrics (a thread of its own).
    for probe in ("livenessProbe", "startupProbe"):
        assert "httpGet" not in c[probe]
        assert env["COMPACTOR_HEARTBEAT_FILE"]["value"] in c[probe]["exec"]["command"]
    assert env["COMPACTOR_STORE"]["value"] == env_value(
        host_sts(render(chart)), "loghost", "LOGHOST_STORE"
    )


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_spark_external_master(chart, kind):
    sts = compactor_workload(render(chart, merge(EXTERNAL_SPARK, WORKLOADS[kind])))
    assert sts["kind"] == kind
    env = env_of(sts, "compactor")
    assert (
        env["COMPACTOR_SPARK_MASTER"]["value"]
        == "spark://spark-master.spark.svc.cluster.local:7077"
    )
    submit = env["PYSPARK_SUBMIT_ARGS"]["value"]
    # Executors in the cluster call back to the driver in this pod, by pod IP.
    assert "--conf spark.driver.host=$(POD_IP)" in submit
    assert "--conf spark.executor.memory=4g" in submit
    assert "--conf spark.sql.shuffle.partitions=64" in submit
    assert submit.startswith("--driver-memory 1g ") and submit.endswith(" pyspark-shell")
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


@pytest.mark.parametrize(
    "limit, driver, ok",
    [("3Gi", "2g", True), ("2Gi", "2g", False), ("3072Mi", "2048m", True), ("2500M", "2g", False)],
)
def test_spark_heap_must_fit_the_memory_limit(chart, limit, driver, ok):
    values = {
        "compactor": {
            "spark": {"driverMemory": driver},
            "resources": {"requests": {"memory": limit}, "limits": {"memory": limit}},
        }
    }
    if ok:
        render(chart, values)
    else:
        with pytest.raises(helm.HelmRenderError, match=r"limits\.memory"):
            render(chart, values)


def test_compactor_can_be_disabled(chart):
    r = render(chart, {"compactor": {"enabled": False}})
    assert not any(o["metadata"]["name"].endswith("-compactor") for o in r.objects)
    assert "Compactors are disabled" in r.notes


# --- secrets & credentials ------------------------------------------------------

SECRET_ENV = {
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "LOGHOST_API_KEYS",
    "COMPACTOR_API_KEY",
}


def secret_refs(r: Rendered) -> dict[tuple[str, str], tuple[str, str]]:
    """(workload, env name) -> (secret name, key) for every secretKeyRef."""
    refs = {}
    for sts in workloads(r):
        for c in sts["spec"]["template"]["spec"]["containers"]:
            for item in c.get("env", []):
                if item["name"] in SECRET_ENV or item["name"] == "LOGHOST_REDIS_URL":
                    ref = item.get("valueFrom", {}).get("secretKeyRef")
                    if item["name"] in SECRET_ENV:
                        assert ref is not None and "value" not in item, (
                            f"{item['name']} must come from a Secret"
                        )
                    if ref:
                        refs[(sts["metadata"]["name"], item["name"])] = (ref["name"], ref["key"])
            assert not c.get("envFrom"), "no bulk env import: every secret is named explicitly"
    return refs


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_secrets_are_referenced_not_inlined(chart, kind):
    r = render(chart, merge(S3_EXISTING_SECRET, EXTERNAL_REDIS, WORKLOADS[kind]))
    assert compactor_workload(r)["kind"] == kind
    refs = secret_refs(r)
    for workload in ("loghost", "loghost-compactor"):
        assert refs[(workload, "AWS_ACCESS_KEY_ID")] == ("acme-s3-credentials", "access-key")
        assert refs[(workload, "AWS_SECRET_ACCESS_KEY")] == ("acme-s3-credentials", "secret-key")
        assert refs[(workload, "AWS_SESSION_TOKEN")] == ("acme-s3-credentials", "session-token")
    assert ("loghost", "LOGHOST_API_KEYS") not in refs  # a mounted file instead (below)
    assert api_keys_file(host_sts(r)) == ("acme-loghost-keys", "api-keys")
    # The compactor's key is a mounted file too (apiKeys.compactorKeyAsFile): Spark's children
    # inherit the environment, not the file.
    assert ("loghost-compactor", "COMPACTOR_API_KEY") not in refs
    assert mounted_secret_file(compactor_workload(r), "compactor", "COMPACTOR_API_KEY_FILE") == (
        "acme-loghost-keys",
        "service-key",
    )
    as_env = secret_refs(
        render(
            chart,
            merge(S3_EXISTING_SECRET, WORKLOADS[kind], {"apiKeys": {"compactorKeyAsFile": False}}),
        )
    )
    assert as_env[("loghost-compactor", "COMPACTOR_API_KEY")] == (
        "acme-loghost-keys",
        "service-key",
    )
    assert refs[("loghost", "LOGHOST_REDIS_URL")] == ("acme-redis", "url")
    session = env_of(host_sts(r), "loghost")["AWS_SESSION_TOKEN"]
    assert session["valueFrom"]["secretKeyRef"]["optional"] is True
    # S3-compatible endpoint and region reach both programs.
    for sts, cname in ((host_sts(r), "loghost"), (compactor_workload(r), "compactor")):
        assert (
            env_value(sts, cname, "AWS_ENDPOINT_URL")
            == "https://minio.storage.svc.cluster.local:9000"
        )
        assert env_value(sts, cname, "AWS_REGION") == "eu-central-1"
        assert (
            env_value(sts, cname, "LOGHOST_STORE" if cname == "loghost" else "COMPACTOR_STORE")
            == "s3://acme-wal/prod/loghost"
        )


def api_keys_file(sts: dict[str, Any]) -> tuple[str, str]:
    """(Secret, key) behind the host's LOGHOST_API_KEYS_FILE (see mounted_secret_file)."""
    return mounted_secret_file(sts, "loghost", "LOGHOST_API_KEYS_FILE")


def mounted_secret_file(sts: dict[str, Any], cname: str, var: str) -> tuple[str, str]:
    """(Secret, key) behind a file-naming env var, checking the mount on the way: the
    variable names a file in a read-only directory mount (no subPath, which kubelet never
    updates) of a Secret volume that projects exactly that one key, readable by fsGroup."""
    spec = sts["spec"]["template"]["spec"]
    c = container(sts, cname)
    path = env_value(sts, cname, var)
    mounts = [m for m in c["volumeMounts"] if path.startswith(m["mountPath"].rstrip("/") + "/")]
    assert len(mounts) == 1, (path, c["volumeMounts"])
    mount = mounts[0]
    assert mount.get("readOnly") is True and "subPath" not in mount, mount
    volume = {v["name"]: v for v in spec["volumes"]}[mount["name"]]
    secret = volume["secret"]
    file_name = path[len(mount["mountPath"].rstrip("/")) + 1 :]
    items = {i["path"]: i["key"] for i in secret["items"]}
    assert list(items) == [file_name], (
        items
    )  # that one entry (the host's keys, not the compactor's)
    assert secret["defaultMode"] & 0o007 == 0 and secret["defaultMode"] & 0o040, secret
    assert spec["securityContext"]["fsGroup"] is not None
    return secret["secretName"], items[file_name]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_api_keys_are_a_mounted_secret_file(chart, scenario):
    """The hosts read their keys from the mounted Secret (LOGHOST_API_KEYS_FILE), so an updated
    Secret reaches running hosts without a restart; the key never sits in the environment."""
    values = SCENARIOS[scenario]
    r = render(chart, values)
    sts = host_sts(r)
    keys = values.get("apiKeys", {})
    assert api_keys_file(sts) == (
        keys.get("existingSecret", "loghost-api-keys"),
        keys.get("hostKey", "LOGHOST_API_KEYS"),
    )
    assert "LOGHOST_API_KEYS" not in env_of(sts, "loghost")


def test_ambient_credentials_render_no_keys(chart):
    r = render(chart, IRSA)
    assert len(workloads(r)) == 2
    for sts in workloads(r):
        names = {
            e["name"]
            for c in sts["spec"]["template"]["spec"]["containers"]
            for e in c.get("env", [])
        }
        assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
        assert sts["spec"]["template"]["spec"]["serviceAccountName"] == "loghost"
    sa = r.get("ServiceAccount", "loghost")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"].startswith("arn:aws:iam::")


def test_redis_is_optional(chart):
    assert "LOGHOST_REDIS_URL" not in env_of(host_sts(render(chart)), "loghost")
    plain = env_of(host_sts(render(chart, EXTERNAL_REDIS_URL)), "loghost")["LOGHOST_REDIS_URL"]
    assert plain["value"] == "redis://redis-master.redis.svc.cluster.local:6379/0"
    assert "LOGHOST_REDIS_URL" not in env_of(
        compactor_workload(render(chart, EXTERNAL_REDIS_URL)), "compactor"
    )


# --- values.schema.json rejects bad values ----------------------------------------

BAD_VALUES = {
    "zero-hosts": {"host": {"replicas": 0}},
    "replicas-as-string": {"host": {"replicas": "3"}},
    "unknown-top-level-key": {"replicaCount": 3},
    "typo-in-host": {"host": {"replica": 3}},
    "http-store-url": {"store": {"url": "http://bucket/prefix"}},
    "s3-url-without-bucket": {"store": {"url": "s3://"}},
    "inline-access-key": {"store": {"s3": {"accessKeyId": "AKIAIOSFODNN7EXAMPLE"}}},
    "inline-secret-key": {
        "store": {"s3": {"secretAccessKey": "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"}}
    },
    "inline-api-keys": {"apiKeys": {"keys": "k1=tenant-a,svc=*"}},
    "no-api-key-secret": {"apiKeys": {"existingSecret": ""}},
    "credentials-in-endpoint-url": {
        "store": {"s3": {"endpointUrl": "https://user:pass@minio:9000"}}
    },
    "redis-password-in-url": {"redis": {"enabled": True, "url": "redis://:hunter2@redis:6379/0"}},
    "redis-enabled-without-url": {"redis": {"enabled": True}},
    "redis-not-a-url": {"redis": {"enabled": True, "url": "redis-master:6379"}},
    "spark-master-yarn": {"compactor": {"spark": {"master": "yarn"}}},
    "spark-driver-memory-unit": {"compactor": {"spark": {"driverMemory": "2GB"}}},
    "spark-conf-owned-by-chart": {
        "compactor": {"spark": {"conf": {"spark.driver.host": "1.2.3.4"}}}
    },
    "spark-conf-not-spark": {"compactor": {"spark": {"conf": {"executor.memory": "4g"}}}},
    "hpa-with-static-membership": {"compactor": {"autoscaling": {"enabled": True}}},
    "unknown-membership-mode": {"compactor": {"membership": {"mode": "dns"}}},
    "unknown-workload-kind": {"compactor": {"workload": "DaemonSet"}},
    "workload-kind-lowercase": {"compactor": {"workload": "deployment"}},
    "hpa-with-static-membership-statefulset": merge(
        STATEFULSET, {"compactor": {"autoscaling": {"enabled": True}}}
    ),
    "privileged-port": {"host": {"port": 80}},
    "root-allowed": {"host": {"podSecurityContext": {"runAsNonRoot": False}}},
    "root-user": {"compactor": {"podSecurityContext": {"runAsUser": 0}}},
    "bad-anti-affinity": {"host": {"antiAffinity": "strict"}},
    "bad-log-level": {"host": {"config": {"logLevel": "verbose"}}},
    "negative-rollup": {"host": {"config": {"rollupIntervalS": -1}}},
    "memory-limit-removed": {"host": {"resources": {"limits": {"memory": None}}}},
    "bad-service-type": {"service": {"type": "Ingress"}},
    "fullname-too-long": {"fullnameOverride": "a" * 43},
    "bad-extra-host": {"compactor": {"extraHosts": ["loghost-9:8080"]}},
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_schema_rejects_bad_values(chart, case):
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(BASE_VALUES, BAD_VALUES[case]))
    # and an install/render with them fails the same way
    with pytest.raises(helm.HelmValuesError):
        render(chart, BAD_VALUES[case])


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_schema_accepts_the_realistic_values(chart, scenario):
    chart.validate_schema(merge(BASE_VALUES, SCENARIOS[scenario]))


def test_schema_rejects_plain_redis_password_but_allows_user_without_password(chart):
    chart.validate_schema(
        merge(BASE_VALUES, {"redis": {"enabled": True, "url": "rediss://default@redis:6380"}})
    )
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(
            merge(
                BASE_VALUES, {"redis": {"enabled": True, "url": "rediss://default:pw@redis:6380"}}
            )
        )


# --- local (dev) store ------------------------------------------------------------


def test_local_dev_store_uses_a_pvc(chart):
    sts = host_sts(render(chart, LOCAL_DEV))
    assert env_value(sts, "loghost", "LOGHOST_STORE") == "file:///data/wal"
    mounts = {m["name"]: m["mountPath"] for m in container(sts, "loghost")["volumeMounts"]}
    assert mounts["data"] == "/data"
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "5Gi"


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_local_shared_claim_is_mounted_by_hosts_and_compactors(chart, kind):
    r = render(chart, merge(LOCAL_SHARED, WORKLOADS[kind]))
    for sts, cname in ((host_sts(r), "loghost"), (compactor_workload(r), "compactor")):
        vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
        assert vols["data"]["persistentVolumeClaim"]["claimName"] == "loghost-rwx"
        mounts = {m["name"]: m["mountPath"] for m in container(sts, cname)["volumeMounts"]}
        assert mounts["data"] == "/data"
        assert "volumeClaimTemplates" not in sts["spec"]


@pytest.mark.parametrize(
    "values, message",
    [
        ({"store": {"url": "file:///data/wal"}}, "dev-only"),
        ({"store": {"url": "file:///var/wal", "local": {"existingClaim": "x"}}}, "mountPath"),
        ({"host": {"persistence": {"enabled": True}}}, "local"),
        (
            merge(
                MONITORED_AUTOSCALED,
                {"compactor": {"autoscaling": {"minReplicas": 5, "maxReplicas": 3}}},
            ),
            "minReplicas",
        ),
    ],
)
def test_inconsistent_settings_are_refused(chart, values, message):
    with pytest.raises(helm.HelmRenderError, match=message):
        render(chart, values)


# --- metrics --------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_prometheus_annotations_match_ports(chart, kind):
    r = render(chart, WORKLOADS[kind])
    for sts, cname in ((host_sts(r), "loghost"), (compactor_workload(r), "compactor")):
        ann = sts["spec"]["template"]["metadata"]["annotations"]
        assert ann["prometheus.io/scrape"] == "true"
        assert ann["prometheus.io/path"] == "/metrics"
        ports = [p["containerPort"] for p in container(sts, cname)["ports"]]
        assert int(ann["prometheus.io/port"]) in ports
    off = render(chart, {"metrics": {"podAnnotations": False}})
    assert "prometheus.io/scrape" not in (
        host_sts(off)["spec"]["template"]["metadata"].get("annotations") or {}
    )


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_service_monitors_select_one_target_per_pod(chart, kind):
    r = render(chart, merge(MONITORED_AUTOSCALED, WORKLOADS[kind]))
    host_sm = r.get("ServiceMonitor", "loghost")
    services = r.kinds("Service")
    matched = [
        s
        for s in services
        if selects(host_sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in matched] == ["loghost-headless"]
    assert host_sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert host_sm["spec"]["endpoints"][0]["port"] in {
        p["name"] for p in matched[0]["spec"]["ports"]
    }
    assert host_sm["spec"]["endpoints"][0]["path"] == "/metrics"
    # The per-tenant metrics, with the service key from the Secret the compactors read it from.
    tenants = host_sm["spec"]["endpoints"][1]
    assert (tenants["path"], tenants["port"]) == ("/metrics/tenants", "http")
    assert tenants["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "loghost-api-keys", "key": "COMPACTOR_API_KEY"},
    }
    off = render(
        chart,
        merge(
            MONITORED_AUTOSCALED,
            WORKLOADS[kind],
            {"metrics": {"serviceMonitor": {"tenantMetrics": False}}},
        ),
    )
    assert [e["path"] for e in off.get("ServiceMonitor", "loghost")["spec"]["endpoints"]] == [
        "/metrics"
    ]

    comp_sm = r.get("ServiceMonitor", "loghost-compactor")
    matched = [
        s
        for s in services
        if selects(comp_sm["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])
    ]
    assert [s["metadata"]["name"] for s in matched] == ["loghost-compactor"]
    assert comp_sm["spec"]["endpoints"][0]["port"] == "metrics"
    # ...and that Service reaches the compactor pods, on a port they expose.
    workload = compactor_workload(r)
    assert selects(matched[0]["spec"]["selector"], pod_labels(workload))
    assert matched[0]["spec"]["ports"][0]["targetPort"] in {
        p["name"] for p in container(workload, "compactor")["ports"]
    }


def test_alert_rules_use_exported_metrics(chart):
    rule = render(chart, MONITORED_AUTOSCALED).get("PrometheusRule", "loghost")
    alerts = {}
    for group in rule["spec"]["groups"]:
        for item in group["rules"]:
            alerts[item["alert"]] = item
    for name in [
        "LoghostDirtyUntrackedCollections",
        "LoghostUncompactedTooOld",
        "LoghostBackpressure",
        "LoghostRollupSlow",
        "LoghostContention",
        "LoghostLeaderHintFailures",
        "LoghostCompactionStalled",
        "LoghostCompactorFailures",
        "LoghostHostsAbsent",
        "LoghostHostDown",
        "LoghostCompactorsAbsent",
        "LoghostCompactorDown",
        "LoghostRollupFailures",
        "LoghostGcFailures",
        "LoghostServerErrors",
        "LoghostAppendLatencySLO",
        "LoghostBufferedBytesNearLimit",
    ]:
        assert name in alerts, name
    # Nothing scrubs in the background, so an alert on scrub failures could never fire.
    assert "LoghostScrubFailures" not in alerts
    for name, item in alerts.items():
        expr = item["expr"]
        assert expr.count("(") == expr.count(")") and expr.count("{") == expr.count("}"), name
        used = set(
            re.findall(r"\b((?:loghost|compactor)_[a-z_]+?)(?:_bucket|_count|_sum)?\s*\{", expr)
        )
        assert used or re.search(r"\bup\{", expr), f"{name}: no metric selector in {expr!r}"
        assert used <= KNOWN_METRICS, f"{name}: unknown metrics {used - KNOWN_METRICS}"
        # scoped to this release's services, so two releases don't mix
        assert f'namespace="{NAMESPACE}"' in expr, name
        assert item["labels"]["severity"] in {"info", "warning", "critical"}
        assert "{{ $labels" not in expr
    assert "> 1800" in alerts["LoghostUncompactedTooOld"]["expr"]
    assert 'service="loghost-headless"' in alerts["LoghostGcFailures"]["expr"]
    assert 'service="loghost-compactor"' in alerts["LoghostCompactorFailures"]["expr"]
    # Prometheus' own templating survives Helm's.
    assert "{{ $labels.pod }}" in alerts["LoghostUncompactedTooOld"]["annotations"]["summary"]


# --- names & notes --------------------------------------------------------------


def test_long_release_names_stay_within_kubernetes_limits(chart):
    name = "a-very-long-release-name-for-the-log-host-service-x"  # 51 chars
    helm.validate_release_name(name)
    r = render(chart, FIVE_REPLICAS, name=name)
    assert len(r.kinds("StatefulSet")) == 2
    for sts in r.kinds("StatefulSet"):
        # controller-revision-hash label = name + "-" + 10 chars must fit in 63
        assert len(sts["metadata"]["name"]) <= 52
        validate_object(sts)
    hosts = [
        s
        for s in r.kinds("StatefulSet")
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == "host"
    ]
    (host,) = hosts
    urls = env_value(
        compactor_sts(r, host["metadata"]["name"]), "compactor", "COMPACTOR_HOSTS"
    ).split(",")
    assert urls == host_advertise_urls(r, host["metadata"]["name"])
    for url in urls:
        for label in url.split("//")[1].split(":")[0].split("."):
            assert len(label) <= 63
    deploy = compactor_deploy(render(chart, {}, name=name), host["metadata"]["name"])
    validate_object(deploy)
    # The selector the supervisor lists pods by is made of label values, each <= 63.
    assert all(len(v) <= 63 for v in deploy["spec"]["selector"]["matchLabels"].values())


def test_notes_tell_the_operator_how_to_reach_the_api(chart):
    notes = render(chart).notes
    assert "http://loghost.logs.svc.cluster.local:8080/v1" in notes
    assert "kubectl port-forward --namespace logs svc/loghost 8080:8080" in notes
    assert "loghost-api-keys" in notes and "loghost-s3" in notes
    lb = render(chart, MONITORED_AUTOSCALED).notes
    assert "kubectl get svc --namespace logs loghost" in lb


# --- the image the chart runs ---------------------------------------------------


def dockerfile() -> str:
    return (IMAGE_DIR / "Dockerfile").read_text()


def test_dockerfile_builds_the_image_the_chart_runs(chart):
    text = dockerfile()
    assert re.search(r"^ARG PYTHON_IMAGE=python:3\.11-slim", text, re.M)
    assert "openjdk-17-jre-headless" in text
    # From the repo root, with the extras both commands need (a bare install is the client).
    assert re.search(r"pip install '\.\[server,compactor\]'(\s|$)", text), text
    assert "JAVA_HOME=" in text
    # non-root, numeric, and the same uid the chart runs as
    users = re.findall(r"^USER (\S+)", text, re.M)
    assert users and users[-1].split(":")[0].isdigit()
    uid = int(users[-1].split(":")[0])
    assert uid != 0
    values = chart.values
    assert values["host"]["podSecurityContext"]["runAsUser"] == uid
    assert values["compactor"]["podSecurityContext"]["runAsUser"] == uid
    # the supervisor the chart invokes is on PATH under that name
    assert re.search(
        r"^COPY .*helm/image/compactor-supervisor\.py /usr/local/bin/compactor-supervisor$",
        text,
        re.M,
    )


def test_dockerfile_bakes_in_no_secrets():
    for line in dockerfile().splitlines():
        if re.match(r"^\s*(ENV|ARG)\b", line) or line.strip().startswith(
            ("PIP_", "PATH=", "JAVA_HOME=")
        ):
            assert not re.search(r"(AWS_|SECRET|PASSWORD|TOKEN|API_KEY|REDIS_URL)", line, re.I), (
                line
            )
    assert not re.search(r"^COPY .*\.(env|pem|key)\b", dockerfile(), re.M)


def test_dockerignore_lets_in_every_package_the_distribution_declares():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    includes = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    allowed = {
        line[1:].rstrip("/")
        for line in (IMAGE_DIR / "Dockerfile.dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    assert "pyproject.toml" in allowed
    for pattern in includes:
        package = pattern.rstrip("*")
        assert package in allowed, f"{package} is excluded from the build context"
    assert "helm/image/compactor-supervisor.py" in allowed
    assert (IMAGE_DIR / "compactor-supervisor.py").is_file()
    scripts = pyproject["project"]["scripts"]
    assert {"loghost", "compactor"} <= set(scripts)


def test_keep_alive_outlasts_a_load_balancer_idle_timeout(chart):
    # A server closing idle connections before the balancer does loses requests sent on them.
    assert int(env_value(host_sts(render(chart)), "loghost", "LOGHOST_KEEP_ALIVE_S")) > 60
    sts = host_sts(render(chart, {"host": {"config": {"keepAliveS": 400}}}))
    assert env_value(sts, "loghost", "LOGHOST_KEEP_ALIVE_S") == "400"


# --- issue 22: a required store URL --------------------------------------------------


def test_store_url_is_required(chart, tmp_path):
    # There is no default bucket: the schema refuses values without one...
    with pytest.raises(helm.HelmValuesError, match="url"):
        chart.validate_schema({})
    with pytest.raises(helm.HelmValuesError, match="url"):
        chart.render({}, name=RELEASE, namespace=NAMESPACE)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema({"store": {"url": ""}})
    assert helm.lint(str(CHART_DIR), {}, strict=True)["errors"], (
        "lint must refuse a missing store.url"
    )
    assert "url" not in yaml.safe_load((CHART_DIR / "values.yaml").read_text())["store"]
    # ...and for installs that skip the schema, every template fails with one clear message.
    copy_dir = tmp_path / "loghost"
    shutil.copytree(CHART_DIR, copy_dir)
    (copy_dir / "values.schema.json").unlink()
    with helm.Chart.load(str(copy_dir)) as loaded:
        for values in ({}, {"store": {"url": ""}}, {"compactor": {"enabled": False}}):
            with pytest.raises(
                helm.HelmRenderError,
                match=r"store\.url is required: the s3://bucket/prefix of a bucket you own",
            ):
                loaded.render(values, name=RELEASE, namespace=NAMESPACE)
        loaded.render({"store": {"url": STORE_URL}}, name=RELEASE, namespace=NAMESPACE)


def test_store_url_reaches_both_programs_and_the_notes(chart):
    r = render(chart, {"store": {"url": "s3://acme-wal/eu/prod"}})
    assert env_value(host_sts(r), "loghost", "LOGHOST_STORE") == "s3://acme-wal/eu/prod"
    assert (
        env_value(compactor_workload(r), "compactor", "COMPACTOR_STORE") == "s3://acme-wal/eu/prod"
    )
    # The notes name where the hosts keep their dirty logs (wal3.paths.dirty_prefix).
    assert f"{paths.DIRTY_PREFIX}<pod name>/ in s3://acme-wal/eu/prod" in r.notes


# --- issue 22: every server setting is a value -----------------------------------------

# Settings the chart sets itself (pod identity, listen address, store, keys file, Redis).
CHART_OWNED_SETTINGS = {
    "store",
    "listen",
    "server_id",
    "advertise_url",
    "redis_url",
    "api_keys",
    "api_keys_file",
    "dev",
}


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def _settings_fields() -> dict[str, Any]:
    from host.config import Settings

    return {n: f for n, f in Settings.model_fields.items() if n not in CHART_OWNED_SETTINGS}


def test_every_server_setting_is_a_value():
    """host.config has one key per tunable of host/config.py Settings, typed and bounded like it."""
    import annotated_types as at

    schema = json.loads((CHART_DIR / "values.schema.json").read_text())
    props = schema["properties"]["host"]["properties"]["config"]["properties"]
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["host"]["config"]
    fields = _settings_fields()
    assert len(fields) >= 27
    assert set(props) == {_camel(n) for n in fields} == set(values), set(props) ^ {
        _camel(n) for n in fields
    }
    for name, field in fields.items():
        prop = props[_camel(name)]
        if field.annotation is int:
            assert prop["type"] == ["integer", "null"], name
        elif field.annotation is float:
            assert prop["type"] == ["number", "null"], name
        bounds = {}
        for m in field.metadata:
            if isinstance(m, at.Ge):
                bounds["minimum"] = m.ge
            elif isinstance(m, at.Gt):
                bounds["exclusiveMinimum"] = m.gt
            elif isinstance(m, at.Le):
                bounds["maximum"] = m.le
        assert {
            k: prop[k] for k in ("minimum", "exclusiveMinimum", "maximum") if k in prop
        } == bounds, name


def _config_values() -> dict[str, Any]:
    """A non-default value for every setting, of its type, within its bounds."""
    out: dict[str, Any] = {}
    for name, field in _settings_fields().items():
        if field.annotation is int:
            out[_camel(name)] = (
                int(field.default) * 3 + 7 if name != "max_buffered_bytes" else 1 << 30
            )
        elif field.annotation is float:
            out[_camel(name)] = 0.5 if name == "gc_max_fraction" else float(field.default) + 2.5
        elif typing.get_origin(field.annotation) is typing.Literal:
            out[_camel(name)] = next(
                c for c in typing.get_args(field.annotation) if c != field.default
            )
        else:
            out[_camel(name)] = "DEBUG"
    return out


def test_settings_values_render_as_the_env_the_server_reads(chart, monkeypatch):
    from host.config import Settings

    config = _config_values()
    sts = host_sts(
        render(chart, {"host": {"config": config, "terminationGracePeriodSeconds": 200}})
    )
    env = {k: v["value"] for k, v in env_of(sts, "loghost").items() if "value" in v}
    for key in list(env):
        if not key.startswith("LOGHOST_"):
            env.pop(key)
    # Large whole numbers stay integers ("1073741824", never "1.073741824e+09").
    assert env["LOGHOST_MAX_BUFFERED_BYTES"] == str(1 << 30)
    assert env["LOGHOST_GC_MAX_FRACTION"] == "0.5"
    for key in list(os.environ):
        if key.startswith("LOGHOST_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        if key not in ("LOGHOST_ADVERTISE_URL", "LOGHOST_API_KEYS_FILE"):
            monkeypatch.setenv(key, value)
    monkeypatch.setenv("LOGHOST_SERVER_ID", "loghost-0")
    parsed = Settings()
    for name in _settings_fields():
        assert getattr(parsed, name) == config[_camel(name)], name
    assert parsed.store == STORE_URL and parsed.listen == "0.0.0.0:8080"


def test_null_settings_keep_the_server_defaults(chart):
    env = env_of(host_sts(render(chart)), "loghost")
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())["host"]["config"]
    for key, value in defaults.items():
        var = "LOGHOST_" + re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).upper()
        assert (var in env) == (value is not None), var
    assert env["LOGHOST_MAX_OPEN_LOGS"]["value"] == "1024"
    assert "LOGHOST_MAX_BUFFERED_BYTES" not in env


def test_settings_out_of_bounds_are_refused(chart):
    for bad in (
        {"gcMaxFraction": 1.5},
        {"maxBufferedBytes": 100},
        {"snapshotThreshold": 1},
        {"leaderTtlMs": 10},
        {"idleCloseS": 0},
        {"maxOpenLogs": "many"},
        {"maxOpenLog": 5},
    ):
        with pytest.raises(helm.HelmValuesError):
            chart.validate_schema(merge(BASE_VALUES, {"host": {"config": bad}}))


# --- issue 22: extension points ----------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_extra_volumes_env_init_containers_and_sidecars(chart, kind):
    """A TLS MinIO's CA bundle reaches both programs: volume, mount, AWS_CA_BUNDLE."""
    r = render(chart, merge(EXTENDED, WORKLOADS[kind]))
    for workload, cname, env_from in (
        (host_sts(r), "loghost", {"configMapRef": {"name": "loghost-extra"}}),
        (compactor_workload(r), "compactor", {"secretRef": {"name": "spark-extra"}}),
    ):
        pod = workload["spec"]["template"]["spec"]
        c = container(workload, cname)
        assert CA_BUNDLE_VOLUME in pod["volumes"]
        assert CA_BUNDLE_MOUNT in c["volumeMounts"]
        assert env_value(workload, cname, "AWS_CA_BUNDLE").startswith(
            CA_BUNDLE_MOUNT["mountPath"] + "/"
        )
        assert c["envFrom"] == [env_from]
        assert pod["initContainers"] == [INIT]
        assert [x["name"] for x in pod["containers"]] == [cname, "log-shipper"]
        # The chart's own volumes are still there.
        names = [v["name"] for v in pod["volumes"]]
        assert "tmp" in names and len(names) == len(set(names))
        validate_object(workload)
    # Nothing extra by default.
    r = render(chart, WORKLOADS[kind])
    for workload in (host_sts(r), compactor_workload(r)):
        pod = workload["spec"]["template"]["spec"]
        assert "initContainers" not in pod and len(pod["containers"]) == 1
        assert not pod["containers"][0].get("envFrom")


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_compactor_anti_affinity_is_preferred_by_default(chart, kind):
    r = render(chart, WORKLOADS[kind])
    workload = compactor_workload(r)
    term = workload["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    # It spreads compactors from each other, not from the hosts.
    assert selects(term["labelSelector"]["matchLabels"], pod_labels(workload))
    assert not selects(term["labelSelector"]["matchLabels"], pod_labels(host_sts(r)))
    hard = compactor_workload(
        render(chart, merge(WORKLOADS[kind], {"compactor": {"antiAffinity": "hard"}}))
    )
    assert hard["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    none = compactor_workload(
        render(chart, merge(WORKLOADS[kind], {"compactor": {"antiAffinity": "none"}}))
    )
    assert "affinity" not in none["spec"]["template"]["spec"]
    own = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["spark"]}]}
                ]
            }
        }
    }
    custom = compactor_workload(
        render(chart, merge(WORKLOADS[kind], {"compactor": {"affinity": own}}))
    )
    assert custom["spec"]["template"]["spec"]["affinity"] == own


def test_compactor_probes_watch_the_round_loop(chart):
    workload = compactor_workload(render(chart))
    c = container(workload, "compactor")
    heartbeat = env_value(workload, "compactor", "COMPACTOR_HEARTBEAT_FILE")
    for probe, period, threshold in (("livenessProbe", 30, 3), ("startupProbe", 10, 60)):
        assert c[probe]["exec"]["command"][:2] == ["python", "-c"]
        assert c[probe]["exec"]["command"][3:] == [heartbeat, "3600"]
        assert (c[probe]["periodSeconds"], c[probe]["failureThreshold"]) == (period, threshold)
    # A handler of your own replaces the check; null turns a probe off.
    mine = {"httpGet": {"path": "/metrics", "port": "metrics"}, "periodSeconds": 20}
    c = container(
        compactor_workload(
            render(chart, {"compactor": {"livenessProbe": mine, "startupProbe": None}})
        ),
        "compactor",
    )
    assert c["livenessProbe"]["httpGet"] == mine["httpGet"] and "exec" not in c["livenessProbe"]
    assert c["livenessProbe"]["periodSeconds"] == 20 and "startupProbe" not in c
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(
            merge(BASE_VALUES, {"compactor": {"heartbeat": {"maxAgeSeconds": 5}}})
        )


# --- issue 22: secrets as files, and pods that roll when a Secret changes ----------------


def test_s3_credentials_as_a_file(chart):
    r = render(
        chart, merge(S3_EXISTING_SECRET, {"store": {"s3": {"credentialsFile": {"enabled": True}}}})
    )
    for workload, cname in ((host_sts(r), "loghost"), (compactor_workload(r), "compactor")):
        env = env_of(workload, cname)
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)
        assert mounted_secret_file(workload, cname, "AWS_SHARED_CREDENTIALS_FILE") == (
            "acme-s3-credentials",
            "credentials",
        )
        assert env_value(workload, cname, "AWS_REGION") == "eu-central-1"
    # Ambient credentials (IRSA) mount nothing.
    irsa = render(chart, merge(IRSA, {"store": {"s3": {"credentialsFile": {"enabled": True}}}}))
    for workload in workloads(irsa):
        assert "AWS_SHARED_CREDENTIALS_FILE" not in {
            e["name"] for e in workload["spec"]["template"]["spec"]["containers"][0]["env"]
        }


def test_the_documented_credentials_file_format_is_what_the_aws_sdk_reads(tmp_path, monkeypatch):
    """The Secret entry helm/loghost/README.md describes, read the way both programs read it."""
    import botocore.session

    text = (CHART_DIR / "README.md").read_text()
    block = re.search(r"```ini\n(.*?)```", text, re.S)
    assert block, "README.md shows the credentials file"
    path = tmp_path / "credentials"
    path.write_text(block.group(1))
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(path))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    creds = botocore.session.Session().get_credentials()
    assert creds is not None and creds.method == "shared-credentials-file"
    assert creds.access_key and creds.secret_key


LOOKUP_SECRET = 'lookup "v1" "Secret" $root.Release.Namespace $name'
LOOKUP_STS = 'lookup "apps/v1" "StatefulSet" .Release.Namespace (include "loghost.host.name" .)'


@pytest.fixture()
def cluster_chart(tmp_path):
    """The chart with its two lookups answered from values (testLookup), as a cluster would."""
    copy_dir = tmp_path / "loghost"
    shutil.copytree(CHART_DIR, copy_dir)
    helpers = copy_dir / "templates" / "_helpers.tpl"
    text = helpers.read_text()
    assert text.count(LOOKUP_SECRET) == 1 and text.count(LOOKUP_STS) == 1
    text = text.replace(LOOKUP_SECRET, "get $root.Values.testLookup.secrets $name")
    text = text.replace(
        LOOKUP_STS, 'get .Values.testLookup.statefulsets (include "loghost.host.name" .)'
    )
    helpers.write_text(text)
    schema = json.loads((copy_dir / "values.schema.json").read_text())
    schema["properties"]["testLookup"] = {"type": "object"}
    (copy_dir / "values.schema.json").write_text(json.dumps(schema))
    with helm.Chart.load(str(copy_dir)) as loaded:
        yield loaded


def _secrets(**data: dict[str, str]) -> dict[str, Any]:
    import base64

    return {
        "testLookup": {
            "statefulsets": {},
            "secrets": {
                name: {
                    "data": {k: base64.b64encode(v.encode()).decode() for k, v in entries.items()}
                }
                for name, entries in data.items()
            },
        }
    }


def _checksums(chart, values: dict[str, Any]) -> tuple[str | None, str | None]:
    r = render(chart, values)
    return tuple(
        w["spec"]["template"]["metadata"]["annotations"].get("checksum/secrets")
        for w in (host_sts(r), compactor_workload(r))
    )


def test_pods_roll_when_a_secret_they_read_at_start_changes(cluster_chart):
    s3 = {"AWS_ACCESS_KEY_ID": "AKIA1", "AWS_SECRET_ACCESS_KEY": "s1"}
    keys = {"LOGHOST_API_KEYS": "k1=alice,svc=*", "COMPACTOR_API_KEY": "svc"}
    before = _checksums(cluster_chart, _secrets(**{"loghost-s3": s3, "loghost-api-keys": keys}))
    assert all(before) and before[0] != before[1]
    # New S3 credentials roll both.
    after = _checksums(
        cluster_chart,
        _secrets(**{"loghost-s3": {**s3, "AWS_SECRET_ACCESS_KEY": "s2"}, "loghost-api-keys": keys}),
    )
    assert after[0] != before[0] and after[1] != before[1]
    # A new compactor key rolls the compactors only.
    after = _checksums(
        cluster_chart,
        _secrets(**{"loghost-s3": s3, "loghost-api-keys": {**keys, "COMPACTOR_API_KEY": "svc2"}}),
    )
    assert after[0] == before[0] and after[1] != before[1]
    # The hosts' API keys are re-read by the running hosts: a change rolls nothing.
    after = _checksums(
        cluster_chart,
        _secrets(
            **{"loghost-s3": s3, "loghost-api-keys": {**keys, "LOGHOST_API_KEYS": "k2=bob,svc=*"}}
        ),
    )
    assert after == before
    # A Redis URL Secret rolls the hosts.
    redis = merge(
        EXTERNAL_REDIS,
        _secrets(
            **{"loghost-s3": s3, "loghost-api-keys": keys, "acme-redis": {"url": "redis://a"}}
        ),
    )
    other = merge(
        EXTERNAL_REDIS,
        _secrets(
            **{"loghost-s3": s3, "loghost-api-keys": keys, "acme-redis": {"url": "redis://b"}}
        ),
    )
    assert _checksums(cluster_chart, redis)[0] != _checksums(cluster_chart, other)[0]
    assert _checksums(cluster_chart, redis)[1] == _checksums(cluster_chart, other)[1]
    # Off: no annotation.
    assert _checksums(cluster_chart, merge(_secrets(), {"rollOnSecretChange": False})) == (
        None,
        None,
    )


def test_offline_rendering_has_a_stable_checksum(chart):
    assert _checksums(chart, {}) == _checksums(chart, {})


# --- issue 22: NetworkPolicy, Ingress, helm test -----------------------------------------


def test_network_policies_are_off_by_default(chart):
    assert not render(chart).kinds("NetworkPolicy")


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_network_policies(chart, kind):
    r = render(chart, merge(EXTENDED, WORKLOADS[kind]))
    host_np = r.get("NetworkPolicy", "loghost")
    comp_np = r.get("NetworkPolicy", "loghost-compactor")
    host_pod, comp_pod, test_pod = (
        pod_labels(host_sts(r)),
        pod_labels(compactor_workload(r)),
        r.get("Pod", "loghost-test-healthz")["metadata"]["labels"],
    )
    assert selects(host_np["spec"]["podSelector"]["matchLabels"], host_pod)
    assert not selects(host_np["spec"]["podSelector"]["matchLabels"], comp_pod)
    assert selects(comp_np["spec"]["podSelector"]["matchLabels"], comp_pod)
    (rule,) = host_np["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    peers = rule["from"]
    selectors = [p["podSelector"]["matchLabels"] for p in peers if "podSelector" in p]
    # The compactors, the hosts and the helm test pod reach the API; then the listed peers.
    for labels in (comp_pod, host_pod, test_pod):
        assert any(selects(sel, labels) for sel in selectors), labels
    assert PEER_INGRESS_NS in peers and PEER_MONITORING in peers
    (metrics_rule,) = comp_np["spec"]["ingress"]
    assert metrics_rule == {
        "ports": [{"port": "metrics", "protocol": "TCP"}],
        "from": [PEER_MONITORING],
    }
    for np in (host_np, comp_np):
        assert np["spec"]["policyTypes"] == ["Ingress", "Egress"]
        egress = np["spec"]["egress"]
        assert egress[0]["ports"] == [
            {"port": 53, "protocol": "UDP"},
            {"port": 53, "protocol": "TCP"},
        ]
        assert selects(egress[1]["to"][0]["podSelector"]["matchLabels"], comp_pod)
        assert selects(egress[1]["to"][0]["podSelector"]["matchLabels"], host_pod)
        assert egress[2] == EGRESS_S3
        validate_object(np)


def test_network_policies_open_by_default_peers(chart):
    r = render(chart, merge(EXTERNAL_SPARK, {"networkPolicy": {"enabled": True}}))
    host_np = r.get("NetworkPolicy", "loghost")
    assert host_np["spec"]["ingress"] == [
        {"ports": [{"port": "http", "protocol": "TCP"}]}
    ]  # any source
    assert host_np["spec"]["policyTypes"] == ["Ingress"] and "egress" not in host_np["spec"]
    comp = r.get("NetworkPolicy", "loghost-compactor")["spec"]["ingress"]
    # An external Spark cluster's executors call the driver back on ports Spark picks.
    assert comp == [{"ports": [{"port": "metrics", "protocol": "TCP"}]}, {}]
    only = render(
        chart,
        merge(
            EXTERNAL_SPARK,
            {"networkPolicy": {"enabled": True, "sparkExecutorsFrom": [PEER_INGRESS_NS]}},
        ),
    )
    assert only.get("NetworkPolicy", "loghost-compactor")["spec"]["ingress"][1] == {
        "from": [PEER_INGRESS_NS]
    }
    local = render(chart, {"networkPolicy": {"enabled": True}, "compactor": {"enabled": True}})
    assert len(local.get("NetworkPolicy", "loghost-compactor")["spec"]["ingress"]) == 1
    assert not render(
        chart, {"networkPolicy": {"enabled": True}, "compactor": {"enabled": False}}
    ).has("NetworkPolicy", "loghost-compactor")


def test_ingress_routes_to_the_client_service(chart):
    assert not render(chart).kinds("Ingress")
    r = render(chart, EXTENDED)
    ing = r.get("Ingress", "loghost")
    assert ing["spec"]["ingressClassName"] == "nginx"
    assert ing["metadata"]["annotations"]["nginx.ingress.kubernetes.io/proxy-body-size"] == "16m"
    (rule,) = ing["spec"]["rules"]
    assert rule["host"] == "logs.example.com"
    (path,) = rule["http"]["paths"]
    assert path["path"] == "/v1" and path["pathType"] == "Prefix"
    client = r.get("Service", path["backend"]["service"]["name"])
    assert client["metadata"]["labels"]["loghost/service"] == "client"
    assert path["backend"]["service"]["port"]["name"] in {
        p["name"] for p in client["spec"]["ports"]
    }
    assert ing["spec"]["tls"] == [{"secretName": "logs-example-tls", "hosts": ["logs.example.com"]}]
    validate_object(ing)
    with pytest.raises(helm.HelmValuesError):
        chart.validate_schema(merge(BASE_VALUES, {"ingress": {"enabled": True, "hosts": []}}))


def _test_pod(r: Rendered) -> dict[str, Any]:
    pod = r.get("Pod", "loghost-test-healthz")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "hook-succeeded" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    assert pod["spec"]["restartPolicy"] == "Never"
    return pod


def test_helm_test_pod_gets_healthz_through_the_client_service(chart):
    r = render(chart, {"service": {"port": 9000}})
    pod = _test_pod(r)
    (c,) = pod["spec"]["containers"]
    url = {e["name"]: e["value"] for e in c["env"]}["LOGHOST_URL"]
    client = r.get("Service", "loghost")
    assert (
        url
        == f"http://loghost.{NAMESPACE}.svc.cluster.local:{client['spec']['ports'][0]['port']}/healthz"
    )
    assert c["image"] == container(host_sts(r), "loghost")["image"]
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    validate_object(pod)
    assert "helm test loghost --namespace logs" in r.notes
    off = render(chart, {"tests": {"enabled": False}})
    assert not off.has("Pod", "loghost-test-healthz") and "helm test" not in off.notes


async def test_helm_test_command_passes_against_a_live_host_and_fails_without_one(chart, tmp_path):
    """The rendered command, run as rendered (with this interpreter), with the Service URL
    pointed at a real host on 127.0.0.1."""
    import asyncio
    import sys

    from tests.host.live import live_server
    from verify.testkit import free_port

    (c,) = _test_pod(render(chart))["spec"]["containers"]
    assert c["command"][0] == "python"
    command = [sys.executable, *c["command"][1:]]

    async def run(url: str) -> tuple[int, str]:
        proc = await asyncio.create_subprocess_exec(
            *command,
            env={"LOGHOST_URL": url, "PATH": "/usr/bin:/bin"},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        return proc.returncode, out.decode()

    async with live_server(str(tmp_path / "store")) as live:
        code, out = await run(f"{live.url}/healthz")
        assert code == 0, out
        assert f"served by {live.settings.server_id}" in out
        code, out = await run(f"{live.url}/nothing-here")
        assert code == 1 and "404" in out
    code, out = await run(f"http://127.0.0.1:{free_port()}/healthz")
    assert code == 1 and "/healthz" in out


# --- issue 22: NOTES on a scale-in -----------------------------------------------------------


def test_notes_on_install_and_on_an_upgrade_without_a_cluster(chart):
    install = render(chart, is_install=True)
    assert "Before scaling the hosts IN" in install.notes and "/v1/dirty/adopt" not in install.notes
    # Offline (helm template, --dry-run=client) the previous replica count cannot be read: an
    # upgrade prints the adopt command for the pods it may have removed.
    upgrade = render(chart, {"host": {"replicas": 2}}, is_upgrade=True)
    assert "If this upgrade lowered host.replicas" in upgrade.notes
    assert (
        'curl -s -X POST -H "Authorization: Bearer $SERVICE_KEY" -d \'{"server_id": "loghost-<i>"}\' '
        "http://loghost-0.loghost-headless.logs.svc.cluster.local:8080/v1/dirty/adopt"
    ) in upgrade.notes
    assert "(loghost-2 and up)" in upgrade.notes


def test_notes_print_the_exact_adopt_commands_on_a_scale_in(cluster_chart):
    def notes(replicas_before: int | None, replicas: int, upgrade: bool = True) -> str:
        live = {
            "testLookup": {
                "secrets": {},
                "statefulsets": (
                    {"loghost": {"spec": {"replicas": replicas_before}}} if replicas_before else {}
                ),
            }
        }
        return render(
            cluster_chart,
            merge(live, {"host": {"replicas": replicas}}),
            **({"is_upgrade": True} if upgrade else {"is_install": True}),
        ).notes

    text = notes(5, 3)
    assert "scales the hosts IN from 5 to 3 pods" in text
    assert "loghost-3 loghost-4 stay in the store" in text
    for gone in ("loghost-3", "loghost-4"):
        assert (
            f'curl -s -X POST -H "Authorization: Bearer $SERVICE_KEY" -d \'{{"server_id": "{gone}"}}\' '
            "http://loghost-0.loghost-headless.logs.svc.cluster.local:8080/v1/dirty/adopt"
        ) in text
    assert '"server_id": "loghost-2"' not in text
    assert "kubectl port-forward --namespace logs pod/loghost-0 8080:8080" in text
    # Scaling out, keeping the count, or a first install: no warning, no command.
    for before, after, upgrade in ((3, 5, True), (3, 3, True), (None, 3, False)):
        text = notes(before, after, upgrade)
        assert "scales the hosts IN" not in text and "/v1/dirty/adopt" not in text, (before, after)
