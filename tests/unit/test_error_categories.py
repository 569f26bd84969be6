"""Every error has one KIP-1050 category, consistent with ``retriable``, and docs/errors.md lists it."""

from __future__ import annotations

from pathlib import Path

import pytest

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.client.producer.sender import ProducerClosedError, TransactionAbortedError
from sluice.client.producer.transaction_manager import TransactionManager, TransactionState, ends_the_producer

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"
C = errors.Category


@pytest.mark.parametrize("cls", errors.ERRORS, ids=lambda c: c.__name__)
def test_every_error_class_has_a_category_that_agrees_with_retriable(cls: type[errors.SluiceError]) -> None:
    assert isinstance(cls.category, errors.ErrorCategory)
    assert (cls.category is C.RETRIABLE) == cls.retriable, cls


def test_the_categories_of_the_transactional_errors() -> None:
    # KIP-890 part 2: a stale epoch after a coordinator's bump is abortable, a fence is not.
    assert errors.InvalidProducerEpochError.category is C.ABORTABLE
    assert errors.ProducerFencedError.category is C.APPLICATION_RECOVERABLE
    assert errors.InvalidProducerIdMappingError.category is C.APPLICATION_RECOVERABLE
    assert errors.TransactionalIdAuthorizationFailedError.category is C.FATAL
    assert errors.InvalidTxnStateError.category is C.FATAL
    assert errors.ConcurrentTransactionsError.category is C.RETRIABLE
    assert errors.CoordinatorLoadInProgressError.category is C.RETRIABLE
    assert TransactionAbortedError.category is C.ABORTABLE  # KIP-654
    assert ProducerClosedError.category is C.FATAL
    assert errors.error_for(pb.INVALID_PRODUCER_EPOCH).category is C.ABORTABLE


def test_an_unnamed_category_follows_retriable_and_a_subclass_inherits() -> None:
    class NewRetriable(errors.SluiceError):
        retriable = True

    class NewRefusal(errors.SluiceError):
        pass

    class StaleEpochVariant(errors.InvalidProducerEpochError):
        pass

    assert NewRetriable.category is C.RETRIABLE
    assert NewRefusal.category is C.FATAL  # never abortable by accident
    assert StaleEpochVariant.category is C.ABORTABLE


def test_the_producer_classifies_by_category() -> None:
    assert ends_the_producer(errors.ProducerFencedError("x"))
    assert ends_the_producer(errors.TransactionalIdAuthorizationFailedError("x"))
    assert not ends_the_producer(errors.InvalidProducerEpochError("x"))
    assert not ends_the_producer(errors.MessageTooLargeError("x"))
    # A version 2 producer: a stale epoch breaks the transaction only; abort is allowed.
    tm = TransactionManager("tx", transaction_version=2)
    tm.begin_init()
    tm.complete_init(5, 0)
    tm.begin_transaction()
    tm.set_abortable_error(errors.InvalidProducerEpochError("bumped by a timeout"))
    assert tm.state is TransactionState.ABORTABLE_ERROR
    tm.begin_abort()
    tm.complete_epoch_bump(5, 1)
    tm.complete_transaction()
    assert tm.state is TransactionState.READY and tm.producer_id_and_epoch() == (5, 1)
    # ... while a fence ends it, in either version.
    tm.begin_transaction()
    tm.set_abortable_error(errors.ProducerFencedError("another instance"))
    assert tm.state is TransactionState.FATAL_ERROR


def test_docs_list_every_error_with_its_category() -> None:
    text = DOC.read_text()
    for cls in errors.ERRORS:
        name = pb.ErrorCode.Name(cls.code) if cls.code != pb.NONE else cls.__name__
        rows = [line for line in text.splitlines() if line.startswith("|") and f"`{name}`" in line]
        assert rows, f"docs/errors.md has no row for {name}"
        assert any(f"| {cls.category.value} |" in row for row in rows), (name, cls.category.value, rows)
