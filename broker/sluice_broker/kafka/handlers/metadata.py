"""Metadata: brokers (their Kafka addresses), topics, partition leaders, epochs, replicas and ISR.

Answered from the broker's :class:`~sluice.broker.cluster.ClusterView`, refreshed
first, as the gRPC Metadata is. Brokers are listed with the Kafka address each
advertised in its ``brokers/<id>`` document; a broker without a Kafka listener is
left out (its partitions show their leader id, which a Kafka client cannot
reach, so it keeps refreshing: what Kafka does for a leader on an unknown
listener). A partition without a leader is LEADER_NOT_AVAILABLE, a topic that
does not exist UNKNOWN_TOPIC_OR_PARTITION (topics are never auto-created:
``allow_auto_topic_creation`` is ignored, as ``auto.create.topics.enable`` is
refused by the broker). Authorized-operations fields are left at Kafka's
"not provided" value until ACLs exist (issue 12).
"""

from __future__ import annotations

import uuid

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import INTERNAL_TOPICS, TopicInfo
from sluice.broker.kafka.codec import Message, Versions
from sluice.broker.kafka.context import KafkaContext, kafka_brokers
from sluice.broker.kafka.messages.metadata_request import MetadataRequest
from sluice.broker.kafka.messages.metadata_response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from sluice.broker.kafka.messages.request_header import RequestHeader
from sluice.metadata.documents import NO_LEADER

UNKNOWN_TOPIC_ID = 100  # Kafka's; not in records.proto's ErrorCode (gRPC names topics only)
ZERO_UUID = uuid.UUID(int=0)


def topic_uuid(info: TopicInfo) -> uuid.UUID:
    try:
        return uuid.UUID(hex=info.topic_id)
    except ValueError:
        return ZERO_UUID


class MetadataHandler:
    api_key = 3
    versions = Versions(0, 13)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, MetadataRequest)
        version = header.request_api_version
        cluster = ctx.cluster
        cluster.refresh()
        # Kafka clients send admin requests to the controller; every Sluice broker takes them, so
        # each names itself (it has a Kafka listener: it is answering on it).
        resp = MetadataResponse(cluster_id=cluster.cluster_id or None, controller_id=ctx.config.broker_id)
        for broker_id, host, port, rack in kafka_brokers(ctx):
            resp.brokers.append(MetadataResponseBroker(broker_id, host, port, rack))
        everything = request.topics is None or (version == 0 and not request.topics)
        if everything:
            for name in sorted(cluster.topics):
                resp.topics.append(self._topic(cluster.topics[name]))
            return resp
        by_id = {topic_uuid(t): t for t in cluster.topics.values()}
        for wanted in request.topics or []:
            if wanted.name is None:
                info = by_id.get(wanted.topic_id)
                if info is None:
                    # the response's name is nullable from v12; v10-11 answer an empty one
                    no_name = None if version >= 12 else ""
                    resp.topics.append(
                        MetadataResponseTopic(error_code=UNKNOWN_TOPIC_ID, name=no_name, topic_id=wanted.topic_id)
                    )
                    continue
            else:
                info = cluster.topics.get(wanted.name)
                if info is None:
                    resp.topics.append(
                        MetadataResponseTopic(error_code=pb.UNKNOWN_TOPIC_OR_PARTITION, name=wanted.name)
                    )
                    continue
            resp.topics.append(self._topic(info))
        return resp

    @staticmethod
    def _topic(info: TopicInfo) -> MetadataResponseTopic:
        out = MetadataResponseTopic(
            error_code=0, name=info.name, topic_id=topic_uuid(info), is_internal=info.name in INTERNAL_TOPICS
        )
        for index, part in enumerate(info.partitions):
            out.partitions.append(
                MetadataResponsePartition(
                    error_code=pb.LEADER_NOT_AVAILABLE if part.leader == NO_LEADER else 0,
                    partition_index=index,
                    leader_id=part.leader,
                    leader_epoch=part.leader_epoch,
                    replica_nodes=list(part.replicas),
                    isr_nodes=list(part.isr),
                    offline_replicas=[],
                )
            )
        return out
