"""``sluice topics create|list|describe|alter|delete``: kafka-topics.sh.

``describe`` prints Kafka's layout (a topic line, then one line per partition with leader,
leader epoch, replicas and ISR), or the client's TopicDescription as JSON with ``--json``.
Names of topics that do not exist are one-line errors that say how to create them.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from sluice.cli.argtypes import key_value, positive_int
from sluice.cli.bootstrap import connection
from sluice.cli.clients import describe_existing_topic, open_admin, partitions_of
from sluice.cli.exits import USAGE, CliError
from sluice.cli.output import close_quietly, err, print_json

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Admin, PartitionDescription, TopicDescription


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    topics = sub.add_parser("topics", help="create, list, describe and delete topics")
    t_sub = topics.add_subparsers(dest="topics_command", metavar="ACTION", required=True)
    create = t_sub.add_parser("create", parents=[client], help="create a topic")
    create.add_argument("topic", help="the new topic's name")
    create.add_argument("--partitions", type=positive_int, help="default: the broker's num.partitions")
    create.add_argument(
        "--replication-factor", type=positive_int, help="default: the broker's default.replication.factor"
    )
    create.add_argument(
        "--config", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="e.g. retention.ms=-1"
    )
    t_list = t_sub.add_parser("list", parents=[client], help="list topics")
    t_list.add_argument("--json", action="store_true", help="the names as a JSON array")
    describe = t_sub.add_parser("describe", parents=[client], help="partitions, leaders, replicas, config")
    describe.add_argument("topics", nargs="+", metavar="TOPIC", help="one or more topics")
    describe.add_argument("--json", action="store_true", help="the client's TopicDescription as JSON")
    delete = t_sub.add_parser("delete", parents=[client], help="delete topics")
    delete.add_argument("topics", nargs="+", metavar="TOPIC", help="one or more topics (their records are gone)")
    alter = t_sub.add_parser(
        "alter",
        parents=[client],
        help="add partitions or change config overrides (kafka-topics --alter, kafka-configs --alter)",
    )
    alter.add_argument("topic", help="an existing topic")
    alter.add_argument("--partitions", type=positive_int, help="the new total, more than it has (never fewer)")
    alter.add_argument(
        "--config",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="set a config override, e.g. retention.ms=3600000 (applied without a restart); repeatable",
    )
    alter.add_argument(
        "--delete-config",
        action="append",
        default=[],
        metavar="KEY",
        help="drop a config override: the broker's value applies again; repeatable",
    )


def run(args: argparse.Namespace) -> int:
    admin = open_admin(connection(args))
    try:
        if args.topics_command == "create":
            _create(admin, args)
        elif args.topics_command == "list":
            names = sorted(admin.list_topics())
            if args.json:
                print_json(names)
            else:
                for name in names:
                    print(name)
        elif args.topics_command == "describe":
            descs = [describe_existing_topic(admin, t) for t in args.topics]
            if args.json:
                print_json(descs if len(descs) > 1 else descs[0])
            else:
                print("\n".join(render_topic(name, d) for name, d in zip(args.topics, descs, strict=True)))
        elif args.topics_command == "alter":
            _alter(admin, args)
        elif args.topics_command == "delete":
            for topic in args.topics:
                describe_existing_topic(admin, topic, hint_create=False)
                admin.delete_topic(topic)
                err(f"deleted topic {topic}")
    finally:
        close_quietly(admin)
    return 0


def _create(admin: Admin, args: argparse.Namespace) -> None:
    # None leaves partitions and replication factor to the broker's defaults.
    admin.create_topic(
        args.topic,
        partitions=args.partitions,
        replication_factor=args.replication_factor,
        config=dict(args.config),
    )
    err(f"created topic {args.topic}")


def _alter(admin: Admin, args: argparse.Namespace) -> None:
    changes: dict[str, str | None] = dict(args.config)
    for key in args.delete_config:
        if key in changes:
            raise CliError(f"--config and --delete-config both name {key}", USAGE)
        changes[key] = None
    if args.partitions is None and not changes:
        raise CliError("nothing to alter: give --partitions, --config or --delete-config", USAGE)
    before = len(partitions_of(describe_existing_topic(admin, args.topic, hint_create=False)))
    if args.partitions is not None and args.partitions <= before:
        raise CliError(
            f"topic {args.topic} has {before} partition(s): --partitions must be more (partitions are only "
            "ever added, as in Kafka)",
            USAGE,
        )
    if changes:  # first: a refused config (all or nothing) leaves the partitions as they were too
        admin.alter_topic_config(args.topic, changes)
        shown = ", ".join(f"{k}={v}" if v is not None else f"{k} (broker default)" for k, v in changes.items())
        err(f"topic {args.topic}: {shown}")
    if args.partitions is not None:
        admin.create_partitions(args.topic, args.partitions)
        err(f"topic {args.topic}: {before} -> {args.partitions} partitions")


def render_topic(name: str, desc: TopicDescription) -> str:
    parts = partitions_of(desc)
    cfg = ",".join(f"{k}={v}" for k, v in sorted(desc.config.items()))
    rf = desc.replication_factor
    if not rf and parts:
        rf = len(parts[0].replicas)
    head = (
        f"Topic: {name}\tTopicId: {desc.topic_id}\tPartitionCount: {len(parts)}"
        f"\tReplicationFactor: {rf}\tConfigs: {cfg}"
    )
    return "\n".join([head, *(_render_partition(name, p) for p in parts)])


def _render_partition(name: str, p: PartitionDescription) -> str:
    def ids(values: list[int]) -> str:
        return ",".join(str(i) for i in values)

    return (
        f"\tTopic: {name}\tPartition: {p.partition}\tLeader: {p.leader}"
        f"\tLeaderEpoch: {p.leader_epoch}\tReplicas: {ids(p.replicas)}\tIsr: {ids(p.isr)}"
    )
