"""ListGroups, DescribeGroups and DeleteGroups: what kafka-consumer-groups.sh and admin clients ask.

The gRPC group administration (:class:`~sluice.broker.group.admin.GroupAdmin`)
does the work over the same group coordinator, so a group listed or deleted
here is the group gRPC clients see. A group is a KIP-848 ``consumer`` group
(its members heartbeat with ConsumerGroupHeartbeat or Sluice's gRPC
heartbeat; Kafka's state names Empty, Reconciling, Stable) or a ``classic``
one (JoinGroup/SyncGroup members; states Empty, PreparingRebalance,
CompletingRebalance, Stable); both have protocol type ``consumer``. A group
with committed offsets only is listed as an Empty ``consumer`` group.
ListGroups is per broker, as in Kafka: a broker lists the groups whose
``__consumer_offsets`` partitions it leads (an admin client asks every
broker); a partition still loading answers COORDINATOR_LOAD_IN_PROGRESS.
``states_filter`` (v4) and ``types_filter`` (v5) match case-insensitively;
``share`` and ``streams`` groups do not exist here.

DescribeGroups describes classic groups as Kafka does (members with their
metadata and assignment in Stable only). A KIP-848 group with members, or an
unknown group, is GROUP_ID_NOT_FOUND from v6 (KIP-1043) and the state Dead
with no error before; a group with offsets only is Empty.

ConsumerGroupDescribe (KIP-848) describes the groups of Sluice's own protocol
(the gRPC admin's describe: epochs, subscriptions, current and target
assignments, topics by id and name); any other group is GROUP_ID_NOT_FOUND,
which Kafka's admin client takes as "describe it with DescribeGroups", so
``kafka-consumer-groups --describe`` works for both kinds. The assignor is
reported as ``uniform``, Kafka's name for a balanced sticky server assignor.

DeleteGroups answers per group: NON_EMPTY_GROUP while it has members (or
offsets pending in an open transaction), GROUP_ID_NOT_FOUND for a group with
neither members nor offsets, NOT_COORDINATOR elsewhere.

Authorization (Kafka's): ListGroups lists every group for a caller with
Describe on the cluster, else only the groups it may Describe; DescribeGroups
and ConsumerGroupDescribe need Describe on each group (GROUP_AUTHORIZATION_FAILED
in that group's entry; ``authorized_operations`` filled when asked for);
DeleteGroups needs Delete on each group (GROUP_AUTHORIZATION_FAILED in that
group's result; the others are deleted).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.admin import GroupAdmin
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.metadata import topic_uuid
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages import consumer_group_describe_response as cgd
from sluice.broker.kafka_wire.messages.consumer_group_describe_request import ConsumerGroupDescribeRequest
from sluice.broker.kafka_wire.messages.delete_groups_request import DeleteGroupsRequest
from sluice.broker.kafka_wire.messages.delete_groups_response import DeletableGroupResult, DeleteGroupsResponse
from sluice.broker.kafka_wire.messages.describe_groups_request import DescribeGroupsRequest
from sluice.broker.kafka_wire.messages.describe_groups_response import (
    DescribedGroup,
    DescribedGroupMember,
    DescribeGroupsResponse,
)
from sluice.broker.kafka_wire.messages.list_groups_request import ListGroupsRequest
from sluice.broker.kafka_wire.messages.list_groups_response import ListedGroup, ListGroupsResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

CONSUMER = "consumer"  # Kafka's protocol type of every Sluice group, and the KIP-848 group type
CLASSIC = "classic"
DEAD = "Dead"


def _admin(ctx: KafkaContext) -> GroupAdmin:
    return GroupAdmin(ctx.groups, ctx.config.broker_id)


class ListGroupsHandler:
    api_key = 16
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListGroupsRequest)
        resp = ListGroupsResponse()
        types = {t.lower() for t in request.types_filter}
        states = {s.lower() for s in request.states_filter}
        listed = await _admin(ctx).list_groups()
        classic = ctx.groups.classic.listing()
        resp.error_code = int(listed.error_code)
        found = [(g.group_id, g.state, CONSUMER) for g in listed.groups if g.group_id not in classic]
        found += [(group_id, state, CLASSIC) for group_id, state in classic.items()]
        everything = authorization.cluster_allowed(ctx, AclOperation.DESCRIBE)
        for group_id, state, kind in sorted(found):
            if (types and kind not in types) or (states and state.lower() not in states):
                continue
            if not everything and authorization.group_refusal(ctx, AclOperation.DESCRIBE, group_id):
                continue
            listed_group = ListedGroup(group_id=group_id, protocol_type=CONSUMER, group_state=state, group_type=kind)
            resp.groups.append(listed_group)
        return resp


class DescribeGroupsHandler:
    api_key = 15
    versions = Versions(0, 6)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeGroupsRequest)
        resp = DescribeGroupsResponse()
        for group_id in request.groups:
            refusal = authorization.group_refusal(ctx, AclOperation.DESCRIBE, group_id)
            if refusal is not None:
                why = refusal[1] if header.request_api_version >= 6 else None
                resp.groups.append(DescribedGroup(group_id=group_id, error_code=refusal[0], error_message=why))
                continue
            d = ctx.groups.classic.describe(group_id)
            out = DescribedGroup(group_id=group_id, error_code=int(d.error))
            if request.include_authorized_operations:
                out.authorized_operations = authorization.authorized_operations(ctx, ResourceType.GROUP, group_id)
            if d.error == pb.GROUP_ID_NOT_FOUND and header.request_api_version < 6:
                out.error_code, out.group_state = pb.NONE, DEAD  # before KIP-1043: Dead, no error
            elif d.error != pb.NONE:
                out.error_message = d.message or None
            else:
                out.group_state, out.protocol_type, out.protocol_data = d.state, d.protocol_type, d.protocol_name
                out.members = [
                    DescribedGroupMember(
                        member_id=m.member_id,
                        group_instance_id=m.group_instance_id,
                        client_id=m.client_id,
                        client_host=m.client_host,
                        member_metadata=m.metadata,
                        member_assignment=m.assignment,
                    )
                    for m in d.members
                ]
            resp.groups.append(out)
        return resp


class ConsumerGroupDescribeHandler:
    api_key = 69
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ConsumerGroupDescribeRequest)
        refused = {g: r for g in request.group_ids if (r := authorization.group_refusal(ctx, AclOperation.DESCRIBE, g))}
        allowed = [g for g in request.group_ids if g not in refused]
        by_id = {g.group_id: g for g in await _admin(ctx).describe_groups(allowed)}
        resp = cgd.ConsumerGroupDescribeResponse()
        for group_id in request.group_ids:
            if group_id in refused:
                code, why = refused[group_id]
                resp.groups.append(cgd.DescribedGroup(group_id=group_id, error_code=code, error_message=why))
                continue
            g = by_id[group_id]
            out = cgd.DescribedGroup(group_id=g.group_id, error_code=int(g.error_code))
            if request.include_authorized_operations:
                out.authorized_operations = authorization.authorized_operations(ctx, ResourceType.GROUP, group_id)
            if g.error_code == pb.NONE and not g.members:  # a classic group, offsets only: DescribeGroups' to answer
                out.error_code = pb.GROUP_ID_NOT_FOUND
                out.error_message = f"group {g.group_id!r} is not a consumer (KIP-848) group"
            elif g.error_code != pb.NONE:
                out.error_message = g.error_message or None
            else:
                out.group_state, out.group_epoch, out.assignment_epoch = g.state, g.group_epoch, g.group_epoch
                out.assignor_name = "uniform"
                out.members = [
                    cgd.Member(
                        member_id=m.member_id,
                        member_epoch=m.member_epoch,
                        subscribed_topic_names=list(m.subscribed_topic_names),
                        assignment=_assignment(ctx, m.assignment),
                        target_assignment=_assignment(ctx, m.target_assignment),
                        member_type=1,  # consumer (KIP-848), not classic
                    )
                    for m in g.members
                ]
            resp.groups.append(out)
        return resp


def _assignment(ctx: KafkaContext, tps: Iterable[tuple[str, int]]) -> cgd.Assignment:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in tps:
        by_topic.setdefault(topic, []).append(partition)
    return cgd.Assignment(
        topic_partitions=[
            cgd.TopicPartitions(topic_id=topic_uuid(ctx.cluster.topics[name]), topic_name=name, partitions=sorted(ps))
            for name, ps in sorted(by_topic.items())
            if name in ctx.cluster.topics
        ]
    )


class DeleteGroupsHandler:
    api_key = 42
    versions = Versions(0, 2)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DeleteGroupsRequest)
        refused = {
            g: r for g in request.groups_names if (r := authorization.group_refusal(ctx, AclOperation.DELETE, g))
        }
        allowed = [g for g in request.groups_names if g not in refused]
        answered = {g: int(o.error_code) for g, o in (await _admin(ctx).delete_groups(allowed)).items()}
        return DeleteGroupsResponse(
            results=[
                DeletableGroupResult(group_id=g, error_code=refused[g][0] if g in refused else answered[g])
                for g in request.groups_names
            ]
        )
