"""The group APIs on a secure Kafka listener: mutual TLS, the authorizer on, deny by default.

A principal without an ACL on the group is refused with GROUP_AUTHORIZATION_FAILED by JoinGroup,
SyncGroup, Heartbeat, LeaveGroup, DescribeGroups, ConsumerGroupDescribe and
ConsumerGroupHeartbeat, and no member is created; with Read and Describe on the group it joins
(MEMBER_ID_REQUIRED, then a generation) and is described with its peer address as client host.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

import pytest
from kafka.protocol.admin import DescribeGroupsRequest
from kafka.protocol.consumer import HeartbeatRequest, JoinGroupRequest, LeaveGroupRequest, SyncGroupRequest

from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from sluice.broker.kafka_wire.messages.consumer_group_describe_response import ConsumerGroupDescribeResponse
from sluice.broker.kafka_wire.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from sluice.broker.kafka_wire.messages.consumer_group_heartbeat_response import ConsumerGroupHeartbeatResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.client import Admin
from sluice.testing import LocalCluster

from .test_kafka_security import GROUP_AUTH, OP, RT, allow, ask, read_frame, tls_connect, tls_context

NONE, MEMBER_ID_REQUIRED = 0, 79


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster(
        brokers=1,
        data_dir=tmp_path_factory.mktemp("kafka-groups-secure"),
        secure=True,
        kafka_listener=True,
        config={"group.initial.rebalance.delay.ms": 300},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def admin(cluster: LocalCluster) -> Iterator[Admin]:
    a = Admin(**cluster.client_config("admin"))
    yield a
    a.close()


def join(group: str, member_id: str = "") -> JoinGroupRequest:
    protocol = JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"m")
    return JoinGroupRequest[5](group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000,
                               member_id=member_id, group_instance_id=None, protocol_type="consumer",
                               protocols=[protocol])  # fmt: skip


def ask_flexible(cluster: LocalCluster, who: str, api_key: int, request: Any, response: Any) -> Any:
    """A KIP-848 request (kafka-python has no class for these): the broker's generated codec, v0, over TLS."""
    header = codec.encode(RequestHeader(request_api_key=api_key, request_api_version=0, correlation_id=7,
                                        client_id="security-test"), 2)  # fmt: skip
    body = header + codec.encode(request, 0)
    with tls_connect(cluster, tls_context(cluster, who)) as sock:
        sock.sendall(struct.pack(">i", len(body)) + body)
        frame = read_frame(sock)
    assert struct.unpack(">i", frame[:4])[0] == 7 and frame[4] == 0  # correlation id, no tagged fields
    return codec.decode(response, frame[5:], 0)


def test_group_apis_need_read_and_describe_on_the_group(cluster: LocalCluster, admin: Admin) -> None:
    group, who = "secure-classic-group", "group-user"
    assert ask(cluster, who, join(group)).error_code == GROUP_AUTH
    sync = SyncGroupRequest[3](group_id=group, generation_id=1, member_id="m", group_instance_id=None, assignments=[])
    assert ask(cluster, who, sync).error_code == GROUP_AUTH
    beat = HeartbeatRequest[3](group_id=group, generation_id=1, member_id="m", group_instance_id=None)
    assert ask(cluster, who, beat).error_code == GROUP_AUTH
    leave = LeaveGroupRequest[3](group_id=group, members=[LeaveGroupRequest.MemberIdentity(member_id="m")])
    assert ask(cluster, who, leave).error_code == GROUP_AUTH
    [described] = ask(cluster, who, DescribeGroupsRequest[5](groups=[group])).groups
    assert described.error_code == GROUP_AUTH
    described_848 = ask_flexible(cluster, who, 69, ConsumerGroupDescribeRequest(group_ids=[group]),
                                 ConsumerGroupDescribeResponse)  # fmt: skip
    assert [g.error_code for g in described_848.groups] == [GROUP_AUTH]
    kip848 = ConsumerGroupHeartbeatRequest(group_id=group, member_id="m", member_epoch=0, subscribed_topic_names=[])
    assert ask_flexible(cluster, who, 68, kip848, ConsumerGroupHeartbeatResponse).error_code == GROUP_AUTH
    # nothing was created by the refused requests
    [described] = ask(cluster, "admin", DescribeGroupsRequest[5](groups=[group])).groups
    assert described.members == []

    allow(admin, f"User:{who}", RT.GROUP, group, OP.READ, OP.DESCRIBE)
    required = ask(cluster, who, join(group))
    assert required.error_code == MEMBER_ID_REQUIRED
    joined = ask(cluster, who, join(group, required.member_id))
    assert (joined.error_code, joined.generation_id, joined.leader) == (NONE, 1, required.member_id)
    [described] = ask(cluster, who, DescribeGroupsRequest[5](groups=[group])).groups
    assert described.error_code == NONE
    assert [(m.member_id, m.client_host) for m in described.members] == [(required.member_id, "/127.0.0.1")]
