"""Classic groups as records of ``__consumer_offsets``: Kafka's GroupMetadata record.

One record per classic group, rewritten whole when the leader's assignment of
a new generation is accepted, as Kafka writes it; a tombstone when the group
loses its last member (the partition is compacted, so a group that is gone
leaves nothing behind).

    key    int16  type            5 (Sluice's key types 0-4 are offsets and KIP-848 groups;
                                     Kafka's key version 2 is Sluice's type 2, a KIP-848 member)
           string group_id        uint16 length + UTF-8, like every Sluice key
    value  Kafka's GroupMetadataValue, version 3 (the last non-flexible one), byte for byte:
           int16 version 3, string protocol_type, int32 generation, nullable string protocol,
           nullable string leader, int64 current_state_timestamp, int32 member count, then per
           member: string member_id, nullable string group_instance_id, string client_id,
           string client_host, int32 rebalance_timeout, int32 session_timeout,
           bytes subscription (the chosen protocol's metadata), bytes assignment
           (strings int16 length, -1 for null; bytes int32 length)

Keeping Kafka's value layout means the bytes a member's assignor produced are
stored as Kafka stores them and can be read by anything that knows Kafka's
record; the key stays in Sluice's numbering (a reader of this partition skips
key types it does not know, so offsets and KIP-848 records are untouched).

Loading: :class:`ClassicRecordLog` keeps the last value per group while the
partition is replayed (last value wins, a tombstone deletes) and decodes them
at the end; a value that does not decode is logged and its group left out
(its members rejoin as new ones).
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping

from sluice.broker.group.classic import ClassicGroup, ClassicMember, ClassicSettings
from sluice.records import RecordBatch, decode_records

log = logging.getLogger(__name__)

CLASSIC_GROUP = 5
VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")


class ClassicRecordError(ValueError):
    """A classic group record of ``__consumer_offsets`` that cannot be decoded."""


def encode_key(group_id: str) -> bytes:
    raw = group_id.encode()
    if len(raw) > 0xFFFF:
        raise ValueError(f"group id of {len(raw)} bytes is too long for a __consumer_offsets key")
    return _I16.pack(CLASSIC_GROUP) + _U16.pack(len(raw)) + raw


def decode_key(key: bytes) -> str | None:
    """The group id of a classic group key; None for any other key."""
    try:
        (kind,) = _I16.unpack_from(key, 0)
        if kind != CLASSIC_GROUP:
            return None
        (n,) = _U16.unpack_from(key, 2)
        if 4 + n != len(key):
            raise ClassicRecordError("the group id does not end the key")
        return key[4:].decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise ClassicRecordError(f"malformed classic group key: {exc}") from exc


def _str(text: str | None) -> bytes:
    if text is None:
        return _I16.pack(-1)
    raw = text.encode()
    if len(raw) > 0x7FFF:
        raise ValueError(f"string of {len(raw)} bytes is too long for a group record")
    return _I16.pack(len(raw)) + raw


def _bytes(data: bytes) -> bytes:
    return _I32.pack(len(data)) + data


def encode_value(group: ClassicGroup, assignments: Mapping[str, bytes], timestamp_ms: int) -> bytes:
    """The group with ``assignments`` (member id -> bytes) as Kafka's GroupMetadataValue v3."""
    out = [
        _I16.pack(VALUE_VERSION),
        _str(group.protocol_type or ""),
        _I32.pack(group.generation),
        _str(group.protocol_name),
        _str(group.leader),
        _I64.pack(timestamp_ms),
        _I32.pack(len(group.members)),
    ]
    for m in group.members.values():
        out += [
            _str(m.member_id),
            _str(m.group_instance_id),
            _str(m.client_id),
            _str(m.client_host),
            _I32.pack(m.rebalance_timeout_ms),
            _I32.pack(m.session_timeout_ms),
            _bytes(m.metadata(group.protocol_name)),
            _bytes(assignments.get(m.member_id, b"")),
        ]
    return b"".join(out)


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def _take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ClassicRecordError("a field runs past the end of the value")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def int(self, fmt: struct.Struct) -> int:
        (value,) = fmt.unpack(self._take(fmt.size))
        return int(value)

    def str(self) -> str | None:
        n = self.int(_I16)
        return None if n == -1 else self._take(n).decode()

    def bytes(self) -> bytes:
        return self._take(self.int(_I32))


def decode_value(group_id: str, value: bytes, settings: ClassicSettings, now: float) -> ClassicGroup:
    try:
        r = _Reader(value)
        version = r.int(_I16)
        if version != VALUE_VERSION:
            raise ClassicRecordError(f"group metadata value version {version} is not {VALUE_VERSION}")
        protocol_type = r.str() or ""
        generation = r.int(_I32)
        protocol, leader = r.str(), r.str()
        r.int(_I64)  # current_state_timestamp: informative
        count = r.int(_I32)
        if count < 0:
            raise ClassicRecordError(f"negative member count {count}")
        members: list[ClassicMember] = []
        for _ in range(count):
            member_id, instance_id, client_id, client_host = r.str(), r.str(), r.str(), r.str()
            rebalance_timeout, session_timeout = r.int(_I32), r.int(_I32)
            subscription, assignment = r.bytes(), r.bytes()
            if member_id is None or client_id is None or client_host is None:
                raise ClassicRecordError("a member's id, client id or host is null")
            members.append(
                ClassicMember(
                    member_id,
                    instance_id,
                    client_id,
                    client_host,
                    session_timeout,
                    rebalance_timeout,
                    protocol_type,
                    ((protocol or "", subscription),),
                    now,
                    assignment=assignment,
                )
            )
        if r.pos != len(value):
            raise ClassicRecordError(f"{len(value) - r.pos} bytes after the group metadata value")
    except (struct.error, UnicodeDecodeError) as exc:
        raise ClassicRecordError(f"malformed group metadata value: {exc}") from exc
    return ClassicGroup.restore(group_id, settings, generation, protocol_type, protocol, leader, members, now)


class ClassicRecordLog:
    """The last classic group record of every group of one partition, as a replay finds them."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def replay(self, batch: RecordBatch) -> None:
        if batch.control or batch.transactional:
            return
        for rec in decode_records(batch):
            if rec.key is None:
                continue
            try:
                group_id = decode_key(rec.key)
            except ClassicRecordError as exc:
                log.error("group coordinator: skipping an undecodable classic group key: %s", exc)
                continue
            if group_id is None:
                continue
            if rec.value is None:
                self.values.pop(group_id, None)
            else:
                self.values[group_id] = rec.value

    def groups(self, settings: ClassicSettings, now: float) -> dict[str, ClassicGroup]:
        out: dict[str, ClassicGroup] = {}
        for group_id, value in sorted(self.values.items()):
            try:
                group = decode_value(group_id, value, settings, now)
            except ClassicRecordError as exc:
                log.error("group coordinator: classic group %r could not be restored (%s)", group_id, exc)
                continue
            if not group.is_empty:
                out[group_id] = group
        return out
