"""Consumer-group membership as records of ``__consumer_offsets`` (KIP-848's persisted state).

The committed offsets of a group were always in its ``__consumer_offsets``
partition; its membership was in the coordinator's memory only, so a
coordinator failover made every member rejoin and the group rebalance. This
module describes a group as a set of keyed records in the same partition, the
split KIP-848 makes, so a coordinator that loads the partition rebuilds every
group as it was:

    key type 1  (group)            GroupMetadataValue: the group epoch, and the partition
                                   counts of the subscribed topics at the last target
    key type 2  (group, member)    GroupMemberMetadataValue: subscription, session and
                                   rebalance timeouts
    key type 3  (group, member)    GroupTargetAssignmentValue: the member's target
    key type 4  (group, member)    GroupCurrentMemberAssignmentValue: member epoch, previous
                                   epoch, the partitions it was answered (with the epoch since
                                   which it holds each), those it is revoking, those it reported,
                                   the epoch of the last answer that took partitions away

(key type 0 is a committed offset, :mod:`.offsets`; a reader skips types it
does not know.) Keys are packed like the offset keys (``int16`` type, then
``uint16``-length UTF-8 strings); values are protobuf messages
(``proto/sluice/v1/group_records.proto``), serialised deterministically so that
the same state always gives the same bytes.

Writing. The coordinator turns a group into its records before and after a
change (:func:`group_records`) and appends only the difference
(:func:`changed_records`): new or changed values, and a tombstone (null value)
for every key that disappeared, i.e. a member that left, expired or was fenced,
and every key of a group that became empty. The partition is compacted, so a
tombstone is what keeps the state from growing: compaction drops the older
values of the key, then the tombstone itself after ``delete.retention.ms``.
Separate keys per member (not one record per group) keep a steady heartbeat of
one member from rewriting the others.

Loading. :class:`GroupRecordLog` keeps the last value of every group key while
the partition is replayed (last value wins, a tombstone deletes: what
compaction keeps too), and :meth:`GroupRecordLog.groups` decodes them at the end
of the load. Times are not persisted: sessions and revocation deadlines start
at the load (see :meth:`ConsumerGroup.restore`).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import DecodeError

from sluice.api.v1 import group_records_pb2 as gpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.group.membership import ConsumerGroup, GroupSettings, Member
from sluice.broker.topic_partition import TopicPartition
from sluice.records import RecordBatch, decode_records

log = logging.getLogger(__name__)

GROUP_METADATA = 1
MEMBER_METADATA = 2
TARGET_ASSIGNMENT = 3
CURRENT_ASSIGNMENT = 4
KEY_TYPES = frozenset({GROUP_METADATA, MEMBER_METADATA, TARGET_ASSIGNMENT, CURRENT_ASSIGNMENT})

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")

Records = dict[bytes, bytes]  # key -> value of one group (or of every group of a partition)
GroupValue = (
    gpb.GroupMetadataValue
    | gpb.GroupMemberMetadataValue
    | gpb.GroupTargetAssignmentValue
    | gpb.GroupCurrentMemberAssignmentValue
)


class GroupRecordError(ValueError):
    """A group record of ``__consumer_offsets`` that cannot be decoded."""


# -- keys -----------------------------------------------------------------------------------------


def _pack_str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for a __consumer_offsets key")
    return _U16.pack(len(raw)) + raw


def encode_key(kind: int, group_id: str, member_id: str | None = None) -> bytes:
    if kind not in KEY_TYPES:
        raise ValueError(f"unknown group record key type {kind}")
    key = _I16.pack(kind) + _pack_str(group_id)
    if kind != GROUP_METADATA:
        if member_id is None:
            raise ValueError(f"a key of type {kind} names a member")
        key += _pack_str(member_id)
    return key


def decode_key(key: bytes) -> tuple[int, str, str] | None:
    """(type, group id, member id or "") of a group key; None for any other key (an offset key)."""
    try:
        (kind,) = _I16.unpack_from(key, 0)
        if kind not in KEY_TYPES:
            return None
        strings: list[str] = []
        pos = 2
        for _ in range(1 if kind == GROUP_METADATA else 2):
            (n,) = _U16.unpack_from(key, pos)
            pos += 2
            if pos + n > len(key):
                raise GroupRecordError("a string runs past the end of the key")
            strings.append(key[pos : pos + n].decode())
            pos += n
    except (struct.error, UnicodeDecodeError) as exc:
        raise GroupRecordError(f"malformed group key: {exc}") from exc
    return kind, strings[0], strings[1] if len(strings) > 1 else ""


# -- group -> records -----------------------------------------------------------------------------


def _tps(tps: Iterable[TopicPartition]) -> list[pb.TopicPartition]:
    return [pb.TopicPartition(topic=t, partition=p) for t, p in sorted(tps)]


def _held(held: Mapping[TopicPartition, int]) -> list[gpb.HeldPartition]:
    return [gpb.HeldPartition(topic=t, partition=p, since_epoch=e) for (t, p), e in sorted(held.items())]


def group_records(group: ConsumerGroup) -> Records:
    """Every record that describes ``group``; none for an empty group (it is deleted)."""
    if group.is_empty:
        return {}
    gid = group.group_id
    out: Records = {
        encode_key(GROUP_METADATA, gid): gpb.GroupMetadataValue(
            epoch=group.epoch, subscribed_topic_partitions=group.subscribed_sizes
        ).SerializeToString(deterministic=True)
    }
    for mid, m in group.members.items():
        out[encode_key(MEMBER_METADATA, gid, mid)] = gpb.GroupMemberMetadataValue(
            subscribed_topic_names=list(m.subscription),
            session_timeout_ms=m.session_timeout_ms,
            rebalance_timeout_ms=m.rebalance_timeout_ms,
        ).SerializeToString(deterministic=True)
        out[encode_key(TARGET_ASSIGNMENT, gid, mid)] = gpb.GroupTargetAssignmentValue(
            partitions=_tps(group.target.get(mid, frozenset()))
        ).SerializeToString(deterministic=True)
        out[encode_key(CURRENT_ASSIGNMENT, gid, mid)] = gpb.GroupCurrentMemberAssignmentValue(
            member_epoch=m.epoch,
            previous_member_epoch=m.previous_epoch,
            assigned=_held(m.assigned),
            revoking=_held(m.revoking),
            owned=_tps(m.owned),
            revoked_epoch=m.revoked_epoch,
        ).SerializeToString(deterministic=True)
    return out


def changed_records(before: Mapping[bytes, bytes], after: Mapping[bytes, bytes]) -> list[tuple[bytes, bytes | None]]:
    """The records that turn ``before`` into ``after``: changed values, then tombstones."""
    out: list[tuple[bytes, bytes | None]] = [(k, v) for k, v in sorted(after.items()) if before.get(k) != v]
    out.extend((k, None) for k in sorted(before) if k not in after)
    return out


# -- records -> groups (loading) ------------------------------------------------------------------


@dataclass
class _Loading:
    """The decoded records of one group, before it is built."""

    metadata: gpb.GroupMetadataValue | None = None
    members: dict[str, gpb.GroupMemberMetadataValue] = field(default_factory=dict)
    targets: dict[str, gpb.GroupTargetAssignmentValue] = field(default_factory=dict)
    current: dict[str, gpb.GroupCurrentMemberAssignmentValue] = field(default_factory=dict)


def _parse(kind: int, value: bytes) -> GroupValue:
    message: GroupValue
    if kind == GROUP_METADATA:
        message = gpb.GroupMetadataValue()
    elif kind == MEMBER_METADATA:
        message = gpb.GroupMemberMetadataValue()
    elif kind == TARGET_ASSIGNMENT:
        message = gpb.GroupTargetAssignmentValue()
    else:
        message = gpb.GroupCurrentMemberAssignmentValue()
    try:
        message.ParseFromString(value)
    except DecodeError as exc:
        raise GroupRecordError(f"malformed group record value of type {kind}: {exc}") from exc
    return message


def _build(group_id: str, rec: _Loading, settings: GroupSettings, now: float) -> ConsumerGroup:
    if rec.metadata is None:
        raise GroupRecordError("no group metadata record (epoch)")
    members: list[Member] = []
    for mid, meta in sorted(rec.members.items()):
        current = rec.current.get(mid)
        if current is None:
            raise GroupRecordError(f"member {mid!r} has no current-assignment record")
        members.append(
            Member(
                member_id=mid,
                subscription=tuple(meta.subscribed_topic_names),
                session_timeout_ms=meta.session_timeout_ms or settings.session_timeout_ms,
                rebalance_timeout_ms=meta.rebalance_timeout_ms or settings.rebalance_timeout_ms,
                last_seen_ms=now,
                epoch=current.member_epoch,
                previous_epoch=current.previous_member_epoch,
                owned=frozenset((tp.topic, tp.partition) for tp in current.owned),
                assigned={(h.topic, h.partition): h.since_epoch for h in current.assigned},
                revoking={(h.topic, h.partition): h.since_epoch for h in current.revoking},
                revoked_epoch=current.revoked_epoch,
            )
        )
    target = {mid: frozenset((tp.topic, tp.partition) for tp in value.partitions) for mid, value in rec.targets.items()}
    return ConsumerGroup.restore(
        group_id, settings, rec.metadata.epoch, dict(rec.metadata.subscribed_topic_partitions), members, target, now
    )


class GroupRecordLog:
    """The last value of every group key of one partition, as a replay finds them."""

    def __init__(self) -> None:
        self.records: Records = {}

    def replay(self, batch: RecordBatch) -> None:
        """Apply one stored batch; markers and transactional batches hold no group records."""
        if batch.control or batch.transactional:
            return
        for rec in decode_records(batch):
            if rec.key is None or decode_key(rec.key) is None:
                continue
            if rec.value is None:
                self.records.pop(rec.key, None)
            else:
                self.records[rec.key] = rec.value

    def groups(self, settings: GroupSettings, now: float) -> dict[str, ConsumerGroup]:
        """Every group the records describe; a group whose records do not decode is left out (logged)."""
        loading: dict[str, _Loading] = {}
        bad: dict[str, str] = {}
        for key, value in self.records.items():
            try:
                decoded = decode_key(key)
                if decoded is None:
                    continue
                kind, gid, mid = decoded
                rec = loading.setdefault(gid, _Loading())
                message = _parse(kind, value)
            except GroupRecordError as exc:
                log.error("group coordinator: skipping an undecodable group record: %s", exc)
                continue
            if isinstance(message, gpb.GroupMetadataValue):
                rec.metadata = message
            elif isinstance(message, gpb.GroupMemberMetadataValue):
                rec.members[mid] = message
            elif isinstance(message, gpb.GroupTargetAssignmentValue):
                rec.targets[mid] = message
            else:
                rec.current[mid] = message
        out: dict[str, ConsumerGroup] = {}
        for gid, rec in sorted(loading.items()):
            try:
                group = _build(gid, rec, settings, now)
            except GroupRecordError as exc:
                bad[gid] = str(exc)
                continue
            if not group.is_empty:
                out[gid] = group
        for gid, why in bad.items():
            log.error("group coordinator: group %r could not be restored (%s); its members must rejoin", gid, why)
        return out
