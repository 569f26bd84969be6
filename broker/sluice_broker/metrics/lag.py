"""End offsets for consumer lag: this broker's own, or the leader's, learned just before a scrape.

The coordinator of a group knows the group's committed offsets, but not always
the end of the partitions it committed for: those may be led by other
brokers. Before each scrape, :meth:`EndOffsets.refresh` asks every other
leader concerned, with one ``ListOffsets(latest, read_uncommitted)`` per
leader, all at once and with a short deadline. The answer is the leader's high
watermark, the end offset kafka-exporter and ``kafka-consumer-groups.sh`` use.
Partitions led here are read directly (:meth:`EndOffsets.get`), always fresh.

Bounded: a scrape waits at most :data:`REFRESH_TIMEOUT_S` for the leaders. A
partition whose leader did not answer (down, moving, no leader) has no end
offset this time, so its lag is left out rather than guessed from a stale value.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

import grpc

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import broker_pb2_grpc
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.data_path import LATEST
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.topic_partition import TopicPartition

log = logging.getLogger(__name__)

REFRESH_TIMEOUT_S = 2.0


class EndOffsets:
    def __init__(self, replicas: ReplicaManager, wanted: Callable[[], Iterable[TopicPartition]]) -> None:
        self.replicas = replicas
        self.wanted = wanted  # the partitions whose end offsets the next scrape needs
        self._remote: dict[TopicPartition, int] = {}

    def get(self, tp: TopicPartition) -> int | None:
        """The end offset (high watermark) of ``tp``: local if led here, else as fetched by the last refresh."""
        part = self.replicas.partitions.get(tp)
        if part is not None and tp in self.replicas.leader_of:
            return part.high_watermark
        return self._remote.get(tp)

    def _leader(self, tp: TopicPartition) -> int:
        info = self.replicas.cluster.topics.get(tp[0])
        if info is None or not 0 <= tp[1] < len(info.partitions):
            return -1
        return info.partitions[tp[1]].leader

    async def refresh(self) -> None:
        """Ask the other leaders for the end offsets the next scrape needs (bounded; failures leave gaps)."""
        by_leader: dict[int, set[TopicPartition]] = {}
        for tp in self.wanted():
            if tp in self.replicas.leader_of:
                continue
            leader = self._leader(tp)
            if leader >= 0 and leader != self.replicas.config.broker_id:
                by_leader.setdefault(leader, set()).add(tp)
        results = await asyncio.gather(*(self._ask(b, tps) for b, tps in by_leader.items()))
        remote: dict[TopicPartition, int] = {}
        for answered in results:
            remote.update(answered)
        self._remote = remote

    async def _ask(self, broker_id: int, tps: set[TopicPartition]) -> dict[TopicPartition, int]:
        channel = self.replicas.channels.get(broker_id)
        if channel is None:
            return {}
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(tps):
            topics.setdefault(topic, []).append(partition)
        req = bpb.ListOffsetsRequest(isolation_level=pb.READ_UNCOMMITTED)
        for topic, partitions in topics.items():
            req.topics.add(
                name=topic, partitions=[bpb.ListOffsetsPartition(partition=p, timestamp=LATEST) for p in partitions]
            )
        try:
            stub = broker_pb2_grpc.BrokerStub(channel)  # type: ignore[no-untyped-call]
            resp = await stub.ListOffsets(req, timeout=REFRESH_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.debug("metrics: end offsets from broker %d: %s", broker_id, exc.code().name)
            return {}
        out: dict[TopicPartition, int] = {}
        for t in resp.topics:
            for p in t.partitions:
                if p.error_code == pb.NONE and p.offset >= 0:
                    out[(t.name, p.partition)] = p.offset
        return out
