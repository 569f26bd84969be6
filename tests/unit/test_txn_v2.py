"""Transaction protocol version 2 at the coordinator (KIP-890 part 2, issue 13 section 1).

A version 2 producer (transaction_version=2 on AddPartitionsToTxn/EndTxn) gets
the epoch bumped at every end, with the new handle in EndTxn's answer; a
transaction of it that times out is aborted with the epoch bumped but *not*
fenced: the replaced handle gets the abortable INVALID_PRODUCER_EPOCH, its
abort succeeds with the new handle, and it goes on. Another instance's
InitProducerId still fences it for good. The coordinator runs against the real
broker core (tests/unit/test_txn_coordinator.py's harness).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.txn.api import HandleAnswer, TxnHandle
from sluice.broker.txn.log import decode_value, encode_key, encode_value
from sluice.broker.txn.state import MAX_EPOCH, IllegalTransition, TxnMetadata, TxnState
from sluice.records import decode_records

from .test_txn_coordinator import TOPIC, Broker, run, state_is, until

V2 = 2
FAST_TIMEOUTS = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "50"}


async def add2(b: Broker, tid: str, pid: int, epoch: int, *partitions: int) -> list[int]:
    answers = await b.coord.add_partitions_to_txn(TxnHandle(tid, pid, epoch, V2), [(TOPIC, p) for p in partitions])
    return [r.error_code for r in answers]


async def end2(b: Broker, tid: str, pid: int, epoch: int, commit: bool) -> HandleAnswer:
    """EndTxn (version 2), retrying CONCURRENT_TRANSACTIONS as the client does."""
    for _ in range(500):
        resp = await b.coord.end_txn(TxnHandle(tid, pid, epoch, V2), commit)
        if resp.error_code != pb.CONCURRENT_TRANSACTIONS:
            return resp
        await asyncio.sleep(0.01)
    raise AssertionError("EndTxn kept answering CONCURRENT_TRANSACTIONS")


def test_every_end_bumps_the_epoch_and_answers_the_new_handle(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        assert await add2(b, "tx", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("tx", pid, epoch, 0, b"a") == pb.NONE
        resp = await end2(b, "tx", pid, epoch, commit=True)
        assert (resp.error_code, resp.producer_id, resp.producer_epoch) == (pb.NONE, pid, epoch + 1)
        await until(state_is(b, "tx", "CompleteCommit"), "CompleteCommit")
        marker = [x for x in b.batches(0) if x.control][-1]
        assert marker.producer_epoch == epoch + 1  # the marker carries the bumped epoch
        # A retry whose answer was lost (the old handle) is answered again; the other outcome is refused.
        again = await end2(b, "tx", pid, epoch, commit=True)
        assert (again.error_code, again.producer_epoch) == (pb.NONE, epoch + 1)
        assert (await end2(b, "tx", pid, epoch, commit=False)).error_code == pb.INVALID_TXN_STATE
        # The old handle cannot start a transaction (abortable), the new one goes on at sequence 0.
        assert await add2(b, "tx", pid, epoch, 1) == [pb.INVALID_PRODUCER_EPOCH]
        assert await add2(b, "tx", pid, epoch + 1, 0, 1) == [pb.NONE, pb.NONE]
        assert await b.produce("tx", pid, epoch + 1, 0, b"b") == pb.NONE
        assert await b.produce("tx", pid, epoch + 1, 0, b"c", partition=1) == pb.NONE
        # Once the new transaction began, the old handle is no longer a resumable one: fenced.
        assert await add2(b, "tx", pid, epoch, 1) == [pb.PRODUCER_FENCED]
        resp = await end2(b, "tx", pid, epoch + 1, commit=False)
        assert (resp.error_code, resp.producer_epoch) == (pb.NONE, epoch + 2)
        await until(state_is(b, "tx", "CompleteAbort"), "CompleteAbort")
        assert b.markers(0) == [True, False] and b.markers(1) == [False]

    run(tmp_path, test)


def test_a_timed_out_v2_transaction_is_abortable_and_the_producer_goes_on(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("slow", timeout_ms=200)
        assert await add2(b, "slow", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("slow", pid, epoch, 0, b"never") == pb.NONE
        await until(state_is(b, "slow", "CompleteAbort"), "the timeout abort")
        st = b.describe("slow")
        assert (st.producer_epoch, st.resume_producer_id, st.resume_producer_epoch) == (epoch + 1, pid, epoch)
        assert b.markers(0) == [False]
        # Every request of the old handle is abortable, never PRODUCER_FENCED ...
        assert await b.produce("slow", pid, epoch, 1, b"late") == pb.INVALID_PRODUCER_EPOCH
        assert await b.produce("slow", pid, epoch, 0, b"late", partition=1) == pb.INVALID_PRODUCER_EPOCH
        assert await add2(b, "slow", pid, epoch, 1) == [pb.INVALID_PRODUCER_EPOCH]
        commit = await end2(b, "slow", pid, epoch, commit=True)
        assert commit.error_code == pb.INVALID_PRODUCER_EPOCH and "timed out" in commit.error_message
        # ... its abort succeeds with the new handle, and it goes on.
        abort = await end2(b, "slow", pid, epoch, commit=False)
        assert (abort.error_code, abort.producer_id, abort.producer_epoch) == (pb.NONE, pid, epoch + 1)
        assert await add2(b, "slow", pid, epoch + 1, 0) == [pb.NONE]
        assert await b.produce("slow", pid, epoch + 1, 0, b"next") == pb.NONE
        done = await end2(b, "slow", pid, epoch + 1, commit=True)
        assert (done.error_code, done.producer_epoch) == (pb.NONE, epoch + 2)
        await until(state_is(b, "slow", "CompleteCommit"), "CompleteCommit")
        assert b.markers(0) == [False, True]

    run(tmp_path, test, FAST_TIMEOUTS)


def test_the_resume_handle_survives_a_restart(tmp_path: Path) -> None:
    async def main() -> None:
        b = await Broker(tmp_path, FAST_TIMEOUTS).open()
        pid, epoch = await b.init("slow", timeout_ms=200)
        assert await add2(b, "slow", pid, epoch, 0) == [pb.NONE]
        await until(state_is(b, "slow", "CompleteAbort"), "the timeout abort")
        await b.close()
        b = await Broker(tmp_path, FAST_TIMEOUTS).open()
        try:
            assert (await end2(b, "slow", pid, epoch, commit=True)).error_code == pb.INVALID_PRODUCER_EPOCH
            abort = await end2(b, "slow", pid, epoch, commit=False)
            assert (abort.error_code, abort.producer_epoch) == (pb.NONE, epoch + 1)
        finally:
            await b.close()

    asyncio.run(main())


def test_a_new_instance_fences_a_timed_out_producer_for_good(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("z", timeout_ms=200)
        assert await add2(b, "z", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("z", pid, epoch, 0, b"zombie") == pb.NONE
        await until(state_is(b, "z", "CompleteAbort"), "the timeout abort")
        pid2, epoch2 = await b.init("z")  # another instance: the old handle may no longer resume
        assert (pid2, epoch2) == (pid, epoch + 2)
        assert b.describe("z").resume_producer_epoch == -1
        assert await b.produce("z", pid, epoch, 1, b"late") == pb.PRODUCER_FENCED
        assert await add2(b, "z", pid, epoch, 0) == [pb.PRODUCER_FENCED]
        assert (await end2(b, "z", pid, epoch, commit=False)).error_code == pb.PRODUCER_FENCED
        assert (await end2(b, "z", pid, epoch + 1, commit=False)).error_code == pb.PRODUCER_FENCED
        assert await add2(b, "z", pid2, epoch2, 0) == [pb.NONE]
        assert await b.produce("z", pid2, epoch2, 0, b"successor") == pb.NONE
        assert (await end2(b, "z", pid2, epoch2, commit=True)).producer_epoch == epoch2 + 1
        await until(state_is(b, "z", "CompleteCommit"), "CompleteCommit")

    run(tmp_path, test, FAST_TIMEOUTS)


def test_a_new_instance_fences_an_open_v2_transaction_for_good(tmp_path: Path) -> None:
    async def test(b: Broker) -> None:
        pid, epoch = await b.init("z")
        assert await add2(b, "z", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("z", pid, epoch, 0, b"zombie") == pb.NONE
        pid2, epoch2 = await b.init("z")
        assert (pid2, epoch2) == (pid, epoch + 2)
        assert await b.produce("z", pid, epoch, 1, b"late") == pb.PRODUCER_FENCED
        assert await add2(b, "z", pid, epoch, 1) == [pb.PRODUCER_FENCED]
        assert (await end2(b, "z", pid, epoch, commit=False)).error_code == pb.PRODUCER_FENCED

    run(tmp_path, test)


# -- the state, pure ----------------------------------------------------------------------------------


def ongoing(epoch: int) -> TxnMetadata:
    return TxnMetadata(
        transactional_id="t",
        producer_id=7,
        producer_epoch=epoch,
        last_producer_id=-1,
        last_producer_epoch=-1,
        timeout_ms=60_000,
        state=TxnState.ONGOING,
        partitions=frozenset({("orders", 0)}),
        txn_start_ms=1,
        last_update_ms=1,
        tv2=True,
    )


def test_an_end_at_the_last_epoch_moves_to_a_new_producer_id() -> None:
    meta = ongoing(MAX_EPOCH - 1)
    with pytest.raises(IllegalTransition):
        meta.prepare_end(True, 2)  # no room for epoch + 1: the coordinator must give a new id
    prepared = meta.prepare_end(True, 2, next_producer_id=99)
    # The markers still carry the old id, at MAX_EPOCH; the producer goes on with the new id.
    assert (prepared.producer_id, prepared.producer_epoch) == (7, MAX_EPOCH)
    assert prepared.handle() == (99, 0)
    assert prepared.is_resume_handle(7, MAX_EPOCH - 1) and not prepared.is_resume_handle(99, 0)
    done = prepared.complete(3)
    assert (done.producer_id, done.producer_epoch, done.state) == (99, 0, TxnState.COMPLETE_COMMIT)
    assert done.is_resume_handle(7, MAX_EPOCH - 1)
    assert decode_value(encode_key("t"), encode_value(done)) == done


def test_a_timeout_bump_is_resumable_and_a_fence_is_not() -> None:
    meta = ongoing(4)
    timed_out = meta.abort_timed_out(5)
    assert (timed_out.state, timed_out.producer_epoch, timed_out.timed_out) == (TxnState.PREPARE_ABORT, 5, True)
    assert timed_out.is_resume_handle(7, 4)
    fenced = meta.fence_and_abort(5)
    assert fenced.producer_epoch == 5 and not fenced.is_resume_handle(7, 4)
    assert meta.fence_and_abort(5, owner_may_resume=True).is_resume_handle(7, 4)
    # The v2 fields survive the log, and a record without them reads as a version 1 state.
    assert decode_value(encode_key("t"), encode_value(timed_out)) == timed_out
    old = b'{"v":0,"pid":7,"epoch":4,"last_pid":-1,"last_epoch":-1,"timeout_ms":1,"state":"Empty",'
    old += b'"partitions":[],"start_ms":-1,"update_ms":1}'
    legacy = decode_value(encode_key("t"), old)
    assert (legacy.resume_producer_epoch, legacy.next_producer_id) == (-1, -1)
    assert not legacy.timed_out and not legacy.tv2


def test_a_late_marker_of_the_previous_transaction_does_not_end_the_next_one(tmp_path: Path) -> None:
    """Issue 30 (Kafka's KIP-1228): under TV2 the next transaction writes with the epoch the previous
    one's markers carry. A WriteTxnMarkers of the previous transaction delivered late (after a cut
    heals) would have ended the new one as aborted, and the new one's commit would then find
    nothing open: a commit acknowledged with its records aborted. TV2 markers go out as version 2
    and a partition refuses one that is not newer than its open transaction's data."""

    async def test(b: Broker) -> None:
        pid, epoch = await b.init("tx")
        assert await add2(b, "tx", pid, epoch, 0) == [pb.NONE]
        assert await b.produce("tx", pid, epoch, 0, b"first") == pb.NONE
        assert (await end2(b, "tx", pid, epoch, commit=False)).error_code == pb.NONE
        await until(state_is(b, "tx", "CompleteAbort"), "CompleteAbort")
        # the next transaction writes with the bumped epoch, the one the abort's marker carries
        assert await add2(b, "tx", pid, epoch + 1, 0) == [pb.NONE]
        assert await b.produce("tx", pid, epoch + 1, 0, b"second") == pb.NONE
        late = ipb.WriteTxnMarkersRequest(
            markers=[
                ipb.TxnMarker(
                    producer_id=pid,
                    producer_epoch=epoch + 1,
                    committed=False,
                    coordinator_epoch=0,
                    transaction_version=2,
                    partitions=[pb.TopicPartition(topic=TOPIC, partition=0)],
                    transactional_id="tx",
                )
            ]
        )
        refused = (await b.replicas.write_markers(late)).markers[0].partitions[0]
        assert refused.error_code == pb.INVALID_PRODUCER_EPOCH and "late marker" in refused.error_message
        assert b.markers(0) == [False]  # only the first transaction's abort
        assert (await end2(b, "tx", pid, epoch + 1, commit=True)).error_code == pb.NONE
        await until(state_is(b, "tx", "CompleteCommit"), "CompleteCommit")
        assert b.markers(0) == [False, True]
        part = b.replicas.partitions[(TOPIC, 0)]
        visible = part.read(0, 1 << 20, read_committed=True)
        assert [decode_records(x)[0].value for x in visible.batches if not x.control] == [b"second"]

    run(tmp_path, test)


def test_markers_say_whether_the_end_bumped_the_epoch() -> None:
    """The flag survives the log (a coordinator failover re-sends markers from the loaded state)."""
    meta = TxnMetadata.new("tx", 7, 60_000, 0).add_partitions([(TOPIC, 0)], 1, tv2=True)
    ends = {
        "v2 end": meta.prepare_end(True, 2, bump=True),
        "timeout": meta.abort_timed_out(2),
        "fence": meta.fence_and_abort(2),
        "v1 end": meta.prepare_end(True, 2, bump=False),
    }
    assert {k: m.end_bumped for k, m in ends.items()} == {
        "v2 end": True,
        "timeout": True,
        "fence": True,
        "v1 end": False,
    }
    for m in ends.values():
        assert decode_value(encode_key("tx"), encode_value(m)) == m
    assert "end_bumped" not in json.loads(encode_value(ends["v1 end"]))  # an old record reads as False
