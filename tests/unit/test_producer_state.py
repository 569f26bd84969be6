"""The idempotence checks of DESIGN section 3, as pure logic."""

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.log.producer_state import Action, ProducerEntry, check_append, check_marker


def entry_with(seqs: list[tuple[int, int]], epoch: int = 0) -> ProducerEntry:
    e = ProducerEntry(7, epoch)
    offset = 0
    for first, count in seqs:
        e.appended(epoch, first, count, offset, 0, False)
        offset += count
    return e


def test_unknown_producer_must_start_at_zero() -> None:
    assert check_append(None, 7, 0, 0, 3, False).action is Action.APPEND
    v = check_append(None, 7, 0, 5, 3, False)
    assert v.action is Action.REJECT and v.error == pb.UNKNOWN_PRODUCER_ID


def test_next_sequence_appends_and_gap_is_refused() -> None:
    e = entry_with([(0, 3)])
    assert check_append(e, 7, 0, 3, 2, False).action is Action.APPEND
    gap = check_append(e, 7, 0, 4, 2, False)
    assert gap.action is Action.REJECT and gap.error == pb.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_duplicate_within_window_answers_original_offset() -> None:
    e = entry_with([(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)])
    v = check_append(e, 7, 0, 2, 2, False)
    assert v.action is Action.DUPLICATE and v.duplicate_offset == 2
    # a sixth batch pushes the oldest out of the 5-batch window
    e.appended(0, 10, 2, 10, 0, False)
    assert check_append(e, 7, 0, 0, 2, False).action is Action.REJECT


def test_older_epoch_is_fenced_newer_starts_at_zero() -> None:
    e = entry_with([(0, 3)], epoch=2)
    old = check_append(e, 7, 1, 3, 1, False)
    assert old.error == pb.INVALID_PRODUCER_EPOCH
    assert check_append(e, 7, 1, 3, 1, True).error == pb.PRODUCER_FENCED
    assert check_append(e, 7, 3, 0, 1, False).action is Action.APPEND
    assert check_append(e, 7, 3, 5, 1, False).error == pb.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_sequence_wraps_at_int32() -> None:
    e = ProducerEntry(7, 0)
    e.appended(0, 2**31 - 2, 2, 0, 0, False)
    assert check_append(e, 7, 0, 0, 1, False).action is Action.APPEND


def test_plain_write_during_open_transaction_is_refused() -> None:
    e = ProducerEntry(7, 0)
    e.appended(0, 0, 1, 0, 0, True)
    assert check_append(e, 7, 0, 1, 1, False).error == pb.INVALID_TXN_STATE


def test_marker_from_older_coordinator_is_fenced() -> None:
    e = ProducerEntry(7, 0, coordinator_epoch=5)
    assert check_marker(e, 7, 0, 4).error == pb.TRANSACTION_COORDINATOR_FENCED
    assert check_marker(e, 7, 0, 5).action is Action.APPEND


def test_entry_round_trips() -> None:
    e = entry_with([(0, 2), (2, 3)], epoch=4)
    e.txn_first_offset = 17
    d = ProducerEntry.decode(7, e.encode())
    assert (d.epoch, d.txn_first_offset, list(d.batches)) == (4, 17, list(e.batches))


def test_a_copy_is_equal_and_independent() -> None:
    """The append path changes a copy while its write is pending: the stored entry must not move."""
    e = entry_with([(0, 2), (2, 2), (4, 2), (6, 2), (8, 2)])
    e.coordinator_epoch, e.completed = 3, [(0, 9)]
    c = e.copy()
    assert c == e and c.encode() == e.encode() and c.batches.maxlen == e.batches.maxlen
    c.appended(0, 10, 2, 10, 5, True)
    c.completed.append((10, 12))
    assert e.last_seq == 9 and e.txn_first_offset == -1 and e.completed == [(0, 9)]
    assert ProducerEntry.decode(7, c.encode()) == c
