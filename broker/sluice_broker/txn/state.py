"""The state of one transactional id and the table of its legal transitions (pure, no I/O).

:class:`TxnMetadata` is an immutable value: what the coordinator persists to
``__transaction_state`` and keeps in memory. Every change goes through
:meth:`TxnMetadata.transit`, which checks :data:`TRANSITIONS` and returns the
new value; the coordinator writes that value to the log and only then makes
it current. Keeping the table here, apart from the I/O, makes the protocol
readable in one place and testable without a broker.

The states and their meaning (Kafka's names)::

    Empty              a producer id and epoch, no transaction open
    Ongoing            partitions have been added: a transaction is open, its timeout runs
    PrepareCommit      EndTxn(commit) is decided and logged; markers are being written
    PrepareAbort       EndTxn(abort), a timeout or a fencing InitProducerId decided to abort
    CompleteCommit     every partition has its COMMIT marker
    CompleteAbort      every partition has its ABORT marker
    PrepareEpochFence  an open transaction's epoch is being bumped before it is aborted
                       (InitProducerId of a new instance, or a timeout). Transient: the
                       coordinator goes on to PrepareAbort with the bumped epoch, and only
                       that is logged, so a loaded log never holds it.
    Dead               the id expired: it is removed with a tombstone
    Prepared           the producer PREPARED its transaction (two-phase commit with an
                       external coordinator, the idea of Kafka's KIP-939): its records are
                       all written, the transaction timeout no longer aborts it, and any
                       client holding its handle (transactional id, producer id, epoch)
                       decides its outcome with EndTxn. An idle id may prepare an empty
                       transaction (a Spark task with no rows), so that every task of a
                       job has a prepared transaction to commit.

The (epoch-bumping) InitProducerId moves Empty/Complete* to Empty; adding more
partitions moves Ongoing to Ongoing. Prepared leaves only by a decision:
EndTxn (PrepareCommit/PrepareAbort) or an InitProducerId that asks to abort it
(PrepareEpochFence, then PrepareAbort with the epoch bumped). A timeout, an
expiry or a plain InitProducerId never moves it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from sluice.broker.topic_partition import TopicPartition

MAX_EPOCH = 32767  # int16, as Kafka
NO_PRODUCER_ID = -1
NO_EPOCH = -1
NO_TIME = -1



class TxnState(StrEnum):
    """States of a transactional id; the values are the names DescribeTransactions answers."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"
    PREPARE_EPOCH_FENCE = "PrepareEpochFence"
    DEAD = "Dead"
    PREPARED = "Prepared"


S = TxnState

# from -> the states it may move to. A new id starts in Empty (see TxnMetadata.new).
TRANSITIONS: Mapping[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.ONGOING, S.PREPARED, S.DEAD}),
    S.ONGOING: frozenset({S.ONGOING, S.PREPARED, S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE}),
    S.PREPARED: frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.PREPARE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.COMPLETE_COMMIT}),
    S.PREPARE_ABORT: frozenset({S.COMPLETE_ABORT}),
    S.COMPLETE_COMMIT: frozenset({S.EMPTY, S.ONGOING, S.PREPARED, S.DEAD}),
    S.COMPLETE_ABORT: frozenset({S.EMPTY, S.ONGOING, S.PREPARED, S.DEAD}),
    S.DEAD: frozenset(),
}

PREPARING = frozenset({S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE})
COMPLETE = frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
# No transaction open: the id may start one, be re-initialised, or expire.
IDLE = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})


class IllegalTransition(Exception):
    """A transition that the table does not allow: a coordinator bug, never a client error."""


def can_transit(old: TxnState, new: TxnState) -> bool:
    return new in TRANSITIONS[old]


def epoch_exhausted(epoch: int) -> bool:
    """No room for both an InitProducerId bump and a later fencing bump: take a new producer id.

    Epochs handed to producers stay <= MAX_EPOCH - 1, so a timeout or a new
    instance can always fence the current one with epoch + 1.
    """
    return epoch >= MAX_EPOCH - 1


@dataclass(frozen=True, slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    # The id/epoch before the last InitProducerId: lets a retried InitProducerId whose
    # response was lost (KIP-360) get the current ones instead of being fenced.
    last_producer_id: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    txn_start_ms: int  # NO_TIME unless a transaction is open (or being completed)
    last_update_ms: int

    @classmethod
    def new(cls, transactional_id: str, producer_id: int, timeout_ms: int, now: int) -> TxnMetadata:
        return cls(
            transactional_id=transactional_id,
            producer_id=producer_id,
            producer_epoch=0,
            last_producer_id=NO_PRODUCER_ID,
            last_producer_epoch=NO_EPOCH,
            timeout_ms=timeout_ms,
            state=S.EMPTY,
            partitions=frozenset(),
            txn_start_ms=NO_TIME,
            last_update_ms=now,
        )

    def transit(self, state: TxnState, now: int, **changes: Any) -> TxnMetadata:
        """The value after moving to ``state`` (with other fields changed); checks the table."""
        if not can_transit(self.state, state):
            raise IllegalTransition(
                f"transactional id {self.transactional_id!r}: {self.state} -> {state} is not a legal transition"
            )
        return dataclasses.replace(self, state=state, last_update_ms=now, **changes)

    # -- the transitions the coordinator makes ----------------------------------------------------

    def add_partitions(self, partitions: Iterable[TopicPartition], now: int) -> TxnMetadata:
        """Ongoing with these partitions added; the first add starts the timeout clock."""
        start = self.txn_start_ms if self.state is S.ONGOING else now
        return self.transit(S.ONGOING, now, partitions=self.partitions | frozenset(partitions), txn_start_ms=start)

    def prepare(self, now: int) -> TxnMetadata:
        """Ongoing (or idle: an empty transaction) -> Prepared; the timeout clock stops mattering."""
        if self.state is S.ONGOING:
            return self.transit(S.PREPARED, now)
        return self.transit(S.PREPARED, now, partitions=frozenset(), txn_start_ms=now)

    def prepare_end(self, commit: bool, now: int) -> TxnMetadata:
        return self.transit(S.PREPARE_COMMIT if commit else S.PREPARE_ABORT, now)

    def fence_and_abort(self, now: int) -> TxnMetadata:
        """Ongoing/Prepared -> PrepareEpochFence -> PrepareAbort with epoch + 1: the producer is fenced.

        Producers never hold MAX_EPOCH (see :func:`epoch_exhausted`), so the bump always fits;
        the min() only keeps a corrupt state from producing an invalid epoch.
        """
        bumped = min(self.producer_epoch + 1, MAX_EPOCH)
        fenced = self.transit(S.PREPARE_EPOCH_FENCE, now, producer_epoch=bumped)
        return fenced.transit(S.PREPARE_ABORT, now)

    def complete(self, now: int) -> TxnMetadata:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort; the transaction is over."""
        state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        return self.transit(state, now, partitions=frozenset(), txn_start_ms=NO_TIME)

    def bump_epoch(self, timeout_ms: int, now: int, new_producer_id: int | None = None) -> TxnMetadata:
        """InitProducerId on an idle id: epoch + 1, or a new producer id with epoch 0."""
        if new_producer_id is None:
            pid, epoch = self.producer_id, self.producer_epoch + 1
        else:
            pid, epoch = new_producer_id, 0
        return self.transit(
            S.EMPTY,
            now,
            producer_id=pid,
            producer_epoch=epoch,
            last_producer_id=self.producer_id,
            last_producer_epoch=self.producer_epoch,
            timeout_ms=timeout_ms,
            partitions=frozenset(),
            txn_start_ms=NO_TIME,
        )

    def expire(self, now: int) -> TxnMetadata:
        return self.transit(S.DEAD, now)
