"""Consumer group membership with one heartbeat (the shape of Kafka's KIP-848).

Pure logic, no I/O and no clock of its own: every call takes ``now`` (ms, from
the coordinator's injectable monotonic clock) and the current topic sizes, so
tests drive time and metadata by hand.

Epochs. The *group epoch* is bumped by every change that may change the
assignment (join, leave, expiry, fencing, a subscription change, a subscribed
topic gaining partitions or appearing) and each bump recomputes the *target
assignment* (:mod:`.assignor`). A member's *member epoch* is the group epoch
it was last answered with; a heartbeat must carry it (or, if that answer was
lost, the previous one with nothing owned beyond what it was assigned), else
the member is fenced: FENCED_MEMBER_EPOCH, removed, and it must rejoin with
epoch 0 after dropping its partitions.

Hand-over. A member is answered ``target ∩ free``, where a partition is free
when no *other* member holds it. A member holds what it was last answered,
what it is revoking, and what it last reported in ``owned_partitions``: so a
partition moves only after its previous owner heartbeated without it (it
revoked it and committed its offsets), left, or was removed. A partition taken
out of a member's answer is *revoking* until a heartbeat sent after the member
saw that answer (its request carries that answer's epoch or a later one)
leaves it out of ``owned``: the ``owned`` of a request built before the member
saw the answer may predate its application taking the partition on (the
consumer applies answers in ``poll()``, on another thread), so it cannot
release it. Two members therefore never own a partition at once. A member that
keeps a revoked partition beyond its rebalance timeout is removed so the group
is not stuck behind it.

Sessions. A member that does not heartbeat within its session timeout is
removed by :meth:`ConsumerGroup.expire`, called periodically.

Offset-commit fencing (KIP-447). A commit carrying a member id must come from
a current member with its current epoch; an older epoch is accepted only for
partitions the member has held without interruption since that epoch (the
same rule as Kafka's later "assignment epochs"), so a live member is not
fenced just because a rebalance elsewhere bumped its epoch, while a zombie
(expired, fenced or replaced) never commits. Held includes a partition being
revoked (see hand-over), because the member commits what it processed of a
partition before it releases it (its application sees the revocation only at
its next poll).

Persistence. This module stays pure: the coordinator snapshots a group
(:meth:`ConsumerGroup.clone`) before a change, and writes what changed as
records of ``__consumer_offsets`` (:mod:`.group_records`) before it answers.
A coordinator that loads the partition (after a restart or a failover) rebuilds
each group with :meth:`ConsumerGroup.restore`: same epochs, target and member
assignments, so members keep their ids, epochs and partitions. What is not
persisted is time: a restored member's session starts at the load (a full
session timeout to reach the new coordinator), and so does the deadline of a
member that is revoking partitions.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import BrokerConfig
from sluice.broker.group.assignor import assign
from sluice.broker.topic_partition import TopicPartition

JOIN_EPOCH = 0
LEAVE_EPOCH = -1
# A member id is a string of the member's keys in __consumer_offsets (uint16 length): the format's bound.
MEMBER_ID_MAX_BYTES = 0xFFFF
DEFAULT_REBALANCE_TIMEOUT_MS = 300_000  # Kafka's max.poll.interval.ms default


@dataclass(frozen=True)
class GroupSettings:
    session_timeout_ms: int = 45_000
    min_session_timeout_ms: int = 1_000
    max_session_timeout_ms: int = 300_000
    heartbeat_interval_ms: int = 5_000
    rebalance_timeout_ms: int = DEFAULT_REBALANCE_TIMEOUT_MS

    @classmethod
    def from_config(cls, config: BrokerConfig) -> GroupSettings:
        return cls(
            session_timeout_ms=config.int("group.consumer.session.timeout.ms"),
            min_session_timeout_ms=config.int("group.consumer.min.session.timeout.ms"),
            max_session_timeout_ms=config.int("group.consumer.max.session.timeout.ms"),
            heartbeat_interval_ms=config.int("group.consumer.heartbeat.interval.ms"),
        )


@dataclass(frozen=True)
class HeartbeatInput:
    member_id: str
    member_epoch: int
    subscription: tuple[str, ...] | None  # None: unchanged since the last heartbeat
    # None: as last reported (Kafka's client sends null when unchanged); never "owns nothing"
    owned: frozenset[TopicPartition] | None = frozenset()
    session_timeout_ms: int = 0  # 0: the broker default (or unchanged)
    rebalance_timeout_ms: int = 0


@dataclass(frozen=True)
class HeartbeatResult:
    error: pb.ErrorCode
    message: str
    member_id: str
    member_epoch: int
    assignment: tuple[TopicPartition, ...] = ()


@dataclass
class Member:
    member_id: str
    subscription: tuple[str, ...]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    last_seen_ms: float
    epoch: int = 0
    previous_epoch: int = -1
    owned: frozenset[TopicPartition] = frozenset()  # as last reported
    assigned: dict[TopicPartition, int] = field(default_factory=dict)  # as last answered -> epoch since
    # taken out of its assignment but maybe still consumed (it is revoking them) -> epoch since
    revoking: dict[TopicPartition, int] = field(default_factory=dict)
    revoke_deadline_ms: float | None = None
    # the member epoch of the last answer that took partitions away: only a heartbeat sent after the
    # member saw it (carrying this epoch or a later one) tells what it released
    revoked_epoch: int = 0

    def holds(self, tp: TopicPartition) -> bool:
        """Whether the member may be consuming ``tp``: it was given it, is revoking it, or reports it."""
        return tp in self.assigned or tp in self.revoking or tp in self.owned


class ConsumerGroup:
    def __init__(
        self,
        group_id: str,
        settings: GroupSettings,
        new_member_id: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.group_id = group_id
        self.settings = settings
        self.epoch = 0
        self.members: dict[str, Member] = {}
        self.target: dict[str, frozenset[TopicPartition]] = {}
        self._sizes: dict[str, int] = {}  # partition counts of subscribed topics at the last target
        self._new_member_id = new_member_id

    @property
    def is_empty(self) -> bool:
        return not self.members

    @property
    def subscribed_sizes(self) -> dict[str, int]:
        """Partition counts of the subscribed topics when the target was last computed."""
        return dict(self._sizes)

    def clone(self) -> ConsumerGroup:
        """An independent copy: the coordinator changes the copy and keeps it only once it is written."""
        other = ConsumerGroup(self.group_id, self.settings, self._new_member_id)
        other.epoch = self.epoch
        other.members = {
            mid: replace(m, assigned=dict(m.assigned), revoking=dict(m.revoking)) for mid, m in self.members.items()
        }
        other.target = dict(self.target)
        other._sizes = dict(self._sizes)
        return other

    @classmethod
    def restore(
        cls,
        group_id: str,
        settings: GroupSettings,
        epoch: int,
        sizes: Mapping[str, int],
        members: list[Member],
        target: Mapping[str, frozenset[TopicPartition]],
        now: float,
    ) -> ConsumerGroup:
        """A group as a loaded ``__consumer_offsets`` partition describes it; sessions start at ``now``.

        A restored member gets a whole session timeout from the load (its last
        heartbeat went to the previous coordinator, whose clock is not ours), and
        a member still revoking partitions a whole rebalance timeout to finish.
        """
        group = cls(group_id, settings)
        group.epoch = epoch
        group._sizes = dict(sizes)
        for member in members:
            member.last_seen_ms = now
            member.revoke_deadline_ms = (
                now + member.rebalance_timeout_ms if member.revoking or member.owned - set(member.assigned) else None
            )
            group.members[member.member_id] = member
        group.target = {mid: frozenset(target.get(mid, frozenset())) for mid in group.members}
        return group

    # -- heartbeat ------------------------------------------------------------------------------

    def heartbeat(self, hb: HeartbeatInput, topics: Mapping[str, int], now: float) -> HeartbeatResult:
        """One ConsumerGroupHeartbeat: join (epoch 0), leave (epoch -1) or heartbeat."""

        def fail(code: pb.ErrorCode, message: str) -> HeartbeatResult:
            return HeartbeatResult(code, message, hb.member_id, hb.member_epoch)

        session = hb.session_timeout_ms
        s = self.settings
        if session and not s.min_session_timeout_ms <= session <= s.max_session_timeout_ms:
            return fail(
                pb.INVALID_SESSION_TIMEOUT,
                f"session timeout {session} ms is outside [{s.min_session_timeout_ms}, "
                f"{s.max_session_timeout_ms}] (group.consumer.min/max.session.timeout.ms)",
            )
        if len(hb.member_id.encode()) > MEMBER_ID_MAX_BYTES:
            return fail(pb.INVALID_REQUEST, f"a member id must be at most {MEMBER_ID_MAX_BYTES} bytes of UTF-8")
        if hb.member_epoch < LEAVE_EPOCH:
            return fail(pb.INVALID_REQUEST, f"member epoch {hb.member_epoch} is not valid (0 join, -1 leave)")

        if hb.member_epoch == LEAVE_EPOCH:
            if hb.member_id not in self.members:
                return fail(pb.UNKNOWN_MEMBER_ID, f"member {hb.member_id!r} is not in group {self.group_id!r}")
            self.remove(hb.member_id, topics)
            return HeartbeatResult(pb.NONE, "", hb.member_id, LEAVE_EPOCH)

        changed = False
        if hb.member_epoch == JOIN_EPOCH:
            member_id = hb.member_id or self._new_member_id()
            # A known id joining again gave up what it had: it replaces its old self.
            self.members.pop(member_id, None)
            member = Member(
                member_id,
                _normalise(hb.subscription or ()),
                session or s.session_timeout_ms,
                hb.rebalance_timeout_ms if hb.rebalance_timeout_ms > 0 else s.rebalance_timeout_ms,
                now,
            )
            self.members[member_id] = member
            changed = True
        else:
            found = self.members.get(hb.member_id)
            if found is None:
                return fail(
                    pb.UNKNOWN_MEMBER_ID,
                    f"member {hb.member_id!r} is not in group {self.group_id!r} (expired, left or the "
                    "coordinator moved): rejoin with member epoch 0",
                )
            member = found
            if not self._epoch_ok(member, hb):
                self.remove(member.member_id, topics)
                return fail(
                    pb.FENCED_MEMBER_EPOCH,
                    f"member epoch {hb.member_epoch} of {member.member_id!r} is stale (current "
                    f"{member.epoch}): rejoin with member epoch 0",
                )
            if hb.subscription is not None and _normalise(hb.subscription) != member.subscription:
                member.subscription = _normalise(hb.subscription)
                changed = True
            if session:
                member.session_timeout_ms = session
            if hb.rebalance_timeout_ms > 0:
                member.rebalance_timeout_ms = hb.rebalance_timeout_ms
        member.last_seen_ms = now
        if hb.owned is not None:
            member.owned = hb.owned
        if changed or self._sizes != self._subscribed_sizes(topics):
            self._bump(topics)
        return self._reconcile(member, now, hb.member_epoch)

    @staticmethod
    def _epoch_ok(member: Member, hb: HeartbeatInput) -> bool:
        if hb.member_epoch == member.epoch:
            return True
        # The answer that moved the member to its current epoch may have been lost.
        owned = member.owned if hb.owned is None else hb.owned
        return hb.member_epoch == member.previous_epoch and owned <= set(member.assigned)

    def _reconcile(self, member: Member, now: float, request_epoch: int) -> HeartbeatResult:
        target = self.target.get(member.member_id, frozenset())
        others = [m for m in self.members.values() if m is not member]
        granted = sorted(tp for tp in target if not any(o.holds(tp) for o in others))
        if member.epoch != self.epoch:
            member.previous_epoch, member.epoch = member.epoch, self.epoch
        held = {**member.revoking, **member.assigned}
        assigned = {tp: held.get(tp, member.epoch) for tp in granted}
        # Partitions taken away by this answer: the member may have started on them since it sampled
        # the ``owned`` of this request (its application applies answers in poll()), so they are
        # revoking until a heartbeat sent after it saw this answer reports them released.
        removed = [tp for tp in member.assigned if tp not in assigned]
        if removed:
            member.revoked_epoch = member.epoch
        reported = request_epoch >= member.revoked_epoch  # this request's `owned` knows every removal
        member.revoking = {
            tp: since
            for tp, since in held.items()
            if tp not in assigned and (tp in removed or tp in member.owned or not reported)
        }
        member.assigned = assigned
        if member.revoking or member.owned - set(granted):
            if member.revoke_deadline_ms is None:
                member.revoke_deadline_ms = now + member.rebalance_timeout_ms
        else:
            member.revoke_deadline_ms = None
        return HeartbeatResult(pb.NONE, "", member.member_id, member.epoch, tuple(granted))

    # -- removal --------------------------------------------------------------------------------

    def remove(self, member_id: str, topics: Mapping[str, int]) -> None:
        if self.members.pop(member_id, None) is not None:
            self._bump(topics)

    def expire(self, topics: Mapping[str, int], now: float) -> list[tuple[str, str]]:
        """Remove members past their session timeout or stuck revoking; returns (member id, reason)."""
        removed: list[tuple[str, str]] = []
        for member in list(self.members.values()):
            if now - member.last_seen_ms > member.session_timeout_ms:
                removed.append((member.member_id, f"no heartbeat within {member.session_timeout_ms} ms"))
            elif member.revoke_deadline_ms is not None and now > member.revoke_deadline_ms:
                removed.append((member.member_id, f"did not revoke partitions within {member.rebalance_timeout_ms} ms"))
        for member_id, _reason in removed:
            del self.members[member_id]
        if removed:
            self._bump(topics)
        return removed

    # -- target ---------------------------------------------------------------------------------

    def _subscribed_sizes(self, topics: Mapping[str, int]) -> dict[str, int]:
        names = {t for m in self.members.values() for t in m.subscription}
        return {t: topics[t] for t in sorted(names) if t in topics}

    def _bump(self, topics: Mapping[str, int]) -> None:
        self.epoch += 1
        self._sizes = self._subscribed_sizes(topics)
        subscriptions = {m.member_id: m.subscription for m in self.members.values()}
        self.target = assign(subscriptions, self._sizes, self.target)

    # -- offset commits -------------------------------------------------------------------------

    def check_commit(
        self, member_id: str, member_epoch: int, partitions: list[TopicPartition]
    ) -> tuple[pb.ErrorCode, str]:
        """Whether a member may commit offsets for ``partitions`` (KIP-447 fencing); (NONE, "") if so."""
        member = self.members.get(member_id)
        if member is None:
            return pb.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {self.group_id!r}"
        if member_epoch == member.epoch:
            return pb.NONE, ""
        if (
            member_epoch < member.epoch
            and partitions
            and all(
                member.assigned.get(tp, member.revoking.get(tp, member_epoch + 1)) <= member_epoch for tp in partitions
            )
        ):
            return pb.NONE, ""
        return (
            pb.FENCED_MEMBER_EPOCH,
            f"member epoch {member_epoch} of {member_id!r} is stale (current {member.epoch})",
        )


def _normalise(topics: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return tuple(sorted(set(topics)))
