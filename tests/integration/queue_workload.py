"""The queue workload and its checker: what the fault tests run under kill, pause and partition.

A transactional producer appends numbered values to a topic of three partitions, some
transactions aborted on purpose, while a read_committed consumer reads it live; the test injects
faults meanwhile; at the end the whole topic is read again and :func:`check` returns a
:class:`Verdict`. The properties, Jepsen's queue checker's as they apply to a transactional log:

- every value of a transaction whose commit was acknowledged is read exactly once (``lost``,
  ``duplicated``), by the final read and never twice by the live reader;
- nothing of an aborted transaction is visible (``aborted_visible``), to either reader;
- a transaction whose outcome the producer never learned is all or nothing (``partial``);
- per partition, values appear in the order they were sent (``out_of_order``: each value carries
  its partition's send sequence), for both readers;
- nothing read live as committed is missing from the final read (``vanished``);
- offsets never go back: the live reader's offsets increase per partition, and the
  :class:`~tests.integration.helpers.OffsetMonitor`'s HW and LSO samples never regress
  (``offset_regressions``).

Values are ``p<partition>:<sequence>:t<transaction>``, or ``w<worker>:p<partition>:<sequence>:t<transaction>``
with several workers. Every loop is bounded in count and time.

Several workers and the impatient profile (issue 30): :func:`workers` starts N
:class:`QueueProducer` threads, each with its own transactional id, doing transactions of 1 to 12
records spread at random over the partitions, ~70% committed and the rest aborted on purpose,
with the client timeouts of :data:`IMPATIENT` (short request, delivery and blocking timeouts): a
``commit_transaction(timeout=5)`` that raises a retriable error is called again (up to
``commit_retries`` more times); otherwise the transaction is aborted, and if that fails too the
producer is closed and a new one with the same transactional id is created (its
``init_transactions`` ends the old transaction). Each transaction's outcome is recorded: committed
(``commit_transaction`` returned), aborted on purpose (or before its commit was asked), unknown
(``commit_transaction`` was called and we gave up). :func:`check` takes one producer or several;
the order property is then per worker and partition (each worker numbers its own values).
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice import errors
from sluice.client import Consumer, Producer, TopicPartition

PARTITIONS = 3
PER_PARTITION = 2  # values per partition per transaction
ABORT_EVERY = 5  # every 5th transaction is aborted on purpose


# The impatient client of issue 30's probe: short timeouts, so faults end transactions in errors and
# the application's retry and abort paths run (Producer keyword arguments).
IMPATIENT: dict[str, int] = {
    "request_timeout_ms": 2_000,
    "delivery_timeout_ms": 6_000,
    "max_block_ms": 6_000,
    "transaction_timeout_ms": 20_000,
}
PATIENT: dict[str, int] = {"delivery_timeout_ms": 20_000, "request_timeout_ms": 5_000}


def parse(value: bytes) -> tuple[int, int, int]:
    """(partition, sequence, transaction) of a workload value."""
    p, seq, txn = value.decode().split(":")[-3:]
    return int(p[1:]), int(seq), int(txn[1:])


def worker_of(value: bytes) -> int:
    """The worker that sent a value (0 for the one-producer format)."""
    head = value.decode().split(":")[0]
    return int(head[1:]) if head.startswith("w") else 0


@dataclass
class TxnRecord:
    """What one worker did for one transaction, for the soak's report of an anomaly."""

    worker: int
    txn: int
    outcome: str  # committed | aborted | unknown
    values: list[bytes]
    started: float  # time.time()
    ended: float
    commit_attempts: int = 0
    errors: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "txn": self.txn,
            "outcome": self.outcome,
            "first": self.values[0].decode(),
            "last": self.values[-1].decode(),
            "records": len(self.values),
            "started": self.started,
            "ended": self.ended,
            "commit_attempts": self.commit_attempts,
            "errors": self.errors,
        }


class QueueProducer(threading.Thread):
    """Transactions of PARTITIONS * PER_PARTITION values until stopped; remembers every outcome."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        *,
        max_txns: int = 5000,
        max_seconds: float = 300.0,
        worker: int | None = None,
        seed: int = 0,
        profile: dict[str, int] | None = None,
        random_size: bool = False,
        commit_ratio: float = 1 - 1 / ABORT_EVERY,
        commit_timeout: float = 30.0,
        commit_retries: int = 0,
    ) -> None:
        """One transactional worker. The defaults are the original single producer (six values a
        transaction, every 5th aborted, patient timeouts); ``worker`` (its own transactional id
        and value prefix), ``random_size`` (1-12 records over the partitions, ``commit_ratio``
        committed, drawn from ``seed``), ``profile`` and ``commit_retries`` make the issue 30 worker."""
        super().__init__(daemon=True, name=f"queue-producer-{worker or 0}")
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_txns = max_txns
        self.max_seconds = max_seconds
        self.worker = worker
        self.transactional_id = "queue-tx" if worker is None else f"queue-tx-{worker}"
        self.rng = random.Random(f"{seed}-{worker}")
        self.profile = dict(PATIENT if profile is None else profile)
        self.random_size = random_size
        self.commit_ratio = commit_ratio
        self.commit_timeout = commit_timeout
        self.commit_retries = commit_retries
        self.history: list[TxnRecord] = []
        self.committed: list[list[bytes]] = []
        self.aborted: list[list[bytes]] = []
        self.unknown: list[list[bytes]] = []
        self.errors: Counter[str] = Counter()
        self.restarts = 0
        self.stop_event = threading.Event()
        self._seq = [0] * PARTITIONS
        self._producer: Producer | None = None

    def _new_producer(self) -> Producer | None:
        """A producer with the workload's transactional id (fencing the last one); None if none could start."""
        for _ in range(30):
            if self.stop_event.is_set():
                return None
            try:
                producer = Producer(
                    bootstrap_servers=self.bootstrap,
                    transactional_id=self.transactional_id,
                    linger_ms=2,
                    **self.profile,  # type: ignore[arg-type]
                )
                producer.init_transactions(timeout=30)
                return producer
            except errors.SluiceError as exc:
                self.errors[type(exc).__name__] += 1
                time.sleep(0.5)
        return None

    def _values(self, txn: int) -> tuple[list[tuple[int, bytes]], bool]:
        """The (partition, value) pairs of transaction ``txn`` and whether it is to be aborted."""
        if self.random_size:
            partitions = [self.rng.randrange(PARTITIONS) for _ in range(self.rng.randint(1, 12))]
            abort = self.rng.random() >= self.commit_ratio
        else:
            partitions = [p for p in range(PARTITIONS) for _ in range(PER_PARTITION)]
            abort = txn % ABORT_EVERY == ABORT_EVERY - 1
        prefix = b"" if self.worker is None else b"w%d:" % self.worker
        values = []
        for p in partitions:
            values.append((p, prefix + b"p%d:%06d:t%d" % (p, self._seq[p], txn)))
            self._seq[p] += 1
        return values, abort

    def _commit(self, producer: Producer, record: TxnRecord) -> None:
        """commit_transaction, called again after a retriable error up to ``commit_retries`` times."""
        for attempt in range(self.commit_retries + 1):
            record.commit_attempts += 1
            try:
                producer.commit_transaction(timeout=self.commit_timeout)
                return
            except errors.SluiceError as exc:
                if not exc.retriable or attempt == self.commit_retries:
                    raise
                record.errors.append(f"commit: {type(exc).__name__}: {exc}"[:300])
                self.errors[type(exc).__name__] += 1

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        producer = self._new_producer()
        for txn in range(self.max_txns):
            if producer is None or self.stop_event.is_set() or time.monotonic() > deadline:
                break
            values, abort = self._values(txn)
            record = TxnRecord(self.worker or 0, txn, "", [v for _p, v in values], time.time(), 0.0)
            committing = False
            try:
                producer.begin_transaction()
                for p, v in values:
                    producer.send(self.topic, value=v, partition=p)
                if abort:
                    producer.abort_transaction(timeout=30 if self.commit_retries == 0 else self.commit_timeout)
                else:
                    committing = True
                    self._commit(producer, record)
                record.outcome = "aborted" if abort else "committed"
            except errors.SluiceError as exc:
                self.errors[type(exc).__name__] += 1
                record.errors.append(f"{type(exc).__name__}: {exc}"[:300])
                # never asked to commit: it cannot become visible; else nobody knows yet
                record.outcome = "unknown" if committing else "aborted"
                if not self._abandon(producer):
                    producer = self._fresh(producer)
            record.ended = time.time()
            self.history.append(record)
            {"committed": self.committed, "aborted": self.aborted, "unknown": self.unknown}[record.outcome].append(
                record.values
            )
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=10)

    def _abandon(self, producer: Producer) -> bool:
        """After an error: abort the transaction and keep the producer (the issue 30 worker); False if
        the producer must be replaced (always so for the original producer, which does not try)."""
        if self.commit_retries == 0 and not self.random_size:
            return False
        try:
            producer.abort_transaction(timeout=self.commit_timeout)
            return True
        except errors.SluiceError as exc:
            self.errors[f"abort: {type(exc).__name__}"] += 1
            return False

    def _fresh(self, producer: Producer) -> Producer | None:
        """Close ``producer`` and make a new one with the same transactional id (it ends the old transaction)."""
        with contextlib.suppress(Exception):
            producer.close(timeout=5)
        self.restarts += 1
        return self._new_producer()

    def stop(self, timeout: float = 120.0) -> None:
        self.stop_event.set()
        self.join(timeout)
        assert not self.is_alive(), "the queue producer did not stop"


class LiveReader(threading.Thread):
    """A read_committed consumer of every partition, reading while the faults happen."""

    def __init__(self, bootstrap: str, topic: str, *, max_polls: int = 20_000) -> None:
        super().__init__(daemon=True, name="queue-reader")
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_polls = max_polls
        self.records: list[tuple[int, int, bytes]] = []  # (partition, offset, value)
        self.error: BaseException | None = None
        self.stop_event = threading.Event()

    def run(self) -> None:
        try:
            consumer = Consumer(
                bootstrap_servers=self.bootstrap, group_id=None, isolation_level="read_committed",
                request_timeout_ms=5_000,
            )  # fmt: skip
            consumer.assign([TopicPartition(self.topic, p) for p in range(PARTITIONS)])
            for _ in range(self.max_polls):
                if self.stop_event.is_set():
                    break
                for r in consumer.poll(timeout=0.5):
                    if r.value is not None:
                        self.records.append((r.partition, r.offset, r.value))
            consumer.close()
        except BaseException as exc:  # reported by the checker
            self.error = exc

    def stop(self, timeout: float = 60.0) -> None:
        self.stop_event.set()
        self.join(timeout)


@dataclass
class Verdict:
    committed: int
    aborted: int
    unknown: int
    unknown_visible: int
    read: int
    live_read: int
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    aborted_visible: list[str] = field(default_factory=list)
    partial: list[str] = field(default_factory=list)
    out_of_order: list[str] = field(default_factory=list)
    vanished: list[str] = field(default_factory=list)  # read live as committed, absent from the final read
    offset_regressions: list[str] = field(default_factory=list)
    reader_error: str = ""

    @property
    def anomalies(self) -> dict[str, list[str]]:
        found = {
            "lost": self.lost,
            "duplicated": self.duplicated,
            "aborted_visible": self.aborted_visible,
            "partial": self.partial,
            "out_of_order": self.out_of_order,
            "vanished": self.vanished,
            "offset_regressions": self.offset_regressions,
        }
        if self.reader_error:
            found["reader_error"] = [self.reader_error]
        return {k: v for k, v in found.items() if v}

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def summary(self, fault: str) -> str:
        head = (
            f"queue checker [{fault}]: {'VALID' if self.valid else 'INVALID'}: "
            f"{self.committed} committed, {self.aborted} aborted, {self.unknown} unknown "
            f"({self.unknown_visible} of them visible) transactions; {self.read} values read at the end, "
            f"{self.live_read} read live"
        )
        lines = [head] + [f"  {name}: {len(items)}: {items[:5]}" for name, items in self.anomalies.items()]
        return "\n".join(lines)


def _order(records: list[tuple[int, int, bytes]], who: str) -> list[str]:
    """Per partition, in offset order: offsets increase, each worker's sequences increase, values are on
    their partition."""
    bad = []
    last_offset: dict[int, int] = {}
    last_seq: dict[tuple[int, int], tuple[int, int]] = {}
    for partition, offset, value in records:
        p, seq, _txn = parse(value)
        if p != partition:
            bad.append(f"{who}: {value!r} read from partition {partition}")
        prev_offset = last_offset.get(partition)
        if prev_offset is not None and offset <= prev_offset:
            bad.append(f"{who}: partition {partition} offset {prev_offset} then offset {offset}")
        key = (partition, worker_of(value))
        prev = last_seq.get(key)
        if prev is not None and seq <= prev[1]:
            bad.append(f"{who}: partition {partition} offset {prev[0]} seq {prev[1]} then offset {offset} seq {seq}")
        last_offset[partition] = offset
        last_seq[key] = (offset, seq)
    return bad


class _Outcomes:
    """The committed, aborted and unknown transactions of several producers, as one producer's lists."""

    def __init__(self, producers: Sequence[QueueProducer]) -> None:
        self.committed = [t for p in producers for t in p.committed]
        self.aborted = [t for p in producers for t in p.aborted]
        self.unknown = [t for p in producers for t in p.unknown]


def check(
    producer: QueueProducer | Sequence[QueueProducer],
    final: list[tuple[int, int, bytes | None, bytes | None]],
    live: LiveReader,
    offset_regressions: list[str],
) -> Verdict:
    """The verdict over what the producer(s) know, the final read (read_topic's rows) and the live read."""
    outcomes = _Outcomes([producer] if isinstance(producer, QueueProducer) else producer)
    final_records = sorted((p, o, v) for p, o, _k, v in final if v is not None)
    counts = Counter(v for _p, _o, v in final_records)
    live_counts = Counter(v for _p, _o, v in live.records)
    verdict = Verdict(
        committed=len(outcomes.committed),
        aborted=len(outcomes.aborted),
        unknown=len(outcomes.unknown),
        unknown_visible=0,
        read=len(final_records),
        live_read=len(live.records),
        offset_regressions=list(offset_regressions),
        reader_error=repr(live.error) if live.error else "",
    )
    for txn in outcomes.committed:
        verdict.lost += [v.decode() for v in txn if counts[v] == 0]
    verdict.duplicated += [f"{v.decode()} x{n} (final)" for v, n in counts.items() if n > 1]
    verdict.duplicated += [f"{v.decode()} x{n} (live)" for v, n in live_counts.items() if n > 1]
    for txn in outcomes.aborted:
        verdict.aborted_visible += [v.decode() for v in txn if counts[v] or live_counts[v]]
    for txn in outcomes.unknown:
        seen = [counts[v] > 0 for v in txn]
        if any(seen):
            verdict.unknown_visible += 1
        if any(seen) and not all(seen):
            verdict.partial.append(f"transaction of {txn[0].decode()}: {sum(seen)} of {len(txn)} visible")
    verdict.vanished += [f"{v.decode()} (read live)" for v in live_counts if not counts[v]]
    known = {v for txn in outcomes.committed + outcomes.aborted + outcomes.unknown for v in txn}
    verdict.duplicated += [f"{v.decode()} was never sent" for v in counts if v not in known]
    verdict.out_of_order += _order(final_records, "final") + _order(live.records, "live")
    return verdict


def workers(
    bootstrap: str, topic: str, n: int = 3, *, seed: int = 0, impatient: bool = True, max_seconds: float = 300.0
) -> list[QueueProducer]:
    """The issue 30 workload's ``n`` workers (not started): own transactional ids, 1-12 records a transaction,
    ~70% committed, the :data:`IMPATIENT` profile (or the patient one) with commit retries."""
    return [
        QueueProducer(
            bootstrap,
            topic,
            worker=w,
            seed=seed,
            profile=IMPATIENT if impatient else PATIENT,
            random_size=True,
            commit_ratio=0.7,
            commit_timeout=5.0 if impatient else 30.0,
            commit_retries=3,
            max_seconds=max_seconds,
        )
        for w in range(n)
    ]


def by_partition_sent(producer: QueueProducer) -> dict[int, int]:
    """How many values were sent per partition (for the test's own sanity checks)."""
    out: dict[int, int] = defaultdict(int)
    for txn in producer.committed + producer.aborted + producer.unknown:
        for v in txn:
            out[parse(v)[0]] += 1
    return dict(out)
