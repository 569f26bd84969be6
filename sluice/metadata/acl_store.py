"""ACLs in the MetadataStore: one ``acls/<digest>`` document per ACL.

The digest of the ACL's canonical JSON is its key, so creating an ACL that exists is a no-op
(Kafka's CreateAcls is idempotent too) and two brokers creating the same ACL at once write the
same document. Every broker watches the ``acls/`` prefix (sluice.broker.security.authorizer),
so an ACL written through any broker applies on all of them within one metadata poll.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable

from sluice.acls import AclBinding, AclBindingFilter
from sluice.metadata import keys
from sluice.metadata.store import MetadataStore, VersionConflict


def acl_id(binding: AclBinding) -> str:
    canonical = json.dumps(binding.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def create_acl(store: MetadataStore, binding: AclBinding) -> None:
    key = keys.acl(acl_id(binding))
    if store.get(key) is not None:
        return
    with contextlib.suppress(VersionConflict):  # created meanwhile by another broker: the same ACL
        store.compare_and_set(key, binding.to_json(), None)


def list_acls(store: MetadataStore) -> list[AclBinding]:
    return [AclBinding.from_json(doc.value) for doc in store.list(keys.ACLS) if doc.value is not None]


def delete_acls(store: MetadataStore, filters: Iterable[AclBindingFilter]) -> list[list[AclBinding]]:
    """Delete every ACL each filter matches; per filter, the ACLs it deleted."""
    out: list[list[AclBinding]] = []
    for f in filters:
        deleted: list[AclBinding] = []
        for doc in store.list(keys.ACLS):
            if doc.value is None:
                continue
            binding = AclBinding.from_json(doc.value)
            if f.matches(binding):
                try:
                    store.delete(doc.key, doc.version)
                except VersionConflict:
                    continue  # deleted by another filter or broker meanwhile
                deleted.append(binding)
        out.append(deleted)
    return out
