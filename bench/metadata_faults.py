"""The simulated brokers' health service, and the faults the operator's health checks must see.

The operator's controller health-checks every registered broker itself (``grpc.health.v1.Health/
Check`` for ``sluice.liveness``, :mod:`sluice.operator.liveness.sessions`): a crash, a hang or a
lost node is dead once no SERVING answer came for the session timeout, whatever the Pod says.
:mod:`bench.metadata_scale` measures that detection at 100 brokers, so each simulated broker
serves the health service as a broker does, and fails the three ways that look different from
the controller's side:

* **crash**: the server stops; the port refuses connections (UNAVAILABLE at once, counted from
  the last SERVING answer);
* **hang** (a SIGSTOPped or wedged process): the server keeps its port and accepts, but no check
  is answered until it resumes (DEADLINE_EXCEEDED after the check's deadline);
* **lost** (a node gone with its kubelet, or cut off): every packet to the port is dropped by an
  iptables rule on loopback, so connections and checks hang until their deadline; its Pod stays
  Ready, since no kubelet is left to say otherwise.

All servers share one asyncio loop on a thread of their own (100 of them cost a few threads, not a
thread pool each). :class:`PortDrops` keeps its rules in a chain of its own (``SLUICE-SIM-<pid>``)
and removes chain and jump on :meth:`PortDrops.close`, so a failed run leaves no rule behind.
Needs root and ``iptables`` (``apt-get install -y iptables``) for ``lost`` only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from sluice.operator.liveness.brokers import LIVENESS_SERVICE

__all__ = ["HealthServers", "PortDrops"]

_TIMEOUT_S = 10.0  # one start or stop of a server, at most


class _Health(health_pb2_grpc.HealthServicer):
    """One broker's health service: SERVING, NOT_SERVING while it shuts down, no answer while hung."""

    def __init__(self, servers: HealthServers, broker_id: int) -> None:
        self.servers = servers
        self.broker_id = broker_id

    async def Check(self, request: Any, context: Any) -> Any:
        resumed = self.servers.hung.get(self.broker_id)
        if resumed is not None:
            await resumed.wait()  # the caller's deadline passes first, as with a stopped process
        if request.service not in ("", LIVENESS_SERVICE):
            await context.abort(grpc.StatusCode.NOT_FOUND, f"unknown service {request.service!r}")
        status = (
            health_pb2.HealthCheckResponse.NOT_SERVING
            if self.broker_id in self.servers.shutting_down
            else health_pb2.HealthCheckResponse.SERVING
        )
        return health_pb2.HealthCheckResponse(status=status)


class HealthServers:
    """Every simulated broker's health server, on 127.0.0.1, one event loop for all (module docstring)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="sim-health", daemon=True)
        self.thread.start()
        self.servers: dict[int, grpc.aio.Server] = {}
        self.ports: dict[int, int] = {}  # kept across a restart: the broker registers the same address
        self.hung: dict[int, asyncio.Event] = {}
        self.shutting_down: set[int] = set()

    def _run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(_TIMEOUT_S)

    def start(self, broker_id: int) -> int:
        """Serve ``broker_id``'s health service (again, on its port if it had one); returns the port."""
        return int(self._run(self._start(broker_id)))

    async def _start(self, broker_id: int) -> int:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(_Health(self, broker_id), server)
        port = server.add_insecure_port(f"127.0.0.1:{self.ports.get(broker_id, 0)}")
        if port == 0:
            raise RuntimeError(f"broker {broker_id}'s health server could not bind its port")
        await server.start()
        self.servers[broker_id], self.ports[broker_id] = server, port
        self.shutting_down.discard(broker_id)
        return port

    def address(self, broker_id: int) -> str:
        return f"127.0.0.1:{self.ports[broker_id]}"

    def crash(self, broker_id: int) -> None:
        """Stop the server: its port refuses connections."""
        server = self.servers.pop(broker_id, None)
        if server is not None:
            self._run(server.stop(None))

    def hang(self, broker_id: int) -> None:
        """Checks are accepted and never answered until :meth:`resume`."""
        self.loop.call_soon_threadsafe(self.hung.setdefault, broker_id, asyncio.Event())

    def resume(self, broker_id: int) -> None:
        def wake() -> None:
            event = self.hung.pop(broker_id, None)
            if event is not None:
                event.set()

        self.loop.call_soon_threadsafe(wake)

    def shut_down(self, broker_id: int) -> None:
        """Answer NOT_SERVING, as a broker in controlled shutdown does, then stop."""
        self.shutting_down.add(broker_id)

    def close(self) -> None:
        for broker_id in list(self.servers):
            self.resume(broker_id)
            with contextlib.suppress(Exception):
                self.crash(broker_id)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(_TIMEOUT_S)


class PortDrops:
    """iptables DROP rules for TCP to given loopback ports: a lost node, as the controller sees it."""

    def __init__(self) -> None:
        self.chain = f"SLUICE-SIM-{os.getpid()}"
        self.jump = ["OUTPUT", "-o", "lo", "-p", "tcp", "-j", self.chain]
        self.installed = False

    @staticmethod
    def available() -> str | None:
        """Why drops cannot be made here, or None."""
        if shutil.which("iptables") is None:
            return "iptables is not installed (apt-get install -y iptables)"
        if os.geteuid() != 0:
            return "iptables rules need root"
        return None

    def _iptables(self, *args: str, check: bool = True) -> None:
        subprocess.run(["iptables", "-w", *args], check=check, capture_output=True, timeout=30)

    def drop(self, port: int) -> None:
        if not self.installed:
            self._iptables("-N", self.chain)
            self.installed = True  # (close() removes the chain even if the jump fails)
            self._iptables("-I", *self.jump)
        self._iptables("-A", self.chain, "-p", "tcp", "--dport", str(port), "-j", "DROP")

    def heal(self, port: int) -> None:
        if self.installed:
            self._iptables("-D", self.chain, "-p", "tcp", "--dport", str(port), "-j", "DROP", check=False)

    def close(self) -> None:
        if not self.installed:
            return
        self._iptables("-F", self.chain, check=False)
        self._iptables("-D", *self.jump, check=False)
        self._iptables("-X", self.chain, check=False)
        self.installed = False
