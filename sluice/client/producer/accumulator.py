"""The record accumulator: per-partition batches between ``send()`` and the sender thread.

Design:

* ``send()`` (any thread) appends a record to the last open batch of its
  partition (:class:`ProducerBatch`, which wraps a :class:`sluice.records.BatchBuilder`)
  and gets a future; a batch is closed for appends when it reaches
  ``batch_size`` (a record larger than that gets a batch of its own, up to
  ``max_request_size``).
* The sender thread asks which partitions have a batch worth sending
  (:meth:`RecordAccumulator.ready`: full, older than ``linger_ms``, a retry,
  or a flush/close under way) and takes at most one batch per partition
  (:meth:`RecordAccumulator.drain`), which is what one Produce request carries.
* Idempotence: a batch gets its producer id, epoch and base sequence the first
  time it is drained, and is sealed (encoded, compressed, CRC'd) then; a retry
  resends exactly the same bytes, so the broker recognises a duplicate.
  The partition's next sequence advances by the record count and wraps from
  2^31-1 to 0, as Kafka's does.
* Ordering with up to ``max_in_flight`` (<= 5) batches in flight per
  partition: when a batch fails with a retriable error, it goes back into the
  queue in sequence order and the partition enters *recovery*: nothing more
  is sent for it until every in-flight batch has come back (later ones fail
  with OUT_OF_ORDER_SEQUENCE_NUMBER, since the broker saw a gap, and are
  queued back in order too); then batches are resent one at a time until
  every batch that already had a sequence is acknowledged. Then pipelining
  resumes. A broker that already stored a retried batch answers with its
  original offset, which is simply accepted.
* Every mutation happens under one lock; the sender thread is woken through a
  callback when a batch becomes sendable.
* A batch stays in the *incomplete* set (what ``flush()`` and a commit wait
  for) until :meth:`RecordAccumulator.complete` or :meth:`RecordAccumulator.fail`
  resolves it. Methods that take batches out of their queues to be failed
  (:meth:`~RecordAccumulator.expire`, :meth:`~RecordAccumulator.abort_queued`,
  :meth:`~RecordAccumulator.reset_sequences`) leave them incomplete: the caller
  first records what the failure means for the transaction, then calls
  ``fail()``. A commit that sees a batch gone thus also sees its error.
* A transactional batch belongs to one transaction (its ``generation``, see
  ``transaction_manager``): records of another transaction never join it.
* ``buffer_memory`` bounds the bytes of the records in incomplete batches,
  from their append until their batch is completed or failed. Kafka counts
  ``batch.size`` for every batch it opens, because it allocates that much up
  front; Sluice's batches grow record by record, so it counts their bytes:
  with a 256 KiB ``batch_size``, keyed records over a few hundred partitions
  would otherwise fill 32 MiB with nearly empty batches (300 partitions:
  4,300 against 15,400 records/s). A ``send()`` whose record does not fit
  waits (up to ``max_block_ms``, then BufferExhaustedError) and, meanwhile,
  every queued batch is sendable at once. Besides bounding memory, this is
  what lets the sender keep up: a thread that appends without ever blocking
  holds the GIL, and the sender and gRPC's completion thread get it back only
  at the interpreter's switch interval (5 ms), a few times per request. For the same reason an append that
  starts or fills a batch wakes the sender and then releases the GIL for a
  moment (``time.sleep(0)``): once per batch. Record callbacks run on those
  threads, so a ``send()`` from a callback never waits (it may go over the
  bound instead of stopping what frees it).

The accumulator does no I/O and knows nothing of brokers; unit tests drive it directly.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sluice import errors
from sluice.api.v1 import records_pb2
from sluice.client.types import (
    BatchOutcome,
    DeliveryCallback,
    FutureRecordMetadata,
    TopicPartition,
    failed_future,
    in_record_callback,
)
from sluice.records import RECORD_STRUCT, BatchBuilder, Headers, RecordBatch, now_ms

monotonic = time.monotonic
_pack_record = RECORD_STRUCT.pack

# Let the thread just woken have the GIL: without this, a thread that appends without a pause keeps it
# until the interpreter's switch interval (5 ms) forces it loose, and the sender, and gRPC's thread with a
# response, wait that long each time (see the module's docstring). Once per batch, not per record.
_yield_gil = functools.partial(time.sleep, 0)


def _add_delivery_callback(outcome: BatchOutcome, index: int, callback: DeliveryCallback, timestamp: int) -> None:
    """Keep send()'s callback with the batch (under the accumulator's lock, the batch still open)."""
    entries = outcome.delivery_callbacks
    if entries is None:
        outcome.delivery_callbacks = [index, callback, timestamp]
    else:
        entries.append(index)
        entries.append(callback)
        entries.append(timestamp)


SEQUENCE_MODULUS = 2**31
RECORD_OVERHEAD = RECORD_STRUCT.size  # the fixed part of one encoded record
BATCH_OVERHEAD = 128  # a generous bound on a RecordBatch header plus request framing


def next_sequence(sequence: int, count: int) -> int:
    """The sequence after a batch of ``count`` records starting at ``sequence`` (wraps at 2^31)."""
    return (sequence + count) % SEQUENCE_MODULUS


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Encoded size of one record in a batch, as sluice.records encodes it."""
    size = RECORD_OVERHEAD + (len(key) if key is not None else 0) + (len(value) if value is not None else 0)
    if headers:
        for hk, hv in headers:
            size += 6 + len(hk.encode()) + len(hv)
    return size


class ProducerBatch(BatchBuilder):
    """Records for one partition that travel (and are retried) together.

    A :class:`~sluice.records.BatchBuilder` (records are encoded as they are
    appended) plus the batch's delivery state. The records' futures share one
    :class:`~sluice.client.types.BatchOutcome`.
    """

    __slots__ = (
        "_wire",
        "attempts",
        "created",
        "done",
        "generation",
        "last_error",
        "maybe_stored",
        "order",
        "outcome",
        "producer_epoch",
        "producer_id",
        "retry_at",
        "sequence",
        "tp",
        "transactional",
        "wire_parts",
    )

    def __init__(self, tp: TopicPartition, transactional: bool, created: float, generation: int = 0) -> None:
        super().__init__()
        self.tp = tp
        self.transactional = transactional
        # The transaction the batch belongs to (TransactionManager.generation when it was created).
        self.generation = generation
        self.created = created
        self.outcome = BatchOutcome(tp.topic, tp.partition)
        self.sequence = -1  # assigned on first drain when idempotent
        self.order = -1  # position in the partition's send order (never wraps)
        self.producer_id = -1
        self.producer_epoch = -1
        # Sealed on first drain: the serialized RecordBatch as (head, records), see
        # BatchBuilder.build_serialized; exactly these bytes are sent, and resent on retries.
        self.wire_parts: tuple[bytes, bytes] | None = None
        self._wire: RecordBatch | None = None
        self.attempts = 0
        self.retry_at = 0.0
        self.maybe_stored = False  # a send had an unknown outcome (timeout, connection lost)
        self.last_error: errors.SluiceError | None = None
        self.done = threading.Event()

    @property
    def record_count(self) -> int:
        return self.count

    @property
    def sealed(self) -> bool:
        return self.wire_parts is not None

    @property
    def wire(self) -> RecordBatch | None:
        """The sealed batch as a message (parsed on demand: the sender only needs :attr:`wire_parts`)."""
        if self.wire_parts is None:
            return None
        if self._wire is None:
            self._wire = RecordBatch.FromString(b"".join(self.wire_parts))
        return self._wire

    def add(
        self, key: bytes | None, value: bytes | None, headers: Headers | None, timestamp: int
    ) -> FutureRecordMetadata:
        """Append a record; its future."""
        return FutureRecordMetadata(self.outcome, self.append(key, value, headers, timestamp), timestamp)

    def seal(self, producer_id: int, producer_epoch: int, sequence: int, compression: int) -> None:
        self.producer_id = producer_id
        self.producer_epoch = producer_epoch
        self.sequence = sequence
        self.wire_parts = self.build_serialized(
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=sequence,
            transactional=self.transactional,
            compression=compression,
        )

    def unseal(self) -> None:
        """Forget the sequence and encoding (after an epoch bump: it is sent again as a new batch)."""
        self.wire_parts = None
        self._wire = None
        self.sequence = -1
        self.producer_id = -1
        self.producer_epoch = -1

    def complete(self, base_offset: int, log_append_time: int = -1) -> None:
        """Resolve every record's future; ``base_offset`` -1 means unknown (acks=0)."""
        self.outcome.complete(base_offset, log_append_time)
        self.done.set()

    def fail(self, exc: BaseException) -> None:
        self.outcome.fail(exc)
        self.done.set()

    def __repr__(self) -> str:
        return (
            f"ProducerBatch({self.tp}, records={self.record_count}, sequence={self.sequence}, attempts={self.attempts})"
        )


class _PartitionQueue:
    __slots__ = ("in_flight", "next_order", "next_sequence", "queue", "recovering", "tp")

    def __init__(self, tp: TopicPartition) -> None:
        self.tp = tp
        self.queue: deque[ProducerBatch] = deque()  # not in flight; sealed retries first, in order
        self.in_flight: list[ProducerBatch] = []  # in send order
        self.next_sequence = 0
        self.next_order = 0
        self.recovering = False

    def has_sealed_queued(self) -> bool:
        return bool(self.queue) and self.queue[0].sealed


@dataclass(slots=True)
class AccumulatorConfig:
    batch_size: int = 262_144
    linger_ms: float = 5.0
    max_request_size: int = 1_048_576
    compression: int = records_pb2.COMPRESSION_NONE
    max_in_flight: int = 5
    idempotent: bool = True
    delivery_timeout_ms: int = 120_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1000
    buffer_memory: int = 33_554_432
    max_block_ms: int = 60_000


class RecordAccumulator:
    """Per-partition queues of batches. Thread-safe."""

    def __init__(
        self,
        config: AccumulatorConfig,
        wakeup: Callable[[], None] | None = None,
        current_generation: Callable[[], int] | None = None,
    ) -> None:
        self.config = config
        # The transaction now open (a transactional producer's): a send() that waited for buffer space
        # must not add a record of a transaction that ended meanwhile (see _wait_for_space).
        self._current_generation = current_generation
        self._batch_size = config.batch_size
        self._buffer_memory = config.buffer_memory
        self._max_block = config.max_block_ms / 1000.0
        self._wakeup = wakeup or (lambda: None)
        self._lock = threading.Lock()
        self._parts: dict[TopicPartition, _PartitionQueue] = {}
        self._flushes = 0
        self._closing = False
        self._incomplete: set[ProducerBatch] = set()
        self._buffered = 0  # the encoded bytes of the records of the incomplete batches (buffer_memory)
        self._space = threading.Condition(self._lock)  # notified when a batch stops counting
        self._space_waiters = 0

    # ------------------------------------------------------------------ append (any thread)

    def queue_for(self, tp: TopicPartition) -> _PartitionQueue:
        """The partition's queue (created on first use, then kept: callers may hold on to it)."""
        part = self._parts.get(tp)
        if part is None:
            with self._lock:
                part = self._parts.get(tp)
                if part is None:
                    part = self._parts[tp] = _PartitionQueue(tp)
        return part

    def append(
        self,
        tp: TopicPartition,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None = None,
        timestamp: int | None = None,
        *,
        transactional: bool = False,
        abort_on_new_batch: bool = False,
        generation: int = 0,
    ) -> FutureRecordMetadata | None:
        """Append a record; its future, or None if ``abort_on_new_batch`` and it needed a new batch.

        ``generation``: the transaction the record belongs to; it only joins a batch of the same one.

        A record that can never be sent (larger than max_request_size) gets a
        future failed with MessageTooLargeError.
        """
        size = record_size(key, value, headers)
        if size + BATCH_OVERHEAD > self.config.max_request_size:
            return self.too_large(size)
        try:
            return self.append_to(
                self.queue_for(tp),
                key,
                value,
                headers,
                now_ms() if timestamp is None else timestamp,
                size,
                transactional,
                abort_on_new_batch,
                generation,
            )
        except errors.BufferExhaustedError as exc:
            return failed_future(exc)

    def too_large(self, size: int) -> FutureRecordMetadata:
        return failed_future(
            errors.MessageTooLargeError(
                f"the record is {size} bytes when encoded, more than max_request_size "
                f"({self.config.max_request_size} bytes)"
            )
        )

    def append_to(
        self,
        part: _PartitionQueue,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
        timestamp: int,
        size: int,
        transactional: bool,
        abort_on_new_batch: bool,
        generation: int = 0,
        callback: DeliveryCallback | None = None,
    ) -> FutureRecordMetadata | None:
        """:meth:`append` for callers that looked up the queue (:meth:`queue_for`) and sized the record.

        The producer's per-record hot path: one lock, one encode, one future. ``callback`` (send's)
        is kept with the batch's outcome, which runs it when the batch is done.
        """
        with self._lock:
            if self._closing:
                raise errors.IllegalStateError("cannot send: the producer is closed")
            waited = False
            while True:  # twice at most: after a wait for buffer space, look at the queue again
                if not waited and self._buffered + size > self._buffer_memory:
                    self._wait_for_space(size, transactional, generation)
                    waited = True
                    continue  # part.queue may be another deque now, and its last batch may be gone
                queue = part.queue
                if queue:
                    last = queue[-1]
                    new_size = last.size + size
                    if new_size <= self._batch_size and last.wire_parts is None and last.generation == generation:
                        index = last.count
                        if headers:
                            before = last.size
                            last.append(key, value, headers, timestamp)
                            self._buffered += last.size - before
                        else:
                            # BatchBuilder.append inlined (the per-record hot path); `last` has
                            # records already, so its first timestamp is set.
                            if timestamp > last._max_ts:
                                last._max_ts = timestamp
                            parts = last._parts
                            if key is None:
                                if value is None:
                                    parts.append(_pack_record(index, timestamp - last._first_ts, -1, -1, 0))
                                else:
                                    parts.append(_pack_record(index, timestamp - last._first_ts, -1, len(value), 0))
                                    parts.append(value)
                            else:
                                vlen = -1 if value is None else len(value)
                                parts.append(_pack_record(index, timestamp - last._first_ts, len(key), vlen, 0))
                                parts.append(key)
                                if value is not None:
                                    parts.append(value)
                            last.count = index + 1
                            last.size = new_size
                            self._buffered += size
                        if callback is not None:
                            _add_delivery_callback(last.outcome, index, callback, timestamp)
                        if new_size < self._batch_size:
                            return FutureRecordMetadata(last.outcome, index, timestamp)
                        full: ProducerBatch | None = last
                    else:
                        full = None
                else:
                    full = None
                if full is None:
                    if abort_on_new_batch:
                        return None
                    full = ProducerBatch(part.tp, transactional, monotonic(), generation)
                    index = full.append(key, value, headers, timestamp)
                    if callback is not None:
                        _add_delivery_callback(full.outcome, index, callback, timestamp)
                    queue.append(full)
                    self._incomplete.add(full)
                    self._buffered += full.size
                break
        # the sender must learn of the new batch (its linger timer) or of the full one
        self._wakeup()
        _yield_gil()
        return FutureRecordMetadata(full.outcome, index, timestamp)

    def append_values(
        self,
        part: _PartitionQueue,
        values: list[bytes | None],
        start: int,
        timestamp: int,
        transactional: bool,
        generation: int,
        runs: list[tuple[BatchOutcome, int, int, int]],
        abort_on_new_batch: bool = False,
    ) -> tuple[int, bool]:
        """Append ``values[start:]`` (keyless records of one timestamp, each no larger than a
        request allows) to the partition's open batch, or to a new one, until that batch is full;
        (the batch's outcome, the first record's index in it, how many, the timestamp) goes to
        ``runs``. Returns where the next append starts, and whether the batch filled.
        ``abort_on_new_batch``: append nothing (``start`` is returned) when a new batch would be
        needed, as :meth:`append_to` does for the sticky partitioner.

        :meth:`append_to` for many records: one lock and one batch lookup per batch, no future per
        record (:class:`~sluice.client.types.SentRecords` makes them when asked).
        """
        batch_size = self._batch_size
        end = len(values)
        with self._lock:
            if self._closing:
                raise errors.IllegalStateError("cannot send: the producer is closed")
            first = values[start]
            first_size = RECORD_OVERHEAD + (len(first) if first is not None else 0)
            waited = False
            while True:  # twice at most: after a wait for buffer space, look at the queue again (as append_to)
                if not waited and self._buffered + first_size > self._buffer_memory:
                    self._wait_for_space(first_size, transactional, generation)
                    waited = True
                    continue
                queue = part.queue
                batch = queue[-1] if queue else None
                created = (
                    batch is None
                    or batch.wire_parts is not None
                    or batch.generation != generation
                    or batch.size + first_size > batch_size
                )
                if not created:
                    i = start
                    break
                if abort_on_new_batch:
                    return start, True
                batch = ProducerBatch(part.tp, transactional, monotonic(), generation)
                batch.append(None, first, None, timestamp)
                queue.append(batch)
                self._incomplete.add(batch)
                self._buffered += batch.size
                i = start + 1
                break
            assert batch is not None
            if timestamp > batch._max_ts:
                batch._max_ts = timestamp
            delta = timestamp - batch._first_ts
            parts = batch._parts
            first_index = 0 if created else batch.count
            index, size = batch.count, batch.size
            room = self._buffer_memory - self._buffered + size  # the batch may grow to this (buffer_memory)
            while i < end:
                value = values[i]
                record = RECORD_OVERHEAD + (len(value) if value is not None else 0)
                if size + record > batch_size or (i != start and size + record > room):
                    break  # full, or buffer_memory reached (the first record always goes: progress)
                if value is None:
                    parts.append(_pack_record(index, delta, -1, -1, 0))
                else:
                    parts.append(_pack_record(index, delta, -1, len(value), 0))
                    parts.append(value)
                size += record
                index += 1
                i += 1
            self._buffered += size - batch.size
            batch.count, batch.size = index, size
            runs.append((batch.outcome, first_index, index - first_index, timestamp))
            full = i < end or size >= batch_size
        if created or full:
            self._wakeup()  # the sender must learn of the new batch (its linger timer) or of the full one
            _yield_gil()
        return i, full

    def _wait_for_space(self, size: int, transactional: bool, generation: int) -> None:
        """Called under the lock when a new batch for a ``size``-byte record would go over
        buffer_memory: wait until it fits or nothing is incomplete (then a batch always fits), or
        return at once in a record callback (see the module's docstring). The caller then looks at
        its partition's queue again: while the lock was released it may have been replaced
        (expire, abort_queued) or been given an open batch. Raises BufferExhaustedError after
        max_block_ms, and IllegalStateError if the producer closed meanwhile or the record's
        transaction is no longer open (committing, aborting, ended by another thread): the
        record would otherwise sit in a batch of a transaction that is over."""
        if in_record_callback():
            return
        need = size
        deadline = monotonic() + self._max_block
        self._space_waiters += 1
        self._wakeup()  # every queued batch is sendable while someone waits (_sendable)
        try:
            while self._buffered + need > self._buffer_memory and self._incomplete and not self._closing:
                left = deadline - monotonic()
                if left <= 0:
                    raise errors.BufferExhaustedError(
                        f"no room for a {size}-byte record in buffer_memory ({self._buffer_memory} bytes, "
                        f"{self._buffered} held by {len(self._incomplete)} unacknowledged batches) within "
                        f"max_block_ms ({self.config.max_block_ms} ms)"
                    )
                self._space.wait(left)
        finally:
            self._space_waiters -= 1
        if self._closing:
            raise errors.IllegalStateError("cannot send: the producer is closed")
        if transactional and self._current_generation is not None and self._current_generation() != generation:
            raise errors.IllegalStateError(
                "the record's transaction is no longer open (it ended, or is committing or aborting) after "
                "send() waited for buffer space: the record was not sent"
            )

    def _release(self, batch: ProducerBatch) -> None:
        """Under the lock: ``batch`` is resolved, it no longer counts (flush waits on the rest)."""
        if batch in self._incomplete:
            self._incomplete.remove(batch)
            self._buffered -= batch.size
            if self._space_waiters:
                self._space.notify_all()

    # ------------------------------------------------------------------ sender side

    def _sendable(self, part: _PartitionQueue, now: float) -> tuple[bool, float]:
        """(head batch may be drained now, seconds until it may be when not)."""
        if not part.queue:
            return False, float("inf")
        head = part.queue[0]
        if part.recovering:
            if part.in_flight:
                return False, float("inf")  # a response will wake us
        elif len(part.in_flight) >= self.config.max_in_flight:
            return False, float("inf")
        if head.retry_at > now:
            return False, head.retry_at - now
        if head.sealed or self._flushes or self._closing or len(part.queue) > 1 or self._space_waiters:
            return True, 0.0
        if head.size >= self.config.batch_size:
            return True, 0.0
        linger_left = head.created + self.config.linger_ms / 1000.0 - now
        if linger_left <= 0:
            return True, 0.0
        return False, linger_left

    def ready(
        self,
        now: float,
        can_send: Callable[[TopicPartition], bool] | None = None,
        poll_queued: float | None = None,
    ) -> tuple[list[TopicPartition], float]:
        """Partitions with a batch to drain now, and seconds until the next may be (inf: none waits).

        With ``poll_queued``, the wait is at most that while any batch is
        queued (the sender looks again at batches it cannot send yet).
        """
        out: list[TopicPartition] = []
        wait = float("inf")
        with self._lock:
            for tp, part in self._parts.items():
                if not part.queue:
                    continue
                if poll_queued is not None and poll_queued < wait:
                    wait = poll_queued
                ok, delay = self._sendable(part, now)
                if ok and (can_send is None or can_send(tp)):
                    out.append(tp)
                elif not ok and delay < wait:
                    wait = delay
        return out, wait

    def drain(
        self,
        tps: Iterable[TopicPartition],
        now: float,
        producer_id: int = -1,
        producer_epoch: int = -1,
        max_bytes: int | None = None,
        generation: int | None = None,
    ) -> list[ProducerBatch]:
        """Take one batch from each of ``tps`` (that is still sendable), mark it in flight.

        New batches are sealed here with the producer id, epoch and the
        partition's next sequence (when idempotent). ``max_bytes`` bounds the
        total (one batch is always taken). With ``generation``, a
        transactional batch of another transaction is left where it is.
        """
        out: list[ProducerBatch] = []
        to_seal: list[tuple[ProducerBatch, int, int, int]] = []
        total = 0
        limit = max_bytes if max_bytes is not None else self.config.max_request_size
        idempotent = self.config.idempotent and producer_id >= 0
        with self._lock:
            for tp in tps:
                part = self._parts.get(tp)
                if part is None:
                    continue
                ok, _ = self._sendable(part, now)
                if not ok:
                    continue
                head = part.queue[0]
                if out and total + head.size > limit:
                    continue
                if generation is not None and head.transactional and head.generation != generation:
                    continue
                if part.recovering and not head.sealed and not part.in_flight:
                    part.recovering = False
                part.queue.popleft()
                if not head.sealed:
                    sequence = part.next_sequence if idempotent else -1
                    to_seal.append(
                        (head, producer_id if idempotent else -1, producer_epoch if idempotent else -1, sequence)
                    )
                    head.sequence = sequence
                    head.order = part.next_order
                    part.next_order += 1
                    if idempotent:
                        part.next_sequence = next_sequence(part.next_sequence, head.record_count)
                head.attempts += 1
                part.in_flight.append(head)
                total += head.size
                out.append(head)
        # Encoding (join, compression, CRC) happens outside the lock so send() is not held up:
        # a drained batch is no longer in its queue, so nothing appends to it any more.
        for head, pid, epoch, sequence in to_seal:
            head.seal(pid, epoch, sequence, self.config.compression)
        return out

    def _remove_in_flight(self, batch: ProducerBatch) -> _PartitionQueue | None:
        part = self._parts.get(batch.tp)
        if part is not None and batch in part.in_flight:
            part.in_flight.remove(batch)
        return part

    def _maybe_end_recovery(self, part: _PartitionQueue) -> None:
        if part.recovering and not part.in_flight and not part.has_sealed_queued():
            part.recovering = False

    def complete(self, batch: ProducerBatch, base_offset: int, log_append_time: int = -1) -> None:
        """The broker stored ``batch`` (or a duplicate of it) at ``base_offset``."""
        with self._lock:
            part = self._remove_in_flight(batch)
            if part is not None:
                self._maybe_end_recovery(part)
            self._release(batch)
        batch.complete(base_offset, log_append_time)
        self._wakeup()

    def fail(self, batch: ProducerBatch, exc: BaseException) -> None:
        """``batch`` failed for good: fail its records' futures; it is no longer incomplete.

        A transactional batch's caller records the failure with the
        transaction first (``TransactionManager.send_failed``).
        """
        with self._lock:
            part = self._remove_in_flight(batch)
            if part is not None:
                if batch in part.queue:
                    part.queue.remove(batch)
                self._maybe_end_recovery(part)
            self._release(batch)
        batch.fail(exc)
        self._wakeup()

    def requeue(self, batch: ProducerBatch, now: float, exc: errors.SluiceError | None = None) -> None:
        """``batch`` failed with a retriable error: queue it again, in order, after a backoff."""
        with self._lock:
            part = self._remove_in_flight(batch)
            if part is None:
                return
            batch.last_error = exc
            delay = min(
                self.config.retry_backoff_max_ms,
                self.config.retry_backoff_ms * (2 ** max(0, batch.attempts - 1)),
            )
            batch.retry_at = now + delay / 1000.0
            # sealed batches are ordered by `order`, before every unsealed one
            index = 0
            for index, queued in enumerate(part.queue):  # noqa: B007
                if not queued.sealed or queued.order > batch.order:
                    break
            else:
                index = len(part.queue)
            part.queue.insert(index, batch)
            part.recovering = True
        self._wakeup()

    def earlier_unacknowledged(self, batch: ProducerBatch) -> bool:
        """Is a batch sent before ``batch`` on its partition still unacknowledged?

        An OUT_OF_ORDER_SEQUENCE_NUMBER for ``batch`` is then expected (the
        broker saw the gap left by that batch) and ``batch`` is retried, not failed.
        """
        with self._lock:
            part = self._parts.get(batch.tp)
            if part is None:
                return False
            return any(b.order < batch.order for b in part.in_flight) or any(
                b.sealed and b.order < batch.order for b in part.queue
            )

    def in_flight_count(self, tp: TopicPartition | None = None) -> int:
        with self._lock:
            if tp is not None:
                part = self._parts.get(tp)
                return len(part.in_flight) if part else 0
            return sum(len(p.in_flight) for p in self._parts.values())

    def queued_count(self) -> int:
        with self._lock:
            return sum(len(p.queue) for p in self._parts.values())

    def has_incomplete(self) -> bool:
        with self._lock:
            return bool(self._incomplete)

    def incomplete(self, generation: int | None = None) -> list[ProducerBatch]:
        """Batches not yet completed or failed (with ``generation``: of that transaction only)."""
        with self._lock:
            if generation is None:
                return list(self._incomplete)
            return [b for b in self._incomplete if b.transactional and b.generation == generation]

    def pending_partitions(self) -> set[TopicPartition]:
        """Partitions with queued batches (the sender needs their leaders)."""
        with self._lock:
            return {tp for tp, p in self._parts.items() if p.queue}

    def expire(self, now: float) -> list[ProducerBatch]:
        """Take queued batches older than delivery_timeout_ms out of their queues, for the caller to fail.

        They stay incomplete until the caller's ``fail()``, after it recorded the error.
        """
        limit = self.config.delivery_timeout_ms / 1000.0
        out: list[ProducerBatch] = []
        with self._lock:
            for part in self._parts.values():
                if not part.queue or all(now - batch.created < limit for batch in part.queue):
                    continue
                keep: deque[ProducerBatch] = deque()
                for batch in part.queue:
                    if now - batch.created >= limit:
                        out.append(batch)
                    else:
                        keep.append(batch)
                part.queue = keep
                self._maybe_end_recovery(part)
        return out

    def is_expired(self, batch: ProducerBatch, now: float) -> bool:
        return now - batch.created >= self.config.delivery_timeout_ms / 1000.0

    def abort_queued(self, predicate: Callable[[ProducerBatch], bool] | None = None) -> list[ProducerBatch]:
        """Take every queued (not in-flight) batch matching ``predicate`` out of its queue, for the caller to fail.

        They stay incomplete until the caller's ``fail()``.
        """
        out: list[ProducerBatch] = []
        with self._lock:
            for part in self._parts.values():
                keep: deque[ProducerBatch] = deque()
                for batch in part.queue:
                    if predicate is None or predicate(batch):
                        out.append(batch)
                    else:
                        keep.append(batch)
                part.queue = keep
                self._maybe_end_recovery(part)
        return out

    def reset_sequences(self) -> list[ProducerBatch]:
        """After a new producer id/epoch: every partition starts again at sequence 0.

        Queued batches that were sealed are unsealed and will be sent as new
        batches, except those whose earlier send may have been stored (their
        outcome is unknown): those are taken out and returned, for the caller to
        fail (they stay incomplete until then), so they are never written twice.
        """
        dropped: list[ProducerBatch] = []
        with self._lock:
            for part in self._parts.values():
                part.next_sequence = 0
                part.recovering = False
                keep: deque[ProducerBatch] = deque()
                for batch in part.queue:
                    if batch.sealed and batch.maybe_stored:
                        dropped.append(batch)
                        continue
                    if batch.sealed:
                        batch.unseal()
                    keep.append(batch)
                part.queue = keep
        return dropped

    def begin_flush(self) -> None:
        with self._lock:
            self._flushes += 1
        self._wakeup()

    def end_flush(self) -> None:
        with self._lock:
            self._flushes -= 1

    @property
    def flushing(self) -> bool:
        with self._lock:
            return self._flushes > 0

    def close(self) -> None:
        """No more appends (a send() waiting for buffer space raises); every queued batch is sendable now."""
        with self._lock:
            self._closing = True
            self._space.notify_all()
        self._wakeup()

    @property
    def closing(self) -> bool:
        with self._lock:
            return self._closing
