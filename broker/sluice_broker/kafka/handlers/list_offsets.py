"""ListOffsets: earliest, latest, by timestamp and max-timestamp offsets, from the replica manager.

The gRPC ListOffsets does the work (HW or LSO by isolation level, KIP-207's
OFFSET_NOT_AVAILABLE after a leader change, NOT_LEADER_OR_FOLLOWER off the
leader); this handler maps Kafka's request onto it and adds Kafka's leader
epoch check: a ``current_leader_epoch`` (v4+) older than the leader's is
FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, so a client with stale
metadata refreshes, exactly as against Kafka.

Specs: -1 latest, -2 earliest, -3 max timestamp (v7+), -4 earliest local (v8+;
Sluice has no tiered storage, so it is the log start), a timestamp >= 0. The
tiered-storage specs (-5 latest tiered, -6 earliest pending upload) are
INVALID_REQUEST per partition.

Authorization: Describe on each topic, else its partitions answer
TOPIC_AUTHORIZATION_FAILED and are not looked up.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.list_offsets_request import ListOffsetsRequest
from sluice.broker.kafka_wire.messages.list_offsets_response import (
    ListOffsetsPartitionResponse,
    ListOffsetsResponse,
    ListOffsetsTopicResponse,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

EARLIEST, EARLIEST_LOCAL = -2, -4
KAFKA_READ_COMMITTED = 1  # Kafka's isolation levels: 0 read_uncommitted, 1 read_committed


class ListOffsetsHandler:
    api_key = 2
    versions = Versions(1, 11)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListOffsetsRequest)
        isolation = pb.READ_COMMITTED if request.isolation_level == KAFKA_READ_COMMITTED else pb.READ_UNCOMMITTED
        core = bpb.ListOffsetsRequest(isolation_level=isolation)
        refused: set[tuple[int, int]] = set()  # (topic index, partition index) in the request
        denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (t.name for t in request.topics))
        for t, topic in enumerate(request.topics):
            if topic.name in denied:
                continue
            ct = core.topics.add(name=topic.name)
            for i, p in enumerate(topic.partitions):
                spec = EARLIEST if p.timestamp == EARLIEST_LOCAL else p.timestamp
                if spec < -3:
                    refused.add((t, i))
                    spec = EARLIEST  # asked anyway so the partition keeps its place; the answer is replaced
                ct.partitions.add(partition=p.partition_index, timestamp=spec)
        answer = ctx.replicas.list_offsets(core) if core.topics else bpb.ListOffsetsResponse()
        answered_topics = iter(answer.topics)
        resp = ListOffsetsResponse()
        for t, topic in enumerate(request.topics):
            out = ListOffsetsTopicResponse(name=topic.name)
            resp.topics.append(out)
            if topic.name in denied:
                out.partitions = [
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index, error_code=pb.TOPIC_AUTHORIZATION_FAILED,
                        timestamp=-1, offset=-1, leader_epoch=-1,
                    )
                    for p in topic.partitions
                ]  # fmt: skip
                continue
            answered = next(answered_topics)
            for i, (p, a) in enumerate(zip(topic.partitions, answered.partitions, strict=True)):
                part = ListOffsetsPartitionResponse(
                    partition_index=p.partition_index,
                    error_code=int(a.error_code),
                    timestamp=a.timestamp,
                    offset=a.offset,
                    leader_epoch=a.leader_epoch if a.error_code == pb.NONE else -1,
                )
                error = pb.INVALID_REQUEST if (t, i) in refused else None
                if error is None and a.error_code == pb.NONE and p.current_leader_epoch >= 0:
                    if p.current_leader_epoch < a.leader_epoch:
                        error = pb.FENCED_LEADER_EPOCH
                    elif p.current_leader_epoch > a.leader_epoch:
                        error = pb.UNKNOWN_LEADER_EPOCH
                if error is not None:
                    part.error_code, part.offset, part.timestamp, part.leader_epoch = error, -1, -1, -1
                out.partitions.append(part)
        return resp
