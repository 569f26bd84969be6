"""Spark's own Kafka connector (``format("kafka")``, spark-sql-kafka-0-10) against Sluice's Kafka listener.

The connector is Kafka's Java client inside Spark: its driver plans with an AdminClient
(Metadata, ListOffsets at the requested isolation level), its tasks read assigned partitions with
a KafkaConsumer (Fetch, offset gaps where aborted records and markers are) and its sink writes with
an idempotent KafkaProducer. The jars are the connector for the installed pyspark's Spark and
Scala versions, fetched from Maven Central (tests/support/spark_kafka) and put on the session's
``spark.jars`` by conftest.py.

The topic under test is written by librdkafka's transactional producer (an aborted transaction,
committed ones with keys and headers, on 2 partitions), so the same fixture also checks the mixed
path: ``format("sluice")`` (gRPC) reads exactly what ``format("kafka")`` and Sluice's Consumer read.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark.sql import DataFrame, SparkSession

from sluice import client
from sluice.testing import LocalCluster

confluent_kafka = pytest.importorskip("confluent_kafka")  # the dev extra installs it

Row = tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]
LIMIT_S = 60.0


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("spark-kafka"), kafka_listener=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def rd_topic(kcluster: LocalCluster) -> tuple[str, list[Row]]:
    """A 2-partition topic written by librdkafka in transactions; returns (topic, the committed rows)."""
    topic = f"spark-kafka-{uuid.uuid4().hex[:6]}"
    with client.Admin(bootstrap_servers=kcluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=1)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": kcluster.kafka_bootstrap_servers, "transactional.id": f"tx-{topic}", "linger.ms": 5}
    )
    producer.init_transactions(LIMIT_S)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=b"a%d" % i, value=b"aborted-%d" % i, partition=i % 2)
    assert producer.flush(LIMIT_S) == 0
    producer.abort_transaction(LIMIT_S)
    for t in range(4):
        producer.begin_transaction()
        for i in range(25):
            producer.produce(topic, key=b"k%d-%d" % (t, i), value=b"v%d-%d" % (t, i), partition=i % 2,
                             headers=[("txn", b"%d" % t), ("i", b"%d" % i)])  # fmt: skip
        producer.commit_transaction(LIMIT_S)
    return topic, grpc_rows(kcluster, topic, 2, 100)


def grpc_rows(cluster: LocalCluster, topic: str, partitions: int, count: int) -> list[Row]:
    """What Sluice's Consumer reads (read_committed) from the beginning: ``count`` rows."""
    import time

    consumer = client.Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
    try:
        consumer.assign([client.TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        out: list[Row] = []
        deadline = time.monotonic() + LIMIT_S
        while len(out) < count and time.monotonic() < deadline:
            out += [(r.partition, r.offset, r.key, r.value, tuple(r.headers)) for r in consumer.poll(timeout=0.5)]
        return sorted(out)
    finally:
        consumer.close()


def spark_rows(df: DataFrame) -> list[Row]:
    return sorted(
        (r.partition, r.offset, r.key, r.value, tuple((h.key, bytes(h.value)) for h in (r.headers or [])))
        for r in df.select("partition", "offset", "key", "value", "headers").collect()
    )


def kafka_read(spark: SparkSession, cluster: LocalCluster, topic: str, isolation: str) -> DataFrame:
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", cluster.kafka_bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", isolation)
        .load()
    )


def test_spark_kafka_batch_read_committed(spark: SparkSession, kcluster: LocalCluster,
                                          rd_topic: tuple[str, list[Row]]) -> None:  # fmt: skip
    topic, committed = rd_topic
    assert len(committed) == 100
    df = kafka_read(spark, kcluster, topic, "read_committed")
    assert [f.name for f in df.schema.fields] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType", "headers",
    ]  # fmt: skip
    assert spark_rows(df) == committed
    # read_uncommitted: the aborted transaction's records too, at the offsets before its marker
    unc = spark_rows(kafka_read(spark, kcluster, topic, "read_uncommitted"))
    assert [r for r in unc if r in committed] == committed
    assert sorted(r[3] for r in unc if r not in committed) == sorted(b"aborted-%d" % i for i in range(10))


def test_sluice_source_reads_what_librdkafka_committed(spark: SparkSession, kcluster: LocalCluster,
                                                       rd_topic: tuple[str, list[Row]]) -> None:  # fmt: skip
    topic, committed = rd_topic
    df = (
        spark.read.format("sluice")
        .option("bootstrap.servers", kcluster.bootstrap_servers)
        .option("subscribe", topic)
        .option("includeHeaders", "true")
        .load()
    )
    assert spark_rows(df) == committed


def test_spark_kafka_read_stream_micro_batch(spark: SparkSession, kcluster: LocalCluster,
                                            rd_topic: tuple[str, list[Row]], tmp_path: Path) -> None:  # fmt: skip
    topic, committed = rd_topic
    name = f"kafka_stream_{uuid.uuid4().hex[:6]}"
    stream = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kcluster.kafka_bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
        .option("kafka.isolation.level", "read_committed")
        .load()
    )
    query = (
        stream.writeStream.format("memory").queryName(name)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )  # fmt: skip
    try:
        assert query.awaitTermination(180), "the availableNow micro-batch did not finish in 180 s"
        assert query.exception() is None
        assert spark_rows(spark.table(name)) == committed
        assert sum(p["numInputRows"] for p in query.recentProgress) == len(committed)
    finally:
        query.stop()


def test_spark_kafka_write_read_back_by_the_grpc_consumer(spark: SparkSession, kcluster: LocalCluster) -> None:
    topic = f"spark-kafka-out-{uuid.uuid4().hex[:6]}"
    with client.Admin(bootstrap_servers=kcluster.bootstrap_servers) as admin:
        admin.create_topic(topic, partitions=2, replication_factor=1)
    rows = [(b"k%d" % i, b"value-%d" % i, [("src", b"spark"), ("i", b"%d" % i)]) for i in range(200)]
    df = spark.createDataFrame(rows, "key binary, value binary, headers array<struct<key: string, value: binary>>")
    (
        df.repartition(2).write.format("kafka")
        .option("kafka.bootstrap.servers", kcluster.kafka_bootstrap_servers)
        .option("topic", topic)
        .save()
    )  # fmt: skip
    got = grpc_rows(kcluster, topic, 2, 200)
    assert len(got) == 200
    # Spark's Kafka sink is at least once: a run without task retries writes each row exactly once
    assert sorted((k, v, h) for _p, _o, k, v, h in got) == sorted((k, v, tuple(h)) for k, v, h in rows)
    for p in range(2):
        offsets = [o for part, o, *_ in got if part == p]
        assert offsets == list(range(len(offsets)))
