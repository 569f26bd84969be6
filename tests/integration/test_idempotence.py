"""Idempotent producer against a real broker: DESIGN section 3."""

from __future__ import annotations

import threading
import time

from sluice.api.v1 import records_pb2 as pb
from sluice.client import Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster

from .wire import Wire, batch_of


def test_retried_batch_is_stored_once_with_its_original_offset(cluster: LocalCluster, unique_topic: str) -> None:
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    wire.create_topic(unique_topic)
    pid, epoch = wire.init_producer_id()
    first = wire.produce(
        unique_topic, 0, batch_of([b"a", b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    )
    assert first.error_code == pb.NONE and first.base_offset == 0
    wire.produce(unique_topic, 0, batch_of([b"c"], producer_id=pid, producer_epoch=epoch, base_sequence=2))
    retry = wire.produce(
        unique_topic, 0, batch_of([b"a", b"b"], producer_id=pid, producer_epoch=epoch, base_sequence=0)
    )
    assert retry.error_code == pb.NONE and retry.base_offset == 0
    assert [v for _o, v in wire.read_all(unique_topic, 0)] == [b"a", b"b", b"c"]
    wire.close()


def test_sequence_gap_is_refused_and_changes_nothing(cluster: LocalCluster, unique_topic: str) -> None:
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    wire.create_topic(unique_topic)
    pid, epoch = wire.init_producer_id()
    wire.produce(unique_topic, 0, batch_of([b"a"], producer_id=pid, producer_epoch=epoch, base_sequence=0))
    gap = wire.produce(unique_topic, 0, batch_of([b"x"], producer_id=pid, producer_epoch=epoch, base_sequence=5))
    assert gap.error_code == pb.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert "expected sequence 1" in gap.error_message
    assert [v for _o, v in wire.read_all(unique_topic, 0)] == [b"a"]
    wire.close()


def test_unknown_producer_with_nonzero_sequence_is_refused(cluster: LocalCluster, unique_topic: str) -> None:
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    wire.create_topic(unique_topic)
    pid, epoch = wire.init_producer_id()
    resp = wire.produce(unique_topic, 0, batch_of([b"a"], producer_id=pid, producer_epoch=epoch, base_sequence=3))
    assert resp.error_code == pb.UNKNOWN_PRODUCER_ID
    assert wire.read_all(unique_topic, 0) == []
    wire.close()


def test_five_in_flight_with_retries_keep_order(cluster: LocalCluster, unique_topic: str) -> None:
    """Five requests in flight at once, each retried until acknowledged and some sent twice.

    Whatever order they arrive in, the log holds each batch once, in sequence order.
    """
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    wire.create_topic(unique_topic)
    pid, epoch = wire.init_producer_id()
    n_batches = 40
    acked: dict[int, int] = {}
    lock = threading.Lock()

    def send(i: int) -> None:
        batch = batch_of(
            [f"{i}-{j}".encode() for j in range(3)], producer_id=pid, producer_epoch=epoch, base_sequence=3 * i
        )
        deadline = time.monotonic() + 30
        sends = 0
        while time.monotonic() < deadline:
            resp = wire.produce(unique_topic, 0, batch)
            sends += 1
            if resp.error_code == pb.NONE:
                if sends == 1 and i % 3 == 0:
                    continue  # an injected retry of an acknowledged batch: must be answered as a duplicate
                with lock:
                    acked[i] = resp.base_offset
                return
            # arrived before its predecessors: refused, nothing stored, retried
            assert resp.error_code in (pb.OUT_OF_ORDER_SEQUENCE_NUMBER, pb.UNKNOWN_PRODUCER_ID), resp.error_message
            time.sleep(0.005)
        raise AssertionError(f"batch {i} was never acknowledged")

    for window in range(0, n_batches, 5):
        threads = [threading.Thread(target=send, args=(i,)) for i in reversed(range(window, window + 5))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert sorted(acked) == list(range(n_batches))
    assert [acked[i] for i in range(n_batches)] == [3 * i for i in range(n_batches)]
    values = [v for _o, v in wire.read_all(unique_topic, 0)]
    assert values == [f"{i}-{j}".encode() for i in range(n_batches) for j in range(3)]
    wire.close()


def test_producer_keeps_order_per_partition_with_five_in_flight(cluster: LocalCluster, unique_topic: str) -> None:
    admin_wire = Wire(cluster.bootstrap_servers.split(",")[0])
    admin_wire.create_topic(unique_topic, partitions=2)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, max_in_flight=5, linger_ms=0, batch_size=200)
    futures = [producer.send(unique_topic, value=str(i).encode(), partition=i % 2) for i in range(2000)]
    producer.flush()
    offsets = [f.result(timeout=30).offset for f in futures]
    producer.close()
    for p in (0, 1):
        assert [offsets[i] for i in range(p, 2000, 2)] == list(range(1000))
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None, isolation_level="read_committed")
    consumer.assign([TopicPartition(unique_topic, 0), TopicPartition(unique_topic, 1)])
    seen: dict[int, list[int]] = {0: [], 1: []}
    deadline = time.monotonic() + 30
    while sum(map(len, seen.values())) < 2000 and time.monotonic() < deadline:
        for r in consumer.poll(timeout=1.0):
            seen[r.partition].append(int(r.value or b"-1"))
    consumer.close()
    assert seen[0] == list(range(0, 2000, 2))
    assert seen[1] == list(range(1, 2000, 2))
    admin_wire.close()
