"""Partition reassignment (Kafka's KIP-455), as pure functions over a partition's state.

A reassignment moves a partition from its replicas (the *original* set) to a *target* set
without ever having fewer copies than before, in Kafka's order:

1. **Start** (:func:`start`, written by the broker that serves AlterPartitionReassignments):
   the partition's replicas become ``target + (original - target)``, with ``adding_replicas``
   (target - original) and ``removing_replicas`` (original - target) recorded in the topic
   document, and the original replicas in their order (``original_replicas``, so a cancel
   restores the preferred leader; Kafka derives them as ``replicas - adding``, losing it).
   Leader, epoch and ISR stay as they are. Every broker sees the new replica list in its
   metadata watch: an adding broker opens the partition and fetches from the leader from
   the log start, as a follower; the leader adds it to the ISR when it has caught up (the
   existing ISR expansion rule). Nothing is removed yet, so min.insync.replicas and acks=all
   keep counting the original in-sync replicas.
2. **Completion** (:func:`complete`, applied by the controller every round, with its other
   rules, :mod:`sluice.operator.controller.decisions`): when every target replica is in the
   ISR, one compare-and-set makes ``replicas`` the target, the ISR its intersection with the
   target, and clears the adding/removing lists. When the leader is being removed, leadership
   moves in the same write to the first target replica that is live and in the ISR (a clean
   election: an ISR member holds every record below the HW), bumping the leader epoch so the
   old leader is fenced. A broker no longer in ``replicas`` stops serving the partition and
   deletes its data (the replica manager's existing "reassigned away" path).
3. **Cancel** (:func:`cancel`): the replicas go back to the original set, the ISR to its
   intersection with it, and leadership to an original in-sync replica when an adding replica
   led (the preferred-leader rule may have moved it there). Added replicas delete their copy.

All state is in the topic document, so a controller or leader that fails midway loses nothing:
the next controller re-applies :func:`complete` to what it reads, a new leader keeps
expanding the ISR with the adding replicas. A new reassignment of a partition that is being
reassigned starts from its *original* replicas (``replicas - adding``), as Kafka's does.

Validation (:func:`check_target`) raises :class:`ReassignmentRefused` with the Kafka error
name a broker answers: INVALID_REPLICA_ASSIGNMENT for an empty list, duplicate brokers or an
unregistered broker; INVALID_REPLICATION_FACTOR when the replication factor would change and
the caller said it may not. It lives in :mod:`sluice.metadata` because the broker (start,
cancel) and the controller (complete) may not import each other.

:func:`propose` is the ``--generate`` mode of ``sluice partitions reassign``: the placement of
:mod:`sluice.metadata.placement` over the given brokers, keeping each partition's replication
factor, with the proposal listed only for partitions whose replicas change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping, Sequence
from collections.abc import Set as AbstractSet

from sluice.metadata.documents import NO_LEADER, PartitionState
from sluice.metadata.placement import place_replicas

__all__ = [
    "INVALID_REPLICATION_FACTOR",
    "INVALID_REPLICA_ASSIGNMENT",
    "NO_REASSIGNMENT_IN_PROGRESS",
    "ReassignmentRefused",
    "cancel",
    "check_target",
    "complete",
    "original_replicas",
    "propose",
    "start",
    "target_replicas",
]

INVALID_REPLICA_ASSIGNMENT = "INVALID_REPLICA_ASSIGNMENT"
INVALID_REPLICATION_FACTOR = "INVALID_REPLICATION_FACTOR"
NO_REASSIGNMENT_IN_PROGRESS = "NO_REASSIGNMENT_IN_PROGRESS"


class ReassignmentRefused(ValueError):
    """A reassignment (or its cancellation) that cannot be done; ``error`` is the Kafka error name."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def original_replicas(partition: PartitionState) -> list[int]:
    """The replicas before the reassignment in progress (the replicas themselves when there is none).

    In their original order when the document recorded it (``original_replicas``, written by
    :func:`start`); else, as Kafka derives them, the replicas not being added.
    """
    derived = [b for b in partition.replicas if b not in partition.adding_replicas]
    if partition.reassigning and sorted(partition.original_replicas) == sorted(derived):
        return list(partition.original_replicas)
    return derived


def target_replicas(partition: PartitionState) -> list[int]:
    """Where the partition is going (its replicas when no reassignment is in progress)."""
    return [b for b in partition.replicas if b not in partition.removing_replicas]


def check_target(
    target: Sequence[int],
    registered: Collection[int],
    current_replication_factor: int,
    *,
    allow_replication_factor_change: bool = True,
) -> None:
    """Raise :class:`ReassignmentRefused` when ``target`` is not a valid replica list."""
    if not target:
        raise ReassignmentRefused(INVALID_REPLICA_ASSIGNMENT, "the target replica list is empty")
    if len(set(target)) != len(target):
        raise ReassignmentRefused(INVALID_REPLICA_ASSIGNMENT, f"the target replicas {list(target)} repeat a broker")
    unknown = sorted(b for b in target if b not in registered)
    if unknown:
        raise ReassignmentRefused(
            INVALID_REPLICA_ASSIGNMENT,
            f"the target replicas {list(target)} name unknown broker(s) {unknown} (registered: {sorted(registered)})",
        )
    if not allow_replication_factor_change and len(target) != current_replication_factor:
        raise ReassignmentRefused(
            INVALID_REPLICATION_FACTOR,
            f"the target replicas {list(target)} change the replication factor {current_replication_factor}",
        )


def start(partition: PartitionState, target: Sequence[int]) -> PartitionState:
    """The partition with a reassignment to ``target`` started (replacing one in progress).

    Raises :class:`ReassignmentRefused` when replacing the move in progress would leave no
    in-sync replica (only replicas it was adding are in sync, and the new target drops them).
    """
    original = original_replicas(partition)
    adding = [b for b in target if b not in original]
    removing = [b for b in original if b not in target]
    replicas = list(target) + removing
    # Replicas dropped by replacing an earlier reassignment leave the ISR with it, and leadership
    # if one of them led (the preferred-leader rule may have moved it to an adding replica).
    isr = [b for b in partition.isr if b in replicas]
    if not isr:
        raise ReassignmentRefused(
            INVALID_REPLICA_ASSIGNMENT,
            f"the target {list(target)} drops every in-sync replica {partition.isr} of the move in progress",
        )
    leader, epoch = partition.leader, partition.leader_epoch
    if leader != NO_LEADER and leader not in replicas:
        leader, epoch = isr[0], epoch + 1
    return dataclasses.replace(
        partition,
        replicas=replicas,
        isr=isr,
        leader=leader,
        leader_epoch=epoch,
        adding_replicas=adding,
        removing_replicas=removing,
        original_replicas=original if adding or removing else [],
    )


def cancel(partition: PartitionState, dead: AbstractSet[int] = frozenset()) -> PartitionState:
    """The partition back on its original replicas; raises :class:`ReassignmentRefused` when none is in progress."""
    if not partition.reassigning:
        raise ReassignmentRefused(NO_REASSIGNMENT_IN_PROGRESS, "no reassignment is in progress")
    original = original_replicas(partition)
    isr = [b for b in partition.isr if b in original]
    if not isr:
        # Going back would leave no in-sync replica (the originals fell behind or died): the data
        # is on the target now. Refused rather than electing a replica that may lack records.
        raise ReassignmentRefused(
            INVALID_REPLICA_ASSIGNMENT,
            f"cannot cancel: none of the original replicas {original} is in sync (ISR {partition.isr})",
        )
    leader, epoch = partition.leader, partition.leader_epoch
    if leader not in original:
        eligible = [b for b in original if b in isr and b not in dead]
        leader = eligible[0] if eligible else NO_LEADER
        epoch += 1
    return dataclasses.replace(
        partition,
        replicas=original,
        isr=isr,
        leader=leader,
        leader_epoch=epoch,
        adding_replicas=[],
        removing_replicas=[],
        original_replicas=[],
    )


def complete(partition: PartitionState, live: AbstractSet[int]) -> PartitionState:
    """The partition with its reassignment finished, when every target replica is in sync; else as it is."""
    if not partition.reassigning:
        return partition
    target = target_replicas(partition)
    if any(b not in partition.isr for b in target):
        return partition  # a target replica is still catching up
    leader, epoch = partition.leader, partition.leader_epoch
    if leader not in target:
        eligible = [b for b in target if b in live and b in partition.isr]
        if not eligible:
            return partition  # no target replica can lead now: wait
        leader, epoch = eligible[0], epoch + 1
    return dataclasses.replace(
        partition,
        replicas=target,
        isr=[b for b in partition.isr if b in target],
        leader=leader,
        leader_epoch=epoch,
        adding_replicas=[],
        removing_replicas=[],
        original_replicas=[],
    )


def propose(
    topics: Mapping[str, Sequence[Sequence[int]]], brokers: Sequence[tuple[int, str | None]]
) -> dict[tuple[str, int], list[int]]:
    """A balanced placement of ``topics`` (name -> each partition's current replicas) over ``brokers``.

    Returns the partitions whose replicas would change, with their proposed replicas. Each
    topic keeps its replication factor (its first partition's replica count); raises
    ValueError when that is larger than the number of brokers. Deterministic and rack-aware
    (:func:`sluice.metadata.placement.place_replicas`, Kafka's layout).
    """
    plan: dict[tuple[str, int], list[int]] = {}
    for name, current in sorted(topics.items()):
        if not current:
            continue
        layout = place_replicas(brokers, len(current), len(current[0]))
        for index, (replicas, proposed) in enumerate(zip(current, layout, strict=True)):
            if list(replicas) != proposed:
                plan[(name, index)] = proposed
    return plan
