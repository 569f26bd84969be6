"""Broker liveness in Kubernetes: the Pods' readiness, and the operator's own health checks.

:class:`~sluice.operator.liveness.pods.PodLiveness` alone waits for the kubelet: a crashed or hung
broker is NotReady only after its readiness probe failed ``failureThreshold`` times (15 s with the
chart's defaults), then the grace period runs; and a node that is lost (its kubelet gone with it)
reports nothing at all until the node controller marks it NotReady (40 s and more). Kafka's KRaft
controller fences a broker whose heartbeats stop for ``broker.session.timeout.ms`` (9 s), whatever
its host does. This detector adds that: the operator health-checks every registered broker itself
(:class:`~sluice.operator.liveness.brokers.FailureDetector`, the local controller's detector, on the
broker's plaintext health port), and a broker without a SERVING answer for the session timeout is
dead even while its Pod still says Ready. No write is made for it (heartbeats into the API server
would be a write per broker per second).

The verdicts combine so the health checks can only speed a failover up, never start one the Pods
would not have started for a reason of the operator's own:

* **dead** when its Pod says so (NotReady past the grace period, deleted, gone), or when its health
  checks say so, counted only for a broker that answered SERVING since this operator started (a
  broker never reached, e.g. a network policy between the operator and the brokers, is judged by its
  Pod alone) and only while some other broker still answers (an operator cut off from every broker
  is the operator's problem, not theirs: it must not fence the whole cluster);
* **alive** when its Pod is Ready and its health checks do not say dead;
* **unknown** otherwise.

``alive_for`` (the controller hands preferred leaderships back to brokers that stayed up a while)
asks both: Ready that long, and no failed health check for that long (when it is checked).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from sluice.operator.liveness.brokers import ALIVE, DEAD, UNKNOWN, FailureDetector, Transition
from sluice.operator.liveness.pods import PodLiveness

__all__ = ["SessionLiveness", "with_port"]


def with_port(address: str, port: int) -> str:
    """``host:port`` with its port replaced (a bracketed IPv6 host stays as it is)."""
    host, sep, _old = address.rpartition(":")
    return f"{host}:{port}" if sep else f"{address}:{port}"


class SessionTransition(Transition):
    """A liveness change; ``status`` says which of the two sources decided it."""

    def describe(self) -> str:
        if self.status.startswith("broker "):  # the Pod's own description
            return self.status
        return f"broker {self.broker_id} is {self.new}: {self.status}"


class SessionLiveness:
    """Pods and health checks together (see the module docstring); the FailureDetector interface."""

    def __init__(self, pods: PodLiveness, health: FailureDetector, health_port: int | None = None) -> None:
        self.pods = pods
        self.health = health
        self.health_port = health_port  # None: check the registered (gRPC) address
        self._lock = threading.Lock()
        self._states: dict[int, str] = {}
        self._answered: set[int] = set()  # brokers that answered SERVING since this operator started

    def _health_dead(self) -> frozenset[int]:
        """The brokers the health checks may declare dead now (see the module docstring)."""
        dead = self.health.dead & self._answered
        if not self.health.live:
            return frozenset()  # nobody answers: the operator's own connectivity, not the brokers'
        return dead

    def _decide(self, broker_id: int, health_dead: frozenset[int]) -> str:
        pod = self.pods.state(broker_id)
        if pod == DEAD or broker_id in health_dead:
            return DEAD
        return ALIVE if pod == ALIVE else UNKNOWN

    def poll(self, targets: Mapping[int, str]) -> list[Transition]:
        """One round: the Pods' verdicts, one round of health checks, and what changed."""
        pod_changes = {c.broker_id: c for c in self.pods.poll(targets)}
        checked = (
            targets if self.health_port is None else {b: with_port(a, self.health_port) for b, a in targets.items()}
        )
        self.health.poll(checked)
        with self._lock:
            self._answered = (self._answered & set(targets)) | set(self.health.live)
            health_dead = self._health_dead()
            changes: list[Transition] = []
            for gone in set(self._states) - set(targets):
                del self._states[gone]
            for broker_id in targets:
                old = self._states.get(broker_id, UNKNOWN)
                new = self._decide(broker_id, health_dead)
                self._states[broker_id] = new
                if new == old:
                    continue
                pod_state = self.pods.state(broker_id)
                if new == DEAD and broker_id in health_dead and pod_state != DEAD:
                    silent = self._silent(broker_id)
                    reason = f"no successful health check for {silent:.1f} s, while its Pod is {pod_state}"
                else:
                    by_pod = pod_changes.get(broker_id)
                    silent = by_pod.silent_s if by_pod is not None else 0.0
                    reason = by_pod.describe() if by_pod is not None else f"its Pod is {pod_state}"
                changes.append(SessionTransition(broker_id, old, new, reason, silent))
        return changes

    def _silent(self, broker_id: int) -> float:
        h = self.health.brokers.get(broker_id)
        return 0.0 if h is None else self.health.clock() - h.since

    def state(self, broker_id: int) -> str:
        with self._lock:
            return self._states.get(broker_id, UNKNOWN)

    @property
    def live(self) -> frozenset[int]:
        with self._lock:
            return frozenset(b for b, s in self._states.items() if s == ALIVE)

    @property
    def dead(self) -> frozenset[int]:
        with self._lock:
            return frozenset(b for b, s in self._states.items() if s == DEAD)

    def alive_for(self, seconds: float) -> frozenset[int]:
        """Ready that long, and (when its health is checked) no failed check for that long either."""
        by_pods = self.pods.alive_for(seconds)
        with self._lock:
            answered = set(self._answered)
        by_health = self.health.alive_for(seconds)
        return frozenset(b for b in by_pods if b not in answered or b in by_health) & self.live
