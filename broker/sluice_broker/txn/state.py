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
partitions moves Ongoing to Ongoing.

Epochs follow transaction protocol version 2 (Kafka's KIP-890 part 2, on top
of KIP-360/KIP-588): every end of a transaction bumps the epoch. PrepareCommit
and PrepareAbort carry epoch + 1, the markers are written with it (so a write
of the ended transaction's epoch can never land after them), and the producer
goes on with it, from EndTxn's answer. A bump the coordinator makes *without*
meaning to fence the producer (an EndTxn, or a transaction timeout) remembers
the handle it replaced in ``resume_producer_id/epoch``: a request with that
handle is the rightful producer that has not heard of the bump yet, and gets
an abortable error (INVALID_PRODUCER_EPOCH), its EndTxn(abort) after a timeout
succeeds with the new handle. A bump that fences (another instance's
InitProducerId) clears it, so the old instance gets PRODUCER_FENCED for good.
When epoch + 1 reaches :data:`MAX_EPOCH` the end also takes a new producer id
(``next_producer_id``): the markers still carry the old id at MAX_EPOCH, and
the id moves to the new one at epoch 0 when the transaction completes. Prepared leaves only by a decision:
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
    # The handle the last non-fencing bump replaced (an EndTxn or a timeout, TV2): its owner
    # may still abort and go on. NO_PRODUCER_ID/NO_EPOCH when a fence (or InitProducerId) cleared it.
    resume_producer_id: int = NO_PRODUCER_ID
    resume_producer_epoch: int = NO_EPOCH
    # Set in Prepare*/Complete* when the end exhausted the epoch: the id the producer goes on with.
    next_producer_id: int = NO_PRODUCER_ID
    # The resume handle was replaced by a timeout (not an EndTxn): its commit gets an abortable error.
    timed_out: bool = False
    # The transaction's producer speaks transaction protocol v2 (it said so when adding
    # partitions): a timeout then aborts it without fencing. Version 1 producers are fenced.
    tv2: bool = False
    # In Prepare*: this end bumped the epoch above the one the transaction's data was written with
    # (a TV2 EndTxn, a timeout, a fence), so its markers go out as transaction version 2 and a
    # partition accepts them only above that data's epoch (KIP-1228): a late marker of the previous
    # transaction, which carries the epoch the next transaction writes with, cannot end that one.
    end_bumped: bool = False

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

    def add_partitions(self, partitions: Iterable[TopicPartition], now: int, tv2: bool = False) -> TxnMetadata:
        """Ongoing with these partitions added; the first add starts the timeout clock.

        ``tv2``: the request came from a transaction protocol v2 producer.
        """
        if self.state is S.ONGOING:
            return self.transit(S.ONGOING, now, partitions=self.partitions | frozenset(partitions), tv2=self.tv2 or tv2)
        # A new transaction: its producer has the new handle, so the old one may no longer resume.
        return self.transit(
            S.ONGOING,
            now,
            partitions=frozenset(partitions),
            txn_start_ms=now,
            tv2=tv2,
            resume_producer_id=NO_PRODUCER_ID,
            resume_producer_epoch=NO_EPOCH,
            timed_out=False,
        )

    def prepare(self, now: int) -> TxnMetadata:
        """Ongoing (or idle: an empty transaction) -> Prepared; the timeout clock stops mattering."""
        if self.state is S.ONGOING:
            return self.transit(S.PREPARED, now)
        return self.transit(
            S.PREPARED,
            now,
            partitions=frozenset(),
            txn_start_ms=now,
            resume_producer_id=NO_PRODUCER_ID,
            resume_producer_epoch=NO_EPOCH,
            timed_out=False,
        )

    def _ending_bump(self, next_producer_id: int | None, timed_out: bool) -> dict[str, Any]:
        """The fields of an end that bumps the epoch (TV2); the old handle may resume."""
        changes: dict[str, Any] = {
            "producer_epoch": min(self.producer_epoch + 1, MAX_EPOCH),
            "end_bumped": self.producer_epoch < MAX_EPOCH,
            "resume_producer_id": self.producer_id,
            "resume_producer_epoch": self.producer_epoch,
            "next_producer_id": NO_PRODUCER_ID,
            "timed_out": timed_out,
        }
        if epoch_exhausted(self.producer_epoch):
            if next_producer_id is None:
                raise IllegalTransition(
                    f"transactional id {self.transactional_id!r}: epoch {self.producer_epoch} is exhausted, "
                    "the end needs a new producer id"
                )
            changes["next_producer_id"] = next_producer_id
        return changes

    def prepare_end(
        self, commit: bool, now: int, next_producer_id: int | None = None, *, bump: bool = True
    ) -> TxnMetadata:
        """EndTxn: PrepareCommit/PrepareAbort; the producer goes on with :meth:`handle`.

        ``bump`` (transaction protocol v2): epoch + 1, the old handle may
        resume; ``next_producer_id`` is used (and required) only when the epoch
        is exhausted. Without it (version 1) the epoch stays.
        """
        state = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        if not bump:
            return self.transit(state, now, end_bumped=False)
        return self.transit(state, now, **self._ending_bump(next_producer_id, False))

    def abort_timed_out(self, now: int, next_producer_id: int | None = None) -> TxnMetadata:
        """A timeout: Ongoing -> PrepareEpochFence -> PrepareAbort, epoch + 1, the producer NOT fenced.

        Its next request gets an abortable error, and its abort then succeeds with the new handle.
        """
        fenced = self.transit(S.PREPARE_EPOCH_FENCE, now, **self._ending_bump(next_producer_id, True))
        return fenced.transit(S.PREPARE_ABORT, now)

    def fence_and_abort(self, now: int, *, owner_may_resume: bool = False) -> TxnMetadata:
        """Ongoing/Prepared -> PrepareEpochFence -> PrepareAbort with epoch + 1: the producer is fenced.

        ``owner_may_resume``: the request came from the current handle itself
        (a KIP-360 re-initialisation), which then keeps the right to go on;
        another instance's InitProducerId fences the old one for good.
        Producers never hold MAX_EPOCH (see :func:`epoch_exhausted`), so the bump always fits;
        the min() only keeps a corrupt state from producing an invalid epoch.
        """
        bumped = min(self.producer_epoch + 1, MAX_EPOCH)
        resume = (self.producer_id, self.producer_epoch) if owner_may_resume else (NO_PRODUCER_ID, NO_EPOCH)
        fenced = self.transit(
            S.PREPARE_EPOCH_FENCE,
            now,
            producer_epoch=bumped,
            resume_producer_id=resume[0],
            resume_producer_epoch=resume[1],
            next_producer_id=NO_PRODUCER_ID,
            timed_out=False,
            end_bumped=bumped > self.producer_epoch,
        )
        return fenced.transit(S.PREPARE_ABORT, now)

    def handle(self) -> tuple[int, int]:
        """The (producer id, epoch) its producer holds (or will once the end completes)."""
        if self.next_producer_id != NO_PRODUCER_ID:
            return self.next_producer_id, 0
        return self.producer_id, self.producer_epoch

    def is_resume_handle(self, producer_id: int, producer_epoch: int) -> bool:
        """Is this the handle a non-fencing bump replaced (its owner has not heard of the bump)?"""
        return (
            self.resume_producer_epoch != NO_EPOCH
            and (producer_id, producer_epoch) == (self.resume_producer_id, self.resume_producer_epoch)
            and (producer_id, producer_epoch) != self.handle()
        )

    def complete(self, now: int) -> TxnMetadata:
        """PrepareCommit/PrepareAbort -> CompleteCommit/CompleteAbort; the transaction is over."""
        state = S.COMPLETE_COMMIT if self.state is S.PREPARE_COMMIT else S.COMPLETE_ABORT
        pid, epoch = self.handle()  # an exhausted epoch moves to the new producer id now
        return self.transit(
            state,
            now,
            producer_id=pid,
            producer_epoch=epoch,
            next_producer_id=NO_PRODUCER_ID,
            partitions=frozenset(),
            txn_start_ms=NO_TIME,
        )

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
            resume_producer_id=NO_PRODUCER_ID,  # a new instance (or a re-init): nobody resumes an old handle
            resume_producer_epoch=NO_EPOCH,
            next_producer_id=NO_PRODUCER_ID,
            timed_out=False,
        )

    def expire(self, now: int) -> TxnMetadata:
        return self.transit(S.DEAD, now)
