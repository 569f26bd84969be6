"""Produce: Kafka v2 record batches into the same partitions, producer state and transactions.

The simplest correct path, measured in docs/kafka-compatibility.md: each
partition's v2 batch is validated (:func:`~sluice.broker.kafka.record_batch.split_batches`:
magic 2 only, CRC-32C, lengths) and put as it came into Sluice's batch envelope
(:func:`~sluice.broker.kafka.record_batch.to_stored_batch`: the records section
as sent, the header's producer id, epoch, base sequence, transactional flag and
timestamps); then the replica manager's produce, the one the gRPC servicer
calls, appends it. So idempotence (sequence checks, duplicates
answered with the original offset), KIP-890's transaction verification,
min.insync.replicas, acks and NOT_LEADER_OR_FOLLOWER are exactly the gRPC
path's, and so are their error codes, which are Kafka's (sluice/errors.py).

Kafka's own rules on the request, which the gRPC API does not have to spell:

* v3+ carries exactly one batch per partition (Kafka: INVALID_RECORD
  otherwise); a partition with no records is INVALID_RECORD too.
* A CRC mismatch or a batch whose length runs past the data is
  CORRUPT_MESSAGE; magic < 2 is INVALID_RECORD (KIP-724); a codec Sluice
  cannot read is UNSUPPORTED_COMPRESSION_TYPE. These are per partition: the
  other partitions of the request are still appended.
* acks=0 gets no response at all (the listener writes nothing back); when a
  partition was refused, the connection is closed instead, as Kafka does, so
  the producer notices and refreshes its metadata.
* v13 names topics by id: an id no topic has is UNKNOWN_TOPIC_ID.
* v10+: NOT_LEADER_OR_FOLLOWER comes with KIP-951's leader hint
  (:mod:`~sluice.broker.kafka.handlers.leader_hint`).
* A transactional batch from a fenced (older) epoch is INVALID_PRODUCER_EPOCH, never
  PRODUCER_FENCED, as Kafka answers Produce since 2.7 (KIP-588): for the client it is
  abortable; the fatal fencing comes from the coordinator when it aborts (EndTxn). librdkafka
  and the Java client rely on that order. (The gRPC path keeps PRODUCER_FENCED.)

Authorization, before anything is converted (Kafka's order): a request carrying
transactional batches needs Write on its transactional id, else every partition
answers TRANSACTIONAL_ID_AUTHORIZATION_FAILED and nothing is appended; each
topic needs Write, else its partitions answer TOPIC_AUTHORIZATION_FAILED and the
rest of the request is served. The byte-rate quota is the listener's
(:mod:`~sluice.broker.kafka.quotas`).
"""

from __future__ import annotations

from sluice import errors
from sluice.acls import AclOperation, ResourceType
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.data_path import ProduceInput, ProducePartition
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.framing import FrameError
from sluice.broker.kafka.handlers.leader_hint import LeaderHint, leader_hint
from sluice.broker.kafka.handlers.metadata import UNKNOWN_TOPIC_ID, topic_uuid
from sluice.broker.kafka.record_batch import split_batches, to_stored_batch
from sluice.broker.kafka_wire import codec
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.produce_request import ProduceRequest
from sluice.broker.kafka_wire.messages.produce_response import (
    LeaderIdAndEpoch,
    NodeEndpoint,
    PartitionProduceResponse,
    ProduceResponse,
    TopicProduceResponse,
)
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.records import RecordBatch

TOPIC_IDS_FROM = 13  # Produce v13 names topics by id (KIP-516)
LEADER_HINTS_FROM = 10  # KIP-951
_MAGIC, _ATTRIBUTES_LOW = 16, 22  # offsets in a v2 batch: magic, the low byte of attributes
_TRANSACTIONAL = 0x10


def has_transactional_batch(records: bytes | None) -> bool:
    """Whether a partition's records start with a transactional v2 batch (read before any validation)."""
    if records is None or len(records) <= _ATTRIBUTES_LOW or records[_MAGIC] != 2:
        return False
    return bool(records[_ATTRIBUTES_LOW] & _TRANSACTIONAL)


def _txn_refused(ctx: KafkaContext, request: ProduceRequest) -> str | None:
    """Why a request with transactional batches may not be appended (Kafka checks this first), or None."""
    sent = (codec.received(p.records) for t in request.topic_data for p in t.partition_data)
    if not any(has_transactional_batch(records) for records in sent):
        return None
    txn_id = request.transactional_id
    if txn_id is None:
        return "transactional batches need a transactional id"
    if not authorization.allowed(ctx, AclOperation.WRITE, ResourceType.TRANSACTIONAL_ID, txn_id):
        return f"not authorized to Write transactional id {txn_id!r} (no ACL allows it)"
    return None


def convert(records: bytes | None) -> RecordBatch:
    """The one v2 batch of a partition's ``records``, validated, in Sluice's envelope as sent (a SluiceError
    if not). Whether it is stored so or converted into Sluice's encoding is the core's decision
    (``ReplicaManager._in_stored_format``: ``kafka.records.stored.as.sent`` and the replicas' versions)."""
    if not records:
        raise errors.InvalidRecordError("a produced partition has no record batch")
    batches = split_batches(records)
    if len(batches) != 1:
        raise errors.InvalidRecordError(f"Produce v3+ carries one record batch per partition, not {len(batches)}")
    header, batch = batches[0]
    if header.record_count == 0:
        raise errors.InvalidRecordError("a record batch without records")
    return to_stored_batch(header, batch)


class ProduceHandler:
    api_key = 0
    versions = Versions(3, 13)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message | None:
        assert isinstance(request, ProduceRequest)
        version = header.request_api_version
        by_id = {topic_uuid(t): t.name for t in ctx.cluster.topics.values()} if version >= TOPIC_IDS_FROM else {}
        names = [by_id.get(t.topic_id, "") if version >= TOPIC_IDS_FROM else t.name for t in request.topic_data]
        txn_refused = _txn_refused(ctx, request)
        denied = authorization.denied_topics(ctx, AclOperation.WRITE, (n for n in names if n))
        # Per partition of the request, in order: the refusal found here, or None (the core answers).
        refusals: list[list[tuple[int, str] | None]] = []
        batches: list[ProducePartition] = []
        for topic, name in zip(request.topic_data, names, strict=True):
            mine: list[tuple[int, str] | None] = []
            for p in topic.partition_data:
                if txn_refused is not None:
                    mine.append((pb.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, txn_refused))
                    continue
                if version >= TOPIC_IDS_FROM and not name:
                    mine.append((UNKNOWN_TOPIC_ID, f"no topic has id {topic.topic_id}"))
                    continue
                if name in denied:
                    mine.append((pb.TOPIC_AUTHORIZATION_FAILED, authorization.topic_refusal(AclOperation.WRITE, name)))
                    continue
                try:
                    batch = convert(codec.received(p.records))
                except errors.SluiceError as exc:
                    mine.append((int(exc.code), exc.message))
                    continue
                batches.append(ProducePartition(name, p.index, batch))
                mine.append(None)
            refusals.append(mine)
        core = ProduceInput(
            batches, acks=request.acks, timeout_ms=request.timeout_ms, transactional_id=request.transactional_id or ""
        )
        answered = iter(await ctx.replicas.produce(core) if batches else ())
        resp = ProduceResponse()
        hints: dict[int, LeaderHint] = {}
        for t, topic in enumerate(request.topic_data):
            out = TopicProduceResponse(name=topic.name, topic_id=topic.topic_id)
            for p, refusal in zip(topic.partition_data, refusals[t], strict=True):
                part = PartitionProduceResponse(index=p.index, base_offset=-1)
                if refusal is not None:
                    part.error_code, part.error_message = refusal
                else:
                    a = next(answered)
                    part.error_code = int(a.error_code)
                    if part.error_code == pb.PRODUCER_FENCED:  # KIP-588: Produce says INVALID_PRODUCER_EPOCH
                        part.error_code = int(pb.INVALID_PRODUCER_EPOCH)
                    part.error_message = a.error_message or None
                    part.base_offset = a.base_offset
                    part.log_append_time_ms = a.log_append_time
                    part.log_start_offset = a.log_start_offset
                    hint = leader_hint(ctx, names[t], p.index, part.error_code)
                    if hint is not None and version >= LEADER_HINTS_FROM:
                        part.current_leader = LeaderIdAndEpoch(leader_id=hint.leader_id, leader_epoch=hint.leader_epoch)
                        hints[hint.leader_id] = hint
                out.partition_responses.append(part)
            resp.responses.append(out)
        resp.node_endpoints = [
            NodeEndpoint(node_id=h.leader_id, host=h.host, port=h.port, rack=h.rack) for h in hints.values()
        ]
        if request.acks == 0:
            failed = [p for t in resp.responses for p in t.partition_responses if p.error_code]
            if failed:
                # The only way to tell an acks=0 producer: Kafka closes the connection, so it refreshes.
                raise FrameError(f"acks=0 produce refused for {len(failed)} partition(s), error {failed[0].error_code}")
            return None  # Kafka sends nothing back to an acks=0 producer
        return resp
