"""``sluice configs``: kafka-configs.sh, for client quotas of users, client ids and both.

Kafka's options: ``--entity-type users|clients``, each followed by ``--entity-name NAME`` or
``--entity-default``; a user and a client id together are one entity (KIP-55). Then
``--describe`` or ``--alter`` with ``--add-config producer_byte_rate=N,consumer_byte_rate=N``
and/or ``--delete-config producer_byte_rate,consumer_byte_rate``::

    sluice configs --alter --entity-type users --entity-name alice --add-config producer_byte_rate=1048576
    sluice configs --alter --entity-type users --entity-name alice --entity-type clients --entity-name app1 \\
        --add-config producer_byte_rate=2097152
    sluice configs --alter --entity-type clients --entity-default --add-config consumer_byte_rate=524288
    sluice configs --describe --entity-type users            # every named user entity with quotas
    sluice configs --describe --entity-type users --entity-type clients   # every user+client-id entity

Names pair with types in order, as in kafka-configs.sh: the Nth ``--entity-name`` or
``--entity-default`` names the Nth ``--entity-type``; a type without one, in ``--describe``,
stands for every named entity of that type. Describing lists exactly the entities with the given
types (Kafka's ``containsOnly`` filter). Topic settings are given at creation (``sluice topics
create --config``). Quotas are stored in the metadata store and every broker follows them
(docs/security.md, "Limits"); the broker validates the keys and values (InvalidRequestError).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sluice.cli.bootstrap import connection
from sluice.cli.clients import open_admin
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import close_quietly, print_json, table

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands

ENTITY_TYPES = {"users": "user", "clients": "client-id"}  # kafka-configs.sh's name -> the quota entity type
DEFAULT = "<default>"


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "configs", parents=[client], help="describe and alter client quotas of users and client ids (kafka-configs.sh)"
    )
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true", help="show the entities' quotas")
    action.add_argument("--alter", action="store_true", help="set (--add-config) or remove (--delete-config) quotas")
    p.add_argument(
        "--entity-type", action="append", required=True, choices=tuple(ENTITY_TYPES),
        help="users (the NAME of a principal User:NAME) or clients (a client id); twice for a user's client id",
    )  # fmt: skip
    p.add_argument("--entity-name", action="append", dest="entity_names", help="the entity of the --entity-type before")
    p.add_argument(
        "--entity-default", action="append_const", const=None, dest="entity_names",
        help="the default entity of the --entity-type before (every user or client id without its own)",
    )  # fmt: skip
    p.add_argument("--add-config", metavar="K=V,...", help="quotas to set: producer_byte_rate, consumer_byte_rate")
    p.add_argument("--delete-config", metavar="K,...", help="quotas to remove")
    p.add_argument("--json", action="store_true", help="--describe as JSON")


def _changes(args: argparse.Namespace) -> dict[str, float | None]:
    changes: dict[str, float | None] = {}
    for item in filter(None, (i.strip() for i in (args.add_config or "").split(","))):
        key, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or number != number:
            raise CliError(f"--add-config: {item!r} is not KEY=NUMBER", USAGE)
        changes[key.strip()] = number
    for key in filter(None, (k.strip() for k in (args.delete_config or "").split(","))):
        if key in changes:
            raise CliError(f"{key} is both added and deleted", USAGE)
        changes[key] = None
    return changes


def _entity(args: argparse.Namespace) -> tuple[list[str], list[str | None]]:
    """The quota entity types given (``user``, ``client-id``) and the names paired with them."""
    types = [ENTITY_TYPES[t] for t in args.entity_type]
    names: list[str | None] = list(args.entity_names or [])
    if len(set(types)) != len(types):
        raise CliError("each --entity-type may be given once (users and clients, for a user's client id)", USAGE)
    if len(names) > len(types):
        raise CliError("more --entity-name/--entity-default than --entity-type", USAGE)
    if args.alter and len(names) != len(types):
        raise CliError("--alter needs --entity-name NAME or --entity-default after each --entity-type", USAGE)
    return types, names


def _rate(value: float) -> str:
    """A quota as people write it: 2097152, not 2.09715e+06 (a fraction only when there is one)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _label(name: str | None) -> str:
    return DEFAULT if name is None else name


def run(args: argparse.Namespace) -> int:
    from sluice.client import ClientQuotaAlteration, ClientQuotaEntity, ClientQuotaFilter, ClientQuotaFilterComponent

    types, names = _entity(args)
    if args.alter:
        changes = _changes(args)
        if not changes:
            raise CliError("--alter needs --add-config and/or --delete-config", USAGE)
    elif args.add_config or args.delete_config:
        raise CliError("--add-config and --delete-config go with --alter", USAGE)
    admin = open_admin(connection(args))
    try:
        if args.alter:
            entity = ClientQuotaEntity(dict(zip(types, names, strict=True)))
            ops = [ClientQuotaAlteration.Op(k, v) for k, v in changes.items()]
            admin.alter_client_quotas([ClientQuotaAlteration(entity, ops)])
            what = " and ".join(f"{t} {_label(n)!r}" for t, n in zip(types, names, strict=True))
            print(f"Completed updating quotas of {what}.")
            return 0
        components = []
        for i, entity_type in enumerate(types):
            if i >= len(names):
                components.append(ClientQuotaFilterComponent.of_entity_type(entity_type))
            elif names[i] is None:
                components.append(ClientQuotaFilterComponent.of_default_entity(entity_type))
            else:
                components.append(ClientQuotaFilterComponent.of_entity(entity_type, str(names[i])))
        found = admin.describe_client_quotas(ClientQuotaFilter.contains_only(components))
        rows = sorted(
            (
                "" if "user" not in entity.entries else _label(entity.entries["user"]),
                "" if "client-id" not in entity.entries else _label(entity.entries["client-id"]),
                key,
                value,
            )
            for entity, values in found.items()
            for key, value in values.items()
        )
        if args.json:
            print_json([{"user": u or None, "client_id": c or None, "key": k, "value": v} for u, c, k, v in rows])
        elif rows:
            print(table([(u, c, k, _rate(v)) for u, c, k, v in rows], ("USER", "CLIENT-ID", "QUOTA", "VALUE")))
        return 0
    finally:
        close_quietly(admin)
