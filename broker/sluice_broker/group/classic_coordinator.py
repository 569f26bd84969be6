"""The classic group protocol's orchestration: parked requests, writes, expiry.

:mod:`.classic` decides; this module holds what the decisions need around
them, on the broker's one asyncio loop:

* **Parked requests.** A JoinGroup or SyncGroup that must wait for other
  members awaits a future keyed by (group, member); the state machine's
  :class:`~.classic.Effects` say which futures to complete with what. A
  request's future is registered before the effects of its own call are
  applied, since the call itself may complete the phase. A second request
  of the same member replaces its parked one, which is answered
  REBALANCE_IN_PROGRESS (the client retried on a new connection). Every wait
  is bounded (the member's rebalance timeout plus the initial delay and a
  margin) even though the phase deadlines should answer it first: a request
  is never parked forever.
* **Writes.** The leader's SyncGroup writes the group record
  (:mod:`.classic_records`) to the group's ``__consumer_offsets`` partition and
  waits for the high watermark to cover it before any member gets its
  assignment, so an assignment a member acts on survives a coordinator
  failover; a failed write answers the parked SyncGroups with the coordinator
  error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE: retriable) and the group
  rebalances. A group that loses its last member gets a tombstone.
* **One group, one type.** A classic JoinGroup for a group that has KIP-848
  members is INCONSISTENT_GROUP_PROTOCOL; the KIP-848 heartbeat refuses a
  group with classic members (:meth:`GroupCoordinator.heartbeat`). Empty
  groups of either kind may change type: they keep only their offsets.
* **Expiry** runs in the coordinator's periodic sweep (:meth:`expire`):
  sessions, unused member ids, and join/sync deadlines.
* **Unloading** (leadership moved) answers every parked request of the
  partition's groups NOT_COORDINATOR; the members find the new coordinator,
  which loaded the groups from their records.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.classic import (
    ASSIGNMENT_MAX_BYTES,
    ClassicGroup,
    ClassicSettings,
    ClassicState,
    Effects,
    JoinInput,
    JoinResult,
    SyncResult,
    validate_join,
)
from sluice.broker.group.classic_records import encode_key, encode_value
from sluice.errors import SluiceError
from sluice.records import now_ms

if TYPE_CHECKING:
    from sluice.broker.group.coordinator import GroupCoordinator, OffsetsPartitionState

log = logging.getLogger(__name__)

_WAIT_MARGIN_S = 30.0
T = TypeVar("T")
Key = tuple[str, str]  # (group id, member id)


@dataclass(frozen=True)
class DescribedMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes


@dataclass(frozen=True)
class Described:
    """A group as DescribeGroups answers it; ``error`` for a group that is not a classic one or not here."""

    group_id: str
    error: int = pb.NONE
    message: str = ""
    state: str = ""
    protocol_type: str = ""
    protocol_name: str = ""
    members: tuple[DescribedMember, ...] = ()


def _code(exc: SluiceError) -> int:
    return int(pb.NOT_COORDINATOR if exc.code == pb.NOT_LEADER_OR_FOLLOWER else exc.code)


class ClassicCoordinator:
    def __init__(self, coordinator: GroupCoordinator) -> None:
        self.coordinator = coordinator
        self.settings = ClassicSettings.from_config(coordinator.config)
        self._joins: dict[Key, asyncio.Future[JoinResult]] = {}
        self._syncs: dict[Key, asyncio.Future[SyncResult]] = {}

    def _now(self) -> float:
        return self.coordinator.clock()

    # -- JoinGroup ------------------------------------------------------------------------------

    async def join(self, group_id: str, join: JoinInput) -> JoinResult:
        try:
            state = self.coordinator.locate(group_id)
        except SluiceError as exc:
            return JoinResult(_code(exc), join.member_id)
        code, message = validate_join(join, self.settings)
        if code != pb.NONE:
            log.info("group %r: JoinGroup of %r refused: %s", group_id, join.member_id or join.client_id, message)
            return JoinResult(code, join.member_id)
        other = state.consumer_group(group_id)
        if other is not None and not other.is_empty:
            log.info("group %r: classic JoinGroup refused, the group has KIP-848 members", group_id)
            return JoinResult(pb.INCONSISTENT_GROUP_PROTOCOL, join.member_id)
        group = state.classic_group(group_id)
        if group is None:  # new, or it was an empty consumer group: it becomes a classic one
            group = state.groups[group_id] = ClassicGroup(group_id, self.settings)
        superseded = self._joins.pop((group_id, join.member_id), None) if join.member_id else None
        generation = group.generation
        member_id, result, fx = group.join(join, self._now())
        _complete(superseded, JoinResult(pb.REBALANCE_IN_PROGRESS, join.member_id))
        waiter: asyncio.Future[JoinResult] | None = None
        if result is None:
            waiter = self._joins[(group_id, member_id)] = asyncio.get_running_loop().create_future()
        self._apply(state, group, fx)
        if result is not None:
            if fx.store:
                return await self._store_members(state, group, result)
            return result
        assert waiter is not None
        bound = (join.rebalance_timeout_ms + self.settings.initial_rebalance_delay_ms) / 1000 + _WAIT_MARGIN_S
        answer = await self._wait(self._joins, (group_id, member_id), waiter, bound)
        if answer is None:
            log.warning("group %r: JoinGroup of %s unanswered after %.0f s", group_id, member_id, bound)
            return JoinResult(pb.REBALANCE_IN_PROGRESS, member_id)
        if answer.error == pb.NONE and answer.generation != generation and answer.leader == member_id:
            log.info(
                "group %r: generation %d, leader %s, protocol %s, %d member(s)",
                group_id, answer.generation, answer.leader, answer.protocol_name, len(group.members),
            )  # fmt: skip
        return answer

    # -- SyncGroup ------------------------------------------------------------------------------

    async def sync(
        self,
        group_id: str,
        member_id: str,
        instance_id: str | None,
        generation: int,
        protocol_type: str | None,
        protocol_name: str | None,
        assignments: Mapping[str, bytes],
    ) -> SyncResult:
        try:
            state = self.coordinator.locate(group_id)
        except SluiceError as exc:
            return SyncResult(_code(exc))
        if any(len(a) > ASSIGNMENT_MAX_BYTES for a in assignments.values()):
            log.info("group %r: SyncGroup of %s refused: an assignment above %d bytes", group_id, member_id,
                     ASSIGNMENT_MAX_BYTES)  # fmt: skip
            return SyncResult(pb.INVALID_REQUEST)
        group = state.classic_group(group_id)
        if group is None:
            return SyncResult(pb.UNKNOWN_MEMBER_ID)
        key = (group_id, member_id)
        superseded = self._syncs.pop(key, None)
        result, write = group.sync(
            member_id, instance_id, generation, protocol_type, protocol_name, assignments, self._now()
        )
        _complete(superseded, SyncResult(pb.REBALANCE_IN_PROGRESS))
        if result is not None:
            return result
        waiter: asyncio.Future[SyncResult] = asyncio.get_running_loop().create_future()
        self._syncs[key] = waiter
        if write:
            await self._write_assignment(state, group)
        bound = max((m.rebalance_timeout_ms for m in group.members.values()), default=0) / 1000 + _WAIT_MARGIN_S
        answer = await self._wait(self._syncs, key, waiter, bound)
        return SyncResult(pb.REBALANCE_IN_PROGRESS) if answer is None else answer

    async def _write_assignment(self, state: OffsetsPartitionState, group: ClassicGroup) -> None:
        """Write the leader's assignment, wait for the ISR, then make the group Stable (or rebalance)."""
        generation = group.generation
        proposed = dict(group.proposed or {})
        try:
            self._append(state, group.group_id, encode_value(group, proposed, now_ms()))
            await self.coordinator.await_committed(state)
        except SluiceError as exc:
            log.warning("group %r: writing generation %d failed (%s): rebalancing", group.group_id, generation, exc)
            self._apply(state, group, group.assignment_failed(generation, _code(exc), self._now()))
            return
        self._apply(state, group, group.assignment_written(generation, self._now()))

    async def _store_members(self, state: OffsetsPartitionState, group: ClassicGroup, answer: JoinResult) -> JoinResult:
        """Write the group with a static member's new id (no rebalance), then answer its JoinGroup.

        Until the record is in the ISR a coordinator failover would restore the old member id;
        the member's answer waits for it, as Kafka's does. A failed write answers the error
        (retriable: the member joins again, with its instance id, and replaces itself again).
        """
        assignments = {mid: m.assignment for mid, m in group.members.items()}
        try:
            self._append(state, group.group_id, encode_value(group, assignments, now_ms()))
            await self.coordinator.await_committed(state)
        except SluiceError as exc:
            log.warning("group %r: writing static member %s failed (%s)", group.group_id, answer.member_id, exc)
            return JoinResult(_code(exc), answer.member_id)
        log.info("group %r: static member %s rejoined without a rebalance", group.group_id, answer.member_id)
        return answer

    def _append(self, state: OffsetsPartitionState, group_id: str, value: bytes | None) -> None:
        self.coordinator.append_group_records(state, group_id, [(encode_key(group_id), value)])

    # -- Heartbeat, LeaveGroup ------------------------------------------------------------------

    def heartbeat(self, group_id: str, member_id: str, instance_id: str | None, generation: int) -> int:
        try:
            state = self.coordinator.locate(group_id)
        except SluiceError as exc:
            return _code(exc)
        group = state.classic_group(group_id)
        if group is None:
            return pb.UNKNOWN_MEMBER_ID  # also a KIP-848 group: this member is not a classic one of it
        return group.heartbeat(member_id, instance_id, generation, self._now())

    def leave(self, group_id: str, leaving: list[tuple[str, str | None]]) -> tuple[int, list[int]]:
        """(error of the whole request, error per member)."""
        try:
            state = self.coordinator.locate(group_id)
        except SluiceError as exc:
            return _code(exc), []
        group = state.classic_group(group_id)
        if group is None:
            return pb.NONE, [pb.UNKNOWN_MEMBER_ID for _ in leaving]
        codes, fx = group.leave(leaving, self._now())
        self._apply(state, group, fx)
        return pb.NONE, codes

    # -- DescribeGroups, ListGroups --------------------------------------------------------------

    def describe(self, group_id: str) -> Described:
        try:
            state = self.coordinator.locate(group_id)
        except SluiceError as exc:
            return Described(group_id, _code(exc), exc.message)
        group = state.classic_group(group_id)
        if group is not None and not group.is_empty:
            stable = group.state is ClassicState.STABLE
            members = tuple(
                DescribedMember(
                    m.member_id,
                    m.group_instance_id,
                    m.client_id,
                    m.client_host,
                    m.metadata(group.protocol_name) if stable else b"",
                    m.assignment if stable else b"",
                )
                for m in group.members.values()
            )
            return Described(
                group_id,
                state=group.state.value,
                protocol_type=group.protocol_type or "",
                protocol_name=(group.protocol_name or "") if stable else "",
                members=members,
            )
        kip848 = state.consumer_group(group_id)
        if kip848 is not None and not kip848.is_empty:
            return Described(group_id, pb.GROUP_ID_NOT_FOUND, f"group {group_id!r} is not a classic group")
        if group_id in state.offsets.groups or group is not None:
            return Described(group_id, state=ClassicState.EMPTY.value)
        return Described(group_id, pb.GROUP_ID_NOT_FOUND, f"group {group_id!r} does not exist")

    def listing(self) -> dict[str, str]:
        """Group id -> state of every classic group with members in the partitions loaded here."""
        out: dict[str, str] = {}
        for cpart in self.coordinator.runtime.active_partitions():
            for group_id, group in cpart.state.classic_groups():
                if not group.is_empty:
                    out[group_id] = group.state.value
        return out

    # -- effects, expiry, unloading -------------------------------------------------------------

    def _apply(self, state: OffsetsPartitionState, group: ClassicGroup, fx: Effects) -> None:
        gid = group.group_id
        for member_id, joined in fx.joins.items():
            _complete(self._joins.pop((gid, member_id), None), joined)
        for member_id, synced in fx.syncs.items():
            _complete(self._syncs.pop((gid, member_id), None), synced)
        for member_id, why in fx.removed:
            log.info("group %r: removed member %s (%s)", gid, member_id, why)
        if fx.emptied:
            log.info("group %r: no member left (generation %d)", gid, group.generation)
            try:
                self._append(state, gid, None)  # the group's record goes; its offsets stay
            except SluiceError as exc:
                log.warning("group %r: the tombstone of its record was not written (%s)", gid, exc)
        if group.is_gone and state.groups.get(gid) is group:
            del state.groups[gid]

    def expire(self, now: float) -> None:
        for cpart in self.coordinator.runtime.active_partitions():
            state = cpart.state
            for _gid, group in state.classic_groups():
                self._apply(state, group, group.expire(now))

    def on_unloaded(self, state: OffsetsPartitionState) -> None:
        """The partition moved: its parked requests are answered NOT_COORDINATOR, its groups dropped."""
        gone = {gid for gid, _group in state.classic_groups()}
        for key in [k for k in self._joins if k[0] in gone]:
            _complete(self._joins.pop(key), JoinResult(pb.NOT_COORDINATOR, key[1]))
        for key in [k for k in self._syncs if k[0] in gone]:
            _complete(self._syncs.pop(key), SyncResult(pb.NOT_COORDINATOR))
        for gid in gone:
            del state.groups[gid]

    @staticmethod
    async def _wait(
        waiters: dict[Key, asyncio.Future[T]], key: Key, waiter: asyncio.Future[T], bound_s: float
    ) -> T | None:
        try:
            return await asyncio.wait_for(asyncio.shield(waiter), bound_s)
        except TimeoutError:
            if waiters.get(key) is waiter:
                del waiters[key]
            return None


def _complete(waiter: asyncio.Future[T] | None, value: T) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(value)
