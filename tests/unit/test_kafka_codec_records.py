"""Kafka v2 record batches: validation (magic, length, CRC-32C) and records, with kafka-python's builder as oracle."""

from __future__ import annotations

import struct

import crc32c
import pytest

from sluice import errors
from sluice.broker.kafka.record_batch import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_NONE,
    COMPRESSION_ZSTD,
    HEADER_SIZE,
    BatchHeader,
    RecordRefusedError,
    iter_records,
    split_batches,
    to_sluice_batch,
)
from sluice.records import BatchBuilder, decode_records, verify_crc

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python

RECORDS = [
    (b"k0", b"v" * 300, []),
    (None, b"only value", [("h1", b"x"), ("h2", b"")]),
    (b"key only", None, []),
    (b"", b"", [("empty", b"")]),
]


def kafka_batch(
    codec: int = COMPRESSION_NONE, *, transactional: bool = False, pid: int = -1, epoch: int = -1, seq: int = -1
) -> bytes:
    builder = default_records.DefaultRecordBatchBuilder(2, codec, int(transactional), pid, epoch, seq, 1 << 20)
    for i, (key, value, headers) in enumerate(RECORDS):
        builder.append(i, 1_700_000_000_000 + i, key, value, headers)
    return bytes(builder.build())


@pytest.mark.parametrize("codec", [COMPRESSION_NONE, COMPRESSION_GZIP, COMPRESSION_LZ4, COMPRESSION_ZSTD])
def test_records_of_kafka_python_batches(codec: int) -> None:
    data = kafka_batch(codec, transactional=True, pid=42, epoch=3, seq=7)
    [(header, batch)] = split_batches(data)
    assert (header.magic, header.compression, header.record_count, header.last_offset_delta) == (2, codec, 4, 3)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (42, 3, 7)
    assert header.transactional and not header.control
    got = list(iter_records(header, batch))
    assert [(o, t) for o, t, *_ in got] == [(i, 1_700_000_000_000 + i) for i in range(4)]
    assert [(k, v, h) for _, _, k, v, h in got] == RECORDS


def test_conversion_to_a_sluice_batch_keeps_every_field() -> None:
    header, batch = split_batches(kafka_batch(COMPRESSION_LZ4, pid=9, epoch=1, seq=0))[0]
    converted = to_sluice_batch(header, batch)
    assert verify_crc(converted)
    assert (converted.producer_id, converted.producer_epoch, converted.base_sequence) == (9, 1, 0)
    records = decode_records(converted)
    assert [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in records] == [
        (i, 1_700_000_000_000 + i, k, v, h) for i, (k, v, h) in enumerate(RECORDS)
    ]


@pytest.mark.parametrize("delta_ms", [0, 1, 63, 64, 8191, 8192, 9_000_000])
@pytest.mark.parametrize("value_size", [0, 50, 63, 64, 8100, 8200, 70_000])
def test_conversion_reads_one_two_and_three_byte_varints(delta_ms: int, value_size: int) -> None:
    """Record lengths and timestamp deltas take one, two or more varint bytes (each has its own path)."""
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 22)
    values = [bytes([i]) * value_size for i in range(3)]
    for i, value in enumerate(values):
        builder.append(i, 1_700_000_000_000 + i * delta_ms, None, value, [])
    header, batch = split_batches(bytes(builder.build()))[0]
    records = decode_records(to_sluice_batch(header, batch))
    assert [(r.offset, r.timestamp, r.value) for r in records] == [
        (i, 1_700_000_000_000 + i * delta_ms, v) for i, v in enumerate(values)
    ]


def test_several_batches_in_one_records_field() -> None:
    data = kafka_batch() + kafka_batch(COMPRESSION_GZIP)
    assert [h.compression for h, _ in split_batches(data)] == [COMPRESSION_NONE, COMPRESSION_GZIP]


def test_a_flipped_bit_is_corrupt_message() -> None:
    data = bytearray(kafka_batch())
    data[HEADER_SIZE + 5] ^= 0x01  # inside the records, covered by the CRC
    with pytest.raises(errors.CorruptMessageError, match="CRC-32C"):
        split_batches(bytes(data))
    assert errors.CorruptMessageError.code == 2


def test_base_offset_and_leader_epoch_are_not_covered_by_the_crc() -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">qii", data, 0, 1000, len(data) - 12, 17)  # what a broker assigns
    [(header, _)] = split_batches(bytes(data))
    assert (header.base_offset, header.partition_leader_epoch) == (1000, 17)


def test_magic_below_2_is_refused_as_kafka_4_does() -> None:
    # a magic-1 message set entry: offset, size, crc, magic 1, attributes, timestamp, key, value
    body = struct.pack(">bbqii", 1, 0, 0, -1, 1) + b"v"
    entry = struct.pack(">qiI", 0, len(body) + 4, crc32c.crc32c(body)) + body
    with pytest.raises(errors.InvalidRecordError, match="magic 1"):
        split_batches(entry)


@pytest.mark.parametrize("cut", [1, 20, HEADER_SIZE - 1, HEADER_SIZE + 3])
def test_truncated_batches_are_corrupt(cut: int) -> None:
    data = kafka_batch()
    with pytest.raises((errors.CorruptMessageError, errors.InvalidRecordError)):
        split_batches(data[:cut])


def test_a_length_past_the_data_is_corrupt() -> None:
    data = bytearray(kafka_batch())
    struct.pack_into(">i", data, 8, len(data))  # 12 bytes more than there are
    with pytest.raises(errors.CorruptMessageError, match="does not fit"):
        split_batches(bytes(data))


def test_records_that_lie_about_their_length_are_corrupt() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    data = bytearray(builder.build())
    data[HEADER_SIZE] += 2  # the first record's zigzag length grows by one
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    [(header, batch)] = split_batches(bytes(data))
    with pytest.raises(errors.CorruptMessageError):
        list(iter_records(header, batch))


def reference_conversion(header: BatchHeader, batch: bytes | memoryview) -> bytes:
    """The conversion as it was first written: iter_records decoded, BatchBuilder re-encoded."""
    builder = BatchBuilder()
    for _offset_delta, timestamp, key, value, headers in iter_records(header, batch):
        builder.append(key, value, [(k, v) for k, v in headers if v is not None], timestamp)
    head, records = builder.build_serialized(
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        transactional=header.transactional,
    )
    return head + records


def test_the_in_line_conversion_writes_the_bytes_the_builder_writes() -> None:
    # Every varint width the in-line decoding takes: one byte, two (64 B to 8 KiB), three and
    # more (longer values), negative timestamp deltas (out-of-order timestamps), null keys and
    # values, empty ones, and headers.
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 1, 5, 2, 40, 1 << 24)
    cases = [
        (b"k", b"v", []),
        (None, b"x" * 63, []),
        (b"key" * 30, b"y" * 64, [("h", b"1")]),
        (b"", None, []),
        (None, None, [("a", b""), ("b", b"z" * 200)]),
        (b"big", b"w" * 9000, []),
        (b"huge", b"u" * 300_000, []),
    ]
    timestamps = [1_700_000_000_500, 1_700_000_000_000, 1_700_000_009_000, 1_700_000_000_001, 5, 1_700_000_000_002, 7]
    for i, ((key, value, headers), ts) in enumerate(zip(cases, timestamps, strict=True)):
        builder.append(i, ts, key, value, headers)
    [(header, batch)] = split_batches(bytes(builder.build()))
    converted = to_sluice_batch(header, batch)
    assert converted.SerializeToString() == reference_conversion(header, batch)
    assert verify_crc(converted) and converted.max_timestamp == 1_700_000_009_000
    assert [(r.key, r.value, list(r.headers), r.timestamp) for r in decode_records(converted)] == [
        (k, v, h, ts) for (k, v, h), ts in zip(cases, timestamps, strict=True)
    ]


def test_a_null_header_value_and_a_gap_in_offsets_are_refused() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [("h", None)])
    [(header, batch)] = split_batches(bytes(builder.build()))
    with pytest.raises(errors.InvalidRecordError, match="record 0 of the batch: header 'h' has a null value") as exc:
        to_sluice_batch(header, batch)
    assert isinstance(exc.value, RecordRefusedError) and exc.value.record_index == 0
    builder = default_records.DefaultRecordBatchBuilder(2, COMPRESSION_NONE, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    builder.append(2, 1, b"k", b"v", [])  # offset delta 2 after 0
    [(header, batch)] = split_batches(bytes(builder.build()))
    with pytest.raises(errors.InvalidRecordError, match="offset delta 2 where 1"):
        to_sluice_batch(header, batch)


def test_a_record_that_lies_about_its_length_is_corrupt_in_the_conversion_too() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, -1, -1, -1, 1 << 20)
    builder.append(0, 1, b"k", b"v", [])
    builder.append(1, 1, b"k", b"v", [])
    data = bytearray(builder.build())
    data[HEADER_SIZE] += 2
    data[17:21] = struct.pack(">I", crc32c.crc32c(bytes(data[21:])))
    [(header, batch)] = split_batches(bytes(data))
    with pytest.raises(errors.CorruptMessageError):
        to_sluice_batch(header, batch)
    truncated = bytearray(kafka_batch())
    truncated[57:61] = struct.pack(">i", len(RECORDS) + 1)  # one record more than there are
    truncated[17:21] = struct.pack(">I", crc32c.crc32c(bytes(truncated[21:])))
    [(header, batch)] = split_batches(bytes(truncated))
    with pytest.raises(errors.CorruptMessageError):
        to_sluice_batch(header, batch)
