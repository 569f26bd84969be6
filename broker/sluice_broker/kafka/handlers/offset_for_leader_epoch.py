"""OffsetForLeaderEpoch: where a leader epoch ends on the leader, so a consumer can validate its position.

The Java client validates its fetch position after a leader change with v3+
(KIP-320): it asks where the epoch of its last consumed record ends and
truncates if the log diverged. The replica manager's own answer (the one
followers use over gRPC), including the ``current_leader_epoch`` check
(FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH), is mapped onto Kafka's shape.

Authorization (Kafka's): ClusterAction on the cluster covers every topic (a
follower's right); otherwise each topic needs Describe, else its partitions
answer TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.offset_for_leader_epoch_request import OffsetForLeaderEpochRequest
from sluice.broker.kafka_wire.messages.offset_for_leader_epoch_response import (
    EpochEndOffset,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderTopicResult,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader


class OffsetForLeaderEpochHandler:
    api_key = 23
    versions = Versions(2, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, OffsetForLeaderEpochRequest)
        core = ipb.OffsetsForLeaderEpochRequest(replica_id=request.replica_id)
        denied: set[str] = set()
        if not authorization.cluster_allowed(ctx, AclOperation.CLUSTER_ACTION):
            denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (t.topic for t in request.topics))
        by_topic: dict[str, OffsetForLeaderTopicResult] = {}
        for topic in request.topics:
            if topic.topic in denied:
                result = by_topic.setdefault(topic.topic, OffsetForLeaderTopicResult(topic=topic.topic))
                result.partitions.extend(
                    EpochEndOffset(pb.TOPIC_AUTHORIZATION_FAILED, p.partition, -1, -1) for p in topic.partitions
                )
                continue
            for p in topic.partitions:
                core.partitions.add(
                    topic=topic.topic,
                    partition=p.partition,
                    current_leader_epoch=p.current_leader_epoch,
                    leader_epoch=p.leader_epoch,
                )
        answer = ctx.replicas.offsets_for_leader_epoch(core)
        for a in answer.partitions:
            result = by_topic.setdefault(a.topic, OffsetForLeaderTopicResult(topic=a.topic))
            result.partitions.append(EpochEndOffset(int(a.error_code), a.partition, a.leader_epoch, a.end_offset))
        return OffsetForLeaderEpochResponse(topics=list(by_topic.values()))
