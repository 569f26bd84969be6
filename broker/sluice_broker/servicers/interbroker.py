"""sluice.v1.InterBroker: the service brokers call on each other.

Followers fetch from leaders (ReplicaFetch) and ask where an epoch ended
before truncating (OffsetsForLeaderEpoch); transaction coordinators write
COMMIT/ABORT markers (WriteTxnMarkers). All three go to the
:class:`~sluice.broker.replica_manager.ReplicaManager`.

Only brokers may call them: :meth:`InterBrokerService.handler` is registered on the
inter-broker listener alone, and every method first passes
:func:`~sluice.broker.security.peers.require_broker` (the caller's certificate is a broker's)
before its request is used. The client listener registers :func:`refusing_handler` instead:
the same method names, answered PERMISSION_DENIED without decoding anything.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.broker.errors import InvalidArgumentError
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security.peers import CLIENT_LISTENER_REFUSAL, require_broker
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

    async def write_txn_markers(self, req: ipb.WriteTxnMarkersRequest, ctx: Ctx) -> ipb.WriteTxnMarkersResponse:
        await require_broker(ctx)
        return await self.replicas.write_markers(req)

    async def replica_fetch(self, req: ipb.ReplicaFetchRequest, ctx: Ctx) -> bytes:
        await require_broker(ctx)
        nonneg(req.max_wait_ms, "max_wait_ms")
        nonneg(req.max_bytes, "max_bytes")
        if req.replica_id < 0:
            raise InvalidArgumentError(f"replica_id must be a broker id, not {req.replica_id}")
        if req.max_wait_ms > MAX_WAIT_MS:
            raise InvalidArgumentError(f"max_wait_ms must be at most {MAX_WAIT_MS}, not {req.max_wait_ms}")
        return await self.replicas.replica_fetch(req)

    async def offsets_for_leader_epoch(
        self, req: ipb.OffsetsForLeaderEpochRequest, ctx: Ctx
    ) -> ipb.OffsetsForLeaderEpochResponse:
        await require_broker(ctx)
        return self.replicas.offsets_for_leader_epoch(req)


METHODS = ("WriteTxnMarkers", "ReplicaFetch", "OffsetsForLeaderEpoch")


def refusing_handler() -> grpc.GenericRpcHandler[Any, Any]:
    """sluice.v1.InterBroker as the client listener serves it: every call PERMISSION_DENIED, nothing decoded."""

    async def refuse(_request: bytes, context: Ctx) -> bytes:
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, CLIENT_LISTENER_REFUSAL)
        raise AssertionError("unreachable")

    return grpc.method_handlers_generic_handler(
        "sluice.v1.InterBroker",
        {name: grpc.unary_unary_rpc_method_handler(refuse) for name in METHODS},
    )
