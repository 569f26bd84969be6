"""The record batch codec: encoding, the serialized form the producer sends, decoding.

The producer never builds RecordBatch messages on its hot path: it sends
``BatchBuilder.build_serialized`` pieces inside a ProduceRequest it composes
itself (``encode_produce_request``), and the consumer decodes records into
tuples. These tests pin each shortcut to what protobuf itself would produce.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client.producer.sender import encode_produce_request
from sluice.client.types import ConsumerRecord, consumer_record
from sluice.records import (
    BatchBuilder,
    RecordBatch,
    control_batch,
    decode_record_tuples,
    decode_records,
    parse_control,
    varint,
    verify_crc,
)

CODECS = [
    records_pb2.COMPRESSION_NONE,
    records_pb2.COMPRESSION_GZIP,
    records_pb2.COMPRESSION_LZ4,
    records_pb2.COMPRESSION_ZSTD,
]


Expected = list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]], int]]


def mixed_builder(n: int = 60, seed: int = 1) -> tuple[BatchBuilder, Expected]:
    rnd = random.Random(seed)
    builder = BatchBuilder()
    expected: Expected = []
    for i in range(n):
        key = None if i % 3 == 0 else (b"" if i % 7 == 0 else b"k%d" % i)
        value = None if i % 11 == 5 else bytes(rnd.randrange(256) for _ in range(rnd.randrange(0, 300)))
        headers = [("h", b"1"), ("é", b"")] if i % 4 == 0 else []
        ts = 1_000 + rnd.randrange(0, 50)
        builder.append(key, value, headers or None, ts)
        expected.append((key, value, headers, ts))
    return builder, expected


@pytest.mark.parametrize("codec", CODECS)
def test_records_round_trip_with_null_keys_values_and_headers(codec: int) -> None:
    builder, expected = mixed_builder()
    batch = builder.build(producer_id=7, producer_epoch=1, base_sequence=3, compression=codec)
    batch.base_offset = 100
    assert verify_crc(batch)
    assert batch.record_count == len(expected)
    assert batch.first_timestamp == expected[0][3]
    assert batch.max_timestamp == max(e[3] for e in expected)
    records = decode_records(batch)
    assert [(r.key, r.value, r.headers, r.timestamp) for r in records] == expected
    assert [r.offset for r in records] == list(range(100, 100 + len(expected)))


@pytest.mark.parametrize("codec", CODECS)
def test_build_serialized_is_protobufs_serialization(codec: int) -> None:
    builder, _ = mixed_builder()
    head, records = builder.build_serialized(
        producer_id=9, producer_epoch=2, base_sequence=11, transactional=True, compression=codec
    )
    batch = builder.build(producer_id=9, producer_epoch=2, base_sequence=11, transactional=True, compression=codec)
    assert head + records == batch.SerializeToString()
    assert RecordBatch.FromString(head + records).records == records
    assert batch.partition_leader_epoch == -1 and batch.base_offset == 0


def test_an_empty_batch_cannot_be_built() -> None:
    with pytest.raises(ValueError):
        BatchBuilder().build_serialized()


def test_append_without_timestamp_uses_the_clock_and_counts_sizes() -> None:
    builder = BatchBuilder()
    assert builder.append(None, b"abc") == 0
    assert builder.append(b"k", None) == 1
    assert builder.size == (22 + 3) + (22 + 1)
    batch = builder.build()
    assert batch.first_timestamp > 1_600_000_000_000
    assert [(r.key, r.value) for r in decode_records(batch)] == [(None, b"abc"), (b"k", None)]


def test_decode_record_tuples_skips_records_below_min_offset() -> None:
    builder = BatchBuilder()
    for i in range(5):
        builder.append(None, b"%d" % i, None, 10 + i)
    batch = builder.build()
    batch.base_offset = 20
    assert decode_record_tuples(batch, 22) == [
        (22, 12, None, b"2", []),
        (23, 13, None, b"3", []),
        (24, 14, None, b"4", []),
    ]
    rows = decode_record_tuples(batch)
    rows[0][4].append(("x", b"y"))  # each record has its own headers list
    assert rows[1][4] == []


def test_log_append_time_batches_report_the_brokers_time() -> None:
    builder = BatchBuilder()
    builder.append(None, b"v", None, 5)
    batch = builder.build()
    batch.timestamp_type = records_pb2.LOG_APPEND_TIME
    batch.max_timestamp = 999
    assert decode_record_tuples(batch)[0][1] == 999


def test_control_batches() -> None:
    marker = control_batch(5, 1, committed=True, coordinator_epoch=3, timestamp=42)
    assert marker.control and marker.transactional and verify_crc(marker)
    assert parse_control(marker) == (True, 3)


def test_varint_is_protobufs() -> None:
    for n in (0, 1, 127, 128, 300, 2**21, 2**31 - 1):
        assert broker_pb2.ProducePartitionData.FromString(b"\x08" + varint(n)).partition == n
        if n:
            assert broker_pb2.ProducePartitionData(partition=n).SerializeToString() == b"\x08" + varint(n)
    assert varint(300) == b"\xac\x02"


@pytest.mark.parametrize(("transactional_id", "acks"), [("", -1), ("txn", -1), ("", 1), ("", 0)])
def test_encode_produce_request_is_protobufs_serialization(transactional_id: str, acks: int) -> None:
    builders = []
    for n in (1, 40, 3000):
        b = BatchBuilder()
        for i in range(n):
            b.append(None, b"x" * (i % 50), None, 7)
        builders.append(b)
    pieces = [b.build_serialized(producer_id=5, producer_epoch=0, base_sequence=0) for b in builders]
    messages = [b.build(producer_id=5, producer_epoch=0, base_sequence=0) for b in builders]
    raw = encode_produce_request(
        transactional_id, acks, 30_000, [("a", 0, pieces[0]), ("b", 7, pieces[1]), ("a", 200, pieces[2])]
    )
    expected = broker_pb2.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout_ms=30_000,
        topics=[
            broker_pb2.ProduceTopicData(
                name="a",
                partitions=[
                    broker_pb2.ProducePartitionData(partition=0, batch=messages[0]),
                    broker_pb2.ProducePartitionData(partition=200, batch=messages[2]),
                ],
            ),
            broker_pb2.ProduceTopicData(
                name="b", partitions=[broker_pb2.ProducePartitionData(partition=7, batch=messages[1])]
            ),
        ],
    )
    assert raw == expected.SerializeToString()


def test_consumer_record_helper_builds_ordinary_frozen_records() -> None:
    fast = consumer_record("t", 1, 5, None, b"v", [("h", b"1")], 9)
    slow = ConsumerRecord("t", 1, 5, None, b"v", [("h", b"1")], 9)
    assert type(fast) is ConsumerRecord
    assert fast == slow and repr(fast) == repr(slow)
    assert dataclasses.replace(fast, offset=6).offset == 6
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.offset = 7  # type: ignore[misc]
    assert fast.topic_partition == slow.topic_partition
