"""Quotas on the secure Kafka listener: byte rates with throttle_time_ms (KIP-219) and the producer-id rate.

A secure cluster with small quotas (``quota.producer.default``, ``quota.consumer.default``,
``producer.id.rate.per.principal.per.minute``). Each principal is counted on its own, and in the
same buckets as over gRPC. The throttle is checked as lower bounds on time (never upper ones): a
throttled connection is muted for the reported time (Produce v6+, Fetch v8+), an older client's
response is held back that long, and a kafka-python producer that writes past its quota cannot go
faster than the quota.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kafka import KafkaProducer
from kafka.protocol.producer import InitProducerIdRequest

from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.client import Admin, Producer
from sluice.testing import LocalCluster

from .test_kafka_security import (
    ask,
    fetch_request,
    produce_request,
    read_frame,
    response_class,
    send,
    tls_connect,
    tls_context,
)

RATE = 50_000  # bytes/s, produce and fetch
PIDS_PER_MINUTE = 2  # one token per 30 s: the test's few requests cannot see a refill
THROTTLING_QUOTA_EXCEEDED = 89
BATCH_BYTES = 16_384  # kafka-python's batch_size: at most this much record data per Produce
TS = 1_700_000_000_000


@pytest.fixture(scope="module")
def qcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    config = {
        "quota.producer.default": RATE,
        "quota.consumer.default": RATE,
        "producer.id.rate.per.principal.per.minute": PIDS_PER_MINUTE,
    }
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("kafka-quotas"), config=config, secure=True,
                      kafka_listener=True) as c:  # fmt: skip
        admin = Admin(**c.client_config("admin"))
        admin.create_topic("quota", partitions=1, replication_factor=1)
        admin.create_acls(
            AclBinding(ResourceType.TOPIC, "quota", ResourcePatternType.LITERAL, "User:*", "*", op,
                       AclPermissionType.ALLOW)
            for op in (AclOperation.WRITE, AclOperation.READ)
        )  # fmt: skip
        admin.close()
        yield c


def big_batch(nbytes: int) -> bytes:
    from kafka.record.default_records import DefaultRecordBatchBuilder

    builder = DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 24)
    for i in range(nbytes // 1000):
        builder.append(i, TS + i, None, bytes(1000), [])
    return bytes(builder.build())


def test_produce_over_the_quota_is_throttled_and_the_connection_muted(qcluster: LocalCluster) -> None:
    records = big_batch(2 * RATE)  # twice a second's worth: the first request already overdraws the bucket
    with tls_connect(qcluster, tls_context(qcluster, "fast")) as sock:
        sent = time.monotonic()
        send(sock, produce_request("quota", records, version=9), correlation_id=1)
        first = response_class(produce_request("quota", records)).decode(read_frame(sock), header=True)
        assert [p.error_code for t in first.responses for p in t.partition_responses] == [0]
        assert 0 < first.throttle_time_ms <= 10_000
        # KIP-219: the answer came at once; the next request is read only after the throttle time
        send(sock, produce_request("quota", records, version=9), correlation_id=2)
        second = response_class(produce_request("quota", records)).decode(read_frame(sock), header=True)
        assert time.monotonic() - sent >= first.throttle_time_ms / 1000
        assert second.throttle_time_ms > 0


def test_a_client_older_than_kip_219_gets_its_response_held(qcluster: LocalCluster) -> None:
    records = big_batch(2 * RATE)
    with tls_connect(qcluster, tls_context(qcluster, "old")) as sock:
        sent = time.monotonic()
        send(sock, produce_request("quota", records, version=5))
        held = response_class(produce_request("quota", records, version=5)).decode(read_frame(sock), header=True)
        assert held.throttle_time_ms > 0
        assert time.monotonic() - sent >= held.throttle_time_ms / 1000


def test_fetch_over_the_quota_reports_its_throttle_time(qcluster: LocalCluster) -> None:
    ask(qcluster, "writer", produce_request("quota", big_batch(2 * RATE)))
    resp = ask(qcluster, "reader", fetch_request("quota", version=11))
    [p] = resp.responses[0].partitions
    assert p.error_code == 0 and len(p.records) > RATE
    assert 0 < resp.throttle_time_ms <= 10_000
    # another principal has a bucket of its own
    assert ask(qcluster, "reader2", fetch_request("quota", version=11, offset=10**9)).throttle_time_ms == 0


def test_a_kafka_python_producer_cannot_outrun_its_quota(qcluster: LocalCluster) -> None:
    total = 4 * RATE
    producer = KafkaProducer(**qcluster.kafka_client_config("steady"), acks=1, linger_ms=5, batch_size=BATCH_BYTES)
    started = time.monotonic()
    for _ in range(total // 1000):
        producer.send("quota", bytes(1000), partition=0)
    producer.flush(timeout=120)
    elapsed = time.monotonic() - started
    producer.close()
    # The bucket starts with one second's worth and the broker reads the next request only once it is
    # back to zero; the last request's own mute comes after its answer, hence one batch less.
    assert elapsed >= (total - RATE - BATCH_BYTES) / RATE


def init_pid(cluster: LocalCluster, who: str) -> Any:
    request = InitProducerIdRequest[4](transactional_id=None, transaction_timeout_ms=60000, producer_id=-1,
                                       producer_epoch=-1)  # fmt: skip
    return ask(cluster, who, request)


def test_the_producer_id_rate_is_per_principal_and_shared_with_grpc(qcluster: LocalCluster) -> None:
    with Producer(**qcluster.client_config("pids")) as grpc_producer:  # idempotent: takes a producer id
        grpc_producer.send("quota", b"x", partition=0).result(timeout=60)
    got = [init_pid(qcluster, "pids") for _ in range(PIDS_PER_MINUTE)]
    assert [r.error_code for r in got] == [0] * (PIDS_PER_MINUTE - 1) + [THROTTLING_QUOTA_EXCEEDED]
    assert got[-1].producer_id == -1
    assert got[-1].throttle_time_ms == 60_000 // PIDS_PER_MINUTE  # when the next one can be had
    assert init_pid(qcluster, "pids-other").error_code == 0  # another principal is not held back
