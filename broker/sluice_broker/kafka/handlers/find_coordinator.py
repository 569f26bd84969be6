"""FindCoordinator: the broker leading a group's or transactional id's coordinator partition.

The broker's one rule (:meth:`~sluice.broker.security.gate.RequestGate.find_coordinator`,
the gRPC FindCoordinator's too: the key's hash picks a partition of ``__consumer_offsets``
or ``__transaction_state``; its leader coordinates), with the coordinator's Kafka address.
v0-3 ask for one key; v4+ batch keys and answer per key. No leader, or a leader without a
Kafka listener, is COORDINATOR_NOT_AVAILABLE (retriable: the client asks again).
Authorization is the gate's too (Describe on the group or the transactional id), per key:
GROUP_/TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
"""

from __future__ import annotations

from sluice.api.v1 import broker_pb2 as bpb
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka.context import KafkaContext, kafka_endpoint
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.find_coordinator_request import FindCoordinatorRequest
from sluice.broker.kafka_wire.messages.find_coordinator_response import Coordinator, FindCoordinatorResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

KEY_TYPES = {0: bpb.GROUP, 1: bpb.TRANSACTION}  # 2 (share groups) is not served


def find(ctx: KafkaContext, key: str, key_type: int) -> Coordinator:
    out = Coordinator(key=key, node_id=-1, host="", port=-1, error_code=0, error_message=None)
    kind = KEY_TYPES.get(key_type)
    if kind is None:
        out.error_code, out.error_message = pb.INVALID_REQUEST, f"key type {key_type} is not served"
        return out
    found = ctx.gate.find_coordinator(ctx.cluster, ctx.caller, key, kind)
    if found.refusal is not None:
        out.error_code, out.error_message = int(found.refusal.code), found.refusal.message
        return out
    endpoint = kafka_endpoint(ctx, found.broker_id)
    if endpoint is None:
        out.error_code = pb.COORDINATOR_NOT_AVAILABLE
        out.error_message = f"the coordinator of {key!r} (broker {found.broker_id}) has no Kafka listener"
        return out
    out.node_id, (out.host, out.port) = found.broker_id, endpoint
    return out


class FindCoordinatorHandler:
    api_key = 10
    versions = Versions(0, 6)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, FindCoordinatorRequest)
        ctx.cluster.refresh()
        if header.request_api_version >= 4:
            return FindCoordinatorResponse(
                coordinators=[find(ctx, key, request.key_type) for key in request.coordinator_keys]
            )
        one = find(ctx, request.key, request.key_type)
        return FindCoordinatorResponse(
            error_code=one.error_code,
            error_message=one.error_message,
            node_id=one.node_id,
            host=one.host,
            port=one.port,
        )
