"""Writing COMMIT/ABORT markers to every partition of a transaction.

:meth:`MarkerSender.send` delivers one transaction's markers and returns only
when it knows how that ended:

* ``DONE``: every partition has its marker (or no longer exists);
* ``FENCED``: a partition answered TRANSACTION_COORDINATOR_FENCED, i.e. a
  newer coordinator for this id exists and owns the transaction now;
* ``ABANDONED``: the caller's ``still_valid()`` turned false (this broker lost
  leadership of the ``__transaction_state`` partition); the next coordinator
  reloads the Prepare* state and sends the markers again.

Each round groups the remaining partitions by their current leader (read from
the cluster view every round, so a moved partition is followed), writes the
local ones through :meth:`ReplicaManager.write_markers` and sends one
WriteTxnMarkers request to every other leader, all concurrently. Partitions
that failed for any other reason (no leader, broker down, NOT_LEADER_OR_FOLLOWER,
a storage error ...) are retried with exponential backoff, without limit: a
transaction cannot complete until every partition has its marker, and
duplicate markers are harmless (the partition ignores a marker for a producer
with no open transaction).

Markers follow leadership: while a request is in flight, the cluster view
(refreshed every 100 ms) is checked every :data:`LEADER_CHECK_INTERVAL_S`, and
once it names another leader for one of the request's partitions the request is
abandoned and the next round goes to the new leader at once, without a backoff;
a backoff between failed rounds is cut short the same way.
A deposed leader that is paused or cut off answers nothing until the RPC
timeout, and one that still runs waits up to its marker replication timeout
for followers that now fetch elsewhere; waiting for either kept a transaction
whose partitions moved open for seconds after the new leader could take its
markers (docs/architecture.md, "Offsets and visibility").

A partition whose topic is gone from the cluster view counts as done (a
deleted topic has nothing left to end). A partition that already saw a newer
epoch of the producer (INVALID_PRODUCER_EPOCH) also counts as done: a later
InitProducerId already ended whatever this producer had open there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

import grpc

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.api.v1 import interbroker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.channels import BrokerChannels
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.topic_partition import TopicPartition

log = logging.getLogger(__name__)

# Per-partition answers that end the partition's part of the job.
_DONE_CODES = frozenset({pb.NONE, pb.INVALID_PRODUCER_EPOCH})

PartitionOutcome = tuple[TopicPartition, "pb.ErrorCode", str]

# How often an in-flight marker request looks at the cluster view for a new leader (the view itself is
# refreshed every 100 ms).
LEADER_CHECK_INTERVAL_S = 0.05


class MarkerResult(Enum):
    DONE = "done"
    FENCED = "fenced"
    ABANDONED = "abandoned"


@dataclass(frozen=True, slots=True)
class MarkerJob:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool
    coordinator_epoch: int
    partitions: frozenset[TopicPartition]
    # 2: the end bumped the epoch, so the marker must be newer than the data it ends (KIP-1228)
    transaction_version: int = 1

    def request(self, partitions: Iterable[TopicPartition]) -> ipb.WriteTxnMarkersRequest:
        marker = ipb.TxnMarker(
            producer_id=self.producer_id,
            producer_epoch=self.producer_epoch,
            committed=self.committed,
            coordinator_epoch=self.coordinator_epoch,
            transactional_id=self.transactional_id,
            transaction_version=self.transaction_version,
        )
        for topic, partition in sorted(partitions):
            marker.partitions.add(topic=topic, partition=partition)
        return ipb.WriteTxnMarkersRequest(markers=[marker])


class MarkerSender:
    def __init__(
        self,
        replicas: ReplicaManager,
        cluster: ClusterView,
        config: BrokerConfig,
        channels: BrokerChannels,
        *,
        initial_backoff_s: float = 0.05,
        max_backoff_s: float = 2.0,
        rpc_timeout_s: float = 10.0,
    ) -> None:
        self.replicas = replicas
        self.cluster = cluster
        self.config = config
        self.channels = channels
        self.initial_backoff_s = initial_backoff_s
        self.max_backoff_s = max_backoff_s
        self.rpc_timeout_s = rpc_timeout_s

    def _exists(self, tp: TopicPartition) -> bool:
        info = self.cluster.topics.get(tp[0])
        return info is not None and 0 <= tp[1] < len(info.partitions)

    def _leader(self, tp: TopicPartition) -> int:
        return self.cluster.topics[tp[0]].partitions[tp[1]].leader

    async def send(self, job: MarkerJob, still_valid: Callable[[], bool]) -> MarkerResult:
        remaining = set(job.partitions)
        backoff = self.initial_backoff_s
        attempt = 0
        while True:
            if not still_valid():
                return MarkerResult.ABANDONED
            remaining = {tp for tp in remaining if self._exists(tp)}
            if not remaining:
                return MarkerResult.DONE
            by_leader: dict[int, list[TopicPartition]] = {}
            for tp in remaining:
                by_leader.setdefault(self._leader(tp), []).append(tp)
            sent_to = {tp: b for b, tps in by_leader.items() for tp in tps}
            rounds = await asyncio.gather(*(self._send_following(b, job, tps) for b, tps in by_leader.items()))
            if not still_valid():
                return MarkerResult.ABANDONED
            failures: list[PartitionOutcome] = []
            for outcomes in rounds:
                for tp, code, message in outcomes:
                    if code in _DONE_CODES:
                        remaining.discard(tp)
                    elif code == pb.TRANSACTION_COORDINATOR_FENCED:
                        log.warning("%s markers of %r: %s", _kind(job), job.transactional_id, message)
                        return MarkerResult.FENCED
                    else:
                        failures.append((tp, code, message))
            if not remaining:
                return MarkerResult.DONE
            if self._any_moved(remaining, sent_to):
                # a partition moved to a new leader since this round began: go there now
                backoff = self.initial_backoff_s
                continue
            attempt += 1
            if attempt == 1 or attempt % 20 == 0:
                (topic, partition), code, message = failures[0]
                log.warning(
                    "%s markers of %r: %d partition(s) not written yet (attempt %d), e.g. %s-%d: %s %s",
                    _kind(job),
                    job.transactional_id,
                    len(remaining),
                    attempt,
                    topic,
                    partition,
                    pb.ErrorCode.Name(code),
                    message,
                )
            if await self._sleep_unless_moved(backoff, remaining, sent_to):
                backoff = self.initial_backoff_s  # woken by a new leader: go there now
            else:
                backoff = min(backoff * 2, self.max_backoff_s)

    def _any_moved(self, partitions: set[TopicPartition], sent_to: dict[TopicPartition, int]) -> bool:
        """Whether the cluster view names a new leader (not the one last tried, not none) for any of ``partitions``."""
        return any(self._exists(tp) and self._leader(tp) not in (sent_to[tp], -1) for tp in partitions)

    async def _sleep_unless_moved(
        self, seconds: float, partitions: set[TopicPartition], sent_to: dict[TopicPartition, int]
    ) -> bool:
        """The backoff, cut short (True) when one of ``partitions`` gets a new leader meanwhile.

        A dead leader fails every attempt at once, so by the time the controller
        elects another one the backoff may have grown to its 2 s maximum.
        """
        deadline = asyncio.get_running_loop().time() + seconds
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(min(left, LEADER_CHECK_INTERVAL_S))
            if self._any_moved(partitions, sent_to):
                return True
        return False

    def _moved(self, broker_id: int, partitions: list[TopicPartition]) -> TopicPartition | None:
        """A partition of ``partitions`` the cluster view no longer places on ``broker_id`` (gone, or led elsewhere)."""
        for tp in partitions:
            if not self._exists(tp) or self._leader(tp) != broker_id:
                return tp
        return None

    async def _send_following(
        self, broker_id: int, job: MarkerJob, partitions: list[TopicPartition]
    ) -> list[PartitionOutcome]:
        """:meth:`_send_to`, abandoned as soon as the cluster view moves one of ``partitions`` off ``broker_id``.

        The marker may still be written by the deposed leader: harmless, a
        partition writes one marker per transaction and the new leader either
        copied it or writes its own.
        """
        if broker_id < 0 or self._moved(broker_id, partitions) is not None:
            return await self._send_to(broker_id, job, partitions)
        task = asyncio.ensure_future(self._send_to(broker_id, job, partitions))
        try:
            while True:
                done, _pending = await asyncio.wait({task}, timeout=LEADER_CHECK_INTERVAL_S)
                if done:
                    return task.result()
                moved = self._moved(broker_id, partitions)
                if moved is not None:
                    message = f"{moved[0]}-{moved[1]} moved off broker {broker_id} while its marker was in flight"
                    return [(tp, pb.NOT_LEADER_OR_FOLLOWER, message) for tp in partitions]
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _send_to(
        self, broker_id: int, job: MarkerJob, partitions: list[TopicPartition]
    ) -> list[PartitionOutcome]:
        def all_failed(code: pb.ErrorCode, message: str) -> list[PartitionOutcome]:
            return [(tp, code, message) for tp in partitions]

        if broker_id < 0:
            return all_failed(pb.LEADER_NOT_AVAILABLE, "the partition has no leader")
        req = job.request(partitions)
        try:
            if broker_id == self.config.broker_id:
                resp = await self.replicas.write_markers(req)
            else:
                channel = self.channels.get(broker_id)
                if channel is None:
                    return all_failed(pb.LEADER_NOT_AVAILABLE, f"broker {broker_id} is not registered")
                stub = interbroker_pb2_grpc.InterBrokerStub(channel)  # type: ignore[no-untyped-call]
                resp = await stub.WriteTxnMarkers(req, timeout=self.rpc_timeout_s)
        except grpc.aio.AioRpcError as exc:
            return all_failed(pb.REQUEST_TIMED_OUT, f"broker {broker_id}: {exc.code().name} {exc.details()}")
        except Exception as exc:  # a local storage failure: retried like any other
            log.exception("writing markers on broker %d failed", broker_id)
            return all_failed(pb.UNKNOWN_SERVER_ERROR, f"{type(exc).__name__}: {exc}")
        answered: dict[TopicPartition, tuple[pb.ErrorCode, str]] = {}
        for mresult in resp.markers:
            for presult in mresult.partitions:
                answered[(presult.topic, presult.partition)] = (presult.error_code, presult.error_message)
        missing = (pb.UNKNOWN_SERVER_ERROR, f"broker {broker_id} did not answer for the partition")
        return [(tp, *answered.get(tp, missing)) for tp in partitions]


def _kind(job: MarkerJob) -> str:
    return "COMMIT" if job.committed else "ABORT"
