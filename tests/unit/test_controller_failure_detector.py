"""The controller's failure detector: timeouts on a fake clock, and the real gRPC health checker."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator, Mapping
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from sluice.operator.liveness.brokers import ALIVE, DEAD, UNKNOWN, FailureDetector, GrpcHealthChecker


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Answers:
    """A checker that answers what the test says (nothing: still in flight), and records who was asked."""

    def __init__(self) -> None:
        self.status: dict[int, str] = {}
        self.asked: list[dict[int, str]] = []

    def __call__(self, targets: Mapping[int, str]) -> dict[int, str]:
        self.asked.append(dict(targets))
        return {b: self.status[b] for b in targets if b in self.status}


TARGETS = {0: "h:0", 1: "h:1"}


def detector(timeout_ms: int = 1000) -> tuple[FailureDetector, Answers, FakeClock]:
    answers, clock = Answers(), FakeClock()
    return FailureDetector(answers, timeout_ms=timeout_ms, clock=clock), answers, clock


def test_new_brokers_are_unknown_until_they_answer() -> None:
    d, answers, _ = detector()
    answers.status = {0: "SERVING"}
    changes = d.poll(TARGETS)
    assert d.live == {0} and d.unknown == {1} and d.dead == frozenset()
    assert [(c.broker_id, c.old, c.new) for c in changes] == [(0, UNKNOWN, ALIVE)]
    assert answers.asked == [TARGETS]


def test_dead_after_failing_for_the_timeout_and_alive_after_one_success() -> None:
    d, answers, clock = detector(timeout_ms=1000)
    answers.status = {0: "SERVING", 1: "SERVING"}
    d.poll(TARGETS)
    answers.status = {0: "SERVING", 1: "DEADLINE_EXCEEDED"}
    for _ in range(4):  # 0.8 s of failures: not yet
        clock.now += 0.2
        assert d.poll(TARGETS) == []
    assert d.state(1) == ALIVE
    clock.now += 0.2
    changes = d.poll(TARGETS)
    assert d.dead == {1} and d.live == {0}
    assert len(changes) == 1 and changes[0].new == DEAD
    assert (
        changes[0].describe()
        == "broker 1 is dead: no successful health check for 1.0 s (last answer: DEADLINE_EXCEEDED)"
    )
    clock.now += 5
    assert d.poll(TARGETS) == []  # dead stays dead, reported once
    answers.status[1] = "SERVING"
    changes = d.poll(TARGETS)
    assert d.live == {0, 1}
    assert [c.describe() for c in changes] == ["broker 1 is alive again"]


def test_a_success_resets_the_failure_clock() -> None:
    d, answers, clock = detector(timeout_ms=1000)
    for i in range(20):
        answers.status = {0: "SERVING" if i % 4 == 0 else "UNAVAILABLE"}
        clock.now += 0.3
        d.poll({0: "h:0"})
        assert d.state(0) == ALIVE  # never 1 s without success


def test_not_serving_is_a_controlled_shutdown_and_dead_at_once() -> None:
    d, answers, _ = detector(timeout_ms=60_000)
    answers.status = {0: "SERVING", 1: "SERVING"}
    d.poll(TARGETS)
    answers.status = {0: "SERVING", 1: "NOT_SERVING"}
    changes = d.poll(TARGETS)  # no time passed
    assert d.dead == {1}
    assert [c.describe() for c in changes] == [
        "broker 1 is shutting down (controlled shutdown): its partitions move now"
    ]


def test_alive_for_counts_from_the_last_failed_check() -> None:
    d, answers, clock = detector(timeout_ms=1000)
    answers.status = {0: "SERVING", 1: "SERVING"}
    d.poll(TARGETS)
    clock.now += 5
    d.poll(TARGETS)
    assert d.alive_for(5) == {0, 1} and d.alive_for(6) == frozenset()
    answers.status = {0: "SERVING", 1: "UNAVAILABLE"}  # one failed check: still alive, not settled
    clock.now += 0.1
    d.poll(TARGETS)
    answers.status = {0: "SERVING", 1: "SERVING"}
    clock.now += 0.1
    d.poll(TARGETS)
    assert d.live == {0, 1} and d.alive_for(1) == {0}
    clock.now += 1
    d.poll(TARGETS)
    assert d.alive_for(1) == {0, 1}


def test_answers_are_counted_before_deaths_after_a_controller_stall() -> None:
    d, answers, clock = detector(timeout_ms=1000)
    answers.status = {0: "SERVING", 1: "SERVING"}
    d.poll(TARGETS)
    clock.now += 30  # the controller itself was stalled; 0's check was answered meanwhile
    answers.status = {0: "SERVING", 1: "UNAVAILABLE"}
    changes = d.poll(TARGETS)
    assert d.state(0) == ALIVE
    assert [(c.broker_id, c.new) for c in changes] == [(1, DEAD)]


def test_a_check_that_never_returns_is_a_death_by_time() -> None:
    """A SIGSTOPped broker: its check is in flight, no answer ever comes."""
    d, answers, clock = detector(timeout_ms=1000)
    answers.status = {0: "SERVING"}
    d.poll({0: "h:0"})
    answers.status = {}
    clock.now += 0.9
    d.poll({0: "h:0"})
    assert d.state(0) == ALIVE
    clock.now += 0.1
    changes = d.poll({0: "h:0"})
    assert d.state(0) == DEAD
    assert changes[0].describe() == ("broker 0 is dead: no successful health check for 1.0 s (last answer: SERVING)")


def test_slow_answers_keep_a_broker_alive() -> None:
    d, answers, clock = detector(timeout_ms=1000)
    for i in range(30):  # an answer every 0.8 s, nothing in between
        answers.status = {0: "SERVING"} if i % 4 == 0 else {}
        clock.now += 0.2
        d.poll({0: "h:0"})
        assert d.state(0) in (UNKNOWN, ALIVE) and d.dead == frozenset()


def test_never_answering_broker_is_dead_a_timeout_after_first_sight() -> None:
    d, _, clock = detector(timeout_ms=2000)
    d.poll({0: "h:0"})
    clock.now += 1.0
    d.poll({0: "h:0"})
    assert d.state(0) == UNKNOWN
    clock.now += 1.0
    d.poll({0: "h:0"})
    assert d.state(0) == DEAD


def test_deregistered_brokers_are_forgotten() -> None:
    d, answers, _ = detector()
    answers.status = {0: "SERVING", 1: "SERVING"}
    d.poll(TARGETS)
    d.poll({0: "h:0"})
    assert d.live == {0} and set(d.brokers) == {0}


def test_no_brokers_no_checks() -> None:
    d, answers, _ = detector()
    assert d.poll({}) == []
    assert answers.asked == []


def test_bad_timeout_refused() -> None:
    with pytest.raises(ValueError):
        FailureDetector(Answers(), timeout_ms=0)


# -- the real gRPC checker ----------------------------------------------------------------------------


@pytest.fixture
def health_server() -> Iterator[tuple[str, health.HealthServicer, grpc.Server]]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer, server
    server.stop(grace=None)


def collect(checker: GrpcHealthChecker, targets: Mapping[int, str], timeout: float = 5.0) -> dict[int, str]:
    """Rounds until every target answered (the checker never blocks).

    A round that collects an answer also sends the next check, so the first
    answer after a change may be from before it: drain with one ``collect``.
    """
    out: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while set(out) != set(targets) and time.monotonic() < deadline:
        out.update(checker({b: a for b, a in targets.items() if b not in out}))
        time.sleep(0.01)
    return out


def test_grpc_checker_reports_serving_not_found_and_unavailable(
    health_server: tuple[str, health.HealthServicer, grpc.Server],
) -> None:
    address, servicer, _ = health_server
    checker = GrpcHealthChecker(deadline_ms=1000)
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = f"127.0.0.1:{s.getsockname()[1]}"  # bound, never listening: refused
        assert collect(checker, {0: address, 1: closed}) == {0: "NOT_FOUND", 1: "UNAVAILABLE"}
        servicer.set("sluice.liveness", health_pb2.HealthCheckResponse.SERVING)
        collect(checker, {0: address})
        assert collect(checker, {0: address}) == {0: "SERVING"}
        assert collect(checker, {0: address}) == {0: "SERVING"}  # the kept channel
        servicer.set("sluice.liveness", health_pb2.HealthCheckResponse.NOT_SERVING)
        collect(checker, {0: address})
        assert collect(checker, {0: address}) == {0: "NOT_SERVING"}
    finally:
        checker.close()


def test_grpc_checker_checks_each_broker_at_most_once_per_interval(
    health_server: tuple[str, health.HealthServicer, grpc.Server],
) -> None:
    """Rounds come every 100 ms (more at 100 brokers would be 1,000 calls a second): checks do not."""
    address, servicer, _ = health_server
    servicer.set("sluice.liveness", health_pb2.HealthCheckResponse.SERVING)
    checker = GrpcHealthChecker(deadline_ms=5000, interval_ms=400)
    answers = 0
    try:
        started = time.monotonic()
        for _ in range(200):  # a round every 10 ms for 1.2 s (bounded in count and time)
            answers += len(checker({0: address}))
            if time.monotonic() - started >= 1.2:
                break
            time.sleep(0.01)
    finally:
        checker.close()
    # sent at 0, 0.4, 0.8 (and 1.2 at the edge): without the interval, one per round answered (~100)
    assert 2 <= answers <= 4
    assert GrpcHealthChecker(deadline_ms=1000).interval_s == 0.2  # a fifth of a short deadline
    assert GrpcHealthChecker(deadline_ms=9000).interval_s == 0.5


def test_grpc_checker_checks_a_broker_at_its_new_address_at_once(
    health_server: tuple[str, health.HealthServicer, grpc.Server],
) -> None:
    """A broker registered again elsewhere (a new Pod IP) is not left waiting on its old address's deadline."""
    address, servicer, _ = health_server
    servicer.set("sluice.liveness", health_pb2.HealthCheckResponse.SERVING)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts, never answers: the old address
        checker = GrpcHealthChecker(deadline_ms=20_000)
        try:
            assert checker({0: f"127.0.0.1:{listener.getsockname()[1]}"}) == {}
            assert collect(checker, {0: address}, timeout=5.0) == {0: "SERVING"}
        finally:
            checker.close()


def test_grpc_checker_never_blocks_and_times_out_a_silent_listener() -> None:
    """What a SIGSTOPped broker looks like: the kernel accepts the connection, nobody answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        checker = GrpcHealthChecker(deadline_ms=300)
        try:
            started = time.monotonic()
            assert checker({0: address, 1: address}) == {}  # sent, nothing back yet
            assert time.monotonic() - started < 0.2
            assert collect(checker, {0: address, 1: address}) == {0: "DEADLINE_EXCEEDED", 1: "DEADLINE_EXCEEDED"}
            assert time.monotonic() - started < 2.0
        finally:
            checker.close()
