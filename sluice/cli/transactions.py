"""``sluice transactions list|describe|commit|abort|find-hanging``: kafka-transactions.sh.

``list`` asks every broker for the transactional ids its coordinators hold (filtered by state;
``--prepared`` is the state Prepared, the transactions waiting for an external coordinator's
decision; ``--duration-filter MS`` keeps those open for longer than MS, KIP-994, filtered by the
coordinators, which know when each transaction started).
``describe`` shows one id's state as its coordinator has it, one id at a time so an
unknown id is reported without hiding the others. ``commit``/``abort`` end a prepared
transaction with its handle (transactional id, producer id, epoch), from any client.

Hanging transactions, as kafka-transactions.sh finds and aborts them: ``find-hanging`` asks each
partition's leader for the producers with a transaction open there (DescribeProducers) and lists
those whose newest record is older than ``--max-transaction-timeout`` minutes (Kafka's default
15, its ``transaction.max.timeout.ms``) and that no coordinator lists as that producer's ongoing
transaction. ``abort --topic T --partition P --start-offset O`` writes an ABORT marker for the
transaction that starts at O (the broker refuses one that is not hanging).
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from sluice.cli.argtypes import non_negative_int
from sluice.cli.bootstrap import connection
from sluice.cli.clients import open_admin, prepared_transaction
from sluice.cli.exits import CliError, describe_error
from sluice.cli.output import close_quietly, err, print_json, table

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Admin, TransactionDescription


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    txns = sub.add_parser("transactions", help="list and describe transactional ids")
    x_sub = txns.add_subparsers(dest="transactions_command", metavar="ACTION", required=True)
    x_list = x_sub.add_parser("list", parents=[client], help="transactional ids and their state")
    x_list.add_argument("--state", action="append", default=[], help="only this state (repeatable)")
    x_list.add_argument(
        "--prepared", action="store_true", help="only prepared transactions, with the epoch that ends them"
    )
    x_list.add_argument(
        "--duration-filter",
        type=non_negative_int,
        default=0,
        metavar="MS",
        help="only transactions open for longer than MS milliseconds (KIP-994)",
    )
    x_list.add_argument("--json", action="store_true", help="as JSON")
    x_desc = x_sub.add_parser("describe", parents=[client], help="one transactional id in detail")
    x_desc.add_argument("transactional_ids", nargs="+", metavar="ID", help="one or more transactional ids")
    x_desc.add_argument("--json", action="store_true", help="as JSON")
    for action, what in (("commit", "commit"), ("abort", "abort")):
        hanging = " (or a hanging transaction: --topic, --partition, --start-offset)" if action == "abort" else ""
        x_end = x_sub.add_parser(
            action,
            parents=[client],
            help=f"{what} a prepared transaction with its handle (id, producer id, epoch){hanging}",
        )
        x_end.add_argument(
            "transactional_id", metavar="ID", nargs="?" if action == "abort" else None,
            help="the prepared transaction's transactional id",
        )  # fmt: skip
        x_end.add_argument("--producer-id", type=int, help="its producer id (transactions describe shows it)")
        x_end.add_argument("--producer-epoch", type=int, help="its producer epoch (transactions describe shows it)")
        if action == "abort":
            x_end.add_argument("--topic", help="a hanging transaction's topic (find-hanging shows it)")
            x_end.add_argument("--partition", type=non_negative_int, help="a hanging transaction's partition")
            x_end.add_argument(
                "--start-offset", type=non_negative_int, help="the first offset of the hanging transaction"
            )
    x_hang = x_sub.add_parser(
        "find-hanging", parents=[client], help="transactions left open on partitions that no coordinator will end"
    )
    x_hang.add_argument("--topic", help="look at this topic only (default: every topic)")
    x_hang.add_argument("--partition", type=non_negative_int, help="look at this partition of --topic only")
    x_hang.add_argument("--broker-id", type=int, help="look at the partitions this broker leads only")
    x_hang.add_argument(
        "--max-transaction-timeout",
        type=non_negative_int,
        default=15,
        metavar="MINUTES",
        help="a transaction is a candidate once its producer wrote nothing for this long (default 15: "
        "transaction.max.timeout.ms)",
    )
    x_hang.add_argument("--json", action="store_true", help="as JSON")


def run(args: argparse.Namespace) -> int:
    admin = open_admin(connection(args))
    try:
        if args.transactions_command == "list":
            _list(admin, args)
        elif args.transactions_command == "abort" and args.topic is not None:
            _abort_hanging(admin, args)
        elif args.transactions_command in ("commit", "abort"):
            _end_prepared(admin, args)
        elif args.transactions_command == "find-hanging":
            _find_hanging(admin, args)
        else:
            return _describe(admin, args)
    finally:
        close_quietly(admin)
    return 0


def _list(admin: Admin, args: argparse.Namespace) -> None:
    txns = admin.list_transactions(duration_filter_ms=args.duration_filter)
    states = [*args.state, *(["Prepared"] if args.prepared else [])]
    if states:
        wanted = {s.lower() for s in states}
        txns = [t for t in txns if t.state.lower() in wanted]
    if args.json:
        print_json(txns)
        return
    rows = [[t.transactional_id, t.producer_id, t.producer_epoch, t.state, t.coordinator_id] for t in txns]
    print(table(rows, ["TRANSACTIONAL_ID", "PRODUCER_ID", "EPOCH", "STATE", "COORDINATOR"]))


def _end_prepared(admin: Admin, args: argparse.Namespace) -> None:
    missing = [f for f in ("transactional_id", "producer_id", "producer_epoch") if getattr(args, f) is None]
    if missing:
        names = ", ".join("ID" if f == "transactional_id" else "--" + f.replace("_", "-") for f in missing)
        raise CliError(f"{args.transactions_command} a prepared transaction: give {names} (transactions describe)")
    handle = prepared_transaction(args.transactional_id, args.producer_id, args.producer_epoch)
    if args.transactions_command == "commit":
        admin.commit_prepared_transaction(handle)
    else:
        admin.abort_prepared_transaction(handle)
    verb = "committed" if args.transactions_command == "commit" else "aborted"
    print(
        f"{verb} the prepared transaction of {args.transactional_id} "
        f"(producer {args.producer_id} epoch {args.producer_epoch})"
    )


def _hanging(admin: Admin, args: argparse.Namespace) -> list[dict[str, int | str]]:
    """Kafka's find-hanging: open transactions idle past the timeout that no coordinator has as ongoing."""
    from sluice.client import TopicPartition

    names = [args.topic] if args.topic else admin.list_topics()
    partitions = []
    for topic in admin.describe_topics(names):
        for p in topic.partitions:
            if args.partition is not None and p.partition != args.partition:
                continue
            if args.broker_id is not None and p.leader != args.broker_id:
                continue
            partitions.append(TopicPartition(topic.name, p.partition))
    now = int(time.time() * 1000)
    idle_ms = args.max_transaction_timeout * 60_000
    candidates = [
        (tp, p)
        for tp, producers in admin.describe_producers(partitions).items()
        for p in producers
        if p.current_transaction_start_offset >= 0 and now - p.last_timestamp > idle_ms
    ]
    if not candidates:
        return []
    # a producer its coordinator lists as Ongoing with the partition in its transaction is slow, not hanging
    ongoing = {t.producer_id: t for t in admin.list_transactions(producer_ids={p.producer_id for _tp, p in candidates})}
    live: set[tuple[int, TopicPartition]] = set()
    for listed in ongoing.values():
        if listed.state.lower() != "ongoing":
            continue
        for d in admin.describe_transactions([listed.transactional_id]):
            live.update((d.producer_id, tp) for tp in d.partitions)
    return [
        {
            "topic": tp.topic, "partition": tp.partition, "producer_id": p.producer_id,
            "producer_epoch": p.producer_epoch, "coordinator_epoch": p.coordinator_epoch,
            "start_offset": p.current_transaction_start_offset, "last_timestamp": p.last_timestamp,
            "duration_minutes": (now - p.last_timestamp) // 60_000,
        }
        for tp, p in candidates
        if (p.producer_id, tp) not in live
    ]  # fmt: skip


def _find_hanging(admin: Admin, args: argparse.Namespace) -> None:
    if args.partition is not None and not args.topic:
        raise CliError("--partition goes with --topic")
    found = _hanging(admin, args)
    if args.json:
        print_json(found)
        return
    columns = ["topic", "partition", "producer_id", "producer_epoch", "coordinator_epoch", "start_offset"]
    rows = [[h[c] for c in columns] + [h["last_timestamp"], h["duration_minutes"]] for h in found]
    heads = ["TOPIC", "PARTITION", "PRODUCER_ID", "PRODUCER_EPOCH", "COORDINATOR_EPOCH", "START_OFFSET"]
    print(table(rows, [*heads, "LAST_TIMESTAMP", "DURATION(MIN)"]) if rows else "no hanging transactions found")


def _abort_hanging(admin: Admin, args: argparse.Namespace) -> None:
    from sluice.client import TopicPartition

    if args.transactional_id is not None or args.partition is None:
        raise CliError("abort a hanging transaction with --topic, --partition and --start-offset (no ID)")
    tp = TopicPartition(args.topic, args.partition)
    producers = admin.describe_producers([tp])[tp]
    if args.start_offset is not None:
        matching = [p for p in producers if p.current_transaction_start_offset == args.start_offset]
        if not matching:
            raise CliError(f"no transaction open on {tp.topic}-{tp.partition} starts at offset {args.start_offset}")
        producer = matching[0]
    elif args.producer_id is not None:
        matching = [p for p in producers if p.producer_id == args.producer_id]
        if not matching:
            raise CliError(f"producer {args.producer_id} has no state on {tp.topic}-{tp.partition}")
        producer = matching[0]
    else:
        raise CliError("give --start-offset (find-hanging shows it) or --producer-id")
    marker = admin.abort_transaction(tp, producer.producer_id, producer.producer_epoch, producer.coordinator_epoch)
    print(
        f"aborted the transaction of producer {producer.producer_id} (epoch {producer.producer_epoch}) on "
        f"{tp.topic}-{tp.partition} from offset {producer.current_transaction_start_offset}: ABORT marker at "
        f"offset {marker}"
    )


def _describe(admin: Admin, args: argparse.Namespace) -> int:
    from sluice import errors

    found: list[TransactionDescription] = []
    failed: list[dict[str, str]] = []
    for txn_id in args.transactional_ids:  # one by one: an unknown id must not hide the others
        try:
            found.extend(admin.describe_transactions([txn_id]))
        except errors.SluiceError as exc:
            failed.append({"transactional_id": txn_id, "error": describe_error(exc)})
    if args.json:
        print_json([*found, *failed])
    elif found:
        print("\n\n".join(render_transaction(s) for s in found))
    for f in failed:
        err(f"error: {f['transactional_id']}: {f['error']}")
    return 1 if failed else 0


def render_transaction(s: TransactionDescription) -> str:
    def when(ms: int) -> str:
        if ms < 0:
            return "-"
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f" ({ms})"

    names = ", ".join(f"{p.topic}-{p.partition}" for p in s.partitions) or "-"
    lines = [
        f"TransactionalId:      {s.transactional_id}",
        f"State:                {s.state}",
        f"ProducerId:           {s.producer_id}",
        f"ProducerEpoch:        {s.producer_epoch}",
        f"Coordinator:          {s.coordinator_id}",
        f"TransactionTimeoutMs: {s.transaction_timeout_ms}",
        f"TransactionStart:     {when(s.transaction_start_time_ms)}",
        f"LastUpdate:           {when(s.last_update_time_ms)}",
        f"Partitions:           {names}",
    ]
    return "\n".join(lines)
