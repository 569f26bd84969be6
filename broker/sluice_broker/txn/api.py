"""What the transaction coordinator takes and answers: plain values, no protocol's messages.

Both protocols call the coordinator: the gRPC servicer and the Kafka listener's handlers each
decode their request into these values, ask :mod:`sluice.broker.security.coordinator_checks`
whether the caller may, call :class:`~sluice.broker.txn.coordinator.TransactionCoordinator`, and
encode its answer in their own wire format. So a Kafka InitProducerId never becomes a gRPC
message on its way in, and the two protocols cannot drift apart in what they check.

As in :mod:`sluice.broker.data_path`, errors travel as ``error_code`` and ``error_message`` (the
Kafka code of the :class:`~sluice.errors.SluiceError` that refused the call, filled by
:func:`sluice.broker.errors.answer`); each adapter maps them to what its clients understand
(PRODUCER_FENCED is INVALID_PRODUCER_EPOCH to an old Kafka client, for instance).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.coordination.answers import Outcome, PartitionAnswer

__all__ = [
    "HandleAnswer",
    "InitProducerIdInput",
    "ListTransactionsInput",
    "ListedTransaction",
    "Outcome",
    "PartitionAnswer",
    "TransactionList",
    "TxnDescription",
    "TxnHandle",
]


@dataclass(frozen=True, slots=True)
class InitProducerIdInput:
    """InitProducerId: a new handle for an idempotent (no id) or transactional producer."""

    transactional_id: str = ""  # empty: an idempotent producer, any broker answers
    transaction_timeout_ms: int = 0
    producer_id: int = -1  # KIP-360: the handle the producer has, -1 (or 0) for none
    producer_epoch: int = -1
    keep_prepared_txn: bool = False  # a prepared transaction (KIP-939's idea) is kept, its handle answered
    abort_prepared_txn: bool = False  # ... or aborted


@dataclass(frozen=True, slots=True)
class TxnHandle:
    """Who calls about a transaction: the id, the producer's handle, its transaction protocol version.

    ``transaction_version`` is Kafka's clientTransactionVersion: 2 (KIP-890 part 2) bumps the
    epoch at every EndTxn; 0 and 1 keep the classic rules.
    """

    transactional_id: str
    producer_id: int
    producer_epoch: int
    transaction_version: int = 1

    @property
    def bumps(self) -> bool:
        return self.transaction_version >= 2


@dataclass(slots=True)
class HandleAnswer:
    """A producer handle, or -1s with the error: InitProducerId, EndTxn and PrepareTxn answer it."""

    producer_id: int = -1
    producer_epoch: int = -1
    previous_state: str = ""  # InitProducerId: the id's state before the request ("" for a new id)
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""


@dataclass(slots=True)
class TxnDescription:
    """DescribeTransactions' answer for one id: its state, or the error (-1s for what is unknown)."""

    transactional_id: str
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    state: str = ""
    producer_id: int = -1
    producer_epoch: int = -1
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = -1
    last_update_time_ms: int = 0
    coordinator_id: int = 0
    resume_producer_id: int = -1  # the handle a version 2 bump replaced (may still go on)
    resume_producer_epoch: int = -1
    partitions: list[tuple[str, int]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class ListTransactionsInput:
    """ListTransactions' filters; empty sets match everything."""

    states: frozenset[str] = frozenset()
    producer_ids: frozenset[int] = frozenset()
    duration_filter_ms: int = 0  # KIP-994: > 0 lists only transactions open for longer


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    state: str
    coordinator_id: int


@dataclass(slots=True)
class TransactionList:
    """The ids this broker coordinates that match; COORDINATOR_LOAD_IN_PROGRESS while a partition loads."""

    transactions: list[ListedTransaction] = field(default_factory=list)
    error_code: pb.ErrorCode = pb.NONE
