"""CreateTopics, DeleteTopics, CreatePartitions: Kafka's topic admin over the cluster view.

The same calls as the gRPC topic admin (:class:`~sluice.broker.cluster.ClusterView`
``create_topic`` / ``delete_topic`` / ``create_partitions``), so names, limits and
config validation are one set of rules; a refusal is the Kafka code of the
:mod:`sluice.errors` class raised, per topic. Kafka's -1 ("the broker's
default") for partitions and replication factor is Sluice's 0. Manual replica
assignments are refused per topic with INVALID_REQUEST: placement is the
cluster's (rack-aware, docs/architecture.md). A created topic's result (v5+)
carries its configs, as Kafka's does: Kafka's Java AdminClient
(``kafka-topics --create``, ``Admin.createTopics``) reads them and fails on a
null list.

Authorization (Kafka's), per topic, before the topic is looked up:
CreateTopics needs Create on the cluster or on the topic (and DescribeConfigs on
the topic for its configs: else ``topic_config_error_code`` says
TOPIC_AUTHORIZATION_FAILED); DeleteTopics Delete on the topic, and for a topic
named by id Describe as well (without it the name is not returned);
CreatePartitions Alter on the topic. A refused topic answers
TOPIC_AUTHORIZATION_FAILED; the others are served.
"""

from __future__ import annotations

import uuid

from sluice import errors
from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.describe_configs import topic_config_entries
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.create_partitions_request import CreatePartitionsRequest
from sluice.broker.kafka_wire.messages.create_partitions_response import (
    CreatePartitionsResponse,
    CreatePartitionsTopicResult,
)
from sluice.broker.kafka_wire.messages.create_topics_request import CreateTopicsRequest
from sluice.broker.kafka_wire.messages.create_topics_response import (
    CreatableTopicConfigs,
    CreatableTopicResult,
    CreateTopicsResponse,
)
from sluice.broker.kafka_wire.messages.delete_topics_request import DeleteTopicsRequest
from sluice.broker.kafka_wire.messages.delete_topics_response import DeletableTopicResult, DeleteTopicsResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.errors import SluiceError


def _uuid(hex_id: str) -> uuid.UUID:
    try:
        return uuid.UUID(hex=hex_id)
    except ValueError:
        return uuid.UUID(int=0)


class CreateTopicsHandler:
    api_key = 19
    versions = Versions(2, 7)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, CreateTopicsRequest)
        resp = CreateTopicsResponse()
        names = [t.name for t in request.topics]
        on_cluster = authorization.cluster_allowed(ctx, AclOperation.CREATE)
        denied = set() if on_cluster else authorization.denied_topics(ctx, AclOperation.CREATE, names)
        no_configs = authorization.denied_topics(ctx, AclOperation.DESCRIBE_CONFIGS, names)
        for topic in request.topics:
            result = CreatableTopicResult(name=topic.name, error_message=None, configs=None)
            if topic.name in no_configs:
                result.topic_config_error_code = pb.TOPIC_AUTHORIZATION_FAILED
            if topic.name in denied:
                result.error_code = pb.TOPIC_AUTHORIZATION_FAILED
                result.error_message = authorization.topic_refusal(AclOperation.CREATE, topic.name)
                resp.topics.append(result)
                continue
            try:
                if topic.assignments:
                    raise errors.InvalidRequestError(
                        "manual replica assignments are not supported: placement is Sluice's"
                    )
                config = {c.name: c.value for c in topic.configs if c.value is not None}
                topic_id = await ctx.cluster.admin(
                    ctx.cluster.create_topic,
                    topic.name,
                    max(topic.num_partitions, 0),
                    max(topic.replication_factor, 0),
                    config,
                    validate_only=request.validate_only,
                )
                result.topic_id = _uuid(topic_id)
                info = ctx.cluster.topics.get(topic.name)
                if info is not None:
                    result.num_partitions = len(info.partitions)
                    result.replication_factor = info.replication_factor
                result.configs = [
                    CreatableTopicConfigs(key, value, False, source, False)
                    for key, value, source in topic_config_entries(ctx, info.config if info is not None else config)
                ]
            except SluiceError as exc:
                result.error_code, result.error_message = int(exc.code), exc.message
            resp.topics.append(result)
        return resp


class DeleteTopicsHandler:
    api_key = 20
    versions = Versions(1, 6)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DeleteTopicsRequest)
        ctx.cluster.refresh()
        by_id = {_uuid(t.topic_id): name for name, t in ctx.cluster.topics.items()}
        wanted: list[tuple[str | None, uuid.UUID]] = [(n, uuid.UUID(int=0)) for n in request.topic_names]
        wanted += [(t.name, t.topic_id) for t in request.topics]
        names = [n if n is not None else by_id.get(i) for n, i in wanted]
        undescribable = authorization.denied_topics(ctx, AclOperation.DESCRIBE, (n for n in names if n))
        denied = authorization.denied_topics(ctx, AclOperation.DELETE, (n for n in names if n))
        resp = DeleteTopicsResponse()
        for (name, topic_id), resolved in zip(wanted, names, strict=True):
            result = DeletableTopicResult(name=name, topic_id=topic_id)
            try:
                if name is None:
                    if resolved is None:
                        raise errors.UnknownTopicOrPartitionError(f"no topic has the id {topic_id}")
                    if resolved in undescribable:  # Kafka: the id is no secret, the name is
                        raise errors.TopicAuthorizationFailedError(
                            authorization.topic_refusal(AclOperation.DESCRIBE, str(topic_id))
                        )
                    name = result.name = resolved
                if name in denied:
                    raise errors.TopicAuthorizationFailedError(authorization.topic_refusal(AclOperation.DELETE, name))
                result.topic_id = _uuid(await ctx.cluster.admin(ctx.cluster.delete_topic, name))
            except SluiceError as exc:
                result.error_code, result.error_message = int(exc.code), exc.message
            resp.responses.append(result)
        return resp


class CreatePartitionsHandler:
    api_key = 37
    versions = Versions(0, 3)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, CreatePartitionsRequest)
        resp = CreatePartitionsResponse()
        denied = authorization.denied_topics(ctx, AclOperation.ALTER, (t.name for t in request.topics))
        for topic in request.topics:
            result = CreatePartitionsTopicResult(name=topic.name)
            try:
                if topic.name in denied:
                    raise errors.TopicAuthorizationFailedError(
                        authorization.topic_refusal(AclOperation.ALTER, topic.name)
                    )
                if topic.assignments:
                    raise errors.InvalidRequestError(
                        "manual replica assignments are not supported: placement is Sluice's"
                    )
                await ctx.cluster.admin(ctx.cluster.create_partitions, topic.name, topic.count, request.validate_only)
            except SluiceError as exc:
                result.error_code, result.error_message = int(exc.code), exc.message
            resp.results.append(result)
        return resp
