"""The consumer protocol's bytes: what a classic group's members subscribe to and were assigned.

A Kafka consumer in a classic group (protocol type ``consumer``) puts its subscription in
JoinGroup's protocol metadata and gets its assignment in SyncGroup's answer, each a
ConsumerProtocolSubscription / ConsumerProtocolAssignment prefixed with an int16 version
(codecs generated from Kafka's definitions, like the requests). The broker never needs them to
run the group (Kafka's neither: the leader's assignor reads them); it reads them only to describe
a group to whoever asks over gRPC (``sluice consumer-groups describe``).

Bytes of a newer version than the generated codec knows are read as the newest known one, as
Kafka's ConsumerProtocol does: versions only add fields at the end. Bytes that do not decode
(another protocol type's, a client's garbage) describe nothing: None, never an error.
"""

from __future__ import annotations

import struct

from sluice.broker.kafka_wire.codec import DecodeError, Message, Reader, decode_from
from sluice.broker.kafka_wire.messages.consumer_protocol_assignment import ConsumerProtocolAssignment
from sluice.broker.kafka_wire.messages.consumer_protocol_subscription import ConsumerProtocolSubscription

CONSUMER = "consumer"  # the protocol type of Kafka's consumers
_VERSION = struct.Struct(">h")


def _decode(cls: type[Message], data: bytes) -> Message | None:
    if len(data) < _VERSION.size:
        return None
    (version,) = _VERSION.unpack_from(data)
    valid = cls.VALID_VERSIONS  # type: ignore[attr-defined]
    if version < valid.lo:
        return None
    try:  # what a newer version adds at the end is left unread
        return decode_from(Reader(memoryview(data)[_VERSION.size :]), cls, min(version, valid.hi))
    except (DecodeError, ValueError, UnicodeDecodeError):
        return None


def subscribed_topics(metadata: bytes) -> list[str] | None:
    """The topics of a consumer's subscription (JoinGroup metadata), or None when it does not decode."""
    sub = _decode(ConsumerProtocolSubscription, metadata)
    return None if not isinstance(sub, ConsumerProtocolSubscription) else list(sub.topics)


def assigned_partitions(assignment: bytes) -> list[tuple[str, int]] | None:
    """A consumer's assigned (topic, partition)s (SyncGroup assignment), or None when it does not decode."""
    if not assignment:
        return []
    got = _decode(ConsumerProtocolAssignment, assignment)
    if not isinstance(got, ConsumerProtocolAssignment):
        return None
    return sorted((tp.topic, p) for tp in got.assigned_partitions for p in tp.partitions)
