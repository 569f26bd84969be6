"""The transaction state machine (broker/sluice_broker/txn/state.py): the transition table and the transitions."""

from __future__ import annotations

import itertools

import pytest

from sluice.broker.txn.state import (
    COMPLETE,
    IDLE,
    MAX_EPOCH,
    NO_TIME,
    TRANSITIONS,
    IllegalTransition,
    TxnMetadata,
    TxnState,
    can_transit,
    epoch_exhausted,
)

S = TxnState

# The table, written out independently as the pairs Kafka allows (TransactionState.validPreviousStates).
LEGAL = {
    (S.EMPTY, S.EMPTY),
    (S.EMPTY, S.ONGOING),
    (S.EMPTY, S.DEAD),
    (S.ONGOING, S.ONGOING),
    (S.ONGOING, S.PREPARE_COMMIT),
    (S.ONGOING, S.PREPARE_ABORT),
    (S.ONGOING, S.PREPARE_EPOCH_FENCE),
    (S.PREPARE_EPOCH_FENCE, S.PREPARE_ABORT),
    (S.PREPARE_COMMIT, S.COMPLETE_COMMIT),
    (S.PREPARE_ABORT, S.COMPLETE_ABORT),
    (S.COMPLETE_COMMIT, S.EMPTY),
    (S.COMPLETE_COMMIT, S.ONGOING),
    (S.COMPLETE_COMMIT, S.DEAD),
    (S.COMPLETE_ABORT, S.EMPTY),
    (S.COMPLETE_ABORT, S.ONGOING),
    (S.COMPLETE_ABORT, S.DEAD),
    # Prepared transactions (KIP-939's idea): prepared from an open transaction or, empty, from an
    # idle id; left only by a decision (EndTxn) or a fencing InitProducerId that aborts it.
    (S.ONGOING, S.PREPARED),
    (S.EMPTY, S.PREPARED),
    (S.COMPLETE_COMMIT, S.PREPARED),
    (S.COMPLETE_ABORT, S.PREPARED),
    (S.PREPARED, S.PREPARE_COMMIT),
    (S.PREPARED, S.PREPARE_ABORT),
    (S.PREPARED, S.PREPARE_EPOCH_FENCE),
}


def meta(
    state: TxnState = S.EMPTY, epoch: int = 0, partitions: frozenset[tuple[str, int]] = frozenset()
) -> TxnMetadata:
    base = TxnMetadata.new("tx", 7, 60_000, now=1000)
    return TxnMetadata(
        transactional_id=base.transactional_id,
        producer_id=base.producer_id,
        producer_epoch=epoch,
        last_producer_id=base.last_producer_id,
        last_producer_epoch=base.last_producer_epoch,
        timeout_ms=base.timeout_ms,
        state=state,
        partitions=partitions,
        txn_start_ms=NO_TIME,
        last_update_ms=1000,
    )


def test_state_names_are_the_wire_names() -> None:
    assert [s.value for s in S] == [
        "Empty",
        "Ongoing",
        "PrepareCommit",
        "PrepareAbort",
        "CompleteCommit",
        "CompleteAbort",
        "PrepareEpochFence",
        "Dead",
        "Prepared",
    ]


def test_table_covers_every_state() -> None:
    assert set(TRANSITIONS) == set(S)


@pytest.mark.parametrize(("old", "new"), list(itertools.product(S, S)))
def test_every_pair_is_legal_exactly_when_listed(old: TxnState, new: TxnState) -> None:
    assert can_transit(old, new) == ((old, new) in LEGAL)
    if (old, new) in LEGAL:
        assert meta(old).transit(new, now=2000).state is new
    else:
        with pytest.raises(IllegalTransition):
            meta(old).transit(new, now=2000)


def test_dead_is_final_and_idle_states_can_start_or_expire() -> None:
    assert TRANSITIONS[S.DEAD] == frozenset()
    for state in IDLE:
        assert {S.ONGOING, S.DEAD, S.EMPTY} <= TRANSITIONS[state]
    assert frozenset({S.COMPLETE_COMMIT, S.COMPLETE_ABORT}) == COMPLETE


def test_new_id_is_empty_at_epoch_zero() -> None:
    m = TxnMetadata.new("tx", 42, 5000, now=123)
    assert (m.state, m.producer_id, m.producer_epoch, m.timeout_ms) == (S.EMPTY, 42, 0, 5000)
    assert (m.last_producer_id, m.last_producer_epoch, m.txn_start_ms, m.last_update_ms) == (-1, -1, NO_TIME, 123)


def test_first_add_starts_the_clock_and_later_adds_keep_it() -> None:
    first = meta(S.EMPTY).add_partitions([("a", 0)], now=2000)
    assert first.state is S.ONGOING and first.txn_start_ms == 2000 and first.partitions == {("a", 0)}
    second = first.add_partitions([("a", 1), ("a", 0)], now=3000)
    assert second.txn_start_ms == 2000 and second.last_update_ms == 3000
    assert second.partitions == {("a", 0), ("a", 1)}
    again = meta(S.COMPLETE_COMMIT).add_partitions([("b", 0)], now=4000)
    assert again.txn_start_ms == 4000 and again.partitions == {("b", 0)}


def test_prepare_and_complete_keep_then_clear_partitions() -> None:
    ongoing = meta(S.EMPTY).add_partitions([("a", 0)], now=2000)
    prepared = ongoing.prepare_end(commit=True, now=2500)
    assert prepared.state is S.PREPARE_COMMIT and prepared.partitions == {("a", 0)}
    done = prepared.complete(now=3000)
    assert done.state is S.COMPLETE_COMMIT and done.partitions == frozenset() and done.txn_start_ms == NO_TIME
    aborted = ongoing.prepare_end(commit=False, now=2500).complete(now=3000)
    assert aborted.state is S.COMPLETE_ABORT
    with pytest.raises(IllegalTransition):
        done.complete(now=4000)  # Complete* -> Complete* is not a transition


def test_fence_bumps_the_epoch_on_the_way_to_prepare_abort() -> None:
    ongoing = meta(S.ONGOING, epoch=4, partitions=frozenset({("a", 0)}))
    fenced = ongoing.fence_and_abort(now=5000)
    assert fenced.state is S.PREPARE_ABORT and fenced.producer_epoch == 5 and fenced.partitions == {("a", 0)}
    with pytest.raises(IllegalTransition):
        meta(S.EMPTY).fence_and_abort(now=5000)


def test_bump_epoch_remembers_the_previous_id_and_epoch() -> None:
    bumped = meta(S.COMPLETE_ABORT, epoch=3).bump_epoch(9000, now=6000)
    assert (bumped.state, bumped.producer_id, bumped.producer_epoch) == (S.EMPTY, 7, 4)
    assert (bumped.last_producer_id, bumped.last_producer_epoch, bumped.timeout_ms) == (7, 3, 9000)
    rotated = meta(S.EMPTY, epoch=MAX_EPOCH - 1).bump_epoch(9000, now=6000, new_producer_id=99)
    assert (rotated.producer_id, rotated.producer_epoch) == (99, 0)
    assert (rotated.last_producer_id, rotated.last_producer_epoch) == (7, MAX_EPOCH - 1)
    with pytest.raises(IllegalTransition):
        meta(S.ONGOING).bump_epoch(9000, now=6000)


def test_epoch_exhaustion_leaves_room_for_one_fence() -> None:
    assert not epoch_exhausted(MAX_EPOCH - 2)
    assert epoch_exhausted(MAX_EPOCH - 1)
    # The highest epoch a producer can hold can still be fenced within int16.
    assert meta(S.ONGOING, epoch=MAX_EPOCH - 1).fence_and_abort(now=1).producer_epoch == MAX_EPOCH


def test_expire_goes_to_dead_only_when_idle() -> None:
    assert meta(S.COMPLETE_COMMIT).expire(now=1).state is S.DEAD
    with pytest.raises(IllegalTransition):
        meta(S.ONGOING).expire(now=1)


def test_metadata_is_immutable() -> None:
    m = meta()
    with pytest.raises(AttributeError):
        m.producer_epoch = 3  # type: ignore[misc]


def test_prepare_keeps_the_open_transaction_and_its_clock() -> None:
    ongoing = meta(S.EMPTY).add_partitions([("a", 0), ("b", 1)], now=2000)
    prepared = ongoing.prepare(now=2500)
    assert prepared.state is S.PREPARED
    assert prepared.partitions == {("a", 0), ("b", 1)} and prepared.txn_start_ms == 2000
    assert (prepared.producer_id, prepared.producer_epoch) == (ongoing.producer_id, ongoing.producer_epoch)
    committed = prepared.prepare_end(commit=True, now=3000)
    assert committed.state is S.PREPARE_COMMIT and committed.partitions == {("a", 0), ("b", 1)}
    assert committed.complete(now=3500).state is S.COMPLETE_COMMIT
    assert prepared.prepare_end(commit=False, now=3000).complete(now=3500).state is S.COMPLETE_ABORT


def test_an_idle_id_prepares_an_empty_transaction() -> None:
    for state in IDLE:
        prepared = meta(state, partitions=frozenset()).prepare(now=7000)
        assert prepared.state is S.PREPARED and prepared.partitions == frozenset() and prepared.txn_start_ms == 7000


def test_a_prepared_transaction_is_never_bumped_expired_or_joined() -> None:
    prepared = meta(S.ONGOING, epoch=2, partitions=frozenset({("a", 0)})).prepare(now=2000)
    for move in (
        lambda: prepared.bump_epoch(9000, now=3000),
        lambda: prepared.expire(now=3000),
        lambda: prepared.add_partitions([("b", 0)], now=3000),
        lambda: prepared.prepare(now=3000),
        lambda: prepared.complete(now=3000),
    ):
        with pytest.raises(IllegalTransition):
            move()


def test_aborting_a_prepared_transaction_fences_its_epoch() -> None:
    prepared = meta(S.ONGOING, epoch=2, partitions=frozenset({("a", 0)})).prepare(now=2000)
    fenced = prepared.fence_and_abort(now=3000)
    assert fenced.state is S.PREPARE_ABORT and fenced.producer_epoch == 3 and fenced.partitions == {("a", 0)}
