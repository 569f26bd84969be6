"""What a Kafka handler may use: the same core objects the gRPC servicers are given.

The Kafka listener is a second protocol over one broker, not a second broker:
handlers read the cluster view and call the replica manager and the
coordinators exactly as :mod:`sluice.broker.servicers` does, so a record, a
group or a transaction is one object whichever protocol touches it.

The same holds for policy: ``gate`` is the broker's one
:class:`~sluice.broker.security.gate.RequestGate`, the gRPC servicers' too (one ACL set,
one watch, one set of quota and rate buckets), so a principal's bytes and producer ids
count once per broker whichever protocol it uses, as Kafka counts them across its
listeners. ``caller`` is per connection: the listener hands
each connection its own copy of the context with the principal its TLS
handshake proved (:mod:`sluice.broker.kafka.transport`), or, on a token listener,
the one its SASL authentication proved (:mod:`sluice.broker.kafka.authentication`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sluice.broker.cluster import ClusterView
from sluice.broker.config import BrokerConfig
from sluice.broker.group import GroupCoordinator
from sluice.broker.replica_manager import ReplicaManager
from sluice.broker.security.authorizer import Access
from sluice.broker.security.gate import RequestGate
from sluice.broker.security.peers import ANONYMOUS, Caller
from sluice.broker.txn import TransactionCoordinator

if TYPE_CHECKING:
    from sluice.broker.kafka.authentication import SaslSession

# The key of a broker's Kafka address ("host:port") in its brokers/<id> document: written by the
# broker when its listener opens, read by every broker to answer Metadata (a broker without one
# has no Kafka listener and is left out of Kafka clients' view of the cluster).
KAFKA_ADDRESS_FIELD = "kafka_address"


@dataclass
class KafkaContext:
    config: BrokerConfig
    cluster: ClusterView
    replicas: ReplicaManager
    txn: TransactionCoordinator
    groups: GroupCoordinator
    gate: RequestGate
    # the connection's caller; the listener's own context (before any connection) is anonymous
    caller: Caller = field(default_factory=lambda: Caller(ANONYMOUS, ""))
    # the connection's SASL authentication (a token listener: sluice.broker.kafka.authentication), else None
    sasl: SaslSession | None = None

    @property
    def access(self) -> Access:
        """The broker's authorizer (the gate's)."""
        return self.gate.access


def split_host_port(value: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); ValueError when it is not one."""
    host, sep, port = value.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{value!r} is not HOST:PORT with a port in 1..65535")
    return host, int(port)


def kafka_endpoint(ctx: KafkaContext, broker_id: int) -> tuple[str, int] | None:
    """Broker ``broker_id``'s advertised Kafka address, or None when it has no Kafka listener."""
    broker = ctx.cluster.brokers.get(broker_id)
    address = None if broker is None else broker.extra.get(KAFKA_ADDRESS_FIELD)
    if not isinstance(address, str):
        return None
    try:
        return split_host_port(address)
    except ValueError:
        return None


def kafka_brokers(ctx: KafkaContext) -> list[tuple[int, str, int, str | None]]:
    """(id, host, port, rack) of every broker with a Kafka listener, by id."""
    out = []
    for broker_id in sorted(ctx.cluster.brokers):
        endpoint = kafka_endpoint(ctx, broker_id)
        if endpoint is not None:
            out.append((broker_id, *endpoint, ctx.cluster.brokers[broker_id].rack or None))
    return out
