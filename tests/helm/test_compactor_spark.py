"""The compactor chart's Spark settings (issue 15): an external standalone or Kubernetes master,
or a Spark Connect endpoint, and how executors sign S3 requests."""

from __future__ import annotations

from typing import Any

import pytest

from .test_chart import (
    WORKLOADS,
    compactor_workload,
    env_of,
    helm,
    merge,
    render,
)

CONNECT = {"compactor": {"spark": {"remote": "sc://spark-connect.spark.svc.cluster.local:15002"}}}
K8S = {
    "compactor": {
        "spark": {
            "master": "k8s://https://kubernetes.default.svc:443",
            "conf": {"spark.kubernetes.container.image": "registry.local/loghost:1"},
        }
    }
}


def objects(r: Any, kind: str) -> list[dict[str, Any]]:
    return [o for o in r.objects if o["kind"] == kind]


@pytest.mark.parametrize("kind", sorted(WORKLOADS))
def test_a_spark_connect_endpoint_replaces_the_master(chart: Any, kind: str) -> None:
    r = render(chart, merge(CONNECT, WORKLOADS[kind]))
    env = env_of(compactor_workload(r), "compactor")
    assert (
        env["COMPACTOR_SPARK_REMOTE"]["value"] == "sc://spark-connect.spark.svc.cluster.local:15002"
    )
    assert "COMPACTOR_SPARK_MASTER" not in env
    # A client only: it binds loopback, as in local mode (nothing connects back to it).
    assert env["SPARK_LOCAL_IP"]["value"] == "127.0.0.1"
    assert "Spark Connect sc://spark-connect" in r.notes


def test_a_kubernetes_master_is_accepted_and_executors_call_back_by_pod_ip(chart: Any) -> None:
    env = env_of(compactor_workload(render(chart, K8S)), "compactor")
    assert env["COMPACTOR_SPARK_MASTER"]["value"] == "k8s://https://kubernetes.default.svc:443"
    submit = env["PYSPARK_SUBMIT_ARGS"]["value"]
    assert "--conf spark.driver.host=$(POD_IP)" in submit
    assert "--conf spark.kubernetes.container.image=registry.local/loghost:1" in submit


def test_s3_credentials_mode_and_level_ratio_reach_the_compactor(chart: Any) -> None:
    env = env_of(compactor_workload(render(chart)), "compactor")
    assert env["COMPACTOR_S3_CREDENTIALS"]["value"] == "driver"
    assert "COMPACTOR_LEVEL_RATIO" not in env
    values = {"compactor": {"levelRatio": 8, "spark": {"s3Credentials": "executor"}}}
    env = env_of(compactor_workload(render(chart, values)), "compactor")
    assert env["COMPACTOR_S3_CREDENTIALS"]["value"] == "executor"
    assert env["COMPACTOR_LEVEL_RATIO"]["value"] == "8"


def test_connect_needs_no_ingress_for_executors(chart: Any) -> None:
    values = merge(CONNECT, {"networkPolicy": {"enabled": True}})
    policies = objects(render(chart, values), "NetworkPolicy")
    compactor = [p for p in policies if "compactor" in p["metadata"]["name"]]
    assert compactor
    for p in compactor:
        for rule in p["spec"].get("ingress") or []:
            # Only the metrics port is open: no any-port rule for executors calling back.
            assert rule.get("ports"), rule


@pytest.mark.parametrize(
    "values",
    [
        {"compactor": {"spark": {"remote": "http://spark:15002"}}},
        {"compactor": {"spark": {"master": "k8s://kubernetes"}}},
        {"compactor": {"spark": {"s3Credentials": "both"}}},
        {"compactor": {"levelRatio": 1}},
    ],
)
def test_bad_spark_settings_are_refused(chart: Any, values: dict[str, Any]) -> None:
    with pytest.raises(helm.HelmValuesError):
        render(chart, values)
