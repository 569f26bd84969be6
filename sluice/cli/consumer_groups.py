"""``sluice consumer-groups list|describe|reset-offsets|delete``: kafka-consumer-groups.sh.

``describe`` prints Kafka's offsets table (one row per partition the group has a committed
offset for or a member owns: committed offset, log end offset, lag, owner). The log end offset
is the partition's high watermark (``Admin.list_offsets`` LATEST, read_uncommitted), the end the
broker's ``kafka_consumergroup_lag`` metric also measures from, so the two agree; lag is that
minus the committed offset, ``-`` where nothing is committed. ``--members`` and ``--state`` show
the group instead of its offsets.

``reset-offsets`` follows Kafka's tool: a scope (``--topic T[:P,P...]`` or ``--all-topics``), one
target (``--to-earliest``, ``--to-latest``, ``--to-offset N``, ``--shift-by N``, ``--to-datetime``,
``--by-duration``: the first offset whose record's timestamp is at least that time, the log end
when none is), and a plan that
is only printed (``--dry-run``, the default) unless ``--execute`` is given. Targets are clamped to
the partition's [earliest, latest] range, as Kafka clamps them. A group with members is refused
(the members would overwrite the reset with their next commit), as Kafka refuses it.
"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sluice.cli.bootstrap import connection
from sluice.cli.clients import describe_existing_topic, open_admin, topic_partition
from sluice.cli.exits import CliError, describe_error
from sluice.cli.output import close_quietly, err, print_json, table

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Admin, ConsumerGroupDescription, TopicPartition


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    groups = sub.add_parser("consumer-groups", help="list, describe, reset and delete consumer groups")
    g_sub = groups.add_subparsers(dest="groups_command", metavar="ACTION", required=True)
    g_list = g_sub.add_parser("list", parents=[client], help="the cluster's consumer groups")
    g_list.add_argument(
        "--state", action="append", default=[], help="only this state (Empty, Stable, Reconciling); repeatable"
    )
    g_list.add_argument("--json", action="store_true", help="as JSON")
    g_desc = g_sub.add_parser("describe", parents=[client], help="offsets and lag (or members, or state)")
    g_desc.add_argument("group", help="the consumer group")
    shown = g_desc.add_mutually_exclusive_group()
    shown.add_argument("--members", action="store_true", help="the members and their assignments")
    shown.add_argument("--state", action="store_true", help="the group's state, epoch and coordinator")
    g_desc.add_argument("--json", action="store_true", help="as JSON")
    g_reset = g_sub.add_parser("reset-offsets", parents=[client], help="move an inactive group's offsets")
    g_reset.add_argument("group", help="the consumer group (with no members)")
    scope = g_reset.add_mutually_exclusive_group(required=True)
    scope.add_argument(
        "--topic", action="append", default=[], metavar="TOPIC[:P,P...]", help="a topic, or some of its partitions"
    )
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    target = g_reset.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="each partition's first offset")
    target.add_argument("--to-latest", action="store_true", help="each partition's end (skip everything)")
    target.add_argument("--to-offset", type=int, metavar="N", help="this offset in every partition (clamped)")
    target.add_argument("--shift-by", type=int, metavar="N", help="from the committed offset (negative: back)")
    target.add_argument(
        "--to-datetime",
        type=datetime_ms,
        metavar="YYYY-MM-DDTHH:mm:SS.sss",
        help="the first offset whose record is at least this recent (ISO 8601; no zone: local time, as Kafka)",
    )
    target.add_argument(
        "--by-duration",
        type=duration_ms,
        metavar="PnDTnHnMnS",
        help="the first offset of records at most this old (ISO 8601 duration, e.g. PT30M, P1DT2H)",
    )
    mode = g_reset.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the plan only (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the new offsets")
    g_reset.add_argument("--json", action="store_true", help="the plan as JSON")
    g_del = g_sub.add_parser("delete", parents=[client], help="delete inactive groups (their committed offsets)")
    g_del.add_argument("groups", nargs="+", metavar="GROUP", help="one or more consumer groups")


def run(args: argparse.Namespace) -> int:
    admin = open_admin(connection(args))
    try:
        if args.groups_command == "list":
            _list(admin, args)
        elif args.groups_command == "describe":
            _describe(admin, args)
        elif args.groups_command == "reset-offsets":
            _reset(admin, args)
        else:
            return _delete(admin, args)
    finally:
        close_quietly(admin)
    return 0


# -- list -----------------------------------------------------------------------------------------


def _list(admin: Admin, args: argparse.Namespace) -> None:
    listed = admin.list_consumer_groups(states=args.state or None)
    if args.json:
        print_json(listed)
    elif args.state:
        print(table([[g.group_id, g.state] for g in listed], ["GROUP", "STATE"]))
    else:
        for g in listed:
            print(g.group_id)


# -- describe -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PartitionLag:
    """One row of ``describe``: a partition's committed offset, end offset and lag (None: unknown)."""

    group: str
    topic: str
    partition: int
    current_offset: int | None
    log_end_offset: int | None
    lag: int | None
    consumer_id: str | None


def _existing_group(admin: Admin, group: str) -> ConsumerGroupDescription:
    from sluice import errors

    try:
        return admin.describe_consumer_groups([group])[group]
    except errors.GroupIdNotFoundError:
        raise CliError(f"consumer group {group!r} does not exist") from None


def group_lag(admin: Admin, group: str, desc: ConsumerGroupDescription) -> list[PartitionLag]:
    """Every partition the group committed or a member owns, with its lag (HW minus committed)."""
    committed = admin.list_consumer_group_offsets(group)
    owner: dict[TopicPartition, str] = {}
    for m in desc.members:
        for tp in m.assignment:
            owner[tp] = m.member_id
    tps = sorted(set(committed) | set(owner), key=lambda tp: (tp.topic, tp.partition))
    ends = admin.list_offsets({tp: admin.LATEST for tp in tps}) if tps else {}
    rows = []
    for tp in tps:
        current = committed.get(tp)
        end = ends[tp].offset if tp in ends and ends[tp].offset >= 0 else None
        lag = max(end - current, 0) if current is not None and end is not None else None
        rows.append(PartitionLag(group, tp.topic, tp.partition, current, end, lag, owner.get(tp)))
    return rows


def _describe(admin: Admin, args: argparse.Namespace) -> None:
    desc = _existing_group(admin, args.group)
    if args.state:
        if args.json:
            print_json(_plain_state(desc))
            return
        row = [desc.group_id, desc.coordinator_id, desc.state, desc.group_epoch, len(desc.members)]
        print(table([row], ["GROUP", "COORDINATOR", "STATE", "EPOCH", "#MEMBERS"]))
        return
    if args.members:
        if args.json:
            print_json(desc.members)
            return
        rows = [
            [
                desc.group_id,
                m.member_id,
                m.member_epoch,
                len(m.assignment),
                ",".join(f"{tp.topic}-{tp.partition}" for tp in m.assignment) or "-",
            ]
            for m in desc.members
        ]
        print(table(rows, ["GROUP", "CONSUMER-ID", "EPOCH", "#PARTITIONS", "ASSIGNMENT"]))
        return
    rows_lag = group_lag(admin, args.group, desc)
    if args.json:
        print_json(rows_lag)
        return
    if not desc.members:
        err(f"consumer group {args.group!r} has no active members")

    def cell(v: int | str | None) -> str:
        return "-" if v is None else str(v)

    rows = [
        [r.group, r.topic, r.partition, *(cell(v) for v in (r.current_offset, r.log_end_offset, r.lag, r.consumer_id))]
        for r in rows_lag
    ]
    print(table(rows, ["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID"]))


def _plain_state(desc: ConsumerGroupDescription) -> dict[str, object]:
    return {
        "group_id": desc.group_id,
        "coordinator_id": desc.coordinator_id,
        "state": desc.state,
        "group_epoch": desc.group_epoch,
        "members": len(desc.members),
    }


# -- reset-offsets --------------------------------------------------------------------------------


def parse_topic_scope(text: str) -> tuple[str, list[int] | None]:
    """``TOPIC`` (every partition) or ``TOPIC:0,2`` (those partitions)."""
    topic, sep, parts = text.partition(":")
    if not topic:
        raise CliError(f"--topic {text!r}: the topic name is empty", code=2)
    if not sep:
        return topic, None
    try:
        numbers = [int(p) for p in parts.split(",") if p.strip()]
    except ValueError:
        raise CliError(f"--topic {text!r}: partitions must be integers, as TOPIC:0,1", code=2) from None
    if not numbers or any(n < 0 for n in numbers):
        raise CliError(f"--topic {text!r}: name partitions >= 0, as TOPIC:0,1", code=2)
    return topic, numbers


def _scope(admin: Admin, args: argparse.Namespace, committed: dict[TopicPartition, int]) -> list[TopicPartition]:
    if args.all_topics:
        if not committed:
            raise CliError(f"consumer group {args.group!r} has no committed offsets: name the topics with --topic")
        return sorted(committed, key=lambda tp: (tp.topic, tp.partition))
    out: list[TopicPartition] = []
    for text in args.topic:
        topic, numbers = parse_topic_scope(text)
        count = len(describe_existing_topic(admin, topic).partitions)
        for n in numbers or []:
            if n >= count:
                raise CliError(f"topic {topic!r} has no partition {n} (it has {count})")
        out.extend(topic_partition(topic, p) for p in (numbers if numbers is not None else range(count)))
    return out


def plan_reset(
    tps: list[TopicPartition],
    committed: dict[TopicPartition, int],
    earliest: dict[TopicPartition, int],
    latest: dict[TopicPartition, int],
    *,
    to_earliest: bool = False,
    to_latest: bool = False,
    to_offset: int | None = None,
    shift_by: int | None = None,
    by_time: dict[TopicPartition, int] | None = None,
) -> dict[TopicPartition, int]:
    """The new offset of each partition, clamped to [earliest, latest] as Kafka's tool clamps it.

    ``by_time``: each partition's first offset at or after a timestamp (-1: no record is that
    recent, so the log end, as Kafka's tool resets it).
    """
    plan: dict[TopicPartition, int] = {}
    for tp in tps:
        low, high = earliest[tp], latest[tp]
        if to_earliest:
            wanted = low
        elif to_latest:
            wanted = high
        elif by_time is not None:
            found = by_time.get(tp, -1)
            wanted = high if found < 0 else found
        elif to_offset is not None:
            wanted = to_offset
        else:
            if tp not in committed:
                raise CliError(f"{tp.topic}-{tp.partition} has no committed offset to shift from")
            wanted = committed[tp] + (shift_by or 0)
        plan[tp] = min(max(wanted, low), high)
    return plan


def _reset(admin: Admin, args: argparse.Namespace) -> None:
    from sluice import errors

    try:
        desc: ConsumerGroupDescription | None = admin.describe_consumer_groups([args.group])[args.group]
    except errors.GroupIdNotFoundError:
        desc = None  # a new group: resetting creates its offsets, as Kafka's tool does
    if desc is not None and desc.members:
        raise CliError(
            f"offsets can only be reset while consumer group {args.group!r} is inactive, "
            f"but it has {len(desc.members)} members (state {desc.state}); stop them first"
        )
    committed = admin.list_consumer_group_offsets(args.group)
    tps = _scope(admin, args, committed)
    earliest = {tp: r.offset for tp, r in admin.list_offsets({tp: admin.EARLIEST for tp in tps}).items()}
    latest = {tp: r.offset for tp, r in admin.list_offsets({tp: admin.LATEST for tp in tps}).items()}
    by_time = None
    if args.to_datetime is not None or args.by_duration is not None:
        when = args.to_datetime if args.to_datetime is not None else int(time.time() * 1000) - args.by_duration
        by_time = {tp: r.offset for tp, r in admin.list_offsets({tp: max(when, 0) for tp in tps}).items()}
    plan = plan_reset(
        tps,
        committed,
        earliest,
        latest,
        to_earliest=args.to_earliest,
        to_latest=args.to_latest,
        to_offset=args.to_offset,
        shift_by=args.shift_by,
        by_time=by_time,
    )
    if args.execute:
        admin.alter_consumer_group_offsets(args.group, plan)
    if args.json:
        print_json(
            [
                {"group": args.group, "topic": tp.topic, "partition": tp.partition, "new_offset": o}
                for tp, o in plan.items()
            ]
        )
    else:
        rows = [[args.group, tp.topic, tp.partition, off] for tp, off in plan.items()]
        print(table(rows, ["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"]))
    if not args.execute:
        err("dry run: nothing was changed (add --execute to commit these offsets)")


_DURATION = re.compile(r"P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?", re.IGNORECASE)


def duration_ms(text: str) -> int:
    """An ISO 8601 duration as Kafka's --by-duration takes it (``PT30M``, ``P1DT2H``, ``PT0.5S``), in ms."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or not any(m.groups()) or text.strip().upper().endswith("T"):
        raise argparse.ArgumentTypeError(f"expected an ISO 8601 duration such as PT30M or P1DT2H, got {text!r}")
    days, hours, minutes, seconds = (float(g) if g else 0.0 for g in m.groups())
    return int(((days * 24 + hours) * 60 + minutes) * 60_000 + seconds * 1000)


def datetime_ms(text: str) -> int:
    """``YYYY-MM-DDTHH:mm:SS[.sss][zone]`` in ms since the epoch; without a zone, local time (as Kafka's tool)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date and time such as 2026-11-28T09:30:00.000 (optionally +01:00 or Z), got {text!r}"
        ) from None
    if when.tzinfo is None:
        when = when.astimezone()  # local time
    return int(when.timestamp() * 1000)


# -- delete ---------------------------------------------------------------------------------------


def _delete(admin: Admin, args: argparse.Namespace) -> int:
    from sluice import errors

    failed = 0
    for group in args.groups:  # one by one: a group that cannot be deleted must not stop the others
        try:
            admin.delete_consumer_groups([group])
        except errors.GroupIdNotFoundError:
            err(f"error: consumer group {group!r} does not exist")
            failed += 1
        except errors.SluiceError as exc:
            err(f"error: consumer group {group!r} could not be deleted: {describe_error(exc)}")
            failed += 1
        else:
            err(f"deleted consumer group {group}")
    return 1 if failed else 0
