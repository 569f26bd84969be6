"""DescribeClientQuotas and AlterClientQuotas of sluice.v1.Broker: Kafka's client quota administration.

Thin, as the ACL handlers: the caller is checked (AlterConfigs on the cluster to alter,
DescribeConfigs to describe, when the authorizer is on, as Kafka's KafkaApis checks), each entry
is validated by :mod:`sluice.broker.security.quota_admin` (what Kafka has and Sluice does not
keep is refused by name, INVALID_REQUEST), and quotas are written to or read from the metadata
store (:mod:`sluice.metadata.quota_store`), from which every broker follows them
(:mod:`sluice.broker.security.quota_watch`).
"""

from __future__ import annotations

import asyncio

from sluice.acls import AclOperation
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.security import quota_admin
from sluice.broker.security.authorizer import Access
from sluice.broker.security.quota_admin import QuotaRequestError
from sluice.broker.security.quota_watch import ClientQuotas
from sluice.broker.servicers.registration import Ctx
from sluice.metadata import quota_store
from sluice.metadata.quota_store import QuotaEntity
from sluice.metadata.store import MetadataStore

NOT_ALLOWED = "{what} client quotas needs {op} on the cluster"


def _entity_proto(entity: QuotaEntity) -> list[bpb.QuotaEntityComponent]:
    out = []
    for entity_type, name in quota_admin.components_of(entity):
        c = bpb.QuotaEntityComponent(entity_type=entity_type)
        if name is not None:
            c.entity_name = name
        out.append(c)
    return out


class QuotaHandlers:
    def __init__(self, store: MetadataStore, access: Access, quotas: ClientQuotas) -> None:
        self.store = store
        self.access = access
        self.quotas = quotas

    def _refused(self, ctx: Ctx, op: AclOperation) -> bool:
        return self.access.enabled and not self.access.cluster(ctx, op)

    async def describe_client_quotas(
        self, req: bpb.DescribeClientQuotasRequest, ctx: Ctx
    ) -> bpb.DescribeClientQuotasResponse:
        if self._refused(ctx, AclOperation.DESCRIBE_CONFIGS):
            return bpb.DescribeClientQuotasResponse(
                error_code=pb.CLUSTER_AUTHORIZATION_FAILED,
                error_message=NOT_ALLOWED.format(what="describing", op="DescribeConfigs"),
            )
        components = [(c.entity_type, int(c.match_type), c.match or None) for c in req.components]
        try:
            stored = await asyncio.to_thread(quota_store.list_quotas, self.store)  # a store read may block
            found = quota_admin.describe(stored, components, req.strict)
        except QuotaRequestError as exc:
            return bpb.DescribeClientQuotasResponse(error_code=pb.INVALID_REQUEST, error_message=str(exc))
        resp = bpb.DescribeClientQuotasResponse()
        for entity, values in found:
            resp.entries.add(
                entity=_entity_proto(entity),
                values=[bpb.QuotaValue(key=k, value=v) for k, v in sorted(values.items())],
            )
        return resp

    async def alter_client_quotas(self, req: bpb.AlterClientQuotasRequest, ctx: Ctx) -> bpb.AlterClientQuotasResponse:
        resp = bpb.AlterClientQuotasResponse()
        refused = self._refused(ctx, AclOperation.ALTER_CONFIGS)
        for entry in req.entries:
            result = resp.results.add(entity=entry.entity)
            if refused:
                result.error_code = pb.CLUSTER_AUTHORIZATION_FAILED
                result.error_message = NOT_ALLOWED.format(what="altering", op="AlterConfigs")
                continue
            try:
                entity = quota_admin.entity_from(
                    [(c.entity_type, c.entity_name if c.HasField("entity_name") else None) for c in entry.entity]
                )
                changes = quota_admin.changes_from([(op.key, op.value, op.remove) for op in entry.ops])
            except QuotaRequestError as exc:
                result.error_code, result.error_message = pb.INVALID_REQUEST, str(exc)
                continue
            if not req.validate_only and changes:
                await asyncio.to_thread(quota_store.alter_quotas, self.store, entity, changes)
        self.quotas.refresh()  # this broker applies its own write at once
        return resp
