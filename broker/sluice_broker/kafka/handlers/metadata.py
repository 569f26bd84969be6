"""Metadata: brokers (their Kafka addresses), topics, partition leaders, epochs, replicas and ISR.

Answered from the broker's :class:`~sluice.broker.cluster.ClusterView`, refreshed
first, as the gRPC Metadata is. Brokers are listed with the Kafka address each
advertised in its ``brokers/<id>`` document; a broker without a Kafka listener is
left out (its partitions show their leader id, which a Kafka client cannot
reach, so it keeps refreshing: what Kafka does for a leader on an unknown
listener). A partition without a leader is LEADER_NOT_AVAILABLE, a topic that
does not exist UNKNOWN_TOPIC_OR_PARTITION (topics are never auto-created:
``allow_auto_topic_creation`` is ignored, as ``auto.create.topics.enable`` is
refused by the broker).

Authorization (Kafka's): Describe on each topic. A topic asked for by name that
the caller may not Describe is TOPIC_AUTHORIZATION_FAILED with a zero id,
whether it exists or not (existence is not disclosed); asked for by id, the id
is answered with TOPIC_AUTHORIZATION_FAILED and no name; the all-topics list
leaves it out. The authorized-operations bit fields are filled when asked for
(v8+; the cluster's v8-10, 0 without Describe on the cluster).
"""

from __future__ import annotations

import uuid

from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import INTERNAL_TOPICS, TopicInfo
from sluice.broker.kafka import authorization
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
        if request.include_cluster_authorized_operations and version <= 10:
            resp.cluster_authorized_operations = authorization.cluster_operations(ctx)
        everything = request.topics is None or (version == 0 and not request.topics)
        if everything:
            denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, cluster.topics)
            for name in sorted(set(cluster.topics) - denied):
                resp.topics.append(self._topic(cluster.topics[name]))
        else:
            self._wanted(ctx, request, version, resp)
        if request.include_topic_authorized_operations:
            for topic in resp.topics:
                if topic.error_code in (0, pb.LEADER_NOT_AVAILABLE) and topic.name:
                    topic.topic_authorized_operations = authorization.authorized_operations(
                        ctx, ResourceType.TOPIC, topic.name
                    )
        return resp

    def _wanted(self, ctx: KafkaContext, request: MetadataRequest, version: int, resp: MetadataResponse) -> None:
        """The topics asked for by name or id: each one's metadata, or why not."""
        cluster = ctx.cluster
        wanted = request.topics or []
        by_id = {topic_uuid(t): t for t in cluster.topics.values()}
        asked = [w.name if w.name is not None else getattr(by_id.get(w.topic_id), "name", "") for w in wanted]
        denied = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (n for n in asked if n))
        refusal = pb.TOPIC_AUTHORIZATION_FAILED
        no_name = None if version >= 12 else ""  # the response's name is nullable from v12; v10-11: empty
        for w, name in zip(wanted, asked, strict=True):
            if w.name is None:
                info = by_id.get(w.topic_id)
                if info is None:
                    resp.topics.append(
                        MetadataResponseTopic(error_code=UNKNOWN_TOPIC_ID, name=no_name, topic_id=w.topic_id)
                    )
                    continue
                if name in denied:  # Kafka: ids are not secret, the name is
                    resp.topics.append(MetadataResponseTopic(error_code=refusal, name=no_name, topic_id=w.topic_id))
                    continue
            else:
                if name in denied:  # checked before existence: a refusal does not say whether it exists
                    resp.topics.append(MetadataResponseTopic(error_code=refusal, name=name))
                    continue
                info = cluster.topics.get(w.name)
                if info is None:
                    resp.topics.append(MetadataResponseTopic(error_code=pb.UNKNOWN_TOPIC_OR_PARTITION, name=w.name))
                    continue
            resp.topics.append(self._topic(info))

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
