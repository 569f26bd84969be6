"""CreateTime records too far from the broker's clock are refused (KIP-937), through both protocols.

Kafka 4's defaults: ``message.timestamp.after.max.ms`` one hour, ``message.timestamp.before.max.ms``
unbounded; both per topic. A refused batch answers INVALID_TIMESTAMP (not retriable) and nothing of
it is stored; LogAppendTime topics take any timestamp (the broker's replaces it). Real broker process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice import errors
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

from .test_kafka_produce_fetch import grpc_read, kafka_read

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python
from kafka import KafkaProducer  # noqa: E402
from kafka.errors import InvalidTimestampError as KafkaInvalidTimestamp  # noqa: E402

HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("ts-data"), kafka_listener=True) as c:
        admin = Admin(bootstrap_servers=c.bootstrap_servers)
        try:
            admin.create_topic("ts-default", partitions=1, replication_factor=1)
            admin.create_topic(
                "ts-narrow",
                partitions=1,
                replication_factor=1,
                config={"message.timestamp.before.max.ms": str(DAY_MS), "message.timestamp.after.max.ms": "0"},
            )
            admin.create_topic(
                "ts-append", partitions=1, replication_factor=1, config={"message.timestamp.type": "LogAppendTime"}
            )
        finally:
            admin.close()
        yield c


def now_ms() -> int:
    return int(time.time() * 1000)


def grpc_send(cluster: LocalCluster, topic: str, ts: int) -> int:
    with Producer(bootstrap_servers=cluster.bootstrap_servers) as producer:
        return producer.send(topic, b"v", timestamp_ms=ts).get(timeout=30).offset


def kafka_send(cluster: LocalCluster, topic: str, ts: int) -> int:
    producer = KafkaProducer(bootstrap_servers=cluster.kafka_bootstrap_servers, retries=0, request_timeout_ms=30000)
    try:
        return int(producer.send(topic, b"v", timestamp_ms=ts).get(timeout=30).offset)
    finally:
        producer.close()


def test_a_record_more_than_an_hour_ahead_is_refused_by_default(cluster: LocalCluster) -> None:
    assert grpc_send(cluster, "ts-default", now_ms() + HOUR_MS - 60_000) == 0  # within the hour
    assert grpc_send(cluster, "ts-default", 1_000) == 1  # any past timestamp, by default
    with pytest.raises(errors.InvalidTimestampError, match="out of range") as info:
        grpc_send(cluster, "ts-default", now_ms() + 2 * HOUR_MS)
    assert not info.value.retriable
    assert "message.timestamp.after.max.ms=3600000" in str(info.value)
    with pytest.raises(KafkaInvalidTimestamp):
        kafka_send(cluster, "ts-default", now_ms() + 2 * HOUR_MS)
    assert kafka_send(cluster, "ts-default", now_ms()) == 2  # nothing of the refused ones was stored
    assert [r[0] for r in grpc_read(cluster, "ts-default", "read_uncommitted", 3)] == [0, 1, 2]


def test_per_topic_bounds_and_log_append_time(cluster: LocalCluster) -> None:
    with pytest.raises(errors.InvalidTimestampError):
        grpc_send(cluster, "ts-narrow", now_ms() - 2 * DAY_MS)  # before.max.ms: one day
    with pytest.raises(KafkaInvalidTimestamp):
        kafka_send(cluster, "ts-narrow", now_ms() + 60_000)  # after.max.ms: 0
    assert kafka_send(cluster, "ts-narrow", now_ms() - HOUR_MS) == 0
    # LogAppendTime: the broker's clock replaces whatever the producer said
    far = now_ms() + 30 * DAY_MS
    assert kafka_send(cluster, "ts-append", far) == 0
    [(_offset, _key, _value, _headers, stored)] = kafka_read(cluster, "ts-append", "read_uncommitted")
    assert abs(stored - now_ms()) < HOUR_MS


def test_bounds_are_validated_as_topic_config(cluster: LocalCluster) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        with pytest.raises(errors.InvalidConfigError, match="must be >= 0"):
            admin.create_topic("ts-bad", partitions=1, config={"message.timestamp.after.max.ms": "-1"})
        admin.alter_topic_config("ts-default", {"message.timestamp.after.max.ms": str(3 * HOUR_MS)})
    finally:
        admin.close()
    deadline = time.monotonic() + 30
    while True:  # the new bound applies at the broker's next metadata refresh
        try:
            grpc_send(cluster, "ts-default", now_ms() + 2 * HOUR_MS)
            break
        except errors.InvalidTimestampError:
            assert time.monotonic() < deadline, "the raised bound never applied"
            time.sleep(0.5)
