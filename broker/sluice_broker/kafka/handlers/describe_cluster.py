"""DescribeCluster: the cluster id and every broker's Kafka address, as admin clients ask for them.

Brokers are listed as in Metadata (those with a Kafka listener); the
"controller" is the answering broker, since every Sluice broker takes admin
requests. Asking for controller endpoints (endpoint type 2, KIP-919) is
INVALID_REQUEST: Sluice's controller does not speak Kafka. Nothing is
authorized (as in Kafka); the cluster's authorized operations are reported when
asked for (0 without Describe on the cluster).
"""

from __future__ import annotations

from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext, kafka_brokers
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.describe_cluster_request import DescribeClusterRequest
from sluice.broker.kafka_wire.messages.describe_cluster_response import DescribeClusterBroker, DescribeClusterResponse
from sluice.broker.kafka_wire.messages.request_header import RequestHeader

BROKER_ENDPOINTS = 1


class DescribeClusterHandler:
    api_key = 60
    versions = Versions(0, 2)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, DescribeClusterRequest)
        ctx.cluster.refresh()
        resp = DescribeClusterResponse(
            endpoint_type=request.endpoint_type,
            cluster_id=ctx.cluster.cluster_id,
            controller_id=ctx.config.broker_id,
        )
        if request.endpoint_type != BROKER_ENDPOINTS:
            resp.error_code = pb.INVALID_REQUEST
            resp.error_message = f"endpoint type {request.endpoint_type} is not served: only brokers (1)"
            return resp
        if request.include_cluster_authorized_operations:
            resp.cluster_authorized_operations = authorization.cluster_operations(ctx)
        for broker_id, host, port, rack in kafka_brokers(ctx):
            resp.brokers.append(DescribeClusterBroker(broker_id, host, port, rack))
        return resp
