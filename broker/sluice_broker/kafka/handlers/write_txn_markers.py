"""WriteTxnMarkers, as an administrator sends it: the abort of a hanging transaction.

Kafka's transaction coordinators send WriteTxnMarkers to partition leaders; Sluice's send theirs
over the inter-broker gRPC listener, so on the Kafka listener the only sender is an
administrator's ``Admin.abortTransaction`` (``kafka-transactions.sh abort``): an ABORT marker for
a transaction its coordinator will never end, which holds the partition's LSO back. Each
partition goes to the core's :meth:`~sluice.broker.replica_manager.ReplicaManager.abort_hanging_transaction`,
the gRPC AbortTransaction's too, which refuses a transaction whose producer wrote within
``transaction.max.timeout.ms`` (INVALID_TXN_STATE: it may still be live).

ClusterAction on the cluster is needed, as in Kafka (CLUSTER_AUTHORIZATION_FAILED on every
partition otherwise). A COMMIT marker is never an administrator's to write: INVALID_REQUEST.
Served 1-2 (v0, not flexible, is gone from Kafka 4).
"""

from __future__ import annotations

from sluice.acls import AclOperation
from sluice.api.v1 import records_pb2 as pb
from sluice.broker.kafka import authorization
from sluice.broker.kafka.context import KafkaContext
from sluice.broker.kafka_wire.codec import Message, Versions
from sluice.broker.kafka_wire.messages.request_header import RequestHeader
from sluice.broker.kafka_wire.messages.write_txn_markers_request import WriteTxnMarkersRequest
from sluice.broker.kafka_wire.messages.write_txn_markers_response import (
    WritableTxnMarkerPartitionResult,
    WritableTxnMarkerResult,
    WritableTxnMarkerTopicResult,
    WriteTxnMarkersResponse,
)
from sluice.errors import SluiceError


class WriteTxnMarkersHandler:
    api_key = 27
    versions = Versions(1, 2)

    async def handle(self, ctx: KafkaContext, header: RequestHeader, request: Message) -> Message:
        assert isinstance(request, WriteTxnMarkersRequest)
        allowed = authorization.cluster_allowed(ctx, AclOperation.CLUSTER_ACTION)
        resp = WriteTxnMarkersResponse()
        for marker in request.markers:
            out = WritableTxnMarkerResult(producer_id=marker.producer_id)
            for topic in marker.topics:
                result = WritableTxnMarkerTopicResult(name=topic.name)
                for index in topic.partition_indexes:
                    code = pb.NONE
                    if not allowed:
                        code = pb.CLUSTER_AUTHORIZATION_FAILED
                    elif marker.transaction_result:
                        code = pb.INVALID_REQUEST  # commits are the coordinator's alone
                    else:
                        try:
                            await ctx.replicas.abort_hanging_transaction(
                                topic.name, index, marker.producer_id, marker.producer_epoch, marker.coordinator_epoch
                            )
                        except SluiceError as exc:
                            code = exc.code
                    result.partitions.append(WritableTxnMarkerPartitionResult(partition_index=index, error_code=code))
                out.topics.append(result)
            resp.markers.append(out)
        return resp
