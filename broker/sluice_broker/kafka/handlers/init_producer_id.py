"""InitProducerId: a producer id and epoch for idempotent and transactional producers.

The transaction coordinator's own call (the gRPC InitProducerId): an empty or
null transactional id gets a fresh id from any broker; a transactional id is
answered by its coordinator (NOT_COORDINATOR elsewhere, so the client looks it
up again), bumping the epoch and fencing the previous producer (PRODUCER_FENCED from v4, INVALID_PRODUCER_EPOCH
before, KIP-588); v3+ carries
the producer's current id and epoch for KIP-360's re-initialisation.

Served 0-5. v6 (KIP-939's two-phase commit: ``enable2_pc``,
``keep_prepared_txn``) maps onto Sluice's prepared transactions but is not
wired yet, so it is not advertised.
"""

from __future__ import annotations

from sluice.api.v1 import broker_pb2 as bpb
from sluice.broker.kafka.codec import Message, Versions
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.transactions import kafka_error
from sluice.broker.kafka.messages.init_producer_id_request import InitProducerIdRequest
from sluice.broker.kafka.messages.init_producer_id_response import InitProducerIdResponse
from sluice.broker.kafka.messages.request_header import RequestHeader


class InitProducerIdHandler:
    api_key = 22
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, InitProducerIdRequest)
        answer = await ctx.txn.init_producer_id(
            bpb.InitProducerIdRequest(
                transactional_id=request.transactional_id or "",
                transaction_timeout_ms=request.transaction_timeout_ms,
                producer_id=request.producer_id,
                producer_epoch=request.producer_epoch,
            )
        )
        return InitProducerIdResponse(
            error_code=kafka_error(answer.error_code, header.request_api_version, 4),
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )
