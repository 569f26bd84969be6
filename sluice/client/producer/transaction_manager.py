"""The producer's transaction state machine: plain state, no network.

Why a separate module: the rules of a transactional producer (what may be
called when, what an error does to the producer) are the part users get
wrong and reviewers must check. Here they are a table, :data:`TRANSITIONS`,
and a lock; the network code (``producer.py`` and ``sender.py``) asks this
object what is allowed and reports what happened, and never keeps a state of
its own. Unit tests drive it without a broker.

States (Kafka's names)::

    UNINITIALIZED --init_transactions--> INITIALIZING --ok--> READY
    READY --begin_transaction--> IN_TRANSACTION
    IN_TRANSACTION --commit--> COMMITTING_TRANSACTION --EndTxn ok--> READY
    IN_TRANSACTION --abort---> ABORTING_TRANSACTION   --EndTxn ok--> READY
    IN_TRANSACTION --prepare--> COMMITTING_TRANSACTION --PrepareTxn ok--> PREPARED_TRANSACTION
    READY --init_transactions kept a prepared transaction--> PREPARED_TRANSACTION
    PREPARED_TRANSACTION --commit / abort--> COMMITTING / ABORTING --EndTxn ok--> READY
    IN_TRANSACTION / COMMITTING --a send or offset commit failed--> ABORTABLE_ERROR
    ABORTABLE_ERROR --abort--> ABORTING_TRANSACTION
    any --fenced, or an error the producer cannot recover from--> FATAL_ERROR

A producer without a transactional id uses the same object for its producer
id and epoch (idempotence): UNINITIALIZED -> INITIALIZING -> READY, and
READY -> INITIALIZING again when it must bump its epoch after a broken
sequence.

Errors are classified by their KIP-1050 category (``SluiceError.category``,
docs/errors.md): retriable ones are retried by the caller within its timeout,
abortable ones move the transaction to ABORTABLE_ERROR, application-recoverable
ones (fenced) and a coordinator's fatal answers to FATAL_ERROR. The producer
speaks transaction protocol version 2 (:data:`TRANSACTION_VERSION`): EndTxn
answers a bumped epoch that the producer takes (:meth:`complete_epoch_bump`),
and INVALID_PRODUCER_EPOCH, which the coordinator answers to a producer whose
transaction it timed out, is abortable, not a fence.

In ABORTABLE_ERROR the only way on is ``abort_transaction()``; commit and
send raise the error that broke the transaction. In FATAL_ERROR every call
raises that error (for a fenced producer, ``ProducerFencedError``): the
application must close the producer.

The manager also tracks which partitions the coordinator knows are part of
the current transaction: ``send()`` registers a partition
(:meth:`TransactionManager.maybe_add_partition`), the sender takes the
pending ones in one AddPartitionsToTxn (:meth:`TransactionManager.take_pending_partitions`),
and only drains batches of partitions the coordinator has confirmed
(:meth:`TransactionManager.is_partition_added`).

Generations: :attr:`TransactionManager.generation` is bumped when a
transaction begins and when it ends, so each transaction has its own number.
Every batch records the generation it was created in, and whatever the
sender learns about a batch or a request is applied only if it belongs to the
current generation: the sender runs concurrently with the application, which
may finish an abort and begin (and fill) the next transaction while the
sender still acts on the previous one. A failure of the previous
transaction's batch must neither drop the next transaction's records
(:meth:`TransactionManager.aborting_generation` names the transaction an
abort is for) nor break it (:meth:`TransactionManager.send_failed`).
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable

from sluice import errors
from sluice.client.types import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
# AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS (the previous transaction is still being
# completed): retry after this short, flat delay rather than the growing backoff of other
# retriable errors, as Kafka's producer does (its ADD_PARTITIONS_RETRY_BACKOFF_MS, 20 ms). The
# completion takes a few replication round trips; a backoff grown to half a second would leave
# the producer idle long after it. The coordinator also waits for the completion before it
# answers this (broker/sluice_broker/txn/coordinator.py), so the retry is rare.
CONCURRENT_TRANSACTIONS_RETRY_S = 0.02
# The transaction protocol this client speaks (Kafka's clientTransactionVersion, KIP-890 part 2):
# the coordinator bumps the epoch at every end and answers it in EndTxn, and a transaction it
# timed out is an abortable error, not a fence. Sent in AddPartitionsToTxn, AddOffsetsToTxn, EndTxn.
TRANSACTION_VERSION = 2


class TransactionState(enum.Enum):
    UNINITIALIZED = "UNINITIALIZED"
    INITIALIZING = "INITIALIZING"
    READY = "READY"
    IN_TRANSACTION = "IN_TRANSACTION"
    COMMITTING_TRANSACTION = "COMMITTING_TRANSACTION"
    ABORTING_TRANSACTION = "ABORTING_TRANSACTION"
    ABORTABLE_ERROR = "ABORTABLE_ERROR"
    FATAL_ERROR = "FATAL_ERROR"
    PREPARED_TRANSACTION = "PREPARED_TRANSACTION"


S = TransactionState

#: Legal transitions. FATAL_ERROR is reachable from every state and is final.
#: A state listed as reachable from itself is a retry of the same operation
#: (init, commit or abort after a timeout).
TRANSITIONS: dict[TransactionState, frozenset[TransactionState]] = {
    S.UNINITIALIZED: frozenset({S.INITIALIZING, S.FATAL_ERROR}),
    S.INITIALIZING: frozenset({S.INITIALIZING, S.READY, S.UNINITIALIZED, S.FATAL_ERROR}),
    S.READY: frozenset({S.IN_TRANSACTION, S.INITIALIZING, S.PREPARED_TRANSACTION, S.FATAL_ERROR}),
    S.IN_TRANSACTION: frozenset({S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION, S.ABORTABLE_ERROR, S.FATAL_ERROR}),
    S.COMMITTING_TRANSACTION: frozenset(
        {S.COMMITTING_TRANSACTION, S.READY, S.PREPARED_TRANSACTION, S.ABORTABLE_ERROR, S.FATAL_ERROR}
    ),
    S.PREPARED_TRANSACTION: frozenset({S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION, S.FATAL_ERROR}),
    S.ABORTING_TRANSACTION: frozenset({S.ABORTING_TRANSACTION, S.READY, S.FATAL_ERROR}),
    S.ABORTABLE_ERROR: frozenset({S.ABORTABLE_ERROR, S.ABORTING_TRANSACTION, S.FATAL_ERROR}),
    S.FATAL_ERROR: frozenset({S.FATAL_ERROR}),
}

# Errors that fence the producer for good (reported to the application as ProducerFencedError).
_FENCING = (
    errors.ProducerFencedError,
    errors.TransactionCoordinatorFencedError,
)


def is_fencing_error(exc: BaseException, transaction_version: int = TRANSACTION_VERSION) -> bool:
    """Does ``exc`` fence the producer for good?

    INVALID_PRODUCER_EPOCH does only for a protocol version 1 producer. With
    version 2 the coordinator bumps the epoch at every end and at a timeout,
    and a producer that has not heard of the bump yet gets it as an abortable
    error (KIP-890 part 2); a real zombie is told PRODUCER_FENCED.
    """
    if transaction_version < 2 and isinstance(exc, errors.InvalidProducerEpochError):
        return True
    return isinstance(exc, _FENCING)


def ends_the_producer(exc: errors.SluiceError) -> bool:
    """Is the producer unusable after ``exc`` (KIP-1050: application-recoverable or fatal)?"""
    return exc.category in (errors.Category.APPLICATION_RECOVERABLE, errors.Category.FATAL)


class TransactionManager:
    """State of one producer's id, epoch and transaction. Thread-safe; no I/O."""

    def __init__(
        self, transactional_id: str | None, transaction_timeout_ms: int = 60_000, transaction_version: int = 1
    ) -> None:
        self.transactional_id = transactional_id
        self.transaction_timeout_ms = transaction_timeout_ms
        # 1: Kafka's classic protocol (INVALID_PRODUCER_EPOCH fences); the Producer speaks
        # TRANSACTION_VERSION (2) and sends it with its transactional requests.
        self.transaction_version = transaction_version
        self._lock = threading.RLock()
        # send() reads these without the lock (one attribute read per record):
        # send_ok is True only in states where check_can_send() passes;
        # generation changes whenever a transaction begins or ends.
        self.send_ok = False
        self.generation = 0
        self._state = S.UNINITIALIZED
        self.producer_id = NO_PRODUCER_ID
        self.producer_epoch = NO_PRODUCER_EPOCH
        self._last_error: errors.SluiceError | None = None
        self._added: set[TopicPartition] = set()  # confirmed by the coordinator
        self._pending: set[TopicPartition] = set()  # sent to, not yet added
        self._in_flight_add: set[TopicPartition] = set()  # AddPartitionsToTxn under way
        self._offsets_added = False
        self._prepared = False  # the coordinator holds this transaction as Prepared
        self._epoch_bump_needed = False

    # ------------------------------------------------------------------ state

    @property
    def is_transactional(self) -> bool:
        return self.transactional_id is not None

    @property
    def _state(self) -> TransactionState:
        return self._state_value

    @_state.setter
    def _state(self, value: TransactionState) -> None:
        self._state_value = value
        if self.transactional_id is None:
            self.send_ok = value is not S.FATAL_ERROR
        else:
            self.send_ok = value is S.IN_TRANSACTION

    @property
    def state(self) -> TransactionState:
        with self._lock:
            return self._state

    @property
    def last_error(self) -> errors.SluiceError | None:
        with self._lock:
            return self._last_error

    def _transition(self, target: TransactionState, action: str) -> None:
        if target not in TRANSITIONS[self._state]:
            if self._state is S.FATAL_ERROR and self._last_error is not None:
                raise self._fatal_copy(action)
            if self._state is S.ABORTABLE_ERROR and self._last_error is not None:
                raise self._abortable_copy(action)
            raise errors.IllegalStateError(
                f"cannot {action}: the producer is in state {self._state.value} "
                f"(legal next states: {', '.join(sorted(s.value for s in TRANSITIONS[self._state]))})"
            )
        self._state = target

    def transition_to(self, target: TransactionState, action: str = "change state") -> None:
        """Move to ``target`` or raise IllegalStateError (or the stored error in an error state)."""
        with self._lock:
            self._transition(target, action)

    def _fatal_copy(self, action: str) -> errors.SluiceError:
        err = self._last_error
        assert err is not None
        exc = type(err)(f"cannot {action}: the producer hit a fatal error and must be closed: {err.message}")
        exc.__cause__ = err
        return exc

    def _abortable_copy(self, action: str) -> errors.SluiceError:
        err = self._last_error
        assert err is not None
        exc = type(err)(f"cannot {action}: the transaction must be aborted after an earlier error: {err.message}")
        exc.__cause__ = err
        return exc

    def _require_transactional(self, action: str) -> None:
        if self.transactional_id is None:
            raise errors.IllegalStateError(f"cannot {action}: the producer has no transactional_id")

    # ------------------------------------------------------------------ producer id

    def begin_init(self) -> None:
        """init_transactions() (or the idempotent producer's first InitProducerId) starts."""
        with self._lock:
            if self.transactional_id is not None and self._state not in (S.UNINITIALIZED, S.INITIALIZING):
                if self._state is S.FATAL_ERROR:
                    raise self._fatal_copy("init_transactions")
                raise errors.IllegalStateError(
                    "init_transactions() was already called: it may be called once per producer "
                    f"(state {self._state.value})"
                )
            self._transition(S.INITIALIZING, "initialize the producer id")

    def begin_epoch_bump(self) -> None:
        """An idempotent producer re-initializes after a broken sequence (READY -> INITIALIZING)."""
        with self._lock:
            self._transition(S.INITIALIZING, "bump the producer epoch")

    def complete_init(self, producer_id: int, producer_epoch: int) -> None:
        with self._lock:
            self._transition(S.READY, "complete initialization")
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self._epoch_bump_needed = False

    def init_failed(self, exc: errors.SluiceError) -> None:
        """InitProducerId failed: a retriable error allows calling init again; others are fatal."""
        with self._lock:
            if exc.retriable:
                self._transition(S.UNINITIALIZED, "reset after a failed initialization")
            else:
                self._set_fatal(exc)

    @property
    def has_producer_id(self) -> bool:
        with self._lock:
            return self.producer_id >= 0 and self._state not in (S.UNINITIALIZED, S.INITIALIZING)

    def producer_id_and_epoch(self) -> tuple[int, int]:
        with self._lock:
            return self.producer_id, self.producer_epoch

    # ------------------------------------------------------------------ transaction

    def aborting_generation(self) -> tuple[int, errors.SluiceError | None] | None:
        """The transaction that can only abort now: (its generation, the error that broke it), or None.

        Read as one decision, so a caller that fails that transaction's queued
        batches later touches only them, even if the application has meanwhile
        ended it and begun the next one. The error is None for a plain abort.
        """
        with self._lock:
            if self._state is S.ABORTING_TRANSACTION:
                return self.generation, None
            if self._state is S.ABORTABLE_ERROR:
                return self.generation, self._last_error
            return None

    def begin_transaction(self) -> None:
        with self._lock:
            self._require_transactional("begin_transaction")
            if self._state in (S.UNINITIALIZED, S.INITIALIZING):
                raise errors.IllegalStateError("cannot begin_transaction: call init_transactions() first")
            if self._state is S.IN_TRANSACTION:
                raise errors.IllegalStateError("cannot begin_transaction: a transaction is already open")
            if S.IN_TRANSACTION in TRANSITIONS[self._state]:
                # before send_ok turns True: a send() that passes its check reads the new generation
                self.generation += 1
            self._transition(S.IN_TRANSACTION, "begin_transaction")

    def check_can_send(self) -> None:
        """Raise unless a record may be sent now."""
        with self._lock:
            if self._state is S.FATAL_ERROR and self._last_error is not None:
                raise self._fatal_copy("send")
            if self.transactional_id is None:
                return
            if self._state is S.ABORTABLE_ERROR and self._last_error is not None:
                raise self._abortable_copy("send")
            if self._state is not S.IN_TRANSACTION:
                hint = (
                    "call init_transactions() first"
                    if self._state in (S.UNINITIALIZED, S.INITIALIZING)
                    else "call begin_transaction() first"
                )
                raise errors.IllegalStateError(
                    f"cannot send: a transactional producer sends only inside a transaction "
                    f"(state {self._state.value}); {hint}"
                )

    def check_in_transaction(self, action: str) -> None:
        with self._lock:
            self._require_transactional(action)
            if self._state is S.FATAL_ERROR and self._last_error is not None:
                raise self._fatal_copy(action)
            if self._state is S.ABORTABLE_ERROR and self._last_error is not None:
                raise self._abortable_copy(action)
            if self._state is not S.IN_TRANSACTION:
                raise errors.IllegalStateError(f"cannot {action}: no transaction is open (state {self._state.value})")

    def maybe_add_partition(self, tp: TopicPartition) -> bool:
        """A record for ``tp`` is being sent in this transaction; True if it is new to the transaction."""
        with self._lock:
            if self.transactional_id is None:
                return False
            if tp not in self._added and tp not in self._in_flight_add and tp not in self._pending:
                self._pending.add(tp)
                return True
            return False

    def is_partition_added(self, tp: TopicPartition) -> bool:
        """May batches of ``tp`` be sent now?"""
        with self._lock:
            if self.transactional_id is None:
                return True
            return tp in self._added and self._state in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION)

    def has_pending_partitions(self) -> bool:
        with self._lock:
            return bool(self._pending) and self._state in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION)

    def take_pending_partitions(self) -> tuple[int, list[TopicPartition]]:
        """The generation and partitions to add in one AddPartitionsToTxn (none unless the transaction is live)."""
        with self._lock:
            if self._state not in (S.IN_TRANSACTION, S.COMMITTING_TRANSACTION) or not self._pending:
                return self.generation, []
            tps = sorted(self._pending)
            self._in_flight_add.update(tps)
            self._pending.clear()
            return self.generation, tps

    def partitions_added(self, tps: Iterable[TopicPartition], generation: int | None = None) -> None:
        """The coordinator added ``tps`` to the transaction ``generation`` (None: the current one).

        An answer for a transaction that has ended since is ignored: the next
        transaction must add its partitions itself.
        """
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            for tp in tps:
                self._in_flight_add.discard(tp)
                self._added.add(tp)

    def partitions_add_failed(self, tps: Iterable[TopicPartition], retry: bool, generation: int | None = None) -> None:
        with self._lock:
            if generation is not None and generation != self.generation:
                return
            for tp in tps:
                self._in_flight_add.discard(tp)
                if retry:
                    self._pending.add(tp)

    def adding_partitions(self) -> bool:
        """Is an AddPartitionsToTxn under way?"""
        with self._lock:
            return bool(self._in_flight_add)

    def offsets_added(self) -> None:
        with self._lock:
            self._offsets_added = True

    @property
    def partitions_in_transaction(self) -> frozenset[TopicPartition]:
        with self._lock:
            return frozenset(self._added)

    def needs_end_txn(self) -> bool:
        """Does the coordinator know of this transaction (anything was added, or it was prepared)?"""
        with self._lock:
            return bool(self._added) or self._offsets_added or self._prepared

    def begin_prepare(self) -> None:
        """prepare_transaction() starts: like a commit, sends are closed and the records flushed.

        Legal in a transaction, and again after a prepare that timed out
        (COMMITTING_TRANSACTION); anything else raises what a commit would.
        """
        with self._lock:
            self._require_transactional("prepare_transaction")
            if self._state is S.PREPARED_TRANSACTION:
                raise errors.IllegalStateError("cannot prepare_transaction: the transaction is already prepared")
            if self._state is not S.COMMITTING_TRANSACTION:
                self.check_in_transaction("prepare_transaction")
            self._transition(S.COMMITTING_TRANSACTION, "prepare_transaction")

    def complete_prepare(self) -> None:
        """PrepareTxn succeeded: the transaction waits for commit or abort (from this or any client)."""
        with self._lock:
            self._transition(S.PREPARED_TRANSACTION, "complete prepare_transaction")
            self._prepared = True

    def kept_prepared(self, producer_id: int, producer_epoch: int) -> None:
        """init_transactions(keep_prepared_txn=True) found a prepared transaction: hold its handle."""
        with self._lock:
            self._transition(S.PREPARED_TRANSACTION, "keep the prepared transaction")
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self._prepared = True

    @property
    def was_prepared(self) -> bool:
        """Was the open transaction prepared (so another client may end it: Admin.commit_prepared_transaction)?"""
        with self._lock:
            return self._prepared

    @property
    def is_prepared(self) -> bool:
        with self._lock:
            return self._state is S.PREPARED_TRANSACTION

    def begin_commit(self) -> None:
        with self._lock:
            self._require_transactional("commit_transaction")
            if self._state is S.READY:
                raise errors.IllegalStateError("cannot commit_transaction: no transaction is open")
            self._transition(S.COMMITTING_TRANSACTION, "commit_transaction")

    def begin_abort(self) -> None:
        with self._lock:
            self._require_transactional("abort_transaction")
            if self._state is S.READY:
                raise errors.IllegalStateError("cannot abort_transaction: no transaction is open")
            self._transition(S.ABORTING_TRANSACTION, "abort_transaction")
            # An abort after an error may leave sequence numbers the broker does not expect.
            if self._last_error is not None:
                self._epoch_bump_needed = True

    @property
    def epoch_bump_needed(self) -> bool:
        with self._lock:
            return self._epoch_bump_needed

    def request_epoch_bump(self) -> None:
        with self._lock:
            self._epoch_bump_needed = True

    def complete_transaction(self) -> None:
        """EndTxn succeeded (or was not needed): back to READY for the next transaction."""
        with self._lock:
            self._transition(S.READY, "complete the transaction")
            self.generation += 1
            self._added.clear()
            self._pending.clear()
            self._in_flight_add.clear()
            self._offsets_added = False
            self._prepared = False
            self._last_error = None

    def complete_epoch_bump(self, producer_id: int, producer_epoch: int) -> None:
        with self._lock:
            self.producer_id = producer_id
            self.producer_epoch = producer_epoch
            self._epoch_bump_needed = False

    @property
    def is_completing(self) -> bool:
        with self._lock:
            return self._state in (S.COMMITTING_TRANSACTION, S.ABORTING_TRANSACTION)

    @property
    def is_aborting(self) -> bool:
        with self._lock:
            return self._state in (S.ABORTING_TRANSACTION, S.ABORTABLE_ERROR)

    # ------------------------------------------------------------------ errors

    def _set_fatal(self, exc: errors.SluiceError) -> None:
        if self.is_fencing(exc) and not isinstance(exc, errors.ProducerFencedError):
            fenced = errors.ProducerFencedError(exc.message)
            fenced.__cause__ = exc
            exc = fenced
        if self._state is not S.FATAL_ERROR or self._last_error is None:
            self._last_error = exc
        self._state = S.FATAL_ERROR

    def is_fencing(self, exc: BaseException) -> bool:
        """Does ``exc`` fence this producer for good (by its transaction protocol version)?"""
        return is_fencing_error(exc, self.transaction_version)

    def set_fatal_error(self, exc: errors.SluiceError) -> None:
        with self._lock:
            self._set_fatal(exc)

    def set_abortable_error(self, exc: errors.SluiceError) -> None:
        """A send or offset commit of the transaction failed: only abort is possible now.

        An application-recoverable error (fenced, the producer id is gone)
        makes it fatal instead. A FATAL-category answer to a produce (the
        records were refused, e.g. INVALID_TXN_STATE) only breaks the
        transaction, as Kafka's producer does; a coordinator's answer of that
        category ends the producer (the callers use :func:`ends_the_producer`).
        Outside a transaction (or while aborting anyway) an error changes
        nothing but is remembered.
        """
        with self._lock:
            if self.is_fencing(exc) or exc.category is errors.Category.APPLICATION_RECOVERABLE:
                self._set_fatal(exc)
                return
            if self.transactional_id is None or self._state is S.FATAL_ERROR:
                return
            if self._state is S.ABORTING_TRANSACTION:
                if self._last_error is None:
                    self._last_error = exc
                self._epoch_bump_needed = True
                return
            if S.ABORTABLE_ERROR in TRANSITIONS[self._state]:
                self._state = S.ABORTABLE_ERROR
                if self._last_error is None:
                    self._last_error = exc

    def send_failed(self, generation: int, exc: errors.SluiceError) -> None:
        """A transactional batch created in ``generation`` (or a record send() refused) failed for good.

        Breaks that transaction if it is still the current one (its commit
        then raises); a failure of an earlier, ended transaction must not
        break the next one. A fencing error ends the producer either way.
        Call it *before* the batch leaves the accumulator's incomplete set,
        so that a commit whose flush sees the batch gone also sees the error.
        """
        with self._lock:
            if generation != self.generation and not (
                self.is_fencing(exc) or exc.category is errors.Category.APPLICATION_RECOVERABLE
            ):
                return
            self.set_abortable_error(exc)

    def request_error(self, generation: int, exc: errors.SluiceError) -> None:
        """A transactional request of ``generation`` (AddPartitionsToTxn) failed for good.

        By its category the producer ends or the transaction breaks, if it
        is still the current one; the answer to a request of an ended
        transaction only counts if it fences the producer (fenced is fenced).
        """
        with self._lock:
            if generation != self.generation:
                if self.is_fencing(exc) or exc.category is errors.Category.APPLICATION_RECOVERABLE:
                    self._set_fatal(exc)
            elif ends_the_producer(exc):
                self._set_fatal(exc)
            else:
                self.set_abortable_error(exc)

    def raise_if_error(self, action: str) -> None:
        """Raise the stored error if the manager is in ABORTABLE_ERROR or FATAL_ERROR."""
        with self._lock:
            if self._state is S.FATAL_ERROR and self._last_error is not None:
                raise self._fatal_copy(action)
            if self._state is S.ABORTABLE_ERROR and self._last_error is not None:
                raise self._abortable_copy(action)

    def __repr__(self) -> str:
        return (
            f"TransactionManager(transactional_id={self.transactional_id!r}, state={self.state.value}, "
            f"producer_id={self.producer_id}, producer_epoch={self.producer_epoch})"
        )
