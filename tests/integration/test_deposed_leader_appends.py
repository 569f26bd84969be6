"""A leader deposed while a produce waits must not append it (issue 30), on three real brokers.

The loss seen under network partitions: broker L led a partition at epoch E; a transactional
Produce passed L's leadership check and awaited KIP-890's verification with the transaction
coordinator; meanwhile the controller elected F at epoch E+1 and L, reading the metadata,
became a follower, so its log's epoch was E+1. When the verification returned, L appended the
batch stamped with epoch E+1, the new leader's, while F wrote something else at that offset in
the same epoch. OffsetsForLeaderEpoch compares epochs only, so L never truncated it, and once L
led again the record F's consumers had read was gone from the leader.

Here the test hook ``produce.hold_verification`` holds L's verified produce while the test moves
leadership exactly as the controller would (one compare-and-set of the topic document: a new
leader, epoch + 1, the ISR without L). F then takes a write at the offset L would have used.
Released, L must answer NOT_LEADER_OR_FOLLOWER and write nothing; once L is back in the ISR and
leads again, its log is F's.
"""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin
from sluice.metadata.documents import TopicDocument
from sluice.metadata.topic_view import update_partitions
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .helpers import checked
from .wire import Wire, batch_of

TOPIC = "moved"
TXN_ID = "deposed-tx"


def move_leadership(cluster: LocalCluster, to: int, isr: list[int]) -> int:
    """Elect ``to`` with ISR ``isr`` at the next epoch, as the controller does; returns the new epoch."""

    def change(topic: TopicDocument) -> TopicDocument:
        p = topic.partitions[0]
        return topic.with_partition(0, dataclasses.replace(p, leader=to, leader_epoch=p.leader_epoch + 1, isr=isr))

    update_partitions(cluster.metadata, TOPIC, change, writer="test")  # a record, or the document before records
    return int(cluster.partition_state(TOPIC, 0)["leader_epoch"])


def sees_leader(wire: Wire, leader: int, epoch: int) -> bool:
    """Whether the broker behind ``wire`` applied the metadata (leader, epoch) of the partition."""
    resp = wire.stub.Metadata(bpb.MetadataRequest(topics=[TOPIC]))
    if not resp.topics or not resp.topics[0].partitions:
        return False
    p = resp.topics[0].partitions[0]
    return bool(p.leader == leader and p.leader_epoch == epoch)


def readable(wire: Wire) -> list[tuple[int, bytes | None]] | None:
    """Every record up to the HW (read_uncommitted), None while the leader cannot serve them yet."""
    try:
        return wire.read_all(TOPIC, 0, read_committed=False) or None
    except AssertionError:  # a new leader answers an error until its HW is vouched for (KIP-207)
        return None


def test_a_verified_produce_held_while_leadership_moves_is_refused_and_the_replicas_agree(tmp_path: Path) -> None:
    config = {"sluice.test.hooks": "produce.hold_verification", "min.insync.replicas": "2"}
    # checked(): once it is over, every partition's replicas are compared batch by batch as well
    with checked(LocalCluster(brokers=3, data_dir=tmp_path, config=config)) as cluster:
        admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
        admin.create_topic(TOPIC, partitions=1, replication_factor=3)
        admin.close()
        state = cluster.wait_for_partition(TOPIC, 0, lambda p: len(p["isr"]) == 3, what="a full ISR")
        old, epoch = state["leader"], state["leader_epoch"]
        new, third = [b for b in state["replicas"] if b != old]
        wires = {b: Wire(cluster.address(b)) for b in range(3)}
        try:
            wait_for(lambda: all(sees_leader(wires[b], old, epoch) for b in range(3)), what="every broker knowing it")
            found = wires[0].stub.FindCoordinator(bpb.FindCoordinatorRequest(key=TXN_ID, key_type=bpb.TRANSACTION))
            assert found.error_code == pb.NONE, found.error_message
            coordinator = wires[found.node_id]
            pid, producer_epoch = coordinator.init_producer_id(TXN_ID)
            added = coordinator.stub.AddPartitionsToTxn(
                bpb.AddPartitionsToTxnRequest(
                    transactional_id=TXN_ID,
                    producer_id=pid,
                    producer_epoch=producer_epoch,
                    topics=[bpb.TxnTopic(name=TOPIC, partitions=[0])],
                )
            )
            assert added.results[0].error_code == pb.NONE, added.results[0].error_message

            broker_dir = cluster.data_dir / f"broker-{old}"
            (broker_dir / "hold-verification").touch()
            answers: list[bpb.ProducePartitionResponse] = []
            held_batch = batch_of(
                [b"held"], producer_id=pid, producer_epoch=producer_epoch, base_sequence=0, transactional=True
            )
            sender = threading.Thread(
                target=lambda: answers.append(wires[old].produce(TOPIC, 0, held_batch, transactional_id=TXN_ID)),
                daemon=True,
            )
            sender.start()
            wait_for(lambda: (broker_dir / "verification-held").exists(), timeout=30, what="the verification held")

            moved = move_leadership(cluster, new, [new, third])
            assert moved == epoch + 1
            wait_for(lambda: all(sees_leader(wires[b], new, moved) for b in range(3)), what="every broker following")
            other = wires[new].produce(TOPIC, 0, batch_of([b"other"]))
            assert (other.error_code, other.base_offset) == (pb.NONE, 0), other.error_message

            (broker_dir / "hold-verification").unlink()
            sender.join(timeout=60)
            assert not sender.is_alive(), "the held produce never answered"
            assert answers[0].error_code == pb.NOT_LEADER_OR_FOLLOWER, answers[0]

            # The deposed leader catches up as a follower and leads again (as the controller's
            # preferred-leader rule would make it): its log is the one its followers have.
            cluster.wait_for_partition(TOPIC, 0, lambda p: old in p["isr"], timeout=60, what="the old leader in sync")
            back = move_leadership(cluster, old, [old, new, third])
            wait_for(lambda: sees_leader(wires[old], old, back), what="the old leader leading again")
            log = wait_for(lambda: readable(wires[old]), what="the old leader serving its log again")
            assert log == [(0, b"other")]
            assert "admitted at leader epoch" in answers[0].error_message  # refused before, not after, the append
        finally:
            for wire in wires.values():
                wire.close()
