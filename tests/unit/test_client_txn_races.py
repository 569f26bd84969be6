"""Races between the application and the sender thread that could report a commit of records it dropped (issue 30).

A real Producer against a fake cluster (coordinator and leader in memory).
Its sender thread is not started by the Producer: each test runs the sender's
rounds itself, on a thread of its own, and holds it at the exact point where
the race is (through events, never sleeps), so every interleaving is
deterministic. The invariant checked: a commit_transaction() that returns
has every record of its transaction stored, or it raises.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import Rpc
from sluice.client._network import rpc as rpcs
from sluice.client._network.cluster import PartitionInfo, TopicInfo
from sluice.client.producer import producer as producer_module
from sluice.client.producer.accumulator import AccumulatorConfig, RecordAccumulator
from sluice.client.producer.producer import Producer
from sluice.client.producer.sender import Sender, SenderConfig
from sluice.client.producer.transaction_manager import TransactionManager, TransactionState
from sluice.client.types import TopicPartition
from sluice.records import decode_records

S = TransactionState
WAIT = 10.0  # bound on every wait for the other thread (a hang fails the test instead of blocking it)


class Resolved:
    """A call future that is already answered (grpc.Future's part the sender uses)."""

    def __init__(self, result: Any) -> None:
        self._result = result

    def add_done_callback(self, cb: Callable[[Any], None]) -> None:
        cb(self)

    def done(self) -> bool:
        return True

    def result(self, timeout: float | None = None) -> Any:
        return self._result


class Unanswered:
    """A call future that never completes."""

    def add_done_callback(self, cb: Callable[[Any], None]) -> None:
        pass

    def done(self) -> bool:
        return False

    def cancel(self) -> bool:
        return False


class FakeCluster:
    """The coordinator and the leader of every partition of topic ``t`` (3 partitions), in memory."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.version = 1
        self.epoch = 0
        self.log: list[bytes | None] = []
        self.end_txns: list[bool] = []
        self.echo_current_handle = False  # EndTxn answers the request's handle instead of a bumped one
        self.hold_produce = False  # Produce requests are never answered
        self.produce_arrived = threading.Event()

    # metadata
    def wait_for_topic(self, name: str, deadline: Any) -> TopicInfo:
        if name == "missing":
            raise errors.KafkaTimeoutError(f"topic {name!r} not found within max_block_ms")
        parts = {p: PartitionInfo(name, p, 1, 0, (1,), (1,), 0) for p in range(3)}
        return TopicInfo(name, "id", False, parts)

    def partition_count(self, topic: str) -> int:
        return 3

    def refresh_if_stale(self, *args: Any, **kwargs: Any) -> None:
        pass

    def leader(self, topic: str, partition: int) -> tuple[str, int]:
        return ("fake:1", 1)

    def forget_leader(self, topic: str, partition: int) -> None:
        pass

    def forget_coordinator(self, key: str, key_type: int) -> None:
        pass

    def throttle(self, addr: str, ms: int) -> None:
        pass

    def throttled_for(self, addr: str) -> float:
        return 0.0

    def close(self) -> None:
        pass

    # coordinator
    def find_coordinator(self, key: str, key_type: int, deadline: Any, *, once: bool = False) -> tuple[int, str]:
        return 1, "fake:1"

    def coordinator_call(
        self, key: str, key_type: int, rpc: Rpc[Any, Any], request: Any, error_fn: Any, deadline: Any
    ) -> Any:
        if rpc is rpcs.INIT_PRODUCER_ID:
            return broker_pb2.InitProducerIdResponse(producer_id=7, producer_epoch=self.epoch)
        if rpc is rpcs.PREPARE_TXN:
            return broker_pb2.PrepareTxnResponse(producer_id=7, producer_epoch=self.epoch)
        assert rpc is rpcs.END_TXN, rpc
        self.end_txns.append(request.committed)
        if not self.echo_current_handle:
            self.epoch = request.producer_epoch + 1
        return broker_pb2.EndTxnResponse(producer_id=7, producer_epoch=self.epoch)

    # requests the sender sends without waiting
    def call_future(self, addr: str, rpc: Rpc[Any, Any], request: Any, timeout: float | None = None) -> Any:
        if rpc is rpcs.ADD_PARTITIONS_TO_TXN:
            return Resolved(
                broker_pb2.AddPartitionsToTxnResponse(
                    results=[
                        broker_pb2.TxnPartitionResult(topic=t.name, partition=p)
                        for t in request.topics
                        for p in t.partitions
                    ]
                )
            )
        assert rpc is rpcs.PRODUCE_SERIALIZED, rpc
        self.produce_arrived.set()
        if self.hold_produce:
            return Unanswered()
        req = broker_pb2.ProduceRequest.FromString(request)
        topics = []
        for topic in req.topics:
            answers = []
            for data in topic.partitions:
                answers.append(broker_pb2.ProducePartitionResponse(partition=data.partition, base_offset=len(self.log)))
                self.log.extend(r.value for r in decode_records(data.batch))
            topics.append(broker_pb2.ProduceTopicResponse(name=topic.name, partitions=answers))
        return Resolved(broker_pb2.ProduceResponse(topics=topics))


@pytest.fixture
def producer(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Producer, FakeCluster]]:
    monkeypatch.setattr(producer_module, "Cluster", FakeCluster)
    monkeypatch.setattr(Sender, "start", lambda self: None)  # the test runs the sender itself
    p = Producer("fake:1", transactional_id="tx", linger_ms=0)
    cluster = p._cluster
    assert isinstance(cluster, FakeCluster)
    p.init_transactions()
    yield p, cluster
    if p._sender.is_alive():
        p.close(5)


def start_sender(p: Producer) -> None:
    """Start the producer's sender thread for real (after the race a test set up)."""
    threading.Thread.start(p._sender)


def on_thread(name: str, fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    failures: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            failures.append(exc)

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread, failures


def test_the_senders_abort_of_a_transaction_spares_the_next_one(
    producer: tuple[Producer, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sender decides to abort transaction N; the application ends the abort, begins N+1 and sends;
    then the sender's abort runs. N+1's record must be committed with it (it was failed without
    breaking N+1, whose commit then succeeded with nothing written)."""
    p, cluster = producer
    p.begin_transaction()
    p.send("t", b"n", partition=0)

    decided, next_queued = threading.Event(), threading.Event()
    abort_queued = p._accumulator.abort_queued

    def held_abort_queued(predicate: Any = None) -> Any:
        if threading.current_thread().name == "sender-round":
            decided.set()  # the sender has decided to abort: hold it until N+1 has records queued
            assert next_queued.wait(WAIT)
        return abort_queued(predicate)

    monkeypatch.setattr(p._accumulator, "abort_queued", held_abort_queued)
    wait_in_flight = p._wait_in_flight
    sender_round: list[threading.Thread] = []

    def abort_while_the_sender_decides(deadline: Any) -> None:
        thread, _ = on_thread("sender-round", p._sender._run_once)  # sees ABORTING_TRANSACTION
        sender_round.append(thread)
        assert decided.wait(WAIT)
        wait_in_flight(deadline)

    monkeypatch.setattr(p, "_wait_in_flight", abort_while_the_sender_decides)
    p.abort_transaction(5)
    monkeypatch.setattr(p, "_wait_in_flight", wait_in_flight)

    p.begin_transaction()
    future = p.send("t", b"n+1", partition=0)
    next_queued.set()
    sender_round[0].join(WAIT)
    assert not sender_round[0].is_alive()

    start_sender(p)
    p.commit_transaction(5)
    assert future.result(0).offset == 0  # the commit returned: its record is stored
    assert cluster.log == [b"n+1"]
    assert cluster.end_txns == [True]


def test_a_batch_expiring_while_the_commit_flushes_breaks_the_commit(
    producer: tuple[Producer, FakeCluster], monkeypatch: pytest.MonkeyPatch
) -> None:
    """expire() takes the batch out while commit_transaction() flushes: the commit must raise
    (the flush found nothing to wait for and the error came after the commit had returned)."""
    p, cluster = producer
    p.begin_transaction()
    future = p.send("t", b"late", partition=0)
    (batch,) = p._accumulator.incomplete()
    batch.created -= 3600.0  # past delivery_timeout_ms

    class SignallingEvent(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            flushing.set()
            return super().wait(timeout)

    expired, flushing, committed = threading.Event(), threading.Event(), threading.Event()
    batch.done = SignallingEvent()
    expire = p._accumulator.expire

    def held_expire(now: float) -> Any:
        out = expire(now)
        expired.set()
        # hold the sender between expiry and failing the batch until the commit is waiting or done
        for _ in range(int(WAIT / 0.01)):
            if flushing.is_set() or committed.is_set():
                break
            flushing.wait(0.01)
        return out

    monkeypatch.setattr(p._accumulator, "expire", held_expire)
    sender, sender_failures = on_thread("sender-round", p._sender._run_once)
    assert expired.wait(WAIT)

    def commit() -> None:
        try:
            p.commit_transaction(WAIT)
        finally:
            committed.set()

    committer, commit_failures = on_thread("application", commit)
    committer.join(WAIT)
    sender.join(WAIT)
    assert not committer.is_alive() and not sender.is_alive() and not sender_failures
    assert [type(e) for e in commit_failures] == [errors.KafkaTimeoutError]
    with pytest.raises(errors.KafkaTimeoutError):
        future.result(0)
    assert p.transaction_state is S.ABORTABLE_ERROR
    assert cluster.end_txns == []


def test_end_txn_answering_the_current_handle_is_not_a_commit(producer: tuple[Producer, FakeCluster]) -> None:
    """Under TV2 every end bumps the epoch: an EndTxn that answers the current handle ended nothing."""
    p, cluster = producer
    cluster.echo_current_handle = True
    start_sender(p)
    p.begin_transaction()
    p.send("t", b"v", partition=0).result(WAIT)
    with pytest.raises(errors.InvalidTxnStateError, match="ended no transaction"):
        p.commit_transaction(5)
    assert p.transaction_state is S.FATAL_ERROR


def test_end_txn_of_a_prepared_transaction_may_answer_the_current_handle(
    producer: tuple[Producer, FakeCluster],
) -> None:
    """Another client (Admin, protocol version 1: no bump) may have committed it: that answer is the truth."""
    p, cluster = producer
    start_sender(p)
    p.begin_transaction()
    p.send("t", b"v", partition=0).result(WAIT)
    p.prepare_transaction(5)
    cluster.echo_current_handle = True
    p.commit_transaction(5)
    assert p.transaction_state is S.READY


def test_a_late_failure_of_the_previous_transaction_does_not_break_the_next() -> None:
    """A batch of transaction N that fails once N+1 began is N's business, not N+1's."""
    tm = TransactionManager("tx", transaction_version=2)
    tm.begin_init()
    tm.complete_init(7, 0)
    accumulator = RecordAccumulator(AccumulatorConfig(linger_ms=0))
    sender = Sender(FakeCluster(), accumulator, tm, SenderConfig())  # type: ignore[arg-type]
    tm.begin_transaction()
    accumulator.append(TopicPartition("t", 0), None, b"n", transactional=True, generation=tm.generation)
    (old,) = accumulator.abort_queued()
    tm.begin_abort()
    tm.complete_transaction()
    tm.begin_transaction()
    sender._fail_batch(old, errors.error_for(records_pb2.INVALID_PRODUCER_EPOCH, "late"))
    assert tm.state is S.IN_TRANSACTION
    sender._fail_batch(old, errors.ProducerFencedError("another instance"))  # fenced is fenced, whatever the batch
    assert tm.state is S.FATAL_ERROR


@pytest.mark.parametrize("refused", ["no metadata", "too large", "no such partition"])
def test_a_record_send_refuses_breaks_its_transaction(producer: tuple[Producer, FakeCluster], refused: str) -> None:
    """send() returns a failed future without queuing the record: the commit must not succeed without it
    (as in Kafka's producer, the transaction becomes abortable)."""
    p, cluster = producer
    start_sender(p)
    p.begin_transaction()
    p.send("t", b"kept", partition=1)
    if refused == "no metadata":
        future = p.send("missing", b"v")
    elif refused == "too large":
        future = p.send("t", b"x" * 2_000_000)
    else:
        future = p.send("t", b"v", partition=7)
    assert future.exception(0) is not None
    with pytest.raises(errors.SluiceError):
        p.commit_transaction(5)
    assert p.transaction_state is S.ABORTABLE_ERROR
    assert cluster.end_txns == []
    p.abort_transaction(5)
    p.begin_transaction()  # the next transaction is not affected
    p.send("t", b"next", partition=1)
    p.commit_transaction(5)
    assert cluster.end_txns[-1:] == [True] and cluster.end_txns.count(True) == 1  # the abort's may be skipped


def test_closing_the_producer_while_a_commit_flushes_fails_the_commit(producer: tuple[Producer, FakeCluster]) -> None:
    """close() on another thread fails the undelivered records: the flushing commit must raise, not commit."""
    p, cluster = producer
    cluster.hold_produce = True
    start_sender(p)
    p.begin_transaction()
    future = p.send("t", b"never", partition=0)
    assert cluster.produce_arrived.wait(WAIT)
    committer, failures = on_thread("application", lambda: p.commit_transaction(WAIT))
    p.close(0)  # the sender gives up on the record at once
    committer.join(WAIT)
    assert not committer.is_alive()
    assert future.exception(0) is not None
    assert len(failures) == 1 and isinstance(failures[0], errors.SluiceError), failures
    assert cluster.end_txns == []
