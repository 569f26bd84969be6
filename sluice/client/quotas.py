"""Client quotas as Kafka's Admin API names them: entities, alterations, filters.

``Admin.alter_client_quotas`` and ``Admin.describe_client_quotas`` take and return these, the
shape of Kafka's ``ClientQuotaEntity``, ``ClientQuotaAlteration`` and ``ClientQuotaFilter``:

    admin.alter_client_quotas([
        ClientQuotaAlteration(ClientQuotaEntity({"user": "alice"}),
                              [ClientQuotaAlteration.Op("producer_byte_rate", 1_048_576)]),
    ])
    admin.describe_client_quotas(ClientQuotaFilter.contains([ClientQuotaFilterComponent.of_entity("user", "alice")]))
    # {ClientQuotaEntity({'user': 'alice'}): {'producer_byte_rate': 1048576.0}}

An entity maps entity types to names, a name of None being the default entity of its type
(Kafka's ``<default>``). Sluice brokers keep ``user`` and ``client-id`` entities and the two
together (``ClientQuotaEntity({"user": "alice", "client-id": "app1"})``), with
``producer_byte_rate`` and ``consumer_byte_rate`` (docs/security.md, "Limits"); anything else
(``ip`` entities, ``request_percentage``, unknown types and keys, values that are not positive
whole numbers) is refused by the broker with InvalidRequestError naming it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from sluice.api.v1 import broker_pb2

USER = "user"
CLIENT_ID = "client-id"
IP = "ip"


@dataclass(frozen=True, slots=True)
class ClientQuotaEntity:
    """Entity type -> name (None: the type's default entity), e.g. ``ClientQuotaEntity({"user": "alice"})``."""

    entries: Mapping[str, str | None]
    _key: tuple[tuple[str, str | None], ...] = field(init=False, repr=False, compare=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "entries", dict(self.entries))
        object.__setattr__(self, "_key", tuple(sorted(self.entries.items(), key=lambda kv: kv[0])))

    def __hash__(self) -> int:
        return hash(self._key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientQuotaEntity) and self._key == other._key

    def __repr__(self) -> str:
        return f"ClientQuotaEntity({dict(self._key)!r})"

    def to_proto(self) -> list[broker_pb2.QuotaEntityComponent]:
        out = []
        for entity_type, name in self._key:
            c = broker_pb2.QuotaEntityComponent(entity_type=entity_type)
            if name is not None:
                c.entity_name = name
            out.append(c)
        return out

    @classmethod
    def from_proto(cls, components: Iterable[broker_pb2.QuotaEntityComponent]) -> ClientQuotaEntity:
        return cls({c.entity_type: (c.entity_name if c.HasField("entity_name") else None) for c in components})


@dataclass(frozen=True, slots=True)
class ClientQuotaAlteration:
    """Changes to one entity's quotas: each :class:`Op` sets a value, or removes it (value None)."""

    @dataclass(frozen=True, slots=True)
    class Op:
        key: str  # producer_byte_rate, consumer_byte_rate
        value: float | None  # None: remove the quota

    entity: ClientQuotaEntity
    ops: tuple[ClientQuotaAlteration.Op, ...] | list[ClientQuotaAlteration.Op]

    def to_proto(self) -> broker_pb2.QuotaAlteration:
        return broker_pb2.QuotaAlteration(
            entity=self.entity.to_proto(),
            ops=[broker_pb2.QuotaOp(key=op.key, value=op.value or 0.0, remove=op.value is None) for op in self.ops],
        )


@dataclass(frozen=True, slots=True)
class ClientQuotaFilterComponent:
    """One condition on an entity: a name, the default entity, or any named entity of a type."""

    entity_type: str
    match: str | None  # with match_type EXACT
    match_type: int

    @classmethod
    def of_entity(cls, entity_type: str, name: str) -> ClientQuotaFilterComponent:
        return cls(entity_type, name, broker_pb2.QuotaFilterComponent.EXACT)

    @classmethod
    def of_default_entity(cls, entity_type: str) -> ClientQuotaFilterComponent:
        return cls(entity_type, None, broker_pb2.QuotaFilterComponent.DEFAULT)

    @classmethod
    def of_entity_type(cls, entity_type: str) -> ClientQuotaFilterComponent:
        return cls(entity_type, None, broker_pb2.QuotaFilterComponent.SPECIFIED)


@dataclass(frozen=True, slots=True)
class ClientQuotaFilter:
    """Which entities to describe: those with (``strict``: exactly) these components; none: all."""

    components: tuple[ClientQuotaFilterComponent, ...] = ()
    strict: bool = False

    @classmethod
    def contains(cls, components: Iterable[ClientQuotaFilterComponent]) -> ClientQuotaFilter:
        return cls(tuple(components), False)

    @classmethod
    def contains_only(cls, components: Iterable[ClientQuotaFilterComponent]) -> ClientQuotaFilter:
        return cls(tuple(components), True)

    @classmethod
    def all(cls) -> ClientQuotaFilter:
        return cls((), False)

    def to_proto(self) -> broker_pb2.DescribeClientQuotasRequest:
        return broker_pb2.DescribeClientQuotasRequest(
            components=[
                broker_pb2.QuotaFilterComponent(
                    entity_type=c.entity_type,
                    match_type=c.match_type,  # type: ignore[arg-type]
                    match=c.match or "",
                )
                for c in self.components
            ],
            strict=self.strict,
        )
