"""``sluice consume TOPIC``: kafka-console-consumer.sh, records to stdout.

read_committed by default (Sluice's default, unlike Kafka's): aborted and still open
transactions are never printed. Without ``--group`` the consumer joins a throw-away group and
commits nothing; with ``--group`` it commits what it printed when it exits, Ctrl-C included
(not with ``--no-commit``). ``--partition`` reads one partition outside any group, from ``--offset``.
The command ends after ``--max-messages`` records, after ``--timeout`` seconds without a record,
or on Ctrl-C (exit code 130), and reports the count on stderr.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from types import FrameType
from typing import TYPE_CHECKING, Any

from sluice.cli.argtypes import ISOLATION_LEVELS, key_value, non_negative_int, positive_float, positive_int, separator
from sluice.cli.bootstrap import connection
from sluice.cli.clients import check_partition, open_consumer, topic_partition
from sluice.cli.exits import INTERRUPTED, SUCCESS, USAGE, CliError
from sluice.cli.output import close_quietly, err

if TYPE_CHECKING:
    from sluice.cli.parser import Subcommands
    from sluice.client import Consumer, ConsumerRecord, TopicPartition


def register(sub: Subcommands, client: argparse.ArgumentParser) -> None:
    consume = sub.add_parser("consume", parents=[client], help="print a topic's records to stdout")
    consume.add_argument("topic", help="an existing topic")
    consume.add_argument("--from-beginning", action="store_true", help="start at the oldest record")
    consume.add_argument(
        "--isolation-level",
        choices=ISOLATION_LEVELS,
        default="read_committed",
        help="read_committed (default: Sluice's default, unlike Kafka) or read_uncommitted",
    )
    consume.add_argument("--max-messages", type=positive_int, help="exit after this many records")
    timeout = consume.add_mutually_exclusive_group()
    timeout.add_argument(
        "--timeout", type=positive_float, metavar="SECONDS", help="exit when no record arrives for this long"
    )
    timeout.add_argument("--timeout-ms", type=positive_int, metavar="MS", help="--timeout in milliseconds (Kafka's)")
    consume.add_argument("--group", help="consumer group (committed at exit; default: a throw-away group)")
    consume.add_argument("--no-commit", action="store_true", help="with --group: do not commit offsets")
    consume.add_argument("--partition", type=non_negative_int, help="read only this partition (no group)")
    consume.add_argument("--offset", help="with --partition: an offset, 'earliest' or 'latest'")
    consume.add_argument("--print-key", action="store_true", help="print the key before the value (null: null)")
    consume.add_argument("--print-headers", action="store_true", help="print the headers as k=v,k=v (or NO_HEADERS)")
    consume.add_argument("--print-offset", action="store_true", help="print partition and offset")
    consume.add_argument("--print-timestamp", action="store_true", help="print CreateTime:MS")
    consume.add_argument("--separator", type=separator, default="\t", help="between printed fields (default tab)")
    consume.add_argument(
        "--consumer-property",
        "--command-property",
        dest="consumer_property",
        type=key_value,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="any consumer setting by Kafka's name (max.poll.records, fetch.max.wait.ms, session.timeout.ms ...), "
        "overriding the options above; repeatable",
    )


def format_record(rec: ConsumerRecord, args: argparse.Namespace) -> bytes:
    """One output line: the fields the --print-* options ask for, then the value, ``--separator`` apart."""
    sep: bytes = args.separator.encode()
    fields: list[bytes] = []
    if args.print_timestamp:
        fields.append(f"CreateTime:{rec.timestamp}".encode())
    if args.print_offset:
        fields.append(f"{rec.partition}:{rec.offset}".encode())
    if args.print_headers:
        hdrs = rec.headers or []
        fields.append(b",".join(k.encode() + b"=" + (v or b"") for k, v in hdrs) if hdrs else b"NO_HEADERS")
    if args.print_key:
        fields.append(b"null" if rec.key is None else rec.key)
    fields.append(b"null" if rec.value is None else bytes(rec.value))
    return sep.join(fields) + b"\n"


def run(args: argparse.Namespace) -> int:
    if args.offset is not None and args.partition is None:
        raise CliError("--offset needs --partition", USAGE)
    if args.partition is not None and args.group:
        raise CliError("--partition reads outside any group: do not combine it with --group", USAGE)
    if args.timeout_ms is not None:
        args.timeout = args.timeout_ms / 1000.0
    conn = connection(args)
    check_partition(conn, args.topic, args.partition)
    consumer = open_consumer(
        conn,
        group_id=args.group or f"sluice-console-{uuid.uuid4().hex[:12]}",
        isolation_level=args.isolation_level,
        auto_offset_reset="earliest" if args.from_beginning else "latest",
        enable_auto_commit=False,
        properties=args.consumer_property,
    )
    printed = _Printed()
    stop = _StopOnCtrlC()
    try:
        with stop:
            if args.partition is not None:
                _assign_one_partition(consumer, args)
            else:
                consumer.subscribe([args.topic])
            _print_records(consumer, args, printed, stop)
            if args.group and not args.no_commit:
                offsets = _offsets_to_commit(consumer, printed)
                if offsets:
                    consumer.commit(offsets)
    finally:
        close_quietly(consumer)
        err(f"processed a total of {printed.count} messages")
    return INTERRUPTED if stop.requested else SUCCESS


def _offsets_to_commit(consumer: Consumer, printed: _Printed) -> dict[TopicPartition, int]:
    """Where the group's next run starts, for every partition this run was assigned, as Kafka's
    console consumer commits on close: after the last record printed; where nothing was printed,
    the position the consumer resolved (the end, without --from-beginning), so records produced
    between two runs are read by the next one instead of skipped by its own reset to the end."""
    from sluice.errors import SluiceError  # here: the CLI starts without loading the client's modules

    offsets = dict(printed.next_offsets)  # what was printed, not the position: a poll may return more
    for tp in consumer.assignment():
        if tp not in offsets:
            try:
                offsets[tp] = consumer.position(tp, timeout=5.0)
            except SluiceError as exc:
                err(f"no position to commit for {tp.topic}-{tp.partition}: {exc}")
    return offsets


class _StopOnCtrlC:
    """Ctrl-C (SIGINT), the usual end of this command, as a request: the loop stops at its next poll.

    A KeyboardInterrupt raised inside the consumer (a gRPC call in flight) can leave its channel
    unable to close, and one raised between printing a record and counting it would leave that
    record out of the commit. So the first Ctrl-C only sets ``requested``; the records at hand are
    printed and committed, and the command exits 130. A second Ctrl-C interrupts at once.
    """

    def __init__(self) -> None:
        self.requested = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __enter__(self) -> _StopOnCtrlC:
        if threading.current_thread() is threading.main_thread():  # handlers belong to the main thread
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


def _assign_one_partition(consumer: Consumer, args: argparse.Namespace) -> None:
    tp = topic_partition(args.topic, args.partition)
    consumer.assign([tp])
    where = args.offset or ("earliest" if args.from_beginning else "latest")
    if where == "earliest":
        consumer.seek(tp, consumer.beginning_offsets([tp])[tp])
    elif where == "latest":
        consumer.seek(tp, consumer.end_offsets([tp])[tp])
    else:
        try:
            consumer.seek(tp, int(where))
        except ValueError:
            raise CliError(f"--offset must be an integer, 'earliest' or 'latest', got {where!r}", USAGE) from None


@dataclass
class _Printed:
    """The records printed so far: the summary line reports it however the command ends."""

    count: int = 0
    next_offsets: dict[TopicPartition, int] = field(default_factory=dict)  # per partition, the offset after the last


def _print_records(consumer: Consumer, args: argparse.Namespace, printed: _Printed, stop: _StopOnCtrlC) -> None:
    """Poll and print until --max-messages, --timeout seconds without a record, or Ctrl-C."""
    out = sys.stdout.buffer
    last_record = time.monotonic()
    while not stop.requested and (args.max_messages is None or printed.count < args.max_messages):
        wait = 1.0
        if args.timeout is not None:
            left = args.timeout - (time.monotonic() - last_record)
            if left <= 0:
                break
            wait = min(wait, left)
        records = consumer.poll(timeout=wait)
        if records:
            last_record = time.monotonic()
        for i, rec in enumerate(records):
            out.write(format_record(rec, args))
            printed.count += 1
            printed.next_offsets[rec.topic_partition] = rec.offset + 1
            if args.max_messages is not None and printed.count >= args.max_messages:
                for left in records[i + 1 :]:  # returned, not printed: the group's next run starts there
                    printed.next_offsets.setdefault(left.topic_partition, left.offset)
                break
        out.flush()
