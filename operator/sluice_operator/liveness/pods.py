"""Which brokers are alive in Kubernetes: from their Pods, with a grace period.

The operator's stand-in for :class:`sluice.operator.liveness.brokers.FailureDetector`
(same interface: ``observe``/``poll`` return :class:`Transition` lists,
``live``/``dead`` sets), fed by a watch on the broker Pods instead of by
health checks of its own: the kubelet already checks each broker with the
gRPC health probe, and the Pod's ``Ready`` condition is its verdict.

A broker (the pod's StatefulSet ordinal is the broker id) is:

* ``alive`` when its Pod is Ready and not being deleted;
* ``unknown`` while its Pod is NotReady for less than the grace period
  (``grace_s``: a readiness blip, a slow probe) or before its Pod was seen;
* ``dead`` when its Pod has been NotReady for the grace period, or is being
  deleted or gone (deleted Pods are dead at once: the process is being
  stopped, waiting would only lengthen the outage), or when a registered
  broker has had no Pod for the grace period.

NotReady time is counted from when the operator first saw the Pod NotReady
(on its own monotonic clock, never the Pod's timestamps, so clock skew
between nodes and the operator cannot kill a broker early); an operator
that restarts counts again from its start, which is the safe direction.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sluice.operator.liveness.brokers import ALIVE, DEAD, UNKNOWN, Transition
from sluice.operator.resources import pod_ordinal

DEFAULT_GRACE_S = 10.0


class PodTransition(Transition):
    """A liveness change, told in terms of Pods."""

    def describe(self) -> str:
        if self.new == DEAD:
            return f"broker {self.broker_id} is dead: its pod is not ready ({self.status}) for {self.silent_s:.1f} s"
        return super().describe()


@dataclass
class PodState:
    name: str
    ready: bool
    deleting: bool
    ip: str = ""


def pod_state(pod: Mapping[str, Any]) -> PodState:
    """Readiness of a Pod object (a dict as the API returns it)."""
    meta = pod.get("metadata") or {}
    conditions = (pod.get("status") or {}).get("conditions") or []
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
    return PodState(
        str(meta.get("name", "")),
        ready,
        bool(meta.get("deletionTimestamp")),
        str((pod.get("status") or {}).get("podIP") or ""),
    )


class PodLiveness:
    """Broker liveness from Pod events (see the module docstring). Thread-safe."""

    def __init__(self, grace_s: float = DEFAULT_GRACE_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace_s = grace_s
        self.clock = clock
        self._lock = threading.Lock()
        self._pods: dict[int, PodState] = {}
        self._not_ready_since: dict[int, float] = {}
        self._missing_since: dict[int, float] = {}
        self._states: dict[int, str] = {}
        self._silent_since: dict[int, float] = {}
        self._alive_since: dict[int, float] = {}
        self.started = clock()

    # -- feeding ----------------------------------------------------------------------------------

    def pod_event(self, kind: str, pod: Mapping[str, Any]) -> int | None:
        """Apply one watch event (ADDED, MODIFIED, DELETED, or None for a listed pod); returns the broker id."""
        state = pod_state(pod)
        broker_id = pod_ordinal(state.name)
        if broker_id is None:
            return None
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(broker_id, None)
                self._not_ready_since.pop(broker_id, None)
                self._missing_since[broker_id] = self.clock() - self.grace_s  # gone: dead at once
            else:
                self._pods[broker_id] = state
                self._missing_since.pop(broker_id, None)
                if state.ready:
                    self._not_ready_since.pop(broker_id, None)
                else:
                    self._not_ready_since.setdefault(broker_id, self.clock())
        return broker_id

    def pods(self) -> dict[int, PodState]:
        with self._lock:
            return dict(self._pods)

    # -- deciding (the FailureDetector interface) -------------------------------------------------

    def _decide(self, broker_id: int, now: float) -> str:
        pod = self._pods.get(broker_id)
        if pod is None:
            since = self._missing_since.setdefault(broker_id, max(self.started, now))
            return DEAD if now - since >= self.grace_s else UNKNOWN
        if pod.deleting:
            return DEAD
        if pod.ready:
            return ALIVE
        since = self._not_ready_since.get(broker_id, now)
        return DEAD if now - since >= self.grace_s else UNKNOWN

    def poll(self, targets: Mapping[int, str]) -> list[Transition]:
        """One round over the registered brokers (id -> address): their states now, and what changed."""
        now = self.clock()
        changes: list[Transition] = []
        with self._lock:
            for gone in set(self._states) - set(targets):
                del self._states[gone]
            for broker_id in targets:
                old = self._states.get(broker_id, UNKNOWN)
                new = self._decide(broker_id, now)
                if new == ALIVE:
                    self._silent_since[broker_id] = now
                    if old != ALIVE:
                        self._alive_since[broker_id] = now
                self._states[broker_id] = new
                if new != old:
                    pod = self._pods.get(broker_id)
                    status = "gone" if pod is None else ("deleting" if pod.deleting else f"Ready={pod.ready}")
                    silent = now - self._silent_since.get(broker_id, self.started)
                    changes.append(PodTransition(broker_id, old, new, status, silent))
        return changes

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
        """Brokers alive without a break for at least ``seconds`` (for preferred-leader restoration)."""
        now = self.clock()
        with self._lock:
            return frozenset(
                b for b, s in self._states.items() if s == ALIVE and now - self._alive_since.get(b, now) >= seconds
            )
