"""Both protocols on one topic: transactions written over one, read_committed over the other.

A transaction is one object whichever protocol wrote it (the same coordinator, markers, LSO and
aborted index), so a record has one offset, key, value and header list for every reader:

* Sluice's gRPC transactional Producer (one transaction aborted, one committed, then one left
  open), read by librdkafka read_committed and read_uncommitted: the same rows as the gRPC
  consumer, nothing of the open transaction for read_committed;
* librdkafka's transactional producer (aborted, committed, keys, values, headers on 2
  partitions), read by Sluice's Consumer: the same rows librdkafka's own read_committed consumer
  sees. (``spark.read.format("sluice")`` of such a topic: tests/spark/test_kafka_connector.py.)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from sluice import client
from sluice.testing import LocalCluster

from .test_kafka_librdkafka import LIMIT_S, Row, create, grpc_read, rd_producer, rd_read


@pytest.fixture(scope="module")
def kcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(brokers=1, data_dir=tmp_path_factory.mktemp("mixed"), kafka_listener=True) as cluster:
        yield cluster


def test_grpc_transactions_read_by_librdkafka(kcluster: LocalCluster) -> None:
    topic = f"mixed-grpc-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic)
    producer = client.Producer(bootstrap_servers=kcluster.bootstrap_servers, transactional_id=f"g-{topic}")
    producer.init_transactions()
    producer.begin_transaction()
    for i in range(4):
        producer.send(topic, key=b"a%d" % i, value=b"aborted-%d" % i, partition=0)
    producer.flush()
    producer.abort_transaction()
    producer.begin_transaction()
    for i in range(6):
        producer.send(topic, key=b"c%d" % i, value=b"committed-%d" % i, partition=0, headers=[("h", b"%d" % i)])
    producer.commit_transaction()
    committed = grpc_read(kcluster, topic, "read_committed", 6)
    assert [r[3] for r in committed] == [b"committed-%d" % i for i in range(6)]
    # a transaction left open: not visible to read_committed, visible to read_uncommitted
    producer.begin_transaction()
    producer.send(topic, key=b"o", value=b"open", partition=0)
    producer.flush()
    try:
        assert rd_read(kcluster, topic, "read_committed") == committed
        uncommitted = grpc_read(kcluster, topic, "read_uncommitted", 11)
        assert len(uncommitted) == 11 and uncommitted[-1][3] == b"open"
        assert rd_read(kcluster, topic, "read_uncommitted") == uncommitted
    finally:
        producer.abort_transaction()
        producer.close()


def test_librdkafka_transactions_read_by_the_grpc_consumer(kcluster: LocalCluster) -> None:
    topic = f"mixed-rd-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic, partitions=2)
    producer = rd_producer(kcluster, **{"transactional.id": f"rd-{topic}"})
    producer.init_transactions(LIMIT_S)
    producer.begin_transaction()
    for i in range(6):
        producer.produce(topic, key=b"a%d" % i, value=b"aborted-%d" % i, partition=i % 2)
    assert producer.flush(LIMIT_S) == 0
    producer.abort_transaction(LIMIT_S)
    expected: list[tuple[int, bytes, bytes, list[tuple[str, bytes]]]] = []
    for t in range(3):
        producer.begin_transaction()
        for i in range(10):
            key, value = b"k%d-%d" % (t, i), b"v%d-%d" % (t, i)
            headers = [("txn", b"%d" % t), ("i", b"%d" % i)]
            producer.produce(topic, key=key, value=value, partition=i % 2, headers=headers)
            expected.append((i % 2, key, value, headers))
        producer.commit_transaction(LIMIT_S)

    ours: list[Row] = grpc_read(kcluster, topic, "read_committed", 30, partitions=2)
    theirs = rd_read(kcluster, topic, "read_committed", partitions=2)
    assert ours == theirs
    assert sorted((p, k, v, h) for p, _o, k, v, h in ours) == sorted(expected)
    # the aborted records are in the log (read_uncommitted) at offsets read_committed skips
    unc = grpc_read(kcluster, topic, "read_uncommitted", 36, partitions=2)
    assert [r for r in unc if r in ours] == ours
    assert sorted(r[3] for r in unc if r not in ours) == sorted(b"aborted-%d" % i for i in range(6))
