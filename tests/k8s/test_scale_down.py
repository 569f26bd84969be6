"""A StatefulSet scaled down: the broker it removed is unregistered once it holds nothing.

Real API server, brokers and operator (tests/k8s/sluice_on_k8s.py); the operator reads the broker
StatefulSet's replicas as the chart configures it (``SLUICE_BROKER_STATEFULSET``). No
kube-controller-manager runs here, so the StatefulSet is the object the operator reads and the
test does what its controller would: it deletes the Pod of the ordinal scaled away (after its
broker stopped). Broker 2 is scaled away first while it still holds replicas: it stays registered
(its partitions still name it) and the operator says why. Once a ``remove-brokers`` rebalance has
moved them, its registration goes: the cluster's size, the controller's dead brokers and the
operator's health checks no longer count it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata import keys
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SELECTOR, SluiceOnK8s, wait_for

V1 = "sluice.dev/v1alpha1"
TOPIC = "shrinks"
STATEFULSET = "sluice-broker"
# Internal topics of two replicas, so that broker 2 can be drained of everything.
CONFIG = {"offsets.topic.replication.factor": "2", "transaction.state.log.replication.factor": "2"}


def statefulset(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": STATEFULSET},
        "spec": {
            "replicas": replicas,
            "serviceName": "sluice-broker",
            "selector": {"matchLabels": dict(SELECTOR)},
            "template": {
                "metadata": {"labels": dict(SELECTOR)},
                "spec": {"containers": [{"name": "broker", "image": "sluice:test"}]},
            },
        },
    }


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    namespace = k8s.create_namespace("sluice-scale-down")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-scale-down"))
    cluster.env["SLUICE_BROKER_STATEFULSET"] = STATEFULSET
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        cluster.apply(statefulset(3))
        cluster.start(CONFIG)
        cluster.start_operator("--brokers", "0")  # the size from the StatefulSet, as the chart runs it
        yield cluster
    finally:
        cluster.close()


def registered(sluice: SluiceOnK8s) -> list[int]:
    return sorted(int(d.key[len(keys.BROKERS) :]) for d in sluice.store.list(keys.BROKERS) if d.value is not None)


def events(sluice: SluiceOnK8s, reason: str) -> list[dict[str, Any]]:
    return [e for e in sluice.events() if e.get("reason") == reason and e["involvedObject"]["kind"] == "StatefulSet"]


def dead_brokers(sluice: SluiceOnK8s) -> list[int] | None:
    doc = sluice.store.get(keys.CONTROLLER)
    return None if doc is None or doc.value is None else list(doc.value["dead_brokers"])


def cluster_size(sluice: SluiceOnK8s) -> str:
    return str(sluice.core.read_namespaced_config_map("sluice-cluster", sluice.namespace).data["brokers"])


def test_a_broker_scaled_away_is_unregistered_once_it_holds_no_replica(sluice: SluiceOnK8s) -> None:
    admin = Admin(sluice.bootstrap_servers)
    admin.create_topic(TOPIC, partitions=6, replication_factor=2)
    producer = Producer(sluice.bootstrap_servers, acks="all")
    for i in range(30):
        producer.send(TOPIC, value=f"r{i}".encode(), partition=i % 6)
    producer.flush(timeout=60)
    producer.close()
    wait_for(lambda: cluster_size(sluice) == "3", 30, "the cluster's size published", logs=sluice.logs)

    # scaled down without draining first: broker 2 stops and its Pod goes, its replicas stay
    sluice.apply(statefulset(2))
    sluice.kill(2)
    sluice.delete_pod(2)
    warned = wait_for(lambda: events(sluice, "BrokerHoldsReplicas"), 60, "the warning", logs=sluice.logs)
    assert "broker 2 was scaled away" in warned[0]["message"] and warned[0]["type"] == "Warning"
    wait_for(lambda: dead_brokers(sluice) == [2], 30, "broker 2 dead", logs=sluice.logs)
    assert registered(sluice) == [0, 1, 2], "unregistered while its partitions still name it"

    # the drain moves its replicas to the brokers left; then its registration goes
    sluice.apply(
        {"apiVersion": V1, "kind": "SluiceRebalance", "metadata": {"name": "drain"},
         "spec": {"mode": "remove-brokers", "brokers": [2], "autoApprove": True}}
    )  # fmt: skip
    wait_for(lambda: registered(sluice) == [0, 1], 180, "broker 2 unregistered", logs=sluice.logs)
    done = wait_for(lambda: events(sluice, "BrokerUnregistered"), 30, "the event", logs=sluice.logs)
    assert "broker 2 was scaled away" in done[0]["message"] and "holds nothing" in done[0]["message"]
    assert sluice.store.get(keys.isr_requests(2)) is None
    wait_for(lambda: cluster_size(sluice) == "2", 30, "the cluster's size without broker 2", logs=sluice.logs)

    wait_for(lambda: dead_brokers(sluice) == [], 30, "the controller no longer lists broker 2 dead", logs=sluice.logs)
    described = admin.describe_topic(TOPIC)
    assert all(2 not in p.replicas for p in described.partitions)
    # the data is all there, on the brokers left
    seen: list[bytes] = []
    consumer = Consumer(",".join(sluice.address(i) for i in (0, 1)), group_id=None)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(6)])
    consumer.seek_to_beginning()
    deadline = time.monotonic() + 60
    while len(seen) < 30 and time.monotonic() < deadline:
        seen.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
    consumer.close()
    admin.close()
    assert sorted(seen) == sorted(f"r{i}".encode() for i in range(30))
