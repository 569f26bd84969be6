"""The Arrow decoder of the Spark reader against the record codec's own decoder."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema

from sluice.api.v1 import records_pb2
from sluice.broker.kafka.record_batch import split_batches, to_stored_batch
from sluice.records import BatchBuilder, RecordBatch, control_batch, decode_record_tuples
from sluice.spark.arrow import arrow_schema, decode_batches
from sluice.spark.source import read_schema

default_records = pytest.importorskip("kafka.record.default_records")  # the dev extra installs kafka-python


def _batch(base: int, records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes]] | None]]) -> RecordBatch:
    builder = BatchBuilder()
    for i, (key, value, headers) in enumerate(records):
        builder.append(key, value, headers, 1_700_000_000_000 + base + i)
    batch = builder.build(producer_id=-1, producer_epoch=-1)
    batch.base_offset = base
    return batch


Row = tuple[int, int, bytes | None, bytes | None, object]


def _expected(batches: list[RecordBatch], start: int, end: int) -> list[Row]:
    out = []
    for b in batches:
        if b.control:
            continue
        for offset, ts, key, value, headers in decode_record_tuples(b):
            if start <= offset < end:
                out.append((offset, ts, key, value, [{"key": k, "value": v} for k, v in headers] or None))
    return out


def _got(rb: pa.RecordBatch) -> list[Row]:
    d = rb.to_pydict()
    headers = d.get("headers", [None] * rb.num_rows)
    return [
        (o, int(t.timestamp() * 1000), k, v, h)
        for o, t, k, v, h in zip(d["offset"], d["timestamp"], d["key"], d["value"], headers, strict=True)
    ]


@pytest.mark.parametrize("include_headers", [False, True])
def test_schema_is_what_spark_expects(include_headers: bool) -> None:
    assert arrow_schema(include_headers).equals(to_arrow_schema(read_schema(include_headers), timezone="UTC"))


def test_uniform_and_varied_batches_decode_like_the_codec() -> None:
    rnd = random.Random(3)
    uniform = _batch(0, [(b"k", b"v" * 100, None) for _ in range(500)])
    varied = _batch(
        500,
        [
            (
                None if i % 5 == 0 else f"key-{i}".encode(),
                None if i % 7 == 0 else bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 60))),
                [("trace", b"x" * (i % 3)), ("n", b"")] if i % 4 == 0 else None,
            )
            for i in range(300)
        ],
    )
    marker = control_batch(5, 0, True, 0)
    marker.base_offset = 800
    after = _batch(801, [(b"k2", b"w" * 100, None) for _ in range(50)])
    batches = [uniform, varied, marker, after]
    schema = arrow_schema(True)
    rb = decode_batches(batches, "orders", 3, 0, 10_000, schema)
    assert rb is not None and rb.schema.equals(schema)
    assert _got(rb) == _expected(batches, 0, 10_000)
    assert set(rb.column("topic").to_pylist()) == {"orders"} and set(rb.column("partition").to_pylist()) == {3}
    assert set(rb.column("timestampType").to_pylist()) == {0}
    # ranges that cut batches anywhere: inside the uniform one, across the marker, inside the varied one
    for start, end in [(17, 480), (499, 501), (520, 802), (0, 1), (600, 851), (801, 851)]:
        part = decode_batches(batches, "orders", 3, start, end, schema)
        assert part is not None
        assert _got(part) == _expected(batches, start, end), (start, end)
    assert decode_batches(batches, "orders", 3, 800, 801, schema) is None  # only the marker
    assert decode_batches([], "orders", 3, 0, 10, schema) is None


def test_log_append_time_batches_carry_the_broker_time() -> None:
    batch = _batch(0, [(None, b"a", None), (None, b"b", None)])
    batch.timestamp_type = records_pb2.LOG_APPEND_TIME
    batch.max_timestamp = 1_800_000_000_123
    rb = decode_batches([batch], "t", 0, 0, 2, arrow_schema(False))
    assert rb is not None
    assert rb.column("timestampType").to_pylist() == [1, 1]
    assert [int(t.timestamp() * 1000) for t in rb.column("timestamp").to_pylist()] == [1_800_000_000_123] * 2


def _kafka_batch(base: int, records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
                 codec: int = 0) -> RecordBatch:  # fmt: skip
    """A batch as a Kafka client's v2 batch is stored (kafka-python builds it; records_format KAFKA_V2)."""
    builder = default_records.DefaultRecordBatchBuilder(2, codec, 0, -1, -1, -1, 1 << 24)
    for i, (key, value, headers) in enumerate(records):
        builder.append(i, 1_700_000_000_000 + base + i, key, value, headers)
    [(header, data)] = split_batches(bytes(builder.build()))
    batch = to_stored_batch(header, data)
    batch.base_offset = base
    return batch


@pytest.mark.parametrize("codec", [0, 1, 3])  # none, gzip, lz4
def test_batches_in_kafkas_encoding_decode_like_the_codec(codec: int) -> None:
    rnd = random.Random(5)
    kafka_batch = _kafka_batch(
        100,
        [
            (
                None if i % 5 == 0 else f"key-{i}".encode(),
                None if i % 7 == 0 else bytes(rnd.randrange(256) for _ in range(rnd.randint(0, 300))),
                [("trace", b"x" * (i % 3)), ("null", None)] if i % 4 == 0 else [],
            )
            for i in range(300)
        ],
        codec,
    )
    assert kafka_batch.records_format == records_pb2.RECORDS_FORMAT_KAFKA_V2
    batches = [_batch(0, [(b"k", b"v" * 10, None) for _ in range(100)]), kafka_batch]  # both encodings, one fetch
    schema = arrow_schema(True)
    for start, end in [(0, 10_000), (50, 150), (101, 399), (399, 400)]:
        rb = decode_batches(batches, "orders", 3, start, end, schema)
        assert rb is not None
        assert _got(rb) == _expected(batches, start, end), (start, end)
