"""Kafka's ACL model: resource patterns, operations, permissions, bindings and filters.

The shape Kafka users know (``kafka-acls``, ``AdminClient.create_acls``), shared by the client
(Admin's ACL methods), the metadata store (where ACLs are kept) and the broker's authorizer: one
definition, in the lowest layer. Enum values are Kafka's wire codes, so a binding reads the same
in both systems.

A binding says: ``principal`` from ``host`` may (ALLOW) or may not (DENY) do ``operation`` on
the resources ``pattern`` names. A pattern is a resource type and a name, LITERAL (that name, or
``*`` for every resource of the type) or PREFIXED (every name starting with it). Filters (for
describe and delete) use ANY / MATCH / None as wildcards, as Kafka's AclBindingFilter does.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

WILDCARD = "*"  # a LITERAL name or principal or host meaning "every"


class ResourceType(IntEnum):
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class ResourcePatternType(IntEnum):
    ANY = 1  # filters only
    MATCH = 2  # filters only: the patterns that would apply to the named resource
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(IntEnum):
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


# Kafka's implied operations: an ALLOW of any of these also allows the key (Read, Write, Delete
# and Alter imply Describe; AlterConfigs implies DescribeConfigs). ALL implies everything.
IMPLIED_BY: Mapping[AclOperation, frozenset[AclOperation]] = {
    AclOperation.DESCRIBE: frozenset({AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS}),
}

_CONCRETE_OPERATIONS = set(AclOperation) - {AclOperation.ANY}


def parse_principal(principal: str) -> tuple[str, str]:
    """``"User:alice"`` -> ("User", "alice"); ValueError unless TYPE:NAME (or the wildcard ``User:*``)."""
    kind, sep, name = principal.partition(":")
    if not sep or not kind or not name:
        raise ValueError(f"a principal is TYPE:NAME (User:alice, ServiceAccount:ns:name), not {principal!r}")
    return kind, name


@dataclass(frozen=True)
class AclBinding:
    """One ACL: (resource pattern) x (principal, host, operation, permission)."""

    resource_type: ResourceType
    name: str
    pattern_type: ResourcePatternType
    principal: str
    host: str
    operation: AclOperation
    permission_type: AclPermissionType

    def __post_init__(self) -> None:
        if self.resource_type == ResourceType.ANY:
            raise ValueError("an ACL names a resource type (TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID), not ANY")
        if self.pattern_type not in (ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED):
            raise ValueError(f"an ACL's pattern type is LITERAL or PREFIXED, not {self.pattern_type.name}")
        if self.operation == AclOperation.ANY:
            raise ValueError("an ACL names an operation (READ, WRITE, ... or ALL), not ANY")
        if self.permission_type == AclPermissionType.ANY:
            raise ValueError("an ACL is ALLOW or DENY, not ANY")
        if not self.name:
            raise ValueError("an ACL's resource name must not be empty ('*' means every resource)")
        if self.resource_type == ResourceType.CLUSTER and self.name != "kafka-cluster":
            raise ValueError("the CLUSTER resource is named 'kafka-cluster' (Kafka's name)")
        if self.pattern_type == ResourcePatternType.PREFIXED and self.name == WILDCARD:
            raise ValueError("'*' is a LITERAL name (every resource); a PREFIXED '*' would match names starting '*'")
        parse_principal(self.principal)
        if not self.host:
            raise ValueError("an ACL's host must not be empty ('*' means every host)")

    def matches_resource(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this ACL's pattern covers the resource ``resource_type`` ``name``."""
        if self.resource_type != resource_type:
            return False
        if self.pattern_type == ResourcePatternType.LITERAL:
            return self.name in (name, WILDCARD)
        return name.startswith(self.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "resource_type": self.resource_type.name,
            "name": self.name,
            "pattern_type": self.pattern_type.name,
            "principal": self.principal,
            "host": self.host,
            "operation": self.operation.name,
            "permission_type": self.permission_type.name,
        }

    @classmethod
    def from_json(cls, value: Mapping[str, Any]) -> AclBinding:
        return cls(
            ResourceType[str(value["resource_type"])],
            str(value["name"]),
            ResourcePatternType[str(value["pattern_type"])],
            str(value["principal"]),
            str(value.get("host", WILDCARD)),
            AclOperation[str(value["operation"])],
            AclPermissionType[str(value["permission_type"])],
        )


@dataclass(frozen=True)
class AclBindingFilter:
    """Which bindings a describe or delete applies to; None, ANY and MATCH are wildcards (Kafka's)."""

    resource_type: ResourceType = ResourceType.ANY
    name: str | None = None
    pattern_type: ResourcePatternType = ResourcePatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission_type: AclPermissionType = AclPermissionType.ANY

    def matches(self, b: AclBinding) -> bool:
        if self.resource_type not in (ResourceType.ANY, b.resource_type):
            return False
        if self.pattern_type == ResourcePatternType.MATCH:
            # every pattern that applies to the named resource (the literal name, '*', prefixes of it)
            if self.name is not None and not b.matches_resource(b.resource_type, self.name):
                return False
        else:
            if self.pattern_type not in (ResourcePatternType.ANY, b.pattern_type):
                return False
            if self.name is not None and self.name != b.name:
                return False
        if self.principal is not None and self.principal != b.principal:
            return False
        if self.host is not None and self.host != b.host:
            return False
        if self.operation not in (AclOperation.ANY, b.operation):
            return False
        return self.permission_type in (AclPermissionType.ANY, b.permission_type)


def transactional_id_principals(
    allowed_users: Iterable[str] = (), allowed_service_accounts: Iterable[str] = ()
) -> list[str]:
    """The principals a TransactionalId resource allows (``allowedUsers``, ``allowedServiceAccounts``).

    ``alice`` (or ``User:alice``) is ``User:alice``, the CN of a client certificate; ``ns/name`` is
    ``ServiceAccount:ns:name``, the principal a ServiceAccount token authenticates as. Sorted and
    without duplicates, so the document the operator writes changes only when the set does.
    """
    out: set[str] = set()
    for user in allowed_users:
        user = str(user).strip()
        if user:
            out.add(user if user.startswith("User:") else f"User:{user}")
    for account in allowed_service_accounts:
        namespace, sep, name = str(account).strip().partition("/")
        if not sep or not namespace or not name:
            raise ValueError(f"allowedServiceAccounts entry {account!r} is not namespace/name")
        out.add(f"ServiceAccount:{namespace}:{name}")
    return sorted(out)
