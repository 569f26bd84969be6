"""sluice.v1.InterBroker: the service brokers call on each other.

Followers fetch from leaders (ReplicaFetchStream: one stream per leader, one
response per request; ReplicaFetch, the same one round per call, for followers
of older code) and ask where an epoch ended before truncating
(OffsetsForLeaderEpoch); transaction coordinators write COMMIT/ABORT markers
(WriteTxnMarkers). All go to the :class:`~sluice.broker.replica_manager.ReplicaManager`.

Only brokers may call them: :meth:`InterBrokerService.handler` is registered on the
inter-broker listener alone, and every method first passes
:func:`~sluice.broker.security.peers.require_broker` (the caller's certificate is a broker's)
before its request is used (a stream: once, when it opens; the peer cannot change on it). The
client listener registers :func:`refusing_handler` instead: the same method names, answered
PERMISSION_DENIED without decoding anything.
"""

from __future__ import annotations

from typing import Any

import grpc

from sluice.api.v1 import interbroker_pb2 as ipb
from sluice.broker.errors import InvalidArgumentError
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security.peers import CLIENT_LISTENER_REFUSAL, require_broker
from sluice.broker.servicers.broker import MAX_WAIT_MS
from sluice.broker.servicers.registration import Ctx, Stream, nonneg, service


class InterBrokerService:
    """sluice.v1.InterBroker."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas
        self._ending = False

    def end_streams(self) -> None:
        """The broker is stopping: each open ReplicaFetchStream ends before its next request.

        A stream has no end of its own, so without this a graceful stop of the listener would wait
        its whole grace period; the followers see the stream end and fetch again after their back-off.
        """
        self._ending = True

    def handler(self) -> grpc.GenericRpcHandler[Any, Any]:
        return service(
            "sluice.v1.InterBroker",
            {
                "WriteTxnMarkers": (self.write_txn_markers, ipb.WriteTxnMarkersRequest),
                "ReplicaFetch": (self.replica_fetch, ipb.ReplicaFetchRequest),
                "OffsetsForLeaderEpoch": (self.offsets_for_leader_epoch, ipb.OffsetsForLeaderEpochRequest),
            },
            self.replicas.events,
            streams={
                # each request on the stream is timed and counted as a ReplicaFetch call
                "ReplicaFetchStream": Stream(
                    require_broker,
                    self._replica_fetch,
                    ipb.ReplicaFetchRequest,
                    "ReplicaFetch",
                    ending=lambda: self._ending,
                )
            },
        )

    async def write_txn_markers(self, req: ipb.WriteTxnMarkersRequest, ctx: Ctx) -> ipb.WriteTxnMarkersResponse:
        await require_broker(ctx)
        return await self.replicas.write_markers(req)

    async def replica_fetch(self, req: ipb.ReplicaFetchRequest, ctx: Ctx) -> bytes:
        await require_broker(ctx)
        return await self._replica_fetch(req, ctx)

    async def _replica_fetch(self, req: ipb.ReplicaFetchRequest, _ctx: Ctx) -> bytes:
        """One round of a follower that passed :func:`require_broker` (a call, or a request on its stream)."""
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
STREAMS = ("ReplicaFetchStream",)


def refusing_handler() -> grpc.GenericRpcHandler[Any, Any]:
    """sluice.v1.InterBroker as the client listener serves it: every call PERMISSION_DENIED, nothing decoded."""

    async def refuse(_request: object, context: Ctx) -> bytes:
        # A stream's request iterator is never read: refused before any request is decoded
        # (without deserializers, a request would arrive as bytes anyway).
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, CLIENT_LISTENER_REFUSAL)
        raise AssertionError("unreachable")

    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(refuse) for name in METHODS
    }
    handlers.update((name, grpc.stream_stream_rpc_method_handler(refuse)) for name in STREAMS)
    return grpc.method_handlers_generic_handler("sluice.v1.InterBroker", handlers)
