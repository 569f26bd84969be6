"""The coordinator runtime recovers from a load that fails mid-way, without a restart.

Real broker core in one process (SQLite metadata, RocksDB storage, ReplicaManager) and the
real coordinator classes. The failures are injected at the edges only: a RocksDB storage whose
log scan fails once part-way through (a disk read error), and a group coordinator whose replay
raises once after it replayed some batches (a bug in a shard's replay).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path

from sluice import errors
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, ClusterView, coordinator_partition
from sluice.broker.config import BrokerConfig
from sluice.broker.coordination import LoadStatus
from sluice.broker.coordination.runtime import LOAD_YIELD_EVERY, coordinator_error
from sluice.broker.group import GroupCoordinator
from sluice.broker.group.api import CommitOffset, OffsetCommitInput, OffsetFetchInput
from sluice.broker.group.coordinator import OffsetsPartitionState
from sluice.broker.log.manager import LogManager
from sluice.broker.log.storage import RocksStorage
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.api import InitProducerIdInput, TxnDescription, TxnHandle
from sluice.metadata import MetadataStore, open_store
from sluice.records import RecordBatch, build_batch
from tests.support.waiting import until

TOPIC = "orders"
PARTITIONS = 4
CONFIG = {"transaction.state.log.num.partitions": str(PARTITIONS), "offsets.topic.num.partitions": str(PARTITIONS)}


class FlakyStorage(RocksStorage):
    """RocksDB whose next ``fail_log_scans`` scans of the log fail after ``fail_after`` entries."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.fail_log_scans = 0
        self.fail_after = 0
        self.failures = 0

    def scan(self, cf: str, start: bytes, end: bytes, back_to: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        if cf != "log" or self.fail_log_scans <= 0:
            yield from super().scan(cf, start, end, back_to)
            return
        self.fail_log_scans -= 1
        for n, item in enumerate(super().scan(cf, start, end, back_to)):
            if n == self.fail_after:
                self.failures += 1
                raise OSError("injected: reading the log failed part-way")
            yield item


class Core:
    """A broker's replica manager without coordinators, reopenable on the same directories.

    Not the shared harness (tests/support/broker_core.py), which builds the broker's own
    coordinators: these tests build theirs around the runtime (one failing on purpose)."""

    def __init__(self, tmp: Path) -> None:
        data = tmp / "data"
        os.makedirs(data, exist_ok=True)
        self.store: MetadataStore = open_store(str(tmp / "metadata.sqlite"))
        self.config = BrokerConfig.build(0, "127.0.0.1", 1, str(data), str(tmp / "metadata.sqlite"), CONFIG)
        self.cluster = ClusterView(self.store, self.config)
        self.cluster.register()
        self.storage = FlakyStorage(str(data / "rocksdb"))
        self.channels = BrokerChannels(self.cluster)
        self.replicas = ReplicaManager(
            LogManager(self.storage, self.cluster, self.config), self.cluster, self.config, self.channels
        )

    def create_topics(self) -> None:
        self.cluster.ensure_internal_topics()
        self.cluster.refresh()
        if TOPIC not in self.cluster.topics:
            self.cluster.create_topic(TOPIC, 2, 1, {})

    def close(self) -> None:
        self.storage.close()
        self.store.close()


# -- the transaction coordinator (the bug: it never retried a failed load) ----------------------------


async def _transactions(coord: TransactionCoordinator, core: Core, count: int) -> tuple[int, int]:
    """``count`` committed transactions of "tx", then one left open on orders-1; (pid, epoch)."""
    init = await coord.init_producer_id(InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=60_000))
    assert init.error_code == pb.NONE, init.error_message
    handle = TxnHandle("tx", init.producer_id, init.producer_epoch)
    for n in range(count + 1):
        partition = 0 if n < count else 1
        add = await coord.add_partitions_to_txn(handle, [(TOPIC, partition)])
        assert [r.error_code for r in add] == [pb.NONE]
        if n == count:
            break
        assert (await coord.end_txn(handle, True)).error_code == pb.NONE
        await until(lambda: describe(coord).state == "CompleteCommit", "CompleteCommit")
    return init.producer_id, init.producer_epoch


def describe(coord: TransactionCoordinator) -> TxnDescription:
    (described,) = coord.describe_transactions(["tx"])
    return described


def test_a_failed_transaction_state_load_is_retried_without_a_restart(tmp_path: Path) -> None:
    partition = coordinator_partition("tx", PARTITIONS)

    async def main() -> None:
        core = Core(tmp_path)
        coord = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
        await coord.start()
        core.create_topics()
        await until(coord.is_ready, "the first load")
        pid, epoch = await _transactions(coord, core, 10)
        await coord.stop()
        core.close()

        # Restart; the first read of __transaction_state-p fails part-way through.
        core = Core(tmp_path)
        core.storage.fail_log_scans, core.storage.fail_after = 1, 5
        coord = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
        coord.runtime.retry_initial_s = 0.3  # long enough to observe the failed state
        await coord.start()
        core.create_topics()
        try:
            await until(lambda: core.storage.failures == 1, "the injected failure")
            cpart = coord.runtime.get(partition)
            assert cpart is not None and cpart.status is LoadStatus.FAILED
            assert "injected" in cpart.last_error
            # Meanwhile its ids are answered "loading" (retriable), never NOT_COORDINATOR.
            st = describe(coord)
            assert st.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
            assert "failed" in st.error_message and "retrying" in st.error_message
            assert not coord.is_ready()

            await until(coord.is_ready, "the retried load")
            assert coord.runtime.get(partition) is cpart and cpart.status is LoadStatus.ACTIVE
            assert cpart.attempts == 2
            assert coord.runtime.last_load_ms[partition] >= 0
            st = describe(coord)
            assert (st.error_code, st.state, st.producer_id, st.producer_epoch) == (pb.NONE, "Ongoing", pid, epoch)
            assert st.partitions == [(TOPIC, 1)]
            # And the loaded state serves requests: the open transaction commits.
            end = await coord.end_txn(TxnHandle("tx", pid, epoch), True)
            assert end.error_code == pb.NONE, end.error_message
            await until(lambda: describe(coord).state == "CompleteCommit", "the commit after the reload")
        finally:
            await coord.stop()
            core.close()

    asyncio.run(main())


def test_losing_leadership_stops_the_retries(tmp_path: Path) -> None:
    partition = coordinator_partition("tx", PARTITIONS)

    async def main() -> None:
        core = Core(tmp_path)
        coord = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
        await coord.start()
        core.create_topics()
        await until(coord.is_ready, "the first load")
        await _transactions(coord, core, 1)
        await coord.stop()
        core.close()

        core = Core(tmp_path)
        core.storage.fail_log_scans, core.storage.fail_after = 100, 0  # fails every time
        coord = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
        coord.runtime.retry_initial_s = coord.runtime.retry_max_s = 0.05
        await coord.start()
        core.create_topics()
        try:
            await until(lambda: core.storage.failures >= 3, "a few failed attempts")
            cpart = coord.runtime.get(partition)
            assert cpart is not None and cpart.load_task is not None
            core.replicas.leader_of.discard((TRANSACTION_STATE_TOPIC, partition))
            coord.runtime.on_leadership(TRANSACTION_STATE_TOPIC, partition, False, 0)
            assert cpart.status is LoadStatus.UNLOADED and coord.runtime.get(partition) is None
            await asyncio.sleep(0.05)
            assert cpart.load_task.done()
            failures = core.storage.failures
            await asyncio.sleep(0.3)
            assert core.storage.failures == failures  # no attempt after the resignation
            assert describe(coord).error_code == pb.NOT_COORDINATOR
        finally:
            await coord.stop()
            core.close()

    asyncio.run(main())


# -- the group coordinator: a replay that raises once, after some batches -------------------------------


class ReplayFailsOnce(GroupCoordinator):
    """The real group coordinator, whose replay raises once after ``fail_after`` batches."""

    fail_after = LOAD_YIELD_EVERY + 6  # past a yield to the event loop: the load was really under way
    replayed = 0
    failed = False

    def replay(self, state: OffsetsPartitionState, partition: int, batch: RecordBatch) -> None:
        if not self.failed:
            self.replayed += 1
            if self.replayed > self.fail_after:
                self.failed = True
                raise RuntimeError("injected: replay failed part-way")
        super().replay(state, partition, batch)


def _commit(group: str, offset: int) -> OffsetCommitInput:
    return OffsetCommitInput(group, (CommitOffset(TOPIC, 0, offset, 0),))


async def _fetch(groups: GroupCoordinator, group: str) -> tuple[int, int]:
    resp = await groups.offset_fetch(OffsetFetchInput(group))
    if resp.error_code != pb.NONE:
        return resp.error_code, -1
    return pb.NONE, resp.partitions[0].offset


def test_a_failed_offsets_load_is_retried_without_a_restart(tmp_path: Path) -> None:
    partition = coordinator_partition("g", PARTITIONS)
    commits = 2 * LOAD_YIELD_EVERY

    async def main() -> None:
        core = Core(tmp_path)
        groups: GroupCoordinator = GroupCoordinator(core.replicas, core.cluster, core.config)
        await groups.start()
        core.create_topics()
        await until(groups.is_ready, "the first load")
        for offset in range(commits):
            resp = await groups.offset_commit(_commit("g", offset))
            assert [r.error_code for r in resp] == [pb.NONE]
        await groups.stop()
        core.close()

        core = Core(tmp_path)
        flaky = ReplayFailsOnce(core.replicas, core.cluster, core.config)
        flaky.runtime.retry_initial_s = 0.3
        await flaky.start()
        core.create_topics()
        try:
            await until(lambda: flaky.failed, "the injected failure")
            assert flaky.replayed == ReplayFailsOnce.fail_after + 1
            cpart = flaky.runtime.get(partition)
            assert cpart is not None and cpart.status is LoadStatus.FAILED
            assert await _fetch(flaky, "g") == (pb.COORDINATOR_LOAD_IN_PROGRESS, -1)
            await until(flaky.is_ready, "the retried load")
            assert cpart.status is LoadStatus.ACTIVE and cpart.attempts == 2
            assert await _fetch(flaky, "g") == (pb.NONE, commits - 1)
            # Markers reach the reloaded state: the listener was registered by the successful attempt.
            state = cpart.state
            assert state.log is not None and state.marker_listener in state.log.marker_listeners
            resp = await flaky.offset_commit(_commit("g", commits))
            assert [r.error_code for r in resp] == [pb.NONE]
            assert await _fetch(flaky, "g") == (pb.NONE, commits)
        finally:
            await flaky.stop()
            core.close()

    asyncio.run(main())


def test_offsets_partition_is_a_shard_on_the_runtime(tmp_path: Path) -> None:
    """Both coordinators run on the same runtime class, each for its own internal topic."""

    async def main() -> None:
        core = Core(tmp_path)
        groups = GroupCoordinator(core.replicas, core.cluster, core.config)
        txn = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
        await groups.start()
        await txn.start()
        core.create_topics()
        try:
            await until(lambda: groups.is_ready() and txn.is_ready(), "both loads")
            assert type(groups.runtime) is type(txn.runtime)
            assert (groups.runtime.topic, txn.runtime.topic) == (CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC)
            assert sorted(groups.runtime.last_load_ms) == sorted(txn.runtime.last_load_ms) == list(range(PARTITIONS))
        finally:
            await txn.stop()
            await groups.stop()
            core.close()

    asyncio.run(main())


def test_leadership_told_outside_the_loop_is_loaded_by_the_supervisor(tmp_path: Path) -> None:
    """A synchronous metadata refresh between loop runs: no task can start then; the runtime starts it later."""
    loop = asyncio.new_event_loop()
    core = Core(tmp_path)
    coord = TransactionCoordinator(core.replicas, core.cluster, core.config, core.channels)
    try:
        loop.run_until_complete(coord.start())
        core.create_topics()  # leadership of every partition is told here, with no loop running
        cparts = coord.runtime.all_partitions()
        assert len(cparts) == PARTITIONS and all(c.load_task is None for c in cparts)
        assert not coord.is_ready()
        loop.run_until_complete(until(coord.is_ready, "the supervisor to load them"))
        assert all(c.status is LoadStatus.ACTIVE and c.attempts == 1 for c in cparts)
    finally:
        loop.run_until_complete(coord.stop())
        loop.close()
        core.close()


def test_one_error_table_for_every_coordinator_write() -> None:
    """Kafka's mapping: the leader moved or its disk failed -> NOT_COORDINATOR; too few replicas or a
    timeout -> COORDINATOR_NOT_AVAILABLE; a batch refused as too large -> UNKNOWN_SERVER_ERROR."""
    expected = {
        errors.NotLeaderOrFollowerError: pb.NOT_COORDINATOR,
        errors.KafkaStorageError: pb.NOT_COORDINATOR,
        errors.NotEnoughReplicasError: pb.COORDINATOR_NOT_AVAILABLE,
        errors.NotEnoughReplicasAfterAppendError: pb.COORDINATOR_NOT_AVAILABLE,
        errors.RequestTimedOutError: pb.COORDINATOR_NOT_AVAILABLE,
        errors.UnknownTopicOrPartitionError: pb.COORDINATOR_NOT_AVAILABLE,
        errors.MessageTooLargeError: pb.UNKNOWN_SERVER_ERROR,
    }
    for kind, code in expected.items():
        mapped = coordinator_error(kind("cause"), "the state of 'tx'")
        assert (mapped.code, mapped.message) == (code, "cannot write the state of 'tx': cause"), kind
    other = errors.InvalidRequestError("as it is")
    assert coordinator_error(other, "x") is other


def test_a_write_at_a_coordinator_epoch_no_longer_led_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """A shard's state belongs to the epoch it was loaded at (issue 30): a write made for an older
    epoch, though this broker leads the partition again, is NOT_COORDINATOR and not appended."""

    async def main() -> None:
        core = Core(tmp_path)
        groups = GroupCoordinator(core.replicas, core.cluster, core.config)
        await groups.start()
        core.create_topics()
        try:
            await until(groups.is_ready, "the offsets load")
            cpart = groups.runtime.active(0, "partition 0")
            batch = build_batch([(b"k", b"v")])
            base = await groups.runtime.write(0, cpart.coordinator_epoch, batch, "a record")
            part = core.replicas.partitions[(CONSUMER_OFFSETS_TOPIC, 0)]
            assert part.high_watermark == part.log_end_offset == base + 1
            part.become_leader(cpart.coordinator_epoch + 1)  # led again at a later epoch
            try:
                await groups.runtime.write(0, cpart.coordinator_epoch, build_batch([(b"k", b"w")]), "a record")
            except errors.SluiceError as exc:
                assert exc.code == pb.NOT_COORDINATOR and "admitted at leader epoch" in exc.message
            else:
                raise AssertionError("a write for an older coordinator epoch was appended")
            assert part.log_end_offset == base + 1
        finally:
            await groups.stop()
            core.close()

    asyncio.run(main())
