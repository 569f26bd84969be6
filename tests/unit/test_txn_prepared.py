"""Prepared transactions in the transaction coordinator (two-phase commit, the idea of KIP-939).

Against the real broker core in one process (the harness of test_txn_coordinator:
RocksDB, the metadata store, the replica manager), so the state changes are
really logged to ``__transaction_state`` and replayed on reopen.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.txn.api import HandleAnswer, InitProducerIdInput, ListTransactionsInput, TxnHandle
from tests.unit.test_txn_coordinator import TOPIC, Broker, run, state_is, until

FAST_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "50"}


async def prepare(b: Broker, tid: str, pid: int, epoch: int) -> HandleAnswer:
    return await b.coord.prepare_txn(TxnHandle(tid, pid, epoch))


async def end_prepared(b: Broker, tid: str, pid: int, epoch: int, commit: bool) -> HandleAnswer:
    return await b.coord.end_txn(TxnHandle(tid, pid, epoch), commit, prepared_only=True)


async def init_raw(b: Broker, tid: str, *, keep: bool = False, abort: bool = False) -> HandleAnswer:
    return await b.coord.init_producer_id(
        InitProducerIdInput(
            transactional_id=tid, transaction_timeout_ms=200, keep_prepared_txn=keep, abort_prepared_txn=abort
        )
    )


async def prepared_with_data(b: Broker, tid: str) -> tuple[int, int]:
    pid, epoch = await b.init(tid, timeout_ms=200)
    assert await b.add(tid, pid, epoch, 0) == [pb.NONE]
    assert await b.produce(tid, pid, epoch, 0, b"row") == pb.NONE
    resp = await prepare(b, tid, pid, epoch)
    assert resp.error_code == pb.NONE, resp.error_message
    assert (resp.producer_id, resp.producer_epoch) == (pid, epoch)
    return pid, epoch


def test_the_timeout_does_not_abort_a_prepared_transaction_and_its_handle_commits_it(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await prepared_with_data(b, "tx")
        await asyncio.sleep(0.6)  # three times the 200 ms timeout, with a 50 ms scan
        st = b.describe("tx")
        assert (st.state, st.producer_epoch) == ("Prepared", epoch)
        assert st.partitions == [(TOPIC, 0)]
        assert b.markers(0) == []
        # Nothing joins a prepared transaction, and a repeated prepare answers the same handle.
        assert await b.add("tx", pid, epoch, 1) == [pb.INVALID_TXN_STATE]
        again = await prepare(b, "tx", pid, epoch)
        assert (again.error_code, again.producer_id, again.producer_epoch) == (pb.NONE, pid, epoch)
        # Wrong handles are refused with Kafka's codes, and change nothing.
        assert (await end_prepared(b, "tx", pid, epoch - 1, True)).error_code == pb.PRODUCER_FENCED
        assert (await end_prepared(b, "tx", pid, epoch + 1, True)).error_code == pb.INVALID_PRODUCER_EPOCH
        assert (await end_prepared(b, "tx", pid + 1000, epoch, True)).error_code == pb.INVALID_PRODUCER_ID_MAPPING
        unknown = await end_prepared(b, "nope", pid, epoch, True)
        assert (
            unknown.error_code == pb.TRANSACTIONAL_ID_NOT_FOUND and "no prepared transaction" in unknown.error_message
        )
        assert b.describe("tx").state == "Prepared"
        # The right handle commits it, and a retried commit is answered OK.
        assert (await end_prepared(b, "tx", pid, epoch, True)).error_code == pb.NONE
        await until(state_is(b, "tx", "CompleteCommit"), "the commit to complete")
        assert b.markers(0) == [True]
        assert (await end_prepared(b, "tx", pid, epoch, True)).error_code == pb.NONE
        aborted = await end_prepared(b, "tx", pid, epoch, False)
        assert aborted.error_code == pb.INVALID_TXN_STATE and "no prepared transaction" in aborted.error_message
        assert b.markers(0) == [True]

    run(tmp_path, test, FAST_TIMEOUTS)


def test_abort_of_a_prepared_transaction(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await prepared_with_data(b, "tx")
        assert (await end_prepared(b, "tx", pid, epoch, False)).error_code == pb.NONE
        await until(state_is(b, "tx", "CompleteAbort"), "the abort to complete")
        assert b.markers(0) == [False]
        assert (await end_prepared(b, "tx", pid, epoch, False)).error_code == pb.NONE  # retried abort
        assert (await end_prepared(b, "tx", pid, epoch, True)).error_code == pb.INVALID_TXN_STATE

    run(tmp_path, test)


def test_an_open_transaction_that_was_not_prepared_is_not_ended_by_a_handle(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("open")
        assert await b.add("open", pid, epoch, 0) == [pb.NONE]
        resp = await end_prepared(b, "open", pid, epoch, True)
        assert resp.error_code == pb.INVALID_TXN_STATE and "no prepared transaction" in resp.error_message
        assert b.describe("open").state == "Ongoing"
        assert await b.end("open", pid, epoch, commit=False) == pb.NONE  # the producer's own EndTxn still works
        await until(state_is(b, "open", "CompleteAbort"), "the abort")

    run(tmp_path, test)


def test_init_never_aborts_a_prepared_transaction_silently(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await prepared_with_data(b, "tx")
        plain = await init_raw(b, "tx")
        assert plain.error_code == pb.INVALID_TXN_STATE and "prepared transaction" in plain.error_message
        both = await init_raw(b, "tx", keep=True, abort=True)
        assert both.error_code == pb.INVALID_REQUEST
        kept = await init_raw(b, "tx", keep=True)
        assert (kept.error_code, kept.producer_id, kept.producer_epoch) == (pb.NONE, pid, epoch)
        assert kept.previous_state == "Prepared"
        assert b.describe("tx").state == "Prepared" and b.markers(0) == []
        # Told to, InitProducerId aborts it with the epoch bumped (the old handle is fenced).
        first = await init_raw(b, "tx", abort=True)
        assert first.error_code == pb.CONCURRENT_TRANSACTIONS
        await until(state_is(b, "tx", "CompleteAbort"), "the fencing abort")
        assert b.markers(0) == [False]
        after = await init_raw(b, "tx", abort=True)
        assert (after.error_code, after.producer_id, after.producer_epoch) == (pb.NONE, pid, epoch + 2)
        assert after.previous_state == "CompleteAbort"
        assert (await end_prepared(b, "tx", pid, epoch, True)).error_code == pb.PRODUCER_FENCED

    run(tmp_path, test)


def test_an_idle_id_prepares_an_empty_transaction_and_init_reports_the_commit(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("empty")
        resp = await prepare(b, "empty", pid, epoch)
        assert resp.error_code == pb.NONE
        st = b.describe("empty")
        assert st.state == "Prepared" and list(st.partitions) == []
        assert (await end_prepared(b, "empty", pid, epoch, True)).error_code == pb.NONE
        await until(state_is(b, "empty", "CompleteCommit"), "the empty commit")
        again = await init_raw(b, "empty", keep=True)
        assert (again.error_code, again.previous_state) == (pb.NONE, "CompleteCommit")
        listed = b.coord.list_transactions(ListTransactionsInput(states=frozenset({"Prepared"})))
        assert list(listed.transactions) == []

    run(tmp_path, test)


def test_list_shows_prepared_transactions_with_their_handle(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await prepared_with_data(b, "a")
        await b.init("b")
        listed = b.coord.list_transactions(ListTransactionsInput(states=frozenset({"Prepared"})))
        assert [(t.transactional_id, t.producer_id, t.producer_epoch, t.state) for t in listed.transactions] == [
            ("a", pid, epoch, "Prepared")
        ]

    run(tmp_path, test)


def test_a_prepared_transaction_survives_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        b = await Broker(tmp_path, FAST_TIMEOUTS).open()
        pid, epoch = await prepared_with_data(b, "tx")
        await b.close()

        b = await Broker(tmp_path, FAST_TIMEOUTS).open()
        await asyncio.sleep(0.5)  # past the timeout, with the scan running on the reloaded state
        st = b.describe("tx")
        assert (st.state, st.producer_id, st.producer_epoch) == ("Prepared", pid, epoch)
        assert st.partitions == [(TOPIC, 0)]
        assert (await end_prepared(b, "tx", pid, epoch, True)).error_code == pb.NONE
        await until(state_is(b, "tx", "CompleteCommit"), "the commit after the restart")
        assert b.markers(0) == [True]
        await b.close()

    asyncio.run(main())
