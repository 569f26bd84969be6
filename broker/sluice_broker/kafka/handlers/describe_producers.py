"""DescribeProducers: the active producers of partitions this broker leads (kafka-transactions).

Read from the partition log's producer state, the same state idempotence and
transactions are checked against: per producer id its epoch, last sequence,
last timestamp, coordinator epoch and, while it has a transaction open on the
partition, that transaction's first offset (Kafka's
``current_txn_start_offset``: what an operator uses to find a hanging
transaction). As in Kafka the leader answers; another broker answers
NOT_LEADER_OR_FOLLOWER, an unknown partition UNKNOWN_TOPIC_OR_PARTITION.
Authorization (Kafka's): Read on the topic, else its partitions answer
TOPIC_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.describe_producers_request import DescribeProducersRequest
from sluice.broker.kafka_wire.messages.describe_producers_response import (
    DescribeProducersResponse,
    PartitionResponse,
    ProducerState,
    TopicResponse,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.errors import SluiceError


class DescribeProducersHandler:
    api_key = 61
    versions = Versions(0, 0)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeProducersRequest)
        resp = DescribeProducersResponse()
        denied = authorization.denied_topics(ctx, AclOperation.READ, (t.name for t in request.topics))
        for topic in request.topics:
            out = TopicResponse(name=topic.name)
            for index in topic.partition_indexes:
                part = PartitionResponse(partition_index=index)
                if topic.name in denied:
                    part.error_code = pb.TOPIC_AUTHORIZATION_FAILED
                    part.error_message = authorization.topic_refusal(AclOperation.READ, topic.name)
                    out.partitions.append(part)
                    continue
                try:
                    found = ctx.replicas.describe_producers(topic.name, index)
                except SluiceError as exc:
                    part.error_code, part.error_message = int(exc.code), exc.message
                else:
                    part.active_producers = [
                        ProducerState(
                            producer_id=p.producer_id,
                            producer_epoch=p.producer_epoch,
                            last_sequence=p.last_sequence,
                            last_timestamp=p.last_timestamp,
                            coordinator_epoch=p.coordinator_epoch,
                            current_txn_start_offset=p.current_txn_start_offset,
                        )
                        for p in found
                    ]
                out.partitions.append(part)
            resp.topics.append(out)
        return resp
