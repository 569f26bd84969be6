"""ConsumerGroupHeartbeat (KIP-848) over the Kafka listener: Kafka's new consumer protocol.

Sluice's own groups are KIP-848 shaped, so this is a thin map onto the
coordinator's heartbeat (:meth:`GroupCoordinator.member_heartbeat`), the one the
gRPC consumer uses: a Java consumer with ``group.protocol=consumer`` and a
Sluice consumer can be members of the same group. The translations:

* topics are named by id on the wire (Metadata's topic ids); an owned
  partition of a topic id this broker does not know (deleted) is dropped;
* ``topic_partitions`` (owned) and ``subscribed_topic_names`` are null when
  unchanged since the member's last heartbeat: null maps to "as last
  reported", never to "owns nothing" (that could give a partition two owners);
* ``rebalance_timeout_ms`` -1 is "unchanged";
* the answer always carries the member's complete assignment (Kafka may send
  null when it did not change; a complete one is equally valid).

Refused with INVALID_REQUEST: a join (epoch 0) without a subscription, a
regular-expression subscription (v1; not supported), and a
``group_instance_id`` (static membership is not supported for these groups).
A ``server_assignor`` is ignored: Sluice has one (balanced, sticky) assignor.

Authorization is the gRPC heartbeat's (:func:`coordinator_checks.check_heartbeat`):
Read on the group (GROUP_AUTHORIZATION_FAILED) and Describe on each subscribed
topic (TOPIC_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

from collections import defaultdict

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.membership import JOIN_EPOCH, HeartbeatInput
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.metadata import topic_uuid
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.consumer_group_heartbeat_request import ConsumerGroupHeartbeatRequest
from sluice.broker.kafka_wire.messages.consumer_group_heartbeat_response import (
    Assignment,
    ConsumerGroupHeartbeatResponse,
    TopicPartitions,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.security import coordinator_checks as checks


def _refuse(request: ConsumerGroupHeartbeatRequest, message: str) -> ConsumerGroupHeartbeatResponse:
    return ConsumerGroupHeartbeatResponse(
        error_code=pb.INVALID_REQUEST,
        error_message=message,
        member_id=request.member_id,
        member_epoch=request.member_epoch,
    )


class ConsumerGroupHeartbeatHandler:
    api_key = 68
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ConsumerGroupHeartbeatRequest)
        if request.subscribed_topic_regex:
            return _refuse(request, "regular-expression subscriptions are not supported: name the topics")
        if request.instance_id is not None:
            return _refuse(request, "static membership (group.instance.id) is not supported for consumer groups")
        if request.member_epoch == JOIN_EPOCH and request.subscribed_topic_names is None:
            return _refuse(request, "a join (member epoch 0) must name the subscribed topics")
        refused = checks.check_heartbeat(ctx.access, ctx.caller, request.group_id, request.subscribed_topic_names or [])
        if refused is not None:
            return ConsumerGroupHeartbeatResponse(
                error_code=int(refused.code),
                error_message=refused.message,
                member_id=request.member_id,
                member_epoch=request.member_epoch,
            )
        names = {topic_uuid(info): name for name, info in ctx.cluster.topics.items()}
        owned = None
        if request.topic_partitions is not None:
            known = [tp for tp in request.topic_partitions if tp.topic_id in names]
            owned = frozenset((names[tp.topic_id], p) for tp in known for p in tp.partitions)
        answer = await ctx.groups.member_heartbeat(
            request.group_id,
            HeartbeatInput(
                member_id=request.member_id,
                member_epoch=request.member_epoch,
                subscription=None if request.subscribed_topic_names is None else tuple(request.subscribed_topic_names),
                owned=owned,
                rebalance_timeout_ms=max(request.rebalance_timeout_ms, 0),
            ),
        )
        resp = ConsumerGroupHeartbeatResponse(
            error_code=int(answer.error_code),
            error_message=answer.error_message or None,
            member_id=answer.member_id or request.member_id,
            member_epoch=answer.member_epoch,
            heartbeat_interval_ms=answer.heartbeat_interval_ms,
        )
        if answer.error_code == pb.NONE and answer.member_epoch >= 0:
            by_topic: dict[str, list[int]] = defaultdict(list)
            for topic, partition in answer.assignment:
                by_topic[topic].append(partition)
            resp.assignment = Assignment(
                topic_partitions=[
                    TopicPartitions(topic_id=topic_uuid(ctx.cluster.topics[topic]), partitions=sorted(parts))
                    for topic, parts in sorted(by_topic.items())
                    if topic in ctx.cluster.topics
                ]
            )
        return resp
