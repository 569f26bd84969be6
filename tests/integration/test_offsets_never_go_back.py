"""Offsets a client was told never go back (issue 19; Kafka's unreplicated transactions and KIP-207).

Three real brokers, replication factor 3. The test hook ``replication.hold_markers`` (see
docs/architecture.md, "Test-only hooks") holds a transaction's COMMIT marker on the leader,
above the high watermark, for as long as a file exists in the leader's data directory:

- ListOffsets(read_committed) and read_committed fetches stop before the transaction while its
  marker is above the HW, and it becomes readable exactly when the HW passes the marker;
- after a failover to a follower without the marker, neither LSO nor HW goes back, and the
  coordinator's marker follows the partition to its new leader within about a metadata refresh;
- a new leader whose HW is below the start of its epoch answers ListOffsets(latest) with
  OFFSET_NOT_AVAILABLE, which the Consumer, the Admin client and the Spark source retry.
- a leader killed and restarted with the marker still above the HW rebuilds the unreplicated
  transaction from its producer states and HW checkpoint.

Every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import interbroker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer, TopicPartition
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import OffsetMonitor, read_topic, values
from .wire import Wire

HOLD = {
    "min.insync.replicas": "2",
    # followers held before a marker are not caught up: keep them in the ISR for the whole test
    "replica.lag.time.max.ms": "60000",
    "sluice.test.hooks": "replication.hold_markers",
}
VALUES = [b"t%d" % i for i in range(5)]


def partition_state(admin: Admin, topic: str) -> tuple[int, int, list[int]]:
    p = admin.describe_topic(topic).partitions[0]
    return p.leader, p.leader_epoch, p.isr


def log_end(cluster: LocalCluster, broker: int, topic: str, epoch: int) -> int:
    """The leader's log end offset (the end of its latest epoch), read with OffsetsForLeaderEpoch."""
    with cluster.interbroker_channel(broker) as channel:  # inter-broker RPCs: a broker's identity
        stub = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
        resp = stub.OffsetsForLeaderEpoch(
            ipb.OffsetsForLeaderEpochRequest(
                replica_id=-1,
                partitions=[
                    ipb.OffsetsForLeaderEpochPartition(
                        topic=topic, partition=0, current_leader_epoch=-1, leader_epoch=epoch
                    )
                ],
            ),
            timeout=5,
        )
    (p,) = resp.partitions
    assert p.error_code == pb.NONE, p.error_message
    return int(p.end_offset)


def list_latest(wire: Wire, topic: str, read_committed: bool, spec: int = -1) -> bpb.ListOffsetsPartitionResponse:
    """ListOffsets of partition 0 at one broker: latest (-1) by default, or earliest -2, max timestamp -3, a time."""
    resp = wire.stub.ListOffsets(
        bpb.ListOffsetsRequest(
            isolation_level=pb.READ_COMMITTED if read_committed else pb.READ_UNCOMMITTED,
            topics=[
                bpb.ListOffsetsTopic(name=topic, partitions=[bpb.ListOffsetsPartition(partition=0, timestamp=spec)])
            ],
        ),
        timeout=5,
    )
    return resp.topics[0].partitions[0]


def coordinator_of(cluster: LocalCluster, txn_id: str) -> int:
    wire = Wire(cluster.bootstrap_servers.split(",")[0])
    found = wire.stub.FindCoordinator(bpb.FindCoordinatorRequest(key=txn_id, key_type=bpb.TRANSACTION))
    wire.close()
    assert found.error_code == pb.NONE, found.error_message
    return int(found.node_id)


def txn_id_not_coordinated_by(cluster: LocalCluster, broker: int) -> str:
    for i in range(100):
        candidate = f"held-tx-{i}"
        if coordinator_of(cluster, candidate) != broker:
            return candidate
    raise AssertionError(f"every candidate transactional id is coordinated by broker {broker}")


def new_topic(admin: Admin, topic: str) -> tuple[int, int]:
    """A topic of one partition on the three brokers; its leader and leader epoch once all are in sync."""
    admin.create_topic(topic, partitions=1, replication_factor=3)
    wait_for(lambda: len(partition_state(admin, topic)[2]) == 3, timeout=20, what="three in-sync replicas")
    leader, epoch, _isr = partition_state(admin, topic)
    return leader, epoch


def held_commit(cluster: LocalCluster, admin: Admin, topic: str, txn_id: str) -> Path:
    """A transaction of VALUES at offsets 0-4 whose COMMIT marker (offset 5) is held on the leader.

    Returns the hold file (remove it to release the marker).
    """
    leader, epoch, _isr = partition_state(admin, topic)
    producer = Producer(bootstrap_servers=cluster.bootstrap_servers, transactional_id=txn_id, linger_ms=0)
    producer.init_transactions()
    producer.begin_transaction()
    for v in VALUES:
        producer.send(topic, value=v, partition=0)
    producer.flush()
    tp = TopicPartition(topic, 0)
    # the data is on every in-sync replica before the commit
    wait_for(lambda: admin.list_offsets({tp: Admin.LATEST})[tp].offset == len(VALUES), timeout=20, what="the data's HW")
    hold = cluster.data_dir / f"broker-{leader}" / "hold-markers"
    hold.touch()
    producer.commit_transaction()
    producer.close()
    wait_for(lambda: log_end(cluster, leader, topic, epoch) == len(VALUES) + 1, timeout=20, what="the marker")
    return hold


def test_a_transaction_is_readable_exactly_when_its_marker_is_below_the_hw(tmp_path: Path) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, config=HOLD, failure_timeout_ms=1000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        leader, _epoch = new_topic(admin, "held")
        hold = held_commit(cluster, admin, "held", "held-tx")
        tp = TopicPartition("held", 0)
        wire = Wire(cluster.address(leader))
        marker = len(VALUES)
        for _ in range(10):  # the marker is in the leader's log, only there: the transaction stays unstable
            resp = wire.fetch("held", 0, 0, read_committed=True)
            assert resp.error_code == pb.NONE, resp.error_message
            assert (resp.high_watermark, resp.last_stable_offset) == (marker, 0)
            assert list(resp.batches) == []
            assert list_latest(wire, "held", read_committed=True).offset == 0
            assert list_latest(wire, "held", read_committed=False).offset == marker
            assert admin.list_offsets({tp: Admin.LATEST}, isolation_level="read_committed")[tp].offset == 0
            time.sleep(0.1)
        hold.unlink()
        seen: list[tuple[int, int]] = []
        for _ in range(400):  # bounded: the followers fetch every 500 ms at most
            resp = wire.fetch("held", 0, 0, read_committed=True)
            assert resp.error_code == pb.NONE, resp.error_message
            hw, lso = resp.high_watermark, resp.last_stable_offset
            seen.append((hw, lso))
            if hw <= marker:
                assert lso == 0 and list(resp.batches) == [], f"readable before its marker is replicated: {seen}"
            else:
                assert lso == hw == marker + 1, seen
                assert len(resp.batches) > 0, "the transaction is not readable once its marker is replicated"
                break
            time.sleep(0.025)
        else:
            raise AssertionError(f"the HW never passed the marker: {seen[-5:]}")
        assert values(read_topic(cluster.bootstrap_servers, "held")) == VALUES
        wire.close()
        admin.close()


@pytest.mark.parametrize("fault", ["pause", "kill"])
def test_failover_to_a_follower_without_the_marker_takes_back_nothing(tmp_path: Path, fault: str) -> None:
    with LocalCluster(brokers=3, data_dir=tmp_path, config=HOLD, failure_timeout_ms=1000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        leader, epoch = new_topic(admin, "moved")
        # the coordinator lives elsewhere, so its marker request is in flight to the leader we pause
        txn_id = txn_id_not_coordinated_by(cluster, leader)
        tp = TopicPartition("moved", 0)
        held_commit(cluster, admin, "moved", txn_id)
        with OffsetMonitor(cluster.bootstrap_servers, [tp], interval=0.05) as monitor:
            wait_for(lambda: len(monitor.samples["read_committed"][tp]) >= 3, timeout=20, what="samples")
            assert monitor.samples["read_committed"][tp][-1][1] == 0
            coordinator_id = coordinator_of(cluster, txn_id)
            # paused, the deposed leader keeps its connections and answers nothing, as a partitioned one
            # would (the coordinator's request waits for its timeout); killed, every attempt fails at once
            if fault == "pause":
                cluster.pause(leader)
            else:
                cluster.kill(leader)
            try:
                # Polled together and straight from the source, so no request waits on the paused broker:
                # the leader change as the metadata store records it, the LSO passing the marker at the
                # new leader, and CompleteCommit at the coordinator.
                coordinator = Wire(cluster.address(coordinator_id))
                changed = visible = done = None
                new_leader: Wire | None = None
                for _ in range(3000):  # bounded: 3000 polls of at least 20 ms
                    state = cluster.partition_state("moved", 0)
                    if changed is None and int(state["leader_epoch"]) > epoch:
                        changed = time.monotonic()
                        new_leader = Wire(cluster.address(int(state["leader"])))
                    lso = -1 if new_leader is None else list_latest(new_leader, "moved", read_committed=True).offset
                    if visible is None and lso == len(VALUES) + 1:
                        visible = time.monotonic()
                    if changed is not None and done is None:
                        described = coordinator.stub.DescribeTransactions(
                            bpb.DescribeTransactionsRequest(transactional_ids=[txn_id]), timeout=5
                        )
                        if described.transactions[0].state == "CompleteCommit":
                            done = time.monotonic()
                    if done is not None and visible is not None:
                        break
                    time.sleep(0.02)
                assert changed and visible and done, f"leader changed {changed}, visible {visible}, complete {done}"
                print(f"\n{fault}: leader change -> LSO past the marker at the new leader: {visible - changed:.2f}s")
                took = done - changed
                coordinator.close()
                assert new_leader is not None
                new_leader.close()
                print(f"\n{fault}: leader change -> transaction complete: {took:.2f}s")
                wait_for(
                    lambda: (monitor.samples["read_committed"][tp] or [(0, 0)])[-1][1] == len(VALUES) + 1,
                    timeout=20,
                    what="the LSO past the marker on the new leader",
                )
            finally:
                if fault == "pause":
                    cluster.resume(leader)
                else:
                    cluster.restart(leader)
            time.sleep(1.0)  # samples while the old leader comes back as a follower
        monitor.check(min_samples=5)
        # the marker's wait on the deposed leader is abandoned once the cluster view names the new one
        assert took < 5.0, f"the transaction completed {took:.2f}s after the leader change"
        assert values(read_topic(cluster.bootstrap_servers, "moved")) == VALUES
        admin.close()


def test_a_new_leader_behind_its_epoch_start_answers_offset_not_available(tmp_path: Path) -> None:
    config = {"min.insync.replicas": "2", "replica.lag.time.max.ms": "60000"}
    # a paused follower stays "live" (and in the ISR) for the whole test; a stopped broker leaves at once
    with LocalCluster(brokers=3, data_dir=tmp_path, config=config, failure_timeout_ms=60_000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic("kip207", partitions=1, replication_factor=3)
        wait_for(lambda: len(partition_state(admin, "kip207")[2]) == 3, timeout=20, what="three in-sync replicas")
        replicas = admin.describe_topic("kip207").partitions[0].replicas
        leader = partition_state(admin, "kip207")[0]
        heir, laggard = [r for r in replicas if r != leader]  # the controller elects the first live ISR member
        tp = TopicPartition("kip207", 0)
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks=1, linger_ms=0)
        for i in range(5):
            producer.send("kip207", value=b"a%d" % i, partition=0).result(timeout=30)
        wait_for(lambda: admin.list_offsets({tp: Admin.LATEST})[tp].offset == 5, timeout=20, what="HW 5")
        old_wire = Wire(cluster.address(leader))
        cluster.pause(laggard)
        try:
            # From here on the test asks the metadata store and the brokers it means directly: a client
            # request could go to the paused broker and wait for its whole timeout.
            # The heir copies these; the HW cannot pass the paused follower's log end (5).
            for i in range(5):
                producer.send("kip207", value=b"b%d" % i, partition=0).result(timeout=30)
            producer.close()
            time.sleep(1.0)  # the heir's fetch is a long poll woken by each append: it copies at once
            assert list_latest(old_wire, "kip207", read_committed=False).offset == 5
            old_wire.close()
            cluster.stop(leader)  # controlled shutdown: the heir is elected at once
            wait_for(lambda: cluster.leader("kip207", 0) == heir, timeout=20, what="the heir to lead")
            heir_epoch = int(cluster.partition_state("kip207", 0)["leader_epoch"])
            assert log_end(cluster, heir, "kip207", heir_epoch) == 10, "the heir did not copy offsets 5-9"
            wire = Wire(cluster.address(heir))
            for read_committed in (False, True):
                answer = wait_for(
                    lambda rc=read_committed: (  # type: ignore[misc]
                        a if (a := list_latest(wire, "kip207", rc)).error_code != pb.NOT_LEADER_OR_FOLLOWER else None
                    ),
                    timeout=10,
                    what="the heir's answer",
                )
                assert answer.error_code == pb.OFFSET_NOT_AVAILABLE, answer
            # the latest record's offset, or "no record this recent", might also be less than the old
            # leader answered; earliest is the log start, which a new leader knows
            assert list_latest(wire, "kip207", False, spec=-3).error_code == pb.OFFSET_NOT_AVAILABLE
            future = int(time.time() * 1000) + 3_600_000
            assert list_latest(wire, "kip207", False, spec=future).error_code == pb.OFFSET_NOT_AVAILABLE
            assert list_latest(wire, "kip207", False, spec=0).offset == 0
            assert list_latest(wire, "kip207", False, spec=-2).offset == 0
            assert errors.error_class(pb.OFFSET_NOT_AVAILABLE).retriable
            results: dict[str, Any] = {}

            def ask(name: str, call: Any) -> None:
                try:
                    results[name] = call()
                except Exception as exc:  # reported by the assertion below
                    results[name] = exc

            consumer = Consumer(bootstrap_servers=cluster.bootstrap_servers, group_id=None)
            from sluice.spark.options import parse_read_options
            from sluice.spark.planning import Catalog

            catalog = Catalog(
                parse_read_options(
                    {"bootstrap.servers": cluster.bootstrap_servers, "subscribe": "kip207"}, streaming=False
                )
            )
            threads = [
                threading.Thread(target=ask, args=("consumer", lambda: consumer.end_offsets([tp], timeout=60)[tp])),
                threading.Thread(
                    target=ask,
                    args=("admin", lambda: admin.list_offsets({tp: Admin.LATEST}, timeout=60)[tp].offset),
                ),
                threading.Thread(target=ask, args=("spark", lambda: catalog.latest([tp])[tp])),
            ]
            for t in threads:
                t.start()
            time.sleep(1.5)
            assert results == {}, f"answered while the heir could not vouch for its HW: {results}"
        finally:
            cluster.resume(laggard)
        for t in threads:
            t.join(60)
        # once the laggard caught up with the heir, every client got the end, never less than 5
        assert results == {"consumer": 10, "admin": 10, "spark": 10}, results
        assert list_latest(wire, "kip207", read_committed=True).offset == 10
        consumer.close()
        catalog.close()
        wire.close()
        admin.close()


def test_a_restarted_leader_rebuilds_the_unreplicated_transaction_from_its_hw_checkpoint(tmp_path: Path) -> None:
    # a failure timeout longer than the test: the restarted leader keeps its leadership and epoch
    with LocalCluster(brokers=3, data_dir=tmp_path, config=HOLD, failure_timeout_ms=60_000) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        leader, epoch = new_topic(admin, "rebuilt")
        hold = held_commit(cluster, admin, "rebuilt", "rebuilt-tx")
        time.sleep(1.5)  # the HW (5, below the marker) is checkpointed every second
        cluster.kill(leader)
        cluster.restart(leader)
        assert partition_state(admin, "rebuilt")[:2] == (leader, epoch)
        assert log_end(cluster, leader, "rebuilt", epoch) == len(VALUES) + 1  # the marker survived the kill
        wire = Wire(cluster.address(leader))
        for _ in range(10):
            resp = wire.fetch("rebuilt", 0, 0, read_committed=True)
            assert resp.error_code == pb.NONE, resp.error_message
            assert (resp.high_watermark, resp.last_stable_offset) == (len(VALUES), 0)
            assert list(resp.batches) == []
            assert list_latest(wire, "rebuilt", read_committed=True).offset == 0
            time.sleep(0.1)
        hold.unlink()
        wait_for(
            lambda: list_latest(wire, "rebuilt", read_committed=True).offset == len(VALUES) + 1,
            timeout=20,
            what="the LSO past the released marker",
        )
        assert values(read_topic(cluster.bootstrap_servers, "rebuilt")) == VALUES
        wire.close()
        admin.close()
