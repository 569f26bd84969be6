"""The rebalance planner (sluice.metadata.rebalance): balance reached, racks kept, drains complete, refusals."""

from __future__ import annotations

import random
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


# ---------------------------------------------------------------- with partition sizes (bytes)


def held_bytes(layout: dict[tuple[str, int], list[int]], sizes: dict[tuple[str, int], int]) -> Counter[int]:
    held: Counter[int] = Counter()
    for key, rs in layout.items():
        for b in rs:
            held[b] += sizes[key]
    return held


def spread(held: Counter[int], ids: list[int]) -> int:
    return max(held[b] for b in ids) - min(held[b] for b in ids)


def skewed() -> tuple[list[TopicDocument], dict[tuple[str, int], int]]:
    """Two topics on brokers 0-2: a few big partitions among many small ones (sizes as leaders report)."""
    topics = [placed("big", 6, 2, [0, 1, 2]), placed("small", 12, 2, [0, 1, 2])]
    sizes = {("big", i): (i + 1) * 1_000_000 for i in range(6)}
    sizes.update({("small", i): 1_000 * (i + 1) for i in range(12)})
    return topics, sizes


def test_with_sizes_the_plan_states_bytes_and_evens_them_out_at_the_same_copy_count() -> None:
    topics, sizes = skewed()
    ids = [0, 1, 2, 3, 4]
    by_count = plan(Goal(ADD_BROKERS, (3, 4)), brokers(ids), topics)
    by_bytes = plan(Goal(ADD_BROKERS, (3, 4)), brokers(ids), topics, sizes)
    assert not by_count.by_bytes and by_bytes.by_bytes
    # the count rule holds either way, and the same number of replicas is copied
    for p in (by_count, by_bytes):
        replicas, _ = counts(after(topics, p))
        assert max(replicas[b] for b in ids) - min(replicas[b] for b in ids) <= 1
    assert by_bytes.replicas_to_copy == by_count.replicas_to_copy
    # bytes end more even when weighed (the unweighed plan takes the lowest partitions, the big ones)
    weighed = held_bytes(after(topics, by_bytes), sizes)
    unweighed = held_bytes(after(topics, by_count), sizes)
    assert spread(weighed, ids) < spread(unweighed, ids), (weighed, unweighed)
    # what the plan states is what its layout holds
    before = held_bytes(after(topics, Plan()), sizes)
    for load in by_bytes.loads:
        assert (load.bytes_before, load.bytes_after) == (before[load.broker_id], weighed[load.broker_id])
    copied = sum(
        sizes[k] * len(set(target) - set(next(t for t in topics if t.name == k[0]).partitions[k[1]].replicas))
        for k, target in by_bytes.moves.items()
    )
    assert by_bytes.bytes_to_move == copied == weighed[3] + weighed[4] > 0
    # without sizes nothing is invented
    assert by_count.bytes_to_move is None and all(x.bytes_after is None for x in by_count.loads if x.replicas_after)


def test_a_drain_with_sizes_gives_the_big_replicas_to_the_brokers_with_the_fewest_bytes() -> None:
    one = [topic("t", [[0], [1], [2], [2]])]  # broker 0 holds 5 MB, broker 1 1 MB; broker 2 goes
    sizes = {("t", 0): 5_000_000, ("t", 1): 1_000_000, ("t", 2): 4_000_000, ("t", 3): 0}
    by_count = plan(Goal(REMOVE_BROKERS, (2,)), brokers([0, 1, 2]), one)
    by_bytes = plan(Goal(REMOVE_BROKERS, (2,)), brokers([0, 1, 2]), one, sizes)
    assert by_bytes.moves == {("t", 2): [1], ("t", 3): [0]}  # 5 MB each
    assert by_count.moves == {("t", 2): [0], ("t", 3): [1]}  # by id: 9 MB and 1 MB
    loads = {x.broker_id: x for x in by_bytes.loads}
    assert [(loads[b].bytes_before, loads[b].bytes_after) for b in (0, 1, 2)] == [
        (5_000_000, 5_000_000), (1_000_000, 5_000_000), (4_000_000, 0),
    ]  # fmt: skip
    assert by_bytes.bytes_to_move == 4_000_000 and by_bytes.replicas_to_copy == by_count.replicas_to_copy == 2

    _, sizes = skewed()  # with replication: still the count rule, and the bytes stated are the layout's
    ids = [0, 1, 2, 3]
    grown = [placed("big", 6, 2, ids), placed("small", 12, 2, ids)]
    p = plan(Goal(REMOVE_BROKERS, (3,)), brokers(ids), grown, sizes)
    layout = after(grown, p)
    assert (
        counts(layout)[0][3] == 0
        and p.replicas_to_copy == plan(Goal(REMOVE_BROKERS, (3,)), brokers(ids), grown).replicas_to_copy
    )
    assert {x.broker_id: x.bytes_after for x in p.loads} == {b: held_bytes(layout, sizes)[b] for b in ids}
    assert p.bytes_to_move == held_bytes(after(grown, Plan()), sizes)[3]


def test_unknown_sizes_leave_the_plan_by_counts_and_its_bytes_unknown_where_they_are() -> None:
    topics, sizes = skewed()
    ids = [0, 1, 2, 3]
    by_count = plan(Goal(ADD_BROKERS, (3,)), brokers(ids), topics)
    partial = {k: v for k, v in sizes.items() if k != ("big", 5)}  # its leader did not answer
    p = plan(Goal(ADD_BROKERS, (3,)), brokers(ids), topics, partial)
    assert not p.by_bytes and p.moves == by_count.moves  # counts only: an unknown size is not taken as 0
    holders = set(topics[0].partitions[5].replicas)
    for load in p.loads:
        if load.broker_id in holders:
            assert load.bytes_before is None
        else:
            assert load.bytes_before == held_bytes(after(topics, Plan()), sizes)[load.broker_id]
    copies_big5 = ("big", 5) in p.moves and 3 in p.moves[("big", 5)]
    assert (p.bytes_to_move is None) == copies_big5


def test_skewed_sizes_on_a_large_cluster_end_within_a_few_percent_of_even() -> None:
    rnd = random.Random(27)
    topics = [placed(f"t{i}", 50, 3, list(range(6))) for i in range(40)]
    sizes = {(t.name, i): int(rnd.paretovariate(1.5) * 1_000_000) for t in topics for i in range(50)}
    ids = list(range(9))
    weighed = held_bytes(after(topics, plan(Goal(ADD_BROKERS, (6, 7, 8)), brokers(ids), topics, sizes)), sizes)
    unweighed = held_bytes(after(topics, plan(Goal(ADD_BROKERS, (6, 7, 8)), brokers(ids), topics)), sizes)
    assert spread(weighed, ids) < 0.05 * max(weighed.values()), weighed
    assert spread(weighed, ids) * 5 < spread(unweighed, ids)
