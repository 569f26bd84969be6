"""Ports and health probes for local brokers.

Ports are picked below the kernel's ephemeral range (``ip_local_port_range``,
32768-60999 by default), at random, among those free now: a port from that
range (what binding port 0 gives) may meanwhile become the source port of any
outgoing connection on the machine, a client's or another test's, and the
broker then fails to bind it. The port is released and handed to the broker; a
port handed out once is never handed out again by this process, so two
clusters of one test run never collide even though the probe socket is closed
before the broker binds. Without a range to read (not Linux), port 0 it is.

Health is the standard ``grpc.health.v1.Health/Check`` with service "" (the
whole broker), the same probe Kubernetes uses for readiness. Each probe uses a
fresh channel: a channel that failed to connect backs off for up to minutes
before trying again, which would make a wait loop far slower than the broker.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from collections.abc import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice import tls

SERVING = "SERVING"
UNREACHABLE = "UNREACHABLE"

# Loopback only: never let an http_proxy variable route a probe elsewhere.
CHANNEL_OPTIONS = [("grpc.enable_http_proxy", 0)]

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


LISTEN_PORTS_FROM = 10_000  # the lowest port handed out (below: well-known and registered services)
_random = random.SystemRandom()


def _listen_port_range() -> range | None:
    """Ports below the ephemeral range, or None when there is no such range to read or it leaves too few."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return range(LISTEN_PORTS_FROM, low) if low - LISTEN_PORTS_FROM >= 1000 else None


def free_port(host: str = "127.0.0.1", attempts: int = 64) -> int:
    """A port that is free on ``host`` now and that this process has not handed out before."""
    ports = _listen_port_range()
    with _ports_lock:
        for _ in range(attempts):
            if ports is not None:
                port = _random.choice(ports)
                if port in _handed_out or not port_is_free(host, port):
                    continue
            else:
                with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
                    s.bind((host, 0))
                    port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise RuntimeError(f"no free port found on {host} after {attempts} attempts")


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now.

    SO_REUSEADDR as gRPC servers set it: connections of a killed broker left in
    TIME_WAIT do not keep its port from being reused, only a listener does.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


_BROKER_NAME = ("grpc.ssl_target_name_override", tls.BROKER_SERVER_NAME)


def check_health(address: str, timeout: float = 1.0, credentials: grpc.ChannelCredentials | None = None) -> str:
    """The broker's overall health status name (``SERVING``, ``NOT_SERVING`` ...) or ``UNREACHABLE``.

    ``credentials``: TLS to a client listener that requires it (a secure LocalCluster).
    """
    try:
        channel = (
            grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
            if credentials is None
            # brokers are reached by address: their certificates' common server name is checked
            else grpc.secure_channel(address, credentials, options=[*CHANNEL_OPTIONS, _BROKER_NAME])
        )
        with channel:
            stub = health_pb2_grpc.HealthStub(channel)
            resp = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
    except grpc.RpcError:
        return UNREACHABLE
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(resp.status))


def poll_until(
    predicate: Callable[[], bool],
    timeout: float,
    interval: float = 0.1,
    max_interval: float = 0.5,
) -> bool:
    """Call ``predicate`` until it is true or ``timeout`` s have passed; bounded in time and count.

    The interval grows by half each round up to ``max_interval``.
    """
    deadline = time.monotonic() + timeout
    max_rounds = int(timeout / max(interval, 0.001)) + 2
    for _ in range(max_rounds):
        if predicate():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        time.sleep(min(interval, left))
        interval = min(interval * 1.5, max_interval)
    return predicate()
