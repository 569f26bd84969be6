"""``sluice partitions reassign | list-reassignments | cancel``: kafka-reassign-partitions.sh.

The plan file is Kafka's reassignment JSON (``{"version": 1, "partitions": [{"topic": ...,
"partition": ..., "replicas": [...]}]}``), so a plan written for Kafka's tool, or by
``--generate`` here, works with both. ``reassign --generate --topics A,B --brokers 3,4,5``
prints the current assignment (keep it: it is what a rollback reassigns to) and a proposed
one: Kafka's rack-aware placement over the given brokers, each topic keeping its replication
factor (:func:`sluice.metadata.reassignment.propose`); only partitions that would move are in
it. ``reassign FILE`` starts the moves (the broker answers once they are recorded; the
controller completes each when its new replicas are in sync) and ``--wait`` waits for them to
finish. ``list-reassignments`` shows the moves in progress (Kafka's ``--verify`` and
``--list``); ``cancel`` puts partitions back on their original replicas.

Refusals are per partition and named as Kafka names them (UNKNOWN_TOPIC_OR_PARTITION,
INVALID_REPLICA_ASSIGNMENT, NO_REASSIGNMENT_IN_PROGRESS, ...): every refused partition is
printed and the command fails; the others go ahead, as with Kafka's tool.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sluice.cli.bootstrap import connection
from sluice.cli.clients import describe_existing_topic, open_admin, partitions_of
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import close_quietly, err, print_json
from sluice.metadata.reassignment import propose

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Admin
    from sluice.errors import SluiceError

WAIT_POLL_S = 1.0


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    partitions = sub.add_parser("partitions", help="move partitions between brokers (kafka-reassign-partitions)")
    p_sub = partitions.add_subparsers(dest="partitions_command", metavar="ACTION", required=True)
    reassign = p_sub.add_parser(
        "reassign", parents=[client], help="start the moves of a plan file, or --generate a plan"
    )
    reassign.add_argument("plan", nargs="?", metavar="FILE", help="Kafka's reassignment JSON ('-': standard input)")
    reassign.add_argument("--generate", action="store_true", help="print a balanced plan instead of moving anything")
    reassign.add_argument("--topics", help="--generate: the topics to place, comma-separated")
    reassign.add_argument("--brokers", help="--generate: the broker ids to place them on, comma-separated")
    reassign.add_argument(
        "--disallow-replication-factor-change",
        action="store_true",
        help="refuse a target whose size differs from the partition's replica count",
    )
    reassign.add_argument("--wait", action="store_true", help="wait until every move started has finished")
    reassign.add_argument("--timeout", type=float, default=600.0, help="--wait: give up after this many seconds")
    listing = p_sub.add_parser("list-reassignments", parents=[client], help="the moves in progress")
    listing.add_argument("--json", action="store_true", help="as JSON")
    cancel = p_sub.add_parser("cancel", parents=[client], help="put partitions back on their original replicas")
    cancel.add_argument(
        "partitions", nargs="*", metavar="TOPIC:PARTITION", help="partitions to cancel (or --reassignment-json-file)"
    )
    cancel.add_argument("--reassignment-json-file", metavar="FILE", help="cancel every partition of this plan")


def run(args: argparse.Namespace) -> int:
    admin = open_admin(connection(args))
    try:
        if args.partitions_command == "reassign":
            return _generate(admin, args) if args.generate else _reassign(admin, args)
        if args.partitions_command == "list-reassignments":
            return _list(admin, args)
        return _cancel(admin, args)
    finally:
        close_quietly(admin)


def _ids(text: str | None, what: str) -> list[int]:
    try:
        values = [int(v) for v in (text or "").split(",") if v.strip()]
    except ValueError:
        raise CliError(f"{what}: comma-separated broker ids, not {text!r}", USAGE) from None
    if not values:
        raise CliError(f"--generate needs {what}", USAGE)
    return values


def plan_json(plan: dict[tuple[str, int], list[int]]) -> dict[str, Any]:
    """A plan as Kafka's reassignment JSON."""
    return {
        "version": 1,
        "partitions": [{"topic": t, "partition": p, "replicas": replicas} for (t, p), replicas in sorted(plan.items())],
    }


def read_plan(path: str) -> dict[tuple[str, int], list[int]]:
    """Kafka's reassignment JSON, checked for shape (the broker checks the brokers)."""
    try:
        text = Path("/dev/stdin" if path == "-" else path).read_text()
        doc = json.loads(text)
        entries = doc["partitions"]
        plan: dict[tuple[str, int], list[int]] = {}
        for entry in entries:
            key = (str(entry["topic"]), int(entry["partition"]))
            if key in plan:
                raise CliError(f"{path}: {key[0]}-{key[1]} is in the plan twice", USAGE)
            plan[key] = [int(b) for b in entry.get("replicas") or []]
    except OSError as exc:
        raise CliError(f"cannot read {path}: {exc.strerror or exc}", USAGE) from None
    except (ValueError, KeyError, TypeError) as exc:
        raise CliError(
            f"{path}: not a reassignment plan ({exc}); expected "
            '{"version": 1, "partitions": [{"topic": "t", "partition": 0, "replicas": [1, 2]}]}',
            USAGE,
        ) from None
    return plan


def _generate(admin: Admin, args: argparse.Namespace) -> int:
    names = [t for t in (args.topics or "").split(",") if t]
    if not names:
        raise CliError("--generate needs --topics", USAGE)
    wanted = _ids(args.brokers, "--brokers")
    racks = {b.broker_id: b.rack for b in admin.describe_cluster().brokers}
    unknown = sorted(set(wanted) - set(racks))
    if unknown:
        raise CliError(f"--brokers: unknown broker(s) {unknown}; the cluster has {sorted(racks)}", USAGE)
    current = {name: [list(p.replicas) for p in partitions_of(describe_existing_topic(admin, name))] for name in names}
    try:
        plan = propose(current, [(b, racks[b]) for b in sorted(set(wanted))])
    except ValueError as exc:
        raise CliError(str(exc), USAGE) from None
    err("Current partition replica assignment")
    print_json(plan_json({(t, i): r for t, parts in current.items() for i, r in enumerate(parts)}))
    err("Proposed partition reassignment configuration")
    print_json(plan_json(plan))
    return 0


def _report(results: dict[Any, SluiceError | None], verb: str) -> tuple[int, int]:
    refused = 0
    for tp, result in sorted(results.items()):
        if result is None:
            err(f"{verb} {tp}")
        else:
            refused += 1
            err(f"{tp}: {result.code_name}: {result.message}")
    return len(results) - refused, refused


def _reassign(admin: Admin, args: argparse.Namespace) -> int:
    if not args.plan:
        raise CliError("give a plan FILE (Kafka's reassignment JSON), or --generate one", USAGE)
    plan = read_plan(args.plan)
    if not plan:
        raise CliError(f"{args.plan}: the plan has no partitions", USAGE)
    results = admin.alter_partition_reassignments(
        {key: replicas for key, replicas in plan.items()},
        allow_replication_factor_change=not args.disallow_replication_factor_change,
    )
    started, refused = _report(results, "started the reassignment of")
    if args.wait and started:
        moving = {tp for tp, r in results.items() if r is None}
        deadline = time.monotonic() + args.timeout
        while True:
            left = moving & set(admin.list_partition_reassignments(moving))
            if not left:
                err(f"every reassignment finished ({len(moving)} partition(s))")
                break
            if time.monotonic() >= deadline:
                raise CliError(f"{len(left)} reassignment(s) still in progress after {args.timeout:g} s")
            time.sleep(WAIT_POLL_S)
    return 1 if refused else 0


def _list(admin: Admin, args: argparse.Namespace) -> int:
    ongoing = admin.list_partition_reassignments()
    if args.json:
        print_json(
            [
                {
                    "topic": tp.topic,
                    "partition": tp.partition,
                    "replicas": r.replicas,
                    "adding_replicas": r.adding_replicas,
                    "removing_replicas": r.removing_replicas,
                }
                for tp, r in sorted(ongoing.items())
            ]
        )
        return 0
    if not ongoing:
        err("no reassignment in progress")
    for tp, r in sorted(ongoing.items()):
        print(
            f"{tp.topic}\t{tp.partition}\treplicas {_csv(r.replicas)}\tadding {_csv(r.adding_replicas)}"
            f"\tremoving {_csv(r.removing_replicas)}"
        )
    return 0


def _csv(values: list[int]) -> str:
    return ",".join(str(v) for v in values) or "-"


def _cancel(admin: Admin, args: argparse.Namespace) -> int:
    keys: list[tuple[str, int]] = []
    if args.reassignment_json_file:
        keys += list(read_plan(args.reassignment_json_file))
    for text in args.partitions:
        topic, sep, number = text.rpartition(":")
        if not sep or not topic or not number.isdigit():
            raise CliError(f"{text!r}: give partitions as TOPIC:PARTITION", USAGE)
        keys.append((topic, int(number)))
    if not keys:
        raise CliError("name partitions to cancel (TOPIC:PARTITION) or give --reassignment-json-file", USAGE)
    results = admin.alter_partition_reassignments(dict.fromkeys(keys))
    _, refused = _report(results, "cancelled the reassignment of")
    return 1 if refused else 0
