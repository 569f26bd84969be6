"""Value types of the client's public API.

Small immutable records, named as a Kafka user knows them: a partition is a
:class:`TopicPartition`, a delivered record is described by
:class:`RecordMetadata`, a consumed one is a :class:`ConsumerRecord`, and a
consumer's group membership, as a transactional producer needs it to commit
offsets (KIP-447), is :class:`GroupMetadata`.

They are frozen dataclasses with slots: hashable (``TopicPartition`` is a dict
key everywhere), cheap, and printable. ``TopicPartition`` also unpacks like the
namedtuple Kafka's Python clients use: ``topic, partition = tp``.
"""

from __future__ import annotations

import bisect
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any, overload

_log = logging.getLogger("concurrent.futures")
_Callback = Callable[["Future[RecordMetadata]"], object]
# send(callback=...): Kafka's Callback.onCompletion(metadata, exception). The metadata is always given
# (offset and timestamp -1 after an error, as Kafka's), the exception is None on success.
DeliveryCallback = Callable[["RecordMetadata", "BaseException | None"], object]

__all__ = [
    "BatchOutcome",
    "ConsumerRecord",
    "FutureRecordMetadata",
    "GroupMetadata",
    "OffsetAndTimestamp",
    "PreparedTransaction",
    "RecordMetadata",
    "SentRecords",
    "TopicPartition",
]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of a topic."""

    topic: str
    partition: int

    def __iter__(self) -> Iterator[str | int]:
        yield self.topic
        yield self.partition

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True, order=True)
class PreparedTransaction:
    """The handle of a prepared transaction (two-phase commit, the idea of Kafka's KIP-939).

    ``Producer.prepare_transaction()`` returns it; any client can later end
    the transaction with it (``Admin.commit_prepared_transaction`` /
    ``abort_prepared_transaction``). Plain values, so it pickles and travels
    (a Spark task hands it to the driver in its commit message).
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was stored: its offset and timestamp.

    ``offset`` is -1 when the producer does not wait for acknowledgements
    (acks=0). ``timestamp`` is the record's create time, or the broker's
    append time for topics with message.timestamp.type=LogAppendTime.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A record returned by :meth:`Consumer.poll`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(slots=True)
class _MutableConsumerRecord:
    """ConsumerRecord's exact layout without the frozen ``__setattr__`` (see :func:`consumer_record`)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = -1


assert _MutableConsumerRecord.__slots__ == ConsumerRecord.__slots__  # the layouts must match


def consumer_record(
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes]],
    timestamp: int,
) -> ConsumerRecord:
    """A :class:`ConsumerRecord`, three times faster than its constructor (the consumer's per-record cost).

    A frozen dataclass sets each field through ``object.__setattr__``; this
    builds the same slots on a plain dataclass of identical layout and then
    makes it a ConsumerRecord (``__class__`` assignment between classes with
    the same slots). The result is an ordinary, frozen ConsumerRecord.
    """
    rec = _MutableConsumerRecord(topic, partition, offset, key, value, headers, timestamp)
    rec.__class__ = ConsumerRecord  # type: ignore[assignment]
    return rec  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A consumer's group membership, for :meth:`Producer.send_offsets_to_transaction`.

    ``member_id`` is empty and ``member_epoch`` -1 for a consumer that uses
    ``assign()`` (it is not a member): the coordinator then skips the zombie check.
    """

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetAndTimestamp:
    """An answer of :meth:`Consumer.offsets_for_times`: the offset found and its record's timestamp."""

    offset: int
    timestamp: int


_running = threading.local()  # depth: record callbacks this thread is running (see in_record_callback)


def in_record_callback() -> bool:
    """Whether this thread is running a record's callback: the producer's I/O threads run them, and
    ``send()`` must not wait for buffer space there (only those threads free it)."""
    return getattr(_running, "depth", 0) > 0


class BatchOutcome:
    """The shared completion of the records of one producer batch.

    Every record's :class:`FutureRecordMetadata` points here and reads its
    result from it (the batch's base offset plus the record's index), so
    completing a batch of thousands of records is one assignment plus the
    callbacks that were registered, not a future and a condition variable per
    record. Thread-safe: completed once, by the producer's sender thread.

    Registering a callback takes no lock (it is on the per-record path of every
    ``send(...).add_done_callback(cb)``): the entry goes into a deque, whose append
    and popleft are atomic, and every entry is run by whoever pops it. The
    finisher sets ``done`` and then pops until the deque is empty; an adder
    appends and then looks at ``done``: if it is set, the finisher's drain may have
    missed the entry, so the adder pops until empty too. Either way each entry runs
    exactly once, in registration order unless an adder raced the finish.
    """

    __slots__ = (
        "_callbacks",
        "_event",
        "_lock",
        "_materialised",
        "base_offset",
        "delivery_callbacks",
        "done",
        "exception",
        "log_append_time",
        "partition",
        "topic",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.done = False
        self.base_offset = -1
        self.log_append_time = -1
        self.exception: BaseException | None = None
        self._lock = threading.Lock()  # done, the event and the materialised futures; not the callbacks
        self._callbacks: deque[tuple[FutureRecordMetadata, _Callback]] = deque()
        self._event: threading.Event | None = None
        self._materialised: list[FutureRecordMetadata] | None = None
        # send(callback=...): index, callback, timestamp, flat (no object per record for the
        # garbage collector to follow while the batch is in flight). Appended only while the batch
        # is open for records, under the accumulator's lock, so never after it is done.
        self.delivery_callbacks: list[Any] | None = None

    def complete(self, base_offset: int, log_append_time: int = -1) -> bool:
        """Resolve every record with ``base_offset`` (-1: unknown, acks=0); False if already done."""
        return self._finish(base_offset, log_append_time, None)

    def fail(self, exc: BaseException) -> bool:
        """Fail every record with ``exc``; False if already done."""
        return self._finish(-1, -1, exc)

    def _finish(self, base_offset: int, log_append_time: int, exc: BaseException | None) -> bool:
        with self._lock:
            if self.done:
                return False
            self.base_offset = base_offset
            self.log_append_time = log_append_time
            self.exception = exc
            self.done = True
            materialised, self._materialised = self._materialised, None
            event = self._event
        if event is not None:
            event.set()
        if materialised:
            for future in materialised:
                future._settle()
        if self.delivery_callbacks:
            self._run_delivery_callbacks()
        self._run_callbacks()
        return True

    def _run_delivery_callbacks(self) -> None:
        """Run send(callback=...) callbacks in send order: (metadata, None) or (metadata with -1s, error)."""
        entries, self.delivery_callbacks = self.delivery_callbacks, None
        assert entries is not None
        topic, partition, exc = self.topic, self.partition, self.exception
        base, appended = self.base_offset, self.log_append_time
        depth = getattr(_running, "depth", 0)
        _running.depth = depth + 1
        try:
            for i in range(0, len(entries), 3):
                index, fn, timestamp = entries[i], entries[i + 1], entries[i + 2]
                if exc is not None:
                    metadata = RecordMetadata(topic, partition, -1, -1)
                else:
                    metadata = RecordMetadata(
                        topic,
                        partition,
                        base + index if base >= 0 else -1,
                        appended if appended >= 0 else timestamp,
                    )
                try:
                    fn(metadata, exc)
                except Exception:
                    _log.exception("exception calling the delivery callback of %s-%d", topic, partition)
        finally:
            _running.depth = depth

    def _run_callbacks(self) -> None:
        """Pop and run the registered callbacks until none is left (the finisher, or an adder that saw ``done``)."""
        callbacks = self._callbacks
        if not callbacks:
            return
        depth = getattr(_running, "depth", 0)
        _running.depth = depth + 1
        try:
            while callbacks:
                try:
                    future, fn = callbacks.popleft()
                except IndexError:  # another drainer took the last one
                    return
                try:
                    fn(future)
                except Exception:
                    _log.exception("exception calling callback for %r", future)
        finally:
            _running.depth = depth

    def wait(self, timeout: float | None) -> bool:
        if self.done:
            return True
        with self._lock:
            if self.done:
                return True
            if self._event is None:
                self._event = threading.Event()
            event = self._event
        return event.wait(timeout)

    def _materialise(self, future: FutureRecordMetadata) -> None:
        with self._lock:
            if "_condition" in future.__dict__:
                return
            Future.__init__(future)
            if self.done:
                future._fill()
            else:
                future._state = _RUNNING
                if self._materialised is None:
                    self._materialised = [future]
                else:
                    self._materialised.append(future)


_RUNNING = "RUNNING"
_FINISHED = "FINISHED"
# concurrent.futures.Future's internals, built on first use (by concurrent.futures.wait / as_completed).
_FUTURE_INTERNALS = frozenset({"_condition", "_state", "_result", "_exception", "_waiters", "_done_callbacks"})


class FutureRecordMetadata(Future[RecordMetadata]):
    """The result of :meth:`Producer.send`: a ``concurrent.futures.Future``.

    ``result(timeout)`` returns the :class:`RecordMetadata` or raises the
    error from :mod:`sluice.errors` that failed the record; ``get`` is an alias
    for those used to kafka-python. ``exception``, ``done`` and
    ``add_done_callback`` behave as ``concurrent.futures.Future``'s (callbacks
    run on the producer's sender thread, or at once if the record is already
    done); a record being sent cannot be cancelled (``cancel()`` is False).

    Lightweight: a record's future is three references (its batch's shared
    :class:`BatchOutcome`, its index in the batch, its timestamp). The
    condition variable of a ``concurrent.futures.Future`` is only built if
    ``concurrent.futures.wait`` or ``as_completed`` asks for it.
    """

    __slots__ = ("_index", "_outcome", "_timestamp")

    def __init__(self, outcome: BatchOutcome | None = None, index: int = 0, timestamp: int = -1) -> None:
        # Future.__init__ is deliberately not called: see _FUTURE_INTERNALS.
        self._outcome = outcome if outcome is not None else BatchOutcome("", -1)
        self._index = index
        self._timestamp = timestamp

    def __getattr__(self, name: str) -> Any:
        if name not in _FUTURE_INTERNALS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        self._outcome._materialise(self)
        return object.__getattribute__(self, name)

    def _metadata(self) -> RecordMetadata:
        o = self._outcome
        return RecordMetadata(
            o.topic,
            o.partition,
            o.base_offset + self._index if o.base_offset >= 0 else -1,
            o.log_append_time if o.log_append_time >= 0 else self._timestamp,
        )

    def _fill(self) -> None:
        """Copy the outcome into the concurrent.futures internals (materialised futures only)."""
        exc = self._outcome.exception
        if exc is not None:
            self._exception = exc
        else:
            self._result = self._metadata()
        self._state = _FINISHED

    def _settle(self) -> None:
        """The outcome is done: update a materialised future and wake concurrent.futures waiters."""
        with self._condition:
            self._fill()
            for waiter in self._waiters:
                if self._outcome.exception is not None:
                    waiter.add_exception(self)
                else:
                    waiter.add_result(self)
            self._condition.notify_all()

    def done(self) -> bool:
        return self._outcome.done

    def running(self) -> bool:
        return not self._outcome.done

    def cancelled(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False

    def set_running_or_notify_cancel(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> RecordMetadata:
        o = self._outcome
        if not o.done and not o.wait(timeout):
            raise TimeoutError()
        if o.exception is not None:
            raise o.exception
        return self._metadata()

    def get(self, timeout: float | None = None) -> RecordMetadata:
        return self.result(timeout)

    def exception(self, timeout: float | None = None) -> BaseException | None:
        o = self._outcome
        if not o.done and not o.wait(timeout):
            raise TimeoutError()
        return o.exception

    def add_done_callback(self, fn: Callable[[Future[RecordMetadata]], object]) -> None:
        o = self._outcome
        if not o.done:  # no lock: see BatchOutcome
            o._callbacks.append((self, fn))
            if o.done:  # it finished meanwhile and may have drained before the append
                o._run_callbacks()
            return
        try:
            fn(self)
        except Exception:
            _log.exception("exception calling callback for %r", self)

    def set_result(self, result: RecordMetadata) -> None:
        """Resolve a standalone future (not one of a batch) with ``result``."""
        if self._outcome.done:
            raise InvalidStateError(f"{self!r} is already done")
        self._outcome.topic = result.topic
        self._outcome.partition = result.partition
        self._index = 0
        self._timestamp = result.timestamp
        self._outcome.complete(result.offset)

    def set_exception(self, exception: BaseException | None) -> None:
        """Fail a standalone future (not one of a batch) with ``exception``."""
        if self._outcome.done:
            raise InvalidStateError(f"{self!r} is already done")
        self._outcome.fail(exception if exception is not None else RuntimeError("failed"))

    def __repr__(self) -> str:
        o = self._outcome
        if not o.done:
            return f"<FutureRecordMetadata at {id(self):#x} state=running>"
        if o.exception is not None:
            return f"<FutureRecordMetadata at {id(self):#x} state=finished raised {type(o.exception).__name__}>"
        return f"<FutureRecordMetadata at {id(self):#x} state=finished returned RecordMetadata>"


class SentRecords(Sequence[FutureRecordMetadata]):
    """The records of one :meth:`Producer.send_many`, in the order given: a sequence of futures.

    Kept per batch (the batch's :class:`BatchOutcome`, the first record's index in it, how many,
    their timestamp); a record's :class:`FutureRecordMetadata` is made only when asked for
    (``sent[i]``, iteration): a future per record was most of a bulk send's cost, in allocations
    and the garbage collections they start. :meth:`wait` waits for every record and raises the
    first error.
    """

    __slots__ = ("_runs", "_starts")

    def __init__(self, runs: list[tuple[BatchOutcome, int, int, int]]) -> None:
        self._runs = runs
        self._starts: list[int] = []
        total = 0
        for _outcome, _first, count, _ts in runs:
            self._starts.append(total)
            total += count
        self._starts.append(total)

    def __len__(self) -> int:
        return self._starts[-1]

    @overload
    def __getitem__(self, i: int) -> FutureRecordMetadata: ...

    @overload
    def __getitem__(self, i: slice) -> list[FutureRecordMetadata]: ...

    def __getitem__(self, i: int | slice) -> FutureRecordMetadata | list[FutureRecordMetadata]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"record {i} of {n}")
        run = bisect.bisect_right(self._starts, i) - 1
        outcome, first, _count, ts = self._runs[run]
        return FutureRecordMetadata(outcome, first + i - self._starts[run], ts)

    def __iter__(self) -> Iterator[FutureRecordMetadata]:
        for outcome, first, count, ts in self._runs:
            for index in range(first, first + count):
                yield FutureRecordMetadata(outcome, index, ts)

    def wait(self, timeout: float | None = None) -> None:
        """Until every record is stored (or failed): raises the first record's error, in order,
        and TimeoutError when ``timeout`` (seconds, for all of them) passes first."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for outcome, first, _count, ts in self._runs:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            FutureRecordMetadata(outcome, first, ts).result(left)


def failed_future(exc: BaseException) -> FutureRecordMetadata:
    """A future that failed at once with ``exc`` (the record was never queued)."""
    future = FutureRecordMetadata()
    future._outcome.fail(exc)
    return future
