"""``sluice transactions list|describe|commit|abort``: kafka-transactions.sh.

``list`` asks every broker for the transactional ids its coordinators hold (filtered by state;
``--prepared`` is the state Prepared, the transactions waiting for an external coordinator's
decision; ``--duration-filter MS`` keeps those open for longer than MS, KIP-994, filtered by the
coordinators, which know when each transaction started).
``describe`` shows one id's state as its coordinator has it, one id at a time so an
unknown id is reported without hiding the others. ``commit``/``abort`` end a prepared
transaction with its handle (transactional id, producer id, epoch), from any client.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

from sluice.cli.argtypes import non_negative_int
from sluice.cli.bootstrap import connection
from sluice.cli.clients import open_admin, prepared_transaction
from sluice.cli.exits import describe_error
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
        x_end = x_sub.add_parser(
            action, parents=[client], help=f"{what} a prepared transaction with its handle (id, producer id, epoch)"
        )
        x_end.add_argument("transactional_id", metavar="ID", help="the prepared transaction's transactional id")
        x_end.add_argument(
            "--producer-id", type=int, required=True, help="its producer id (transactions describe shows it)"
        )
        x_end.add_argument(
            "--producer-epoch", type=int, required=True, help="its producer epoch (transactions describe shows it)"
        )


def run(args: argparse.Namespace) -> int:
    admin = open_admin(connection(args))
    try:
        if args.transactions_command == "list":
            _list(admin, args)
        elif args.transactions_command in ("commit", "abort"):
            _end_prepared(admin, args)
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
