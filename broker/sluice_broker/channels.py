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

Certificates are reloaded while the broker runs (sluice.broker.security.reload): when the
material's version changes, ``get`` makes new credentials and a new channel, so the next
handshake presents the new certificate and trusts the new bundle; the old channel is closed
after a grace period, so calls on it (a replica fetch's long poll) finish rather than fail.
"""

from __future__ import annotations

import asyncio
import contextlib

import grpc

from sluice import tls
from sluice.broker.cluster import ClusterView
from sluice.broker.security import peers
from sluice.broker.security.reload import TlsFiles, files_for

_OPTIONS = [
    ("grpc.max_receive_message_length", 100 * 1024 * 1024),
    ("grpc.max_send_message_length", 100 * 1024 * 1024),
    ("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME),
]
# How long a channel replaced by new credentials keeps serving the calls already on it.
REPLACED_CHANNEL_GRACE_S = 10.0


def target(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class BrokerChannels:
    def __init__(self, cluster: ClusterView) -> None:
        self.cluster = cluster
        self._files: TlsFiles | None = files_for(cluster.config) if cluster.config.tls_dir else None
        self._version = 0
        self._credentials: grpc.ChannelCredentials | None = None
        self._channels: dict[int, tuple[str, int, grpc.aio.Channel]] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._retired: set[grpc.aio.Channel] = set()  # replaced, closing after their grace

    def get(self, broker_id: int) -> grpc.aio.Channel | None:
        """A channel to ``broker_id``'s inter-broker listener, or None when there is none to reach."""
        endpoint = self.cluster.brokers.get(broker_id)
        credentials = self._current_credentials()
        if endpoint is None or not endpoint.inter_broker_port or credentials is None:
            return None
        address = target(endpoint.host, endpoint.inter_broker_port)
        cached = self._channels.get(broker_id)
        if cached is not None:
            if cached[0] == address and cached[1] == self._version:
                return cached[2]
            # a new address closes at once; new credentials let the calls on the old channel finish
            self._close_later(cached[2], None if cached[0] != address else REPLACED_CHANNEL_GRACE_S)
        channel = grpc.aio.secure_channel(address, credentials, options=_OPTIONS)
        self._channels[broker_id] = (address, self._version, channel)
        return channel

    def _current_credentials(self) -> grpc.ChannelCredentials | None:
        """Credentials of the loaded material, made again after a reload (None without TLS)."""
        if self._files is None:
            return None
        loaded = self._files.loaded
        if self._credentials is None or loaded.version != self._version:
            m = loaded.material
            self._credentials = peers.channel_credentials(m.ca_pem, m.cert_pem, m.key_pem)
            self._version = loaded.version
        return self._credentials

    def _close_later(self, channel: grpc.aio.Channel, grace: float | None) -> None:
        self._retired.add(channel)
        task = asyncio.get_running_loop().create_task(channel.close(grace))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
        task.add_done_callback(lambda _t: self._retired.discard(channel))

    async def close(self) -> None:
        channels = [ch for _addr, _version, ch in self._channels.values()] + list(self._retired)
        self._channels.clear()
        for channel in channels:
            with contextlib.suppress(Exception):
                await channel.close(None)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)
