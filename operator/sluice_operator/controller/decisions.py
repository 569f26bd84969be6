"""The controller's decisions, as pure functions over topic documents (DESIGN 6).

Who leads each partition, and which replicas count as in sync, is decided
here and nowhere else. The functions take a ``topics/<name>`` document (a
:class:`~sluice.metadata.documents.TopicDocument`) and what is known about
broker liveness, and return the new document, or None when nothing changes. They do no
I/O: the embedded cluster's local controller
(:mod:`sluice.operator.controller.local`) and the Kubernetes operator call
them inside their own compare-and-set loops, and tests call them directly.

Liveness comes as two sets: ``live`` (brokers known to answer) and ``dead``
(brokers known to have failed for the failure detector's timeout). A broker
in neither is *unknown* (just registered, or the controller just started):
it is not elected, and it is not replaced either, so a restarting controller
does not move every leader before it has checked anyone. ``dead=None`` means
"every broker not live is dead", the simple form tests use.

The rules, per partition (Kafka's, KRaft flavour):

1. **Election.** A partition whose leader is dead, or which has none (-1),
   gets as leader the first replica, in replica order, that is live *and*
   in the ISR. Only ISR members are guaranteed to hold every record below
   the high watermark, so this "clean" election loses no acknowledged
   write. Dead brokers leave the ISR.
2. **Nobody eligible.** If no live ISR member remains, the leader becomes
   -1 and the ISR is *not* emptied: dead members are removed only while one
   member stays, so the ISR keeps the last brokers that were in sync, and
   the first of them to come back is elected by rule 1. Unless the topic
   sets ``unclean.leader.election.enable=true``: then the first live
   replica is elected even though it may lack acknowledged records, and the
   ISR becomes just that replica (Kafka's unclean election; data loss is
   the price of availability, which is why it is off by default).
3. **Fencing.** A dead broker is removed from the ISR of every partition it
   is in, also where the leader is alive (as KRaft fences a broker out of
   all ISRs): a leader must not count on it for acks=all, and a restarted
   broker comes back into the ISR only when the leader has seen it catch up.
   The leader epoch is unchanged by an ISR change; the document version is
   what leaders compare-and-set against.
4. **Preferred leader.** When the preferred replica (``replicas[0]``) is
   live and in the ISR but does not lead, leadership moves back to it, so
   leadership returns to its even spread after a failure heals. Because the
   ISR is the condition, a returning broker never leads before the current
   leader has re-admitted it as caught up.
5. **Epochs.** Every leadership change, including to and from -1, bumps the
   partition's ``leader_epoch`` by one, so epochs strictly increase and a
   deposed leader's requests are fenced (FENCED_LEADER_EPOCH). Nothing else
   bumps it.

6. **Reassignment.** A partition being reassigned (``adding_replicas`` /
   ``removing_replicas``, :mod:`sluice.metadata.reassignment`) completes once
   every target replica is in the ISR: the replicas become the target, the
   removed brokers leave the ISR, and when the leader is one of them
   leadership moves to the first live in-sync target replica (rule 5 bumps
   the epoch). Applied after rules 1-4, in the same write, so a controller
   that fails midway leaves a document the next one completes. When the
   last partition of a topic completes and all have one replica count, the
   topic's ``replication_factor`` becomes that count.

The ISR is otherwise the leader's to change (shrink a lagging follower,
expand a caught-up one); leaders compare-and-set only the ``isr`` field,
and only while the document's leader and epoch are still theirs. Both sides
re-read and re-decide on every conflict, so the rules above are re-applied to
whatever the leader wrote.

Topic creation and partition addition (:func:`new_topic`,
:func:`add_partitions`) build documents from
:func:`sluice.metadata.placement.place_replicas`, with the preferred replica
leading at epoch 0 and every replica in the ISR (an empty log is in sync).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet

from sluice.metadata.documents import NO_LEADER, PartitionState, TopicDocument
from sluice.metadata.placement import place_replicas
from sluice.metadata.reassignment import complete as complete_reassignment

__all__ = [
    "UNCLEAN_KEY",
    "add_partitions",
    "describe_changes",
    "elect_leaders",
    "new_topic",
    "reconcile_partition",
    "reconcile_topic",
    "restore_preferred_leaders",
]

UNCLEAN_KEY = "unclean.leader.election.enable"


def _is_dead(broker: int, live: AbstractSet[int], dead: AbstractSet[int] | None) -> bool:
    if broker in live:
        return False
    return dead is None or broker in dead


def unclean_enabled(topic: TopicDocument, default: bool = False) -> bool:
    """Whether the topic allows unclean election (its config, else ``default``, the broker-wide setting)."""
    value = topic.config.get(UNCLEAN_KEY)
    if value is None:
        return default
    return str(value).strip().lower() == "true"


def reconcile_partition(
    partition: PartitionState,
    live: AbstractSet[int],
    dead: AbstractSet[int] | None = None,
    *,
    unclean: bool = False,
    elect: bool = True,
    fence: bool = True,
    preferred: bool = True,
) -> PartitionState:
    """One partition's state after applying the rules of the module docstring.

    ``elect``/``fence``/``preferred`` switch rules 1-2, 3 and 4 on and off
    (rule 5 always holds). Returns ``partition`` itself when nothing changes (most partitions of
    a topic in most decisions: a copy of each cost most of a decision at 1,000 partitions, and the
    caller's comparison of the lists then sees identical objects), else a new value (replicas are
    kept as they are).
    """
    replicas = partition.replicas
    isr = partition.isr
    leader = partition.leader
    epoch = partition.leader_epoch
    if not replicas:
        return partition

    # Dead members leave the ISR, but it never becomes empty (rule 2).
    alive_isr = [b for b in isr if not _is_dead(b, live, dead)]
    fenced = alive_isr or isr

    new_leader = leader
    new_isr = fenced if fence else isr
    leaderless = leader == NO_LEADER or _is_dead(leader, live, dead)
    if elect and leaderless:
        new_isr = fenced
        clean = [b for b in replicas if b in live and b in fenced]
        if clean:
            new_leader = clean[0]
        elif unclean and any(b in live for b in replicas):
            new_leader = next(b for b in replicas if b in live)
            new_isr = [new_leader]
        else:
            new_leader = NO_LEADER
    elif preferred and not leaderless:
        first = replicas[0]
        if first != leader and first in live and first in new_isr:
            new_leader = first

    if new_leader != leader:
        return dataclasses.replace(partition, isr=list(new_isr), leader=new_leader, leader_epoch=epoch + 1)
    if new_isr == isr:
        return partition
    return dataclasses.replace(partition, isr=list(new_isr))


def reconcile_topic(
    topic: TopicDocument,
    live: AbstractSet[int],
    dead: AbstractSet[int] | None = None,
    *,
    preferred: bool = True,
    default_unclean: bool = False,
) -> TopicDocument | None:
    """The topic document with every rule applied to each partition; None if nothing changes."""
    unclean = unclean_enabled(topic, default_unclean)
    # The brokers the rules treat as dead (_is_dead), when ``dead`` is given: a partition whose leader
    # and ISR avoid them, not being reassigned and (with ``preferred``) led by its first replica, is
    # left as it is without going through the rules (one C-level set test instead of a copy of its
    # ISR: most partitions of most decisions, bench/controller_rounds.py).
    gone = None if dead is None else frozenset(dead) - frozenset(live)
    partitions = [
        p
        if gone is not None
        and p.leader != NO_LEADER
        and p.leader not in gone
        and gone.isdisjoint(p.isr)
        and not (p.adding_replicas or p.removing_replicas)
        and (not preferred or not p.replicas or p.replicas[0] == p.leader)
        else complete_reassignment(reconcile_partition(p, live, dead, unclean=unclean, preferred=preferred), live)
        for p in topic.partitions
    ]
    if partitions == topic.partitions:
        return None
    new = topic.with_partitions(partitions)
    # A completed reassignment may have changed the replication factor: once every partition has
    # the same replica count again, the topic's says so too (what describe shows; new partitions use it).
    counts = {len(p.replicas) for p in partitions}
    if len(counts) == 1 and not any(p.reassigning for p in partitions) and any(p.reassigning for p in topic.partitions):
        (count,) = counts
        if count != topic.replication_factor:
            new = dataclasses.replace(new, replication_factor=count)
    return new


def elect_leaders(
    topic: TopicDocument,
    live: AbstractSet[int],
    dead: AbstractSet[int] | None = None,
    *,
    default_unclean: bool = False,
) -> TopicDocument | None:
    """Rules 1-3 only: replace dead leaders, elect leaderless partitions, fence dead brokers out of ISRs."""
    return reconcile_topic(topic, live, dead, preferred=False, default_unclean=default_unclean)


def restore_preferred_leaders(topic: TopicDocument, live: AbstractSet[int]) -> TopicDocument | None:
    """Rule 4 only: hand leadership back to live, in-sync preferred replicas."""
    partitions = [
        p
        if not p.replicas or p.replicas[0] == p.leader
        else reconcile_partition(p, live, frozenset(), elect=False, fence=False, preferred=True)
        for p in topic.partitions
    ]
    if partitions == topic.partitions:
        return None
    return topic.with_partitions(partitions)


def describe_changes(
    topic: TopicDocument,
    new: TopicDocument,
    live: AbstractSet[int],
    dead: AbstractSet[int] | None = None,
) -> list[str]:
    """Human lines for the log: one per leadership change, one per group of ISR-only changes.

    A dead broker leaves the ISR of dozens of internal partitions at once;
    those ISR-only changes are grouped by the brokers removed, so the log
    shows the elections rather than a page of fencing.
    """
    name = new.name
    lines: list[str] = []
    fenced: dict[tuple[int, ...], list[tuple[int, list[int]]]] = {}
    for i, (old, cur) in enumerate(zip(topic.partitions, new.partitions, strict=False)):
        if old is cur:
            continue  # the rules leave most partitions as they are (the same object)
        partition_name = f"{name}-{i}"
        was, now = old.leader, cur.leader
        epoch = cur.leader_epoch
        if old.reassigning and not cur.reassigning:
            lines.append(f"reassignment of {partition_name} completed: replicas {old.replicas} -> {cur.replicas}")
        if was != now:
            if was in old.removing_replicas and not cur.reassigning:
                why = f"reassigned off broker {was}"
            elif was == NO_LEADER:
                why = "it had no leader"
            elif _is_dead(was, live, dead):
                why = f"broker {was} dead"
            elif cur.replicas[:1] == [now]:
                why = f"preferred replica back in sync; broker {was} led"
            else:
                why = f"broker {was} led"
            if now == NO_LEADER:
                lines.append(
                    f"{partition_name} has no leader at epoch {epoch} ({why}; no live in-sync replica, ISR {cur.isr})"
                )
            elif now not in old.isr:
                lines.append(
                    f"UNCLEAN election of broker {now} as leader of {partition_name} at epoch {epoch} ({why}): "
                    "records acknowledged by the old in-sync replicas may be lost"
                )
            else:
                lines.append(f"elected broker {now} leader of {partition_name} at epoch {epoch} ({why}), ISR {cur.isr}")
            continue
        removed = tuple(b for b in old.isr if b not in cur.isr)
        if removed:
            fenced.setdefault(removed, []).append((i, list(cur.isr)))
    for removed, parts in fenced.items():
        if len(parts) == 1:
            i, isr = parts[0]
            lines.append(f"removed dead broker(s) {list(removed)} from the ISR of {name}-{i}, now {isr}")
        else:
            numbers = [i for i, _ in parts]
            lines.append(
                f"removed dead broker(s) {list(removed)} from the ISRs of {len(parts)} partitions of {name}: {numbers}"
            )
    return lines


# -- topic creation and partition addition --------------------------------------------------------


def new_topic(
    name: str,
    topic_id: str,
    partitions: int,
    replication_factor: int,
    config: Mapping[str, str],
    brokers: Sequence[tuple[int, str | None]],
    *,
    internal: bool = False,
) -> TopicDocument:
    """A new ``topics/<name>`` document. Raises ValueError as place_replicas does."""
    return TopicDocument(
        name=name,
        topic_id=topic_id,
        internal=internal,
        config=dict(config),
        replication_factor=replication_factor,
        partitions=[PartitionState.initial(r) for r in place_replicas(brokers, partitions, replication_factor)],
    )


def add_partitions(topic: TopicDocument, count: int, brokers: Sequence[tuple[int, str | None]]) -> TopicDocument | None:
    """The topic grown to ``count`` partitions (None if it has that many already).

    Raises ValueError when ``count`` is smaller than the current count (partitions never go away).
    """
    current = topic.partitions
    if count < len(current):
        raise ValueError(f"topic {topic.name!r} has {len(current)} partitions; cannot shrink to {count}")
    if count == len(current):
        return None
    added = place_replicas(brokers, count - len(current), topic.replication_factor, start_partition=len(current))
    return topic.with_partitions(current + [PartitionState.initial(r) for r in added])
