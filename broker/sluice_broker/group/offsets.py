"""Committed and pending (transactional) offsets of groups, and their records in ``__consumer_offsets``.

Pure bookkeeping, no I/O: the coordinator appends a record batch, then calls
:meth:`OffsetStore.commit` / :meth:`OffsetStore.stage` with the offsets of the
records it wrote; loading a partition after a restart or failover feeds every
stored batch to :meth:`OffsetStore.replay`, which rebuilds exactly the same
state. Memory is therefore always a function of the log.

Record encoding (all integers big-endian, strings are ``uint16 length`` +
UTF-8)::

    key    int16  type            0 = committed offset (other types are skipped: room to grow)
           string group_id
           string topic
           int32  partition
    value  int16  version         0
           int64  committed_offset
           int32  committed_leader_epoch   -1: unknown
           int64  commit_timestamp         ms since the epoch
           string metadata
    a null value (tombstone) deletes the group's offset for that partition.

Transactions: a TxnOffsetCommit writes the same records in a transactional
batch of the producer (id and epoch). Those offsets are *pending*, kept per
producer id, until the producer's COMMIT marker reaches the partition (they
become committed) or its ABORT marker (they vanish). An offset remembers the
log offset of the record that wrote it (``record_offset``): when a
transaction commits, a pending offset replaces the committed one only if it
was written later, so the last write in log order wins, the same answer a
replay gives (and Kafka's).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace

from sluice.broker.topic_partition import TopicPartition
from sluice.records import RecordBatch, decode_records, parse_control

OFFSET_KEY_TYPE = 0
VALUE_VERSION = 0
METADATA_MAX_BYTES = 4096  # Kafka's offset.metadata.max.bytes default

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_VALUE_HEAD = struct.Struct(">hqiq")


class OffsetRecordError(ValueError):
    """A ``__consumer_offsets`` record that cannot be decoded."""


@dataclass(frozen=True, slots=True)
class OffsetAndMetadata:
    offset: int
    leader_epoch: int = -1
    metadata: str = ""
    commit_timestamp: int = -1
    record_offset: int = -1  # log offset of the record that wrote it (ordering; not encoded)


# -- encoding -------------------------------------------------------------------------------------


def _pack_str(text: str) -> bytes:
    raw = text.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for a __consumer_offsets record")
    return _U16.pack(len(raw)) + raw


def _unpack_str(data: bytes, pos: int) -> tuple[str, int]:
    (n,) = _U16.unpack_from(data, pos)
    pos += 2
    if pos + n > len(data):
        raise OffsetRecordError("string runs past the end of the record")
    return data[pos : pos + n].decode(), pos + n


def encode_key(group_id: str, topic: str, partition: int) -> bytes:
    return _I16.pack(OFFSET_KEY_TYPE) + _pack_str(group_id) + _pack_str(topic) + _I32.pack(partition)


def encode_value(value: OffsetAndMetadata) -> bytes:
    head = _VALUE_HEAD.pack(VALUE_VERSION, value.offset, value.leader_epoch, value.commit_timestamp)
    return head + _pack_str(value.metadata)


def decode_key(key: bytes) -> tuple[str, TopicPartition] | None:
    """(group id, (topic, partition)) of an offset key; None for a key type this version does not know."""
    try:
        (kind,) = _I16.unpack_from(key, 0)
        if kind != OFFSET_KEY_TYPE:
            return None
        group_id, pos = _unpack_str(key, 2)
        topic, pos = _unpack_str(key, pos)
        (partition,) = _I32.unpack_from(key, pos)
    except (struct.error, UnicodeDecodeError) as exc:
        raise OffsetRecordError(f"malformed offset key: {exc}") from exc
    return group_id, (topic, partition)


def decode_value(value: bytes, record_offset: int = -1) -> OffsetAndMetadata:
    try:
        version, offset, leader_epoch, timestamp = _VALUE_HEAD.unpack_from(value, 0)
        if version != VALUE_VERSION:
            raise OffsetRecordError(f"unknown offset value version {version}")
        metadata, _pos = _unpack_str(value, _VALUE_HEAD.size)
    except (struct.error, UnicodeDecodeError) as exc:
        raise OffsetRecordError(f"malformed offset value: {exc}") from exc
    return OffsetAndMetadata(offset, leader_epoch, metadata, timestamp, record_offset)


def offset_records(
    group_id: str, offsets: Iterable[tuple[TopicPartition, OffsetAndMetadata]]
) -> list[tuple[bytes | None, bytes | None]]:
    """The (key, value) records of an offset commit, ready for ``build_batch``."""
    return [(encode_key(group_id, tp[0], tp[1]), encode_value(v)) for tp, v in offsets]


# -- state ----------------------------------------------------------------------------------------


@dataclass
class GroupOffsets:
    """One group's offsets: committed ones, and pending ones per producer id."""

    committed: dict[TopicPartition, OffsetAndMetadata] = field(default_factory=dict)
    pending: dict[int, dict[TopicPartition, OffsetAndMetadata]] = field(default_factory=dict)

    def has_pending(self, tp: TopicPartition) -> bool:
        return any(tp in offsets for offsets in self.pending.values())

    def pending_partitions(self) -> set[TopicPartition]:
        return {tp for offsets in self.pending.values() for tp in offsets}

    def is_empty(self) -> bool:
        return not self.committed and not self.pending


class OffsetStore:
    """The offsets of every group of one ``__consumer_offsets`` partition."""

    def __init__(self) -> None:
        self.groups: dict[str, GroupOffsets] = {}
        self._txn_groups: dict[int, set[str]] = {}  # producer id -> groups with offsets pending for it

    # -- changes --------------------------------------------------------------------------------

    def commit(self, group_id: str, tp: TopicPartition, value: OffsetAndMetadata) -> None:
        """A committed offset; an older write (by record offset) never replaces a newer one."""
        offsets = self.groups.setdefault(group_id, GroupOffsets())
        current = offsets.committed.get(tp)
        if current is None or value.record_offset >= current.record_offset:
            offsets.committed[tp] = value

    def delete(self, group_id: str, tp: TopicPartition) -> None:
        offsets = self.groups.get(group_id)
        if offsets is not None:
            offsets.committed.pop(tp, None)
            self._drop_if_empty(group_id)

    def stage(self, group_id: str, producer_id: int, tp: TopicPartition, value: OffsetAndMetadata) -> None:
        """An offset of producer ``producer_id``'s open transaction: pending until its marker."""
        offsets = self.groups.setdefault(group_id, GroupOffsets())
        offsets.pending.setdefault(producer_id, {})[tp] = value
        self._txn_groups.setdefault(producer_id, set()).add(group_id)

    def end_txn(self, producer_id: int, committed: bool) -> list[str]:
        """Apply a COMMIT/ABORT marker of ``producer_id``; returns the groups it touched."""
        groups = sorted(self._txn_groups.pop(producer_id, ()))
        for group_id in groups:
            offsets = self.groups[group_id]
            staged = offsets.pending.pop(producer_id, {})
            if committed:
                for tp, value in staged.items():
                    self.commit(group_id, tp, value)
            self._drop_if_empty(group_id)
        return groups

    def _drop_if_empty(self, group_id: str) -> None:
        offsets = self.groups.get(group_id)
        if offsets is not None and offsets.is_empty():
            del self.groups[group_id]

    # -- reads ----------------------------------------------------------------------------------

    def committed(self, group_id: str, tp: TopicPartition) -> OffsetAndMetadata | None:
        offsets = self.groups.get(group_id)
        return None if offsets is None else offsets.committed.get(tp)

    def has_pending(self, group_id: str, tp: TopicPartition) -> bool:
        offsets = self.groups.get(group_id)
        return offsets is not None and offsets.has_pending(tp)

    def partitions(self, group_id: str, *, include_pending: bool = False) -> list[TopicPartition]:
        """The group's committed partitions (and pending ones if asked), sorted."""
        offsets = self.groups.get(group_id)
        if offsets is None:
            return []
        tps = set(offsets.committed)
        if include_pending:
            tps |= offsets.pending_partitions()
        return sorted(tps)

    def pending_producers(self) -> list[int]:
        return sorted(self._txn_groups)

    # -- replay ---------------------------------------------------------------------------------

    def replay(self, batch: RecordBatch) -> None:
        """Apply one stored batch (data or control), in log order."""
        if batch.control:
            committed, _coordinator_epoch = parse_control(batch)
            self.end_txn(batch.producer_id, committed)
            return
        for group_id, tp, value in iter_offset_records(batch):
            if value is None:
                self.delete(group_id, tp)
            elif batch.transactional:
                self.stage(group_id, batch.producer_id, tp, value)
            else:
                self.commit(group_id, tp, value)


def iter_offset_records(batch: RecordBatch) -> Iterator[tuple[str, TopicPartition, OffsetAndMetadata | None]]:
    """(group id, partition, value or None for a tombstone) of each offset record of a data batch."""
    for rec in decode_records(batch):
        if rec.key is None:
            continue
        decoded = decode_key(rec.key)
        if decoded is None:
            continue
        group_id, tp = decoded
        value = None if rec.value is None else decode_value(rec.value, rec.offset)
        yield group_id, tp, value


def with_record_offset(value: OffsetAndMetadata, record_offset: int) -> OffsetAndMetadata:
    return replace(value, record_offset=record_offset)
