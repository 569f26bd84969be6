"""The broker's Kafka-listener options (``--kafka-listen``, ``--kafka-advertise``) and its start.

Kept here rather than in main.py so the broker's start-up gains two lines, not
the listener's details. The listener is off unless ``--kafka-listen`` is given:
a second client port is opened only on purpose. Its security is the gRPC client
listener's (``--client-listener``: plaintext, tls or mtls with the same
certificates, or token: SASL OAUTHBEARER over TLS), its policy the broker's one request gate
(:class:`~sluice.broker.security.gate.RequestGate`), which the gRPC servicers use too.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig, ConfigError
from sluice.broker.group import GroupCoordinator
from sluice.broker.kafka.context import KafkaContext, split_host_port
from sluice.broker.kafka.listener import KafkaListener
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security.gate import RequestGate
from sluice.broker.security.tokens import TokenAuthenticator
from sluice.broker.txn import TransactionCoordinator
from sluice.tls import TlsError


@dataclass(frozen=True)
class KafkaOptions:
    listen: tuple[str, int]
    advertise: tuple[str, int] | None = None

    @classmethod
    def parse(cls, listen: str | None, advertise: str | None) -> KafkaOptions | None:
        if listen is None:
            if advertise is not None:
                raise ConfigError("--kafka-advertise needs --kafka-listen")
            return None
        try:
            return cls(split_host_port(listen), None if advertise is None else split_host_port(advertise))
        except ValueError as exc:
            raise ConfigError(f"--kafka-listen/--kafka-advertise: {exc}") from None


async def start_kafka_listener(
    options: KafkaOptions | None,
    config: BrokerConfig,
    cluster: ClusterView,
    replicas: ReplicaManager,
    txn: TransactionCoordinator,
    groups: GroupCoordinator,
    gate: RequestGate,
    authenticator: TokenAuthenticator | None = None,
) -> KafkaListener | None:
    """Open the listener (None when not configured): the broker's ``gate`` decides its requests as
    the gRPC servicers', and on a token listener the gRPC listener's token ``authenticator`` (its
    cache of reviews too) authenticates its connections."""
    if options is None:
        return None
    try:
        context = KafkaContext(config, cluster, replicas, txn, groups, gate)
        listener = KafkaListener(context, authenticator if config.client_listener == "token" else None)
    except TlsError as exc:
        raise SystemExit(f"sluice broker: {exc}") from None
    try:
        await listener.start(*options.listen, options.advertise)
    except OSError as exc:  # before the gRPC port opens: a broker that cannot serve what was asked stops
        host, port = options.listen
        raise SystemExit(f"sluice broker: cannot serve the Kafka protocol on {host}:{port}: {exc}") from None
    return listener
