"""The data path's own types: what Produce and Fetch take and answer inside the broker's core.

The core (:class:`~sluice.broker.replica_manager.ReplicaManager`) serves two protocols, gRPC and
Kafka's, and speaks neither: each adapter decodes its request into these values, asks the request
gate (:mod:`sluice.broker.security.gate`) what the caller may do, calls the core with what is
allowed, and encodes the answer in its own wire format. Nothing here is a protobuf message, so a
Kafka request never becomes a gRPC one on its way in, and a Fetch's answer is never serialized in
one protocol to be parsed back by the other.

Errors travel as ``error_code`` and ``error_message`` (the Kafka code of the
:class:`~sluice.errors.SluiceError` that refused the partition), filled by
:func:`sluice.broker.errors.answer`; each adapter maps them to what its clients expect.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.api.v1 import records_pb2 as pb
from sluice.records import RecordBatch


@dataclass(frozen=True, slots=True)
class ProducePartition:
    """One partition's batch of a Produce."""

    topic: str
    partition: int
    batch: RecordBatch


@dataclass(frozen=True, slots=True)
class ProduceInput:
    """A Produce: the batches (one per partition, in the request's order), acks and timeout."""

    batches: list[ProducePartition]
    acks: int = -1  # -1 (all), 0 or 1
    timeout_ms: int = 30_000  # how long acks=all waits for the in-sync replicas
    transactional_id: str = ""  # a transactional producer's id (KIP-890's verification asks its coordinator)


@dataclass(slots=True)
class ProduceResult:
    """One partition's answer to a Produce, in the order of :attr:`ProduceInput.batches`."""

    topic: str
    partition: int
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    base_offset: int = -1
    log_start_offset: int = -1
    log_append_time: int = -1  # the broker's append time when the topic says LogAppendTime, else -1


@dataclass(frozen=True, slots=True)
class FetchPartition:
    """One partition of a Fetch: where to read from, and how much."""

    topic: str
    partition: int
    fetch_offset: int
    max_bytes: int  # at least one batch is answered when there is one, whatever this says
    current_leader_epoch: int = -1  # the client's view (KIP-320); -1: not checked


@dataclass(frozen=True, slots=True)
class FetchInput:
    """A Fetch: its partitions, how long to wait for how many bytes, and the isolation level."""

    partitions: list[FetchPartition]
    max_wait_ms: int = 0
    min_bytes: int = 0
    max_bytes: int = 0  # 0: the broker's fetch.max.bytes
    read_committed: bool = False
    # Kafka's clients filter aborted records themselves: read_committed then stops at the LSO but
    # keeps aborted batches and markers (their position must move past them) and lists the aborted
    # transactions. gRPC clients get aborted batches and markers dropped by the broker.
    keep_aborted: bool = False


@dataclass(slots=True)
class FetchedPartition:
    """One partition's answer to a Fetch, in the order of :attr:`FetchInput.partitions`."""

    topic: str
    partition: int
    next_fetch_offset: int  # where the next fetch starts (past batches stepped over)
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    aborted: list[tuple[int, int]] = field(default_factory=list)  # (producer id, first offset)
    batches: list[RecordBatch] = field(default_factory=list)
    raw: list[bytes] = field(default_factory=list)  # each batch as stored: what gRPC sends, never re-serialized


# ListOffsets' offset specs (Kafka's): the latest (HW, or LSO for read_committed), the log start, and
# the record with the largest timestamp; a spec >= 0 is a timestamp (the first record at or after it).
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


@dataclass(frozen=True, slots=True)
class OffsetQuery:
    """One partition of a ListOffsets: which offset (:data:`LATEST`, :data:`EARLIEST`,
    :data:`MAX_TIMESTAMP`, or a timestamp in ms)."""

    topic: str
    partition: int
    spec: int
    current_leader_epoch: int = -1  # the client's view (KIP-320); -1: not checked


@dataclass(slots=True)
class OffsetAnswer:
    """One partition's answer to a ListOffsets, in the order asked; -1s with an error."""

    topic: str
    partition: int
    error_code: pb.ErrorCode = pb.NONE
    error_message: str = ""
    offset: int = -1  # -1 when no record matches the timestamp
    timestamp: int = -1  # -1 for latest and earliest
    leader_epoch: int = -1


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """A producer with state on a partition (Kafka's DescribeProducers): what find-hanging reads."""

    producer_id: int
    producer_epoch: int
    last_sequence: int  # -1: none
    last_timestamp: int  # ms, its newest record's on the partition
    coordinator_epoch: int  # of the last marker written for it here; -1: none
    current_txn_start_offset: int  # first offset of its open transaction here; -1: none open
