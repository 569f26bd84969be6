"""The producer's transaction state machine, without a broker."""

from __future__ import annotations

import itertools

import pytest

from sluice import errors
from sluice.client.producer.transaction_manager import (
    TRANSITIONS,
    TransactionManager,
    TransactionState,
)
from sluice.client.types import TopicPartition

S = TransactionState
TP0 = TopicPartition("t", 0)
TP1 = TopicPartition("t", 1)


def ready() -> TransactionManager:
    tm = TransactionManager("tx-1")
    tm.begin_init()
    tm.complete_init(7, 3)
    return tm


def in_txn() -> TransactionManager:
    tm = ready()
    tm.begin_transaction()
    return tm


def test_table_covers_every_state_and_fatal_is_reachable_from_all() -> None:
    assert set(TRANSITIONS) == set(S)
    for state, targets in TRANSITIONS.items():
        assert S.FATAL_ERROR in targets, state
    assert TRANSITIONS[S.FATAL_ERROR] == {S.FATAL_ERROR}


@pytest.mark.parametrize(("source", "target"), list(itertools.product(list(S), list(S))))
def test_transition_to_follows_the_table(source: TransactionState, target: TransactionState) -> None:
    tm = TransactionManager("tx-1")
    tm._state = source  # drive the table directly
    if target in TRANSITIONS[source]:
        tm.transition_to(target)
        assert tm.state is target
    else:
        with pytest.raises(errors.IllegalStateError):
            tm.transition_to(target)
        assert tm.state is source


def test_happy_path_commit() -> None:
    tm = TransactionManager("tx-1")
    assert tm.state is S.UNINITIALIZED
    tm.begin_init()
    assert tm.state is S.INITIALIZING
    tm.complete_init(7, 3)
    assert tm.state is S.READY
    assert tm.producer_id_and_epoch() == (7, 3)
    tm.begin_transaction()
    assert tm.state is S.IN_TRANSACTION
    tm.check_can_send()
    tm.begin_commit()
    assert tm.state is S.COMMITTING_TRANSACTION
    tm.complete_transaction()
    assert tm.state is S.READY


def test_init_twice_is_illegal_with_a_clear_message() -> None:
    tm = ready()
    with pytest.raises(errors.IllegalStateError, match="init_transactions\\(\\) was already called"):
        tm.begin_init()
    tm.begin_transaction()
    with pytest.raises(errors.IllegalStateError, match="already called"):
        tm.begin_init()


def test_init_may_be_retried_after_a_retriable_failure_not_after_a_fatal_one() -> None:
    tm = TransactionManager("tx-1")
    tm.begin_init()
    tm.init_failed(errors.CoordinatorNotAvailableError("later"))
    assert tm.state is S.UNINITIALIZED
    tm.begin_init()
    tm.init_failed(errors.InvalidTransactionTimeoutError("too long"))
    assert tm.state is S.FATAL_ERROR
    with pytest.raises(errors.InvalidTransactionTimeoutError):
        tm.begin_init()


def test_send_and_begin_need_init() -> None:
    tm = TransactionManager("tx-1")
    with pytest.raises(errors.IllegalStateError, match="init_transactions"):
        tm.check_can_send()
    with pytest.raises(errors.IllegalStateError, match="init_transactions"):
        tm.begin_transaction()


def test_send_outside_a_transaction_is_illegal() -> None:
    tm = ready()
    with pytest.raises(errors.IllegalStateError, match="begin_transaction"):
        tm.check_can_send()


def test_begin_twice_commit_or_abort_without_transaction() -> None:
    tm = ready()
    with pytest.raises(errors.IllegalStateError):
        tm.begin_commit()
    with pytest.raises(errors.IllegalStateError):
        tm.begin_abort()
    tm.begin_transaction()
    with pytest.raises(errors.IllegalStateError, match="already open"):
        tm.begin_transaction()


def test_abortable_error_commit_raises_abort_allowed() -> None:
    tm = in_txn()
    tm.set_abortable_error(errors.MessageTooLargeError("big"))
    assert tm.state is S.ABORTABLE_ERROR
    with pytest.raises(errors.MessageTooLargeError, match="must be aborted"):
        tm.begin_commit()
    with pytest.raises(errors.MessageTooLargeError):
        tm.check_can_send()
    with pytest.raises(errors.MessageTooLargeError):
        tm.check_in_transaction("send_offsets_to_transaction")
    tm.begin_abort()
    assert tm.state is S.ABORTING_TRANSACTION
    assert tm.epoch_bump_needed  # sequences may be off after an error
    tm.complete_epoch_bump(7, 4)
    tm.complete_transaction()
    assert tm.state is S.READY
    assert tm.last_error is None
    assert tm.producer_id_and_epoch() == (7, 4)
    tm.begin_transaction()


def test_an_error_while_committing_makes_the_transaction_abortable() -> None:
    tm = in_txn()
    tm.begin_commit()
    tm.set_abortable_error(errors.KafkaTimeoutError("expired"))
    assert tm.state is S.ABORTABLE_ERROR
    with pytest.raises(errors.KafkaTimeoutError):
        tm.raise_if_error("commit_transaction")


@pytest.mark.parametrize(
    "fencing",
    [
        errors.ProducerFencedError("x"),
        errors.InvalidProducerEpochError("x"),
        errors.TransactionCoordinatorFencedError(),
    ],
)
def test_fencing_is_fatal_and_surfaces_as_producer_fenced(fencing: errors.SluiceError) -> None:
    tm = in_txn()
    tm.set_abortable_error(fencing)
    assert tm.state is S.FATAL_ERROR
    for call in (
        tm.check_can_send,
        tm.begin_commit,
        tm.begin_abort,
        tm.begin_transaction,
        lambda: tm.check_in_transaction("send_offsets_to_transaction"),
    ):
        with pytest.raises(errors.ProducerFencedError):
            call()


def test_fatal_is_final() -> None:
    tm = in_txn()
    tm.set_fatal_error(errors.TransactionalIdAuthorizationFailedError("no"))
    tm.set_abortable_error(errors.MessageTooLargeError("later"))
    assert tm.state is S.FATAL_ERROR
    assert isinstance(tm.last_error, errors.TransactionalIdAuthorizationFailedError)


def test_commit_may_be_retried_after_a_timeout() -> None:
    tm = in_txn()
    tm.begin_commit()
    tm.begin_commit()  # the application calls commit_transaction() again
    assert tm.state is S.COMMITTING_TRANSACTION
    with pytest.raises(errors.IllegalStateError):
        tm.begin_abort()  # Kafka: a commit in progress cannot turn into an abort


def test_partitions_are_added_once_and_only_while_the_transaction_is_live() -> None:
    tm = in_txn()
    assert not tm.is_partition_added(TP0)
    tm.maybe_add_partition(TP0)
    tm.maybe_add_partition(TP1)
    tm.maybe_add_partition(TP0)
    assert tm.has_pending_partitions()
    assert tm.take_pending_partitions() == (tm.generation, [TP0, TP1])
    assert tm.adding_partitions()
    tm.maybe_add_partition(TP0)  # under way: not pending again
    assert not tm.has_pending_partitions()
    tm.partitions_added([TP0])
    tm.partitions_add_failed([TP1], retry=True)
    assert tm.is_partition_added(TP0)
    assert not tm.is_partition_added(TP1)
    assert tm.take_pending_partitions() == (tm.generation, [TP1])
    tm.partitions_added([TP1])
    assert tm.partitions_in_transaction == {TP0, TP1}
    assert tm.needs_end_txn()
    tm.begin_commit()
    tm.complete_transaction()
    assert not tm.needs_end_txn()
    assert not tm.is_partition_added(TP0)  # a new transaction adds it again


def test_offsets_alone_need_end_txn() -> None:
    tm = in_txn()
    assert not tm.needs_end_txn()
    tm.offsets_added()
    assert tm.needs_end_txn()


def test_batches_wait_while_aborting() -> None:
    tm = in_txn()
    tm.maybe_add_partition(TP0)
    tm.partitions_added(tm.take_pending_partitions()[1])
    assert tm.is_partition_added(TP0)
    tm.set_abortable_error(errors.MessageTooLargeError("x"))
    assert not tm.is_partition_added(TP0)
    tm.maybe_add_partition(TP1)
    assert tm.take_pending_partitions()[1] == []


def test_idempotent_producer_uses_the_same_manager() -> None:
    tm = TransactionManager(None)
    assert not tm.has_producer_id
    tm.check_can_send()  # an idempotent producer may queue records before it has an id
    tm.begin_init()
    tm.complete_init(11, 0)
    assert tm.has_producer_id
    assert tm.is_partition_added(TP0)
    tm.begin_epoch_bump()
    assert not tm.has_producer_id
    tm.complete_init(11, 1)
    assert tm.producer_id_and_epoch() == (11, 1)
    with pytest.raises(errors.IllegalStateError, match="no transactional_id"):
        tm.begin_transaction()
    tm.set_abortable_error(errors.MessageTooLargeError("x"))  # no transaction: nothing to abort
    assert tm.state is S.READY


def test_prepare_then_commit_or_abort() -> None:
    tm = in_txn()
    tm.maybe_add_partition(TP0)
    tm.take_pending_partitions()
    tm.partitions_added([TP0])
    tm.begin_prepare()
    assert tm.state is S.COMMITTING_TRANSACTION and not tm.send_ok
    tm.begin_prepare()  # a prepare that timed out may be repeated
    tm.complete_prepare()
    assert tm.state is S.PREPARED_TRANSACTION and tm.is_prepared and not tm.send_ok
    with pytest.raises(errors.IllegalStateError, match="already prepared"):
        tm.begin_prepare()
    with pytest.raises(errors.IllegalStateError):
        tm.check_can_send()
    with pytest.raises(errors.IllegalStateError):
        tm.begin_transaction()
    tm.begin_commit()
    assert tm.needs_end_txn()
    tm.complete_transaction()
    assert tm.state is S.READY and not tm.needs_end_txn()
    tm.begin_transaction()
    tm.begin_prepare()
    tm.complete_prepare()
    tm.begin_abort()
    assert tm.state is S.ABORTING_TRANSACTION and not tm.epoch_bump_needed


def test_an_empty_prepared_transaction_still_needs_its_end_txn() -> None:
    tm = in_txn()
    tm.begin_prepare()
    tm.complete_prepare()
    tm.begin_commit()
    assert tm.needs_end_txn()  # the coordinator holds it as Prepared even without partitions


def test_prepare_needs_an_open_transaction() -> None:
    with pytest.raises(errors.IllegalStateError, match="no transaction is open"):
        ready().begin_prepare()
    with pytest.raises(errors.IllegalStateError, match="transactional_id"):
        TransactionManager(None).begin_prepare()


def test_a_kept_prepared_transaction_is_held_with_its_handle() -> None:
    tm = ready()
    tm.kept_prepared(11, 5)
    assert tm.state is S.PREPARED_TRANSACTION and tm.producer_id_and_epoch() == (11, 5)
    tm.begin_commit()
    assert tm.needs_end_txn()
    tm.complete_transaction()
    assert tm.state is S.READY


def test_what_the_sender_learns_applies_only_to_the_transaction_it_was_for() -> None:
    """Answers and failures that arrive once their transaction ended leave the next one alone (issue 30)."""
    tm = in_txn()
    first = tm.generation
    tm.maybe_add_partition(TP0)
    generation, tps = tm.take_pending_partitions()
    assert (generation, tps) == (first, [TP0])
    tm.begin_abort()
    assert tm.aborting_generation() == (first, None)
    tm.complete_transaction()
    assert tm.aborting_generation() is None
    tm.begin_transaction()
    tm.partitions_added(tps, generation)  # a late answer for the aborted transaction
    assert not tm.is_partition_added(TP0) and not tm.needs_end_txn()
    tm.send_failed(first, errors.KafkaTimeoutError("expired"))
    tm.request_error(first, errors.InvalidTxnStateError("late"))
    assert tm.state is S.IN_TRANSACTION
    tm.send_failed(tm.generation, errors.KafkaTimeoutError("expired"))
    assert tm.state is S.ABORTABLE_ERROR
    assert tm.aborting_generation() == (tm.generation, tm.last_error)
    with pytest.raises(errors.KafkaTimeoutError):
        tm.begin_commit()
