"""The transaction coordinator: Kafka's transaction protocol over ``__transaction_state``.

The coordinator of a transactional id is the leader of partition
``coordinator_partition(id, n)`` of ``__transaction_state``. The coordinator
is a shard of the :mod:`coordinator runtime <sluice.broker.coordination.runtime>`,
which loads, retries and unloads those partitions as leadership comes and goes;
for every partition it leads, this broker keeps a :data:`TxnPartition`: the
coordinator epoch (the partition's leader epoch, carried by every marker) and
the :class:`TxnMetadata` of each id it coordinates. Refusals are raised as the
:mod:`sluice.errors` class of their Kafka error code and answered as that code.

Write-ahead, always: a state change is first appended to the id's partition
(:mod:`.log` encoding), and only then becomes current in memory. A request is
answered after its write, so whatever a client was told survives a restart or
a failover: the next leader replays the partition (last value per key wins)
and carries on. While a write is in flight the id's entry holds it as
``pending``; any other request for the id meanwhile gets
CONCURRENT_TRANSACTIONS (retriable), so requests for one id never interleave
across awaits. (Appends are synchronous today; the guard is there for when
they wait for replication.)

Ending a transaction (EndTxn, a timeout, or a new instance fencing an open
transaction) is two logged steps with markers in between::

    Ongoing --EndTxn--> PrepareCommit/PrepareAbort   logged; the client is answered
            markers to every partition (MarkerSender), __consumer_offsets included
    --> CompleteCommit/CompleteAbort                 logged; partitions cleared

While an id is in Prepare* its requests get CONCURRENT_TRANSACTIONS, except
AddPartitionsToTxn and AddOffsetsToTxn: the producer's next transaction starts
as soon as EndTxn answers, so they wait (up to :data:`COMPLETION_WAIT_S`) for
the completion and then go on, instead of sending the producer into a retry
loop with a backoff on every replicated transaction. A broker
that becomes leader of a partition loads it (the runtime answers
COORDINATOR_LOAD_IN_PROGRESS meanwhile, and retries a load that fails) and
completes every Prepare* it finds by sending the markers again; duplicates are
harmless.

Prepared transactions (two-phase commit with an external coordinator, the
idea of Kafka's KIP-939): PrepareTxn moves Ongoing (or an idle id: an empty
transaction) to Prepared, logged like every state. The timeout scan skips
Prepared, expiry skips it, and it survives restarts and failovers as any
logged state does (a loaded Prepared is simply kept: there is nothing to
finish). It ends only by a decision: EndTxn with its handle (producer id and
epoch), from any client, or InitProducerId with abort_prepared_txn. A plain
InitProducerId on a Prepared id is refused with INVALID_TXN_STATE rather than
aborting what an external coordinator may already have decided to commit;
keep_prepared_txn answers the prepared handle and changes nothing.

Fencing follows Kafka: InitProducerId on an id with an open transaction
aborts it with the epoch bumped (Ongoing -> PrepareEpochFence -> PrepareAbort,
epoch + 1), answers CONCURRENT_TRANSACTIONS, and the client's retry then gets
the next epoch. The old instance is fenced for good: PRODUCER_FENCED on every
request, its late writes and markers refused.

Epochs follow the client's transaction protocol version (Kafka's
clientTransactionVersion, sent in AddPartitionsToTxn, AddOffsetsToTxn and
EndTxn). Version 2 (Kafka 4, KIP-890 part 2; see :mod:`.state`): every EndTxn
bumps the epoch, its markers carry the bumped epoch, and EndTxn answers the
handle the producer goes on with. The timeout scan aborts a version 2
transaction open longer than its timeout the same way, epoch + 1, but without
fencing: the coordinator remembers the replaced handle
(``resume_producer_id/epoch``), so the producer's next request with it gets
the abortable INVALID_PRODUCER_EPOCH (its commit too), its
``abort_transaction()`` (EndTxn abort) succeeds with the new handle, and the
same producer object goes on. A retried EndTxn whose answer was lost is
recognised the same way and answered again. Only another instance's
InitProducerId clears the resume handle, and with it the old one's right to
go on. A version 1 request (no transaction_version) keeps the classic rules:
EndTxn keeps the epoch, and a timeout fences the producer (epoch + 1, no
resume handle).

The coordinator takes and answers the plain values of :mod:`.api`, whichever protocol the
request came by.

Test-only hook ``txn.stop_before_complete_commit`` (broker config
``sluice.test.hooks``): after EndTxn(commit) the coordinator logs
PrepareCommit, answers and writes the markers, but never logs CompleteCommit,
leaving the id in PrepareCommit for failover tests. It applies only to
commits this coordinator decided itself, not to Prepare* states it completes
after loading a partition, so the broker that takes over completes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field

import grpc

from sluice import errors
from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import (
    CONSUMER_OFFSETS_TOPIC,
    TRANSACTION_STATE_TOPIC,
    ClusterView,
    coordinator_partition,
)
from sluice.broker.config import BrokerConfig
from sluice.broker.coordination import CoordinatorPartition, CoordinatorRuntime
from sluice.broker.errors import answer
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.topic_partition import TopicPartition
from sluice.broker.txn.api import (
    HandleAnswer,
    InitProducerIdInput,
    ListedTransaction,
    ListTransactionsInput,
    Outcome,
    PartitionAnswer,
    TransactionList,
    TxnDescription,
    TxnHandle,
)
from sluice.broker.txn.log import TxnLogError, apply_batch, state_batch
from sluice.broker.txn.markers import MarkerJob, MarkerResult, MarkerSender
from sluice.broker.txn.state import (
    IDLE,
    TxnMetadata,
    TxnState,
    epoch_exhausted,
)
from sluice.errors import SluiceError
from sluice.records import RecordBatch, now_ms

log = logging.getLogger(__name__)

S = TxnState
HOOK_STOP_BEFORE_COMPLETE_COMMIT = "txn.stop_before_complete_commit"
# How long AddPartitionsToTxn / AddOffsetsToTxn wait for the id's previous transaction to complete
# (markers written, Complete* logged) before answering CONCURRENT_TRANSACTIONS; see _await_completion.
COMPLETION_WAIT_S = 5.0
_ENDING = frozenset({TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT, TxnState.PREPARE_EPOCH_FENCE})
VERIFY_RPC_TIMEOUT_S = 5.0


@dataclass(eq=False)
class TxnEntry:
    """One transactional id in memory."""

    meta: TxnMetadata | None  # None only until the first write of a new id lands
    pending: TxnMetadata | None = None  # the state being written right now
    _written: asyncio.Event | None = None  # set when the write in flight ends (see wait_written)

    async def wait_written(self, timeout_s: float) -> None:
        """Wait (at most ``timeout_s``) until the next write of this id ends, logged or failed."""
        if self._written is None:
            self._written = asyncio.Event()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._written.wait(), timeout_s)

    def written(self) -> None:
        """A write of this id ended: wake whoever waits for it."""
        if self._written is not None:
            self._written.set()
            self._written = None


@dataclass(eq=False)
class TxnPartitionState:
    """The transactional ids of one ``__transaction_state`` partition (the shard's state)."""

    replayed: dict[str, TxnMetadata] = field(default_factory=dict)  # filled while loading
    txns: dict[str, TxnEntry] = field(default_factory=dict)  # made from ``replayed`` once loaded


TxnPartition = CoordinatorPartition[TxnPartitionState]  # a __transaction_state partition this broker leads


def verdict(
    state: str,
    producer_id: int,
    producer_epoch: int,
    partitions: Iterable[TopicPartition],
    pid: int,
    epoch: int,
    topic_partition: TopicPartition,
    resume: tuple[int, int] = (-1, -1),
) -> tuple[pb.ErrorCode, str]:
    """The answer to a partition leader's verification of a first transactional write (KIP-890).

    ``resume`` is the handle a non-fencing bump replaced: a write with it is
    the rightful producer that has not heard of the bump (abortable), any
    other older epoch a fenced one.
    """
    if resume[1] >= 0 and (pid, epoch) == resume and (pid, epoch) != (producer_id, producer_epoch):
        return pb.INVALID_PRODUCER_EPOCH, (
            f"producer {pid} epoch {epoch}: its transaction was ended by the coordinator (now epoch "
            f"{producer_epoch}); abort the transaction and begin a new one"
        )
    if pid == producer_id and epoch < producer_epoch:
        return pb.PRODUCER_FENCED, f"producer {pid} epoch {epoch} was fenced by epoch {producer_epoch}"
    if state == S.ONGOING and pid == producer_id and epoch == producer_epoch and topic_partition in set(partitions):
        return pb.NONE, ""
    topic, partition = topic_partition
    return pb.INVALID_TXN_STATE, (
        f"{topic}-{partition} is not part of an open transaction of producer {pid} epoch {epoch} "
        f"(the coordinator has producer {producer_id} epoch {producer_epoch} in state {state}); "
        "AddPartitionsToTxn must come before the first write"
    )


def _resume_message(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> str:
    pid, epoch = meta.handle()
    why = "timed out and was aborted by the coordinator" if meta.timed_out else "was already ended"
    return (
        f"the transaction of {meta.transactional_id!r} (producer {producer_id} epoch {producer_epoch}) {why}; "
        f"the id is at producer {pid} epoch {epoch} now: abort the transaction (abort_transaction()) and "
        "begin a new one"
    )


TXN_ID_CAP_KEY = "transactional.id.max.count"


class TransactionCoordinator:
    """The requests of the transaction protocol; a shard of the coordinator runtime."""

    def __init__(
        self, replicas: ReplicaManager, cluster: ClusterView, config: BrokerConfig, channels: BrokerChannels
    ) -> None:
        self.replicas = replicas
        self.cluster = cluster
        self.config = config
        self.clock: Callable[[], int] = now_ms  # tests may replace it
        self.channels = channels  # to other brokers, for markers and DescribeTransactions (the builder's)
        self.markers = MarkerSender(replicas, cluster, config, self.channels)
        self.runtime: CoordinatorRuntime[TxnPartitionState] = CoordinatorRuntime(
            TRANSACTION_STATE_TOPIC, self, replicas, cluster, config
        )
        self._loops: list[asyncio.Task[None]] = []

    # -- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        await self.runtime.start()
        cfg = self.config
        self._loops = [
            asyncio.create_task(
                self._every(
                    cfg.int("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
                    self.abort_timed_out_transactions,
                )
            ),
            asyncio.create_task(
                self._every(
                    cfg.int("transaction.remove.expired.transaction.cleanup.interval.ms"),
                    self.remove_expired_transactional_ids,
                )
            ),
        ]

    async def stop(self) -> None:
        loops = list(self._loops)
        for task in loops:
            task.cancel()
        await self.runtime.stop()
        await asyncio.gather(*loops, return_exceptions=True)
        self._loops = []

    def is_ready(self) -> bool:
        return self.runtime.is_ready()

    async def _every(self, interval_ms: int, job: Callable[[], Awaitable[None]]) -> None:
        while True:
            await asyncio.sleep(max(interval_ms, 1) / 1000)
            try:
                await job()
            except Exception:
                log.exception("transaction coordinator housekeeping failed")

    # -- the shard: replaying __transaction_state (the runtime loads and unloads) -----------------

    def new_state(self, partition: int, coordinator_epoch: int) -> TxnPartitionState:
        return TxnPartitionState()

    def replay(self, state: TxnPartitionState, partition: int, batch: RecordBatch) -> None:
        try:
            apply_batch(state.replayed, batch)
        except TxnLogError:
            log.exception("__transaction_state-%d: skipping an undecodable batch", partition)

    def on_loaded(self, loaded: TxnPartition) -> None:
        """Serve the replayed ids, and finish every Prepare* found (re-sending markers is harmless)."""
        state = loaded.state
        state.txns = {tid: TxnEntry(meta) for tid, meta in state.replayed.items()}
        state.replayed = {}
        for tid, entry in state.txns.items():
            assert entry.meta is not None
            if entry.meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                self.runtime.spawn(
                    loaded, self._complete(loaded, tid, entry, entry.meta, recovering=True), f"completing {tid!r}"
                )

    def on_unloaded(self, unloaded: TxnPartition) -> None:
        # The runtime cancels the partition's tasks (completions in flight stop there); requests
        # waiting for a completion (_await_completion) stop waiting and answer NOT_COORDINATOR.
        for entry in unloaded.state.txns.values():
            entry.written()

    def summary(self, state: TxnPartitionState) -> str:
        return f"{len(state.txns)} transactional id(s)"

    # -- lookups and checks -----------------------------------------------------------------------

    def _coordinator_partition(self, transactional_id: str) -> int:
        partition = self.runtime.partition_for(transactional_id)
        if partition is None:
            raise errors.CoordinatorNotAvailableError(f"{TRANSACTION_STATE_TOPIC} does not exist yet")
        return partition

    def _partition_for(self, transactional_id: str) -> TxnPartition:
        return self.runtime.active(self._coordinator_partition(transactional_id), repr(transactional_id))

    def _entry(self, cpart: TxnPartition, transactional_id: str) -> tuple[TxnEntry, TxnMetadata]:
        """The id's entry and current state for a request that will change it."""
        entry = cpart.state.txns.get(transactional_id)
        if entry is None or entry.meta is None:
            if entry is not None:  # its first write is in flight
                raise errors.ConcurrentTransactionsError(f"{transactional_id!r} is being initialized")
            raise errors.InvalidProducerIdMappingError(
                f"transactional id {transactional_id!r} has no producer id: call InitProducerId first",
            )
        if entry.pending is not None:
            raise errors.ConcurrentTransactionsError(
                f"{transactional_id!r} is changing to {entry.pending.state} right now; retry",
            )
        return entry, entry.meta

    @staticmethod
    def _check_producer(meta: TxnMetadata, producer_id: int, producer_epoch: int) -> None:
        """Pass for the id's current handle; raise what an old, resumable or foreign handle gets."""
        pid, epoch = meta.handle()
        if (producer_id, producer_epoch) == (pid, epoch):
            return
        if meta.is_resume_handle(producer_id, producer_epoch):
            raise errors.InvalidProducerEpochError(_resume_message(meta, producer_id, producer_epoch))
        if producer_id not in (pid, meta.producer_id):
            raise errors.InvalidProducerIdMappingError(
                f"producer id {producer_id} does not belong to {meta.transactional_id!r} (its producer id is {pid})",
            )
        if producer_id != pid or producer_epoch < epoch:  # an older epoch, or the id an exhausted epoch left
            raise errors.ProducerFencedError(
                f"producer {producer_id} epoch {producer_epoch} was fenced: {meta.transactional_id!r} "
                f"is at producer {pid} epoch {epoch}",
            )
        raise errors.InvalidProducerEpochError(
            f"producer {producer_id} epoch {producer_epoch} is newer than the coordinator's {epoch}",
        )

    # -- the write-ahead step ---------------------------------------------------------------------

    async def _write(self, cpart: TxnPartition, transactional_id: str, entry: TxnEntry, new: TxnMetadata) -> None:
        """Log ``new`` for the id, then make it current (or remove the id, for Dead)."""
        if not self.runtime.is_current(cpart):
            raise errors.NotCoordinatorError(f"no longer the coordinator of {transactional_id!r}")
        entry.pending = new
        try:
            # acks=all for our own log: a decision only counts once the ISR has it
            await self.runtime.write(
                cpart.partition, cpart.coordinator_epoch, state_batch(new), f"the state of {transactional_id!r}"
            )
        except BaseException:
            entry.pending = None
            entry.written()
            if entry.meta is None and cpart.state.txns.get(transactional_id) is entry:
                del cpart.state.txns[transactional_id]  # the first write of a new id failed: forget it
            raise
        entry.pending = None
        if new.state is S.DEAD:
            if cpart.state.txns.get(transactional_id) is entry:
                del cpart.state.txns[transactional_id]
        else:
            entry.meta = new
        entry.written()

    # -- InitProducerId ---------------------------------------------------------------------------

    async def init_producer_id(self, req: InitProducerIdInput) -> HandleAnswer:
        resp = HandleAnswer()
        try:
            resp.producer_id, resp.producer_epoch, resp.previous_state = await self._init_producer_id(req)
        except SluiceError as exc:
            answer(resp, exc)
        return resp

    def _check_room(self, transactional_id: str) -> None:
        """A new id: refused once this coordinator holds transactional.id.max.count ids (idle ones
        expire after transactional.id.expiration.ms and make room)."""
        cap = self.config.int(TXN_ID_CAP_KEY)
        held = sum(len(cpart.state.txns) for cpart in self.runtime.active_partitions())
        if held >= cap:
            raise errors.PolicyViolationError(
                f"this transaction coordinator already holds {held} transactional ids ({TXN_ID_CAP_KEY}={cap}); "
                f"{transactional_id!r} is refused until idle ids expire (transactional.id.expiration.ms)"
            )

    def _new_producer_id(self) -> int:
        try:
            return self.cluster.next_producer_id()
        except Exception as exc:
            log.exception("allocating a producer id failed")
            raise errors.CoordinatorNotAvailableError(f"cannot allocate a producer id: {exc}") from exc

    async def _init_producer_id(self, req: InitProducerIdInput) -> tuple[int, int, str]:
        """(producer id, epoch, the id's state before the request)."""
        tid = req.transactional_id
        if not tid:
            return self._new_producer_id(), 0, ""  # an idempotent producer: any broker answers
        required = self.config.get("transactional.id.declaration.required")
        # a miss reads the store: in a worker thread (it may block), before this request touches any state
        if required and not (
            tid in self.cluster.declared_transactional_ids
            or await asyncio.to_thread(self.cluster.transactional_id_declared, tid)
        ):
            raise errors.TransactionalIdAuthorizationFailedError(
                f"transactional id {tid!r} is not declared: this cluster requires a TransactionalId resource "
                "for every id (transactional.id.declaration.required)",
            )
        if req.keep_prepared_txn and req.abort_prepared_txn:
            raise errors.InvalidRequestError("keep_prepared_txn and abort_prepared_txn exclude each other")
        max_timeout = self.config.int("transaction.max.timeout.ms")
        if not 0 < req.transaction_timeout_ms <= max_timeout:
            raise errors.InvalidTransactionTimeoutError(
                f"transaction timeout {req.transaction_timeout_ms} ms must be in (0, {max_timeout}] "
                "(transaction.max.timeout.ms)",
            )
        cpart = self._partition_for(tid)
        now = self.clock()
        if tid not in cpart.state.txns:
            self._check_room(tid)
            new = TxnMetadata.new(tid, self._new_producer_id(), req.transaction_timeout_ms, now)
            entry = TxnEntry(None)
            cpart.state.txns[tid] = entry
            await self._write(cpart, tid, entry, new)
            return new.producer_id, new.producer_epoch, ""
        entry, meta = self._entry(cpart, tid)
        # KIP-360: the producer says which id/epoch it has. Producer ids start at 1, so 0 (the
        # proto default of a client that did not set the field) counts as "none", like -1.
        expected = req.producer_id > 0
        known_ids = (meta.producer_id, meta.last_producer_id, meta.handle()[0], meta.resume_producer_id)
        if expected and req.producer_id not in known_ids:
            raise errors.ProducerFencedError(
                f"producer id {req.producer_id} is not the current one of {tid!r} ({meta.producer_id})",
            )
        if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
            raise errors.ConcurrentTransactionsError(
                f"the previous transaction of {tid!r} is being completed ({meta.state})"
            )
        if meta.state is S.PREPARED:
            if req.keep_prepared_txn:
                return meta.producer_id, meta.producer_epoch, meta.state.value
            if not req.abort_prepared_txn:
                raise errors.InvalidTxnStateError(
                    f"{tid!r} has a prepared transaction (producer {meta.producer_id} epoch "
                    f"{meta.producer_epoch}) waiting for its external coordinator's decision: commit or "
                    "abort it with its handle (EndTxn with prepared, `sluice transactions commit|abort`), or "
                    "initialize with keep_prepared_txn (keep it) or abort_prepared_txn (abort it)",
                )
        if meta.state in (S.ONGOING, S.PREPARED):
            if expected and (req.producer_id, req.producer_epoch) != (meta.producer_id, meta.producer_epoch):
                raise errors.ProducerFencedError(
                    f"producer {req.producer_id} epoch {req.producer_epoch} is not the current "
                    f"{meta.producer_id}/{meta.producer_epoch} of {tid!r}",
                )
            # A new instance (or a KIP-360 re-init): abort the open transaction with the epoch
            # bumped, so the old instance is fenced, and let the client retry for its epoch. The
            # current handle re-initialising itself keeps its right to go on (its retry bumps).
            fenced = meta.fence_and_abort(now, owner_may_resume=expected)
            await self._write(cpart, tid, entry, fenced)
            self.runtime.spawn(cpart, self._complete(cpart, tid, entry, fenced), f"aborting {tid!r}")
            raise errors.ConcurrentTransactionsError(
                f"aborting the open transaction of {tid!r} (producer {meta.producer_id} fenced at epoch "
                f"{fenced.producer_epoch}); retry",
            )
        if meta.state not in IDLE:
            raise errors.InvalidTxnStateError(f"{tid!r} is in state {meta.state}")
        if expected:
            current = (req.producer_id, req.producer_epoch) == meta.handle() or meta.is_resume_handle(
                req.producer_id, req.producer_epoch
            )
            previous = (req.producer_id, req.producer_epoch) == (meta.last_producer_id, meta.last_producer_epoch)
            if not current:
                if previous and meta.state is S.EMPTY:
                    # A retry whose response was lost: answer what it was given, do not bump again.
                    return meta.producer_id, meta.producer_epoch, meta.state.value
                code = pb.INVALID_PRODUCER_EPOCH if req.producer_epoch > meta.producer_epoch else pb.PRODUCER_FENCED
                raise errors.error_for(
                    code,
                    f"producer {req.producer_id} epoch {req.producer_epoch} is not the current "
                    f"{meta.producer_id}/{meta.producer_epoch} of {tid!r}",
                )
        new_pid = self._new_producer_id() if epoch_exhausted(meta.producer_epoch) else None
        new = meta.bump_epoch(req.transaction_timeout_ms, now, new_pid)
        await self._write(cpart, tid, entry, new)
        return new.producer_id, new.producer_epoch, meta.state.value

    # -- AddPartitionsToTxn / AddOffsetsToTxn -----------------------------------------------------

    async def add_partitions_to_txn(
        self, handle: TxnHandle, partitions: Iterable[TopicPartition]
    ) -> list[PartitionAnswer]:
        """Add ``partitions`` to the transaction; an answer per partition, in the order asked."""
        results = await self._add(handle, list(partitions))
        return [
            PartitionAnswer(topic, partition, code, message) for (topic, partition), (code, message) in results.items()
        ]

    async def add_offsets_to_txn(self, handle: TxnHandle, group_id: str) -> Outcome:
        """Add the ``__consumer_offsets`` partition of ``group_id`` to the transaction (for TxnOffsetCommit)."""
        if not group_id:
            return Outcome(pb.INVALID_GROUP_ID, "group_id must not be empty")
        info = self.cluster.topics.get(CONSUMER_OFFSETS_TOPIC)
        if info is None or not info.partitions:
            return Outcome(pb.COORDINATOR_NOT_AVAILABLE, f"{CONSUMER_OFFSETS_TOPIC} does not exist yet")
        offsets_partition = (CONSUMER_OFFSETS_TOPIC, coordinator_partition(group_id, len(info.partitions)))
        results = await self._add(handle, [offsets_partition])
        return Outcome(*results[offsets_partition])

    async def _add(
        self, handle: TxnHandle, wanted: list[TopicPartition]
    ) -> dict[TopicPartition, tuple[pb.ErrorCode, str]]:
        """Add partitions to the id's transaction; a result per partition.

        Unknown partitions get UNKNOWN_TOPIC_OR_PARTITION and the others are
        added (there is no OPERATION_NOT_ATTEMPTED on this wire; adding a
        partition that is never written costs one marker).
        """
        tid, producer_id, producer_epoch, tv2 = (
            handle.transactional_id, handle.producer_id, handle.producer_epoch, handle.bumps
        )  # fmt: skip
        results: dict[TopicPartition, tuple[pb.ErrorCode, str]] = {}
        try:
            cpart = self._partition_for(tid)
            await self._await_completion(cpart, tid)
            entry, meta = self._entry(cpart, tid)
            resuming = meta.is_resume_handle(producer_id, producer_epoch)
            if not resuming:
                self._check_producer(meta, producer_id, producer_epoch)
            if meta.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT, S.PREPARE_EPOCH_FENCE):
                raise errors.ConcurrentTransactionsError(
                    f"the previous transaction of {tid!r} is being completed ({meta.state}); retry",
                )
            if resuming:  # once the end is complete: the producer must abort and take the new handle
                raise errors.InvalidProducerEpochError(_resume_message(meta, producer_id, producer_epoch))
            if meta.state is S.PREPARED:
                raise errors.InvalidTxnStateError(
                    f"the transaction of {tid!r} is prepared: nothing may join it; commit or abort it first",
                )
            if meta.state is not S.ONGOING and meta.state not in IDLE:
                raise errors.InvalidTxnStateError(f"{tid!r} is in state {meta.state}")
            valid: list[TopicPartition] = []
            for topic, partition in wanted:
                info = self.cluster.topics.get(topic)
                if info is None or not 0 <= partition < len(info.partitions):
                    results[(topic, partition)] = (
                        pb.UNKNOWN_TOPIC_OR_PARTITION,
                        f"unknown topic or partition {topic}-{partition}",
                    )
                else:
                    valid.append((topic, partition))
            changes = meta.state is not S.ONGOING or not set(valid) <= meta.partitions or (tv2 and not meta.tv2)
            if valid and changes:
                await self._write(cpart, tid, entry, meta.add_partitions(valid, self.clock(), tv2))
            for key in valid:
                results[key] = (pb.NONE, "")
        except SluiceError as exc:
            return {key: (exc.code, exc.message) for key in wanted}
        return {key: results[key] for key in wanted}  # in the order asked

    async def _await_completion(self, cpart: TxnPartition, tid: str) -> None:
        """Wait, bounded, while the id's previous transaction is being completed.

        A producer begins its next transaction as soon as EndTxn answers, which is
        after PrepareCommit/PrepareAbort is logged but before the markers are written
        and Complete* is logged; its first AddPartitionsToTxn then used to get
        CONCURRENT_TRANSACTIONS and retry after a backoff, about two round trips per
        replicated transaction (docs/performance.md). Waiting here for the completion
        answers it at once when the id is free. After :data:`COMPLETION_WAIT_S`, or
        when this broker stops coordinating the id, the caller checks as before
        (CONCURRENT_TRANSACTIONS if still busy, retriable).
        """
        deadline = time.monotonic() + COMPLETION_WAIT_S
        while self.runtime.is_current(cpart):
            entry = cpart.state.txns.get(tid)
            if entry is None or entry.meta is None:
                return
            if entry.pending is None and entry.meta.state not in _ENDING:
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            await entry.wait_written(remaining)

    # -- EndTxn -----------------------------------------------------------------------------------

    async def end_txn(self, handle: TxnHandle, commit: bool, *, prepared_only: bool = False) -> HandleAnswer:
        """Commit or abort; ``prepared_only``: end a prepared transaction (and nothing else) with its handle."""
        resp = HandleAnswer()
        try:
            resp.producer_id, resp.producer_epoch = await self._end_txn(
                handle.transactional_id,
                handle.producer_id,
                handle.producer_epoch,
                commit,
                prepared_only=prepared_only,
                bump=handle.bumps,
            )
        except SluiceError as exc:
            answer(resp, exc)
        return resp

    async def _end_txn(
        self,
        tid: str,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        *,
        prepared_only: bool = False,
        bump: bool = False,
    ) -> tuple[int, int]:
        """End the transaction; the handle the producer goes on with (``bump``: epoch + 1, TV2)."""
        cpart = self._partition_for(tid)
        if prepared_only and tid not in cpart.state.txns:
            raise errors.TransactionalIdNotFoundError(f"no transactional id {tid!r}: no prepared transaction to end")
        entry, meta = self._entry(cpart, tid)
        # The handle a bump replaced: a retry whose answer was lost, or the first call after a timeout.
        resuming = meta.is_resume_handle(producer_id, producer_epoch)
        if not resuming:
            self._check_producer(meta, producer_id, producer_epoch)
        outcome = "commit" if commit else "abort"
        same = S.PREPARE_COMMIT if commit else S.PREPARE_ABORT
        done = S.COMPLETE_COMMIT if commit else S.COMPLETE_ABORT
        if not resuming and (meta.state is S.PREPARED or (meta.state is S.ONGOING and not prepared_only)):
            next_pid = self._new_producer_id() if bump and epoch_exhausted(meta.producer_epoch) else None
            new = meta.prepare_end(commit, self.clock(), next_pid, bump=bump)
            await self._write(cpart, tid, entry, new)
            self.runtime.spawn(cpart, self._complete(cpart, tid, entry, new), f"completing {tid!r}")
            return new.handle()
        if meta.state is done:
            return meta.handle()  # a retry of the EndTxn that completed it (or the abort after a timeout)
        if meta.state is same:
            raise errors.ConcurrentTransactionsError(f"the {outcome} of {tid!r} is being completed; retry")
        if resuming and meta.timed_out and commit:
            raise errors.InvalidProducerEpochError(_resume_message(meta, producer_id, producer_epoch))
        if prepared_only:
            raise errors.InvalidTxnStateError(
                f"cannot {outcome}: {tid!r} (producer {producer_id} epoch {producer_epoch}) has no prepared "
                f"transaction (state {meta.state})",
            )
        raise errors.InvalidTxnStateError(f"cannot {outcome}: {tid!r} is in state {meta.state}")

    # -- PrepareTxn -------------------------------------------------------------------------------

    async def prepare_txn(self, handle: TxnHandle) -> HandleAnswer:
        resp = HandleAnswer()
        try:
            await self._prepare_txn(handle.transactional_id, handle.producer_id, handle.producer_epoch)
            resp.producer_id, resp.producer_epoch = handle.producer_id, handle.producer_epoch
        except SluiceError as exc:
            answer(resp, exc)
        return resp

    async def _prepare_txn(self, tid: str, producer_id: int, producer_epoch: int) -> None:
        """Ongoing (or idle: an empty transaction) -> Prepared; a repeat of a prepare is answered again."""
        cpart = self._partition_for(tid)
        entry, meta = self._entry(cpart, tid)
        self._check_producer(meta, producer_id, producer_epoch)
        if meta.state is S.PREPARED:
            return  # a retry whose answer was lost
        if meta.state is S.ONGOING or meta.state in IDLE:
            await self._write(cpart, tid, entry, meta.prepare(self.clock()))
            return
        raise errors.InvalidTxnStateError(
            f"cannot prepare: the transaction of {tid!r} is already being ended ({meta.state})",
        )

    # -- completing a transaction -----------------------------------------------------------------

    async def _complete(
        self, cpart: TxnPartition, tid: str, entry: TxnEntry, prepared: TxnMetadata, *, recovering: bool = False
    ) -> None:
        """Markers for a Prepare* state, then Complete*. Runs as a task; stops if leadership is lost."""
        committed = prepared.state is S.PREPARE_COMMIT
        job = MarkerJob(
            transactional_id=tid,
            producer_id=prepared.producer_id,
            producer_epoch=prepared.producer_epoch,
            committed=committed,
            coordinator_epoch=cpart.coordinator_epoch,
            partitions=prepared.partitions,
            transaction_version=2 if prepared.end_bumped else 1,
        )

        def still_valid() -> bool:
            return self.runtime.is_current(cpart) and cpart.state.txns.get(tid) is entry and entry.meta is prepared

        started = time.monotonic()
        result = await self.markers.send(job, still_valid)
        if result is MarkerResult.DONE:
            self.replicas.events.markers_sent(time.monotonic() - started)
        else:
            log.warning("markers of %r not completed (%s): leaving it to the next coordinator", tid, result.value)
            return
        if committed and not recovering and self.config.hook(HOOK_STOP_BEFORE_COMPLETE_COMMIT):
            log.warning("test hook %s: %r stays in PrepareCommit", HOOK_STOP_BEFORE_COMPLETE_COMMIT, tid)
            return
        backoff = 0.05
        while still_valid():
            if entry.pending is not None:
                await asyncio.sleep(backoff)
                continue
            try:
                await self._write(cpart, tid, entry, prepared.complete(self.clock()))
                self.replicas.events.txn_completed(committed)
                return
            except SluiceError as exc:
                if exc.code == pb.NOT_COORDINATOR:
                    return
                log.warning("cannot log the completion of %r yet: %s", tid, exc.message)
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, 2.0)

    # -- housekeeping -----------------------------------------------------------------------------

    async def abort_timed_out_transactions(self) -> None:
        """Abort every Ongoing transaction past its timeout, epoch + 1.

        A transaction protocol v2 producer may then abort and go on; a version 1 producer is fenced.
        """
        now = self.clock()
        for cpart in self.runtime.active_partitions():
            for tid, entry in list(cpart.state.txns.items()):
                meta = entry.meta
                if meta is None or entry.pending is not None or meta.state is not S.ONGOING:
                    continue
                if now - meta.txn_start_ms <= meta.timeout_ms:
                    continue
                log.info(
                    "transaction of %r (producer %d epoch %d) timed out after %d ms: aborting it",
                    tid,
                    meta.producer_id,
                    meta.producer_epoch,
                    now - meta.txn_start_ms,
                )
                try:
                    if meta.tv2:  # bumped, not fenced: the producer aborts and goes on
                        next_pid = self._new_producer_id() if epoch_exhausted(meta.producer_epoch) else None
                        fenced = meta.abort_timed_out(now, next_pid)
                    else:  # a version 1 producer cannot learn a new epoch from EndTxn: fenced, as before
                        fenced = meta.fence_and_abort(now)
                    await self._write(cpart, tid, entry, fenced)
                except SluiceError as exc:
                    log.warning("cannot abort the timed-out transaction of %r: %s", tid, exc.message)
                    continue
                self.replicas.events.txn_timed_out()
                self.runtime.spawn(cpart, self._complete(cpart, tid, entry, fenced), f"aborting {tid!r}")

    async def remove_expired_transactional_ids(self) -> None:
        """Tombstone ids idle longer than transactional.id.expiration.ms."""
        now = self.clock()
        expiration = self.config.int("transactional.id.expiration.ms")
        for cpart in self.runtime.active_partitions():
            for tid, entry in list(cpart.state.txns.items()):
                meta = entry.meta
                if meta is None or entry.pending is not None or meta.state not in IDLE:
                    continue
                if now - meta.last_update_ms <= expiration:
                    continue
                try:
                    await self._write(cpart, tid, entry, meta.expire(now))
                    log.info("transactional id %r expired (idle since %d)", tid, meta.last_update_ms)
                except SluiceError as exc:
                    log.warning("cannot expire %r: %s", tid, exc.message)

    # -- verification for partition leaders (KIP-890) ---------------------------------------------

    async def verify_partition(
        self, transactional_id: str, producer_id: int, epoch: int, topic: str, partition: int
    ) -> tuple[pb.ErrorCode, str]:
        """Is ``topic-partition`` in the open transaction of this producer and epoch?

        Answered from memory when this broker coordinates the id, else by
        asking the coordinator with DescribeTransactions. Errors a producer
        should retry (coordinator moving or loading) come back retriable.
        """
        written = (topic, partition)
        try:
            p = self._coordinator_partition(transactional_id)
        except SluiceError as exc:
            return exc.code, exc.message
        local = self.runtime.get(p)
        if local is not None:
            if not local.active:
                return pb.COORDINATOR_LOAD_IN_PROGRESS, self.runtime.loading_message(p)
            entry = local.state.txns.get(transactional_id)
            meta = entry.meta if entry is not None else None
            if meta is None:
                return pb.INVALID_TXN_STATE, f"unknown transactional id {transactional_id!r}"
            return verdict(
                meta.state,
                meta.producer_id,
                meta.producer_epoch,
                meta.partitions,
                producer_id,
                epoch,
                written,
                (meta.resume_producer_id, meta.resume_producer_epoch),
            )
        leader = self.cluster.topics[TRANSACTION_STATE_TOPIC].partitions[p].leader
        if leader == self.config.broker_id:
            return pb.COORDINATOR_LOAD_IN_PROGRESS, f"{TRANSACTION_STATE_TOPIC}-{p} is not loaded yet"
        channel = self.channels.get(leader)
        if channel is None:
            return pb.COORDINATOR_NOT_AVAILABLE, f"the coordinator of {transactional_id!r} is not available"
        try:
            stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.DescribeTransactions(
                bpb.DescribeTransactionsRequest(transactional_ids=[transactional_id]), timeout=VERIFY_RPC_TIMEOUT_S
            )
        except grpc.aio.AioRpcError as exc:
            return pb.COORDINATOR_NOT_AVAILABLE, f"coordinator broker {leader}: {exc.code().name} {exc.details()}"
        if len(resp.transactions) != 1:
            return pb.COORDINATOR_NOT_AVAILABLE, f"coordinator broker {leader} gave no answer"
        st = resp.transactions[0]
        if st.error_code == pb.TRANSACTIONAL_ID_NOT_FOUND:
            return pb.INVALID_TXN_STATE, f"unknown transactional id {transactional_id!r}"
        if st.error_code in (pb.COORDINATOR_LOAD_IN_PROGRESS, pb.COORDINATOR_NOT_AVAILABLE):
            return st.error_code, st.error_message
        if st.error_code != pb.NONE:  # NOT_COORDINATOR: our metadata is behind; the producer retries
            return pb.COORDINATOR_NOT_AVAILABLE, st.error_message
        return verdict(
            st.state,
            st.producer_id,
            st.producer_epoch,
            [(x.topic, x.partition) for x in st.partitions],
            producer_id,
            epoch,
            written,
            (st.resume_producer_id, st.resume_producer_epoch),
        )

    # -- describe / list --------------------------------------------------------------------------

    def describe_transactions(self, transactional_ids: Iterable[str]) -> list[TxnDescription]:
        out: list[TxnDescription] = []
        for tid in transactional_ids:
            st = TxnDescription(tid)
            out.append(st)
            try:
                cpart = self._partition_for(tid)
            except SluiceError as exc:
                answer(st, exc)
                continue
            entry = cpart.state.txns.get(tid)
            meta = entry.meta if entry is not None else None
            if meta is None:
                st.error_code = pb.TRANSACTIONAL_ID_NOT_FOUND
                st.error_message = f"no transactional id {tid!r}"
                continue
            st.state = meta.state.value
            st.producer_id = meta.producer_id
            st.producer_epoch = meta.producer_epoch
            st.transaction_timeout_ms = meta.timeout_ms
            st.transaction_start_time_ms = meta.txn_start_ms
            st.last_update_time_ms = meta.last_update_ms
            st.coordinator_id = self.config.broker_id
            st.resume_producer_id, st.resume_producer_epoch = meta.resume_producer_id, meta.resume_producer_epoch
            st.partitions = sorted(meta.partitions)
        return out

    def list_transactions(self, req: ListTransactionsInput) -> TransactionList:
        """The ids of every loaded partition this broker coordinates (clients ask every broker)."""
        resp = TransactionList()
        for cpart in self.runtime.all_partitions():
            if not cpart.active:
                resp.error_code = pb.COORDINATOR_LOAD_IN_PROGRESS
                continue
            for tid, entry in sorted(cpart.state.txns.items()):
                meta = entry.meta
                if meta is None or (req.states and meta.state.value not in req.states):
                    continue
                if req.producer_ids and meta.producer_id not in req.producer_ids:
                    continue
                if req.duration_filter_ms > 0 and not (  # KIP-994: open for longer than the filter
                    meta.txn_start_ms >= 0 and self.clock() - meta.txn_start_ms > req.duration_filter_ms
                ):
                    continue
                resp.transactions.append(
                    ListedTransaction(
                        tid, meta.producer_id, meta.producer_epoch, meta.state.value, self.config.broker_id
                    )
                )
        return resp
