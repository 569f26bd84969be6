"""gRPC channels from this broker to the others: coordinator traffic and replication.

The coordinator talks to other brokers for two things: WriteTxnMarkers to the
leaders of the partitions in a transaction, and DescribeTransactions to
another broker's coordinator when a partition led here verifies a
transactional write (KIP-890). One channel per broker is reused; it is
replaced when the broker's registered endpoint changes (a restarted pod with
a new address). grpc.aio channels reconnect by themselves, so a broker that is
down only costs failed calls, which the callers retry.

Every channel goes to the other broker's inter-broker listener (its registered
``inter_broker_port``), over TLS with this broker's certificate: the peer
verifies we are a broker of the cluster, we verify it against the cluster CA.
The server name checked is the one every broker certificate carries
(:data:`~sluice.broker.security.tls.BROKER_SERVER_NAME`), not the address: brokers
are reached by pod IP or loopback address, and what proves a broker is the CA
that signed it. A broker without TLS material (or a peer without an
inter-broker listener) gets no channel: ``get`` answers None, which callers
treat as a broker they cannot reach.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from sluice import tls
from sluice.broker.cluster import ClusterView
from sluice.broker.security import peers

_OPTIONS = [
    ("grpc.max_receive_message_length", 100 * 1024 * 1024),
    ("grpc.max_send_message_length", 100 * 1024 * 1024),
    ("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME),
]


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BrokerChannels:
    def __init__(self, cluster: ClusterView) -> None:
        self.cluster = cluster
        self._credentials: grpc.ChannelCredentials | None = None
        if cluster.config.tls_dir:
            material = tls.load_dir(cluster.config.tls_dir)
            self._credentials = peers.channel_credentials(material.ca_pem, material.cert_pem, material.key_pem)
        self._channels: dict[int, tuple[str, grpc.aio.Channel]] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def get(self, broker_id: int) -> grpc.aio.Channel | None:
        """A channel to ``broker_id``'s inter-broker listener, or None when there is none to reach."""
        endpoint = self.cluster.brokers.get(broker_id)
        if endpoint is None or not endpoint.inter_broker_port or self._credentials is None:
            return None
        address = target(endpoint.host, endpoint.inter_broker_port)
        cached = self._channels.get(broker_id)
        if cached is not None:
            if cached[0] == address:
                return cached[1]
            self._close_later(cached[1])
        channel = grpc.aio.secure_channel(address, self._credentials, options=_OPTIONS)
        self._channels[broker_id] = (address, channel)
        return channel

    def _close_later(self, channel: grpc.aio.Channel) -> None:
        task = asyncio.get_running_loop().create_task(channel.close(None))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        channels = [ch for _addr, ch in self._channels.values()]
        self._channels.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
