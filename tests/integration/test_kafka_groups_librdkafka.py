"""librdkafka (confluent-kafka) consumer groups on the Kafka listener: the classic protocol in C.

librdkafka runs its own group state machine and assignors: range, and cooperative-sticky
(KIP-429: incremental rebalances, a member gives up only the partitions that move, in a second
rebalance). Two members poll in threads of their own; every wait is bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.client import Admin
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .test_kafka_groups import create

ck = pytest.importorskip("confluent_kafka")  # the dev extra installs confluent-kafka
REBALANCING = {ck.KafkaError.REBALANCE_IN_PROGRESS, ck.KafkaError.ILLEGAL_GENERATION, ck.KafkaError.UNKNOWN_MEMBER_ID}


@pytest.fixture(scope="module")
def rcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1,
        data_dir=tmp_path_factory.mktemp("kafka-groups-librdkafka"),
        config={"group.initial.rebalance.delay.ms": 300},
        kafka_listener=True,
    ) as cluster:
        yield cluster


class RdMember(threading.Thread):
    """A confluent-kafka Consumer polling in its own thread, committing what it read."""

    def __init__(
        self, cluster: LocalCluster, group: str, topic: str, strategy: str, name: str, instance: str | None = None
    ) -> None:
        super().__init__(daemon=True)
        static = {"group.instance.id": instance} if instance is not None else {}
        self.consumer = ck.Consumer({
            "bootstrap.servers": cluster.kafka_bootstrap_servers, "group.id": group, "client.id": name,
            "partition.assignment.strategy": strategy, "auto.offset.reset": "earliest",
            "enable.auto.commit": False, "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **static,
        })  # fmt: skip
        self.assigned: frozenset[int] = frozenset()
        self.revoked: list[list[int]] = []  # each revocation's partitions (incremental with cooperative-sticky)
        self.values: list[bytes] = []
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.consumer.subscribe([topic], on_revoke=self._on_revoke)
        self.start()

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.revoked.append(sorted(p.partition for p in partitions))

    def run(self) -> None:
        deadline = time.monotonic() + 240
        unsaved: dict[int, Any] = {}  # partition -> its last message whose commit a rebalance refused
        try:
            while not self.stopping.is_set() and time.monotonic() < deadline:
                message = self.consumer.poll(0.2)
                if message is not None and message.error() is None:
                    self.values.append(message.value())
                    unsaved[message.partition()] = message
                self.assigned = frozenset(tp.partition for tp in self.consumer.assignment())
                for partition in [p for p in unsaved if p not in self.assigned]:
                    del unsaved[partition]  # moved: its next owner reads from the last commit
                for partition, last in list(unsaved.items()):
                    try:
                        self.consumer.commit(message=last, asynchronous=False)
                        del unsaved[partition]
                    except ck.KafkaException as exc:
                        # Kafka's answers while the group rebalances: commit again once it is done
                        if exc.args[0].code() not in REBALANCING:
                            raise
        except BaseException as exc:
            self.error = exc
        finally:
            self.consumer.close()  # LeaveGroup (none for a static member: KIP-345)

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive() and self.error is None, f"the member failed: {self.error!r}"


@pytest.mark.parametrize("strategy", ["range", "cooperative-sticky"])
def test_librdkafka_members_share_rebalance_and_commit(rcluster: LocalCluster, strategy: str) -> None:
    topic, group = f"rdk-{strategy}", f"rdk-{strategy}-group"
    values = create(rcluster, topic, partitions=4, records=400)
    a = RdMember(rcluster, group, topic, strategy, "rdk-a")
    wait_for(lambda: a.assigned == frozenset(range(4)), timeout=60, what="member a owns every partition")
    revocations_before = len(a.revoked)
    b = RdMember(rcluster, group, topic, strategy, "rdk-b")
    wait_for(lambda: len(a.assigned) == 2 and len(b.assigned) == 2 and not a.assigned & b.assigned,
             timeout=90, what="two members with two partitions each")  # fmt: skip
    if strategy == "cooperative-sticky":
        # incremental: a gave up only the two partitions b took, and kept the others throughout
        assert a.revoked[revocations_before:] == [sorted(b.assigned)]
    b.stop()
    wait_for(lambda: a.assigned == frozenset(range(4)), timeout=60, what="member a owns every partition again")
    wait_for(lambda: len(set(a.values) | set(b.values)) == len(values), timeout=60, what="every record read")
    a.stop()
    assert set(a.values) | set(b.values) == set(values)
    admin = Admin(bootstrap_servers=rcluster.bootstrap_servers)
    assert {tp.partition: o for tp, o in admin.list_consumer_group_offsets(group).items()} == {p: 100 for p in range(4)}
    admin.close()


def test_a_static_member_restarting_takes_its_partitions_back_without_a_rebalance(rcluster: LocalCluster) -> None:
    """KIP-345: a member with group.instance.id that restarts within its session gets its own
    partitions back, and the other members never rebalance (no revocation, same assignment)."""
    topic, group = "rdk-static", "rdk-static-group"
    create(rcluster, topic, partitions=4, records=40)
    a = RdMember(rcluster, group, topic, "range", "rdk-static-a", instance="a")
    wait_for(lambda: a.assigned == frozenset(range(4)), timeout=60, what="member a owns every partition")
    b = RdMember(rcluster, group, topic, "range", "rdk-static-b", instance="b")
    wait_for(lambda: len(a.assigned) == 2 and len(b.assigned) == 2 and not a.assigned & b.assigned,
             timeout=90, what="two members with two partitions each")  # fmt: skip
    mine, theirs, b_revocations = a.assigned, b.assigned, len(b.revoked)
    # Sluice's Admin (gRPC) describes the Kafka clients' classic group: members, subscriptions and
    # assignments read from the consumer protocol's bytes, the generation as the epoch
    with Admin(bootstrap_servers=rcluster.bootstrap_servers) as admin:
        described = admin.describe_consumer_groups([group])[group]
    assert described.state == "Stable" and len(described.members) == 2
    assert {m.member_epoch for m in described.members} == {described.group_epoch}
    assert all(m.subscribed_topic_names == [topic] for m in described.members)
    assert {frozenset(tp.partition for tp in m.assignment) for m in described.members} == {mine, theirs}
    a.stop()  # a static member leaves no LeaveGroup behind: its session (6 s) keeps its place
    a2 = RdMember(rcluster, group, topic, "range", "rdk-static-a2", instance="a")
    wait_for(lambda: a2.assigned == mine, timeout=30, what="the restarted member to get its partitions back")
    time.sleep(3)  # six of b's heartbeat intervals: a rebalance would have reached it
    assert len(b.revoked) == b_revocations and b.assigned == theirs, "the other member rebalanced"
    a2.stop()
    b.stop()
