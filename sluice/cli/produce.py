"""``sluice produce TOPIC``: kafka-console-producer.sh, one record per line of stdin.

Lines are values, or ``KEY<SEP>VALUE`` with ``--key-separator``. The producer is idempotent with
``acks=all`` (Kafka's default); ``--transactional-id`` sends all of stdin in one transaction, so
either every line becomes visible to read_committed consumers or none does (an error or Ctrl-C
aborts it, and the command says so). Sends are pipelined: at most 10,000 unacknowledged records
are kept, and the first failed one ends the command with its error.
"""

from __future__ import annotations

import argparse
import sys
from collections import deque
from typing import TYPE_CHECKING

from sluice.cli.argtypes import acks, compression, key_value, non_negative_int, separator
from sluice.cli.bootstrap import connection
from sluice.cli.clients import check_partition, open_producer
from sluice.cli.exits import CliError
from sluice.cli.output import close_quietly, err

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import FutureRecordMetadata

_MAX_PENDING = 10_000


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    produce = sub.add_parser(
        "produce", parents=[client], help="send stdin to a topic, one record per line (Ctrl-D ends)"
    )
    produce.add_argument("topic", help="an existing topic")
    produce.add_argument(
        "--key-separator", type=separator, metavar="SEP", help="lines are KEY<SEP>VALUE (e.g. ':' or '\\t')"
    )
    produce.add_argument(
        "--header", type=key_value, action="append", default=[], metavar="KEY=VALUE", help="added to every record"
    )
    produce.add_argument("--transactional-id", metavar="ID", help="send all of stdin in one transaction")
    produce.add_argument("--acks", type=acks, default="all", help="all (default), 1 or 0")
    produce.add_argument("--partition", type=non_negative_int, help="default: by key hash, else spread")
    produce.add_argument("--compression", type=compression, default=None, help="none, gzip, snappy, lz4 or zstd")
    produce.add_argument(
        "--linger-ms", type=non_negative_int, default=5, help="how long a batch waits for more records (default 5)"
    )
    produce.add_argument(
        "--producer-property",
        "--command-property",
        dest="producer_property",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any producer setting by Kafka's name (batch.size, delivery.timeout.ms, max.request.size ...), "
        "overriding the options above; repeatable",
    )


def split_line(line: bytes, sep: bytes | None, lineno: int) -> tuple[bytes | None, bytes]:
    """(key, value) of one input line: no key without a separator; a line without it is an error."""
    if sep is None:
        return None, line
    key, found, value = line.partition(sep)
    if not found:
        raise CliError(f"line {lineno} has no key separator {sep.decode()!r}: {line[:60]!r}")
    return key, value


def _acknowledged(future: FutureRecordMetadata) -> bool:
    return future.done() and future.exception(0) is None


def _before_the_error(acknowledged: int, sent: int, acks: str) -> str:
    """What the error left written: only records the brokers acknowledged count, not those handed to the producer."""
    if acks == "0":
        return f"{sent} record(s) were sent before the error, with acks=0: none is acknowledged, none known written"
    if acknowledged == 0:
        return "no record was written (acknowledged) before the error"
    return (
        f"{acknowledged} of {sent} record(s) were written (acknowledged) before the error; "
        f"{sent - acknowledged} were not acknowledged"
    )


def run(args: argparse.Namespace) -> int:
    conn = connection(args)
    check_partition(conn, args.topic, args.partition)
    producer = open_producer(
        conn,
        transactional_id=args.transactional_id,
        acks=args.acks,
        enable_idempotence=args.acks == "all",
        linger_ms=args.linger_ms,
        compression=args.compression,
        properties=args.producer_property,
    )
    headers = [(k, v.encode()) for k, v in args.header] or None
    sep = args.key_separator.encode() if args.key_separator else None
    pending: deque[FutureRecordMetadata] = deque()
    sent = 0
    acked = 0  # the records before pending[0], each acknowledged
    in_txn = False
    failed = False
    stdin = sys.stdin.buffer
    if sys.stdin.isatty():
        err(f"type records for {args.topic}, one per line; Ctrl-D to finish")

    def check_done(block: bool) -> None:
        nonlocal acked
        while pending and (block or pending[0].done()):
            pending[0].result()  # raises the record's error, if any (it stays unacknowledged)
            pending.popleft()
            acked += 1

    try:
        if args.transactional_id:
            producer.init_transactions()
            producer.begin_transaction()
            in_txn = True
        for lineno, raw in enumerate(stdin, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            key, value = split_line(line, sep, lineno)
            pending.append(producer.send(args.topic, value=value, key=key, partition=args.partition, headers=headers))
            sent += 1
            if len(pending) > _MAX_PENDING:
                check_done(block=False)
        producer.flush()
        check_done(block=True)
        if in_txn:
            producer.commit_transaction()
            in_txn = False
    except BaseException:
        failed = True
        if in_txn:
            try:
                producer.abort_transaction()
                err(f"transaction {args.transactional_id} aborted: none of the {sent} records is visible")
            except Exception as exc:
                err(f"aborting transaction {args.transactional_id} failed: {exc}")
        raise
    finally:
        close_quietly(producer)  # flushes: records still in flight get their answer first
        if failed and not args.transactional_id and sent:
            err(_before_the_error(acked + sum(1 for f in pending if _acknowledged(f)), sent, args.acks))
    how = f" in transaction {args.transactional_id}" if args.transactional_id else ""
    err(f"produced {sent} record(s) to {args.topic}{how}")
    return 0
