"""Metadata: brokers (their Kafka addresses), topics, partition leaders, epochs, replicas and ISR.

Answered from the broker's :class:`~sluice.broker.cluster.ClusterView`, refreshed
first, as the gRPC Metadata is. Brokers are listed with the Kafka address each
advertised in its ``brokers/<id>`` document; a broker without a Kafka listener is
left out (its partitions show their leader id, which a Kafka client cannot
reach, so it keeps refreshing: what Kafka does for a leader on an unknown
listener). A partition without a leader is LEADER_NOT_AVAILABLE, a topic that
does not exist UNKNOWN_TOPIC_OR_PARTITION, unless ``auto.create.topics.enable``
(Kafka's key; off by default here, on in Kafka) and the request's
``allow_auto_topic_creation`` (always true before v4) let it be created: then, as
Kafka, it is created with ``num.partitions`` and ``default.replication.factor`` if
the caller may Create it (on the cluster or the topic), and answered with its
partitions, LEADER_NOT_AVAILABLE while they have no leader yet. With the switch
off, the broker logs once per topic name why the topic is unknown and what to do.

Authorization (Kafka's): Describe on each topic. A topic asked for by name that
the caller may not Describe is TOPIC_AUTHORIZATION_FAILED with a zero id,
whether it exists or not (existence is not disclosed); asked for by id, the id
is answered with TOPIC_AUTHORIZATION_FAILED and no name; the all-topics list
leaves it out. The authorized-operations bit fields are filled when asked for
(v8+; the cluster's v8-10, 0 without Describe on the cluster).
"""

from __future__ import annotations

import logging
import uuid

from sluice import errors
from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import INTERNAL_TOPICS, TopicInfo
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext, kafka_brokers
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.metadata_request import MetadataRequest
from sluice.broker.kafka_wire.messages.metadata_response import (
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.metadata.documents import NO_LEADER

UNKNOWN_TOPIC_ID = 100  # Kafka's; not in records.proto's ErrorCode (gRPC names topics only)
ZERO_UUID = uuid.UUID(int=0)
_TOLD_MAX = 1000  # topic names whose absence was logged: bounded, clients may ask for any name

log = logging.getLogger(__name__)


def topic_uuid(info: TopicInfo) -> uuid.UUID:
    try:
        return uuid.UUID(hex=info.topic_id)
    except ValueError:
        return ZERO_UUID


class MetadataHandler:
    api_key = 3
    versions = Versions(0, 13)

    def __init__(self) -> None:
        self._told: set[str] = set()

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
            await self._wanted(ctx, header, request, version, resp)
        if request.include_topic_authorized_operations:
            for topic in resp.topics:
                if topic.error_code in (0, pb.LEADER_NOT_AVAILABLE) and topic.name:
                    topic.topic_authorized_operations = authorization.authorized_operations(
                        ctx, ResourceType.TOPIC, topic.name
                    )
        return resp

    async def _wanted(
        self, ctx: KafkaContext, header: RequestHeader, request: MetadataRequest, version: int, resp: MetadataResponse
    ) -> None:
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
                    allowed = version < 4 or request.allow_auto_topic_creation
                    resp.topics.append(await self._unknown(ctx, header, w.name, allowed))
                    continue
            resp.topics.append(self._topic(info))

    async def _unknown(
        self, ctx: KafkaContext, header: RequestHeader, name: str, allowed: bool
    ) -> MetadataResponseTopic:
        """A topic asked for by name that does not exist: created if auto-creation is on, else UNKNOWN."""
        unknown = MetadataResponseTopic(error_code=pb.UNKNOWN_TOPIC_OR_PARTITION, name=name)
        if not ctx.config.get("auto.create.topics.enable"):
            if name not in self._told and len(self._told) < _TOLD_MAX:
                self._told.add(name)  # once: clients ask again every retry.backoff.ms
                log.info(
                    "Metadata from %r: topic %r does not exist and auto.create.topics.enable is false: create it "
                    "(sluice topics create %s, kafka-topics.sh --create) or set auto.create.topics.enable=true",
                    header.client_id, name, name,
                )  # fmt: skip
            return unknown
        if not allowed or name in INTERNAL_TOPICS:
            return unknown
        if not authorization.cluster_allowed(ctx, AclOperation.CREATE) and authorization.denied_topics(
            ctx, AclOperation.CREATE, [name]
        ):
            return unknown  # Kafka answers UNKNOWN_TOPIC_OR_PARTITION to a caller that may not create it
        try:
            await ctx.cluster.admin(ctx.cluster.create_topic, name, 0, 0, {})  # 0, 0: num.partitions, default RF
            log.info("auto-created topic %r for a Metadata request from %r", name, header.client_id)
        except errors.TopicAlreadyExistsError:
            pass  # another request created it first
        except errors.SluiceError as exc:  # an invalid name, too few brokers for the replication factor
            return MetadataResponseTopic(error_code=int(exc.code), name=name)
        info = ctx.cluster.topics.get(name)
        if info is None:
            return MetadataResponseTopic(error_code=pb.LEADER_NOT_AVAILABLE, name=name)  # as Kafka: ask again
        return self._topic(info)

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
