"""KIP-951 leader hints: where a partition's leader is, sent with NOT_LEADER_OR_FOLLOWER.

A client that produced to or fetched from a broker that is no longer the
leader would otherwise ask for Metadata before retrying; from Produce v10 and
Fetch v12 Kafka answers such a refusal with the partition's current leader
and epoch (``current_leader``) and the leader's address (``node_endpoints``),
so the client goes straight there. The hint is what this broker's cluster view
holds, the same view Metadata answers from; a leader without a Kafka listener
or a partition without a leader gives no hint (the client then refreshes, as
before).
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka.context import KafkaContext, kafka_endpoint
from sluice.metadata.documents import NO_LEADER

HINTED_ERRORS = frozenset({pb.NOT_LEADER_OR_FOLLOWER, pb.FENCED_LEADER_EPOCH})


@dataclass(frozen=True, slots=True)
class LeaderHint:
    leader_id: int
    leader_epoch: int
    host: str
    port: int
    rack: str | None


def leader_hint(ctx: KafkaContext, topic: str, partition: int, error_code: int) -> LeaderHint | None:
    """The hint for a partition refused with ``error_code``, or None (no hint for that error or partition)."""
    if error_code not in HINTED_ERRORS:
        return None
    info = ctx.cluster.topics.get(topic)
    if info is None or not 0 <= partition < len(info.partitions):
        return None
    part = info.partitions[partition]
    if part.leader == NO_LEADER:
        return None
    endpoint = kafka_endpoint(ctx, part.leader)
    if endpoint is None:
        return None
    broker = ctx.cluster.brokers.get(part.leader)
    rack = broker.rack if broker is not None and broker.rack else None
    return LeaderHint(part.leader, part.leader_epoch, endpoint[0], endpoint[1], rack)
