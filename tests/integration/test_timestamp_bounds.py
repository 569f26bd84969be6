"""CreateTime records too far from the broker's clock are refused (KIP-937), through both protocols.

Every record of a batch in Kafka's v2 encoding is checked, not only the header's first and largest
timestamps, and a wrong header maxTimestamp is corrected, as Kafka's LogValidator does; a v2 batch
sent over gRPC has its records checked as a Kafka client's are.

Kafka 4's defaults: ``message.timestamp.after.max.ms`` one hour, ``message.timestamp.before.max.ms``
unbounded; both per topic. A refused batch answers INVALID_TIMESTAMP (not retriable) and nothing of
it is stored; LogAppendTime topics take any timestamp (the broker's replaces it). Real broker process.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka.record_batch import split_batches, to_stored_batch
from sluice.client import Admin, Producer
from sluice.records import RecordBatch, compute_crc, verify_crc
from sluice.testing import LocalCluster

from .test_kafka_produce_fetch import grpc_read, kafka_read
from .wire import Wire

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python
from kafka import KafkaProducer  # noqa: E402
from kafka.errors import InvalidTimestampError as KafkaInvalidTimestamp  # noqa: E402
from kafka.record.default_records import DefaultRecordBatchBuilder as KafkaBatchBuilder  # noqa: E402

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


def v2_batch(stamps: list[int], header_max: int | None = None) -> RecordBatch:
    """A Kafka v2 batch (kafka-python's builder) as a gRPC client in another language sends it:
    records_format KAFKA_V2; ``header_max`` a maxTimestamp other than the records' largest."""
    builder = KafkaBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    for i, ts in enumerate(stamps):
        builder.append(i, ts, None, b"v%d" % i, [])
    batch = to_stored_batch(*split_batches(bytes(builder.build()))[0])
    if header_max is not None:
        batch.max_timestamp = header_max
        batch.crc = compute_crc(batch)  # the client's CRC matches the header it wrote
    return batch


def stored_batches(cluster: LocalCluster, topic: str) -> list[RecordBatch]:
    wire = Wire(cluster.brokers[0].address)
    try:
        resp = wire.fetch(topic, 0, 0, read_committed=False, kafka_v2_records=True)
        assert resp.error_code == pb.NONE, resp.error_message
        return list(resp.batches)
    finally:
        wire.close()


def test_every_record_of_a_v2_batch_is_checked_and_a_wrong_max_timestamp_corrected(cluster: LocalCluster) -> None:
    """As Kafka's LogValidator, whichever protocol brought the batch (here gRPC with Kafka's encoding):
    each record's timestamp against the bounds, not the header's two, and the header's maxTimestamp
    made the records' largest, with a new CRC."""
    wire = Wire(cluster.brokers[0].address)
    try:
        wire.create_topic("ts-v2", config={"message.timestamp.before.max.ms": str(DAY_MS)})
        now = now_ms()
        # The header's two timestamps are in bounds; a record is two hours ahead (the header lies) ...
        ahead = wire.produce("ts-v2", 0, v2_batch([now, now + 2 * HOUR_MS, now], header_max=now))
        assert ahead.error_code == pb.INVALID_TIMESTAMP, ahead
        # ... or two days behind (earlier than the header's first: a negative delta).
        behind = wire.produce("ts-v2", 0, v2_batch([now, now - 2 * DAY_MS]))
        assert behind.error_code == pb.INVALID_TIMESTAMP, behind
        assert "out of range" in behind.error_message
        # In bounds, with a maxTimestamp lower than the records' largest: stored, corrected.
        ok = wire.produce("ts-v2", 0, v2_batch([now, now + 5000, now + 1000], header_max=now))
        assert (ok.error_code, ok.base_offset) == (pb.NONE, 0), ok
    finally:
        wire.close()
    [stored] = stored_batches(cluster, "ts-v2")  # nothing of the refused ones
    assert stored.max_timestamp == now + 5000
    assert verify_crc(stored)


def test_a_v2_batch_from_grpc_with_a_malformed_record_is_refused_and_nothing_stored(cluster: LocalCluster) -> None:
    wire = Wire(cluster.brokers[0].address)
    try:
        wire.create_topic("v2-corrupt")
        now = now_ms()
        bad = v2_batch([now, now])
        bad.records = bad.records[:-1] + b"\x02"  # the last record: one header, and none follows
        bad.crc = compute_crc(bad)  # a right CRC over wrong records: only the record walk sees it
        resp = wire.produce("v2-corrupt", 0, bad)
        assert resp.error_code == pb.CORRUPT_MESSAGE, resp
        assert "undecodable record" in resp.error_message
        good = wire.produce("v2-corrupt", 0, v2_batch([now, now]))
        assert (good.error_code, good.base_offset) == (pb.NONE, 0), good
    finally:
        wire.close()
    assert [b.record_count for b in stored_batches(cluster, "v2-corrupt")] == [2]
