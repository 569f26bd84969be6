"""Client quota entities, followed from the metadata store (Kafka's client quotas).

:class:`ClientQuotas` keeps the ``quotas/...`` documents (sluice.metadata.quota_store: user,
client-id and user+client-id entities) as they change, with the broker's metadata watch, the
way the ACLs are followed: a quota altered through any broker applies on every broker within
one metadata poll. :meth:`ClientQuotas.rates` gives the byte-rate quota of the data path
(sluice.broker.security.limits.ByteRateQuota) its lookup for one quota key, resolved in Kafka's
order by :mod:`sluice.broker.security.quota_resolution`; with no entity setting the key, the
broker's ``quota.*.default`` setting applies.
"""

from __future__ import annotations

from sluice.broker.security.quota_resolution import Bucket, resolve
from sluice.metadata import keys
from sluice.metadata.quota_store import QuotaEntity, entity_of
from sluice.metadata.store import MetadataStore

_CACHE_MAX = 10_000  # resolutions remembered per key; the cache is dropped whole when full or stale


def user_of_principal(principal: str) -> str:
    """``User:alice`` -> ``alice`` (the name a user quota entity has)."""
    kind, sep, name = principal.partition(":")
    return name if sep and kind == "User" else principal


class QuotaRates:
    """The quotas of one key (``producer_byte_rate`` ...), as ByteRateQuota reads them."""

    def __init__(self, owner: ClientQuotas, key: str) -> None:
        self.owner = owner
        self.key = key
        self._cache: dict[tuple[str, str], tuple[Bucket, int] | None] = {}
        self._generation = -1

    def any(self) -> bool:
        """Whether some entity has this quota (else the data path skips the lookup)."""
        return self.key in self.owner.keys_in_use

    def resolve(self, principal: str, client_id: str) -> tuple[Bucket, int] | None:
        """The bucket and bytes/s for a caller, or None when no entity sets the key (the broker default applies)."""
        if self._generation != self.owner.generation or len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
            self._generation = self.owner.generation
        found = self._cache.get((principal, client_id), False)
        if found is not False:
            return found  # type: ignore[return-value]
        match = resolve(self.owner.entities, self.key, user_of_principal(principal), client_id)
        result = None if match is None else (match[1], int(match[2]))
        self._cache[(principal, client_id)] = result
        return result


class ClientQuotas:
    """The quota documents of the metadata store, kept current by :meth:`refresh`."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.entities: dict[QuotaEntity, dict[str, float]] = {}
        self.keys_in_use: frozenset[str] = frozenset()
        self.generation = 0  # incremented by every change: cached resolutions are then stale
        self._revision = 0

    def rates(self, key: str) -> QuotaRates:
        return QuotaRates(self, key)

    def refresh(self) -> None:
        changed = False
        for doc in self.store.changes_since(self._revision, keys.QUOTAS):
            self._revision = max(self._revision, doc.revision)
            entity = entity_of(doc.key)
            if entity is None:
                continue
            if doc.value:
                self.entities[entity] = {k: float(v) for k, v in doc.value.items()}
            else:
                self.entities.pop(entity, None)
            changed = True
        if changed:
            self.keys_in_use = frozenset(k for values in self.entities.values() for k in values)
            self.generation += 1
