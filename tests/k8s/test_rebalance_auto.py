"""The automatic rebalance on scale-up (SLUICE_AUTO_REBALANCE_ON_SCALE_UP, the chart's rebalance.autoOnScaleUp).

Real API server, brokers and operator (tests/k8s/sluice_on_k8s.py), the operator with the setting
on. Brokers 0 and 1 hold a topic; broker 2 joins empty (its Pod turns Ready, as a StatefulSet
scale-up makes it): the operator creates ``auto-add-brokers-2`` by itself, auto-approved, and the
new broker gets its share without anyone applying or approving anything. A second Pod event
makes no second rebalance.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SluiceOnK8s, wait_for

TOPIC = "grows"
CONFIG = {"offsets.topic.replication.factor": "2", "transaction.state.log.replication.factor": "2"}


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    namespace = k8s.create_namespace("sluice-autorebalance")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-autorebalance"))
    cluster.env["SLUICE_AUTO_REBALANCE_ON_SCALE_UP"] = "true"
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        for i in (0, 1):
            cluster.create_pod(i)
            cluster.start_broker(i, CONFIG)
        for i in (0, 1):
            cluster.wait_serving(i)
            cluster.set_ready(i, True)
        cluster.start_operator()
        yield cluster
    finally:
        cluster.close()


def rebalances(sluice: SluiceOnK8s) -> list[dict[str, Any]]:
    found = sluice.custom.list_namespaced_custom_object("sluice.dev", "v1alpha1", sluice.namespace, "sluicerebalances")
    return list(found["items"])


def test_a_broker_that_joins_empty_gets_its_share_without_anyone_asking(sluice: SluiceOnK8s) -> None:
    with Admin(",".join(sluice.address(i) for i in (0, 1))) as admin:
        admin.create_topic(TOPIC, 6, 2)
    wait_for(lambda: len(sluice.leaders(TOPIC)) == 6, 30, "the topic", logs=sluice.logs)
    # Brokers 0 and 1 are not "joined empty" (they hold the topic): no rebalance for them.
    sluice.set_ready(0, True)
    assert rebalances(sluice) == []

    sluice.create_pod(2)
    sluice.start_broker(2, CONFIG)
    sluice.wait_serving(2)
    sluice.set_ready(2, True)
    obj = wait_for(
        lambda: (
            (o := sluice.get("sluicerebalances", "auto-add-brokers-2")) and o["status"].get("state") == "Ready" and o
        ),
        120,
        "the automatic rebalance done",
        logs=sluice.logs,
    )
    assert obj["spec"] == {"mode": "add-brokers", "brokers": [2], "autoApprove": True, "maxPartitionsInFlight": 10}
    assert obj["status"]["progress"]["done"] == obj["status"]["progress"]["total"] > 0
    doc = sluice.topic_doc(TOPIC) or {}
    assert Counter(b for p in doc["partitions"] for b in p["replicas"]) == {0: 4, 1: 4, 2: 4}
    sluice.set_ready(2, True)  # another event of the new broker's Pod: no second rebalance
    assert [r["metadata"]["name"] for r in rebalances(sluice)] == ["auto-add-brokers-2"]
