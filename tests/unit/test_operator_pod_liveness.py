"""Broker liveness from Pods (sluice.operator.liveness.pods), with a fake clock."""

from __future__ import annotations

from typing import Any

from sluice.operator.liveness.brokers import ALIVE, DEAD, UNKNOWN
from sluice.operator.liveness.pods import PodLiveness


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def pod(name: str, ready: bool, deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {
        "metadata": meta,
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


TARGETS = {0: "a:1", 1: "b:1", 2: "c:1"}


def test_ready_pods_are_alive_and_not_ready_ones_die_after_the_grace_period() -> None:
    clock = Clock()
    live = PodLiveness(grace_s=5, clock=clock)
    for i in range(3):
        assert live.pod_event("ADDED", pod(f"sluice-broker-{i}", True)) == i
    changes = live.poll(TARGETS)
    assert {c.broker_id: c.new for c in changes} == {0: ALIVE, 1: ALIVE, 2: ALIVE}
    assert live.live == {0, 1, 2} and live.dead == frozenset()
    live.pod_event("MODIFIED", pod("sluice-broker-1", False))
    clock.t += 4.9
    changes = live.poll(TARGETS)
    assert [(c.broker_id, c.new) for c in changes] == [(1, UNKNOWN)]  # within the grace period: neither
    assert live.live == {0, 2} and live.dead == frozenset()
    clock.t += 0.2
    changes = live.poll(TARGETS)
    assert [(c.broker_id, c.old, c.new) for c in changes] == [(1, UNKNOWN, DEAD)]
    assert live.dead == {1}
    # Ready again: alive at once.
    live.pod_event("MODIFIED", pod("sluice-broker-1", True))
    assert [(c.broker_id, c.new) for c in live.poll(TARGETS)] == [(1, ALIVE)]
    assert live.live == {0, 1, 2}


def test_a_readiness_blip_shorter_than_the_grace_period_changes_nothing_lasting() -> None:
    clock = Clock()
    live = PodLiveness(grace_s=5, clock=clock)
    live.pod_event("ADDED", pod("sluice-broker-0", True))
    live.poll({0: "a"})
    live.pod_event("MODIFIED", pod("sluice-broker-0", False))
    clock.t += 3
    live.poll({0: "a"})
    live.pod_event("MODIFIED", pod("sluice-broker-0", True))
    live.poll({0: "a"})
    live.pod_event("MODIFIED", pod("sluice-broker-0", False))  # the count starts again
    clock.t += 3
    live.poll({0: "a"})
    assert live.dead == frozenset()


def test_deleted_and_deleting_pods_are_dead_at_once() -> None:
    clock = Clock()
    live = PodLiveness(grace_s=30, clock=clock)
    for i in range(3):
        live.pod_event("ADDED", pod(f"sluice-broker-{i}", True))
    live.poll(TARGETS)
    live.pod_event("MODIFIED", pod("sluice-broker-0", True, deleting=True))
    live.pod_event("DELETED", pod("sluice-broker-2", True))
    assert {(c.broker_id, c.new) for c in live.poll(TARGETS)} == {(0, DEAD), (2, DEAD)}
    # The StatefulSet recreates the pod; it is alive once Ready.
    live.pod_event("ADDED", pod("sluice-broker-2", False))
    assert live.poll(TARGETS) == [] or live.state(2) != ALIVE
    live.pod_event("MODIFIED", pod("sluice-broker-2", True))
    assert (2, ALIVE) in {(c.broker_id, c.new) for c in live.poll(TARGETS)}


def test_a_registered_broker_without_a_pod_dies_after_the_grace_period() -> None:
    clock = Clock()
    live = PodLiveness(grace_s=5, clock=clock)
    live.pod_event("ADDED", pod("sluice-broker-0", True))
    live.poll({0: "a", 7: "b"})
    assert live.state(7) == UNKNOWN
    clock.t += 5
    live.poll({0: "a", 7: "b"})
    assert live.dead == {7} and live.live == {0}


def test_pods_without_an_ordinal_are_ignored() -> None:
    live = PodLiveness(grace_s=5, clock=Clock())
    assert live.pod_event("ADDED", pod("operator", True)) is None
    assert live.pods() == {}


def test_alive_for_counts_from_the_last_return() -> None:
    """Preferred leaders go back only to brokers Ready without a break for the delay."""
    clock = Clock()
    live = PodLiveness(grace_s=1, clock=clock)
    live.pod_event("ADDED", pod("sluice-broker-0", True))
    live.poll({0: "a"})
    clock.t += 5
    live.poll({0: "a"})
    assert live.alive_for(5) == {0}
    live.pod_event("MODIFIED", pod("sluice-broker-0", False))
    clock.t += 2
    live.poll({0: "a"})
    assert live.dead == {0} and live.alive_for(0) == frozenset()
    live.pod_event("MODIFIED", pod("sluice-broker-0", True))
    live.poll({0: "a"})
    clock.t += 3
    live.poll({0: "a"})
    assert live.alive_for(3) == {0} and live.alive_for(4) == frozenset()
