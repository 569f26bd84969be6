"""Batch reads through Spark (local[2]) against a real broker: columns, isolation, ranges, splits, errors."""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from sluice.client import Producer
from sluice.testing import LocalCluster
from tests.spark.data import Written, create_topic, transaction, transactional_producer


def _read(spark: SparkSession, bootstrap: str, **options: object) -> DataFrame:
    reader = spark.read.format("sluice").option("bootstrap.servers", bootstrap)
    for k, v in options.items():
        reader = reader.option(k, v if isinstance(v, str) else json.dumps(v) if isinstance(v, dict) else str(v))
    return reader.load()


def _rows(df: DataFrame) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted(
        (r.partition, r.offset, r.key, r.value) for r in df.select("partition", "offset", "key", "value").collect()
    )


def _expect(written: list[Written]) -> list[tuple[int, int, bytes | None, bytes | None]]:
    return sorted((w.partition, w.offset, w.key, w.value) for w in written)


@pytest.fixture
def mixed_topic(
    cluster: LocalCluster, unique_topic: str
) -> Iterator[tuple[str, list[Written], list[Written], list[Written]]]:
    """A 3-partition topic holding committed, aborted and (at its end) still open transactions.

    Returns (topic, committed, aborted, open). The open transaction stays open for the test.
    """
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 3)
    committed: list[Written] = []
    aborted: list[Written] = []
    p1 = transactional_producer(bootstrap)
    committed += transaction(p1, unique_topic, [f"c1-{i}".encode() for i in range(300)])
    aborted += transaction(p1, unique_topic, [f"a1-{i}".encode() for i in range(120)], commit=False)
    committed += transaction(
        p1, unique_topic, [f"h-{i}".encode() for i in range(30)], partition=1, headers=[("trace", b"t1"), ("n", b"")]
    )
    committed += transaction(p1, unique_topic, [f"c2-{i}".encode() for i in range(200)])
    p2 = transactional_producer(bootstrap, timeout_ms=600_000)  # stays open for the whole test
    open_ = transaction(p2, unique_topic, [f"o-{i}".encode() for i in range(50)], commit=None)
    yield unique_topic, committed, aborted, open_
    p2.abort_transaction()
    p2.close()
    p1.close()


def test_read_committed_returns_exactly_the_committed_records_with_kafka_columns(
    spark: SparkSession, cluster: LocalCluster, mixed_topic: tuple[str, list[Written], list[Written], list[Written]]
) -> None:
    topic, committed, _aborted, _open = mixed_topic
    df = _read(spark, cluster.bootstrap_servers, subscribe=topic, includeHeaders="true")
    assert df.schema == StructType(
        [
            StructField("key", BinaryType()),
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("offset", LongType()),
            StructField("timestamp", TimestampType()),
            StructField("timestampType", IntegerType()),
            StructField(
                "headers",
                ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())])),
            ),
        ]
    )
    rows = df.collect()
    by_position = {(r.partition, r.offset): r for r in rows}
    assert len(by_position) == len(rows), "a record was returned twice"
    assert sorted(by_position) == sorted((w.partition, w.offset) for w in committed)
    for w in committed:
        r = by_position[(w.partition, w.offset)]
        assert (r.topic, r.key, r.value, r.timestampType) == (topic, w.key, w.value, 0)
        assert r.timestamp == dt.datetime.fromtimestamp(w.timestamp / 1000, tz=dt.UTC).replace(tzinfo=None)
        if w.headers:
            assert [(h.key, bytes(h.value)) for h in r.headers] == list(w.headers)
        else:
            assert r.headers is None
    # without includeHeaders there is no headers column, as in Spark's Kafka source
    assert "headers" not in _read(spark, cluster.bootstrap_servers, subscribe=topic).columns


def test_read_uncommitted_sees_aborted_and_open_transactions(
    spark: SparkSession, cluster: LocalCluster, mixed_topic: tuple[str, list[Written], list[Written], list[Written]]
) -> None:
    topic, committed, aborted, open_ = mixed_topic
    every = _rows(_read(spark, cluster.bootstrap_servers, subscribe=topic, isolationLevel="read_uncommitted"))
    assert every == _expect(committed + aborted + open_)  # data records only: no transaction markers
    committed_only = _rows(_read(spark, cluster.bootstrap_servers, subscribe=topic))
    assert committed_only == _expect(committed)


def test_offset_ranges_assign_pattern_and_min_partitions(
    spark: SparkSession, cluster: LocalCluster, unique_topic: str
) -> None:
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 2)
    create_topic(bootstrap, f"{unique_topic}-other", 1)
    producer = transactional_producer(bootstrap)
    written = transaction(producer, unique_topic, [f"p0-{i}".encode() for i in range(400)], partition=0)
    written += transaction(producer, unique_topic, [f"p1-{i}".encode() for i in range(100)], partition=1)
    aborted = transaction(producer, unique_topic, [f"x-{i}".encode() for i in range(40)], partition=0, commit=False)
    written += transaction(producer, unique_topic, [f"p0b-{i}".encode() for i in range(60)], partition=0)
    other = transaction(producer, f"{unique_topic}-other", [b"o1", b"o2"])
    producer.close()
    assert aborted

    # explicit ranges: [10, 350) of partition 0 (aborted records and markers inside are stepped over), 1 from -2 to -1
    ranges = _read(
        spark,
        bootstrap,
        subscribe=unique_topic,
        startingOffsets={unique_topic: {"0": 10, "1": -2}},
        endingOffsets={unique_topic: {"0": 350, "1": -1}},
    )
    assert _rows(ranges) == _expect(
        [w for w in written if (w.partition == 0 and 10 <= w.offset < 350) or w.partition == 1]
    )
    # a range that spans the aborted transaction, starting inside the last committed one
    last_p0 = max(w.offset for w in written if w.partition == 0)
    spanning = _read(
        spark, bootstrap, assign={unique_topic: [0]}, startingOffsets={unique_topic: {"0": 395}},
        endingOffsets={unique_topic: {"0": last_p0 + 1}},
    )  # fmt: skip
    assert _rows(spanning) == _expect([w for w in written if w.partition == 0 and w.offset >= 395])

    # assign one partition; subscribePattern picks both topics
    assert _rows(_read(spark, bootstrap, assign={unique_topic: [1]})) == _expect(
        [w for w in written if w.partition == 1]
    )
    pattern = _read(spark, bootstrap, subscribePattern=f"{unique_topic}(-other)?")
    assert sorted((r.topic, r.value) for r in pattern.collect()) == sorted(
        [(unique_topic, w.value) for w in written] + [(f"{unique_topic}-other", w.value) for w in other]
    )

    # minPartitions splits the big partition: more tasks, the same records, none twice
    split = _read(spark, bootstrap, subscribe=unique_topic, minPartitions=8)
    assert split.rdd.getNumPartitions() >= 8
    assert _rows(split) == _expect(written)
    capped = _read(spark, bootstrap, subscribe=unique_topic, maxRecordsPerPartition=50)
    assert capped.rdd.getNumPartitions() >= (max(w.offset for w in written if w.partition == 0) + 1) // 50
    assert _rows(capped) == _expect(written)


def test_aggregation_over_a_read(spark: SparkSession, cluster: LocalCluster, unique_topic: str) -> None:
    """The data frame is an ordinary one: a group-by over it counts what was committed per key."""
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 3)
    producer = Producer(bootstrap_servers=bootstrap)
    for i in range(900):
        producer.send(unique_topic, value=b"x", key=f"customer-{i % 7}".encode())
    producer.flush()
    producer.close()
    counts = (
        _read(spark, bootstrap, subscribe=unique_topic)
        .selectExpr("CAST(key AS STRING) AS customer")
        .groupBy("customer")
        .count()
        .collect()
    )
    assert {r.customer: r["count"] for r in counts} == {
        f"customer-{k}": 900 // 7 + (1 if k < 900 % 7 else 0) for k in range(7)
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"subscribe": "{topic}", "startingOffsets": "latest"}, "'startingOffsets' cannot be 'latest'"),
        ({"subscribe": "{topic}", "startingOffsets": "{{bad json"}, "'startingOffsets' is not valid JSON"),
        ({"subscribe": "{topic}", "endingOffsets": '{{"{topic}":{{"0":999999}}}}'}, "past the end of the partition"),
        ({"subscribe": "{topic}", "startingOffset": "earliest"}, "unknown option(s) startingoffset"),
        ({"subscribe": "{topic}", "assign": '{{"{topic}":[0]}}'}, "exactly one of 'subscribe'"),
        ({"subscribe": "{topic}-does-not-exist"}, "does-not-exist"),
        ({"assign": '{{"{topic}":[5]}}'}, "not [5]"),
        ({"subscribe": "{topic}", "isolationLevel": "serializable"}, "'isolationLevel' must be"),
        ({"subscribe": "{topic}", "maxOffsetsPerTrigger": "10"}, "only for streaming queries"),
    ],
)
def test_bad_options_fail_with_a_clear_error(
    spark: SparkSession, cluster: LocalCluster, unique_topic: str, options: dict[str, str], message: str
) -> None:
    create_topic(cluster.bootstrap_servers, unique_topic, 1)
    given = {k: v.format(topic=unique_topic) for k, v in options.items()}
    with pytest.raises(PySparkException) as info:
        _read(spark, cluster.bootstrap_servers, **given).collect()
    assert message.format(topic=unique_topic) in str(info.value)


def test_user_schema_is_refused(spark: SparkSession, cluster: LocalCluster, unique_topic: str) -> None:
    create_topic(cluster.bootstrap_servers, unique_topic, 1)
    reader = (
        spark.read.format("sluice")
        .schema("value STRING")
        .option("bootstrap.servers", cluster.bootstrap_servers)
        .option("subscribe", unique_topic)
    )
    with pytest.raises(PySparkException, match="does not take a user-specified one"):
        reader.load().collect()
