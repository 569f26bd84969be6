"""The producer's background sender thread: from the accumulator to partition leaders.

One loop, one thread, and every decision about a batch's fate made in it:

1. Take the responses that arrived (gRPC completes the calls on its own
   thread; its callback acknowledges a fully successful response right there,
   which takes a thread hand-off off every record's latency, and queues
   anything else for this thread, keeping the order responses arrived in).
   Success completes the batch's futures; a retriable error queues it again
   in sequence order (see ``accumulator``), after forgetting the leader when
   the error says it moved; anything else fails the batch's records.
2. Idempotent producer without a producer id yet: InitProducerId (empty
   transactional id). After a batch with a sequence failed for good, the
   partition's sequence has a gap the broker will never accept: once nothing
   is in flight, bump the epoch (InitProducerId with the current id and
   epoch, KIP-360) and start every partition at sequence 0 again.
3. Transactional producer: AddPartitionsToTxn for the partitions ``send()``
   used for the first time in this transaction, all of them in one request.
   Their batches are not drained before the coordinator confirmed them.
   A transaction that can only abort (ABORTABLE_ERROR, ABORTING) fails
   every batch of it still waiting to be sent, retries included: they belong
   to a transaction that will not commit, and abort_transaction() waits for
   them. Only batches of *that* transaction (its generation, read with the
   decision): by the time they are failed the application may have ended the
   abort and queued the next transaction's records.
4. Expire batches older than delivery_timeout_ms.
5. Ask the accumulator which partitions are ready, group them by leader
   (refreshing metadata for partitions without a known leader) and send one
   Produce request per leader, carrying one batch per partition, without
   waiting for the answer (``grpc.Future``).
6. Sleep until the next batch's linger time, a retry backoff, or a wakeup.

Errors that break a transaction (a batch that cannot be delivered) move the
transaction manager to ABORTABLE_ERROR, if the batch's transaction is still
the current one, and before the batch stops counting as incomplete (a commit
that finds it gone finds the error); fencing errors move it to FATAL_ERROR.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import (
    METADATA_REFRESH_CODES,
    TRANSACTION,
    Backoff,
    Cluster,
    Deadline,
    map_rpc_error,
)
from sluice.client._network import rpc as rpcs
from sluice.client.producer.accumulator import ProducerBatch, RecordAccumulator
from sluice.client.producer.transaction_manager import (
    CONCURRENT_TRANSACTIONS_RETRY_S,
    TransactionManager,
    TransactionState,
)
from sluice.client.types import TopicPartition
from sluice.records import varint

log = logging.getLogger("sluice.client.producer")

# Codes that fail only the batch they answer (the records are refused, the producer lives on).
_SEQUENCE_BREAKING = frozenset({records_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER, records_pb2.UNKNOWN_PRODUCER_ID})


class TransactionAbortedError(errors.SluiceError):
    """The record was not sent: its transaction was aborted first (Kafka's TransactionAbortedException)."""

    code = records_pb2.NONE
    category = errors.Category.ABORTABLE  # KIP-654: the producer goes on


class ProducerClosedError(errors.IllegalStateError):
    """The producer was closed before the record could be delivered."""


# Tags of the length-delimited fields composed by hand: (field number << 3) | 2.
_TAG_REQUEST_TOPICS = b"\x22"  # ProduceRequest.topics = 4
_TAG_TOPIC_PARTITIONS = b"\x12"  # ProduceTopicData.partitions = 2
_TAG_PARTITION_BATCH = b"\x12"  # ProducePartitionData.batch = 2


def encode_produce_request(
    transactional_id: str, acks: int, timeout_ms: int, batches: list[tuple[str, int, tuple[bytes, ...]]]
) -> bytes:
    """A serialized ProduceRequest carrying ``(topic, partition, serialized RecordBatch)`` batches.

    Each batch is given as the pieces of its serialization (their
    concatenation is the RecordBatch message, see
    ``BatchBuilder.build_serialized``). The result is the same bytes as
    ``ProduceRequest(...).SerializeToString()``, but each batch's bytes are
    copied once (into the result), never parsed into a message: building the
    message would deep-copy every batch (about 1 ms per 256 KiB batch with
    upb), which bounded the producer.
    """
    by_topic: dict[str, list[bytes]] = {}
    for topic, partition, pieces in batches:
        entry_head = broker_pb2.ProducePartitionData(partition=partition).SerializeToString()
        batch_len = sum(len(p) for p in pieces)
        batch_tag = _TAG_PARTITION_BATCH + varint(batch_len)
        entry_len = len(entry_head) + len(batch_tag) + batch_len
        by_topic.setdefault(topic, []).extend(
            (_TAG_TOPIC_PARTITIONS + varint(entry_len), entry_head, batch_tag, *pieces)
        )
    parts = [
        broker_pb2.ProduceRequest(
            transactional_id=transactional_id, acks=acks, timeout_ms=timeout_ms
        ).SerializeToString()
    ]
    for topic, entries in by_topic.items():
        name = broker_pb2.ProduceTopicData(name=topic).SerializeToString()
        topic_len = len(name) + sum(len(p) for p in entries)
        parts += (_TAG_REQUEST_TOPICS, varint(topic_len), name)
        parts += entries
    return b"".join(parts)


@dataclass(slots=True)
class SenderConfig:
    acks: int = -1
    request_timeout_ms: int = 30_000
    delivery_timeout_ms: int = 120_000
    max_request_size: int = 1_048_576
    transaction_timeout_ms: int = 60_000
    idempotent: bool = True


@dataclass(slots=True)
class _Request:
    addr: str
    batches: dict[TopicPartition, ProducerBatch]
    future: grpc.Future[broker_pb2.ProduceResponse] | None = None


class Sender(threading.Thread):
    """Drains the accumulator into Produce requests. Started by the Producer."""

    def __init__(
        self,
        cluster: Cluster,
        accumulator: RecordAccumulator,
        txn: TransactionManager,
        config: SenderConfig,
        name: str = "sluice-producer-sender",
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.cluster = cluster
        self.accumulator = accumulator
        self.txn = txn
        self.config = config
        self._wake_event = threading.Event()
        self._completions: deque[_Request] = deque()
        # Held while a response is handled, by the sender thread or gRPC's (see _on_response).
        self._completion_lock = threading.Lock()
        self._in_flight: set[int] = set()  # ids of requests under way
        self._keep_running = True
        self._force_close = False
        self._broken: set[TopicPartition] = set()  # partitions whose sequence has a gap
        self._init_backoff = Backoff(0.1, 1.0)
        self._init_retry_at = 0.0
        self._add_backoff = Backoff(0.02, 0.5)
        self._add_retry_at = 0.0
        self._add_request: (
            tuple[list[TopicPartition], grpc.Future[broker_pb2.AddPartitionsToTxnResponse], str, int] | None
        ) = None
        self._stopped_event = threading.Event()

    # ------------------------------------------------------------------ control

    def wakeup(self) -> None:
        self._wake_event.set()

    def initiate_close(self) -> None:
        """Send what is queued, then stop."""
        self._keep_running = False
        self.wakeup()

    def force_close(self) -> None:
        """Stop now; fail what is not delivered."""
        self._force_close = True
        self._keep_running = False
        self.wakeup()

    # ------------------------------------------------------------------ loop

    def run(self) -> None:
        try:
            while self._keep_running:
                self._run_once_safely()
            while not self._force_close and (self.accumulator.has_incomplete() or self._in_flight):
                self._fail_unsendable_on_close()
                self._run_once_safely()
        finally:
            exc = ProducerClosedError("the producer was closed before the record was delivered")
            self.accumulator.abort_queued()  # out of their queues; failed with the rest just below
            for batch in self.accumulator.incomplete():
                # through the transaction: a commit still flushing on another thread must not succeed
                self._fail_batch(batch, exc)
            self._stopped_event.set()

    def _run_once_safely(self) -> None:
        try:
            self._run_once()
        except Exception:  # a bug must not stop delivery for good: log it and go on
            log.exception("unexpected error in the producer's sender thread")
            self._wake_event.wait(0.1)

    def _run_once(self) -> None:
        self._process_completions()
        now = time.monotonic()
        wait = 1.0

        if self.txn.state is TransactionState.FATAL_ERROR:
            err = self.txn.last_error or errors.IllegalStateError("the producer is in a fatal error state")
            for batch in self.accumulator.abort_queued():
                self.accumulator.fail(batch, err)

        aborting = self.txn.aborting_generation()
        if aborting is not None:
            self.abort_undrained(*aborting)

        idempotent_only = self.config.idempotent and not self.txn.is_transactional
        if idempotent_only and not self._ensure_producer_id(now):
            self._sleep(min(wait, max(0.01, self._init_retry_at - now)))
            return

        if self.txn.is_transactional:
            self._add_partitions(now)
            if self.txn.has_pending_partitions() and self._add_request is None:
                wait = min(wait, max(0.005, self._add_retry_at - now))

        for batch in self.accumulator.expire(now):
            self._fail_batch(
                batch,
                errors.KafkaTimeoutError(
                    f"{batch.record_count} record(s) for {batch.tp} expired after "
                    f"{self.config.delivery_timeout_ms} ms (delivery_timeout_ms)"
                    + (f": last error: {batch.last_error}" if batch.last_error else "")
                ),
            )

        if self._broken and idempotent_only:
            # no new batch until in-flight ones are back and the epoch was bumped
            self._sleep(0.05)
            return

        producer_id, producer_epoch = self.txn.producer_id_and_epoch()
        # Only the current transaction's batches are sent (a record that raced its transaction's end waits
        # and expires instead of joining the next transaction under its epoch).
        generation = self.txn.generation if self.txn.is_transactional else None
        if self.config.idempotent and (producer_id < 0 or not self.txn.has_producer_id):
            self._sleep(min(wait, 0.05))
            return
        ready, delay = self.accumulator.ready(now, self.txn.is_partition_added, poll_queued=0.1)
        wait = min(wait, delay)
        by_leader: dict[str, list[TopicPartition]] = defaultdict(list)
        unknown: set[str] = set()
        for tp in ready:
            leader = self.cluster.leader(tp.topic, tp.partition)
            if leader is None:
                unknown.add(tp.topic)
            else:
                by_leader[leader[0]].append(tp)
        if unknown:  # bounded: the sender thread also expires batches and handles responses
            self.cluster.refresh_if_stale(
                unknown, min_age=0.1, timeout=min(self.config.request_timeout_ms / 1000.0, 5.0)
            )
            wait = min(wait, 0.05)
        for addr, tps in by_leader.items():
            throttled = self.cluster.throttled_for(addr)
            if throttled > 0:  # the broker said how long to wait (KIP-219): its batches keep until then
                wait = min(wait, throttled)
                continue
            batches = self.accumulator.drain(
                tps, now, producer_id, producer_epoch, self.config.max_request_size, generation
            )
            if batches:
                self._send(addr, batches)
        self._sleep(wait)

    def abort_undrained(self, generation: int, error: errors.SluiceError | None = None) -> None:
        """The transaction ``generation`` can only abort and sends nothing more: fail what waits to be sent.

        That includes batches sent before and queued again for a retry (their
        partition no longer counts as added once the transaction is aborting,
        so they would otherwise wait for delivery_timeout_ms, and
        abort_transaction() with them). One that was sent may be stored with
        its sequence: the abort bumps the epoch, which restarts sequences.
        Called on this thread every round while the transaction can only abort,
        and by abort_transaction() itself (the accumulator's lock makes that safe).
        ``generation`` is the transaction the caller decided to abort
        (``TransactionManager.aborting_generation``): the application may have
        ended that abort and queued the next transaction's records since, and
        those must not be touched. ``error`` broke the transaction (None: a
        plain abort).
        """
        exc: errors.SluiceError = error or TransactionAbortedError(
            "the transaction was aborted before the record was sent"
        )
        for batch in self.accumulator.abort_queued(lambda b: b.transactional and b.generation == generation):
            if batch.sealed:
                self.txn.request_epoch_bump()
            self.accumulator.fail(batch, exc)

    def _sleep(self, seconds: float) -> None:
        if seconds > 0 and not self._completions:
            self._wake_event.wait(seconds)
        self._wake_event.clear()

    def _fail_unsendable_on_close(self) -> None:
        """On close, batches of a transaction that can no longer commit will never be sent."""
        if not self.txn.is_transactional:
            return
        if self.txn.state not in (TransactionState.IN_TRANSACTION, TransactionState.COMMITTING_TRANSACTION):
            exc = ProducerClosedError(
                f"the producer was closed in state {self.txn.state.value}: the record was not sent"
            )
            for batch in self.accumulator.abort_queued():
                self.accumulator.fail(batch, exc)

    # ------------------------------------------------------------------ producer id (idempotent)

    def _ensure_producer_id(self, now: float) -> bool:
        """Make sure an idempotent producer has a producer id; True when it may send."""
        state = self.txn.state
        if state is TransactionState.FATAL_ERROR:
            return True  # batches are failed above
        need_init = not self.txn.has_producer_id
        need_bump = bool(self._broken)
        if not need_init and not need_bump:
            return True
        if not self.accumulator.has_incomplete() and need_init:
            return True  # nothing to send: initialise lazily
        if need_bump and self.accumulator.in_flight_count():
            return True  # wait for in-flight batches to come back first (handled by the caller)
        if now < self._init_retry_at:
            return False
        old_id, old_epoch = self.txn.producer_id_and_epoch()
        try:
            if need_init:
                self.txn.begin_init()
            else:
                self.txn.begin_epoch_bump()
            request = broker_pb2.InitProducerIdRequest(
                transactional_id="",
                transaction_timeout_ms=self.config.transaction_timeout_ms,
                producer_id=old_id if need_bump else -1,
                producer_epoch=old_epoch if need_bump else -1,
            )
            response: broker_pb2.InitProducerIdResponse = self.cluster.call_any(
                rpcs.INIT_PRODUCER_ID, request, min(self.config.request_timeout_ms / 1000.0, 5.0)
            )
            errors.check(response.error_code, response.error_message)
        except errors.SluiceError as exc:
            if exc.retriable:
                if need_bump:  # back to READY with the old id; the bump is retried
                    self.txn.complete_init(old_id, old_epoch)
                else:
                    self.txn.init_failed(exc)
                self._init_retry_at = time.monotonic() + self._init_backoff.next()
                log.debug("InitProducerId failed, retrying: %s", exc)
                return False
            log.error("the idempotent producer cannot get a producer id: %s", exc)
            self.txn.set_fatal_error(exc)
            return True
        self._init_backoff.reset()
        self.txn.complete_init(response.producer_id, response.producer_epoch)
        if need_bump:
            self._broken.clear()
            for batch in self.accumulator.reset_sequences():
                self._fail_batch(
                    batch,
                    batch.last_error or errors.OutOfOrderSequenceError("the batch's outcome is unknown"),
                )
            log.info(
                "producer epoch bumped to %d.%d after a sequence gap", response.producer_id, response.producer_epoch
            )
        return True

    # ------------------------------------------------------------------ transactions

    def _add_partitions(self, now: float) -> None:
        """Send AddPartitionsToTxn for pending partitions, without waiting; handle the answer when it came.

        The sender thread never blocks on the coordinator: a dead coordinator
        must not stop batches from expiring.
        """
        if self._add_request is not None:
            tps, future, addr, generation = self._add_request
            if not future.done():
                return
            self._add_request = None
            self._handle_add_response(tps, future, addr, generation)
        if now < self._add_retry_at or not self.txn.has_pending_partitions():
            return
        txn_id = self.txn.transactional_id or ""
        timeout = self.config.request_timeout_ms / 1000.0
        try:
            _node, addr = self.cluster.find_coordinator(txn_id, TRANSACTION, Deadline(timeout), once=True)
        except errors.SluiceError as exc:
            self._add_failed([], exc, self.txn.generation)
            return
        # The answer is applied to this transaction only: it may have ended by the time it comes.
        generation, tps = self.txn.take_pending_partitions()
        if not tps:
            return
        producer_id, producer_epoch = self.txn.producer_id_and_epoch()
        by_topic: dict[str, list[int]] = defaultdict(list)
        for tp in tps:
            by_topic[tp.topic].append(tp.partition)
        request = broker_pb2.AddPartitionsToTxnRequest(
            transactional_id=txn_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            topics=[broker_pb2.TxnTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
            transaction_version=self.txn.transaction_version,
        )
        try:
            future = self.cluster.call_future(addr, rpcs.ADD_PARTITIONS_TO_TXN, request, timeout)
        except Exception as exc:
            self.cluster.forget_coordinator(txn_id, TRANSACTION)
            err = exc if isinstance(exc, errors.SluiceError) else errors.BrokerNotAvailableError(str(exc))
            self._add_failed(tps, err, generation)
            return
        self._add_request = (tps, future, addr, generation)
        future.add_done_callback(lambda _f: self.wakeup())

    def _handle_add_response(
        self,
        tps: list[TopicPartition],
        future: grpc.Future[broker_pb2.AddPartitionsToTxnResponse],
        addr: str,
        generation: int,
    ) -> None:
        txn_id = self.txn.transactional_id or ""
        try:
            response: broker_pb2.AddPartitionsToTxnResponse = future.result()
        except grpc.RpcError as rpc_exc:
            self.cluster.forget_coordinator(txn_id, TRANSACTION)
            self._add_failed(tps, map_rpc_error(rpc_exc, addr, rpcs.ADD_PARTITIONS_TO_TXN.name), generation)
            return
        except Exception as other:
            self._add_failed(tps, errors.BrokerNotAvailableError(str(other)), generation)
            return
        results = {TopicPartition(r.topic, r.partition): r for r in response.results}
        added: list[TopicPartition] = []
        retry: list[TopicPartition] = []
        fatal: errors.SluiceError | None = None
        for tp in tps:
            r = results.get(tp)
            code = r.error_code if r is not None else records_pb2.NONE
            if code == records_pb2.NONE:
                added.append(tp)
                continue
            err = errors.error_for(code, r.error_message if r is not None else "")
            if code in (records_pb2.NOT_COORDINATOR, records_pb2.COORDINATOR_NOT_AVAILABLE):
                self.cluster.forget_coordinator(txn_id, TRANSACTION)
            if err.retriable:
                retry.append(tp)
            else:
                fatal = fatal or err
        if added:
            self.txn.partitions_added(added, generation)
            self._add_backoff.reset()
        if fatal is not None:
            self.txn.partitions_add_failed([tp for tp in tps if tp not in added], False, generation)
            self.txn.request_error(generation, fatal)
        elif retry:
            self.txn.partitions_add_failed(retry, True, generation)
            self._add_retry_at = time.monotonic() + self._add_retry_delay(retry, results)
        self.wakeup()

    def _add_retry_delay(
        self, retry: list[TopicPartition], results: dict[TopicPartition, broker_pb2.TxnPartitionResult]
    ) -> float:
        """A short flat delay while the previous transaction completes; the growing backoff otherwise."""
        codes = {r.error_code for r in (results.get(tp) for tp in retry) if r is not None}
        if codes == {records_pb2.CONCURRENT_TRANSACTIONS}:
            return CONCURRENT_TRANSACTIONS_RETRY_S
        return self._add_backoff.next()

    def _add_failed(self, tps: list[TopicPartition], exc: errors.SluiceError, generation: int) -> None:
        if exc.retriable:
            self.txn.partitions_add_failed(tps, True, generation)
            self._add_retry_at = time.monotonic() + self._add_backoff.next()
            log.debug("AddPartitionsToTxn failed, retrying: %s", exc)
        else:
            self.txn.partitions_add_failed(tps, False, generation)
            self.txn.request_error(generation, exc)  # the producer ends, or that transaction

    # ------------------------------------------------------------------ produce

    def _send(self, addr: str, batches: list[ProducerBatch]) -> None:
        transactional = any(b.transactional for b in batches)
        request = encode_produce_request(
            (self.txn.transactional_id or "") if transactional else "",
            self.config.acks,
            self.config.request_timeout_ms,
            [(b.tp.topic, b.tp.partition, b.wire_parts or ()) for b in batches],
        )
        req = _Request(addr, {b.tp: b for b in batches})
        self._in_flight.add(id(req))
        try:
            req.future = self.cluster.call_future(
                addr, rpcs.PRODUCE_SERIALIZED, request, self.config.request_timeout_ms / 1000.0 + 5.0
            )
        except Exception as exc:  # the channel could not even start the call
            self._in_flight.discard(id(req))
            err = exc if isinstance(exc, errors.SluiceError) else errors.BrokerNotAvailableError(str(exc))
            for batch in batches:
                self._retry_or_fail(batch, err, maybe_stored=False)
            return

        req.future.add_done_callback(functools.partial(self._on_response_done, req))

    def _on_response_done(self, req: _Request, _future: object) -> None:
        self._on_response(req)

    def _on_response(self, req: _Request) -> None:
        """gRPC's completion callback (its own thread): complete a successful response here, queue the rest.

        Acknowledging at once, rather than waking the sender thread to do it,
        takes a thread hand-off off every record's latency. Anything else (an
        error, or a response arriving while earlier ones still wait) goes to the
        sender thread, and responses are always handled in the order they came.
        """
        with self._completion_lock:
            if not self._completions and self._complete_if_successful(req):
                self._in_flight.discard(id(req))
                return
            self._completions.append(req)
        self._wake_event.set()

    def _complete_if_successful(self, req: _Request) -> bool:
        """Complete every batch of ``req`` if the response acknowledges them all; False (nothing done) otherwise."""
        assert req.future is not None
        if self.config.acks == 0 or not req.future.done():
            return False
        try:
            response: broker_pb2.ProduceResponse = req.future.result(timeout=0)
        except Exception:
            return False
        if response.throttle_time_ms > 0:  # KIP-219: nothing more to this broker until it is over
            self.cluster.throttle(req.addr, response.throttle_time_ms)
        answered: dict[TopicPartition, broker_pb2.ProducePartitionResponse] = {}
        for topic in response.topics:
            for p in topic.partitions:
                if p.error_code not in (records_pb2.NONE, records_pb2.DUPLICATE_SEQUENCE_NUMBER):
                    return False
                answered[TopicPartition(topic.name, p.partition)] = p
        if any(tp not in answered for tp in req.batches):
            return False
        for tp, batch in req.batches.items():
            pr = answered[tp]
            self.accumulator.complete(batch, pr.base_offset, pr.log_append_time)
        return True

    def _process_completions(self) -> None:
        while True:
            with self._completion_lock:
                if not self._completions:
                    return
                req = self._completions.popleft()
                self._in_flight.discard(id(req))
                self._handle_response(req)

    def _handle_response(self, req: _Request) -> None:
        assert req.future is not None
        try:
            response: broker_pb2.ProduceResponse = req.future.result()
        except grpc.RpcError as rpc_exc:
            exc = map_rpc_error(rpc_exc, req.addr, rpcs.PRODUCE_SERIALIZED.name)
            for batch in req.batches.values():
                if exc.retriable:
                    self.cluster.forget_leader(batch.tp.topic, batch.tp.partition)
                # the broker may have stored the batch before the connection dropped or the call timed out
                self._retry_or_fail(batch, exc, maybe_stored=True)
            return
        except Exception as other:  # cancelled on shutdown, ...
            for batch in req.batches.values():
                self._retry_or_fail(batch, errors.BrokerNotAvailableError(str(other)), maybe_stored=True)
            return
        if response.throttle_time_ms > 0:
            self.cluster.throttle(req.addr, response.throttle_time_ms)
        if self.config.acks == 0:
            for batch in req.batches.values():
                self.accumulator.complete(batch, -1)
            return
        answered: dict[TopicPartition, broker_pb2.ProducePartitionResponse] = {}
        for topic in response.topics:
            for p in topic.partitions:
                answered[TopicPartition(topic.name, p.partition)] = p
        for tp, batch in req.batches.items():
            pr = answered.get(tp)
            if pr is None:
                self._retry_or_fail(
                    batch, errors.UnknownServerError(f"the Produce response of {req.addr} omits {tp}"), True
                )
            elif pr.error_code in (records_pb2.NONE, records_pb2.DUPLICATE_SEQUENCE_NUMBER):
                self.accumulator.complete(batch, pr.base_offset, pr.log_append_time)
            else:
                self._handle_error(batch, pr.error_code, pr.error_message)

    def _handle_error(self, batch: ProducerBatch, code: int, message: str) -> None:
        tp = batch.tp
        exc = errors.error_for(code, message)
        if code in METADATA_REFRESH_CODES:
            self.cluster.forget_leader(tp.topic, tp.partition)
        if code in _SEQUENCE_BREAKING and self.config.idempotent:
            first_unacked = tp not in self._broken and not self.accumulator.earlier_unacknowledged(batch)
            if code == records_pb2.UNKNOWN_PRODUCER_ID and first_unacked and not self.txn.is_transactional:
                # The partition forgot this producer (its state expired: producer.id.expiration.ms), so
                # the batch was not stored. As Kafka's producer (KIP-360): a new epoch starts the
                # partition again at sequence 0 and the batch is sent again, not failed.
                log.info("%s forgot producer %d: bumping the epoch and sending again", tp, batch.producer_id)
                self._broken.add(tp)
                self.accumulator.requeue(batch, time.monotonic(), exc)
                return
            if tp in self._broken or self.accumulator.earlier_unacknowledged(batch):
                # the broker saw the gap left by an earlier batch: this one was not stored, resend it in order
                self._retry_or_fail(batch, exc, maybe_stored=False)
                return
            self._sequence_broken(batch, exc)
            return
        if exc.retriable:
            self._retry_or_fail(batch, exc, maybe_stored=False)
            return
        if self.txn.is_fencing(exc) and self.txn.is_transactional:
            self.txn.set_fatal_error(exc)
            self._fail_batch(batch, self.txn.last_error or exc)
            return
        # refused for good (too large, invalid ...): the sequence it held is now a gap
        self._fail_batch(batch, exc)
        if batch.sealed and batch.sequence >= 0 and self.config.idempotent:
            self._mark_broken(tp)

    def _sequence_broken(self, batch: ProducerBatch, exc: errors.SluiceError) -> None:
        log.warning("%s: %s (sequence %d); the producer resets its sequence numbers", batch.tp, exc, batch.sequence)
        self._fail_batch(batch, exc)
        self._mark_broken(batch.tp)

    def _mark_broken(self, tp: TopicPartition) -> None:
        if self.txn.is_transactional:
            # the transaction must be aborted; the abort bumps the epoch, which resets sequences
            self.txn.request_epoch_bump()
            return
        self._broken.add(tp)

    def _retry_or_fail(self, batch: ProducerBatch, exc: errors.SluiceError, maybe_stored: bool) -> None:
        now = time.monotonic()
        if maybe_stored:
            batch.maybe_stored = True
        if not exc.retriable and not isinstance(exc, errors.OutOfOrderSequenceError | errors.UnknownProducerIdError):
            self._fail_batch(batch, exc)
            if batch.sealed and batch.sequence >= 0 and self.config.idempotent:
                self._mark_broken(batch.tp)
            return
        if self.accumulator.is_expired(batch, now) or self._force_close:
            self._fail_batch(
                batch,
                errors.KafkaTimeoutError(
                    f"{batch.record_count} record(s) for {batch.tp} not delivered within "
                    f"delivery_timeout_ms ({self.config.delivery_timeout_ms} ms): last error: {exc}"
                ),
            )
            if batch.sealed and batch.sequence >= 0 and self.config.idempotent:
                self._mark_broken(batch.tp)
            return
        log.debug("retrying %s after %s", batch, exc)
        self.accumulator.requeue(batch, now, exc)

    def _fail_batch(self, batch: ProducerBatch, exc: errors.SluiceError) -> None:
        if batch.transactional:
            # First, while the batch still counts as incomplete: a commit whose flush finds it gone
            # must find its transaction broken. Only its own transaction (fencing ends the producer).
            self.txn.send_failed(batch.generation, exc)
        self.accumulator.fail(batch, exc)

    def wait_stopped(self, timeout: float | None = None) -> bool:
        return self._stopped_event.wait(timeout)
