"""CreateAcls, DescribeAcls, DeleteAcls of sluice.v1.Broker: Kafka's ACL administration.

Thin: the request is converted to :mod:`sluice.acls` values (a malformed ACL answers its
result INVALID_REQUEST with the reason), the caller is checked (Alter on the cluster to create
or delete, Describe to describe), and the ACLs are written to or read from the metadata store
(:mod:`sluice.metadata.acl_store`), from which every broker's authorizer follows them. With the
authorizer off there are no ACLs to manage: SECURITY_DISABLED, as Kafka answers.
"""

from __future__ import annotations

import asyncio

from sluice.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.security.authorizer import Access
from sluice.broker.servicers.registration import Ctx
from sluice.metadata import acl_store
from sluice.metadata.store import MetadataStore

_DISABLED = "the authorizer is off on this broker (authorizer.enabled=false): there are no ACLs"
_NOT_ALLOWED = "{what} ACLs needs {op} on the cluster"


def binding_of(acl: bpb.Acl) -> AclBinding:
    """ValueError (the reason) for an unknown code or an ACL Kafka would refuse."""
    return AclBinding(
        ResourceType(acl.resource_type),
        acl.name,
        ResourcePatternType(acl.pattern_type),
        acl.principal,
        acl.host or "*",
        AclOperation(acl.operation),
        AclPermissionType(acl.permission_type),
    )


def proto_of(b: AclBinding) -> bpb.Acl:
    return bpb.Acl(
        resource_type=b.resource_type, name=b.name, pattern_type=b.pattern_type, principal=b.principal,
        host=b.host, operation=b.operation, permission_type=b.permission_type,
    )  # fmt: skip


def filter_of(f: bpb.AclFilter) -> AclBindingFilter:
    return AclBindingFilter(
        ResourceType(f.resource_type or ResourceType.ANY),
        f.name if f.HasField("name") else None,
        ResourcePatternType(f.pattern_type or ResourcePatternType.ANY),
        f.principal if f.HasField("principal") else None,
        f.host if f.HasField("host") else None,
        AclOperation(f.operation or AclOperation.ANY),
        AclPermissionType(f.permission_type or AclPermissionType.ANY),
    )


class AclHandlers:
    def __init__(self, store: MetadataStore, access: Access) -> None:
        self.store = store
        self.access = access

    def _refusal(self, ctx: Ctx, op: AclOperation, what: str) -> tuple[pb.ErrorCode, str] | None:
        if not self.access.enabled:
            return pb.SECURITY_DISABLED, _DISABLED
        if not self.access.cluster(ctx, op):
            return pb.CLUSTER_AUTHORIZATION_FAILED, _NOT_ALLOWED.format(what=what, op=op.name)
        return None

    async def create_acls(self, req: bpb.CreateAclsRequest, ctx: Ctx) -> bpb.CreateAclsResponse:
        resp = bpb.CreateAclsResponse()
        refused = self._refusal(ctx, AclOperation.ALTER, "creating")
        for acl in req.creations:
            result = resp.results.add()
            if refused is not None:
                result.error_code, result.error_message = refused
                continue
            try:
                binding = binding_of(acl)
            except ValueError as exc:
                result.error_code, result.error_message = pb.INVALID_REQUEST, str(exc)
                continue
            await asyncio.to_thread(acl_store.create_acl, self.store, binding)  # a store write may block
        self.access.refresh()  # this broker applies its own write at once
        return resp

    async def describe_acls(self, req: bpb.DescribeAclsRequest, ctx: Ctx) -> bpb.DescribeAclsResponse:
        refused = self._refusal(ctx, AclOperation.DESCRIBE, "describing")
        if refused is not None:
            return bpb.DescribeAclsResponse(error_code=refused[0], error_message=refused[1])
        try:
            f = filter_of(req.filter)
        except ValueError as exc:
            return bpb.DescribeAclsResponse(error_code=pb.INVALID_REQUEST, error_message=str(exc))
        bindings = await asyncio.to_thread(acl_store.list_acls, self.store)
        return bpb.DescribeAclsResponse(acls=[proto_of(b) for b in bindings if f.matches(b)])

    async def delete_acls(self, req: bpb.DeleteAclsRequest, ctx: Ctx) -> bpb.DeleteAclsResponse:
        resp = bpb.DeleteAclsResponse()
        refused = self._refusal(ctx, AclOperation.ALTER, "deleting")
        filters: list[AclBindingFilter] = []
        results: list[bpb.DeleteAclsFilterResult] = []
        for f in req.filters:
            result = resp.results.add()
            if refused is not None:
                result.error_code, result.error_message = refused
                continue
            try:
                filters.append(filter_of(f))
                results.append(result)
            except ValueError as exc:
                result.error_code, result.error_message = pb.INVALID_REQUEST, str(exc)
        removed = await asyncio.to_thread(acl_store.delete_acls, self.store, filters)  # a store write may block
        for result, deleted in zip(results, removed, strict=True):
            result.deleted.extend(proto_of(b) for b in deleted)
        self.access.refresh()
        return resp
