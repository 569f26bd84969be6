"""DescribeClientQuotas and AlterClientQuotas of sluice.v1.Broker: Kafka's client quota administration.

Thin, as the ACL handlers: the caller is checked (AlterConfigs on the cluster to alter,
DescribeConfigs to describe, when the authorizer is on, as Kafka's KafkaApis checks), each entry
is validated, and quotas are written to or read from the metadata store
(:mod:`sluice.metadata.quota_store`), from which every broker follows them
(:mod:`sluice.broker.security.quota_watch`). What Kafka has and Sluice does not keep is refused by
name (INVALID_REQUEST): client-id and ip entities, ``request_percentage`` and other keys, and
entities of more than one component.
"""

from __future__ import annotations

import math

from sluice.acls import AclOperation
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.security.authorizer import Access
from sluice.broker.security.quota_watch import UserQuotas
from sluice.broker.servicers.registration import Ctx
from sluice.metadata import quota_store
from sluice.metadata.quota_store import DEFAULT_USER, QUOTA_KEYS
from sluice.metadata.store import MetadataStore

USER = "user"
_NOT_ALLOWED = "{what} client quotas needs {op} on the cluster"


class QuotaRequestError(ValueError):
    """An entity or a quota Sluice does not keep (answered INVALID_REQUEST with the message)."""


def user_of_entity(entity: list[bpb.QuotaEntityComponent]) -> str:
    """The user name of a one-component user entity (DEFAULT_USER for the default user)."""
    if len(entity) != 1 or entity[0].entity_type != USER:
        kinds = ", ".join(c.entity_type or "''" for c in entity) or "none"
        raise QuotaRequestError(
            f"quota entity of components [{kinds}]: Sluice keeps quotas of user entities only (entity_type 'user')"
        )
    c = entity[0]
    if c.HasField("entity_name"):
        if not c.entity_name or c.entity_name == DEFAULT_USER:
            raise QuotaRequestError(f"user name {c.entity_name!r} is not valid (no name: the default user)")
        return c.entity_name
    return DEFAULT_USER


def entity_of(user: str) -> list[bpb.QuotaEntityComponent]:
    if user == DEFAULT_USER:
        return [bpb.QuotaEntityComponent(entity_type=USER)]
    return [bpb.QuotaEntityComponent(entity_type=USER, entity_name=user)]


def changes_of(ops: list[bpb.QuotaOp]) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for op in ops:
        if op.key not in QUOTA_KEYS:
            raise QuotaRequestError(f"quota {op.key!r} is not supported: Sluice keeps {', '.join(QUOTA_KEYS)}")
        if op.key in out:
            raise QuotaRequestError(f"quota {op.key!r} is altered twice in one entry")
        if op.remove:
            out[op.key] = None
        elif not math.isfinite(op.value) or op.value <= 0:
            raise QuotaRequestError(f"{op.key} must be a positive number of bytes per second, not {op.value}")
        else:
            out[op.key] = float(op.value)
    return out


def _matches(user: str, components: list[bpb.QuotaFilterComponent], strict: bool) -> bool:
    """Whether user entity ``user`` passes a DescribeClientQuotas filter (Kafka's rules)."""
    for c in components:
        if c.entity_type != USER:
            return False  # it names a component this entity lacks
        match_type = c.match_type
        if match_type == bpb.QuotaFilterComponent.EXACT and user != c.match:
            return False
        if match_type == bpb.QuotaFilterComponent.DEFAULT and user != DEFAULT_USER:
            return False
        if match_type == bpb.QuotaFilterComponent.SPECIFIED and user == DEFAULT_USER:
            return False
    # strict: only entities of exactly the filter's components (every entity here has one, user)
    return not strict or len(components) == 1


class QuotaHandlers:
    def __init__(self, store: MetadataStore, access: Access, quotas: UserQuotas) -> None:
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
                error_message=_NOT_ALLOWED.format(what="describing", op="DescribeConfigs"),
            )
        for c in req.components:
            if c.entity_type not in (USER, "client-id", "ip"):
                return bpb.DescribeClientQuotasResponse(
                    error_code=pb.INVALID_REQUEST, error_message=f"unknown quota entity type {c.entity_type!r}"
                )
        resp = bpb.DescribeClientQuotasResponse()
        for user, values in sorted(quota_store.list_user_quotas(self.store).items()):
            if not _matches(user, list(req.components), req.strict):
                continue
            resp.entries.add(
                entity=entity_of(user),
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
                result.error_message = _NOT_ALLOWED.format(what="altering", op="AlterConfigs")
                continue
            try:
                user = user_of_entity(list(entry.entity))
                changes = changes_of(list(entry.ops))
            except QuotaRequestError as exc:
                result.error_code, result.error_message = pb.INVALID_REQUEST, str(exc)
                continue
            if not req.validate_only and changes:
                quota_store.alter_user_quotas(self.store, user, changes)
        self.quotas.refresh()  # this broker applies its own write at once
        return resp
