"""The producer's sender thread against a fake in-memory leader that checks sequences like a broker.

The fake keeps, per partition, the log and the producer's last sequence: a
batch with the expected sequence is appended, a batch equal to one already
stored is a duplicate answered with its original offset, anything else is
OUT_OF_ORDER_SEQUENCE_NUMBER. Tests hold responses back to get several
requests in flight, and inject failures, to check that the sender keeps
order and never writes a record twice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import pytest

from sluice import errors
from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client._network import Rpc
from sluice.client._network import rpc as rpcs
from sluice.client.producer.accumulator import AccumulatorConfig, RecordAccumulator
from sluice.client.producer.sender import Sender, SenderConfig
from sluice.client.producer.transaction_manager import TransactionManager
from sluice.client.types import TopicPartition
from sluice.records import decode_records

TP = TopicPartition("t", 0)


class FakeFuture:
    def __init__(self) -> None:
        self._callbacks: list[Callable[[Any], None]] = []
        self._result: Any = None
        self._exc: BaseException | None = None
        self._done = False

    def add_done_callback(self, cb: Callable[[Any], None]) -> None:
        if self._done:
            cb(self)
        else:
            self._callbacks.append(cb)

    def resolve(self, result: Any = None, exc: BaseException | None = None) -> None:
        self._result, self._exc, self._done = result, exc, True
        for cb in self._callbacks:
            cb(self)

    def result(self, timeout: float | None = None) -> Any:
        if self._exc is not None:
            raise self._exc
        return self._result

    def done(self) -> bool:
        return self._done

    def cancel(self) -> bool:
        return False


class FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "fake"

    def initial_metadata(self) -> Any:
        return None

    def trailing_metadata(self) -> Any:
        return None

    def is_active(self) -> bool:
        return False

    def time_remaining(self) -> float:
        return 0.0

    def cancel(self) -> bool:
        return False

    def add_callback(self, callback: Any) -> bool:
        return False


class FakeLeader:
    """One leader of partition t-0 with broker-like sequence checks."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[bytes | None] = []
        self.stored: dict[int, int] = {}  # base sequence -> base offset
        self.next_sequence = 0
        self.hold = 0  # hold responses until this many requests are pending
        self.pending: list[tuple[broker_pb2.ProduceRequest, FakeFuture]] = []
        self.script: list[str] = []  # per request, in arrival order: "ok", "not_leader", "store_then_lose"
        self.requests = 0

    def evaluate(self, request: broker_pb2.ProduceRequest, action: str) -> broker_pb2.ProduceResponse:
        data = request.topics[0].partitions[0]
        batch = data.batch
        with self.lock:
            if action == "not_leader":
                code, offset = records_pb2.NOT_LEADER_OR_FOLLOWER, -1
            elif batch.base_sequence in self.stored:
                code, offset = records_pb2.NONE, self.stored[batch.base_sequence]
            elif batch.base_sequence != self.next_sequence:
                code, offset = records_pb2.OUT_OF_ORDER_SEQUENCE_NUMBER, -1
            else:
                offset = len(self.log)
                batch.base_offset = offset
                self.log.extend(r.value for r in decode_records(batch))
                self.stored[batch.base_sequence] = offset
                self.next_sequence += batch.record_count
                code = records_pb2.NONE
        return broker_pb2.ProduceResponse(
            topics=[
                broker_pb2.ProduceTopicResponse(
                    name="t",
                    partitions=[
                        broker_pb2.ProducePartitionResponse(
                            partition=0, error_code=code, base_offset=offset, log_append_time=-1
                        )
                    ],
                )
            ]
        )

    def produce(self, request: broker_pb2.ProduceRequest) -> FakeFuture:
        future = FakeFuture()
        with self.lock:
            action = self.script.pop(0) if self.script else "ok"
            self.requests += 1
            if self.hold:
                self.pending.append((request, future))
                if len(self.pending) < self.hold:
                    return future
                self.hold = 0
                pending, self.pending = self.pending, []
            else:
                pending = [(request, future)]
            actions = [action] if len(pending) == 1 else self._held_actions(len(pending), action)
        for (req, fut), act in zip(pending, actions, strict=True):
            self._respond(req, fut, act)
        return future

    def _held_actions(self, n: int, last: str) -> list[str]:
        first = [*self.held_script, *(["ok"] * n)][: n - 1]
        return [*first, last]

    held_script: list[str] = []

    def _respond(self, request: broker_pb2.ProduceRequest, future: FakeFuture, action: str) -> None:
        if action == "store_then_lose":
            self.evaluate(request, "ok")
            future.resolve(exc=FakeRpcError(grpc.StatusCode.DEADLINE_EXCEEDED))
        else:
            future.resolve(self.evaluate(request, action))


class FakeCluster:
    request_timeout = 1.0

    def __init__(self, leader: FakeLeader) -> None:
        self.leader_ = leader
        self.forgotten = 0

    def leader(self, topic: str, partition: int) -> tuple[str, int] | None:
        return ("fake:1", 0)

    def refresh_if_stale(self, topics: Any, min_age: float | None = None, timeout: float | None = None) -> None:
        pass

    def forget_leader(self, topic: str, partition: int) -> None:
        self.forgotten += 1

    def offline_reason(self, topic: str, partition: int) -> str | None:
        return None  # the fake partition always has a leader

    def throttle(self, addr: str, throttle_time_ms: int) -> None:
        pass

    def throttled_for(self, addr: str) -> float:
        return 0.0

    def call_any(self, rpc: Rpc[Any, Any], request: Any, timeout: float | None = None) -> Any:
        assert rpc is rpcs.INIT_PRODUCER_ID
        return broker_pb2.InitProducerIdResponse(producer_id=5, producer_epoch=0)

    def call_future(self, addr: str, rpc: Rpc[Any, Any], request: Any, timeout: float | None = None) -> FakeFuture:
        assert rpc is rpcs.PRODUCE_SERIALIZED
        assert isinstance(request, bytes)  # the sender serializes Produce requests itself
        return self.leader_.produce(broker_pb2.ProduceRequest.FromString(request))


def start(leader: FakeLeader, **acc: Any) -> tuple[RecordAccumulator, Sender]:
    config = AccumulatorConfig(linger_ms=0, batch_size=1, retry_backoff_ms=1, max_in_flight=5)
    for k, v in acc.items():
        setattr(config, k, v)
    sender: Sender | None = None
    accumulator = RecordAccumulator(config, wakeup=lambda: sender.wakeup() if sender else None)
    sender = Sender(FakeCluster(leader), accumulator, TransactionManager(None), SenderConfig())  # type: ignore[arg-type]
    sender.start()
    return accumulator, sender


def stop(sender: Sender) -> None:
    sender.initiate_close()
    sender.join(5)
    assert not sender.is_alive()


def test_in_order_without_failures() -> None:
    leader = FakeLeader()
    accumulator, sender = start(leader)
    futures = [accumulator.append(TP, None, b"%d" % i) for i in range(50)]
    offsets = [f.result(5).offset for f in futures if f is not None]
    stop(sender)
    assert offsets == list(range(50))
    assert leader.log == [b"%d" % i for i in range(50)]


def test_a_failed_batch_with_others_in_flight_is_retried_in_order_without_gaps_or_duplicates() -> None:
    leader = FakeLeader()
    leader.hold = 5  # five requests in flight at once
    leader.held_script = ["not_leader"]  # the first fails: the other four see a gap
    accumulator, sender = start(leader)
    futures = [accumulator.append(TP, None, b"%d" % i) for i in range(5)]  # batch_size=1: a batch each
    offsets = [f.result(5).offset for f in futures if f is not None]
    stop(sender)
    assert leader.log == [b"%d" % i for i in range(5)]
    assert offsets == list(range(5))
    assert leader.requests > 5  # retries happened


def test_a_lost_response_is_retried_and_answered_as_a_duplicate() -> None:
    leader = FakeLeader()
    leader.script = ["store_then_lose"]
    accumulator, sender = start(leader)
    future = accumulator.append(TP, None, b"once")
    assert future is not None
    assert future.result(5).offset == 0
    more = accumulator.append(TP, None, b"twice")
    assert more is not None
    assert more.result(5).offset == 1
    stop(sender)
    assert leader.log == [b"once", b"twice"]


def test_delivery_timeout_fails_the_records() -> None:
    leader = FakeLeader()
    leader.script = ["not_leader"] * 1000
    accumulator, sender = start(leader, delivery_timeout_ms=300)
    future = accumulator.append(TP, None, b"never")
    assert future is not None
    with pytest.raises(errors.KafkaTimeoutError, match=r"delivery_timeout_ms"):
        future.result(5)
    sender.force_close()
    sender.join(5)
    assert leader.log == []


def test_close_delivers_what_is_queued() -> None:
    leader = FakeLeader()
    accumulator, sender = start(leader, linger_ms=60_000, batch_size=1_000_000)
    futures = [accumulator.append(TP, None, b"%d" % i) for i in range(10)]
    time.sleep(0.05)
    assert leader.log == []  # still lingering
    accumulator.close()
    stop(sender)
    assert [f.result(0).offset for f in futures if f is not None] == list(range(10))
