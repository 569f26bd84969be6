"""A SluiceUser's spec -> ACL bindings, and the diff the operator applies to the ACL store.

The store is the real SQLite MetadataStore the brokers use locally; the ACLs are read back the way
a broker's authorizer reads them (``acl_store.list_acls``), and hand-made ACLs are written the
way ``Admin.create_acls`` writes them (``acl_store.create_acl``).
"""

from __future__ import annotations

from typing import Any

import pytest

from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.metadata import acl_store
from sluice.metadata.store import MetadataStore
from sluice.operator import user_acls
from sluice.operator.user_acls import InvalidUserSpec, bindings_of, principal_of

SA = {"type": "serviceAccount", "serviceAccount": {"name": "copier", "namespace": "apps"}}


def spec(*acls: dict[str, Any], authentication: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"authentication": authentication or SA, "authorization": {"acls": list(acls)}}


def acl(rtype: str, name: str | None, *ops: str, **extra: Any) -> dict[str, Any]:
    resource: dict[str, Any] = {"type": rtype}
    if name is not None:
        resource["name"] = name
    if "patternType" in extra:
        resource["patternType"] = extra.pop("patternType")
    return {"resource": resource, "operations": list(ops), **extra}


def test_principals_of_both_kinds_of_authentication() -> None:
    assert principal_of(spec(), "sluice", "copier-user") == "ServiceAccount:apps:copier"
    same_ns = {"type": "serviceAccount", "serviceAccount": {"name": "app"}}
    assert principal_of(spec(authentication=same_ns), "sluice", "u") == "ServiceAccount:sluice:app"
    assert principal_of(spec(authentication={"type": "tls"}), "sluice", "alice") == "User:alice"
    with pytest.raises(InvalidUserSpec, match=r"serviceAccount\.name"):
        principal_of(spec(authentication={"type": "serviceAccount"}), "sluice", "u")
    with pytest.raises(InvalidUserSpec, match="serviceAccount or tls"):
        principal_of(spec(authentication={"type": "scram"}), "sluice", "u")


def test_an_entry_becomes_one_binding_per_operation_with_kafkas_defaults() -> None:
    p = "ServiceAccount:apps:copier"
    got = bindings_of(
        spec(
            acl("topic", "orders", "Read", "Describe"),
            acl("topic", "out-", "Write", patternType="prefixed", host="10.0.0.1"),
            acl("group", "*", "Read", permission="deny"),
            acl("cluster", None, "IdempotentWrite"),
            acl("topic", "orders", "Read"),  # a duplicate: one binding
        ),
        p,
    )
    lit, pre = ResourcePatternType.LITERAL, ResourcePatternType.PREFIXED
    allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
    assert set(got) == {
        AclBinding(ResourceType.TOPIC, "orders", lit, p, "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, "orders", lit, p, "*", AclOperation.DESCRIBE, allow),
        AclBinding(ResourceType.TOPIC, "out-", pre, p, "10.0.0.1", AclOperation.WRITE, allow),
        AclBinding(ResourceType.GROUP, "*", lit, p, "*", AclOperation.READ, deny),
        AclBinding(ResourceType.CLUSTER, "kafka-cluster", lit, p, "*", AclOperation.IDEMPOTENT_WRITE, allow),
    }
    assert len(got) == 5
    assert bindings_of({"authentication": SA}, p) == []  # no authorization: no ACLs (deny by default)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (acl("group", "g", "Write"), "GROUP has no operation Write"),
        (acl("transactionalId", "t", "Read"), "TRANSACTIONAL_ID has no operation Read"),
        (acl("topic", "*", "Read", patternType="prefixed"), "PREFIXED"),
        (acl("cluster", "other", "Create"), "kafka-cluster"),
        (acl("topic", "t"), "at least one operation"),
        (acl("topic", "t", "Fly"), "unknown operation 'Fly'"),
        (acl("queue", "t", "Read"), "resource.type must be one of"),
        (acl("topic", "t", "Read", permission="maybe"), "allow or deny"),
    ],
)
def test_what_kafka_would_refuse_is_an_invalid_spec_naming_the_entry(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidUserSpec, match=r"spec\.authorization\.acls\[1\]") as info:
        bindings_of(spec(acl("topic", "ok", "Read"), entry), "User:alice")
    assert message in str(info.value)


def test_sync_creates_diffs_and_deletes_only_what_the_user_owns(store: MetadataStore) -> None:
    p = "ServiceAccount:apps:copier"
    first = bindings_of(spec(acl("topic", "orders", "Read", "Write")), p)
    done = user_acls.sync_user(store, "sluice/copier", "uid-1", first)
    assert (done.created, done.deleted, done.shared) == (2, 0, 0)
    assert set(acl_store.list_acls(store)) == set(first)  # what every broker's authorizer reads

    # A hand-made ACL for the same principal, and one identical to what the next spec asks.
    by_hand = AclBinding(
        ResourceType.GROUP, "g", ResourcePatternType.LITERAL, p, "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    identical = AclBinding(
        ResourceType.TOPIC, "audit", ResourcePatternType.LITERAL, p, "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    acl_store.create_acl(store, by_hand)
    acl_store.create_acl(store, identical)

    second = bindings_of(spec(acl("topic", "orders", "Read"), acl("topic", "audit", "Read")), p)
    before = {d.key: d.version for d in store.list("acls/") if d.value is not None}
    done = user_acls.sync_user(store, "sluice/copier", "uid-1", second)
    assert (done.created, done.deleted, done.shared) == (0, 1, 1)  # Write dropped; audit is the hand-made one
    assert set(acl_store.list_acls(store)) == set(second) | {by_hand}
    kept = next(b for b in first if b.operation == AclOperation.READ)
    key = f"acls/{acl_store.acl_id(kept)}"
    assert store.get(key) is not None and store.get(key).version == before[key]  # untouched, not rewritten

    # Again with nothing changed: nothing is written.
    revision = max(d.revision for d in store.list("acls/"))
    assert user_acls.sync_user(store, "sluice/copier", "uid-1", second) == user_acls.Sync(0, 0, 1)
    assert max(d.revision for d in store.list("acls/")) == revision

    # The user is deleted: its own ACL goes, the hand-made ones (the identical one too) stay.
    assert user_acls.delete_user(store, "sluice/copier", "uid-1") == 1
    assert set(acl_store.list_acls(store)) == {by_hand, identical}


def test_another_user_and_an_older_resource_of_the_same_name(store: MetadataStore) -> None:
    alice = bindings_of(spec(acl("topic", "t", "Read"), authentication={"type": "tls"}), "User:alice")
    bob = bindings_of(spec(acl("topic", "t", "Read"), authentication={"type": "tls"}), "User:bob")
    user_acls.sync_user(store, "sluice/alice", "uid-a", alice)
    user_acls.sync_user(store, "sluice/bob", "uid-b", bob)
    assert user_acls.sync_user(store, "sluice/alice", "uid-a", []) == user_acls.Sync(0, 1, 0)
    assert set(acl_store.list_acls(store)) == set(bob)  # bob's are not alice's to delete

    # bob is deleted and created again (a new uid) before the operator saw the deletion: the new
    # resource takes over the document it wants; deleting the old uid's documents leaves it.
    assert user_acls.sync_user(store, "sluice/bob", "uid-b2", bob) == user_acls.Sync(0, 0, 0)
    assert user_acls.delete_user(store, "sluice/bob", "uid-b") == 0
    assert set(acl_store.list_acls(store)) == set(bob)


def test_sweep_deletes_the_acls_of_users_that_no_longer_exist(store: MetadataStore) -> None:
    carol = bindings_of(spec(acl("topic", "c", "Read")), "ServiceAccount:apps:carol")
    dave = bindings_of(spec(acl("topic", "d", "Read")), "ServiceAccount:apps:dave")
    user_acls.sync_user(store, "sluice/carol", "uid-c", carol)
    user_acls.sync_user(store, "sluice/dave", "uid-d", dave)
    by_hand = AclBinding(
        ResourceType.TOPIC, "h", ResourcePatternType.LITERAL, "User:h", "*", AclOperation.READ, AclPermissionType.ALLOW
    )
    acl_store.create_acl(store, by_hand)
    assert user_acls.sweep(store, lambda: {"sluice/dave": "uid-d"}) == 1
    assert set(acl_store.list_acls(store)) == set(dave) | {by_hand}
