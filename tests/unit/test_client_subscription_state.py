"""The consumer's subscription state: plain state, so its rules are checked without a broker."""

from __future__ import annotations

import pytest

from sluice import errors
from sluice.client.consumer.subscription_state import SubscriptionState
from sluice.client.types import GroupMetadata, TopicPartition

A0 = TopicPartition("a", 0)
A1 = TopicPartition("a", 1)
B0 = TopicPartition("b", 0)


def test_assign_keeps_the_positions_of_kept_partitions_and_names_the_removed_ones() -> None:
    subs = SubscriptionState()
    assert subs.assign({A0, A1}) == []
    subs.state(A0, "seek").position = 7
    removed = subs.assign({A0, B0})
    assert removed == [A1]
    assert set(subs.assignment) == {A0, B0}
    assert subs.state(A0, "seek").position == 7
    assert subs.state(B0, "seek").position is None


def test_state_of_a_partition_not_assigned_is_an_illegal_state() -> None:
    subs = SubscriptionState()
    with pytest.raises(errors.IllegalStateError, match="cannot pause a-0"):
        subs.state(A0, "pause")


def test_positions_are_looked_up_once_and_only_where_unknown() -> None:
    subs = SubscriptionState()
    subs.assign({A0, A1})
    subs.state(A0, "seek").position = 3
    subs.state(A1, "seek").reset_pending = True
    assert subs.missing_positions() == {A1: True}
    subs.set_positions({A0: 100, A1: 5, B0: 9})  # A0 is known, B0 not assigned: both ignored
    assert subs.positions() == {A0: 3, A1: 5}
    assert subs.state(A1, "seek").reset_pending is False
    assert subs.missing_positions() == {}


def test_a_pending_loss_stays_a_loss_until_applied() -> None:
    subs = SubscriptionState()
    subs.owned_partitions = frozenset({A0})
    meta = GroupMetadata("g", "m", 3)
    subs.leave_pending(frozenset(), True, meta)
    assert subs.owned_partitions == frozenset()
    subs.leave_pending(frozenset({A0}), False, GroupMetadata("g", "m", 4))
    pending = subs.pending_assignment
    assert pending is not None
    assert pending.lost
    assert pending.target == frozenset({A0})
    assert pending.metadata.member_epoch == 4


def test_clear_forgets_the_assignment_and_what_the_group_handed_over() -> None:
    subs = SubscriptionState()
    subs.assign({A0})
    subs.subscription = ["a"]
    subs.leave_pending(frozenset({A0}), False, GroupMetadata("g", "m", 1))
    subs.metadata = GroupMetadata("g", "m", 1)
    subs.clear()
    assert subs.assignment == {}
    assert subs.pending_assignment is None
    assert subs.metadata is None
    assert subs.owned_partitions == frozenset()
    assert subs.subscription == ["a"]  # the subscription is the consumer's to drop (unsubscribe)
