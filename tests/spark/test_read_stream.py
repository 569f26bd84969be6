"""Streaming reads through Spark (local[2]) against a real broker: checkpoints, the LSO, limits, new partitions."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from pyspark.sql import SparkSession

from sluice.client import Admin, Producer
from sluice.testing import LocalCluster
from tests.spark.data import Written, create_topic, transaction, transactional_producer
from tests.spark.stream import BatchRecorder, run_available_now, start, stream, wait_until


def _positions(written: list[Written]) -> Counter[tuple[str, int, int]]:
    return Counter((w.topic, w.partition, w.offset) for w in written)


def test_restart_from_checkpoint_reads_every_committed_record_once(
    spark: SparkSession, cluster: LocalCluster, unique_topic: str, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 2)
    checkpoint = str(tmp_path / "checkpoint")
    df = stream(spark, bootstrap, subscribe=unique_topic, startingOffsets="earliest")
    p1 = transactional_producer(bootstrap)
    committed = transaction(p1, unique_topic, [f"t1-{i}".encode() for i in range(200)])
    aborted = transaction(p1, unique_topic, [f"a1-{i}".encode() for i in range(50)], commit=False)
    committed += transaction(p1, unique_topic, [f"t2-{i}".encode() for i in range(100)])

    first = BatchRecorder()
    run_available_now(df, first, checkpoint)
    assert first.positions() == _positions(committed)

    # More data while the query is down: an aborted transaction, a committed one, then a transaction left
    # open on partition 0 followed by committed records on both partitions.
    aborted += transaction(p1, unique_topic, [f"a2-{i}".encode() for i in range(40)], commit=False)
    t3 = transaction(p1, unique_topic, [f"t3-{i}".encode() for i in range(120)])
    p2 = transactional_producer(bootstrap, timeout_ms=600_000)
    open_ = transaction(p2, unique_topic, [f"o-{i}".encode() for i in range(30)], partition=0, commit=None)
    t4 = transaction(p1, unique_topic, [f"t4p0-{i}".encode() for i in range(25)], partition=0)
    t4 += transaction(p1, unique_topic, [f"t4p1-{i}".encode() for i in range(25)], partition=1)

    second = BatchRecorder()
    run_available_now(df, second, checkpoint)
    # never past the last stable offset: partition 0 stops where the open transaction starts
    visible_now = t3 + [w for w in t4 if w.partition == 1]
    assert second.positions() == _positions(visible_now)

    p2.commit_transaction()
    third = BatchRecorder()
    run_available_now(df, third, checkpoint)
    assert third.positions() == _positions(open_ + [w for w in t4 if w.partition == 0])

    everything = first.positions() + second.positions() + third.positions()
    assert everything == _positions(committed + t3 + open_ + t4)  # each committed record exactly once
    seen_values = {v for s in (first, second, third) for *_x, v in s.records()}
    assert not seen_values & {w.value for w in aborted}
    p1.close()
    p2.close()


def test_max_offsets_per_trigger_and_a_stop_in_the_middle(
    spark: SparkSession, cluster: LocalCluster, unique_topic: str, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 3)
    producer = transactional_producer(bootstrap)
    written: list[Written] = []
    for n in range(6):
        written += transaction(producer, unique_topic, [f"r{n}-{i}".encode() for i in range(100)])
        transaction(producer, unique_topic, [f"x{n}-{i}".encode() for i in range(10)], commit=False)
    producer.close()
    checkpoint = str(tmp_path / "checkpoint")
    df = stream(spark, bootstrap, subscribe=unique_topic, startingOffsets="earliest", maxOffsetsPerTrigger="100")

    sink = BatchRecorder()
    query = start(df, sink, checkpoint, processingTime="200 milliseconds")
    try:
        wait_until(lambda: len(sink.batches) >= 2, 180, "two micro-batches", query)
    finally:
        query.stop()
    assert sink.count() < len(written), "the limit should have left work for the restart"
    run_available_now(df, sink, checkpoint)
    assert sink.positions() == _positions(written)
    # the limit counts offsets (aborted records and markers included), rounded up per partition
    assert max(len(rows) for rows in sink.batches.values()) <= 100 + 3
    assert len(sink.batches) >= len(written) // 103


def test_a_partition_added_to_the_topic_is_picked_up(
    spark: SparkSession, cluster: LocalCluster, unique_topic: str, tmp_path: Path
) -> None:
    bootstrap = cluster.bootstrap_servers
    create_topic(bootstrap, unique_topic, 1)
    producer = Producer(bootstrap_servers=bootstrap)
    for i in range(20):
        producer.send(unique_topic, value=f"before-{i}".encode(), partition=0)
    producer.flush()
    sink = BatchRecorder()
    query = start(
        stream(spark, bootstrap, subscribe=unique_topic, startingOffsets="earliest"),
        sink,
        str(tmp_path / "checkpoint"),
        processingTime="200 milliseconds",
    )
    try:
        wait_until(lambda: sink.count() == 20, 180, "the first 20 records", query)
        with Admin(bootstrap_servers=bootstrap) as admin:
            admin.create_partitions(unique_topic, 2)
        producer = Producer(bootstrap_servers=bootstrap)
        for i in range(15):
            producer.send(unique_topic, value=f"after-{i}".encode(), partition=1)
        producer.flush()
        producer.close()
        wait_until(lambda: sink.count() >= 35, 120, "the records of the new partition", query)
    finally:
        query.stop()
    by_partition = Counter(p for _t, p, _o, _v in sink.records())
    assert by_partition == {0: 20, 1: 15}
    assert sorted(v for _t, p, _o, v in sink.records() if p == 1) == sorted(f"after-{i}".encode() for i in range(15))
