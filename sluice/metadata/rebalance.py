"""Rebalance planning: which partitions move where so brokers carry even shares, as pure functions.

The operator's SluiceRebalance resource (:mod:`sluice.operator.handlers.rebalance`) asks for one
of three goals, Strimzi's KafkaRebalance modes:

* ``full``: even out replicas and preferred leaders across every registered broker;
* ``add-brokers``: give the named (new) brokers their share; only they receive replicas and
  leaderships, so nothing moves between the brokers that were already balanced;
* ``remove-brokers``: drain the named brokers; every replica they hold moves to the others
  and nothing else moves. Afterwards they hold nothing and may be scaled away.

:func:`plan` reads the topic and broker documents and returns a :class:`Plan`: the target
replica list of each partition that changes, and the replica and leader counts per broker
before and after. It never writes; the handler executes a plan by starting reassignments
(:func:`sluice.metadata.reassignment.start`) a bounded batch at a time.

Why a greedy move-by-move planner and not a fresh layout: re-placing every partition with
:func:`sluice.metadata.placement.place_replicas` (what ``sluice partitions reassign --generate``
proposes) yields a perfectly balanced layout but moves most replicas of a grown cluster, each
a full copy of a partition. Here one replica moves at a time, from the most loaded broker
allowed to give to the least loaded allowed to take, until the counts differ by at most one,
so the data moved is close to the least that reaches balance. Each move keeps the partition's
replicas on as many racks as before (with racks, placement's rule holds: a partition's
replicas on ``min(replication factor, racks)`` distinct racks), and among the candidate
partitions the one whose topic is most lopsided between the two brokers is chosen, so topics
spread too, not only the totals. Leaders are balanced after the replicas: reordering a
partition's replicas (no data moves) makes another in-sync replica its preferred leader, and
the controller's preferred-leader rule moves leadership there.

Counts are of replicas, not bytes: the planner works from the metadata alone, which holds no
partition sizes (brokers report them in DescribeLogDirs, but the operator does not ask them),
so a plan states the number of replicas to copy and leaves bytes unknown rather than guessing.

Invalid goals raise :class:`PlanRefused` (unknown broker ids, no brokers named for add/remove
or some named for full, every broker removed, a topic whose replication factor the remaining
brokers cannot hold, a topic filter naming no topic), before anything moves.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sluice.metadata.documents import BrokerDocument, TopicDocument
from sluice.metadata.reassignment import target_replicas

__all__ = ["ADD_BROKERS", "FULL", "MODES", "REMOVE_BROKERS", "BrokerLoad", "Goal", "Plan", "PlanRefused", "plan"]

FULL = "full"
ADD_BROKERS = "add-brokers"
REMOVE_BROKERS = "remove-brokers"
MODES = (FULL, ADD_BROKERS, REMOVE_BROKERS)

Key = tuple[str, int]


class PlanRefused(ValueError):
    """The goal cannot be planned (the message says why); nothing is to move."""


@dataclass(frozen=True)
class Goal:
    """What a rebalance asks for: a mode, the brokers it names, and optionally the topics it may move."""

    mode: str = FULL
    brokers: tuple[int, ...] = ()
    topics: tuple[str, ...] = ()  # empty: every topic, internal ones included


@dataclass(frozen=True)
class BrokerLoad:
    """One broker's replica and (preferred) leader counts before and after the plan."""

    broker_id: int
    replicas_before: int
    replicas_after: int
    leaders_before: int
    leaders_after: int


@dataclass(frozen=True)
class Plan:
    """The partitions that change (target replicas, preferred leader first) and the loads it leads to."""

    moves: dict[Key, list[int]] = field(default_factory=dict)
    loads: list[BrokerLoad] = field(default_factory=list)
    replicas_to_copy: int = 0  # replicas a broker must fetch from scratch (the data that moves)
    leader_changes: int = 0  # partitions whose preferred leader changes

    @property
    def partitions_to_move(self) -> int:
        return len(self.moves)


def _check(goal: Goal, registered: Sequence[int], topics: Mapping[str, TopicDocument]) -> list[int]:
    """The brokers replicas may end on; raises PlanRefused for a goal that cannot be planned."""
    if goal.mode not in MODES:
        raise PlanRefused(f"unknown mode {goal.mode!r}: one of {', '.join(MODES)}")
    named = list(goal.brokers)
    if goal.mode == FULL and named:
        raise PlanRefused(f"mode full takes no brokers (got {named}): use add-brokers or remove-brokers")
    if goal.mode != FULL and not named:
        raise PlanRefused(f"mode {goal.mode} needs the ids of the brokers to add or remove")
    if len(set(named)) != len(named):
        raise PlanRefused(f"brokers {named} name a broker twice")
    unknown = sorted(set(named) - set(registered))
    if unknown:
        raise PlanRefused(f"unknown broker id(s) {unknown}: the registered brokers are {sorted(registered)}")
    missing = sorted(set(goal.topics) - set(topics))
    if missing:
        raise PlanRefused(f"unknown topic(s) {missing}")
    eligible = [b for b in registered if not (goal.mode == REMOVE_BROKERS and b in named)]
    if not eligible:
        raise PlanRefused(f"removing {named} would leave no broker")
    for topic in topics.values():
        if goal.topics and topic.name not in goal.topics:
            continue
        rf = max((len(target_replicas(p)) for p in topic.partitions), default=0)
        if rf > len(eligible):
            raise PlanRefused(
                f"topic {topic.name} has replication factor {rf}; the {len(eligible)} remaining broker(s)"
                f" {eligible} cannot hold it"
            )
    return eligible


def _distinct_racks(replicas: Iterable[int], rack_of: Mapping[int, str]) -> int:
    return len({rack_of.get(b, "") for b in replicas})


def _loads(layout: Mapping[Key, list[int]], brokers: Iterable[int]) -> tuple[dict[int, int], dict[int, int]]:
    replicas = dict.fromkeys(brokers, 0)
    leaders = dict.fromkeys(brokers, 0)
    for rs in layout.values():
        for b in rs:
            replicas[b] = replicas.get(b, 0) + 1
        if rs:
            leaders[rs[0]] = leaders.get(rs[0], 0) + 1
    return replicas, leaders


def plan(
    goal: Goal,
    brokers: Sequence[BrokerDocument],
    topics: Iterable[TopicDocument],
) -> Plan:
    """The plan reaching ``goal`` over the registered ``brokers`` (see the module docstring).

    Partitions being reassigned count where they are going (their target replicas). Only the
    topics of ``goal.topics`` move when it is given; the counts are over those topics too.
    """
    every_topic = {t.name: t for t in topics}
    registered = sorted(b.broker_id for b in brokers)
    eligible = _check(goal, registered, every_topic)
    by_name = {n: t for n, t in every_topic.items() if not goal.topics or n in goal.topics}
    rack_of = {b.broker_id: b.rack for b in brokers}
    racks = len({rack_of[b] for b in eligible})
    before: dict[Key, list[int]] = {
        (t.name, i): target_replicas(p) for t in by_name.values() for i, p in enumerate(t.partitions)
    }
    layout = {k: list(v) for k, v in before.items()}
    every = sorted(set(registered) | {b for rs in before.values() for b in rs})
    named = set(goal.brokers)
    takers = sorted(named) if goal.mode == ADD_BROKERS else eligible

    if goal.mode == REMOVE_BROKERS:
        _drain(layout, named, eligible, rack_of)
    else:
        _spread_replicas(layout, eligible, takers, rack_of, racks)
    _spread_leaders(layout, eligible, takers)

    replicas_before, leaders_before = _loads(before, every)
    replicas_after, leaders_after = _loads(layout, every)
    moves = {k: v for k, v in layout.items() if v != before[k]}
    return Plan(
        moves=dict(sorted(moves.items())),
        loads=[
            BrokerLoad(b, replicas_before[b], replicas_after[b], leaders_before[b], leaders_after[b]) for b in every
        ],
        replicas_to_copy=sum(len(set(v) - set(before[k])) for k, v in moves.items()),
        leader_changes=sum(1 for k, v in moves.items() if v[0] != before[k][0]),
    )


def _drain(layout: dict[Key, list[int]], removed: set[int], eligible: list[int], rack_of: Mapping[int, str]) -> None:
    """Replace every replica on a removed broker by the least loaded eligible broker, in its place.

    Racks: the replacement prefers the removed broker's own rack, then a rack the partition does
    not use yet, so the partition keeps its rack spread.
    """
    count, _ = _loads(layout, eligible)
    for key in sorted(layout):
        replicas = layout[key]
        for pos, b in enumerate(list(replicas)):
            if b not in removed:
                continue
            others = [r for r in replicas if r != b]
            used = {rack_of.get(r, "") for r in others}
            candidates = [c for c in eligible if c not in replicas]

            def rank(c: int, gone: int = b, used: set[str] = used) -> tuple[int, int, int]:
                rack = rack_of.get(c, "")
                same = rack == rack_of.get(gone, "")
                return (0 if same or rack not in used else 1, count[c], c)

            choice = min(candidates, key=rank)  # _check made sure there is one
            replicas[pos] = choice
            count[choice] += 1


def _spread_replicas(
    layout: dict[Key, list[int]], eligible: list[int], takers: list[int], rack_of: Mapping[int, str], racks: int
) -> None:
    """Move replicas one at a time from the most to the least loaded broker until within one.

    The replica moved is of the topic most lopsided between the two brokers, a follower's rather
    than the preferred leader's when the topic has one, the lowest partition first. Partitions
    are indexed by broker and topic, so one move looks at the two brokers' topics, not at every
    partition (10,000 partitions plan in seconds).
    """
    count, _ = _loads(layout, eligible)
    holding: dict[int, dict[str, set[Key]]] = {}  # broker -> topic -> its partitions with a replica there
    for key, rs in layout.items():
        for b in rs:
            holding.setdefault(b, {}).setdefault(key[0], set()).add(key)

    def held(b: int, topic: str) -> int:
        return len(holding.get(b, {}).get(topic, ()))

    def candidate(src: int, dst: int) -> Key | None:
        topics = sorted(holding.get(src, {}), key=lambda t: (held(dst, t) - held(src, t), t))
        for topic in topics:
            keys = sorted(holding[src][topic] - holding.get(dst, {}).get(topic, set()))
            valid = [
                k
                for k in keys
                # never fewer racks than the partition had, nor than placement would give it
                if _distinct_racks([dst if b == src else b for b in layout[k]], rack_of)
                >= min(_distinct_racks(layout[k], rack_of), len(layout[k]), racks)
            ]
            if valid:  # a follower's replica first: moving the leader's also moves its leadership
                return next((k for k in valid if layout[k][0] != src), valid[0])
        return None

    givers = sorted(count)  # in add-brokers mode every broker may give, only the named ones take
    for _ in range(sum(len(rs) for rs in layout.values()) + 1):  # each move lowers the spread: bounded
        dst = min(takers, key=lambda b: (count[b], b))
        moved = False
        for src in sorted(givers, key=lambda b: (-count[b], b)):
            if src == dst or count[src] - count[dst] <= 1:
                continue
            chosen = candidate(src, dst)
            if chosen is None:
                continue
            layout[chosen] = [dst if b == src else b for b in layout[chosen]]
            count[src] -= 1
            count[dst] += 1
            holding[src][chosen[0]].discard(chosen)
            holding.setdefault(dst, {}).setdefault(chosen[0], set()).add(chosen)
            moved = True
            break
        if not moved:
            return


def _spread_leaders(layout: dict[Key, list[int]], eligible: list[int], takers: list[int]) -> None:
    """Reorder replicas so preferred leaderships differ by at most one between brokers (``takers`` gain)."""
    _, leaders = _loads(layout, eligible)
    ordered = sorted(layout)
    for _ in range(len(layout) + 1):
        dst = min(takers, key=lambda b: (leaders[b], b))
        moved = False
        for src in sorted(leaders, key=lambda b: (-leaders[b], b)):
            if src == dst or leaders[src] - leaders[dst] <= 1:
                continue
            for key in ordered:
                rs = layout[key]
                if rs[0] == src and dst in rs:
                    layout[key] = [dst] + [b for b in rs if b != dst]
                    leaders[src] -= 1
                    leaders[dst] += 1
                    moved = True
                    break
            if moved:
                break
        if not moved:
            return
