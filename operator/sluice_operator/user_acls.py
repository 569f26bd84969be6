"""A SluiceUser's ACLs: its spec as Kafka ACL bindings, and the store documents it owns.

The operator writes a SluiceUser's ACLs into the same ``acls/<digest>`` documents that
``Admin.create_acls`` writes (:mod:`sluice.metadata.acl_store`), so every broker's authorizer
follows them with no change. Each document it writes carries, beside the binding, who owns it
(``owner``: ``<namespace>/<name>`` of the SluiceUser, ``owner_uid``: its uid); the brokers ignore
those fields. Owning exactly the documents it wrote is what lets the operator:

* apply a spec change as a diff: create what the spec added, delete what it dropped, leave the
  rest untouched (a broker never sees a moment without an ACL the spec kept);
* leave alone ACLs created by hand (no owner), even one identical to a spec entry: an identical
  ACL is one document (its key is the binding's digest), which then stays the hand-made one and
  is not deleted with the user;
* delete, when the user is deleted, its own documents and nothing else, and find documents whose
  user disappeared while the operator was not looking (:func:`orphaned`).

A document owned by an earlier resource of the same name (another uid) is taken over if the new
spec wants it and deleted otherwise. Everything here is synchronous and idempotent: the handlers
call it again on every timer tick, which also repairs ACLs deleted by hand.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType
from sluice.metadata import keys
from sluice.metadata.acl_store import acl_id
from sluice.metadata.store import Document, MetadataStore, VersionConflict

log = logging.getLogger("sluice.operator")

OWNER = "owner"
OWNER_UID = "owner_uid"
CLUSTER_NAME = "kafka-cluster"

RESOURCE_TYPES = {
    "topic": ResourceType.TOPIC,
    "group": ResourceType.GROUP,
    "transactionalId": ResourceType.TRANSACTIONAL_ID,
    "cluster": ResourceType.CLUSTER,
}
PATTERN_TYPES = {"literal": ResourcePatternType.LITERAL, "prefixed": ResourcePatternType.PREFIXED}
PERMISSIONS = {"allow": AclPermissionType.ALLOW, "deny": AclPermissionType.DENY}
OPERATIONS = {
    "All": AclOperation.ALL,
    "Read": AclOperation.READ,
    "Write": AclOperation.WRITE,
    "Create": AclOperation.CREATE,
    "Delete": AclOperation.DELETE,
    "Alter": AclOperation.ALTER,
    "Describe": AclOperation.DESCRIBE,
    "ClusterAction": AclOperation.CLUSTER_ACTION,
    "DescribeConfigs": AclOperation.DESCRIBE_CONFIGS,
    "AlterConfigs": AclOperation.ALTER_CONFIGS,
    "IdempotentWrite": AclOperation.IDEMPOTENT_WRITE,
}
# Kafka's operations per resource type (AclEntry.supportedOperations), ALL besides.
SUPPORTED = {
    ResourceType.TOPIC: {"Read", "Write", "Create", "Delete", "Alter", "Describe", "DescribeConfigs", "AlterConfigs"},
    ResourceType.GROUP: {"Read", "Delete", "Describe"},
    ResourceType.TRANSACTIONAL_ID: {"Write", "Describe"},
    ResourceType.CLUSTER: {
        "Create", "ClusterAction", "DescribeConfigs", "AlterConfigs", "IdempotentWrite", "Alter", "Describe",
    },
}  # fmt: skip
MAX_ACLS = 256 * 12  # the CRD's maxItems times an entry's operations


class InvalidUserSpec(ValueError):
    """The spec cannot be turned into ACLs (the message says which entry and why)."""


def principal_of(spec: Mapping[str, Any], namespace: str, name: str) -> str:
    """The principal a SluiceUser names: ``ServiceAccount:<ns>:<name>`` or ``User:<resource name>``."""
    auth = spec.get("authentication") or {}
    kind = auth.get("type")
    if kind == "serviceAccount":
        account = auth.get("serviceAccount") or {}
        if not account.get("name"):
            raise InvalidUserSpec("spec.authentication.serviceAccount.name is required with type serviceAccount")
        return f"ServiceAccount:{account.get('namespace') or namespace}:{account['name']}"
    if kind == "tls":
        return f"User:{name}"
    raise InvalidUserSpec(f"spec.authentication.type must be serviceAccount or tls, not {kind!r}")


def bindings_of(spec: Mapping[str, Any], principal: str) -> list[AclBinding]:
    """The ACL bindings ``spec.authorization.acls`` asks for ``principal`` (sorted, no duplicates)."""
    entries = (spec.get("authorization") or {}).get("acls") or []
    out: set[AclBinding] = set()
    for i, entry in enumerate(entries):
        where = f"spec.authorization.acls[{i}]"
        resource = entry.get("resource") or {}
        rtype = RESOURCE_TYPES.get(str(resource.get("type")))
        if rtype is None:
            raise InvalidUserSpec(f"{where}.resource.type must be one of {', '.join(RESOURCE_TYPES)}")
        pattern = PATTERN_TYPES.get(resource.get("patternType") or "literal")
        if pattern is None:
            raise InvalidUserSpec(f"{where}.resource.patternType must be literal or prefixed")
        name = resource.get("name") or (CLUSTER_NAME if rtype == ResourceType.CLUSTER else "")
        permission = PERMISSIONS.get(entry.get("permission") or "allow")
        if permission is None:
            raise InvalidUserSpec(f"{where}.permission must be allow or deny")
        operations = entry.get("operations") or []
        if not operations:
            raise InvalidUserSpec(f"{where}.operations must name at least one operation")
        for op in operations:
            if op not in OPERATIONS:
                raise InvalidUserSpec(f"{where}: unknown operation {op!r}")
            if op != "All" and op not in SUPPORTED[rtype]:
                known = ", ".join(sorted(SUPPORTED[rtype]))
                raise InvalidUserSpec(f"{where}: {rtype.name} has no operation {op} (Kafka's: All, {known})")
            host = entry.get("host") or "*"
            try:
                out.add(AclBinding(rtype, name, pattern, principal, host, OPERATIONS[op], permission))
            except ValueError as exc:  # the model's own rules: the cluster's name, a prefixed '*', ...
                raise InvalidUserSpec(f"{where}: {exc}") from None
    if len(out) > MAX_ACLS:
        raise InvalidUserSpec(f"{len(out)} ACLs: at most {MAX_ACLS}")
    return sorted(out, key=lambda b: (b.resource_type, b.name, b.pattern_type, b.operation, b.permission_type, b.host))


def owner_of(doc: Document) -> tuple[str, str] | None:
    """(owner, owner uid) of an ACL document, None for one made by hand."""
    value = doc.value or {}
    owner = value.get(OWNER)
    return (str(owner), str(value.get(OWNER_UID) or "")) if owner else None


@dataclass(frozen=True)
class Sync:
    """What one reconciliation did: ACLs created and deleted, and wanted ones that exist unowned."""

    created: int = 0
    deleted: int = 0
    shared: int = 0  # identical ACLs made by hand or by another user: in force, but not this user's


def _acl_documents(store: MetadataStore) -> list[Document]:
    return [d for d in store.list(keys.ACLS) if d.value is not None]


def sync_user(store: MetadataStore, owner: str, uid: str, wanted: Iterable[AclBinding]) -> Sync:
    """Make the documents ``owner`` owns exactly ``wanted`` (see the module docstring)."""
    docs = {d.key: d for d in _acl_documents(store)}
    want = {keys.acl(acl_id(b)): b for b in wanted}
    created = deleted = shared = 0
    for key, binding in want.items():
        doc = docs.get(key)
        value = {**binding.to_json(), OWNER: owner, OWNER_UID: uid}
        if doc is None:
            with contextlib.suppress(VersionConflict):  # written meanwhile: looked at again next time
                store.compare_and_set(key, value, None)
                created += 1
            continue
        found = owner_of(doc)
        if found is None or found[0] != owner:
            shared += 1
        elif found[1] != uid:  # an earlier resource of this name wrote it: this one owns it now
            with contextlib.suppress(VersionConflict):
                store.compare_and_set(key, value, doc.version)
    for key, doc in docs.items():
        found = owner_of(doc)
        if found is not None and found[0] == owner and key not in want:
            with contextlib.suppress(VersionConflict):  # deleted or changed meanwhile
                store.delete(key, doc.version)
                deleted += 1
    return Sync(created, deleted, shared)


def delete_user(store: MetadataStore, owner: str, uid: str | None = None) -> int:
    """Delete the documents ``owner`` owns (only those of resource ``uid`` when given); how many."""
    deleted = 0
    for doc in _acl_documents(store):
        found = owner_of(doc)
        if found is None or found[0] != owner or (uid is not None and found[1] not in (uid, "")):
            continue
        with contextlib.suppress(VersionConflict):
            store.delete(doc.key, doc.version)
            deleted += 1
    return deleted


def orphaned(docs: Iterable[Document], live: Mapping[str, str]) -> list[Document]:
    """The documents whose owner (``namespace/name``) is not among ``live`` (owner -> uid)."""
    out = []
    for doc in docs:
        found = owner_of(doc)
        if found is not None and found[0] not in live:
            out.append(doc)
    return out


def sweep(store: MetadataStore, list_owners: Callable[[], Mapping[str, str]]) -> int:
    """Delete documents of users that no longer exist; ``list_owners()`` -> {owner: uid} of live users.

    The documents are listed before the users, so a user created in between (whose documents the
    first list cannot hold) is never mistaken for a deleted one.
    """
    docs = _acl_documents(store)
    live = list_owners()
    deleted = 0
    for doc in orphaned(docs, live):
        with contextlib.suppress(VersionConflict):
            store.delete(doc.key, doc.version)
            deleted += 1
            log.info("deleted ACL %s of %s, a SluiceUser that no longer exists", doc.key, owner_of(doc))
    return deleted
