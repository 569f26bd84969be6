"""The operator's handlers (sluice.operator.handlers) against real brokers, called directly.

The Kopf machinery and the API server are tested in tests/k8s/; here the handlers' logic meets a
real LocalCluster (its SQLite MetadataStore stands where the Kubernetes store would): a Topic
body becomes a real topic with its status in the Kopf patch, growth and config changes reach the
brokers, what cannot be done becomes a condition, and a TransactionalId fences a live producer.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import kopf
import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.metadata import keys, open_store
from sluice.operator.handlers.rebalance import reconcile_rebalance
from sluice.operator.handlers.runtime import OperatorRuntime
from sluice.operator.handlers.topics import reconcile_topic
from sluice.operator.handlers.transactional_ids import reconcile_transactional_id, release_transactional_id
from sluice.operator.settings import OperatorSettings
from sluice.testing import LocalCluster


@pytest.fixture(scope="module")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, OperatorRuntime]]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("ops")) as c:
        settings = OperatorSettings(namespace="test", metadata_url=str(c.metadata_path), expected_brokers=1)
        store = open_store(settings.metadata_url)
        ops = OperatorRuntime(settings, store)
        yield c, ops
        ops.close()


@pytest.fixture
def cluster(runtime: tuple[LocalCluster, OperatorRuntime]) -> LocalCluster:
    return runtime[0]


@pytest.fixture
def ops(runtime: tuple[LocalCluster, OperatorRuntime]) -> OperatorRuntime:
    return runtime[1]


def body(name: str, generation: int = 1, annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "test", "generation": generation}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec, "status": {}}


def cond(patch: kopf.Patch, type_: str) -> dict[str, Any]:
    return next(c for c in patch["status"]["conditions"] if c["type"] == type_)


def test_a_topic_body_becomes_a_topic_with_status(cluster: LocalCluster, ops: OperatorRuntime) -> None:
    patch = kopf.Patch()
    reconcile_topic(body("orders", partitions=3, replicationFactor=1, config={"retention.ms": "60000"}), patch, ops)
    assert cond(patch, "Ready")["status"] == "True", patch
    assert [r["partition"] for r in patch["status"]["partitions"]] == [0, 1, 2]
    assert all(r["leader"] == 0 and r["isr"] == [0] for r in patch["status"]["partitions"])
    with Admin(cluster.bootstrap_servers) as admin:
        topic = admin.describe_topic("orders")
        assert len(topic.partitions) == 3 and topic.config["retention.ms"] == "60000"
        assert patch["status"]["topicId"] == topic.topic_id

    grown = kopf.Patch()
    reconcile_topic(body("orders", 2, partitions=5, replicationFactor=1, config={"retention.ms": "1"}), grown, ops)
    assert len(grown["status"]["partitions"]) == 5 and grown["status"]["observedGeneration"] == 2
    with Admin(cluster.bootstrap_servers) as admin:
        assert len(admin.describe_topic("orders").partitions) == 5
    assert cluster.topic_document("orders")["config"] == {"retention.ms": "1"}  # type: ignore[index]


def test_what_cannot_be_done_is_a_condition(cluster: LocalCluster, ops: OperatorRuntime) -> None:
    wide = kopf.Patch()
    reconcile_topic(body("wide", partitions=1, replicationFactor=2), wide, ops)
    assert (cond(wide, "Ready")["status"], cond(wide, "Ready")["reason"]) == ("False", "InvalidReplicationFactor")
    assert cluster.topic_document("wide") is None

    bad = kopf.Patch()
    reconcile_topic(body("bad", partitions=1, replicationFactor=1, config={"no.such.setting": "x"}), bad, ops)
    assert cond(bad, "Ready")["status"] == "False" and "no.such.setting" in cond(bad, "Ready")["message"]

    reconcile_topic(body("fixed", partitions=2, replicationFactor=1), kopf.Patch(), ops)
    fewer = kopf.Patch()
    reconcile_topic(body("fixed", 2, partitions=1, replicationFactor=1), fewer, ops)
    assert (
        cond(fewer, "NotSupported")["status"] == "True" and "never decrease" in cond(fewer, "NotSupported")["message"]
    )
    assert len(cluster.topic_document("fixed")["partitions"]) == 2  # type: ignore[index]

    paused = kopf.Patch()
    reconcile_topic(
        body("fixed", 3, annotations={"sluice.dev/paused": "true"}, partitions=4, replicationFactor=1), paused, ops
    )
    assert cond(paused, "Paused")["status"] == "True"
    assert len(cluster.topic_document("fixed")["partitions"]) == 2  # type: ignore[index]


def test_a_transactional_id_is_declared_described_and_fenced(cluster: LocalCluster, ops: OperatorRuntime) -> None:
    reconcile_topic(body("out", partitions=1, replicationFactor=1), kopf.Patch(), ops)
    idle = kopf.Patch()
    reconcile_transactional_id(body("app", transactionalId="app"), idle, ops, describe=True)
    assert cond(idle, "Ready")["status"] == "True" and idle["status"]["state"] == "Unknown"
    assert cluster.topic_document("out") is not None
    store = ops.meta
    assert store.get("transactional_ids/app").value == {"transactional_id": "app", "resource": "test/app"}  # type: ignore[union-attr]

    producer = Producer(cluster.bootstrap_servers, transactional_id="app")
    producer.init_transactions(timeout=30)
    producer.begin_transaction()
    producer.send("out", value=b"x", partition=0)
    producer.flush()
    ongoing = kopf.Patch()
    reconcile_transactional_id(body("app", transactionalId="app"), ongoing, ops, describe=True)
    assert ongoing["status"]["state"] == "Ongoing" and ongoing["status"]["partitions"] == ["out-0"]
    epoch = ongoing["status"]["producerEpoch"]

    fenced = kopf.Patch()
    spec = {"transactionalId": "app", "operation": {"type": "fence", "requestId": "r1"}}
    reconcile_transactional_id(body("app", 2, **spec), fenced, ops, describe=True)
    assert fenced["status"]["lastOperation"]["result"] == "Succeeded", fenced["status"]["lastOperation"]
    assert fenced["status"]["producerEpoch"] > epoch
    with pytest.raises(errors.ProducerFencedError):
        producer.commit_transaction(timeout=30)
    producer.close()
    # Done once per requestId.
    again = kopf.Patch()
    b = body("app", 2, **spec)
    b["status"] = {"lastOperation": fenced["status"]["lastOperation"]}
    reconcile_transactional_id(b, again, ops, describe=True)
    assert "lastOperation" not in again["status"]
    # As after Kafka's fenceProducers: the open transaction was aborted, then the epoch bumped.
    assert again["status"]["state"] == "Empty" and again["status"]["producerEpoch"] == fenced["status"]["producerEpoch"]
    consumer = Consumer(cluster.bootstrap_servers, group_id=None, isolation_level="read_uncommitted")
    consumer.assign([TopicPartition("out", 0)])
    consumer.seek_to_beginning()
    deadline = time.monotonic() + 20
    seen: list[Any] = []
    while len(seen) < 1 and time.monotonic() < deadline:
        seen.extend(consumer.poll(timeout=0.5))
    consumer.close()
    assert [r.value for r in seen] == [b"x"]  # written, and (below) aborted
    committed = Consumer(cluster.bootstrap_servers, group_id=None, isolation_level="read_committed")
    committed.assign([TopicPartition("out", 0)])
    committed.seek_to_beginning()
    assert committed.poll(timeout=2.0) == []
    committed.close()

    release_transactional_id(body("app", transactionalId="app"), ops)
    assert store.get("transactional_ids/app") is None


@pytest.mark.parametrize("rate", [0, -5, "10MB", True, 1.5])
def test_a_rebalance_with_an_invalid_throttle_is_invalid_spec_and_sets_no_throttle(
    cluster: LocalCluster, ops: OperatorRuntime, rate: object
) -> None:
    """The CRD refuses these; an object it did not check (an older CRD) is refused by the operator too."""
    patch = kopf.Patch()
    reconcile_rebalance(body("throttled", mode="full", autoApprove=True, throttleBytesPerSecond=rate), patch, ops)
    assert patch["status"]["state"] == "NotReady", patch
    ready = cond(patch, "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "InvalidSpec")
    assert "throttleBytesPerSecond must be a positive integer" in ready["message"]
    assert cluster.metadata.get(keys.REPLICATION_THROTTLE) is None
