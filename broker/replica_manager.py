"""The partitions this broker holds, and the data-path requests on them.

The ReplicaManager creates a :class:`PartitionLog` for every partition the
cluster view places on this broker, drops it when its topic is deleted, and
answers Produce, Fetch, ListOffsets and WriteTxnMarkers for the partitions it
leads. Coordinators use it to write to and replay their internal partitions,
and hear about leadership of those partitions through ``leadership_listeners``.

Concurrency: the broker runs one asyncio loop; an append is synchronous code
between awaits, so appends to one partition never interleave. The only await
on the produce path is the transaction verification of a partition's first
transactional batch, which holds the partition's lock so pipelined batches of
that producer stay in order.

Replication is not here yet: every partition has one replica, so the high
watermark follows the log end offset. The seams for it are ``leader_epoch``
(stamped on every batch), ``high_watermark`` and ``leadership_listeners``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterator

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import INTERNAL_TOPICS, ClusterView, TopicInfo
from sluice.broker.config import BrokerConfig
from sluice.broker.partition import PartitionError, PartitionLog, validate_batch
from sluice.broker.storage import Storage
from sluice.records import RecordBatch, now_ms

log = logging.getLogger(__name__)

TopicPartitionKey = tuple[str, int]
# (transactional id, producer id, epoch, topic, partition) -> (error code, message)
TxnVerifier = Callable[[str, int, int, str, int], Awaitable[tuple[pb.ErrorCode, str]]]
LeadershipListener = Callable[[str, int, bool, int], None]  # topic, partition, is_leader, leader epoch

DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
LATEST, EARLIEST, MAX_TIMESTAMP = -1, -2, -3


class ReplicaManager:
    def __init__(self, storage: Storage, cluster: ClusterView, config: BrokerConfig) -> None:
        self.storage = storage
        self.cluster = cluster
        self.config = config
        self.partitions: dict[TopicPartitionKey, PartitionLog] = {}
        self.leader_of: set[TopicPartitionKey] = set()
        self.txn_verifier: TxnVerifier | None = None
        self.leadership_listeners: list[LeadershipListener] = []
        self._locks: dict[TopicPartitionKey, asyncio.Lock] = {}
        self._data_arrived = asyncio.Event()
        cluster.listeners.append(self._on_topic_change)

    # -- partitions follow the cluster view ------------------------------------------------------

    def _config_lookup(self, topic: str) -> Callable[[str], object]:
        def lookup(key: str) -> object:
            info = self.cluster.topics.get(topic)
            return self.config.topic_value(info.config if info else {}, key)

        return lookup

    def _on_topic_change(self, old: TopicInfo | None, new: TopicInfo | None) -> None:
        me = self.config.broker_id
        if old is not None and (new is None or new.topic_id != old.topic_id):
            for p in range(len(old.partitions)):
                part = self.partitions.pop((old.name, p), None)
                if (old.name, p) in self.leader_of:
                    self.leader_of.discard((old.name, p))
                    self._tell_leadership(old.name, p, False, -1)
                if part is not None:
                    part.delete_all()
            old = None
        if new is None:
            return
        for p, info in enumerate(new.partitions):
            key = (new.name, p)
            if me not in info.replicas:
                continue
            part = self.partitions.get(key)
            if part is None:
                part = PartitionLog(self.storage, new.name, p, new.topic_id, self._config_lookup(new.name))
                self.partitions[key] = part
            if info.leader == me:
                part.set_leader_epoch(info.leader_epoch)
                if key not in self.leader_of:
                    self.leader_of.add(key)
                    self._tell_leadership(new.name, p, True, info.leader_epoch)
            elif key in self.leader_of:
                self.leader_of.discard(key)
                self._tell_leadership(new.name, p, False, info.leader_epoch)

    def _tell_leadership(self, topic: str, partition: int, is_leader: bool, epoch: int) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(topic, partition, is_leader, epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", topic, partition)

    def leader_partition(self, topic: str, partition: int) -> PartitionLog:
        """The partition if this broker leads it, else the PartitionError a client should see."""
        info = self.cluster.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            raise PartitionError(pb.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic or partition {topic}-{partition}")
        part = self.partitions.get((topic, partition))
        if part is None or (topic, partition) not in self.leader_of:
            raise PartitionError(
                pb.NOT_LEADER_OR_FOLLOWER, f"broker {self.config.broker_id} does not lead {topic}-{partition}"
            )
        return part

    def _after_append(self, part: PartitionLog) -> None:
        # One replica: what is stored is committed. Replication moves this to the ISR's acks.
        part.high_watermark = part.log_end_offset
        self._data_arrived.set()
        self._data_arrived = asyncio.Event()

    # -- produce ----------------------------------------------------------------------------------

    async def produce(self, req: bpb.ProduceRequest) -> bpb.ProduceResponse:
        resp = bpb.ProduceResponse()
        for topic in req.topics:
            tresp = resp.topics.add(name=topic.name)
            for pdata in topic.partitions:
                presp = tresp.partitions.add(partition=pdata.partition, base_offset=-1, log_append_time=-1)
                try:
                    part = self.leader_partition(topic.name, pdata.partition)
                    base, _dup = await self._produce_one(req, topic.name, part, pdata.batch)
                    presp.base_offset = base
                    presp.log_start_offset = part.log_start_offset
                    if part.config("message.timestamp.type") == "LogAppendTime":
                        presp.log_append_time = pdata.batch.max_timestamp
                except PartitionError as exc:
                    presp.error_code = exc.code
                    presp.error_message = exc.message
        return resp

    async def _produce_one(
        self, req: bpb.ProduceRequest, topic: str, part: PartitionLog, batch: RecordBatch
    ) -> tuple[int, bool]:
        if req.acks not in (-1, 0, 1):
            raise PartitionError(pb.INVALID_REQUIRED_ACKS, f"acks must be -1 (all), 0 or 1, not {req.acks}")
        if topic in INTERNAL_TOPICS:
            raise PartitionError(pb.INVALID_TOPIC_EXCEPTION, f"clients cannot write to internal topic {topic}")
        validate_batch(batch, int(str(part.config("max.message.bytes"))))
        needs_verification = batch.transactional and batch.producer_id not in part.open_txns
        if not needs_verification:
            result = part.append(batch)
            self._after_append(part)
            return result
        key = (part.topic, part.partition)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if batch.producer_id not in part.open_txns:
                await self._verify_txn(req.transactional_id, batch, part)
            result = part.append(batch, verified_txn=True)
            self._after_append(part)
            return result

    async def _verify_txn(self, transactional_id: str, batch: RecordBatch, part: PartitionLog) -> None:
        """KIP-890's defence against hanging transactions: the partition asks the coordinator."""
        if not transactional_id:
            raise PartitionError(pb.INVALID_REQUEST, "transactional batches need ProduceRequest.transactional_id")
        if self.txn_verifier is None:
            raise PartitionError(pb.COORDINATOR_NOT_AVAILABLE, "the transaction coordinator is not running")
        code, message = await self.txn_verifier(
            transactional_id, batch.producer_id, batch.producer_epoch, part.topic, part.partition
        )
        if code != pb.NONE:
            raise PartitionError(code, message)

    # -- internal writes (coordinators) ---------------------------------------------------------

    def append_internal(self, topic: str, partition: int, batch: RecordBatch) -> int:
        """Append a batch a coordinator built (its crc is trusted). Returns the base offset."""
        part = self.leader_partition(topic, partition)
        offset, _dup = part.append(batch, verified_txn=True)
        self._after_append(part)
        return offset

    def iter_batches(self, topic: str, partition: int, start: int = -1) -> Iterator[RecordBatch]:
        """Every batch from ``start`` (default: log start) to the HW, control batches included."""
        part = self.partitions[(topic, partition)]
        offset = part.log_start_offset if start < 0 else start
        while offset < part.high_watermark:
            result = part.read(offset, 4 * 1024 * 1024, read_committed=False)
            if not result.batches:
                break
            yield from result.batches
            offset = result.next_fetch_offset

    # -- markers ----------------------------------------------------------------------------------

    def write_markers(self, req: ipb.WriteTxnMarkersRequest) -> ipb.WriteTxnMarkersResponse:
        resp = ipb.WriteTxnMarkersResponse()
        for marker in req.markers:
            mresp = resp.markers.add(producer_id=marker.producer_id)
            for tp in marker.partitions:
                presp = mresp.partitions.add(topic=tp.topic, partition=tp.partition)
                try:
                    part = self.leader_partition(tp.topic, tp.partition)
                    offset = part.write_marker(
                        marker.producer_id, marker.producer_epoch, marker.committed, marker.coordinator_epoch
                    )
                    if offset is not None:
                        self._after_append(part)
                except PartitionError as exc:
                    presp.error_code = exc.code
                    presp.error_message = exc.message
        return resp

    # -- fetch ------------------------------------------------------------------------------------

    async def fetch(self, req: bpb.FetchRequest) -> bpb.FetchResponse:
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        max_bytes = req.max_bytes or self.config.int("fetch.max.bytes")
        min_bytes = max(req.min_bytes, 0)
        read_committed = req.isolation_level == pb.READ_COMMITTED
        while True:
            waiter = self._data_arrived
            resp, total, errors = self._fetch_once(req, max_bytes, read_committed)
            remaining = deadline - time.monotonic()
            if total >= max(min_bytes, 1) or errors or remaining <= 0:
                return resp
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(waiter.wait(), remaining)

    def _fetch_once(
        self, req: bpb.FetchRequest, max_bytes: int, read_committed: bool
    ) -> tuple[bpb.FetchResponse, int, bool]:
        resp = bpb.FetchResponse()
        total = 0
        errors = False
        for topic in req.topics:
            tresp = resp.topics.add(name=topic.name)
            for fp in topic.partitions:
                presp = tresp.partitions.add(
                    partition=fp.partition,
                    high_watermark=-1,
                    last_stable_offset=-1,
                    log_start_offset=-1,
                    next_fetch_offset=fp.fetch_offset,
                )
                try:
                    part = self.leader_partition(topic.name, fp.partition)
                    if fp.current_leader_epoch >= 0 and fp.current_leader_epoch != part.leader_epoch:
                        code = (
                            pb.FENCED_LEADER_EPOCH
                            if fp.current_leader_epoch < part.leader_epoch
                            else pb.UNKNOWN_LEADER_EPOCH
                        )
                        raise PartitionError(
                            code, f"leader epoch {fp.current_leader_epoch}, the partition is at {part.leader_epoch}"
                        )
                    presp.high_watermark = part.high_watermark
                    presp.last_stable_offset = part.last_stable_offset
                    presp.log_start_offset = part.log_start_offset
                    budget = min(fp.partition_max_bytes or DEFAULT_PARTITION_MAX_BYTES, max(max_bytes - total, 1))
                    result = part.read(fp.fetch_offset, budget, read_committed)
                    presp.batches.extend(result.batches)
                    presp.next_fetch_offset = result.next_fetch_offset
                    for pid, first in result.aborted:
                        presp.aborted_transactions.add(producer_id=pid, first_offset=first)
                    total += result.size
                    if result.next_fetch_offset > fp.fetch_offset and not result.batches:
                        total += 1  # stepped over aborted data: worth answering now
                except PartitionError as exc:
                    presp.error_code = exc.code
                    presp.error_message = exc.message
                    errors = True
        return resp, total, errors

    # -- list offsets -----------------------------------------------------------------------------

    def list_offsets(self, req: bpb.ListOffsetsRequest) -> bpb.ListOffsetsResponse:
        resp = bpb.ListOffsetsResponse()
        read_committed = req.isolation_level == pb.READ_COMMITTED
        for topic in req.topics:
            tresp = resp.topics.add(name=topic.name)
            for lp in topic.partitions:
                presp = tresp.partitions.add(partition=lp.partition, offset=-1, timestamp=-1)
                try:
                    part = self.leader_partition(topic.name, lp.partition)
                    presp.leader_epoch = part.leader_epoch
                    if lp.timestamp == LATEST:
                        presp.offset = part.last_stable_offset if read_committed else part.high_watermark
                    elif lp.timestamp == EARLIEST:
                        presp.offset = part.log_start_offset
                    elif lp.timestamp == MAX_TIMESTAMP:
                        presp.offset, presp.timestamp = part.max_timestamp_offset()
                    elif lp.timestamp >= 0:
                        presp.offset, presp.timestamp = part.offset_for_timestamp(lp.timestamp)
                    else:
                        raise PartitionError(pb.INVALID_REQUEST, f"unknown offset spec {lp.timestamp}")
                except PartitionError as exc:
                    presp.error_code = exc.code
                    presp.error_message = exc.message
        return resp

    # -- housekeeping -----------------------------------------------------------------------------

    def apply_retention(self) -> None:
        now = now_ms()
        for key in list(self.leader_of):
            part = self.partitions.get(key)
            if part is not None and key[0] not in INTERNAL_TOPICS:
                try:
                    part.apply_retention(now)
                except Exception:
                    log.exception("retention failed on %s-%d", *key)
