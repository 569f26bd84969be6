"""Offsets inside transactions (TxnOffsetCommit): DESIGN sections 4 and 5."""

from __future__ import annotations

import time

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .wire import Wire


def setup(cluster: LocalCluster, topic: str) -> None:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=1, replication_factor=1)
    admin.create_topic(f"{topic}-out", partitions=1, replication_factor=1)
    admin.close()
    p = Producer(bootstrap_servers=cluster.bootstrap_servers)
    for i in range(20):
        p.send(topic, value=f"in-{i}".encode())
    p.flush()
    p.close()


def test_offsets_become_visible_only_on_commit_and_vanish_on_abort(cluster: LocalCluster, unique_topic: str) -> None:
    setup(cluster, unique_topic)
    group = f"{unique_topic}-g"
    tp = TopicPartition(unique_topic, 0)
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, enable_auto_commit=False)
    consumer.assign([tp])
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"{group}-tx", linger_ms=0)
    producer.init_transactions()

    producer.begin_transaction()
    producer.send(f"{unique_topic}-out", value=b"x")
    producer.send_offsets_to_transaction({tp: 10}, consumer.group_metadata())
    # pending: read_committed waits for the transaction (require_stable) and gives up at its timeout
    with pytest.raises((errors.UnstableOffsetCommitError, errors.KafkaTimeoutError)):
        consumer.committed([tp], timeout=1.0)
    peek = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, isolation_level="read_uncommitted")
    assert peek.committed([tp])[tp] is None  # read_uncommitted answers at once: nothing committed yet
    peek.close()
    producer.abort_transaction()
    assert consumer.committed([tp])[tp] is None  # aborted: the group re-reads from where it was

    producer.begin_transaction()
    producer.send(f"{unique_topic}-out", value=b"y")
    producer.send_offsets_to_transaction({tp: 12}, consumer.group_metadata())
    producer.commit_transaction()
    assert wait_for(lambda: consumer.committed([tp])[tp] == 12, timeout=10, what="committed offset 12")
    producer.close()
    consumer.close()

    # a new member of the group starts where the committed transaction left it
    fresh = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group, enable_auto_commit=False)
    fresh.assign([tp])
    records = []
    deadline = time.monotonic() + 20
    while not records and time.monotonic() < deadline:
        records = fresh.poll(timeout=1.0)
    assert records and records[0].offset == 12 and records[0].value == b"in-12"
    fresh.close()


def test_offset_fetch_with_require_stable_reports_pending_offsets(cluster: LocalCluster, unique_topic: str) -> None:
    setup(cluster, unique_topic)
    group = f"{unique_topic}-g"
    tp = TopicPartition(unique_topic, 0)
    consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=group)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=f"{group}-tx", linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    producer.send_offsets_to_transaction({tp: 5}, consumer.group_metadata())

    coordinator = _group_coordinator(cluster, group)
    req = bpb.OffsetFetchRequest(group_id=group, partitions=[pb.TopicPartition(topic=unique_topic, partition=0)])
    req.require_stable = True
    pending = coordinator.stub.OffsetFetch(req).partitions[0]
    assert pending.error_code == pb.UNSTABLE_OFFSET_COMMIT
    req.require_stable = False
    assert coordinator.stub.OffsetFetch(req).partitions[0].committed_offset == -1

    producer.commit_transaction()
    req.require_stable = True

    def stable() -> bool:
        part = coordinator.stub.OffsetFetch(req).partitions[0]
        return part.error_code == pb.NONE and part.committed_offset == 5

    wait_for(stable, timeout=10, what="stable offset 5")
    producer.close()
    consumer.close()
    coordinator.close()


def _group_coordinator(cluster: LocalCluster, group: str) -> Wire:
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    found = wire.stub.FindCoordinator(bpb.FindCoordinatorRequest(key=group, key_type=bpb.GROUP))
    assert found.error_code == pb.NONE, found.error_message
    wire.close()
    return Wire(f"{found.host}:{found.port}")
