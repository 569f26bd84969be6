"""librdkafka (confluent-kafka) against the Kafka listener of real broker processes, 1 broker and 3 (RF 3).

librdkafka's transactional producer is the strictest client of the transaction APIs: it keeps its
own state machine (init, begin, AddPartitionsToTxn before the first batch of a partition,
AddOffsetsToTxn + TxnOffsetCommit for ``send_offsets_to_transaction``, EndTxn), raises fatal
errors for fencing and refuses to go on after an answer it does not expect. These tests drive it
end to end and check what a user relies on:

* a transaction aborted then one committed: read_committed consumers see the committed records
  only, read_uncommitted ones both, at the offsets the gRPC consumer reads (markers in between);
* consume-transform-produce with ``send_offsets_to_transaction`` from an ``assign()`` consumer with
  a group.id (no group membership needed): the group's offsets move exactly with each commit, and
  an aborted transaction leaves them (and the output) as they were;
* a zombie: a second producer with the same transactional.id fences the first, whose next
  transactional call fails with a fatal fencing error; nothing the zombie wrote becomes visible;
* idempotent acks=all produce: every record acknowledged, at the offsets the gRPC consumer reads.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from sluice import client
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin
from sluice.testing import LocalCluster

from .wire import Wire

# (partition, offset, key, value, headers)
Row = tuple[int, int, bytes | None, bytes | None, list[tuple[str, bytes]]]
LIMIT_S = 60.0


@pytest.fixture(scope="module", params=[1, 3], ids=["1broker", "3brokers-rf3"])
def kcluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    brokers: int = request.param
    # 3 brokers: replication factor 3 and min.insync.replicas 2 for every topic (LocalCluster's defaults)
    with LocalCluster(brokers=brokers, data_dir=tmp_path_factory.mktemp(f"rdkafka-{brokers}"),
                      kafka_listener=True) as cluster:  # fmt: skip
        yield cluster


def rf(cluster: LocalCluster) -> int:
    return min(3, len(cluster.brokers))


def create(cluster: LocalCluster, topic: str, partitions: int = 1) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        admin.create_topic(topic, partitions=partitions, replication_factor=rf(cluster))
    finally:
        admin.close()


def rd_producer(cluster: LocalCluster, **conf: Any) -> Producer:
    base: dict[str, Any] = {"bootstrap.servers": cluster.kafka_bootstrap_servers, "linger.ms": 5}
    base.update(conf)
    return Producer(base)


def rd_consumer(cluster: LocalCluster, isolation: str, group: str | None = None, **conf: Any) -> Consumer:
    base: dict[str, Any] = {
        "bootstrap.servers": cluster.kafka_bootstrap_servers,
        "group.id": group or f"reader-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
    }
    base.update(conf)
    return Consumer(base)


def rd_read(cluster: LocalCluster, topic: str, isolation: str, partitions: int = 1) -> list[Row]:
    """Every record of the topic from the beginning up to the end (LSO or HW), read by librdkafka."""
    consumer = rd_consumer(cluster, isolation)
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        rows: list[Row] = []
        at_end: set[int] = set()
        deadline = time.monotonic() + LIMIT_S
        while len(at_end) < partitions and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=500, timeout=0.5):
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                    continue
                if err is not None:
                    raise KafkaException(err)
                at_end.discard(m.partition())
                rows.append(row(m))
        assert len(at_end) == partitions, f"librdkafka did not reach the end of {topic} in {LIMIT_S}s"
        return sorted(rows)
    finally:
        consumer.close()


def row(m: Message) -> Row:
    headers = [(k, bytes(v)) for k, v in (m.headers() or [])]
    return (m.partition(), m.offset(), m.key(), m.value(), headers)


def grpc_read(cluster: LocalCluster, topic: str, isolation: str, count: int, partitions: int = 1) -> list[Row]:
    """``count`` records of the topic read by Sluice's own (gRPC) consumer, as rows."""
    consumer = client.Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, isolation_level=isolation)
    try:
        consumer.assign([client.TopicPartition(topic, p) for p in range(partitions)])
        consumer.seek_to_beginning()
        out: list[Row] = []
        deadline = time.monotonic() + LIMIT_S
        while len(out) < count and time.monotonic() < deadline:
            out += [(r.partition, r.offset, r.key, r.value, list(r.headers)) for r in consumer.poll(timeout=0.5)]
        return sorted(out)
    finally:
        consumer.close()


def test_transaction_aborted_then_committed(kcluster: LocalCluster) -> None:
    topic = f"rd-txn-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic)
    producer = rd_producer(kcluster, **{"transactional.id": f"rd-tx-{uuid.uuid4().hex[:6]}"})
    producer.init_transactions(LIMIT_S)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"a%d" % i, value=b"aborted-%d" % i, partition=0)
    assert producer.flush(LIMIT_S) == 0  # the aborted records reached the log before the abort
    producer.abort_transaction(LIMIT_S)
    producer.begin_transaction()
    for i in range(5):
        producer.produce(topic, key=b"c%d" % i, value=b"committed-%d" % i, partition=0, headers=[("n", b"%d" % i)])
    producer.commit_transaction(LIMIT_S)

    # offsets 0-4 aborted, 5 the ABORT marker, 6-10 committed, 11 the COMMIT marker
    committed = [(0, 6 + i, b"c%d" % i, b"committed-%d" % i, [("n", b"%d" % i)]) for i in range(5)]
    aborted = [(0, i, b"a%d" % i, b"aborted-%d" % i, []) for i in range(5)]
    assert rd_read(kcluster, topic, "read_committed") == committed
    assert rd_read(kcluster, topic, "read_uncommitted") == aborted + committed
    # the same records at the same offsets through the other protocol
    assert grpc_read(kcluster, topic, "read_committed", 5) == committed
    assert grpc_read(kcluster, topic, "read_uncommitted", 10) == aborted + committed


def test_consume_transform_produce_offsets_move_with_commit_only(kcluster: LocalCluster) -> None:
    suffix = uuid.uuid4().hex[:6]
    src, dst, group = f"rd-ctp-in-{suffix}", f"rd-ctp-out-{suffix}", f"rd-ctp-{suffix}"
    create(kcluster, src, partitions=3)
    create(kcluster, dst, partitions=3)
    feed = client.Producer(bootstrap_servers=kcluster.bootstrap_servers)
    for i in range(300):
        feed.send(src, key=b"%d" % i, value=b"in-%d" % i, partition=i % 3)
    feed.flush()

    consumer = rd_consumer(kcluster, "read_committed", group=group, **{"enable.partition.eof": False})
    consumer.assign([TopicPartition(src, p, OFFSET_BEGINNING) for p in range(3)])
    producer = rd_producer(kcluster, **{"transactional.id": f"rd-ctp-tx-{suffix}"})
    producer.init_transactions(LIMIT_S)
    group_offsets = client.Admin(bootstrap_servers=kcluster.bootstrap_servers)

    def committed() -> dict[int, int]:
        """The group's committed offsets as librdkafka reads them (OffsetFetch, require_stable)."""
        tps = consumer.committed([TopicPartition(src, p) for p in range(3)], timeout=LIMIT_S)
        return {tp.partition: tp.offset for tp in tps if tp.offset >= 0}

    def copy_one_transaction(max_records: int, at_least_one: bool = False) -> int:
        """Consume up to ``max_records``, write them transformed and put the positions in the transaction."""
        msgs = [m for m in consumer.consume(num_messages=max_records, timeout=2.0) if m.error() is None]
        deadline = time.monotonic() + LIMIT_S
        while at_least_one and not msgs and time.monotonic() < deadline:
            msgs = [m for m in consumer.consume(num_messages=max_records, timeout=1.0) if m.error() is None]
        producer.begin_transaction()
        for m in msgs:
            producer.produce(dst, key=m.key(), value=b"out-" + (m.value() or b""), partition=m.partition())
        positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
        producer.send_offsets_to_transaction(positions, consumer.consumer_group_metadata(), LIMIT_S)
        return len(msgs)

    try:
        copied = 0
        deadline = time.monotonic() + 2 * LIMIT_S
        while copied < 200 and time.monotonic() < deadline:
            copied += copy_one_transaction(50)
            producer.commit_transaction(LIMIT_S)
        assert copied >= 200
        before = committed()
        assert sum(before.values()) == copied  # exactly the consumed positions, committed with the records
        # the gRPC Admin reads the same offsets from the group coordinator
        assert before == {tp.partition: o for tp, o in group_offsets.list_consumer_group_offsets(group).items()}

        # one more transaction, aborted: neither its offsets nor its records become visible
        assert copy_one_transaction(50, at_least_one=True) > 0
        assert producer.flush(LIMIT_S) == 0  # in the log before the abort (librdkafka purges what is queued)
        producer.abort_transaction(LIMIT_S)
        assert committed() == before
        out = rd_read(kcluster, dst, "read_committed", partitions=3)
        assert len(out) == copied

        # a new incarnation resumes from the committed offsets and copies the rest exactly once
        for p in range(3):
            consumer.seek(TopicPartition(src, p, before.get(p, 0)))
        deadline = time.monotonic() + 2 * LIMIT_S
        while copied < 300 and time.monotonic() < deadline:
            copied += copy_one_transaction(50)
            producer.commit_transaction(LIMIT_S)
        assert copied == 300
        assert committed() == {0: 100, 1: 100, 2: 100}
    finally:
        consumer.close()
        group_offsets.close()
    out = rd_read(kcluster, dst, "read_committed", partitions=3)
    assert sorted(v for *_, v, _h in out) == sorted(b"out-in-%d" % i for i in range(300))
    # read_uncommitted also sees the aborted copies: the abort really wrote to the log
    assert len(rd_read(kcluster, dst, "read_uncommitted", partitions=3)) > 300


def test_zombie_producer_is_fenced(kcluster: LocalCluster) -> None:
    topic = f"rd-zombie-{uuid.uuid4().hex[:6]}"
    txn_id = f"rd-zombie-tx-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic)
    zombie = rd_producer(kcluster, **{"transactional.id": txn_id})
    zombie.init_transactions(LIMIT_S)
    zombie.begin_transaction()
    zombie.produce(topic, value=b"zombie-1", partition=0)
    assert zombie.flush(LIMIT_S) == 0

    fresh = rd_producer(kcluster, **{"transactional.id": txn_id})
    fresh.init_transactions(LIMIT_S)  # bumps the epoch: the zombie's open transaction is aborted
    fresh.begin_transaction()
    fresh.produce(topic, value=b"fresh-1", partition=0)
    fresh.commit_transaction(LIMIT_S)

    zombie.produce(topic, value=b"zombie-2", partition=0)
    with pytest.raises(KafkaException) as caught:
        zombie.commit_transaction(LIMIT_S)
    err: KafkaError = caught.value.args[0]
    # As against Kafka (KIP-588): the zombie's batch is refused with INVALID_PRODUCER_EPOCH, which
    # librdkafka's transactional producer turns into its fatal _FENCED error
    assert err.fatal(), err
    assert err.code() == KafkaError._FENCED, err
    with pytest.raises(KafkaException):  # fatal: nothing transactional works any more
        zombie.begin_transaction()
    values = [v for *_, v, _h in rd_read(kcluster, topic, "read_committed")]
    assert values == [b"fresh-1"]


def test_idempotent_produce_every_record_acknowledged(kcluster: LocalCluster) -> None:
    topic = f"rd-idem-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic, partitions=3)
    producer = rd_producer(kcluster, **{"enable.idempotence": True, "acks": "all"})
    acked: list[tuple[int, int, bytes]] = []
    failed: list[str] = []

    def delivered(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(str(err))
        else:
            acked.append((msg.partition(), msg.offset(), msg.value()))

    count = 3000
    for i in range(count):
        producer.produce(topic, key=b"k%d" % i, value=b"v%d" % i, on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(LIMIT_S) == 0
    assert not failed
    assert len(acked) == count
    for p in range(3):
        offsets = sorted(o for part, o, _ in acked if part == p)
        assert offsets == list(range(len(offsets)))  # no gap, no duplicate
    expected = sorted((p, o, v) for p, o, v in acked)
    got = [(p, o, v) for p, o, _k, v, _h in grpc_read(kcluster, topic, "read_committed", count, partitions=3)]
    assert got == expected


@pytest.mark.parametrize("codec", ["snappy", "lz4", "zstd", "gzip"])
def test_compressed_batches_are_stored_as_sent_and_read_back(kcluster: LocalCluster, codec: str) -> None:
    """librdkafka's compressed batches (snappy as librdkafka writes it: one raw block) are stored in
    their codec, read back by librdkafka as sent and decoded by Sluice's own client."""
    topic = f"rd-codec-{codec}-{uuid.uuid4().hex[:6]}"
    create(kcluster, topic)
    producer = rd_producer(kcluster, **{"compression.type": codec, "enable.idempotence": True})
    for i in range(200):
        producer.produce(topic, key=b"k%d" % i, value=b"value %d " % i * 20, partition=0, headers=[("n", b"%d" % i)])
    assert producer.flush(LIMIT_S) == 0
    expected = [(0, i, b"k%d" % i, b"value %d " % i * 20, [("n", b"%d" % i)]) for i in range(200)]
    assert rd_read(kcluster, topic, "read_committed") == expected
    assert grpc_read(kcluster, topic, "read_committed", 200) == expected
    wire = Wire(kcluster.brokers[0].address if len(kcluster.brokers) == 1 else leader_address(kcluster, topic))
    try:
        stored = wire.fetch(topic, 0, kafka_v2_records=True).batches
    finally:
        wire.close()
    assert stored and {(b.records_format, b.compression) for b in stored} == {
        (pb.RECORDS_FORMAT_KAFKA_V2, pb.Compression.Value(f"COMPRESSION_{codec.upper()}"))
    }


def leader_address(cluster: LocalCluster, topic: str) -> str:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    try:
        leader = admin.describe_topic(topic).partitions[0].leader
    finally:
        admin.close()
    return next(b.address for b in cluster.brokers if b.broker_id == leader)
