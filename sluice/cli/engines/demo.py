"""``sluice demo``: exactly-once copy of a topic through transactions, verified.

On a fresh local cluster:

1. write ``records`` numbered records into ``demo-input`` (idempotent producer);
2. copy them to ``demo-output`` with Kafka's consume-transform-produce loop:
   a read_committed consumer in group ``demo-copier``, a transactional
   producer, the consumed offsets committed *inside* each transaction
   (``send_offsets_to_transaction``). Every ``abort_every``-th transaction
   is aborted on purpose after its records reached the log, and the consumer
   seeks back so the same records are copied again in the next transaction;
3. read ``demo-output`` back with a fresh read_committed consumer and check
   that every input record is there exactly once, that the group's committed
   offsets are the end of the input (a restart would copy nothing twice), and
   show what read_uncommitted sees: the aborted copies too.

Exit status 0 only if the output is exactly once.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from sluice.cli.engines.progress import Progress
from sluice.cli.engines.target import Target, client_kwargs, servers_of

if TYPE_CHECKING:
    from sluice.client import Admin, Consumer, ConsumerRecord, Producer, TopicPartition
    from sluice.testing import LocalCluster

INPUT = "demo-input"
OUTPUT = "demo-output"
GROUP = "demo-copier"
TRANSACTIONAL_ID = "demo-copier-1"
PREFIX = b"copied:"
COPIER_USER = "demo-copier"  # the copier's principal on a secure cluster (User:demo-copier)


class DemoError(RuntimeError):
    pass


@dataclass
class DemoReport:
    input_records: int = 0
    output_records: int = 0
    duplicates: int = 0
    lost: int = 0
    unexpected: int = 0
    committed_transactions: int = 0
    aborted_transactions: int = 0
    aborted_records: int = 0
    # the crashed copier's open transaction, aborted by the instance that fenced it (chaos)
    fenced_transactions: int = 0
    fenced_records: int = 0
    uncommitted_view_records: int = 0
    offsets_at_end: bool = False
    order_preserved: bool = True
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def exactly_once(self) -> bool:
        return (
            self.input_records > 0
            and self.output_records == self.input_records
            and self.duplicates == 0
            and self.lost == 0
            and self.unexpected == 0
            and self.offsets_at_end
        )

    def render(self) -> str:
        yes = {True: "yes", False: "NO"}
        lines = [
            "",
            "Sluice exactly-once demo: consume-transform-produce through transactions",
            f"  input records (demo-input)             {self.input_records:>8,}",
            f"  output records, read_committed         {self.output_records:>8,}",
            f"  duplicates                             {self.duplicates:>8,}",
            f"  lost                                   {self.lost:>8,}",
            f"  unexpected records                     {self.unexpected:>8,}",
            f"  transactions committed                 {self.committed_transactions:>8,}",
            f"  transactions aborted on purpose, redone{self.aborted_transactions:>8,}"
            f"  ({self.aborted_records:,} records written, then aborted)",
        ]
        if self.fenced_transactions:
            lines.append(
                f"  aborted by the copier that took over   {self.fenced_transactions:>8,}"
                f"  ({self.fenced_records:,} records written by the crashed one)"
            )
        aborted_copies = self.uncommitted_view_records - self.output_records
        lines += [
            f"  output records, read_uncommitted       {self.uncommitted_view_records:>8,}"
            f"  ({self.output_records:,} committed + {aborted_copies:,} aborted copies)",
            f"  group offsets committed at input end   {yes[self.offsets_at_end]:>8}",
            f"  order per key preserved                {yes[self.order_preserved]:>8}",
            f"  time                                   {self.seconds:>7.1f}s",
        ]
        lines += [f"  note: {n}" for n in self.notes]
        verdict = (
            "EXACTLY ONCE: every input record is in the output once" if self.exactly_once else ("NOT EXACTLY ONCE")
        )
        lines += ["", f"verdict: {verdict}", ""]
        return "\n".join(lines)


def _offset_of(value: int | None) -> int:
    """A committed offset, -1 where the group has none."""
    return -1 if value is None else value


def _record_id(value: bytes | None) -> int | None:
    if value is None or not value.startswith(PREFIX + b"record-"):
        return None
    try:
        return int(value[len(PREFIX) + len(b"record-") :])
    except ValueError:
        return None


def _read_all(
    bootstrap: Target,
    topic: str,
    partitions: int,
    isolation_level: str,
    deadline: float,
    progress: Progress | None = None,
) -> list[ConsumerRecord]:
    """Every record of ``topic`` up to its current end (LSO for read_committed), in offset order per partition."""
    from sluice.client import Consumer, TopicPartition

    consumer = Consumer(
        **client_kwargs(bootstrap),
        group_id=f"demo-verifier-{isolation_level}",
        isolation_level=isolation_level,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(tps)
        for tp, offset in consumer.beginning_offsets(tps).items():
            consumer.seek(tp, offset)
        ends: Mapping[TopicPartition, int] = consumer.end_offsets(tps)
        out: list[ConsumerRecord] = []
        while time.monotonic() < deadline:
            if all(consumer.position(tp) >= ends[tp] for tp in tps):
                return out
            out.extend(consumer.poll(timeout=0.5))
            if progress is not None:
                progress.update(len(out))
        raise DemoError(f"timed out reading {topic} ({isolation_level}) after {len(out)} records")
    finally:
        consumer.close()


def _produce_input(bootstrap: Target, records: int, deadline: float, progress: bool) -> None:
    from sluice.client import Producer

    producer = Producer(**client_kwargs(bootstrap), acks="all", enable_idempotence=True)
    bar = Progress("writing demo-input", records, enabled=progress)
    try:
        futures = []
        for i in range(records):
            futures.append(producer.send(INPUT, key=f"key-{i % 37}".encode(), value=f"record-{i:08d}".encode()))
            bar.update(i + 1)
        producer.flush()
        for fut in futures:
            fut.result(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        bar.close()
        producer.close()


@dataclass
class Chaos:
    """What the demo breaks while it copies (on a LocalCluster it started itself).

    At a third of the copy the leader-holding broker ``victim`` is killed with SIGKILL and
    restarted ``restart_after_s`` later; at two thirds the copier itself "crashes" in the middle
    of a transaction (its producer and consumer are dropped without ending it) and a new
    instance with the same transactional id takes over, fencing the old one and aborting what
    it left open. The verdict must still be exactly once.
    """

    cluster: LocalCluster
    victim: int = 0
    restart_after_s: float = 3.0
    broker_killed: bool = False
    copier_restarted: bool = False
    timers: list[threading.Timer] = field(default_factory=list)

    def kill_broker(self, report: DemoReport, note: Progress) -> None:
        self.broker_killed = True
        self.cluster.kill(self.victim)
        note.message(f"chaos: killed broker {self.victim} (SIGKILL); restarting it in {self.restart_after_s:.0f} s")
        report.notes.append(f"broker {self.victim} killed with SIGKILL and restarted while copying")
        timer = threading.Timer(self.restart_after_s, self.cluster.restart, args=(self.victim,))
        timer.daemon = True
        timer.start()
        self.timers.append(timer)

    def close(self) -> None:
        for timer in self.timers:
            timer.join(60)


def _new_copier(bootstrap: Target, txn_size: int) -> tuple[Consumer, Producer]:
    from sluice.client import Consumer, Producer

    consumer = Consumer(
        **client_kwargs(bootstrap),
        group_id=GROUP,
        isolation_level="read_committed",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_poll_records=txn_size,
    )
    producer = Producer(
        **client_kwargs(bootstrap), transactional_id=TRANSACTIONAL_ID, acks="all", enable_idempotence=True
    )
    consumer.subscribe([INPUT])
    producer.init_transactions()  # fences an older instance and aborts what it left open
    return consumer, producer


def _rewind(consumer: Consumer) -> None:
    """Back to the group's committed offsets: what an aborted transaction consumed is read again."""
    from sluice.client import TopicPartition

    tps = sorted(consumer.assignment())
    committed = consumer.committed(tps)
    for tp in tps:
        offset = _offset_of(committed.get(TopicPartition(tp.topic, tp.partition)))
        consumer.seek(tp, max(offset, 0))


def _copy(
    bootstrap: Target,
    records: int,
    txn_size: int,
    abort_every: int,
    deadline: float,
    report: DemoReport,
    progress: bool,
    chaos: Chaos | None = None,
) -> None:
    from sluice import errors
    from sluice.client import TopicPartition

    consumer, producer = _new_copier(bootstrap, txn_size)
    bar = Progress("copying exactly once", records, enabled=progress)
    copied = 0
    txn_no = 0
    try:
        while copied < records:
            if time.monotonic() > deadline:
                raise DemoError(f"timed out copying: {copied} of {records} records copied")
            if chaos is not None and not chaos.broker_killed and copied >= records // 3:
                chaos.kill_broker(report, bar)
            batch = consumer.poll(timeout=1.0)
            if not batch:
                continue
            txn_no += 1
            first: dict[TopicPartition, int] = {}
            after: dict[TopicPartition, int] = {}
            try:
                producer.begin_transaction()
                for r in batch:
                    tp = TopicPartition(r.topic, r.partition)
                    first.setdefault(tp, r.offset)
                    after[tp] = r.offset + 1
                    source = f"{r.topic}/{r.partition}/{r.offset}".encode()
                    producer.send(OUTPUT, key=r.key, value=PREFIX + (r.value or b""), headers=[("source", source)])
                if chaos is not None and not chaos.copier_restarted and copied >= 2 * records // 3:
                    # The copier "crashes" with its transaction open: nothing ends it but the next instance.
                    chaos.copier_restarted = True
                    producer.flush()
                    for obj in (producer, consumer):
                        with contextlib.suppress(Exception):
                            obj.close()
                    bar.message("chaos: the copier crashed mid-transaction; a new instance takes over")
                    report.notes.append("the copier was restarted in the middle of a transaction")
                    report.fenced_transactions += 1
                    report.fenced_records += len(batch)  # flushed: in the log, aborted by the next instance
                    consumer, producer = _new_copier(bootstrap, txn_size)
                    continue
                producer.send_offsets_to_transaction(after, consumer.group_metadata())
                if abort_every and txn_no % abort_every == 0:
                    producer.flush()  # the aborted copies really reach the log; read_committed must hide them
                    producer.abort_transaction()
                    report.aborted_transactions += 1
                    report.aborted_records += len(batch)
                    for tp, offset in first.items():
                        consumer.seek(tp, offset)  # copy the same records again in the next transaction
                else:
                    _commit(producer)
                    report.committed_transactions += 1
                    copied += len(batch)
            except errors.ProducerFencedError:  # a newer copier took over; a timed-out epoch is abortable
                raise
            except errors.SluiceError as exc:
                # a broker went away under us: abort, rewind to the committed offsets, go on
                report.notes.append(f"transaction {txn_no} aborted after {type(exc).__name__}; redone")
                with contextlib.suppress(errors.SluiceError):
                    producer.abort_transaction()
                _rewind(consumer)
            bar.update(copied, f"{report.committed_transactions} committed, {report.aborted_transactions} aborted")
    finally:
        bar.close()
        with contextlib.suppress(Exception):
            producer.close()
        with contextlib.suppress(Exception):
            consumer.close()


def _commit(producer: Producer, attempts: int = 5) -> None:
    """commit_transaction, retried after a timeout (Kafka allows calling it again)."""
    from sluice import errors

    for attempt in range(attempts):
        try:
            producer.commit_transaction()
            return
        except errors.KafkaTimeoutError:
            if attempt == attempts - 1:
                raise


def verify(
    bootstrap: Target, records: int, partitions: int, deadline: float, report: DemoReport, progress: bool = True
) -> None:
    """Fill the verification part of ``report`` from what is in the cluster."""
    from sluice.client import Consumer, TopicPartition

    bar = Progress("verifying demo-output", records, enabled=progress)
    try:
        committed = _read_all(bootstrap, OUTPUT, partitions, "read_committed", deadline, bar)
    finally:
        bar.close()
    ids = [_record_id(r.value) for r in committed]
    counts = Counter(i for i in ids if i is not None)
    report.output_records = len(committed)
    report.unexpected = sum(1 for i in ids if i is None or not 0 <= i < records)
    report.duplicates = sum(c - 1 for c in counts.values() if c > 1)
    report.lost = sum(1 for i in range(records) if i not in counts)
    last_by_key: dict[bytes | None, int] = {}
    for r in committed:  # per partition in offset order, and a key always maps to one partition
        i = _record_id(r.value)
        if i is None:
            continue
        if last_by_key.get(r.key, -1) > i:
            report.order_preserved = False
        last_by_key[r.key] = i
    report.uncommitted_view_records = len(_read_all(bootstrap, OUTPUT, partitions, "read_uncommitted", deadline))

    consumer = Consumer(
        **client_kwargs(bootstrap), group_id=GROUP, isolation_level="read_committed", enable_auto_commit=False
    )
    try:
        tps = [TopicPartition(INPUT, p) for p in range(partitions)]
        ends = consumer.end_offsets(tps)
        done = consumer.committed(tps)
        report.offsets_at_end = all(_offset_of(done.get(tp)) == ends[tp] for tp in tps)
        if not report.offsets_at_end:
            got = {str(tp): _offset_of(done.get(tp)) for tp in tps}
            report.notes.append(f"committed offsets {got}, input ends { {str(k): v for k, v in ends.items()} }")
    finally:
        consumer.close()


def run_demo(
    records: int = 2000,
    partitions: int = 3,
    txn_size: int = 100,
    abort_every: int = 4,
    brokers: int = 3,
    chaos: bool = True,
    data_dir: str | Path | None = None,
    timeout: float = 600.0,
    progress: bool = True,
    out: TextIO | None = None,
    bootstrap_servers: str | None = None,
    secure: bool = False,
) -> DemoReport:
    """Run the whole demo (on a fresh LocalCluster unless ``bootstrap_servers`` is given).

    ``secure``: the fresh cluster runs mutual TLS clients and the authorizer
    (``LocalCluster(secure=True)``); the super user ``User:admin`` creates the topics, writes the
    input and verifies, and the copier runs as ``User:demo-copier`` with exactly the ACLs a
    consume-transform-produce loop needs (:func:`grant_copier`).
    """
    if records < 1 or partitions < 1 or txn_size < 1:
        raise ValueError("records, partitions and txn_size must be >= 1")
    if abort_every == 1 or abort_every < 0:
        raise ValueError("abort_every must be 0 (never abort) or >= 2 (an aborted batch is redone next)")
    from sluice.client import Admin

    started = time.monotonic()
    deadline = started + timeout
    report = DemoReport(input_records=records)
    note = Progress("demo", enabled=progress)
    breaker: Chaos | None = None
    if secure and bootstrap_servers is not None:
        raise ValueError("secure runs a fresh secure LocalCluster: do not combine it with bootstrap_servers")
    with contextlib.ExitStack() as stack:
        main: Target
        copier: Target
        if bootstrap_servers is None:
            from sluice.testing import LocalCluster

            kind = "secure local cluster (mutual TLS, ACLs)" if secure else "local cluster"
            note.message(f"starting a {kind} of {brokers} broker(s)...")
            cluster = stack.enter_context(
                LocalCluster(brokers=brokers, data_dir=data_dir, failure_timeout_ms=2000, secure=secure)
            )
            main = cluster.client_config("admin") if secure else cluster.bootstrap_servers
            copier = cluster.client_config(COPIER_USER) if secure else cluster.bootstrap_servers
            note.message(f"cluster up at {cluster.bootstrap_servers} (data in {cluster.data_dir})")
            if chaos:
                breaker = Chaos(cluster, victim=brokers - 1)
                stack.callback(breaker.close)
        else:
            main = copier = bootstrap_servers
        admin = Admin(**client_kwargs(main))
        stack.callback(lambda: _close_quietly(admin))
        rf = min(brokers, 3)
        for topic in (INPUT, OUTPUT):
            admin.create_topic(topic, partitions=partitions, replication_factor=rf)
        if secure:
            grant_copier(admin)
            note.message(f"the copier runs as User:{COPIER_USER} with its ACLs ({servers_of(copier)})")
            report.notes.append(
                f"secure: mutual TLS, authorizer on; the copier ran as User:{COPIER_USER} with ACLs "
                f"Read {INPUT}, Read group {GROUP}, Write {OUTPUT}, Write transactional id {TRANSACTIONAL_ID} only"
            )
        _produce_input(main, records, deadline, progress)
        _copy(copier, records, txn_size, abort_every, deadline, report, progress, breaker)
        verify(main, records, partitions, deadline, report, progress)
    report.seconds = time.monotonic() - started
    if out is not None:
        out.write(report.render())
        out.flush()
    return report


def grant_copier(admin: Admin) -> None:
    """The ACLs of ``User:demo-copier``: what Kafka checks for a consume-transform-produce loop.

    Read on the input topic and on the group (Fetch, the group heartbeat, AddOffsetsToTxn,
    TxnOffsetCommit), Write on the output topic and on the transactional id (InitProducerId,
    Produce, AddPartitionsToTxn, EndTxn); Describe (Metadata, FindCoordinator) is implied.
    """
    from sluice.acls import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    principal = f"User:{COPIER_USER}"
    grants = [
        (ResourceType.TOPIC, INPUT, AclOperation.READ),
        (ResourceType.GROUP, GROUP, AclOperation.READ),
        (ResourceType.TOPIC, OUTPUT, AclOperation.WRITE),
        (ResourceType.TRANSACTIONAL_ID, TRANSACTIONAL_ID, AclOperation.WRITE),
    ]
    admin.create_acls(
        [
            AclBinding(rtype, name, ResourcePatternType.LITERAL, principal, "*", op, AclPermissionType.ALLOW)
            for rtype, name, op in grants
        ]
    )


def _close_quietly(admin: Admin) -> None:
    with contextlib.suppress(Exception):
        admin.close()
