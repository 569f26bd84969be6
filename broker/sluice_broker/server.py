"""The broker's gRPC surface: its listeners, and which services each one serves.

Two listeners, as Kafka separates its inter.broker.listener from client listeners:

* the **client listener** (``--listen``; ``--client-listener`` plaintext, tls, mtls or token, see
  :meth:`sluice.broker.security.reload.TlsFiles.client_listener_credentials` and
  :mod:`sluice.broker.security.tokens`) serves sluice.v1.Broker and the health service. The
  inter-broker methods are registered there only to be refused (PERMISSION_DENIED, nothing
  decoded): a client never needs them, and a forged WriteTxnMarkers or ReplicaFetch must not
  move a transaction, a high watermark or an ISR.
* the **inter-broker listener** (``--inter-broker-listen``, with ``--broker-tls-dir``) is TLS
  that requires a client certificate signed by the cluster CA. It serves sluice.v1.InterBroker
  (each call checked again by :func:`sluice.broker.security.peers.require_broker`) and
  sluice.v1.Broker (brokers ask each other's coordinators: DescribeTransactions when verifying a
  transactional write, ListOffsets for the lag metrics).

A broker started without an inter-broker listener serves no inter-broker RPC at all: it runs
alone (single-broker clusters), and no other broker can replicate from it.

Both listeners' TLS is gRPC's dynamic server credentials over the broker's reloaded files
(:mod:`sluice.broker.security.reload`): a renewed certificate or a new trust bundle is served
to every new connection without a restart. gRPC Python binds
handlers per server, not per port, hence two ``grpc.aio`` servers on one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from sluice.broker.channels import target
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security import tokens
from sluice.broker.security.connections import ConnectionLimitInterceptor, ConnectionQuotas, GrpcConnections
from sluice.broker.security.gate import RequestGate
from sluice.broker.security.reload import files_for
from sluice.broker.servicers import BrokerService, InterBrokerService
from sluice.broker.servicers.interbroker import refusing_handler
from sluice.broker.txn import TransactionCoordinator


class BrokerServicer:
    """sluice.v1.Broker and sluice.v1.InterBroker of one broker."""

    def __init__(
        self,
        config: BrokerConfig,
        cluster: ClusterView,
        replicas: ReplicaManager,
        txn: TransactionCoordinator,
        groups: GroupCoordinator,
        gate: RequestGate,
    ) -> None:
        self.config = config
        self.broker = BrokerService(cluster, replicas, txn, groups, gate)
        self.interbroker = InterBrokerService(replicas)

    def client_handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        """What the client listener serves: Broker, and InterBroker refusing every call."""
        return [self.broker.handler(), refusing_handler()]

    def interbroker_handlers(self) -> list[grpc.GenericRpcHandler[Any, Any]]:
        """What the inter-broker listener serves (behind mutual TLS): Broker and InterBroker."""
        return [self.broker.handler(), self.interbroker.handler()]


@dataclass
class Listeners:
    """The broker's gRPC servers: ``client`` always, ``interbroker`` when configured."""

    client: grpc.aio.Server
    interbroker: grpc.aio.Server | None
    health: grpc.aio.Server | None = None  # --health-listen: the health service alone, plaintext

    async def start(self) -> None:
        await self.client.start()
        if self.interbroker is not None:
            await self.interbroker.start()
        if self.health is not None:
            await self.health.start()

    async def stop(self, grace: float) -> None:
        if self.health is not None:
            await self.health.stop(grace)
        if self.interbroker is not None:
            await self.interbroker.stop(grace)
        await self.client.stop(grace)


def _server(
    max_bytes: int, options: list[tuple[str, Any]] | None = None, interceptors: list[Any] | None = None
) -> grpc.aio.Server:
    base: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_bytes),
        ("grpc.max_send_message_length", max_bytes),
        ("grpc.so_reuseport", 0),
    ]
    return grpc.aio.server(options=base + (options or []), interceptors=interceptors)


def client_server(
    config: BrokerConfig,
    reviewer: tokens.Reviewer | None = None,
    authenticator: tokens.TokenAuthenticator | None = None,
) -> tuple[grpc.aio.Server, GrpcConnections | None]:
    """The client listener's server: connections idle for connections.max.idle.ms are closed (as the
    Kafka listener does), and calls from connections beyond max.connections.per.ip & co. are refused
    (:mod:`sluice.broker.security.connections`; no such interceptor when every cap is unlimited).

    With ``--client-listener token`` every call but health checks is first authenticated by its
    ServiceAccount token (:class:`sluice.broker.security.tokens.TokenInterceptor`, reviews by
    ``reviewer``; or ``authenticator``, shared with the Kafka listener). It is the outer
    interceptor: a call without a valid token is refused before it counts as a connection's call,
    and the connection limits see the server's own handlers (they cache their wrapped copies per
    handler).
    """
    idle_ms = config.int("connections.max.idle.ms")
    quotas = ConnectionQuotas.from_config(config)
    interceptors: list[Any] = []
    if config.client_listener == "token":
        if authenticator is None:
            reviewer = reviewer if reviewer is not None else tokens.reviewer_for(config.metadata_url)
            authenticator = tokens.TokenAuthenticator(reviewer, config.token_audience)
        interceptors.append(tokens.TokenInterceptor(authenticator))
    connections: GrpcConnections | None = None
    if not quotas.unlimited:
        connections = GrpcConnections(quotas, config.port, idle_ms / 1000)
        interceptors.append(ConnectionLimitInterceptor(connections))
    options: list[tuple[str, Any]] = [("grpc.max_connection_idle_ms", idle_ms)]
    return _server(config.int("socket.request.max.bytes"), options, interceptors or None), connections


def open_listeners(
    config: BrokerConfig,
    servicer: BrokerServicer,
    health: HealthServicer,
    health_listen: tuple[str, int] | None = None,
    reviewer: tokens.Reviewer | None = None,
    authenticator: tokens.TokenAuthenticator | None = None,
) -> Listeners:
    """Build the servers and bind their ports (not started yet); TlsError if the TLS material is bad.

    With ``--client-listener token`` every client call is authenticated by its ServiceAccount
    token first (:class:`sluice.broker.security.tokens.TokenInterceptor`, reviews by ``reviewer``).
    ``health_listen`` adds a plaintext server with the health service alone, for probes that
    cannot speak TLS (a kubelet's gRPC probe).
    """
    max_bytes = config.int("socket.request.max.bytes")
    client, connections = client_server(config, reviewer, authenticator)
    client.add_generic_rpc_handlers(servicer.client_handlers())
    health_pb2_grpc.add_HealthServicer_to_server(health, client)
    files = files_for(config) if config.tls_dir else None
    address = target(config.host, config.port)
    if files is None or config.client_listener == "plaintext":
        bound = client.add_insecure_port(address)
    else:
        bound = client.add_secure_port(address, files.client_listener_credentials(config.client_listener))
    if connections is not None:
        connections.port = bound  # the port the kernel's connection table is searched for
    interbroker: grpc.aio.Server | None = None
    if config.inter_broker_port and files is not None:
        interbroker = _server(max_bytes)
        interbroker.add_generic_rpc_handlers(servicer.interbroker_handlers())
        interbroker.add_secure_port(target(config.host, config.inter_broker_port), files.interbroker_credentials())
    probes: grpc.aio.Server | None = None
    if health_listen is not None:
        probes = _server(max_bytes)
        health_pb2_grpc.add_HealthServicer_to_server(health, probes)
        probes.add_insecure_port(target(*health_listen))
    return Listeners(client, interbroker, probes)
