"""Which brokers are alive: health checks with a timeout, for the local controller.

The controller asks every registered broker the standard
``grpc.health.v1.Health/Check`` for the service ``sluice.liveness`` (set by
the broker as soon as it serves, independent of readiness: a broker that is
loading coordinator partitions is alive, not ready).

Checks are asynchronous: each round collects the answers that arrived and
sends a new check to every broker that has none in flight and was last sent
one at least an interval ago (0.5 s, or a fifth of the check deadline if
that is shorter; Kafka's brokers heartbeat every 2 s). A check every
controller round would be ten a second per broker: 1,000 calls a second from
the operator at 100 brokers, for no earlier verdict, since death is counted
from the last SERVING answer (a broker's NOT_SERVING at its controlled
shutdown is seen up to one interval later). A check may take up to the
whole failure timeout. So a broker that is slow but answering (a busy event
loop on a loaded machine answers in 300 ms, not 3 ms) is alive,
a paused broker costs no other broker's detection any time, and a stall of
the controller itself does not kill anyone: the answers that arrived
meanwhile (gRPC's threads receive them) are counted before anything is
declared dead.

A broker's state follows its answers:

* ``unknown``: registered but not yet answered since the detector first saw
  it (a broker starting up, or every broker right after the controller
  starts). Neither elected nor replaced: see :mod:`sluice.operator.controller.decisions`.
* ``alive``: it answered ``SERVING``. One answer is enough to come back, as
  in Kafka, where one heartbeat unfences a broker.
* ``dead``: no ``SERVING`` answer has arrived for ``timeout_ms`` (counted
  from its last one, or from when it was first seen), whether its checks
  failed (connection refused: the process is gone) or are still waiting (a
  SIGSTOPped process: the kernel accepts the connection, nobody answers).
  Or at once, when the broker answers ``NOT_SERVING``: that is a broker
  saying it is shutting down (Kafka's controlled shutdown, see
  ``broker/sluice_broker/main.py``), so there is nothing to wait for and its partitions
  move before it stops instead of a timeout after.

``alive_for(seconds)`` gives the brokers alive without a failed check for at least
that long: the controller restores a returning broker's preferred
leaderships only once it has stayed up a while, so a broker that flaps does
not drag leadership back and forth.

Why health checks and not broker heartbeats into the metadata store: a
heartbeat is a write every interval per broker into a store every broker
polls, and in Kubernetes it would be an API-server write per second per
pod. Checking from the controller costs no write, and what it checks (the
broker's gRPC server answers) is what clients need.

The checker and the clock are injectable: unit tests drive the detector with
a dict of answers and a fake clock.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

log = logging.getLogger(__name__)

LIVENESS_SERVICE = "sluice.liveness"  # the broker's liveness service (broker/sluice_broker/main.py)
SERVING = "SERVING"
SHUTTING_DOWN = "NOT_SERVING"  # what a broker in controlled shutdown answers
DEFAULT_TIMEOUT_MS = 5000
DEFAULT_CHECK_INTERVAL_MS = 500  # at most one check per broker this often (module docstring)

# Called once per round with every broker to check (id -> address); returns the answers that
# arrived since the last call: "SERVING", or what went wrong ("UNAVAILABLE", "DEADLINE_EXCEEDED",
# "NOT_SERVING" ...). A broker missing from the answer has a check still in flight.
Checker = Callable[[Mapping[int, str]], Mapping[int, str]]

UNKNOWN = "unknown"
ALIVE = "alive"
DEAD = "dead"


class GrpcHealthChecker:
    """Asynchronous ``Health/Check`` calls, at most one in flight per broker, each with a deadline.

    One channel is kept per broker while it answers. A channel whose check
    failed is closed and the next check opens a new one: a gRPC channel that
    failed to connect backs off before trying again, which would keep a
    restarted broker "dead" for longer than it is.
    """

    def __init__(
        self,
        deadline_ms: int,
        service: str = LIVENESS_SERVICE,
        credentials: grpc.ChannelCredentials | None = None,
        interval_ms: float | None = None,
    ) -> None:
        self.deadline_s = deadline_ms / 1000
        # a new check per broker at most this often (module docstring)
        interval = min(DEFAULT_CHECK_INTERVAL_MS, deadline_ms / 5) if interval_ms is None else interval_ms
        self.interval_s = interval / 1000
        self._last_sent: dict[int, float] = {}
        self.service = service
        self.credentials = credentials  # TLS (with the controller's certificate) to brokers that require it
        # broker id -> (address, channel, stub): made once per address, not per round
        self._channels: dict[int, tuple[str, grpc.Channel, health_pb2_grpc.HealthStub]] = {}
        self._in_flight: dict[int, tuple[Any, float]] = {}  # broker id -> (future, sent at)

    def _stub(self, broker_id: int, address: str) -> health_pb2_grpc.HealthStub:
        known = self._channels.get(broker_id)
        if known is not None and known[0] != address:
            self._drop(broker_id)
            known = None
        if known is None:
            options = [("grpc.enable_http_proxy", 0), ("grpc.max_reconnect_backoff_ms", 500)]
            channel = (
                grpc.insecure_channel(address, options=options)
                if self.credentials is None
                else grpc.secure_channel(address, self.credentials, options=options)
            )
            known = (address, channel, health_pb2_grpc.HealthStub(channel))
            self._channels[broker_id] = known
        return known[2]

    def _drop(self, broker_id: int) -> None:
        flight = self._in_flight.pop(broker_id, None)
        if flight is not None:
            flight[0].cancel()
        known = self._channels.pop(broker_id, None)
        if known is not None:
            known[1].close()

    def _answer(self, broker_id: int, future: Any, sent: float) -> str:
        try:
            response = future.result(timeout=0)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            return code.name if code is not None else "ERROR"
        except Exception as exc:  # cancelled, or anything else the call raised
            return f"ERROR {type(exc).__name__}"
        status = str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))
        took = time.monotonic() - sent
        if took > self.deadline_s / 2:
            log.warning("broker %d answered its health check after %.0f ms", broker_id, took * 1000)
        return status

    def __call__(self, targets: Mapping[int, str]) -> dict[int, str]:
        for gone in (set(self._channels) | set(self._last_sent)) - set(targets):
            self._drop(gone)
            self._last_sent.pop(gone, None)
        out: dict[int, str] = {}
        for broker_id, (future, sent) in list(self._in_flight.items()):
            if future.done():
                del self._in_flight[broker_id]
                out[broker_id] = self._answer(broker_id, future, sent)
        for broker_id, status in out.items():
            if status != SERVING:
                self._drop(broker_id)
        request = health_pb2.HealthCheckRequest(service=self.service)
        now = time.monotonic()
        for broker_id, address in targets.items():
            known = self._channels.get(broker_id)
            if known is not None and known[0] != address:
                # registered at a new address: the check in flight went to the old one, and waiting for its
                # deadline would keep a broker that moved "dead" that long
                self._drop(broker_id)
                self._last_sent.pop(broker_id, None)
            if broker_id in self._in_flight or now - self._last_sent.get(broker_id, -math.inf) < self.interval_s:
                continue
            self._last_sent[broker_id] = now
            try:
                future = self._stub(broker_id, address).Check.future(request, timeout=self.deadline_s)
            except Exception as exc:  # a malformed address, a closed channel
                self._drop(broker_id)
                out.setdefault(broker_id, f"ERROR {exc}")
                continue
            self._in_flight[broker_id] = (future, time.monotonic())
        return out

    def close(self) -> None:
        for broker_id in list(self._channels) + list(self._in_flight):
            self._drop(broker_id)


PENDING = "PENDING"  # no answer yet: the check is still in flight


@dataclass
class BrokerHealth:
    state: str  # unknown | alive | dead
    since: float  # clock time of the last SERVING answer (or of first sight, before any)
    last_status: str = PENDING  # the last answer, or PENDING
    alive_since: float = 0.0  # clock time it last became alive, or answered again after a failed check
    interrupted: bool = False  # a check failed since alive_since


@dataclass(frozen=True)
class Transition:
    broker_id: int
    old: str
    new: str
    status: str  # the last answer when it changed
    silent_s: float  # seconds without a SERVING answer, when it died

    def describe(self) -> str:
        if self.new == DEAD and self.status == SHUTTING_DOWN:
            return f"broker {self.broker_id} is shutting down (controlled shutdown): its partitions move now"
        if self.new == DEAD:
            last = "none yet, a check is waiting" if self.status == PENDING else self.status
            return (
                f"broker {self.broker_id} is dead: no successful health check for {self.silent_s:.1f} s "
                f"(last answer: {last})"
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
        """One round over ``targets`` (id -> address): collect answers, decide; returns the state changes.

        Brokers no longer in ``targets`` are forgotten (they were deregistered).
        """
        answers = self.checker(targets) if targets else {}
        return self.observe({b: answers.get(b, PENDING) for b in targets})

    def observe(self, answers: Mapping[int, str]) -> list[Transition]:
        """Record one round: per broker ``SERVING``, a failure, or ``PENDING`` (no news).

        Answers are counted before deaths are decided, so an answer that
        arrived while the controller was stalled keeps its broker alive.
        """
        now = self.clock()
        for gone in set(self.brokers) - set(answers):
            del self.brokers[gone]
        changes: list[Transition] = []
        for broker_id, status in answers.items():
            h = self.brokers.get(broker_id)
            if h is None:
                h = self.brokers[broker_id] = BrokerHealth(UNKNOWN, now)
            old = h.state
            if status != PENDING:
                h.last_status = status
            if status == SERVING:
                if h.state != ALIVE or h.interrupted:
                    h.alive_since, h.interrupted = now, False
                h.state, h.since = ALIVE, now
            else:
                if status != PENDING:
                    h.interrupted = True  # a failed check breaks "alive for a while" without killing it yet
                if h.state != DEAD and (status == SHUTTING_DOWN or now - h.since >= self.timeout_s):
                    h.state = DEAD
            if h.state != old:
                changes.append(Transition(broker_id, old, h.state, h.last_status, now - h.since))
        return changes

    def state(self, broker_id: int) -> str:
        h = self.brokers.get(broker_id)
        return UNKNOWN if h is None else h.state

    @property
    def live(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == ALIVE)

    def alive_for(self, seconds: float) -> frozenset[int]:
        """Brokers alive without a break for at least ``seconds``."""
        now = self.clock()
        return frozenset(b for b, h in self.brokers.items() if h.state == ALIVE and now - h.alive_since >= seconds)

    @property
    def dead(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == DEAD)

    @property
    def unknown(self) -> frozenset[int]:
        return frozenset(b for b, h in self.brokers.items() if h.state == UNKNOWN)
