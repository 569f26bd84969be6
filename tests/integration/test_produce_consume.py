"""Plain produce/consume, compression, offsets look-ups and topic administration on a real broker."""

from __future__ import annotations

import time

import pytest

from sluice import errors
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .helpers import read_topic


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_round_trip_with_keys_headers_and_compression(
    cluster: LocalCluster, unique_topic: str, compression: str | None
) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=3, replication_factor=1)
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, compression=compression, linger_ms=2)
    sent = [(f"k{i}".encode(), f"value-{i}".encode() * 20, [("h", str(i).encode())]) for i in range(300)]
    futures = [p.send(unique_topic, value=v, key=k, headers=h) for k, v, h in sent]
    p.flush()
    metas = [f.result(timeout=30) for f in futures]
    p.close()
    # the same key always lands on the same partition
    by_key = {}
    for (k, _v, _h), m in zip(sent, metas, strict=True):
        assert by_key.setdefault(k, m.partition) == m.partition
    got = read_topic(cluster.bootstrap_servers, unique_topic)
    assert sorted((r[2], r[3]) for r in got) == sorted((k, v) for k, v, _h in sent)
    c = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
    c.assign([TopicPartition(unique_topic, metas[0].partition)])
    records = []
    deadline = time.monotonic() + 20
    while not records and time.monotonic() < deadline:
        records = c.poll(timeout=1.0)
    c.close()
    first = next(r for r in records if r.offset == metas[0].offset)
    assert first.headers == [("h", b"0")] and first.key == b"k0"
    admin.close()


def test_send_many_in_a_transaction_and_outside_one(cluster: LocalCluster, unique_topic: str) -> None:
    """Producer.send_many: every value stored once, in order per partition, batches spread over the
    partitions; with an explicit partition all there; in a transaction, visible after the commit."""
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=3, replication_factor=1)
    admin.close()
    values = [b"%06d" % i * 10 for i in range(20_000)]  # 60 B each: several 16 KiB batches
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, batch_size=16_384, linger_ms=5)
    futures = p.send_many(unique_topic, values)
    assert len(futures) == len(values)
    explicit = p.send_many(unique_topic, [f"to-two-{i}" for i in range(100)], partition=2)
    futures.wait(timeout=30)
    metas = [f.result(timeout=0) for f in futures]
    assert len({m.partition for m in metas}) == 3  # sticky, then another partition when a batch is full
    small = []  # calls smaller than a batch, each after the last one was sent: on to another partition
    for i in range(6):
        small.append(p.send_many(unique_topic, [b"small-%d-%d" % (i, j) for j in range(10)]))
        p.flush()
    assert len({sent[0].result(0).partition for sent in small}) > 1
    assert {f.result(timeout=30).partition for f in explicit} == {2}
    p.close()
    t = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"{unique_topic}-txn")
    t.init_transactions()
    t.begin_transaction()
    assert len(t.send_many(unique_topic, [])) == 0
    t.send_many(unique_topic, [b"txn-%d" % i for i in range(5_000)], partition=0)
    t.commit_transaction()
    t.close()
    got = read_topic(cluster.bootstrap_servers, unique_topic)
    by_partition: dict[int, list[bytes]] = {}
    for r in got:
        by_partition.setdefault(r[0], []).append(r[3])
    assert sorted(v for vs in by_partition.values() for v in vs) == sorted(
        values
        + [b"to-two-%d" % i for i in range(100)]
        + [b"small-%d-%d" % (i, j) for i in range(6) for j in range(10)]
        + [b"txn-%d" % i for i in range(5_000)]
    )
    stored = {(r[0], r[1]): r[3] for r in got}
    assert all(stored[(m.partition, m.offset)] == v for m, v in zip(metas, values, strict=True))  # where each is
    assert [v for v in by_partition[0] if v.startswith(b"txn-")] == [b"txn-%d" % i for i in range(5_000)]


def test_send_many_to_a_topic_that_does_not_exist_fails_every_record_after_one_wait(cluster: LocalCluster) -> None:
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, max_block_ms=500)
    started = time.monotonic()
    sent = p.send_many("no-such-topic-here", [b"a"] * 1000)
    assert time.monotonic() - started < 10  # one wait for its metadata, not one per record
    assert len(sent) == 1000
    with pytest.raises(errors.SluiceError):
        sent.wait(timeout=1)
    assert isinstance(sent[999].exception(0), errors.SluiceError)
    p.close()


def test_list_offsets_and_timestamps(cluster: LocalCluster, unique_topic: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    for i in range(10):
        p.send(unique_topic, value=b"x", timestamp_ms=1_000_000 + i * 1000).result(timeout=30)
    p.close()
    tp = TopicPartition(unique_topic, 0)
    c = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
    assert c.beginning_offsets([tp])[tp] == 0
    assert c.end_offsets([tp])[tp] == 10
    found = c.offsets_for_times({tp: 1_004_500})
    assert found[tp] is not None and (found[tp].offset, found[tp].timestamp) == (5, 1_005_000)
    assert c.offsets_for_times({tp: 2_000_000})[tp] is None
    c.assign([tp])
    c.seek(tp, 7)
    assert c.position(tp) == 7
    c.close()
    admin.close()


def test_topic_admin(cluster: LocalCluster, unique_topic: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(unique_topic, partitions=2, replication_factor=1, config={"retention.ms": "-1"})
    assert unique_topic in admin.list_topics()
    assert "__consumer_offsets" not in admin.list_topics()
    described = admin.describe_topic(unique_topic)
    assert len(described.partitions) == 2 and described.config["retention.ms"] == "-1"
    with pytest.raises(errors.TopicAlreadyExistsError):
        admin.create_topic(unique_topic, partitions=1, replication_factor=1)
    admin.create_partitions(unique_topic, 4)
    assert len(admin.describe_topic(unique_topic).partitions) == 4
    p = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
    p.send(unique_topic, value=b"old", partition=3).result(timeout=30)
    p.close()
    admin.delete_topic(unique_topic)
    assert unique_topic not in admin.list_topics()
    with pytest.raises(errors.UnknownTopicOrPartitionError):
        admin.describe_topic(unique_topic)
    admin.create_topic(unique_topic, partitions=4, replication_factor=1)  # a new topic: nothing of the old
    assert read_topic(cluster.bootstrap_servers, unique_topic, idle_s=1.0) == []
    admin.close()


def test_retention_drops_old_batches(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with LocalCluster(brokers=1, data_dir=tmp_path, config={"log.retention.check.interval.ms": "200"}) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("short", partitions=1, replication_factor=1, config={"retention.ms": "1000"})
        p = Producer(bootstrap_servers=cluster.bootstrap_servers, linger_ms=0)
        old = int(time.time() * 1000) - 60_000
        for i in range(5):
            p.send("short", value=b"old", timestamp_ms=old + i).result(timeout=30)
        p.close()
        tp = TopicPartition("short", 0)
        c = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
        deadline = time.monotonic() + 20
        while c.beginning_offsets([tp])[tp] < 5 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert c.beginning_offsets([tp])[tp] == 5
        c.close()
        admin.close()


def test_offsets_of_a_partition_added_after_the_client_cached_the_topic(
    cluster: LocalCluster, unique_topic: str
) -> None:
    """The consumer's metadata cache knows the topic with one partition; the partition added later
    is found by refreshing, not waited for until the timeout."""
    with Admin(bootstrap_servers=cluster.bootstrap_servers) as admin:
        admin.create_topic(unique_topic, partitions=1)
        consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
        assert consumer.end_offsets([TopicPartition(unique_topic, 0)]) == {TopicPartition(unique_topic, 0): 0}
        admin.create_partitions(unique_topic, 2)
    new = TopicPartition(unique_topic, 1)
    assert consumer.end_offsets([new], timeout=20) == {new: 0}  # raised KafkaTimeoutError before the fix
    consumer.close()
