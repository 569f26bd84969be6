"""Kafka's classic group protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on real brokers.

kafka-python's KafkaConsumer is the client: its own codecs and its own client-side assignors
(range, roundrobin) over the broker's rendezvous. Each member polls in a thread of its own, as
an application would; every wait is bounded. The bad-input test speaks the requests directly
(kafka-python's request classes) to send what no consumer would.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.client import Admin, Consumer, Producer
from sluice.testing import LocalCluster
from tests.support.waiting import wait_for

from .test_kafka_listener import ask
from .wire import Wire

kafka = pytest.importorskip("kafka")  # the dev extra installs kafka-python
from kafka import KafkaConsumer  # noqa: E402
from kafka import TopicPartition as KTopicPartition  # noqa: E402
from kafka.admin import KafkaAdminClient  # noqa: E402
from kafka.coordinator.assignors.range import RangePartitionAssignor  # noqa: E402
from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor  # noqa: E402
from kafka.errors import CommitFailedError, RebalanceInProgressError  # noqa: E402
from kafka.protocol.consumer import (  # noqa: E402
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from kafka.structs import OffsetAndMetadata  # noqa: E402

# Kafka error codes the tests expect
NONE, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_MEMBER_ID = 0, 22, 23, 25
INVALID_SESSION_TIMEOUT, INVALID_REQUEST, MEMBER_ID_REQUIRED = 26, 42, 79
GROUP_ID_NOT_FOUND = 69

CONFIG = {"group.initial.rebalance.delay.ms": 300}


@pytest.fixture(scope="module")
def gcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1, data_dir=tmp_path_factory.mktemp("kafka-groups"), config=CONFIG, kafka_listener=True
    ) as cluster:
        yield cluster


def create(cluster: LocalCluster, topic: str, partitions: int, records: int = 0, rf: int = 1) -> list[bytes]:
    admin = Admin(bootstrap_servers=cluster.bootstrap_servers)
    admin.create_topic(topic, partitions=partitions, replication_factor=rf)
    admin.close()
    values = [f"{topic}-{i}".encode() for i in range(records)]
    if values:
        producer = Producer(bootstrap_servers=cluster.bootstrap_servers, acks="all")
        for i, value in enumerate(values):
            producer.send(topic, value=value, partition=i % partitions)
        producer.flush()
        producer.close()
    return values


def kconsumer(cluster: LocalCluster, group: str, name: str, **config: Any) -> KafkaConsumer:
    settings: dict[str, Any] = {
        "bootstrap_servers": cluster.kafka_bootstrap_servers,
        "group_id": group,
        "client_id": name,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "session_timeout_ms": 6000,
        "heartbeat_interval_ms": 500,
        "request_timeout_ms": 40000,
    }
    settings.update(config)
    return KafkaConsumer(**settings)


class Member(threading.Thread):
    """A KafkaConsumer polling in its own thread: what it was assigned and what it read."""

    def __init__(self, consumer: KafkaConsumer, topic: str, limit_s: float = 240.0) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.consumer.subscribe([topic])
        self.records: list[tuple[int, int, bytes]] = []
        self.assigned: frozenset[int] = frozenset()
        self.error: BaseException | None = None
        self.stopping = threading.Event()
        self.limit_s = limit_s
        self.start()

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        unsaved = False  # read records whose commit a rebalance refused
        try:
            while not self.stopping.is_set() and time.monotonic() < deadline:
                batch = self.consumer.poll(timeout_ms=200)
                for recs in batch.values():
                    self.records.extend((r.partition, r.offset, r.value) for r in recs)
                self.assigned = frozenset(tp.partition for tp in self.consumer.assignment())
                if batch or unsaved:
                    try:
                        self.consumer.commit()
                        unsaved = False
                    except (CommitFailedError, RebalanceInProgressError):
                        unsaved = True  # Kafka's answer while the group rebalances: commit again after it
        except BaseException as exc:  # reported by stop()
            self.error = exc
        finally:
            self.consumer.close()  # LeaveGroup

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        assert not self.is_alive(), "the member did not stop"
        assert self.error is None, f"the member failed: {self.error!r}"


def split(members: list[Member], partitions: int) -> list[frozenset[int]] | None:
    """Each member's partitions once they are disjoint, cover every partition and are balanced."""
    sets = [m.assigned for m in members]
    union = frozenset().union(*sets)
    if union != frozenset(range(partitions)) or sum(len(s) for s in sets) != partitions:
        return None
    if max(len(s) for s in sets) - min(len(s) for s in sets) > 1:
        return None
    return sets


def describe(cluster: LocalCluster, group: str) -> dict[str, Any]:
    """DescribeGroups through kafka-python's admin (it decodes the consumer protocol's bytes)."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    try:
        described = admin.describe_groups([group])[group]
    finally:
        admin.close()
    assert described["error"] is None, described
    return {
        "state": described["group_state"],
        "protocol_type": described["protocol_type"],
        "protocol": described["protocol_data"],
        "members": {
            m["client_id"]: sorted(
                (t["topic"], p) for t in m["member_assignment"]["assigned_partitions"] for p in t["partitions"]
            )
            for m in described["members"]
        },
    }


@pytest.mark.parametrize(
    ("assignor", "name"), [(RangePartitionAssignor, "range"), (RoundRobinPartitionAssignor, "roundrobin")]
)
def test_two_members_share_the_partitions_by_the_client_assignor_and_rebalance_on_join_and_leave(
    gcluster: LocalCluster, assignor: Any, name: str
) -> None:
    topic, group = f"kgroup-{name}", f"kgroup-{name}-group"
    values = create(gcluster, topic, partitions=4, records=400)
    a = Member(kconsumer(gcluster, group, "member-a", partition_assignment_strategy=[assignor]), topic)
    wait_for(lambda: a.assigned == frozenset(range(4)), timeout=60, what="member a owns every partition")
    b = Member(kconsumer(gcluster, group, "member-b", partition_assignment_strategy=[assignor]), topic)
    sets = wait_for(lambda: split([a, b], 4), timeout=90, what="two members with two partitions each")
    if name == "range":  # contiguous ranges
        assert sorted(sorted(s) for s in sets) == [[0, 1], [2, 3]]
    else:  # dealt one by one: one member has the even partitions
        assert sorted(sorted(s) for s in sets) == [[0, 2], [1, 3]]
    # kafka-consumer-groups' view (DescribeGroups): the leader's assignment as each member holds it
    described = wait_for(lambda: (d := describe(gcluster, group))["state"] == "Stable" and d, timeout=30)
    assert described["protocol_type"] == "consumer" and described["protocol"] == name
    assert described["members"] == {
        "member-a": [(topic, p) for p in sorted(a.assigned)],
        "member-b": [(topic, p) for p in sorted(b.assigned)],
    }
    b.stop()  # LeaveGroup: a takes everything back
    wait_for(lambda: a.assigned == frozenset(range(4)), timeout=60, what="member a owns every partition again")
    wait_for(lambda: len(a.records) + len(b.records) >= len(values), timeout=60, what="every record read")
    a.stop()
    assert {v for _, _, v in a.records + b.records} == set(values)


def test_commit_then_a_new_member_resumes_from_the_committed_offsets(gcluster: LocalCluster) -> None:
    topic, group = "kgroup-resume", "kgroup-resume-group"
    create(gcluster, topic, partitions=2, records=200)
    first = kconsumer(gcluster, group, "first", max_poll_records=20)
    first.subscribe([topic])
    read: list[tuple[int, int]] = []
    deadline = time.monotonic() + 90
    while len(read) < 60 and time.monotonic() < deadline:
        for recs in first.poll(timeout_ms=500).values():
            read.extend((r.partition, r.offset) for r in recs)
    assert len(read) >= 60
    processed = {p: max(o for q, o in read if q == p) + 1 for p in {p for p, _ in read}}
    first.commit({KTopicPartition(topic, p): OffsetAndMetadata(o, "", -1) for p, o in processed.items()})
    first.close()
    # one group object: the gRPC side reads the offsets the classic member committed
    admin = Admin(bootstrap_servers=gcluster.bootstrap_servers)
    assert {tp.partition: o for tp, o in admin.list_consumer_group_offsets(group).items()} == processed
    admin.close()
    second = kconsumer(gcluster, group, "second")
    second.subscribe([topic])
    firsts: dict[int, int] = {}
    deadline = time.monotonic() + 90
    while len(firsts) < 2 and time.monotonic() < deadline:
        for tp, recs in second.poll(timeout_ms=500).items():
            firsts.setdefault(tp.partition, recs[0].offset)
    second.close()
    assert firsts == {p: processed.get(p, 0) for p in (0, 1)}


def join_request(version: int, group: str, member_id: str = "", metadata: bytes = b"sub", session_ms: int = 10000,
                 protocols: list[tuple[str, bytes]] | None = None) -> Any:  # fmt: skip
    protocol = JoinGroupRequest.JoinGroupRequestProtocol
    chosen = [("range", metadata)] if protocols is None else protocols
    return JoinGroupRequest[version](
        group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=10000, member_id=member_id,
        group_instance_id=None, protocol_type="consumer",
        protocols=[protocol(name=n, metadata=m) for n, m in chosen],
    )  # fmt: skip


def join(cluster: LocalCluster, version: int, group: str, **kw: Any) -> Any:
    return ask(cluster, join_request(version, group, **kw), JoinGroupResponse[version])


def test_bad_inputs_get_kafkas_errors(gcluster: LocalCluster) -> None:
    group = "kgroup-raw"
    required = join(gcluster, 5, group)
    assert required.error_code == MEMBER_ID_REQUIRED and required.member_id.startswith("t-")  # client id "t"
    assert join(gcluster, 5, group, member_id="made-up").error_code == UNKNOWN_MEMBER_ID
    assert join(gcluster, 5, group, session_ms=1000).error_code == INVALID_SESSION_TIMEOUT
    assert join(gcluster, 5, group, protocols=[]).error_code == INCONSISTENT_GROUP_PROTOCOL
    assert join(gcluster, 5, group, metadata=b"x" * (1024 * 1024 + 1)).error_code == INVALID_REQUEST
    # garbage metadata is opaque to the broker, as in Kafka: the leader gets it as sent
    garbage = b"\xff\x00not a subscription\x00"
    joined = join(gcluster, 5, group, member_id=required.member_id, metadata=garbage)
    assert (joined.error_code, joined.generation_id, joined.leader) == (NONE, 1, required.member_id)
    assert [(m.member_id, m.metadata) for m in joined.members] == [(required.member_id, garbage)]
    mid = required.member_id

    def sync(generation: int, member: str, assignment: bytes = b"") -> Any:
        given = [SyncGroupRequest.SyncGroupRequestAssignment(member_id=mid, assignment=assignment)]
        request = SyncGroupRequest[3](group_id=group, generation_id=generation, member_id=member,
                                      group_instance_id=None, assignments=given)  # fmt: skip
        return ask(gcluster, request, SyncGroupResponse[3])

    def heartbeat(generation: int, member: str) -> int:
        request = HeartbeatRequest[3](
            group_id=group, generation_id=generation, member_id=member, group_instance_id=None
        )
        return int(ask(gcluster, request, HeartbeatResponse[3]).error_code)

    assert sync(1, "stranger").error_code == UNKNOWN_MEMBER_ID
    assert sync(7, mid).error_code == ILLEGAL_GENERATION
    answered = sync(1, mid, b"\x01opaque assignment")
    assert (answered.error_code, answered.assignment) == (NONE, b"\x01opaque assignment")
    assert heartbeat(1, mid) == NONE
    assert heartbeat(0, mid) == ILLEGAL_GENERATION
    assert heartbeat(1, "stranger") == UNKNOWN_MEMBER_ID
    # a commit from outside the group while it has a member, and one of another generation
    from .test_kafka_listener import commit_offsets

    create(gcluster, "kgroup-raw-topic", partitions=1)
    outside = commit_offsets(gcluster, 8, group, "kgroup-raw-topic", {0: 1})
    assert outside == [("kgroup-raw-topic", 0, UNKNOWN_MEMBER_ID)]
    leave = LeaveGroupRequest[3](group_id=group, members=[
        LeaveGroupRequest.MemberIdentity(member_id=mid, group_instance_id=None),
        LeaveGroupRequest.MemberIdentity(member_id="stranger", group_instance_id=None)])  # fmt: skip
    left = ask(gcluster, leave, LeaveGroupResponse[3])
    assert [(m.member_id, m.error_code) for m in left.members] == [(mid, NONE), ("stranger", UNKNOWN_MEMBER_ID)]
    assert heartbeat(1, mid) == UNKNOWN_MEMBER_ID
    # the broker is still serving: a gRPC client reads the topic list
    admin = Admin(bootstrap_servers=gcluster.bootstrap_servers)
    assert "kgroup-raw-topic" in admin.list_topics()
    admin.close()


def test_a_group_is_one_type_whichever_protocol_joins_first(gcluster: LocalCluster) -> None:
    topic = "kgroup-types"
    create(gcluster, topic, partitions=2)
    # a KIP-848 group with a member (Sluice's gRPC consumer): a classic JoinGroup is refused
    member = Consumer(bootstrap_servers=gcluster.bootstrap_servers, group_id="kgroup-kip848")
    member.subscribe([topic])
    wait_for(lambda: member.poll(timeout=0.2) is not None and member.assignment(), timeout=60)
    mid = join(gcluster, 5, "kgroup-kip848").member_id
    assert join(gcluster, 5, "kgroup-kip848", member_id=mid).error_code == INCONSISTENT_GROUP_PROTOCOL
    member.close()
    # a classic group with a member: the KIP-848 heartbeat is refused
    classic = Member(kconsumer(gcluster, "kgroup-classic", "classic-member"), topic)
    wait_for(lambda: classic.assigned == frozenset({0, 1}), timeout=60)
    wire = Wire(gcluster.address(0))
    answer = wire.stub.ConsumerGroupHeartbeat(bpb.ConsumerGroupHeartbeatRequest(
        group_id="kgroup-classic", member_epoch=0, subscribed_topic_names=[topic]))  # fmt: skip
    wire.close()
    assert answer.error_code == pb.GROUP_ID_NOT_FOUND
    # ListGroups tells them apart; DescribeGroups describes the classic one only
    admin = KafkaAdminClient(bootstrap_servers=gcluster.kafka_bootstrap_servers, request_timeout_ms=30000)
    try:
        listed = {g["group_id"]: g for g in admin.list_groups()}
        found = listed["kgroup-classic"]
        assert (found["group_type"], found["group_state"]) == ("classic", "Stable")
        assert "kgroup-classic" in {g["group_id"] for g in admin.list_groups(types_filter=["classic"])}
        assert "kgroup-classic" not in {g["group_id"] for g in admin.list_groups(types_filter=["consumer"])}
        assert admin.delete_groups(["kgroup-classic"]) == {"kgroup-classic": "NonEmptyGroupError"}
    finally:
        admin.close()
    classic.stop()
