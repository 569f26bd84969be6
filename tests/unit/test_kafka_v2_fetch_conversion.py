"""Stored Sluice batches as Kafka v2 batches (the Fetch path), with kafka-python's reader as oracle."""

from __future__ import annotations

import pytest

from sluice.api.v1 import records_pb2
from sluice.broker.kafka.handlers.produce import convert
from sluice.broker.kafka.record_batch import split_batches, stored_records, to_v2_batch, v2_batch_parts
from sluice.records import BatchBuilder, RecordBatch, RecordDecodeError, control_batch, decode_record_tuples

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python

TS = 1_700_000_000_000
RECORDS = [
    (b"k0", b"v" * 300, [], TS),
    (None, b"only value", [("h1", b"x"), ("h2", b"")], TS + 7),
    (b"key only", None, [], TS + 3),
    (b"", b"", [("empty", b"")], TS + 9),
]


def stored(codec: int = records_pb2.COMPRESSION_NONE, **producer: int | bool) -> RecordBatch:
    builder = BatchBuilder()
    for key, value, headers, ts in RECORDS:
        builder.append(key, value, headers, ts)
    batch = builder.build(compression=codec, **producer)  # type: ignore[arg-type]
    batch.base_offset, batch.partition_leader_epoch = 1000, 4
    return batch


@pytest.mark.parametrize(
    "codec", [records_pb2.COMPRESSION_NONE, records_pb2.COMPRESSION_GZIP, records_pb2.COMPRESSION_LZ4]
)
def test_kafka_python_reads_what_a_sluice_batch_becomes(codec: int) -> None:
    data = to_v2_batch(stored(codec, producer_id=42, producer_epoch=3, base_sequence=7, transactional=True))
    kb = default_records.DefaultRecordBatch(data)
    assert kb.validate_crc()
    assert (kb.base_offset, kb.producer_id, kb.producer_epoch, kb.base_sequence) == (1000, 42, 3, 7)
    assert kb.is_transactional and not kb.is_control_batch
    assert kb.last_offset_delta == 3 and kb.max_timestamp == TS + 9
    got = [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in kb]
    assert got == [(1000 + i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(RECORDS)]
    [(header, _)] = split_batches(data)  # our own validator accepts it too
    assert header.partition_leader_epoch == 4


def test_no_producer_id_is_kafkas_minus_one() -> None:
    kb = default_records.DefaultRecordBatch(to_v2_batch(stored(producer_id=0)))
    assert (kb.producer_id, kb.producer_epoch, kb.base_sequence) == (-1, -1, -1)


def test_log_append_time_sets_the_timestamp_type() -> None:
    batch = stored()
    batch.timestamp_type = records_pb2.LOG_APPEND_TIME
    batch.max_timestamp = TS + 60_000
    kb = default_records.DefaultRecordBatch(to_v2_batch(batch))
    assert kb.timestamp_type == 1
    assert {r.timestamp for r in kb} == {TS + 60_000}


@pytest.mark.parametrize("committed", [True, False])
def test_markers_are_control_batches_kafka_clients_recognise(committed: bool) -> None:
    marker = control_batch(42, 3, committed, 9, timestamp=TS)
    marker.base_offset = 77
    kb = default_records.DefaultRecordBatch(to_v2_batch(marker))
    assert kb.is_control_batch and kb.is_transactional and kb.base_offset == 77
    [record] = list(kb)
    assert record.key == (b"\x00\x00\x00\x01" if committed else b"\x00\x00\x00\x00")
    assert record.value == b"\x00\x00\x00\x00\x00\x09"  # version 0, coordinator epoch 9


def test_kafka_to_sluice_to_kafka_keeps_every_field() -> None:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 1, 42, 3, 7, 1 << 20)
    for i, (key, value, headers, ts) in enumerate(RECORDS):
        builder.append(i, ts, key, value, headers)
    batch = convert(bytes(builder.build()))
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence, batch.transactional) == (42, 3, 7, True)
    batch.base_offset = 5
    assert [r[1:] for r in decode_record_tuples(batch)] == [(ts, k, v, h) for k, v, h, ts in RECORDS]
    kb = default_records.DefaultRecordBatch(to_v2_batch(batch))
    assert [(r.offset, r.key, r.value, list(r.headers), r.timestamp) for r in kb] == [
        (5 + i, k, v, h, ts) for i, (k, v, h, ts) in enumerate(RECORDS)
    ]


def test_a_kafka_batch_round_trips_to_the_same_bytes() -> None:
    """Produced by kafka-python, stored as Sluice's, fetched as v2: byte for byte what was sent."""
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, 5, 0, 0, 1 << 24)
    for i in range(300):  # lengths past one varint byte (values up to 30 KB), null keys, headers
        key = b"k%d" % i if i % 2 else None
        builder.append(i, TS + 3 * i, key, bytes(100 * i), [("h", b"x")] if i % 3 else [])
    sent = bytes(builder.build())
    [(header, _batch)] = split_batches(sent)
    stored = convert(sent)
    stored.base_offset, stored.partition_leader_epoch = header.base_offset, header.partition_leader_epoch
    assert to_v2_batch(stored) == sent


def test_a_stored_batch_with_malformed_records_is_a_decode_error_not_a_wrong_batch() -> None:
    batch = stored()
    batch.records = batch.records[:-5]  # the last record's value runs past the end
    with pytest.raises(RecordDecodeError, match="offset 1000"):
        to_v2_batch(batch)
    batch = stored()
    batch.records = batch.records[:10]  # not even the first record's fixed part
    with pytest.raises(RecordDecodeError):
        to_v2_batch(batch)


def _kafka_batch(records: int, value_size: int) -> bytes:
    builder = default_records.DefaultRecordBatchBuilder(2, 0, 0, 5, 0, 0, 1 << 26)
    for i in range(records):
        builder.append(i, TS + i, b"k%d" % i, bytes([i % 251]) * value_size, [])
    return bytes(builder.build())


@pytest.mark.parametrize(
    ("records", "value_size", "base_offset", "epoch"),
    [(1, 0, 0, 0), (3, 100, 2**40, 7), (40, 1000, 2**62, 2**30), (300, 900, 5, 0)],  # up to 270 KB
)
def test_the_records_of_a_stored_kafka_batch_are_read_out_of_its_stored_bytes(
    records: int, value_size: int, base_offset: int, epoch: int
) -> None:
    """The fetch path sends the records section as a view into the stored value; it must be exactly
    the records field, whatever the widths of the varints before it (negative ids take ten bytes)."""
    sent = _kafka_batch(records, value_size)
    batch = convert(sent)
    batch.base_offset, batch.partition_leader_epoch = base_offset, epoch
    batch.producer_id = -1  # Kafka's "no producer id": a ten-byte varint in the stored form
    raw = batch.SerializeToString()
    view = stored_records(batch, raw)
    assert isinstance(view, memoryview) and view.obj is raw  # no copy
    assert bytes(view) == batch.records
    header, records = v2_batch_parts(batch, raw)
    assert bytes(header) + bytes(records) == to_v2_batch(batch)


def test_a_stored_batch_of_another_layout_gives_its_records_the_slow_way() -> None:
    """A value whose fields are not in the order the broker writes them (any protobuf writer may
    order them so) is still read right: from the parsed batch."""
    batch = convert(_kafka_batch(3, 10))
    raw = batch.SerializeToString()
    assert raw.endswith(b"\x78\x01")  # records_format (15) KAFKA_V2, after the records (14)
    reordered = raw[-2:] + raw[:-2]
    assert RecordBatch.FromString(reordered) == batch
    assert stored_records(batch, reordered) == batch.records
    assert not isinstance(stored_records(batch, reordered), memoryview)
    records_first = raw[raw.index(b"\x72") : -2] + raw[: raw.index(b"\x72")] + raw[-2:]
    assert RecordBatch.FromString(records_first) == batch
    assert stored_records(batch, records_first) == batch.records  # found at once: a view, and right
    assert stored_records(batch, None) == batch.records
    truncated = raw[: raw.index(b"\x72") + 5]  # the length says more than is there
    assert stored_records(batch, truncated) == batch.records
