"""Stray partitions: data this broker holds that the metadata no longer assigns to it.

A broker that was down while a topic was deleted never heard of the deletion; one that was
down while a topic was deleted and created again under the same name hears only of the new
topic. Either way the old partitions' keys stay in RocksDB forever unless something looks
for them. This module does the looking, the way Kafka's stray-log detection does (KIP-858's
follow-up in KRaft brokers): it lists the partitions stored on disk, each under its *topic
id* (every key of a partition starts with the 16 bytes of its topic id and 4 of its
partition number, see :func:`sluice.broker.log.partition.partition_prefix`), and compares
them with the partitions the metadata assigns to this broker, also by topic id. Names are
never compared: a re-created topic has the old name and a new id, so its old data is stray
and its new data is not.

What is on disk comes from the ``partition_meta`` column family, where every partition log
writes one record at creation (and deletes it last, after its data): a partition whose
metadata record is gone holds no data either.

Pure functions over what was read; the replica manager decides when to run them (at start,
once the first full metadata read is done, and after every metadata change) and deletes, and only
while the data directory's recorded cluster id (:data:`CLUSTER_ID_KEY`) is the metadata's.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from sluice.broker.log.storage import Storage, WriteSet
from sluice.metadata.documents import TopicDocument

_PARTITION = struct.Struct(">I")
# The id of the cluster whose metadata this data directory follows, kept in partition_meta under a
# key that is not PREFIX_BYTES long (so never taken for a partition). A broker pointed at another
# cluster's metadata (a new metadata file, the wrong namespace) would find every partition stray:
# like Kafka's cluster id check in meta.properties, stray deletion then stops instead.
CLUSTER_ID_KEY = b"sluice.cluster-id"
TOPIC_ID_BYTES = 16
PREFIX_BYTES = TOPIC_ID_BYTES + _PARTITION.size
# every column family that holds a partition's keys under its prefix; partition_meta last
PARTITION_COLUMN_FAMILIES = ("log", "producers", "txn_index", "partition_meta")


@dataclass(frozen=True)
class StoredPartition:
    """A partition found on disk: its key prefix, topic id (32 hex digits), number, and the name it had."""

    prefix: bytes
    topic_id: str
    partition: int
    topic: str

    def describe(self) -> str:
        return f"{self.topic}-{self.partition} (topic id {self.topic_id})"


def normalize_topic_id(topic_id: str) -> str:
    """A topic id as 32 lower-case hex digits (ids are written with or without a UUID's dashes)."""
    return topic_id.replace("-", "").lower()


def stored_partitions(storage: Storage) -> Iterator[StoredPartition]:
    """Every partition whose metadata record is on disk."""
    for key, value in storage.scan("partition_meta", b"", b"\xff" * (PREFIX_BYTES + 1)):
        if len(key) != PREFIX_BYTES:
            continue  # not a partition record: nothing else lives here today, but never guess
        try:
            name = str(json.loads(value).get("topic", "?"))
        except (ValueError, AttributeError):
            name = "?"
        (partition,) = _PARTITION.unpack_from(key, TOPIC_ID_BYTES)
        yield StoredPartition(bytes(key), key[:TOPIC_ID_BYTES].hex(), partition, name)


def assigned_partitions(topics: Iterable[TopicDocument], broker_id: int) -> set[tuple[str, int]]:
    """(topic id, partition) of every partition whose replica list names ``broker_id``."""
    return {
        (normalize_topic_id(topic.topic_id), i)
        for topic in topics
        for i, state in enumerate(topic.partitions)
        if broker_id in state.replicas
    }


def stray_partitions(stored: Iterable[StoredPartition], assigned: set[tuple[str, int]]) -> list[StoredPartition]:
    """The stored partitions the metadata does not assign to this broker (compared by topic id)."""
    return [p for p in stored if (p.topic_id, p.partition) not in assigned]


def delete_partition_keys(storage: Storage, prefix: bytes) -> None:
    """Delete every key of one partition in one atomic write, its metadata record included.

    RocksDB drops the data itself when compaction passes over the range tombstones; callers
    that want the space back now follow with :meth:`Storage.compact` of :func:`key_range`.
    """
    ws = WriteSet()
    start, end = key_range(prefix)
    for cf in PARTITION_COLUMN_FAMILIES[:-1]:
        ws.delete_range(cf, start, end)
    ws.delete("partition_meta", prefix)
    storage.write(ws)


def key_range(prefix: bytes) -> tuple[bytes, bytes]:
    """[start, end) covering every key that starts with ``prefix`` in every partition column family."""
    return prefix, prefix + b"\xff" * 9
