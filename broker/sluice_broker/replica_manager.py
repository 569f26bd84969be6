"""The partitions this broker holds, the leader side of replication, and the data-path requests on them.

The ReplicaManager follows the cluster view: it opens a :class:`PartitionLog` (through the log
manager) for every partition placed on this broker, leads or follows it at the metadata's
leader epoch, drops it when its topic is deleted, and answers Produce, Fetch, ListOffsets and
WriteTxnMarkers for the partitions it leads, in the core's own types
(:mod:`sluice.broker.data_path`). Coordinators use it to write to and replay their internal partitions,
and hear about leadership of those partitions through ``leadership_listeners``.

Concurrency: the broker runs one asyncio loop; an append is synchronous code
between awaits, so appends to one partition never interleave. The only await
on the produce path is the transaction verification of a partition's first
transactional batch, which holds the partition's lock so pipelined batches of
that producer stay in order.

Replication (DESIGN 7; the follower side is in :mod:`replication`): the leader
answers ReplicaFetch, remembers each follower's log end offset, and keeps the
high watermark at the smallest log end offset of the ISR. acks=all answers once
the HW covers the batch; fewer in-sync replicas than min.insync.replicas refuses
the write up front (NOT_ENOUGH_REPLICAS). A follower that has not caught up for
replica.lag.time.max.ms leaves the ISR, and one that caught up rejoins it; both
are compare-and-set into the topic document, and only while this broker is
still the leader at its epoch there, so a deposed leader cannot change an ISR.

The logs themselves are the :class:`~sluice.broker.log.manager.LogManager`'s (disk, free space,
stray partitions, retention): this class opens a partition's log there when the metadata places
it here and deletes it when it goes.

A failed log directory (a full disk: :mod:`sluice.broker.log.storage`) takes every partition
offline here at once, as Kafka does for the partitions of an offline log dir: this broker stops
leading and following (coordinators unload), every request for a partition is answered
KAFKA_STORAGE_ERROR (retriable: clients look the leader up again), and metadata changes touch
nothing on disk any more. Main turns readiness NOT_SERVING and records the failure in this
broker's ``brokers/<id>`` document, where the controller reads it and moves leadership to the
replicas that can write. A restart (after space is freed) starts from what the write-ahead log
holds and catches up like any returning follower.

Offsets a client was told never go back (docs/architecture.md, "Offsets and
visibility"): the LSO waits for markers to be below the HW (PartitionLog), and
a new leader whose HW is still below the start of its own leader epoch answers
ListOffsets(latest) with OFFSET_NOT_AVAILABLE (retriable, Kafka's KIP-207): until
its followers catch up it cannot know how far the previous leader's HW got.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator

from sluice import errors
from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import INTERNAL_TOPICS, ClusterView, PartitionInfo, TopicInfo
from sluice.broker.config import BrokerConfig
from sluice.broker.data_path import (
    EARLIEST,
    LATEST,
    MAX_TIMESTAMP,
    ActiveProducer,
    FetchedPartition,
    FetchInput,
    OffsetAnswer,
    OffsetQuery,
    ProduceInput,
    ProduceResult,
)
from sluice.broker.errors import answer
from sluice.broker.events import BrokerEvents, FetchTally
from sluice.broker.log.fetch_response import ReplicaFetchResponseWriter
from sluice.broker.log.manager import LogManager
from sluice.broker.log.partition import PartitionLog, validate_batch
from sluice.broker.log.record_check import check_produced
from sluice.broker.log.stray import (
    normalize_topic_id,
)
from sluice.broker.replication.fetcher import (
    FollowerTracker,
    ReplicaFetcherManager,
    check_epoch,
    divergence,
)
from sluice.broker.replication.fetcher import now_ms as monotonic_ms
from sluice.broker.replication.throttle import ReplicationThrottle
from sluice.broker.replication.wakeups import PartitionWaits
from sluice.broker.topic_partition import TopicPartition
from sluice.errors import SluiceError
from sluice.metadata.documents import IsrRequest
from sluice.metadata.isr import IsrChange, IsrOutcome
from sluice.metadata.store import StoreUnavailable
from sluice.records import KAFKA_V2, RecordBatch, RecordDecodeError, now_ms, to_sluice_format

log = logging.getLogger(__name__)

# a per-partition result to fill in, and the (topic, partition, end offset) it waits to see replicated
ReplicationWait = tuple[ProduceResult | ipb.MarkerPartitionResult, str, int, int]
# (transactional id, producer id, epoch, topic, partition) -> (error code, message)
TxnVerifier = Callable[[str, int, int, str, int], Awaitable[tuple[pb.ErrorCode, str]]]
LeadershipListener = Callable[[str, int, bool, int], None]  # topic, partition, is_leader, leader epoch

DEFAULT_PARTITION_MAX_BYTES = 1024 * 1024
MARKER_REPLICATION_TIMEOUT_S = 30.0
# a follower rejoins the ISR only if it fetched this recently (a replica fetch waits at most 500 ms)
ISR_FETCH_RECENCY_MS = 1500
ISR_WRITES_IN_FLIGHT = 4  # topic documents a leader writes ISR changes to at once
# An ISR request the controller has not decided in this long is written by the leader itself (the same
# rule, so either writer is safe): ISR changes keep flowing while the controller is down or cut off.
ISR_REQUEST_TIMEOUT_S = 3.0
ISR_FALLBACK_WARNING_INTERVAL_S = 10.0
# Test-only hook (docs/architecture.md, "Test-only hooks"): while the file HOLD_MARKERS_FILE exists in the
# data directory, this broker as leader serves followers nothing from the first marker of a client topic on.
HOOK_HOLD_MARKERS = "replication.hold_markers"
HOLD_MARKERS_FILE = "hold-markers"
# Test-only hook: while HOLD_VERIFICATION_FILE exists in the data directory, a transactional produce that
# the coordinator just verified (KIP-890) waits before its append; VERIFICATION_HELD_FILE says one waits.
HOOK_HOLD_VERIFICATION = "produce.hold_verification"
HOLD_VERIFICATION_FILE = "hold-verification"
VERIFICATION_HELD_FILE = "verification-held"
HOLD_VERIFICATION_MAX_S = 120.0
# Test-only hook: while SKIP_VERIFICATION_FILE exists in the data directory, transactional batches are
# appended without KIP-890's verification, as a broker before it did: the way to leave a hanging
# transaction (data its coordinator does not know of) for the find-hanging and abort tests.
HOOK_SKIP_VERIFICATION = "produce.skip_verification"
SKIP_VERIFICATION_FILE = "skip-verification"


# Codecs of Sluice's encoding that brokers from before records_format (d37a648) read: not snappy.
_CODECS_EVERY_VERSION_READS = frozenset({pb.COMPRESSION_GZIP, pb.COMPRESSION_LZ4, pb.COMPRESSION_ZSTD})


class ReplicaManager:
    def __init__(
        self,
        logs: LogManager,
        cluster: ClusterView,
        config: BrokerConfig,
        channels: BrokerChannels,
    ) -> None:
        self.logs = logs
        self.storage = logs.storage
        self.cluster = cluster
        self.config = config
        self.partitions = logs.partitions  # the logs held here (the log manager opens and deletes them)
        self.leader_of: set[TopicPartition] = set()
        self.trackers: dict[TopicPartition, FollowerTracker] = {}
        # reassignment traffic this broker sends as leader (leader.replication.throttled.rate)
        self.reassignment_throttle = ReplicationThrottle(self.config.int("leader.replication.throttled.rate"))
        # ISR changes being written to the store (maintain_isr): old and new members, which the HW counts
        self._pending_isr: dict[TopicPartition, set[int]] = {}
        self._isr_unsure: set[TopicPartition] = set()  # ISR writes of unknown outcome: read again first
        # ISR changes asked of the controller (isr_requests/<id>) and not yet decided: (change, when asked)
        self._isr_requested: dict[TopicPartition, tuple[IsrChange, float]] = {}
        self._isr_fallback_warned_at = -ISR_FALLBACK_WARNING_INTERVAL_S
        self.txn_verifier: TxnVerifier | None = None  # the transaction coordinator's (verify_transactions_with)
        self.leadership_listeners: list[LeadershipListener] = []
        self.events = BrokerEvents()  # counted as they happen, for the metrics endpoint
        self._locks: dict[TopicPartition, asyncio.Lock] = {}
        # Long polls, woken per partition (replication/wakeups): followers' fetches by new batches,
        # consumers' fetches and acks=all/coordinator writes by a moved high watermark.
        self._appended = PartitionWaits()
        self._advanced = PartitionWaits()
        try:  # the loop the broker runs on (None when built outside one, as unit tests do)
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self.channels = channels
        self.fetchers = ReplicaFetcherManager(
            config.broker_id,
            self.partitions,
            self.channels,
            config.int("replica.fetch.max.bytes"),
            self._wake,
            ReplicationThrottle(config.int("follower.replication.throttled.rate")),
        )
        cluster.listeners.append(self._on_topic_change)
        # a running rebalance's throttle (the replication_throttle document) overrides both rates
        cluster.throttle_listeners.append(self._on_throttle_change)
        self._on_throttle_change(cluster.replication_throttle)
        logs.storage.failure_listeners.append(self._on_storage_failure)

    # -- partitions follow the cluster view ------------------------------------------------------

    def _on_throttle_change(self, rate: int | None) -> None:
        """The cluster view's replication_throttle changed: both reassignment buckets use ``rate``
        (None: back to leader/follower.replication.throttled.rate)."""
        self.reassignment_throttle.override(rate)
        self.fetchers.throttle.override(rate)

    def _on_storage_failure(self, reason: str) -> None:
        """Storage's failure listener: handle it on the event loop, after the failing call has unwound.

        The listener runs inside the call that failed (an append half way through a coordinator's
        write, say) or on the reclaim thread (a compaction): neither may change leadership state
        there and then. The failing call raises KafkaStorageError by itself; every other request
        is refused by ``_check_storage`` meanwhile.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            self._handle_storage_failure(reason)
            return
        try:
            running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            loop.call_soon(self._handle_storage_failure, reason)
        else:
            loop.call_soon_threadsafe(self._handle_storage_failure, reason)

    def _handle_storage_failure(self, reason: str) -> None:
        """The log directory went offline: stop leading and following everything (see the module docstring)."""
        log.error("log directory offline (%s): broker %d stops leading and following", reason, self.config.broker_id)
        for key in list(self.leader_of):
            self.leader_of.discard(key)
            self.trackers.pop(key, None)
            self._tell_leadership(key[0], key[1], False, -1)
        for key in list(self.fetchers.followed):
            self.fetchers.unfollow(key)
        self._appended.wake_all()  # acks=all waits and long polls see the change at once
        self._advanced.wake_all()
        # into brokers/<id> in a worker thread (a store write may block); housekeeping retries a failure
        if self._loop is not None and not self._loop.is_closed():
            self._loop.run_in_executor(None, self.logs.report_storage_failure)
        else:
            self.logs.report_storage_failure()

    def _on_topic_change(self, old: TopicInfo | None, new: TopicInfo | None) -> None:
        me = self.config.broker_id
        self.logs.topics_changed()
        if self.storage.failure is not None:
            # Offline: nothing on disk changes now. Forget deleted topics; the stray check at the
            # next start deletes their data.
            if old is not None and (new is None or new.topic_id != old.topic_id):
                for p in range(len(old.partitions)):
                    self.partitions.pop((old.name, p), None)
            return
        if old is not None and (new is None or new.topic_id != old.topic_id):
            for p in range(len(old.partitions)):
                self._drop_partition((old.name, p))
            self.events.forget_topic(old.name)
            old = None
        if new is None:
            return
        for p, info in enumerate(new.partitions):
            key = (new.name, p)
            if me not in info.replicas:
                if key in self.partitions:  # reassigned away from this broker
                    self._drop_partition(key)
                continue
            part = self.logs.open(key, new.topic_id)
            if info.leader == me:
                self.fetchers.unfollow(key)
                epoch_changed = part.leader_epoch != info.leader_epoch
                part.become_leader(info.leader_epoch)
                if key not in self.leader_of or epoch_changed:
                    self.leader_of.add(key)
                    # Followers in the ISR get the lag time from now to show up, then leave it.
                    self.trackers[key] = FollowerTracker.starting(info.isr, me, monotonic_ms())
                    self._tell_leadership(new.name, p, True, info.leader_epoch)
                self._isr_request_decided(key, info)
                if self._maybe_advance_hw(key, part):  # the ISR may have shrunk to the replicas caught up
                    self._advanced.wake(key)
            else:
                self._forget_isr_request(key)
                if key in self.leader_of:
                    self.leader_of.discard(key)
                    self.trackers.pop(key, None)
                    self._wake([key])  # its long polls and replication waits answer NOT_LEADER now
                    self._tell_leadership(new.name, p, False, info.leader_epoch)
                part.become_follower(info.leader_epoch)  # appends admitted at our epoch fail from now on
                if info.leader >= 0:
                    self.fetchers.follow(key, info.leader, info.leader_epoch, throttled=me in info.adding_replicas)
                else:
                    self.fetchers.unfollow(key)

    def _isr_request_decided(self, key: TopicPartition, info: PartitionInfo) -> None:
        """The view's state of a partition this broker leads: if it moved past the partition epoch of
        an ISR request (the controller decided it, or something else changed the partition first),
        the request is over; if the ISR is now the one asked for, it was taken."""
        asked = self._isr_requested.get(key)
        if asked is None:
            return
        change, _at = asked
        if info.partition_epoch == change.partition_epoch and info.leader_epoch == change.leader_epoch:
            return  # not decided yet
        self._forget_isr_request(key)
        if set(info.isr) == set(change.isr):
            self._isr_changed(key, change)
        self._advanced.wake(key)  # a moved HW, or fewer in-sync replicas than acks=all waits need

    def _isr_changed(self, key: TopicPartition, change: IsrChange) -> None:
        """Log and count an ISR change of this leader's that the store took (written or asked for)."""
        log.info("%s-%d: ISR %s -> %s", key[0], key[1], list(change.base), list(change.isr))
        self.events.isr_changed(list(change.base), list(change.isr))

    def _forget_isr_request(self, key: TopicPartition) -> None:
        if self._isr_requested.pop(key, None) is not None:
            self._pending_isr.pop(key, None)

    def _drop_partition(self, key: TopicPartition) -> None:
        """Stop serving and following one partition and delete its data (its topic is gone or moved away)."""
        self._forget_isr_request(key)
        part = self.partitions.get(key)
        if part is not None:
            part.become_follower(-1)  # a request holding this log (awaiting verification) must not append
        self.fetchers.unfollow(key)
        self.trackers.pop(key, None)
        if key in self.leader_of:
            self.leader_of.discard(key)
            self._wake([key])
            self._tell_leadership(key[0], key[1], False, -1)
        if part is not None:
            self.logs.delete(part)

    def verify_transactions_with(self, verifier: TxnVerifier) -> None:
        """KIP-890: a partition's first transactional batch of a producer is appended only once
        ``verifier`` (the transaction coordinator) says the partition is in its open transaction."""
        self.txn_verifier = verifier

    def _tell_leadership(self, topic: str, partition: int, is_leader: bool, epoch: int) -> None:
        for listener in self.leadership_listeners:
            try:
                listener(topic, partition, is_leader, epoch)
            except Exception:
                log.exception("leadership listener failed for %s-%d", topic, partition)

    def leader_partition(self, topic: str, partition: int) -> PartitionLog:
        """The partition if this broker leads it, else the error a client should see."""
        info = self.cluster.topics.get(topic)
        if info is None or not 0 <= partition < len(info.partitions):
            raise errors.UnknownTopicOrPartitionError(f"unknown topic or partition {topic}-{partition}")
        self.logs.check_storage()
        part = self.partitions.get((topic, partition))
        if part is None or (topic, partition) not in self.leader_of:
            raise errors.NotLeaderOrFollowerError(f"broker {self.config.broker_id} does not lead {topic}-{partition}")
        return part

    def _wake(self, keys: Iterable[TopicPartition]) -> None:
        """Wake every wait parked on ``keys``: their leadership, log or high watermark changed."""
        for key in keys:
            self._appended.wake(key)
            self._advanced.wake(key)

    def isr(self, key: TopicPartition) -> list[int]:
        info = self.cluster.topics.get(key[0])
        if info is None or key[1] >= len(info.partitions):
            return []
        return info.partitions[key[1]].isr

    def _maybe_advance_hw(self, key: TopicPartition, part: PartitionLog) -> bool:
        """HW = the smallest log end offset in the ISR (this leader's included); it never goes back."""
        tracker = self.trackers.get(key)
        if tracker is None:
            return False
        me = self.config.broker_id
        hw = part.log_end_offset
        for replica in set(self.isr(key)) | self._pending_isr.get(key, set()):
            if replica != me:
                hw = min(hw, tracker.end_offset(replica))
        if hw > part.high_watermark:
            part.high_watermark = hw
            return True
        return False

    def _after_append(self, part: PartitionLog) -> None:
        key = (part.topic, part.partition)
        self._appended.wake(key)  # followers' fetches have something to copy
        if self._maybe_advance_hw(key, part):  # no other in-sync replica: committed at once
            self._advanced.wake(key)

    def _check_min_isr(self, key: TopicPartition, part: PartitionLog) -> None:
        min_isr = int(str(part.config("min.insync.replicas")))
        isr = self.isr(key)
        if len(isr) < min_isr:
            raise errors.NotEnoughReplicasError(
                f"{key[0]}-{key[1]} has {len(isr)} in-sync replica(s) {isr}, min.insync.replicas is {min_isr}",
            )

    async def wait_replicated(self, topic: str, partition: int, end_offset: int, timeout_s: float) -> None:
        """Wait until the HW reaches ``end_offset`` (acks=all), as long as this broker leads the partition."""
        key = (topic, partition)
        deadline = time.monotonic() + timeout_s
        with self._advanced.watching([key]) as advanced:
            while True:
                advanced.clear()
                if self._replicated(key, end_offset, deadline):
                    return
                # bounded, so a change nobody wakes us for (none is known) still ends the wait
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(advanced.wait(), min(deadline - time.monotonic(), 0.5))

    def _replicated(self, key: TopicPartition, end_offset: int, deadline: float) -> bool:
        """Whether the HW of ``key`` reached ``end_offset``; raises why the wait is over without it."""
        topic, partition = key
        self.logs.check_storage()
        part = self.partitions.get(key)
        if part is None or key not in self.leader_of:
            raise errors.NotLeaderOrFollowerError(
                f"broker {self.config.broker_id} lost the leadership of {topic}-{partition} before the write "
                "was replicated",
            )
        if part.high_watermark >= end_offset:
            min_isr = int(str(part.config("min.insync.replicas")))
            if len(self.isr(key)) < min_isr:
                raise errors.NotEnoughReplicasAfterAppendError(
                    f"stored, but the ISR of {topic}-{partition} shrank below min.insync.replicas={min_isr}",
                )
            return True
        if deadline - time.monotonic() <= 0:
            raise errors.RequestTimedOutError(
                f"{topic}-{partition}: the in-sync replicas did not acknowledge offset {end_offset - 1} in time",
            )
        return False

    # -- produce ----------------------------------------------------------------------------------

    async def produce(self, req: ProduceInput) -> list[ProduceResult]:
        """Append each partition's batch (as leader) and answer per partition, in the request's order.

        acks=all answers once the in-sync replicas have every batch, or ``timeout_ms`` passed.
        """
        results: list[ProduceResult] = []
        waits: list[ReplicationWait] = []
        for one in req.batches:
            result = ProduceResult(one.topic, one.partition)
            results.append(result)
            try:
                part = self.leader_partition(one.topic, one.partition)
                # the epoch this request is admitted at: the append checks it after every await
                epoch = part.leader_epoch
                base, stored = await self._produce_one(req, one.topic, part, epoch, one.batch)
                result.base_offset = base
                result.log_start_offset = part.log_start_offset
                if part.config("message.timestamp.type") == "LogAppendTime":
                    result.log_append_time = stored.max_timestamp
                if req.acks == -1:
                    waits.append((result, one.topic, one.partition, base + stored.record_count))
            except SluiceError as exc:
                self.events.produce_failed(one.topic, one.topic in self.cluster.topics)
                answer(result, exc)
        # Every partition is appended before any waits, so replication of all of them overlaps.
        await self._await_replication(waits, (req.timeout_ms or 30_000) / 1000)
        return results

    async def _produce_one(
        self, req: ProduceInput, topic: str, part: PartitionLog, epoch: int, batch: RecordBatch
    ) -> tuple[int, RecordBatch]:
        """Append one produced batch as leader: its base offset and the batch as stored (a duplicate's
        original offset and the batch as it came)."""
        if req.acks not in (-1, 0, 1):
            raise errors.InvalidRequiredAcksError(f"acks must be -1 (all), 0 or 1, not {req.acks}")
        if topic in INTERNAL_TOPICS:
            raise errors.InvalidTopicError(f"clients cannot write to internal topic {topic}")
        size = validate_batch(batch, int(str(part.config("max.message.bytes"))))
        earliest, _latest = check_produced(batch)  # Kafka's v2 records, whichever protocol brought them
        batch = self._in_stored_format(part, batch)
        key = (part.topic, part.partition)
        if req.acks == -1:
            self._check_min_isr(key, part)
        needs_verification = batch.transactional and batch.producer_id not in part.open_txns
        if needs_verification and self._skipping_verification():
            result = part.append(batch, leader_epoch=epoch, verified_txn=True, earliest_timestamp=earliest)
            self._after_append(part)
            self.events.produced(topic, size, batch.record_count, duplicate=result[1])
            return result[0], batch
        if not needs_verification:
            result = part.append(batch, leader_epoch=epoch, earliest_timestamp=earliest)
            self._after_append(part)
            self.events.produced(topic, size, batch.record_count, duplicate=result[1])
            return result[0], batch
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            if batch.producer_id not in part.open_txns:
                await self._verify_txn(req.transactional_id, batch, part)
                await self._hold_after_verification()
            # leadership may have moved while we waited: append() refuses unless we still lead at `epoch`
            result = part.append(batch, leader_epoch=epoch, verified_txn=True, earliest_timestamp=earliest)
            self._after_append(part)
            self.events.produced(topic, size, batch.record_count, duplicate=result[1])
            return result[0], batch

    def _in_stored_format(self, part: PartitionLog, batch: RecordBatch) -> RecordBatch:
        """``batch`` (validated) in the encoding this partition stores it in now.

        Sluice's encoding as it is. Kafka's (RECORDS_FORMAT_KAFKA_V2, what the Kafka listener hands
        over, or a gRPC producer sent) as sent, unless a replica of the partition runs code that cannot
        read it (:meth:`ClusterView.kafka_v2_writable`: a rolling upgrade from d37a648 or older is under
        way) or ``kafka.records.stored.as.sent`` is false: then converted into Sluice's encoding, as
        every broker did before records_format, so old followers copy it and an old leader serves it.
        """
        if batch.records_format != KAFKA_V2:
            return batch
        if self.config.get("kafka.records.stored.as.sent") and self.cluster.kafka_v2_writable(
            part.topic, part.partition
        ):
            return batch
        # The producer's codec is kept where brokers before records_format read it (as they converted);
        # snappy came with records_format, so such a batch is stored uncompressed.
        codec = batch.compression if batch.compression in _CODECS_EVERY_VERSION_READS else pb.COMPRESSION_NONE
        try:
            return to_sluice_format(batch, codec)
        except RecordDecodeError as exc:
            raise errors.CorruptMessageError(str(exc)) from None

    def _skipping_verification(self) -> bool:
        """The skip-verification test hook: True while its file exists; always False without the hook."""
        return self.config.hook(HOOK_SKIP_VERIFICATION) and os.path.exists(
            os.path.join(self.config.data_dir, SKIP_VERIFICATION_FILE)
        )

    async def _hold_after_verification(self) -> None:
        """The hold-verification test hook: wait (bounded) while its file exists; a no-op otherwise."""
        if not self.config.hook(HOOK_HOLD_VERIFICATION):
            return
        hold = os.path.join(self.config.data_dir, HOLD_VERIFICATION_FILE)
        held = os.path.join(self.config.data_dir, VERIFICATION_HELD_FILE)
        deadline = time.monotonic() + HOLD_VERIFICATION_MAX_S
        if os.path.exists(hold):
            with open(held, "w"):
                pass
            log.warning("test hook %s: holding a verified transactional produce", HOOK_HOLD_VERIFICATION)
        while os.path.exists(hold) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def _verify_txn(self, transactional_id: str, batch: RecordBatch, part: PartitionLog) -> None:
        """KIP-890's defence against hanging transactions: the partition asks the coordinator."""
        if not transactional_id:
            raise errors.InvalidRequestError("transactional batches need ProduceRequest.transactional_id")
        if self.txn_verifier is None:
            raise errors.CoordinatorNotAvailableError("the transaction coordinator is not running")
        code, message = await self.txn_verifier(
            transactional_id, batch.producer_id, batch.producer_epoch, part.topic, part.partition
        )
        if code != pb.NONE:
            raise errors.error_for(code, message)

    # -- internal writes (coordinators) ---------------------------------------------------------

    def append_internal(self, topic: str, partition: int, batch: RecordBatch, *, leader_epoch: int) -> int:
        """Append a batch a coordinator built (its crc is trusted). Returns the base offset.

        ``leader_epoch`` is the coordinator epoch the coordinator loaded the
        partition at: its state is only valid while this broker leads at it.
        Coordinators then ``await wait_replicated(...)`` before they answer, as
        Kafka's write their logs with acks=all.
        """
        part = self.leader_partition(topic, partition)
        self._check_min_isr((topic, partition), part)
        offset, _dup = part.append(batch, leader_epoch=leader_epoch, verified_txn=True)
        self._after_append(part)
        return offset

    def iter_batches(self, topic: str, partition: int, start: int = -1) -> Iterator[RecordBatch]:
        """Every batch from ``start`` (default: log start) to the log end, control batches included.

        To the log end, not the HW: a coordinator loads as the new leader, whose
        log is the truth from now on (the HW catches up as followers fetch).
        """
        part = self.partitions[(topic, partition)]
        offset = part.log_start_offset if start < 0 else start
        while offset < part.log_end_offset:
            result = part.read(offset, 4 * 1024 * 1024, read_committed=False, upto=part.log_end_offset)
            if not result.batches:
                break
            yield from result.batches
            offset = result.next_fetch_offset

    # -- markers ----------------------------------------------------------------------------------

    async def write_markers(self, req: ipb.WriteTxnMarkersRequest) -> ipb.WriteTxnMarkersResponse:
        """Write COMMIT/ABORT markers; answer once each is replicated (the coordinator then completes)."""
        resp = ipb.WriteTxnMarkersResponse()
        waits: list[ReplicationWait] = []
        for marker in req.markers:
            mresp = resp.markers.add(producer_id=marker.producer_id)
            for marked in marker.partitions:
                presp = mresp.partitions.add(topic=marked.topic, partition=marked.partition)
                try:
                    part = self.leader_partition(marked.topic, marked.partition)
                    offset = part.write_marker(
                        marker.producer_id,
                        marker.producer_epoch,
                        marker.committed,
                        marker.coordinator_epoch,
                        transaction_version=marker.transaction_version,
                        leader_epoch=part.leader_epoch,  # no await since leader_partition(): the epoch admitted
                    )
                    if offset is not None:
                        self._after_append(part)
                    # a re-sent marker that wrote nothing still waits for the first one to replicate
                    waits.append((presp, marked.topic, marked.partition, part.log_end_offset))
                except SluiceError as exc:
                    answer(presp, exc)
        await self._await_replication(waits, MARKER_REPLICATION_TIMEOUT_S)
        return resp

    # -- hanging transactions (kafka-transactions.sh find-hanging, abort) --------------------------

    def describe_producers(self, topic: str, partition: int) -> list[ActiveProducer]:
        """The producers with state on a partition this broker leads, by producer id."""
        part = self.leader_partition(topic, partition)
        return [
            ActiveProducer(
                pid,
                entry.epoch,
                entry.last_seq,
                entry.last_timestamp,
                entry.coordinator_epoch,
                part.open_txns.get(pid, -1),
            )
            for pid, entry in sorted(part.producers.items())
        ]

    async def abort_hanging_transaction(
        self, topic: str, partition: int, producer_id: int, producer_epoch: int, coordinator_epoch: int
    ) -> int:
        """Write an ABORT marker for a transaction left open on a partition; the marker's offset.

        Kafka's ``Admin.abortTransaction`` (a WriteTxnMarkers sent by an administrator), for a
        transaction its coordinator will never end: one whose producer wrote to the partition
        without the partition being in its transaction, so no marker is coming (a client without
        KIP-890's verification, or a coordinator that lost it). It holds the LSO back, so every
        read_committed consumer of the partition waits at it. Refused unless the producer has a
        transaction open here whose newest record is older than ``transaction.max.timeout.ms``:
        any coordinator would have aborted a transaction of its own by then, so a younger one may
        still be live and is not the administrator's to end (INVALID_TXN_STATE).
        """
        part = self.leader_partition(topic, partition)
        entry = part.producers.get(producer_id)
        start = part.open_txns.get(producer_id)
        if entry is None or start is None:
            raise errors.InvalidTxnStateError(
                f"producer {producer_id} has no transaction open on {topic}-{partition}: nothing to abort"
            )
        max_timeout_ms = self.config.int("transaction.max.timeout.ms")
        idle_ms = now_ms() - entry.last_timestamp
        if idle_ms <= max_timeout_ms:
            raise errors.InvalidTxnStateError(
                f"the transaction of producer {producer_id} on {topic}-{partition} (from offset {start}) wrote "
                f"{idle_ms} ms ago, within transaction.max.timeout.ms ({max_timeout_ms} ms): its coordinator may "
                "still end it; only a transaction open longer than that is hanging"
            )
        offset = part.write_marker(
            producer_id, producer_epoch, False, coordinator_epoch, leader_epoch=part.leader_epoch, transaction_version=1
        )
        assert offset is not None, "write_marker writes nothing only when no transaction is open: checked above"
        self._after_append(part)
        log.warning(
            "%s-%d: aborted the hanging transaction of producer %d (epoch %d) from offset %d: ABORT marker at %d",
            topic, partition, producer_id, producer_epoch, start, offset,
        )  # fmt: skip
        await self.wait_replicated(topic, partition, offset + 1, MARKER_REPLICATION_TIMEOUT_S)
        return offset

    async def _await_replication(self, waits: list[ReplicationWait], timeout_s: float) -> None:
        """Wait for every (result, topic, partition, end offset) together; a failed wait sets its result's error."""
        if not waits:
            return
        results = await asyncio.gather(
            *(self.wait_replicated(t, p, end, timeout_s) for _r, t, p, end in waits), return_exceptions=True
        )
        for (presp, _t, _p, _end), result in zip(waits, results, strict=True):
            if isinstance(result, SluiceError):
                answer(presp, result)
            elif isinstance(result, BaseException):
                raise result

    # -- replication: the leader's side -----------------------------------------------------------

    async def replica_fetch(self, req: ipb.ReplicaFetchRequest) -> bytes:
        """The ReplicaFetchResponse, serialized from the stored batches (see fetch_response)."""
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        budget = req.max_bytes or self.config.int("replica.fetch.max.bytes")
        first = True
        woken = False
        # woken only by appends to the partitions of this fetch (see replication/wakeups)
        with self._appended.watching((fp.topic, fp.partition) for fp in req.partitions) as appended:
            while True:
                appended.clear()
                resp, total, any_error = self._replica_fetch_once(req, budget, record=first)
                first = False
                answered = bool(total or any_error or time.monotonic() >= deadline)
                if woken:
                    self.events.woke("replica_fetch", answered)
                if answered:
                    return resp
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(appended.wait(), deadline - time.monotonic())
                woken = appended.is_set()

    def _replica_fetch_once(self, req: ipb.ReplicaFetchRequest, budget: int, record: bool) -> tuple[bytes, int, bool]:
        out = ReplicaFetchResponseWriter()
        total = 0
        any_error = False
        hw_moved: list[TopicPartition] = []
        now = monotonic_ms()
        for fp in req.partitions:
            presp = ipb.ReplicaFetchPartitionResponse(topic=fp.topic, partition=fp.partition, high_watermark=-1)
            raw: list[bytes] = []
            key = (fp.topic, fp.partition)
            try:
                part = self.leader_partition(fp.topic, fp.partition)
                if fp.topic_id and normalize_topic_id(fp.topic_id) != normalize_topic_id(part.topic_id):
                    raise errors.UnknownTopicOrPartitionError(
                        f"{fp.topic}-{fp.partition} of topic id {fp.topic_id} is gone: the topic now has id "
                        f"{part.topic_id} (deleted and created again)",
                    )
                check_epoch(part, fp.current_leader_epoch)
                info = self.cluster.topics[fp.topic].partitions[fp.partition]
                if req.replica_id not in info.replicas:
                    raise errors.NotLeaderOrFollowerError(
                        f"broker {req.replica_id} is not a replica of {fp.topic}-{fp.partition}",
                    )
                presp.log_start_offset = part.log_start_offset
                presp.log_end_offset = part.log_end_offset
                diverging = divergence(part, fp.fetch_offset, fp.last_fetched_epoch)
                if diverging is not None:
                    presp.diverging_epoch.CopyFrom(diverging)
                    presp.high_watermark = part.high_watermark
                    any_error = True  # answer at once: the follower must truncate before anything else
                    out.partition(presp, raw)
                    continue
                if fp.fetch_offset < part.log_start_offset:
                    raise errors.OffsetOutOfRangeError(
                        f"offset {fp.fetch_offset} is before the log start {part.log_start_offset}",
                    )
                if record:
                    tracker = self.trackers.setdefault(key, FollowerTracker())
                    tracker.fetched(req.replica_id, fp.fetch_offset, part.log_end_offset, now)
                    if self._maybe_advance_hw(key, part):
                        hw_moved.append(key)
                presp.high_watermark = part.high_watermark
                upto = self._replica_fetch_limit(part, fp.fetch_offset)
                # a replica a reassignment is adding: its bytes come out of the throttle's budget
                throttled = req.replica_id in info.adding_replicas
                allowed = self.reassignment_throttle.available() if throttled else budget
                if fp.max_bytes > 0:  # the follower's own limit for this partition (its throttle)
                    allowed = min(allowed, fp.max_bytes)
                if fp.fetch_offset < upto and allowed > 0:
                    result = part.read(fp.fetch_offset, max(min(budget - total, allowed), 1), False, upto=upto)
                    raw = result.raw
                    total += result.size
                    if throttled:
                        self.reassignment_throttle.charge(result.size)
            except SluiceError as exc:
                answer(presp, exc)
                any_error = True
            out.partition(presp, raw)
        for key in hw_moved:
            self._advanced.wake(key)
        return out.getvalue(), total, any_error

    def _replica_fetch_limit(self, part: PartitionLog, fetch_offset: int) -> int:
        """Where a follower's fetch stops: the log end, unless the hold-markers test hook is on."""
        if (
            not self.config.hook(HOOK_HOLD_MARKERS)
            or part.topic in INTERNAL_TOPICS
            or not os.path.exists(os.path.join(self.config.data_dir, HOLD_MARKERS_FILE))
        ):
            return part.log_end_offset
        marker = part.first_control_offset(fetch_offset)
        return part.log_end_offset if marker is None else marker

    def offsets_for_leader_epoch(self, req: ipb.OffsetsForLeaderEpochRequest) -> ipb.OffsetsForLeaderEpochResponse:
        resp = ipb.OffsetsForLeaderEpochResponse()
        for p in req.partitions:
            presp = resp.partitions.add(topic=p.topic, partition=p.partition, leader_epoch=-1, end_offset=-1)
            try:
                part = self.leader_partition(p.topic, p.partition)
                check_epoch(part, p.current_leader_epoch)
                presp.leader_epoch, presp.end_offset = part.end_offset_for_epoch(p.leader_epoch)
            except SluiceError as exc:
                answer(presp, exc)
        return resp

    async def maintain_isr(self) -> None:
        """Shrink the ISR by followers lagging past replica.lag.time.max.ms; expand it by caught-up ones.

        When the controller takes ISR requests (its document says so), the changes of a round are
        asked of it in one write of this broker's ``isr_requests/<id>`` document (Kafka's
        AlterPartition): the controller writes many leaders' changes to a topic in one write, where
        leaders writing for themselves raced each other on the same documents when a broker came
        back (issue 28). A request is decided when the view shows the partition at a new partition
        epoch (:meth:`_isr_request_decided`); one left undecided for ISR_REQUEST_TIMEOUT_S is written
        directly, as below, under the same rule, so ISR changes go on without a controller.

        Otherwise the changes of one round are written one topic at a time, all of a topic's in one write
        (:meth:`ClusterView.write_isrs`, which refuses a change decided from an ISR that is no longer
        the store's), in worker threads (a store call may block: an API server that does not answer)
        while the loop goes on serving. Meanwhile the HW counts the replicas of both the old and the
        new ISR (Kafka's "maximal ISR"): a replica being added may be elected once the store has it,
        so the HW must not pass it before the view has it. A write whose outcome is unknown (the store
        unreachable: it may have happened) keeps both counted until the document is read again, at the
        start of a later round.
        """
        for key in [k for k in self._pending_isr if k not in self.leader_of]:
            self._pending_isr.pop(key, None)  # no longer led here: a new leadership starts afresh
            self._isr_unsure.discard(key)
            self._isr_requested.pop(key, None)
        for topic in sorted({key[0] for key in self._isr_unsure}):
            try:
                current = await asyncio.to_thread(self.cluster.read_topic, topic)
            except StoreUnavailable:
                continue  # still unknown: both ISRs stay counted
            self.cluster.isr_written(current)  # the view takes the ISR the store has
            for key in [k for k in self._isr_unsure if k[0] == topic]:
                self._isr_unsure.discard(key)
                self._pending_isr.pop(key, None)
        overdue = self._overdue_isr_requests()
        changes = [(key, change) for key in list(self.leader_of) if (change := self._isr_change(key)) is not None]
        if self.cluster.controller_takes_isr_requests:
            asked = [(key, change) for key, change in changes if key not in overdue]
            changes = [(key, change) for key, change in changes if key in overdue]
            if asked:  # the document holds what is still asked: nothing new, nothing to write
                await self._request_isrs(asked)
        by_topic: dict[str, list[tuple[TopicPartition, IsrChange]]] = {}
        for key, change in changes:
            by_topic.setdefault(key[0], []).append((key, change))
        if by_topic:
            gate = asyncio.Semaphore(ISR_WRITES_IN_FLIGHT)
            await asyncio.gather(*(self._write_isrs(topic, items, gate) for topic, items in by_topic.items()))

    def _overdue_isr_requests(self) -> set[TopicPartition]:
        """Requests the controller left undecided for ISR_REQUEST_TIMEOUT_S: forgotten, so this round
        decides them again and writes them directly (the controller may be down or cut off)."""
        now = time.monotonic()
        overdue = {key for key, (_c, at) in self._isr_requested.items() if now - at > ISR_REQUEST_TIMEOUT_S}
        for key in overdue:
            self._forget_isr_request(key)
        if overdue and now - self._isr_fallback_warned_at >= ISR_FALLBACK_WARNING_INTERVAL_S:
            self._isr_fallback_warned_at = now
            log.warning(
                "the controller has not decided ISR requests in %.0f s (%s): writing them directly",
                ISR_REQUEST_TIMEOUT_S,
                ", ".join(f"{t}-{p}" for t, p in sorted(overdue)[:8]) + (" ..." if len(overdue) > 8 else ""),
            )
        return overdue

    async def _request_isrs(self, items: list[tuple[TopicPartition, IsrChange]]) -> None:
        """Ask the controller for ``items`` (with every request still undecided: the document holds all
        this broker asks). Until decided, the HW counts both the old and the new ISR, as for a write."""
        now = time.monotonic()
        for key, change in items:
            self._pending_isr[key] = set(change.isr) | set(change.base)
            self._isr_requested[key] = (change, now)
        requests = []
        for key, (change, _at) in sorted(self._isr_requested.items()):
            info = self.cluster.topics.get(key[0])
            requests.append(
                IsrRequest(
                    topic=key[0],
                    topic_id=info.topic_id if info is not None else "",
                    partition=key[1],
                    leader_epoch=change.leader_epoch,
                    partition_epoch=change.partition_epoch or 0,
                    base=list(change.base),
                    isr=list(change.isr),
                )
            )
        with contextlib.suppress(StoreUnavailable):  # asked or not: counted until decided or overdue
            await asyncio.to_thread(self.cluster.request_isrs, requests)

    def _isr_change(self, key: TopicPartition) -> IsrChange | None:
        """The ISR this leader wants for ``key`` now, from its view's and its followers' state; None
        when it is the view's already (or the partition is not to be changed now)."""
        if key in self._isr_unsure or key in self._isr_requested:
            return None  # its last write's outcome is still unknown, or the controller is deciding it
        me = self.config.broker_id
        info = self.cluster.topics.get(key[0])
        part = self.partitions.get(key)
        tracker = self.trackers.get(key)
        if info is None or part is None or tracker is None or key[1] >= len(info.partitions):
            return None
        pinfo = info.partitions[key[1]]
        if len(pinfo.replicas) < 2:
            return None
        now = monotonic_ms()
        lag_max = self.config.int("replica.lag.time.max.ms")
        isr = [r for r in pinfo.isr if r == me or not tracker.lagging(r, now, lag_max)]
        epoch_start = part.end_offset_for_epoch(part.leader_epoch - 1)[1] if part.leader_epoch > 0 else 0
        for r in pinfo.replicas:
            if r not in isr and r != me:
                leo = tracker.end_offset(r)
                alive = r not in self.cluster.dead_brokers and tracker.fetching(r, now, ISR_FETCH_RECENCY_MS)
                if alive and leo >= part.high_watermark and leo >= epoch_start and leo >= 0:
                    isr.append(r)
        if me not in isr:
            isr.insert(0, me)
        if sorted(isr) == sorted(pinfo.isr):
            return None
        return IsrChange(key[1], part.leader_epoch, tuple(pinfo.isr), tuple(isr), pinfo.partition_epoch)

    async def _write_isrs(
        self, topic: str, items: list[tuple[TopicPartition, IsrChange]], gate: asyncio.Semaphore
    ) -> None:
        """Write one topic's ISR changes (one document write), then apply what the store took."""
        async with gate:
            for key, change in items:
                self._pending_isr[key] = set(change.isr) | set(change.base)
                self._isr_unsure.add(key)
            unsure = True  # until the write answered (a cancelled round leaves it so: read again)
            try:
                written = await asyncio.to_thread(
                    self.cluster.write_isrs, topic, self.config.broker_id, [c for _k, c in items]
                )
                unsure = False
            except StoreUnavailable:
                written = None
            finally:
                if not unsure:
                    for key, _c in items:
                        self._isr_unsure.discard(key)
                        self._pending_isr.pop(key, None)
        self.cluster.isr_written(written.document if written is not None else None)
        if written is None:
            return
        for key, change in items:
            part = self.partitions.get(key)  # the loop went on meanwhile
            if not IsrOutcome.applied(written.outcomes.get(key[1])) or part is None:
                continue  # refused: the view now has the document that refused it; decided again next round
            self._isr_changed(key, change)
            if key in self.leader_of:
                self._maybe_advance_hw(key, part)
            self._advanced.wake(key)  # a moved HW, or fewer in-sync replicas than acks=all waits need

    # -- fetch ------------------------------------------------------------------------------------

    async def fetch(self, req: FetchInput) -> list[FetchedPartition]:
        """Read each partition (as leader), in the request's order; a long poll until ``min_bytes``
        are there, an error is, or ``max_wait_ms`` passed."""
        deadline = time.monotonic() + max(0, req.max_wait_ms) / 1000
        max_bytes = req.max_bytes or self.config.int("fetch.max.bytes")
        min_bytes = max(req.min_bytes, 0)
        woken = False
        # woken only by a moved high watermark of the partitions of this fetch (see replication/wakeups)
        with self._advanced.watching((p.topic, p.partition) for p in req.partitions) as advanced:
            while True:
                advanced.clear()
                tally = FetchTally()
                found, total, any_error = self._fetch_once(req, max_bytes, tally)
                remaining = deadline - time.monotonic()
                answered = total >= max(min_bytes, 1) or any_error or remaining <= 0
                if woken:
                    self.events.woke("fetch", answered)
                if answered:
                    self.events.fetched(tally)
                    return found
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(advanced.wait(), remaining)
                woken = advanced.is_set()

    def _fetch_once(
        self, req: FetchInput, max_bytes: int, tally: FetchTally | None = None
    ) -> tuple[list[FetchedPartition], int, bool]:
        """One pass over the requested partitions: (their answers, bytes found, any error)."""
        found: list[FetchedPartition] = []
        total = 0
        any_error = False
        for want in req.partitions:
            out = FetchedPartition(want.topic, want.partition, next_fetch_offset=want.fetch_offset)
            found.append(out)
            try:
                part = self.leader_partition(want.topic, want.partition)
                check_epoch(part, want.current_leader_epoch)
                out.high_watermark = part.high_watermark
                out.last_stable_offset = part.last_stable_offset
                out.log_start_offset = part.log_start_offset
                budget = min(want.max_bytes or DEFAULT_PARTITION_MAX_BYTES, max(max_bytes - total, 1))
                if req.read_committed and req.keep_aborted:
                    result = part.read(want.fetch_offset, budget, False, upto=part.last_stable_offset)
                else:
                    result = part.read(want.fetch_offset, budget, req.read_committed)
                out.batches, out.raw, out.aborted = result.batches, result.raw, result.aborted
                out.next_fetch_offset = result.next_fetch_offset
                total += result.size
                if tally is not None:
                    tally.read(want.topic, result.size)
                if result.next_fetch_offset > want.fetch_offset and not result.batches:
                    total += 1  # stepped over aborted data: worth answering now
            except SluiceError as exc:
                answer(out, exc)
                any_error = True
                if tally is not None:
                    tally.error(want.topic, want.topic in self.cluster.topics)
        return found, total, any_error

    # -- list offsets -----------------------------------------------------------------------------

    def list_offsets(self, queries: list[OffsetQuery], read_committed: bool) -> list[OffsetAnswer]:
        """The offsets asked (as leader), in the order asked."""
        answers: list[OffsetAnswer] = []
        for q in queries:
            out = OffsetAnswer(q.topic, q.partition)
            answers.append(out)
            try:
                part = self.leader_partition(q.topic, q.partition)
                check_epoch(part, q.current_leader_epoch)  # KIP-320: a client's stale view
                if q.spec == LATEST:
                    self._check_offsets_vouched(part)
                    out.offset = part.last_stable_offset if read_committed else part.high_watermark
                elif q.spec == EARLIEST:
                    out.offset = part.log_start_offset
                elif q.spec == MAX_TIMESTAMP:
                    self._check_offsets_vouched(part)  # the latest record may be above this HW
                    out.offset, out.timestamp = part.max_timestamp_offset()
                elif q.spec >= 0:
                    out.offset, out.timestamp = part.offset_for_timestamp(q.spec)
                    if out.offset < 0:  # "none below the HW" may be a record the old leader exposed
                        self._check_offsets_vouched(part)
                else:
                    raise errors.InvalidRequestError(f"unknown offset spec {q.spec}")
                out.leader_epoch = part.leader_epoch
            except RecordDecodeError as exc:  # a timestamp search met a batch it cannot decode
                answer(out, errors.CorruptMessageError(f"{q.topic}-{q.partition}: {exc}"))
                out.offset = out.timestamp = out.leader_epoch = -1
            except SluiceError as exc:
                answer(out, exc)
                out.offset = out.timestamp = out.leader_epoch = -1
        return answers

    @staticmethod
    def _check_offsets_vouched(part: PartitionLog) -> None:
        """KIP-207: a leader whose HW is below the start of its own epoch might answer less than its predecessor did."""
        start = part.leader_epoch_start_offset()
        if start is not None and part.high_watermark < start:
            raise errors.OffsetNotAvailableError(
                f"{part.topic}-{part.partition}: the new leader's high watermark {part.high_watermark} is below "
                f"the start of its leader epoch {part.leader_epoch} at offset {start}; retry once its followers "
                "have caught up",
            )
