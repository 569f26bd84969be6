"""``sluice acls add|list|remove``: kafka-acls.sh.

Kafka's options where they exist: ``--allow-principal`` / ``--deny-principal`` (add),
``--principal`` (list, remove), ``--operation`` (repeatable), ``--host``, one resource of
``--topic``, ``--group``, ``--transactional-id`` or ``--cluster``, ``--resource-pattern-type``
(literal, prefixed; for list and remove also match and any) and ``--command-config FILE``, a
properties file with the client's security settings (:mod:`sluice.cli.security`, shared by every
client command): a secure cluster's ACLs are managed by its super user, so the command connects
as one. ``list --json`` prints the bindings as JSON.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from sluice.cli.bootstrap import connection
from sluice.cli.clients import open_admin
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import close_quietly, err, print_json, table

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands

_OPERATIONS = (
    "all", "read", "write", "create", "delete", "alter", "describe", "cluster_action", "describe_configs",
    "alter_configs", "idempotent_write",
)  # fmt: skip


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    acls = sub.add_parser("acls", help="add, list and remove ACLs (authorization)")
    a_sub = acls.add_subparsers(dest="acls_command", metavar="ACTION", required=True)
    add = a_sub.add_parser("add", parents=[client], help="add ACLs")
    who = add.add_mutually_exclusive_group(required=True)
    who.add_argument("--allow-principal", metavar="TYPE:NAME", help="e.g. User:alice")
    who.add_argument("--deny-principal", metavar="TYPE:NAME", help="deny instead (a DENY wins over any ALLOW)")
    add.add_argument(
        "--operation", action="append", required=True, choices=_OPERATIONS, type=str.lower, help="repeatable"
    )
    _resource_options(add, ("literal", "prefixed"), required=True)
    listing = a_sub.add_parser("list", parents=[client], help="list ACLs (all, or those the options select)")
    remove = a_sub.add_parser("remove", parents=[client], help="remove the ACLs the options select")
    remove.add_argument("--force", action="store_true", help="remove without asking for confirmation")
    for p in (listing, remove):
        p.add_argument("--principal", metavar="TYPE:NAME", help="only this principal's ACLs")
        p.add_argument(
            "--operation", action="append", choices=_OPERATIONS, type=str.lower, help="only these operations"
        )
        _resource_options(p, ("literal", "prefixed", "match", "any"), required=False)
    listing.add_argument("--json", action="store_true", help="as JSON")


def _resource_options(p: argparse.ArgumentParser, patterns: tuple[str, ...], *, required: bool) -> None:
    res = p.add_mutually_exclusive_group(required=required)
    res.add_argument("--topic", help="a topic (or a prefix, with --resource-pattern-type prefixed)")
    res.add_argument("--group", help="a consumer group (or a prefix)")
    res.add_argument("--transactional-id", help="a transactional id (or a prefix)")
    res.add_argument("--cluster", action="store_true", help="the cluster resource (kafka-cluster)")
    default_pattern = patterns[0] if required else None
    p.add_argument(
        "--resource-pattern-type",
        choices=patterns,
        type=str.lower,
        default=default_pattern,
        help="literal: the name itself, prefixed: every name starting with it (list/remove: also match, any)",
    )
    p.add_argument("--host", default="*" if required else None, help="the client host ('*': every host)")


def _resource(args: argparse.Namespace) -> tuple[Any, str | None]:
    from sluice.acls import ResourceType

    if args.topic is not None:
        return ResourceType.TOPIC, args.topic
    if args.group is not None:
        return ResourceType.GROUP, args.group
    if args.transactional_id is not None:
        return ResourceType.TRANSACTIONAL_ID, args.transactional_id
    if args.cluster:
        return ResourceType.CLUSTER, "kafka-cluster"
    return ResourceType.ANY, None


def run(args: argparse.Namespace) -> int:
    from sluice.acls import AclBinding, AclBindingFilter, AclOperation, AclPermissionType, ResourcePatternType

    admin = open_admin(connection(args))
    rtype, name = _resource(args)
    ops = [AclOperation[o.upper()] for o in (args.operation or [])]
    try:
        if args.acls_command == "add":
            permission = AclPermissionType.ALLOW if args.allow_principal else AclPermissionType.DENY
            principal = args.allow_principal or args.deny_principal
            pattern = ResourcePatternType[args.resource_pattern_type.upper()]
            try:
                bindings = [AclBinding(rtype, name or "", pattern, principal, args.host, op, permission) for op in ops]
            except ValueError as exc:
                raise CliError(str(exc), USAGE) from None
            admin.create_acls(bindings)
            for b in bindings:
                print(f"added {_line(b)}")
            return 0
        pattern = ResourcePatternType[(args.resource_pattern_type or "any").upper()]
        filters = [
            AclBindingFilter(rtype, name, pattern, args.principal, args.host, op) for op in (ops or [AclOperation.ANY])
        ]
        if args.acls_command == "list":
            found = [b for f in filters for b in admin.describe_acls(f)]
            if args.json:
                print_json([b.to_json() for b in found])
            elif found:
                rows = [
                    (b.principal, b.permission_type.name, b.operation.name, b.resource_type.name, b.name,
                     b.pattern_type.name, b.host)
                    for b in found
                ]  # fmt: skip
                print(table(rows, ("PRINCIPAL", "PERMISSION", "OPERATION", "RESOURCE", "NAME", "PATTERN", "HOST")))
            else:  # stderr: stdout stays empty for scripts
                err("no ACLs match" if args.principal or ops or name or args.host else "no ACLs")
            return 0
        if not args.force:
            matching = [b for f in filters for b in admin.describe_acls(f)]
            if not matching:
                err("no ACLs match: nothing to remove")
                return 0
            if not _confirmed(matching):
                raise CliError("nothing removed (confirm with y, or pass --force to remove without asking)")
        for b in admin.delete_acls(filters):
            print(f"removed {_line(b)}")
        return 0
    finally:
        close_quietly(admin)


def _confirmed(matching: list[Any]) -> bool:
    """kafka-acls asks before removing; so does this: the ACLs, then one line of stdin (y: remove)."""
    for b in matching:
        print(f"  {_line(b)}", file=sys.stderr)
    print(f"remove these {len(matching)} ACL(s)? (y/n) ", end="", file=sys.stderr, flush=True)
    answer = sys.stdin.readline()  # EOF (a script, no --force): not confirmed
    if not answer:
        print(file=sys.stderr)
    return answer.strip().lower() in ("y", "yes")


def _line(b: Any) -> str:
    return (
        f"{b.permission_type.name} {b.principal} {b.operation.name} on {b.resource_type.name} "
        f"{b.pattern_type.name} {b.name!r} from host {b.host}"
    )
