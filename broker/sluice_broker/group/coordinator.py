"""The group coordinator: offsets and membership of the groups this broker coordinates.

The coordinator of a group is the leader of partition
``crc32(group_id) % n`` of ``__consumer_offsets``. This module is the
orchestration around two pure parts: :mod:`.offsets` (what is committed or
pending, and the record format) and :mod:`.membership` (members, epochs,
assignment). Everything here is I/O and routing:

* Leadership and loading are the coordinator runtime's
  (:mod:`sluice.broker.coordination.runtime`): it loads a ``__consumer_offsets``
  partition when this broker becomes its leader, answers
  COORDINATOR_LOAD_IN_PROGRESS until the replay reached the end of the log,
  retries a load that failed, and unloads on resignation. This class is its
  shard: it replays offset records (and the transactional ones with their
  COMMIT/ABORT markers) into an :class:`OffsetsPartitionState`. The marker
  listener is registered in ``on_loaded``, the same synchronous step that
  finishes the replay, so no marker is applied twice or missed: markers written
  while loading are in the log the replay is still reading. Unloading drops the
  partition's groups (members included): NOT_COORDINATOR from then on.
* Writes. An offset commit is one record batch appended to the group's
  partition with ``append_internal`` (synchronous, atomic); memory changes only
  after the append succeeded, with the record offsets the log assigned.
* Transactions. TxnOffsetCommit first asks the transaction coordinator
  (``replicas.txn_verifier``) that the partition is in the producer's open
  transaction, then re-checks everything that may have changed during that
  await (leadership, membership) before appending a transactional batch with
  the producer's id and epoch: the partition fences stale epochs
  (PRODUCER_FENCED). The offsets stay pending until the marker arrives.
* Membership (KIP-848). A heartbeat changes a *copy* of the group
  (:meth:`ConsumerGroup.clone`); what changed is appended as group records
  (:mod:`.group_records`: epoch, member metadata, target and current
  assignments, tombstones for members and groups that are gone) and only once
  the append succeeded does the copy replace the group. The answer waits until
  the partition's high watermark covers everything appended so far (this
  write, and any other whose state the answer reflects), so a member is never
  told an epoch or partitions that a failover could lose. Loading the
  partition rebuilds the groups from those records: after a failover members
  keep their ids, epochs and partitions, and their sessions restart at the load.
* Sessions. A periodic task removes members whose session expired, and writes
  their tombstones the same way.
* Kafka's classic protocol (JoinGroup/SyncGroup over the Kafka listener) is
  :mod:`.classic` (the state machine) and :mod:`.classic_coordinator` (parked
  requests, writes); its groups live next to the KIP-848 ones in the same
  partition state, share the offsets, and a group is one type at a time: a
  KIP-848 heartbeat for a group with classic members is GROUP_ID_NOT_FOUND,
  as Kafka 4 answers when the online upgrade is off. Commits from classic
  members follow Kafka's ClassicGroup rule (:meth:`ClassicGroup.check_commit`).

Concurrency: one asyncio loop. The only await inside a request is the
verifier's; all state changes happen in synchronous stretches after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.coordination import CoordinatorPartition, CoordinatorRuntime
from sluice.broker.errors import answer
from sluice.broker.group.api import (
    CommitOffset,
    FetchedOffset,
    HeartbeatAnswer,
    OffsetCommitInput,
    OffsetFetchAnswer,
    OffsetFetchInput,
    PartitionAnswer,
    TxnOffsetCommitInput,
)
from sluice.broker.group.classic import ClassicGroup
from sluice.broker.group.classic_coordinator import ClassicCoordinator
from sluice.broker.group.classic_records import ClassicRecordLog
from sluice.broker.group.group_records import GroupRecordError, GroupRecordLog, changed_records, group_records
from sluice.broker.group.membership import ConsumerGroup, GroupSettings, HeartbeatInput
from sluice.broker.group.offsets import (
    METADATA_MAX_BYTES,
    OffsetAndMetadata,
    OffsetRecordError,
    OffsetStore,
    offset_records,
    with_record_offset,
)
from sluice.broker.log.partition import PartitionLog
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.topic_partition import TopicPartition
from sluice.errors import SluiceError
from sluice.records import RecordBatch, RecordDecodeError, build_batch, now_ms

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # monotonic milliseconds
MarkerListener = Callable[[PartitionLog, int, bool, int], None]

GROUP_ID_MAX_BYTES = 0xFFFF


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


@dataclass(eq=False)
class OffsetsPartitionState:
    """The groups of one ``__consumer_offsets`` partition this broker leads (the shard's state)."""

    partition: int
    coordinator_epoch: int  # the leader epoch it was loaded at: its writes are valid only while we lead at it
    offsets: OffsetStore = field(default_factory=OffsetStore)
    # Every group with members (or, classic, with members joining), of either kind: one id, one
    # group. A group changes kind only while empty, and its records are tombstoned when it
    # empties, so a replay never brings back the old kind.
    groups: dict[str, ConsumerGroup | ClassicGroup] = field(default_factory=dict)
    group_log: GroupRecordLog = field(default_factory=GroupRecordLog)  # consumer group records, while loading
    classic_log: ClassicRecordLog = field(default_factory=ClassicRecordLog)  # classic group records, while loading
    log: PartitionLog | None = None  # where the marker listener is registered, once loaded
    marker_listener: MarkerListener | None = None

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        """The group, if it is a consumer (KIP-848) group."""
        group = self.groups.get(group_id)
        return group if isinstance(group, ConsumerGroup) else None

    def classic_group(self, group_id: str) -> ClassicGroup | None:
        """The group, if it is a classic (JoinGroup/SyncGroup) group."""
        group = self.groups.get(group_id)
        return group if isinstance(group, ClassicGroup) else None

    def consumer_groups(self) -> list[tuple[str, ConsumerGroup]]:
        return [(gid, g) for gid, g in self.groups.items() if isinstance(g, ConsumerGroup)]

    def classic_groups(self) -> list[tuple[str, ClassicGroup]]:
        return [(gid, g) for gid, g in self.groups.items() if isinstance(g, ClassicGroup)]


OffsetsPartition = CoordinatorPartition[OffsetsPartitionState]  # a __consumer_offsets partition led here


@dataclass
class _Item:
    """One partition of a commit request, and what becomes of it."""

    topic: str
    partition: int
    value: OffsetAndMetadata | None = None
    code: pb.ErrorCode = pb.NONE
    message: str = ""

    def fail(self, code: pb.ErrorCode, message: str) -> None:
        if self.code == pb.NONE:
            self.code, self.message = code, message


class GroupCoordinator:
    """Offsets and membership RPCs; a shard of the coordinator runtime."""

    def __init__(
        self,
        replicas: ReplicaManager,
        cluster: ClusterView,
        config: BrokerConfig,
        *,
        clock: Clock = _monotonic_ms,
    ) -> None:
        self.replicas = replicas
        self.cluster = cluster
        self.config = config
        self.settings = GroupSettings.from_config(config)
        self.clock = clock
        self.runtime: CoordinatorRuntime[OffsetsPartitionState] = CoordinatorRuntime(
            CONSUMER_OFFSETS_TOPIC, self, replicas, cluster, config
        )
        self._running = False
        self._expiry_task: asyncio.Task[None] | None = None
        self.classic = ClassicCoordinator(self)

    # -- life cycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        self._running = True
        await self.runtime.start()
        self._expiry_task = asyncio.create_task(self._expiry_loop(), name="group-session-expiry")

    async def stop(self) -> None:
        self._running = False
        expiry = self._expiry_task
        if expiry is not None:
            expiry.cancel()
        await self.runtime.stop()
        if expiry is not None:
            await asyncio.gather(expiry, return_exceptions=True)
        self._expiry_task = None

    def is_ready(self) -> bool:
        """Every ``__consumer_offsets`` partition this broker leads is loaded."""
        return self.runtime.is_ready()

    def partition_for(self, group_id: str) -> int | None:
        """The ``__consumer_offsets`` partition of a group (None while the topic does not exist)."""
        return self.runtime.partition_for(group_id)

    # -- the shard: replaying __consumer_offsets (the runtime loads and unloads) ------------------

    def new_state(self, partition: int, coordinator_epoch: int) -> OffsetsPartitionState:
        return OffsetsPartitionState(partition, coordinator_epoch)

    def replay(self, state: OffsetsPartitionState, partition: int, batch: RecordBatch) -> None:
        try:
            state.group_log.replay(batch)
        except (GroupRecordError, RecordDecodeError) as exc:
            log.error(
                "group coordinator: skipping group records of the batch at offset %d of %s-%d: %s",
                batch.base_offset,
                CONSUMER_OFFSETS_TOPIC,
                partition,
                exc,
            )
        try:
            state.classic_log.replay(batch)
        except RecordDecodeError as exc:
            log.error(
                "group coordinator: skipping classic group records of the batch at offset %d of %s-%d: %s",
                batch.base_offset,
                CONSUMER_OFFSETS_TOPIC,
                partition,
                exc,
            )
        try:
            state.offsets.replay(batch)
        except (OffsetRecordError, RecordDecodeError) as exc:
            # One bad batch must not keep every group of the partition unavailable.
            log.error(
                "group coordinator: skipping undecodable batch at offset %d of %s-%d: %s",
                batch.base_offset,
                CONSUMER_OFFSETS_TOPIC,
                partition,
                exc,
            )

    def on_loaded(self, loaded: OffsetsPartition) -> None:
        """Listen for markers from now on: called in the step that ended the replay, so none is missed."""
        part = self.replicas.partitions[(CONSUMER_OFFSETS_TOPIC, loaded.partition)]

        def listener(_part: PartitionLog, pid: int, committed: bool, _offset: int) -> None:
            self._on_marker(loaded, pid, committed)

        part.marker_listeners.append(listener)
        loaded.state.log, loaded.state.marker_listener = part, listener
        # The groups, with their sessions starting now: a full session timeout to find this coordinator.
        state = loaded.state
        consumer = state.group_log.groups(self.settings, self.clock())
        classic = state.classic_log.groups(self.classic.settings, self.clock())
        state.group_log, state.classic_log = GroupRecordLog(), ClassicRecordLog()  # only needed for the load
        for gid in sorted(consumer.keys() & classic.keys()):
            # Cannot happen while kinds change only when empty (tombstones): say so, keep the consumer group.
            log.error("group coordinator: group %r restored as both a consumer and a classic group", gid)
        state.groups = {**classic, **consumer}
        if classic:
            log.info(
                "group coordinator: %s-%d restored %d classic group(s): %s",
                CONSUMER_OFFSETS_TOPIC,
                loaded.partition,
                len(classic),
                ", ".join(f"{gid}@{g.generation}" for gid, g in sorted(classic.items())),
            )
        if consumer:
            log.info(
                "group coordinator: %s-%d restored %d group(s) with %d member(s): %s",
                CONSUMER_OFFSETS_TOPIC,
                loaded.partition,
                len(consumer),
                sum(len(g.members) for g in consumer.values()),
                ", ".join(f"{gid}@{g.epoch}" for gid, g in sorted(consumer.items())),
            )

    def on_unloaded(self, unloaded: OffsetsPartition) -> None:
        """Drop the partition's groups (members included): NOT_COORDINATOR from now on."""
        state = unloaded.state
        if state.log is not None and state.marker_listener is not None:
            with contextlib.suppress(ValueError):
                state.log.marker_listeners.remove(state.marker_listener)
        self.classic.on_unloaded(state)
        state.groups.clear()

    def summary(self, state: OffsetsPartitionState) -> str:
        return (
            f"{len(state.offsets.groups)} groups with offsets, {len(state.groups)} with members, "
            f"{len(state.offsets.pending_producers())} producers with pending offsets"
        )

    def _on_marker(self, cpart: OffsetsPartition, producer_id: int, committed: bool) -> None:
        if not self.runtime.is_current(cpart):
            return
        groups = cpart.state.offsets.end_txn(producer_id, committed)
        if groups:
            log.debug(
                "group coordinator: %s of producer %d applied to groups %s",
                "COMMIT" if committed else "ABORT",
                producer_id,
                groups,
            )

    def locate(self, group_id: str) -> OffsetsPartitionState:
        """The loaded state of the group's partition, or the error a client should see (raised)."""
        return self._locate(group_id)

    def _locate(self, group_id: str) -> OffsetsPartitionState:
        """The loaded state of the group's partition, or the error a client should see."""
        if not group_id:
            raise errors.InvalidGroupIdError("the group id must not be empty")
        if len(group_id.encode()) > GROUP_ID_MAX_BYTES:
            # a string of every key of the group in __consumer_offsets (uint16 length): the format's bound
            raise errors.InvalidGroupIdError(f"a group id must be at most {GROUP_ID_MAX_BYTES} bytes of UTF-8")
        if not self._running:
            raise errors.CoordinatorNotAvailableError("the group coordinator is not running")
        partition = self.partition_for(group_id)
        if partition is None:
            raise errors.CoordinatorNotAvailableError(f"{CONSUMER_OFFSETS_TOPIC} does not exist yet")
        return self.runtime.active(partition, f"group {group_id!r}").state

    # -- offset commits -------------------------------------------------------------------------

    def _items(self, offsets: Iterable[CommitOffset]) -> list[_Item]:
        """One item per requested partition, validated; valid ones carry the value to write."""
        now = now_ms()
        items: list[_Item] = []
        for o in offsets:
            info = self.cluster.topics.get(o.topic)
            item = _Item(o.topic, o.partition)
            items.append(item)
            if info is None or not 0 <= o.partition < len(info.partitions):
                item.fail(pb.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic or partition {o.topic}-{o.partition}")
            elif o.offset < 0:
                item.fail(pb.INVALID_REQUEST, f"committed offset {o.offset} must be >= 0")
            elif len(o.metadata.encode()) > METADATA_MAX_BYTES:
                item.fail(pb.INVALID_REQUEST, f"offset metadata is longer than {METADATA_MAX_BYTES} bytes")
            else:
                item.value = OffsetAndMetadata(o.offset, o.leader_epoch, o.metadata, now)
        return items

    def _append(
        self, state: OffsetsPartitionState, group_id: str, items: list[_Item], **header: int | bool
    ) -> int | None:
        """Append the valid items as one batch; returns its base offset (None: nothing written)."""
        valid = [i for i in items if i.code == pb.NONE and i.value is not None]
        if not valid:
            return None
        batch = build_batch(
            offset_records(group_id, [((i.topic, i.partition), i.value) for i in valid if i.value]), **header
        )
        try:
            return self.runtime.append(
                state.partition, state.coordinator_epoch, batch, f"the offsets of group {group_id!r}"
            )
        except SluiceError as exc:
            for item in valid:
                item.fail(exc.code, exc.message)
        return None

    @staticmethod
    def _written(items: list[_Item], base_offset: int) -> list[tuple[TopicPartition, OffsetAndMetadata]]:
        """(partition, value with its record offset) of the items just written at ``base_offset``."""
        valid = [i for i in items if i.code == pb.NONE and i.value is not None]
        return [
            ((i.topic, i.partition), with_record_offset(i.value, base_offset + n))
            for n, i in enumerate(valid)
            if i.value
        ]

    @staticmethod
    def _fail_all(items: list[_Item], code: pb.ErrorCode, message: str) -> None:
        for item in items:
            item.fail(code, message)

    @staticmethod
    def _answers(items: list[_Item]) -> list[PartitionAnswer]:
        return [PartitionAnswer(item.topic, item.partition, item.code, item.message) for item in items]

    async def offset_commit(self, req: OffsetCommitInput) -> list[PartitionAnswer]:
        """Commit offsets; an answer per partition, in the order asked."""
        items = self._items(req.offsets)
        try:
            state = self._locate(req.group_id)
            group = state.consumer_group(req.group_id)
            classic = state.classic_group(req.group_id)
            if classic is not None and not classic.is_empty:
                code, message = classic.check_commit(
                    req.member_id, req.member_epoch, transactional=False, instance_id=req.instance_id
                )
                if code != pb.NONE:
                    raise errors.error_for(code, message)
            elif req.member_id:
                if group is None:
                    raise errors.UnknownMemberIdError(f"member {req.member_id!r} is not in group {req.group_id!r}")
                code, message = group.check_commit(
                    req.member_id, req.member_epoch, [(i.topic, i.partition) for i in items]
                )
                if code != pb.NONE:
                    raise errors.error_for(code, message)
            elif group is not None and not group.is_empty:
                # Kafka's rule: commits from outside the group only while it has no members.
                raise errors.UnknownMemberIdError(
                    f"group {req.group_id!r} has active members: commit with a member id and epoch",
                )
        except SluiceError as exc:
            self._fail_all(items, exc.code, exc.message)
        else:
            base = self._append(state, req.group_id, items)
            if base is not None:
                for tp, value in self._written(items, base):
                    state.offsets.commit(req.group_id, tp, value)
                await self._await_replication(state, items)
        return self._answers(items)

    async def txn_offset_commit(self, txn: TxnOffsetCommitInput) -> list[PartitionAnswer]:
        """Stage offsets in a transaction; an answer per partition, in the order asked."""
        items = self._items(txn.commit.offsets)
        try:
            await self._txn_offset_commit(txn, items)
        except SluiceError as exc:
            self._fail_all(items, exc.code, exc.message)
        return self._answers(items)

    async def _txn_offset_commit(self, txn: TxnOffsetCommitInput, items: list[_Item]) -> None:
        req = txn.commit
        state = self._locate(req.group_id)
        if not txn.transactional_id:
            raise errors.InvalidRequestError("TxnOffsetCommit needs a transactional id")
        if txn.producer_id <= 0 or not 0 <= txn.producer_epoch <= 32767:
            raise errors.InvalidRequestError(
                f"producer id {txn.producer_id} / epoch {txn.producer_epoch} are not a valid producer",
            )
        if all(i.code != pb.NONE for i in items):
            return
        verifier = self.replicas.txn_verifier
        if verifier is None:
            raise errors.CoordinatorNotAvailableError("the transaction coordinator is not running")
        try:
            verdict, message = await verifier(
                txn.transactional_id, txn.producer_id, txn.producer_epoch, CONSUMER_OFFSETS_TOPIC, state.partition
            )
        except Exception as exc:
            log.exception("group coordinator: transaction verification failed for %r", txn.transactional_id)
            raise errors.CoordinatorNotAvailableError(f"cannot verify the transaction: {exc}") from exc
        if verdict != pb.NONE:
            raise errors.error_for(verdict, message)
        # The await may have seen leadership or membership change: check again from here on, synchronously.
        if self._locate(req.group_id) is not state:
            raise errors.NotCoordinatorError(f"the coordinator of group {req.group_id!r} moved")
        classic = state.classic_group(req.group_id)
        if classic is not None and not classic.is_empty:
            code, message = classic.check_commit(
                req.member_id, req.member_epoch, transactional=True, instance_id=req.instance_id
            )
            if code != pb.NONE:
                raise errors.error_for(code, message)
        elif req.member_id:
            group = state.consumer_group(req.group_id)
            if group is None:
                raise errors.UnknownMemberIdError(f"member {req.member_id!r} is not in group {req.group_id!r}")
            code, message = group.check_commit(req.member_id, req.member_epoch, [(i.topic, i.partition) for i in items])
            if code != pb.NONE:
                raise errors.error_for(code, message)
        base = self._append(
            state,
            req.group_id,
            items,
            producer_id=txn.producer_id,
            producer_epoch=txn.producer_epoch,
            base_sequence=-1,
            transactional=True,
        )
        if base is not None:
            for tp, value in self._written(items, base):
                state.offsets.stage(req.group_id, txn.producer_id, tp, value)
            await self._await_replication(state, items)

    async def _await_replication(self, state: OffsetsPartitionState, items: list[_Item]) -> None:
        """acks=all for the offsets log: answer once the ISR has the write.

        Memory was updated right after the append, so it always mirrors this
        leader's log (a marker may arrive at any await); a write that fails to
        replicate is reported to the client, which retries.
        """
        try:
            await self.runtime.wait_committed(state.partition, "the offsets")
        except SluiceError as exc:
            for item in items:
                if item.code == pb.NONE:
                    item.fail(exc.code, exc.message)

    # -- offset fetch ---------------------------------------------------------------------------

    async def offset_fetch(self, req: OffsetFetchInput) -> OffsetFetchAnswer:
        resp = OffsetFetchAnswer()
        try:
            state = self._locate(req.group_id)
        except SluiceError as exc:
            answer(resp, exc)
            return resp
        offsets = state.offsets
        if req.partitions is not None:
            tps = list(req.partitions)
        else:
            tps = offsets.partitions(req.group_id, include_pending=req.require_stable)
        for tp in tps:
            out = FetchedOffset(tp[0], tp[1])
            resp.partitions.append(out)
            if req.require_stable and offsets.has_pending(req.group_id, tp):
                out.error_code = pb.UNSTABLE_OFFSET_COMMIT
                out.error_message = (
                    f"group {req.group_id!r} has offsets for {tp[0]}-{tp[1]} pending in an open transaction"
                )
                continue
            value = offsets.committed(req.group_id, tp)
            if value is not None:
                out.offset, out.leader_epoch, out.metadata = value.offset, value.leader_epoch, value.metadata
        return resp

    # -- membership -----------------------------------------------------------------------------

    def _topic_sizes(self) -> dict[str, int]:
        return {name: len(info.partitions) for name, info in self.cluster.topics.items()}

    async def member_heartbeat(self, group_id: str, hb: HeartbeatInput) -> HeartbeatAnswer:
        """One KIP-848 heartbeat, whichever protocol carried it (gRPC, or the Kafka listener's)."""
        resp = HeartbeatAnswer(hb.member_id, hb.member_epoch, self.settings.heartbeat_interval_ms)
        try:
            state = self._locate(group_id)
        except SluiceError as exc:
            answer(resp, exc)
            return resp
        classic = state.classic_group(group_id)
        if classic is not None and not classic.is_empty:
            resp.error_code = pb.GROUP_ID_NOT_FOUND
            resp.error_message = (
                f"group {group_id!r} is a classic group with members (JoinGroup/SyncGroup): "
                "it becomes a consumer group only once empty"
            )
            return resp
        current = state.consumer_group(group_id)  # an empty classic group of this id is replaced
        group = current.clone() if current is not None else ConsumerGroup(group_id, self.settings)
        before = group.epoch
        result = group.heartbeat(hb, self._topic_sizes(), self.clock())
        try:
            self._persist(state, current, group)
        except SluiceError as exc:
            answer(resp, exc)
            return resp
        if group.epoch != before:
            self.replicas.events.group_epochs_bumped(group.epoch - before)
            log.info(
                "group %r: epoch %d -> %d (member %s, epoch %d: %s), %d members",
                group_id,
                before,
                group.epoch,
                result.member_id or "-",
                hb.member_epoch,
                pb.ErrorCode.Name(result.error),
                len(group.members),
            )
        try:
            await self._await_committed(state)
        except SluiceError as exc:
            answer(resp, exc)
            return resp
        resp.error_code, resp.error_message = result.error, result.message
        resp.member_id, resp.member_epoch = result.member_id, result.member_epoch
        resp.assignment = list(result.assignment)
        return resp

    def _persist(self, state: OffsetsPartitionState, current: ConsumerGroup | None, changed: ConsumerGroup) -> None:
        """Write what ``changed`` changed of ``current`` (None: a new group), then make it the group.

        Synchronous: nothing else runs between the append and the swap. If the
        append fails the group stays as it was (the error, mapped to a
        coordinator error, is for the caller to answer).
        """
        gid = changed.group_id
        records = changed_records(group_records(current) if current is not None else {}, group_records(changed))
        if records:
            self.runtime.append(
                state.partition, state.coordinator_epoch, build_batch(records), f"the state of group {gid!r}"
            )
        if not changed.is_empty:
            state.groups[gid] = changed
        elif current is not None and state.groups.get(gid) is current:
            del state.groups[gid]

    def append_group_records(
        self, state: OffsetsPartitionState, group_id: str, records: list[tuple[bytes, bytes | None]]
    ) -> None:
        """Append records of a group (synchronously); a failure is raised as the coordinator error."""
        self.runtime.append(
            state.partition, state.coordinator_epoch, build_batch(records), f"the state of group {group_id!r}"
        )

    async def await_committed(self, state: OffsetsPartitionState) -> None:
        """Wait until the ISR has everything appended to the partition (raises the coordinator error)."""
        await self._await_committed(state)

    async def _await_committed(self, state: OffsetsPartitionState) -> None:
        """Wait until the high watermark covers the log end: the state an answer reflects is replicated."""
        await self.runtime.wait_committed(state.partition, "the group state")

    async def _expiry_loop(self) -> None:
        s = self.settings
        interval = min(max(min(s.heartbeat_interval_ms, s.min_session_timeout_ms) / 4000, 0.05), 1.0)
        while True:
            await asyncio.sleep(interval)
            try:
                self.expire_sessions()
            except Exception:
                log.exception("group coordinator: session expiry failed")

    def expire_sessions(self) -> None:
        """Remove members whose session expired (or that did not revoke in time), in every group.

        The removal is written (tombstones, the new epoch and target) before it
        takes effect; a failed write leaves the group as it was, for the next round.
        """
        now = self.clock()
        self.classic.expire(now)
        sizes: dict[str, int] | None = None
        for cpart in self.runtime.active_partitions():
            state = cpart.state
            for group_id, current in state.consumer_groups():
                if sizes is None:
                    sizes = self._topic_sizes()
                group = current.clone()
                removed = group.expire(sizes, now)
                if not removed:
                    continue
                try:
                    self._persist(state, current, group)
                except SluiceError as exc:
                    log.warning("group %r: expiring %d member(s) not written (%s)", group_id, len(removed), exc)
                    continue
                for member_id, reason in removed:
                    log.info("group %r: removed member %s (%s); epoch now %d", group_id, member_id, reason, group.epoch)
                self.replicas.events.group_epochs_bumped(group.epoch - current.epoch)
