"""The broker's gRPC surface: its listeners, and which services each one serves.

Two listeners, as Kafka separates its inter.broker.listener from client listeners:

* the **client listener** (``--listen``; ``--client-listener`` plaintext, tls, mtls or token,
  see :func:`sluice.broker.security.peers.client_listener_credentials` and
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
alone (single-broker clusters), and no other broker can replicate from it. gRPC Python binds
handlers per server, not per port, hence two ``grpc.aio`` servers on one event loop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from sluice import tls
from sluice.broker.channels import target
from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security import peers, tokens
from sluice.broker.security.authorizer import Access
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
    ) -> None:
        self.config = config
        self.access = Access(config, cluster.store)
        self.broker = BrokerService(cluster, replicas, txn, groups, self.access)
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


def _server(max_bytes: int, interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] | None = None) -> grpc.aio.Server:
    return grpc.aio.server(
        interceptors=interceptors,
        options=[
            ("grpc.max_receive_message_length", max_bytes),
            ("grpc.max_send_message_length", max_bytes),
            ("grpc.so_reuseport", 0),
        ]
    )


def open_listeners(
    config: BrokerConfig,
    servicer: BrokerServicer,
    health: HealthServicer,
    health_listen: tuple[str, int] | None = None,
    reviewer: tokens.Reviewer | None = None,
) -> Listeners:
    """Build the servers and bind their ports (not started yet); TlsError if the TLS material is bad.

    With ``--client-listener token`` every client call is authenticated by its ServiceAccount
    token first (:class:`sluice.broker.security.tokens.TokenInterceptor`, reviews by ``reviewer``).
    ``health_listen`` adds a plaintext server with the health service alone, for probes that
    cannot speak TLS (a kubelet's gRPC probe).
    """
    max_bytes = config.int("socket.request.max.bytes")
    interceptors: list[grpc.aio.ServerInterceptor[Any, Any]] = []
    if config.client_listener == "token":
        reviewer = reviewer if reviewer is not None else tokens.reviewer_for(config.metadata_url)
        interceptors.append(tokens.TokenInterceptor(tokens.TokenAuthenticator(reviewer, config.token_audience)))
    client = _server(max_bytes, interceptors)
    client.add_generic_rpc_handlers(servicer.client_handlers())
    health_pb2_grpc.add_HealthServicer_to_server(health, client)
    material = tls.load_dir(config.tls_dir) if config.tls_dir else None
    address = target(config.host, config.port)
    if material is None or config.client_listener == "plaintext":
        client.add_insecure_port(address)
    else:
        creds = peers.client_listener_credentials(config.client_listener, material, config.clients_ca)
        client.add_secure_port(address, creds)
    interbroker: grpc.aio.Server | None = None
    if config.inter_broker_port and material is not None:
        interbroker = _server(max_bytes)
        interbroker.add_generic_rpc_handlers(servicer.interbroker_handlers())
        creds = peers.server_credentials(material.ca_pem, material.cert_pem, material.key_pem)
        interbroker.add_secure_port(target(config.host, config.inter_broker_port), creds)
    probes: grpc.aio.Server | None = None
    if health_listen is not None:
        probes = _server(max_bytes)
        health_pb2_grpc.add_HealthServicer_to_server(health, probes)
        probes.add_insecure_port(target(*health_listen))
    return Listeners(client, interbroker, probes)
