"""Fetch: the replica manager's fetch, its batches handed to Kafka clients as v2 batches.

The core's fetch does the work, as for the gRPC Fetch (long poll on min_bytes/max_wait_ms, HW or LSO
by isolation level, the aborted-transaction list, FENCED_LEADER_EPOCH /
UNKNOWN_LEADER_EPOCH on a stale ``current_leader_epoch``,
NOT_LEADER_OR_FOLLOWER off the leader, OFFSET_OUT_OF_RANGE); this handler
maps Kafka's request onto it and converts each stored batch into Kafka's v2
format (:func:`~sluice.broker.kafka.record_batch.v2_batch_parts`) with its own
base offset, so a Kafka consumer sees the offsets, keys, values, headers and
timestamps a gRPC consumer sees. A batch a Kafka client produced goes back as it
was stored, its records never copied on the way to the socket (the parts go into
the response as :class:`~sluice.broker.kafka_wire.codec.Chunks`).

read_committed differs from the gRPC fetch's (which drops aborted batches and
markers on the broker): as Kafka does, the answer stops at the LSO but keeps
aborted batches and markers and lists the aborted transactions, and the
client drops them. A Kafka client needs the markers: its position moves past
the last batch it was sent, so a marker left out would leave the consumer one
offset short of the LSO for ever (lag 1 after every transaction).

From v12 a NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH partition carries
KIP-951's leader hint (``current_leader``; ``node_endpoints`` from v16).

No fetch sessions (KIP-227): every answer carries session id 0, which tells
the client no session was created, so it sends full requests; a request
naming a session id is answered FETCH_SESSION_ID_NOT_FOUND, as Kafka answers
a session it no longer has. ``forgotten_topics_data`` only matters inside a
session and is ignored. Followers of a Sluice cluster replicate over gRPC, so a
replica id in a Kafka fetch is not acted on: the fetch is served as a consumer's,
and authorized as one: each topic needs Read, else its partitions answer
TOPIC_AUTHORIZATION_FAILED and are not read (a topic id no topic has is
UNKNOWN_TOPIC_ID first, as in Kafka). The byte-rate quota is the listener's
(:mod:`~sluice.broker.kafka.quotas`).
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.data_path import FetchedPartition, FetchInput, FetchPartition
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.leader_hint import LeaderHint, leader_hint
from sluice.broker.kafka.handlers.list_offsets import KAFKA_READ_COMMITTED
from sluice.broker.kafka.handlers.metadata import UNKNOWN_TOPIC_ID, topic_uuid
from sluice.broker.kafka.record_batch import v2_batch_parts
from sluice.broker.kafka_wire.codec import Chunks, Message, Versions
from sluice.broker.kafka_wire.messages.fetch_request import FetchRequest
from sluice.broker.kafka_wire.messages.fetch_response import (
    AbortedTransaction,
    FetchableTopicResponse,
    FetchResponse,
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionData,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

TOPIC_IDS_FROM = 13  # Fetch v13 names topics by id (KIP-516)
FETCH_SESSION_ID_NOT_FOUND = 70  # Kafka's; sessions do not exist over gRPC
LEADER_HINTS_FROM, NODE_ENDPOINTS_FROM = 12, 16  # KIP-951: current_leader from v12, node_endpoints from v16


def aborted(answer: FetchedPartition) -> list[AbortedTransaction]:
    return [AbortedTransaction(producer_id=pid, first_offset=first) for pid, first in answer.aborted]


class FetchHandler:
    api_key = 1
    versions = Versions(4, 18)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, FetchRequest)
        version = header.request_api_version
        if request.session_id != 0:
            return FetchResponse(error_code=FETCH_SESSION_ID_NOT_FOUND, session_id=0)
        read_committed = request.isolation_level == KAFKA_READ_COMMITTED
        by_id = {topic_uuid(t): t.name for t in ctx.cluster.topics.values()} if version >= TOPIC_IDS_FROM else {}
        names = [by_id.get(t.topic_id, "") if version >= TOPIC_IDS_FROM else t.topic for t in request.topics]
        denied = authorization.denied_topics(ctx, AclOperation.READ, (n for n in names if n))
        # topic indexes of the request not read: their id names no topic, or the caller may not Read them
        refused: dict[int, int] = {}
        wanted: list[FetchPartition] = []
        for t, (topic, name) in enumerate(zip(request.topics, names, strict=True)):
            if version >= TOPIC_IDS_FROM and not name:
                refused[t] = UNKNOWN_TOPIC_ID
                continue
            if name in denied:
                refused[t] = pb.TOPIC_AUTHORIZATION_FAILED
                continue
            wanted.extend(
                FetchPartition(name, p.partition, p.fetch_offset, max(p.partition_max_bytes, 1), p.current_leader_epoch)
                for p in topic.partitions
            )
        core = FetchInput(
            wanted,
            max_wait_ms=max(request.max_wait_ms, 0),
            min_bytes=max(request.min_bytes, 0),
            max_bytes=max(request.max_bytes, 1),
            read_committed=read_committed,
            keep_aborted=True,  # as Kafka answers: the client drops aborted records itself
        )
        answered = iter(await ctx.replicas.fetch(core) if wanted else ())
        resp = FetchResponse(session_id=0)
        hints: dict[int, LeaderHint] = {}
        for t, topic in enumerate(request.topics):
            out = FetchableTopicResponse(topic=topic.topic, topic_id=topic.topic_id)
            if t in refused:
                for p in topic.partitions:
                    out.partitions.append(
                        PartitionData(partition_index=p.partition, error_code=refused[t], high_watermark=-1)
                    )
                resp.responses.append(out)
                continue
            for p in topic.partitions:
                a = next(answered)
                part = PartitionData(
                    partition_index=p.partition,
                    error_code=int(a.error_code),
                    high_watermark=a.high_watermark,
                    last_stable_offset=a.last_stable_offset,
                    log_start_offset=a.log_start_offset,
                    aborted_transactions=aborted(a) if read_committed else None,
                    records=Chunks(
                        [piece for b, raw in zip(a.batches, a.raw, strict=True) for piece in v2_batch_parts(b, raw)]
                    ),
                )
                hint = leader_hint(ctx, a.topic, p.partition, part.error_code)
                if hint is not None and version >= LEADER_HINTS_FROM:
                    part.current_leader = LeaderIdAndEpoch(leader_id=hint.leader_id, leader_epoch=hint.leader_epoch)
                    hints[hint.leader_id] = hint
                out.partitions.append(part)
            resp.responses.append(out)
        if version >= NODE_ENDPOINTS_FROM:
            resp.node_endpoints = [
                NodeEndpoint(node_id=h.leader_id, host=h.host, port=h.port, rack=h.rack) for h in hints.values()
            ]
        return resp
