"""Rebalance planning: which partitions move where so brokers carry even shares, as pure functions.

The operator's SluiceRebalance resource (:mod:`sluice.operator.handlers.rebalance`) asks for one
of three goals, Strimzi's KafkaRebalance modes:

* ``full``: even out replicas and preferred leaders across every registered broker;
* ``add-brokers``: give the named (new) brokers their share; only they receive replicas and
  leaderships, so nothing moves between the brokers that were already balanced;
* ``remove-brokers``: drain the named brokers; every replica they hold moves to the others
  and nothing else moves. Afterwards they hold nothing and may be scaled away.

:func:`plan` reads the topic and broker documents (and, when given, partition sizes) and
returns a :class:`Plan`: the target replica list of each partition that changes, and the
replica, leader and byte counts per broker before and after. It never writes; the handler
executes a plan by starting reassignments (:func:`sluice.metadata.reassignment.start`) a bounded
batch at a time.

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

**Bytes.** The metadata holds no partition sizes; the brokers report them (DescribeLogDirs, on
the Kafka listener and over gRPC), and the caller passes them in as ``sizes``: bytes per
partition, the size its leader reports (what a new replica copies). The planner stays pure and
never invents a size: a partition missing from ``sizes`` is of unknown size. With sizes,

* the plan states bytes: per broker the bytes of the replicas it holds before and after (None for
  a broker holding a partition of unknown size), and ``bytes_to_move``, the sum of the sizes of
  the replicas copied (None when a copied partition's size is unknown);
* when every partition in scope has a size, the greedy steps are weighed by bytes too. The count
  rule stays what ends the planning (replica counts within one of each other, so the number of
  copies, the cost, is the same as without sizes), but each step is chosen to even out bytes:
  among brokers tied on count, the one with the most bytes gives and the one with the fewest
  takes, and of the replicas that would not make a topic more lopsided between the two brokers,
  the one whose size is closest to what evens out moves: the average of what the taker lacks of
  the mean bytes per broker, per replica it still has to take, and what the giver holds above it,
  per replica it still has to give (a small one when the giver is light). On 2,000 partitions of
  skewed sizes grown from 6 to 9 brokers this ends within about 1% of the mean where the count
  planner's choice left 15-30%. A drain places the largest partitions first, each on the
  broker with the fewest replicas, then the fewest bytes, and then swaps the destinations of two
  drained replicas (the most uneven pair of brokers of one rack that has such a swap first)
  while that evens bytes: free, as both are copies anyway (the pairs looked at are bounded, so a
  drain of many thousands of replicas plans in about a second and evens less). Nothing swaps replicas that would
  otherwise stay put to even bytes further: each such swap copies two more replicas, the data a
  rebalance should keep small, so bytes end closer, not necessarily even (a drain's counts are
  fixed by the count rule, which leaves it less room than a grow).

With some sizes unknown the plan is by counts only, exactly as without sizes (treating an
unknown size as 0 would be guessing, and would steer the big unknown partitions anywhere), and
states the bytes it knows.

Preferred leaders are balanced by count (moving a leadership copies nothing).

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
    bytes_before: int | None = None  # of the replicas held; None: a partition's size is unknown
    bytes_after: int | None = None


@dataclass(frozen=True)
class Plan:
    """The partitions that change (target replicas, preferred leader first) and the loads it leads to."""

    moves: dict[Key, list[int]] = field(default_factory=dict)
    loads: list[BrokerLoad] = field(default_factory=list)
    replicas_to_copy: int = 0  # replicas a broker must fetch from scratch (the data that moves)
    leader_changes: int = 0  # partitions whose preferred leader changes
    bytes_to_move: int | None = None  # sizes of the replicas to copy; None: some size unknown
    by_bytes: bool = False  # every partition's size was known: the moves were weighed by bytes

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


def _bytes(layout: Mapping[Key, list[int]], brokers: Iterable[int], sizes: Mapping[Key, int]) -> dict[int, int | None]:
    """Bytes held per broker (a replica weighs its partition's size); None where a size is unknown."""
    held: dict[int, int | None] = dict.fromkeys(brokers, 0)
    for key, rs in layout.items():
        size = sizes.get(key)
        for b in rs:
            known = held.get(b, 0)
            held[b] = None if known is None or size is None else known + size
    return held


def plan(
    goal: Goal,
    brokers: Sequence[BrokerDocument],
    topics: Iterable[TopicDocument],
    sizes: Mapping[Key, int] | None = None,
) -> Plan:
    """The plan reaching ``goal`` over the registered ``brokers`` (see the module docstring).

    Partitions being reassigned count where they are going (their target replicas). Only the
    topics of ``goal.topics`` move when it is given; the counts are over those topics too.
    ``sizes``: bytes per (topic, partition) as its leader reports them; a partition left out is
    of unknown size (see "Bytes" in the module docstring). Bytes are over the topics in scope.
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
    known = {k: max(int(sizes[k]), 0) for k in before if sizes is not None and k in sizes}
    weigh = known if before and len(known) == len(before) else None  # every size known: weigh by bytes

    if goal.mode == REMOVE_BROKERS:
        _drain(layout, named, eligible, rack_of, weigh)
    else:
        _spread_replicas(layout, eligible, takers, rack_of, racks, weigh)
    _spread_leaders(layout, eligible, takers)

    replicas_before, leaders_before = _loads(before, every)
    replicas_after, leaders_after = _loads(layout, every)
    bytes_before, bytes_after = _bytes(before, every, known), _bytes(layout, every, known)
    moves = {k: v for k, v in layout.items() if v != before[k]}
    copies = {k: len(set(v) - set(before[k])) for k, v in moves.items()}
    unknown = any(n and k not in known for k, n in copies.items())
    return Plan(
        moves=dict(sorted(moves.items())),
        loads=[
            BrokerLoad(
                b,
                replicas_before[b],
                replicas_after[b],
                leaders_before[b],
                leaders_after[b],
                bytes_before[b],
                bytes_after[b],
            )
            for b in every
        ],
        replicas_to_copy=sum(copies.values()),
        leader_changes=sum(1 for k, v in moves.items() if v[0] != before[k][0]),
        bytes_to_move=None if unknown else sum(n * known.get(k, 0) for k, n in copies.items()),
        by_bytes=weigh is not None,
    )


def _drain(
    layout: dict[Key, list[int]],
    removed: set[int],
    eligible: list[int],
    rack_of: Mapping[int, str],
    sizes: Mapping[Key, int] | None = None,
) -> None:
    """Replace every replica on a removed broker by the least loaded eligible broker, in its place.

    Racks: the replacement prefers the removed broker's own rack, then a rack the partition does
    not use yet, so the partition keeps its rack spread. With ``sizes`` (all known) the largest
    partitions are placed first, and replica counts tie-break on bytes.
    """
    count, _ = _loads(layout, eligible)
    held = _bytes(layout, eligible, sizes or {})
    order = sorted(layout, key=lambda k: (-sizes[k], k)) if sizes is not None else sorted(layout)
    placed: list[tuple[Key, int]] = []  # (partition, broker) of each replacement
    for key in order:
        replicas = layout[key]
        for pos, b in enumerate(list(replicas)):
            if b not in removed:
                continue
            others = [r for r in replicas if r != b]
            used = {rack_of.get(r, "") for r in others}
            candidates = [c for c in eligible if c not in replicas]

            def rank(c: int, gone: int = b, used: set[str] = used) -> tuple[int, int, int, int]:
                rack = rack_of.get(c, "")
                same = rack == rack_of.get(gone, "")
                return (0 if same or rack not in used else 1, count[c], (held.get(c) or 0) if sizes else 0, c)

            choice = min(candidates, key=rank)  # _check made sure there is one
            replicas[pos] = choice
            count[choice] += 1
            placed.append((key, choice))
            if sizes is not None:
                held[choice] = (held.get(choice) or 0) + sizes[key]
    if sizes is not None:
        _even_placed(layout, placed, {b: held.get(b) or 0 for b in eligible}, rack_of, sizes)


def _even_placed(
    layout: dict[Key, list[int]],
    placed: list[tuple[Key, int]],
    held: dict[int, int],
    rack_of: Mapping[int, str],
    sizes: Mapping[Key, int],
    budget: int = 5_000_000,
) -> None:
    """Swap the destinations of two drained replicas while that evens out bytes: free, since both
    are new copies anyway; the counts stay, and racks too (only brokers of one rack swap). The
    pairs of replicas looked at are bounded by ``budget`` (a huge drain stops evening early)."""
    where = dict(enumerate(placed))
    on: dict[int, set[int]] = {}  # broker -> indices of the drained replicas placed there
    for i, (_, b) in where.items():
        on.setdefault(b, set()).add(i)
    spent = 0

    def best_swap(heavy: int, light: int) -> tuple[int, int, int] | None:
        nonlocal spent
        gap = held[heavy] - held[light]
        givers = [(i, where[i][0]) for i in sorted(on.get(heavy, ())) if light not in layout[where[i][0]]]
        takers = [(j, where[j][0]) for j in sorted(on.get(light, ())) if heavy not in layout[where[j][0]]]
        spent += len(givers) * len(takers) + len(givers) + len(takers)
        best: tuple[int, int, int] | None = None
        for i, a in givers:
            for j, c in takers:
                d = sizes[a] - sizes[c]
                if d > 0 and abs(gap - 2 * d) < gap and (best is None or abs(gap - 2 * d) < best[0]):
                    best = (abs(gap - 2 * d), i, j)
        return best

    for _ in range(len(placed)):
        pairs = sorted(
            ((x, y) for x in held for y in held if held[x] > held[y] and rack_of.get(x, "") == rack_of.get(y, "")),
            key=lambda xy: (held[xy[1]] - held[xy[0]], xy),
        )  # the most uneven pair first
        found = None
        for x, y in pairs:
            if spent > budget:
                return
            swap = best_swap(x, y)
            if swap is not None:
                found = (x, y, swap)
                break
        if found is None:
            return
        heavy, light, (_, i, j) = found
        (a, _), (c, _) = where[i], where[j]
        layout[a] = [light if b == heavy else b for b in layout[a]]
        layout[c] = [heavy if b == light else b for b in layout[c]]
        where[i], where[j] = (a, light), (c, heavy)
        on[heavy].discard(i)
        on[light].discard(j)
        on.setdefault(light, set()).add(i)
        on.setdefault(heavy, set()).add(j)
        d = sizes[a] - sizes[c]
        held[heavy] -= d
        held[light] += d


def _spread_replicas(
    layout: dict[Key, list[int]],
    eligible: list[int],
    takers: list[int],
    rack_of: Mapping[int, str],
    racks: int,
    sizes: Mapping[Key, int] | None = None,
) -> None:
    """Move replicas one at a time from the most to the least loaded broker until within one.

    The replica moved is of the topic most lopsided between the two brokers, a follower's rather
    than the preferred leader's when the topic has one, the lowest partition first. Partitions
    are indexed by broker and topic, so one move looks at the two brokers' topics, not at every
    partition (10,000 partitions plan in seconds). With ``sizes`` (every one known), brokers tied
    on count give from the most bytes and take to the fewest, and the replica moved is the one
    that best evens out the two brokers' bytes among those not making a topic more lopsided.
    """
    count, _ = _loads(layout, eligible)
    weight: dict[int, int] = {b: n or 0 for b, n in _bytes(layout, eligible, sizes or {}).items()}
    mean_bytes = sum(weight[b] for b in eligible) / len(eligible)
    count_target = sum(count[b] for b in eligible) / len(eligible)
    holding: dict[int, dict[str, set[Key]]] = {}  # broker -> topic -> its partitions with a replica there
    for key, rs in layout.items():
        for b in rs:
            holding.setdefault(b, {}).setdefault(key[0], set()).add(key)

    def held(b: int, topic: str) -> int:
        return len(holding.get(b, {}).get(topic, ()))

    def racks_kept(k: Key, src: int, dst: int) -> bool:
        # never fewer racks than the partition had, nor than placement would give it
        return _distinct_racks([dst if b == src else b for b in layout[k]], rack_of) >= min(
            _distinct_racks(layout[k], rack_of), len(layout[k]), racks
        )

    def candidate(src: int, dst: int) -> Key | None:
        if sizes is not None:
            return weighed_candidate(src, dst)
        topics = sorted(holding.get(src, {}), key=lambda t: (held(dst, t) - held(src, t), t))
        for topic in topics:
            keys = sorted(holding[src][topic] - holding.get(dst, {}).get(topic, set()))
            valid = [k for k in keys if racks_kept(k, src, dst)]
            if valid:  # a follower's replica first: moving the leader's also moves its leadership
                return next((k for k in valid if layout[k][0] != src), valid[0])
        return None

    def weighed_candidate(src: int, dst: int) -> Key | None:
        assert sizes is not None
        # The size that best evens out: what dst lacks of the mean bytes per broker, spread over the
        # replicas it still has to take, and what src holds above it, over those it has to give.
        want_dst = (mean_bytes - weight[dst]) / max(count_target - count[dst], 1.0)
        want_src = (weight[src] - mean_bytes) / max(count[src] - count_target, 1.0)
        want = (want_dst + want_src) / 2
        best: tuple[tuple[int, float, int, int, Key], Key] | None = None
        for topic, held_keys in holding.get(src, {}).items():
            lopsided = held(src, topic) - held(dst, topic)  # >= 1: the move does not worsen the topic's spread
            for k in held_keys - holding.get(dst, {}).get(topic, set()):
                # the topic's spread first, then bytes evened out, then a follower's replica, ...
                score = (0 if lopsided >= 1 else 1, abs(want - sizes[k]), int(layout[k][0] == src), -lopsided, k)
                if (best is None or score < best[0]) and racks_kept(k, src, dst):
                    best = (score, k)
        return None if best is None else best[1]

    def size_of(b: int) -> int:
        return weight[b] if sizes is not None else 0

    givers = sorted(count)  # in add-brokers mode every broker may give, only the named ones take
    for _ in range(sum(len(rs) for rs in layout.values()) + 1):  # each move lowers the spread: bounded
        dst = min(takers, key=lambda b: (count[b], size_of(b), b))
        moved = False
        for src in sorted(givers, key=lambda b: (-count[b], -size_of(b), b)):
            if src == dst or count[src] - count[dst] <= 1:
                continue
            chosen = candidate(src, dst)
            if chosen is None:
                continue
            layout[chosen] = [dst if b == src else b for b in layout[chosen]]
            count[src] -= 1
            count[dst] += 1
            if sizes is not None:
                weight[src] -= sizes[chosen]
                weight[dst] = weight.get(dst, 0) + sizes[chosen]
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
