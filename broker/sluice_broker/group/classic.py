"""Kafka's classic consumer-group protocol: the coordinator's state machine for one group.

The classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup: what
kafka-python, librdkafka's default and Kafka's tools speak) is a rendezvous:
the broker only collects the members, elects a leader and hands the leader's
assignment out; the *client* leader runs the assignor (range, roundrobin,
cooperative-sticky) over the members' opaque protocol metadata. This module is
that rendezvous, pure like :mod:`.membership`: no I/O, no futures, ``now``
passed in. The coordinator (:mod:`.classic_coordinator`) parks a request's
future per member and completes it with what a call here returns.

States, as Kafka's ``ClassicGroup``::

    Empty --join--> PreparingRebalance --all rejoined or deadline--> CompletingRebalance
      ^                  ^    |                                          | leader's SyncGroup
      |                  |    +--no member left--> Empty                 v   written
      |                  +-----member joins, leaves, expires, changes-- Stable

* **Join phase.** A JoinGroup parks until every known member has rejoined (and
  no member id handed out by MEMBER_ID_REQUIRED is still outstanding) or the
  largest rebalance timeout of the members has passed; members that did not
  rejoin are then removed. The first rebalance of an empty group waits
  ``group.initial.rebalance.delay.ms`` more per joining member (up to the
  rebalance timeout), so a starting fleet forms one generation, not many.
  Completing it bumps the generation, chooses the protocol (each member votes
  for its most preferred one among those every member supports), keeps the
  leader if it rejoined (else the first member), and answers every parked
  JoinGroup; only the leader gets the members' metadata.
* **Sync phase.** SyncGroups park until the leader's assignment is written
  (:meth:`ClassicGroup.sync` says so; the coordinator writes the group record
  and then calls :meth:`ClassicGroup.assignment_written`), and then each gets
  its member's bytes; a member that has not sent SyncGroup within the
  rebalance timeout is removed. Stable from then on.
* **Heartbeats** keep a member's session alive and tell it to rejoin
  (REBALANCE_IN_PROGRESS) while the group prepares a rebalance; another
  generation is ILLEGAL_GENERATION, a stranger UNKNOWN_MEMBER_ID. A member
  parked in JoinGroup or SyncGroup cannot heartbeat (the same connection
  waits), so its session does not run out meanwhile: the phase deadlines
  bound it instead.
* **Member ids** (KIP-394): from JoinGroup v4 an unknown member is given an id
  with MEMBER_ID_REQUIRED and joins again with it; the id is pending for one
  session timeout. A ``group_instance_id`` (KIP-345 static membership) maps to
  one member id: a new join with the instance id replaces the old member (its
  parked requests answered FENCED_INSTANCE_ID), and a request naming the
  instance with another member id is fenced (offset commits included). In a
  Stable group, a static member that comes back with the same protocols takes
  its assignment back without a rebalance (KIP-345's point: a rolling restart
  of static members moves no partition); the group record is written with the
  new member id before the JoinGroup is answered (``Effects.store``), and a
  static leader is told to skip the assignment (KIP-814).
* **Offsets** (:meth:`ClassicGroup.check_commit`): Kafka's rule, a member of the
  current generation commits; the group being mid-rebalance refuses plain
  commits (REBALANCE_IN_PROGRESS) but not transactional ones (KIP-447: the
  producer's transaction is what fences).

What is persisted (:mod:`.classic_records`) is the group as of its last
written assignment: generation, protocol, leader, members with the chosen
protocol's metadata and their assignment. A coordinator that loads it starts
the group Stable at that generation, so after a failover members keep
heartbeating and committing as before; times are not persisted (sessions
restart at the load).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.config import BrokerConfig

# Bounds on what a member may make the coordinator keep and write (Kafka bounds them only by the
# record size of __consumer_offsets; a clear refusal at the door is better than a failed write).
MAX_PROTOCOLS = 64
PROTOCOL_METADATA_MAX_BYTES = 1024 * 1024  # every protocol's metadata of one member, together
ASSIGNMENT_MAX_BYTES = 1024 * 1024  # one member's assignment
NAME_MAX_BYTES = 0x7FFF  # member, instance, client ids, protocol names: int16-length strings in the record


class ClassicState(StrEnum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class ClassicSettings:
    min_session_timeout_ms: int = 6_000
    max_session_timeout_ms: int = 1_800_000
    initial_rebalance_delay_ms: int = 3_000
    max_size: int = 1_000

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ClassicSettings:
        return cls(
            min_session_timeout_ms=config.int("group.min.session.timeout.ms"),
            max_session_timeout_ms=config.int("group.max.session.timeout.ms"),
            initial_rebalance_delay_ms=config.int("group.initial.rebalance.delay.ms"),
            max_size=config.int("group.classic.max.size"),
        )


Protocols = tuple[tuple[str, bytes], ...]  # (name, metadata) in the member's order of preference


@dataclass(frozen=True)
class JoinInput:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    require_known_member_id: bool  # JoinGroup v4+ (KIP-394)


@dataclass(frozen=True)
class JoinResult:
    error: int
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    members: tuple[tuple[str, str | None, bytes], ...] = ()  # the leader's: (member id, instance id, metadata)
    # a static leader back in a Stable group (KIP-814, JoinGroup v9+): the assignment stands, compute none
    skip_assignment: bool = False


@dataclass(frozen=True)
class SyncResult:
    error: int
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass
class Effects:
    """What a change means for requests parked elsewhere, and whether the group record must be written."""

    joins: dict[str, JoinResult] = field(default_factory=dict)  # member id -> answer of its parked JoinGroup
    syncs: dict[str, SyncResult] = field(default_factory=dict)  # member id -> answer of its parked SyncGroup
    removed: list[tuple[str, str]] = field(default_factory=list)  # (member id, why)
    emptied: bool = False  # the group lost its last member: delete its record
    store: bool = False  # the members changed without a rebalance (a static member's new id): write the record


@dataclass
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    last_seen_ms: float
    assignment: bytes = b""
    awaiting_join: bool = False  # a JoinGroup of this member is parked
    awaiting_sync: bool = False  # a SyncGroup of this member is parked

    def protocol_names(self) -> list[str]:
        return [name for name, _ in self.protocols]

    def metadata(self, protocol: str | None) -> bytes:
        return next((meta for name, meta in self.protocols if name == protocol), b"")

    def vote(self, candidates: set[str]) -> str:
        return next(name for name, _ in self.protocols if name in candidates)


def _refusal(error: int, member_id: str) -> JoinResult:
    return JoinResult(error, member_id)


def validate_join(join: JoinInput, settings: ClassicSettings) -> tuple[int, str]:
    """Kafka's checks of a JoinGroup that need no group; (NONE, "") when it passes."""
    s = settings
    if not s.min_session_timeout_ms <= join.session_timeout_ms <= s.max_session_timeout_ms:
        return (
            pb.INVALID_SESSION_TIMEOUT,
            f"session timeout {join.session_timeout_ms} ms is outside [{s.min_session_timeout_ms}, "
            f"{s.max_session_timeout_ms}] (group.min/max.session.timeout.ms)",
        )
    if not join.protocol_type or not join.protocols:
        return pb.INCONSISTENT_GROUP_PROTOCOL, "a JoinGroup needs a protocol type and at least one protocol"
    if len(join.protocols) > MAX_PROTOCOLS:
        return pb.INVALID_REQUEST, f"at most {MAX_PROTOCOLS} protocols per member"
    names = [name for name, _ in join.protocols]
    if len(set(names)) != len(names):
        return pb.INVALID_REQUEST, "a protocol is named twice"
    if sum(len(meta) for _, meta in join.protocols) > PROTOCOL_METADATA_MAX_BYTES:
        return pb.INVALID_REQUEST, f"the protocols' metadata is larger than {PROTOCOL_METADATA_MAX_BYTES} bytes"
    texts = [join.member_id, join.group_instance_id or "", join.client_id, join.client_host, join.protocol_type]
    if any(len(t.encode()) > NAME_MAX_BYTES for t in [*texts, *names]):
        return pb.INVALID_REQUEST, f"an id or a protocol name is longer than {NAME_MAX_BYTES} bytes"
    return pb.NONE, ""


class ClassicGroup:
    def __init__(
        self,
        group_id: str,
        settings: ClassicSettings,
        new_member_id: Callable[[str], str] = lambda prefix: f"{prefix}-{uuid.uuid4()}",
    ) -> None:
        self.group_id = group_id
        self.settings = settings
        self.state = ClassicState.EMPTY
        self.generation = 0
        self.protocol_type: str | None = None
        self.protocol_name: str | None = None
        self.leader: str | None = None
        self.members: dict[str, ClassicMember] = {}  # in join order: the first is the next leader
        self.pending: dict[str, float] = {}  # member ids given with MEMBER_ID_REQUIRED -> deadline
        self.static: dict[str, str] = {}  # group instance id -> member id
        self.pending_sync: set[str] = set()  # members that got this generation's JoinGroup answer, no SyncGroup yet
        self.deadline_ms: float | None = None  # join phase: when it completes; sync phase: when laggards go
        self.initial_limit_ms: float | None = None  # first rebalance of an empty group: the delay's cap
        self.proposed: dict[str, bytes] | None = None  # the leader's assignment, being written
        self.state_since_ms: float = 0.0
        self._new_member_id = new_member_id

    # -- views ----------------------------------------------------------------------------------

    @property
    def is_empty(self) -> bool:
        """No member (pending member ids are not members): the group may change type or be dropped."""
        return not self.members

    @property
    def is_gone(self) -> bool:
        """Nothing left to keep in memory."""
        return not self.members and not self.pending

    def _candidates(self) -> set[str]:
        members = list(self.members.values())
        if not members:
            return set()
        common = set(members[0].protocol_names())
        for m in members[1:]:
            common &= set(m.protocol_names())
        return common

    def supports(self, protocol_type: str, names: Iterable[str]) -> bool:
        """Kafka's rule: an empty group takes any; else the same type and a protocol every member has."""
        if self.is_empty:
            return bool(protocol_type)
        return protocol_type == self.protocol_type and bool(self._candidates() & set(names))

    def _leader_members(self) -> tuple[tuple[str, str | None, bytes], ...]:
        return tuple((m.member_id, m.group_instance_id, m.metadata(self.protocol_name)) for m in self.members.values())

    def _answer(self, member_id: str, *, skip_assignment: bool = False) -> JoinResult:
        leader = member_id == self.leader
        return JoinResult(
            pb.NONE,
            member_id,
            self.generation,
            self.protocol_type,
            self.protocol_name,
            self.leader or "",
            self._leader_members() if leader else (),
            skip_assignment=skip_assignment and leader,
        )

    def _set_state(self, state: ClassicState, now: float) -> None:
        self.state = state
        self.state_since_ms = now

    # -- JoinGroup ------------------------------------------------------------------------------

    def join(self, join: JoinInput, now: float) -> tuple[str, JoinResult | None, Effects]:
        """A JoinGroup: (member id, an immediate answer or None, effects).

        None: the member's JoinGroup parks until an ``Effects.joins`` answers it
        (maybe the effects returned here: the join phase may complete at once).
        """
        fx = Effects()
        names = [name for name, _ in join.protocols]
        if self.state is ClassicState.DEAD:
            return join.member_id, _refusal(pb.COORDINATOR_NOT_AVAILABLE, join.member_id), fx
        if not join.member_id:
            if not self.supports(join.protocol_type, names):
                return "", _refusal(pb.INCONSISTENT_GROUP_PROTOCOL, ""), fx
            instance = join.group_instance_id
            existing = self.static.get(instance) if instance is not None else None
            if existing is None and len(self.members) + len(self.pending) >= self.settings.max_size:
                return "", _refusal(pb.GROUP_MAX_SIZE_REACHED, ""), fx
            member_id = self._new_member_id(instance if instance is not None else join.client_id)
            if existing is not None:
                old = self.members[existing]
                unchanged = old.protocols == join.protocols and old.protocol_type == join.protocol_type
                self._replace_static(existing, member_id, join, now, fx)
                if self.state is ClassicState.STABLE and unchanged:
                    # KIP-345: a restarted static member takes its old assignment back without a
                    # rebalance; the group record names the new member id before it is answered.
                    self.members[member_id].awaiting_join = False
                    fx.store = True
                    return member_id, self._answer(member_id, skip_assignment=True), fx
            elif instance is None and join.require_known_member_id:
                self.pending[member_id] = now + join.session_timeout_ms
                return member_id, _refusal(pb.MEMBER_ID_REQUIRED, member_id), fx
            else:
                self._add(member_id, join, now)
            return member_id, None, self._rebalance(now, fx)

        member_id = join.member_id
        if member_id in self.pending:
            if join.group_instance_id is not None:
                return member_id, _refusal(pb.INVALID_REQUEST, member_id), fx  # a pending member id is never static
            if not self.supports(join.protocol_type, names):
                return member_id, _refusal(pb.INCONSISTENT_GROUP_PROTOCOL, member_id), fx
            del self.pending[member_id]
            self._add(member_id, join, now)
            return member_id, None, self._rebalance(now, fx)
        error = self._validate_member(member_id, join.group_instance_id)
        if error != pb.NONE:
            return member_id, _refusal(error, member_id), fx
        if not self.supports(join.protocol_type, names):
            return member_id, _refusal(pb.INCONSISTENT_GROUP_PROTOCOL, member_id), fx
        member = self.members[member_id]
        same = member.protocols == join.protocols
        if self.state is ClassicState.COMPLETING_REBALANCE and same:
            return member_id, self._answer(member_id), fx  # its JoinGroup answer was lost: the same again
        if self.state is ClassicState.STABLE and same and member_id != self.leader:
            return member_id, self._answer(member_id), fx  # nothing changed: sync again
        # PreparingRebalance, changed metadata, or the leader (it rejoins to rebalance, e.g. for new topics);
        # a JoinGroup of the member still parked is the coordinator's to answer (it holds the futures)
        self._update(member, join, now)
        return member_id, None, self._rebalance(now, fx)

    def _add(self, member_id: str, join: JoinInput, now: float) -> None:
        if self.is_empty:
            self.protocol_type = join.protocol_type
        member = ClassicMember(
            member_id,
            join.group_instance_id,
            join.client_id,
            join.client_host,
            join.session_timeout_ms,
            join.rebalance_timeout_ms,
            join.protocol_type,
            join.protocols,
            now,
            awaiting_join=True,
        )
        self.members[member_id] = member
        if join.group_instance_id is not None:
            self.static[join.group_instance_id] = member_id
        if self.leader is None:
            self.leader = member_id
        if self.state is ClassicState.PREPARING_REBALANCE and self.initial_limit_ms is not None:
            # the initial delay restarts with every new member, up to the rebalance timeout
            self.deadline_ms = min(now + self.settings.initial_rebalance_delay_ms, self.initial_limit_ms)

    def _update(self, member: ClassicMember, join: JoinInput, now: float) -> None:
        member.protocols = join.protocols
        member.session_timeout_ms = join.session_timeout_ms
        member.rebalance_timeout_ms = join.rebalance_timeout_ms
        member.client_id, member.client_host = join.client_id, join.client_host
        member.last_seen_ms = now
        member.awaiting_join = True

    def _replace_static(self, old_id: str, new_id: str, join: JoinInput, now: float, fx: Effects) -> None:
        """A static member restarted: the new member id takes the instance over; the old one is fenced."""
        old = self.members.pop(old_id)
        if old.awaiting_join:
            fx.joins[old_id] = _refusal(pb.FENCED_INSTANCE_ID, old_id)
        if old.awaiting_sync:
            fx.syncs[old_id] = SyncResult(pb.FENCED_INSTANCE_ID)
        self.pending_sync.discard(old_id)
        was_leader = self.leader == old_id
        self.leader = None if was_leader else self.leader
        self._add(new_id, join, now)
        self.members[new_id].assignment = old.assignment
        if was_leader:
            self.leader = new_id

    def _rebalance(self, now: float, fx: Effects) -> Effects:
        """A member joined or changed: prepare a rebalance (unless one is being prepared), maybe complete it."""
        if self.state is not ClassicState.PREPARING_REBALANCE:
            self._prepare_rebalance(now, fx)
        self._maybe_complete_join(now, fx)
        return fx

    def _prepare_rebalance(self, now: float, fx: Effects) -> None:
        if self.state is ClassicState.COMPLETING_REBALANCE:
            for m in self.members.values():  # the leader's assignment will not come for this generation
                m.assignment = b""
        for m in self.members.values():
            if m.awaiting_sync:
                fx.syncs[m.member_id] = SyncResult(pb.REBALANCE_IN_PROGRESS)
                m.awaiting_sync = False
        self.pending_sync.clear()
        self.proposed = None
        initial = self.state is ClassicState.EMPTY
        timeout = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        if initial:
            self.initial_limit_ms = now + timeout
            self.deadline_ms = min(now + self.settings.initial_rebalance_delay_ms, self.initial_limit_ms)
        else:
            self.initial_limit_ms = None
            self.deadline_ms = now + timeout
        self._set_state(ClassicState.PREPARING_REBALANCE, now)

    def _all_joined(self) -> bool:
        return not self.pending and all(m.awaiting_join for m in self.members.values())

    def _maybe_complete_join(self, now: float, fx: Effects) -> None:
        if self.state is ClassicState.PREPARING_REBALANCE and self.initial_limit_ms is None and self._all_joined():
            self._complete_join(now, fx)

    def _complete_join(self, now: float, fx: Effects) -> None:
        for m in [m for m in self.members.values() if not m.awaiting_join]:
            self._remove(m.member_id, "did not rejoin within the rebalance timeout", fx)
        self.initial_limit_ms = None
        self.generation += 1
        if self.is_empty:
            self.protocol_name = self.leader = None
            self.deadline_ms = None
            self._set_state(ClassicState.EMPTY, now)
            fx.emptied = True
            return
        candidates = self._candidates()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = m.vote(candidates)
            votes[choice] = votes.get(choice, 0) + 1
        # the most votes; a tie goes to the leader's preference (deterministic, unlike a hash map's order)
        leader = self.members.get(self.leader or "") or next(iter(self.members.values()))
        self.leader = leader.member_id
        rank = {name: i for i, name in enumerate(leader.protocol_names())}
        self.protocol_name = max(votes, key=lambda name: (votes[name], -rank.get(name, len(rank))))
        self._set_state(ClassicState.COMPLETING_REBALANCE, now)
        self.deadline_ms = now + max(m.rebalance_timeout_ms for m in self.members.values())
        for m in self.members.values():
            m.awaiting_join = False
            m.last_seen_ms = now
            fx.joins[m.member_id] = self._answer(m.member_id)
        self.pending_sync = set(self.members)

    # -- SyncGroup ------------------------------------------------------------------------------

    def sync(
        self,
        member_id: str,
        instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
        now: float,
    ) -> tuple[SyncResult | None, bool]:
        """A SyncGroup: an immediate answer, or None (it parks); True when the leader's assignment is to be written."""
        if self.state is ClassicState.DEAD:
            return SyncResult(pb.COORDINATOR_NOT_AVAILABLE), False
        error = self._validate_member(member_id, instance_id)
        if error != pb.NONE:
            return SyncResult(error), False
        if generation != self.generation:
            return SyncResult(pb.ILLEGAL_GENERATION), False
        if (protocol_type is not None and protocol_type != self.protocol_type) or (
            protocol_name is not None and protocol_name != self.protocol_name
        ):
            return SyncResult(pb.INCONSISTENT_GROUP_PROTOCOL), False
        member = self.members[member_id]
        member.last_seen_ms = now
        if self.state is ClassicState.PREPARING_REBALANCE:
            return SyncResult(pb.REBALANCE_IN_PROGRESS), False
        self.pending_sync.discard(member_id)
        if self.state is ClassicState.STABLE:
            return self._synced(member), False
        # CompletingRebalance: wait for the leader's assignment to be written
        member.awaiting_sync = True
        if member_id == self.leader and self.proposed is None:
            self.proposed = {mid: assignments.get(mid, b"") for mid in self.members}
            return None, True
        return None, False

    def _synced(self, member: ClassicMember) -> SyncResult:
        return SyncResult(pb.NONE, member.assignment, self.protocol_type, self.protocol_name)

    def assignment_written(self, generation: int, now: float) -> Effects:
        """The leader's assignment of ``generation`` is in the log: Stable, every parked SyncGroup answered."""
        fx = Effects()
        if self.generation != generation or self.state is not ClassicState.COMPLETING_REBALANCE or not self.proposed:
            return fx  # a rebalance started meanwhile: the parked SyncGroups were answered by it
        for mid, member in self.members.items():
            member.assignment = self.proposed.get(mid, b"")
        self.proposed = None
        self._set_state(ClassicState.STABLE, now)
        for member in self.members.values():
            if member.awaiting_sync:
                member.awaiting_sync = False
                fx.syncs[member.member_id] = self._synced(member)
        # members that have not sent SyncGroup yet keep the sync deadline
        if not self.pending_sync:
            self.deadline_ms = None
        return fx

    def assignment_failed(self, generation: int, error: int, now: float) -> Effects:
        """The write of the leader's assignment failed: the parked SyncGroups get ``error``, and members rejoin."""
        fx = Effects()
        if self.generation != generation or self.state is not ClassicState.COMPLETING_REBALANCE:
            return fx
        for member in self.members.values():
            if member.awaiting_sync:
                member.awaiting_sync = False
                fx.syncs[member.member_id] = SyncResult(error)
        self._prepare_rebalance(now, fx)
        return fx

    # -- Heartbeat, LeaveGroup ------------------------------------------------------------------

    def heartbeat(self, member_id: str, instance_id: str | None, generation: int, now: float) -> int:
        if self.state is ClassicState.DEAD:
            return pb.COORDINATOR_NOT_AVAILABLE
        error = self._validate_member(member_id, instance_id)
        if error != pb.NONE:
            return error
        if generation != self.generation:
            return pb.ILLEGAL_GENERATION
        self.members[member_id].last_seen_ms = now
        if self.state is ClassicState.PREPARING_REBALANCE:
            return pb.REBALANCE_IN_PROGRESS
        return pb.NONE

    def leave(self, leaving: list[tuple[str, str | None]], now: float) -> tuple[list[int], Effects]:
        """LeaveGroup of (member id, instance id) pairs (v3+ batches them); an error per member."""
        fx = Effects()
        codes: list[int] = []
        for member_id, instance_id in leaving:
            if not member_id and instance_id is not None:
                member_id = self.static.get(instance_id, "")
            if member_id in self.pending and instance_id is None:
                del self.pending[member_id]
                codes.append(pb.NONE)
                continue
            error = self._validate_member(member_id, instance_id)
            codes.append(error)
            if error == pb.NONE:
                self._remove(member_id, "left the group", fx)
        self._after_removal(now, fx)
        return codes, fx

    # -- expiry ---------------------------------------------------------------------------------

    def expire(self, now: float) -> Effects:
        """Sessions that ran out, member ids never used, and phases past their deadline."""
        fx = Effects()
        for member_id, deadline in list(self.pending.items()):
            if now > deadline:
                del self.pending[member_id]
        for m in list(self.members.values()):
            if not m.awaiting_join and not m.awaiting_sync and now - m.last_seen_ms > m.session_timeout_ms:
                self._remove(m.member_id, f"no heartbeat within {m.session_timeout_ms} ms", fx)
        if self.deadline_ms is not None and now >= self.deadline_ms:
            if self.state is ClassicState.PREPARING_REBALANCE:
                self._complete_join(now, fx)
                return fx
            if self.state in (ClassicState.COMPLETING_REBALANCE, ClassicState.STABLE):
                for member_id in sorted(self.pending_sync):
                    if member_id in self.members:
                        self._remove(member_id, "sent no SyncGroup within the rebalance timeout", fx)
                self.pending_sync.clear()
                self.deadline_ms = None
        self._after_removal(now, fx)
        return fx

    # -- members --------------------------------------------------------------------------------

    def _validate_member(self, member_id: str, instance_id: str | None) -> int:
        if instance_id is not None:
            known = self.static.get(instance_id)
            if known is None:
                return pb.UNKNOWN_MEMBER_ID
            if known != member_id:
                return pb.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return pb.UNKNOWN_MEMBER_ID
        return pb.NONE

    def _remove(self, member_id: str, why: str, fx: Effects) -> None:
        member = self.members.pop(member_id, None)
        if member is None:
            return
        if member.group_instance_id is not None and self.static.get(member.group_instance_id) == member_id:
            del self.static[member.group_instance_id]
        if member.awaiting_join:
            fx.joins[member_id] = _refusal(pb.UNKNOWN_MEMBER_ID, member_id)
        if member.awaiting_sync:
            fx.syncs[member_id] = SyncResult(pb.UNKNOWN_MEMBER_ID)
        self.pending_sync.discard(member_id)
        if self.leader == member_id:
            self.leader = next(iter(self.members), None)
        fx.removed.append((member_id, why))

    def _after_removal(self, now: float, fx: Effects) -> None:
        """What removals (of members or pending ids) mean: a rebalance, or the join phase's completion."""
        if fx.removed and self.state in (ClassicState.STABLE, ClassicState.COMPLETING_REBALANCE):
            self._prepare_rebalance(now, fx)
        self._maybe_complete_join(now, fx)

    # -- offsets --------------------------------------------------------------------------------

    def check_commit(
        self, member_id: str, generation: int, *, transactional: bool, instance_id: str | None = None
    ) -> tuple[int, str]:
        """Kafka's ClassicGroup offset-commit rule (KIP-447 for transactional ones); (NONE, "") if allowed.

        A static member's commit names its instance id: one another member id holds now is a
        zombie's (its instance restarted and replaced it): FENCED_INSTANCE_ID, as Kafka answers.
        """
        if not member_id and self.is_empty:
            return pb.NONE, ""  # from outside the group (assign(), admin tools): only while it has no members
        if member_id and instance_id is not None:
            error = self._validate_member(member_id, instance_id)
            if error != pb.NONE:
                return error, f"group {self.group_id!r}: member {member_id!r} does not hold instance {instance_id!r}"
        if member_id:
            if member_id not in self.members:
                return pb.UNKNOWN_MEMBER_ID, f"member {member_id!r} is not in group {self.group_id!r}"
            if generation != self.generation:
                return (
                    pb.ILLEGAL_GENERATION,
                    f"generation {generation} of group {self.group_id!r} is not the current {self.generation}",
                )
        elif not transactional:
            return pb.UNKNOWN_MEMBER_ID, f"group {self.group_id!r} has members: commit with a member id and generation"
        if not transactional and self.state is ClassicState.COMPLETING_REBALANCE:
            return pb.REBALANCE_IN_PROGRESS, f"group {self.group_id!r} is completing a rebalance: commit after it"
        return pb.NONE, ""

    # -- persistence ----------------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        group_id: str,
        settings: ClassicSettings,
        generation: int,
        protocol_type: str,
        protocol_name: str | None,
        leader: str | None,
        members: list[ClassicMember],
        now: float,
    ) -> ClassicGroup:
        """The group as its record describes it (Stable at its generation); sessions start at ``now``."""
        group = cls(group_id, settings)
        group.generation = generation
        group.protocol_type = protocol_type
        group.protocol_name = protocol_name
        for m in members:
            m.last_seen_ms = now
            group.members[m.member_id] = m
            if m.group_instance_id is not None:
                group.static[m.group_instance_id] = m.member_id
        group.leader = leader if leader in group.members else next(iter(group.members), None)
        group._set_state(ClassicState.STABLE if members else ClassicState.EMPTY, now)
        return group
