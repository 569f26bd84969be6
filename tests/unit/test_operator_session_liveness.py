"""Broker liveness in Kubernetes from Pods and the operator's own health checks together
(sluice.operator.liveness.sessions), with a fake clock and scripted health answers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sluice.operator.liveness.brokers import ALIVE, DEAD, UNKNOWN, FailureDetector
from sluice.operator.liveness.pods import PodLiveness
from sluice.operator.liveness.sessions import SessionLiveness, with_port

TARGETS = {0: "sluice-broker-0.sluice:9092", 1: "sluice-broker-1.sluice:9092", 2: "sluice-broker-2.sluice:9092"}


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Answers:
    """The health checker: answers per broker id, the addresses it was asked to check."""

    def __init__(self) -> None:
        self.now: dict[int, str] = {}
        self.asked: list[dict[int, str]] = []

    def __call__(self, targets: Mapping[int, str]) -> dict[int, str]:
        self.asked.append(dict(targets))
        return {b: self.now[b] for b in targets if b in self.now}


def pod(i: int, ready: bool) -> dict[str, Any]:
    return {
        "metadata": {"name": f"sluice-broker-{i}"},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def setup(timeout_s: float = 9.0) -> tuple[Clock, Answers, SessionLiveness]:
    clock, answers = Clock(), Answers()
    pods = PodLiveness(grace_s=10, clock=clock)
    for i in TARGETS:
        pods.pod_event("ADDED", pod(i, True))
    health = FailureDetector(answers, int(timeout_s * 1000), clock=clock)
    return clock, answers, SessionLiveness(pods, health, health_port=9094)


def test_a_hung_broker_whose_pod_is_still_ready_is_dead_after_the_session_timeout() -> None:
    clock, answers, live = setup()
    answers.now = {0: "SERVING", 1: "SERVING", 2: "SERVING"}
    assert {c.broker_id: c.new for c in live.poll(TARGETS)} == {0: ALIVE, 1: ALIVE, 2: ALIVE}
    assert answers.asked[-1] == {i: a.replace(":9092", ":9094") for i, a in TARGETS.items()}  # the health port
    del answers.now[1]  # SIGSTOPped: its check waits, nothing comes back; the kubelet has not noticed yet
    clock.t += 8.9
    assert live.poll(TARGETS) == [] and live.live == {0, 1, 2}
    clock.t += 0.2
    changes = live.poll(TARGETS)
    assert [(c.broker_id, c.old, c.new) for c in changes] == [(1, ALIVE, DEAD)]
    assert "no successful health check for 9.1 s, while its Pod is alive" in changes[0].describe()
    assert live.dead == {1} and live.live == {0, 2}
    # It answers again (SIGCONT): alive at once, but not "alive for a while" yet.
    answers.now[1] = "SERVING"
    assert [(c.broker_id, c.new) for c in live.poll(TARGETS)] == [(1, ALIVE)]
    assert live.alive_for(5) == {0, 2}
    clock.t += 5
    live.poll(TARGETS)
    assert live.alive_for(5) == {0, 1, 2}


def test_a_broker_never_reached_is_judged_by_its_pod_alone() -> None:
    """A network policy between the operator and one broker: no answer ever, no failover for it."""
    clock, answers, live = setup()
    answers.now = {0: "SERVING", 1: "SERVING", 2: "UNAVAILABLE"}
    live.poll(TARGETS)
    clock.t += 60
    live.poll(TARGETS)
    assert live.live == {0, 1, 2} and live.dead == frozenset()
    assert live.alive_for(30) == {0, 1, 2}
    live.pods.pod_event("MODIFIED", pod(2, False))  # its Pod still decides
    clock.t += 10
    assert [(c.broker_id, c.new) for c in live.poll(TARGETS)] == [(2, DEAD)]


def test_an_operator_cut_off_from_every_broker_fences_none() -> None:
    clock, answers, live = setup()
    answers.now = {0: "SERVING", 1: "SERVING", 2: "SERVING"}
    live.poll(TARGETS)
    answers.now = {0: "UNAVAILABLE", 1: "UNAVAILABLE", 2: "UNAVAILABLE"}
    clock.t += 30
    assert live.poll(TARGETS) == [] and live.live == {0, 1, 2}
    # one comes back into reach: the others, silent for the whole timeout, are dead now
    answers.now[0] = "SERVING"
    changes = live.poll(TARGETS)
    assert {(c.broker_id, c.new) for c in changes} == {(1, DEAD), (2, DEAD)}


def test_a_broker_shutting_down_is_dead_at_once_and_a_pod_verdict_still_counts() -> None:
    clock, answers, live = setup()
    answers.now = {0: "SERVING", 1: "SERVING", 2: "SERVING"}
    live.poll(TARGETS)
    answers.now[2] = "NOT_SERVING"  # a controlled shutdown
    assert [(c.broker_id, c.new) for c in live.poll(TARGETS)] == [(2, DEAD)]
    live.pods.pod_event("MODIFIED", pod(1, False))  # NotReady: unknown within the grace, dead after it
    assert [(c.broker_id, c.new) for c in live.poll(TARGETS)] == [(1, UNKNOWN)]
    clock.t += 10
    changes = live.poll(TARGETS)
    assert [(c.broker_id, c.new) for c in changes] == [(1, DEAD)]
    assert "its pod is not ready" in changes[0].describe()


def test_with_port() -> None:
    assert with_port("sluice-broker-0.sluice.ns.svc:9092", 9094) == "sluice-broker-0.sluice.ns.svc:9094"
    assert with_port("[fd00::1]:9092", 9094) == "[fd00::1]:9094"
    assert with_port("host", 9094) == "host:9094"
