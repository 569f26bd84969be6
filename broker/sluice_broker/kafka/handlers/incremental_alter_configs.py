"""IncrementalAlterConfigs: change a topic's config overrides with Kafka's SET / DELETE / APPEND / SUBTRACT.

What ``kafka-configs --alter --add-config / --delete-config``,
``Admin.incrementalAlterConfigs`` and librdkafka's ``incremental_alter_configs``
send. A thin map onto :meth:`~sluice.broker.cluster.ClusterView.alter_topic_config`
(the rules: :mod:`sluice.broker.topic_config_ops`), one resource at a time:
each is applied or refused whole, and a refusal is that resource's error code
and message, the others served. ``validate_only`` checks and writes nothing.

Resources: a topic (type 2). A broker (type 4, by id or the cluster default
``""``): Sluice has no dynamic broker configuration, so INVALID_REQUEST saying
so (broker settings are given at start-up). Any other type (loggers, client
metrics, groups): INVALID_REQUEST. A resource named twice in one request:
INVALID_REQUEST for each occurrence, as Kafka.

Authorization (Kafka's): AlterConfigs on the topic (TOPIC_AUTHORIZATION_FAILED,
whether it exists or not), on the cluster for a broker
(CLUSTER_AUTHORIZATION_FAILED); checked before anything else about the resource.
"""

from __future__ import annotations

from collections import Counter

from sluice import errors
from sluice.acls import AclOperation, ResourceType
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.incremental_alter_configs_request import (
    AlterConfigsResource,
    IncrementalAlterConfigsRequest,
)
from sluice.broker.kafka_wire.messages.incremental_alter_configs_response import (
    AlterConfigsResourceResponse,
    IncrementalAlterConfigsResponse,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.topic_config_ops import ConfigChange
from sluice.errors import SluiceError

TOPIC, BROKER = 2, 4
NO_DYNAMIC_BROKER_CONFIG = (
    "Sluice has no dynamic broker configuration: a broker's settings are given at start-up "
    "(--config KEY=VALUE, the Helm chart's broker config) and changed by restarting it; "
    "topic settings are altered per topic"
)


class IncrementalAlterConfigsHandler:
    api_key = 44
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, IncrementalAlterConfigsRequest)
        named = Counter((r.resource_type, r.resource_name) for r in request.resources)
        resp = IncrementalAlterConfigsResponse()
        for resource in request.resources:
            result = AlterConfigsResourceResponse(
                error_message=None, resource_type=resource.resource_type, resource_name=resource.resource_name
            )
            try:
                if named[(resource.resource_type, resource.resource_name)] > 1:
                    raise errors.InvalidRequestError(
                        f"resource {resource.resource_name!r} (type {resource.resource_type}) is named more "
                        "than once in one request"
                    )
                await self._alter(ctx, resource, request.validate_only)
            except SluiceError as exc:
                result.error_code, result.error_message = int(exc.code), exc.message
            resp.responses.append(result)
        return resp

    @staticmethod
    async def _alter(ctx: KafkaContext, resource: AlterConfigsResource, validate_only: bool) -> None:
        op = AclOperation.ALTER_CONFIGS
        if resource.resource_type == TOPIC:
            if not authorization.allowed(ctx, op, ResourceType.TOPIC, resource.resource_name):
                raise errors.TopicAuthorizationFailedError(authorization.topic_refusal(op, resource.resource_name))
            changes = [ConfigChange(c.name, c.config_operation, c.value) for c in resource.configs]
            await ctx.cluster.admin(
                ctx.cluster.alter_topic_config, resource.resource_name, changes, validate_only=validate_only
            )
        elif resource.resource_type == BROKER:
            if not authorization.cluster_allowed(ctx, op):
                raise errors.ClusterAuthorizationFailedError(authorization.cluster_refusal(op))
            raise errors.InvalidRequestError(NO_DYNAMIC_BROKER_CONFIG)
        else:
            raise errors.InvalidRequestError(
                f"resource type {resource.resource_type} is not served (topics: 2; brokers: 4, read-only)"
            )
