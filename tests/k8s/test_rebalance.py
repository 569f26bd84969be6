"""SluiceRebalance against a real API server, real brokers and the real operator (tests/k8s/sluice_on_k8s.py).

The cluster grows as a platform team's does: brokers 0 and 1 hold a topic with data, broker 2
joins and holds nothing. An ``add-brokers`` rebalance proposes its share, with the bytes to copy
as the brokers report them (the operator asks them over gRPC), moves nothing until it is approved
with the annotation, then moves partitions to it; the records are all still there, and broker 2
serves some. Then a ``remove-brokers`` rebalance of broker 2 (invalid specs first: they are
refused and move nothing) drains it again and reports ReadyToScaleDown. A rebalance with
``throttleBytesPerSecond`` holds the cluster's replication_throttle document while it runs and
only then.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata import keys
from sluice.metadata.topic_view import TopicView
from sluice.records import now_ms
from sluice.testing import Scrape, free_port, scrape
from tests.support.k8s_env import KubeCluster

from .crds import install_crds
from .sluice_on_k8s import SluiceOnK8s, wait_for

V1 = "sluice.dev/v1alpha1"
TOPIC = "orders"
PARTITIONS, RF, RECORDS = 6, 2, 120
# Internal topics of two replicas, so that broker 2 can be drained of everything.
METRICS_PORT = free_port("127.0.0.1")
METRICS = f"http://127.0.0.1:{METRICS_PORT}/metrics"
CONFIG = {"offsets.topic.replication.factor": "2", "transaction.state.log.replication.factor": "2"}


THROTTLE = 1024 * 1024  # the data is small: the throttle is checked for its document, not its speed


def throttle_document(sluice: SluiceOnK8s) -> dict[str, Any] | None:
    """The replication_throttle document (without its timestamp), None when there is none."""
    doc = sluice.store.get(keys.REPLICATION_THROTTLE)
    return None if doc is None or doc.value is None else {k: v for k, v in doc.value.items() if k != "updated_ms"}


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return dict(c)
    return {}


def rebalance(name: str, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"annotations": annotations} if annotations else {})}
    return {"apiVersion": V1, "kind": "SluiceRebalance", "metadata": meta, "spec": spec}


def replicas_per_broker(sluice: SluiceOnK8s) -> Counter[int]:
    doc = sluice.topic_doc(TOPIC) or {}
    return Counter(b for p in doc.get("partitions", []) for b in p["replicas"])


def reassigning(sluice: SluiceOnK8s) -> bool:
    doc = sluice.topic_doc(TOPIC) or {}
    return any(p.get("adding_replicas") or p.get("removing_replicas") for p in doc.get("partitions", []))


def all_replicas_per_broker(sluice: SluiceOnK8s) -> dict[int, int]:
    topics = TopicView.load(sluice.store).topics().values()  # composed with their partition change records
    return dict(Counter(b for topic in topics for p in topic.partitions for b in p.replicas))


def operator_replicas(m: Scrape) -> dict[int, int]:
    return {int(labels["broker"]): int(v) for labels, v in m.series("sluice_operator_partition_replicas") if v}


def read_all(sluice: SluiceOnK8s) -> list[bytes]:
    consumer = Consumer(sluice.bootstrap_servers, group_id=None)
    consumer.assign([TopicPartition(TOPIC, p) for p in range(PARTITIONS)])
    consumer.seek_to_beginning()
    seen: list[bytes] = []
    for _ in range(120):  # at most 60 s
        seen.extend(r.value for r in consumer.poll(timeout=0.5) if r.value is not None)
        if len(seen) >= RECORDS:
            break
    consumer.close()
    return seen


@pytest.fixture(scope="module")
def sluice(k8s: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceOnK8s]:
    install_crds(k8s)
    namespace = k8s.create_namespace("sluice-rebalance")
    cluster = SluiceOnK8s(k8s, namespace, tmp_path_factory.mktemp("sluice-rebalance"))
    try:
        k8s.kubectl("apply", "-n", namespace, "-f", str(Path(__file__).parents[2] / "manifests/operator/peering.yaml"))
        for i in (0, 1):  # broker 2 joins later
            cluster.create_pod(i)
            cluster.start_broker(i, CONFIG)
        for i in (0, 1):
            cluster.wait_serving(i)
            cluster.set_ready(i, True)
        cluster.start_operator("--metrics-listen", f"127.0.0.1:{METRICS_PORT}")
        yield cluster
    finally:
        cluster.close()


def test_add_brokers_proposes_then_moves_the_new_brokers_share_once_approved(sluice: SluiceOnK8s) -> None:
    with Admin(",".join(sluice.address(i) for i in (0, 1))) as admin:
        admin.create_topic(TOPIC, PARTITIONS, RF)
    wait_for(lambda: len(sluice.leaders(TOPIC)) == PARTITIONS, 30, "the topic", logs=sluice.logs)
    producer = Producer(",".join(sluice.address(i) for i in (0, 1)), acks="all")
    for i in range(RECORDS):
        producer.send(TOPIC, value=f"r{i}".encode(), partition=i % PARTITIONS)
    producer.flush()
    producer.close()
    assert replicas_per_broker(sluice) == {0: 6, 1: 6}

    sluice.create_pod(2)
    sluice.start_broker(2, CONFIG)
    sluice.wait_serving(2)
    sluice.set_ready(2, True)
    sluice.apply(rebalance("grow", mode="add-brokers", brokers=[2], topics=[TOPIC]))
    obj = wait_for(lambda: sluice.rebalance_in_state("grow", "ProposalReady"), 60, "a proposal", logs=sluice.logs)
    proposal = obj["status"]["proposal"]
    loads = {b["id"]: b for b in proposal["brokers"]}
    assert (loads[2]["replicasBefore"], loads[2]["replicasAfter"]) == (0, 4), proposal
    assert sorted(loads[b]["replicasAfter"] for b in (0, 1, 2)) == [4, 4, 4]
    assert loads[2]["leadersAfter"] == 2 and loads[0]["leadersAfter"] == loads[1]["leadersAfter"] == 2
    assert proposal["replicasToCopy"] == 4 and proposal["partitionsToMove"] == len(obj["status"]["plan"])
    # Bytes: what the partitions' leaders report (nothing is written meanwhile), weighed by the plan.
    with Admin(",".join(sluice.address(i) for i in (0, 1, 2))) as admin:
        dirs = admin.describe_log_dirs()
    leaders = sluice.leaders(TOPIC)
    size = {p: dirs[leaders[p]].replica_sizes[TopicPartition(TOPIC, p)] for p in range(PARTITIONS)}
    copied = sum(size[row["partition"]] for row in obj["status"]["plan"] if 2 in row["replicas"])
    assert isinstance(proposal["bytesToMove"], int) and proposal["bytesToMove"] == copied > 0, (proposal, size)
    assert proposal["balancedBy"] == "bytes" and proposal["brokersWithoutSizes"] == []
    assert (loads[2]["bytesBefore"], loads[2]["bytesAfter"]) == (0, copied)
    assert loads[0]["bytesBefore"] == loads[1]["bytesBefore"] == sum(size.values())
    assert f"({copied} bytes)" in condition(obj, "ProposalReady")["message"]
    assert condition(obj, "ProposalReady")["status"] == "True"
    assert condition(obj, "Ready")["reason"] == "ProposalReady"
    # Not approved: nothing moves, over three of the operator's status rounds (1 s each).
    for _ in range(15):
        assert sluice.rebalance_in_state("grow", "ProposalReady")
        assert replicas_per_broker(sluice) == {0: 6, 1: 6} and not reassigning(sluice)
        time.sleep(0.2)

    sluice.k8s.kubectl("annotate", "-n", sluice.namespace, "sluicerebalance", "grow", "sluice.dev/rebalance=approve")
    obj = wait_for(lambda: sluice.rebalance_in_state("grow", "Ready"), 120, "the rebalance done", logs=sluice.logs)
    assert obj["status"]["progress"]["done"] == obj["status"]["progress"]["total"] == len(obj["status"]["plan"])
    assert condition(obj, "Ready")["status"] == "True" and condition(obj, "Rebalancing")["status"] == "False"
    assert "sluice.dev/rebalance" not in (obj["metadata"].get("annotations") or {})  # acted on: removed
    assert replicas_per_broker(sluice) == {0: 4, 1: 4, 2: 4} and not reassigning(sluice)
    # The operator's metrics: replicas per broker (every topic, as the metadata has them), nothing moving.
    wanted = all_replicas_per_broker(sluice)
    m = wait_for(lambda: (m := scrape(METRICS)) and operator_replicas(m) == wanted and m, 30, "replica metrics")
    assert m.value("sluice_operator_reassigning_partitions") == 0
    assert m.value("sluice_operator_rebalances_running") == 0
    # Every record is still there, and broker 2 leads its partitions once the controller moves
    # leadership to the preferred replicas (preferred-leader delay 2 s).
    wait_for(lambda: Counter(sluice.leaders(TOPIC))[2] == 2, 60, "broker 2 leading", logs=sluice.logs)
    assert sorted(read_all(sluice)) == sorted(f"r{i}".encode() for i in range(RECORDS))


def test_invalid_specs_move_nothing_and_remove_brokers_drains_then_allows_scale_down(sluice: SluiceOnK8s) -> None:
    before = sluice.topic_doc(TOPIC)
    sluice.apply(rebalance("bad-id", mode="remove-brokers", brokers=[7], autoApprove=True))
    sluice.apply(rebalance("bad-all", mode="remove-brokers", brokers=[0, 1, 2], autoApprove=True))
    for name, message in (("bad-id", "unknown broker id(s) [7]"), ("bad-all", "would leave no broker")):
        obj = wait_for(lambda name=name: sluice.rebalance_in_state(name, "NotReady"), 60, name, logs=sluice.logs)
        ready = condition(obj, "Ready")
        assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec") and message in ready["message"], ready
    # The API server refuses brokers with mode full.
    refused = sluice.k8s.kubectl(
        "apply", "-n", sluice.namespace, "-f", "-", check=False,
        input='{"apiVersion": "sluice.dev/v1alpha1", "kind": "SluiceRebalance", "metadata": {"name": "bad-full"},'
        ' "spec": {"mode": "full", "brokers": [1]}}',
    )  # fmt: skip
    assert refused.returncode != 0 and "only then" in refused.stderr
    # ... and a throttle that is not a positive number of bytes per second
    refused = sluice.k8s.kubectl(
        "apply", "-n", sluice.namespace, "-f", "-", check=False,
        input='{"apiVersion": "sluice.dev/v1alpha1", "kind": "SluiceRebalance", "metadata": {"name": "bad-rate"},'
        ' "spec": {"mode": "full", "throttleBytesPerSecond": 0}}',
    )  # fmt: skip
    assert refused.returncode != 0 and "throttleBytesPerSecond" in refused.stderr, refused.stderr
    assert sluice.topic_doc(TOPIC) == before

    sluice.apply(rebalance("drain", mode="remove-brokers", brokers=[2], autoApprove=True))
    obj = wait_for(lambda: sluice.rebalance_in_state("drain", "Ready"), 120, "the drain done", logs=sluice.logs)
    assert condition(obj, "ReadyToScaleDown")["status"] == "True", obj["status"]["conditions"]
    assert condition(obj, "BrokersHoldReplicas")["status"] == "False"
    assert 2 not in replicas_per_broker(sluice) and not reassigning(sluice)
    assert sorted(replicas_per_broker(sluice).values()) == [6, 6]
    assert sorted(read_all(sluice)) == sorted(f"r{i}".encode() for i in range(RECORDS))


def test_stop_cancels_the_moves_in_flight_and_approve_after_refresh_finishes(sluice: SluiceOnK8s) -> None:
    assert 2 not in replicas_per_broker(sluice)  # drained by the test before
    before = {p["replicas"][0]: p for p in (sluice.topic_doc(TOPIC) or {})["partitions"]}
    sluice.kill(2)  # its copies can never catch up: the moves stay in flight
    sluice.apply(
        rebalance(
            "onto-2", mode="add-brokers", brokers=[2], topics=[TOPIC], autoApprove=True, maxPartitionsInFlight=1,
            throttleBytesPerSecond=THROTTLE,
        )
    )  # fmt: skip
    obj = wait_for(
        lambda: (
            (o := sluice.rebalance_in_state("onto-2", "Rebalancing")) and o["status"]["progress"]["inFlight"] == 1 and o
        ),
        60,
        "one move in flight",
        logs=sluice.logs,
    )
    assert obj["status"]["progress"]["done"] == 0 and condition(obj, "Rebalancing")["status"] == "True"
    # broker 2 is down: the proposal names it as giving no sizes (it leads nothing: every size is known)
    assert obj["status"]["proposal"]["brokersWithoutSizes"] == [2], obj["status"]["proposal"]
    # its throttle is the cluster's while it runs (the brokers apply it: tests/integration/test_reassignment.py)
    assert throttle_document(sluice) == {"rate": THROTTLE, "resource": f"{sluice.namespace}/onto-2"}
    assert f"throttled to {THROTTLE} bytes/s" in condition(obj, "Rebalancing")["message"]
    moving = [p for p in (sluice.topic_doc(TOPIC) or {})["partitions"] if p.get("adding_replicas")]
    m = wait_for(
        lambda: (m := scrape(METRICS)) and m.value("sluice_operator_reassigning_partitions") == 1 and m,
        30,
        "the move in flight in the operator's metrics",
    )
    assert m.value("sluice_operator_rebalances_running") == 1
    assert m.value("sluice_operator_rebalance_partitions", state="in_flight") == 1
    assert m.value("sluice_operator_rebalance_partitions", state="total") == obj["status"]["progress"]["total"]
    assert m.value("sluice_operator_rebalance_partitions", state="done") == 0
    assert len(moving) == 1 and moving[0]["adding_replicas"] == [2], (sluice.topic_doc(TOPIC), obj["status"])

    sluice.k8s.kubectl("annotate", "-n", sluice.namespace, "sluicerebalance", "onto-2", "sluice.dev/rebalance=stop")
    obj = wait_for(lambda: sluice.rebalance_in_state("onto-2", "Stopped"), 60, "stopped", logs=sluice.logs)
    assert "1 move(s) in flight cancelled" in condition(obj, "Rebalancing")["message"]
    assert throttle_document(sluice) is None  # stopped: the brokers' configured rates again
    assert not reassigning(sluice) and 2 not in replicas_per_broker(sluice)
    assert {p["replicas"][0]: p["replicas"] for p in (sluice.topic_doc(TOPIC) or {})["partitions"]} == {
        k: p["replicas"] for k, p in before.items()
    }
    for _ in range(10):  # stopped stays stopped
        assert sluice.rebalance_in_state("onto-2", "Stopped") and not reassigning(sluice)
        time.sleep(0.2)

    sluice.restart(2)
    annotate = ("annotate", "-n", sluice.namespace, "--overwrite", "sluicerebalance", "onto-2")
    sluice.k8s.kubectl(*annotate, "sluice.dev/rebalance=refresh")
    wait_for(
        lambda: sluice.rebalance_in_state("onto-2", "Rebalancing") or sluice.rebalance_in_state("onto-2", "Ready"),
        60,
        "resumed",
    )
    obj = wait_for(lambda: sluice.rebalance_in_state("onto-2", "Ready"), 120, "the rebalance done", logs=sluice.logs)
    assert replicas_per_broker(sluice) == {0: 4, 1: 4, 2: 4} and not reassigning(sluice)
    assert throttle_document(sluice) is None  # done: removed
    assert sorted(read_all(sluice)) == sorted(f"r{i}".encode() for i in range(RECORDS))

    # A throttle left by a rebalance that is gone (deleted while no operator ran) is swept away by
    # the next round of any rebalance: it would otherwise hold every broker back for good.
    ghost = {"rate": 1, "resource": f"{sluice.namespace}/ghost", "updated_ms": 1}
    sluice.store.compare_and_set(keys.REPLICATION_THROTTLE, ghost, None)
    wait_for(lambda: throttle_document(sluice) is None, 30, "the ghost's throttle swept", logs=sluice.logs)

    # A document just written by a rebalance whose status does not say Rebalancing yet (Kopf
    # patches it after the round that wrote the document) stays: the other rebalances' rounds once
    # swept onto-2's while its first move started. "idle" exists and is not Rebalancing, as a
    # just-started one looks; paused, its own rounds leave the document to the others' sweeps.
    sluice.apply(rebalance("idle", annotations={"sluice.dev/paused": "true"}, mode="full"))
    wait_for(
        lambda: condition(sluice.get("sluicerebalances", "idle"), "Paused").get("status") == "True", 30, "idle paused"
    )
    young = {"rate": 2, "resource": f"{sluice.namespace}/idle", "updated_ms": now_ms()}
    sluice.store.compare_and_set(keys.REPLICATION_THROTTLE, young, None)
    for _ in range(15):  # three seconds: every rebalance's round (status interval 1 s) runs three times
        assert throttle_document(sluice) == {"rate": 2, "resource": f"{sluice.namespace}/idle"}
        time.sleep(0.2)
    current = sluice.store.get(keys.REPLICATION_THROTTLE)
    assert current is not None
    old = {**young, "updated_ms": now_ms() - 120_000}
    sluice.store.compare_and_set(keys.REPLICATION_THROTTLE, old, current.version)
    wait_for(
        lambda: throttle_document(sluice) is None, 30, "an old one of a rebalance not running swept", logs=sluice.logs
    )
