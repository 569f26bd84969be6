"""``sluice configs``: kafka-configs.sh, for client quotas of users.

Kafka's options: ``--entity-type users`` with ``--entity-name NAME`` or ``--entity-default``, and
``--describe`` or ``--alter`` with ``--add-config producer_byte_rate=N,consumer_byte_rate=N``
and/or ``--delete-config producer_byte_rate,consumer_byte_rate``::

    sluice configs --alter --entity-type users --entity-name alice --add-config producer_byte_rate=1048576
    sluice configs --describe --entity-type users            # every user entity with quotas

Topic settings are given at creation (``sluice topics create --config``); ``users`` is the one
entity type here (Kafka's client-id and ip quota entities are not kept by Sluice). Quotas are
stored in the metadata store and every broker follows them (docs/security.md, "Limits").
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


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    p = sub.add_parser("configs", parents=[client], help="describe and alter client quotas of users (kafka-configs.sh)")
    action = p.add_mutually_exclusive_group(required=True)
    action.add_argument("--describe", action="store_true")
    action.add_argument("--alter", action="store_true")
    p.add_argument("--entity-type", required=True, choices=("users",), help="users (client quotas of a user)")
    who = p.add_mutually_exclusive_group()
    who.add_argument("--entity-name", help="the user (the NAME of the principal User:NAME)")
    who.add_argument("--entity-default", action="store_true", help="the default user (every user without its own)")
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


def run(args: argparse.Namespace) -> int:
    from sluice.client import ClientQuotaAlteration, ClientQuotaEntity, ClientQuotaFilter, ClientQuotaFilterComponent

    user: str | None = None if args.entity_default else args.entity_name
    if args.alter:
        if args.entity_name is None and not args.entity_default:
            raise CliError("--alter needs --entity-name NAME or --entity-default", USAGE)
        changes = _changes(args)
        if not changes:
            raise CliError("--alter needs --add-config and/or --delete-config", USAGE)
    elif args.add_config or args.delete_config:
        raise CliError("--add-config and --delete-config go with --alter", USAGE)
    admin = open_admin(connection(args))
    try:
        if args.alter:
            ops = [ClientQuotaAlteration.Op(k, v) for k, v in changes.items()]
            admin.alter_client_quotas([ClientQuotaAlteration(ClientQuotaEntity({"user": user}), ops)])
            name = "the default user" if user is None else f"user {user!r}"
            print(f"Completed updating quotas of {name}.")
            return 0
        if args.entity_default:
            found = admin.describe_client_quotas(
                ClientQuotaFilter.contains([ClientQuotaFilterComponent.of_default_entity("user")])
            )
        elif user is not None:
            found = admin.describe_client_quotas(
                ClientQuotaFilter.contains([ClientQuotaFilterComponent.of_entity("user", user)])
            )
        else:
            found = admin.describe_client_quotas()
        rows = sorted(
            ((entity.entries.get("user") or "<default>", key, value) for entity, values in found.items()
             for key, value in values.items()),
        )  # fmt: skip
        if args.json:
            print_json([{"user": u, "key": k, "value": v} for u, k, v in rows])
        elif rows:
            print(table([(u, k, f"{v:g}") for u, k, v in rows], ("USER", "QUOTA", "VALUE")))
        return 0
    finally:
        close_quietly(admin)
