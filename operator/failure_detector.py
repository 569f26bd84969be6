"""Which brokers are alive: health checks with a timeout, for the local controller.

Each round the controller asks every registered broker the standard
``grpc.health.v1.Health/Check`` for the service ``sluice.liveness`` (set by
the broker as soon as it serves, independent of readiness: a broker that is
loading coordinator partitions is alive, not ready). The checks of one
round run concurrently, each with its own deadline, so one paused broker
costs a round at most one deadline, not one per broker.

A broker's state follows its answers:

* ``unknown``: registered but not yet answered since the detector first saw
  it (a broker starting up, or every broker right after the controller
  starts). Neither elected nor replaced: see :mod:`sluice.operator.controller`.
* ``alive``: its last check succeeded. One success is enough to come back,
  as in Kafka, where one heartbeat unfences a broker.
* ``dead``: no check has succeeded for ``timeout_ms`` (counted from its last
  success, or from when it was first seen) *and* at least two checks in a
  row failed. The second condition keeps a stall of the controller itself
  (a long pause, a slow disk under SQLite) from declaring every broker dead
  on one late check: each broker must fail a fresh check after the stall.

Why health checks and not broker heartbeats into the metadata store: a
heartbeat is a write every interval per broker into a store every broker
polls, and in Kubernetes it would be an API-server write per second per
pod. Checking from the controller costs no write, and what it checks (the
broker's gRPC server answers) is what clients need. A SIGSTOPped broker
accepts TCP connections (the kernel does that) but answers nothing, so its
checks run into their deadline and it is declared dead, as it must be.

The checker and the clock are injectable: unit tests drive the detector with
a dict of answers and a fake clock.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

LIVENESS_SERVICE = "sluice.liveness"  # the broker's liveness service (broker/main.py)
SERVING = "SERVING"
DEFAULT_TIMEOUT_MS = 5000

# broker id -> address in, broker id -> "SERVING" or what went wrong ("UNAVAILABLE", "DEADLINE_EXCEEDED" ...) out
Checker = Callable[[Mapping[int, str]], Mapping[int, str]]

UNKNOWN = "unknown"
ALIVE = "alive"
DEAD = "dead"


def default_check_deadline_ms(timeout_ms: int) -> int:
    """A check's deadline: a quarter of the failure timeout, within [100 ms, 1 s].

    Short enough that a few checks fit in the timeout (so one slow answer is
    not a death sentence), long enough for a busy broker on a loaded machine.
    """
    return max(100, min(1000, timeout_ms // 4))


class GrpcHealthChecker:
    """Concurrent ``Health/Check`` calls with a deadline; one kept channel per broker.

    A channel whose check failed is closed and the next check opens a new
    one: a gRPC channel that failed to connect backs off before trying again,
    which would keep a restarted broker "dead" for longer than it is.
    """

    def __init__(self, deadline_ms: int, service: str = LIVENESS_SERVICE) -> None:
        self.deadline_s = deadline_ms / 1000
        self.service = service
        self._channels: dict[int, tuple[str, grpc.Channel]] = {}

    def _stub(self, broker_id: int, address: str) -> health_pb2_grpc.HealthStub:
        known = self._channels.get(broker_id)
        if known is not None and known[0] != address:
            known[1].close()
            known = None
        if known is None:
            channel = grpc.insecure_channel(
                address,
                options=[("grpc.enable_http_proxy", 0), ("grpc.max_reconnect_backoff_ms", 500)],
            )
            known = (address, channel)
            self._channels[broker_id] = known
        return health_pb2_grpc.HealthStub(known[1])

    def _drop(self, broker_id: int) -> None:
        known = self._channels.pop(broker_id, None)
        if known is not None:
            known[1].close()

    def __call__(self, targets: Mapping[int, str]) -> dict[int, str]:
        for gone in set(self._channels) - set(targets):
            self._drop(gone)
        request = health_pb2.HealthCheckRequest(service=self.service)
        pending: dict[int, Any] = {}
        out: dict[int, str] = {}
        for broker_id, address in targets.items():
            try:
                pending[broker_id] = self._stub(broker_id, address).Check.future(request, timeout=self.deadline_s)
            except Exception as exc:  # a malformed address, a closed channel
                out[broker_id] = f"ERROR {exc}"
        for broker_id, future in pending.items():
            try:
                response = future.result()
                out[broker_id] = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
            except grpc.RpcError as exc:
                code = exc.code() if isinstance(exc, grpc.Call) else None
                out[broker_id] = code.name if code is not None else "ERROR"
        for broker_id, status in out.items():
            if status != SERVING:
                self._drop(broker_id)
        return out

    def close(self) -> None:
        for broker_id in list(self._channels):
            self._drop(broker_id)


@dataclass
class BrokerHealth:
    state: str  # unknown | alive | dead
    since: float  # clock time of the last success (or of first sight, before any success)
    failures: int = 0  # consecutive failed checks
    last_status: str = ""


@dataclass(frozen=True)
class Transition:
    broker_id: int
    old: str
    new: str
    status: str  # the check answer that caused it
    silent_s: float  # seconds without a successful check, when it died

    def describe(self) -> str:
        if self.new == DEAD:
            return (
                f"broker {self.broker_id} is dead: no successful health check for {self.silent_s:.1f} s "
                f"(last answer: {self.status})"
            )
        if self.new == ALIVE:
            return f"broker {self.broker_id} is alive" + (" again" if self.old == DEAD else "")
        return f"broker {self.broker_id} is {self.new}"


class FailureDetector:
    """Liveness of registered brokers from repeated health checks (see the module docstring)."""

    def __init__(
        self,
        checker: Checker,
        timeout_ms: int = DEFAULT_TIMEOUT_MS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if timeout_ms <= 0:
            raise ValueError(f"timeout_ms must be positive, not {timeout_ms}")
        self.checker = checker
        self.timeout_s = timeout_ms / 1000
        self.clock = clock
        self.brokers: dict[int, BrokerHealth] = {}

    def poll(self, targets: Mapping[int, str]) -> list[Transition]:
        """Check every broker in ``targets`` (id -> address) once; returns the state changes."""
        started = self.clock()
        answers = self.checker(targets) if targets else {}
        return self.observe({b: answers.get(b, "NO_ANSWER") for b in targets}, started)

    def observe(self, answers: Mapping[int, str], checked_at: float | None = None) -> list[Transition]:
        """Record one round of answers (``SERVING`` = success) taken at ``checked_at``.

        Brokers missing from ``answers`` are forgotten (they were deregistered).
        """
        now = self.clock()
        at = now if checked_at is None else checked_at
        for gone in set(self.brokers) - set(answers):
            del self.brokers[gone]
        changes: list[Transition] = []
        for broker_id, status in answers.items():
            h = self.brokers.get(broker_id)
            if h is None:
                h = self.brokers[broker_id] = BrokerHealth(UNKNOWN, at)
            old = h.state
            h.last_status = status
            if status == SERVING:
                h.state, h.since, h.failures = ALIVE, at, 0
            else:
                h.failures += 1
                if h.state != DEAD and h.failures >= 2 and now - h.since >= self.timeout_s:
                    h.state = DEAD
            if h.state != old:
                changes.append(Transition(broker_id, old, h.state, status, now - h.since))
        return changes

    def state(self, broker_id: int) -> str:
        h = self.brokers.get(broker_id)
        return UNKNOWN if h is None else h.state

    @property
    def live(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == ALIVE)

    @property
    def dead(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == DEAD)

    @property
    def unknown(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == UNKNOWN)
