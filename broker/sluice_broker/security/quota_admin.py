"""Client quota administration as plain logic: validating entities and ops, filtering for describe.

Shared by the gRPC servicer (:mod:`sluice.broker.servicers.quotas`) and the Kafka listener's
DescribeClientQuotas / AlterClientQuotas (:mod:`sluice.broker.kafka.handlers.client_quotas`):
each adapter turns its own messages into the tuples below, checks authorization itself, and
answers a :class:`QuotaRequestError` with INVALID_REQUEST and its message (Kafka's error).

Kept: ``user`` and ``client-id`` entities, alone or together (Kafka's eight combinations with
defaults), and ``producer_byte_rate`` / ``consumer_byte_rate``. Refused by name: ``ip``
entities, ``request_percentage`` and any other key, unknown entity types, an entity type given
twice, names that are empty or ``<default>`` (a default entity has no name), and values that are
not positive whole numbers of bytes per second.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from sluice.metadata.quota_store import DEFAULT, QUOTA_KEYS, QuotaEntity

USER, CLIENT_ID, IP = "user", "client-id", "ip"
ENTITY_TYPES = (USER, CLIENT_ID, IP)
EXACT, MATCH_DEFAULT, SPECIFIED = 0, 1, 2  # Kafka's ClientQuotaFilterComponent match types

Component = tuple[str, str | None]  # (entity type, name; None: the default entity of the type)
FilterComponent = tuple[str, int, str | None]  # (entity type, match type, name for EXACT)
Op = tuple[str, float, bool]  # (key, value, remove)


class QuotaRequestError(ValueError):
    """An entity, op or filter Sluice does not keep (answered INVALID_REQUEST with the message)."""


def _check_type(entity_type: str, seen: set[str]) -> None:
    if entity_type not in ENTITY_TYPES:
        raise QuotaRequestError(
            f"unknown quota entity type {entity_type!r}: Kafka's are {', '.join(map(repr, ENTITY_TYPES))}"
        )
    if entity_type in seen:
        raise QuotaRequestError(f"quota entity type {entity_type!r} is given twice")
    seen.add(entity_type)


def entity_from(components: Sequence[Component]) -> QuotaEntity:
    """The entity a request names; QuotaRequestError when Sluice does not keep it."""
    if not components:
        raise QuotaRequestError("a quota entity needs at least one component (user and/or client-id)")
    seen: set[str] = set()
    names: dict[str, str] = {}
    for entity_type, name in components:
        _check_type(entity_type, seen)
        if name is not None and (not name or name == DEFAULT):
            raise QuotaRequestError(
                f"{entity_type} name {name!r} is not valid (the default {entity_type} is given without a name)"
            )
        names[entity_type] = DEFAULT if name is None else name
    if IP in names:
        raise QuotaRequestError("ip quota entities are not kept by Sluice (user and client-id entities are)")
    return QuotaEntity(user=names.get(USER), client_id=names.get(CLIENT_ID))


def components_of(entity: QuotaEntity) -> list[Component]:
    out: list[Component] = []
    if entity.user is not None:
        out.append((USER, None if entity.user == DEFAULT else entity.user))
    if entity.client_id is not None:
        out.append((CLIENT_ID, None if entity.client_id == DEFAULT else entity.client_id))
    return out


def changes_from(ops: Sequence[Op]) -> dict[str, float | None]:
    """The changes an entry asks for (None: remove the key); QuotaRequestError for a bad op."""
    out: dict[str, float | None] = {}
    for key, value, remove in ops:
        if key not in QUOTA_KEYS:
            raise QuotaRequestError(f"quota {key!r} is not supported: Sluice keeps {', '.join(QUOTA_KEYS)}")
        if key in out:
            raise QuotaRequestError(f"quota {key!r} is altered twice in one entry")
        if remove:
            out[key] = None
        elif not math.isfinite(value) or value <= 0 or value != int(value):
            raise QuotaRequestError(f"{key} must be a positive whole number of bytes per second, not {value:g}")
        else:
            out[key] = float(value)
    return out


def check_filter(components: Sequence[FilterComponent]) -> None:
    seen: set[str] = set()
    for entity_type, match_type, match in components:
        _check_type(entity_type, seen)
        if match_type not in (EXACT, MATCH_DEFAULT, SPECIFIED):
            raise QuotaRequestError(f"unknown match type {match_type} for entity type {entity_type!r}")
        if match_type == EXACT and not match:
            raise QuotaRequestError(f"an exact match of entity type {entity_type!r} needs a name")


def _name(entity: QuotaEntity, entity_type: str) -> str | None:
    return entity.user if entity_type == USER else entity.client_id if entity_type == CLIENT_ID else None


def matches(entity: QuotaEntity, components: Sequence[FilterComponent], strict: bool) -> bool:
    """Whether ``entity`` passes a DescribeClientQuotas filter (Kafka's rules)."""
    for entity_type, match_type, match in components:
        name = _name(entity, entity_type)
        if name is None:
            return False  # it names a component this entity lacks
        if match_type == EXACT and name != match:
            return False
        if match_type == MATCH_DEFAULT and name != DEFAULT:
            return False
        if match_type == SPECIFIED and name == DEFAULT:
            return False
    # strict: only entities of exactly the filter's components
    return not strict or len(components) == len(components_of(entity))


def describe(
    quotas: Mapping[QuotaEntity, Mapping[str, float]], components: Sequence[FilterComponent], strict: bool
) -> list[tuple[QuotaEntity, dict[str, float]]]:
    """The entities a filter matches with their quotas, in a stable order; QuotaRequestError for a bad filter."""
    check_filter(components)
    found = [(e, dict(v)) for e, v in quotas.items() if v and matches(e, components, strict)]
    return sorted(found, key=lambda ev: (ev[0].user or "", ev[0].client_id or "", ev[0].user is None))
