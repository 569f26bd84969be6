"""DescribeConfigs: a topic's settings (overrides and the broker defaults under them) and a broker's.

What ``kafka-configs --describe`` and ``kafka-topics --describe`` show. A topic
(resource type 2) lists every topic key Sluice reads (:data:`TOPIC_KEYS`): its
override (source DYNAMIC_TOPIC_CONFIG) or the broker's value (STATIC_BROKER_CONFIG
when the broker was started with it, DEFAULT_CONFIG otherwise). A broker
(type 4) lists its own settings, read-only: Sluice has no dynamic broker
configuration; another broker's id is INVALID_REQUEST (Kafka clients send it
to that broker). Other resource types (loggers, client metrics, groups) are
INVALID_REQUEST. Synonyms are the broker value under a topic override.

Authorization (Kafka's): DescribeConfigs on the topic (TOPIC_AUTHORIZATION_FAILED,
whether it exists or not), on the cluster for a broker
(CLUSTER_AUTHORIZATION_FAILED); a refused resource lists no configs.
"""

from __future__ import annotations

from typing import Any

from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import DEFAULTS, TOPIC_KEYS
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.describe_configs_request import DescribeConfigsRequest, DescribeConfigsResource
from sluice.broker.kafka_wire.messages.describe_configs_response import (
    DescribeConfigsResourceResult,
    DescribeConfigsResponse,
    DescribeConfigsResult,
    DescribeConfigsSynonym,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

TOPIC, BROKER = 2, 4
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
_TYPES = {bool: 1, str: 2, int: 5}  # Kafka's ConfigType: BOOLEAN, STRING, LONG
HIDDEN = {"sluice.test.hooks"}


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _broker_source(ctx: KafkaContext, key: str) -> int:
    return DEFAULT_CONFIG if ctx.config.values[key] == DEFAULTS[key][1] else STATIC_BROKER_CONFIG


class DescribeConfigsHandler:
    api_key = 32
    versions = Versions(1, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeConfigsRequest)
        ctx.cluster.refresh()
        resp = DescribeConfigsResponse()
        for resource in request.resources:
            result = DescribeConfigsResult(
                error_message=None, resource_type=resource.resource_type, resource_name=resource.resource_name
            )
            refusal = self._refusal(ctx, resource)
            if refusal is not None:
                result.error_code, result.error_message = refusal
            elif resource.resource_type == TOPIC:
                self._topic(ctx, resource, result, request.include_synonyms)
            elif resource.resource_type == BROKER and resource.resource_name in ("", str(ctx.config.broker_id)):
                self._broker(ctx, resource, result)
            else:
                result.error_code = pb.INVALID_REQUEST
                result.error_message = (
                    f"broker {resource.resource_name!r} is not this broker ({ctx.config.broker_id}): ask it"
                    if resource.resource_type == BROKER
                    else f"resource type {resource.resource_type} is not served (topics: 2, brokers: 4)"
                )
            resp.results.append(result)
        return resp

    @staticmethod
    def _refusal(ctx: KafkaContext, resource: DescribeConfigsResource) -> tuple[int, str] | None:
        op = AclOperation.DESCRIBE_CONFIGS
        if resource.resource_type == TOPIC:
            if not authorization.allowed(ctx, op, ResourceType.TOPIC, resource.resource_name):
                return pb.TOPIC_AUTHORIZATION_FAILED, authorization.topic_refusal(op, resource.resource_name)
        elif resource.resource_type == BROKER and not authorization.cluster_allowed(ctx, op):
            return pb.CLUSTER_AUTHORIZATION_FAILED, authorization.cluster_refusal(op)
        return None

    @staticmethod
    def _wanted(resource: DescribeConfigsResource, keys: list[str]) -> list[str]:
        asked = resource.configuration_keys
        return sorted(keys) if asked is None else [k for k in asked if k in keys]

    def _topic(
        self, ctx: KafkaContext, resource: DescribeConfigsResource, out: DescribeConfigsResult, synonyms: bool
    ) -> None:
        info = ctx.cluster.topics.get(resource.resource_name)
        if info is None:
            out.error_code = pb.UNKNOWN_TOPIC_OR_PARTITION
            out.error_message = f"topic {resource.resource_name!r} does not exist"
            return
        for key in self._wanted(resource, list(TOPIC_KEYS)):
            broker_value = _text(ctx.config.values[key])
            below = DescribeConfigsSynonym(key, broker_value, _broker_source(ctx, key))
            if key in info.config:
                entry = DescribeConfigsResourceResult(key, info.config[key], False, DYNAMIC_TOPIC_CONFIG, False)
                if synonyms:
                    entry.synonyms = [DescribeConfigsSynonym(key, info.config[key], DYNAMIC_TOPIC_CONFIG), below]
            else:
                entry = DescribeConfigsResourceResult(key, broker_value, False, below.source, False)
                if synonyms:
                    entry.synonyms = [below]
            entry.config_type = _TYPES.get(DEFAULTS[key][0], 0)
            entry.documentation = None
            out.configs.append(entry)

    def _broker(self, ctx: KafkaContext, resource: DescribeConfigsResource, out: DescribeConfigsResult) -> None:
        for key in self._wanted(resource, [k for k in DEFAULTS if k not in HIDDEN]):
            entry = DescribeConfigsResourceResult(
                key, _text(ctx.config.values[key]), True, _broker_source(ctx, key), False
            )
            entry.config_type = _TYPES.get(DEFAULTS[key][0], 0)
            entry.documentation = None
            out.configs.append(entry)


def topic_config_entries(ctx: KafkaContext, overrides: dict[str, str]) -> list[tuple[str, str, int]]:
    """(key, value, Kafka config source) of every topic key for a topic with ``overrides``:
    what CreateTopics v5+ answers for a created topic (the Java AdminClient reads it)."""
    out = []
    for key in sorted(TOPIC_KEYS):
        if key in overrides:
            out.append((key, overrides[key], DYNAMIC_TOPIC_CONFIG))
        else:
            out.append((key, _text(ctx.config.values[key]), _broker_source(ctx, key)))
    return out
