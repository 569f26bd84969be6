"""The controller's election rules (sluice.operator.controller.decisions), as pure functions."""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest

from sluice.metadata.documents import PartitionState, TopicDocument
from sluice.operator.controller.decisions import (
    add_partitions,
    describe_changes,
    elect_leaders,
    new_topic,
    reconcile_partition,
    reconcile_topic,
    restore_preferred_leaders,
)


def part(replicas: list[int], leader: int, epoch: int, isr: list[int]) -> PartitionState:
    return PartitionState(replicas=replicas, leader=leader, leader_epoch=epoch, isr=isr)


def topic(*partitions: PartitionState, config: dict[str, str] | None = None) -> TopicDocument:
    return TopicDocument(
        name="orders",
        topic_id="t1",
        internal=False,
        config=config or {},
        replication_factor=len(partitions[0].replicas),
        partitions=list(partitions),
    )


def only(doc: TopicDocument | None) -> PartitionState:
    assert doc is not None
    return doc.partitions[0]


# -- election ---------------------------------------------------------------------------------------


def test_nothing_changes_when_everyone_is_alive() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0, 1, 2]), part([1, 2, 0], 1, 0, [1, 2, 0]))
    assert reconcile_topic(t, {0, 1, 2}) is None


def test_dead_leader_replaced_by_first_live_isr_member_in_replica_order() -> None:
    t = topic(part([0, 1, 2], 0, 3, [2, 0, 1]))
    p = only(elect_leaders(t, {1, 2}))
    assert p == part([0, 1, 2], 1, 4, [2, 1])  # replica order decides, not ISR order; 0 leaves the ISR


def test_no_election_from_outside_the_isr() -> None:
    t = topic(part([0, 1, 2], 0, 5, [0, 2]))
    p = only(elect_leaders(t, {1, 2}))
    assert p.leader == 2  # 1 is live and earlier in replica order but out of sync
    p = only(elect_leaders(t, {1}))
    assert p.leader == -1 and p.leader_epoch == 6
    assert p.isr == [0, 2]  # never emptied: the last in-sync members stay


def test_last_isr_member_stays_when_it_dies() -> None:
    t = topic(part([0, 1], 0, 2, [0]))
    p = only(elect_leaders(t, {1}))
    assert p == part([0, 1], -1, 3, [0])
    # nothing more happens while it stays dead: no epoch churn
    assert elect_leaders(topic(p), {1}) is None
    # it comes back: the first of the last ISR to return is elected
    back = only(elect_leaders(topic(p), {0, 1}))
    assert back == part([0, 1], 0, 4, [0])


def test_leaderless_partition_elected_as_soon_as_an_isr_member_is_live() -> None:
    t = topic(part([0, 1, 2], -1, 7, [1, 2]))
    assert elect_leaders(t, {0}) is None  # 0 is live but not in sync
    p = only(elect_leaders(t, {0, 2}))
    assert p == part([0, 1, 2], 2, 8, [2])


def test_dead_broker_fenced_out_of_isr_of_live_leaders_without_epoch_change() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0, 1, 2]), part([1, 2, 0], 1, 2, [1, 2, 0]))
    out = elect_leaders(t, {0, 1})
    assert out is not None
    assert out.partitions == [part([0, 1, 2], 0, 3, [0, 1]), part([1, 2, 0], 1, 2, [1, 0])]
    assert out.name == "orders" and out.topic_id == "t1"


def test_unknown_brokers_are_neither_elected_nor_replaced() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0, 1, 2]))
    # 0 is unknown (neither live nor dead): it keeps leading; dead 2 is fenced
    assert only(reconcile_topic(t, {1}, dead={2})) == part([0, 1, 2], 0, 3, [0, 1])
    # a leaderless partition does not get an unknown broker as leader
    t = topic(part([0, 1, 2], -1, 3, [0]))
    assert reconcile_topic(t, {1, 2}, dead=set()) is None


def test_unclean_election_takes_any_live_replica_and_resets_isr() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0]), config={"unclean.leader.election.enable": "true"})
    p = only(elect_leaders(t, {1, 2}))
    assert p == part([0, 1, 2], 1, 4, [1])
    # clean candidates still win over unclean ones
    t = topic(part([0, 1, 2], 0, 3, [0, 2]), config={"unclean.leader.election.enable": "true"})
    assert only(elect_leaders(t, {1, 2})).leader == 2


def test_unclean_off_by_default_and_broker_default_applies() -> None:
    t = topic(part([0, 1], 0, 3, [0]))
    assert only(elect_leaders(t, {1})).leader == -1
    assert only(elect_leaders(t, {1}, default_unclean=True)).leader == 1
    t = topic(part([0, 1], 0, 3, [0]), config={"unclean.leader.election.enable": "false"})
    assert only(elect_leaders(t, {1}, default_unclean=True)).leader == -1


def test_other_fields_are_kept() -> None:
    p = PartitionState.from_json({**part([0, 1], 0, 1, [0, 1]).to_json(), "future_field": 9})
    assert reconcile_partition(p, {1}).to_json()["future_field"] == 9


def test_every_change_of_a_partition_counts_one_partition_epoch() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0, 1, 2]), part([1, 2, 0], 1, 0, [1, 2, 0]))
    once = elect_leaders(t, {1, 2})  # 0 dies: partition 0 elects, partition 1 fences it out
    assert once is not None
    assert [p.partition_epoch for p in once.partitions] == [1, 1]
    assert once.to_json()["partitions"][0]["partition_epoch"] == 1
    twice = elect_leaders(once, {2})
    assert twice is not None and [p.partition_epoch for p in twice.partitions] == [2, 2]
    # a partition that does not change keeps its epoch; a state written at the same epoch is one change
    t3 = topic(part([0, 1], 0, 3, [0, 1]), part([1, 0], 1, 0, [1]))
    moved = elect_leaders(t3, {1})
    assert moved is not None and [p.partition_epoch for p in moved.partitions] == [1, 0]
    assert t.to_json()["partitions"][0].get("partition_epoch") is None  # 0 is not written


# -- preferred leaders and returning brokers --------------------------------------------------------


def test_returning_broker_does_not_lead_before_it_is_in_sync() -> None:
    t = topic(part([0, 1, 2], 0, 3, [0, 1, 2]))
    after_death = elect_leaders(t, {1, 2})
    assert after_death is not None
    p = only(after_death)
    assert (p.leader, p.leader_epoch, p.isr) == (1, 4, [1, 2])
    # broker 0 is back but the leader has not re-admitted it: nothing moves
    assert reconcile_topic(after_death, {0, 1, 2}) is None
    # the leader adds it to the ISR once caught up; now it gets its leadership back
    caught_up = topic(part([0, 1, 2], 1, 4, [1, 2, 0]))
    p = only(reconcile_topic(caught_up, {0, 1, 2}))
    assert p == part([0, 1, 2], 0, 5, [1, 2, 0])


def test_preferred_restoration_only_when_preferred_is_live() -> None:
    t = topic(part([0, 1, 2], 1, 4, [1, 2, 0]))
    assert restore_preferred_leaders(t, {1, 2}) is None
    assert only(restore_preferred_leaders(t, {0, 1, 2})).leader == 0


def test_restore_preferred_alone_does_not_fence_or_elect() -> None:
    t = topic(part([0, 1, 2], 1, 4, [1, 2]), part([1, 2, 0], -1, 2, [1]))
    assert restore_preferred_leaders(t, {1}) is None


def test_preferred_can_be_switched_off() -> None:
    t = topic(part([0, 1, 2], 1, 4, [1, 2, 0]))
    assert reconcile_topic(t, {0, 1, 2}, preferred=False) is None


# -- epochs -----------------------------------------------------------------------------------------


def test_epochs_strictly_increase_on_every_leadership_change_under_random_failures() -> None:
    rng = random.Random(7)
    brokers = [0, 1, 2, 3]
    t = new_topic("orders", "t1", 8, 3, {}, [(b, "") for b in brokers])
    for _ in range(500):
        live = {b for b in brokers if rng.random() < 0.7}
        # the leaders' side: a live follower may be re-admitted to the ISR, a follower may lag out
        for i, p in enumerate(t.partitions):
            if p.leader in live:
                for r in p.replicas:
                    if r in live and r not in p.isr and rng.random() < 0.5:
                        p = dataclasses.replace(p, isr=[*p.isr, r])
                    elif r != p.leader and r in p.isr and rng.random() < 0.1:
                        p = dataclasses.replace(p, isr=[b for b in p.isr if b != r])
                t = t.with_partition(i, p)
        new = reconcile_topic(t, live)
        if new is None:
            continue
        for old_p, new_p in zip(t.partitions, new.partitions, strict=True):
            if new_p.leader != old_p.leader:
                assert new_p.leader_epoch == old_p.leader_epoch + 1
                assert new_p.leader == -1 or new_p.leader in old_p.isr  # clean only
                assert new_p.leader == -1 or new_p.leader in live
            else:
                assert new_p.leader_epoch == old_p.leader_epoch
            assert new_p.isr, "the ISR is never emptied"
            assert set(new_p.isr) <= set(old_p.isr)  # the controller never adds to the ISR
            if new_p.leader != -1:
                assert new_p.leader in new_p.isr
        assert reconcile_topic(new, live) is None, "decisions are stable: a second pass changes nothing"
        t = new


def test_leadership_change_to_and_from_no_leader_bumps_epoch_each_time() -> None:
    epochs = []
    t = topic(part([0], 0, 0, [0]))
    for live in ({0}, set(), set(), {0}, set(), {0}):
        new = reconcile_topic(t, live)
        t = new if new is not None else t
        epochs.append(only(t).leader_epoch)
    assert epochs == [0, 1, 1, 2, 3, 4]


# -- log lines --------------------------------------------------------------------------------------


def test_describe_changes_says_who_was_elected_and_why() -> None:
    t = topic(part([1, 2, 0], 1, 2, [1, 2, 0]), part([0, 1, 2], 0, 0, [0, 1, 2]))
    new = reconcile_topic(t, {0, 2})
    assert new is not None
    assert describe_changes(t, new, {0, 2}) == [
        "elected broker 2 leader of orders-0 at epoch 3 (broker 1 dead), ISR [2, 0]",
        "removed dead broker(s) [1] from the ISR of orders-1, now [0, 2]",
    ]
    t2 = topic(part([0, 1], 1, 3, [1, 0]))
    new2 = reconcile_topic(t2, {0, 1})
    assert new2 is not None
    assert describe_changes(t2, new2, {0, 1}) == [
        "elected broker 0 leader of orders-0 at epoch 4 (preferred replica back in sync; broker 1 led), ISR [1, 0]"
    ]
    t4 = topic(part([1, 0], 1, 0, [1, 0]), part([0, 1, 2], 0, 0, [0, 1, 2]), part([2, 0], 2, 0, [2, 0]))
    new4 = reconcile_topic(t4, {1, 2})
    assert new4 is not None
    assert describe_changes(t4, new4, {1, 2}) == [
        "elected broker 1 leader of orders-1 at epoch 1 (broker 0 dead), ISR [1, 2]",
        "removed dead broker(s) [0] from the ISRs of 2 partitions of orders: [0, 2]",
    ]
    t3 = topic(part([0, 1], 0, 3, [0]))
    new3 = reconcile_topic(t3, {1})
    assert new3 is not None
    assert describe_changes(t3, new3, {1}) == [
        "orders-0 has no leader at epoch 4 (broker 0 dead; no live in-sync replica, ISR [0])"
    ]


# -- topic creation and partition addition ------------------------------------------------------------


def test_new_topic_and_added_partitions() -> None:
    brokers: list[tuple[int, str | None]] = [(0, ""), (1, ""), (2, "")]
    t = new_topic("orders", "id1", 2, 3, {"retention.ms": "1000"}, brokers)
    assert t.partitions == [part([0, 1, 2], 0, 0, [0, 1, 2]), part([1, 2, 0], 1, 0, [1, 2, 0])]
    assert t.replication_factor == 3 and t.config == {"retention.ms": "1000"}
    grown = add_partitions(t, 4, brokers)
    assert grown is not None
    assert [p.replicas for p in grown.partitions] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 2, 1]]
    assert add_partitions(grown, 4, brokers) is None
    with pytest.raises(ValueError, match="cannot shrink"):
        add_partitions(grown, 3, brokers)
    with pytest.raises(ValueError, match="replication factor 3"):
        new_topic("x", "id2", 1, 3, {}, brokers[:2])


def test_every_combination_of_three_brokers_gives_a_valid_state() -> None:
    base = new_topic("t", "id", 3, 3, {}, [(0, ""), (1, ""), (2, "")])
    for n in range(4):
        for live_tuple in itertools.combinations(range(3), n):
            live = set(live_tuple)
            new = reconcile_topic(base, live) or base
            for p in new.partitions:
                assert p.leader in live or (p.leader == -1 and not live)


def _random_partition(rng: random.Random) -> PartitionState:
    replicas = rng.sample(range(6), rng.randint(0, 4))
    isr = [b for b in replicas if rng.random() < 0.7] + ([7] if rng.random() < 0.05 else [])
    leader = rng.choice([*replicas, -1, 7]) if replicas else -1
    adding = [b for b in replicas[1:] if rng.random() < 0.1]
    removing = [b for b in replicas if b not in adding and rng.random() < 0.05]
    return PartitionState(
        replicas, leader, rng.randint(0, 5), isr, adding, removing, list(replicas) if adding or removing else []
    )


def test_the_rules_skip_only_partitions_they_would_leave_as_they_are() -> None:
    """reconcile_topic and restore_preferred_leaders skip partitions the rules cannot change (a set test,
    for speed at 1,000 partitions a topic): the result is what each partition through the rules gives."""
    from sluice.metadata.reassignment import complete

    rng = random.Random(28)
    for _ in range(2000):
        doc = topic(*(_random_partition(rng) for _ in range(rng.randint(1, 8))))
        live = frozenset(b for b in range(8) if rng.random() < 0.6)
        dead = None if rng.random() < 0.2 else frozenset(b for b in range(8) if b not in live and rng.random() < 0.7)
        preferred, unclean = rng.random() < 0.5, rng.random() < 0.2
        slow = [
            complete(reconcile_partition(p, live, dead, unclean=unclean, preferred=preferred), live)
            for p in doc.partitions
        ]
        expected = None if slow == doc.partitions else doc.with_partitions(slow).partitions
        got = reconcile_topic(doc, live, dead, preferred=preferred, default_unclean=unclean)
        assert (got.partitions if got is not None else None) == expected, (doc, live, dead, preferred, unclean)
        slow = [reconcile_partition(p, live, frozenset(), elect=False, fence=False) for p in doc.partitions]
        expected = None if slow == doc.partitions else doc.with_partitions(slow).partitions
        got = restore_preferred_leaders(doc, live)
        assert (got.partitions if got is not None else None) == expected, (doc, live)
        # a partition the rules leave alone is the same object (the log and the record skip it)
        if got is not None:
            assert all(a is b for a, b in zip(doc.partitions, got.partitions, strict=True) if a == b)
