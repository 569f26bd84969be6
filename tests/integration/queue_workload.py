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
- offsets never go back: the live reader's offsets increase per partition, and the
  :class:`~tests.integration.helpers.OffsetMonitor`'s HW and LSO samples never regress
  (``offset_regressions``).

Values are ``p<partition>:<sequence>:t<transaction>``. Every loop is bounded in count and time.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from sluice import errors
from sluice.client import Consumer, Producer, TopicPartition

PARTITIONS = 3
PER_PARTITION = 2  # values per partition per transaction
ABORT_EVERY = 5  # every 5th transaction is aborted on purpose


def parse(value: bytes) -> tuple[int, int, int]:
    """(partition, sequence, transaction) of a workload value."""
    p, seq, txn = value.decode().split(":")
    return int(p[1:]), int(seq), int(txn[1:])


class QueueProducer(threading.Thread):
    """Transactions of PARTITIONS * PER_PARTITION values until stopped; remembers every outcome."""

    def __init__(self, bootstrap: str, topic: str, *, max_txns: int = 5000, max_seconds: float = 300.0) -> None:
        super().__init__(daemon=True, name="queue-producer")
        self.bootstrap = bootstrap
        self.topic = topic
        self.max_txns = max_txns
        self.max_seconds = max_seconds
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
                    transactional_id="queue-tx",
                    linger_ms=2,
                    delivery_timeout_ms=20_000,
                    request_timeout_ms=5_000,
                )
                producer.init_transactions(timeout=30)
                return producer
            except errors.SluiceError as exc:
                self.errors[type(exc).__name__] += 1
                time.sleep(0.5)
        return None

    def run(self) -> None:
        deadline = time.monotonic() + self.max_seconds
        producer = self._new_producer()
        for txn in range(self.max_txns):
            if producer is None or self.stop_event.is_set() or time.monotonic() > deadline:
                break
            values = []
            for p in range(PARTITIONS):
                for _ in range(PER_PARTITION):
                    values.append((p, b"p%d:%06d:t%d" % (p, self._seq[p], txn)))
                    self._seq[p] += 1
            abort = txn % ABORT_EVERY == ABORT_EVERY - 1
            try:
                producer.begin_transaction()
                for p, v in values:
                    producer.send(self.topic, value=v, partition=p)
                if abort:
                    producer.abort_transaction(timeout=30)
                else:
                    producer.commit_transaction(timeout=30)
                (self.aborted if abort else self.committed).append([v for _p, v in values])
            except errors.SluiceError as exc:
                self.errors[type(exc).__name__] += 1
                # never committed on purpose: it cannot become visible; else nobody knows yet
                (self.aborted if abort else self.unknown).append([v for _p, v in values])
                with contextlib.suppress(Exception):
                    producer.close(timeout=5)
                self.restarts += 1
                producer = self._new_producer()  # its init_transactions ends the old transaction
        if producer is not None:
            with contextlib.suppress(Exception):
                producer.close(timeout=10)

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
    """Per partition, in offset order: sequences increase, offsets increase, values are on their partition."""
    bad = []
    last: dict[int, tuple[int, int]] = {}
    for partition, offset, value in records:
        p, seq, _txn = parse(value)
        if p != partition:
            bad.append(f"{who}: {value!r} read from partition {partition}")
        prev = last.get(partition)
        if prev is not None and (offset <= prev[0] or seq <= prev[1]):
            bad.append(f"{who}: partition {partition} offset {prev[0]} seq {prev[1]} then offset {offset} seq {seq}")
        last[partition] = (offset, seq)
    return bad


def check(
    producer: QueueProducer,
    final: list[tuple[int, int, bytes | None, bytes | None]],
    live: LiveReader,
    offset_regressions: list[str],
) -> Verdict:
    """The verdict over what the producer knows, the final read (read_topic's rows) and the live read."""
    final_records = sorted((p, o, v) for p, o, _k, v in final if v is not None)
    counts = Counter(v for _p, _o, v in final_records)
    live_counts = Counter(v for _p, _o, v in live.records)
    verdict = Verdict(
        committed=len(producer.committed),
        aborted=len(producer.aborted),
        unknown=len(producer.unknown),
        unknown_visible=0,
        read=len(final_records),
        live_read=len(live.records),
        offset_regressions=list(offset_regressions),
        reader_error=repr(live.error) if live.error else "",
    )
    for txn in producer.committed:
        verdict.lost += [v.decode() for v in txn if counts[v] == 0]
    verdict.duplicated += [f"{v.decode()} x{n} (final)" for v, n in counts.items() if n > 1]
    verdict.duplicated += [f"{v.decode()} x{n} (live)" for v, n in live_counts.items() if n > 1]
    for txn in producer.aborted:
        verdict.aborted_visible += [v.decode() for v in txn if counts[v] or live_counts[v]]
    for txn in producer.unknown:
        seen = [counts[v] > 0 for v in txn]
        if any(seen):
            verdict.unknown_visible += 1
        if any(seen) and not all(seen):
            verdict.partial.append(f"transaction of {txn[0].decode()}: {sum(seen)} of {len(txn)} visible")
    known = {v for txn in producer.committed + producer.aborted + producer.unknown for v in txn}
    verdict.duplicated += [f"{v.decode()} was never sent" for v in counts if v not in known]
    verdict.out_of_order += _order(final_records, "final") + _order(live.records, "live")
    return verdict


def by_partition_sent(producer: QueueProducer) -> dict[int, int]:
    """How many values were sent per partition (for the test's own sanity checks)."""
    out: dict[int, int] = defaultdict(int)
    for txn in producer.committed + producer.aborted + producer.unknown:
        for v in txn:
            out[parse(v)[0]] += 1
    return dict(out)
