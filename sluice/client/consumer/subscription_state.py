"""What a consumer reads and where it is in each partition (Kafka's SubscriptionState).

Design:

* Plain state, no I/O and no lock of its own: the
  :class:`~sluice.client.consumer.Consumer`'s lock guards it, and the
  :class:`~sluice.client.consumer.fetcher.Fetcher` takes that same lock, so
  one lock covers the assignment, the positions and the fetch buffer
  together (a fetch response is accepted only if the position it was
  fetched from is still current).
* A consumer either subscribes to topics (the group assigns partitions) or
  is assigned partitions by hand, never both at once.
* Per assigned partition a :class:`PartitionState`: the *position* (the next
  offset ``poll()`` returns; None until looked up), whether the lookup must
  use ``auto_offset_reset`` (after OFFSET_OUT_OF_RANGE), the pause flag, the
  time before which it is not fetched again (after an error), and the
  high watermark and last stable offset the last fetch reported.
* A group's new assignment is left here by the heartbeat thread
  (:attr:`SubscriptionState.pending_assignment`) and applied by the next
  ``poll()``, so that between two polls the assignment describes the records
  the last poll returned (the consumer module's docstring explains why).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice import errors
from sluice.client.types import GroupMetadata, TopicPartition


@dataclass(slots=True)
class PartitionState:
    position: int | None = None
    reset_pending: bool = False  # use auto_offset_reset, not the committed offset (after OFFSET_OUT_OF_RANGE)
    paused: bool = False
    retry_at: float = 0.0
    high_watermark: int = -1
    last_stable_offset: int = -1


@dataclass(frozen=True, slots=True)
class PendingAssignment:
    """A group assignment the heartbeat thread received, for the next ``poll()`` to apply."""

    target: frozenset[TopicPartition]
    lost: bool  # taken away without a chance to commit (the member was fenced or expired)
    metadata: GroupMetadata  # the member id and epoch the assignment came with


class SubscriptionState:
    """The subscription (or manual assignment) and the state of each assigned partition.

    Not thread-safe by itself: callers hold the consumer's lock.
    """

    __slots__ = ("assignment", "metadata", "owned_partitions", "pending_assignment", "subscription")

    def __init__(self) -> None:
        self.assignment: dict[TopicPartition, PartitionState] = {}
        self.subscription: list[str] | None = None  # None: not subscribed (manual assignment or nothing)
        self.pending_assignment: PendingAssignment | None = None
        self.owned_partitions: frozenset[TopicPartition] = frozenset()  # reported in heartbeats
        self.metadata: GroupMetadata | None = None  # as of the last applied assignment

    def state(self, tp: TopicPartition, action: str) -> PartitionState:
        """The state of an assigned partition; IllegalStateError names ``action`` if it is not assigned."""
        st = self.assignment.get(tp)
        if st is None:
            raise errors.IllegalStateError(f"cannot {action} {tp}: the partition is not assigned to this consumer")
        return st

    def assign(self, partitions: set[TopicPartition]) -> list[TopicPartition]:
        """Make ``partitions`` the assignment, keeping the state of those kept; the partitions removed."""
        removed = [tp for tp in self.assignment if tp not in partitions]
        for tp in removed:
            del self.assignment[tp]
        for tp in partitions:
            self.assignment.setdefault(tp, PartitionState())
        return removed

    def leave_pending(self, target: frozenset[TopicPartition], lost: bool, metadata: GroupMetadata) -> None:
        """The heartbeat thread's new target, kept for the next poll()."""
        if lost:
            self.owned_partitions = frozenset()  # not ours any more, whatever the application holds
        pending = self.pending_assignment
        # a loss not applied yet stays a loss: nothing of those partitions may be committed
        self.pending_assignment = PendingAssignment(target, lost or (pending is not None and pending.lost), metadata)

    def clear(self) -> None:
        """Forget the assignment and everything the group handed over (unsubscribe)."""
        self.assignment.clear()
        self.pending_assignment = None
        self.owned_partitions = frozenset()
        self.metadata = None

    def positions(self) -> dict[TopicPartition, int]:
        """The known positions of the assigned partitions: what commit() commits by default."""
        return {tp: st.position for tp, st in self.assignment.items() if st.position is not None}

    def missing_positions(self) -> dict[TopicPartition, bool]:
        """Partitions whose position must be looked up, each with whether auto_offset_reset must be used."""
        return {tp: st.reset_pending for tp, st in self.assignment.items() if st.position is None}

    def set_positions(self, positions: dict[TopicPartition, int]) -> None:
        """Set looked-up positions, where the partition is still assigned and its position still unknown."""
        for tp, offset in positions.items():
            st = self.assignment.get(tp)
            if st is not None and st.position is None:
                st.position = offset
                st.reset_pending = False

    def paused(self) -> set[TopicPartition]:
        return {tp for tp, st in self.assignment.items() if st.paused}
