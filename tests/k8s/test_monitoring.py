"""The chart's monitoring: PodMonitor/ServiceMonitor, PrometheusRule, Grafana dashboard (issue 14, item 4).

* The objects render as the values ask (all off by default), and the ones the test control plane
  knows (the dashboard ConfigMap, the operator's metrics Service, the Deployment with its metrics
  port) are accepted by a real API server. The Prometheus Operator's kinds are checked by shape:
  their CRDs are not part of the test control plane.
* promtool's checks of the rules are in test_promtool.py.
* Every metric name the rules and the dashboard use is exported by a live 3-broker LocalCluster
  or its controller (the operator's metrics), scraped while a transaction is open and a consumer
  group has committed offsets.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.operator.main import parse_args as parse_operator_args
from sluice.testing import LocalCluster, scrape
from tests.support.k8s_env import KubeCluster

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sluice"
DASHBOARD = CHART / "dashboards" / "sluice.json"
ALL_ON = [
    "--set", "monitoring.podMonitor.enabled=true",
    "--set", "monitoring.serviceMonitor.enabled=true",
    "--set", "monitoring.prometheusRule.enabled=true",
    "--set", "monitoring.grafanaDashboard.enabled=true",
]  # fmt: skip
ALERTS = {
    "SluiceUnderReplicatedPartitions",
    "SluiceUnderMinIsrPartitions",
    "SluiceOfflinePartitions",
    "SluiceTransactionPastTimeout",
    "SluiceLastStableOffsetLagGrowing",
    "SluiceConsumerGroupLagGrowing",
    "SluiceDataVolumeAlmostFull",
    "SluiceRocksDBWriteStopped",
    "SluiceCoordinatorLoadFailing",
    "SluiceOperatorReconcileErrors",
}
METRIC = re.compile(r"\b((?:kafka|sluice|process)_[a-z0-9_]+)")


def render(k8s: KubeCluster, *args: str, namespace: str = "prod") -> list[dict[str, Any]]:
    out = k8s.helm("template", "sluice", str(CHART), "--namespace", namespace, *args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def of_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def rule_groups(k8s: KubeCluster, *args: str) -> dict[str, Any]:
    (rule,) = of_kind(render(k8s, *ALL_ON, *args), "PrometheusRule")
    return {"groups": rule["spec"]["groups"]}


def dashboard_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    return exprs


# -- rendering ---------------------------------------------------------------------------------------


def test_monitoring_is_off_by_default_and_renders_when_asked(k8s: KubeCluster, k8s_namespace: str) -> None:
    default = render(k8s)
    assert not [d for d in default if d["kind"] in ("PodMonitor", "ServiceMonitor", "PrometheusRule")]
    assert not [d for d in of_kind(default, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    # the operator serves its metrics by default, on a port named like the brokers'
    (deployment,) = of_kind(default, "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "metrics", "containerPort": 9403, "protocol": "TCP"} in container["ports"]
    listen = [a for a in container["args"] if a.startswith("--metrics-listen=")]
    assert listen == ["--metrics-listen=0.0.0.0:9403"]
    assert parse_operator_args(container["args"][1:]).metrics_listen == "0.0.0.0:9403"
    for switch in ("monitoring.operator.enabled=false", "broker.metrics.enabled=false"):
        (deployment_off,) = of_kind(render(k8s, "--set", switch), "Deployment")
        args_off = deployment_off["spec"]["template"]["spec"]["containers"][0]["args"]
        assert not any(a.startswith("--metrics-listen") for a in args_off), switch
    # its own switch wins over the brokers'
    (deployment_on,) = of_kind(
        render(k8s, "--set", "broker.metrics.enabled=false", "--set", "monitoring.operator.enabled=true"), "Deployment"
    )
    assert "--metrics-listen=0.0.0.0:9403" in deployment_on["spec"]["template"]["spec"]["containers"][0]["args"]

    docs = render(k8s, *ALL_ON, "--set", "monitoring.podMonitor.labels.release=kps", namespace=k8s_namespace)
    (pod_monitor,) = of_kind(docs, "PodMonitor")
    assert pod_monitor["metadata"]["labels"]["release"] == "kps"
    assert pod_monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert pod_monitor["spec"]["selector"]["matchExpressions"][0]["values"] == ["broker", "operator"]
    (service_monitor,) = of_kind(docs, "ServiceMonitor")
    assert service_monitor["spec"]["endpoints"][0]["port"] == "metrics"
    # each target is scraped once: the only Services with a "metrics" port are the headless broker
    # Service and the operator's metrics Service
    with_metrics = [s["metadata"]["name"] for s in of_kind(docs, "Service")
                    if any(p["name"] == "metrics" for p in s["spec"]["ports"])]  # fmt: skip
    assert sorted(with_metrics) == ["sluice-broker-headless", "sluice-operator-metrics"]
    (rule,) = of_kind(docs, "PrometheusRule")
    alerts = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts == ALERTS
    for g in rule["spec"]["groups"]:
        for r in g["rules"]:
            assert f'namespace="{k8s_namespace}"' in r["expr"], r  # the release's series only
            assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["description"]
    (dashboard,) = [d for d in of_kind(docs, "ConfigMap") if d["metadata"]["name"] == "sluice-dashboard"]
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    dash = json.loads(dashboard["data"]["sluice.json"])
    assert dash == json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in dash["panels"] if p["type"] == "row"]
    assert rows[:4] == ["Overview", "Topics", "Transactions", "Consumer groups"]
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])

    # what the test control plane knows is accepted by it
    known = [d for d in docs if d["kind"] in ("ConfigMap", "Service") and d["metadata"]["name"] in
             ("sluice-dashboard", "sluice-operator-metrics")]  # fmt: skip
    known += of_kind(docs, "Deployment")
    assert len(known) == 3
    k8s.kubectl("apply", "-n", k8s_namespace, "-f", "-", input=yaml.safe_dump_all(known))
    found = k8s.kubectl_json("get", "configmap", "sluice-dashboard", "-n", k8s_namespace)
    assert found["metadata"]["labels"]["grafana_dashboard"]  # type: ignore[index] == "1"


# -- the names against a live cluster ----------------------------------------------------------------


def test_every_metric_in_rules_and_dashboard_is_exported(k8s: KubeCluster, tmp_path: Path) -> None:
    used: set[str] = set()
    for group in rule_groups(k8s)["groups"]:
        for rule in group["rules"]:
            used.update(METRIC.findall(rule["expr"]))
    for expr in dashboard_exprs():
        used.update(METRIC.findall(expr))
    assert len(used) > 30, sorted(used)

    config = {"offsets.topic.num.partitions": 3, "transaction.state.log.num.partitions": 3}
    with LocalCluster(brokers=3, data_dir=tmp_path / "cluster", config=config) as cluster:
        topic = "monitored"
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(topic, partitions=3, replication_factor=3)
        # an open transaction (LSO lag, open transactions)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id="monitored-tx", linger_ms=0)
        producer.init_transactions()
        producer.begin_transaction()
        for i in range(6):
            producer.send(topic, value=b"x", partition=i % 3)
        producer.flush()
        # a group with committed offsets (lag) and a member (kept until the scrapes are done)
        consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id="monitored-group")
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(consumer.assignment()) < 3 and time.monotonic() < deadline:
            consumer.poll(timeout=0.5)
        consumer.commit({TopicPartition(topic, p): 0 for p in range(3)})

        exported: set[str] = set()
        missing: list[str] = sorted(used)
        deadline = time.monotonic() + 60
        while missing and time.monotonic() < deadline:
            exported = set().union(*(scrape(cluster.metrics_url(i)).names() for i in range(3)))
            exported |= scrape(cluster.controller_metrics_url()).names()
            missing = sorted(used - exported)
            if missing:
                time.sleep(1)
        consumer.close()
        producer.abort_transaction()
        producer.close()
        admin.close()
    assert not missing, f"used in rules or dashboard but exported by no broker nor the operator: {missing}"


@pytest.mark.parametrize("expr", dashboard_exprs())
def test_dashboard_queries_select_the_release_namespace(expr: str) -> None:
    assert 'namespace="$namespace"' in expr or expr.startswith("label_values(kafka_server_replicamanager"), expr
