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

Before the coordinator, the gRPC InitProducerId's own checks, in its order:
authorization (Write on the transactional id, TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
without one IdempotentWrite on the cluster or Write on some topic, KIP-679:
CLUSTER_AUTHORIZATION_FAILED), then the caller's producer-id rate
(``producer.id.rate.per.principal.per.minute``, the same bucket as over gRPC):
a new producer id beyond it is THROTTLING_QUOTA_EXCEEDED with ``throttle_time_ms``
set to when the next one can be had.
"""

from __future__ import annotations

from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka.handlers.transactions import kafka_error
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.init_producer_id_request import InitProducerIdRequest
from sluice.broker.kafka_wire.messages.init_producer_id_response import InitProducerIdResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.security import coordinator_checks as checks
from sluice.broker.txn.api import InitProducerIdInput


class InitProducerIdHandler:
    api_key = 22
    versions = Versions(0, 5)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, InitProducerIdRequest)
        core = InitProducerIdInput(
            transactional_id=request.transactional_id or "",
            transaction_timeout_ms=request.transaction_timeout_ms,
            producer_id=request.producer_id,
            producer_epoch=request.producer_epoch,
        )
        refused = checks.check_init_producer_id(ctx.access, ctx.caller, core.transactional_id)
        if refused is not None:
            return InitProducerIdResponse(error_code=int(refused.code), producer_id=-1, producer_epoch=-1)
        throttled = ctx.gate.take_producer_id(ctx.caller.principal, core.producer_id)
        if throttled is not None:
            return InitProducerIdResponse(
                throttle_time_ms=throttled.throttle_ms,  # one token's refill time
                error_code=throttled.code,
                producer_id=-1,
                producer_epoch=-1,
            )
        answer = await ctx.txn.init_producer_id(core)
        return InitProducerIdResponse(
            error_code=kafka_error(answer.error_code, header.request_api_version, 4),
            producer_id=answer.producer_id,
            producer_epoch=answer.producer_epoch,
        )
