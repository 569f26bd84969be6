"""Per-user quota overrides, followed from the metadata store (Kafka's client quotas of user entities).

:class:`UserQuotas` keeps the ``quotas/users/<name>`` documents (sluice.metadata.quota_store) as
they change, with the broker's metadata watch, the way the ACLs are followed: a quota altered
through any broker applies on every broker within one metadata poll. :meth:`UserQuotas.rates`
gives the byte-rate quota of the data path (sluice.broker.security.limits.ByteRateQuota) its
lookup for one quota key, resolved as Kafka resolves user quotas: the user's own value, else the
``<default>`` user's, else the broker's ``quota.*.default`` setting.
"""

from __future__ import annotations

from sluice.metadata import keys
from sluice.metadata.quota_store import DEFAULT_USER, user_of
from sluice.metadata.store import MetadataStore


def user_of_principal(principal: str) -> str:
    """``User:alice`` -> ``alice`` (the name a user quota entity has)."""
    kind, sep, name = principal.partition(":")
    return name if sep and kind == "User" else principal


class QuotaRates:
    """The overrides of one quota key (``producer_byte_rate`` ...), as ByteRateQuota reads them."""

    def __init__(self, owner: UserQuotas, key: str) -> None:
        self.owner = owner
        self.key = key

    def any(self) -> bool:
        """Whether some user has this quota (else the data path skips the per-principal lookup)."""
        return self.key in self.owner.keys_in_use

    def rate(self, principal: str) -> int | None:
        """Bytes/s for ``principal``, or None when no user entity sets it (the broker default applies)."""
        users = self.owner.users
        own = users.get(user_of_principal(principal))
        if own is not None and self.key in own:
            return int(own[self.key])
        default = users.get(DEFAULT_USER)
        if default is not None and self.key in default:
            return int(default[self.key])
        return None


class UserQuotas:
    """The user quota documents of the metadata store, kept current by :meth:`refresh`."""

    def __init__(self, store: MetadataStore) -> None:
        self.store = store
        self.users: dict[str, dict[str, float]] = {}
        self.keys_in_use: frozenset[str] = frozenset()
        self._revision = 0

    def rates(self, key: str) -> QuotaRates:
        return QuotaRates(self, key)

    def refresh(self) -> None:
        changed = False
        for doc in self.store.changes_since(self._revision, keys.USER_QUOTAS):
            self._revision = max(self._revision, doc.revision)
            user = user_of(doc.key)
            if doc.value:
                self.users[user] = {k: float(v) for k, v in doc.value.items()}
            else:
                self.users.pop(user, None)
            changed = True
        if changed:
            self.keys_in_use = frozenset(k for values in self.users.values() for k in values)
