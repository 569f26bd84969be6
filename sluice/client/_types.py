"""Value types of the client's public API.

Small immutable records, named as a Kafka user knows them: a partition is a
:class:`TopicPartition`, a delivered record is described by
:class:`RecordMetadata`, a consumed one is a :class:`ConsumerRecord`, and a
consumer's group membership, as a transactional producer needs it to commit
offsets (KIP-447), is :class:`GroupMetadata`.

They are frozen dataclasses with slots: hashable (``TopicPartition`` is a dict
key everywhere), cheap, and printable. ``TopicPartition`` also unpacks like the
namedtuple Kafka's Python clients use: ``topic, partition = tp``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field

__all__ = [
    "ConsumerRecord",
    "FutureRecordMetadata",
    "GroupMetadata",
    "OffsetAndTimestamp",
    "RecordMetadata",
    "TopicPartition",
]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition of a topic."""

    topic: str
    partition: int

    def __iter__(self) -> Iterator[str | int]:
        yield self.topic
        yield self.partition

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


@dataclass(frozen=True, slots=True)
class RecordMetadata:
    """Where a produced record was stored: its offset and timestamp.

    ``offset`` is -1 when the producer does not wait for acknowledgements
    (acks=0). ``timestamp`` is the record's create time, or the broker's
    append time for topics with message.timestamp.type=LogAppendTime.
    """

    topic: str
    partition: int
    offset: int
    timestamp: int

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class ConsumerRecord:
    """A record returned by :meth:`Consumer.poll`."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]] = field(default_factory=list)
    timestamp: int = -1

    @property
    def topic_partition(self) -> TopicPartition:
        return TopicPartition(self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class GroupMetadata:
    """A consumer's group membership, for :meth:`Producer.send_offsets_to_transaction`.

    ``member_id`` is empty and ``member_epoch`` -1 for a consumer that uses
    ``assign()`` (it is not a member): the coordinator then skips the zombie check.
    """

    group_id: str
    member_id: str = ""
    member_epoch: int = -1


@dataclass(frozen=True, slots=True)
class OffsetAndTimestamp:
    """An answer of :meth:`Consumer.offsets_for_times`: the offset found and its record's timestamp."""

    offset: int
    timestamp: int


class FutureRecordMetadata(Future[RecordMetadata]):
    """The result of :meth:`Producer.send`: a ``concurrent.futures.Future``.

    ``result(timeout)`` returns the :class:`RecordMetadata` or raises the
    error from :mod:`sluice.errors` that failed the record; ``get`` is an alias
    for those used to kafka-python.
    """

    def get(self, timeout: float | None = None) -> RecordMetadata:
        return self.result(timeout)
