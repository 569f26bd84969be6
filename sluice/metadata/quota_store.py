"""Client quotas in the MetadataStore: one document per quota entity.

Kafka keeps client quotas as configs of entities and every broker applies them; here each
entity with at least one quota is one document ``{"producer_byte_rate": n, "consumer_byte_rate": n}``,
written through any broker (AlterClientQuotas) and followed by every broker with its metadata
watch (sluice.broker.security.quota_watch). An entity whose last quota is removed loses its
document. The keys follow Kafka's ZooKeeper paths (KIP-55):

``quotas/users/<user>``                    a user, ``<default>`` for the default user
``quotas/users/<user>/clients/<client>``   a user's client id (either may be ``<default>``)
``quotas/clients/<client>``                a client id, ``<default>`` for the default client id

Names are escaped as Kafka sanitizes them, minimally: ``%`` and ``/`` only (a user named
``a/clients/b`` must not read as a user and a client id), so the user documents written before
client-id entities existed keep their keys.

Kept: ``user`` and ``client-id`` entities and their combination, and the two byte rates. ``ip``
entities and ``request_percentage`` (Kafka's) are refused by name where a request names them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.metadata import keys
from sluice.metadata.store import MetadataStore, VersionConflict

DEFAULT = "<default>"
DEFAULT_USER = DEFAULT  # the name of the default entity of any type
QUOTA_KEYS = ("producer_byte_rate", "consumer_byte_rate")
_USERS, _CLIENTS = "users", "clients"


@dataclass(frozen=True, slots=True)
class QuotaEntity:
    """A quota entity: a user and/or a client id (None: the entity lacks that component;
    ``DEFAULT``: the default entity of that type)."""

    user: str | None = None
    client_id: str | None = None

    def __post_init__(self) -> None:
        if self.user is None and self.client_id is None:
            raise ValueError("a quota entity has a user, a client id, or both")

    def describe(self) -> str:
        """Kafka's path of the entity, as kafka-configs.sh names it in messages."""
        parts = []
        if self.user is not None:
            parts.append(f"users/{self.user}")
        if self.client_id is not None:
            parts.append(f"clients/{self.client_id}")
        return "/".join(parts)


def _escape(name: str) -> str:
    return name.replace("%", "%25").replace("/", "%2F")


def _unescape(name: str) -> str:
    return name.replace("%2F", "/").replace("%2f", "/").replace("%25", "%")


def key_of(entity: QuotaEntity) -> str:
    """The document key of ``entity``."""
    parts = []
    if entity.user is not None:
        parts += [_USERS, _escape(entity.user)]
    if entity.client_id is not None:
        parts += [_CLIENTS, _escape(entity.client_id)]
    return keys.QUOTAS + "/".join(parts)


def entity_of(key: str) -> QuotaEntity | None:
    """The entity of a document key (None: not a quota entity key)."""
    parts = key[len(keys.QUOTAS) :].split("/")
    if len(parts) == 2 and parts[0] == _USERS:
        return QuotaEntity(user=_unescape(parts[1]))
    if len(parts) == 2 and parts[0] == _CLIENTS:
        return QuotaEntity(client_id=_unescape(parts[1]))
    if len(parts) == 4 and parts[0] == _USERS and parts[2] == _CLIENTS:
        return QuotaEntity(user=_unescape(parts[1]), client_id=_unescape(parts[3]))
    return None


def alter_quotas(
    store: MetadataStore, entity: QuotaEntity, changes: dict[str, float | None], attempts: int = 50
) -> None:
    """Set (a number) or remove (None) quotas of ``entity``.

    Compare-and-set, retried on a conflict; the document goes when its last quota does."""
    key = key_of(entity)
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


def list_quotas(store: MetadataStore) -> dict[QuotaEntity, dict[str, float]]:
    """Every entity with quotas -> its quotas."""
    out: dict[QuotaEntity, dict[str, float]] = {}
    for doc in store.list(keys.QUOTAS):
        entity = entity_of(doc.key)
        if entity is not None and doc.value:
            out[entity] = {k: float(v) for k, v in doc.value.items() if k in QUOTA_KEYS}
    return out
