"""The authorization decision, Kafka's AclAuthorizer rules (not yet wired into the RPCs).

For ``principal`` from ``host`` wanting ``operation`` on a resource:

1. a super user (``super.users``) is allowed everything;
2. the ACLs whose pattern covers the resource are gathered (literal name, literal ``*``,
   prefixes of the name);
3. none at all: allowed only when ``allow.everyone.if.no.acl.found`` (off by default, as the
   issue asks: deny by default when the authorizer is on);
4. any matching DENY (same principal or ``User:*``, same host or ``*``, the operation or ALL)
   refuses, whatever allows: DENY wins;
5. else a matching ALLOW of the operation, of ALL, or of an operation that implies it (Read,
   Write, Delete, Alter imply Describe; AlterConfigs implies DescribeConfigs) allows;
6. else refused.

Pure: the ACLs are handed over (:meth:`Authorizer.set_acls`) by whoever watches the store.
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice.acls import IMPLIED_BY, WILDCARD, AclBinding, AclOperation, AclPermissionType, ResourceType


def _principal_matches(acl: AclBinding, principal: str) -> bool:
    if acl.principal == principal:
        return True
    kind, _, name = acl.principal.partition(":")
    return name == WILDCARD and principal.partition(":")[0] == kind


class Authorizer:
    def __init__(self, super_users: Iterable[str] = (), allow_everyone_if_no_acl_found: bool = False) -> None:
        self.super_users = frozenset(super_users)
        self.allow_everyone_if_no_acl_found = allow_everyone_if_no_acl_found
        self._by_type: dict[ResourceType, list[AclBinding]] = {}

    def set_acls(self, acls: Iterable[AclBinding]) -> None:
        by_type: dict[ResourceType, list[AclBinding]] = {}
        for acl in acls:
            by_type.setdefault(acl.resource_type, []).append(acl)
        self._by_type = by_type  # swapped whole: a concurrent check sees the old set or the new

    def authorize(
        self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str
    ) -> bool:
        if principal in self.super_users:
            return True
        covering = [a for a in self._by_type.get(resource_type, ()) if a.matches_resource(resource_type, name)]
        if not covering:
            return self.allow_everyone_if_no_acl_found
        mine = [a for a in covering if _principal_matches(a, principal) and a.host in (host, WILDCARD)]
        if any(
            a.permission_type == AclPermissionType.DENY and a.operation in (operation, AclOperation.ALL) for a in mine
        ):
            return False
        allowing = {operation, AclOperation.ALL} | IMPLIED_BY.get(operation, frozenset())
        return any(a.permission_type == AclPermissionType.ALLOW and a.operation in allowing for a in mine)
