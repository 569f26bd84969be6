"""ISR changes a partition leader asks of a topic document, as one pure rule.

A leader shrinks a partition's ISR by followers that lag and expands it by followers that caught
up (``sluice.broker.replica_manager``); the change goes into the partition's topic document, the
one every broker elects from. Kafka's leader sends AlterPartition to its controller, which refuses
a request from a leader that lost its leadership (a newer leader epoch) or that decided from an
old ISR (a newer partition epoch). This module is that check, applied to the document itself:

* a change applies only while its leader still leads the partition at the change's leader epoch;
* and only while the document's ISR is the one the leader decided from (``base``). Otherwise the
  leader's view is behind (the controller took a dead broker out of the ISR, or an earlier write
  of its own landed): writing its ISR back would undo that, and could make an ISR of a broker that
  is gone. The leader takes the document it is refused with and decides again.

* and, when the change names one, only while the partition is still at the partition epoch the
  leader decided from (every change of the partition counts one: a request the controller took
  once, or that the partition moved past, can never apply again, even if the ISR returns to
  ``base``).

Leaders ask the controller (``isr_requests/<broker>`` documents) when the controller says it takes
requests, and the controller applies them with :func:`apply_isr_changes`, many leaders' changes to a
topic in one write, as Kafka's controller batches AlterPartition; otherwise (a controller from
before, or one that does not answer a request in time) the leader writes the change itself, under
the same rule.

A change already in the document (the same set: order carries no meaning) is reported as such and
writes nothing. :func:`apply_isr_changes` takes all of one leader's changes to one topic, so they
go in one write (each write is the whole document, to etcd and to every watcher).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

from sluice.metadata.documents import TopicDocument
from sluice.metadata.store import Document

__all__ = ["IsrChange", "IsrOutcome", "IsrWrite", "apply_isr_changes"]


@dataclass(frozen=True)
class IsrChange:
    """One partition's new ISR, as its leader at ``leader_epoch`` decided it from ``base``."""

    partition: int
    leader_epoch: int
    base: tuple[int, ...]
    isr: tuple[int, ...]
    partition_epoch: int | None = None  # None: not checked (tools, and leaders of older documents)


class IsrOutcome(enum.Enum):
    WRITTEN = "written"
    ALREADY = "already so"
    NOT_LEADER = "refused: not the leader at this epoch"
    STALE = "refused: the ISR changed since the leader decided"
    NO_PARTITION = "refused: no such partition"
    CONFLICTS = "not written: the document kept changing"

    @classmethod
    def applied(cls, outcome: IsrOutcome | None) -> bool:
        """Whether the document now has the change (written now or before)."""
        return outcome in (cls.WRITTEN, cls.ALREADY)


@dataclass(frozen=True)
class IsrWrite:
    """What one topic's ISR write did: the document to apply to the view (None: nothing read), and
    each change's outcome by partition."""

    document: Document | None
    outcomes: dict[int, IsrOutcome]


def apply_isr_changes(
    doc: TopicDocument, leader: int, changes: Sequence[IsrChange]
) -> tuple[TopicDocument, dict[int, IsrOutcome]]:
    """The document with every change that may apply, and each change's outcome; ``doc`` itself
    (the same object) when nothing is to be written."""
    parts = list(doc.partitions)
    outcomes: dict[int, IsrOutcome] = {}
    for change in changes:
        if not 0 <= change.partition < len(parts):
            outcomes[change.partition] = IsrOutcome.NO_PARTITION
            continue
        p = parts[change.partition]
        if p.leader != leader or p.leader_epoch != change.leader_epoch:
            outcomes[change.partition] = IsrOutcome.NOT_LEADER
        elif set(p.isr) == set(change.isr):
            outcomes[change.partition] = IsrOutcome.ALREADY
        elif set(p.isr) != set(change.base) or (
            change.partition_epoch is not None and change.partition_epoch != p.partition_epoch
        ):
            outcomes[change.partition] = IsrOutcome.STALE
        else:
            parts[change.partition] = dataclasses.replace(p, isr=list(change.isr))
            outcomes[change.partition] = IsrOutcome.WRITTEN
    if IsrOutcome.WRITTEN not in outcomes.values():
        return doc, outcomes
    return doc.with_partitions(parts), outcomes
