"""sluice.v1.InterBroker: the service brokers call on each other.

Followers fetch from leaders (ReplicaFetch) and ask where an epoch ended
before truncating (OffsetsForLeaderEpoch); transaction coordinators write
COMMIT/ABORT markers (WriteTxnMarkers). All three go to the
:class:`~sluice.broker.replica_manager.ReplicaManager`.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.broker.errors import InvalidArgumentError
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.servicers.broker import MAX_WAIT_MS
from sluice.broker.servicers.registration import Ctx, nonneg, service


class InterBrokerService:
    """sluice.v1.InterBroker."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return service(
            "sluice.v1.InterBroker",
            {
                "WriteTxnMarkers": (self.write_txn_markers, ipb.WriteTxnMarkersRequest),
                "ReplicaFetch": (self.replica_fetch, ipb.ReplicaFetchRequest),
                "OffsetsForLeaderEpoch": (self.offsets_for_leader_epoch, ipb.OffsetsForLeaderEpochRequest),
            },
            self.replicas.events,
        )

    async def write_txn_markers(self, req: ipb.WriteTxnMarkersRequest, _ctx: Ctx) -> ipb.WriteTxnMarkersResponse:
        return await self.replicas.write_markers(req)

    async def replica_fetch(self, req: ipb.ReplicaFetchRequest, _ctx: Ctx) -> bytes:
        nonneg(req.max_wait_ms, "max_wait_ms")
        nonneg(req.max_bytes, "max_bytes")
        if req.replica_id < 0:
            raise InvalidArgumentError(f"replica_id must be a broker id, not {req.replica_id}")
        if req.max_wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"max_wait_ms must be at most {MAX_WAIT_MS}, not {req.max_wait_ms}")
        return await self.replicas.replica_fetch(req)

    async def offsets_for_leader_epoch(
        self, req: ipb.OffsetsForLeaderEpochRequest, _ctx: Ctx
    ) -> ipb.OffsetsForLeaderEpochResponse:
        return self.replicas.offsets_for_leader_epoch(req)
