"""The transaction coordinator against the real broker core, in one process, without gRPC.

Wired as the broker process wires it (sluice.broker.core.build_core, through the unit tests'
one harness, tests/support/broker_core.py): SQLite metadata store and RocksDB in a tmp dir. One
broker, so every marker is written locally. Each test runs its own event loop (asyncio.run).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from pathlib import Path

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC, coordinator_partition
from sluice.broker.data_path import ProduceInput, ProducePartition
from sluice.broker.txn import TransactionCoordinator
from sluice.broker.txn.api import InitProducerIdInput, ListTransactionsInput, TxnDescription, TxnHandle
from sluice.broker.txn.state import MAX_EPOCH
from sluice.records import RecordBatch, build_batch, decode_records, parse_control
from tests.support.broker_core import InProcessBroker
from tests.support.waiting import until

TOPIC = "orders"
TXN_PARTITIONS = 4
BASE_CONFIG = {
    "transaction.state.log.num.partitions": str(TXN_PARTITIONS),
    "offsets.topic.num.partitions": "4",
}


class Broker(InProcessBroker):
    """One broker's core (no gRPC server), closable and reopenable on the same data."""

    def __init__(self, tmp: Path, config: dict[str, str] | None = None) -> None:
        super().__init__(tmp, {**BASE_CONFIG, **(config or {})})

    @property
    def coord(self) -> TransactionCoordinator:
        return self.txn

    async def open(self, *, wait_ready: bool = True) -> Broker:  # type: ignore[override]
        await super().open(topics={TOPIC: 2}, wait_ready=wait_ready)
        return self

    # -- requests ----------------------------------------------------------------------------------

    async def init(self, tid: str, timeout_ms: int = 60_000, pid: int = -1, epoch: int = -1) -> tuple[int, int]:
        """InitProducerId, retrying CONCURRENT_TRANSACTIONS as the client does."""
        for _ in range(500):
            resp = await self.coord.init_producer_id(
                InitProducerIdInput(
                    transactional_id=tid, transaction_timeout_ms=timeout_ms, producer_id=pid, producer_epoch=epoch
                )
            )
            if resp.error_code != pb.CONCURRENT_TRANSACTIONS:
                assert resp.error_code == pb.NONE, resp.error_message
                return resp.producer_id, resp.producer_epoch
            await asyncio.sleep(0.01)
        raise AssertionError("InitProducerId kept answering CONCURRENT_TRANSACTIONS")

    async def add(self, tid: str, pid: int, epoch: int, *partitions: int, topic: str = TOPIC) -> list[int]:
        answers = await self.coord.add_partitions_to_txn(TxnHandle(tid, pid, epoch), [(topic, p) for p in partitions])
        return [r.error_code for r in answers]

    async def end(self, tid: str, pid: int, epoch: int, commit: bool) -> int:
        resp = await self.coord.end_txn(TxnHandle(tid, pid, epoch), commit)
        return resp.error_code

    async def produce(self, tid: str, pid: int, epoch: int, seq: int, value: bytes, partition: int = 0) -> int:
        batch = build_batch(
            [(None, value)], producer_id=pid, producer_epoch=epoch, base_sequence=seq, transactional=True
        )
        (produced,) = await self.replicas.produce(
            ProduceInput([ProducePartition(TOPIC, partition, batch)], acks=-1, timeout_ms=1000, transactional_id=tid)
        )
        return produced.error_code

    def describe(self, tid: str) -> TxnDescription:
        (described,) = self.coord.describe_transactions([tid])
        return described

    def batches(self, partition: int = 0, topic: str = TOPIC) -> list[RecordBatch]:
        return list(self.replicas.iter_batches(topic, partition))

    def markers(self, partition: int = 0) -> list[bool]:
        """The COMMIT (True) / ABORT (False) markers of a partition, in order."""
        return [parse_control(b)[0] for b in self.batches(partition) if b.control]


def run(tmp: Path, test: Callable[[Broker], Awaitable[None]], config: dict[str, str] | None = None) -> None:
    async def main() -> None:
        broker = await Broker(tmp, config).open()
        try:
            await test(broker)
        finally:
            await broker.close()

    asyncio.run(main())


def state_is(b: Broker, tid: str, state: str) -> Callable[[], bool]:
    return lambda: b.describe(tid).state == state


# -- the happy path ---------------------------------------------------------------------------------


def test_commit_writes_markers_to_every_partition(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        assert epoch == 0 and pid > 0
        assert b.describe("tx").state == "Empty"
        assert await b.add("tx", pid, epoch, 0, 1) == [pb.NONE, pb.NONE]
        assert await b.produce("tx", pid, epoch, 0, b"a") == pb.NONE
        assert await b.produce("tx", pid, epoch, 0, b"b", partition=1) == pb.NONE
        offsets = await b.coord.add_offsets_to_txn(TxnHandle("tx", pid, epoch), "g")
        assert offsets.error_code == pb.NONE
        group_tp = (CONSUMER_OFFSETS_TOPIC, coordinator_partition("g", 4))
        st = b.describe("tx")
        assert st.state == "Ongoing" and st.transaction_start_time_ms > 0 and st.coordinator_id == 0
        assert set(st.partitions) == {(TOPIC, 0), (TOPIC, 1), group_tp}
        part = b.replicas.partitions[(TOPIC, 0)]
        assert part.last_stable_offset == 0 < part.high_watermark

        assert await b.end("tx", pid, epoch, commit=True) == pb.NONE
        await until(state_is(b, "tx", "CompleteCommit"), "CompleteCommit")
        assert b.markers(0) == [True] and b.markers(1) == [True]
        assert part.last_stable_offset == part.high_watermark == 2
        st = b.describe("tx")
        assert list(st.partitions) == [] and st.transaction_start_time_ms == -1
        # A retried EndTxn of the same outcome succeeds; the other outcome is refused.
        assert await b.end("tx", pid, epoch, commit=True) == pb.NONE
        assert await b.end("tx", pid, epoch, commit=False) == pb.INVALID_TXN_STATE
        # The next transaction of the same producer.
        assert await b.add("tx", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("tx", pid, epoch, 1, b"c") == pb.NONE
        assert await b.end("tx", pid, epoch, commit=False) == pb.NONE
        await until(state_is(b, "tx", "CompleteAbort"), "CompleteAbort")
        assert b.markers(0) == [True, False]
        assert part.aborted[pid] == [(2, 3)]  # (first offset, ABORT marker)

    run(tmp_path, test)


def test_list_and_describe(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        p1, e1 = await b.init("one")
        p2, _ = await b.init("two")
        assert await b.add("one", p1, e1, 0) == [pb.NONE]
        listed = b.coord.list_transactions(ListTransactionsInput())
        assert listed.error_code == pb.NONE
        assert {(t.transactional_id, t.state, t.producer_id) for t in listed.transactions} == {
            ("one", "Ongoing", p1),
            ("two", "Empty", p2),
        }
        ongoing = b.coord.list_transactions(ListTransactionsInput(states=frozenset({"Ongoing"})))
        assert [t.transactional_id for t in ongoing.transactions] == ["one"]
        by_pid = b.coord.list_transactions(ListTransactionsInput(producer_ids=frozenset({p2})))
        assert [t.transactional_id for t in by_pid.transactions] == ["two"]
        missing = b.describe("nope")
        assert missing.error_code == pb.TRANSACTIONAL_ID_NOT_FOUND

    run(tmp_path, test)


# -- request checks ---------------------------------------------------------------------------------


def test_request_checks(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        too_long = await b.coord.init_producer_id(
            InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=10**9)
        )
        assert too_long.error_code == pb.INVALID_TRANSACTION_TIMEOUT
        zero = await b.coord.init_producer_id(InitProducerIdInput(transactional_id="tx"))
        assert zero.error_code == pb.INVALID_TRANSACTION_TIMEOUT
        # Idempotent producers get a fresh id at epoch 0 from any broker.
        idem = await b.coord.init_producer_id(InitProducerIdInput(producer_id=-1, producer_epoch=-1))
        assert idem.error_code == pb.NONE and idem.producer_epoch == 0
        assert await b.add("unknown", 5, 0, 0) == [pb.INVALID_PRODUCER_ID_MAPPING]

        pid, epoch = await b.init("tx")
        assert await b.add("tx", pid + 1, epoch, 0) == [pb.INVALID_PRODUCER_ID_MAPPING]
        assert await b.add("tx", pid, epoch + 1, 0) == [pb.INVALID_PRODUCER_EPOCH]
        assert await b.end("tx", pid, epoch, commit=True) == pb.INVALID_TXN_STATE  # nothing open
        assert await b.add("tx", pid, epoch, 0, 9) == [pb.NONE, pb.UNKNOWN_TOPIC_OR_PARTITION]
        assert await b.add("tx", pid, epoch, 0, topic="no-such-topic") == [pb.UNKNOWN_TOPIC_OR_PARTITION]
        # KIP-890: a partition never added is refused by its leader.
        assert await b.produce("tx", pid, epoch, 0, b"x", partition=1) == pb.INVALID_TXN_STATE
        assert await b.produce("tx", pid, epoch, 0, b"x", partition=0) == pb.NONE
        # A second EndTxn while the first is being completed.
        b.coord.markers.initial_backoff_s = 0.2
        b.replicas.leader_of.discard((TOPIC, 0))  # markers cannot be written for now
        assert await b.end("tx", pid, epoch, commit=True) == pb.NONE
        assert b.describe("tx").state == "PrepareCommit"
        assert await b.end("tx", pid, epoch, commit=True) == pb.CONCURRENT_TRANSACTIONS
        assert await b.end("tx", pid, epoch, commit=False) == pb.INVALID_TXN_STATE
        assert await b.add("tx", pid, epoch, 1) == [pb.CONCURRENT_TRANSACTIONS]
        init = await b.coord.init_producer_id(InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=1))
        assert init.error_code == pb.CONCURRENT_TRANSACTIONS
        await asyncio.sleep(0.3)
        assert b.describe("tx").state == "PrepareCommit"  # retried, not given up
        b.replicas.leader_of.add((TOPIC, 0))  # the partition is back
        await until(state_is(b, "tx", "CompleteCommit"), "CompleteCommit")
        assert b.markers(0) == [True]

    run(tmp_path, test)


def test_verify_partition(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        verify = b.coord.verify_partition
        assert (await verify("tx", pid, epoch, TOPIC, 0))[0] == pb.INVALID_TXN_STATE
        await b.add("tx", pid, epoch, 0)
        assert (await verify("tx", pid, epoch, TOPIC, 0))[0] == pb.NONE
        assert (await verify("tx", pid, epoch, TOPIC, 1))[0] == pb.INVALID_TXN_STATE
        assert (await verify("tx", pid + 1, epoch, TOPIC, 0))[0] == pb.INVALID_TXN_STATE
        assert (await verify("nope", pid, epoch, TOPIC, 0))[0] == pb.INVALID_TXN_STATE
        await b.init("tx")  # fences: epoch + 2
        assert (await verify("tx", pid, epoch, TOPIC, 0))[0] == pb.PRODUCER_FENCED
        assert b.replicas.txn_verifier == b.coord.verify_partition

    run(tmp_path, test)


# -- fencing, KIP-360, epochs -------------------------------------------------------------------------


def test_second_init_fences_and_aborts_the_open_transaction(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        await b.add("tx", pid, epoch, 0)
        assert await b.produce("tx", pid, epoch, 0, b"zombie") == pb.NONE
        first = await b.coord.init_producer_id(
            InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=60_000)
        )
        assert first.error_code == pb.CONCURRENT_TRANSACTIONS  # the abort is under way
        pid2, epoch2 = await b.init("tx")
        assert (pid2, epoch2) == (pid, epoch + 2)  # +1 to fence, +1 for the new instance
        assert b.markers(0) == [False]  # the zombie's data is aborted
        assert b.batches(0)[-1].producer_epoch == epoch + 1  # marker at the fencing epoch
        assert await b.produce("tx", pid, epoch, 1, b"late") == pb.PRODUCER_FENCED
        assert await b.add("tx", pid, epoch, 1) == [pb.PRODUCER_FENCED]
        assert await b.end("tx", pid, epoch, commit=True) == pb.PRODUCER_FENCED
        assert await b.add("tx", pid2, epoch2, 0) == [pb.NONE]
        assert await b.produce("tx", pid2, epoch2, 0, b"successor") == pb.NONE
        assert await b.end("tx", pid2, epoch2, commit=True) == pb.NONE
        await until(state_is(b, "tx", "CompleteCommit"), "CompleteCommit")
        assert b.markers(0) == [False, True]

    run(tmp_path, test)


def test_kip360_reinit_and_lost_response_retry(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, e0 = await b.init("tx")
        # Re-init with the current id/epoch bumps it.
        assert await b.init("tx", pid=pid, epoch=e0) == (pid, e0 + 1)
        # The same request again (its response was lost): the same answer, no second bump.
        assert await b.init("tx", pid=pid, epoch=e0) == (pid, e0 + 1)
        # proto3's default 0 means "no id given": a new instance, which bumps.
        assert await b.init("tx", pid=0, epoch=0) == (pid, e0 + 2)
        stale = await b.coord.init_producer_id(
            InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=1000, producer_id=pid, producer_epoch=e0)
        )
        assert stale.error_code == pb.PRODUCER_FENCED
        other = await b.coord.init_producer_id(
            InitProducerIdInput(
                transactional_id="tx", transaction_timeout_ms=1000, producer_id=pid + 7, producer_epoch=0
            )
        )
        assert other.error_code == pb.PRODUCER_FENCED

    run(tmp_path, test)


def test_exhausted_epoch_gets_a_new_producer_id(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, _ = await b.init("tx")
        cpart = b.coord.runtime.get(coordinator_partition("tx", TXN_PARTITIONS))
        assert cpart is not None
        entry = cpart.state.txns["tx"]
        assert entry.meta is not None
        entry.meta = dataclasses.replace(entry.meta, producer_epoch=MAX_EPOCH - 2)
        assert await b.init("tx") == (pid, MAX_EPOCH - 1)
        new_pid, epoch = await b.init("tx", pid=pid, epoch=MAX_EPOCH - 1)
        assert new_pid != pid and epoch == 0
        # The retry of that request (response lost) is recognised by the previous id.
        assert await b.init("tx", pid=pid, epoch=MAX_EPOCH - 1) == (new_pid, 0)

    run(tmp_path, test)


# -- timeouts and expiration --------------------------------------------------------------------------


def test_timed_out_transaction_is_aborted_and_its_producer_fenced(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("slow", timeout_ms=200)
        await b.add("slow", pid, epoch, 0)
        assert await b.produce("slow", pid, epoch, 0, b"never") == pb.NONE
        await until(state_is(b, "slow", "CompleteAbort"), "the timeout abort")
        st = b.describe("slow")
        assert st.producer_epoch == epoch + 1
        assert b.markers(0) == [False]
        assert await b.produce("slow", pid, epoch, 1, b"late") == pb.PRODUCER_FENCED
        assert await b.end("slow", pid, epoch, commit=True) == pb.PRODUCER_FENCED
        assert await b.init("slow") == (pid, epoch + 2)

    run(tmp_path, test, {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "50"})


def test_idle_ids_expire_with_a_tombstone(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, _ = await b.init("idle")
        busy_pid, busy_epoch = await b.init("busy")
        await b.add("busy", busy_pid, busy_epoch, 0)
        await until(lambda: b.describe("idle").error_code == pb.TRANSACTIONAL_ID_NOT_FOUND, "expiration")
        assert b.describe("busy").state == "Ongoing"  # an open transaction never expires
        p = coordinator_partition("idle", TXN_PARTITIONS)
        last = b.batches(p, TRANSACTION_STATE_TOPIC)[-1]
        (rec,) = decode_records(last)
        assert rec.key == b"idle" and rec.value is None
        new_pid, new_epoch = await b.init("idle")  # a new life: a new producer id
        assert new_pid != pid and new_epoch == 0

    run(
        tmp_path,
        test,
        {
            "transactional.id.expiration.ms": "100",
            "transaction.remove.expired.transaction.cleanup.interval.ms": "50",
        },
    )


# -- loading, restart, failover ------------------------------------------------------------------------


def test_restart_reloads_state_and_completes_a_prepare_commit(tmp_path: Path) -> None:
    hook = {"sluice.test.hooks": "txn.stop_before_complete_commit"}

    async def main() -> None:
        b = await Broker(tmp_path, hook).open()
        pid, epoch = await b.init("tx")
        open_pid, open_epoch = await b.init("open")
        await b.add("tx", pid, epoch, 0, 1)
        await b.add("open", open_pid, open_epoch, 1)
        assert await b.produce("tx", pid, epoch, 0, b"committed") == pb.NONE
        assert await b.produce("open", open_pid, open_epoch, 0, b"pending", partition=1) == pb.NONE
        assert await b.end("tx", pid, epoch, commit=True) == pb.NONE
        await until(lambda: b.markers(0) == [True], "the COMMIT marker")
        await asyncio.sleep(0.1)
        assert b.describe("tx").state == "PrepareCommit"  # the hook: no CompleteCommit
        init = await b.coord.init_producer_id(InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=60_000))
        assert init.error_code == pb.CONCURRENT_TRANSACTIONS
        await b.close()

        b = await Broker(tmp_path, hook).open(wait_ready=False)
        assert not b.coord.is_ready()
        loading = await b.coord.init_producer_id(
            InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=60_000)
        )
        assert loading.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
        assert b.describe("tx").error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
        await until(b.coord.is_ready, "loading")
        # The loaded PrepareCommit is completed (the hook applies only to fresh commits).
        await until(state_is(b, "tx", "CompleteCommit"), "the reloaded PrepareCommit to complete")
        assert b.markers(0) == [True]  # the re-sent marker was a no-op
        assert b.markers(1) == []  # no data of "tx" there; "open" still open
        st = b.describe("open")
        assert (st.state, st.producer_id, st.producer_epoch) == ("Ongoing", open_pid, open_epoch)
        assert st.partitions == [(TOPIC, 1)]
        assert await b.produce("open", open_pid, open_epoch, 1, b"more", partition=1) == pb.NONE
        assert await b.end("open", open_pid, open_epoch, commit=False) == pb.NONE
        await until(state_is(b, "open", "CompleteAbort"), "abort after restart")
        assert b.markers(1) == [False]
        assert await b.init("tx") == (pid, epoch + 1)
        await b.close()

    asyncio.run(main())


def test_losing_leadership_drops_the_partition(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        p = coordinator_partition("tx", TXN_PARTITIONS)
        b.replicas.leader_of.discard((TRANSACTION_STATE_TOPIC, p))
        b.coord.runtime.on_leadership(TRANSACTION_STATE_TOPIC, p, False, 0)
        assert await b.add("tx", pid, epoch, 0) == [pb.NOT_COORDINATOR]
        assert b.describe("tx").error_code == pb.NOT_COORDINATOR
        assert b.coord.is_ready()
        # Leadership comes back with a new epoch: the state is loaded again from the log.
        b.replicas.leader_of.add((TRANSACTION_STATE_TOPIC, p))
        b.coord.runtime.on_leadership(TRANSACTION_STATE_TOPIC, p, True, 1)
        assert not b.coord.is_ready()
        await until(b.coord.is_ready, "reload")
        assert b.describe("tx").producer_id == pid
        reloaded = b.coord.runtime.get(p)
        assert reloaded is not None and reloaded.coordinator_epoch == 1

    run(tmp_path, test)


def test_declared_transactional_ids_only_when_the_cluster_requires_them(tmp_path: Path) -> None:
    """With transactional.id.declaration.required, only ids with a transactional_ids/<id> document
    (written by the operator for each TransactionalId resource) get a producer id."""

    async def scenario() -> None:
        broker = await Broker(tmp_path, {"transactional.id.declaration.required": "true"}).open()
        try:
            refused = await broker.coord.init_producer_id(
                InitProducerIdInput(transactional_id="app-1", transaction_timeout_ms=60_000, producer_id=-1)
            )
            assert refused.error_code == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
            assert "not declared" in refused.error_message and refused.producer_id == -1
            # Idempotent producers (no transactional id) are not concerned.
            idempotent = await broker.coord.init_producer_id(InitProducerIdInput(transaction_timeout_ms=1))
            assert idempotent.error_code == pb.NONE
            doc = broker.store.compare_and_set(
                "transactional_ids/app-1", {"transactional_id": "app-1", "resource": "ns/app-1"}, None
            )
            # Declared a moment ago and not yet seen by the broker's metadata refresh: still accepted
            # (the coordinator reads the store before refusing).
            pid, epoch = await broker.init("app-1")
            assert pid > 0 and epoch == 0
            # Undeclared again (the resource was deleted): new instances are refused.
            broker.store.delete("transactional_ids/app-1", doc.version)
            broker.cluster.refresh()
            again = await broker.coord.init_producer_id(
                InitProducerIdInput(transactional_id="app-1", transaction_timeout_ms=60_000, producer_id=-1)
            )
            assert again.error_code == pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
        finally:
            await broker.close()

    asyncio.run(scenario())


def test_undeclared_ids_work_by_default(tmp_path: Path) -> None:
    async def scenario() -> None:
        broker = await Broker(tmp_path).open()
        try:
            pid, epoch = await broker.init("anything-goes")
            assert pid > 0 and epoch == 0
        finally:
            await broker.close()

    asyncio.run(scenario())
