"""The rebalance planner (sluice.metadata.rebalance): balance reached, racks kept, drains complete, refusals."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from sluice.metadata.documents import BrokerDocument, PartitionState, TopicDocument
from sluice.metadata.placement import place_replicas
from sluice.metadata.reassignment import start
from sluice.metadata.rebalance import ADD_BROKERS, FULL, REMOVE_BROKERS, Goal, Plan, PlanRefused, plan


def brokers(ids: list[int], racks: dict[int, str] | None = None) -> list[BrokerDocument]:
    return [BrokerDocument(b, "127.0.0.1", 9000 + b, rack=(racks or {}).get(b, "")) for b in ids]


def topic(name: str, layout: list[list[int]]) -> TopicDocument:
    return TopicDocument(name, f"id-{name}", replication_factor=len(layout[0]),
                         partitions=[PartitionState.initial(rs) for rs in layout])  # fmt: skip


def placed(name: str, partitions: int, rf: int, on: list[int], racks: dict[int, str] | None = None) -> TopicDocument:
    """A topic as CreateTopics would have placed it on the brokers ``on``."""
    return topic(name, place_replicas([(b, (racks or {}).get(b)) for b in on], partitions, rf))


def after(topics: list[TopicDocument], p: Plan) -> dict[tuple[str, int], list[int]]:
    return {(t.name, i): p.moves.get((t.name, i), part.replicas) for t in topics for i, part in enumerate(t.partitions)}


def counts(layout: dict[tuple[str, int], list[int]]) -> tuple[Counter[int], Counter[int]]:
    return Counter(b for rs in layout.values() for b in rs), Counter(rs[0] for rs in layout.values())


def test_add_brokers_gives_new_brokers_their_share_and_moves_only_onto_them() -> None:
    topics = [placed("orders", 12, 3, [0, 1, 2]), placed("audit", 6, 2, [0, 1, 2])]
    p = plan(Goal(ADD_BROKERS, (3, 4)), brokers([0, 1, 2, 3, 4]), topics)
    layout = after(topics, p)
    replicas, leaders = counts(layout)
    assert sum(replicas.values()) == 12 * 3 + 6 * 2  # no replica lost or added
    assert max(replicas.values()) - min(replicas[b] for b in range(5)) <= 1, replicas
    assert max(leaders.values()) - min(leaders[b] for b in range(5)) <= 1, leaders
    for key, target in p.moves.items():
        old = next(t for t in topics if t.name == key[0]).partitions[key[1]].replicas
        assert sorted(target) != sorted(old) or target[0] != old[0]
        assert len(set(target)) == len(target) == len(old)
        # every new replica is on a new broker: nothing shuffles between the old three
        assert set(target) - set(old) <= {3, 4}
    # each move copies one replica at most: far less than re-placing everything
    assert p.replicas_to_copy == replicas[3] + replicas[4] <= 20
    by_id = {load.broker_id: load for load in p.loads}
    assert (by_id[3].replicas_before, by_id[3].replicas_after) == (0, replicas[3])
    assert by_id[0].leaders_before == 6 and by_id[0].leaders_after == leaders[0]


def test_full_evens_out_a_lopsided_cluster_and_topics_spread_too() -> None:
    lopsided = [topic("t", [[0, 1], [0, 1], [1, 0], [0, 1], [1, 0], [0, 2]])]
    p = plan(Goal(FULL), brokers([0, 1, 2, 3]), lopsided)
    replicas, leaders = counts(after(lopsided, p))
    assert sorted(replicas[b] for b in range(4)) == [3, 3, 3, 3]
    assert max(leaders[b] for b in range(4)) - min(leaders[b] for b in range(4)) <= 1


def test_a_balanced_cluster_needs_no_move() -> None:
    topics = [placed("orders", 6, 3, [0, 1, 2])]
    p = plan(Goal(FULL), brokers([0, 1, 2]), topics)
    assert p.moves == {} and p.replicas_to_copy == 0


def test_remove_brokers_empties_them_and_moves_nothing_else() -> None:
    topics = [placed("orders", 10, 2, [0, 1, 2, 3, 4]), placed("audit", 3, 3, [0, 1, 2, 3, 4])]
    p = plan(Goal(REMOVE_BROKERS, (3, 4)), brokers([0, 1, 2, 3, 4]), topics)
    layout = after(topics, p)
    replicas, leaders = counts(layout)
    assert replicas[3] == replicas[4] == leaders[3] == leaders[4] == 0
    assert sum(replicas.values()) == 10 * 2 + 3 * 3
    assert max(replicas[b] for b in range(3)) - min(replicas[b] for b in range(3)) <= 1
    for key, target in p.moves.items():
        old = next(t for t in topics if t.name == key[0]).partitions[key[1]].replicas
        kept = [b for b in old if b not in (3, 4)]
        # the replicas on the remaining brokers stay (only their order may change, for leadership)
        assert set(kept) <= set(target), (key, old, target)


def test_racks_are_respected_when_adding_and_draining() -> None:
    racks = {0: "a", 1: "b", 2: "c", 3: "a", 4: "b", 5: "c"}
    topics = [placed("orders", 12, 3, [0, 1, 2], racks)]
    grown = plan(Goal(ADD_BROKERS, (3, 4, 5)), brokers(list(range(6)), racks), topics)
    layout = after(topics, grown)
    assert all(len({racks[b] for b in rs}) == 3 for rs in layout.values()), layout
    replicas, _ = counts(layout)
    assert all(replicas[b] == 6 for b in range(6)), replicas

    spread = [placed("orders", 12, 2, list(range(6)), racks)]
    drained = plan(Goal(REMOVE_BROKERS, (5,)), brokers(list(range(6)), racks), spread)
    layout = after(spread, drained)
    assert counts(layout)[0][5] == 0
    assert all(len({racks[b] for b in rs}) == 2 for rs in layout.values()), layout


def test_partitions_being_reassigned_count_where_they_are_going() -> None:
    t = topic("t", [[0, 1], [0, 1]])
    moving = t.with_partition(1, start(t.partitions[1], [2, 1]))  # already on its way to broker 2
    p = plan(Goal(REMOVE_BROKERS, (0,)), brokers([0, 1, 2]), [moving])
    assert list(p.moves) == [("t", 0)]
    assert 0 not in p.moves[("t", 0)]


def test_the_topic_filter_moves_only_those_topics() -> None:
    topics = [placed("orders", 6, 2, [0, 1]), placed("audit", 6, 2, [0, 1])]
    p = plan(Goal(ADD_BROKERS, (2,), topics=("orders",)), brokers([0, 1, 2]), topics)
    assert p.moves and {k[0] for k in p.moves} == {"orders"}


@pytest.mark.parametrize(
    ("goal", "ids", "message"),
    [
        (Goal(ADD_BROKERS, (7,)), [0, 1, 2], "unknown broker id(s) [7]"),
        (Goal(REMOVE_BROKERS, ()), [0, 1, 2], "needs the ids"),
        (Goal(FULL, (1,)), [0, 1, 2], "takes no brokers"),
        (Goal("shuffle"), [0, 1, 2], "unknown mode"),
        (Goal(REMOVE_BROKERS, (1, 1)), [0, 1, 2], "twice"),
        (Goal(REMOVE_BROKERS, (0, 1, 2)), [0, 1, 2], "leave no broker"),
        (Goal(REMOVE_BROKERS, (2,)), [0, 1, 2], "replication factor 3"),
        (Goal(FULL, topics=("nope",)), [0, 1, 2], "unknown topic(s) ['nope']"),
    ],
)
def test_invalid_goals_are_refused_with_the_reason(goal: Goal, ids: list[int], message: str) -> None:
    with pytest.raises(PlanRefused, match=re.escape(message)):
        plan(goal, brokers(ids), [placed("orders", 3, 3, [0, 1, 2])])


def test_a_large_cluster_balances_with_about_the_least_data_moved() -> None:
    # 2,000 partitions of 40 topics on 6 brokers, 3 brokers added (the planner indexes partitions
    # by broker and topic: this takes well under a second; pytest-timeout bounds it anyway).
    topics = [placed(f"t{i}", 50, 3, list(range(6))) for i in range(40)]
    p = plan(Goal(ADD_BROKERS, (6, 7, 8)), brokers(list(range(9))), topics)
    replicas, leaders = counts(after(topics, p))
    assert max(replicas.values()) - min(replicas.values()) <= 1
    assert max(leaders.values()) - min(leaders.values()) <= 1
    assert p.replicas_to_copy == replicas[6] + replicas[7] + replicas[8] == 6000 // 9 * 3  # only what they need
    per_topic = Counter((k[0], b) for k, rs in after(topics, p).items() for b in rs)
    assert all(per_topic[(f"t{i}", b)] >= 1 for i in range(40) for b in (6, 7, 8))  # topics spread too
