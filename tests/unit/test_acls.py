"""Kafka's ACL rules: patterns, DENY wins, implied operations, super users, deny by default."""

from __future__ import annotations

import pytest

from sluice.acls import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    ResourcePatternType,
    ResourceType,
)
from sluice.broker.security.authorizer import Authorizer

T, G, TX = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.TRANSACTIONAL_ID
LIT, PRE = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
ALLOW, DENY = AclPermissionType.ALLOW, AclPermissionType.DENY
Op = AclOperation


def acl(
    rtype: ResourceType, name: str, op: AclOperation, principal: str = "User:alice",
    permission: AclPermissionType = ALLOW, pattern: ResourcePatternType = LIT, host: str = "*",
) -> AclBinding:  # fmt: skip
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def authorizer(*acls: AclBinding, **kwargs: object) -> Authorizer:
    a = Authorizer(**kwargs)  # type: ignore[arg-type]
    a.set_acls(acls)
    return a


def test_deny_by_default_and_allow_everyone_if_no_acl_found() -> None:
    assert not authorizer().authorize("User:alice", "h", Op.READ, T, "orders")
    assert authorizer(allow_everyone_if_no_acl_found=True).authorize("User:alice", "h", Op.READ, T, "orders")
    # an ACL on the resource makes the default irrelevant: bob has none of them
    a = authorizer(acl(T, "orders", Op.READ), allow_everyone_if_no_acl_found=True)
    assert not a.authorize("User:bob", "h", Op.READ, T, "orders")


def test_literal_wildcard_and_prefixed_patterns() -> None:
    a = authorizer(acl(T, "orders", Op.WRITE), acl(T, "*", Op.READ), acl(G, "team-a.", Op.READ, pattern=PRE))
    assert a.authorize("User:alice", "h", Op.WRITE, T, "orders")
    assert not a.authorize("User:alice", "h", Op.WRITE, T, "orders2")
    assert a.authorize("User:alice", "h", Op.READ, T, "anything")
    assert a.authorize("User:alice", "h", Op.READ, G, "team-a.billing")
    assert not a.authorize("User:alice", "h", Op.READ, G, "team-b.billing")


def test_deny_wins_and_implied_operations() -> None:
    a = authorizer(
        acl(T, "orders", Op.ALL), acl(T, "orders", Op.DELETE, permission=DENY),
        acl(TX, "copier", Op.WRITE), acl(T, "audit", Op.ALTER_CONFIGS),
    )  # fmt: skip
    assert a.authorize("User:alice", "h", Op.WRITE, T, "orders")
    assert not a.authorize("User:alice", "h", Op.DELETE, T, "orders")
    assert a.authorize("User:alice", "h", Op.DESCRIBE, TX, "copier")  # Write implies Describe
    assert not a.authorize("User:alice", "h", Op.READ, TX, "copier")
    assert a.authorize("User:alice", "h", Op.DESCRIBE_CONFIGS, T, "audit")  # AlterConfigs implies it
    # a DENY of an implying operation does not deny the implied one (Kafka: only the op or ALL)
    b = authorizer(acl(T, "x", Op.DESCRIBE), acl(T, "x", Op.READ, permission=DENY))
    assert b.authorize("User:alice", "h", Op.DESCRIBE, T, "x")


def test_principal_and_host_wildcards_and_super_users() -> None:
    a = authorizer(
        acl(T, "orders", Op.READ, principal="User:*"),
        acl(T, "orders", Op.READ, principal="User:mallory", permission=DENY),
        acl(T, "pay", Op.WRITE, host="10.0.0.1"),
        super_users=["User:admin"],
    )
    assert a.authorize("User:bob", "h", Op.READ, T, "orders")
    assert not a.authorize("User:mallory", "h", Op.READ, T, "orders")
    assert not a.authorize("ServiceAccount:ns:app", "h", Op.READ, T, "orders")  # User:* is users only
    assert a.authorize("User:alice", "10.0.0.1", Op.WRITE, T, "pay")
    assert not a.authorize("User:alice", "10.0.0.2", Op.WRITE, T, "pay")
    assert a.authorize("User:admin", "h", Op.DELETE, T, "anything")


def test_bindings_refuse_what_kafka_refuses_and_round_trip() -> None:
    with pytest.raises(ValueError, match="not ANY"):
        acl(ResourceType.ANY, "x", Op.READ)
    with pytest.raises(ValueError, match="TYPE:NAME"):
        acl(T, "x", Op.READ, principal="alice")
    with pytest.raises(ValueError, match="kafka-cluster"):
        acl(ResourceType.CLUSTER, "mine", Op.ALTER)
    with pytest.raises(ValueError, match="LITERAL or PREFIXED"):
        acl(T, "x", Op.READ, pattern=ResourcePatternType.MATCH)
    b = acl(G, "team-a.", Op.READ, pattern=PRE, permission=DENY, host="10.0.0.1")
    assert AclBinding.from_json(b.to_json()) == b


def test_filters() -> None:
    lit, pre = acl(T, "orders", Op.READ), acl(T, "ord", Op.WRITE, pattern=PRE, principal="User:bob")
    assert AclBindingFilter().matches(lit) and AclBindingFilter().matches(pre)
    bob = AclBindingFilter(principal="User:bob")
    assert bob.matches(pre) and not bob.matches(lit)
    match = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.MATCH)
    assert match.matches(lit) and match.matches(pre)
    assert not AclBindingFilter(ResourceType.TOPIC, "ord", ResourcePatternType.LITERAL).matches(pre)
    assert AclBindingFilter(operation=Op.WRITE, permission_type=ALLOW).matches(pre)
