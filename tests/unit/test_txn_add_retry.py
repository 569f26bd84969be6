"""How long the producer waits before it retries AddPartitionsToTxn (docs/performance.md).

CONCURRENT_TRANSACTIONS means the previous transaction is still being completed (markers,
CompleteCommit): a matter of a few replication round trips, so the retry comes after a short,
flat delay, as Kafka's producer does (20 ms), not after the backoff other retriable errors get,
which grows by 1.6x to half a second. The policy is checked on the sender itself, without a
thread or a network.
"""

from __future__ import annotations

from sluice.api.v1 import broker_pb2, records_pb2
from sluice.client.producer.accumulator import AccumulatorConfig, RecordAccumulator
from sluice.client.producer.sender import Sender, SenderConfig
from sluice.client.producer.transaction_manager import CONCURRENT_TRANSACTIONS_RETRY_S, TransactionManager
from sluice.client.types import TopicPartition

TPS = [TopicPartition("t", 0), TopicPartition("t", 1)]


def sender() -> Sender:
    accumulator = RecordAccumulator(AccumulatorConfig(), wakeup=lambda: None)
    return Sender(None, accumulator, TransactionManager("tx"), SenderConfig())  # type: ignore[arg-type]


def answered(code: int) -> dict[TopicPartition, broker_pb2.TxnPartitionResult]:
    return {
        tp: broker_pb2.TxnPartitionResult(topic=tp.topic, partition=tp.partition, error_code=code)  # type: ignore[arg-type]
        for tp in TPS
    }


def test_concurrent_transactions_is_retried_after_a_short_flat_delay() -> None:
    s = sender()
    delays = [s._add_retry_delay(TPS, answered(records_pb2.CONCURRENT_TRANSACTIONS)) for _ in range(8)]
    assert delays == [CONCURRENT_TRANSACTIONS_RETRY_S] * 8
    assert CONCURRENT_TRANSACTIONS_RETRY_S <= 0.02


def test_other_retriable_errors_back_off_more_and_more() -> None:
    s = sender()
    delays = [s._add_retry_delay(TPS, answered(records_pb2.COORDINATOR_LOAD_IN_PROGRESS)) for _ in range(8)]
    assert delays[-1] > 4 * delays[0]  # 20 ms growing by 1.6x (+-20% jitter) to 500 ms
    assert max(delays) <= 0.5 * 1.2


def test_a_mix_with_another_error_takes_the_backoff() -> None:
    s = sender()
    mixed = answered(records_pb2.CONCURRENT_TRANSACTIONS)
    mixed[TPS[1]].error_code = records_pb2.COORDINATOR_LOAD_IN_PROGRESS
    first = s._add_retry_delay(TPS, mixed)
    later = [s._add_retry_delay(TPS, mixed) for _ in range(7)]
    assert later[-1] > 4 * first
