"""The automatic rebalance on scale-up (SLUICE_AUTO_REBALANCE_ON_SCALE_UP, the chart's rebalance.autoOnScaleUp).

Real API server, brokers and operator (tests/k8s/sluice_on_k8s.py), the operator with the setting
on. Brokers 0 and 1 hold a topic; broker 2 joins empty (its Pod turns Ready, as a StatefulSet
scale-up makes it): the operator creates ``auto-add-brokers-2`` by itself, auto-approved, and the
new broker gets its share without anyone applying or approving anything. A second Pod event
makes no second rebalance. Then one at a time: broker 3 joins while a throttled drain of broker 2
runs, and waits; when the drain is stopped, broker 3 gets ``auto-add-brokers-3``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin, Producer
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SluiceOnK8s, wait_for

TOPIC = "grows"
CONFIG = {"offsets.topic.replication.factor": "2", "transaction.state.log.replication.factor": "2"}


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    namespace = k8s.create_namespace("sluice-autorebalance")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-autorebalance"), brokers=4)
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
        lambda: sluice.rebalance_in_state("auto-add-brokers-2", "Ready"), 120, "the automatic rebalance done",
        logs=sluice.logs,
    )  # fmt: skip
    assert obj["spec"] == {"mode": "add-brokers", "brokers": [2], "autoApprove": True, "maxPartitionsInFlight": 10}
    assert obj["status"]["progress"]["done"] == obj["status"]["progress"]["total"] > 0
    doc = sluice.topic_doc(TOPIC) or {}
    assert Counter(b for p in doc["partitions"] for b in p["replicas"]) == {0: 4, 1: 4, 2: 4}
    sluice.set_ready(2, True)  # another event of the new broker's Pod: no second rebalance
    assert [r["metadata"]["name"] for r in rebalances(sluice)] == ["auto-add-brokers-2"]


def test_a_broker_that_joins_while_a_rebalance_runs_gets_its_own_when_that_one_ends(sluice: SluiceOnK8s) -> None:
    # Data, and a drain of broker 2 throttled to 1 KiB/s: its moves stay in flight for minutes.
    with Producer(",".join(sluice.address(i) for i in (0, 1, 2)), acks="all") as producer:
        for i in range(300):
            producer.send(TOPIC, value=bytes(2048), partition=i % 6)
        producer.flush()
    drain = {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "SluiceRebalance",
        "metadata": {"name": "drain-2"},
        "spec": {"mode": "remove-brokers", "brokers": [2], "autoApprove": True, "throttleBytesPerSecond": 1024},
    }
    sluice.apply(drain)
    wait_for(lambda: sluice.rebalance_in_state("drain-2", "Rebalancing"), 60, "the drain running", logs=sluice.logs)

    sluice.create_pod(3)
    sluice.start_broker(3, CONFIG)
    sluice.wait_serving(3)
    sluice.set_ready(3, True)
    assert sluice.operator is not None
    operator = sluice.operator
    wait_for(
        lambda: "joined empty: their rebalance waits for SluiceRebalance drain-2" in operator.log_tail(400),
        60,
        "the operator seeing broker 3 and deferring",
        logs=sluice.logs,
    )
    assert sorted(r["metadata"]["name"] for r in rebalances(sluice)) == ["auto-add-brokers-2", "drain-2"]
    assert sluice.get("sluicerebalances", "drain-2")["status"]["state"] == "Rebalancing"  # still: the wait was real

    sluice.k8s.kubectl("annotate", "-n", sluice.namespace, "sluicerebalance", "drain-2", "sluice.dev/rebalance=stop")
    obj = wait_for(
        lambda: sluice.rebalance_in_state("auto-add-brokers-3", "Ready"), 120,
        "broker 3's rebalance, created when the drain ended, done", logs=sluice.logs,
    )  # fmt: skip
    assert sluice.get("sluicerebalances", "drain-2")["status"]["state"] == "Stopped"
    assert obj["spec"]["brokers"] == [3]  # broker 2 is being drained: not "joined empty"
    doc = sluice.topic_doc(TOPIC) or {}
    assert Counter(b for p in doc["partitions"] for b in p["replicas"])[3] > 0
