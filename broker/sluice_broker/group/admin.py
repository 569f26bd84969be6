"""ListGroups, DescribeGroups and DeleteGroups: what kafka-consumer-groups.sh asks a broker.

Answered from the group coordinator's own state, through the coordinator's public parts (its
runtime's loaded partitions and writes, each partition's groups and offsets), for both
adapters: the gRPC servicer and the Kafka listener's group handlers call it, so neither
imports the other:

* **ListGroups** (asked of every broker) lists the groups of every ``__consumer_offsets``
  partition this broker has loaded: a group with members, or with committed offsets only
  (state Empty, as Kafka lists a group that has offsets and no members).
* **DescribeGroups** (asked of the group's coordinator) gives the group's state and epoch and,
  per member, its epoch, subscription, current and target assignment. The state follows
  KIP-848's names: Empty (no members), Stable (every member at the group epoch, owning its
  target) or Reconciling. A group of Kafka clients on the classic protocol is described in the
  same shape, with the classic states and its generation as the epoch (:func:`_describe_classic`).
* **DeleteGroups** (asked of the group's coordinator) writes a tombstone per committed
  partition of the group to its ``__consumer_offsets`` partition, drops the offsets from memory
  once the append succeeded, and answers once the ISR has the tombstones (as a commit does).
  Refused with NON_EMPTY_GROUP while the group has members, as Kafka refuses, and while it has
  offsets pending in an open transaction (the marker would bring them back).
"""

from __future__ import annotations

from collections.abc import Iterable

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC
from sluice.broker.errors import answer
from sluice.broker.group import GroupCoordinator, consumer_protocol
from sluice.broker.group.api import GroupDescription, GroupList, ListedGroup, MemberDescription, Outcome
from sluice.broker.group.classic import ClassicGroup
from sluice.broker.group.membership import ConsumerGroup
from sluice.broker.group.offsets import encode_key
from sluice.errors import SluiceError
from sluice.records import build_batch

EMPTY, STABLE, RECONCILING = "Empty", "Stable", "Reconciling"


def group_state(group: ConsumerGroup | None) -> str:
    """KIP-848's state of a group: Empty, Stable or Reconciling."""
    if group is None or group.is_empty:
        return EMPTY
    for member_id, member in group.members.items():
        if member.epoch != group.epoch or frozenset(member.assigned) != group.target.get(member_id, frozenset()):
            return RECONCILING
    return STABLE


def _describe_classic(group: ClassicGroup, out: GroupDescription) -> None:
    """A group of Kafka clients (the classic protocol, over the Kafka listener) in the same shape.

    The state is the classic one (Stable, PreparingRebalance, CompletingRebalance), the epoch the
    generation, every member's epoch the generation too. Subscriptions and assignments are read
    from the consumer protocol's bytes when the group's protocol type is ``consumer``; another
    type's bytes are opaque, so its members are listed without them.
    """
    out.state = group.state.value
    out.group_epoch = group.generation
    consumer = group.protocol_type == consumer_protocol.CONSUMER
    for member_id, member in sorted(group.members.items()):
        m = MemberDescription(member_id, group.generation)
        out.members.append(m)
        if not consumer:
            continue
        m.subscribed_topic_names = sorted(
            consumer_protocol.subscribed_topics(member.metadata(group.protocol_name)) or ()
        )
        m.assignment = list(consumer_protocol.assigned_partitions(member.assignment) or ())
        m.target_assignment = list(m.assignment)  # the classic protocol has no target


class GroupAdmin:
    """The three group-administration calls, over a :class:`GroupCoordinator`."""

    def __init__(self, groups: GroupCoordinator, broker_id: int) -> None:
        self.groups = groups
        self.broker_id = broker_id

    async def list_groups(self, states: Iterable[str] = ()) -> GroupList:
        """The groups this broker coordinates, in those ``states`` (any case; none: every state)."""
        resp = GroupList()
        wanted = {s.lower() for s in states}
        for cpart in self.groups.runtime.all_partitions():
            if not cpart.active:
                resp.error_code = pb.COORDINATOR_LOAD_IN_PROGRESS
                resp.error_message = f"{CONSUMER_OFFSETS_TOPIC}-{cpart.partition} is still loading"
                continue
            state = cpart.state
            for group_id in sorted(set(state.groups) | set(state.offsets.groups)):
                group = state.groups.get(group_id)
                if isinstance(group, ClassicGroup) and not group.is_empty:  # the Kafka listener's
                    name = group.state.value
                else:
                    name = group_state(group if isinstance(group, ConsumerGroup) else None)
                if wanted and name.lower() not in wanted:
                    continue
                resp.groups.append(ListedGroup(group_id, name, self.broker_id))
        return resp

    async def describe_groups(self, group_ids: Iterable[str]) -> list[GroupDescription]:
        out: list[GroupDescription] = []
        for group_id in group_ids:
            described = GroupDescription(group_id, self.broker_id)
            out.append(described)
            try:
                self._describe(group_id, described)
            except SluiceError as exc:
                answer(described, exc)
        return out

    def _describe(self, group_id: str, out: GroupDescription) -> None:
        state = self.groups.locate(group_id)
        classic = state.classic_group(group_id)
        if classic is not None and not classic.is_empty:
            _describe_classic(classic, out)
            return
        group = state.consumer_group(group_id)
        if group is None and group_id not in state.offsets.groups:
            raise errors.GroupIdNotFoundError(f"group {group_id!r} does not exist")
        out.state = group_state(group)
        if group is None:
            return
        out.group_epoch = group.epoch
        for member_id, member in sorted(group.members.items()):
            out.members.append(
                MemberDescription(
                    member_id,
                    member.epoch,
                    list(member.subscription),
                    sorted(member.assigned),
                    sorted(group.target.get(member_id, frozenset())),
                )
            )

    async def delete_groups(self, group_ids: Iterable[str]) -> dict[str, Outcome]:
        """Each group's outcome, in the order asked."""
        out: dict[str, Outcome] = {}
        for group_id in group_ids:
            outcome = out[group_id] = Outcome()
            try:
                await self._delete(group_id)
            except SluiceError as exc:
                answer(outcome, exc)
        return out

    async def _delete(self, group_id: str) -> None:
        state = self.groups.locate(group_id)
        group = state.consumer_group(group_id)
        if group is not None and not group.is_empty:
            raise errors.NonEmptyGroupError(
                f"group {group_id!r} has {len(group.members)} active members: stop them first"
            )
        classic = state.classic_group(group_id)
        if classic is not None and not classic.is_empty:
            raise errors.NonEmptyGroupError(
                f"group {group_id!r} has {len(classic.members)} active (classic) members: stop them first"
            )
        offsets = state.offsets.groups.get(group_id)
        if offsets is None:
            raise errors.GroupIdNotFoundError(f"group {group_id!r} does not exist")
        if offsets.pending:
            raise errors.NonEmptyGroupError(
                f"group {group_id!r} has offsets pending in an open transaction: end it first"
            )
        tps = sorted(offsets.committed)
        batch = build_batch([(encode_key(group_id, topic, partition), None) for topic, partition in tps])
        runtime = self.groups.runtime
        what = f"the offsets of group {group_id!r}"
        runtime.append(state.partition, state.coordinator_epoch, batch, what)
        for tp in tps:  # the log has the tombstones: memory follows, as a replay would
            state.offsets.delete(group_id, tp)
        await runtime.wait_committed(state.partition, what)
