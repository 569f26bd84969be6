"""DescribeClientQuotas (48) and AlterClientQuotas (49): kafka-configs.sh's client quotas.

Thin over :mod:`sluice.broker.security.quota_admin`, the logic the gRPC servicer uses too, and
the same metadata store documents (:mod:`sluice.metadata.quota_store`): a quota altered here
applies to gRPC and Kafka clients alike, on every broker. Authorization is Kafka's: describing
needs DescribeConfigs on the cluster, altering AlterConfigs (CLUSTER_AUTHORIZATION_FAILED, for
the whole request or for each entry). What Sluice does not keep (ip entities,
``request_percentage``, unknown keys and entity types, values that are not positive whole
numbers) is INVALID_REQUEST with a message naming it.
"""

from __future__ import annotations

import asyncio

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.alter_client_quotas_request import AlterClientQuotasRequest
from sluice.broker.kafka_wire.messages.alter_client_quotas_response import AlterClientQuotasResponse
from sluice.broker.kafka_wire.messages.alter_client_quotas_response import EntityData as AlterEntity
from sluice.broker.kafka_wire.messages.alter_client_quotas_response import EntryData as AlterResult
from sluice.broker.kafka_wire.messages.describe_client_quotas_request import DescribeClientQuotasRequest
from sluice.broker.kafka_wire.messages.describe_client_quotas_response import (
    DescribeClientQuotasResponse,
    EntityData,
    EntryData,
    ValueData,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.security import quota_admin
from sluice.broker.security.quota_admin import QuotaRequestError
from sluice.metadata import quota_store

NOT_ALLOWED = "{what} client quotas needs {op} on the cluster"


def _refused(ctx: KafkaContext, op: AclOperation) -> bool:
    return ctx.access.enabled and not authorization.cluster_allowed(ctx, op)


class DescribeClientQuotasHandler:
    api_key = 48
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeClientQuotasRequest)
        if _refused(ctx, AclOperation.DESCRIBE_CONFIGS):
            message = NOT_ALLOWED.format(what="describing", op="DescribeConfigs")
            return DescribeClientQuotasResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED, error_message=message, entries=None
            )
        components = [(c.entity_type, c.match_type, c.match) for c in request.components]
        try:
            stored = await asyncio.to_thread(quota_store.list_quotas, ctx.cluster.store)  # a store read may block
            found = quota_admin.describe(stored, components, request.strict)
        except QuotaRequestError as exc:
            return DescribeClientQuotasResponse(error_code=pb.INVALID_REQUEST, error_message=str(exc), entries=None)
        entries = [
            EntryData(
                entity=[EntityData(entity_type=t, entity_name=n) for t, n in quota_admin.components_of(entity)],
                values=[ValueData(key=k, value=v) for k, v in sorted(values.items())],
            )
            for entity, values in found
        ]
        return DescribeClientQuotasResponse(error_message=None, entries=entries)


class AlterClientQuotasHandler:
    api_key = 49
    versions = Versions(0, 1)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, AlterClientQuotasRequest)
        refused = _refused(ctx, AclOperation.ALTER_CONFIGS)
        resp = AlterClientQuotasResponse()
        for entry in request.entries:
            result = AlterResult(
                error_message=None,
                entity=[AlterEntity(entity_type=e.entity_type, entity_name=e.entity_name) for e in entry.entity],
            )
            resp.entries.append(result)
            if refused:
                result.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
                result.error_message = NOT_ALLOWED.format(what="altering", op="AlterConfigs")
                continue
            try:
                entity = quota_admin.entity_from([(e.entity_type, e.entity_name) for e in entry.entity])
                changes = quota_admin.changes_from([(op.key, op.value, op.remove) for op in entry.ops])
            except QuotaRequestError as exc:
                result.error_code, result.error_message = pb.INVALID_REQUEST, str(exc)
                continue
            if not request.validate_only and changes:
                await asyncio.to_thread(quota_store.alter_quotas, ctx.cluster.store, entity, changes)
        ctx.gate.client_quotas.refresh()  # this broker applies its own write at once
        return resp
