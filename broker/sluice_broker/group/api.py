"""What the group coordinator takes and answers: plain values (offsets, KIP-848 heartbeats, admin).

Both protocols call the coordinator: the gRPC servicer and the Kafka listener's handlers each
decode their request into these values, ask :mod:`sluice.broker.security.coordinator_checks`
whether the caller may, call :class:`~sluice.broker.group.GroupCoordinator`, and encode its answer
in their own format. A Kafka OffsetCommit never becomes a gRPC message on its way in.

The member epoch of a commit is checked by the group's kind: a classic group's generation
(Kafka's ClassicGroup rule), a consumer group member's epoch (KIP-848). Errors travel as
``error_code`` and ``error_message``, per partition where the request has partitions
(:class:`~sluice.broker.coordination.answers.PartitionAnswer`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.coordination.answers import Outcome, PartitionAnswer
from sluice.broker.group.membership import HeartbeatInput
from sluice.broker.topic_partition import TopicPartition

__all__ = [
    "CommitOffset",
    "FetchedOffset",
    "GroupDescription",
    "GroupList",
    "HeartbeatAnswer",
    "HeartbeatInput",
    "ListedGroup",
    "MemberDescription",
    "OffsetCommitInput",
    "OffsetFetchAnswer",
    "OffsetFetchInput",
    "Outcome",
    "PartitionAnswer",
    "TxnOffsetCommitInput",
]


@dataclass(frozen=True, slots=True)
class CommitOffset:
    """One partition's offset to commit: the next offset to read, its leader epoch, free metadata."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int = -1
    metadata: str = ""


@dataclass(frozen=True, slots=True)
class OffsetCommitInput:
    """OffsetCommit: a member's commit (member id and epoch, or generation), or one from outside
    the group (empty member id), accepted only while the group has no members."""

    group_id: str
    offsets: tuple[CommitOffset, ...]
    member_id: str = ""
    member_epoch: int = -1
    instance_id: str | None = None  # the committing member's group.instance.id (KIP-345), if it has one


@dataclass(frozen=True, slots=True)
class TxnOffsetCommitInput:
    """TxnOffsetCommit: offsets staged in a transaction, visible once its COMMIT marker lands."""

    commit: OffsetCommitInput
    transactional_id: str
    producer_id: int
    producer_epoch: int


@dataclass(frozen=True, slots=True)
class OffsetFetchInput:
    group_id: str
    partitions: tuple[TopicPartition, ...] | None = None  # None: every partition the group has an offset for
    require_stable: bool = False  # UNSTABLE_OFFSET_COMMIT for a partition with a transactional offset pending


@dataclass(slots=True)
class FetchedOffset:
    """One partition's committed offset (-1s when none), or its error."""

    topic: str
    partition: int
    offset: int = -1
    leader_epoch: int = -1
    metadata: str = ""
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""


@dataclass(slots=True)
class OffsetFetchAnswer:
    partitions: list[FetchedOffset] = field(default_factory=list)
    error_code: pb.ErrorCode = pb.NONE  # the group's error (the coordinator moved, not loaded ...)
    error_message: str = ""


@dataclass(slots=True)
class HeartbeatAnswer:
    """A KIP-848 heartbeat's answer: the member's id and epoch and its assignment, or the error."""

    member_id: str
    member_epoch: int
    heartbeat_interval_ms: int = 0
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    assignment: list[TopicPartition] = field(default_factory=list)


# -- group administration (kafka-consumer-groups.sh): group/admin.py ------------------------------


@dataclass(frozen=True, slots=True)
class ListedGroup:
    group_id: str
    state: str  # KIP-848's Empty, Stable, Reconciling; a classic group's own state names
    coordinator_id: int


@dataclass(slots=True)
class GroupList:
    """The groups of every ``__consumer_offsets`` partition this broker has loaded; while one is
    still loading, COORDINATOR_LOAD_IN_PROGRESS with the others' groups."""

    groups: list[ListedGroup] = field(default_factory=list)
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""


@dataclass(slots=True)
class MemberDescription:
    member_id: str
    member_epoch: int
    subscribed_topic_names: list[str] = field(default_factory=list)
    assignment: list[TopicPartition] = field(default_factory=list)
    target_assignment: list[TopicPartition] = field(default_factory=list)


@dataclass(slots=True)
class GroupDescription:
    """DescribeGroups' answer for one group: its state, epoch and members, or the error."""

    group_id: str
    coordinator_id: int
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    state: str = ""
    group_epoch: int = 0
    members: list[MemberDescription] = field(default_factory=list)
