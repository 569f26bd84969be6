"""Server-side partition assignment: balanced, sticky and deterministic.

The coordinator computes each member's *target* assignment whenever the group
epoch changes (a member joins, leaves or expires, a subscription changes, a
subscribed topic gains partitions). The function here is pure: the same
members, subscriptions, topic sizes and previous target always give the same
answer, so a test (or a new coordinator after failover) can reproduce it.

1. Quotas. Partitions of subscribed topics, sorted by (topic, partition), are
   dealt one at a time to the subscriber of that topic holding the fewest so
   far. With equal subscriptions the counts differ by at most one; the extra
   partitions go to the members that held more before (then by member id), so
   a rebalance moves as little as possible.
2. Stickiness. Every member keeps the partitions it had in the previous target
   (still subscribed, still existing) up to its quota.
3. The rest go, in sorted order, to the subscriber with the most unused quota
   (ties: member id); only with uneven subscriptions can a partition find no
   subscriber with quota left, and then it goes to the least loaded one.

Moving few partitions matters because every move is a hand-over: the old
owner must revoke the partition (and commit its offsets) before the new one
may start.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from sluice.broker.topic_partition import TopicPartition


def assign(
    subscriptions: Mapping[str, Collection[str]],
    topic_partitions: Mapping[str, int],
    previous: Mapping[str, Collection[TopicPartition]] | None = None,
) -> dict[str, frozenset[TopicPartition]]:
    """Target assignment: member id -> partitions.

    ``subscriptions``: member id -> subscribed topic names; ``topic_partitions``:
    topic -> partition count of the topics that exist (unknown topics are
    skipped); ``previous``: the last target, for stickiness.
    """
    previous = previous or {}
    members = sorted(subscriptions)
    subscribers: dict[str, list[str]] = {}
    for member in members:
        for topic in set(subscriptions[member]):
            if topic_partitions.get(topic, 0) > 0:
                subscribers.setdefault(topic, []).append(member)
    all_tps = [(topic, p) for topic in sorted(subscribers) for p in range(topic_partitions[topic])]
    valid = set(all_tps)
    prev_count = {m: sum(1 for tp in previous.get(m, ()) if tp in valid) for m in members}

    quota = dict.fromkeys(members, 0)
    for topic, _p in all_tps:
        chosen = min(subscribers[topic], key=lambda m: (quota[m], -prev_count[m], m))
        quota[chosen] += 1

    owner: dict[TopicPartition, str] = {}
    left = dict(quota)
    for member in members:
        subscribed = set(subscriptions[member])
        for tp in sorted(previous.get(member, ())):
            if left[member] == 0:
                break
            if tp in valid and tp[0] in subscribed and tp not in owner:
                owner[tp] = member
                left[member] -= 1

    load = dict.fromkeys(members, 0)
    for member in owner.values():
        load[member] += 1
    for tp in all_tps:
        if tp in owner:
            continue
        candidates = subscribers[tp[0]]
        with_quota = [m for m in candidates if left[m] > 0]
        if with_quota:
            chosen = min(with_quota, key=lambda m: (-left[m], m))
            left[chosen] -= 1
        else:
            chosen = min(candidates, key=lambda m: (load[m], m))
        owner[tp] = chosen
        load[chosen] += 1

    result: dict[str, set[TopicPartition]] = {m: set() for m in members}
    for tp, member in owner.items():
        result[member].add(tp)
    return {m: frozenset(tps) for m, tps in result.items()}
