"""Connections per client address: Kafka's ``max.connections.per.ip``, its overrides, ``max.connections``.

:class:`ConnectionQuotas` counts the live connections of each client address, for the broker's
listeners together (Kafka counts them broker-wide too). A listener asks :meth:`~ConnectionQuotas.open`
when a connection arrives and calls :meth:`~ConnectionQuotas.close` when it ends; a connection
beyond the address's cap (``max.connections.per.ip``, or its entry in
``max.connections.per.ip.overrides``) or the broker's (``max.connections``) is refused with a
message naming the key. Inter-broker connections never pass through it (their listener is
separate and mutual TLS already decides who may connect).

The Kafka listener sees every accept and close, so its count is exact: it closes a refused
connection at once, as Kafka does.

gRPC Python exposes no connection events, only each call's peer (``ipv4:10.0.0.7:54321``), and
a client's calls on one channel share one connection, hence one source port. So
:class:`GrpcConnections` takes a new (address, port) pair as a new connection when its first
call arrives, and refuses that call (RESOURCE_EXHAUSTED, naming the key) when the address is at
its cap; the connection itself stays open but is served nothing. A pair leaves the count when
the connection is gone, which is learnt two ways:

* the client server closes connections without a call for ``connections.max.idle.ms``
  (``grpc.max_connection_idle_ms``), so a pair with no call in flight for that long is gone;
* before refusing, the count is checked against the kernel's table of established TCP
  connections to the listener's port (``/proc/net/tcp`` and ``tcp6``, at most once a second), so
  a client that closed its channel frees its place at once rather than after the idle time.

Without ``/proc`` (not Linux) only the first applies: a closed connection still counts until the
idle time has passed. docs/security.md, "Limits", says what this means for users.
"""

from __future__ import annotations

import ipaddress
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from sluice.broker.config import BrokerConfig, parse_ip_overrides

log = logging.getLogger(__name__)

PER_IP_KEY = "max.connections.per.ip"
OVERRIDES_KEY = "max.connections.per.ip.overrides"
TOTAL_KEY = "max.connections"
UNLIMITED = 2_147_483_647
COUNTED_SERVICE = "/sluice.v1.Broker/"  # the client API; the health service is not counted


class ConnectionQuotas:
    """Live connections per client address, capped per address and in total."""

    def __init__(self, per_ip: int, overrides: dict[str, int] | None = None, total: int = UNLIMITED) -> None:
        self.per_ip = per_ip
        self.overrides = dict(overrides or {})
        self.total = total
        self.counts: dict[str, int] = {}
        self.count = 0

    @classmethod
    def from_config(cls, config: BrokerConfig) -> ConnectionQuotas:
        return cls(config.int(PER_IP_KEY), parse_ip_overrides(str(config.get(OVERRIDES_KEY))), config.int(TOTAL_KEY))

    def cap(self, host: str) -> tuple[int, str]:
        """The cap of ``host`` and the key that sets it."""
        if host in self.overrides:
            return self.overrides[host], f"{OVERRIDES_KEY} ({host}:{self.overrides[host]})"
        return self.per_ip, f"{PER_IP_KEY}={self.per_ip}"

    @property
    def unlimited(self) -> bool:
        return self.per_ip >= UNLIMITED and self.total >= UNLIMITED and not self.overrides

    def refusal(self, host: str) -> str | None:
        """Why a new connection from ``host`` would be refused now, or None."""
        cap, key = self.cap(host)
        have = self.counts.get(host, 0)
        if have >= cap:
            return f"too many connections from {host}: {have} open, at most {cap} ({key})"
        if self.count >= self.total:
            return f"too many connections to this broker: {self.count} open ({TOTAL_KEY}={self.total})"
        return None

    def open(self, host: str) -> str | None:
        """Count a new connection from ``host``; the refusal (and nothing counted) when over a cap."""
        refused = self.refusal(host)
        if refused is None:
            self.counts[host] = self.counts.get(host, 0) + 1
            self.count += 1
        return refused

    def close(self, host: str) -> None:
        have = self.counts.get(host, 0)
        if have <= 1:
            self.counts.pop(host, None)
        else:
            self.counts[host] = have - 1
        self.count = max(0, self.count - 1)


def parse_peer(peer: str) -> tuple[str, int] | None:
    """(host, port) of a gRPC peer string (``ipv4:1.2.3.4:5``, ``ipv6:[::1]:5``); None for others (unix:)."""
    kind, _, rest = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return None
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        return None
    host = host[1:-1] if host.startswith("[") else host
    if host.lower().startswith("::ffff:") and "." in host:  # an IPv4 client of a dual-stack listener
        host = host[7:]
    return host, int(port)


def _hex_ipv4(word: str) -> str:
    raw = bytes.fromhex(word)[::-1]  # /proc/net/tcp prints the address as a host-order (little-endian) word
    return ".".join(str(b) for b in raw)


def _hex_ipv6(text: str) -> str:
    raw = b"".join(bytes.fromhex(text[i : i + 8])[::-1] for i in range(0, 32, 8))
    address = ipaddress.IPv6Address(raw)
    mapped = address.ipv4_mapped
    return str(mapped) if mapped is not None else str(address)


def established_peers(port: int, proc: Path = Path("/proc/net")) -> set[tuple[str, int]] | None:
    """(address, port) of every established TCP connection to local ``port``; None without /proc."""
    found: set[tuple[str, int]] = set()
    read_any = False
    for name, decode in (("tcp", _hex_ipv4), ("tcp6", _hex_ipv6)):
        try:
            lines = (proc / name).read_text().splitlines()[1:]
        except OSError:
            continue
        read_any = True
        for line in lines:
            fields = line.split()
            if len(fields) < 4 or fields[3] != "01":  # 01: ESTABLISHED
                continue
            local, remote = fields[1], fields[2]
            if int(local.rsplit(":", 1)[1], 16) != port:
                continue
            address, remote_port = remote.rsplit(":", 1)
            found.add((decode(address), int(remote_port, 16)))
    return found if read_any else None


class GrpcConnections:
    """Connections of a gRPC listener, learnt from the peers of its calls (see the module docstring)."""

    RECONCILE_EVERY_S = 1.0

    def __init__(
        self,
        quotas: ConnectionQuotas,
        port: int,
        idle_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        established: Callable[[int], set[tuple[str, int]] | None] = established_peers,
    ) -> None:
        self.quotas = quotas
        self.port = port
        self.idle_s = idle_s
        self.clock = clock
        self.established = established
        self._live: dict[tuple[str, int], list[float]] = {}  # (host, port) -> [calls in flight, last activity]
        self._swept_at = {False: float("-inf"), True: float("-inf")}  # by kind (kernel or not)

    def begin(self, peer: str) -> str | None:
        """A call starts on ``peer``'s connection: None to serve it, else the refusal."""
        key = parse_peer(peer)
        if key is None:
            return None
        state = self._live.get(key)
        if state is None:
            # a new connection: sweep the idle-closed ones first (at most once a second), so the
            # table stays as large as the live connections even when no address reaches its cap
            self._forget(kernel=False)
            refused = self.quotas.open(key[0])
            if refused is not None and self._forget(kernel=True):
                refused = self.quotas.open(key[0])
            if refused is not None:
                return refused
            state = self._live[key] = [0.0, 0.0]
        state[0] += 1
        state[1] = self.clock()
        return None

    def end(self, peer: str) -> None:
        key = parse_peer(peer)
        state = self._live.get(key) if key is not None else None
        if state is not None:
            state[0] -= 1
            state[1] = self.clock()

    def _forget(self, *, kernel: bool) -> bool:
        """Drop connections that are gone (idle past the server's idle close; with ``kernel``, also
        those the kernel no longer has established); each kind at most once a second. True if any."""
        now = self.clock()
        if now - self._swept_at[kernel] < self.RECONCILE_EVERY_S:
            return False
        self._swept_at[kernel] = now
        gone = {k for k, (calls, at) in self._live.items() if calls <= 0 and now - at > self.idle_s}
        if kernel:
            alive = self.established(self.port)
            if alive is not None:
                gone |= {k for k, (calls, _at) in self._live.items() if calls <= 0 and k not in alive}
        for key in gone:
            del self._live[key]
            self.quotas.close(key[0])
        return bool(gone)


class ConnectionLimitInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]
    """Checks each unary call's connection with :class:`GrpcConnections` before its handler runs.

    Installed on the client listener only, and counts the calls of sluice.v1.Broker only: a
    health probe (the kubelet's, the controller's) is never refused. A refused call answers
    RESOURCE_EXHAUSTED with the refusal, which names the key; the client maps it to a retriable
    BrokerNotAvailableError, as a Kafka client takes a connection the broker closed. Wrapped
    handlers are made once per method.
    """

    def __init__(self, connections: GrpcConnections) -> None:
        self.connections = connections
        self._wrapped: dict[int, tuple[Any, Any]] = {}  # id(handler) -> (handler, its wrapped copy)

    async def intercept_service(self, continuation: Any, details: grpc.HandlerCallDetails) -> Any:
        handler: Any = await continuation(details)
        if handler is None or handler.unary_unary is None or not details.method.startswith(COUNTED_SERVICE):
            return handler  # health checks (a probe opens a connection per check) are not counted
        cached = self._wrapped.get(id(handler))
        if cached is not None and cached[0] is handler:
            return cached[1]
        inner = handler.unary_unary
        connections = self.connections

        async def limited(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            peer = context.peer() or ""
            refused = connections.begin(peer)
            if refused is not None:
                await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
            try:
                return await inner(request, context)
            finally:
                connections.end(peer)

        wrapped = handler._replace(unary_unary=limited)  # RpcMethodHandler is a namedtuple
        self._wrapped[id(handler)] = (handler, wrapped)
        return wrapped
