"""Partition reassignment's pure rules (sluice.metadata.reassignment) and the controller's completion step."""

from __future__ import annotations

import dataclasses

import pytest

from sluice.metadata.documents import NO_LEADER, PartitionState, TopicDocument
from sluice.metadata.reassignment import (
    INVALID_REPLICA_ASSIGNMENT,
    INVALID_REPLICATION_FACTOR,
    NO_REASSIGNMENT_IN_PROGRESS,
    ReassignmentRefused,
    cancel,
    check_target,
    complete,
    original_replicas,
    propose,
    start,
    target_replicas,
)
from sluice.operator.controller.decisions import describe_changes, elect_leaders, reconcile_topic

ALL = frozenset(range(10))


def _state(
    replicas: list[int], leader: int | None = None, isr: list[int] | None = None, epoch: int = 3
) -> PartitionState:
    return PartitionState(
        replicas=replicas,
        leader=replicas[0] if leader is None else leader,
        leader_epoch=epoch,
        isr=list(replicas) if isr is None else isr,
    )


def test_start_adds_the_target_and_records_adding_and_removing() -> None:
    moving = start(_state([1, 2, 3]), [3, 4, 5])
    assert moving.replicas == [3, 4, 5, 1, 2]
    assert moving.adding_replicas == [4, 5] and moving.removing_replicas == [1, 2]
    assert (moving.leader, moving.leader_epoch, moving.isr) == (1, 3, [1, 2, 3])  # nothing else moves yet
    assert original_replicas(moving) == [1, 2, 3] and target_replicas(moving) == [3, 4, 5]
    assert moving.reassigning


def test_document_round_trip_keeps_the_lists_and_omits_them_when_empty() -> None:
    moving = start(_state([1, 2]), [3, 4])
    assert PartitionState.from_json(moving.to_json()) == moving
    plain = _state([1, 2])
    assert "adding_replicas" not in plain.to_json() and "removing_replicas" not in plain.to_json()


def test_complete_waits_for_every_target_replica_in_sync() -> None:
    moving = start(_state([1, 2, 3]), [3, 4, 5])
    assert complete(moving, ALL) == moving
    assert complete(dataclasses.replace(moving, isr=[1, 2, 3, 4]), ALL).reassigning


def test_complete_moves_leadership_off_a_removed_leader_and_bumps_the_epoch() -> None:
    moving = dataclasses.replace(start(_state([1, 2, 3]), [3, 4, 5]), isr=[1, 2, 3, 4, 5])
    done = complete(moving, ALL)
    assert done.replicas == [3, 4, 5] and done.isr == [3, 4, 5]
    assert (done.leader, done.leader_epoch) == (3, 4)
    assert not done.reassigning


def test_complete_keeps_a_leader_that_stays() -> None:
    moving = dataclasses.replace(start(_state([1, 2]), [1, 3]), isr=[1, 2, 3])
    done = complete(moving, ALL)
    assert (done.replicas, done.isr, done.leader, done.leader_epoch) == ([1, 3], [1, 3], 1, 3)


def test_complete_waits_when_no_target_replica_can_lead() -> None:
    moving = dataclasses.replace(start(_state([1]), [2]), isr=[1, 2])
    assert complete(moving, frozenset({1})) == moving  # broker 2 is not live


def test_cancel_reverts_and_hands_leadership_back() -> None:
    moving = start(_state([1, 2]), [3, 4])
    led_by_new = dataclasses.replace(moving, isr=[1, 2, 3], leader=3, leader_epoch=4)
    back = cancel(led_by_new)
    assert back.replicas == [1, 2] and back.isr == [1, 2]
    assert (back.leader, back.leader_epoch) == (1, 5)
    assert not back.reassigning
    assert cancel(moving) == _state([1, 2])


def test_cancel_without_a_reassignment_is_refused() -> None:
    with pytest.raises(ReassignmentRefused) as info:
        cancel(_state([1, 2]))
    assert info.value.error == NO_REASSIGNMENT_IN_PROGRESS


def test_a_new_target_replaces_the_one_in_progress_from_the_original_replicas() -> None:
    moving = dataclasses.replace(start(_state([1, 2]), [3, 4]), isr=[1, 2, 3])
    again = start(moving, [1, 5])
    assert again.replicas == [1, 5, 2]
    assert again.adding_replicas == [5] and again.removing_replicas == [2]
    assert again.isr == [1, 2]  # broker 3 is no replica any more


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ([], INVALID_REPLICA_ASSIGNMENT),
        ([1, 1], INVALID_REPLICA_ASSIGNMENT),
        ([1, 9], INVALID_REPLICA_ASSIGNMENT),
    ],
)
def test_bad_targets_are_refused_as_kafka_classifies_them(target: list[int], error: str) -> None:
    with pytest.raises(ReassignmentRefused) as info:
        check_target(target, {1, 2, 3}, 2)
    assert info.value.error == error


def test_replication_factor_change_refused_only_when_asked() -> None:
    check_target([1, 2, 3], {1, 2, 3}, 2)
    with pytest.raises(ReassignmentRefused) as info:
        check_target([1, 2, 3], {1, 2, 3}, 2, allow_replication_factor_change=False)
    assert info.value.error == INVALID_REPLICATION_FACTOR


def test_the_controller_completes_a_caught_up_reassignment_in_its_round() -> None:
    moving = dataclasses.replace(start(_state([0, 1]), [2, 3]), isr=[0, 1, 2, 3])
    topic = TopicDocument(name="t", topic_id="x" * 32, partitions=[moving])
    new = elect_leaders(topic, ALL, frozenset())
    assert new is not None
    p = new.partitions[0]
    assert (p.replicas, p.isr, p.leader, p.leader_epoch) == ([2, 3], [2, 3], 2, 4)
    lines = describe_changes(topic, new, ALL, frozenset())
    assert any("reassignment of t-0 completed" in line for line in lines)
    assert any("reassigned off broker 0" in line for line in lines)


def test_the_controller_leaves_a_catching_up_reassignment_alone() -> None:
    moving = start(_state([0, 1]), [2, 3])
    topic = TopicDocument(name="t", topic_id="x" * 32, partitions=[moving])
    assert reconcile_topic(topic, ALL, frozenset(), preferred=False) is None


def test_a_dead_leader_is_replaced_from_the_isr_midway() -> None:
    moving = dataclasses.replace(start(_state([0, 1]), [2, 3]), isr=[0, 1, 2])
    topic = TopicDocument(name="t", topic_id="x" * 32, partitions=[moving])
    new = elect_leaders(topic, frozenset({1, 2, 3}), frozenset({0}))
    assert new is not None
    p = new.partitions[0]
    assert p.leader != 0 and p.leader in p.isr and 0 not in p.isr
    assert p.reassigning  # broker 3 still catching up: the move goes on under the new leader
    assert p.leader != NO_LEADER


def test_propose_balances_over_the_given_brokers_and_lists_only_moves() -> None:
    plan = propose({"t": [[0, 1], [1, 2], [2, 0]]}, [(3, None), (4, None), (5, None)])
    assert sorted(plan) == [("t", 0), ("t", 1), ("t", 2)]
    assert all(set(r) <= {3, 4, 5} and len(r) == 2 for r in plan.values())
    leaders = [r[0] for r in plan.values()]
    assert sorted(leaders) == [3, 4, 5]
    same = propose({"t": [[3, 4], [4, 5], [5, 3]]}, [(3, None), (4, None), (5, None)])
    assert same == {}
    with pytest.raises(ValueError):
        propose({"t": [[0, 1, 2]]}, [(3, None), (4, None)])


def test_a_new_target_dropping_the_adding_leader_hands_leadership_back() -> None:
    moving = dataclasses.replace(start(_state([1, 2]), [3, 4]), isr=[1, 2, 3], leader=3, leader_epoch=4)
    again = start(moving, [1, 5])
    assert 3 not in again.replicas and again.leader in again.isr and again.leader in (1, 2)
    assert again.leader_epoch == 5


def test_a_new_target_dropping_every_in_sync_replica_is_refused() -> None:
    moving = dataclasses.replace(start(_state([1]), [3]), isr=[3], leader=3, leader_epoch=4)
    with pytest.raises(ReassignmentRefused) as info:
        start(moving, [1, 5])  # 1 fell out of sync; dropping 3 would leave nobody in sync
    assert info.value.error == INVALID_REPLICA_ASSIGNMENT


def test_the_topic_replication_factor_follows_once_every_partition_completed() -> None:
    growing = [dataclasses.replace(start(_state([0, 1]), [0, 1, 2]), isr=[0, 1, 2]), start(_state([1, 2]), [1, 2, 0])]
    topic = TopicDocument(name="t", topic_id="x" * 32, replication_factor=2, partitions=growing)
    first = elect_leaders(topic, ALL, frozenset())
    assert first is not None and first.replication_factor == 2  # partition 1 still catching up
    caught_up = first.with_partition(1, dataclasses.replace(first.partitions[1], isr=[1, 2, 0]))
    done = elect_leaders(caught_up, ALL, frozenset())
    assert done is not None and done.replication_factor == 3
    assert [p.replicas for p in done.partitions] == [[0, 1, 2], [1, 2, 0]]
