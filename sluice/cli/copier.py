"""An exactly-once copier process: our version of Kafka's TransactionalMessageCopier.

``python -m sluice.cli.copier --bootstrap-server ... --input in --output out
--transactional-id copier-0 (--partition 0 | --group-mode) --group copiers
[--command-config client.properties]``

``--command-config`` takes the client security settings as every ``sluice`` client command does
(``security.protocol=SSL``, ``ssl.ca.location``, ``ssl.certificate.location``,
``ssl.key.location``: docs/cli.md), so the copier runs against a secure cluster as the
principal of its certificate; its consumer, producer and admin client all use them. A bad file
is refused before anything connects (exit 2, one line naming it).

Consume-transform-produce: a read_committed consumer reads the input, a
transactional producer writes each record to the output (same key and value),
and the consumed positions are committed inside the same transaction with
``send_offsets_to_transaction``. With ``--partition`` the copier owns one input
partition (assign(), offsets still kept by the group); with ``--group-mode``
the copiers share the group and its assignment.

It exits 0 once every record of its input (up to the end offsets seen at start:
the input is seeded before the copiers run) is committed, and non-zero when it
was fenced by a newer instance of its transactional id. Retriable and abortable
errors abort the transaction and restart from the committed offsets, so a
broker bounce costs a retry, never a duplicate. Progress goes to stderr as one
JSON line per commit, which is what the tests read.

Why it is in the package, beside the commands, and not in tests/: it is a
program people run, not a test helper. manifests/examples/copier-job.yaml runs
it from the Sluice image, which holds the installed package and no tests/; the
integration and Kubernetes tests run the same program. Kafka ships its
TransactionalMessageCopier the same way, in its tools, beside the console
producer and consumer. It is not a ``sluice`` sub-command: it is an example
application of the client, and the command list stays Kafka's tools.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from sluice import errors
from sluice.cli.exits import CliError
from sluice.cli.security import read_command_config
from sluice.client import Admin, Consumer, Producer, TopicPartition

FENCED_EXIT = 3


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m sluice.cli.copier", description=__doc__.splitlines()[0])
    p.add_argument("--bootstrap-server", required=True)
    p.add_argument("--input", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--transactional-id", required=True)
    p.add_argument("--group", required=True)
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--partition", type=int, help="copy this input partition only (assign)")
    mode.add_argument("--group-mode", action="store_true", help="share the input with the group (subscribe)")
    p.add_argument("--transaction-size", type=int, default=750)
    p.add_argument("--transaction-timeout-ms", type=int, default=20_000)
    p.add_argument("--max-seconds", type=float, default=600.0, help="give up (exit 2) after this long")
    p.add_argument(
        "--command-config",
        metavar="FILE",
        help="client security settings (security.protocol=SSL, ssl.ca.location, ssl.certificate.location, "
        "ssl.key.location), as the sluice commands take",
    )
    return p.parse_args(argv)


def log(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, "t": round(time.time(), 3), **fields}), file=sys.stderr, flush=True)


def committed_offsets(consumer: Consumer, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
    found = consumer.committed(tps)
    return {tp: (found.get(tp) or 0) for tp in tps}


def run(args: argparse.Namespace) -> int:
    deadline = time.monotonic() + args.max_seconds
    security = read_command_config(args.command_config).kwargs() if args.command_config else {}
    consumer = Consumer(
        **security,
        bootstrap_servers=args.bootstrap_server,
        group_id=args.group,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=args.transaction_size,
    )
    producer = Producer(
        **security,
        bootstrap_servers=args.bootstrap_server,
        transactional_id=args.transactional_id,
        transaction_timeout_ms=args.transaction_timeout_ms,
        linger_ms=5,
    )
    producer.init_transactions()
    all_input = [TopicPartition(args.input, p) for p in range(_partitions(args.bootstrap_server, args.input, security))]
    ends = consumer.end_offsets(all_input)
    if args.group_mode:
        consumer.subscribe([args.input])
        mine = all_input
    else:
        mine = [TopicPartition(args.input, args.partition)]
        consumer.assign(mine)
    log("started", transactional_id=args.transactional_id, ends={str(tp.partition): ends[tp] for tp in mine})
    copied = 0
    try:
        while time.monotonic() < deadline:
            done = committed_offsets(consumer, mine)
            if all(done[tp] >= ends[tp] for tp in mine):
                log("done", copied=copied)
                return 0
            records = consumer.poll(timeout=0.5)
            if not records:
                continue
            try:
                producer.begin_transaction()
                for r in records:
                    producer.send(args.output, key=r.key, value=r.value)
                positions = {tp: consumer.position(tp) for tp in consumer.assignment()}
                producer.send_offsets_to_transaction(positions, consumer.group_metadata())
                _commit(producer)
                copied += len(records)
                log(
                    "committed",
                    records=len(records),
                    copied=copied,
                    positions={f"{tp.topic}-{tp.partition}": off for tp, off in sorted(positions.items())},
                )
            except errors.ProducerFencedError as exc:
                # Only a newer instance of our transactional id ends us. A stale member epoch
                # (FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID) means the group moved on, and a stale
                # producer epoch (INVALID_PRODUCER_EPOCH: the coordinator timed our transaction
                # out, transaction protocol v2) is abortable: abort, rejoin, redo.
                log("fenced", error=type(exc).__name__, message=str(exc))
                return FENCED_EXIT
            except errors.SluiceError as exc:
                log("aborting", error=type(exc).__name__, message=str(exc))
                try:
                    _abort_and_rewind(producer, consumer)
                except errors.ProducerFencedError as fenced:
                    log("fenced", error=type(fenced).__name__, message=str(fenced))
                    return FENCED_EXIT
    finally:
        for closer in (producer.close, consumer.close):
            try:
                closer()
            except Exception as exc:  # the process is ending either way; say why closing failed
                log("close-failed", error=type(exc).__name__)
    log("timed-out", copied=copied)
    return 2


def _commit(producer: Producer, attempts: int = 5) -> None:
    """commit_transaction, retried on a timeout: Kafka lets the same commit be called again, and
    once EndTxn was sent the only way out is to finish it (an abort is no longer legal)."""
    for attempt in range(attempts):
        try:
            producer.commit_transaction()
            return
        except errors.KafkaTimeoutError as exc:
            log("commit-retry", attempt=attempt, message=str(exc))
            if attempt == attempts - 1:
                raise


def _abort_and_rewind(producer: Producer, consumer: Consumer, attempts: int = 5) -> None:
    """abort_transaction, retried on a timeout (as a commit is: the same abort may be called again),
    then back to the committed offsets."""
    for attempt in range(attempts):
        try:
            producer.abort_transaction()
            break
        except errors.ProducerFencedError:
            raise
        except errors.KafkaTimeoutError as exc:
            log("abort-retry", attempt=attempt, message=str(exc))
        except errors.SluiceError as exc:
            log("abort-failed", error=type(exc).__name__, message=str(exc))
            break
    tps = sorted(consumer.assignment())
    for tp, offset in committed_offsets(consumer, tps).items():
        consumer.seek(tp, offset)


def _partitions(bootstrap: str, topic: str, security: dict[str, Any]) -> int:
    admin = Admin(bootstrap_servers=bootstrap, **security)
    try:
        return len(admin.describe_topic(topic).partitions)
    finally:
        admin.close()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command_config:
            read_command_config(args.command_config)  # refused before anything connects
        return run(args)
    except CliError as exc:  # a bad --command-config: one line, usage exit status
        print(f"copier: {exc}", file=sys.stderr)
        return exc.code


if __name__ == "__main__":
    sys.exit(main())
