"""ListOffsets: earliest, latest, by timestamp and max-timestamp offsets, from the replica manager.

The core's ListOffsets does the work, as for the gRPC one (HW or LSO by isolation level,
KIP-207's OFFSET_NOT_AVAILABLE after a leader change, NOT_LEADER_OR_FOLLOWER off the leader,
and Kafka's leader epoch check: a ``current_leader_epoch`` (v4+) older than the leader's is
FENCED_LEADER_EPOCH, a newer one UNKNOWN_LEADER_EPOCH, so a client with stale metadata
refreshes, exactly as against Kafka); this handler maps Kafka's request onto it.

Specs: -1 latest, -2 earliest, -3 max timestamp (v7+), -4 earliest local (v8+;
Sluice has no tiered storage, so it is the log start), a timestamp >= 0. The
tiered-storage specs (-5 latest tiered, -6 earliest pending upload) are
INVALID_REQUEST per partition.

Authorization: Describe on each topic, else its partitions answer
TOPIC_AUTHORIZATION_FAILED and are not looked up.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.data_path import EARLIEST, OffsetQuery
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

EARLIEST_LOCAL = -4  # KIP-405's earliest local offset: with no tiered storage, the earliest
KAFKA_READ_COMMITTED = 1  # Kafka's isolation levels: 0 read_uncommitted, 1 read_committed


class ListOffsetsHandler:
    api_key = 2
    versions = Versions(1, 11)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, ListOffsetsRequest)
        read_committed = request.isolation_level == KAFKA_READ_COMMITTED
        denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (t.name for t in request.topics))
        queries = [
            # the core answers INVALID_REQUEST for a spec it does not know (KIP-1005's -5 among them)
            OffsetQuery(
                topic.name,
                p.partition_index,
                EARLIEST if p.timestamp == EARLIEST_LOCAL else p.timestamp,
                p.current_leader_epoch,
            )
            for topic in request.topics
            if topic.name not in denied
            for p in topic.partitions
        ]
        answered = iter(ctx.replicas.list_offsets(queries, read_committed) if queries else ())
        resp = ListOffsetsResponse()
        for topic in request.topics:
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
            for p in topic.partitions:
                a = next(answered)
                out.partitions.append(
                    ListOffsetsPartitionResponse(
                        partition_index=p.partition_index,
                        error_code=int(a.error_code),
                        timestamp=a.timestamp,
                        offset=a.offset,
                        leader_epoch=a.leader_epoch,
                    )
                )
        return resp
