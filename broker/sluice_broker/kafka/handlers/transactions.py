"""AddPartitionsToTxn, AddOffsetsToTxn, EndTxn: Kafka's transaction calls over the transaction coordinator.

The coordinator's own calls (the gRPC servicer makes the same, with the plain values of
:mod:`sluice.broker.txn.api`), so a transaction begun by a Kafka client is the same object as one
begun over gRPC: same state log, markers, LSO
and timeouts. Versions served are the client ones without KIP-890 part 2
(transaction.version 2, issue 13), which this listener does not advertise:

* AddPartitionsToTxn 0-3 (4+ are broker-to-broker, batched and verify-only);
* AddOffsetsToTxn 0-4 and EndTxn 0-4 (EndTxn 5 bumps the epoch per transaction: TV2).

librdkafka sends AddPartitionsToTxn and AddOffsetsToTxn at v0 only, EndTxn at 0-1.
PRODUCER_FENCED exists from v2 of these APIs (KIP-588); older versions get
INVALID_PRODUCER_EPOCH for it, as Kafka answers them.

Authorization is the gRPC servicer's (:mod:`sluice.broker.security.coordinator_checks`),
answered in Kafka's shape: Write on the transactional id for all three
(TRANSACTIONAL_ID_AUTHORIZATION_FAILED, on every partition for
AddPartitionsToTxn), Write on each added topic (TOPIC_AUTHORIZATION_FAILED, the
other partitions OPERATION_NOT_ATTEMPTED: none is added) and Read on the group
of AddOffsetsToTxn (GROUP_AUTHORIZATION_FAILED). A refused call leaves the
transaction as it was.
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.add_offsets_to_txn_request import AddOffsetsToTxnRequest
from sluice.broker.kafka_wire.messages.add_offsets_to_txn_response import AddOffsetsToTxnResponse
from sluice.broker.kafka_wire.messages.add_partitions_to_txn_request import AddPartitionsToTxnRequest
from sluice.broker.kafka_wire.messages.add_partitions_to_txn_response import (
    AddPartitionsToTxnPartitionResult,
    AddPartitionsToTxnResponse,
    AddPartitionsToTxnTopicResult,
)
from sluice.broker.kafka_wire.messages.end_txn_request import EndTxnRequest
from sluice.broker.kafka_wire.messages.end_txn_response import EndTxnResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.txn.api import PartitionAnswer, TxnHandle


def kafka_error(code: int, version: int, fenced_from: int) -> int:
    """The error as a client of ``version`` understands it (PRODUCER_FENCED only from ``fenced_from``)."""
    if code == pb.PRODUCER_FENCED and version < fenced_from:
        return int(pb.INVALID_PRODUCER_EPOCH)
    return int(code)


class AddPartitionsToTxnHandler:
    api_key = 24
    versions = Versions(0, 3)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, AddPartitionsToTxnRequest)
        version = header.request_api_version
        tid = request.v3_and_below_transactional_id
        pairs = [(t.name, p) for t in request.v3_and_below_topics for p in t.partitions]
        refused = checks.check_add_partitions(ctx.access, ctx.caller, tid, pairs)
        if refused is not None:
            answers = [PartitionAnswer(t, p, r.code, r.message) for t, p, r in refused]
        else:
            handle = TxnHandle(tid, request.v3_and_below_producer_id, request.v3_and_below_producer_epoch)
            answers = await ctx.txn.add_partitions_to_txn(handle, pairs)
        by_topic: dict[str, AddPartitionsToTxnTopicResult] = {}
        for r in answers:
            topic = by_topic.setdefault(r.topic, AddPartitionsToTxnTopicResult(name=r.topic))
            topic.results_by_partition.append(
                AddPartitionsToTxnPartitionResult(r.partition, kafka_error(r.error_code, version, 2))
            )
        return AddPartitionsToTxnResponse(results_by_topic_v3_and_below=list(by_topic.values()))


class AddOffsetsToTxnHandler:
    api_key = 25
    versions = Versions(0, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, AddOffsetsToTxnRequest)
        refused = checks.check_txn_id(ctx.access, ctx.caller, request.transactional_id) or checks.check_group(
            ctx.access, ctx.caller, AclOperation.READ, request.group_id
        )
        if refused is not None:
            return AddOffsetsToTxnResponse(error_code=int(refused.code))
        handle = TxnHandle(request.transactional_id, request.producer_id, request.producer_epoch)
        answer = await ctx.txn.add_offsets_to_txn(handle, request.group_id)
        return AddOffsetsToTxnResponse(error_code=kafka_error(answer.error_code, header.request_api_version, 2))


class EndTxnHandler:
    api_key = 26
    versions = Versions(0, 4)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, EndTxnRequest)
        refused = checks.check_txn_id(ctx.access, ctx.caller, request.transactional_id)
        if refused is not None:
            return EndTxnResponse(error_code=int(refused.code))
        handle = TxnHandle(request.transactional_id, request.producer_id, request.producer_epoch)
        answer = await ctx.txn.end_txn(handle, request.committed)
        return EndTxnResponse(error_code=kafka_error(answer.error_code, header.request_api_version, 2))
