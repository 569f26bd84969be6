"""GroupCoordinator over real RocksDB, a real metadata store and a real ReplicaManager.

Wired the way broker/sluice_broker/main.py wires a broker, inside one asyncio loop; a
restart closes everything and builds it again on the same directories.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import Any

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.cluster import CONSUMER_OFFSETS_TOPIC, coordinator_partition
from sluice.broker.group import GroupCoordinator
from sluice.broker.group.api import (
    CommitOffset,
    OffsetCommitInput,
    OffsetFetchInput,
    PartitionAnswer,
    TxnOffsetCommitInput,
)
from sluice.broker.servicers.broker import heartbeat_input, heartbeat_response
from sluice.broker.txn.api import InitProducerIdInput, TxnHandle
from sluice.metadata import keys
from sluice.metadata.store import update
from tests.support.broker_core import InProcessBroker

OFFSETS_PARTITIONS = 3
GROUP = "g"


class Broker(InProcessBroker):
    """One broker's core; the group coordinator's clock is ``now[0]`` (ms), moved by the tests."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(
            tmp,
            {
                "offsets.topic.num.partitions": OFFSETS_PARTITIONS,
                "transaction.state.log.num.partitions": 1,
                "group.consumer.heartbeat.interval.ms": 200,
                "group.consumer.session.timeout.ms": 3000,
            },
            port=9092,
        )
        self.now = [0.0]

    @property
    def partition(self) -> int:
        return int(coordinator_partition(GROUP, OFFSETS_PARTITIONS))


async def start_broker(tmp: Path, *, wait: bool = True) -> Broker:
    broker = Broker(tmp)
    broker.build().groups.clock = lambda: broker.now[0]
    await broker.core.start()
    broker.cluster.ensure_internal_topics()
    broker.cluster.refresh()
    if wait:
        await wait_ready(broker.groups)
    return broker


async def wait_ready(groups: GroupCoordinator) -> None:
    for _ in range(500):
        if groups.is_ready():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the group coordinator did not load")


def run(tmp: Path, body: Callable[[Broker], Awaitable[None]]) -> None:
    async def main() -> None:
        broker = await start_broker(tmp)
        if "t" not in broker.cluster.topics:
            broker.cluster.create_topic("t", 2, 1, {})
        try:
            await body(broker)
        finally:
            await broker.close()

    asyncio.run(main())


def commit_req(offsets: dict[tuple[str, int], int], **fields: Any) -> OffsetCommitInput:
    fields = {"group_id": GROUP, "member_epoch": -1, **fields}
    return OffsetCommitInput(
        offsets=tuple(CommitOffset(t, p, offset, 0) for (t, p), offset in offsets.items()), **fields
    )


def txn_req(
    offsets: dict[tuple[str, int], int], pid: int, epoch: int = 0, tid: str = "tx", **fields: Any
) -> TxnOffsetCommitInput:
    return TxnOffsetCommitInput(commit_req(offsets, **{"member_epoch": 0, **fields}), tid, pid, epoch)


def codes(answers: list[PartitionAnswer]) -> dict[tuple[str, int], int]:
    return {(r.topic, r.partition): r.error_code for r in answers}


async def heartbeat(
    groups: GroupCoordinator, req: bpb.ConsumerGroupHeartbeatRequest
) -> bpb.ConsumerGroupHeartbeatResponse:
    """A gRPC heartbeat through the servicer's codec and the coordinator."""
    return heartbeat_response(await groups.member_heartbeat(req.group_id, heartbeat_input(req)))


async def fetch(broker: Broker, *tps: tuple[str, int], stable: bool = False) -> dict[tuple[str, int], Any]:
    resp = await broker.groups.offset_fetch(OffsetFetchInput(GROUP, tps or None, stable))
    assert resp.error_code == pb.NONE, resp.error_message
    return {
        (p.topic, p.partition): (p.offset if p.error_code == pb.NONE else pb.ErrorCode.Name(p.error_code))
        for p in resp.partitions
    }


def verifier(calls: list[tuple[Any, ...]], answer: int = pb.NONE) -> Callable[..., Coroutine[Any, Any, Any]]:
    async def verify(tid: str, pid: int, epoch: int, topic: str, partition: int) -> tuple[int, str]:
        calls.append((tid, pid, epoch, topic, partition))
        await asyncio.sleep(0)
        return answer, "" if answer == pb.NONE else "refused"

    return verify


# -- tests ----------------------------------------------------------------------------------------


def test_commit_fetch_and_validation(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        resp = await b.groups.offset_commit(commit_req({("t", 0): 5, ("t", 1): 7}))
        assert codes(resp) == {("t", 0): pb.NONE, ("t", 1): pb.NONE}
        assert await fetch(b, ("t", 0), ("t", 1), ("t", 9)) == {("t", 0): 5, ("t", 1): 7, ("t", 9): -1}
        assert await fetch(b) == {("t", 0): 5, ("t", 1): 7}  # empty list: everything committed
        resp = await b.groups.offset_commit(commit_req({("t", 0): 6, ("t", 5): 1, ("nope", 0): 1, ("t", 1): -3}))
        assert codes(resp) == {
            ("t", 0): pb.NONE,
            ("t", 5): pb.UNKNOWN_TOPIC_OR_PARTITION,
            ("nope", 0): pb.UNKNOWN_TOPIC_OR_PARTITION,
            ("t", 1): pb.INVALID_REQUEST,
        }
        assert await fetch(b) == {("t", 0): 6, ("t", 1): 7}
        resp = await b.groups.offset_commit(commit_req({("t", 0): 1}, group_id=""))
        assert codes(resp) == {("t", 0): pb.INVALID_GROUP_ID}
        unknown = await b.groups.offset_fetch(OffsetFetchInput("other", (("t", 0),)))
        assert unknown.error_code == pb.NONE and unknown.partitions[0].offset == -1
        assert (await b.groups.offset_fetch(OffsetFetchInput(""))).error_code == pb.INVALID_GROUP_ID

    run(tmp_path, body)


def test_offsets_survive_a_restart(tmp_path: Path) -> None:
    async def first(b: Broker) -> None:
        await b.groups.offset_commit(commit_req({("t", 0): 5, ("t", 1): 7}))
        await b.groups.offset_commit(commit_req({("t", 0): 11}))

    async def second(b: Broker) -> None:
        assert await fetch(b) == {("t", 0): 11, ("t", 1): 7}

    run(tmp_path, first)
    run(tmp_path, second)


def test_transactional_offsets_pending_until_commit_marker_and_reloaded(tmp_path: Path) -> None:
    calls: list[tuple[Any, ...]] = []

    async def first(b: Broker) -> None:
        b.replicas.verify_transactions_with(verifier(calls))
        await b.groups.offset_commit(commit_req({("t", 0): 1}))
        resp = await b.groups.txn_offset_commit(txn_req({("t", 0): 10, ("t", 1): 20}, pid=5))
        assert codes(resp) == {("t", 0): pb.NONE, ("t", 1): pb.NONE}
        assert calls == [("tx", 5, 0, CONSUMER_OFFSETS_TOPIC, b.partition)]
        assert await fetch(b, ("t", 0), ("t", 1)) == {("t", 0): 1, ("t", 1): -1}
        stable = await fetch(b, ("t", 0), ("t", 1), stable=True)
        assert stable == {("t", 0): "UNSTABLE_OFFSET_COMMIT", ("t", 1): "UNSTABLE_OFFSET_COMMIT"}
        assert await fetch(b, stable=True) == stable  # "all" lists pending partitions too

        part = b.replicas.partitions[(CONSUMER_OFFSETS_TOPIC, b.partition)]
        assert part.write_marker(5, 0, True, 0, leader_epoch=part.leader_epoch) is not None
        assert await fetch(b, stable=True) == {("t", 0): 10, ("t", 1): 20}

        # another producer: aborted offsets vanish; a third stays open across the restart
        await b.groups.txn_offset_commit(txn_req({("t", 0): 99}, pid=6))
        part.write_marker(6, 0, False, 0, leader_epoch=part.leader_epoch)
        assert await fetch(b, ("t", 0), stable=True) == {("t", 0): 10}
        await b.groups.txn_offset_commit(txn_req({("t", 1): 30}, pid=7))
        assert await fetch(b, ("t", 1), stable=True) == {("t", 1): "UNSTABLE_OFFSET_COMMIT"}

    async def second(b: Broker) -> None:
        assert await fetch(b, ("t", 0), ("t", 1)) == {("t", 0): 10, ("t", 1): 20}
        assert await fetch(b, ("t", 1), stable=True) == {("t", 1): "UNSTABLE_OFFSET_COMMIT"}
        part = b.replicas.partitions[(CONSUMER_OFFSETS_TOPIC, b.partition)]
        part.write_marker(
            7, 0, True, 0, leader_epoch=part.leader_epoch
        )  # the transaction coordinator finishes it after the restart
        assert await fetch(b, stable=True) == {("t", 0): 10, ("t", 1): 30}

    async def third(b: Broker) -> None:
        assert await fetch(b, stable=True) == {("t", 0): 10, ("t", 1): 30}

    run(tmp_path, first)
    run(tmp_path, second)
    run(tmp_path, third)


def test_txn_offset_commit_errors(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        resp = await b.groups.txn_offset_commit(txn_req({("t", 0): 1}, pid=5))
        # the broker's own transaction coordinator knows no such transactional id
        assert codes(resp) == {("t", 0): pb.INVALID_TXN_STATE}
        calls: list[tuple[Any, ...]] = []
        b.replicas.verify_transactions_with(verifier(calls, pb.INVALID_TXN_STATE))
        assert codes(await b.groups.txn_offset_commit(txn_req({("t", 0): 1}, pid=5))) == {
            ("t", 0): pb.INVALID_TXN_STATE
        }
        b.replicas.verify_transactions_with(verifier(calls))
        assert codes(await b.groups.txn_offset_commit(txn_req({("t", 0): 1}, pid=5, epoch=3))) == {("t", 0): pb.NONE}
        # an older epoch of the same producer is fenced by the partition
        assert codes(await b.groups.txn_offset_commit(txn_req({("t", 0): 2}, pid=5, epoch=2))) == {
            ("t", 0): pb.PRODUCER_FENCED
        }
        bad = txn_req({("t", 0): 1}, pid=5, tid="")
        assert codes(await b.groups.txn_offset_commit(bad)) == {("t", 0): pb.INVALID_REQUEST}

    run(tmp_path, body)


def test_membership_and_commit_fencing(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        g = b.groups
        calls: list[tuple[Any, ...]] = []
        b.replicas.verify_transactions_with(verifier(calls))
        join = await heartbeat(
            g, bpb.ConsumerGroupHeartbeatRequest(group_id=GROUP, member_epoch=0, subscribed_topic_names=["t"])
        )
        assert join.error_code == pb.NONE and join.member_id and join.member_epoch == 1
        assert join.heartbeat_interval_ms == 200
        assert sorted((tp.topic, tp.partition) for tp in join.assignment) == [("t", 0), ("t", 1)]
        a = join.member_id

        # members commit with their id and epoch; outsiders may not while the group has members
        ok = await g.offset_commit(commit_req({("t", 0): 3}, member_id=a, member_epoch=1))
        assert codes(ok) == {("t", 0): pb.NONE}
        assert codes(await g.offset_commit(commit_req({("t", 0): 4}))) == {("t", 0): pb.UNKNOWN_MEMBER_ID}
        assert codes(await g.offset_commit(commit_req({("t", 0): 4}, member_id="x", member_epoch=1))) == {
            ("t", 0): pb.UNKNOWN_MEMBER_ID
        }
        assert codes(await g.offset_commit(commit_req({("t", 0): 4}, member_id=a, member_epoch=7))) == {
            ("t", 0): pb.FENCED_MEMBER_EPOCH
        }

        # b joins; a keeps heartbeating and gives up one partition
        join_b = await heartbeat(
            g, bpb.ConsumerGroupHeartbeatRequest(group_id=GROUP, member_epoch=0, subscribed_topic_names=["t"])
        )
        assert join_b.member_epoch == 2 and list(join_b.assignment) == []
        hb = await heartbeat(
            g,
            bpb.ConsumerGroupHeartbeatRequest(
                group_id=GROUP,
                member_id=a,
                member_epoch=1,
                subscription_unchanged=True,
                owned_partitions=join.assignment,
            ),
        )
        assert hb.error_code == pb.NONE and hb.member_epoch == 2 and len(hb.assignment) == 1

        # a's session expires (fake clock); its transactional commit is then fenced (KIP-447)
        b.now[0] += 5000
        hb_b = await heartbeat(
            g,
            bpb.ConsumerGroupHeartbeatRequest(
                group_id=GROUP, member_id=join_b.member_id, member_epoch=2, subscription_unchanged=True
            ),
        )
        assert hb_b.error_code == pb.NONE
        g.expire_sessions()
        zombie = txn_req({("t", 0): 50}, pid=9, member_id=a, member_epoch=2)
        assert codes(await g.txn_offset_commit(zombie)) == {("t", 0): pb.UNKNOWN_MEMBER_ID}
        hb_b = await heartbeat(
            g,
            bpb.ConsumerGroupHeartbeatRequest(
                group_id=GROUP, member_id=join_b.member_id, member_epoch=hb_b.member_epoch, subscription_unchanged=True
            ),
        )
        assert len(hb_b.assignment) == 2
        member = txn_req({("t", 0): 50}, pid=9, member_id=join_b.member_id, member_epoch=hb_b.member_epoch)
        assert codes(await g.txn_offset_commit(member)) == {("t", 0): pb.NONE}
        stale = txn_req({("t", 0): 51}, pid=9, member_id=join_b.member_id, member_epoch=hb_b.member_epoch + 1)
        assert codes(await g.txn_offset_commit(stale)) == {("t", 0): pb.FENCED_MEMBER_EPOCH}

        # leave; then the group is empty and simple commits are allowed again
        left = await heartbeat(
            g, bpb.ConsumerGroupHeartbeatRequest(group_id=GROUP, member_id=join_b.member_id, member_epoch=-1)
        )
        assert left.error_code == pb.NONE and left.member_epoch == -1
        assert codes(await g.offset_commit(commit_req({("t", 1): 4}))) == {("t", 1): pb.NONE}
        bad = await heartbeat(
            g,
            bpb.ConsumerGroupHeartbeatRequest(
                group_id=GROUP, member_epoch=0, subscribed_topic_names=["t"], session_timeout_ms=5
            ),
        )
        assert bad.error_code == pb.INVALID_SESSION_TIMEOUT

    run(tmp_path, body)


def test_loading_not_coordinator_and_failback(tmp_path: Path) -> None:
    async def body(b: Broker) -> None:
        g = b.groups
        await g.offset_commit(commit_req({("t", 0): 8}))
        key = keys.topic(CONSUMER_OFFSETS_TOPIC)

        def move_leader(to: int) -> None:
            def change(value: dict[str, Any] | None) -> dict[str, Any]:
                assert value is not None
                p = value["partitions"][b.partition]
                p["leader"], p["leader_epoch"] = to, p["leader_epoch"] + 1
                return value

            update(b.store, key, change)
            b.cluster.refresh()

        move_leader(1)  # another broker leads the group's partition now
        assert (CONSUMER_OFFSETS_TOPIC, b.partition) not in b.replicas.leader_of
        assert g.is_ready()  # it leads nothing it has not loaded
        resp = await g.offset_fetch(OffsetFetchInput(GROUP))
        assert resp.error_code == pb.NOT_COORDINATOR
        hb = await heartbeat(g, bpb.ConsumerGroupHeartbeatRequest(group_id=GROUP, member_epoch=0))
        assert hb.error_code == pb.NOT_COORDINATOR

        move_leader(0)  # and back: loading first, then the offsets are there again
        resp = await g.offset_fetch(OffsetFetchInput(GROUP))
        assert resp.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
        assert not g.is_ready()
        await wait_ready(g)
        assert await fetch(b) == {("t", 0): 8}

    run(tmp_path, body)


def test_load_in_progress_before_the_replay_ran(tmp_path: Path) -> None:
    async def main() -> None:
        b = await start_broker(tmp_path, wait=False)
        try:
            resp = await b.groups.offset_fetch(OffsetFetchInput(GROUP))
            assert resp.error_code == pb.COORDINATOR_LOAD_IN_PROGRESS
            assert not b.groups.is_ready()
            await wait_ready(b.groups)
            resp = await b.groups.offset_fetch(OffsetFetchInput(GROUP))
            assert resp.error_code == pb.NONE
        finally:
            await b.close()

    asyncio.run(main())


def test_with_the_real_transaction_coordinator(tmp_path: Path) -> None:
    """AddOffsetsToTxn + TxnOffsetCommit + EndTxn: the markers of the real coordinator apply the offsets."""

    async def body(b: Broker) -> None:
        txn = b.txn  # the broker's own, as wired by build_core
        for _ in range(500):
            if txn.is_ready():
                break
            await asyncio.sleep(0.01)
        init = await txn.init_producer_id(InitProducerIdInput(transactional_id="tx", transaction_timeout_ms=60_000))
        assert init.error_code == pb.NONE, init.error_message
        pid, epoch = init.producer_id, init.producer_epoch
        handle = TxnHandle("tx", pid, epoch)

        async def end(commit: bool) -> None:
            assert (await txn.end_txn(handle, commit)).error_code == pb.NONE
            for _ in range(200):  # markers are sent in the background
                if (await fetch(b, ("t", 0), stable=True))[("t", 0)] != "UNSTABLE_OFFSET_COMMIT":
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("the marker never reached the offsets partition")

        for offset, commit in ((42, True), (99, False)):
            added = await txn.add_offsets_to_txn(handle, GROUP)
            assert added.error_code == pb.NONE, added.error_message
            resp = await b.groups.txn_offset_commit(txn_req({("t", 0): offset}, pid=pid, epoch=epoch))
            assert codes(resp) == {("t", 0): pb.NONE}
            assert await fetch(b, ("t", 0), stable=True) == {("t", 0): "UNSTABLE_OFFSET_COMMIT"}
            await end(commit)
            assert await fetch(b, ("t", 0), stable=True) == {("t", 0): 42}

        # outside a transaction (no AddOffsetsToTxn) the verifier refuses it
        resp = await b.groups.txn_offset_commit(txn_req({("t", 0): 7}, pid=pid, epoch=epoch))
        assert codes(resp) == {("t", 0): pb.INVALID_TXN_STATE}

    run(tmp_path, body)
