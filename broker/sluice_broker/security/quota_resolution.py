"""Which quota entity applies to a request, in Kafka's order (KIP-55), and whose bucket it fills.

Plain logic over the entities' quotas, apart from the network code. For a caller ``user`` with
client id ``client`` and one quota key (``producer_byte_rate`` ...), the first of these entities
that sets the key gives the rate, as Kafka's default quota callback resolves it:

1. ``users/<user>/clients/<client>``      5. ``users/<default>/clients/<default>``
2. ``users/<user>/clients/<default>``     6. ``users/<default>``
3. ``users/<user>``                       7. ``clients/<client>``
4. ``users/<default>/clients/<client>``   8. ``clients/<default>``

The rate is a quota of the matched entity, shared by every connection it covers (Kafka's
semantics): the bucket is named by the components the entity has, with a default standing for
the caller's own name. So ``users/alice`` is one bucket for all of alice's clients,
``clients/app1`` one for every user's ``app1`` connections, and ``users/<default>`` one bucket
per user. Nothing set: None, and the broker's ``quota.*.default`` applies per principal.
"""

from __future__ import annotations

from collections.abc import Mapping

from sluice.metadata.quota_store import DEFAULT, QuotaEntity

Bucket = tuple[str, str]  # (user or "", client id or ""): who shares one quota


def _order(user: str, client: str) -> tuple[tuple[QuotaEntity, Bucket], ...]:
    both, user_only, client_only = (user, client), (user, ""), ("", client)
    return (
        (QuotaEntity(user, client), both),
        (QuotaEntity(user, DEFAULT), both),
        (QuotaEntity(user, None), user_only),
        (QuotaEntity(DEFAULT, client), both),
        (QuotaEntity(DEFAULT, DEFAULT), both),
        (QuotaEntity(DEFAULT, None), user_only),
        (QuotaEntity(None, client), client_only),
        (QuotaEntity(None, DEFAULT), client_only),
    )


def resolve(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], key: str, user: str, client: str
) -> tuple[QuotaEntity, Bucket, float] | None:
    """The entity whose ``key`` applies to (``user``, ``client``), its bucket and its rate; None: no entity sets it."""
    for entity, bucket in _order(user, client):
        values = quotas.get(entity)
        if values is not None and key in values:
            return entity, bucket, values[key]
    return None
