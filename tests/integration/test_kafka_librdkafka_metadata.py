"""librdkafka's all-topics Metadata against a real broker: ``list_topics()`` and regex subscriptions.

Also Metadata naming an unknown topic: not created by default (the broker's log and Sluice's
client say how to create it), created with ``auto.create.topics.enable=true``.

Both send Metadata with a null topic array, which librdkafka 2.16 encodes with 3 bytes more than
the body holds (see tests/unit/test_kafka_metadata_all_topics.py); the broker once refused it, and
a regex subscription then read nothing without an error. Run with the newest confluent-kafka the
package index has (pyproject gives a lower bound only).
"""

from __future__ import annotations

import socket
import struct
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest, MetadataRequestTopic
from sluice.broker.kafka_wire.messages.metadata_response import MetadataResponse, MetadataResponseTopic
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.client import Admin
from sluice.client import Producer as SluiceProducer
from sluice.errors import UnknownTopicOrPartitionError
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


def metadata(cluster: LocalCluster, name: str, version: int = 12, allow: bool = True) -> MetadataResponseTopic:
    """One Metadata request naming ``name``, raw, to broker 0's Kafka listener: the topic's answer."""
    header = RequestHeader(request_api_key=3, request_api_version=version, correlation_id=1, client_id="t")
    request = MetadataRequest(topics=[MetadataRequestTopic(name=name)], allow_auto_topic_creation=allow)
    frame = codec.encode(header, 2) + codec.encode(request, version)
    host, port = cluster.kafka_bootstrap_servers.split(",")[0].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        answer = b""
        while len(answer) < 4 or len(answer) < 4 + struct.unpack(">i", answer[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "closed"
            answer += chunk
    (topic,) = codec.decode(MetadataResponse, answer[4 + 5 :], version).topics  # size, correlation id, tags
    return topic


def test_unknown_topics_are_not_created_by_default_and_the_log_says_how(kcluster: LocalCluster) -> None:
    assert metadata(kcluster, "no-such-topic").error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    assert metadata(kcluster, "no-such-topic").error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
    log = kcluster.brokers[0].log_path.read_text(errors="replace")
    assert log.count("topic 'no-such-topic' does not exist and auto.create.topics.enable is false") == 1
    # Sluice's own client says so too
    producer = SluiceProducer(bootstrap_servers=kcluster.bootstrap_servers, max_block_ms=2000)
    try:
        with pytest.raises(UnknownTopicOrPartitionError, match=r"auto\.create\.topics\.enable"):
            producer.send("no-such-topic", b"x").get(timeout=10)
    finally:
        producer.close()


def test_auto_create_topics_enable(tmp_path_factory: pytest.TempPathFactory) -> None:
    config = {"auto.create.topics.enable": "true", "num.partitions": 3}
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("auto-create"), kafka_listener=True,
                      config=config) as cluster:  # fmt: skip
        # allow_auto_topic_creation false (a consumer's allow.auto.create.topics=false): not created
        assert metadata(cluster, "not-wanted", allow=False).error_code == pb.UNKNOWN_TOPIC_OR_PARTITION
        # librdkafka's producer asks for the topic's metadata, which creates it with num.partitions
        producer = Producer({"bootstrap.servers": cluster.kafka_bootstrap_servers})
        producer.produce("auto-made", b"first")
        assert producer.flush(30) == 0
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        try:
            assert len(admin.describe_topic("auto-made").partitions) == 3
            assert "not-wanted" not in admin.list_topics()
        finally:
            admin.close()
        assert metadata(cluster, "__consumer_offsets-like.bad/name").error_code == pb.INVALID_TOPIC_EXCEPTION
