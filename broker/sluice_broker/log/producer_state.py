"""Idempotent-producer state of one partition: the checks of DESIGN section 3.

Pure logic, no I/O: :class:`PartitionLog` asks :func:`check_append` what to do
with a batch, appends it, then records it with :meth:`ProducerEntry.appended`,
and persists :meth:`ProducerEntry.encode` in the same atomic write.

Per producer id the leader keeps the epoch, and the first/last sequence and
offsets of the last :data:`DUPLICATE_WINDOW` batches. A batch equal to one of
them is a retry of something already stored: it is acknowledged with the
original offset and not appended again. Anything else must continue the
sequence exactly (no gap, no overlap); a new epoch starts again at 0. That is
what lets a producer keep 5 requests in flight and retry them safely.

An entry also remembers the transactions of its producer that ended on this
partition at markers the high watermark may not have passed yet
(``completed``: (first offset, marker offset) pairs). The partition keeps such
a transaction unstable until its marker is below the HW (Kafka's unreplicated
transactions, see :mod:`sluice.broker.log.partition`); persisting the pairs with
the entry is what lets a restarted replica rebuild that set from its HW
checkpoint without scanning the log back to each transaction's start. The list
is pruned to the markers at or above the HW whenever the entry is written, so
it stays as short as the unreplicated tail of the log.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from enum import Enum

from sluice.api.v1 import records_pb2 as pb

DUPLICATE_WINDOW = 5
SEQ_MODULUS = 2**31
NO_OFFSET = -1

_HEAD = struct.Struct(">iiqqB")
_BATCH = struct.Struct(">iiqq")
_COMPLETED_COUNT = struct.Struct(">I")
_COMPLETED = struct.Struct(">qq")  # first offset, marker offset


@dataclass(frozen=True, slots=True)
class BatchMeta:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    producer_id: int
    epoch: int
    coordinator_epoch: int = -1
    txn_first_offset: int = NO_OFFSET  # first offset of the open transaction on this partition
    last_timestamp: int = -1
    batches: deque[BatchMeta] = field(default_factory=lambda: deque(maxlen=DUPLICATE_WINDOW))
    # (first offset, marker offset) of transactions ended here whose marker may still be above the HW
    completed: list[tuple[int, int]] = field(default_factory=list)

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1

    def find_duplicate(self, first_seq: int, last_seq: int) -> BatchMeta | None:
        for meta in self.batches:
            if meta.first_seq == first_seq and meta.last_seq == last_seq:
                return meta
        return None

    def appended(
        self,
        epoch: int,
        first_seq: int,
        record_count: int,
        first_offset: int,
        timestamp: int,
        transactional: bool,
    ) -> None:
        if epoch != self.epoch:
            self.epoch = epoch
            self.batches.clear()
        if first_seq >= 0:
            last_seq = (first_seq + record_count - 1) % SEQ_MODULUS
            self.batches.append(BatchMeta(first_seq, last_seq, first_offset, first_offset + record_count - 1))
        if transactional and self.txn_first_offset == NO_OFFSET:
            self.txn_first_offset = first_offset
        self.last_timestamp = max(self.last_timestamp, timestamp)

    def copy(self) -> ProducerEntry:
        """A copy to change while the write that stores it is pending (its BatchMetas are immutable)."""
        return ProducerEntry(
            self.producer_id,
            self.epoch,
            self.coordinator_epoch,
            self.txn_first_offset,
            self.last_timestamp,
            deque(self.batches, maxlen=DUPLICATE_WINDOW),
            list(self.completed),
        )

    def encode(self) -> bytes:
        head = _HEAD.pack(
            self.epoch, self.coordinator_epoch, self.txn_first_offset, self.last_timestamp, len(self.batches)
        )
        body = b"".join(_BATCH.pack(m.first_seq, m.last_seq, m.first_offset, m.last_offset) for m in self.batches)
        if not self.completed:
            return head + body  # the format written before completed transactions were kept
        tail = b"".join(_COMPLETED.pack(first, marker) for first, marker in self.completed)
        return head + body + _COMPLETED_COUNT.pack(len(self.completed)) + tail

    @classmethod
    def decode(cls, producer_id: int, data: bytes) -> ProducerEntry:
        epoch, coord_epoch, txn_first, last_ts, n = _HEAD.unpack_from(data, 0)
        entry = cls(producer_id, epoch, coord_epoch, txn_first, last_ts)
        for i in range(n):
            entry.batches.append(BatchMeta(*_BATCH.unpack_from(data, _HEAD.size + i * _BATCH.size)))
        pos = _HEAD.size + n * _BATCH.size
        if len(data) > pos:  # absent in entries written before completed transactions were kept
            (count,) = _COMPLETED_COUNT.unpack_from(data, pos)
            pos += _COMPLETED_COUNT.size
            for i in range(count):
                first, marker = _COMPLETED.unpack_from(data, pos + i * _COMPLETED.size)
                entry.completed.append((first, marker))
        return entry


def is_expired(entry: ProducerEntry, now_ms: int, expiration_ms: int, high_watermark: int, open_txn: bool) -> bool:
    """Kafka's rule for forgetting an idle producer (producer.id.expiration.ms): its newest record
    timestamp is that old and it has no transaction open here, nor one whose marker may still be
    above the HW (its entry keeps that transaction unstable across a restart)."""
    if open_txn or any(marker >= high_watermark for _first, marker in entry.completed):
        return False
    return now_ms - entry.last_timestamp >= expiration_ms


class Action(Enum):
    APPEND = "append"
    DUPLICATE = "duplicate"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class Verdict:
    action: Action
    error: pb.ErrorCode = pb.NONE
    message: str = ""
    duplicate_offset: int = NO_OFFSET

    @classmethod
    def reject(cls, error: pb.ErrorCode, message: str) -> Verdict:
        return cls(Action.REJECT, error, message)


APPEND = Verdict(Action.APPEND)


def check_append(
    entry: ProducerEntry | None,
    producer_id: int,
    epoch: int,
    base_seq: int,
    record_count: int,
    transactional: bool,
) -> Verdict:
    """What to do with a data batch from ``producer_id`` given the partition's state for it.

    ``base_seq == -1`` is a coordinator write (transactional offsets): the epoch
    is checked, sequences are not.
    """
    fenced = pb.PRODUCER_FENCED if transactional else pb.INVALID_PRODUCER_EPOCH
    if entry is None:
        if base_seq > 0:
            return Verdict.reject(
                pb.UNKNOWN_PRODUCER_ID,
                f"producer {producer_id} is unknown on this partition and its sequence is {base_seq}, not 0",
            )
        return APPEND
    if epoch < entry.epoch:
        return Verdict.reject(
            fenced, f"producer {producer_id} epoch {epoch} is older than the current epoch {entry.epoch}"
        )
    if entry.txn_first_offset != NO_OFFSET and not transactional:
        return Verdict.reject(
            pb.INVALID_TXN_STATE,
            f"producer {producer_id} has a transaction open on this partition; a non-transactional write is "
            "not allowed until it ends",
        )
    if base_seq < 0:
        return APPEND
    if epoch > entry.epoch:
        if base_seq != 0:
            return Verdict.reject(
                pb.OUT_OF_ORDER_SEQUENCE_NUMBER,
                f"producer {producer_id} starts epoch {epoch} with sequence {base_seq}, not 0",
            )
        return APPEND
    last_seq = (base_seq + record_count - 1) % SEQ_MODULUS
    dup = entry.find_duplicate(base_seq, last_seq)
    if dup is not None:
        return Verdict(Action.DUPLICATE, duplicate_offset=dup.first_offset)
    expected = (entry.last_seq + 1) % SEQ_MODULUS
    if base_seq != expected:
        return Verdict.reject(
            pb.OUT_OF_ORDER_SEQUENCE_NUMBER,
            f"producer {producer_id} epoch {epoch}: expected sequence {expected}, got {base_seq}",
        )
    return APPEND


def check_marker(
    entry: ProducerEntry | None,
    producer_id: int,
    epoch: int,
    coordinator_epoch: int,
    transaction_version: int = 1,
    open_transaction: bool = False,
) -> Verdict:
    """Whether a COMMIT/ABORT marker from a coordinator may be written.

    A transaction version 2 marker comes from an end that bumped the epoch, so it is newer than
    the data of the transaction it ends. One that is not is a late marker of the *previous*
    transaction (a WriteTxnMarkers delayed until after the next transaction began, which writes
    with the epoch that marker carries): ending the open transaction with it would commit or
    abort records its producer never asked to end. Kafka refuses the same (KIP-1228).
    """
    if entry is None:
        return APPEND
    if coordinator_epoch < entry.coordinator_epoch:
        return Verdict.reject(
            pb.TRANSACTION_COORDINATOR_FENCED,
            f"marker from coordinator epoch {coordinator_epoch}, "
            f"but this partition saw {entry.coordinator_epoch} for producer {producer_id}",
        )
    if epoch < entry.epoch:
        return Verdict.reject(
            pb.INVALID_PRODUCER_EPOCH,
            f"marker for producer {producer_id} epoch {epoch} is older than the current epoch {entry.epoch}",
        )
    if transaction_version >= 2 and open_transaction and epoch <= entry.epoch:
        return Verdict.reject(
            pb.INVALID_PRODUCER_EPOCH,
            f"a transaction version 2 marker for producer {producer_id} at epoch {epoch} is not newer than the "
            f"open transaction's epoch {entry.epoch}: a late marker of an earlier transaction, refused",
        )
    return APPEND
