"""The Sluice producer: idempotent by default, transactional with a transactional_id.

The pieces, each in its own module:

* ``send()`` (thread-safe, any number of threads) picks the partition
  (``partitioner``), appends the record to the partition's open batch in the
  :class:`~sluice.client.producer.accumulator.RecordAccumulator` and returns a future.
* The :class:`~sluice.client.producer.sender.Sender` thread drains ready batches into
  Produce requests, one per partition leader, and resolves the futures.
* The :class:`~sluice.client.producer.transaction_manager.TransactionManager` holds the
  producer id, epoch and transaction state and decides what is legal.
* This module drives the transaction coordinator for the calls the
  application makes and waits for (init_transactions, send_offsets_to_transaction,
  commit_transaction, abort_transaction), in the caller's thread.

Semantics are Kafka's (the Java client's), with two deliberate choices spelled out:

* Prepared transactions (two-phase commit with an external coordinator, the
  idea of Kafka's KIP-939): ``prepare_transaction()`` flushes, asks the
  coordinator to hold the transaction as Prepared (its timeout no longer
  aborts it) and returns its :class:`PreparedTransaction` handle. This
  producer, or any client with the handle (``Admin.commit_prepared_transaction``),
  then commits or aborts it. ``init_transactions()`` on an id with a prepared
  transaction fails with InvalidTxnStateError unless told to keep it
  (``keep_prepared_txn``: the producer holds it, ready to be committed or
  aborted) or to abort it (``abort_prepared_txn``).
* ``close()`` with a transaction open does not abort it: the coordinator
  aborts it when transaction_timeout_ms passes, or the next producer with the
  same transactional_id aborts it in ``init_transactions()``.
* Keys are partitioned with CRC-32, not murmur2 (see ``partitioner``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal

from sluice import errors
from sluice.api.v1 import broker_pb2
from sluice.client import tracing as _tracing
from sluice.client._network import GROUP, TRANSACTION, Cluster, Deadline, first_error, response_error
from sluice.client._network import rpc as rpcs
from sluice.client._network.security import ClientSecurity
from sluice.client.producer.accumulator import (
    BATCH_OVERHEAD,
    RECORD_OVERHEAD,
    AccumulatorConfig,
    ProducerBatch,
    RecordAccumulator,
    _PartitionQueue,
    record_size,
)
from sluice.client.producer.partitioner import StickyPartitioner, partition_for_key
from sluice.client.producer.sender import Sender, SenderConfig, TransactionAbortedError
from sluice.client.producer.transaction_manager import (
    TRANSACTION_VERSION,
    TransactionManager,
    TransactionState,
    ends_the_producer,
)
from sluice.client.types import (
    BatchOutcome,
    DeliveryCallback,
    FutureRecordMetadata,
    GroupMetadata,
    PreparedTransaction,
    RecordMetadata,
    SentRecords,
    TopicPartition,
    failed_future,
)
from sluice.records import compression_code

log = logging.getLogger("sluice.client.producer")

_time_ns = time.time_ns

HeadersArg = Iterable[tuple[str, bytes | str]] | Mapping[str, bytes | str] | None
Acks = Literal["all", -1, 0, 1, "0", "1", "-1"]


def _acks(value: Acks | int | str) -> int:
    if value in ("all", -1, "-1"):
        return -1
    if value in (1, "1"):
        return 1
    if value in (0, "0"):
        return 0
    raise ValueError(f"acks must be 'all' (-1), 1 or 0, not {value!r}")


def _as_bytes(value: bytes | bytearray | memoryview | str | None, what: str) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise TypeError(f"{what} must be bytes, str or None, not {type(value).__name__}")


def _headers(headers: HeadersArg) -> list[tuple[str, bytes]] | None:
    if not headers:
        return None
    items = headers.items() if isinstance(headers, Mapping) else headers
    out: list[tuple[str, bytes]] = []
    for k, v in items:
        if not isinstance(k, str):
            raise TypeError(f"header keys must be str, not {type(k).__name__}")
        b = _as_bytes(v, f"header {k!r}")
        out.append((k, b if b is not None else b""))
    return out


# send() re-reads a topic's metadata this often (ms) even without a change, so
# Cluster.topic() can refresh metadata older than metadata_max_age.
_ROUTE_MAX_AGE_MS = 1000


@dataclass(slots=True)
class _Route:
    """A topic's partitions as send() needs them (one dict lookup per record)."""

    num: int
    available: list[int] | None  # partitions with a known leader (None: all)
    queues: list[_PartitionQueue]  # the accumulator's queue of each partition
    version: int  # Cluster.version it was built from
    expires_ms: int  # wall-clock time (ms) after which it is rebuilt (a clock step only rebuilds it early or late)
    sticky: int  # the partition keyless records go to (StickyPartitioner's choice)
    txn_generation: list[int]  # per partition: the transaction it was added to (TransactionManager.generation)


class Producer:
    """Sends records to Sluice topics.

    Arguments (Kafka's producer configs, in Python spelling):

    * ``transactional_id``: enables transactions (``init_transactions()``
      first); None gives an idempotent, non-transactional producer.
    * ``acks``: "all" (-1, the default), 1 or 0. With acks=0 futures resolve
      with offset -1 and idempotence is turned off (without acknowledgements
      there are no retries to deduplicate).
    * ``enable_idempotence``: producer id + per-partition sequence numbers, so
      retries never write duplicates and never reorder (on by default, as in
      Kafka 3). Required by transactions.
    * ``linger_ms``, ``batch_size``: how long a batch waits to fill, and its size in bytes.
    * ``compression``: None, "gzip", "snappy", "lz4" or "zstd".
    * ``max_in_flight``: Produce requests in flight per partition (<= 5 with idempotence).
    * ``delivery_timeout_ms``: upper bound for a record from ``send()`` to
      success or failure, retries included.
    * ``max_request_size``: the largest record (and request) sent; a larger
      record fails with MessageTooLargeError.
    * ``buffer_memory``: the bytes of records waiting to be sent or acknowledged
      (32 MiB, as Kafka's ``buffer.memory``; Kafka counts ``batch.size`` per
      open batch, Sluice the records' bytes); at least ``max_request_size``. A
      ``send()`` whose record does not fit waits for an acknowledgement, up to
      ``max_block_ms``, then its future fails with BufferExhaustedError
      (retriable). A ``send()`` from a record's callback does not wait.
    * ``max_block_ms``: how long ``send()`` waits for a topic's metadata (and,
      then, for room in ``buffer_memory``: each wait up to this long, where Kafka
      counts both against one ``max.block.ms``) and
      transactional calls (init, send_offsets, commit, abort) wait for the
      coordinator, retries included. Transactional calls also stop at
      ``delivery_timeout_ms`` if that is shorter (a departure from Kafka, which
      uses max.block.ms alone): an application that gives records 3 s to be
      delivered learns just as fast that a commit cannot complete. With the
      defaults the bound is Kafka's 60 s. After such a timeout the call may be
      repeated, or the transaction aborted.

    Futures are resolved (and their callbacks, and ``send(callback=...)``'s, run) on the producer's I/O
    threads (gRPC's completion thread for an acknowledgement, the sender thread
    otherwise): a callback should be quick and must not block on the producer
    (``flush()`` in a callback deadlocks).
    """

    def __init__(
        self,
        bootstrap_servers: str | list[str],
        *,
        transactional_id: str | None = None,
        acks: Acks | int | str = "all",
        enable_idempotence: bool = True,
        linger_ms: float = 5,
        batch_size: int = 262_144,
        compression: str | None = None,
        transaction_timeout_ms: int = 60_000,
        max_in_flight: int = 5,
        delivery_timeout_ms: int = 120_000,
        request_timeout_ms: int = 30_000,
        security_protocol: str = "PLAINTEXT",
        ssl_cafile: str | None = None,
        ssl_certfile: str | None = None,
        ssl_keyfile: str | None = None,
        sasl_mechanism: str | None = None,
        sasl_oauthbearer_token_file: str | None = None,
        max_request_size: int = 1_048_576,
        max_block_ms: int = 60_000,
        buffer_memory: int = 33_554_432,
        retry_backoff_ms: int = 100,
        client_id: str | None = None,
    ) -> None:
        acks_int = _acks(acks)
        if transactional_id is not None:
            if not transactional_id:
                raise ValueError("transactional_id must not be empty (use None for a non-transactional producer)")
            if not enable_idempotence:
                raise ValueError("a transactional producer requires enable_idempotence=True")
            if acks_int != -1:
                raise ValueError("a transactional producer requires acks='all'")
        idempotent = enable_idempotence and acks_int != 0
        if idempotent and not 1 <= max_in_flight <= 5:
            raise ValueError("max_in_flight must be between 1 and 5 with idempotence")
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be at least 1")
        if batch_size <= 0 or linger_ms < 0 or delivery_timeout_ms <= 0:
            raise ValueError("batch_size and delivery_timeout_ms must be positive, linger_ms not negative")
        if buffer_memory < max_request_size:
            raise ValueError(
                f"buffer_memory ({buffer_memory}) must be at least max_request_size ({max_request_size}): "
                "a record that fits a request must fit the buffer"
            )
        self.client_id = client_id or "sluice-producer"
        self.transactional_id = transactional_id
        self._max_block = max_block_ms / 1000.0
        # Transactional calls wait for the coordinator at most this long (see the class docstring).
        self._txn_block = min(max_block_ms, delivery_timeout_ms) / 1000.0
        self._request_timeout = request_timeout_ms / 1000.0
        self._transaction_timeout_ms = transaction_timeout_ms
        self._cluster = Cluster(
            bootstrap_servers,
            request_timeout_ms=request_timeout_ms,
            client_id=self.client_id,
            security=ClientSecurity.build(
                security_protocol,
                ssl_cafile,
                ssl_certfile,
                ssl_keyfile,
                sasl_mechanism=sasl_mechanism,
                sasl_oauthbearer_token_file=sasl_oauthbearer_token_file,
            ),
        )
        self._txn = TransactionManager(transactional_id, transaction_timeout_ms, TRANSACTION_VERSION)
        self._sticky = StickyPartitioner()
        self._accumulator = RecordAccumulator(
            AccumulatorConfig(
                batch_size=batch_size,
                linger_ms=linger_ms,
                max_request_size=max_request_size,
                compression=compression_code(compression),
                max_in_flight=max_in_flight,
                idempotent=idempotent,
                delivery_timeout_ms=delivery_timeout_ms,
                retry_backoff_ms=retry_backoff_ms,
                buffer_memory=buffer_memory,
                max_block_ms=max_block_ms,
            ),
            wakeup=self._wakeup,
            # The transaction open for sends, -1 if none: plain reads, no lock taken under the accumulator's.
            current_generation=lambda: self._txn.generation if self._txn.send_ok else -1,
        )
        self._sender = Sender(
            self._cluster,
            self._accumulator,
            self._txn,
            SenderConfig(
                acks=acks_int,
                request_timeout_ms=request_timeout_ms,
                delivery_timeout_ms=delivery_timeout_ms,
                max_request_size=max_request_size,
                transaction_timeout_ms=transaction_timeout_ms,
                idempotent=idempotent,
            ),
            name=f"{self.client_id}-sender",
        )
        self._transactional = transactional_id is not None
        self._max_record_size = max_request_size - BATCH_OVERHEAD
        self._routes: dict[str, _Route] = {}
        self._previous_txn_state = ""
        self._closed = False
        self._close_lock = threading.Lock()
        self._sender.start()

    def _wakeup(self) -> None:
        sender = getattr(self, "_sender", None)
        if sender is not None:
            sender.wakeup()

    # ------------------------------------------------------------------ sending

    def send(
        self,
        topic: str,
        value: bytes | str | None = None,
        key: bytes | str | None = None,
        partition: int | None = None,
        headers: HeadersArg = None,
        timestamp_ms: int | None = None,
        callback: DeliveryCallback | None = None,
    ) -> FutureRecordMetadata:
        """Queue a record; the future resolves to its RecordMetadata once stored.

        Blocks only to learn the topic's partitions (up to max_block_ms) and, with buffer_memory
        full, for room (as long again). Raises IllegalStateError when sending is not legal now
        (closed, no transaction open on a transactional producer) and ProducerFencedError after
        the producer was fenced; delivery errors fail the future.

        ``callback(metadata, exception)`` is Kafka's ``send(record, callback)``: it runs once the
        record is stored (exception None) or failed (metadata with offset and timestamp -1), on
        the producer's I/O thread, in send order for a partition; for a record send() refuses
        at once, on the calling thread before send() returns. It costs less than
        ``add_done_callback`` on the future: nothing is kept per record but the callback itself.
        """
        # The per-record hot path: keep it to attribute reads, one clock read and one lock (the accumulator's).
        if self._closed:
            raise errors.IllegalStateError("cannot send: the producer is closed")
        txn = self._txn
        generation = txn.generation  # read before the check: the record belongs to the transaction it passed in
        if not txn.send_ok:
            txn.check_can_send()
        if value is not None and value.__class__ is not bytes:
            value = _as_bytes(value, "value")
        if key is not None and key.__class__ is not bytes:
            key = _as_bytes(key, "key")
        hdrs = _headers(headers) if headers else None
        now_ms = _time_ns() // 1_000_000
        route = self._routes.get(topic)
        if route is None or now_ms >= route.expires_ms or route.version != self._cluster.version:
            try:
                route = self._route(topic, now_ms)
            except errors.SluiceError as exc:
                return self._refused(exc, generation, callback, topic, partition)
        size = RECORD_OVERHEAD + (len(value) if value is not None else 0)
        if key is not None:
            size += len(key)
        if hdrs:
            size = record_size(key, value, hdrs)
        accumulator = self._accumulator
        if size > self._max_record_size:
            return self._refused(accumulator.too_large(size), generation, callback, topic, partition)
        ts = now_ms if timestamp_ms is None else timestamp_ms
        transactional = self._transactional
        try:  # no cost unless raised
            if partition is None and key is None:
                chosen = route.sticky
                future = accumulator.append_to(
                    route.queues[chosen], key, value, hdrs, ts, size, transactional, True, generation, callback
                )
                if future is None:  # the sticky batch is full or gone: stick to another partition
                    chosen = self._next_sticky(route, chosen)
                    future = accumulator.append_to(
                        route.queues[chosen], key, value, hdrs, ts, size, transactional, False, generation, callback
                    )
            else:
                if partition is None:
                    chosen = partition_for_key(key, route.num)  # type: ignore[arg-type]  # key is not None here
                else:
                    chosen = partition
                    if not 0 <= partition < route.num:
                        self._cluster.refresh_if_stale([topic])
                        num = self._cluster.partition_count(topic) or route.num
                        if not 0 <= partition < num:
                            return self._refused(
                                errors.UnknownTopicOrPartitionError(
                                    f"partition {partition} of topic {topic!r} does not exist (it has {num})"
                                ),
                                generation,
                                callback,
                                topic,
                                partition,
                            )
                        route = self._route(topic, now_ms)
                future = accumulator.append_to(
                    route.queues[chosen], key, value, hdrs, ts, size, transactional, False, generation, callback
                )
        except errors.BufferExhaustedError as exc:  # waited max_block_ms for buffer_memory
            return self._refused(exc, generation, callback, topic, chosen)
        except errors.IllegalStateError:
            if transactional and not txn.send_ok:  # the transaction moved on while send() waited for space
                txn.check_can_send()  # its own error (abortable, or IllegalStateError naming the state)
            raise
        if transactional and route.txn_generation[chosen] != generation:
            route.txn_generation[chosen] = generation
            if txn.maybe_add_partition(route.queues[chosen].tp):
                self._wakeup()
        if _tracing.tracer is not None and future is not None:  # optional spans (sluice.client.tracing)
            _tracing.sent(topic, chosen, future)
        return future  # type: ignore[return-value]  # None only with abort_on_new_batch

    def send_many(
        self,
        topic: str,
        values: Iterable[bytes | bytearray | memoryview | str | None],
        partition: int | None = None,
        timestamp_ms: int | None = None,
    ) -> SentRecords:
        """Queue keyless records without headers, one per value, in order; their futures
        (a :class:`~sluice.client.types.SentRecords`: ``wait()`` waits for all of them).

        What ``[send(topic, value=v, partition=partition, timestamp_ms=timestamp_ms) for v in values]``
        does (the same sticky partitioning, batches, errors and transaction), with the per-record
        work of :meth:`send` done once per batch: a bulk writer (Spark's sink) spends a fraction of
        the CPU per record. A value too large for a request makes every value go through
        :meth:`send`, so that each gets its own answer.
        """
        items = [v if v is None or v.__class__ is bytes else _as_bytes(v, "value") for v in values]
        if self._closed:
            raise errors.IllegalStateError("cannot send: the producer is closed")
        longest = max((len(v) for v in items if v is not None), default=0)
        if RECORD_OVERHEAD + longest > self._max_record_size or _tracing.tracer is not None:
            return self._send_each(topic, items, partition, timestamp_ms)
        txn = self._txn
        generation = txn.generation  # read before the check, as send() does
        if not txn.send_ok:
            txn.check_can_send()
        if not items:
            return SentRecords([])
        now_ms = _time_ns() // 1_000_000
        route = self._routes.get(topic)
        if route is None or now_ms >= route.expires_ms or route.version != self._cluster.version:
            try:
                route = self._route(topic, now_ms)
            except errors.SluiceError as exc:  # every record fails as send() fails it, without waiting again
                refused = self._refused(exc, generation)
                return SentRecords([(refused._outcome, 0, len(items), -1)])
        if partition is not None and not 0 <= partition < route.num:  # send() says why, and refreshes
            return self._send_each(topic, items, partition, timestamp_ms)
        ts = now_ms if timestamp_ms is None else timestamp_ms
        runs: list[tuple[BatchOutcome, int, int, int]] = []
        append, transactional, sticky = self._accumulator.append_values, self._transactional, partition is None
        chosen = route.sticky if partition is None else partition
        start = 0
        while start < len(items):
            if start and not txn.send_ok:  # the transaction broke meanwhile: raise as the next send() would
                txn.check_can_send()
            before = start
            try:
                start, _full = append(route.queues[chosen], items, start, ts, transactional, generation, runs, sticky)
                if start == before:  # the sticky partition needs a new batch: stick to another one, as send() does
                    chosen = self._next_sticky(route, chosen)
                    start, _full = append(route.queues[chosen], items, start, ts, transactional, generation, runs)
            except errors.BufferExhaustedError as exc:  # the rest fail as send() fails each of them
                refused = self._refused(exc, generation)
                runs.append((refused._outcome, 0, len(items) - start, -1))
                break
            if transactional and route.txn_generation[chosen] != generation:
                route.txn_generation[chosen] = generation
                if txn.maybe_add_partition(route.queues[chosen].tp):
                    self._wakeup()
        return SentRecords(runs)

    def _send_each(
        self, topic: str, items: list[bytes | None], partition: int | None, timestamp_ms: int | None
    ) -> SentRecords:
        """send_many the slow way, a send() per value (each gets its own answer): the runs of one record."""
        runs = []
        for value in items:
            future = self.send(topic, value=value, partition=partition, timestamp_ms=timestamp_ms)
            runs.append((future._outcome, future._index, 1, future._timestamp))
        return SentRecords(runs)

    def _refused(
        self,
        refusal: errors.SluiceError | FutureRecordMetadata,
        generation: int,
        callback: DeliveryCallback | None = None,
        topic: str = "",
        partition: int | None = None,
    ) -> FutureRecordMetadata:
        """A record send() could not queue (no metadata in time, too large, no such partition, no room in
        buffer_memory in time): its failed future.

        In a transaction the record's absence breaks the transaction, as
        Kafka's producer does: otherwise a commit would succeed without it.
        """
        future = failed_future(refusal) if isinstance(refusal, errors.SluiceError) else refusal
        exc = future.exception(0)
        if self._transactional and isinstance(exc, errors.SluiceError):
            self._txn.send_failed(generation, exc)
        if callback is not None:  # Kafka calls it at once, on the sending thread
            try:
                callback(RecordMetadata(topic, -1 if partition is None else partition, -1, -1), exc)
            except Exception:
                log.exception("exception calling the delivery callback of a refused record")
        return future

    def _route(self, topic: str, now_ms: int) -> _Route:
        """The topic's partitions as send() needs them, rebuilt after any metadata change."""
        version = self._cluster.version  # read first: a change while building makes the next send rebuild
        info = self._cluster.wait_for_topic(topic, Deadline(self._max_block))
        num = len(info.partitions)
        available = [p for p, meta in info.partitions.items() if meta.leader >= 0 and p < num] or None
        old = self._routes.get(topic)
        route = _Route(
            num=num,
            available=available,
            queues=[self._accumulator.queue_for(TopicPartition(topic, p)) for p in range(num)],
            version=version,
            expires_ms=now_ms + _ROUTE_MAX_AGE_MS,
            sticky=self._sticky.partition(topic, num, available),
            txn_generation=[-1] * num,
        )
        if old is not None and old.num == num:
            route.txn_generation = old.txn_generation
        self._routes[topic] = route
        return route

    def _next_sticky(self, route: _Route, previous: int) -> int:
        """The sticky partition ``previous`` needs a new batch: move on to another partition."""
        topic = route.queues[previous].tp.topic
        self._sticky.on_new_batch(topic, route.num, previous, route.available)
        route.sticky = self._sticky.partition(topic, route.num, route.available)
        return route.sticky

    def flush(self, timeout: float | None = None) -> None:
        """Send every queued record now and wait until each has succeeded or failed.

        Raises KafkaTimeoutError if ``timeout`` (seconds) passes first. Errors of
        individual records are on their futures, not raised here.
        """
        self._flush(Deadline(timeout))

    def _flush(self, deadline: Deadline) -> None:
        self._accumulator.begin_flush()
        try:
            for batch in self._accumulator.incomplete():
                if not batch.done.wait(deadline.remaining() if deadline.at != float("inf") else None):
                    raise errors.KafkaTimeoutError("flush() timed out before every record was delivered")
        finally:
            self._accumulator.end_flush()

    def partitions_for(self, topic: str) -> list[int]:
        """The partition numbers of ``topic`` (waits up to max_block_ms for its metadata)."""
        info = self._cluster.wait_for_topic(topic, Deadline(self._max_block))
        return sorted(info.partitions)

    # ------------------------------------------------------------------ transactions

    def _txn_id(self, action: str) -> str:
        if self.transactional_id is None:
            raise errors.IllegalStateError(f"cannot {action}: the producer has no transactional_id")
        if self._closed:
            raise errors.IllegalStateError(f"cannot {action}: the producer is closed")
        return self.transactional_id

    def _deadline(self, timeout: float | None) -> Deadline:
        return Deadline(self._txn_block if timeout is None else timeout)

    def init_transactions(
        self,
        timeout: float | None = None,
        *,
        keep_prepared_txn: bool = False,
        abort_prepared_txn: bool = False,
    ) -> PreparedTransaction | None:
        """Get the producer id and epoch for the transactional_id; fences older instances.

        The coordinator completes or aborts a transaction the previous
        instance left open. Call once, before the first transaction; a
        second call raises IllegalStateError. ``timeout`` (seconds) defaults
        to the transactional bound (see the class docstring); after a timeout the call may be repeated.

        A *prepared* transaction of the id (``prepare_transaction()``) is
        never aborted silently: without a flag this raises
        InvalidTxnStateError (fatal for this producer). ``abort_prepared_txn``
        aborts it and goes on as usual; ``keep_prepared_txn`` keeps it and
        returns its handle: the producer then holds it
        (``transaction_state`` PREPARED_TRANSACTION) and ``commit_transaction()``
        or ``abort_transaction()`` ends it. Returns None otherwise.
        """
        txn_id = self._txn_id("init_transactions")
        if keep_prepared_txn and abort_prepared_txn:
            raise ValueError("keep_prepared_txn and abort_prepared_txn exclude each other")
        self._txn.begin_init()
        try:
            response = self._init_producer_id_response(
                txn_id,
                -1,
                -1,
                self._deadline(timeout),
                keep_prepared_txn=keep_prepared_txn,
                abort_prepared_txn=abort_prepared_txn,
            )
        except errors.SluiceError as exc:
            self._txn.init_failed(exc)
            raise
        self._txn.complete_init(response.producer_id, response.producer_epoch)
        self._previous_txn_state = response.previous_state
        kept = None
        if keep_prepared_txn and response.previous_state == "Prepared":
            self._txn.kept_prepared(response.producer_id, response.producer_epoch)
            kept = PreparedTransaction(txn_id, response.producer_id, response.producer_epoch)
        self._wakeup()
        return kept

    @property
    def previous_transaction_state(self) -> str:
        """The id's state at the coordinator before init_transactions() ("" for a new id).

        "CompleteCommit" when the id's last transaction committed, "Prepared"
        when a prepared transaction was kept. (No Kafka counterpart: a writer
        that uses each transactional id for one transaction, as the Spark
        sink does, learns here that its work was already committed.)
        """
        return self._previous_txn_state

    def _init_producer_id(
        self, txn_id: str, producer_id: int, producer_epoch: int, deadline: Deadline
    ) -> tuple[int, int]:
        response = self._init_producer_id_response(txn_id, producer_id, producer_epoch, deadline)
        return response.producer_id, response.producer_epoch

    def _init_producer_id_response(
        self,
        txn_id: str,
        producer_id: int,
        producer_epoch: int,
        deadline: Deadline,
        *,
        keep_prepared_txn: bool = False,
        abort_prepared_txn: bool = False,
    ) -> broker_pb2.InitProducerIdResponse:
        request = broker_pb2.InitProducerIdRequest(
            transactional_id=txn_id,
            transaction_timeout_ms=self._transaction_timeout_ms,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            keep_prepared_txn=keep_prepared_txn,
            abort_prepared_txn=abort_prepared_txn,
        )
        response: broker_pb2.InitProducerIdResponse = self._cluster.coordinator_call(
            txn_id,
            TRANSACTION,
            rpcs.INIT_PRODUCER_ID,
            request,
            response_error,
            deadline,
        )
        return response

    def begin_transaction(self) -> None:
        """Start a transaction (local only: the coordinator learns of it with the first send)."""
        self._txn_id("begin_transaction")
        self._txn.begin_transaction()

    def send_offsets_to_transaction(
        self,
        offsets: Mapping[TopicPartition, int],
        group_metadata: GroupMetadata | str,
        timeout: float | None = None,
    ) -> None:
        """Commit consumed ``offsets`` (next offset to read, per partition) as part of the transaction.

        ``group_metadata`` is ``consumer.group_metadata()``: with the member id
        and epoch, the group coordinator refuses the commit of a consumer that
        lost its partitions in a rebalance (a zombie, KIP-447). The offsets
        become visible to the group only if the transaction commits.
        """
        txn_id = self._txn_id("send_offsets_to_transaction")
        self._txn.check_in_transaction("send_offsets_to_transaction")
        gm = group_metadata if isinstance(group_metadata, GroupMetadata) else GroupMetadata(str(group_metadata))
        if not gm.group_id:
            raise errors.InvalidGroupIdError("send_offsets_to_transaction needs a consumer group id")
        deadline = self._deadline(timeout)
        producer_id, producer_epoch = self._txn.producer_id_and_epoch()
        try:
            self._cluster.coordinator_call(
                txn_id,
                TRANSACTION,
                rpcs.ADD_OFFSETS_TO_TXN,
                broker_pb2.AddOffsetsToTxnRequest(
                    transactional_id=txn_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    group_id=gm.group_id,
                    transaction_version=self._txn.transaction_version,
                ),
                response_error,
                deadline,
            )
            self._txn.offsets_added()
            by_topic: dict[str, list[broker_pb2.OffsetCommitPartition]] = {}
            for tp, offset in offsets.items():
                by_topic.setdefault(tp.topic, []).append(
                    broker_pb2.OffsetCommitPartition(
                        partition=tp.partition, committed_offset=int(offset), committed_leader_epoch=-1
                    )
                )
            if by_topic:
                self._cluster.coordinator_call(
                    gm.group_id,
                    GROUP,
                    rpcs.TXN_OFFSET_COMMIT,
                    broker_pb2.TxnOffsetCommitRequest(
                        transactional_id=txn_id,
                        group_id=gm.group_id,
                        producer_id=producer_id,
                        producer_epoch=producer_epoch,
                        member_id=gm.member_id,
                        member_epoch=gm.member_epoch,
                        topics=[broker_pb2.OffsetCommitTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
                    ),
                    lambda r: first_error((x.error_code, x.error_message) for x in r.results),
                    deadline,
                )
        except errors.SluiceError as exc:
            raise self._transactional_failure(exc, "send_offsets_to_transaction") from None

    def _transactional_failure(self, exc: errors.SluiceError, action: str) -> errors.SluiceError:
        """Record what a failed coordinator call means for the producer; the error to raise."""
        if exc.retriable:
            return exc  # ran out of time: the call may be repeated
        if ends_the_producer(exc):  # KIP-1050: application-recoverable (fenced) or fatal
            self._txn.set_fatal_error(exc)
            return self._txn.last_error or exc
        self._txn.set_abortable_error(exc)  # abortable: abort_transaction() and go on
        return exc

    def commit_transaction(self, timeout: float | None = None) -> None:
        """Flush the transaction's records, then commit it (EndTxn).

        Raises the error that broke the transaction if a send or an offset
        commit in it failed (abort_transaction() is then the only way on),
        InvalidProducerEpochError (abortable) if the coordinator aborted the
        transaction after its transaction_timeout_ms (abort_transaction() then
        succeeds and the producer goes on), ProducerFencedError if another
        instance took over, KafkaTimeoutError
        (or the last retriable error) when ``timeout`` passes: the call may
        then be repeated.
        """
        with _tracing.settle("commit", self.transactional_id or ""):  # a span when tracing is on
            self._commit_transaction(timeout)

    def _commit_transaction(self, timeout: float | None) -> None:
        txn_id = self._txn_id("commit_transaction")
        self._txn.begin_commit()
        generation = self._txn.generation
        deadline = self._deadline(timeout)
        self._flush(deadline)
        # A send() that passed its check just before begin_commit may have queued a record after the
        # flush looked: the transaction is not complete until every batch of it is resolved.
        while self._accumulator.incomplete(generation):
            self._flush(deadline)
        # A batch of this transaction that failed recorded its error before it stopped counting as
        # incomplete (Sender._fail_batch): this raises it.
        self._txn.raise_if_error("commit_transaction")
        if self._txn.needs_end_txn():
            self._take_handle(self._end_txn(txn_id, True, deadline), committed=True)
        self._txn.complete_transaction()

    def prepare_transaction(self, timeout: float | None = None) -> PreparedTransaction:
        """Flush the transaction's records and PREPARE it; its handle for whoever decides its outcome.

        After this the coordinator holds the transaction as Prepared: its
        timeout no longer aborts it, and only a commit or an abort with the
        handle ends it, from this producer (``commit_transaction()`` /
        ``abort_transaction()``) or from any client
        (``Admin.commit_prepared_transaction(handle)``). Closing this producer
        leaves it prepared. A transaction with no records can be prepared too
        (it commits to nothing). Raises like ``commit_transaction()``; after a
        timeout the call may be repeated.
        """
        txn_id = self._txn_id("prepare_transaction")
        self._txn.begin_prepare()
        deadline = self._deadline(timeout)
        self._flush(deadline)
        self._txn.raise_if_error("prepare_transaction")
        self._wait_in_flight(deadline)
        producer_id, producer_epoch = self._txn.producer_id_and_epoch()
        try:
            self._cluster.coordinator_call(
                txn_id,
                TRANSACTION,
                rpcs.PREPARE_TXN,
                broker_pb2.PrepareTxnRequest(
                    transactional_id=txn_id, producer_id=producer_id, producer_epoch=producer_epoch
                ),
                response_error,
                deadline,
            )
        except errors.SluiceError as exc:
            raise self._transactional_failure(exc, "prepare_transaction") from None
        self._txn.complete_prepare()
        return PreparedTransaction(txn_id, producer_id, producer_epoch)

    def abort_transaction(self, timeout: float | None = None) -> None:
        """Abort the transaction: unsent records fail with TransactionAbortedError, the rest is rolled back.

        Legal in a transaction and after an (abortable) error in one, a
        transaction the coordinator timed out included; after a fatal error
        (fenced) it raises that error. The coordinator answers a bumped epoch
        (transaction protocol v2), which the next transaction uses.
        """
        with _tracing.settle("abort", self.transactional_id or ""):  # a span when tracing is on
            self._abort_transaction(timeout)

    def _abort_transaction(self, timeout: float | None) -> None:
        txn_id = self._txn_id("abort_transaction")
        self._txn.begin_abort()
        deadline = self._deadline(timeout)
        # the sender does it too, for batches that come back for a retry
        self._sender.abort_undrained(self._txn.generation)
        self._wait_in_flight(deadline)
        if self._txn.needs_end_txn():
            self._take_handle(self._end_txn(txn_id, False, deadline), committed=False)
        if self._txn.epoch_bump_needed:
            producer_id, producer_epoch = self._txn.producer_id_and_epoch()
            try:
                new_id, new_epoch = self._init_producer_id(txn_id, producer_id, producer_epoch, deadline)
            except errors.SluiceError as exc:
                raise self._transactional_failure(exc, "abort_transaction") from None
            self._txn.complete_epoch_bump(new_id, new_epoch)
            aborted = TransactionAbortedError("the transaction was aborted before the record was sent")
            for batch in self._accumulator.reset_sequences():
                self._accumulator.fail(batch, aborted)
        self._txn.complete_transaction()
        self._wakeup()

    def _wait_in_flight(self, deadline: Deadline) -> None:
        """Wait until no batch is in flight and no AddPartitionsToTxn is under way."""
        pending: list[ProducerBatch] = self._accumulator.incomplete()
        for batch in pending:
            if not batch.done.wait(deadline.remaining() if deadline.at != float("inf") else None):
                raise errors.KafkaTimeoutError("timed out waiting for in-flight records before ending the transaction")
        while self._txn.adding_partitions():
            if deadline.expired():
                raise errors.KafkaTimeoutError("timed out waiting for AddPartitionsToTxn")
            threading.Event().wait(0.005)

    def _take_handle(self, handle: tuple[int, int], committed: bool) -> None:
        """Go on with the handle EndTxn answered: the epoch is bumped at every end (TV2).

        A new epoch starts every partition at sequence 0 again. Nothing is
        queued or in flight at an end (a commit flushed, an abort failed what
        was queued), so nothing is dropped; should anything be, it fails
        rather than being written twice. An answer without a handle (-1, from
        a broker before TV2) changes nothing.

        A successful answer with the producer's *current* handle ended
        nothing: a coordinator that ends a transaction bumps the epoch, and a
        retry of an end that completed answers the bumped one. It is the
        answer for a transactional id whose last transaction was already
        complete, i.e. the coordinator never had this one. Taking it as
        success would report a commit of records that were not committed:
        the producer and the coordinator disagree, and the producer ends
        (InvalidTxnStateError, fatal; a new producer's init_transactions()
        settles the id). Except for a prepared transaction: another client
        may have ended it with the same outcome (Admin speaks protocol
        version 1, which does not bump), and the answer says so truthfully.
        """
        producer_id, producer_epoch = handle
        if producer_id < 0:
            return
        current = (producer_id, producer_epoch) == self._txn.producer_id_and_epoch()
        if current and self._txn.was_prepared:
            return
        if current:
            outcome = "committed" if committed else "aborted"
            exc = errors.InvalidTxnStateError(
                f"EndTxn answered the producer's current handle ({producer_id}/{producer_epoch}): "
                f"the coordinator ended no transaction, so this one was not {outcome}; "
                "close the producer and create a new one"
            )
            self._txn.set_fatal_error(exc)
            raise self._txn.last_error or exc
        self._txn.complete_epoch_bump(producer_id, producer_epoch)
        aborted = TransactionAbortedError("the transaction ended before the record was sent")
        for batch in self._accumulator.reset_sequences():
            self._accumulator.fail(batch, aborted)

    def _end_txn(self, txn_id: str, committed: bool, deadline: Deadline) -> tuple[int, int]:
        """EndTxn; the handle (producer id, epoch) to go on with."""
        producer_id, producer_epoch = self._txn.producer_id_and_epoch()
        try:
            response: broker_pb2.EndTxnResponse = self._cluster.coordinator_call(
                txn_id,
                TRANSACTION,
                rpcs.END_TXN,
                broker_pb2.EndTxnRequest(
                    transactional_id=txn_id,
                    producer_id=producer_id,
                    producer_epoch=producer_epoch,
                    committed=committed,
                    transaction_version=self._txn.transaction_version,
                ),
                response_error,
                deadline,
            )
        except errors.SluiceError as exc:
            action = "commit_transaction" if committed else "abort_transaction"
            if not exc.retriable and not committed and not self._txn.is_fencing(exc):
                # the abort cannot go through for a reason the producer cannot repair
                self._txn.set_fatal_error(exc)
                raise self._txn.last_error or exc from None
            raise self._transactional_failure(exc, action) from None
        return response.producer_id, response.producer_epoch

    @property
    def transaction_state(self) -> TransactionState:
        """The transaction manager's state (for tests and diagnostics)."""
        return self._txn.state

    # ------------------------------------------------------------------ lifecycle

    def close(self, timeout: float | None = None) -> None:
        """Deliver queued records (up to ``timeout`` seconds), then stop; undelivered records fail.

        An open transaction is left as it is (not aborted): the coordinator
        aborts it after transaction_timeout_ms, or the next producer with the
        same transactional_id aborts it in init_transactions().
        """
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        self._accumulator.close()
        self._sender.initiate_close()
        self._sender.join(timeout)
        if self._sender.is_alive():
            self._sender.force_close()
            self._sender.join(5.0)
        self._cluster.close()

    def __enter__(self) -> Producer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Producer(transactional_id={self.transactional_id!r}, state={self._txn.state.value})"


__all__ = ["PreparedTransaction", "Producer", "TransactionAbortedError"]
