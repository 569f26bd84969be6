"""Fetch and ReplicaFetch responses composed from stored batch bytes.

The log stores each RecordBatch as its serialized protobuf. A Fetch response
carries those batches unchanged, so the broker never parses them into messages
and serializes them again: with upb, adding large RecordBatch messages to a
response (``extend``) deep-copies them, about 1 ms per 256 KiB batch, which
made the broker the bound of every consumer.

:class:`FetchResponseWriter` writes the protobuf encoding directly: each
partition's header message (every field but ``batches``) followed by the
stored batches as field 7. Protobuf parsers accept fields in any order and keep
a repeated field's elements in order, so the result parses to exactly the
FetchResponse the message API would have built (only the field order of the
bytes differs). Each batch is copied once, into the result.
:class:`ReplicaFetchResponseWriter` does the same for the leader's answer to
its followers, which carry the same stored batches.
"""

from __future__ import annotations

from google.protobuf.message import Message

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.records import varint

# Tags of the length-delimited fields written by hand: (field number << 3) | 2.
_TAG_RESPONSE_TOPICS = b"\x0a"  # FetchResponse.topics = 1
_TAG_TOPIC_PARTITIONS = b"\x12"  # FetchTopicResponse.partitions = 2
_TAG_PARTITION_BATCHES = b"\x3a"  # FetchPartitionResponse.batches = 7
_TAG_REPLICA_PARTITIONS = b"\x0a"  # ReplicaFetchResponse.partitions = 1
_TAG_REPLICA_BATCHES = b"\x4a"  # ReplicaFetchPartitionResponse.batches = 9


def _with_batches(header: Message, tag: bytes, batches: list[bytes]) -> list[bytes]:
    """``header`` serialized, then each stored batch as a length-delimited field ``tag``."""
    pieces = [header.SerializeToString()]
    for raw in batches:
        pieces += (tag, varint(len(raw)), raw)
    return pieces


def _field(tag: bytes, pieces: list[bytes]) -> list[bytes]:
    """``pieces`` (one encoded message) as a length-delimited field ``tag``."""
    return [tag, varint(sum(map(len, pieces))), *pieces]


class FetchResponseWriter:
    """A serialized FetchResponse, topic by topic, partition by partition."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []
        self._topic: list[bytes] = []

    def topic(self, name: str) -> None:
        """Start the next topic (its partitions follow)."""
        self._end_topic()
        self._topic = [bpb.FetchTopicResponse(name=name).SerializeToString()]

    def partition(self, header: bpb.FetchPartitionResponse, batches: list[bytes]) -> None:
        """A partition of the current topic: ``header`` (no batches set) and the stored batches, in order."""
        self._topic += _field(_TAG_TOPIC_PARTITIONS, _with_batches(header, _TAG_PARTITION_BATCHES, batches))

    def _end_topic(self) -> None:
        if self._topic:
            self._pieces += _field(_TAG_RESPONSE_TOPICS, self._topic)
            self._topic = []

    def getvalue(self) -> bytes:
        self._end_topic()
        return b"".join(self._pieces)


class ReplicaFetchResponseWriter:
    """A serialized ReplicaFetchResponse, partition by partition."""

    def __init__(self) -> None:
        self._pieces: list[bytes] = []

    def partition(self, header: ipb.ReplicaFetchPartitionResponse, batches: list[bytes]) -> None:
        """One partition: ``header`` (no batches set) and the stored batches, in order."""
        self._pieces += _field(_TAG_REPLICA_PARTITIONS, _with_batches(header, _TAG_REPLICA_BATCHES, batches))

    def getvalue(self) -> bytes:
        return b"".join(self._pieces)
