"""Client quotas in the MetadataStore: one ``quotas/users/<name>`` document per user entity.

Kafka keeps client quotas as configs of entities (``/config/users/<user>``, ``<default>`` for
the default user) and every broker applies them; here each user entity with at least one quota
is one document ``{"producer_byte_rate": n, "consumer_byte_rate": n}``, written through any
broker (AlterClientQuotas) and followed by every broker with its metadata watch
(sluice.broker.security.quota_watch). An entity whose last quota is removed loses its document.

Only the ``user`` entity type and the two byte rates are kept: client-id and ip entities and
``request_percentage`` (Kafka's) are refused by name where a request names them.
"""

from __future__ import annotations

from sluice.metadata import keys
from sluice.metadata.store import MetadataStore, VersionConflict

DEFAULT_USER = "<default>"
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate")


def user_of(key: str) -> str:
    return key[len(keys.USER_QUOTAS) :]


def alter_user_quotas(store: MetadataStore, user: str, changes: dict[str, float | None], attempts: int = 50) -> None:
    """Set (a number) or remove (None) quotas of ``user`` (``DEFAULT_USER``: the default entity).

    Compare-and-set, retried on a conflict; the document goes when its last quota does."""
    key = keys.user_quota(user)
    for _ in range(attempts):
        doc = store.get(key)
        old = dict(doc.value or {}) if doc is not None else {}
        new = {k: v for k, v in old.items() if k not in changes}
        new.update({k: v for k, v in changes.items() if v is not None})
        try:
            if new == old:
                return
            if not new:
                assert doc is not None
                store.delete(key, doc.version)
            else:
                store.compare_and_set(key, new, None if doc is None else doc.version)
            return
        except VersionConflict:
            continue
    raise VersionConflict(f"{key}: gave up after {attempts} conflicting updates")


def list_user_quotas(store: MetadataStore) -> dict[str, dict[str, float]]:
    """user (or DEFAULT_USER) -> its quotas."""
    out: dict[str, dict[str, float]] = {}
    for doc in store.list(keys.USER_QUOTAS):
        if doc.value:
            out[user_of(doc.key)] = {k: float(v) for k, v in doc.value.items() if k in QUOTA_KEYS}
    return out
