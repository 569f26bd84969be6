"""One partition's log: offsets, high watermark, LSO, idempotence, aborted-transaction index.

A :class:`PartitionLog` owns the keys of one partition in :class:`Storage` and
the in-memory state derived from them. Every change is a single atomic
:class:`WriteSet`, built completely before anything in memory changes, so a
failed write (or a kill -9 half way) leaves memory and disk as they were.

Offsets:
  log_start_offset <= last_stable_offset <= high_watermark <= log_end_offset
LSO = min(first unstable offset, HW). The first unstable offset is the first
offset of the earliest transaction that is still open on the partition or
whose marker is not yet below the HW (Kafka's "unreplicated" transactions): a
transaction becomes readable only once its COMMIT/ABORT marker is on every
in-sync replica, so a follower elected without the marker cannot take back
what a read_committed reader was already shown. The unreplicated set is kept
sorted by marker offset and pruned whenever the HW moves (the
``high_watermark`` setter, on leaders and followers alike); each producer
entry persists its part of it, so a restart rebuilds it from the producer
states and the HW checkpoint. read_committed fetches stop at the LSO and skip
the batches of aborted transactions, which the broker knows from its aborted
index (producer id -> [(first offset, marker offset)]).

The batch is the unit throughout: append validates its header and CRC and
stores it as it came (with base offset and leader epoch set); reads return
stored batches. Records are decoded only for timestamp look-ups.

Leadership and the epoch stamp: a leader append (client batches, coordinator
batches, markers) names the leader epoch under which its request was admitted,
and :meth:`PartitionLog.append` / :meth:`PartitionLog.write_marker` refuse it
with NOT_LEADER_OR_FOLLOWER unless this replica still leads at exactly that
epoch, in the same synchronous step that stamps the epoch and writes. A request
may wait between admission and append (KIP-890's verification with the
transaction coordinator, a lock, a quota), and leadership may move meanwhile: a
deposed leader that appended anyway would stamp its batch with the *new*
leader's epoch (its ``leader_epoch`` follows the metadata), so two replicas
would differ within one epoch and no OffsetsForLeaderEpoch exchange would ever
find it (issue 30). Kafka guards the same step with the partition's leader/ISR
lock and re-checks leadership in the verification callback.
"""

from __future__ import annotations

import bisect
import json
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.log.producer_state import (
    NO_OFFSET,
    Action,
    ProducerEntry,
    check_append,
    check_marker,
    is_expired,
)
from sluice.broker.log.storage import Storage, WriteSet
from sluice.records import (
    RecordBatch,
    RecordDecodeError,
    compute_crc,
    control_batch,
    decode_record_tuples,
    decode_records,
    now_ms,
    parse_control,
    verify_crc,
)

PRODUCER_CAP_KEY = "producer.id.max.count.per.partition"
PRODUCER_EXPIRATION_KEY = "producer.id.expiration.ms"
_OFFSET = struct.Struct(">q")
_PID = struct.Struct(">q")
_ABORTED = struct.Struct(">qq")  # producer id, last offset (the ABORT marker)
MAX_OFFSET_KEY = _OFFSET.pack(2**63 - 1)


def partition_prefix(topic_id: str, partition: int) -> bytes:
    return bytes.fromhex(topic_id.replace("-", "")) + struct.pack(">I", partition)


def validate_batch(batch: RecordBatch, max_message_bytes: int) -> int:
    """The header checks every produced batch passes before anything else looks at it; returns its size."""
    if batch.control:
        raise errors.InvalidRecordError("control batches are written by the broker only")
    if batch.record_count < 1:
        raise errors.InvalidRecordError(f"record_count must be >= 1, not {batch.record_count}")
    if batch.compression not in (
        pb.COMPRESSION_NONE,
        pb.COMPRESSION_GZIP,
        pb.COMPRESSION_SNAPPY,
        pb.COMPRESSION_LZ4,
        pb.COMPRESSION_ZSTD,
    ):
        raise errors.UnsupportedCompressionTypeError(f"unknown compression {batch.compression}")
    if batch.records_format not in (pb.RECORDS_FORMAT_SLUICE, pb.RECORDS_FORMAT_KAFKA_V2):
        raise errors.InvalidRecordError(f"unknown records_format {batch.records_format} (0: Sluice's, 1: Kafka's v2)")
    size = batch.ByteSize()
    if size > max_message_bytes:
        raise errors.MessageTooLargeError(f"batch of {size} bytes is larger than max.message.bytes={max_message_bytes}")
    has_pid = batch.producer_id > 0
    if has_pid and (batch.producer_epoch < 0 or batch.producer_epoch > 32767 or batch.base_sequence < 0):
        raise errors.InvalidRecordError(
            f"producer id {batch.producer_id} needs an epoch in [0, 32767] and a sequence >= 0",
        )
    if batch.transactional and not has_pid:
        raise errors.InvalidRecordError("a transactional batch needs a producer id")
    if batch.first_timestamp > batch.max_timestamp:
        raise errors.InvalidTimestampError("first_timestamp is after max_timestamp")
    if not verify_crc(batch):
        raise errors.CorruptMessageError("the batch's CRC-32C does not match its contents")
    return size  # ByteSize() serializes the batch (upb): callers reuse it rather than ask again


@dataclass(frozen=True)
class ReadResult:
    batches: list[RecordBatch]
    next_fetch_offset: int
    aborted: list[tuple[int, int]]  # (producer id, first offset) overlapping the range
    size: int
    # The stored bytes of each of `batches` (same order): what Fetch sends, never re-serialized.
    raw: list[bytes] = field(default_factory=list)


class PartitionLog:
    def __init__(
        self,
        storage: Storage,
        topic: str,
        partition: int,
        topic_id: str,
        config: Callable[[str], Any],
    ) -> None:
        self.storage = storage
        self.topic = topic
        self.partition = partition
        self.topic_id = topic_id
        self.config = config  # key -> effective value (topic override, else broker default)
        self.prefix = partition_prefix(topic_id, partition)
        self._end_key = self.prefix + MAX_OFFSET_KEY
        self.log_start_offset = 0
        self.log_end_offset = 0
        # Bytes of the stored batches in [log start, log end) (what DescribeLogDirs reports), kept
        # as batches come and go; None until first read after a start (see size_bytes). Until
        # then, the size persisted with the meta: (bytes, up to which offset).
        self._size: int | None = 0
        self._size_base: tuple[int, int] | None = None
        # (marker offset, first offset, producer id) of transactions ended at a marker not yet below
        # the HW, sorted; see the module docstring. Set before the HW, whose setter prunes it.
        self._unreplicated: list[tuple[int, int, int]] = []
        self._hw = 0
        self.leader_epoch = 0  # the latest epoch this replica knows of, as leader or follower
        self.leading = False  # this replica leads at ``leader_epoch`` (set by the replica manager)
        self.epoch_cache: list[tuple[int, int]] = []  # (leader epoch, its start offset)
        self.producers: dict[int, ProducerEntry] = {}
        self.open_txns: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: dict[int, list[tuple[int, int]]] = {}  # producer id -> sorted [(first, last)]
        self.marker_listeners: list[Callable[[PartitionLog, int, bool, int], None]] = []
        self._checkpointed_hw = -1
        self._load()

    # -- keys and persistence ---------------------------------------------------------------------

    def _log_key(self, offset: int) -> bytes:
        return self.prefix + _OFFSET.pack(offset)

    def _meta(self, epoch_cache: list[tuple[int, int]] | None = None) -> bytes:
        return json.dumps(
            {
                "topic": self.topic,
                "partition": self.partition,
                "topic_id": self.topic_id,
                "log_start_offset": self.log_start_offset,
                "leader_epoch": self.leader_epoch,
                "epoch_cache": self.epoch_cache if epoch_cache is None else epoch_cache,
                "high_watermark": self.high_watermark,
                **self._size_fields(),
            }
        ).encode()

    def _size_fields(self) -> dict[str, int]:
        """The size of [log start, size_end): a restart adds the batches stored after size_end."""
        if self._size is not None:
            return {"size_bytes": self._size, "size_end": self.log_end_offset}
        if self._size_base is not None:
            return {"size_bytes": self._size_base[0], "size_end": self._size_base[1]}
        return {}

    def checkpoint_high_watermark(self) -> None:
        """Persist the HW (periodically, as Kafka's checkpoint file): a restarted replica starts there."""
        if self.high_watermark != self._checkpointed_hw:
            ws = WriteSet()
            ws.put("partition_meta", self.prefix, self._meta())
            self.storage.write(ws)
            self._checkpointed_hw = self.high_watermark

    def _load(self) -> None:
        raw = self.storage.get("partition_meta", self.prefix)
        persisted_hw = None
        if raw is None:
            ws = WriteSet()
            ws.put("partition_meta", self.prefix, self._meta())
            self.storage.write(ws)
        else:
            meta = json.loads(raw)
            self.log_start_offset = meta["log_start_offset"]
            self.leader_epoch = meta["leader_epoch"]
            self.epoch_cache = [(int(e), int(o)) for e, o in meta["epoch_cache"]]
            persisted_hw = meta.get("high_watermark")
            if "size_end" in meta:
                self._size_base = (int(meta["size_bytes"]), int(meta["size_end"]))
        last = self.storage.last("log", self.prefix, self._end_key)
        if last is not None:
            batch = RecordBatch.FromString(last[1])
            self.log_end_offset = batch.base_offset + batch.record_count
        else:
            self.log_end_offset = self.log_start_offset
        if raw is not None:
            self._size = None  # counted when first read: opening a partition reads no batch
        # A replica restarts at its checkpointed HW (never above its own log end); the leader
        # raises it again as followers fetch. Logs written before HW checkpoints existed were
        # single-replica, where everything stored was committed.
        hw = self.log_end_offset if persisted_hw is None else min(int(persisted_hw), self.log_end_offset)
        self.high_watermark = max(hw, self.log_start_offset)
        self._checkpointed_hw = self.high_watermark
        end = self.prefix + b"\xff" * 8
        for key, value in self.storage.scan("producers", self.prefix, end):
            pid = _PID.unpack_from(key, len(self.prefix))[0]
            entry = ProducerEntry.decode(pid, value)
            self.producers[pid] = entry
            if entry.txn_first_offset != NO_OFFSET:
                self.open_txns[pid] = entry.txn_first_offset
            # Transactions whose marker the checkpointed HW had not passed stay unstable until
            # the HW (raised again as followers fetch) passes it. The checkpoint may lag the real
            # HW by a second; that only keeps a transaction unstable a little longer.
            for first, marker in entry.completed:
                if self.high_watermark <= marker < self.log_end_offset:
                    bisect.insort(self._unreplicated, (marker, first, pid))
        for key, value in self.storage.scan("txn_index", self.prefix, end):
            first = _OFFSET.unpack_from(key, len(self.prefix))[0]
            pid, last_offset = _ABORTED.unpack(value)
            self.aborted.setdefault(pid, []).append((first, last_offset))
        for ranges in self.aborted.values():
            ranges.sort()

    @property
    def size_bytes(self) -> int:
        """Bytes of the stored batches in [log start, log end).

        Counted at the first read after a start: the persisted size plus the batches stored after
        it. The meta is written with every change of the log start and at each HW checkpoint, so
        that tail is short. A meta without a size (written before sizes were kept) costs one scan
        of the whole log, once.
        """
        if self._size is None:
            size, since = self._size_base or (0, self.log_start_offset)
            if not self.log_start_offset <= since <= self.log_end_offset:
                size, since = 0, self.log_start_offset
            if since < self.log_end_offset:
                size += self._stored_bytes(since, self.log_end_offset)
            self._size = size
        return self._size

    def _stored_bytes(self, start: int, end: int) -> int:
        return sum(len(v) for _k, v in self.storage.scan("log", self._log_key(start), self._log_key(end)))

    # -- offsets ----------------------------------------------------------------------------------

    @property
    def high_watermark(self) -> int:
        return self._hw

    @high_watermark.setter
    def high_watermark(self, hw: int) -> None:
        self._hw = hw
        if self._unreplicated and self._unreplicated[0][0] < hw:
            # markers below the HW are on every in-sync replica: their transactions are stable now
            del self._unreplicated[: bisect.bisect_left(self._unreplicated, (hw, -1, -1))]

    @property
    def unreplicated_txns(self) -> list[tuple[int, int, int]]:
        """(marker offset, first offset, producer id) of ended transactions whose marker is not below the HW."""
        return list(self._unreplicated)

    @property
    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest transaction open here or ended above the HW; None if none."""
        firsts = [first for _marker, first, _pid in self._unreplicated]
        if self.open_txns:
            firsts.append(min(self.open_txns.values()))
        return min(firsts) if firsts else None

    @property
    def last_stable_offset(self) -> int:
        first = self.first_unstable_offset
        return self.high_watermark if first is None else min(first, self.high_watermark)

    def leader_epoch_start_offset(self) -> int | None:
        """Where this replica's history of its current leader epoch starts (None if it has no entry for it).

        A new leader whose HW is below this offset cannot yet vouch for the HW
        the previous leader may have exposed (Kafka's KIP-207).
        """
        for epoch, start in reversed(self.epoch_cache):
            if epoch == self.leader_epoch:
                return start
            if epoch < self.leader_epoch:
                break
        return None

    def become_leader(self, epoch: int) -> None:
        """Lead at ``epoch``: new batches are stamped with it and it starts at the log end."""
        self.leading = True
        if epoch == self.leader_epoch and self.epoch_cache and self.epoch_cache[-1][0] >= epoch:
            return
        self.leader_epoch = epoch
        if not self.epoch_cache or self.epoch_cache[-1][0] < epoch:
            self.epoch_cache.append((epoch, self.log_end_offset))
        ws = WriteSet()
        ws.put("partition_meta", self.prefix, self._meta())
        self.storage.write(ws)

    def become_follower(self, epoch: int) -> None:
        """Another replica leads at ``epoch`` (or none does): no leader append passes from now on."""
        self.leading = False
        self.leader_epoch = max(self.leader_epoch, epoch)

    def check_leader(self, admitted_epoch: int) -> None:
        """Raise NOT_LEADER_OR_FOLLOWER unless this replica leads at ``admitted_epoch`` now."""
        if self.leading and self.leader_epoch == admitted_epoch:
            return
        now = f"leads at epoch {self.leader_epoch}" if self.leading else f"follows at epoch {self.leader_epoch}"
        raise errors.NotLeaderOrFollowerError(
            f"{self.topic}-{self.partition}: the request was admitted at leader epoch {admitted_epoch}, "
            f"but this replica now {now}; nothing was written",
        )

    @property
    def latest_epoch(self) -> int:
        return self.epoch_cache[-1][0] if self.epoch_cache else -1

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(largest epoch <= ``epoch`` in this log's history, the offset where it ends); (-1, -1) if none.

        The end of an epoch is the start of the next one, or the log end for the latest.
        """
        found = -1
        for i, (e, _start) in enumerate(self.epoch_cache):
            if e <= epoch:
                found = i
            else:
                break
        if found < 0:
            return -1, -1
        if found + 1 < len(self.epoch_cache):
            return self.epoch_cache[found][0], self.epoch_cache[found + 1][1]
        return self.epoch_cache[found][0], self.log_end_offset

    # -- writes -----------------------------------------------------------------------------------

    def append(
        self, batch: RecordBatch, *, leader_epoch: int, verified_txn: bool = False, earliest_timestamp: int = -1
    ) -> tuple[int, bool]:
        """Append a validated data batch as leader. Returns (base offset, is_duplicate).

        ``leader_epoch``: the epoch under which the caller's request was
        admitted (:meth:`check_leader`). ``verified_txn``: the caller checked
        with the transaction coordinator that this partition is part of the
        producer's open transaction (needed for the first transactional batch
        of a transaction on this partition). ``earliest_timestamp``: the
        earliest of the records' timestamps where the caller read them
        (:func:`~sluice.broker.log.record_check.check_produced`), checked with
        the header's first and largest.
        """
        self.check_leader(leader_epoch)
        if not batch.control and self.config("message.timestamp.type") != "LogAppendTime":
            self._check_timestamps(batch.first_timestamp, batch.max_timestamp, earliest_timestamp)
        if not batch.control and "compact" in str(self.config("cleanup.policy")).split(","):
            self._require_keys(batch)
        pid = batch.producer_id
        if pid > 0:
            entry = self.producers.get(pid)
            if entry is None:
                self._check_producer_room(pid)
            verdict = check_append(
                entry, pid, batch.producer_epoch, batch.base_sequence, batch.record_count, batch.transactional
            )
            if verdict.action is Action.DUPLICATE:
                return verdict.duplicate_offset, True
            if verdict.action is Action.REJECT:
                raise errors.error_for(verdict.error, verdict.message)
            if batch.transactional and pid not in self.open_txns and not verified_txn:
                raise errors.InvalidTxnStateError(
                    f"partition {self.topic}-{self.partition} was not added to producer {pid}'s transaction "
                    "(AddPartitionsToTxn must come before the first write)",
                )
        offset = self.log_end_offset
        batch.base_offset = offset
        batch.partition_leader_epoch = self.leader_epoch
        if self.config("message.timestamp.type") == "LogAppendTime":
            batch.max_timestamp = now_ms()
            batch.timestamp_type = pb.LOG_APPEND_TIME
            batch.crc = compute_crc(batch)
        self._write_staged(batch)
        return offset, False

    def _check_timestamps(self, *stamps: int) -> None:
        """CreateTime records no further from the broker's clock than ``message.timestamp.before.max.ms``
        into the past and ``message.timestamp.after.max.ms`` into the future (KIP-937; Kafka 4's defaults:
        any past, one hour ahead), else INVALID_TIMESTAMP, as Kafka refuses them. What is checked is
        the batch header's first and largest timestamps and, for Kafka's v2 records, the records'
        earliest (their largest is the header's, corrected); -1 (no timestamp) passes, as in Kafka."""
        now = now_ms()
        before = int(self.config("message.timestamp.before.max.ms"))
        after = int(self.config("message.timestamp.after.max.ms"))
        for ts in stamps:
            if ts != -1 and (now - ts > before or ts - now > after):
                raise errors.InvalidTimestampError(
                    f"timestamp {ts} of a record for {self.topic}-{self.partition} is out of range: the broker "
                    f"takes timestamps from {now - before if before < now else 0} to {now + after} now "
                    f"(message.timestamp.before.max.ms={before}, message.timestamp.after.max.ms={after})"
                )

    def _require_keys(self, batch: RecordBatch) -> None:
        """A compacted topic keeps the latest record per key, so it refuses a record without one, as
        Kafka does (INVALID_RECORD). The one produce check that decodes every record, on these topics only."""
        try:
            records = decode_record_tuples(batch)
        except RecordDecodeError as exc:
            raise errors.CorruptMessageError(str(exc)) from None
        for index, (_offset, _ts, key, _value, _headers) in enumerate(records):
            if key is None:
                raise errors.InvalidRecordError(
                    f"compacted topic {self.topic} cannot accept a record without a key (record {index} of the "
                    "batch): give every record a key, or use cleanup.policy=delete"
                )

    def _check_producer_room(self, producer_id: int) -> None:
        """A new producer on this partition: refused once it holds producer.id.max.count.per.partition."""
        cap = int(self.config(PRODUCER_CAP_KEY))
        if len(self.producers) >= cap:
            raise errors.PolicyViolationError(
                f"partition {self.topic}-{self.partition} already keeps the state of {len(self.producers)} "
                f"producers ({PRODUCER_CAP_KEY}={cap}); producer {producer_id} is refused until idle ones expire "
                "(producer.id.expiration.ms)"
            )

    def remove_expired_producers(self, now: int) -> int:
        """Forget producers idle for producer.id.expiration.ms (Kafka's rule); how many were removed.

        Idle: the newest record timestamp it wrote is that old, and it has no transaction open here
        and none whose marker may still be above the HW. Every replica applies the same rule to
        its own copy, as Kafka's do. A producer that writes again after its state expired is new
        to the partition: its sequence must start at 0 (UNKNOWN_PRODUCER_ID otherwise), which the
        client answers by starting a new epoch (KIP-360).
        """
        expiration = int(self.config(PRODUCER_EXPIRATION_KEY))
        hw = self.high_watermark
        expired = [
            pid
            for pid, entry in self.producers.items()
            if is_expired(entry, now, expiration, hw, pid in self.open_txns)
        ]
        if not expired:
            return 0
        ws = WriteSet()
        for pid in expired:
            ws.delete("producers", self.prefix + _PID.pack(pid))
        self.storage.write(ws)
        for pid in expired:
            del self.producers[pid]
        return len(expired)

    def write_marker(
        self,
        producer_id: int,
        epoch: int,
        committed: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int,
        transaction_version: int = 1,
    ) -> int | None:
        """Write a COMMIT/ABORT marker for ``producer_id`` as leader; returns its offset.

        None when the producer has no transaction open here: the marker was
        already written (a coordinator retrying after failover) or nothing was
        ever written, and either way there is nothing to end. ``leader_epoch``
        as for :meth:`append`; ``transaction_version`` 2: the end bumped the
        epoch, so the marker must be newer than the open transaction's data.
        """
        self.check_leader(leader_epoch)
        entry = self.producers.get(producer_id)
        verdict = check_marker(
            entry, producer_id, epoch, coordinator_epoch, transaction_version, producer_id in self.open_txns
        )
        if verdict.action is Action.REJECT:
            raise errors.error_for(verdict.error, verdict.message)
        if entry is None or producer_id not in self.open_txns:
            if entry is not None and (epoch > entry.epoch or coordinator_epoch > entry.coordinator_epoch):
                self._store_entry_change(entry, epoch, coordinator_epoch)
            return None
        offset = self.log_end_offset
        marker = control_batch(producer_id, epoch, committed, coordinator_epoch)
        marker.base_offset = offset
        marker.partition_leader_epoch = self.leader_epoch
        self._write_staged(marker)
        for listener in self.marker_listeners:
            listener(self, producer_id, committed, offset)
        return offset

    def append_replica(self, batch: RecordBatch) -> None:
        """Append a batch copied from the leader as it is (offset and epoch already set).

        No idempotence checks (the leader made them); the producer state, the
        open transactions, the aborted index and the epoch cache are rebuilt
        from the batch exactly as the leader built them. The CRC-32C is checked
        (it covers everything but the offset and leader epoch the leader set):
        a batch damaged on the leader's disk or on the way is refused, never
        copied, so no replica that could be elected holds it (CORRUPT_MESSAGE).
        """
        if not verify_crc(batch):
            raise errors.CorruptMessageError(
                f"replica of {self.topic}-{self.partition}: the batch at offset {batch.base_offset} from the leader "
                "fails its CRC-32C check; not appended"
            )
        if batch.base_offset < self.log_end_offset:
            raise errors.UnknownServerError(
                f"replica of {self.topic}-{self.partition} expected a batch at offset {self.log_end_offset} or "
                f"later (a gap is a batch compacted away), got {batch.base_offset}",
            )
        self._write_staged(batch)

    def _write_staged(self, batch: RecordBatch) -> None:
        ws = WriteSet()
        commit = self._stage(batch, ws)
        self.storage.write(ws)
        commit()  # the write is durable: now the memory

    def _stage(self, batch: RecordBatch, ws: WriteSet) -> Callable[[], None]:
        """Add everything appending ``batch`` changes on disk to ``ws``; return the change of memory.

        The one place that knows how a batch changes a partition's state, shared
        by leader appends, markers, follower appends and the rebuild after a
        truncation, so a follower's state is the leader's by construction.
        """
        base = batch.base_offset
        end = base + batch.record_count
        stored = batch.SerializeToString()
        ws.put("log", self._log_key(base), stored)
        cache = self.epoch_cache
        if batch.partition_leader_epoch > self.latest_epoch:
            cache = [*self.epoch_cache, (batch.partition_leader_epoch, base)]
            ws.put("partition_meta", self.prefix, self._meta(cache))
        pid = batch.producer_id
        new: ProducerEntry | None = None
        opened = closed = False
        aborted_range: tuple[int, int] | None = None
        if pid > 0:
            old = self.producers.get(pid)
            new = ProducerEntry(pid, batch.producer_epoch) if old is None else old.copy()
            if batch.control:
                committed, coordinator_epoch = parse_control(batch)
                new.coordinator_epoch = max(coordinator_epoch, new.coordinator_epoch)
                if batch.producer_epoch > new.epoch:
                    new.epoch = batch.producer_epoch
                    new.batches.clear()
                new.txn_first_offset = NO_OFFSET
                first = self.open_txns.get(pid)
                if first is not None:
                    closed = True
                    new.completed = [c for c in new.completed if c[1] >= self.high_watermark]
                    new.completed.append((first, base))
                    if not committed:
                        aborted_range = (first, base)
                        ws.put("txn_index", self.prefix + _OFFSET.pack(first), _ABORTED.pack(pid, base))
            else:
                new.appended(
                    batch.producer_epoch,
                    batch.base_sequence,
                    batch.record_count,
                    base,
                    batch.max_timestamp,
                    batch.transactional,
                )
                opened = batch.transactional and pid not in self.open_txns
                if new.completed:  # keep the persisted list as short as the unreplicated tail
                    new.completed = [c for c in new.completed if c[1] >= self.high_watermark]
            ws.put("producers", self.prefix + _PID.pack(pid), new.encode())

        def commit() -> None:
            self.log_end_offset = end
            if self._size is not None:  # else counted from the disk when first read
                self._size += len(stored)
            self.epoch_cache = cache
            if new is None:
                return
            self.producers[pid] = new
            if opened:
                self.open_txns[pid] = base
            if closed:
                first_offset = self.open_txns.pop(pid)
                if base >= self.high_watermark:
                    bisect.insort(self._unreplicated, (base, first_offset, pid))
            if aborted_range is not None:
                bisect.insort(self.aborted.setdefault(pid, []), aborted_range)

        return commit

    def _store_entry_change(self, entry: ProducerEntry, epoch: int, coordinator_epoch: int) -> None:
        new_entry = entry.copy()
        new_entry.coordinator_epoch = max(coordinator_epoch, entry.coordinator_epoch)
        if epoch > new_entry.epoch:
            new_entry.epoch = epoch
            new_entry.batches.clear()
        ws = WriteSet()
        ws.put("producers", self.prefix + _PID.pack(entry.producer_id), new_entry.encode())
        self.storage.write(ws)
        self.producers[entry.producer_id] = new_entry

    def truncate_to(self, offset: int) -> None:
        """Drop every batch at or after ``offset`` (a follower whose history diverged from the leader's).

        The producer states, open transactions and aborted index are rebuilt
        from what is left, by replaying it through :meth:`_stage`; everything
        changes on disk in one atomic write.
        """
        if offset >= self.log_end_offset:
            # Nothing to drop from the log, but epochs that start here or later are history the
            # leader does not share (an epoch this replica led without writing): forget them.
            kept_epochs = [(e, s) for e, s in self.epoch_cache if s < offset]
            if kept_epochs != self.epoch_cache:
                ws = WriteSet()
                ws.put("partition_meta", self.prefix, self._meta(kept_epochs))
                self.storage.write(ws)
                self.epoch_cache = kept_epochs
            return
        offset = max(offset, self.log_start_offset)
        floor = self.storage.floor("log", self._log_key(offset), self.prefix)
        if floor is not None:
            batch = RecordBatch.FromString(floor[1])
            if batch.base_offset < offset < batch.base_offset + batch.record_count:
                offset = batch.base_offset  # batches are whole: truncate to the start of the one cut
        kept = [
            RecordBatch.FromString(v)
            for _k, v in self.storage.scan("log", self._log_key(self.log_start_offset), self._log_key(offset))
        ]
        saved = (self.producers, self.open_txns, self.aborted, self.epoch_cache, self.log_end_offset)
        saved_unreplicated, saved_size = self._unreplicated, self._size
        self.producers, self.open_txns, self.aborted = {}, {}, {}
        self._unreplicated = []
        self.epoch_cache = [(e, s) for e, s in saved[3] if s < offset]
        self.log_end_offset = self.log_start_offset
        self._size = 0  # the replay below counts what is kept
        scratch = WriteSet()
        for batch in kept:
            self._stage(batch, scratch)()
        ws = WriteSet()
        end = self.prefix + b"\xff" * 9
        ws.delete_range("log", self._log_key(offset), self._end_key + b"\xff")
        ws.delete_range("producers", self.prefix, end)
        ws.delete_range("txn_index", self.prefix, end)
        for pid, entry in self.producers.items():
            ws.put("producers", self.prefix + _PID.pack(pid), entry.encode())
        for pid, ranges in self.aborted.items():
            for first, last in ranges:
                ws.put("txn_index", self.prefix + _OFFSET.pack(first), _ABORTED.pack(pid, last))
        self.high_watermark = min(self.high_watermark, self.log_end_offset)
        ws.put("partition_meta", self.prefix, self._meta())
        try:
            self.storage.write(ws)
        except Exception:
            self.producers, self.open_txns, self.aborted, self.epoch_cache, self.log_end_offset = saved
            self._unreplicated, self._size = saved_unreplicated, saved_size
            raise
        self._checkpointed_hw = self.high_watermark

    # -- reads ------------------------------------------------------------------------------------

    def _is_aborted(self, pid: int, offset: int) -> bool:
        ranges = self.aborted.get(pid)
        if not ranges:
            return False
        i = bisect.bisect_right(ranges, (offset, 2**63)) - 1
        return i >= 0 and ranges[i][0] <= offset <= ranges[i][1]

    def read(self, fetch_offset: int, max_bytes: int, read_committed: bool, upto: int | None = None) -> ReadResult:
        """Batches from ``fetch_offset`` up to the HW (LSO for read_committed; ``upto`` for followers).

        At least one batch is returned when there is one, whatever ``max_bytes`` says.
        """
        if fetch_offset < self.log_start_offset or fetch_offset > self.log_end_offset:
            raise errors.OffsetOutOfRangeError(
                f"offset {fetch_offset} is outside [{self.log_start_offset}, {self.log_end_offset}] "
                f"of {self.topic}-{self.partition}",
            )
        limit = self.last_stable_offset if read_committed else self.high_watermark
        if upto is not None:
            limit = upto
        out: list[RecordBatch] = []
        raw: list[bytes] = []
        aborted: list[tuple[int, int]] = []
        size = 0
        next_offset = fetch_offset
        # from the batch that holds fetch_offset (keys are base offsets)
        for _key, value in self.storage.scan("log", self._log_key(fetch_offset), self._log_key(limit), self.prefix):
            batch = RecordBatch.FromString(value)
            last = batch.base_offset + batch.record_count - 1
            if last < fetch_offset:
                continue
            if out and size + len(value) > max_bytes:
                break
            next_offset = last + 1
            if read_committed and (
                batch.control or (batch.transactional and self._is_aborted(batch.producer_id, batch.base_offset))
            ):
                continue
            out.append(batch)
            raw.append(value)
            size += len(value)
            if size >= max_bytes:
                break
        if not read_committed and out:
            lo, hi = out[0].base_offset, next_offset - 1
            for pid, ranges in self.aborted.items():
                aborted.extend((pid, first) for first, last in ranges if first <= hi and last >= lo)
        return ReadResult(out, next_offset, aborted, size, raw)

    def first_control_offset(self, start: int) -> int | None:
        """The offset of the first control batch (marker) at or after ``start``; None if there is none."""
        for _key, value in self.storage.scan("log", self._log_key(start), self._end_key):
            batch = RecordBatch.FromString(value)
            if batch.control and batch.base_offset >= start:
                return int(batch.base_offset)
        return None

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int]:
        """(offset, timestamp) of the first record with timestamp >= ``timestamp``; (-1, -1) if none."""
        for _key, value in self.storage.scan("log", self._log_key(self.log_start_offset), self._end_key):
            batch = RecordBatch.FromString(value)
            if batch.control or batch.max_timestamp < timestamp or batch.base_offset >= self.high_watermark:
                continue
            for rec in decode_records(batch):
                if rec.timestamp >= timestamp and rec.offset >= self.log_start_offset:
                    return rec.offset, rec.timestamp
        return -1, -1

    def max_timestamp_offset(self) -> tuple[int, int]:
        best = (-1, -1)
        for _key, value in self.storage.scan("log", self._log_key(self.log_start_offset), self._end_key):
            batch = RecordBatch.FromString(value)
            if batch.control or batch.base_offset >= self.high_watermark:
                continue
            if batch.max_timestamp > best[1]:
                for rec in decode_records(batch):
                    if rec.timestamp == batch.max_timestamp:
                        best = (rec.offset, rec.timestamp)
                        break
        return best

    # -- retention --------------------------------------------------------------------------------

    def apply_retention(self, now: int) -> int:
        """Drop whole batches past retention.ms / retention.bytes; returns the new log start offset.

        Never drops past the LSO, so an open transaction keeps its data and a
        read_committed consumer never loses what it has not been allowed to read.
        """
        retention_ms = int(self.config("retention.ms"))
        retention_bytes = int(self.config("retention.bytes"))
        if retention_ms < 0 and retention_bytes < 0:
            return self.log_start_offset
        bound = self.last_stable_offset
        entries = []
        total = 0
        for key, value in self.storage.scan("log", self._log_key(self.log_start_offset), self._log_key(bound)):
            batch = RecordBatch.FromString(value)
            entries.append((key, batch.base_offset + batch.record_count, batch.max_timestamp, len(value)))
            total += len(value)
        new_start, before = self.log_start_offset, total
        for _key, end, max_ts, size in entries:
            too_old = retention_ms >= 0 and max_ts < now - retention_ms
            too_big = retention_bytes >= 0 and total > retention_bytes
            if not (too_old or too_big):
                break
            new_start = end
            total -= size
        if new_start > self.log_start_offset:
            self.advance_log_start(new_start, removed_bytes=before - total)
        return self.log_start_offset

    def compact(self, now: int) -> int:
        """Drop the batches of a compacted partition that no reader of the latest values needs.

        Only the decided part of the log is cleaned: below min(LSO, HW), every
        transaction there has its marker; and, as Kafka's min.compaction.lag.ms,
        only batches older than that lag (by their max timestamp): the first
        newer batch ends the cleanable part. A data batch stays if one of its
        records is the latest for its key (a tombstone only until
        delete.retention.ms has passed), or if its transaction is undecided; an
        aborted batch goes; a marker stays while a batch of its transaction
        does. Whole batches are dropped, never rewritten, so offsets and batch
        headers are untouched and followers copy gaps as gaps. The last batch of
        the log always stays: the log end offset is read from it at start-up.
        Returns the number of batches dropped.
        """
        bound = min(self.last_stable_offset, self.high_watermark)
        delete_retention_ms = int(str(self.config("delete.retention.ms")))
        lag_ms = int(str(self.config("min.compaction.lag.ms")))
        entries: list[tuple[bytes, RecordBatch]] = []
        stored_size: dict[bytes, int] = {}
        for key, value in self.storage.scan("log", self._log_key(self.log_start_offset), self._log_key(bound)):
            batch = RecordBatch.FromString(value)
            if lag_ms > 0 and batch.max_timestamp > now - lag_ms:
                break  # too recent to clean, and so is everything after it
            entries.append((key, batch))
            stored_size[key] = len(value)
        if len(entries) < 2:
            return 0
        last_key = self.storage.last("log", self.prefix, self._end_key)
        pending: dict[int, list[int]] = {}  # producer id -> its undecided transactional batches
        marker_of: dict[int, int] = {}  # data batch offset -> its marker's offset
        aborted: set[int] = set()
        for _key, b in entries:
            if b.control:
                committed, _epoch = parse_control(b)
                for offset in pending.pop(b.producer_id, []):
                    marker_of[offset] = b.base_offset
                    if not committed:
                        aborted.add(offset)
            elif b.transactional:
                pending.setdefault(b.producer_id, []).append(b.base_offset)
        undecided = {o for offsets in pending.values() for o in offsets}
        latest: dict[bytes, int] = {}
        records: dict[int, list[tuple[bytes | None, int, bool, int]]] = {}
        for _key, b in entries:
            if b.control or b.base_offset in aborted or b.base_offset in undecided:
                continue
            recs = [(r.key, r.offset, r.value is None, r.timestamp) for r in decode_records(b)]
            records[b.base_offset] = recs
            for k, offset, _tomb, _ts in recs:
                if k is not None:
                    latest[k] = offset
        kept_markers: set[int] = set()
        drop: list[bytes] = []
        for key, b in entries:
            if b.control or key == (last_key[0] if last_key else None):
                continue
            offset = b.base_offset
            keep = offset in undecided or (
                offset not in aborted
                and any(
                    k is None or (latest.get(k) == o and not (tomb and ts < now - delete_retention_ms))
                    for k, o, tomb, ts in records.get(offset, [])
                )
            )
            if keep:
                if offset in marker_of:
                    kept_markers.add(marker_of[offset])
            else:
                drop.append(key)
        for key, b in entries:
            if b.control and b.base_offset not in kept_markers and key != (last_key[0] if last_key else None):
                drop.append(key)
        if not drop:
            return 0
        ws = WriteSet()
        for key in drop:
            ws.delete("log", key)
        gone = {pid: [r for r in ranges if r[1] < bound] for pid, ranges in self.aborted.items()}
        for ranges in gone.values():
            for first, _last in ranges:
                ws.delete("txn_index", self.prefix + _OFFSET.pack(first))
        old_size = self.size_bytes
        self._size = old_size - sum(stored_size[key] for key in drop)
        ws.put("partition_meta", self.prefix, self._meta())
        try:
            self.storage.write(ws)
        except Exception:
            self._size = old_size
            raise
        for pid, ranges in gone.items():
            self.aborted[pid] = [r for r in self.aborted[pid] if r not in ranges]
            if not self.aborted[pid]:
                del self.aborted[pid]
        return len(drop)

    def advance_log_start(self, new_start: int, *, removed_bytes: int) -> None:
        """Drop the batches below ``new_start``, ``removed_bytes`` of them (retention has just summed them)."""
        ws = WriteSet()
        ws.delete_range("log", self._log_key(self.log_start_offset), self._log_key(new_start))
        old_start, old_size = self.log_start_offset, self.size_bytes
        self.log_start_offset = new_start
        self._size = max(0, old_size - removed_bytes)
        ws.put("partition_meta", self.prefix, self._meta())
        for ranges in self.aborted.values():
            for first, last in ranges:
                if last < new_start:
                    ws.delete("txn_index", self.prefix + _OFFSET.pack(first))
        try:
            self.storage.write(ws)
        except Exception:
            self.log_start_offset, self._size = old_start, old_size
            raise
        for pid in list(self.aborted):
            self.aborted[pid] = [r for r in self.aborted[pid] if r[1] >= new_start]
            if not self.aborted[pid]:
                del self.aborted[pid]

    def reset_to(self, offset: int) -> None:
        """Drop the whole log and start empty at ``offset`` (a follower behind the leader's log start)."""
        ws = WriteSet()
        end = self.prefix + b"\xff" * 9
        for cf in ("log", "producers", "txn_index"):
            ws.delete_range(cf, self.prefix, end)
        self.log_start_offset = self.log_end_offset = self.high_watermark = offset
        self._size = 0
        self.producers, self.open_txns, self.aborted = {}, {}, {}
        self._unreplicated = []
        self.epoch_cache = []
        ws.put("partition_meta", self.prefix, self._meta())
        self.storage.write(ws)
        self._checkpointed_hw = offset

    def delete_all(self) -> None:
        """Remove every key of this partition (topic deletion)."""
        ws = WriteSet()
        end = self.prefix + b"\xff" * 9
        for cf in ("log", "producers", "txn_index"):
            ws.delete_range(cf, self.prefix, end)
        ws.delete("partition_meta", self.prefix)
        self.storage.write(ws)
