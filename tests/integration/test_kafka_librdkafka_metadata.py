"""librdkafka's all-topics Metadata against a real broker: ``list_topics()`` and regex subscriptions.

Both send Metadata with a null topic array, which librdkafka 2.16 encodes with 3 bytes more than
the body holds (see tests/unit/test_kafka_metadata_all_topics.py); the broker once refused it, and
a regex subscription then read nothing without an error. Run with the newest confluent-kafka the
package index has (pyproject gives a lower bound only).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from sluice.client import Admin
from sluice.testing import LocalCluster

LIMIT_S = 60.0


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("rdkafka-metadata"), kafka_listener=True) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        try:
            admin.create_topic("ck-a", partitions=2)
            admin.create_topic("ck-b", partitions=1)
            admin.create_topic("other", partitions=1)
        finally:
            admin.close()
        yield cluster


def test_admin_client_lists_every_topic(kcluster: LocalCluster) -> None:
    metadata = AdminClient({"bootstrap.servers": kcluster.kafka_bootstrap_servers}).list_topics(timeout=20)
    assert {"ck-a", "ck-b", "other"} <= set(metadata.topics)
    assert len(metadata.topics["ck-a"].partitions) == 2 and metadata.topics["ck-a"].error is None
    assert len(metadata.brokers) == 1


def test_regex_subscription_reads_the_matching_topics(kcluster: LocalCluster) -> None:
    producer = Producer({"bootstrap.servers": kcluster.kafka_bootstrap_servers, "linger.ms": 5})
    sent = {(topic, f"{topic}-{i}".encode()) for topic in ("ck-a", "ck-b", "other") for i in range(5)}
    for topic, value in sorted(sent):
        producer.produce(topic, value)
    assert producer.flush(30) == 0

    consumer = Consumer({
        "bootstrap.servers": kcluster.kafka_bootstrap_servers,
        "group.id": f"regex-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "topic.metadata.refresh.interval.ms": 1000,
    })  # fmt: skip
    try:
        consumer.subscribe(["^ck-.*"])
        wanted = {(t, v) for t, v in sent if t.startswith("ck-")}
        got: set[tuple[str, bytes]] = set()
        deadline = time.monotonic() + LIMIT_S
        while got != wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            topic, value = msg.topic(), msg.value()
            assert topic is not None and value is not None
            got.add((topic, value))
        assert got == wanted
        assert {tp.topic for tp in consumer.assignment()} == {"ck-a", "ck-b"}
    finally:
        consumer.close()
