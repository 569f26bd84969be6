"""MarkerSender leaves a deposed leader as soon as the cluster view names a new one.

The network is replaced by a fake ``_send_to``: the old leader never answers
(a paused or cut-off broker), the new one answers at once.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, cast

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.topic_partition import TopicPartition
from sluice.broker.txn.markers import MarkerJob, MarkerResult, MarkerSender, PartitionOutcome


@dataclass
class _Partition:
    leader: int


@dataclass
class _Topic:
    partitions: list[_Partition]


@dataclass
class _Cluster:
    topics: dict[str, _Topic] = field(default_factory=dict)


class _Sender(MarkerSender):
    def __init__(self, cluster: _Cluster) -> None:
        super().__init__(cast(Any, None), cast(Any, cluster), cast(Any, None), cast(Any, None), rpc_timeout_s=30.0)
        self.calls: list[int] = []
        self.cancelled: list[int] = []

    async def _send_to(
        self, broker_id: int, job: MarkerJob, partitions: list[TopicPartition]
    ) -> list[PartitionOutcome]:
        self.calls.append(broker_id)
        if broker_id == 1:
            try:
                await asyncio.sleep(30)  # the deposed leader never answers
            except asyncio.CancelledError:
                self.cancelled.append(broker_id)
                raise
        return [(tp, pb.NONE, "") for tp in partitions]


def _job() -> MarkerJob:
    return MarkerJob("tx", 1000, 0, True, 3, frozenset({("t", 0)}))


def test_an_in_flight_marker_follows_the_new_leader_without_waiting_for_the_old_one() -> None:
    cluster = _Cluster({"t": _Topic([_Partition(leader=1)])})
    sender = _Sender(cluster)

    async def scenario() -> tuple[MarkerResult, float]:
        async def move_leader() -> None:
            await asyncio.sleep(0.3)
            cluster.topics["t"].partitions[0].leader = 2

        start = time.monotonic()
        mover = asyncio.ensure_future(move_leader())
        result = await asyncio.wait_for(sender.send(_job(), lambda: True), timeout=10)
        await mover
        return result, time.monotonic() - start

    result, elapsed = asyncio.run(scenario())
    assert result is MarkerResult.DONE
    assert sender.calls == [1, 2]
    assert sender.cancelled == [1]  # the request to the deposed leader was abandoned
    assert elapsed < 1.5, f"took {elapsed:.2f}s: the sender waited for the deposed leader"


def test_a_leader_that_did_not_move_is_waited_for() -> None:
    cluster = _Cluster({"t": _Topic([_Partition(leader=2)])})
    sender = _Sender(cluster)
    assert asyncio.run(sender.send(_job(), lambda: True)) is MarkerResult.DONE
    assert sender.calls == [2]
    assert sender.cancelled == []


class _DeadLeaderSender(_Sender):
    """Broker 1 is dead: every attempt fails at once, as a refused connection does."""

    async def _send_to(
        self, broker_id: int, job: MarkerJob, partitions: list[TopicPartition]
    ) -> list[PartitionOutcome]:
        self.calls.append(broker_id)
        if broker_id == 1:
            return [(tp, pb.REQUEST_TIMED_OUT, "broker 1: UNAVAILABLE") for tp in partitions]
        return [(tp, pb.NONE, "") for tp in partitions]


def test_a_grown_backoff_is_cut_short_by_a_new_leader() -> None:
    cluster = _Cluster({"t": _Topic([_Partition(leader=1)])})
    sender = _DeadLeaderSender(cluster)
    sender.initial_backoff_s = 2.0  # as grown after a few seconds of a dead leader

    async def scenario() -> float:
        async def elect() -> None:
            await asyncio.sleep(0.3)
            cluster.topics["t"].partitions[0].leader = 2

        mover = asyncio.ensure_future(elect())
        start = time.monotonic()
        assert await asyncio.wait_for(sender.send(_job(), lambda: True), timeout=10) is MarkerResult.DONE
        await mover
        return time.monotonic() - start

    elapsed = asyncio.run(scenario())
    assert sender.calls[0] == 1 and sender.calls[-1] == 2
    assert elapsed < 1.0, f"took {elapsed:.2f}s: the backoff was not cut short by the election"
